//! gpupass's DRA driver served by the kubelet-plugin kit over real unix sockets, with tonic's
//! client playing the kubelet, against the `workstation` fixture host on the test kit's fake
//! kernel (binds take the kernel's visible effect on the tree).

use super::checkpoint;
use super::claim::Identity;
use super::prepare::Driver;
use crate::containers::kubelet::claims::Dir;
use crate::containers::kubelet::plugin::{run, Config};
use crate::containers::kubelet::proto::health::dra_resource_health_client::DraResourceHealthClient;
use crate::containers::kubelet::proto::health::{
    DeviceHealth, HealthStatus, NodeWatchResourcesRequest, NodeWatchResourcesResponse,
};
use crate::containers::kubelet::proto::registration::registration_client::RegistrationClient;
use crate::containers::kubelet::proto::registration::InfoRequest;
use crate::containers::kubelet::proto::{v1, v1beta1};
use crate::host::HostRoot;
use crate::testkit::FakeHost;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::Request;

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
            if let Ok(c) = crate::containers::kubelet::socket::connect_unix(p).await {
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

/// The plugin directories of a test under `dir`, driver `vfio.gpupass.dev`, pool `node-a`.
pub(super) fn test_config(dir: &Path) -> Config {
    Config {
        driver: "vfio.gpupass.dev".into(),
        pool: "node-a".into(),
        registry_dir: dir.join("registry"),
        plugin_dir: dir.join("plugin"),
        poll: Duration::from_millis(20),
        uevents: false,
        health_every: Duration::from_millis(100),
    }
}

/// gpupass's driver on the fake kernel over the host tree `root`, its claims read from
/// `claims`, served by the kit per `cfg` on a thread of its own until the sender is used.
pub(super) fn serve(
    root: &Path,
    cfg: &Config,
    claims: &Path,
    lock_wait: Duration,
) -> (std::thread::JoinHandle<()>, tokio::sync::oneshot::Sender<()>) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (root, cfg, claims) = (root.to_path_buf(), cfg.clone(), claims.to_path_buf());
    let server = std::thread::spawn(move || {
        let ops = FakeHost::new(HostRoot::new(&root));
        let me = Identity {
            driver: cfg.driver.clone(),
            node: cfg.pool.clone(),
            pool: cfg.pool.clone(),
        };
        let driver = Driver::new(
            &ops,
            me,
            crate::inventory::backend::Policy::Auto,
            "b0-boot".into(),
        )
        .unwrap()
        .with_lock_wait(lock_wait);
        run(driver, &cfg, Box::new(Dir { dir: claims }), None, async {
            let _ = stop_rx.await;
        })
        .unwrap();
    });
    (server, stop_tx)
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
    let cfg = test_config(t.path());
    // A lock wait longer than the call's deadline below: the deadline bounds the wait.
    let (server, stop_tx) = serve(&root, &cfg, &claims, Duration::from_secs(30));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // Registration: what the kubelet's plugin watcher asks first.
        let reg = cfg.registration_socket();
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
    assert!(!cfg.registration_socket().exists());
    assert!(!cfg.service_socket().exists());
    assert_eq!(driver_of(&root, "0000:01:00.0").as_deref(), Some("nvidia"));
}
