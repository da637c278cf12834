//! The DRA side of the kit: a driver ([`DraDriver`]) served to the kubelet the way
//! Kubernetes' helper (`k8s.io/dynamic-resource-allocation/kubeletplugin`) serves one. The kit
//! does the kubelet's protocol: plugin registration (`Registration` on
//! `plugins_registry/<driver>-reg.sock`, through the `:authority` repair of [`super::authority`]),
//! `DRAPlugin` v1 and v1beta1 (one conversion) and `DRAResourceHealth` v1 on
//! `plugins/<driver>/dra.sock`, sockets 0600 in a 0700 directory ([`super::socket`]); it
//! serializes the calls on one worker thread that owns the driver (so the driver may borrow the
//! command's host operations and needs no lock of its own), reads each claim the kubelet names
//! from the API server and checks its UID before the driver sees it ([`super::claims::fetch`]),
//! and after every call, every `poll` and at once on a kernel uevent asks the driver for its
//! resources: the pool it publishes ([`Publish`], the API server's ResourceSlices) and the
//! health it streams. The driver implements Prepare and Unprepare on claims it is handed.

use super::binding::{DeviceKey, Failure};
use super::claims::{self, Claim, ClaimRef, ClaimSource};
use super::pool::Pool;
use super::proto::health::dra_resource_health_server::{DraResourceHealth, DraResourceHealthServer};
use super::proto::health::{
    DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesRequest, NodeWatchResourcesResponse,
};
use super::proto::registration::registration_server::{Registration, RegistrationServer};
use super::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use super::proto::{v1, v1beta1};
use super::socket::{listen, make_dir};
use crate::host::HostRoot;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

/// The registration type the kubelet's plugin watcher routes to its DRA manager.
pub(crate) const PLUGIN_TYPE: &str = "DRAPlugin";
/// The service versions this plugin serves (`PluginInfo.supported_versions`).
/// The health service is listed too: the kubelet opens the health stream only for a plugin
/// that names it (k8s.io/kubernetes v1.37.2 `pkg/kubelet/cm/dra/plugin`, `pickHealthService`).
pub(crate) const SUPPORTED_VERSIONS: [&str; 3] =
    ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth"];

/// `var/lib/kubelet/plugins_registry`: where the kubelet watches for registration sockets.
pub(crate) fn registry_dir(host: &HostRoot) -> PathBuf {
    host.path("var/lib/kubelet/plugins_registry")
}

/// `/var/lib/kubelet/plugins/<driver>` as the host names it: the plugin's data directory
/// (service socket, and what the driver keeps there). Logical (before the root).
pub(crate) fn plugin_dir_logical(driver: &str) -> String {
    format!("/var/lib/kubelet/plugins/{driver}")
}

/// One device as NodePrepareResources returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    pub cdi_device_ids: Vec<String>,
}

/// One device's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub device: String,
    pub healthy: bool,
    pub message: String,
}

/// What a driver has to offer, read now: the pool it publishes and every device's health.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Resources {
    pub pool: Pool,
    pub health: Vec<Health>,
}

/// A DRA driver as the kit serves it (upstream's `DRAPlugin` interface). Its methods are
/// called from one thread, one at a time. Results are by claim UID; an error is what the
/// kubelet puts in the Pod's events (the kit sends its whole chain).
pub(crate) trait DraDriver {
    type Error: std::error::Error + 'static;

    /// Once, before the sockets exist: the driver's clean-up of what an earlier run left
    /// (`claims` tells which claims the API server still has). Returns what was done, one
    /// line each, for the log.
    fn start(&mut self, claims: &dyn ClaimSource) -> Vec<String>;

    /// A claim this driver prepared already and answers for from its own record (the kubelet
    /// retries, or a second Pod shares the claim): its devices. The kit does not read such a
    /// claim from the API server.
    fn prepared(&self, _claim: &ClaimRef) -> Option<Vec<PreparedDevice>> {
        None
    }

    /// NodePrepareResources for `claims` (read and UID-checked by the kit), due by `deadline`
    /// (the gRPC call's).
    fn prepare_resource_claims(
        &mut self,
        claims: &[Claim],
        deadline: Option<Instant>,
    ) -> BTreeMap<String, Result<Vec<PreparedDevice>, Self::Error>>;

    /// NodeUnprepareResources for `claims`, due by `deadline`.
    fn unprepare_resource_claims(
        &mut self,
        claims: &[ClaimRef],
        deadline: Option<Instant>,
    ) -> BTreeMap<String, Result<(), Self::Error>>;

    /// The pool to publish and the health to stream, read now (after each call, every poll,
    /// on a kernel uevent; wake-ups queued together are answered by one call). A driver may
    /// answer the call right after its own change from the host as it read it after that
    /// change's writes, instead of reading it again.
    fn resources(&mut self) -> Result<Resources, Self::Error>;

    /// Binding conditions ([`super::binding`]): the work for `devices` of `claim` (allocated
    /// to this node, its Pod not bound yet) that the devices' binding condition waits on; Ok is
    /// the condition's message, an error the failure condition's reason and message. A driver
    /// that publishes no binding conditions keeps this default.
    fn bind_before_binding(&mut self, _claim: &Claim, _devices: &[DeviceKey]) -> Result<String, Failure> {
        Err(Failure {
            reason: "Unsupported".into(),
            message: "this driver does no work before binding".into(),
        })
    }

    /// Undo the work [`DraDriver::bind_before_binding`] did for every claim `gone` names (no
    /// longer allocated here) that the kubelet never prepared. Returns what was done, one line
    /// each, for the log.
    fn release_before_binding(&mut self, _gone: &dyn Fn(&ClaimRef) -> bool) -> Vec<String> {
        Vec::new()
    }
}

/// Where the plugin listens and who it is.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// The DRA driver name it registers under.
    pub driver: String,
    /// The pool its devices are in (the node's name): what the health stream names.
    pub pool: String,
    /// The kubelet's registration directory (`/var/lib/kubelet/plugins_registry`).
    pub registry_dir: PathBuf,
    /// The plugin's own directory (`/var/lib/kubelet/plugins/<driver>`): the service socket.
    pub plugin_dir: PathBuf,
    /// How often the driver's resources are read again.
    pub poll: Duration,
    /// Whether kernel uevents wake the poll at once (the live host; a `--root` tree has none).
    pub uevents: bool,
    /// How often the health stream sends every device's health again when nothing changed
    /// ([`HEALTH_EVERY`] in the plugin), so that the kubelet never marks a device Unknown.
    pub health_every: Duration,
}

/// How often the plugin sends the full health list when nothing changed. The kubelet marks a
/// device Unknown when it has had no message for it within the device's
/// `health_check_timeout_seconds` (its default, `DefaultHealthTimeout`, is 30 s when the field
/// is 0): every 10 s against a timeout of [`HEALTH_TIMEOUT_S`] leaves two messages' slack.
pub(crate) const HEALTH_EVERY: Duration = Duration::from_secs(10);

/// The `health_check_timeout_seconds` each device's health carries: three times
/// [`HEALTH_EVERY`], the kubelet's own default.
pub(crate) const HEALTH_TIMEOUT_S: i64 = 30;

impl Config {
    pub(crate) fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.driver))
    }

    pub(crate) fn service_socket(&self) -> PathBuf {
        self.plugin_dir.join("dra.sock")
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ServerError {
    #[error("cannot create {}; the kubelet's plugin directories must be writable by root", .path.display())]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on {}", .path.display())]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
}

type PrepareReply = BTreeMap<String, Result<Vec<PreparedDevice>, String>>;
type UnprepareReply = BTreeMap<String, Result<(), String>>;

/// A call for the worker.
enum Job {
    Prepare(Vec<ClaimRef>, Option<Instant>, oneshot::Sender<PrepareReply>),
    Unprepare(Vec<ClaimRef>, Option<Instant>, oneshot::Sender<UnprepareReply>),
    /// The claim watcher's ([`super::binding`]): its answer (a bind's outcome) on the sender.
    Binding(
        super::binding::Event,
        mpsc::Sender<Option<Result<String, Failure>>>,
    ),
    /// Something changed on the host: recompute health now.
    Wake,
    /// The servers stopped: end the worker.
    Stop,
}

struct Shared {
    jobs: Mutex<mpsc::Sender<Job>>,
    health: watch::Receiver<Vec<Health>>,
    driver: String,
    endpoint: String,
}

impl Shared {
    fn send(&self, job: Job) -> Result<(), Status> {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job)
            .map_err(|_| Status::unavailable("the plugin is shutting down"))
    }

    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
        deadline: Option<Instant>,
    ) -> Result<PrepareReply, Status> {
        let (tx, rx) = oneshot::channel();
        self.send(Job::Prepare(claims, deadline, tx))?;
        rx.await
            .map_err(|_| Status::internal("the plugin's worker stopped"))
    }

    async fn unprepare(
        &self,
        claims: Vec<ClaimRef>,
        deadline: Option<Instant>,
    ) -> Result<UnprepareReply, Status> {
        let (tx, rx) = oneshot::channel();
        self.send(Job::Unprepare(claims, deadline, tx))?;
        rx.await
            .map_err(|_| Status::internal("the plugin's worker stopped"))
    }
}

struct Registrar(std::sync::Arc<Shared>);

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        info!("the kubelet asked for the plugin's registration info");
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: self.0.driver.clone(),
            endpoint: self.0.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            info!("the kubelet registered {}", self.0.driver);
        } else {
            warn!("the kubelet refused to register {}: {}", self.0.driver, s.error);
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

struct Plugin(std::sync::Arc<Shared>);

/// A gRPC `grpc-timeout` header's value (`<at most 8 digits><unit>`, unit `H`, `M`, `S`, `m`,
/// `u` or `n`: gRPC's PROTOCOL-HTTP2.md) as a duration; `None` when absent or malformed.
pub(crate) fn grpc_timeout(v: &str) -> Option<Duration> {
    if !v.is_ascii() {
        return None;
    }
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// When a call is due: now plus its `grpc-timeout` (the kubelet sets one on every call).
fn deadline<T>(req: &Request<T>) -> Option<Instant> {
    let t = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    grpc_timeout(t).map(|d| Instant::now() + d)
}

/// The claims of a request, v1's or v1beta1's (the same three fields).
macro_rules! claim_refs {
    ($claims:expr) => {
        $claims
            .into_iter()
            .map(|c| ClaimRef {
                namespace: c.namespace,
                uid: c.uid,
                name: c.name,
            })
            .collect::<Vec<ClaimRef>>()
    };
}

fn refs_v1(claims: Vec<v1::Claim>) -> Vec<ClaimRef> {
    claim_refs!(claims)
}

fn prepare_v1(r: PrepareReply) -> v1::NodePrepareResourcesResponse {
    v1::NodePrepareResourcesResponse {
        claims: r
            .into_iter()
            .map(|(uid, res)| {
                let v = match res {
                    Ok(devs) => v1::NodePrepareResourceResponse {
                        devices: devs
                            .into_iter()
                            .map(|d| v1::Device {
                                request_names: vec![d.request],
                                pool_name: d.pool,
                                device_name: d.device,
                                cdi_device_ids: d.cdi_device_ids,
                                share_id: None,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(e) => v1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: e,
                    },
                };
                (uid, v)
            })
            .collect(),
    }
}

fn unprepare_v1(r: UnprepareReply) -> v1::NodeUnprepareResourcesResponse {
    v1::NodeUnprepareResourcesResponse {
        claims: r
            .into_iter()
            .map(|(uid, res)| {
                (
                    uid,
                    v1::NodeUnprepareResourceResponse {
                        error: res.err().unwrap_or_default(),
                    },
                )
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for Plugin {
    async fn node_prepare_resources(
        &self,
        req: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let due = deadline(&req);
        let r = self.0.prepare(refs_v1(req.into_inner().claims), due).await?;
        Ok(Response::new(prepare_v1(r)))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let due = deadline(&req);
        let r = self.0.unprepare(refs_v1(req.into_inner().claims), due).await?;
        Ok(Response::new(unprepare_v1(r)))
    }
}

/// v1beta1: the same messages without `share_id`, served by converting to and from v1.
#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for Plugin {
    async fn node_prepare_resources(
        &self,
        req: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let due = deadline(&req);
        let claims = claim_refs!(req.into_inner().claims);
        let r = prepare_v1(self.0.prepare(claims, due).await?);
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims: r
                .claims
                .into_iter()
                .map(|(uid, c)| {
                    (
                        uid,
                        v1beta1::NodePrepareResourceResponse {
                            devices: c
                                .devices
                                .into_iter()
                                .map(|d| v1beta1::Device {
                                    request_names: d.request_names,
                                    pool_name: d.pool_name,
                                    device_name: d.device_name,
                                    cdi_device_ids: d.cdi_device_ids,
                                })
                                .collect(),
                            error: c.error,
                        },
                    )
                })
                .collect(),
        }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let due = deadline(&req);
        let claims = claim_refs!(req.into_inner().claims);
        let r = unprepare_v1(self.0.unprepare(claims, due).await?);
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims: r
                .claims
                .into_iter()
                .map(|(uid, c)| (uid, v1beta1::NodeUnprepareResourceResponse { error: c.error }))
                .collect(),
        }))
    }
}

type HealthStream = Pin<Box<dyn Stream<Item = Result<NodeWatchResourcesResponse, Status>> + Send + 'static>>;

/// The health stream's messages for `h` (every device, in name order).
pub(crate) fn health_message(pool: &str, h: &[Health], now_s: i64) -> NodeWatchResourcesResponse {
    NodeWatchResourcesResponse {
        devices: h
            .iter()
            .map(|d| DeviceHealth {
                device: Some(DeviceIdentifier {
                    pool_name: pool.to_string(),
                    device_name: d.device.clone(),
                }),
                health: if d.healthy {
                    HealthStatus::Healthy
                } else {
                    HealthStatus::Unhealthy
                } as i32,
                last_updated_time: now_s,
                health_check_timeout_seconds: HEALTH_TIMEOUT_S,
                message: d.message.chars().take(1024).collect(),
            })
            .collect(),
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

struct HealthService {
    shared: std::sync::Arc<Shared>,
    pool: String,
    every: Duration,
}

#[tonic::async_trait]
impl DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _: Request<NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        // Every device's health at once, again at each change, and again every `every` when
        // nothing changed (a stream that only spoke on changes left the kubelet's timeout to
        // turn healthy devices Unknown). The stream ends when the worker drops the sender.
        let (pool, every) = (self.pool.clone(), self.every);
        let mut rx = self.shared.health.clone();
        let (tx, out) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let h = rx.borrow_and_update().clone();
                if tx.send(Ok(health_message(&pool, &h, unix_now()))).await.is_err() {
                    break; // the kubelet closed the stream
                }
                tokio::select! {
                    changed = rx.changed() => {
                        if changed.is_err() {
                            break; // the worker ended: so does the stream
                        }
                        tick.reset();
                    }
                    _ = tick.tick() => {}
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }
}

/// What the worker hands each fresh pool to: the API server's ResourceSlices
/// ([`super::api::Publisher`]) in the plugin, nothing in tests without an API server.
pub(crate) trait Publish: Send {
    fn publish(&mut self, pool: &Pool);

    /// Start watching what was published; `wake` makes the worker publish again at once (the
    /// published slices changed behind the plugin's back). Nothing by default.
    fn watch(&mut self, _wake: Box<dyn Fn() + Send + Sync>) {}
}

impl Publish for super::api::Publisher {
    fn publish(&mut self, pool: &Pool) {
        super::api::Publisher::publish(self, pool)
    }

    fn watch(&mut self, wake: Box<dyn Fn() + Send + Sync>) {
        super::api::Publisher::watch(self, wake)
    }
}

/// One claim of a Prepare: answered from the driver's record, or read (UID checked) and
/// handed to the driver.
fn prepare_one<D: DraDriver>(
    driver: &mut D,
    source: &dyn ClaimSource,
    c: &ClaimRef,
    due: Option<Instant>,
) -> Result<Vec<PreparedDevice>, String> {
    if let Some(devices) = driver.prepared(c) {
        return Ok(devices);
    }
    let claim = claims::fetch(source, c).map_err(|e| crate::model::ErrorChain(&e).to_string())?;
    match driver
        .prepare_resource_claims(std::slice::from_ref(&claim), due)
        .remove(&c.uid)
    {
        Some(r) => r.map_err(|e| crate::model::ErrorChain(&e).to_string()),
        None => Err(format!(
            "the driver gave no result for claim {}/{} ({})",
            c.namespace, c.name, c.uid
        )),
    }
}

/// The worker: runs the driver's calls one by one, keeps the health current and the node's
/// ResourceSlices published. Claims are handed to the driver one at a time, so each claim's
/// log line carries its own duration (lab/scenarios/drabench.sh reads it).
fn worker<D: DraDriver>(
    mut driver: D,
    source: &dyn ClaimSource,
    jobs: mpsc::Receiver<Job>,
    health: watch::Sender<Vec<Health>>,
    poll: Duration,
    mut publisher: Option<Box<dyn Publish + '_>>,
) {
    let mut refresh = |driver: &mut D| match driver.resources() {
        Ok(r) => {
            if let Some(p) = publisher.as_mut() {
                p.publish(&r.pool);
            }
            let h = r.health;
            health.send_if_modified(|old| {
                if *old != h {
                    for d in h.iter().filter(|d| !d.healthy) {
                        if !old.iter().any(|o| o == d) {
                            warn!("{} is Unhealthy: {}", d.device, d.message);
                        }
                    }
                    *old = h;
                    true
                } else {
                    false
                }
            });
        }
        Err(e) => warn!(
            "cannot read the host for device health: {}",
            crate::model::ErrorChain(&e)
        ),
    };
    refresh(&mut driver);
    // A job taken off the queue while wake-ups were coalesced (below), run next.
    let mut next: Option<Job> = None;
    loop {
        let job = match next.take() {
            Some(j) => Ok(j),
            None => jobs.recv_timeout(poll),
        };
        match job {
            Ok(Job::Prepare(claims, due, reply)) => {
                let mut out = BTreeMap::new();
                for c in claims {
                    let t0 = Instant::now();
                    let r = prepare_one(&mut driver, source, &c, due).inspect_err(|m| {
                        warn!("prepare {}/{}: {m}", c.namespace, c.name);
                    });
                    if r.is_ok() {
                        // The duration is what lab/scenarios/drabench.sh reads.
                        info!(
                            "prepared claim {}/{} ({}) in {} us",
                            c.namespace,
                            c.name,
                            c.uid,
                            t0.elapsed().as_micros()
                        );
                    }
                    out.insert(c.uid, r);
                }
                let _ = reply.send(out);
                refresh(&mut driver);
            }
            Ok(Job::Unprepare(claims, due, reply)) => {
                let mut out = BTreeMap::new();
                for c in claims {
                    let t0 = Instant::now();
                    let r = match driver
                        .unprepare_resource_claims(std::slice::from_ref(&c), due)
                        .remove(&c.uid)
                    {
                        Some(r) => r.map_err(|e| crate::model::ErrorChain(&e).to_string()),
                        None => Err(format!(
                            "the driver gave no result for claim {}/{} ({})",
                            c.namespace, c.name, c.uid
                        )),
                    }
                    .inspect_err(|m| warn!("unprepare {}/{}: {m}", c.namespace, c.name));
                    if r.is_ok() {
                        info!(
                            "unprepared claim {}/{} ({}) in {} us",
                            c.namespace,
                            c.name,
                            c.uid,
                            t0.elapsed().as_micros()
                        );
                    }
                    out.insert(c.uid, r);
                }
                let _ = reply.send(out);
                refresh(&mut driver);
            }
            Ok(Job::Binding(ev, reply)) => {
                let r = binding_job(&mut driver, ev);
                if matches!(r, Some(Err(_))) {
                    // A failure's slices first (a busy device's taint), then the failure
                    // condition: the scheduler, which deallocates the claim on that condition,
                    // then sees the taint before it chooses again.
                    refresh(&mut driver);
                    let _ = reply.send(r);
                } else {
                    let _ = reply.send(r);
                    refresh(&mut driver);
                }
            }
            Ok(Job::Wake) | Err(mpsc::RecvTimeoutError::Timeout) => {
                // The wake-ups queued behind this one (a bind's uevents come in a burst: the
                // unbind, the bind, the VFIO nodes) are answered by this one read of the
                // host, which comes after all of them; the first other job keeps its turn.
                while let Ok(j) = jobs.try_recv() {
                    if !matches!(j, Job::Wake) {
                        next = Some(j);
                        break;
                    }
                }
                refresh(&mut driver)
            }
            Ok(Job::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
}

/// One event of the claim watcher, on the worker.
fn binding_job<D: DraDriver>(driver: &mut D, ev: super::binding::Event) -> Option<Result<String, Failure>> {
    use super::binding::Event;
    let released = match ev {
        Event::Bind { claim, devices } => return Some(driver.bind_before_binding(&claim, &devices)),
        Event::Release(c) => driver.release_before_binding(&|x: &ClaimRef| x.uid == c.uid),
        Event::Sync(here) => driver.release_before_binding(&|x: &ClaimRef| !here.contains(&x.uid)),
    };
    for line in released {
        info!("{line}");
    }
    None
}

/// Serve `driver` until `shutdown` completes: its start-up clean-up, then the sockets. Blocks
/// (it runs its own runtime). The tests' entry; the plugin's is [`run_with`].
#[cfg(test)]
pub(crate) fn run<'a, D: DraDriver + Send + 'a>(
    driver: D,
    cfg: &Config,
    source: Box<dyn ClaimSource + 'a>,
    publisher: Option<Box<dyn Publish + 'a>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServerError> {
    run_with(driver, cfg, source, publisher, None, shutdown)
}

/// [`run`], with the claim watcher of [`super::binding`] when `binding` is given (the driver
/// publishes binding conditions).
pub(crate) fn run_with<'a, D: DraDriver + Send + 'a>(
    driver: D,
    cfg: &Config,
    source: Box<dyn ClaimSource + 'a>,
    publisher: Option<Box<dyn Publish + 'a>>,
    binding: Option<super::binding::Watch>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServerError> {
    let mut driver = driver;
    for line in driver.start(source.as_ref()) {
        info!("{line}");
    }
    let dir = |path: &Path, mode| {
        make_dir(path, mode).map_err(|e| ServerError::Dir {
            path: path.to_path_buf(),
            source: e,
        })
    };
    dir(&cfg.registry_dir, None)?;
    dir(&cfg.plugin_dir, Some(0o700))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ServerError::Runtime)?;
    let pool = cfg.pool.clone();
    let health_every = cfg.health_every;
    let (job_tx, job_rx) = mpsc::channel::<Job>();
    let (health_tx, health_rx) = watch::channel(Vec::new());
    let reg_path = cfg.registration_socket();
    let svc_path = cfg.service_socket();
    let shared = std::sync::Arc::new(Shared {
        jobs: Mutex::new(job_tx.clone()),
        health: health_rx,
        driver: cfg.driver.clone(),
        endpoint: svc_path.to_string_lossy().into_owned(),
    });
    let poll = cfg.poll;
    let listen = |path: &Path| {
        listen(path).map_err(|e| ServerError::Listen {
            path: path.to_path_buf(),
            source: e,
        })
    };
    let mut publisher = publisher;
    if let Some(p) = publisher.as_mut() {
        // Slices deleted or edited by anyone (the kubelet wipes them at its start): published
        // again at once.
        let tx = job_tx.clone();
        p.watch(Box::new(move || {
            let _ = tx.send(Job::Wake);
        }));
    }
    std::thread::scope(|scope| {
        let source = source.as_ref();
        scope.spawn(move || worker(driver, source, job_rx, health_tx, poll, publisher));
        if cfg.uevents {
            // Kernel uevents wake the health refresh at once; the poll stays as the fallback.
            let tx = job_tx.clone();
            super::wake_on_uevents(move || tx.send(Job::Wake).is_ok());
        }
        let watch_stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        if let Some(w) = binding {
            let tx = Mutex::new(job_tx.clone());
            let handler = move |ev| {
                let (reply_tx, reply_rx) = mpsc::channel();
                tx.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .send(Job::Binding(ev, reply_tx))
                    .ok()?;
                reply_rx.recv().ok().flatten()
            };
            super::binding::spawn(w, Box::new(handler), watch_stop.clone());
        }
        drop(job_tx);
        let r = rt.block_on(async {
            // The service socket first: the kubelet dials it as soon as registration succeeds.
            let svc = listen(&svc_path)?;
            let reg = listen(&reg_path)?;
            let (stop_tx, stop_rx) = watch::channel(false);
            let stopped = |mut rx: watch::Receiver<bool>| async move {
                let _ = rx.wait_for(|v| *v).await;
            };
            let s1 = tonic::transport::Server::builder()
                .add_service(v1::dra_plugin_server::DraPluginServer::new(Plugin(
                    shared.clone(),
                )))
                .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(Plugin(
                    shared.clone(),
                )))
                .add_service(DraResourceHealthServer::new(HealthService {
                    shared: shared.clone(),
                    pool,
                    every: health_every,
                }))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(svc),
                    stopped(stop_rx.clone()),
                );
            // The registration socket through the `:authority` repair (super::authority: the
            // kubelet's plugin watcher sends the socket's path, which h2 refuses).
            let (conn_tx, conn_rx) =
                tokio::sync::mpsc::channel::<std::io::Result<tokio::io::DuplexStream>>(4);
            let accept = tokio::spawn(async move {
                while let Ok((c, _)) = reg.accept().await {
                    let (ours, theirs) = tokio::io::duplex(64 * 1024);
                    if conn_tx.send(Ok(theirs)).await.is_err() {
                        break;
                    }
                    tokio::spawn(super::authority::relay(c, ours));
                }
            });
            let s2 = tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(Registrar(shared.clone())))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::ReceiverStream::new(conn_rx),
                    stopped(stop_rx),
                );
            let t1 = tokio::spawn(s1);
            let t2 = tokio::spawn(s2);
            info!(
                "serving {} on {} (registration {})",
                shared.driver,
                svc_path.display(),
                reg_path.display()
            );
            shutdown.await;
            watch_stop.store(true, std::sync::atomic::Ordering::SeqCst);
            accept.abort();
            // The worker first: it drops the health sender, which ends every health stream
            // (a graceful shutdown waits for open streams, and the kubelet keeps that one open).
            let _ = shared.send(Job::Stop);
            let _ = stop_tx.send(true);
            for mut t in [t1, t2] {
                match tokio::time::timeout(Duration::from_secs(5), &mut t).await {
                    Ok(Ok(Err(e))) => warn!("a gRPC server stopped: {}", crate::model::ErrorChain(&e)),
                    Ok(Err(e)) => warn!("a gRPC server task failed: {e}"),
                    Ok(Ok(Ok(()))) => {}
                    Err(_) => {
                        warn!("a gRPC server did not stop within 5 s; closing it");
                        t.abort();
                    }
                }
            }
            Ok::<(), ServerError>(())
        });
        // The worker ends on Stop (the uevent thread may still hold a sender); the scope
        // waits for it.
        let _ = shared.send(Job::Stop);
        drop(shared);
        let _ = std::fs::remove_file(&reg_path);
        let _ = std::fs::remove_file(&svc_path);
        r
    })
}

#[cfg(test)]
mod tests;
