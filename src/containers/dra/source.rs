//! Where Prepare reads a ResourceClaim from. The kubelet names a claim by namespace, name and
//! UID only; the allocation (which devices, which node, which config) is in the claim object,
//! so the plugin must read it, and then checks it ([`super::claim::check`]).
//!
//! Two sources:
//! - [`super::api::Claims`]: the API server, through kube-rs (`resource.k8s.io/v1`).
//! - [`Dir`]: `<dir>/<namespace>/<name>.json`, a claim as `kubectl get -o json` prints it; for
//!   tests and for nodes driven without an API server.

use k8s_openapi::api::resource::v1::ResourceClaim;
use std::path::PathBuf;

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

pub(crate) fn checked_names(namespace: &str, name: &str) -> Result<(), SourceError> {
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
}
