//! The API server, through kube-rs: the ResourceClaims the kit reads for Prepare ([`Claims`],
//! a [`ClaimSource`]) and this node's ResourceSlices ([`Publisher`]), republished when the
//! driver's pool changes.
//!
//! The plugin's worker is a plain thread (a driver may be synchronous: gpupass's writes sysfs
//! under a lock), so [`Kube`] owns a small runtime of its own and every call is a `block_on`
//! bounded by a timeout; an unreachable API server makes a call fail after that time, never
//! hang.
//!
//! What the publisher writes is decided by a pure function, [`reconcile`]: the slices that
//! exist for this node and driver (listed by field selector) against the ones the pool renders
//! ([`super::pool::render`]); a change bumps the pool's generation (the scheduler uses only the
//! newest generation of a pool) and deletes slices the pool no longer has.

use super::claims::{checked_names, ClaimSource, SourceError};
use super::pool::{self, Pool, SliceOptions};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{CounterSet, Device, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Why the API server could not be reached or configured.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot read the kubeconfig {}: {detail}", .path.display())]
    Kubeconfig {
        path: std::path::PathBuf,
        detail: String,
    },
    #[error("no API server configuration: no --kubeconfig, no KUBECONFIG or ~/.kube/config, and not in a Pod ({0})")]
    Infer(String),
    #[error("cannot make the API client: {0}")]
    Client(String),
    #[error("cannot start the API client's runtime")]
    Runtime(#[source] std::io::Error),
}

/// A connection to the API server: a kube-rs client on a runtime of its own.
pub struct Kube {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    /// The same server without a read timeout: a watch is quiet for minutes when nothing
    /// changes (the server ends it after [`WATCH_TIMEOUT_S`]).
    watch_client: kube::Client,
    /// The longest one call may take.
    pub timeout: Duration,
}

impl std::fmt::Debug for Kube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kube").field("timeout", &self.timeout).finish()
    }
}

impl Kube {
    /// From `kubeconfig`, or kube-rs's own rules without one (`KUBECONFIG`, `~/.kube/config`,
    /// the Pod's service account).
    pub fn connect(kubeconfig: Option<&Path>, timeout: Duration) -> Result<Arc<Kube>, ApiError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("gpupass-kube")
            .enable_all()
            .build()
            .map_err(ApiError::Runtime)?;
        let (client, watch_client) = rt.block_on(async {
            let mut cfg = match kubeconfig {
                Some(p) => {
                    let kc = kube::config::Kubeconfig::read_from(p).map_err(|e| ApiError::Kubeconfig {
                        path: p.to_path_buf(),
                        detail: crate::model::ErrorChain(&e).to_string(),
                    })?;
                    kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                        .await
                        .map_err(|e| ApiError::Kubeconfig {
                            path: p.to_path_buf(),
                            detail: crate::model::ErrorChain(&e).to_string(),
                        })?
                }
                None => kube::Config::infer()
                    .await
                    .map_err(|e| ApiError::Infer(crate::model::ErrorChain(&e).to_string()))?,
            };
            // Which credentials, said once at the start: a Pod's plugin must show the service
            // account (in-cluster), never an admin's kubeconfig (docs/deploy.md).
            let creds = match (kubeconfig, cfg.auth_info.token_file.as_deref()) {
                (Some(p), _) => format!("the kubeconfig {}", p.display()),
                (None, Some(t)) => format!("the token {t} (in-cluster configuration)"),
                (None, None) => "the kubeconfig of KUBECONFIG or ~/.kube/config".to_string(),
            };
            info!("API server {} with {creds}", cfg.cluster_url);
            cfg.connect_timeout = Some(timeout);
            cfg.read_timeout = None;
            cfg.write_timeout = Some(timeout);
            let make = |c: kube::Config| {
                kube::Client::try_from(c)
                    .map_err(|e| ApiError::Client(crate::model::ErrorChain(&e).to_string()))
            };
            let watch_client = make(cfg.clone())?;
            cfg.read_timeout = Some(timeout);
            Ok::<_, ApiError>((make(cfg)?, watch_client))
        })?;
        Ok(Arc::new(Kube {
            rt,
            client,
            watch_client,
            timeout,
        }))
    }

    /// The client (for a thread with a runtime of its own: [`super::binding`]'s watcher).
    pub(crate) fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Runs `f` on the client's runtime, at most `timeout`.
    fn call<T, F>(&self, f: impl FnOnce(kube::Client) -> F) -> Result<T, CallError>
    where
        F: std::future::Future<Output = Result<T, kube::Error>>,
    {
        let fut = f(self.client.clone());
        self.rt.block_on(async {
            match tokio::time::timeout(self.timeout, fut).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(CallError::Kube(e)),
                Err(_) => Err(CallError::Timeout(self.timeout)),
            }
        })
    }
}

/// One failed call.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{}", crate::model::ErrorChain(.0))]
    Kube(kube::Error),
    #[error("no answer from the API server within {} s", .0.as_secs_f64())]
    Timeout(Duration),
}

impl CallError {
    fn is_not_found(&self) -> bool {
        matches!(self, CallError::Kube(kube::Error::Api(s)) if s.is_not_found())
    }
}

/// ResourceClaims from the API server (`resource.k8s.io/v1`).
#[derive(Debug, Clone)]
pub(crate) struct Claims(pub Arc<Kube>);

impl ClaimSource for Claims {
    fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, SourceError> {
        checked_names(namespace, name)?;
        let (ns, n) = (namespace.to_string(), name.to_string());
        self.0
            .call(|c| async move { Api::<ResourceClaim>::namespaced(c, &ns).get(&n).await })
            .map_err(|e| {
                let (namespace, name, detail) = (namespace.into(), name.into(), e.to_string());
                if e.is_not_found() {
                    SourceError::NotFound {
                        namespace,
                        name,
                        detail,
                    }
                } else {
                    SourceError::Failed {
                        namespace,
                        name,
                        detail,
                    }
                }
            })
    }
}

/// One write the publisher makes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SliceOp {
    Create(ResourceSlice),
    /// The slice with the existing object's `resourceVersion`.
    Replace(ResourceSlice),
    Delete(String),
}

/// What the slices of a pool hold, by `part` (their devices, their counter sets), in
/// slice-name order.
fn in_slice_order<T: Clone>(s: &[ResourceSlice], part: impl Fn(&ResourceSlice) -> Option<&Vec<T>>) -> Vec<T> {
    let mut v: Vec<&ResourceSlice> = s.iter().collect();
    v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    v.iter()
        .flat_map(|s| part(s).cloned().unwrap_or_default())
        .collect()
}

/// The devices of a pool as the slices hold them, in slice-name order.
fn pool_devices(s: &[ResourceSlice]) -> Vec<Device> {
    in_slice_order(s, |x| x.spec.devices.as_ref())
}

/// The counter sets of a pool's slices, in slice-name order.
fn pool_counters(s: &[ResourceSlice]) -> Vec<CounterSet> {
    in_slice_order(s, |x| x.spec.shared_counters.as_ref())
}

/// What turns `existing` (this node's and driver's slices) into `pool` rendered: nothing
/// when the newest generation already holds exactly those devices in that many slices with the
/// same owner; otherwise every slice of the next generation created or replaced, then the ones
/// left over deleted.
pub(crate) fn reconcile(
    existing: &[ResourceSlice],
    pool: &Pool,
    node: &str,
    driver: &str,
    owner: Option<&OwnerReference>,
) -> Vec<SliceOp> {
    let newest = existing.iter().map(|s| s.spec.pool.generation).max();
    let mut want = pool::render(
        pool.clone(),
        &SliceOptions {
            node: node.to_string(),
            driver: driver.to_string(),
            generation: newest.map_or(1, |g| g + 1),
        },
    );
    for s in &mut want {
        s.metadata.owner_references = owner.map(|o| vec![o.clone()]);
    }
    keep_taint_times(&mut want, existing);
    let same = existing.iter().all(|s| Some(s.spec.pool.generation) == newest)
        && existing.len() == want.len()
        && existing
            .iter()
            .all(|s| s.spec.pool.resource_slice_count == want.len() as i64)
        && existing.iter().all(|s| {
            s.metadata.owner_references.as_deref().unwrap_or_default()
                == want[0].metadata.owner_references.as_deref().unwrap_or_default()
                && s.spec.node_name.as_deref() == Some(node)
                && s.spec.pool.name == node
        })
        && {
            let mut names: Vec<_> = existing.iter().map(|s| s.metadata.name.clone()).collect();
            let mut wanted: Vec<_> = want.iter().map(|s| s.metadata.name.clone()).collect();
            names.sort();
            wanted.sort();
            names == wanted
        }
        && pool_devices(existing) == pool_devices(&want)
        && pool_counters(existing) == pool_counters(&want);
    if same {
        return Vec::new();
    }
    let mut ops = Vec::new();
    for mut s in want.iter().cloned() {
        match existing.iter().find(|e| e.metadata.name == s.metadata.name) {
            Some(e) => {
                s.metadata.resource_version = e.metadata.resource_version.clone();
                ops.push(SliceOp::Replace(s));
            }
            None => ops.push(SliceOp::Create(s)),
        }
    }
    for e in existing {
        if let Some(n) = &e.metadata.name {
            if !want.iter().any(|w| w.metadata.name.as_ref() == Some(n)) {
                ops.push(SliceOp::Delete(n.clone()));
            }
        }
    }
    ops
}

/// Gives each taint of `want` the `timeAdded` the API server set on the same taint (key, value,
/// effect) of the same device in `existing`: the server stamps a taint written without one, so
/// a pool rendered again (with none) would otherwise differ from what is published at every
/// comparison and be written forever. A taint not published yet keeps none (the server stamps
/// it).
fn keep_taint_times(want: &mut [ResourceSlice], existing: &[ResourceSlice]) {
    let published: Vec<&Device> = existing
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect();
    for d in want.iter_mut().flat_map(|s| s.spec.devices.iter_mut().flatten()) {
        let Some(old) = published.iter().find(|o| o.name == d.name) else {
            continue;
        };
        for t in d.taints.iter_mut().flatten().filter(|t| t.time_added.is_none()) {
            t.time_added = old
                .taints
                .iter()
                .flatten()
                .find(|o| o.key == t.key && o.value == t.value && o.effect == t.effect)
                .and_then(|o| o.time_added.clone());
        }
    }
}

/// How long one watch of this node's slices lasts before the server ends it and the watch
/// starts again (`timeoutSeconds`).
pub(crate) const WATCH_TIMEOUT_S: u32 = 290;

/// Publishes this node's pool and keeps it current: [`Publisher::publish`] is called with each
/// fresh pool; it reconciles with the API server when the pool changed since the last success
/// or when its watch ([`Publisher::watch`]) saw this node's slices change (anyone's delete,
/// edit or create: the kubelet's wipe at start, an admin's `kubectl delete`, a restarted API
/// server), and writes only what differs ([`reconcile`]); after a failure it tries again with a
/// growing pause (2 s, doubling to 60 s).
#[derive(Debug)]
pub struct Publisher {
    pub api: Arc<Kube>,
    pub node: String,
    pub driver: String,
    published: Option<Pool>,
    retry: Option<(Instant, Duration)>,
    /// Set by the watch: the API server's slices may no longer be what was published.
    stale: Arc<AtomicBool>,
    watcher: Option<tokio::task::AbortHandle>,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Some(w) = self.watcher.take() {
            w.abort();
        }
    }
}

impl Publisher {
    pub fn new(api: Arc<Kube>, node: String, driver: String) -> Self {
        Publisher {
            api,
            node,
            driver,
            published: None,
            retry: None,
            stale: Arc::new(AtomicBool::new(false)),
            watcher: None,
        }
    }

    /// Watches this node's and driver's slices (field selector, as [`Publisher::sync`] lists
    /// them; the watch starts again after each [`WATCH_TIMEOUT_S`], a dropped connection or a
    /// restarted API server, from the server's current state): any event marks the published
    /// slices stale and calls `wake`, so the next [`Publisher::publish`] reconciles within the
    /// time the worker takes to run (the plugin wakes at once). Events of the publisher's own
    /// writes cost one list and write nothing. While no watch can be had, the slices are
    /// reconciled at each retry (2 s doubling to 30 s).
    pub(crate) fn watch(&mut self, wake: impl Fn() + Send + Sync + 'static) {
        let client = self.api.watch_client.clone();
        let fields = format!("spec.nodeName={},spec.driver={}", self.node, self.driver);
        let stale = self.stale.clone();
        let node = self.node.clone();
        let task = self.api.rt.spawn(async move {
            use tokio_stream::StreamExt;
            let mark = || {
                stale.store(true, Ordering::SeqCst);
                wake();
            };
            let mut pause = Duration::from_secs(2);
            loop {
                let wp = WatchParams::default().fields(&fields).timeout(WATCH_TIMEOUT_S);
                // "0": the server's current slices first (as ADDED), then their changes.
                match Api::<ResourceSlice>::all(client.clone()).watch(&wp, "0").await {
                    Ok(events) => {
                        let mut events = std::pin::pin!(events);
                        while let Some(ev) = events.next().await {
                            match ev {
                                Ok(
                                    WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_),
                                ) => {
                                    pause = Duration::from_secs(2);
                                    mark();
                                }
                                Ok(WatchEvent::Bookmark(_)) => {}
                                Ok(WatchEvent::Error(e)) => {
                                    warn!("the watch of node {node}'s ResourceSlices ended: {}", e.message);
                                    break;
                                }
                                Err(e) => {
                                    warn!(
                                        "the watch of node {node}'s ResourceSlices broke: {}",
                                        crate::model::ErrorChain(&e)
                                    );
                                    break;
                                }
                            }
                        }
                        continue;
                    }
                    Err(e) => warn!(
                        "cannot watch node {node}'s ResourceSlices (reconciling every {} s meanwhile): {}",
                        pause.as_secs(),
                        crate::model::ErrorChain(&e)
                    ),
                }
                mark();
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(30));
            }
        });
        if let Some(old) = self.watcher.replace(task.abort_handle()) {
            old.abort();
        }
    }

    /// Brings the API server's slices to `pool` when they may differ: the pool changed since
    /// the last success, or the watch saw them change.
    pub(crate) fn publish(&mut self, pool: &Pool) {
        if self.published.as_ref() == Some(pool) && !self.stale.load(Ordering::SeqCst) {
            return;
        }
        if let Some((at, _)) = self.retry {
            if Instant::now() < at {
                return;
            }
        }
        let t0 = Instant::now();
        // Cleared before the list: an event during the reconcile sets it again.
        let was_stale = self.stale.swap(false, Ordering::SeqCst);
        match self.sync_counted(pool) {
            Ok((writes, summary)) => {
                if was_stale && writes == 0 {
                    debug!(
                        "{summary} (after a watch event) in {} ms",
                        t0.elapsed().as_millis()
                    );
                } else {
                    info!(
                        "{summary}{} in {} ms",
                        if was_stale { " (after a watch event)" } else { "" },
                        t0.elapsed().as_millis()
                    );
                }
                self.published = Some(pool.clone());
                self.retry = None;
            }
            Err(e) => {
                if was_stale {
                    self.stale.store(true, Ordering::SeqCst);
                }
                let pause = self.retry.map_or(Duration::from_secs(2), |(_, p)| {
                    (p * 2).min(Duration::from_secs(60))
                });
                warn!(
                    "cannot publish the ResourceSlices of node {} (trying again in {} s): {e}",
                    self.node,
                    pause.as_secs()
                );
                self.retry = Some((Instant::now() + pause, pause));
            }
        }
    }

    /// One reconcile of the API server's slices of this node with `pool` (list, then create,
    /// replace and delete what differs), whether or not they may differ: what [`publish`]
    /// does when they may, without its retry pacing (benches/dra.rs times it).
    ///
    /// [`publish`]: Publisher::publish
    pub fn sync(&self, pool: &Pool) -> Result<String, CallError> {
        self.sync_counted(pool).map(|(_, s)| s)
    }

    /// [`Publisher::sync`], with the number of writes it made.
    fn sync_counted(&self, pool: &Pool) -> Result<(usize, String), CallError> {
        let node = self.node.clone();
        let owner = self
            .api
            .call(|c| async move { Api::<Node>::all(c).get(&node).await })?;
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: self.node.clone(),
            uid: owner.metadata.uid.unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: None,
        };
        let fields = format!("spec.nodeName={},spec.driver={}", self.node, self.driver);
        let existing = self.api.call(|c| async move {
            Api::<ResourceSlice>::all(c)
                .list(&ListParams::default().fields(&fields))
                .await
        })?;
        let ops = reconcile(&existing.items, pool, &self.node, &self.driver, Some(&owner));
        if ops.is_empty() {
            return Ok((
                0,
                format!(
                    "ResourceSlices of node {} already current ({} devices)",
                    self.node,
                    pool.devices.len()
                ),
            ));
        }
        let mut generation = 0;
        let (mut made, mut replaced, mut deleted) = (0, 0, 0);
        for op in ops {
            match op {
                SliceOp::Create(s) => {
                    generation = s.spec.pool.generation;
                    self.api.call(|c| async move {
                        Api::<ResourceSlice>::all(c)
                            .create(&PostParams::default(), &s)
                            .await
                    })?;
                    made += 1;
                }
                SliceOp::Replace(s) => {
                    generation = s.spec.pool.generation;
                    let name = s.metadata.name.clone().unwrap_or_default();
                    self.api.call(|c| async move {
                        Api::<ResourceSlice>::all(c)
                            .replace(&name, &PostParams::default(), &s)
                            .await
                    })?;
                    replaced += 1;
                }
                SliceOp::Delete(name) => {
                    let r = self.api.call(|c| async move {
                        Api::<ResourceSlice>::all(c)
                            .delete(&name, &DeleteParams::default())
                            .await
                            .map(|_| ())
                    });
                    match r {
                        Err(e) if e.is_not_found() => {}
                        r => r?,
                    }
                    deleted += 1;
                }
            }
        }
        Ok((
            made + replaced + deleted,
            format!(
                "published the ResourceSlices of node {} (driver {}, pool generation {generation}, {} devices): {made} created, {replaced} replaced, {deleted} deleted",
                self.node,
                self.driver,
                pool.devices.len()
            ),
        ))
    }
}

#[cfg(test)]
mod tests;
