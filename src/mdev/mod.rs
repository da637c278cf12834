//! Mediated devices (mdev) and NVIDIA vendor-VFIO vGPU: list types and instances, create and
//! remove instances, and keep persistent definitions in mdevctl's format.
//!
//! Kernel facts this module encodes:
//! - A parent is any device the kernel lists under `sys/class/mdev_bus/<name>`: usually a PCI
//!   function (a GRID GPU, an Intel GVT-g iGPU), but the kernel's sample drivers (mbochs, mdpy,
//!   mtty) register *virtual* parents living under `sys/devices/virtual/<drv>/<drv>`.
//! - A parent's `mdev_supported_types/<type>/` holds `name`, `description`, `device_api`,
//!   `available_instances` and a write-only `create`: writing a UUID there makes
//!   `<parent>/<uuid>/`, linked from `sys/bus/mdev/devices/<uuid>`, with its own `iommu_group`
//!   and so its own `/dev/vfio/N`. Writing `1` to `sys/bus/mdev/devices/<uuid>/remove`
//!   destroys it. The create fails with EEXIST for a UUID in use and EUSERS when
//!   `available_instances` is 0.
//! - Removing an instance a VM holds open does not fail: the kernel asks the user (QEMU) to
//!   release it and the write blocks until it does. So `remove` checks for open file
//!   descriptors (`proc/<pid>/fd/*` pointing at the instance's `/dev/vfio/N`) first.
//! - NVIDIA vGPU 17+ on Ada/Hopper and later with kernel 6.8+ has no mdev bus: each SR-IOV
//!   VF of the GPU has `nvidia/creatable_vgpu_types` (a table `ID : vGPU Name`, capacity
//!   dependent: it empties as the GPU's framebuffer is handed out) and
//!   `nvidia/current_vgpu_type` (`0` = none). Writing a type id makes the VF *be* that vGPU;
//!   writing `0` clears it. The instance is then the VF's PCI address, not a UUID: the VM gets
//!   the VF as a plain VFIO PCI device. `types`, `create`, `list` and `remove` handle both
//!   models behind the same commands.
//!
//! Layout: [`types`] and [`list`] are the read side (pure functions of the
//! [`Inventory`](crate::model::Inventory), the definitions and the open-file scan), [`ops`]
//! makes the checks and the plans of create and remove, [`plan`] each instance's steps for the
//! one change engine ([`crate::change`]), which changes the host through
//! [`HostOps`](crate::host::ops::HostOps); [`defs`] reads `etc/mdevctl.d/<parent>/<uuid>`
//! exactly as mdevctl does and makes the plans that write and remove it; [`apply`] drives
//! each change (the lock, the read under it, the plan, the engine, what follows in the same
//! session); the clap arguments and the output are `cli::mdev`'s.

pub mod apply;
pub mod defs;
pub mod list;
pub mod ops;
pub mod plan;
pub mod types;

use crate::host::HostRoot;
use crate::model::PciAddress;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Everything that can go wrong in `gpupass mdev`. Each message names the object and the fix.
#[derive(Debug, thiserror::Error)]
pub enum MdevError {
    #[error("{}{}", unknown_parent_msg(.input, .suggestion.as_deref(), .known), .hint.unwrap_or(""))]
    UnknownParent {
        input: String,
        suggestion: Option<String>,
        known: Vec<String>,
        /// Extra advice for the command at hand.
        hint: Option<&'static str>,
    },
    #[error("parent {parent} has no mdev type {ty:?}; valid types: {}", list_or_none(.valid))]
    UnknownType {
        parent: String,
        ty: String,
        valid: Vec<String>,
    },
    #[error("no available instances of {ty} on {parent} ({available} available, {wanted} wanted); remove an instance (`gpupass mdev list`) or pick another type (`gpupass mdev types --parent {parent}`)")]
    NoAvailable {
        parent: String,
        ty: String,
        available: u32,
        wanted: u32,
    },
    #[error("mdev {uuid} already exists (parent {parent}, type {ty}); pick another UUID or omit --uuid to generate one")]
    UuidExists {
        uuid: String,
        parent: String,
        ty: String,
    },
    #[error(
        "mdev {uuid} is already defined for parent {parent} ({path}); `gpupass mdev undefine {uuid}` first"
    )]
    AlreadyDefined {
        uuid: String,
        parent: String,
        path: String,
    },
    #[error("mdev {uuid} is already running on {parent}; `gpupass mdev stop {uuid}` first")]
    AlreadyActive { uuid: String, parent: String },
    #[error("no active mdev {0}; `gpupass mdev list` shows the active ones")]
    NotActive(String),
    #[error("no definition for mdev {0}; `gpupass mdev list --defined` shows the defined ones")]
    NotDefined(String),
    #[error("mdev {uuid} is defined for several parents ({}); add --parent", .parents.join(", "))]
    Ambiguous { uuid: String, parents: Vec<String> },
    #[error("{what} is in use: {} is open by {}; stop the VM or process first", .node.display(), holders_msg(.holders))]
    InUse {
        what: String,
        node: PathBuf,
        holders: Vec<Holder>,
    },
    #[error("parent {parent} of mdev {uuid} is not present on this host (driver not loaded, or SR-IOV not enabled?); nothing was started")]
    ParentGone { parent: String, uuid: String },
    #[error("cannot write {value:?} to {}{}", .path.display(), hint_for(.source))]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("setting attribute {attr} of mdev {uuid} ({}) failed; {}", .path.display(), if *.rollback_ok { "the instance was removed again" } else { "the instance could NOT be removed again: remove it by hand" })]
    AttrFailed {
        uuid: String,
        attr: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
        rollback_ok: bool,
    },
    #[error("the kernel accepted {value} for {} but {expect} did not appear; nothing else was changed", .path.display())]
    NotCreated {
        path: PathBuf,
        value: String,
        expect: String,
    },
    #[error("cannot read mdev definitions in {}: {reason}", .path.display())]
    BadDefinition { path: PathBuf, reason: String },
    #[error("cannot write {}", .path.display())]
    DefIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Usage(String),
    /// The lock, the journal, or a failed step of a change (the one change engine).
    #[error(transparent)]
    Change(#[from] crate::change::ChangeError),
    #[error("an unfinished gpupass {0} touches the same instance; run `gpupass recover` to undo it (or `gpupass recover --continue` to finish it) first")]
    Unfinished(String),
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
    #[error("cannot write output")]
    Output(#[from] std::io::Error),
}

impl MdevError {
    /// Errors that are the caller's (exit status 2) rather than the host's (1).
    pub(crate) fn is_usage(&self) -> bool {
        matches!(self, MdevError::Usage(_))
    }
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn unknown_parent_msg(input: &str, suggestion: Option<&str>, known: &[String]) -> String {
    if known.is_empty() {
        return format!(
            "no mdev parent {input:?}: this host has none (no entries in /sys/class/mdev_bus and no \
             NVIDIA vGPU VFs); load the parent's driver (NVIDIA vGPU manager, i915 GVT-g, mbochs...) \
             or enable SR-IOV first"
        );
    }
    let mut s = format!("no mdev parent {input:?}");
    if let Some(sug) = suggestion {
        s.push_str(&format!("; did you mean {sug:?}?"));
    }
    s.push_str(&format!(" Parents here: {}", known.join(", ")));
    s
}

fn holders_msg(h: &[Holder]) -> String {
    h.iter()
        .map(|h| format!("{} (pid {})", h.comm, h.pid))
        .collect::<Vec<_>>()
        .join(", ")
}

fn hint_for(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(2) | Some(19) => " (the parent or instance went away: driver unloaded?)",
        Some(17) => " (the UUID is already in use)",
        Some(87) => " (no instances of this type are left)",
        Some(13) | Some(1) => " (run as root)",
        Some(16) => " (the device is busy: a vGPU type is already set, or it is open)",
        Some(22) => " (the kernel rejected the value: type not creatable on this device now?)",
        _ => "",
    }
}

/// A process holding a VFIO node open.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Holder {
    pub pid: u32,
    pub comm: String,
    /// The node as the process opened it (`/dev/vfio/12`).
    pub node: String,
}

/// A canonical (lower-case, 8-4-4-4-12) mdev UUID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MdevUuid(String);

impl MdevUuid {
    /// A random version-4 UUID from the operating system's random source (getrandom(2)).
    pub fn random() -> Result<Self, MdevError> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b)
            .map_err(|e| MdevError::Usage(format!("cannot get random bytes for a UUID: {e}")))?;
        // The uuid crate sets the version (4) and RFC 4122 variant bits and spells it
        // hyphenated, lower-case: the kernel's and mdevctl's form.
        let u = uuid::Builder::from_random_bytes(b).into_uuid();
        Ok(MdevUuid(u.hyphenated().to_string()))
    }
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MdevUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for MdevUuid {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        crate::model::canonical_uuid(t).map(MdevUuid).ok_or_else(|| {
            format!("{s:?} is not a UUID; expected 8-4-4-4-12 hex digits like 2f3e4d5c-6b7a-4988-8776-655443322110")
        })
    }
}

/// What `remove`/`stop` name: an mdev by UUID, or an NVIDIA vendor-VFIO vGPU by its VF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceRef {
    Uuid(MdevUuid),
    Vf(PciAddress),
}

/// Text that is neither an mdev UUID nor a VF's PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is neither an mdev UUID (8-4-4-4-12 hex digits) nor the PCI address of an NVIDIA vGPU VF (0000:41:00.4)")]
pub struct InstanceRefError {
    pub text: String,
}

impl FromStr for InstanceRef {
    type Err = InstanceRefError;
    fn from_str(s: &str) -> Result<Self, InstanceRefError> {
        if let Ok(u) = s.parse::<MdevUuid>() {
            return Ok(InstanceRef::Uuid(u));
        }
        if let Ok(a) = s.parse::<PciAddress>() {
            return Ok(InstanceRef::Vf(a));
        }
        Err(InstanceRefError { text: s.to_string() })
    }
}

/// Levenshtein distance, for "did you mean" (strsim's, over chars).
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    strsim::levenshtein(a, b)
}

/// The candidate closest to `input` by edit distance (ties: the first).
pub(crate) fn closest<'a>(input: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .min_by_key(|c| edit_distance(&input.to_ascii_lowercase(), &c.to_ascii_lowercase()))
}

/// Which processes hold which VFIO nodes open: every `proc/<pid>/fd/<n>` symlink whose target
/// starts with the host's `/dev/vfio/` (group nodes and `devices/vfioN` cdevs alike). The
/// kernel prints the target as the opening process sees it, which for VMs on the host is the
/// host path. Processes whose `fd` directory cannot be read (not root) are counted in
/// `unreadable`.
#[derive(Debug, Default, Clone)]
pub(crate) struct OpenNodes {
    pub holders: Vec<Holder>,
    pub unreadable: usize,
}

impl OpenNodes {
    pub(crate) fn scan(host: &HostRoot) -> Self {
        let prefix = format!("{}/", host.display(&host.dev_vfio()));
        let (files, unreadable) = crate::host::open_files(host, &|t: &str| t.starts_with(&prefix));
        let mut out = OpenNodes {
            holders: files
                .into_iter()
                .map(|o| Holder {
                    pid: o.pid,
                    comm: o.comm,
                    node: o.target,
                })
                .collect(),
            unreadable,
        };
        out.holders
            .sort_by(|a, b| (a.pid, &a.node).cmp(&(b.pid, &b.node)));
        out
    }

    /// Holders of one node (`/dev/vfio/12`).
    pub(crate) fn of(&self, node: &str) -> Vec<Holder> {
        self.holders.iter().filter(|h| h.node == node).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_parse_and_generate() {
        let u: MdevUuid = "2F3E4D5C-6b7a-4988-8776-655443322110".parse().unwrap();
        assert_eq!(u.as_str(), "2f3e4d5c-6b7a-4988-8776-655443322110");
        for bad in [
            "",
            "2f3e4d5c6b7a49888776655443322110",
            "../etc",
            "2f3e4d5c-6b7a-4988-8776-65544332211g",
        ] {
            assert!(bad.parse::<MdevUuid>().is_err(), "{bad}");
        }
        let a = MdevUuid::random().unwrap();
        let b = MdevUuid::random().unwrap();
        assert_ne!(a, b);
        assert!(crate::model::is_uuid(a.as_str()));
        assert_eq!(&a.as_str()[14..15], "4");
        assert!("89ab".contains(&a.as_str()[19..20]));
    }

    #[test]
    fn instance_refs() {
        assert_eq!(
            "41:00.4".parse::<InstanceRef>().unwrap(),
            InstanceRef::Vf("0000:41:00.4".parse().unwrap())
        );
        assert!(matches!(
            "2f3e4d5c-6b7a-4988-8776-655443322110".parse::<InstanceRef>(),
            Ok(InstanceRef::Uuid(_))
        ));
        assert!("nope".parse::<InstanceRef>().is_err());
    }

    #[test]
    fn did_you_mean() {
        assert_eq!(edit_distance("mbosch", "mbochs"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(closest("mbosch", ["mdpy", "mbochs", "mtty"]), Some("mbochs"));
        assert_eq!(
            closest("0000:3b:00.1", ["0000:3b:00.0", "mtty"]),
            Some("0000:3b:00.0")
        );
    }
}
