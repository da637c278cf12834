//! Binding conditions (KEP-5007, `resource.k8s.io/v1` beta in 1.37, on by default since 1.36)
//! on the kit's side: a driver publishes a device with `bindingConditions` /
//! `bindingFailureConditions`; the scheduler then allocates it, reserves the claim and waits in
//! PreBind (polling every 5 s, at most `bindingTimeout`, 600 s by default) until every binding
//! condition is True in the claim's `status.devices[]` entry of that device, or gives up at once
//! when a failure condition is True (the claim is deallocated and the Pod goes back to the
//! scheduler, the condition's reason and message in its `FailedScheduling` event).
//!
//! This module watches the ResourceClaims allocated to this node's pool for the driver (a list,
//! then a watch from its resourceVersion, relisted every [`RESYNC`] and after any error), asks
//! the driver to do its work for each device that waits on one of its conditions ([`want`],
//! pure), and writes the outcome onto the claim's status by server-side apply
//! ([`status_apply`], pure; field manager [`FIELD_MANAGER`]), touching only this driver's
//! entries. A claim that was handed to the driver and is then deallocated, deleted or moved
//! elsewhere before the kubelet prepared it is handed back ([`Event::Release`], and
//! [`Event::Sync`] with every claim allocated here after each list), so the driver can undo
//! what it did for a Pod that never came.
//!
//! [`probe`] asks the API server (a server-side dry-run create of a ResourceSlice) whether it
//! keeps the fields at all: an API server without `DRADeviceBindingConditions` drops them, and
//! the plugin then publishes none and starts no watch (the cluster works as without the
//! feature: the kubelet's Prepare does the work).

use super::api::Kube;
use super::claims::{Claim, ClaimRef};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_stream::StreamExt;
use tracing::{info, warn};

/// The field manager of the plugin's writes to claim status.
pub(crate) const FIELD_MANAGER: &str = "gpupass-dra-plugin";
/// How often the claims are listed again even when the watch runs (a write that failed is
/// retried, an event that was missed is seen).
pub(crate) const RESYNC: Duration = Duration::from_secs(30);
/// The longest message a condition carries here (the API allows 32768 bytes).
pub(crate) const MAX_MESSAGE: usize = 1024;

/// The condition types a driver publishes on its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conditions {
    /// The binding condition: True once the driver's work for the device is done.
    pub ready: String,
    /// The binding failure condition: True when it failed (the reason says why).
    pub failed: String,
}

/// One allocated device of a claim.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct DeviceKey {
    pub request: String,
    pub pool: String,
    pub device: String,
}

/// Why a driver's work before binding failed: what the failure condition says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// A condition reason: CamelCase (`InUse`, `Locked`, `ClaimRefused`...).
    pub reason: String,
    pub message: String,
}

/// What a claim asks of this driver now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Want {
    /// Allocated here; these devices wait on the driver's binding condition and have no
    /// outcome yet.
    Bind(Vec<DeviceKey>),
    /// Allocated here, nothing to do (no binding condition of ours, or every outcome written).
    Nothing,
    /// Not allocated to this pool (or being deleted).
    NotHere,
}

/// What the claim asks of `driver` in `pool` ([`Want`]). Pure.
pub(crate) fn want(claim: &ResourceClaim, driver: &str, pool: &str, c: &Conditions) -> Want {
    if claim.metadata.deletion_timestamp.is_some() {
        return Want::NotHere;
    }
    let Some(alloc) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Want::NotHere;
    };
    let ours: Vec<_> = alloc
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.driver == driver && r.pool == pool)
        .collect();
    if ours.is_empty() {
        return Want::NotHere;
    }
    let statuses = claim
        .status
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .cloned()
        .unwrap_or_default();
    let mut todo: Vec<DeviceKey> = ours
        .iter()
        .filter(|r| {
            r.binding_conditions
                .as_ref()
                .is_some_and(|b| b.contains(&c.ready))
        })
        .filter(|r| {
            let st = statuses
                .iter()
                .find(|s| s.driver == r.driver && s.pool == r.pool && s.device == r.device);
            let is_true = |t: &str| {
                st.and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|x| x.type_ == t && x.status == "True"))
            };
            !is_true(&c.ready) && !is_true(&c.failed)
        })
        .map(|r| DeviceKey {
            request: r.request.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
        })
        .collect();
    todo.sort();
    todo.dedup_by(|a, b| a.device == b.device && a.pool == b.pool);
    if todo.is_empty() {
        Want::Nothing
    } else {
        Want::Bind(todo)
    }
}

/// The claim the kubelet would name for `claim` (namespace, name, UID).
pub(crate) fn claim_ref(claim: &ResourceClaim) -> Option<ClaimRef> {
    Some(ClaimRef {
        namespace: claim.metadata.namespace.clone()?,
        name: claim.metadata.name.clone()?,
        uid: claim.metadata.uid.clone()?,
    })
}

/// Cut `s` to at most [`MAX_MESSAGE`] bytes on a char boundary.
fn cut(s: &str) -> String {
    if s.len() <= MAX_MESSAGE {
        return s.to_string();
    }
    let mut end = MAX_MESSAGE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The server-side apply body that sets the outcome of `devices` (all of `driver`) on the
/// claim's `status.devices[]`: `ready` True (Ok, its message), or `failed` True and `ready`
/// False with the failure's reason and message. `now` is RFC 3339. Pure.
pub(crate) fn status_apply(
    claim: &ClaimRef,
    driver: &str,
    devices: &[DeviceKey],
    outcome: &Result<String, Failure>,
    c: &Conditions,
    now: &str,
) -> serde_json::Value {
    let cond = |t: &str, status: &str, reason: &str, message: &str| {
        serde_json::json!({
            "type": t,
            "status": status,
            "reason": reason,
            "message": cut(message),
            "lastTransitionTime": now,
        })
    };
    let conditions = match outcome {
        Ok(m) => vec![cond(&c.ready, "True", "Bound", m)],
        Err(f) => vec![
            cond(&c.failed, "True", &f.reason, &f.message),
            cond(&c.ready, "False", &f.reason, &f.message),
        ],
    };
    let entries: Vec<serde_json::Value> = devices
        .iter()
        .map(|d| {
            serde_json::json!({
                "driver": driver,
                "pool": d.pool,
                "device": d.device,
                "conditions": conditions,
            })
        })
        .collect();
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace},
        "status": {"devices": entries},
    })
}

/// What the watcher hands the driver (through the plugin's worker).
#[derive(Debug, Clone)]
pub(crate) enum Event {
    /// Do the work for `devices` of `claim` before its Pod is bound; the answer is the
    /// condition's message (Ok) or the failure.
    Bind {
        claim: Box<Claim>,
        devices: Vec<DeviceKey>,
    },
    /// The claim is no longer allocated here (deallocated, deleted, moved): undo what was done
    /// for it if the kubelet never prepared it.
    Release(ClaimRef),
    /// After a list: the UIDs of every claim allocated here; undo the work done for any other
    /// claim that the kubelet never prepared.
    Sync(BTreeSet<String>),
}

/// The driver's side of the watcher: the answer to a [`Event::Bind`] (`None` for the others).
pub(crate) type Handler = Box<dyn FnMut(Event) -> Option<Result<String, Failure>> + Send>;

/// Why the watcher could not talk to the API server.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BindingError {
    #[error("{}", crate::model::ErrorChain(.0))]
    Kube(kube::Error),
    #[error("no answer from the API server within {} s", .0.as_secs_f64())]
    Timeout(Duration),
    #[error("cannot start the claim watcher's runtime")]
    Runtime(#[source] std::io::Error),
    #[error("the API server ended the watch: {0}")]
    Watch(String),
}

fn runtime() -> Result<tokio::runtime::Runtime, BindingError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(BindingError::Runtime)
}

async fn bounded<T>(
    t: Duration,
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, BindingError> {
    match tokio::time::timeout(t, f).await {
        Ok(r) => r.map_err(BindingError::Kube),
        Err(_) => Err(BindingError::Timeout(t)),
    }
}

/// Whether the API server keeps binding conditions on a device: a server-side dry-run create
/// of a ResourceSlice of `driver` on `node` whose one device has them (nothing is stored).
/// False where the API server drops them (`DRADeviceBindingConditions` off, a release before
/// 1.34).
pub(crate) fn probe(kube: &Kube, driver: &str, node: &str, c: &Conditions) -> Result<bool, BindingError> {
    let slice: ResourceSlice = serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": format!("{node}-{}-probe-", driver.replace('.', "-"))},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "devices": [{
                "name": "binding-conditions-probe",
                "bindingConditions": [c.ready],
                "bindingFailureConditions": [c.failed],
            }],
        },
    }))
    .expect("a valid ResourceSlice");
    let rt = runtime()?;
    let client = kube.client();
    let t = kube.timeout;
    rt.block_on(async move {
        let pp = PostParams {
            dry_run: true,
            field_manager: Some(FIELD_MANAGER.into()),
        };
        let made = bounded(t, Api::<ResourceSlice>::all(client).create(&pp, &slice)).await?;
        Ok(made
            .spec
            .devices
            .unwrap_or_default()
            .first()
            .and_then(|d| d.binding_conditions.as_ref())
            .is_some_and(|b| b.contains(&c.ready)))
    })
}

/// What the watcher needs.
#[derive(Clone)]
pub(crate) struct Watch {
    pub kube: Arc<Kube>,
    pub driver: String,
    /// This node's pool (the node's name).
    pub pool: String,
    pub conditions: Conditions,
}

/// Start the watcher on a thread of its own; it ends when `stop` is set (within a watch
/// timeout) or the handler's side is gone.
pub(crate) fn spawn(w: Watch, handler: Handler, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("gpupass-claims".into())
        .spawn(move || {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(e) => {
                    warn!("no claim watcher: {e}");
                    return;
                }
            };
            let mut state = Watcher {
                w,
                handler,
                here: BTreeSet::new(),
            };
            rt.block_on(state.run(&stop));
        })
        .expect("a thread for the claim watcher")
}

struct Watcher {
    w: Watch,
    handler: Handler,
    /// UIDs of the claims seen allocated here since the last list.
    here: BTreeSet<String>,
}

impl Watcher {
    async fn run(&mut self, stop: &AtomicBool) {
        let mut backoff = Duration::from_millis(500);
        info!(
            "watching ResourceClaims allocated to pool {} of {} for binding conditions",
            self.w.pool, self.w.driver
        );
        while !stop.load(Ordering::SeqCst) {
            match self.list_and_watch(stop).await {
                Ok(()) => backoff = Duration::from_millis(500),
                Err(e) => {
                    warn!("claim watcher: {e}; listing again in {} ms", backoff.as_millis());
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// One list, then watches from its resourceVersion until [`RESYNC`] is over or the watch
    /// fails.
    async fn list_and_watch(&mut self, stop: &AtomicBool) -> Result<(), BindingError> {
        let client = self.w.kube.client();
        let t = self.w.kube.timeout;
        let list = bounded(
            t,
            Api::<ResourceClaim>::all(client.clone()).list(&ListParams::default()),
        )
        .await?;
        let mut rv = list.metadata.resource_version.clone().unwrap_or_default();
        self.here.clear();
        for c in &list.items {
            if !matches!(self.want(c), Want::NotHere) {
                if let Some(uid) = c.metadata.uid.clone() {
                    self.here.insert(uid);
                }
            }
        }
        let _ = (self.handler)(Event::Sync(self.here.clone()));
        for c in list.items {
            self.seen(&c, false).await;
        }
        let until = Instant::now() + RESYNC;
        // The server ends each watch before the client's read timeout would.
        let server_timeout = (t.as_secs().saturating_sub(2)).clamp(1, 290) as u32;
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            let wp = WatchParams::default().timeout(server_timeout);
            let mut stream =
                Box::pin(bounded(t, Api::<ResourceClaim>::all(client.clone()).watch(&wp, &rv)).await?);
            while let Some(ev) = stream.next().await {
                match ev.map_err(BindingError::Kube)? {
                    WatchEvent::Added(c) | WatchEvent::Modified(c) => {
                        if let Some(v) = c.metadata.resource_version.clone() {
                            rv = v;
                        }
                        self.seen(&c, false).await;
                    }
                    WatchEvent::Deleted(c) => {
                        if let Some(v) = c.metadata.resource_version.clone() {
                            rv = v;
                        }
                        self.seen(&c, true).await;
                    }
                    WatchEvent::Bookmark(b) => rv = b.metadata.resource_version,
                    WatchEvent::Error(s) => {
                        return Err(BindingError::Watch(format!("{} ({})", s.message, s.code)));
                    }
                }
                if stop.load(Ordering::SeqCst) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn want(&self, c: &ResourceClaim) -> Want {
        want(c, &self.w.driver, &self.w.pool, &self.w.conditions)
    }

    /// One claim as the list or an event shows it.
    async fn seen(&mut self, c: &ResourceClaim, deleted: bool) {
        let Some(r) = claim_ref(c) else { return };
        let want = if deleted { Want::NotHere } else { self.want(c) };
        match want {
            Want::NotHere => {
                if self.here.remove(&r.uid) {
                    let _ = (self.handler)(Event::Release(r));
                }
            }
            Want::Nothing => {
                self.here.insert(r.uid.clone());
            }
            Want::Bind(devices) => {
                self.here.insert(r.uid.clone());
                let claim = Box::new(Claim {
                    asked: r.clone(),
                    object: c.clone(),
                });
                let t0 = Instant::now();
                let Some(outcome) = (self.handler)(Event::Bind {
                    claim,
                    devices: devices.clone(),
                }) else {
                    return;
                };
                let names: Vec<&str> = devices.iter().map(|d| d.device.as_str()).collect();
                match &outcome {
                    Ok(_) => info!(
                        "bound claim {}/{} ({}) before binding: {} in {} us",
                        r.namespace,
                        r.name,
                        r.uid,
                        names.join(" "),
                        t0.elapsed().as_micros()
                    ),
                    Err(f) => warn!(
                        "claim {}/{} ({}) failed binding: {}: {}",
                        r.namespace, r.name, r.uid, f.reason, f.message
                    ),
                }
                let now = k8s_openapi::jiff::Timestamp::now()
                    .round(k8s_openapi::jiff::Unit::Second)
                    .map(|t| t.to_string())
                    .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now().to_string());
                let body = status_apply(&r, &self.w.driver, &devices, &outcome, &self.w.conditions, &now);
                let pp = PatchParams::apply(FIELD_MANAGER).force();
                let patch = Patch::Apply(&body);
                let written = bounded(
                    self.w.kube.timeout,
                    Api::<ResourceClaim>::namespaced(self.w.kube.client(), &r.namespace)
                        .patch_status(&r.name, &pp, &patch),
                )
                .await;
                match written {
                    Ok(_) => info!(
                        "set {} on claim {}/{} ({})",
                        match &outcome {
                            Ok(_) => format!("{}=True", self.w.conditions.ready),
                            Err(f) => format!("{}=True ({})", self.w.conditions.failed, f.reason),
                        },
                        r.namespace,
                        r.name,
                        r.uid
                    ),
                    Err(e) => warn!(
                        "cannot write the binding conditions of claim {}/{} ({}): {e}; retried at the next list",
                        r.namespace, r.name, r.uid
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
