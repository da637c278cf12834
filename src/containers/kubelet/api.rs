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
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

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
        let client = rt.block_on(async {
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
            cfg.connect_timeout = Some(timeout);
            cfg.read_timeout = Some(timeout);
            cfg.write_timeout = Some(timeout);
            kube::Client::try_from(cfg)
                .map_err(|e| ApiError::Client(crate::model::ErrorChain(&e).to_string()))
        })?;
        Ok(Arc::new(Kube { rt, client, timeout }))
    }

    /// The client (for a thread with a runtime of its own: [`super::binding`]'s watcher).
    pub fn client(&self) -> kube::Client {
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
pub struct Claims(pub Arc<Kube>);

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
pub enum SliceOp {
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
pub fn reconcile(
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

/// Publishes this node's pool and keeps it current: [`Publisher::publish`] is called with each
/// fresh pool; it writes only when the pool changed since the last success, and after a
/// failure tries again with a growing pause (2 s, doubling to 60 s).
#[derive(Debug)]
pub struct Publisher {
    pub api: Arc<Kube>,
    pub node: String,
    pub driver: String,
    published: Option<Pool>,
    retry: Option<(Instant, Duration)>,
}

impl Publisher {
    pub fn new(api: Arc<Kube>, node: String, driver: String) -> Self {
        Publisher {
            api,
            node,
            driver,
            published: None,
            retry: None,
        }
    }

    /// Brings the API server's slices to `pool` when they may differ.
    pub fn publish(&mut self, pool: &Pool) {
        if self.published.as_ref() == Some(pool) {
            return;
        }
        if let Some((at, _)) = self.retry {
            if Instant::now() < at {
                return;
            }
        }
        let t0 = Instant::now();
        match self.sync(pool) {
            Ok(summary) => {
                info!("{summary} in {} ms", t0.elapsed().as_millis());
                self.published = Some(pool.clone());
                self.retry = None;
            }
            Err(e) => {
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
            return Ok(format!(
                "ResourceSlices of node {} already current ({} devices)",
                self.node,
                pool.devices.len()
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
        Ok(format!(
            "published the ResourceSlices of node {} (driver {}, pool generation {generation}, {} devices): {made} created, {replaced} replaced, {deleted} deleted",
            self.node,
            self.driver,
            pool.devices.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of three devices (what a driver gives the kit).
    fn inv() -> Pool {
        Pool {
            devices: ["pci-0000-01-00-0", "pci-0000-02-00-0", "pci-0000-41-00-0"]
                .iter()
                .map(|n| Device {
                    name: n.to_string(),
                    ..Default::default()
                })
                .collect(),
            counter_sets: Vec::new(),
        }
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "n1".into(),
            uid: "node-uid".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }

    /// What the API server would hold after `ops` were applied to `existing`.
    fn applied(existing: &[ResourceSlice], ops: &[SliceOp]) -> Vec<ResourceSlice> {
        let mut v: Vec<ResourceSlice> = existing.to_vec();
        for op in ops {
            match op {
                SliceOp::Create(s) => {
                    assert!(
                        v.iter().all(|e| e.metadata.name != s.metadata.name),
                        "create of an existing slice"
                    );
                    v.push(s.clone());
                }
                SliceOp::Replace(s) => {
                    let e = v
                        .iter_mut()
                        .find(|e| e.metadata.name == s.metadata.name)
                        .expect("replace of a missing slice");
                    assert_eq!(e.metadata.resource_version, s.metadata.resource_version);
                    *e = s.clone();
                }
                SliceOp::Delete(n) => v.retain(|e| e.metadata.name.as_ref() != Some(n)),
            }
        }
        for (i, s) in v.iter_mut().enumerate() {
            s.metadata.resource_version = Some(format!("rv{i}"));
        }
        v
    }

    #[test]
    fn the_first_publication_creates_generation_one_and_a_second_changes_nothing() {
        let inv = inv();
        let ops = reconcile(&[], &inv, "n1", "vfio.gpupass.dev", Some(&owner()));
        assert!(!ops.is_empty());
        assert!(ops
            .iter()
            .all(|o| matches!(o, SliceOp::Create(s) if s.spec.pool.generation == 1
            && s.metadata.owner_references.as_deref() == Some(&[owner()][..]))));
        let now = applied(&[], &ops);
        assert_eq!(pool_devices(&now), inv.devices);
        assert_eq!(
            reconcile(&now, &inv, "n1", "vfio.gpupass.dev", Some(&owner())),
            Vec::new()
        );
    }

    #[test]
    fn a_changed_host_bumps_the_generation_and_replaces_in_place() {
        let inv = inv();
        let now = applied(
            &[],
            &reconcile(&[], &inv, "n1", "vfio.gpupass.dev", Some(&owner())),
        );
        // A device gone from the host: the slice that held it is replaced, generation 2.
        let mut fewer = now.clone();
        for s in &mut fewer {
            if let Some(d) = s.spec.devices.as_mut() {
                d.push(Device {
                    name: "stale".into(),
                    ..Default::default()
                });
            }
        }
        let ops = reconcile(&fewer, &inv, "n1", "vfio.gpupass.dev", Some(&owner()));
        assert!(
            ops.iter()
                .all(|o| matches!(o, SliceOp::Replace(s) if s.spec.pool.generation == 2)),
            "{ops:?}"
        );
        let after = applied(&fewer, &ops);
        assert_eq!(pool_devices(&after), inv.devices);
        assert_eq!(
            reconcile(&after, &inv, "n1", "vfio.gpupass.dev", Some(&owner())),
            Vec::new()
        );
    }

    #[test]
    fn slices_the_pool_no_longer_has_are_deleted_and_an_old_owner_is_replaced() {
        let inv = inv();
        let now = applied(
            &[],
            &reconcile(&[], &inv, "n1", "vfio.gpupass.dev", Some(&owner())),
        );
        let mut extra = now.clone();
        let mut s = now[0].clone();
        s.metadata.name = Some(pool::slice_name("n1", "vfio.gpupass.dev", 7));
        extra.push(s);
        let ops = reconcile(&extra, &inv, "n1", "vfio.gpupass.dev", Some(&owner()));
        assert!(
            ops.contains(&SliceOp::Delete(pool::slice_name("n1", "vfio.gpupass.dev", 7))),
            "{ops:?}"
        );
        assert_eq!(applied(&extra, &ops).len(), now.len());
        // The node was deleted and registered again (a new UID): every slice gets the new owner.
        let mut o2 = owner();
        o2.uid = "node-uid-2".into();
        let ops = reconcile(&now, &inv, "n1", "vfio.gpupass.dev", Some(&o2));
        assert!(!ops.is_empty());
        let after = applied(&now, &ops);
        assert!(after
            .iter()
            .all(|s| s.metadata.owner_references.as_deref() == Some(&[o2.clone()][..])));
    }
}
