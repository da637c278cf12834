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
use crate::host::HostRoot;

/// One object an mdev plan changes, with its state before and after.
pub use crate::change::Object as Change;
pub(crate) use crate::change::{
    mdev_create_path as create_path, mdev_instance_path as instance_path, vgpu_type_path,
};
/// An mdev plan: the engine's plan, of one part of domain `mdev`.
pub(crate) type MdevPlan = crate::change::Plan;

/// The journal's domain name of these plans.
pub(crate) const DOMAIN: &str = "mdev";

/// The steps that take `c` from before to after.
pub(crate) fn steps_for(c: &Change) -> Vec<Step> {
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
pub(crate) fn describe(action: &str, changes: &[Change]) -> String {
    let what: Vec<String> = changes.iter().map(Change::label).collect();
    format!("{action} of {}", what.join(", "))
}

/// The part of `changes`, in order.
pub(crate) fn part(action: &str, changes: Vec<Change>) -> Part {
    let mut p = Part::new(DOMAIN, describe(action, &changes));
    p.steps = changes.iter().flat_map(steps_for).collect();
    p.objects = changes;
    p
}

/// A plan of `changes`, in order.
pub(crate) fn plan(action: &str, changes: Vec<Change>) -> MdevPlan {
    MdevPlan::of(part(action, changes))
}

/// Run a plan through the change engine (lock, journal, writes, checks, commit; rollback on
/// a failure), with the engine's errors in mdev's words: [`execute_in`] after taking the lock.
/// For a plan made before the lock (the commands take it before they read: [`super::apply`]).
#[cfg(test)]
pub(crate) fn execute(ops: &dyn crate::host::ops::HostOps, plan: &MdevPlan) -> Result<(), MdevError> {
    let mut session = crate::change::Session::lock(ops, crate::change::journal::lock_timeout())
        .map_err(|e| mdev_error(ops.root(), plan, e))?;
    execute_in(&mut session, plan)
}

/// [`execute`] in a session that holds the lock already: the command read the host and made
/// `plan` under it, so no other gpupass changed what the plan was made from in between.
pub(crate) fn execute_in(session: &mut crate::change::Session<'_>, plan: &MdevPlan) -> Result<(), MdevError> {
    let host = session.ops().root().clone();
    session
        .apply(plan)
        .map(|_| ())
        .map_err(|e| mdev_error(&host, plan, e))
}

/// The engine's error in the words the mdev commands have always used.
pub(crate) fn mdev_error(host: &HostRoot, plan: &MdevPlan, e: ChangeError) -> MdevError {
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
mod tests;
