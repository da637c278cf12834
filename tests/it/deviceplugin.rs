//! The device plugin (the real binary) against a kubelet stand-in written here: a
//! `Registration` server on `<dir>/kubelet.sock` and a `DevicePlugin` client that dials the
//! plugin's socket, as the kubelet's device manager does, all over unix sockets in a tempdir.

use crate::util::*;
use gpupass::containers::deviceplugin::proto::device_plugin_client::DevicePluginClient;
use gpupass::containers::deviceplugin::proto::registration_server::{Registration, RegistrationServer};
use gpupass::containers::deviceplugin::proto::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::transport::Channel;

/// The kubelet's registration service: hands every RegisterRequest to the test, or refuses it
/// (recording the resource name) while `refuse` is set.
struct StandIn {
    tx: mpsc::UnboundedSender<RegisterRequest>,
    refuse: Arc<AtomicBool>,
    refused: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl Registration for StandIn {
    async fn register(
        &self,
        req: tonic::Request<RegisterRequest>,
    ) -> Result<tonic::Response<Empty>, tonic::Status> {
        let r = req.into_inner();
        if r.version != "v1beta1" {
            return Err(tonic::Status::invalid_argument("unsupported version"));
        }
        if self.refuse.load(Ordering::SeqCst) {
            self.refused.lock().unwrap().push(r.resource_name);
            return Err(tonic::Status::unavailable("device manager not ready"));
        }
        let _ = self.tx.send(r);
        Ok(tonic::Response::new(Empty {}))
    }
}

struct Kubelet {
    rx: mpsc::UnboundedReceiver<RegisterRequest>,
    task: tokio::task::JoinHandle<()>,
    refuse: Arc<AtomicBool>,
    refused: Arc<Mutex<Vec<String>>>,
}

impl Kubelet {
    /// Start like a kubelet does: wipe the directory, then serve kubelet.sock.
    fn start(dir: &Path) -> Kubelet {
        Kubelet::start_refusing(dir, false)
    }

    /// As `start`; with `refuse`, every registration fails until `refuse` is cleared.
    fn start_refusing(dir: &Path, refuse: bool) -> Kubelet {
        for e in std::fs::read_dir(dir).unwrap() {
            let _ = std::fs::remove_file(e.unwrap().path());
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let refuse = Arc::new(AtomicBool::new(refuse));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let svc = StandIn {
            tx,
            refuse: refuse.clone(),
            refused: refused.clone(),
        };
        let l = tokio::net::UnixListener::bind(dir.join("kubelet.sock")).unwrap();
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(svc))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(l))
                .await
                .unwrap();
        });
        Kubelet {
            rx,
            task,
            refuse,
            refused,
        }
    }

    /// How many registrations of `resource` were refused.
    fn refused(&self, resource: &str) -> usize {
        self.refused
            .lock()
            .unwrap()
            .iter()
            .filter(|r| *r == resource)
            .count()
    }

    /// Registrations until every name in `want` registered (or time out).
    async fn expect(&mut self, want: &[&str], within: Duration) -> Vec<RegisterRequest> {
        let mut got: Vec<RegisterRequest> = Vec::new();
        let deadline = Instant::now() + within;
        while !want.iter().all(|w| got.iter().any(|g| g.resource_name == *w)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some(r)) => got.push(r),
                _ => panic!(
                    "registrations of {want:?} expected within {within:?}, got {:?}",
                    got.iter().map(|g| &g.resource_name).collect::<Vec<_>>()
                ),
            }
        }
        got
    }

    fn stop(self) {
        self.task.abort();
    }
}

/// Dial a unix socket the way the kubelet dials a plugin endpoint.
async fn dial(path: PathBuf) -> DevicePluginClient<Channel> {
    let ch = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
        .expect("dial the plugin");
    DevicePluginClient::new(ch)
}

/// The plugin process, killed when dropped; its stderr goes to a file.
struct Plugin {
    child: Child,
    log: PathBuf,
}

impl Plugin {
    fn start(root: &Path, dir: &Path, log_dir: &Path) -> Plugin {
        let log = log_dir.join("plugin.log");
        let f = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_gpupass"))
            .args([
                "-v",
                "--root",
                root.to_str().unwrap(),
                "device-plugin",
                "--poll-ms",
                "100",
                "--socket-dir",
            ])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .unwrap();
        Plugin { child, log }
    }
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const L40S: &str = "nvidia.com/AD102GL_L40S";
const A6000: &str = "nvidia.com/GA102GL_RTX_A6000";
const AUDIO: &str = "nvidia.com/GA102_HIGH_DEFINITION_AUDIO_CONTROLLER";

fn ids(r: &ListAndWatchResponse) -> Vec<(String, String, Option<i64>)> {
    r.devices
        .iter()
        .map(|d| {
            (
                d.id.clone(),
                d.health.clone(),
                d.topology.as_ref().and_then(|t| t.nodes.first()).map(|n| n.id),
            )
        })
        .collect()
}

fn alloc_req(ids: &[&str]) -> AllocateRequest {
    AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| s.to_string()).collect(),
        }],
    }
}

fn paths(r: &ContainerAllocateResponse) -> Vec<&str> {
    r.devices.iter().map(|d| d.host_path.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_registers_lists_allocates_and_follows_health_and_kubelet_restarts() {
    let host = scratch_host("vfio-numa");
    let sockets = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let dir = sockets.path();
    let mut kubelet = Kubelet::start(dir);
    let plugin = Plugin::start(host.path(), dir, logs.path());

    // Registration: one resource per model, endpoint in the directory, socket mode 0600.
    let regs = kubelet
        .expect(&[L40S, A6000, AUDIO], Duration::from_secs(15))
        .await;
    let l40s = regs.iter().find(|r| r.resource_name == L40S).unwrap().clone();
    assert_eq!(l40s.version, "v1beta1");
    let opts = l40s.options.unwrap();
    assert!(opts.get_preferred_allocation_available && !opts.pre_start_required);
    let sock = dir.join(&l40s.endpoint);
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", sock.display());
    assert_ne!(
        regs.iter().find(|r| r.resource_name == A6000).unwrap().endpoint,
        l40s.endpoint,
        "one endpoint per resource"
    );

    let mut c = dial(sock.clone()).await;
    let o = c.get_device_plugin_options(Empty {}).await.unwrap().into_inner();
    assert!(o.get_preferred_allocation_available);

    // ListAndWatch: the four L40S on vfio-pci (not the one on nvidia), Healthy, with NUMA.
    let mut stream = c.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    let h = |s: &str| s.to_string();
    assert_eq!(
        ids(&first),
        vec![
            (h("0000:17:00.0"), h("Healthy"), Some(0)),
            (h("0000:31:00.0"), h("Healthy"), Some(0)),
            (h("0000:ca:00.0"), h("Healthy"), Some(1)),
            (h("0000:e3:00.0"), h("Healthy"), Some(1)),
        ]
    );

    // Allocate: one backend's nodes (`--backend auto` on a cdev host: the cdev + iommufd,
    // never the group and container too), env with only the allocated address.
    let r = c
        .allocate(alloc_req(&["0000:31:00.0"]))
        .await
        .unwrap()
        .into_inner();
    let r = &r.container_responses[0];
    assert_eq!(paths(r), ["/dev/iommu", "/dev/vfio/devices/vfio1"]);
    assert!(r
        .devices
        .iter()
        .all(|d| d.permissions == "mrw" && d.container_path == d.host_path));
    assert_eq!(r.envs.len(), 1);
    assert_eq!(r.envs["PCI_RESOURCE_NVIDIA_COM_AD102GL_L40S"], "0000:31:00.0");
    assert!(r.cdi_devices.is_empty(), "no gpupass CDI spec on this host yet");
    let r = c
        .allocate(alloc_req(&["0000:e3:00.0", "0000:17:00.0"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.container_responses[0].envs["PCI_RESOURCE_NVIDIA_COM_AD102GL_L40S"],
        "0000:e3:00.0,0000:17:00.0"
    );

    // Unknown and malformed IDs are gRPC errors.
    // (docs/errors.md E-DP-05, E-DP-06: the code and the message.)
    let (unknown, malformed) = (
        "is not a device of resource",
        "is not a PCI address (expected 0000:01:00.0)",
    );
    for (bad, code, message) in [
        ("0000:99:00.0", tonic::Code::NotFound, unknown),
        ("0000:4b:00.0", tonic::Code::NotFound, unknown), // an A6000: another resource
        ("0000:b1:00.0", tonic::Code::NotFound, unknown), // on the nvidia driver
        ("not-an-id", tonic::Code::InvalidArgument, malformed),
    ] {
        let e = c.allocate(alloc_req(&[bad])).await.unwrap_err();
        assert_eq!(e.code(), code, "{bad}: {e}");
        assert!(e.message().contains(message), "{bad}: {e}");
    }

    // Preferred allocation keeps one NUMA node.
    let all: Vec<String> = ["0000:17:00.0", "0000:31:00.0", "0000:ca:00.0", "0000:e3:00.0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let pref = |must: &[&str], size: i32| PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_i_ds: all.clone(),
            must_include_device_i_ds: must.iter().map(|s| s.to_string()).collect(),
            allocation_size: size,
        }],
    };
    let p = c
        .get_preferred_allocation(pref(&[], 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        p.container_responses[0].device_i_ds,
        ["0000:17:00.0", "0000:31:00.0"]
    );
    let p = c
        .get_preferred_allocation(pref(&["0000:e3:00.0"], 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        p.container_responses[0].device_i_ds,
        ["0000:e3:00.0", "0000:ca:00.0"]
    );
    let e = c
        .get_preferred_allocation(pref(&["0000:99:00.0"], 2))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    c.pre_start_container(PreStartContainerRequest { devices_ids: vec![] })
        .await
        .unwrap();

    // The whole group of the A6000 (GPU + audio): both cdevs, no legacy node.
    let mut a = dial(dir.join(&regs.iter().find(|r| r.resource_name == A6000).unwrap().endpoint)).await;
    let r = a
        .allocate(alloc_req(&["0000:4b:00.0"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        paths(&r.container_responses[0]),
        ["/dev/iommu", "/dev/vfio/devices/vfio4", "/dev/vfio/devices/vfio5"]
    );

    // Health: unbind 0000:ca:00.0 (driver link and group node go away) → Unhealthy within 1 s.
    let t0 = Instant::now();
    std::fs::remove_file(host.path().join("sys/bus/pci/devices/0000:ca:00.0/driver")).unwrap();
    std::fs::remove_file(host.path().join("dev/vfio/60")).unwrap();
    let changed = tokio::time::timeout(Duration::from_secs(2), stream.message())
        .await
        .expect("an update within 2 s")
        .unwrap()
        .unwrap();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(1), "update took {took:?}");
    assert!(
        ids(&changed).contains(&(h("0000:ca:00.0"), h("Unhealthy"), Some(1))),
        "{:?}",
        ids(&changed)
    );
    assert_eq!(
        changed.devices.len(),
        4,
        "a vanished device stays listed, Unhealthy"
    );
    let e = c.allocate(alloc_req(&["0000:ca:00.0"])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    // docs/errors.md E-DP-07.
    assert!(
        e.message().contains("device 0000:ca:00.0 cannot be allocated: "),
        "{e}"
    );
    // Rebind: Healthy again.
    let rel = "../../../../bus/pci/drivers/vfio-pci";
    std::os::unix::fs::symlink(
        rel,
        host.path()
            .join("sys/devices/pci0000:c9/0000:c9:01.0/0000:ca:00.0/driver"),
    )
    .unwrap();
    std::fs::write(host.path().join("dev/vfio/60"), "").unwrap();
    let back = tokio::time::timeout(Duration::from_secs(2), stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(ids(&back).contains(&(h("0000:ca:00.0"), h("Healthy"), Some(1))));

    // CDI names appear once a gpupass spec exists (auto mode).
    ok(&gpupass(&[
        "--root",
        host.path().to_str().unwrap(),
        "cdi",
        "generate",
        "--write",
    ]));
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let r = c
            .allocate(alloc_req(&["0000:31:00.0"]))
            .await
            .unwrap()
            .into_inner();
        let names: Vec<String> = r.container_responses[0]
            .cdi_devices
            .iter()
            .map(|d| d.name.clone())
            .collect();
        if !names.is_empty() {
            assert_eq!(names, ["gpupass.dev/pci=0000:31:00.0"]);
            break;
        }
        assert!(Instant::now() < deadline, "CDI names never appeared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Kubelet restart: the directory is wiped and kubelet.sock recreated → every resource
    // registers again, on fresh sockets that serve.
    kubelet.stop();
    let mut kubelet = Kubelet::start(dir);
    let regs = kubelet
        .expect(&[L40S, A6000, AUDIO], Duration::from_secs(5))
        .await;
    let ep = &regs.iter().find(|r| r.resource_name == L40S).unwrap().endpoint;
    let mut c2 = dial(dir.join(ep)).await;
    let again = c2
        .list_and_watch(Empty {})
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.devices.len(), 4);

    // Only the plugin's socket deleted: served again and registered again.
    std::fs::remove_file(dir.join(ep)).unwrap();
    let regs = kubelet.expect(&[L40S], Duration::from_secs(5)).await;
    assert!(
        regs.iter().all(|r| r.resource_name == L40S),
        "only that resource re-registers"
    );
    assert!(dir.join(ep).exists());
    let log = plugin.log();
    assert!(log.contains("registering") || log.contains("serving"), "{log}");
    kubelet.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_serves_mdev_types() {
    let host = scratch_host("mdev-t4");
    let sockets = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let mut kubelet = Kubelet::start(sockets.path());
    let _plugin = Plugin::start(host.path(), sockets.path(), logs.path());
    let regs = kubelet
        .expect(&["nvidia.com/GRID_T4_1B"], Duration::from_secs(15))
        .await;
    let mut c = dial(sockets.path().join(&regs[0].endpoint)).await;
    let l = c
        .list_and_watch(Empty {})
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(l.devices[0].id, "2f3e4d5c-6b7a-4988-8776-655443322110");
    assert_eq!(l.devices[0].health, "Healthy");
    let r = c
        .allocate(alloc_req(&["2f3e4d5c-6b7a-4988-8776-655443322110"]))
        .await
        .unwrap()
        .into_inner();
    let r = &r.container_responses[0];
    assert_eq!(paths(r), ["/dev/vfio/vfio", "/dev/vfio/100"]);
    assert_eq!(
        r.envs["MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4_1B"],
        "2f3e4d5c-6b7a-4988-8776-655443322110"
    );
    let e = c
        .allocate(alloc_req(&["00000000-0000-4000-8000-000000000000"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(e.message().contains("is not a device of resource"), "{e}");
    kubelet.stop();
}

/// Wait until `f` holds (polling every 50 ms), or fail with `what`.
async fn until(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_that_cannot_be_bound_is_logged_once_and_its_recovery_once() {
    let host = scratch_host("vfio-numa");
    let sockets = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let dir = sockets.path();
    // A directory where the L40S socket goes: every round's bind fails with EISDIR.
    let blocked = dir.join("gpupass-nvidia.com_AD102GL_L40S.sock");
    std::fs::create_dir(&blocked).unwrap();
    let plugin = Plugin::start(host.path(), dir, logs.path());
    let a6000 = dir.join("gpupass-nvidia.com_GA102GL_RTX_A6000.sock");
    until(Duration::from_secs(15), "the A6000 socket", || a6000.exists()).await;
    // Ten more rounds at --poll-ms 100.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let log = plugin.log();
    let cannot = format!("cannot serve {L40S}: Is a directory");
    assert_eq!(log.matches(&cannot).count(), 1, "{log}");
    assert!(log.contains(" WARN "), "{log}");
    std::fs::remove_dir(&blocked).unwrap();
    until(Duration::from_secs(5), "the L40S socket", || {
        std::fs::symlink_metadata(&blocked).is_ok_and(|m| !m.is_dir())
    })
    .await;
    until(Duration::from_secs(2), "the recovery line", || {
        plugin.log().contains(&format!("{L40S} can be served again"))
    })
    .await;
    let log = plugin.log();
    assert_eq!(log.matches(&cannot).count(), 1, "{log}");
    assert_eq!(log.matches("can be served again").count(), 1, "{log}");
    assert!(
        log.contains(&format!("serving {L40S} (device model, 4 devices)")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_is_retried_with_backoff() {
    let host = scratch_host("vfio-numa");
    let sockets = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let dir = sockets.path();
    let mut kubelet = Kubelet::start_refusing(dir, true);
    let plugin = Plugin::start(host.path(), dir, logs.path());
    until(Duration::from_secs(15), "a refused registration", || {
        kubelet.refused(L40S) > 0
    })
    .await;
    // Attempts at about 0, 1 and 3 s (then 7 s), not every 100 ms round.
    tokio::time::sleep(Duration::from_millis(4000)).await;
    let n = kubelet.refused(L40S);
    assert!((2..=4).contains(&n), "{n} attempts in about 4 s");
    let log = plugin.log();
    let lines = log
        .lines()
        .filter(|l| l.contains(&format!("{L40S}: the kubelet refused the registration")))
        .collect::<Vec<_>>();
    // The last attempt's line may still be on its way.
    assert!(
        (n - 1..=n).contains(&lines.len()),
        "one line per attempt: {n} attempts, {lines:?}"
    );
    for (l, d) in lines.iter().zip(["1s", "2s", "4s", "8s"]) {
        assert!(
            l.contains("device manager not ready") && l.ends_with(&format!("retrying in {d}")),
            "{l}"
        );
    }
    // Accepted once the kubelet is ready: at the next attempt (within the 4 s backoff).
    kubelet.refuse.store(false, Ordering::SeqCst);
    kubelet.expect(&[L40S], Duration::from_secs(8)).await;
    kubelet.stop();
}

/// A kubelet that goes away in the middle of a Register call (it took the call and never
/// answered: the cluster lab's `midreg` steps do it to the real kubelet) is said as that, not
/// as a refusal by the kubelet.
#[test]
fn a_kubelet_gone_during_the_call_is_no_answer_not_a_refusal() {
    use gpupass::containers::deviceplugin::server::{register, RegisterError};
    struct Hangs(std::sync::mpsc::Sender<()>);
    #[tonic::async_trait]
    impl Registration for Hangs {
        async fn register(
            &self,
            _: tonic::Request<RegisterRequest>,
        ) -> Result<tonic::Response<Empty>, tonic::Status> {
            let _ = self.0.send(());
            std::future::pending().await
        }
    }
    let d = tempfile::tempdir().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let kubelet = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let l = {
        let _g = kubelet.enter();
        tokio::net::UnixListener::bind(d.path().join("kubelet.sock")).unwrap()
    };
    kubelet.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Hangs(tx)))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(l))
            .await
            .unwrap();
    });
    let dir = d.path().to_path_buf();
    let call = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(register(&dir, "p.sock", "example.com/r"))
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the call reached the kubelet");
    // The kubelet dies with the call unanswered: its tasks and sockets go with its runtime.
    kubelet.shutdown_background();
    let e = call.join().unwrap().unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, RegisterError::NoAnswer { .. }), "{msg}");
    assert!(msg.contains("got no answer"), "{msg}");
}
