//! Bind and unbind as changes: take the one lock, read the host (the scope of the change) and
//! plan under it, refuse, re-check the groups just before the first write, and hand the plan
//! to the one change engine ([`crate::change::Session::apply`]: journal, writes, checks,
//! rollback). `gpupass recover` is the engine's ([`crate::change::recover`]).

use super::facts::{self, HostFacts};
use super::{plan_bind, plan_unbind, BindError, BindRequest, Plan, Refusal, UnbindRequest};
use crate::change::engine::current_driver;
use crate::change::journal::{OpenChange, Replay};
use crate::change::{ChangeError, Followup, Object, Part, Session};
use crate::host::ops::HostOps;
use crate::host::HostRoot;
use crate::inventory;
use crate::messages;
use crate::model::{Inventory, PciAddress};

pub(crate) use crate::change::engine::group_blockers;

/// What an applied plan did, one line per function.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub lines: Vec<String>,
    pub changed: Vec<PciAddress>,
    /// Groups whose viability the plan verified (they had no blockers then).
    pub verified_viable: Vec<u32>,
    /// A bind's groups, each with the members that keep it from being viable now (none:
    /// viable): the engine's own check where the plan made one, else read after the bind.
    pub viability: Vec<(u32, Vec<String>)>,
}

/// What part of the host a change reads.
#[derive(Clone, Copy)]
enum Scope<'a> {
    /// Every device (`unbind --all`).
    All,
    /// The IOMMU groups of these functions and these group numbers, with all their members:
    /// everything a bind or unbind of them plans with. On a large host this is a few devices
    /// instead of thousands, and it is what keeps a bind close to the cost of its writes.
    Groups {
        addrs: &'a [PciAddress],
        groups: &'a [u32],
    },
}

/// Scan the host (the scope of the change) and gather facts (under the lock when changing).
fn view(host: &HostRoot, scope: Scope, need: facts::Need) -> Result<(Inventory, HostFacts), BindError> {
    let inv = match scope {
        Scope::All => inventory::scan(host)?,
        Scope::Groups { addrs, groups } => inventory::scan_groups(host, addrs, groups)?,
    };
    tracing::debug!(
        functions = inv.devices.len(),
        groups = inv.groups.len(),
        faults = crate::minor_faults(),
        "scanned"
    );
    let facts = facts::gather_for(host, &inv, need);
    tracing::debug!(
        in_use = facts.uses.len(),
        faults = crate::minor_faults(),
        "in-use facts gathered"
    );
    Ok((inv, facts))
}

/// Refuse when an unfinished plan touches one of the plan's groups or functions; warn about
/// the others.
fn check_unfinished(open: &[OpenChange], plan: &Plan) -> Result<(), BindError> {
    let mine: Vec<String> = plan
        .groups
        .iter()
        .map(|g| format!("group:{g}"))
        .chain(plan.functions.iter().map(|f| format!("pci:{}", f.address)))
        .collect();
    for t in open {
        let objects = t.objects().unwrap_or_default();
        let theirs: Vec<String> = objects.iter().flat_map(Object::keys).collect();
        if theirs.iter().any(|k| mine.contains(k)) {
            let touched: Vec<u32> = objects
                .iter()
                .filter_map(|o| match o {
                    Object::Function { group, .. } => *group,
                    _ => None,
                })
                .collect();
            let group = plan
                .groups
                .iter()
                .find(|g| touched.contains(g))
                .or(touched.first())
                .or(plan.groups.first())
                .copied()
                .unwrap_or(0);
            return Err(BindError::Unfinished {
                group,
                txn: t.txn.clone(),
                action: t.domain.clone(),
                at: t.at,
                total: t.writes,
            });
        }
        messages::warn(format_args!(
            "an unfinished gpupass {} (other devices); run `gpupass recover`",
            t.describe()
        ));
    }
    Ok(())
}

/// Just before the first write: the groups still hold the members the plan was made from, and
/// each function still has the driver the plan expects. The lock keeps other gpupass processes
/// out, but not the kernel (hot-plug, SR-IOV VFs appearing) or other tools; binding a group
/// from a stale view would leave a new member on its host driver, half a group.
pub(crate) fn recheck(host: &HostRoot, inv: &Inventory, plan: &Plan) -> Result<(), BindError> {
    for &g in &plan.groups {
        let planned: Vec<PciAddress> = inv.group(g).map(|x| x.members.clone()).unwrap_or_default();
        let dir = host.iommu_groups().join(g.to_string()).join("devices");
        let mut now: Vec<PciAddress> = crate::host::dir_names(&dir)
            .unwrap_or_default()
            .iter()
            .filter_map(|m| m.parse().ok())
            .collect();
        now.sort();
        let mut was = planned.clone();
        was.sort();
        if now != was {
            let added: Vec<String> = now
                .iter()
                .filter(|a| !was.contains(a))
                .map(|a| a.to_string())
                .collect();
            let gone: Vec<String> = was
                .iter()
                .filter(|a| !now.contains(a))
                .map(|a| a.to_string())
                .collect();
            let mut change = Vec::new();
            if !added.is_empty() {
                change.push(format!("new member {}", added.join(", ")));
            }
            if !gone.is_empty() {
                change.push(format!("{} left it", gone.join(", ")));
            }
            return Err(BindError::GroupChanged {
                group: g,
                change: change.join("; "),
            });
        }
    }
    for f in &plan.functions {
        let now = current_driver(host, &f.address);
        if now != f.before.driver {
            return Err(BindError::GroupChanged {
                group: f.group.unwrap_or_default(),
                change: format!(
                    "{} is now on {}, the plan expected {}",
                    f.address,
                    now.as_deref().unwrap_or("no driver"),
                    f.before.driver.as_deref().unwrap_or("no driver")
                ),
            });
        }
    }
    Ok(())
}

/// A bind or unbind planned under a [`Session`]'s lock for a caller that composes it into a
/// plan of its own (the DRA plugin: a claim's prepare and unprepare, one plan each with the
/// claim's files, owned by the claim). The view of the groups, the refusals (not forced:
/// a device held by a host process is refused at once, naming the holder) and the
/// unfinished plans are checked; the caller runs [`recheck`] just before it applies.
#[cfg(feature = "dra")]
#[derive(Debug)]
pub(crate) struct Planned {
    pub plan: Plan,
    /// The host as the plan was made from it (the named groups).
    pub inv: Inventory,
}

#[cfg(feature = "dra")]
fn plan_in(
    session: &Session<'_>,
    scope: Scope,
    need: facts::Need,
    make: impl Fn(&Inventory, &HostFacts, &Replay) -> Plan,
) -> Result<Planned, BindError> {
    let host = session.ops().root().clone();
    let (inv, facts) = view(&host, scope, need)?;
    let plan = make(&inv, &facts, session.replay());
    if !plan.blocking(false).is_empty() {
        return Err(BindError::Refused(plan.refusal_text(false)));
    }
    check_unfinished(&session.replay().open, &plan)?;
    Ok(Planned { plan, inv })
}

/// `gpupass bind`'s plan of `req`, under `session`'s lock (see [`Planned`]).
#[cfg(feature = "dra")]
pub(crate) fn plan_bind_in(session: &Session<'_>, req: &BindRequest) -> Result<Planned, BindError> {
    let scope = Scope::Groups {
        addrs: &req.addresses,
        groups: &[],
    };
    plan_in(session, scope, facts::Need::BIND, |inv, facts, _| {
        plan_bind(inv, facts, req)
    })
}

/// `gpupass unbind`'s plan of `req` (the drivers the journal recorded), under `session`'s
/// lock (see [`Planned`]).
#[cfg(feature = "dra")]
pub(crate) fn plan_unbind_in(session: &Session<'_>, req: &UnbindRequest) -> Result<Planned, BindError> {
    let group = req.group.map(|g| vec![g]).unwrap_or_default();
    let scope = if req.all {
        Scope::All
    } else {
        Scope::Groups {
            addrs: &req.addresses,
            groups: &group,
        }
    };
    plan_in(session, scope, facts::Need::UNBIND, |inv, facts, replay| {
        plan_unbind(inv, facts, &replay.bound, req)
    })
}

/// The last steps of every bind and unbind before the engine, one copy for `gpupass
/// bind`/`unbind` and the DRA plugin's claims: the test kit's before-apply window, the
/// re-check of the groups against the host now ([`recheck`]), and the plan as the engine's
/// part.
pub(crate) fn to_part(ops: &dyn HostOps, inv: &Inventory, plan: &Plan) -> Result<Part, BindError> {
    ops.before_apply();
    recheck(ops.root(), inv, plan)?;
    tracing::debug!(faults = crate::minor_faults(), "rechecked");
    Ok(plan.to_part())
}

/// A bind or unbind as a part of a caller's plan (the DRA plugin's claims): planned under
/// `session`'s lock ([`Planned`]), then [`to_part`].
#[cfg(feature = "dra")]
#[derive(Debug)]
pub(crate) struct BindPart {
    pub part: Part,
    /// The functions whose driver it moves, each with the driver it is on now (as planned
    /// under the lock: what the caller records as the function's driver before).
    pub moved: std::collections::BTreeMap<PciAddress, Option<String>>,
}

#[cfg(feature = "dra")]
fn part_of(session: &Session<'_>, planned: Planned) -> Result<BindPart, BindError> {
    let part = to_part(session.ops(), &planned.inv, &planned.plan)?;
    Ok(BindPart {
        part,
        moved: planned
            .plan
            .functions
            .iter()
            .map(|f| (f.address, f.before.driver.clone()))
            .collect(),
    })
}

/// [`plan_bind_in`] as a part of a caller's plan ([`BindPart`]).
#[cfg(feature = "dra")]
pub(crate) fn bind_part_in(session: &Session<'_>, req: &BindRequest) -> Result<BindPart, BindError> {
    part_of(session, plan_bind_in(session, req)?)
}

/// [`plan_unbind_in`] as a part of a caller's plan ([`BindPart`]).
#[cfg(feature = "dra")]
pub(crate) fn unbind_part_in(session: &Session<'_>, req: &UnbindRequest) -> Result<BindPart, BindError> {
    part_of(session, plan_unbind_in(session, req)?)
}

/// Result of a bind/unbind command.
#[derive(Debug)]
pub(crate) struct Applied {
    pub plan: Plan,
    /// `None` for a dry run or when there was nothing to do.
    pub outcome: Option<Outcome>,
    pub warnings: Vec<String>,
}

#[allow(clippy::too_many_arguments)]
fn change(
    ops: &dyn HostOps,
    scope: Scope,
    need: facts::Need,
    dry_run: bool,
    force: bool,
    announce: &dyn Fn(&Plan),
    follow: &mut dyn Followup,
    make: impl Fn(&Inventory, &HostFacts, &Replay) -> Plan,
) -> Result<Applied, BindError> {
    let host = ops.root().clone();
    // A dry run takes no lock: it reads the journal as it is and changes nothing.
    let mut session = if dry_run {
        None
    } else {
        Some(Session::lock(ops, crate::change::journal::lock_timeout())?)
    };
    let replay = match &session {
        Some(s) => s.replay().clone(),
        None => crate::change::journal::read(&host)?,
    };
    let (inv, facts) = view(&host, scope, need)?;
    let mut plan = make(&inv, &facts, &replay);
    tracing::debug!(
        functions = plan.functions.len(),
        refusals = plan.refusals.len(),
        faults = crate::minor_faults(),
        "planned"
    );
    if force {
        for r in plan.refusals.iter().filter(|r| r.forceable) {
            plan.warnings
                .push(format!("--force: {}: {}", r.address, r.reason));
        }
    }
    let warnings = facts.warnings.clone();
    if !plan.blocking(force).is_empty() {
        if dry_run {
            return Ok(Applied {
                plan,
                outcome: None,
                warnings,
            });
        }
        return Err(BindError::Refused(plan.refusal_text(force)));
    }
    check_unfinished(&replay.open, &plan).or_else(|e| if dry_run { Ok(()) } else { Err(e) })?;
    let Some(session) = session.as_mut().filter(|_| !plan.functions.is_empty()) else {
        return Ok(Applied {
            plan,
            outcome: None,
            warnings,
        });
    };
    announce(&plan);
    let part = to_part(ops, &inv, &plan)?;
    let done = session
        .apply(&crate::change::Plan::of(part))
        .map_err(|e| match e {
            ChangeError::Unfinished { open, .. } => BindError::Unfinished {
                group: plan.groups.first().copied().unwrap_or(0),
                txn: open.txn.clone(),
                action: open.domain.clone(),
                at: open.at,
                total: open.writes,
            },
            e => e.into(),
        })?;
    tracing::debug!(faults = crate::minor_faults(), "applied and verified");
    let mut outcome = Outcome {
        lines: done.lines,
        changed: Vec::new(),
        verified_viable: done.verified_viable,
        viability: Vec::new(),
    };
    for f in &plan.functions {
        outcome.lines.push(format!(
            "{}: {} -> {}",
            f.address,
            f.before.driver.as_deref().unwrap_or("no driver"),
            current_driver(&host, &f.address).unwrap_or_else(|| "no driver".into())
        ));
        outcome.changed.push(f.address);
    }
    let changed: Vec<String> = outcome.changed.iter().map(|a| a.to_string()).collect();
    follow.follow(session, &changed.join(" "));
    let groups = if plan.action == crate::change::Action::Bind {
        &plan.groups[..]
    } else {
        &[]
    };
    for &g in groups {
        let b = if outcome.verified_viable.contains(&g) {
            Vec::new()
        } else {
            group_blockers(&host, g)
        };
        outcome.viability.push((g, b));
    }
    Ok(Applied {
        plan,
        outcome: Some(outcome),
        warnings,
    })
}

/// `gpupass bind`; `announce` sees the plan after the refusals passed and before any change.
#[cfg(test)]
pub(crate) fn bind(
    ops: &dyn HostOps,
    req: &BindRequest,
    force: bool,
    dry_run: bool,
    announce: &dyn Fn(&Plan),
) -> Result<Applied, BindError> {
    bind_then(ops, req, force, dry_run, announce, &mut ())
}

/// [`bind`], then `follow` in the same session once the bind committed (the command: the
/// CDI specs refreshed before the lock is released).
pub(crate) fn bind_then(
    ops: &dyn HostOps,
    req: &BindRequest,
    force: bool,
    dry_run: bool,
    announce: &dyn Fn(&Plan),
    follow: &mut dyn Followup,
) -> Result<Applied, BindError> {
    let scope = Scope::Groups {
        addrs: &req.addresses,
        groups: &[],
    };
    change(
        ops,
        scope,
        facts::Need::BIND,
        dry_run,
        force,
        announce,
        follow,
        |inv, facts, replay| held_refusals(plan_bind(inv, facts, req), replay, "binding"),
    )
}

/// The host CLI's plan with a refusal for each function a live claim holds (one owner per
/// group): never a DRA claim's own plan, which the claim's prepare checks itself.
fn held_refusals(mut plan: Plan, replay: &Replay, action: &str) -> Plan {
    for f in &plan.functions {
        let key = f.address.to_string();
        if let Some((_, h)) = replay.holders_against(None, &[key], &[]).into_iter().next() {
            plan.refusals
                .push(Refusal::held_by_claim(f.address, &h.label, action));
        }
    }
    plan
}

/// `gpupass unbind`, then `follow` in the same session once the unbind committed.
pub(crate) fn unbind_then(
    ops: &dyn HostOps,
    req: &UnbindRequest,
    force: bool,
    dry_run: bool,
    announce: &dyn Fn(&Plan),
    follow: &mut dyn Followup,
) -> Result<Applied, BindError> {
    let group = req.group.map(|g| vec![g]).unwrap_or_default();
    let scope = if req.all {
        Scope::All
    } else {
        Scope::Groups {
            addrs: &req.addresses,
            groups: &group,
        }
    };
    change(
        ops,
        scope,
        facts::Need::UNBIND,
        dry_run,
        force,
        announce,
        follow,
        |inv, facts, replay| held_refusals(plan_unbind(inv, facts, &replay.bound, req), replay, "unbinding"),
    )
}

/// `gpupass unbind`.
#[cfg(test)]
pub(crate) fn unbind(
    ops: &dyn HostOps,
    req: &UnbindRequest,
    force: bool,
    dry_run: bool,
    announce: &dyn Fn(&Plan),
) -> Result<Applied, BindError> {
    unbind_then(ops, req, force, dry_run, announce, &mut ())
}
