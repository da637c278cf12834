use super::*;
use crate::containers::kubelet::proto::registration::registration_client::RegistrationClient;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Claims in memory, counting reads.
struct Source {
    reads: Arc<AtomicUsize>,
}

impl ClaimSource for Source {
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<k8s_openapi::api::resource::v1::ResourceClaim, claims::SourceError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        if name == "gone" {
            return Err(claims::SourceError::NotFound {
                namespace: namespace.into(),
                name: name.into(),
                detail: "test".into(),
            });
        }
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
            "spec": {}
        }))
        .unwrap())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("refused {0}")]
struct Refused(String);

/// A driver that prepares any claim as one device and remembers it.
#[derive(Default)]
struct Fake {
    calls: Arc<Mutex<Vec<String>>>,
    done: BTreeMap<String, Vec<PreparedDevice>>,
    /// How many times the kit asked for the resources.
    refreshes: Arc<AtomicUsize>,
}

impl DraDriver for Fake {
    type Error = Refused;

    fn start(&mut self, _: &dyn ClaimSource) -> Vec<String> {
        self.calls.lock().unwrap().push("start".into());
        Vec::new()
    }

    fn prepared(&self, c: &ClaimRef) -> Option<Vec<PreparedDevice>> {
        self.done.get(&c.uid).cloned()
    }

    fn prepare_resource_claims(
        &mut self,
        claims: &[Claim],
        _: Option<Instant>,
    ) -> BTreeMap<String, Result<Vec<PreparedDevice>, Refused>> {
        let mut out = BTreeMap::new();
        for c in claims {
            self.calls
                .lock()
                .unwrap()
                .push(format!("prepare {}", c.asked.uid));
            let r = if c.asked.name == "bad" {
                Err(Refused(c.asked.name.clone()))
            } else {
                let d = vec![PreparedDevice {
                    request: "r".into(),
                    pool: "p".into(),
                    device: format!("dev-{}", c.asked.name),
                    cdi_device_ids: vec![format!("k/c={}", c.asked.uid)],
                }];
                self.done.insert(c.asked.uid.clone(), d.clone());
                Ok(d)
            };
            out.insert(c.asked.uid.clone(), r);
        }
        out
    }

    fn unprepare_resource_claims(
        &mut self,
        claims: &[ClaimRef],
        _: Option<Instant>,
    ) -> BTreeMap<String, Result<(), Refused>> {
        claims
            .iter()
            .map(|c| {
                self.calls.lock().unwrap().push(format!("unprepare {}", c.uid));
                self.done.remove(&c.uid);
                (c.uid.clone(), Ok(()))
            })
            .collect()
    }

    fn resources(&mut self) -> Result<Resources, Refused> {
        self.refreshes.fetch_add(1, Ordering::SeqCst);
        Ok(Resources {
            pool: Pool::default(),
            health: vec![Health {
                device: "dev-a".into(),
                healthy: true,
                message: String::new(),
            }],
        })
    }
}

fn claim(name: &str, uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

/// The kit alone, with a driver that is not gpupass's: it registers, reads each claim and
/// checks its UID before the driver sees it, answers a claim the driver says it prepared
/// without reading it, turns a driver's or a read's error into the claim's error, serves
/// v1beta1 by conversion, and removes its sockets when it stops.
#[test]
fn the_kit_serves_any_driver_and_reads_only_claims_it_must() {
    let t = tempfile::tempdir().unwrap();
    let cfg = Config {
        driver: "x.example.com".into(),
        pool: "node-a".into(),
        registry_dir: t.path().join("registry"),
        plugin_dir: t.path().join("plugin"),
        poll: Duration::from_millis(50),
        uevents: false,
        health_every: Duration::from_millis(100),
    };
    let reads = Arc::new(AtomicUsize::new(0));
    let fake = Fake::default();
    let calls = fake.calls.clone();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = {
        let (cfg, reads) = (cfg.clone(), reads.clone());
        std::thread::spawn(move || {
            run(fake, &cfg, Box::new(Source { reads }), None, async {
                let _ = stop_rx.await;
            })
            .unwrap()
        })
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let connect = |p: PathBuf| async move {
            for _ in 0..200 {
                if let Ok(c) = super::super::socket::connect_unix(&p).await {
                    return c;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            panic!("{} never came up", p.display());
        };
        let info = RegistrationClient::new(connect(cfg.registration_socket()).await)
            .get_info(InfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (info.r#type.as_str(), info.name.as_str()),
            ("DRAPlugin", "x.example.com")
        );
        let svc = connect(cfg.service_socket()).await;
        // The health stream: every device at once, then again every `health_every` while
        // nothing changes, each with the timeout the kubelet is to hold it to.
        let mut health =
            super::super::proto::health::dra_resource_health_client::DraResourceHealthClient::new(
                svc.clone(),
            )
            .node_watch_resources(super::super::proto::health::NodeWatchResourcesRequest {})
            .await
            .unwrap()
            .into_inner();
        let start = Instant::now();
        let mut seen = Vec::new();
        while seen.len() < 3 {
            let m = tokio::time::timeout(Duration::from_secs(5), health.message())
                .await
                .expect("a health message within 5 s")
                .unwrap()
                .expect("the stream goes on");
            seen.push(m);
        }
        assert!(
            start.elapsed() >= Duration::from_millis(150),
            "three messages came in {:?}: resent on the interval, not at once",
            start.elapsed()
        );
        for m in &seen {
            assert_eq!(m.devices.len(), 1);
            assert_eq!(m.devices[0].device.as_ref().unwrap().device_name, "dev-a");
            assert_eq!(m.devices[0].device.as_ref().unwrap().pool_name, "node-a");
            assert_eq!(m.devices[0].health, HealthStatus::Healthy as i32);
            assert_eq!(m.devices[0].health_check_timeout_seconds, HEALTH_TIMEOUT_S);
        }
        let mut dra = v1::dra_plugin_client::DraPluginClient::new(svc.clone());
        let r = dra
            .node_prepare_resources(v1::NodePrepareResourcesRequest {
                claims: vec![
                    claim("a", "uid-a"),
                    claim("a", "uid-old"),
                    claim("bad", "uid-bad"),
                    claim("gone", "uid-gone"),
                ],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.claims["uid-a"].error, "");
        assert_eq!(r.claims["uid-a"].devices[0].device_name, "dev-a");
        assert_eq!(r.claims["uid-a"].devices[0].cdi_device_ids, ["k/c=uid-a"]);
        assert!(r.claims["uid-old"]
            .error
            .contains("the API server has UID uid-a, the kubelet asked for uid-old"));
        assert_eq!(r.claims["uid-bad"].error, "refused bad");
        assert!(r.claims["uid-gone"]
            .error
            .starts_with("claim default/gone not found"));
        assert_eq!(reads.load(Ordering::SeqCst), 4);
        // A retry of a prepared claim: answered from the driver's record, not read again.
        let again = dra
            .node_prepare_resources(v1::NodePrepareResourcesRequest {
                claims: vec![claim("a", "uid-a")],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(again.claims["uid-a"], r.claims["uid-a"]);
        assert_eq!(reads.load(Ordering::SeqCst), 4);
        let mut beta = v1beta1::dra_plugin_client::DraPluginClient::new(svc);
        let u = beta
            .node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest {
                claims: vec![v1beta1::Claim {
                    namespace: "default".into(),
                    uid: "uid-a".into(),
                    name: "a".into(),
                }],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(u.claims["uid-a"].error, "");
    });
    stop_tx.send(()).unwrap();
    server.join().unwrap();
    assert_eq!(
        *calls.lock().unwrap(),
        ["start", "prepare uid-a", "prepare uid-bad", "unprepare uid-a"],
        "the driver sees only claims read with the UID asked for, one call at a time"
    );
    assert!(!cfg.registration_socket().exists());
    assert!(!cfg.service_socket().exists());
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

/// Wake-ups queued together (a bind's uevents come in a burst) are answered by one read of the
/// driver's resources, and a call queued among them keeps its turn.
#[test]
fn wake_ups_queued_together_are_one_refresh_and_a_call_among_them_keeps_its_turn() {
    let fake = Fake::default();
    let (calls, refreshes) = (fake.calls.clone(), fake.refreshes.clone());
    let (tx, rx) = mpsc::channel();
    for _ in 0..5 {
        tx.send(Job::Wake).unwrap();
    }
    let (reply, answer) = oneshot::channel();
    let c = ClaimRef {
        namespace: "default".into(),
        uid: "uid-a".into(),
        name: "a".into(),
    };
    tx.send(Job::Unprepare(vec![c], None, reply)).unwrap();
    for _ in 0..3 {
        tx.send(Job::Wake).unwrap();
    }
    tx.send(Job::Stop).unwrap();
    let (health, _watching) = watch::channel(Vec::new());
    let source = Source {
        reads: Arc::default(),
    };
    worker(fake, &source, rx, health, Duration::from_secs(60), None);
    // At start; once for the five wake-ups; after the call; once for the three.
    assert_eq!(refreshes.load(Ordering::SeqCst), 4);
    assert_eq!(*calls.lock().unwrap(), ["unprepare uid-a"]);
    assert!(answer.blocking_recv().unwrap()["uid-a"].is_ok());
}
