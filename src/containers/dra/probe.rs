//! `gpupass dra probe`: whether a running `gpupass dra-plugin` answers as the kubelet needs it
//! to, for a container liveness probe (deploy/helm/gpupass, docs/deploy.md).
//!
//! Two calls, each bounded by a timeout:
//! 1. `Registration.GetInfo` on `plugins_registry/<driver>-reg.sock`, the socket the kubelet's
//!    plugin watcher dials (through the same `:authority` relay): the answer must name this
//!    driver, the `DRAPlugin` type and the service socket below as its endpoint.
//! 2. `DRAPlugin.NodePrepareResources` (v1) with no claims on that endpoint: it goes through the
//!    plugin's one worker thread (the one that binds groups and publishes slices), so an answer
//!    means the worker takes calls; it changes nothing (no claim, no host write).
//!
//! A plugin whose sockets were deleted, whose gRPC servers died or whose worker is stuck fails
//! the probe; a worker busy with a long Prepare fails it only if that outlasts the timeout.

use crate::containers::kubelet::plugin::{Config, PLUGIN_TYPE};
use crate::containers::kubelet::proto::registration::registration_client::RegistrationClient;
use crate::containers::kubelet::proto::registration::InfoRequest;
use crate::containers::kubelet::proto::v1;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why the plugin does not answer as it should.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("cannot connect to {}: {detail} (is `gpupass dra-plugin --driver {driver}` running with this directory?)", .path.display())]
    Connect {
        path: PathBuf,
        driver: String,
        detail: String,
    },
    #[error("{call} on {} failed: {detail}", .path.display())]
    Call {
        call: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("{call} on {} gave no answer within {} s", .path.display(), .timeout.as_secs_f64())]
    Timeout {
        call: &'static str,
        path: PathBuf,
        timeout: Duration,
    },
    #[error("the registration socket {} answers {what} {got:?}, not {want:?}", .path.display())]
    Wrong {
        path: PathBuf,
        what: &'static str,
        got: String,
        want: String,
    },
}

/// Probes the plugin of `cfg.driver` listening per `cfg`; on success, a line saying what
/// answered.
pub(crate) fn probe(cfg: &Config, timeout: Duration) -> Result<String, ProbeError> {
    let driver = cfg.driver.as_str();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ProbeError::Runtime)?;
    rt.block_on(async {
        let reg = cfg.registration_socket();
        let svc = cfg.service_socket();
        let ch = connect(&reg, driver, timeout).await?;
        let info = bounded("Registration.GetInfo", &reg, timeout, async {
            RegistrationClient::new(ch).get_info(InfoRequest {}).await
        })
        .await?;
        let want_endpoint = svc.to_string_lossy().into_owned();
        for (what, got, want) in [
            ("type", &info.r#type, PLUGIN_TYPE),
            ("name", &info.name, driver),
            ("endpoint", &info.endpoint, want_endpoint.as_str()),
        ] {
            if got != want {
                return Err(ProbeError::Wrong {
                    path: reg.clone(),
                    what,
                    got: got.clone(),
                    want: want.to_string(),
                });
            }
        }
        let ch = connect(&svc, driver, timeout).await?;
        let r = bounded(
            "DRAPlugin.NodePrepareResources (no claims)",
            &svc,
            timeout,
            async {
                v1::dra_plugin_client::DraPluginClient::new(ch)
                    .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: Vec::new() })
                    .await
            },
        )
        .await?;
        if !r.claims.is_empty() {
            return Err(ProbeError::Call {
                call: "DRAPlugin.NodePrepareResources (no claims)",
                path: svc,
                detail: format!("answered for {} claims it was not asked for", r.claims.len()),
            });
        }
        Ok(format!(
            "{driver}: registration {} and service {} answer (versions {})",
            reg.display(),
            svc.display(),
            info.supported_versions.join(", ")
        ))
    })
}

async fn connect(
    path: &Path,
    driver: &str,
    timeout: Duration,
) -> Result<tonic::transport::Channel, ProbeError> {
    let err = |detail: String| ProbeError::Connect {
        path: path.to_path_buf(),
        driver: driver.to_string(),
        detail,
    };
    match tokio::time::timeout(timeout, crate::containers::kubelet::socket::connect_unix(path)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(err(crate::model::ErrorChain(&e).to_string())),
        Err(_) => Err(err(format!("no connection within {} s", timeout.as_secs_f64()))),
    }
}

async fn bounded<T>(
    call: &'static str,
    path: &Path,
    timeout: Duration,
    f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, ProbeError> {
    match tokio::time::timeout(timeout, f).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(ProbeError::Call {
            call,
            path: path.to_path_buf(),
            detail: format!("{:?}: {}", s.code(), s.message()),
        }),
        Err(_) => Err(ProbeError::Timeout {
            call,
            path: path.to_path_buf(),
            timeout,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin served on the `workstation` fixture (fake kernel) answers; one that stopped
    /// does not; another driver's name finds no socket.
    #[test]
    fn a_serving_plugin_passes_and_a_stopped_one_fails() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("host");
        crate::testkit::fixtures::build("workstation", &root).unwrap();
        let claims = t.path().join("claims");
        std::fs::create_dir_all(&claims).unwrap();
        let cfg = super::super::tests::test_config(t.path());
        let (server, stop_tx) =
            super::super::tests::serve(&root, &cfg, &claims, super::super::prepare::DEFAULT_LOCK_WAIT);
        let svc = cfg.service_socket();
        let reg = cfg.registration_socket();
        for _ in 0..400 {
            if svc.exists() && reg.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let ok = probe(&cfg, Duration::from_secs(10)).unwrap();
        assert!(ok.contains("v1.DRAPlugin"), "{ok}");
        // Another driver: no socket of that name.
        let other = Config {
            driver: "other.example.com".into(),
            ..cfg.clone()
        };
        let e = probe(&other, Duration::from_secs(2)).unwrap_err();
        assert!(matches!(e, ProbeError::Connect { .. }), "{e}");
        // A plugin directory that is not the one the plugin serves: the endpoint differs.
        let elsewhere = Config {
            plugin_dir: t.path().join("elsewhere"),
            ..cfg.clone()
        };
        let e = probe(&elsewhere, Duration::from_secs(2)).unwrap_err();
        assert!(matches!(e, ProbeError::Wrong { what: "endpoint", .. }), "{e}");
        stop_tx.send(()).unwrap();
        server.join().unwrap();
        let e = probe(&cfg, Duration::from_secs(2)).unwrap_err();
        assert!(matches!(e, ProbeError::Connect { .. }), "{e}");
    }

    #[test]
    fn no_plugin_is_a_connect_error_that_names_the_socket_and_the_driver() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            driver: "vfio.gpupass.dev".into(),
            pool: "node-a".into(),
            registry_dir: d.path().join("reg"),
            plugin_dir: d.path().join("plug"),
            poll: Duration::from_millis(100),
            uevents: false,
            health_every: Duration::from_millis(100),
        };
        let e = probe(&cfg, Duration::from_secs(2)).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, ProbeError::Connect { .. }), "{m}");
        assert!(m.contains("reg/vfio.gpupass.dev-reg.sock"), "{m}");
        assert!(m.contains("--driver vfio.gpupass.dev"), "{m}");
    }
}
