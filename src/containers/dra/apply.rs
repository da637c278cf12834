//! The one place the DRA plugin changes the host: a claim's prepare and its unprepare, each
//! ONE plan of the change engine ([`crate::change`]) owned by the claim ([`owner`]: the
//! journal's `change` record carries the claim UID), applied under the one lock with the one
//! journal, verified, rolled back on a failure (state-based: every object goes back to its
//! state before), and finished or undone by `gpupass recover` after a crash.
//!
//! - [`prepare`]: the group bind of every allocated device (`bind::apply::bind_part_in`: the
//!   journaled IOMMU-group bind steps, the in-use refusals that name the holder), then, in
//!   the same transaction, the claim's files (the per-claim CDI spec, the KEP-5304 metadata
//!   file and its CDI spec) planned from the host as the bind left it
//!   ([`Session::apply_then`](crate::change::Session::apply_then)): which VFIO nodes a claim
//!   gets (the group node, or the device cdev that appears only once vfio-pci holds the
//!   function) is known only after the bind.
//!   The mediated devices of the claim's mdev slots are created in the same plan, after the
//!   bind and before the files (`mdev::plan`'s create steps: an instance's VFIO nodes, like
//!   a bound function's, exist only once it does).
//! - [`unprepare`]: the undo of that plan as one plan of its own: the claim's mediated
//!   devices removed, the functions the claim moved given back to the drivers the journal
//!   recorded (`bind::apply::unbind_part_in` with `only`: never a function that was on
//!   vfio-pci before gpupass touched it), the files removed.
//!
//! When either moved functions between drivers, the host's CDI specs (`cdi generate
//! --write`'s) are refreshed in the same session before the lock is released
//! ([`crate::containers::cdi::refresh_in`]); the one read of the host after the writes (a
//! prepare's, for the claim's files; an unprepare's, the refresh's) is handed on
//! ([`Applied::view`]) to the refresh and to the driver's health and publication: one scan
//! after the writes for all of them.
//!
//! The lock is waited for at most `wait` (the plugin's bound, never past the kubelet's
//! deadline): a kubelet call must not hang behind another gpupass; it fails and is retried.

use crate::bind::apply::{bind_part_in, unbind_part_in};
use crate::bind::{BindError, BindRequest, UnbindRequest};
use crate::change::engine::{current_driver, Followup, Then};
use crate::change::{ChangeError, Part, Plan, Session};
use crate::host::ops::HostOps;
use crate::host::HostRoot;
use crate::model::{is_vfio_driver, ErrorChain, Inventory, PciAddress};
use std::collections::BTreeMap;
use std::time::Duration;

/// The engine's domain of the claim's file part.
pub(crate) const DOMAIN: &str = "dra";

/// The owner tag of a claim's plans in the journal: `dra-claim:<uid>`.
pub(crate) fn owner(uid: &str) -> String {
    format!("{OWNER_PREFIX}{uid}")
}

/// A claim as the journal knows its plans: the owner tag ([`owner`]) and, for people, the
/// claim's `NAMESPACE/NAME (UID)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    pub tag: String,
    pub label: String,
}

impl Owner {
    pub(crate) fn claim(uid: &str, label: &str) -> Owner {
        Owner {
            tag: owner(uid),
            label: format!("claim {label}"),
        }
    }
}

/// What every claim's owner tag begins with.
pub(crate) const OWNER_PREFIX: &str = "dra-claim:";

/// Whether an unfinished plan of the journal is a claim's (a Prepare or Unprepare of this
/// plugin that never ended).
pub(crate) fn is_claims(t: &crate::change::journal::OpenChange) -> bool {
    t.owner.as_deref().is_some_and(|o| o.starts_with(OWNER_PREFIX))
}

/// A file of a claim: its path (as on the host) and, for a write, its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct File {
    pub path: String,
    pub contents: Option<String>,
}

/// Why a claim's plan failed: the engine's or the bind planner's own message (a device in
/// use names its holder and the fix; the lock names the other gpupass and the wait).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApplyError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Change(#[from] ChangeError),
    /// Another live claim holds a function of the claim's groups, or the parent of its
    /// mediated devices (one owner per group, whatever the scheduler allocated).
    #[error(
        "{key} is held by {holder}{how}: one owner per group, a claim may not share an IOMMU group or an mdev parent with another claim's devices; the claim is refused and nothing was changed (once that claim's Pod is deleted the kubelet unprepares it and this claim can be prepared)"
    )]
    Held {
        key: String,
        holder: String,
        how: &'static str,
    },
}

impl ApplyError {
    /// Whether the host is as it was before the call: refused before the first write, or
    /// failed and rolled back. (A rollback that failed too leaves the plan open for `gpupass
    /// recover`.)
    pub(crate) fn changed_nothing(&self) -> bool {
        let change = match self {
            ApplyError::Change(c) | ApplyError::Bind(BindError::Change(c)) => c,
            ApplyError::Bind(_) | ApplyError::Held { .. } => return true,
        };
        match change {
            ChangeError::Failed(f) => f.rollback_ok(),
            // The journal failed: perhaps after writes (the commit record).
            ChangeError::Journal { .. } | ChangeError::RecoverFailed { .. } => false,
            ChangeError::Locked { .. } | ChangeError::Inventory(_) | ChangeError::Unfinished { .. } => true,
        }
    }
}

/// What a claim's plan did.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Applied {
    /// The functions whose driver the plan moved, each with the driver it was on before (as
    /// the bind or unbind planned it under the lock).
    pub moved: BTreeMap<PciAddress, Option<String>>,
    /// Whether it wrote anything at all (a retry of a prepared claim writes nothing).
    pub wrote: bool,
    /// The host as the plan's writes left it, read once under the lock after them: the view
    /// the claim's files and the CDI refresh were planned from, which the driver hands on to
    /// its health and publication instead of reading the host again. [`prepare`] always
    /// reads it; [`unprepare`] only when it moved functions and the CDI refresh had a spec to
    /// plan (else `None`, and the driver reads the host itself, as the refresh did not).
    pub view: Option<Inventory>,
}

/// The metadata file sits in directories of its own (`.../<ns>_<claim>/<request>/`): removing
/// it removes both once empty (the claim's directory holds one per request).
fn prune(path: &str) -> crate::change::Prune {
    crate::change::Prune(if path.ends_with("/metadata.json") { 2 } else { 0 })
}

/// The part of a claim's files, as they are wanted (`contents` `None`: absent); a file
/// already as wanted adds nothing.
fn files_part(host: &HostRoot, what: &str, files: &[File]) -> Part {
    let mut part = Part::new(DOMAIN, what);
    for f in files {
        part.file(host, &f.path, f.contents.clone(), prune(&f.path));
    }
    part
}

/// The error `files` may give, boxed for the engine.
pub(crate) type FilesError = Box<dyn std::error::Error + Send + Sync>;

/// What [`prepare`] calls after the bind and the creation: the claim's files, from the host
/// and its inventory as the writes left them.
pub(crate) type Files<'f> = &'f mut dyn FnMut(&HostRoot, &Inventory) -> Result<Vec<File>, FilesError>;

/// A mediated device of a claim: its UUID, parent and type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mdev {
    pub uuid: String,
    pub parent: String,
    pub mdev_type: String,
}

/// Prepare a claim: under the one lock (waiting at most `wait`), one plan owned by
/// `owner`: the bind of every listed function's IOMMU group (the members already on a VFIO
/// driver are named too and left alone; with all on one, no bind), the creation of each of
/// `mdevs` not present yet, then the files `files` returns from the host as the bind and
/// the creation left it (`files` gets that host's inventory, read once after the writes and
/// handed on to the CDI refresh). A refusal (a member in use by the host,
/// naming the holder), a lock held past `wait`, a failed write or check, or an error of
/// `files` fails it; what was written is rolled back.
pub(crate) fn prepare(
    ops: &dyn HostOps,
    wait: Duration,
    owner: &Owner,
    what: &str,
    members: &[PciAddress],
    mdevs: &[Mdev],
    files: Files<'_>,
) -> Result<Applied, ApplyError> {
    let host = ops.root().clone();
    let mut session = Session::lock(ops, wait)?;
    let holds = holds_of(&host, &owner.label, members, mdevs);
    if let Some((key, h)) = session
        .replay()
        .holders_against(Some(&owner.tag), &holds.alone, &holds.shared)
        .into_iter()
        .next()
    {
        return Err(ApplyError::Held {
            key,
            holder: h.label.clone(),
            how: if h.shared {
                " (the parent of its mediated devices)"
            } else {
                ""
            },
        });
    }
    let mut plan = Plan::default().owned_by(&owner.tag);
    // A retry of a prepared claim holds what it held: nothing to journal for that.
    if session.replay().held_by(&owner.tag) != (holds.alone.clone(), holds.shared.clone()) {
        plan.holds = Some(holds);
    }
    let mut moved = BTreeMap::new();
    let needs_bind = members
        .iter()
        .any(|a| !current_driver(&host, a).as_deref().is_some_and(is_vfio_driver));
    if needs_bind {
        let req = BindRequest {
            addresses: members.to_vec(),
            only: false,
            driver: None,
        };
        let bound = bind_part_in(&session, &req)?;
        moved = bound.moved;
        plan.push(bound.part);
    }
    let create: Vec<crate::change::Object> = mdevs
        .iter()
        .filter(|m| !host.path(&crate::mdev::plan::instance_path(&m.uuid)).exists())
        .map(|m| crate::change::Object::Create {
            uuid: m.uuid.clone(),
            parent: m.parent.clone(),
            mdev_type: m.mdev_type.clone(),
            attrs: Vec::new(),
        })
        .collect();
    if !create.is_empty() {
        plan.push(crate::mdev::plan::part("create", create));
    }
    let mut wrote = !plan.is_empty();
    // The host as the bind and the creation left it: read once, for the claim's files and
    // for the refresh of the host's CDI specs that follows in this session.
    let mut view: Option<Inventory> = None;
    let mut then = |h: &HostRoot| -> Result<Part, FilesError> {
        let after = crate::inventory::scan(h)?;
        let part = files_part(h, what, &files(h, &after)?);
        view = Some(after);
        wrote |= !part.is_empty();
        Ok(part)
    };
    let then: Then<'_> = &mut then;
    session.apply_then(&plan, then)?;
    if !moved.is_empty() {
        refresh_specs(&mut session, view.as_ref());
    }
    Ok(Applied { moved, wrote, view })
}

/// What a claim holds while it lives: each listed function's whole IOMMU group alone (read
/// from its `iommu_group/devices`; the function itself where it has none), and the parents
/// of its mediated devices shared.
fn holds_of(host: &HostRoot, label: &str, members: &[PciAddress], mdevs: &[Mdev]) -> crate::change::Holds {
    let mut alone: Vec<String> = Vec::new();
    for a in members {
        let dir = host
            .sys_bus_pci_devices()
            .join(a.to_string())
            .join("iommu_group/devices");
        let mut names = crate::host::dir_names(&dir).unwrap_or_default();
        if names.is_empty() {
            names.push(a.to_string());
        }
        alone.extend(names);
    }
    alone.sort();
    alone.dedup();
    let mut shared: Vec<String> = mdevs.iter().map(|m| m.parent.clone()).collect();
    shared.sort();
    shared.dedup();
    crate::change::Holds {
        label: label.to_string(),
        alone,
        shared,
    }
}

/// The host's CDI specs (`cdi generate --write`'s) refreshed in a claim's session once its
/// plan committed ([`crate::containers::cdi::refresh_in`]), from `view` when the host was
/// read after the writes; a failure is logged, the claim's change stands. Returns the host
/// as the refresh read it, when it had to (no `view`, a spec to refresh).
fn refresh_specs(session: &mut Session<'_>, view: Option<&Inventory>) -> Option<Inventory> {
    match crate::containers::cdi::refresh_in(session, view) {
        Ok(read) => read,
        Err(e) => {
            tracing::warn!("the CDI spec could not be refreshed: {}", ErrorChain(&e));
            None
        }
    }
}

/// [`refresh_specs`] as the follow-up of the plugin's recovery at start
/// ([`crate::change::recover_where`]).
pub(crate) struct Refresh;

impl Followup for Refresh {
    fn follow(&mut self, session: &mut Session<'_>, _changed: &str) {
        refresh_specs(session, None);
    }
}

/// Unprepare a claim: under the one lock (waiting at most `wait`), one plan owned by
/// `owner`: `mdevs` (the claim's mediated devices) removed where present, `restore` (the
/// functions the claim's prepare moved) given back to the drivers the journal recorded,
/// and `files` removed. A function no longer on a VFIO driver is left
/// as it is; a VFIO group still open by a process is refused, naming it.
pub(crate) fn unprepare(
    ops: &dyn HostOps,
    wait: Duration,
    owner: &str,
    what: &str,
    restore: &[PciAddress],
    mdevs: &[Mdev],
    files: &[String],
) -> Result<Applied, ApplyError> {
    let host = ops.root().clone();
    let mut session = Session::lock(ops, wait)?;
    let mut plan = Plan::default().owned_by(owner);
    let (alone, shared) = session.replay().held_by(owner);
    plan.releases = !alone.is_empty() || !shared.is_empty();
    let mut moved = BTreeMap::new();
    let remove: Vec<crate::change::Object> = mdevs
        .iter()
        .filter(|m| host.path(&crate::mdev::plan::instance_path(&m.uuid)).exists())
        .map(|m| crate::change::Object::Remove {
            uuid: m.uuid.clone(),
            parent: m.parent.clone(),
            mdev_type: m.mdev_type.clone(),
        })
        .collect();
    if !remove.is_empty() {
        plan.push(crate::mdev::plan::part("remove", remove));
    }
    let to_restore: Vec<PciAddress> = restore
        .iter()
        .copied()
        .filter(|a| current_driver(&host, a).as_deref().is_some_and(is_vfio_driver))
        .collect();
    if !to_restore.is_empty() {
        let req = UnbindRequest {
            addresses: to_restore,
            group: None,
            all: false,
            only: true,
        };
        let unbound = unbind_part_in(&session, &req)?;
        moved = unbound.moved;
        plan.push(unbound.part);
    }
    let gone: Vec<File> = files
        .iter()
        .map(|p| File {
            path: p.clone(),
            contents: None,
        })
        .collect();
    plan.push(files_part(&host, what, &gone));
    let wrote = !plan.is_empty();
    session.apply(&plan)?;
    let mut view = None;
    if !moved.is_empty() {
        view = refresh_specs(&mut session, None);
    }
    Ok(Applied { moved, wrote, view })
}
