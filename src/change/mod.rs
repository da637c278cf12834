//! The one change engine: every change gpupass makes to a host is a [`Plan`] of typed
//! [`Step`]s, applied by [`engine`] through [`HostOps`](crate::host::ops::HostOps) under the
//! one lock, with every write announced in the one [`journal`] before it is made, verified,
//! rolled back on failure, and finished or undone by `gpupass recover` after a crash.
//!
//! A plan is made of [`Part`]s, one per domain that contributes to it (a group bind, a CDI
//! spec write, mdev instances, driverctl or mdevctl files), so a caller composes one plan from
//! several parts and applies it as one transaction under one lock, tagged with an owner (the
//! DRA plugin's claim UID) that the journal records. Each part has two halves, as a bind plan
//! always had:
//! - the ordered [`Step`]s, in the kernel's paths before the root (`write "vfio-pci" >
//!   /sys/bus/pci/devices/.../driver_override`, `write file /etc/driverctl.d/pci-...`), which
//!   `--dry-run` prints ([`Plan::render`]) and apply runs, one for one;
//! - the [`Object`]s it changes with their state before and after (a PCI function's driver,
//!   an mdev instance absent then present, a VF's vGPU type, a file's content). Rollback and
//!   recovery are state-based on these: they read what the host shows now and make only the
//!   writes still needed, so they are right whichever write a crash interrupted, and running
//!   them twice is harmless.
//!
//! The domains build plans (`bind::Plan::to_part`, `mdev::plan::part`,
//! `bind::persist::PersistPlan::to_change`, `mdev::defs::define_part`, `containers::cdi::spec_part`)
//! and map the engine's [`ChangeError`] into their own errors; the engine knows the kernel's
//! objects, not the commands. A plan of several parts, as the DRA plugin's prepare of a claim
//! will make it (`tests.rs` builds and crashes exactly this):
//!
//! ```text
//! let mut session = Session::lock(ops, wait)?;      // plan from a view no one else changes
//! let bind = bind::plan_bind(&inv, &facts, &req);   // refusals checked by the caller
//! let mut files = Part::new("dra", "claim 7f3a files");
//! files.file(host, &spec_path, Some(spec_json), false)   // content before read now
//!      .file(host, &meta_path, Some(meta_json), false);
//! let mut plan = Plan::default().owned_by(claim_uid);
//! plan.push(bind.to_part()).push(files);
//! print!("{}", plan.render());                      // --dry-run: the exact steps
//! session.apply(&plan)?;                            // one transaction, one `change` record
//! ```

pub mod engine;
pub mod journal;

use crate::host::HostRoot;
use crate::model::PciAddress;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::PathBuf;

pub(crate) use engine::recover_then;
#[cfg(feature = "dra")]
pub(crate) use engine::recover_where;
pub use engine::{apply, recover, Followup, Outcome, Recovered, Session};

/// What a move of drivers does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Bind,
    Unbind,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Action::Bind => "bind",
            Action::Unbind => "unbind",
        })
    }
}

/// The driver side of one function's state: what `driver` and `driver_override` hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DriverState {
    /// Bound driver (`driver` link), `None` when driverless.
    pub driver: Option<String>,
    /// Module providing that driver (`drivers/<d>/module`), to reload it if needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// `driver_override`, `None` when unset.
    pub driver_override: Option<String>,
}

/// One function a plan moves: its state before and the state the plan leads to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuncPlan {
    pub address: PciAddress,
    pub group: Option<u32>,
    pub before: DriverState,
    pub after: DriverState,
}

/// The functions gpupass bound and the state each had before (from the journal).
pub type BoundState = std::collections::BTreeMap<PciAddress, DriverState>;

/// What a driver check verifies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "expect", rename_all = "snake_case")]
pub enum Expect {
    /// The `driver` link names exactly this driver.
    Driver { driver: String },
    /// Any driver but a VFIO one (an unbind without a journal entry: report who claimed it).
    NotVfio,
}

/// What a sysfs write is, for the error it gives when it fails.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Role {
    /// A write that moves the PCI function `address` between drivers.
    Driver { address: PciAddress },
    /// The UUID to an mdev type's `create` on `parent`.
    Create { parent: String },
    /// An `--attr` of an mdev instance.
    Attr { uuid: String, name: String },
    /// `1` to an mdev instance's `remove`.
    Remove,
    /// A vGPU type id (or `0`) to a VF's `nvidia/current_vgpu_type`.
    VgpuType,
}

/// How many emptied directories a file's removal takes with it: the host's
/// ([`crate::host::ops::Prune`]), which the journal records in its steps and objects.
pub use crate::host::ops::Prune;

/// One ordered step of a plan. The writes (`write`, `write_file`, `remove_file`) are what the
/// journal announces as `step`s and what the test kit's failpoints count; the rest are checks
/// (and module loads) between them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Step {
    /// `modprobe MODULE` (skipped by the host when already loaded).
    LoadModule { module: String },
    /// Write `value` to the sysfs attribute `path` (as on the host, `/sys/...`).
    Write {
        path: String,
        value: String,
        #[serde(flatten)]
        role: Role,
    },
    /// Create or replace the file `path` (as on the host, `/etc/...`) with `contents`,
    /// atomically (a temporary file in the same directory, renamed over it).
    WriteFile { path: String, contents: String },
    /// Remove the file `path`; with `prune`, the directories it empties too ([`Prune`]).
    RemoveFile {
        path: String,
        #[serde(default, skip_serializing_if = "Prune::is_none")]
        prune: Prune,
    },
    /// The function's `driver` link after the probe.
    CheckDriver {
        address: PciAddress,
        path: String,
        #[serde(flatten)]
        expect: Expect,
    },
    /// The VFIO group node exists.
    CheckNode { group: u32, path: String },
    /// Every member of the group is driverless, on a VFIO driver / pci-stub, or a bridge.
    CheckViable { group: u32 },
    /// `path` exists (`present`) or is gone (an mdev instance appeared, or was removed).
    CheckPresent { path: String, present: bool },
    /// The attribute `path` reads `value` (`0` also matches an empty read).
    CheckReads { path: String, value: String },
}

impl Step {
    /// One line as `--dry-run` prints it.
    pub(crate) fn render(&self) -> String {
        match self {
            Step::LoadModule { module } => format!("load module {module} (modprobe {module})"),
            Step::Write { path, value, .. } => format!("write {value:?} > {path}"),
            Step::WriteFile { path, contents } => {
                format!("write file {path} ({} bytes, atomically)", contents.len())
            }
            Step::RemoveFile { path, prune } if prune.is_none() => format!("remove file {path}"),
            Step::RemoveFile { path, prune } if prune.0 == 1 => {
                format!("remove file {path} (and its directory once empty)")
            }
            Step::RemoveFile { path, prune } => {
                format!(
                    "remove file {path} (and up to {} emptied directories above it)",
                    prune.0
                )
            }
            Step::CheckDriver {
                path,
                expect: Expect::Driver { driver },
                ..
            } => format!("check {path} -> {driver}"),
            Step::CheckDriver {
                path,
                expect: Expect::NotVfio,
                ..
            } => format!("check {path} is not a VFIO driver (report which driver claimed it)"),
            Step::CheckNode { path, .. } => format!("check {path} exists"),
            Step::CheckViable { group } => {
                format!("check group {group} is viable (members driverless, on VFIO/pci-stub, or bridges)")
            }
            Step::CheckPresent { path, present: true } => format!("check {path} exists"),
            Step::CheckPresent { path, present: false } => format!("check {path} is gone"),
            Step::CheckReads { path, value } => format!("check {path} reads {value:?}"),
        }
    }

    /// A write: journaled as a `step`, counted by the failpoints and by [`Plan::write_count`].
    pub(crate) fn is_write(&self) -> bool {
        matches!(
            self,
            Step::Write { .. } | Step::WriteFile { .. } | Step::RemoveFile { .. }
        )
    }
}

/// One object a plan changes, with its state before and after: what rollback and `recover`
/// restore (before) or complete (after, `recover --continue`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Object {
    /// A PCI function moved between drivers by a bind or an unbind.
    Function {
        action: Action,
        address: PciAddress,
        group: Option<u32>,
        before: DriverState,
        after: DriverState,
    },
    /// Before: no mdev instance `uuid`. After: an instance of `mdev_type` on `parent` with
    /// `attrs`.
    Create {
        uuid: String,
        parent: String,
        mdev_type: String,
        attrs: Vec<(String, String)>,
    },
    /// Before: the instance exists (of `mdev_type` on `parent`). After: it does not.
    Remove {
        uuid: String,
        parent: String,
        mdev_type: String,
    },
    /// An NVIDIA vGPU VF: before type `0` (none), after `mdev_type`.
    VgpuSet { vf: PciAddress, mdev_type: String },
    /// An NVIDIA vGPU VF: before type `was`, after `0`.
    VgpuClear { vf: PciAddress, was: String },
    /// A file (`path` as on the host): its content before and after, `None` for absent.
    /// `prune`: removing it also removes the directories it empties (mdevctl's parents, a
    /// DRA claim's metadata directories).
    File {
        path: String,
        before: Option<String>,
        after: Option<String>,
        #[serde(default, skip_serializing_if = "Prune::is_none")]
        prune: Prune,
    },
}

impl Object {
    /// The object as a function's plan, for a [`Object::Function`].
    pub(crate) fn function(action: Action, f: &FuncPlan) -> Object {
        Object::Function {
            action,
            address: f.address,
            group: f.group,
            before: f.before.clone(),
            after: f.after.clone(),
        }
    }

    /// What this object is, as keys two plans must not share with an unfinished one: a PCI
    /// function and its IOMMU group, an mdev UUID, a VF, a file.
    pub(crate) fn keys(&self) -> Vec<String> {
        match self {
            Object::Function { address, group, .. } => {
                let mut k = vec![format!("pci:{address}")];
                if let Some(g) = group {
                    k.push(format!("group:{g}"));
                }
                k
            }
            Object::Create { uuid, .. } | Object::Remove { uuid, .. } => vec![format!("mdev:{uuid}")],
            Object::VgpuSet { vf, .. } | Object::VgpuClear { vf, .. } => vec![format!("pci:{vf}")],
            Object::File { path, .. } => vec![format!("file:{path}")],
        }
    }

    /// One short label: `0000:01:00.0`, `2f3e... (mdpy-vga on mdpy)`, `/etc/driverctl.d/...`.
    pub(crate) fn label(&self) -> String {
        match self {
            Object::Function { address, .. } => address.to_string(),
            Object::Create {
                uuid,
                parent,
                mdev_type,
                ..
            } => format!("{uuid} ({mdev_type} on {parent})"),
            Object::Remove { uuid, parent, .. } => format!("{uuid} (on {parent})"),
            Object::VgpuSet { vf, mdev_type } => format!("VF {vf} (type {mdev_type})"),
            Object::VgpuClear { vf, was } => format!("VF {vf} (type {was})"),
            Object::File { path, .. } => path.clone(),
        }
    }
}

/// The logical paths of the mdev and vGPU steps, built where every host path is
/// ([`crate::host::logical`]).
pub(crate) use crate::host::logical::{mdev_create_path, mdev_instance_path, vgpu_type_path};

/// One domain's share of a plan: what it is for people, the objects it changes and the
/// ordered steps that change them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// Who made it: `bind`, `unbind`, `mdev`, `persist`, `cdi`.
    pub domain: String,
    /// One line for the journal, the warnings and `recover`: `bind of IOMMU group 1`.
    pub what: String,
    pub objects: Vec<Object>,
    pub steps: Vec<Step>,
}

impl Part {
    /// A part with no objects or steps yet.
    pub(crate) fn new(domain: impl Into<String>, what: impl Into<String>) -> Part {
        Part {
            domain: domain.into(),
            what: what.into(),
            objects: Vec::new(),
            steps: Vec::new(),
        }
    }

    /// Add a file change: `path` (as on the host) gets `after` (`None`: removed). The content
    /// now is read as the state before; a file already as wanted adds nothing (so a refresh
    /// that changes nothing writes nothing). `prune`: a removal also removes the emptied
    /// directory.
    pub(crate) fn file(
        &mut self,
        host: &HostRoot,
        path: &str,
        after: Option<String>,
        prune: impl Into<Prune>,
    ) -> &mut Part {
        let prune = prune.into();
        let before = read_file_now(host, path);
        if before == after {
            return self;
        }
        self.steps.push(match &after {
            Some(c) => Step::WriteFile {
                path: path.to_string(),
                contents: c.clone(),
            },
            None => Step::RemoveFile {
                path: path.to_string(),
                prune,
            },
        });
        self.objects.push(Object::File {
            path: path.to_string(),
            before,
            after,
            prune,
        });
        self
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.objects.is_empty() && self.steps.is_empty()
    }
}

/// A file's content now, byte for byte (`None`: absent, not a regular file, or unreadable),
/// `path` as on the host. (Not `host::read_bounded`, which trims the trailing newline a
/// driverctl file ends with.)
pub(crate) fn read_file_now(host: &HostRoot, path: &str) -> Option<String> {
    use std::io::Read;
    let f = std::fs::File::open(host.path(path)).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut buf = Vec::new();
    f.take(64 << 20).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The path of `p` (built by [`HostRoot`]) as on the host: what steps and objects carry.
pub(crate) fn logical(host: &HostRoot, p: &std::path::Path) -> String {
    host.display(p)
}

/// A whole change: one or more parts, applied as one transaction under one lock, with an
/// optional owner recorded in the journal (the DRA plugin's claim UID).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub parts: Vec<Part>,
    /// What the owner holds once the plan commits ([`Holds`]), replacing what it held before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holds: Option<Holds>,
    /// The owner gives back everything it held once the plan commits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub releases: bool,
}

/// What an owner (a DRA claim) holds while it lives: the functions it has alone (a claim's
/// device and its IOMMU-group companions) and those it shares with owners of its kind (the
/// parent of a claim's mediated devices, which other claims' vGPUs may share). Recorded in
/// the journal's `change` record and replayed ([`journal::Replay::held`]), so that a second
/// claim on the same group or parent, or `gpupass unbind` on the host, is refused naming the
/// holder.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holds {
    /// Who, for people: `claim NAMESPACE/NAME (UID)`.
    pub label: String,
    /// Keys held alone: PCI addresses (`0000:01:00.0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alone: Vec<String>,
    /// Keys held together with other sharing holders: mdev parents (an address, or a
    /// virtual parent's name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<String>,
}

impl Plan {
    /// A plan of one part.
    pub(crate) fn of(part: Part) -> Plan {
        Plan {
            parts: vec![part],
            ..Plan::default()
        }
    }

    /// Tag the plan with its owner (recorded in the journal's `change` record).
    #[cfg(any(test, feature = "dra"))]
    pub(crate) fn owned_by(mut self, owner: impl Into<String>) -> Plan {
        self.owner = Some(owner.into());
        self
    }

    /// Whether the plan must be journaled even with no write: it takes or gives back holds.
    pub(crate) fn moves_holds(&self) -> bool {
        self.holds.is_some() || self.releases
    }

    /// Add a part (after the ones already there: parts run in order). Empty parts are
    /// dropped.
    pub(crate) fn push(&mut self, part: Part) -> &mut Plan {
        if !part.is_empty() {
            self.parts.push(part);
        }
        self
    }

    /// Every step, in order.
    pub(crate) fn steps(&self) -> impl Iterator<Item = &Step> {
        self.parts.iter().flat_map(|p| p.steps.iter())
    }

    /// Every object, in order.
    pub(crate) fn objects(&self) -> Vec<Object> {
        self.parts
            .iter()
            .flat_map(|p| p.objects.iter().cloned())
            .collect()
    }

    /// The plan's writes: the unit of the journal's `step`s and of the failpoints.
    pub(crate) fn write_count(&self) -> usize {
        self.steps().filter(|s| s.is_write()).count()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.parts.iter().all(Part::is_empty)
    }

    /// The journal's `domain`: the parts' domains, joined with `+` in order.
    pub(crate) fn domain(&self) -> String {
        let mut d: Vec<&str> = Vec::new();
        for p in &self.parts {
            if !d.contains(&p.domain.as_str()) {
                d.push(&p.domain);
            }
        }
        d.join("+")
    }

    /// One line for the journal: the parts' `what`s, and the owner.
    pub(crate) fn describe(&self) -> String {
        let w: Vec<&str> = self.parts.iter().map(|p| p.what.as_str()).collect();
        match &self.owner {
            Some(o) => format!("{} (for {o})", w.join(" + ")),
            None => w.join(" + "),
        }
    }

    /// The steps as `--dry-run` prints them: `plan: WHAT (N writes)`, then numbered steps.
    pub(crate) fn render(&self) -> String {
        let mut s = format!(
            "plan: {} ({} writes)\nsteps:\n",
            self.describe(),
            self.write_count()
        );
        for (i, st) in self.steps().enumerate() {
            let _ = writeln!(s, "  {:>2}. {}", i + 1, st.render());
        }
        s
    }

    /// The plan as `--dry-run --json` prints it: the plan, its write count (the numbers the
    /// failpoints take) and `dry_run`.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "plan": self, "writes": self.write_count(), "dry_run": true })
    }
}

/// A wait as the lock's error says it: whole seconds as `30`, a shorter or uneven wait as
/// `0.2` (the DRA plugin waits what is left of the kubelet's deadline).
fn seconds(d: std::time::Duration) -> String {
    if d.subsec_millis() == 0 {
        d.as_secs().to_string()
    } else {
        format!("{:.1}", d.as_secs_f64())
    }
}

/// Why a change could not be made, or failed. The messages are the ones bind and mdev have
/// always given (docs/errors.md, E-BIND-10/11/12/16, E-CHANGE-*).
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    #[error("journal {}; check that the directory is writable (gpupass needs root to change drivers)", .path.display())]
    Journal {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another gpupass (pid {holder}) is changing devices and did not finish within {} s (lock {}); try again when it is done", seconds(*.waited), .path.display())]
    Locked {
        path: PathBuf,
        holder: String,
        /// How long it waited ([`Session::lock`]'s `wait`).
        waited: std::time::Duration,
    },
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
    /// An unfinished plan (a crash) touches an object of this one.
    #[error("an unfinished gpupass {} touches the same {key}; run `gpupass recover` to undo it (or `gpupass recover --continue` to finish it) first", .open.describe())]
    Unfinished {
        open: Box<journal::OpenChange>,
        key: String,
    },
    /// A step failed; the plan was rolled back (or the rollback failed too: `recover`).
    #[error("{} {} failed: {}; {}", .0.domain, .0.what, crate::model::ErrorChain(&.0.cause), .0.rollback_text())]
    Failed(Box<engine::Failure>),
    #[error("recover of txn {txn} failed: {detail}; the plan stays open in the journal; fix the cause and run `gpupass recover` again")]
    RecoverFailed { txn: String, detail: String },
}

#[cfg(test)]
mod tests;
