//! The gRPC side of `gpupass dra-plugin`: the kubelet's plugin registration (`Registration`
//! on `plugins_registry/<driver>-reg.sock`), `DRAPlugin` v1 and v1beta1 and
//! `DRAResourceHealth` v1 on `plugins/<driver>/dra.sock`. Sockets are 0600 in 0700
//! directories (only root, i.e. the kubelet, may talk to them).
//!
//! The handlers do no work themselves: they hand each call to one worker thread that owns the
//! [`Engine`] (so calls are serialized and the engine may borrow the command's host
//! operations), and that thread re-reads the host every `poll` (and at once on a kernel
//! uevent) to feed the health stream.

use super::claim::{ClaimRef, PreparedDevice};
use super::prepare::{Engine, Health};
use super::proto::health::dra_resource_health_server::{DraResourceHealth, DraResourceHealthServer};
use super::proto::health::{
    DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesRequest, NodeWatchResourcesResponse,
};
use super::proto::registration::registration_server::{Registration, RegistrationServer};
use super::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use super::proto::{v1, v1beta1};
use super::{PLUGIN_TYPE, SUPPORTED_VERSIONS};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

/// Where the plugin listens and who it is.
#[derive(Debug, Clone)]
pub struct Config {
    /// The kubelet's registration directory (`/var/lib/kubelet/plugins_registry`).
    pub registry_dir: PathBuf,
    /// The plugin's own directory (`/var/lib/kubelet/plugins/<driver>`): the service socket.
    pub plugin_dir: PathBuf,
    pub poll: Duration,
}

impl Config {
    pub fn registration_socket(&self, driver: &str) -> PathBuf {
        self.registry_dir.join(format!("{driver}-reg.sock"))
    }

    pub fn service_socket(&self) -> PathBuf {
        self.plugin_dir.join("dra.sock")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
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
    #[error(transparent)]
    Prepare(#[from] super::prepare::PrepareError),
    #[error("cannot read the boot id ({}); the plugin needs it to tell a reboot from a restart", .path.display())]
    BootId {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

type PrepareReply = BTreeMap<String, Result<Vec<PreparedDevice>, String>>;
type UnprepareReply = BTreeMap<String, Result<(), String>>;

/// A call for the worker.
enum Job {
    Prepare(Vec<ClaimRef>, Option<Instant>, oneshot::Sender<PrepareReply>),
    Unprepare(Vec<ClaimRef>, Option<Instant>, oneshot::Sender<UnprepareReply>),
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
pub fn grpc_timeout(v: &str) -> Option<Duration> {
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
pub fn health_message(pool: &str, h: &[Health], now_s: i64) -> NodeWatchResourcesResponse {
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
                health_check_timeout_seconds: 0,
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
}

#[tonic::async_trait]
impl DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _: Request<NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let pool = self.pool.clone();
        let s = tokio_stream::wrappers::WatchStream::new(self.shared.health.clone())
            .map(move |h| Ok(health_message(&pool, &h, unix_now())));
        Ok(Response::new(Box::pin(s)))
    }
}

/// What the worker hands each fresh inventory to: the API server's ResourceSlices
/// ([`super::api::Publisher`]) in the plugin, nothing in tests without an API server.
pub trait Publish: Send {
    fn publish(&mut self, inv: &crate::model::Inventory);
}

impl Publish for super::api::Publisher {
    fn publish(&mut self, inv: &crate::model::Inventory) {
        super::api::Publisher::publish(self, inv)
    }
}

/// The worker: runs the engine's calls one by one, keeps the health current and the node's
/// ResourceSlices published.
fn worker(
    mut engine: Engine<'_>,
    jobs: mpsc::Receiver<Job>,
    health: watch::Sender<Vec<Health>>,
    poll: Duration,
    mut publisher: Option<Box<dyn Publish + '_>>,
) {
    let mut refresh = |engine: &mut Engine<'_>| match crate::inventory::scan(engine.ops.root()) {
        Ok(inv) => {
            if let Some(p) = publisher.as_mut() {
                p.publish(&engine.as_offered(&inv));
            }
            let h = engine.health(&inv);
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
    refresh(&mut engine);
    loop {
        match jobs.recv_timeout(poll) {
            Ok(Job::Prepare(claims, due, reply)) => {
                let mut out = BTreeMap::new();
                for c in claims {
                    let t0 = Instant::now();
                    let r = engine.prepare_until(&c, due).map_err(|e| {
                        let m = crate::model::ErrorChain(&e).to_string();
                        warn!("prepare {}/{}: {m}", c.namespace, c.name);
                        m
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
                refresh(&mut engine);
            }
            Ok(Job::Unprepare(claims, due, reply)) => {
                let mut out = BTreeMap::new();
                for c in claims {
                    let t0 = Instant::now();
                    let r = engine.unprepare_until(&c.uid, due).map_err(|e| {
                        let m = crate::model::ErrorChain(&e).to_string();
                        warn!("unprepare {}/{}: {m}", c.namespace, c.name);
                        m
                    });
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
                refresh(&mut engine);
            }
            Ok(Job::Wake) | Err(mpsc::RecvTimeoutError::Timeout) => refresh(&mut engine),
            Ok(Job::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
}

/// A unix socket listener at `path` (an old socket replaced), mode 0600.
fn listen(path: &Path) -> Result<tokio::net::UnixListener, ServerError> {
    let err = |e| ServerError::Listen {
        path: path.to_path_buf(),
        source: e,
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let l = tokio::net::UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(l)
}

fn make_dir(path: &Path, mode: Option<u32>) -> Result<(), ServerError> {
    let err = |e| ServerError::Dir {
        path: path.to_path_buf(),
        source: e,
    };
    std::fs::create_dir_all(path).map_err(err)?;
    if let Some(m) = mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(m)).map_err(err)?;
    }
    Ok(())
}

/// Serve until `shutdown` completes: the cleanup of claims left from before, then the
/// sockets. Blocks (it runs its own runtime).
pub fn run<'a>(
    engine: Engine<'a>,
    cfg: &Config,
    publisher: Option<Box<dyn Publish + 'a>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServerError> {
    let mut engine = engine;
    for line in engine.cleanup_at_start() {
        info!("{line}");
    }
    make_dir(&cfg.registry_dir, None)?;
    make_dir(&cfg.plugin_dir, Some(0o700))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ServerError::Runtime)?;
    let driver = engine.me.driver.clone();
    let pool = engine.me.pool.clone();
    let live = engine.ops.root().root() == Path::new("/");
    let (job_tx, job_rx) = mpsc::channel::<Job>();
    let (health_tx, health_rx) = watch::channel(Vec::new());
    let reg_path = cfg.registration_socket(&driver);
    let svc_path = cfg.service_socket();
    let shared = std::sync::Arc::new(Shared {
        jobs: Mutex::new(job_tx.clone()),
        health: health_rx,
        driver,
        endpoint: svc_path.to_string_lossy().into_owned(),
    });
    let poll = cfg.poll;
    std::thread::scope(|scope| {
        scope.spawn(move || worker(engine, job_rx, health_tx, poll, publisher));
        if live {
            // Kernel uevents wake the health refresh at once; the poll stays as the fallback.
            match crate::host::uevents::UeventSocket::open() {
                Ok(sock) => {
                    let tx = job_tx.clone();
                    std::thread::spawn(move || {
                        while let Ok(ev) = sock.next(None) {
                            if ev.is_some() && tx.send(Job::Wake).is_err() {
                                break;
                            }
                        }
                    });
                }
                Err(e) => warn!("no kernel uevents ({e}); polling only"),
            }
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
mod tests {
    //! The services over real unix sockets with tonic's client playing the kubelet, against
    //! the `workstation` fixture host on the test kit's fake kernel (binds take the kernel's
    //! visible effect on the tree).
    use super::super::checkpoint;
    use super::super::claim::Identity;
    use super::super::proto::health::dra_resource_health_client::DraResourceHealthClient;
    use super::super::proto::registration::registration_client::RegistrationClient;
    use super::*;
    use crate::host::HostRoot;
    use crate::testkit::FakeHost;
    use serde_json::json;

    const GPU: &str = "pci-0000-01-00-0";

    fn driver_of(root: &Path, a: &str) -> Option<String> {
        std::fs::read_link(root.join("sys/bus/pci/devices").join(a).join("driver"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
    }

    /// Re-point a function's driver link (a driver change behind gpupass's back).
    fn set_driver(root: &Path, a: &str, driver: &str) {
        let link = root.join("sys/bus/pci/devices").join(a).join("driver");
        let t = std::fs::read_link(&link).unwrap();
        let new = t.parent().unwrap().join(driver);
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(new, &link).unwrap();
    }

    fn write_claim(dir: &Path, name: &str, uid: &str, device: &str) {
        let c = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "status": {"allocation": {
                "devices": {"results": [{"request": "vfio", "driver": "vfio.gpupass.dev", "pool": "node-a", "device": device}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}
            }}
        });
        std::fs::create_dir_all(dir.join("default")).unwrap();
        std::fs::write(dir.join(format!("default/{name}.json")), c.to_string()).unwrap();
    }

    async fn channel(p: &Path) -> tonic::transport::Channel {
        for _ in 0..200 {
            if p.exists() {
                if let Ok(c) = crate::containers::deviceplugin::server::connect_unix(p).await {
                    return c;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{} never came up", p.display());
    }

    fn claim(uid: &str, name: &str) -> v1::Claim {
        v1::Claim {
            namespace: "default".into(),
            uid: uid.into(),
            name: name.into(),
        }
    }

    /// The next health message in which `device` has `want`, within 10 s.
    async fn health_of(
        s: &mut tonic::Streaming<NodeWatchResourcesResponse>,
        device: &str,
        want: HealthStatus,
    ) -> DeviceHealth {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let m = tokio::time::timeout_at(deadline, s.message())
                .await
                .expect("health in time")
                .unwrap()
                .unwrap();
            if let Some(d) = m.devices.into_iter().find(|d| {
                d.device
                    .as_ref()
                    .is_some_and(|i| i.device_name == device && i.pool_name == "node-a")
            }) {
                if d.health == want as i32 {
                    return d;
                }
            }
        }
    }

    #[test]
    fn registers_prepares_serializes_watches_health_and_unprepares_over_unix_sockets() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("host");
        crate::testkit::fixtures::build("workstation", &root).unwrap();
        std::fs::create_dir_all(root.join("proc/sys/kernel/random")).unwrap();
        std::fs::write(root.join("proc/sys/kernel/random/boot_id"), "b0-boot\n").unwrap();
        let claims = t.path().join("claims");
        write_claim(&claims, "gpu", "u1", GPU);
        write_claim(&claims, "gpu2", "u2", GPU);
        write_claim(&claims, "nope", "u3", "pci-0000-02-00-0");
        let cfg = Config {
            registry_dir: t.path().join("registry"),
            plugin_dir: t.path().join("plugin"),
            poll: Duration::from_millis(20),
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = {
            let (root, cfg, claims) = (root.clone(), cfg.clone(), claims.clone());
            std::thread::spawn(move || {
                let ops = FakeHost::new(HostRoot::new(&root));
                let me = Identity {
                    driver: "vfio.gpupass.dev".into(),
                    node: "node-a".into(),
                    pool: "node-a".into(),
                };
                let engine = Engine::new(
                    &ops,
                    Box::new(super::super::source::Dir { dir: claims }),
                    me,
                    crate::inventory::backend::Policy::Auto,
                    "b0-boot".into(),
                )
                .unwrap()
                // Longer than the call's deadline below: the deadline bounds the wait.
                .with_lock_wait(Duration::from_secs(30));
                run(engine, &cfg, None, async {
                    let _ = stop_rx.await;
                })
                .unwrap();
            })
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // Registration: what the kubelet's plugin watcher asks first.
            let reg = cfg.registration_socket("vfio.gpupass.dev");
            let info = RegistrationClient::new(channel(&reg).await)
                .get_info(InfoRequest {})
                .await
                .unwrap()
                .into_inner();
            assert_eq!(info.r#type, "DRAPlugin");
            assert_eq!(info.name, "vfio.gpupass.dev");
            assert_eq!(
                info.supported_versions,
                ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth"]
            );
            assert_eq!(PathBuf::from(&info.endpoint), cfg.service_socket());
            for p in [&reg, &cfg.service_socket()] {
                assert_eq!(std::fs::metadata(p).unwrap().permissions().mode() & 0o777, 0o600, "{}", p.display());
            }
            assert_eq!(std::fs::metadata(&cfg.plugin_dir).unwrap().permissions().mode() & 0o777, 0o700);

            let svc = channel(&cfg.service_socket()).await;
            let mut health = DraResourceHealthClient::new(svc.clone())
                .node_watch_resources(NodeWatchResourcesRequest {})
                .await
                .unwrap()
                .into_inner();
            health_of(&mut health, GPU, HealthStatus::Healthy).await;

            // Another gpupass holds the lock: a Prepare due in 2 s waits for it only until
            // its deadline (less the margin), fails naming the lock, and changes nothing.
            let mut dra = v1::dra_plugin_client::DraPluginClient::new(svc.clone());
            let held = crate::change::journal::lock(&HostRoot::new(&root), Duration::ZERO).unwrap();
            let mut req = Request::new(v1::NodePrepareResourcesRequest {
                claims: vec![claim("u1", "gpu")],
            });
            req.set_timeout(Duration::from_secs(2));
            let t0 = std::time::Instant::now();
            let r = dra.node_prepare_resources(req).await.unwrap().into_inner();
            assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
            let err = &r.claims["u1"].error;
            assert!(err.contains("another gpupass") && err.contains("did not finish within 1."), "{err}");
            assert_eq!(driver_of(&root, "0000:01:00.0").as_deref(), Some("nvidia"));
            drop(held);

            // Prepare: the whole group (GPU and its audio function) goes to vfio-pci.
            let r = dra
                .node_prepare_resources(v1::NodePrepareResourcesRequest {
                    claims: vec![claim("u1", "gpu")],
                })
                .await
                .unwrap()
                .into_inner();
            let c = &r.claims["u1"];
            assert_eq!(c.error, "");
            assert_eq!(c.devices.len(), 1);
            assert_eq!(c.devices[0].device_name, GPU);
            assert_eq!(c.devices[0].pool_name, "node-a");
            assert_eq!(c.devices[0].request_names, ["vfio"]);
            assert_eq!(
                c.devices[0].cdi_device_ids,
                [
                    format!("vfio.gpupass.dev/claim=u1-{GPU}"),
                    "vfio.gpupass.dev/metadata=u1_vfio".to_string()
                ]
            );
            assert_eq!(driver_of(&root, "0000:01:00.0").as_deref(), Some("vfio-pci"));
            assert_eq!(driver_of(&root, "0000:01:00.1").as_deref(), Some("vfio-pci"));
            let spec = std::fs::read_to_string(root.join("var/run/cdi/vfio.gpupass.dev_claim_u1.json")).unwrap();
            let spec: serde_json::Value = serde_json::from_str(&spec).unwrap();
            assert_eq!(spec["kind"], "vfio.gpupass.dev/claim");
            let nodes: Vec<&str> = spec["devices"][0]["containerEdits"]["deviceNodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n["path"].as_str().unwrap())
                .collect();
            assert_eq!(nodes, ["/dev/vfio/vfio", "/dev/vfio/1"], "legacy: this fixture kernel has no VFIO cdev");
            let meta = std::fs::read_to_string(
                root.join("var/lib/kubelet/plugins/vfio.gpupass.dev/dra-device-metadata/default_gpu/vfio/metadata.json"),
            )
            .unwrap();
            let docs: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&meta)
                .into_iter::<serde_json::Value>()
                .map(Result::unwrap)
                .collect();
            assert_eq!(docs.len(), 2);
            assert_eq!(docs[0]["apiVersion"], "metadata.resource.k8s.io/v1beta1");
            assert_eq!(docs[1]["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
            for d in &docs {
                assert_eq!(d["metadata"]["uid"], "u1");
                assert_eq!(
                    d["requests"][0]["devices"][0]["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
                    "0000:01:00.0"
                );
            }
            let mspec = std::fs::read_to_string(root.join("var/run/cdi/vfio.gpupass.dev_metadata_u1_vfio.json")).unwrap();
            assert!(mspec.contains("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/gpu/vfio/vfio.gpupass.dev-metadata.json"), "{mspec}");
            let writes = std::fs::read_to_string(crate::change::journal::journal_path(&HostRoot::new(&root))).unwrap().lines().count();

            // Kubelet retries: the same answer, no host change.
            let again = dra
                .node_prepare_resources(v1::NodePrepareResourcesRequest {
                    claims: vec![claim("u1", "gpu")],
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(again, r);
            assert_eq!(
                std::fs::read_to_string(crate::change::journal::journal_path(&HostRoot::new(&root))).unwrap().lines().count(),
                writes
            );

            // A second claim for the same group is refused naming the first; a device not
            // offered here and a UID that is not the claim's are refused too.
            let r2 = dra
                .node_prepare_resources(v1::NodePrepareResourcesRequest {
                    claims: vec![claim("u2", "gpu2"), claim("u3", "nope"), claim("u9", "gpu")],
                })
                .await
                .unwrap()
                .into_inner();
            assert!(r2.claims["u2"].error.contains("is prepared for claim default/gpu (u1)"), "{}", r2.claims["u2"].error);
            assert!(r2.claims["u3"].error.contains("is not a device this node offers"), "{}", r2.claims["u3"].error);
            assert!(r2.claims["u9"].error.contains("the API server has UID u1"), "{}", r2.claims["u9"].error);
            assert!(r2.claims.values().all(|c| c.devices.is_empty()));

            // Health: the audio function taken by its host driver behind gpupass's back (the
            // stream only speaks on a change: it was Healthy all along).
            set_driver(&root, "0000:01:00.1", "snd_hda_intel");
            let h = health_of(&mut health, GPU, HealthStatus::Unhealthy).await;
            assert!(h.message.contains("0000:01:00.1"), "{}", h.message);
            set_driver(&root, "0000:01:00.1", "vfio-pci");
            health_of(&mut health, GPU, HealthStatus::Healthy).await;

            // Unprepare: both functions back on their drivers, files and entry gone; twice is fine.
            for _ in 0..2 {
                let u = dra
                    .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
                        claims: vec![claim("u1", "gpu")],
                    })
                    .await
                    .unwrap()
                    .into_inner();
                assert_eq!(u.claims["u1"].error, "");
            }
            assert_eq!(driver_of(&root, "0000:01:00.0").as_deref(), Some("nvidia"));
            assert_eq!(driver_of(&root, "0000:01:00.1").as_deref(), Some("snd_hda_intel"));
            assert!(!root.join("var/run/cdi/vfio.gpupass.dev_claim_u1.json").exists());
            assert!(!root.join("var/run/cdi/vfio.gpupass.dev_metadata_u1_vfio.json").exists());
            assert!(!root.join("var/lib/kubelet/plugins/vfio.gpupass.dev/dra-device-metadata/default_gpu").exists());
            let cp = checkpoint::load(&checkpoint::path(&HostRoot::new(&root), "vfio.gpupass.dev")).unwrap();
            assert!(cp.claims.is_empty());

            // v1beta1 serves the same.
            let mut beta = v1beta1::dra_plugin_client::DraPluginClient::new(svc);
            let b = beta
                .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
                    claims: vec![v1beta1::Claim {
                        namespace: "default".into(),
                        uid: "u2".into(),
                        name: "gpu2".into(),
                    }],
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(b.claims["u2"].error, "");
            assert_eq!(b.claims["u2"].devices[0].device_name, GPU);
            let u = beta
                .node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest {
                    claims: vec![v1beta1::Claim {
                        namespace: "default".into(),
                        uid: "u2".into(),
                        name: "gpu2".into(),
                    }],
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(u.claims["u2"].error, "");
        });
        stop_tx.send(()).unwrap();
        server.join().unwrap();
        assert!(!cfg.registration_socket("vfio.gpupass.dev").exists());
        assert!(!cfg.service_socket().exists());
        assert_eq!(driver_of(&root, "0000:01:00.0").as_deref(), Some("nvidia"));
    }

    #[test]
    fn grpc_timeouts_are_read_as_grpc_writes_them() {
        assert_eq!(grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout("1999m"), Some(Duration::from_millis(1999)));
        assert_eq!(grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout("500u"), Some(Duration::from_micros(500)));
        assert_eq!(grpc_timeout("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "S", "123456789S", "2s", "-1S", "1.5S", "2µ"] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
