//! Applying plans: the lock, the journal, each write announced then made through
//! [`HostOps`], the checks between the writes, state-based rollback; and `recover`.
//!
//! Every command that changes the host takes the lock ([`Session::lock`]) *before* it reads
//! the host, so its plan is made from a view no other gpupass can change underneath it. Each
//! write is announced in the journal (and the journal synced) before it is made. Checks are
//! not optional: `drivers_probe` returns success even when no driver took the device, and an
//! mdev parent may accept a UUID without making the instance.
//!
//! Rollback and recovery are state-based, not step-based: the journal holds each object's
//! state before and after ([`Object`]); restoring one reads what the host shows now and makes
//! only the writes still needed, so it is correct whether the process died before, during or
//! after any given write, and running it twice is harmless.

use super::journal::{self, Journal, Lock, OpenChange, Record, Replay};
use super::{Action, ChangeError, DriverState, Expect, Object, Plan, Step};
use crate::host::ops::HostOps;
use crate::host::{link_name, logical, read_attr, HostRoot};
use crate::model::{driver_allows_vfio, is_vfio_driver, ErrorChain, PciAddress};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a check waits for the kernel (probe is synchronous through `drivers_probe`, an
/// mdev appears in `create`'s write; this is a grace period, not a polling design).
const VERIFY_WAIT: Duration = Duration::from_millis(500);

/// What an applied plan's checks said.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Lines the checks produced (`0000:01:00.0: reprobed, claimed by e1000e`).
    pub lines: Vec<String>,
    /// Groups whose viability the plan verified (they had no blockers then).
    pub verified_viable: Vec<u32>,
}

/// The function's driver now (`driver` link), `None` when driverless.
pub(crate) fn current_driver(host: &HostRoot, a: &PciAddress) -> Option<String> {
    link_name(&host.pci_device(a).join("driver")).ok().flatten()
}

fn current_override(host: &HostRoot, a: &PciAddress) -> Option<String> {
    read_attr(&host.pci_device(a).join("driver_override"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && s != "(null)")
}

/// Poll the `driver` link until `ok` holds or the grace period ends; returns what it shows.
fn wait_driver(host: &HostRoot, a: &PciAddress, ok: impl Fn(Option<&str>) -> bool) -> (bool, Option<String>) {
    let start = Instant::now();
    loop {
        let d = current_driver(host, a);
        if ok(d.as_deref()) {
            return (true, d);
        }
        if start.elapsed() >= VERIFY_WAIT {
            return (false, d);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn is_bridge_dir(dir: &Path) -> bool {
    if dir.join("pci_bus").is_dir() {
        return true;
    }
    read_attr(&dir.join("class"))
        .ok()
        .and_then(|c| crate::host::parse_hex(&c))
        .is_some_and(|c| matches!(c >> 8, 0x0604 | 0x0609))
}

/// Members of a group that keep it from being viable, as `address (driver)`.
pub(crate) fn group_blockers(host: &HostRoot, group: u32) -> Vec<String> {
    let dir = host.iommu_groups().join(group.to_string()).join("devices");
    let mut out = Vec::new();
    for m in crate::host::dir_names(&dir).unwrap_or_default() {
        let Ok(a) = m.parse::<PciAddress>() else { continue };
        let d = host.pci_device(&a);
        if is_bridge_dir(&d) {
            continue;
        }
        let drv = current_driver(host, &a);
        if !driver_allows_vfio(drv.as_deref()) {
            out.push(format!("{a} ({})", drv.unwrap_or_default()));
        }
    }
    out
}

fn present(host: &HostRoot, path: &str) -> bool {
    host.path(path).exists()
}

fn wait_present(host: &HostRoot, path: &str, want: bool) -> bool {
    let start = Instant::now();
    loop {
        if present(host, path) == want {
            return true;
        }
        if start.elapsed() >= VERIFY_WAIT {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn reads(host: &HostRoot, path: &str) -> String {
    read_attr(&host.path(path)).unwrap_or_default().trim().to_string()
}

fn reads_as(now: &str, want: &str) -> bool {
    now == want || (want == "0" && now.is_empty())
}

/// Why a step of a plan, or a restore of one object, failed: [`Failure`]'s cause.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    /// A check found the host not showing what the plan expects.
    #[error("{0}")]
    Check(String),
    /// An attribute did not read what the plan wrote.
    #[error("{path} reads {now:?}, not {value:?}")]
    Reads {
        path: String,
        value: String,
        now: String,
    },
    #[error("write {value:?} > {}", .path.display())]
    Write {
        path: std::path::PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("write file {path}")]
    WriteFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("remove file {path}")]
    RemoveFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The journal record announcing a write could not be written.
    #[error(transparent)]
    Journal(Box<ChangeError>),
    #[error("modprobe {module}")]
    Modprobe {
        module: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot load module {module} for driver {driver}")]
    LoadModule {
        module: String,
        driver: String,
        #[source]
        source: std::io::Error,
    },
    /// The part [`Session::apply_then`] plans after the plan's writes could not be planned
    /// (the domain's own error: a claim's backend the host cannot serve).
    #[error(transparent)]
    Then(Box<dyn std::error::Error + Send + Sync>),
    /// Restoring several objects: each one that failed, joined with "; ".
    #[error("{}", .0.iter().map(|e| ErrorChain(e).to_string()).collect::<Vec<_>>().join("; "))]
    Several(Vec<Cause>),
}

/// A step that failed, and what the rollback did.
#[derive(Debug)]
pub struct Failure {
    /// The plan's domain (`bind`, `mdev`...).
    pub domain: String,
    /// `step K (the step as --dry-run prints it)`.
    pub what: String,
    /// The step's index in [`Plan::steps`] (for [`Session::apply_then`], counting on into
    /// the part that followed).
    pub index: usize,
    /// `None` when what failed was planning the part [`Session::apply_then`] adds, not a
    /// step.
    pub step: Option<Step>,
    pub cause: Cause,
    /// The rollback's lines, or why it failed (the plan then stays open for `recover`).
    pub rollback: Result<Vec<String>, String>,
}

impl Failure {
    pub(crate) fn rollback_ok(&self) -> bool {
        self.rollback.is_ok()
    }

    /// `rolled back, nothing changed: ...`, or that the rollback failed too.
    pub(crate) fn rollback_text(&self) -> String {
        match &self.rollback {
            Ok(lines) if lines.is_empty() => "nothing changed".to_string(),
            Ok(lines) => format!("rolled back, nothing changed: {}", lines.join(", ")),
            Err(e) => {
                format!("rollback failed too ({e}); the journal keeps the plan open: run `gpupass recover`")
            }
        }
    }
}

/// Run one check step; `Err` when the host does not show what the plan expects.
fn check(host: &HostRoot, step: &Step, out: &mut Outcome) -> Result<(), Cause> {
    match step {
        Step::CheckDriver {
            address,
            expect: Expect::Driver { driver },
            ..
        } => {
            let (ok, got) = wait_driver(host, address, |d| d == Some(driver.as_str()));
            if ok {
                Ok(())
            } else {
                Err(Cause::Check(format!(
                    "{address} is {} after drivers_probe, not {driver} (the probe reports success even \
                     when the driver refuses the device; the kernel log says why)",
                    got.map(|g| format!("bound to {g}"))
                        .unwrap_or_else(|| "driverless".into())
                )))
            }
        }
        Step::CheckDriver {
            address,
            expect: Expect::NotVfio,
            ..
        } => {
            let (_, got) = wait_driver(host, address, |d| d.is_some());
            match got {
                Some(d) if is_vfio_driver(&d) => Err(Cause::Check(format!(
                    "{address} went back to {d} on reprobe (vfio-pci.ids= on the kernel command line, or a \
                     modprobe.d option, hands it to VFIO)"
                ))),
                Some(d) => {
                    out.lines.push(format!("{address}: reprobed, claimed by {d}"));
                    Ok(())
                }
                None => {
                    out.lines
                        .push(format!("{address}: reprobed, no driver claimed it"));
                    Ok(())
                }
            }
        }
        Step::CheckNode { path, group } => {
            if wait_present(host, path, true) {
                Ok(())
            } else {
                Err(Cause::Check(format!(
                    "{path} did not appear for IOMMU group {group} (is the VFIO group driver loaded?)"
                )))
            }
        }
        Step::CheckViable { group } => {
            let b = group_blockers(host, *group);
            if b.is_empty() {
                out.verified_viable.push(*group);
                Ok(())
            } else {
                Err(Cause::Check(format!(
                    "IOMMU group {group} is still not viable: {} on a host driver",
                    b.join(", ")
                )))
            }
        }
        Step::CheckPresent { path, present } => {
            if wait_present(host, path, *present) {
                Ok(())
            } else if *present {
                Err(Cause::Check(format!("{path} did not appear")))
            } else {
                Err(Cause::Check(format!("{path} is still there")))
            }
        }
        Step::CheckReads { path, value } => {
            let now = reads(host, path);
            if reads_as(&now, value) {
                Ok(())
            } else {
                Err(Cause::Reads {
                    path: path.clone(),
                    value: value.clone(),
                    now,
                })
            }
        }
        Step::LoadModule { .. } | Step::Write { .. } | Step::WriteFile { .. } | Step::RemoveFile { .. } => {
            Ok(())
        }
    }
}

/// The writes of a journaled change: through the host, each announced first.
struct Writer<'a> {
    ops: &'a dyn HostOps,
    journal: Option<&'a mut Journal>,
    txn: String,
    n: usize,
    undo: bool,
}

impl Writer<'_> {
    fn announce(&mut self, path: &str, value: String) -> Result<(), Cause> {
        let Some(j) = self.journal.as_deref_mut() else {
            return Ok(());
        };
        let rec = if self.undo {
            Record::Undo {
                txn: self.txn.clone(),
                path: path.to_string(),
                value,
            }
        } else {
            self.n += 1;
            Record::Step {
                txn: self.txn.clone(),
                n: self.n,
                path: path.to_string(),
                value,
            }
        };
        j.append(rec).map_err(|e| Cause::Journal(Box::new(e)))
    }

    fn write(&mut self, path: &str, value: &str) -> Result<(), Cause> {
        self.announce(path, value.to_string())?;
        let p = self.ops.root().path(path);
        self.ops.write(&p, value).map_err(|source| Cause::Write {
            path: path.into(),
            value: value.to_string(),
            source,
        })
    }

    fn write_file(&mut self, path: &str, contents: &str) -> Result<(), Cause> {
        self.announce(path, format!("({} bytes)", contents.len()))?;
        let p = self.ops.root().path(path);
        self.ops
            .write_file(&p, contents)
            .map_err(|source| Cause::WriteFile {
                path: path.into(),
                source,
            })
    }

    fn remove_file(&mut self, path: &str, prune: super::Prune) -> Result<(), Cause> {
        self.announce(path, "(remove)".into())?;
        let p = self.ops.root().path(path);
        self.ops
            .remove_file(&p, prune)
            .map_err(|source| Cause::RemoveFile {
                path: path.into(),
                source,
            })
    }

    /// Run one step of a plan (a check, a module load or a write).
    fn step(&mut self, step: &Step, out: &mut Outcome) -> Result<(), Cause> {
        match step {
            Step::LoadModule { module } => self.ops.load_module(module).map_err(|source| Cause::Modprobe {
                module: module.clone(),
                source,
            }),
            Step::Write { path, value, .. } => self.write(path, value),
            Step::WriteFile { path, contents } => self.write_file(path, contents),
            Step::RemoveFile { path, prune } => self.remove_file(path, *prune),
            _ => check(self.ops.root(), step, out),
        }
    }
}

/// Bring one function to `target` (driver and override), making only the writes still needed.
fn restore_function(w: &mut Writer<'_>, a: &PciAddress, target: &DriverState) -> Result<String, Cause> {
    let host = w.ops.root().clone();
    let cur = current_driver(&host, a);
    let cur_ov = current_override(&host, a);
    let want_ov = target.driver_override.clone();
    let name = |d: &Option<String>| d.clone().unwrap_or_else(|| "no driver".into());
    if cur == target.driver && cur_ov == want_ov {
        return Ok(format!("{a}: already on {}", name(&cur)));
    }
    if cur_ov != want_ov {
        let v = want_ov.clone().unwrap_or_else(|| "\n".into());
        w.write(&logical::override_path(a), &v)?;
    }
    if cur != target.driver {
        if let Some(c) = &cur {
            w.write(&logical::unbind_path(c), &a.to_string())?;
        }
        if let Some(t) = &target.driver {
            if !host.pci_driver(t).is_dir() {
                let m = target.module.clone().unwrap_or_else(|| t.replace('-', "_"));
                w.ops.load_module(&m).map_err(|source| Cause::LoadModule {
                    module: m.clone(),
                    driver: t.clone(),
                    source,
                })?;
            }
            w.write(logical::DRIVERS_PROBE, &a.to_string())?;
            let (ok, got) = wait_driver(&host, a, |d| d == Some(t.as_str()));
            if !ok {
                return Err(Cause::Check(format!(
                    "{a} is {} after reprobe, not {t}",
                    got.map(|g| format!("on {g}"))
                        .unwrap_or_else(|| "driverless".into())
                )));
            }
        }
    }
    Ok(format!("{a}: {} -> {}", name(&cur), name(&target.driver)))
}

/// Bring one object to its state before (`to_after` false) or after, making only the writes
/// still needed. Returns a line saying what happened.
fn restore_one(w: &mut Writer<'_>, o: &Object, to_after: bool) -> Result<String, Cause> {
    let host = w.ops.root().clone();
    match o {
        Object::Function {
            address,
            before,
            after,
            ..
        } => restore_function(w, address, if to_after { after } else { before }),
        Object::Create {
            uuid,
            parent,
            mdev_type,
            ..
        }
        | Object::Remove {
            uuid,
            parent,
            mdev_type,
        } => {
            let attrs: &[(String, String)] = match o {
                Object::Create { attrs, .. } => attrs,
                _ => &[],
            };
            let want = matches!(o, Object::Create { .. }) == to_after;
            let dev = super::mdev_instance_path(uuid);
            if present(&host, &dev) == want {
                return Ok(format!(
                    "{uuid}: already {}",
                    if want { "present" } else { "absent" }
                ));
            }
            if want {
                w.write(&super::mdev_create_path(parent, mdev_type), uuid)?;
                if !wait_present(&host, &dev, true) {
                    return Err(Cause::Check(format!("{dev} did not appear")));
                }
                for (k, v) in attrs {
                    w.write(&format!("{dev}/{k}"), v)?;
                }
                Ok(format!("{uuid}: created again ({mdev_type} on {parent})"))
            } else {
                w.write(&format!("{dev}/remove"), "1")?;
                if !wait_present(&host, &dev, false) {
                    return Err(Cause::Check(format!("{dev} is still there")));
                }
                Ok(format!("{uuid}: removed"))
            }
        }
        Object::VgpuSet { vf, mdev_type } | Object::VgpuClear { vf, was: mdev_type } => {
            let set = matches!(o, Object::VgpuSet { .. });
            let want = if set == to_after { mdev_type.as_str() } else { "0" };
            let p = super::vgpu_type_path(vf);
            let now = reads(&host, &p);
            if reads_as(&now, want) {
                return Ok(format!("VF {vf}: already type {want}"));
            }
            if want != "0" && !reads_as(&now, "0") {
                // The kernel takes a type only on a cleared VF.
                w.write(&p, "0")?;
            }
            w.write(&p, want)?;
            Ok(format!("VF {vf}: type {now} -> {want}"))
        }
        Object::File {
            path,
            before,
            after,
            prune,
        } => {
            let want = if to_after { after } else { before };
            if &super::read_file_now(&host, path) == want {
                return Ok(format!(
                    "{path}: already {}",
                    if want.is_some() { "as wanted" } else { "absent" }
                ));
            }
            match want {
                Some(c) => {
                    w.write_file(path, c)?;
                    Ok(format!("{path}: written ({} bytes)", c.len()))
                }
                None => {
                    w.remove_file(path, *prune)?;
                    Ok(format!("{path}: removed"))
                }
            }
        }
    }
}

/// Restore every object to before (in reverse order), or complete them in order.
fn restore_all(w: &mut Writer<'_>, objects: &[Object], to_after: bool) -> Result<Vec<String>, Cause> {
    let order: Vec<&Object> = if to_after {
        objects.iter().collect()
    } else {
        objects.iter().rev().collect()
    };
    let mut lines = Vec::new();
    let mut errors = Vec::new();
    for o in order {
        match restore_one(w, o, to_after) {
            Ok(l) => lines.push(l),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(lines)
    } else {
        Err(Cause::Several(errors))
    }
}

/// The lock held, and the journal as read under it: one session of changes. Plans made
/// after [`Session::lock`] are made from a view no other gpupass can change; several plans
/// may be applied in one session, each its own transaction.
pub struct Session<'a> {
    ops: &'a dyn HostOps,
    lock: Lock,
    replay: Replay,
}

impl<'a> Session<'a> {
    /// Take the lock, waiting up to `wait` for another gpupass to finish, and read the
    /// journal. The commands wait [`journal::lock_timeout`] (`GPUPASS_LOCK_TIMEOUT`, 30 s by
    /// default); the DRA plugin waits a few seconds at most, never past the kubelet's
    /// deadline.
    pub(crate) fn lock(ops: &'a dyn HostOps, wait: Duration) -> Result<Session<'a>, ChangeError> {
        let host = ops.root();
        let lock = journal::lock(host, wait)?;
        tracing::debug!(faults = crate::minor_faults(), "lock held");
        let replay = journal::read(host)?;
        tracing::debug!(
            open = replay.open.len(),
            faults = crate::minor_faults(),
            "journal read"
        );
        Ok(Session { ops, lock, replay })
    }

    /// The journal as read under the lock.
    pub(crate) fn replay(&self) -> &Replay {
        &self.replay
    }

    pub(crate) fn ops(&self) -> &'a dyn HostOps {
        self.ops
    }

    /// The first unfinished plan that touches an object of `plan`, and the key they share.
    pub(crate) fn conflict(&self, plan: &Plan) -> Option<(&OpenChange, String)> {
        let mine: Vec<String> = plan.objects().iter().flat_map(Object::keys).collect();
        self.replay
            .open
            .iter()
            .find_map(|t| t.keys().into_iter().find(|k| mine.contains(k)).map(|k| (t, k)))
    }

    /// Apply `plan` as one transaction: refuse when an unfinished plan touches one of its
    /// objects; journal the plan (`change`), then each write announced (`step`) before it is
    /// made, the checks between them, and `commit`. On a failure every object goes back to
    /// its state before (journaled as `undo`s, then `rolled_back`); if even that fails the
    /// transaction stays open for `gpupass recover`. An empty plan changes and journals
    /// nothing, unless it takes or gives back holds ([`Plan::moves_holds`]): then its
    /// `change` and `commit` are all it writes.
    pub fn apply(&mut self, plan: &Plan) -> Result<Outcome, ChangeError> {
        if let Some((t, key)) = self.conflict(plan) {
            return Err(ChangeError::Unfinished {
                open: Box::new(t.clone()),
                key: key.replacen(':', " ", 1),
            });
        }
        if plan.is_empty() && !plan.moves_holds() {
            return Ok(Outcome::default());
        }
        self.run_journaled(plan, None)
    }

    /// Apply `plan`, then, in the same transaction, the part `then` plans from the host as
    /// `plan`'s writes left it: for a change whose later part depends on what the earlier one
    /// did (the DRA plugin's prepare of a claim: the group bind, then the claim's CDI spec,
    /// whose VFIO device nodes exist only once the functions are on vfio-pci). The part's
    /// objects are journaled (an `extend` record of the same transaction) before its first
    /// write, so a failure anywhere, `then`'s own included, rolls back both, and `gpupass
    /// recover` undoes or finishes both. `plan` may be empty (nothing to bind); an empty
    /// part from `then` ends the transaction as `plan` alone would.
    #[cfg(any(test, feature = "dra"))]
    pub(crate) fn apply_then(&mut self, plan: &Plan, then: Then<'_>) -> Result<Outcome, ChangeError> {
        if let Some((t, key)) = self.conflict(plan) {
            return Err(ChangeError::Unfinished {
                open: Box::new(t.clone()),
                key: key.replacen(':', " ", 1),
            });
        }
        if plan.is_empty() {
            // Nothing written before the part: it is the plan (a part already as wanted
            // journals nothing, as an empty plan does).
            return match then(self.ops.root()) {
                Ok(part) => {
                    let mut whole = plan.clone();
                    whole.push(part);
                    self.apply(&whole)
                }
                Err(e) => Err(ChangeError::Failed(Box::new(Failure {
                    domain: "change".into(),
                    what: "planning the part after step 0".into(),
                    index: 0,
                    step: None,
                    cause: Cause::Then(e),
                    rollback: Ok(Vec::new()),
                }))),
            };
        }
        self.run_journaled(plan, Some(then))
    }

    fn run_journaled(&mut self, plan: &Plan, then: Option<Then<'_>>) -> Result<Outcome, ChangeError> {
        let host = self.ops.root().clone();
        let mut j = Journal::open(&host, &self.lock, &self.replay)?;
        let r = run(self.ops, plan, then, &self.replay.open, &mut j);
        // The next plan of this session replays what this one wrote: the lines it appended,
        // replayed on top of what was read under the lock (the journal is not read again).
        j.settle(&host, &mut self.replay)?;
        r
    }
}

/// What follows a committed change in the same session, with the lock still held: a change
/// of its own (its own transaction), planned from the host as the first change left it, so no
/// other gpupass runs in between and no second lock is taken. `gpupass bind`, `unbind`,
/// `recover` and the mdev changes pass the refresh of the CDI specs
/// (`containers::cdi::Refresh`), which the domains below `containers` do not name; `()`
/// follows with nothing. The first change has succeeded when it runs: a follow-up reports
/// its own failure (a warning naming `changed`, what the first change changed) and returns
/// nothing.
pub trait Followup {
    fn follow(&mut self, session: &mut Session<'_>, changed: &str);
}

impl Followup for () {
    fn follow(&mut self, _: &mut Session<'_>, _: &str) {}
}

/// What [`Session::apply_then`] calls after the plan's writes: the part that follows, planned
/// from the host as it is then (its error rolls the plan back).
pub(crate) type Then<'f> =
    &'f mut dyn FnMut(&HostRoot) -> Result<super::Part, Box<dyn std::error::Error + Send + Sync>>;

/// The body of [`Session::apply`] and [`Session::apply_then`].
fn run(
    ops: &dyn HostOps,
    plan: &Plan,
    mut then: Option<Then<'_>>,
    open: &[OpenChange],
    j: &mut Journal,
) -> Result<Outcome, ChangeError> {
    let (txn, time) = journal::new_txn();
    let mut objects = plan.objects();
    let mut domain = plan.domain();
    j.append(Record::Change {
        txn: txn.clone(),
        time,
        pid: std::process::id(),
        domain: plan.domain(),
        what: plan.describe(),
        owner: plan.owner.clone(),
        changes: serde_json::to_value(&objects).map_err(|e| ChangeError::Journal {
            path: j.path().to_path_buf(),
            source: std::io::Error::other(e),
        })?,
        writes: plan.write_count(),
        holds: plan.holds.clone(),
        releases: plan.releases,
    })?;
    let mut out = Outcome::default();
    let mut failure: Option<(usize, Option<Step>, Cause)> = None;
    let mut index = 0;
    {
        let mut w = Writer {
            ops,
            journal: Some(&mut *j),
            txn: txn.clone(),
            n: 0,
            undo: false,
        };
        for step in plan.steps() {
            if let Err(c) = w.step(step, &mut out) {
                failure = Some((index, Some(step.clone()), c));
                break;
            }
            index += 1;
        }
        let then = then.as_mut().filter(|_| failure.is_none());
        if let Some(then) = then {
            match then(ops.root()) {
                Err(e) => failure = Some((index, None, Cause::Then(e))),
                Ok(part) if part.is_empty() => {}
                Ok(part) => {
                    let mine: Vec<String> = part.objects.iter().flat_map(Object::keys).collect();
                    if let Some((t, key)) = open
                        .iter()
                        .find_map(|t| t.keys().into_iter().find(|k| mine.contains(k)).map(|k| (t, k)))
                    {
                        failure = Some((
                            index,
                            None,
                            Cause::Journal(Box::new(ChangeError::Unfinished {
                                open: Box::new(t.clone()),
                                key: key.replacen(':', " ", 1),
                            })),
                        ));
                    } else {
                        let extend = Record::Extend {
                            txn: txn.clone(),
                            domain: part.domain.clone(),
                            what: part.what.clone(),
                            changes: serde_json::to_value(&part.objects).unwrap_or_default(),
                            writes: part.steps.iter().filter(|s| s.is_write()).count(),
                        };
                        // Journaled before its first write: rollback and recover know it.
                        objects.extend(part.objects.iter().cloned());
                        if !domain.split('+').any(|d| d == part.domain) {
                            domain = format!("{domain}+{}", part.domain);
                        }
                        match w.journal.as_deref_mut().map(|j| j.append(extend)) {
                            Some(Err(e)) => {
                                failure =
                                    Some((index, part.steps.first().cloned(), Cause::Journal(Box::new(e))))
                            }
                            _ => {
                                for step in &part.steps {
                                    if let Err(c) = w.step(step, &mut out) {
                                        failure = Some((index, Some(step.clone()), c));
                                        break;
                                    }
                                    index += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    let Some((index, step, cause)) = failure else {
        j.append(Record::Commit { txn })?;
        return Ok(out);
    };
    let mut w = Writer {
        ops,
        journal: Some(&mut *j),
        txn: txn.clone(),
        n: 0,
        undo: true,
    };
    let rollback = restore_all(&mut w, &objects, false).map_err(|e| ErrorChain(&e).to_string());
    let what = match &step {
        Some(step) => format!("step {} ({})", index + 1, step.render()),
        None => format!("planning the part after step {index}"),
    };
    let f = Failure {
        domain,
        what,
        index,
        step,
        cause,
        rollback,
    };
    if f.rollback_ok() {
        j.append(Record::RolledBack {
            txn,
            error: format!("{}: {}", f.what, ErrorChain(&f.cause)),
        })?;
    }
    Err(ChangeError::Failed(Box::new(f)))
}

/// Apply `plan` in a session of its own: lock (waiting as the commands do,
/// [`journal::lock_timeout`]), journal, apply (see [`Session::apply`]).
pub fn apply(ops: &dyn HostOps, plan: &Plan) -> Result<Outcome, ChangeError> {
    Session::lock(ops, journal::lock_timeout())?.apply(plan)
}

/// What `recover` did.
#[derive(Debug, Default)]
pub struct Recovered {
    pub lines: Vec<String>,
    /// The functions whose driver it moved (none on a dry run).
    pub functions: Vec<PciAddress>,
    /// Whether it changed anything (the CDI specs follow; false on a dry run).
    pub changed: bool,
}

/// `gpupass recover`: restore (or with `cont`, complete) every unfinished plan, newest first,
/// whatever its domain.
pub fn recover(ops: &dyn HostOps, cont: bool, dry_run: bool) -> Result<Recovered, ChangeError> {
    recover_where(ops, cont, dry_run, journal::lock_timeout(), &|_| true, &mut ())
}

/// [`recover`], then, when it changed anything, `follow` in the same session (`gpupass
/// recover`: the CDI specs refreshed before the lock is released).
pub(crate) fn recover_then(
    ops: &dyn HostOps,
    cont: bool,
    dry_run: bool,
    follow: &mut dyn Followup,
) -> Result<Recovered, ChangeError> {
    recover_where(ops, cont, dry_run, journal::lock_timeout(), &|_| true, follow)
}

/// [`recover`] of the unfinished plans `mine` selects (the DRA plugin at start: the plans its
/// claims own), waiting at most `wait` for the lock; the others stay open, for `gpupass
/// recover`. Plans are open only when their process is gone (a live one holds the lock).
pub(crate) fn recover_where(
    ops: &dyn HostOps,
    cont: bool,
    dry_run: bool,
    wait: std::time::Duration,
    mine: &dyn Fn(&journal::OpenChange) -> bool,
    follow: &mut dyn Followup,
) -> Result<Recovered, ChangeError> {
    let host = ops.root().clone();
    let mut s = Session::lock(ops, wait)?;
    let open: Vec<&journal::OpenChange> = s.replay.open.iter().filter(|t| mine(t)).collect();
    let mut out = Recovered::default();
    if open.is_empty() {
        out.lines
            .push("nothing to recover: the journal has no unfinished plan".to_string());
        return Ok(out);
    }
    let mut j = if dry_run {
        None
    } else {
        Some(Journal::open(&host, &s.lock, &s.replay)?)
    };
    for t in open.iter().rev() {
        let objects = t.objects().ok_or_else(|| ChangeError::RecoverFailed {
            txn: t.txn.clone(),
            detail: "the journal holds an object this gpupass does not know (a newer version wrote it)"
                .into(),
        })?;
        out.lines.push(format!(
            "{} the unfinished {}",
            if cont { "completing" } else { "restoring" },
            t.describe()
        ));
        if dry_run {
            let order: Vec<&Object> = if cont {
                objects.iter().collect()
            } else {
                objects.iter().rev().collect()
            };
            for o in order {
                out.lines.push(match o {
                    Object::Function {
                        address,
                        before,
                        after,
                        ..
                    } => {
                        let target = if cont { after } else { before };
                        format!(
                            "  {address}: now {}, would go to {} (driver_override {})",
                            current_driver(&host, address).unwrap_or_else(|| "no driver".into()),
                            target.driver.as_deref().unwrap_or("no driver"),
                            target.driver_override.as_deref().unwrap_or("cleared")
                        )
                    }
                    o => format!("  would {} {}", if cont { "complete" } else { "undo" }, o.label()),
                });
            }
            continue;
        }
        let mut w = Writer {
            ops,
            journal: j.as_mut(),
            txn: t.txn.clone(),
            n: 0,
            undo: true,
        };
        match restore_all(&mut w, &objects, cont) {
            Ok(ls) => {
                out.lines.extend(ls.into_iter().map(|l| format!("  {l}")));
                out.changed = true;
                out.functions.extend(objects.iter().filter_map(|o| match o {
                    Object::Function { address, .. } => Some(*address),
                    _ => None,
                }));
                if let Some(j) = j.as_mut() {
                    j.append(Record::Recovered {
                        txn: t.txn.clone(),
                        to: if cont { "after" } else { "before" }.into(),
                    })?;
                }
            }
            Err(e) => {
                return Err(ChangeError::RecoverFailed {
                    txn: t.txn.clone(),
                    detail: ErrorChain(&e).to_string(),
                })
            }
        }
    }
    if cont && !dry_run {
        for t in &open {
            let mut groups: Vec<u32> = t
                .objects()
                .unwrap_or_default()
                .iter()
                .filter_map(|o| match o {
                    Object::Function {
                        action: Action::Bind,
                        group,
                        ..
                    } => *group,
                    _ => None,
                })
                .collect();
            groups.dedup();
            for g in groups {
                let b = group_blockers(&host, g);
                if !b.is_empty() {
                    out.lines
                        .push(format!("note: IOMMU group {g} is not viable: {}", b.join(", ")));
                }
            }
        }
    }
    drop(j);
    if out.changed {
        // What follows plans from the journal as the recovery left it.
        s.replay = journal::read(&host)?;
        let changed: Vec<String> = out.functions.iter().map(|a| a.to_string()).collect();
        follow.follow(&mut s, &changed.join(" "));
    }
    Ok(out)
}
