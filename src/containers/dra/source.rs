//! Where Prepare reads a ResourceClaim from. The kubelet names a claim by namespace, name and
//! UID only; the allocation (which devices, which node, which config) is in the claim object,
//! so the plugin must read it, and then checks it ([`super::claim::check`]).
//!
//! Two sources today:
//! - [`Kubectl`]: `kubectl get resourceclaims.v1.resource.k8s.io -n NS NAME -o json`, with the
//!   plugin's kubeconfig: the API server's own answer, parsed into k8s-openapi's
//!   `resource.k8s.io/v1` types. kube-rs is not compiled in (docs/dra.md, "Why not kube-rs
//!   yet"); a `kube::Api<ResourceClaim>` source is one more implementation of this trait.
//! - [`Dir`]: `<dir>/<namespace>/<name>.json`, a claim as `kubectl get -o json` prints it; for
//!   tests and for nodes driven without an API server.

use k8s_openapi::api::resource::v1::ResourceClaim;
use std::path::PathBuf;
use std::time::Duration;

/// Why a claim could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("claim {namespace}/{name} not found ({detail})")]
    NotFound {
        namespace: String,
        name: String,
        detail: String,
    },
    #[error("cannot read claim {namespace}/{name}: {detail}")]
    Failed {
        namespace: String,
        name: String,
        detail: String,
    },
    #[error("claim {namespace}/{name}: not a resource.k8s.io/v1 ResourceClaim: {detail}")]
    Malformed {
        namespace: String,
        name: String,
        detail: String,
    },
    #[error("invalid claim reference {namespace:?}/{name:?}: Kubernetes names are DNS labels/subdomains")]
    BadName { namespace: String, name: String },
}

/// Reads claims.
pub trait ClaimSource: Send + Sync {
    fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, SourceError>;
}

/// A Kubernetes object name: lower-case alphanumerics, `-` and `.`, at most 253 bytes, not
/// starting with `.` (so it is also safe as one path component).
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && !s.starts_with(['.', '-'])
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

fn parse(namespace: &str, name: &str, text: &str) -> Result<ResourceClaim, SourceError> {
    serde_json::from_str(text).map_err(|e| SourceError::Malformed {
        namespace: namespace.into(),
        name: name.into(),
        detail: e.to_string(),
    })
}

fn checked_names(namespace: &str, name: &str) -> Result<(), SourceError> {
    if valid_name(namespace) && valid_name(name) {
        Ok(())
    } else {
        Err(SourceError::BadName {
            namespace: namespace.into(),
            name: name.into(),
        })
    }
}

/// Claims as JSON files: `<dir>/<namespace>/<name>.json`.
#[derive(Debug, Clone)]
pub struct Dir {
    pub dir: PathBuf,
}

impl ClaimSource for Dir {
    fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, SourceError> {
        checked_names(namespace, name)?;
        let p = self.dir.join(namespace).join(format!("{name}.json"));
        match crate::host::read_bounded(&p, 4 << 20) {
            Ok(t) => parse(namespace, name, &t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(SourceError::NotFound {
                namespace: namespace.into(),
                name: name.into(),
                detail: format!("no {}", p.display()),
            }),
            Err(e) => Err(SourceError::Failed {
                namespace: namespace.into(),
                name: name.into(),
                detail: format!("{}: {e}", p.display()),
            }),
        }
    }
}

/// Claims from the API server through `kubectl`.
#[derive(Debug, Clone)]
pub struct Kubectl {
    pub kubectl: PathBuf,
    pub kubeconfig: Option<PathBuf>,
    /// The longest a read may take (kubelet's Prepare has a deadline of its own).
    pub timeout: Duration,
}

impl ClaimSource for Kubectl {
    fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, SourceError> {
        checked_names(namespace, name)?;
        let mut c = std::process::Command::new(&self.kubectl);
        if let Some(k) = &self.kubeconfig {
            c.arg("--kubeconfig").arg(k);
        }
        c.arg(format!("--request-timeout={}s", self.timeout.as_secs().max(1)))
            .args([
                "get",
                "resourceclaims.v1.resource.k8s.io",
                "-n",
                namespace,
                name,
                "-o",
                "json",
            ]);
        let out = c.output().map_err(|e| SourceError::Failed {
            namespace: namespace.into(),
            name: name.into(),
            detail: format!("cannot run {}: {e}", self.kubectl.display()),
        })?;
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if !out.status.success() {
            let detail = if stderr.is_empty() {
                format!("kubectl exited with {}", out.status)
            } else {
                stderr
            };
            return Err(if detail.contains("NotFound") || detail.contains("not found") {
                SourceError::NotFound {
                    namespace: namespace.into(),
                    name: name.into(),
                    detail,
                }
            } else {
                SourceError::Failed {
                    namespace: namespace.into(),
                    name: name.into(),
                    detail,
                }
            });
        }
        parse(namespace, name, &String::from_utf8_lossy(&out.stdout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_leave_the_directory_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = Dir {
            dir: t.path().to_path_buf(),
        };
        for (ns, n) in [
            ("..", "x"),
            ("default", "../x"),
            ("default", "a/b"),
            ("Default", "x"),
            ("", "x"),
        ] {
            assert!(
                matches!(d.get(ns, n), Err(SourceError::BadName { .. })),
                "{ns}/{n}"
            );
        }
        assert!(matches!(
            d.get("default", "gpu"),
            Err(SourceError::NotFound { .. })
        ));
        std::fs::create_dir_all(t.path().join("default")).unwrap();
        std::fs::write(t.path().join("default/gpu.json"), "{\"metadata\": 3}").unwrap();
        assert!(matches!(
            d.get("default", "gpu"),
            Err(SourceError::Malformed { .. })
        ));
    }

    #[test]
    fn kubectl_failures_say_what_kubectl_said() {
        let k = Kubectl {
            kubectl: "/nonexistent/kubectl".into(),
            kubeconfig: None,
            timeout: Duration::from_secs(1),
        };
        let e = k.get("default", "gpu").unwrap_err();
        assert!(e.to_string().contains("cannot run /nonexistent/kubectl"), "{e}");
    }
}
