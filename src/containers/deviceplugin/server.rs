//! The gRPC side of the device plugin: one `DevicePlugin` server per resource on its own unix
//! socket (the kubelet wants one endpoint per resource name), registration with the kubelet,
//! and a poll loop that re-reads the host, streams health changes and re-registers when the
//! kubelet restarts.
//!
//! Every `poll` (500 ms by default), and at once when a kernel uevent for a PCI function, VFIO
//! node or mdev arrives (live host only; see `crate::host::uevents`), the loop:
//! 1. scans the inventory and recomputes [`resources`]; a resource whose device list or health
//!    changed gets the new list on its `ListAndWatch` streams at once (so a change reaches the
//!    kubelet within one poll interval plus a scan);
//! 2. starts a server for a resource seen for the first time;
//! 3. restarts a server whose socket was deleted or replaced (the kubelet wipes its directory
//!    when it restarts) and registers again;
//! 4. registers every resource again when `kubelet.sock` was recreated (a new inode or ctime).
//!
//! Sockets are created with mode 0600 (only root, i.e. the kubelet, may talk to them), a stale
//! one replaced, by the kubelet-plugin kit ([`crate::containers::kubelet::socket`]), which also
//! gives the uevent wake-up ([`crate::containers::kubelet::wake_on_uevents`]).
//!
//! Logs go through `tracing` (stderr; warnings by default, `-v` for the info lines). A failure
//! that repeats every round (a socket that cannot be bound, a host that cannot be read) is
//! logged once per distinct error and once when it clears ([`LogOnce`]). A registration the
//! kubelet refuses (or a kubelet that cannot be reached) is retried with a backoff from 1 s,
//! doubling up to 30 s ([`Backoff`]), one warning per attempt; a new `kubelet.sock` retries at
//! once.

use super::proto::device_plugin_server::{DevicePlugin, DevicePluginServer};
use super::proto::registration_client::RegistrationClient;
use super::proto::{
    AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, DevicePluginOptions, Empty,
    ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, RegisterRequest,
};
use super::{
    allocate, merge, preferred, resources, CdiMode, Config, Resource, ResourceKind, API_VERSION,
    KUBELET_SOCKET,
};
use crate::containers::kubelet::socket::{self, file_id, FileId};
use crate::model::{is_vfio_driver, Inventory, PciAddress};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

/// Logs a failure that recurs every round once per distinct message, and says when it clears.
#[derive(Debug, Default)]
pub(crate) struct LogOnce {
    last: Option<String>,
}

impl LogOnce {
    /// Whether `msg` should be logged: it differs from the failure logged last.
    pub(crate) fn failed(&mut self, msg: &str) -> bool {
        if self.last.as_deref() == Some(msg) {
            return false;
        }
        self.last = Some(msg.to_string());
        true
    }

    /// Whether a logged failure has just cleared (log that once).
    pub(crate) fn cleared(&mut self) -> bool {
        self.last.take().is_some()
    }
}

/// First delay before a refused registration is tried again.
pub(crate) const REGISTER_RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest delay between registration attempts.
pub(crate) const REGISTER_RETRY_MAX: Duration = Duration::from_secs(30);

/// When to try a refused registration again: after 1 s, then doubling up to 30 s.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Backoff {
    delay: Option<Duration>,
    next: Option<Instant>,
}

impl Backoff {
    /// Whether an attempt may be made at `now`.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.next.is_none_or(|t| now >= t)
    }

    /// An attempt failed at `now`: the delay until the next one.
    pub(crate) fn failed(&mut self, now: Instant) -> Duration {
        let d = match self.delay {
            None => REGISTER_RETRY_FIRST,
            Some(d) => (d * 2).min(REGISTER_RETRY_MAX),
        };
        self.delay = Some(d);
        self.next = Some(now + d);
        d
    }

    /// Success, or a new kubelet: the next attempt is made at once.
    pub(crate) fn reset(&mut self) {
        *self = Backoff::default();
    }
}

/// Why the plugin could not run.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error(
        "cannot create the socket directory {}; give --socket-dir a directory gpupass can \
create sockets in (the kubelet's is /var/lib/kubelet/device-plugins)", .path.display()
    )]
    SocketDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
}

/// State shared by the servers and the poll loop.
pub(crate) struct Shared {
    cfg: Config,
    inv: RwLock<Arc<Inventory>>,
    cdi_on: AtomicBool,
}

impl Shared {
    fn inventory(&self) -> Arc<Inventory> {
        self.inv.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The `DevicePlugin` service of one resource.
struct PluginService {
    shared: Arc<Shared>,
    resource: String,
    state: watch::Receiver<Resource>,
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let s = tokio_stream::wrappers::WatchStream::new(self.state.clone()).map(|r| {
            Ok(ListAndWatchResponse {
                devices: r.to_proto(),
            })
        });
        Ok(Response::new(Box::pin(s)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let r = self.state.borrow().clone();
        let mut out = Vec::new();
        for c in req.into_inner().container_requests {
            let size = usize::try_from(c.allocation_size.max(0)).unwrap_or(0);
            let ids = preferred(&r, &c.available_device_i_ds, &c.must_include_device_i_ds, size)
                .map_err(|e| e.to_status())?;
            out.push(ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(PreferredAllocationResponse {
            container_responses: out,
        }))
    }

    async fn allocate(&self, req: Request<AllocateRequest>) -> Result<Response<AllocateResponse>, Status> {
        let t0 = std::time::Instant::now();
        let inv = self.shared.inventory();
        let kind = self
            .shared
            .cdi_on
            .load(Ordering::Relaxed)
            .then_some(&self.shared.cfg.cdi_kind);
        let known = self.state.borrow().clone();
        let mut out = Vec::new();
        for c in req.into_inner().container_requests {
            // IDs the kubelet was never told about (another model, a function on a host
            // driver) are unknown; listed ones that went away fail in `allocate`.
            for id in &c.devices_ids {
                if !known.devices.iter().any(|d| &d.id == id) {
                    let e = if id.parse::<PciAddress>().is_ok() || crate::model::is_uuid(id) {
                        super::AllocError::Unknown {
                            id: id.clone(),
                            resource: self.resource.clone(),
                        }
                    } else {
                        super::AllocError::Malformed { id: id.clone() }
                    };
                    return Err(e.to_status());
                }
            }
            let only = self.shared.cfg.cdi == CdiMode::Only;
            if only && kind.is_none() {
                return Err(Status::failed_precondition(format!(
                    "--cdi only: no gpupass CDI spec ({}) in {} or {}; write one with `gpupass cdi generate --write`",
                    crate::output::cdi::spec_file_name(&self.shared.cfg.cdi_kind),
                    self.shared.cfg.host.cdi_dynamic_dir().display(),
                    self.shared.cfg.host.cdi_static_dir().display()
                )));
            }
            let resp = allocate(
                &inv,
                &self.resource,
                &c.devices_ids,
                kind,
                self.shared.cfg.backend,
            )
            .map_err(|e| e.to_status())?;
            let resp = if only { super::cdi_only(resp) } else { resp };
            // The inventory may be one poll old: check the driver link of each function now.
            for id in &c.devices_ids {
                if let Ok(a) = id.parse::<PciAddress>() {
                    let link = self.shared.cfg.host.pci_device(&a).join("driver");
                    let drv = crate::host::link_name(&link).ok().flatten();
                    if !drv.as_deref().is_some_and(is_vfio_driver) {
                        return Err(Status::failed_precondition(format!(
                            "device {id} is no longer bound to vfio-pci (driver: {})",
                            drv.as_deref().unwrap_or("none")
                        )));
                    }
                }
            }
            out.push(resp);
        }
        // The duration is what lab/scenarios/drabench.sh reads.
        info!(
            "allocated {} container request(s) of {} in {} us",
            out.len(),
            self.resource,
            t0.elapsed().as_micros()
        );
        Ok(Response::new(AllocateResponse {
            container_responses: out,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// Socket file name of a resource: `gpupass-nvidia.com_AD102GL_L40S.sock`.
pub fn socket_name(resource: &str) -> String {
    let s: String = resource
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("gpupass-{s}.sock")
}

struct Running {
    tx: watch::Sender<Resource>,
    task: tokio::task::JoinHandle<()>,
    socket: PathBuf,
    socket_id: Option<FileId>,
    /// False after the socket went away and a new one could not be bound yet.
    serving: bool,
    registered: bool,
    retry: Backoff,
}

fn start_server(
    shared: &Arc<Shared>,
    name: &str,
    rx: watch::Receiver<Resource>,
) -> std::io::Result<(tokio::task::JoinHandle<()>, PathBuf)> {
    let path = shared.cfg.socket_dir.join(socket_name(name));
    let listener = socket::listen(&path)?;
    let svc = PluginService {
        shared: shared.clone(),
        resource: name.to_string(),
        state: rx,
    };
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let label = name.to_string();
    let task = tokio::spawn(async move {
        let r = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(svc))
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = r {
            warn!("server for {label} stopped: {}", crate::model::ErrorChain(&e));
        }
    });
    Ok((task, path))
}

/// Register one resource with the kubelet listening on `<dir>/kubelet.sock`.
pub async fn register(dir: &Path, endpoint: &str, resource: &str) -> Result<(), RegisterError> {
    let channel = socket::connect_unix(&dir.join(KUBELET_SOCKET))
        .await
        .map_err(RegisterError::Connect)?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: API_VERSION.into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: Some(options()),
        })
        .await
        .map_err(RegisterError::from_status)?;
    Ok(())
}

/// Why a registration with the kubelet failed (the plugin retries it).
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("cannot reach the kubelet")]
    Connect(#[source] tonic::transport::Error),
    #[error("the kubelet refused the registration: {message}")]
    Refused { message: String },
    /// The call was made and no answer came: the kubelet went away (or stalled past the
    /// call's 30 s) in the middle of it.
    #[error(
        "the registration call got no answer ({code}: {message}): the kubelet went away or stalled during it"
    )]
    NoAnswer { code: String, message: String },
}

impl RegisterError {
    /// The kubelet answers a registration it refuses with a status of its own (the 1.37
    /// device manager: code Unknown and its message); a status tonic made from a transport
    /// failure carries that failure as its source, and means no answer came.
    fn from_status(s: tonic::Status) -> RegisterError {
        if std::error::Error::source(&s).is_some() {
            RegisterError::NoAnswer {
                code: format!("{:?}", s.code()),
                message: s.message().to_string(),
            }
        } else {
            RegisterError::Refused {
                message: s.message().to_string(),
            }
        }
    }
}

fn cdi_spec_present(cfg: &Config) -> bool {
    let name = crate::output::cdi::spec_file_name(&cfg.cdi_kind);
    cfg.host.cdi_dynamic_dir().join(&name).exists() || cfg.host.cdi_static_dir().join(&name).exists()
}

/// Log that `name` cannot be served, once per distinct error.
fn serve_failed(errors: &mut BTreeMap<String, LogOnce>, name: &str, e: &std::io::Error) {
    let msg = format!("cannot serve {name}: {e}");
    if errors.entry(name.to_string()).or_default().failed(&msg) {
        warn!("{msg}; trying again every round, logged again only when the error changes");
    } else {
        debug!("{msg}");
    }
}

/// Run the plugin until `shutdown` completes; removes its sockets on the way out.
pub async fn serve(cfg: Config, shutdown: impl std::future::Future<Output = ()>) -> Result<(), PluginError> {
    // The host first: a wrong --root must not leave a socket directory behind.
    let first = {
        let host = cfg.host.clone();
        tokio::task::spawn_blocking(move || crate::inventory::scan(&host))
            .await
            .map_err(|e| PluginError::Runtime(std::io::Error::other(e)))??
    };
    std::fs::create_dir_all(&cfg.socket_dir).map_err(|e| PluginError::SocketDir {
        path: cfg.socket_dir.clone(),
        source: e,
    })?;
    let shared = Arc::new(Shared {
        cdi_on: AtomicBool::new(false),
        inv: RwLock::new(Arc::new(first)),
        cfg,
    });
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    // Per resource: the last "cannot serve" error logged; and the host scan's.
    let mut serve_errors: BTreeMap<String, LogOnce> = BTreeMap::new();
    let mut scan_error = LogOnce::default();
    let mut kubelet_id: Option<FileId> = None;
    let mut first_round = true;
    tokio::pin!(shutdown);
    // On the live host, kernel uevents (bind, unbind, add, remove, mdev changes) wake the loop
    // at once; the poll stays as the fallback (and for the kubelet's socket, which has no event).
    let wake = Arc::new(tokio::sync::Notify::new());
    if shared.cfg.host.root() == std::path::Path::new("/") {
        let w = wake.clone();
        crate::containers::kubelet::wake_on_uevents(move || {
            w.notify_one();
            true
        });
    }
    loop {
        if !first_round {
            let host = shared.cfg.host.clone();
            let err = match tokio::task::spawn_blocking(move || crate::inventory::scan(&host)).await {
                Ok(Ok(inv)) => {
                    *shared.inv.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(inv);
                    None
                }
                Ok(Err(e)) => Some(format!("cannot read the host: {}", crate::model::ErrorChain(&e))),
                Err(e) => Some(format!("scan failed: {e}")),
            };
            match err {
                Some(e) if scan_error.failed(&e) => warn!("{e}; serving the last inventory read"),
                Some(e) => debug!("{e}"),
                None if scan_error.cleared() => warn!("the host can be read again"),
                None => {}
            }
        }
        first_round = false;
        let cdi = match shared.cfg.cdi {
            CdiMode::Always => true,
            CdiMode::Never => false,
            CdiMode::Auto | CdiMode::Only => cdi_spec_present(&shared.cfg),
        };
        shared.cdi_on.store(cdi, Ordering::Relaxed);
        let now = resources(&shared.inventory());
        if now.is_empty() && running.is_empty() {
            // Nothing to serve yet; a later bind shows up on a later round.
        }

        // Health and device lists.
        let names: Vec<String> = now.keys().chain(running.keys()).cloned().collect();
        for name in names {
            if let Some(r) = running.get(&name) {
                let old = r.tx.borrow().clone();
                if let Some(m) = merge(Some(&old), now.get(&name)) {
                    if m != old {
                        for d in &m.devices {
                            if old.devices.iter().find(|o| o.id == d.id).map(|o| o.healthy) != Some(d.healthy)
                            {
                                let why = d.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
                                if d.healthy {
                                    info!("{name} {} is now Healthy{why}", d.id);
                                } else {
                                    warn!("{name} {} is now Unhealthy{why}", d.id);
                                }
                            }
                        }
                        r.tx.send_replace(m);
                    }
                }
            } else if let Some(r) = now.get(&name) {
                let (tx, rx) = watch::channel(r.clone());
                match start_server(&shared, &name, rx) {
                    Ok((task, socket)) => {
                        let kind = if r.kind == ResourceKind::Mdev {
                            "mdev type"
                        } else {
                            "device model"
                        };
                        if serve_errors.remove(&name).is_some_and(|mut o| o.cleared()) {
                            warn!("{name} can be served again");
                        }
                        info!(
                            "serving {name} ({kind}, {} devices) on {}",
                            r.devices.len(),
                            socket.display()
                        );
                        let socket_id = file_id(&socket);
                        running.insert(
                            name.clone(),
                            Running {
                                tx,
                                task,
                                socket,
                                socket_id,
                                serving: true,
                                registered: false,
                                retry: Backoff::default(),
                            },
                        );
                    }
                    Err(e) => serve_failed(&mut serve_errors, &name, &e),
                }
            }
        }

        // Kubelet restarts and deleted sockets.
        let kid = file_id(&shared.cfg.socket_dir.join(KUBELET_SOCKET));
        let kubelet_new = kid.is_some() && kid != kubelet_id;
        kubelet_id = kid;
        for (name, r) in running.iter_mut() {
            if r.serving && file_id(&r.socket) != r.socket_id {
                info!("{} was removed; serving {name} again", r.socket.display());
                r.task.abort();
                r.serving = false;
            }
            if !r.serving {
                let rx = r.tx.subscribe();
                match start_server(&shared, name, rx) {
                    Ok((task, socket)) => {
                        if serve_errors.remove(name).is_some_and(|mut o| o.cleared()) {
                            warn!("{name} can be served again");
                        }
                        r.task = task;
                        r.socket_id = file_id(&socket);
                        r.socket = socket;
                        r.serving = true;
                        r.registered = false;
                        r.retry.reset();
                    }
                    Err(e) => {
                        serve_failed(&mut serve_errors, name, &e);
                        continue;
                    }
                }
            }
            if kubelet_new {
                if r.registered {
                    info!("kubelet.sock was recreated; registering {name} again");
                    r.registered = false;
                }
                r.retry.reset();
            }
            if !r.registered && kid.is_some() && r.retry.due(Instant::now()) {
                let endpoint = socket_name(name);
                match register(&shared.cfg.socket_dir, &endpoint, name).await {
                    Ok(()) => {
                        info!("registered {name} (endpoint {endpoint})");
                        r.registered = true;
                        r.retry.reset();
                    }
                    Err(e) => {
                        let d = r.retry.failed(Instant::now());
                        warn!("{name}: {}; retrying in {d:?}", crate::model::ErrorChain(&e));
                    }
                }
            }
        }

        tokio::select! {
            _ = &mut shutdown => break,
            _ = wake.notified() => {}
            _ = tokio::time::sleep(shared.cfg.poll) => {}
        }
    }
    for (_, r) in running {
        r.task.abort();
        let _ = std::fs::remove_file(&r.socket);
    }
    Ok(())
}

/// `gpupass device-plugin`: run until SIGTERM or SIGINT.
pub(crate) fn run(cfg: Config) -> Result<(), PluginError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(PluginError::Runtime)?;
    rt.block_on(async move {
        let stop = async {
            let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        serve(cfg, stop).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_once_per_distinct_error_and_once_on_recovery() {
        let mut o = LogOnce::default();
        assert!(!o.cleared(), "nothing failed yet");
        assert!(o.failed("cannot serve x: EACCES"));
        assert!(!o.failed("cannot serve x: EACCES"));
        assert!(!o.failed("cannot serve x: EACCES"));
        assert!(o.failed("cannot serve x: EISDIR"), "a new error is logged");
        assert!(
            o.failed("cannot serve x: EACCES"),
            "and the old one again after it"
        );
        assert!(o.cleared());
        assert!(!o.cleared(), "recovery is logged once");
        assert!(
            o.failed("cannot serve x: EACCES"),
            "a failure after recovery is logged"
        );
    }

    #[test]
    fn registration_backoff_doubles_to_a_bound_and_resets() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        assert!(b.due(t0));
        let delays: Vec<u64> = (0..8).map(|_| b.failed(t0).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert!(!b.due(t0 + Duration::from_secs(29)));
        assert!(b.due(t0 + Duration::from_secs(30)));
        b.reset();
        assert!(b.due(t0));
        assert_eq!(b.failed(t0), REGISTER_RETRY_FIRST);
    }
}
