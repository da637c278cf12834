//! Prepared claims by UID, in one file the plugin rewrites atomically
//! (`/var/lib/kubelet/plugins/<driver>/checkpoint.json`, mode 0600): it survives a plugin
//! restart, and each entry carries the boot id (`/proc/sys/kernel/random/boot_id`) it was made
//! under, so a node reboot (every bind gone with the old kernel) is told apart from a restart.
//!
//! An entry is written `started` before Prepare changes anything and `completed` after
//! (`bound` by the bind before binding of [`super::binding`], which Prepare then takes over), and
//! records each function's driver before gpupass touched it: Unprepare gives back only the
//! functions the plugin moved (a function that was on vfio-pci before, from a boot-time bind,
//! `vfio-pci.ids=` or `gpupass persist`, stays there), and a retried Prepare after a crash
//! keeps the drivers of its first attempt.

use super::claim::{ClaimDevice, ClaimRef, Prepared};
use crate::host::HostRoot;
use crate::model::PciAddress;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The checkpoint's format version.
pub(crate) const VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckpointError {
    #[error("cannot read the DRA checkpoint {}; check its permissions (the plugin runs as root)", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the DRA checkpoint {} is not a checkpoint gpupass can read ({reason}); move it aside: the plugin then starts with no prepared claims, the kubelet prepares them again, and `gpupass unbind` gives back functions still on vfio-pci", .path.display())]
    Parse { path: PathBuf, reason: String },
    #[error("cannot write the DRA checkpoint {}; check that the kubelet plugin directory is writable by root", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// How far a claim's Prepare got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum State {
    /// Prepare began; the host may hold part of it.
    Started,
    /// Prepare finished; `prepared` is what the kubelet was told.
    Completed,
    /// Bound before the Pod was bound (binding conditions, [`super::binding`]): the devices'
    /// groups moved to vfio-pci, no files written, the kubelet has not prepared it yet. Written
    /// before the bind (with the drivers before); Prepare takes it over, a claim deallocated or
    /// deleted before Prepare is unprepared by the plugin itself.
    Bound,
}

/// One claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub claim: ClaimRef,
    pub boot_id: String,
    pub state: State,
    pub devices: Vec<ClaimDevice>,
    /// Each member's driver before the plugin touched it (`null`: none).
    pub drivers_before: BTreeMap<PciAddress, Option<String>>,
    /// Set when completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepared: Option<Prepared>,
}

impl Entry {
    /// The functions Unprepare gives back: members that were not on a VFIO driver before.
    pub(crate) fn moved(&self) -> Vec<PciAddress> {
        self.drivers_before
            .iter()
            .filter(|(_, d)| !d.as_deref().is_some_and(crate::model::is_vfio_driver))
            .map(|(a, _)| *a)
            .collect()
    }

    /// The DRA device names this claim holds.
    pub(crate) fn device_names(&self) -> impl Iterator<Item = &str> {
        self.devices.iter().map(|d| d.device.as_str())
    }
}

/// The whole checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    pub version: u32,
    /// By claim UID.
    pub claims: BTreeMap<String, Entry>,
}

impl Checkpoint {
    /// The claim of this boot that holds `device`, other than `uid`.
    pub(crate) fn holder(&self, device: &str, uid: &str, boot_id: &str) -> Option<&Entry> {
        self.claims
            .values()
            .filter(|e| e.claim.uid != uid && e.boot_id == boot_id)
            .find(|e| e.device_names().any(|d| d == device))
    }
}

/// `var/lib/kubelet/plugins/<driver>/checkpoint.json` under the root.
pub(crate) fn path(host: &HostRoot, driver: &str) -> PathBuf {
    host.path(&format!(
        "{}/checkpoint.json",
        crate::containers::kubelet::plugin::plugin_dir_logical(driver)
    ))
}

/// Read it; a missing file is an empty checkpoint.
pub(crate) fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let text = match crate::host::read_bounded(path, 64 << 20) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Checkpoint {
                version: VERSION,
                ..Default::default()
            })
        }
        Err(e) => {
            return Err(CheckpointError::Read {
                path: path.to_path_buf(),
                source: e,
            })
        }
    };
    let c: Checkpoint = serde_json::from_str(&text).map_err(|e| CheckpointError::Parse {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if c.version != VERSION {
        return Err(CheckpointError::Parse {
            path: path.to_path_buf(),
            reason: format!("version {} (this gpupass reads {VERSION})", c.version),
        });
    }
    Ok(c)
}

/// Write it atomically, root-only (the file 0600, its directory 0700).
pub(crate) fn save(path: &Path, c: &Checkpoint) -> Result<(), CheckpointError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |e| CheckpointError::Write {
        path: path.to_path_buf(),
        source: e,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
    }
    let text = serde_json::to_string_pretty(c).expect("a checkpoint serializes");
    crate::host::write_atomic(path, text.as_bytes()).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn entry(uid: &str, boot: &str, before: Option<&str>) -> Entry {
        let a: PciAddress = "0000:00:05.0".parse().unwrap();
        Entry {
            claim: ClaimRef {
                namespace: "default".into(),
                uid: uid.into(),
                name: "gpu".into(),
            },
            boot_id: boot.into(),
            state: State::Started,
            devices: vec![ClaimDevice {
                request: "vfio".into(),
                pool: "node-a".into(),
                device: "pci-0000-00-05-0".into(),
                group: 4,
                lead: Some(a),
                members: vec![a],
                mdev: None,
            }],
            drivers_before: BTreeMap::from([(a, before.map(String::from))]),
            prepared: None,
        }
    }

    #[test]
    fn round_trips_root_only() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("plugins/x/checkpoint.json");
        assert_eq!(load(&p).unwrap().claims.len(), 0);
        let mut c = load(&p).unwrap();
        c.claims.insert("u1".into(), entry("u1", "b1", Some("bochs-drm")));
        save(&p, &c).unwrap();
        assert_eq!(load(&p).unwrap(), c);
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(p.parent().unwrap())
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        std::fs::write(&p, "{").unwrap();
        let e = load(&p).unwrap_err();
        assert!(matches!(e, CheckpointError::Parse { .. }));
        assert!(
            e.to_string().contains("is not a checkpoint gpupass can read"),
            "{e}"
        );
    }

    #[test]
    fn functions_on_vfio_before_are_not_moved() {
        assert_eq!(entry("u", "b", Some("bochs-drm")).moved().len(), 1);
        assert_eq!(entry("u", "b", None).moved().len(), 1);
        assert!(entry("u", "b", Some("vfio-pci")).moved().is_empty());
    }

    #[test]
    fn the_holder_is_another_claim_of_this_boot() {
        let mut c = Checkpoint::default();
        c.claims.insert("u1".into(), entry("u1", "b1", None));
        assert_eq!(c.holder("pci-0000-00-05-0", "u2", "b1").unwrap().claim.uid, "u1");
        assert!(c.holder("pci-0000-00-05-0", "u1", "b1").is_none());
        assert!(
            c.holder("pci-0000-00-05-0", "u2", "b2").is_none(),
            "a claim of an old boot holds nothing"
        );
    }
}
