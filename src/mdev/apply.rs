//! The mdev changes as `bind::apply` makes binds: take the one lock, read the part of the host
//! the change plans with and plan under it ([`super::ops`]: every refusal before the first
//! write), hand the plan to the one change engine ([`super::plan::execute_in`]: journal,
//! writes, checks, rollback), then run what follows the change in the same session before the
//! lock is released ([`Followup`]: the commands refresh the CDI specs). One function per
//! subcommand that changes the host: `create`, `remove`, `define`, `undefine`, `start`,
//! `stop`; `cli::mdev` parses the arguments, calls one and prints what it returns.
//!
//! The lock is taken before anything is read: the parent's available instances, the active
//! instances, the definitions and the open files a plan is made from cannot change under it
//! (two `define`s of one UUID, or two creates on the last free instance, are serialized, and
//! the second is planned from what the first left). A dry run reads without it and returns
//! the plan ([`Done::DryRun`]).

use super::defs::{self, Definition, StartMode};
use super::ops;
use super::plan::{self, MdevPlan};
use super::types::{self, Parent, ParentKind, TypeInfo};
use super::{InstanceRef, MdevError, MdevUuid, OpenNodes};
use crate::change::{journal, Followup, Session};
use crate::host::ops::HostOps;
use crate::host::HostRoot;
use crate::inventory::MdevScope;
use crate::messages;
use crate::model::{ErrorChain, Inventory, PciAddress};

/// What a subcommand did: its plan only (`--dry-run`), or what it changed.
#[derive(Debug)]
pub(crate) enum Done<T> {
    DryRun(MdevPlan),
    Applied(T),
}

/// What follows a change of the active instances, named in the follow-up's warning.
const CHANGED: &str = "mdev instances";

/// The lock (not for a dry run) and the host a change plans with, read under it
/// ([`crate::inventory::scan_mdev`]; its warnings said once, here).
fn locked<'a>(
    ops: &'a dyn HostOps,
    dry_run: bool,
    scope: MdevScope<'_>,
) -> Result<(Option<Session<'a>>, Inventory), MdevError> {
    let session = lock(ops, dry_run)?;
    Ok((session, scan(ops.root(), scope)?))
}

/// The lock, not for a dry run.
fn lock(ops: &dyn HostOps, dry_run: bool) -> Result<Option<Session<'_>>, MdevError> {
    if dry_run {
        return Ok(None);
    }
    let s = Session::lock(ops, journal::lock_timeout())?;
    // Under the lock every open plan is an abandoned one (`cli::run` did not read the
    // journal before: `MdevCommand::takes_lock`).
    journal::warn_open(&s.replay().open);
    Ok(Some(s))
}

/// The part of the host `scope` names, its warnings said once.
fn scan(host: &HostRoot, scope: MdevScope<'_>) -> Result<Inventory, MdevError> {
    let inv = crate::inventory::scan_mdev(host, scope)?;
    for w in &inv.warnings {
        messages::warn(w);
    }
    tracing::debug!(
        devices = inv.devices.len(),
        mdevs = inv.mdevs.len(),
        "inventory read"
    );
    Ok(inv)
}

/// The session a change holds.
fn held<'s, 'a>(session: &'s mut Option<Session<'a>>) -> &'s mut Session<'a> {
    session
        .as_mut()
        .expect("a change that is not a dry run holds the lock")
}

/// `type` on `parent`: an unknown type, or (NVIDIA vGPU, whose catalog shrinks with
/// capacity) none left, says so.
pub(crate) fn resolve_type<'a>(parent: &'a Parent, ty: &str) -> Result<&'a TypeInfo, MdevError> {
    parent.find_type(ty).ok_or_else(|| {
        // NVIDIA vGPU catalogs shrink with capacity: an empty one means "used up".
        if parent.kind == ParentKind::NvidiaVgpu && parent.types.is_empty() {
            MdevError::NoAvailable {
                parent: parent.name.clone(),
                ty: ty.to_string(),
                available: 0,
                wanted: 1,
            }
        } else {
            MdevError::UnknownType {
                parent: parent.name.clone(),
                ty: ty.to_string(),
                valid: parent.type_ids(),
            }
        }
    })
}

/// The definitions, their warnings said once.
pub(crate) fn read_defs(host: &HostRoot) -> Vec<Definition> {
    let (d, warnings) = defs::read_all(host);
    for w in warnings {
        messages::warn(w);
    }
    d
}

/// `mdev create`'s request.
#[derive(Debug, Clone)]
pub(crate) struct CreateRequest {
    pub parent: String,
    pub ty: String,
    pub uuid: Option<MdevUuid>,
    pub count: u32,
    pub attrs: Vec<(String, String)>,
}

/// What `mdev create` made.
#[derive(Debug, Clone)]
pub(crate) struct Created {
    /// UUIDs, or VF addresses for NVIDIA vGPU.
    pub made: Vec<String>,
    pub parent: Parent,
    /// The type's id.
    pub type_id: String,
}

/// `gpupass mdev create`.
pub(crate) fn create(
    ops: &dyn HostOps,
    req: &CreateRequest,
    dry_run: bool,
    follow: &mut dyn Followup,
) -> Result<Done<Created>, MdevError> {
    let name = "mdev create";
    let host = ops.root();
    let (mut session, inv) = locked(ops, dry_run, MdevScope::Type(&req.parent, &req.ty))?;
    let parents = types::parents(&inv);
    if req.uuid.is_some() && req.count > 1 {
        return Err(MdevError::Usage(
            "--uuid names one instance; drop it to create --count N".into(),
        ));
    }
    let p = types::resolve(&inv, &parents, &req.parent)?;
    if p.kind == ParentKind::NvidiaVgpu && (req.uuid.is_some() || !req.attrs.is_empty()) {
        return Err(MdevError::Usage(format!(
            "{} is an NVIDIA vendor-VFIO vGPU parent: its instances are SR-IOV VFs named by PCI address and take no --uuid or --attr",
            p.name
        )));
    }
    let t = resolve_type(&p, &req.ty)?;
    let (plan, made) = ops::plan_create(
        host,
        name,
        &inv,
        &p,
        t,
        req.uuid.as_slice(),
        req.count,
        &req.attrs,
    )?;
    if dry_run {
        return Ok(Done::DryRun(plan));
    }
    let s = held(&mut session);
    plan::execute_in(s, &plan)?;
    tracing::debug!("applied");
    follow.follow(s, CHANGED);
    tracing::debug!("CDI refresh done");
    let type_id = t.t.id.clone();
    Ok(Done::Applied(Created {
        made,
        parent: p,
        type_id,
    }))
}

/// What `mdev remove` removed: the instance as named (UUID or VF address) and its parent.
#[derive(Debug, Clone)]
pub(crate) struct Removed {
    pub name: String,
    pub parent: String,
}

/// `gpupass mdev remove`: an mdev by UUID, or an NVIDIA vGPU VF's type; refused while a
/// process holds its VFIO node open.
pub(crate) fn remove(
    ops: &dyn HostOps,
    instance: &InstanceRef,
    dry_run: bool,
    follow: &mut dyn Followup,
) -> Result<Done<Removed>, MdevError> {
    let name = "mdev remove";
    let host = ops.root();
    let scope = match instance {
        InstanceRef::Uuid(_) => MdevScope::Instances,
        InstanceRef::Vf(_) => MdevScope::All,
    };
    let (mut session, inv) = locked(ops, dry_run, scope)?;
    let open = OpenNodes::scan(host);
    tracing::debug!(holders = open.holders.len(), "open files read");
    let (plan, parent) = match instance {
        InstanceRef::Uuid(u) => ops::plan_remove_mdev(host, &inv, &open, u, name)?,
        InstanceRef::Vf(a) => ops::plan_remove_vgpu(host, &inv, &open, a)?,
    };
    if dry_run {
        return Ok(Done::DryRun(plan));
    }
    let s = held(&mut session);
    plan::execute_in(s, &plan)?;
    tracing::debug!("applied");
    follow.follow(s, CHANGED);
    tracing::debug!("CDI refresh done");
    let name = match instance {
        InstanceRef::Uuid(u) => u.to_string(),
        InstanceRef::Vf(a) => a.to_string(),
    };
    Ok(Done::Applied(Removed { name, parent }))
}

/// `mdev define`'s request.
#[derive(Debug, Clone)]
pub(crate) struct DefineRequest {
    pub parent: Option<String>,
    pub ty: Option<String>,
    pub uuid: Option<MdevUuid>,
    pub auto: bool,
    pub attrs: Vec<(String, String)>,
    pub force: bool,
}

/// `gpupass mdev define`: a definition in mdevctl's format; with only a UUID, the parent and
/// type of that active instance.
pub(crate) fn define(
    ops: &dyn HostOps,
    req: DefineRequest,
    dry_run: bool,
) -> Result<Done<Definition>, MdevError> {
    let host = ops.root();
    let scope = match (&req.parent, &req.ty) {
        (Some(p), Some(t)) => MdevScope::Type(p, t),
        (Some(p), None) => MdevScope::Parent(p),
        _ => MdevScope::All,
    };
    let (mut session, inv) = locked(ops, dry_run, scope)?;
    let parents = types::parents(&inv);
    let defs = read_defs(host);
    let uuid = match req.uuid {
        Some(u) => u,
        None => MdevUuid::random()?,
    };
    if let Some(d) = defs.iter().find(|d| d.uuid == uuid.as_str()) {
        return Err(MdevError::AlreadyDefined {
            uuid: uuid.to_string(),
            parent: d.parent.clone(),
            path: host.display(&defs::path_of(host, &d.parent, &d.uuid)),
        });
    }
    // With only --uuid: take parent and type from the running instance.
    let (parent, ty) = match (req.parent, req.ty) {
        (Some(p), Some(t)) => (p, t),
        (None, None) => {
            let m = inv.mdev(uuid.as_str()).ok_or_else(|| {
                MdevError::Usage(format!(
                    "define needs --parent and --type (or --uuid of an active mdev; {uuid} is not active)"
                ))
            })?;
            (m.parent.clone(), m.type_id.clone().unwrap_or_default())
        }
        _ => return Err(MdevError::Usage("define needs both --parent and --type".into())),
    };
    let parent_name = match types::resolve(&inv, &parents, &parent) {
        Ok(p) => {
            if p.kind == ParentKind::NvidiaVgpu {
                return Err(MdevError::Usage(format!(
                    "{} is an NVIDIA vendor-VFIO vGPU parent; mdevctl-format definitions describe mdev devices only (create the vGPU with `gpupass mdev create`)",
                    p.name
                )));
            }
            if !req.force {
                resolve_type(&p, &ty)?;
            }
            p.name
        }
        // A parent that appears later: keep the name as given, in full PCI form.
        Err(MdevError::UnknownParent { .. }) if req.force => parent
            .parse::<PciAddress>()
            .map(|a| a.to_string())
            .unwrap_or(parent),
        Err(MdevError::UnknownParent {
            input,
            suggestion,
            known,
            ..
        }) => {
            return Err(MdevError::UnknownParent {
                input,
                suggestion,
                known,
                hint: Some(" (add --force to define it for a parent that appears later)"),
            })
        }
        Err(e) => return Err(e),
    };
    if parent_name.contains('/') || parent_name.starts_with('.') || parent_name == "scripts.d" {
        return Err(MdevError::Usage(format!("{parent_name:?} is not a parent name")));
    }
    let d = Definition {
        uuid: uuid.to_string(),
        parent: parent_name,
        mdev_type: ty,
        start: if req.auto {
            StartMode::Auto
        } else {
            StartMode::Manual
        },
        attrs: req.attrs,
    };
    let plan = MdevPlan::of(defs::define_part(host, &d));
    if dry_run {
        return Ok(Done::DryRun(plan));
    }
    plan::execute_in(held(&mut session), &plan)?;
    Ok(Done::Applied(d))
}

/// `gpupass mdev undefine`: the definition's file removed (an active instance keeps running).
pub(crate) fn undefine(
    ops: &dyn HostOps,
    uuid: &MdevUuid,
    parent: Option<&str>,
    dry_run: bool,
) -> Result<Done<Definition>, MdevError> {
    let host = ops.root();
    let (mut session, _) = locked(ops, dry_run, MdevScope::Instances)?;
    let defs = read_defs(host);
    let d = defs::find(&defs, uuid, parent)?.clone();
    let plan = MdevPlan::of(defs::undefine_part(host, &d));
    if dry_run {
        return Ok(Done::DryRun(plan));
    }
    plan::execute_in(held(&mut session), &plan)?;
    Ok(Done::Applied(d))
}

/// What `mdev start` did (or, for a dry run, would do): each definition started, or failed
/// with why (`--auto-all` goes on past a failure).
#[derive(Debug, Default)]
pub(crate) struct Started {
    /// Dry run: one plan per definition (each is applied, and fails, on its own).
    pub plans: Vec<MdevPlan>,
    pub started: Vec<Definition>,
    pub failed: Vec<(Definition, String)>,
    /// The definitions it tried (none: nothing to start).
    pub tried: usize,
}

/// `gpupass mdev start`: a defined instance, or with `auto_all` every `auto` definition whose
/// parent is present and that is not running.
pub(crate) fn start(
    ops: &dyn HostOps,
    uuid: Option<&MdevUuid>,
    parent: Option<&str>,
    auto_all: bool,
    dry_run: bool,
    follow: &mut dyn Followup,
) -> Result<Started, MdevError> {
    let name = "mdev start";
    let host = ops.root();
    let mut session = lock(ops, dry_run)?;
    let defs = read_defs(host);
    // One definition: its parent is all the plan needs (the scan reads that one parent when
    // the kernel lists it, else every parent, as before). --auto-all: every parent.
    let one = match (auto_all, uuid) {
        (false, Some(u)) => Some(defs::find(&defs, u, parent)?.clone()),
        _ => None,
    };
    let inv = scan(
        host,
        match &one {
            Some(d) => MdevScope::Type(&d.parent, &d.mdev_type),
            None => MdevScope::All,
        },
    )?;
    let parents = types::parents(&inv);
    let todo: Vec<Definition> = if auto_all {
        defs.iter()
            .filter(|d| d.start == StartMode::Auto)
            .filter(|d| parents.iter().any(|p| p.name == d.parent))
            .filter(|d| inv.mdev(&d.uuid).is_none())
            .cloned()
            .collect()
    } else {
        let d = one.ok_or_else(|| MdevError::Usage("start needs a UUID or --auto-all".into()))?;
        if let Some(m) = inv.mdev(&d.uuid) {
            return Err(MdevError::AlreadyActive {
                uuid: d.uuid.clone(),
                parent: m.parent.clone(),
            });
        }
        vec![d]
    };
    let mut out = Started {
        tried: todo.len(),
        ..Started::default()
    };
    for d in &todo {
        let r = (|| {
            let p = types::resolve(&inv, &parents, &d.parent).map_err(|_| MdevError::ParentGone {
                parent: d.parent.clone(),
                uuid: d.uuid.clone(),
            })?;
            let t = resolve_type(&p, &d.mdev_type)?;
            let u: MdevUuid = d.uuid.parse().map_err(MdevError::Usage)?;
            let (plan, _) = ops::plan_create(host, name, &inv, &p, t, &[u], 1, &d.attrs)?;
            if dry_run {
                out.plans.push(plan);
                return Ok(());
            }
            plan::execute_in(held(&mut session), &plan)
        })();
        match r {
            Ok(_) => out.started.push(d.clone()),
            Err(e) if !auto_all => return Err(e),
            Err(e) => out.failed.push((d.clone(), ErrorChain(&e).to_string())),
        }
    }
    if !dry_run && !out.started.is_empty() {
        follow.follow(held(&mut session), CHANGED);
    }
    Ok(out)
}

/// `gpupass mdev stop`: an active instance removed, its definition kept; returns its parent.
pub(crate) fn stop(
    ops: &dyn HostOps,
    uuid: &MdevUuid,
    dry_run: bool,
    follow: &mut dyn Followup,
) -> Result<Done<String>, MdevError> {
    let name = "mdev stop";
    let host = ops.root();
    let (mut session, inv) = locked(ops, dry_run, MdevScope::Instances)?;
    let open = OpenNodes::scan(host);
    let (plan, parent) = ops::plan_remove_mdev(host, &inv, &open, uuid, name)?;
    if dry_run {
        return Ok(Done::DryRun(plan));
    }
    let s = held(&mut session);
    plan::execute_in(s, &plan)?;
    tracing::debug!("applied");
    follow.follow(s, CHANGED);
    tracing::debug!("CDI refresh done");
    Ok(Done::Applied(parent))
}
