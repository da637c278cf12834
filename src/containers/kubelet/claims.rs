//! The claims the kubelet names and where they are read. The kubelet names a claim by
//! namespace, name and UID only ([`ClaimRef`]); the allocation (which devices, which node,
//! which config) is in the claim object, so the kit reads it ([`fetch`]: the object, its UID
//! checked against the one the kubelet asked for) before the driver is handed it, as
//! Kubernetes' helper does.
//!
//! Two sources:
//! - [`super::api::Claims`]: the API server, through kube-rs (`resource.k8s.io/v1`).
//! - [`Dir`]: `<dir>/<namespace>/<name>.json`, a claim as `kubectl get -o json` prints it; for
//!   tests and for nodes driven without an API server.

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The claim as the kubelet names it in NodePrepareResources and NodeUnprepareResources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRef {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

/// A claim the kit read for the kubelet's reference: what a driver's Prepare is handed.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    /// What the kubelet asked for.
    pub asked: ClaimRef,
    /// The object read, its UID, name and namespace those of `asked`.
    pub object: ResourceClaim,
}

/// Why a claim could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SourceError {
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
    #[error("claim {namespace}/{name}: the API server has UID {found}, the kubelet asked for {asked} (the claim was deleted and recreated); the kubelet retries with the current claim")]
    UidMismatch {
        namespace: String,
        name: String,
        asked: String,
        found: String,
    },
}

/// Reads claims.
pub(crate) trait ClaimSource: Send + Sync {
    fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, SourceError>;
}

/// The claim the kubelet named, read from `source`: its UID, name and namespace must be those
/// the kubelet asked for (a claim deleted and recreated under the same name has a new UID; the
/// kubelet retries with it).
pub(crate) fn fetch(source: &dyn ClaimSource, asked: &ClaimRef) -> Result<Claim, SourceError> {
    let object = source.get(&asked.namespace, &asked.name)?;
    let found = object.metadata.uid.clone().unwrap_or_default();
    if found != asked.uid
        || object.metadata.name.as_deref() != Some(asked.name.as_str())
        || object.metadata.namespace.as_deref() != Some(asked.namespace.as_str())
    {
        return Err(SourceError::UidMismatch {
            namespace: object.metadata.namespace.clone().unwrap_or_default(),
            name: object.metadata.name.clone().unwrap_or_default(),
            asked: asked.uid.clone(),
            found,
        });
    }
    Ok(Claim {
        asked: asked.clone(),
        object,
    })
}

/// A Kubernetes object name: lower-case alphanumerics, `-` and `.`, at most 253 bytes, not
/// starting with `.` (so it is also safe as one path component).
pub(crate) fn valid_name(s: &str) -> bool {
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
pub(crate) struct Dir {
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

    #[test]
    fn a_fetched_claim_has_the_uid_the_kubelet_asked_for() {
        let t = tempfile::tempdir().unwrap();
        let d = Dir {
            dir: t.path().to_path_buf(),
        };
        std::fs::create_dir_all(t.path().join("default")).unwrap();
        std::fs::write(
            t.path().join("default/gpu.json"),
            r#"{"metadata": {"name": "gpu", "namespace": "default", "uid": "u1"}, "spec": {}}"#,
        )
        .unwrap();
        let asked = |uid: &str| ClaimRef {
            namespace: "default".into(),
            uid: uid.into(),
            name: "gpu".into(),
        };
        let c = fetch(&d, &asked("u1")).unwrap();
        assert_eq!(c.asked, asked("u1"));
        assert_eq!(c.object.metadata.uid.as_deref(), Some("u1"));
        let e = fetch(&d, &asked("u9")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "claim default/gpu: the API server has UID u1, the kubelet asked for u9 (the claim was deleted and recreated); the kubelet retries with the current claim"
        );
        assert!(matches!(
            fetch(
                &d,
                &ClaimRef {
                    name: "other".into(),
                    ..asked("u1")
                }
            ),
            Err(SourceError::NotFound { .. })
        ));
    }
}
