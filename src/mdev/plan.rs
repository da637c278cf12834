//! mdev changes as plans for the one change engine ([`crate::change`]): typed steps made from
//! the checks of [`super::ops`], applied under the one lock with every write announced in the
//! one journal (a `change` record of domain `mdev`), rolled back on failure and finished or
//! undone by `gpupass recover` after a crash.
//!
//! A plan's objects ([`Change`], the engine's [`Object`]) are each instance's state before and
//! after (an instance absent then present, a VF's vGPU type `0` then `1044`, a definition
//! file absent then present); its steps are what `--dry-run` prints and apply runs, in the
//! kernel's paths before the root (`/sys/...`). Rollback and recovery are the engine's,
//! state-based on the objects. This module makes the steps of each object and maps the
//! engine's failures into the words the mdev commands have always used.

use super::MdevError;
use crate::change::engine::{Cause, Failure};
use crate::change::{ChangeError, Part, Role, Step};
use crate::host::ops::HostOps;
use crate::host::HostRoot;

/// One object an mdev plan changes, with its state before and after.
pub use crate::change::Object as Change;
pub use crate::change::{
    mdev_create_path as create_path, mdev_instance_path as instance_path, vgpu_type_path,
};
/// An mdev plan: the engine's plan, of one part of domain `mdev`.
pub type MdevPlan = crate::change::Plan;

/// The journal's domain name of these plans.
pub const DOMAIN: &str = "mdev";

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
        // Functions and files are other domains' objects; a file's step is made with it
        // (`Part::file`).
        Change::Function { .. } | Change::File { .. } => Vec::new(),
    }
}

/// `mdev create of 2f3e... (mbochs-small on mbochs)`: the part's `what`.
pub fn describe(action: &str, changes: &[Change]) -> String {
    let what: Vec<String> = changes.iter().map(Change::label).collect();
    format!("{action} of {}", what.join(", "))
}

/// The part of `changes`, in order.
pub fn part(action: &str, changes: Vec<Change>) -> Part {
    let mut p = Part::new(DOMAIN, describe(action, &changes));
    p.steps = changes.iter().flat_map(steps_for).collect();
    p.objects = changes;
    p
}

/// A plan of `changes`, in order.
pub fn plan(action: &str, changes: Vec<Change>) -> MdevPlan {
    MdevPlan::of(part(action, changes))
}

/// Run a plan through the change engine (lock, journal, writes, checks, commit; rollback on
/// a failure), with the engine's errors in mdev's words: [`execute_in`] after taking the lock.
/// For a plan made before the lock (the commands take it before they read: [`super::apply`]).
pub fn execute(ops: &dyn HostOps, plan: &MdevPlan) -> Result<(), MdevError> {
    let mut session = crate::change::Session::lock(ops, crate::change::journal::lock_timeout())
        .map_err(|e| mdev_error(ops.root(), plan, e))?;
    execute_in(&mut session, plan)
}

/// [`execute`] in a session that holds the lock already: the command read the host and made
/// `plan` under it, so no other gpupass changed what the plan was made from in between.
pub fn execute_in(session: &mut crate::change::Session<'_>, plan: &MdevPlan) -> Result<(), MdevError> {
    let host = session.ops().root().clone();
    session
        .apply(plan)
        .map(|_| ())
        .map_err(|e| mdev_error(&host, plan, e))
}

/// The engine's error in the words the mdev commands have always used.
pub fn mdev_error(host: &HostRoot, plan: &MdevPlan, e: ChangeError) -> MdevError {
    match e {
        ChangeError::Unfinished { open, .. } => MdevError::Unfinished(open.describe()),
        ChangeError::Failed(f) => step_error(host, plan, *f),
        e => MdevError::Change(e),
    }
}

/// The error of a failed step of `plan`.
fn step_error(host: &HostRoot, plan: &MdevPlan, f: Failure) -> MdevError {
    let disp = |p: &str| std::path::PathBuf::from(host.display(&host.path(p)));
    let steps: Vec<&Step> = plan.steps().collect();
    let rollback_ok = f.rollback_ok();
    let Failure {
        domain,
        what,
        index: i,
        step,
        cause,
        rollback,
    } = f;
    // The write a check follows.
    let prev_write = || {
        steps[..i].iter().rev().find_map(|s| match s {
            Step::Write { path, value, .. } => Some((path.clone(), value.clone())),
            _ => None,
        })
    };
    match (step.as_ref(), cause) {
        (Some(Step::Write { path, value, role }), Cause::Write { source, .. }) => match role {
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
        (
            Some(Step::WriteFile { path, .. } | Step::RemoveFile { path, .. }),
            Cause::WriteFile { source, .. },
        )
        | (
            Some(Step::WriteFile { path, .. } | Step::RemoveFile { path, .. }),
            Cause::RemoveFile { source, .. },
        ) => MdevError::DefIo {
            path: disp(path),
            source,
        },
        (Some(Step::CheckPresent { path, present }), _) => {
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
        (Some(Step::CheckReads { path, value }), cause) => {
            let now = match cause {
                Cause::Reads { now, .. } => now,
                _ => String::new(),
            };
            MdevError::NotCreated {
                path: disp(path),
                value: value.clone(),
                expect: if value == "0" {
                    format!("a cleared type (reads {now:?})")
                } else {
                    format!("the type in {} (reads {now:?})", host.display(&host.path(path)))
                },
            }
        }
        (_, cause) => MdevError::Change(ChangeError::Failed(Box::new(Failure {
            domain,
            what,
            index: i,
            step: step.clone(),
            cause,
            rollback,
        }))),
    }
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
        let r: Vec<String> = p.steps().map(Step::render).collect();
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
        let v = serde_json::to_value(&p.parts[0].objects).unwrap();
        let back: Vec<Change> = serde_json::from_value(v).unwrap();
        assert_eq!(back, p.parts[0].objects);
    }

    use crate::change::{journal, recover};
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
            assert_eq!(replay.open.len(), 1, "write {n}");
            assert_eq!(replay.open[0].at, n);
            assert_eq!(replay.open[0].writes, writes);
            assert_ne!(state(h.root()), before, "write {n} changed nothing");
            let fake = FakeHost::new(h.clone());
            let rec = recover(&fake, false, false).unwrap();
            assert!(
                rec.lines[0].starts_with("restoring the unfinished"),
                "{:?}",
                rec.lines
            );
            assert_eq!(
                state(h.root()),
                before,
                "{}: recover after write {n}",
                p.describe()
            );
            assert!(journal::read(&h).unwrap().open.is_empty());
            // Twice is harmless.
            assert_eq!(
                recover(&fake, false, false).unwrap().lines,
                ["nothing to recover: the journal has no unfinished plan"]
            );
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
        assert!(r.open.is_empty());
    }
}
