//! mdev changes as plans: typed steps made from the checks of [`super::ops`], applied under
//! the one lock with every write announced in the one journal (`bind::journal`, a
//! [`Record::Change`] of domain `mdev`), rolled back on failure and finished or undone by
//! `gpupass recover` after a crash.
//!
//! The plan ([`MdevPlan`]) has two halves, as a bind plan has: the ordered [`Step`]s (what
//! `--dry-run` prints and apply runs, in the kernel's paths before the root, `/sys/...`) and
//! the [`Change`]s, each object's state before and after (an instance absent then present, a
//! VF's vGPU type `0` then `1044`). Rollback and recovery are state-based on the changes:
//! they read what the kernel shows now and make only the writes still needed, so they are
//! right whichever write a crash interrupted, and running them twice is harmless.

use super::MdevError;
use crate::bind::journal::{self, Journal, Record};
use crate::bind::BindError;
use crate::host::ops::HostOps;
use crate::host::{read_attr, HostRoot};
use crate::model::PciAddress;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// The journal's domain name of these plans.
pub const DOMAIN: &str = "mdev";

/// One object an mdev plan changes, with its state before and after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    /// Before: no instance `uuid`. After: an instance of `mdev_type` on `parent` with `attrs`.
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
}

impl Change {
    /// The instance this change is about (a UUID or a VF address): two plans touching the
    /// same instance must not interleave with an unfinished one.
    pub fn instance(&self) -> String {
        match self {
            Change::Create { uuid, .. } | Change::Remove { uuid, .. } => uuid.clone(),
            Change::VgpuSet { vf, .. } | Change::VgpuClear { vf, .. } => vf.to_string(),
        }
    }
}

/// What a write is, for the error it gives when it fails.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Role {
    /// The UUID to the type's `create` on `parent`.
    Create { parent: String },
    /// An `--attr` of the instance.
    Attr { uuid: String, name: String },
    /// `1` to the instance's `remove`.
    Remove,
    /// A vGPU type id (or `0`) to a VF's `nvidia/current_vgpu_type`.
    VgpuType,
}

/// One ordered step of an mdev plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Step {
    /// Write `value` to the sysfs attribute `path` (as on the host, `/sys/...`).
    Write {
        path: String,
        value: String,
        #[serde(flatten)]
        role: Role,
    },
    /// `path` exists (`present`) or is gone (the instance appeared, or was removed).
    CheckPresent { path: String, present: bool },
    /// The attribute `path` reads `value` (`0` also matches an empty read).
    CheckReads { path: String, value: String },
}

impl Step {
    /// One line as `--dry-run` prints it.
    pub fn render(&self) -> String {
        match self {
            Step::Write { path, value, .. } => format!("write {value:?} > {path}"),
            Step::CheckPresent { path, present: true } => format!("check {path} exists"),
            Step::CheckPresent { path, present: false } => format!("check {path} is gone"),
            Step::CheckReads { path, value } => format!("check {path} reads {value:?}"),
        }
    }
}

/// An mdev change: what it is, the objects it changes and the steps that change them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdevPlan {
    /// The command that made it (`mdev create`, `mdev stop`).
    pub action: String,
    pub changes: Vec<Change>,
    pub steps: Vec<Step>,
}

impl MdevPlan {
    /// The plan's sysfs writes: the unit of the failpoints and of the journal's `step`s.
    pub fn write_count(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::Write { .. }))
            .count()
    }

    /// The plan as `--dry-run` prints it.
    pub fn render(&self) -> String {
        let mut s = format!(
            "plan: {} ({} writes)\nsteps:\n",
            self.describe(),
            self.write_count()
        );
        for (i, st) in self.steps.iter().enumerate() {
            s.push_str(&format!("  {:>2}. {}\n", i + 1, st.render()));
        }
        s
    }

    /// One line for the journal and the warnings: `mdev create of 2f3e... on mbochs`.
    pub fn describe(&self) -> String {
        let what: Vec<String> = self
            .changes
            .iter()
            .map(|c| match c {
                Change::Create {
                    uuid,
                    parent,
                    mdev_type,
                    ..
                } => format!("{uuid} ({mdev_type} on {parent})"),
                Change::Remove { uuid, parent, .. } => format!("{uuid} (on {parent})"),
                Change::VgpuSet { vf, mdev_type } => format!("VF {vf} (type {mdev_type})"),
                Change::VgpuClear { vf, was } => format!("VF {vf} (type {was})"),
            })
            .collect();
        format!("{} of {}", self.action, what.join(", "))
    }
}

/// The logical path of an mdev type's `create` on `parent`.
pub fn create_path(parent: &str, ty: &str) -> String {
    format!("/sys/class/mdev_bus/{parent}/mdev_supported_types/{ty}/create")
}

/// The logical path of an instance.
pub fn instance_path(uuid: &str) -> String {
    format!("/sys/bus/mdev/devices/{uuid}")
}

/// The logical path of a VF's vGPU type.
pub fn vgpu_type_path(vf: &PciAddress) -> String {
    format!("/sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type")
}

/// The steps that take `c` from before to after.
pub fn steps_for(c: &Change) -> Vec<Step> {
    match c {
        Change::Create {
            uuid,
            parent,
            mdev_type,
            attrs,
        } => {
            let dev = instance_path(uuid);
            let mut v = vec![
                Step::Write {
                    path: create_path(parent, mdev_type),
                    value: uuid.clone(),
                    role: Role::Create {
                        parent: parent.clone(),
                    },
                },
                Step::CheckPresent {
                    path: dev.clone(),
                    present: true,
                },
            ];
            for (k, val) in attrs {
                v.push(Step::Write {
                    path: format!("{dev}/{k}"),
                    value: val.clone(),
                    role: Role::Attr {
                        uuid: uuid.clone(),
                        name: k.clone(),
                    },
                });
            }
            v
        }
        Change::Remove { uuid, .. } => {
            let dev = instance_path(uuid);
            vec![
                Step::Write {
                    path: format!("{dev}/remove"),
                    value: "1".into(),
                    role: Role::Remove,
                },
                Step::CheckPresent {
                    path: dev,
                    present: false,
                },
            ]
        }
        Change::VgpuSet { vf, mdev_type } => vec![
            Step::Write {
                path: vgpu_type_path(vf),
                value: mdev_type.clone(),
                role: Role::VgpuType,
            },
            Step::CheckReads {
                path: vgpu_type_path(vf),
                value: mdev_type.clone(),
            },
        ],
        Change::VgpuClear { vf, .. } => vec![
            Step::Write {
                path: vgpu_type_path(vf),
                value: "0".into(),
                role: Role::VgpuType,
            },
            Step::CheckReads {
                path: vgpu_type_path(vf),
                value: "0".into(),
            },
        ],
    }
}

/// A plan of `changes`, in order.
pub fn plan(action: &str, changes: Vec<Change>) -> MdevPlan {
    let steps = changes.iter().flat_map(steps_for).collect();
    MdevPlan {
        action: action.to_string(),
        changes,
        steps,
    }
}

/// How long a check waits for the kernel to show an instance come or go.
const VERIFY_WAIT: Duration = Duration::from_millis(500);

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

fn journal_err(e: BindError) -> MdevError {
    MdevError::Journal(Box::new(e))
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
    fn write(&mut self, path: &str, value: &str) -> Result<(), std::io::Error> {
        if let Some(j) = self.journal.as_deref_mut() {
            let rec = if self.undo {
                Record::Undo {
                    txn: self.txn.clone(),
                    path: path.to_string(),
                    value: value.to_string(),
                }
            } else {
                self.n += 1;
                Record::Step {
                    txn: self.txn.clone(),
                    n: self.n,
                    path: path.to_string(),
                    value: value.to_string(),
                }
            };
            j.append(rec).map_err(std::io::Error::other)?;
        }
        self.ops.write(&self.ops.root().path(path), value)
    }
}

/// Bring one change to its state before (`to_after` false) or after, making only the writes
/// still needed. Returns a line saying what happened.
fn restore_one(w: &mut Writer<'_>, c: &Change, to_after: bool) -> Result<String, std::io::Error> {
    let host = w.ops.root().clone();
    let want_present = |create: bool| create == to_after;
    match c {
        Change::Create {
            uuid,
            parent,
            mdev_type,
            ..
        }
        | Change::Remove {
            uuid,
            parent,
            mdev_type,
        } => {
            let attrs: &[(String, String)] = match c {
                Change::Create { attrs, .. } => attrs,
                _ => &[],
            };
            let want = want_present(matches!(c, Change::Create { .. }));
            let dev = instance_path(uuid);
            let now = present(&host, &dev);
            if now == want {
                return Ok(format!(
                    "{uuid}: already {}",
                    if want { "present" } else { "absent" }
                ));
            }
            if want {
                w.write(&create_path(parent, mdev_type), uuid)?;
                if !wait_present(&host, &dev, true) {
                    return Err(std::io::Error::other(format!("{dev} did not appear")));
                }
                for (k, v) in attrs {
                    w.write(&format!("{dev}/{k}"), v)?;
                }
                Ok(format!("{uuid}: created again ({mdev_type} on {parent})"))
            } else {
                w.write(&format!("{dev}/remove"), "1")?;
                if !wait_present(&host, &dev, false) {
                    return Err(std::io::Error::other(format!("{dev} is still there")));
                }
                Ok(format!("{uuid}: removed"))
            }
        }
        Change::VgpuSet { vf, mdev_type } | Change::VgpuClear { vf, was: mdev_type } => {
            let set = matches!(c, Change::VgpuSet { .. });
            let want = if set == to_after { mdev_type.as_str() } else { "0" };
            let p = vgpu_type_path(vf);
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
    }
}

/// Restore every change of `changes` (in reverse order) to before, or complete them in order.
fn restore_all(w: &mut Writer<'_>, changes: &[Change], to_after: bool) -> Result<Vec<String>, String> {
    let order: Vec<&Change> = if to_after {
        changes.iter().collect()
    } else {
        changes.iter().rev().collect()
    };
    let mut lines = Vec::new();
    let mut errors = Vec::new();
    for c in order {
        match restore_one(w, c, to_after) {
            Ok(l) => lines.push(l),
            Err(e) => errors.push(format!("{}: {e}", c.instance())),
        }
    }
    if errors.is_empty() {
        Ok(lines)
    } else {
        Err(errors.join("; "))
    }
}

/// Refuse when an unfinished mdev plan touches one of this plan's instances.
fn check_unfinished(replay: &journal::Replay, plan: &MdevPlan) -> Result<(), MdevError> {
    for t in replay.open_changes.iter().filter(|t| t.domain == DOMAIN) {
        let theirs: Vec<Change> = serde_json::from_value(t.changes.clone()).unwrap_or_default();
        if theirs
            .iter()
            .any(|c| plan.changes.iter().any(|p| p.instance() == c.instance()))
        {
            return Err(MdevError::Unfinished(t.describe()));
        }
    }
    Ok(())
}

/// Run a plan: take the lock, journal the plan, make each write announced, check, commit. On
/// a failure every change goes back to its state before (journaled as `undo`s, then
/// `rolled_back`); the error is the failing step's, built by `fail` from the step and the I/O
/// error (`None` for a check), and whether the rollback worked.
pub fn execute(ops: &dyn HostOps, plan: &MdevPlan) -> Result<(), MdevError> {
    let host = ops.root().clone();
    let lock = journal::lock(&host, journal::lock_timeout()).map_err(journal_err)?;
    let replay = journal::read(&host).map_err(journal_err)?;
    check_unfinished(&replay, plan)?;
    let mut j = Journal::open(&host, &lock, &replay).map_err(journal_err)?;
    let (txn, time) = journal::new_txn();
    j.append(Record::Change {
        txn: txn.clone(),
        time,
        pid: std::process::id(),
        domain: DOMAIN.into(),
        what: plan.describe(),
        changes: serde_json::to_value(&plan.changes).unwrap_or_default(),
        writes: plan.write_count(),
    })
    .map_err(journal_err)?;
    let mut failure: Option<(usize, Option<std::io::Error>, String)> = None;
    {
        let mut w = Writer {
            ops,
            journal: Some(&mut j),
            txn: txn.clone(),
            n: 0,
            undo: false,
        };
        for (i, step) in plan.steps.iter().enumerate() {
            match step {
                Step::Write { path, value, .. } => {
                    if let Err(e) = w.write(path, value) {
                        failure = Some((i, Some(e), String::new()));
                        break;
                    }
                }
                Step::CheckPresent { path, present } => {
                    if !wait_present(&host, path, *present) {
                        failure = Some((i, None, String::new()));
                        break;
                    }
                }
                Step::CheckReads { path, value } => {
                    let now = reads(&host, path);
                    if !reads_as(&now, value) {
                        failure = Some((i, None, now));
                        break;
                    }
                }
            }
        }
    }
    let Some((i, io, now)) = failure else {
        j.append(Record::Commit { txn }).map_err(journal_err)?;
        return Ok(());
    };
    let mut w = Writer {
        ops,
        journal: Some(&mut j),
        txn: txn.clone(),
        n: 0,
        undo: true,
    };
    let rolled = restore_all(&mut w, &plan.changes, false);
    let rollback_ok = rolled.is_ok();
    let err = step_error(&host, plan, i, io, now, rollback_ok);
    if rollback_ok {
        j.append(Record::RolledBack {
            txn,
            error: crate::model::ErrorChain(&err).to_string(),
        })
        .map_err(journal_err)?;
    }
    Err(err)
}

/// The error of step `i` of `plan`, in the words the commands have always used.
fn step_error(
    host: &HostRoot,
    plan: &MdevPlan,
    i: usize,
    io: Option<std::io::Error>,
    now: String,
    rollback_ok: bool,
) -> MdevError {
    let disp = |p: &str| std::path::PathBuf::from(host.display(&host.path(p)));
    // The write a check follows.
    let prev_write = || {
        plan.steps[..i].iter().rev().find_map(|s| match s {
            Step::Write { path, value, .. } => Some((path.clone(), value.clone())),
            _ => None,
        })
    };
    match (&plan.steps[i], io) {
        (Step::Write { path, value, role }, Some(source)) => match role {
            Role::Create { parent } if !host.mdev_bus_class().join(parent).exists() => {
                MdevError::ParentGone {
                    parent: parent.clone(),
                    uuid: value.clone(),
                }
            }
            Role::Attr { uuid, name } => MdevError::AttrFailed {
                uuid: uuid.clone(),
                attr: name.clone(),
                path: disp(path),
                source,
                rollback_ok,
            },
            _ => MdevError::Write {
                path: disp(path),
                value: value.trim_end().to_string(),
                source,
            },
        },
        (Step::CheckPresent { path, present }, _) => {
            let (wp, wv) = prev_write().unwrap_or_default();
            MdevError::NotCreated {
                path: disp(&wp),
                value: wv,
                expect: if *present {
                    host.display(&host.path(path))
                } else {
                    format!("the removal of {}", host.display(&host.path(path)))
                },
            }
        }
        (Step::CheckReads { path, value }, _) => MdevError::NotCreated {
            path: disp(path),
            value: value.clone(),
            expect: if value == "0" {
                format!("a cleared type (reads {now:?})")
            } else {
                format!("the type in {} (reads {now:?})", host.display(&host.path(path)))
            },
        },
        (s, None) => MdevError::Usage(format!("internal: step {} ({}) failed", i + 1, s.render())),
    }
}

/// What `recover` did with the unfinished mdev plans.
#[derive(Debug, Default)]
pub struct Recovered {
    pub lines: Vec<String>,
    /// Whether an instance came or went (the CDI specs follow).
    pub changed: bool,
}

/// `gpupass recover` for mdev plans: restore (or with `cont`, complete) every unfinished one.
pub fn recover(ops: &dyn HostOps, cont: bool, dry_run: bool) -> Result<Recovered, MdevError> {
    let host = ops.root().clone();
    let lock = journal::lock(&host, journal::lock_timeout()).map_err(journal_err)?;
    let replay = journal::read(&host).map_err(journal_err)?;
    let open: Vec<&journal::OpenChange> = replay
        .open_changes
        .iter()
        .filter(|t| t.domain == DOMAIN)
        .collect();
    let mut out = Recovered::default();
    if open.is_empty() {
        return Ok(out);
    }
    let mut j = if dry_run {
        None
    } else {
        Some(Journal::open(&host, &lock, &replay).map_err(journal_err)?)
    };
    for t in open.iter().rev() {
        let changes: Vec<Change> = serde_json::from_value(t.changes.clone()).map_err(|e| {
            MdevError::Journal(Box::new(BindError::Journal {
                path: journal::journal_path(&host),
                source: std::io::Error::other(e),
            }))
        })?;
        out.lines.push(format!(
            "{} the unfinished {}",
            if cont { "completing" } else { "restoring" },
            t.describe()
        ));
        if dry_run {
            for c in &changes {
                out.lines.push(format!(
                    "  would {} {}",
                    if cont { "complete" } else { "undo" },
                    c.instance()
                ));
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
        match restore_all(&mut w, &changes, cont) {
            Ok(ls) => {
                out.lines.extend(ls.into_iter().map(|l| format!("  {l}")));
                out.changed = true;
                if let Some(j) = j.as_mut() {
                    j.append(Record::Recovered {
                        txn: t.txn.clone(),
                        to: if cont { "after" } else { "before" }.into(),
                    })
                    .map_err(journal_err)?;
                }
            }
            Err(e) => {
                return Err(MdevError::RecoverFailed {
                    txn: t.txn.clone(),
                    detail: e,
                })
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_plan_writes_create_then_attrs_in_order() {
        let p = plan(
            "mdev create",
            vec![Change::Create {
                uuid: "u".into(),
                parent: "mtty".into(),
                mdev_type: "mtty-2".into(),
                attrs: vec![("b".into(), "2".into()), ("a".into(), "1".into())],
            }],
        );
        assert_eq!(p.write_count(), 3);
        let r: Vec<String> = p.steps.iter().map(Step::render).collect();
        assert_eq!(
            r,
            [
                "write \"u\" > /sys/class/mdev_bus/mtty/mdev_supported_types/mtty-2/create",
                "check /sys/bus/mdev/devices/u exists",
                "write \"2\" > /sys/bus/mdev/devices/u/b",
                "write \"1\" > /sys/bus/mdev/devices/u/a",
            ]
        );
        // The changes round-trip through the journal's JSON.
        let v = serde_json::to_value(&p.changes).unwrap();
        let back: Vec<Change> = serde_json::from_value(v).unwrap();
        assert_eq!(back, p.changes);
    }

    use crate::host::ops::HostOps;
    use crate::mdev::{ops, types, MdevUuid, OpenNodes};
    use crate::testkit::FakeHost;
    use std::io;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The fake kernel, dying (a panic: the lock's file closes as it unwinds, as it does
    /// when a process dies) right after its `crash_after`-th write: the in-process twin of
    /// `GPUPASS_CRASH_AFTER_WRITE`.
    struct Crashing {
        inner: FakeHost,
        n: AtomicUsize,
        crash_after: usize,
    }

    impl HostOps for Crashing {
        fn root(&self) -> &HostRoot {
            self.inner.root()
        }
        fn write(&self, path: &Path, value: &str) -> io::Result<()> {
            self.inner.write(path, value)?;
            if self.n.fetch_add(1, Ordering::SeqCst) + 1 == self.crash_after {
                panic!("crash after write {}", self.crash_after);
            }
            Ok(())
        }
        fn load_module(&self, name: &str) -> io::Result<()> {
            self.inner.load_module(name)
        }
        fn writes(&self) -> Vec<(PathBuf, String)> {
            self.inner.writes()
        }
    }

    /// Everything under the root but `run/` (the journal): the host's state.
    fn state(root: &Path) -> Vec<(String, String)> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
            let mut es: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
            es.sort_by_key(|e| e.path());
            for e in es {
                let p = e.path();
                let rel = p.strip_prefix(base).unwrap().display().to_string();
                if rel == "run" {
                    continue;
                }
                let ft = e.file_type().unwrap();
                if ft.is_symlink() {
                    out.push((rel, std::fs::read_link(&p).unwrap().display().to_string()));
                } else if ft.is_dir() {
                    out.push((rel, "dir".into()));
                    walk(base, &p, out);
                } else {
                    out.push((rel, String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into()));
                }
            }
        }
        let mut v = Vec::new();
        walk(root, root, &mut v);
        v
    }

    fn scratch(name: &str) -> (tempfile::TempDir, HostRoot) {
        let t = tempfile::tempdir().unwrap();
        crate::testkit::fixtures::build(name, t.path()).unwrap();
        let h = HostRoot::new(t.path());
        (t, h)
    }

    /// For each write of `make`'s plan (the count from the plan): crash after it, check the
    /// journal holds the plan open at that write, `recover`, and find the host as before.
    fn crash_each_write(name: &str, make: impl Fn(&HostRoot) -> MdevPlan) -> usize {
        let (_t0, h0) = scratch(name);
        let writes = make(&h0).write_count();
        assert!(writes > 0);
        for n in 1..=writes {
            let (_t, h) = scratch(name);
            let p = make(&h);
            let before = state(h.root());
            assert_eq!(p.write_count(), writes);
            let host = Crashing {
                inner: FakeHost::new(h.clone()),
                n: AtomicUsize::new(0),
                crash_after: n,
            };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| execute(&host, &p)));
            assert!(r.is_err(), "write {n}: no crash");
            let replay = journal::read(&h).unwrap();
            assert_eq!(replay.open_changes.len(), 1, "write {n}");
            assert_eq!(replay.open_changes[0].at, n);
            assert_eq!(replay.open_changes[0].writes, writes);
            assert_ne!(state(h.root()), before, "write {n} changed nothing");
            let fake = FakeHost::new(h.clone());
            let rec = recover(&fake, false, false).unwrap();
            assert!(
                rec.lines[0].starts_with("restoring the unfinished"),
                "{:?}",
                rec.lines
            );
            assert_eq!(state(h.root()), before, "{}: recover after write {n}", p.action);
            assert!(journal::read(&h).unwrap().open_changes.is_empty());
            // Twice is harmless.
            assert!(recover(&fake, false, false).unwrap().lines.is_empty());
        }
        writes
    }

    fn mdev_create(h: &HostRoot, parent: &str, ty: &str, uuids: &[&str], count: u32) -> MdevPlan {
        let inv = crate::inventory::scan(h).unwrap();
        let parents = types::parents(&inv);
        let p = types::resolve(&inv, &parents, parent).unwrap();
        let t = p.find_type(ty).unwrap();
        let u: Vec<MdevUuid> = uuids.iter().map(|u| u.parse().unwrap()).collect();
        ops::plan_create(h, "mdev create", &inv, &p, t, &u, count, &[])
            .unwrap()
            .0
    }

    #[test]
    fn a_crash_after_each_write_of_a_create_is_recovered() {
        let uuids = [
            "0f0e0d0c-0b0a-4908-8706-050403020100",
            "0f0e0d0c-0b0a-4908-8706-050403020101",
            "0f0e0d0c-0b0a-4908-8706-050403020102",
        ];
        let n = crash_each_write("mdev-t4", |h| {
            mdev_create(h, "0000:3b:00.0", "nvidia-222", &uuids, 3)
        });
        assert_eq!(n, 3);
        // NVIDIA vendor-VFIO vGPU: two VFs take the type.
        let n = crash_each_write("sriov-vgpu", |h| mdev_create(h, "41:00.0", "1045", &[], 2));
        assert_eq!(n, 2);
    }

    #[test]
    fn a_crash_after_the_write_of_a_remove_is_recovered() {
        let u = "0f0e0d0c-0b0a-4908-8706-050403020100";
        let setup = |h: &HostRoot| {
            if !h.mdev_devices().join(u).exists() {
                let p = mdev_create(h, "0000:3b:00.0", "nvidia-222", &[u], 1);
                execute(&FakeHost::new(h.clone()), &p).unwrap();
            }
            let inv = crate::inventory::scan(h).unwrap();
            let uuid: MdevUuid = u.parse().unwrap();
            ops::plan_remove_mdev(h, &inv, &OpenNodes::default(), &uuid, "mdev remove")
                .unwrap()
                .0
        };
        // The instance exists before the plan is made (setup makes it on each scratch copy).
        let n = crash_each_write("mdev-t4", setup);
        assert_eq!(n, 1);
    }

    #[test]
    fn a_failed_write_rolls_back_and_closes_the_plan() {
        let (_t, h) = scratch("mdev-t4");
        let before = state(h.root());
        let p = mdev_create(&h, "0000:3b:00.0", "nvidia-222", &[], 3);
        let e = execute(&FakeHost::new(h.clone()).fail_at(2), &p).unwrap_err();
        assert!(e.to_string().contains("cannot write"), "{e}");
        assert_eq!(state(h.root()), before);
        let r = journal::read(&h).unwrap();
        assert!(r.open_changes.is_empty() && r.open.is_empty());
    }
}
