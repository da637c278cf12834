//! Executing plans: lock, journal, write, verify, roll back; and `recover`.
//!
//! Every command that changes drivers takes the lock *before* it reads the host, so the plan
//! is made from a view no other gpupass can change underneath it. Each sysfs write is
//! announced in the journal (and the journal synced) before it is made. Verification is not
//! optional: `drivers_probe` returns success even when no driver took the device.
//!
//! Rollback and recovery are state-based, not step-based: for each function the journal holds
//! the state before (driver, module, `driver_override`) and after. Restoring a function reads
//! what the kernel shows now and makes only the writes still needed, so it is correct whether
//! the process died before, during or after any given write, and running it twice is harmless.

use super::facts::{self, HostFacts};
use super::journal::{self, Journal, Record};
use super::{
    plan_bind, plan_unbind, Action, BindError, BindRequest, DriverState, Expect, FuncPlan, Plan, Step,
    UnbindRequest,
};
use crate::host::logical;
use crate::host::ops::HostOps;
use crate::host::{link_name, read_attr, HostRoot};
use crate::inventory;
use crate::messages;
use crate::model::{driver_allows_vfio, is_vfio_driver, ErrorChain, Inventory, PciAddress};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a check waits for the kernel (probe is synchronous through `drivers_probe`; this
/// is a grace period, not a polling design).
const VERIFY_WAIT: Duration = Duration::from_millis(500);

/// What an applied plan did, one line per function.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub lines: Vec<String>,
    pub changed: Vec<PciAddress>,
    /// Groups whose viability the plan verified (they had no blockers then).
    pub verified_viable: Vec<u32>,
}

fn current_driver(host: &HostRoot, a: &PciAddress) -> Option<String> {
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
pub fn group_blockers(host: &HostRoot, group: u32) -> Vec<String> {
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

/// Why a step of a plan, or a restore of one function, failed: [`BindError::Failed`]'s detail
/// (its chain, `outer: cause`).
#[derive(Debug, thiserror::Error)]
enum StepError {
    /// A check found the kernel not showing what the plan expects.
    #[error("{0}")]
    Check(String),
    #[error("write {value:?} > {}", .path.display())]
    Write {
        path: std::path::PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    /// The journal record announcing a write could not be written.
    #[error(transparent)]
    Journal(Box<BindError>),
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
    /// Restoring several functions: each one that failed, joined with "; ".
    #[error("{}", .0.iter().map(|e| ErrorChain(e).to_string()).collect::<Vec<_>>().join("; "))]
    Several(Vec<StepError>),
}

/// Run one check step; `Err` when the kernel does not show what the plan expects.
fn check(host: &HostRoot, step: &Step, out: &mut Outcome) -> Result<(), StepError> {
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
                Err(StepError::Check(format!(
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
                Some(d) if is_vfio_driver(&d) => Err(StepError::Check(format!(
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
            let p = host.path(path);
            let start = Instant::now();
            while !p.exists() {
                if start.elapsed() >= VERIFY_WAIT {
                    return Err(StepError::Check(format!(
                        "{path} did not appear for IOMMU group {group} (is the VFIO group driver loaded?)"
                    )));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(())
        }
        Step::CheckViable { group } => {
            let b = group_blockers(host, *group);
            if b.is_empty() {
                out.verified_viable.push(*group);
                Ok(())
            } else {
                Err(StepError::Check(format!(
                    "IOMMU group {group} is still not viable: {} on a host driver",
                    b.join(", ")
                )))
            }
        }
        _ => Ok(()),
    }
}

/// The writes a journaled change makes: through the host, announced first.
struct Writer<'a> {
    ops: &'a dyn HostOps,
    journal: Option<&'a mut Journal>,
    txn: String,
    n: usize,
    undo: bool,
}

impl Writer<'_> {
    fn write(&mut self, path: &str, value: &str) -> Result<(), StepError> {
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
            j.append(rec).map_err(|e| StepError::Journal(Box::new(e)))?;
        }
        let p = self.ops.root().path(path);
        self.ops.write(&p, value).map_err(|source| StepError::Write {
            path: path.into(),
            value: value.to_string(),
            source,
        })
    }
}

/// Bring one function to `target` (driver and override), making only the writes still needed.
/// Returns a line describing what happened.
fn restore_one(w: &mut Writer<'_>, a: &PciAddress, target: &DriverState) -> Result<String, StepError> {
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
                w.ops.load_module(&m).map_err(|source| StepError::LoadModule {
                    module: m.clone(),
                    driver: t.clone(),
                    source,
                })?;
            }
            w.write(logical::DRIVERS_PROBE, &a.to_string())?;
            let (ok, got) = wait_driver(&host, a, |d| d == Some(t.as_str()));
            if !ok {
                return Err(StepError::Check(format!(
                    "{a} is {} after reprobe, not {t}",
                    got.map(|g| format!("on {g}"))
                        .unwrap_or_else(|| "driverless".into())
                )));
            }
        }
    }
    Ok(format!("{a}: {} -> {}", name(&cur), name(&target.driver)))
}

/// Restore every function to the state `pick` chooses (before or after), in order.
fn restore_all(
    w: &mut Writer<'_>,
    funcs: &[FuncPlan],
    pick: impl Fn(&FuncPlan) -> &DriverState,
) -> Result<Vec<String>, StepError> {
    let mut lines = Vec::new();
    let mut errors = Vec::new();
    for f in funcs {
        match restore_one(w, &f.address, pick(f)) {
            Ok(l) => lines.push(l),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(lines)
    } else {
        Err(StepError::Several(errors))
    }
}

/// Execute a plan: journal `begin`, each write announced then made, checks, `commit`. On any
/// failure the functions are restored to their state before and the journal says
/// `rolled_back`; if even that fails the transaction stays open for `gpupass recover`.
pub fn execute(ops: &dyn HostOps, plan: &Plan, journal: &mut Journal) -> Result<Outcome, BindError> {
    let host = ops.root().clone();
    let (txn, time) = journal::new_txn();
    journal.append(Record::Begin {
        txn: txn.clone(),
        time,
        pid: std::process::id(),
        action: plan.action,
        groups: plan.groups.clone(),
        functions: plan.functions.clone(),
        writes: plan.write_count(),
    })?;
    let mut out = Outcome::default();
    let mut failure: Option<(String, StepError)> = None;
    {
        let mut w = Writer {
            ops,
            journal: Some(&mut *journal),
            txn: txn.clone(),
            n: 0,
            undo: false,
        };
        for (i, step) in plan.steps.iter().enumerate() {
            let what = format!("step {} ({})", i + 1, step.render());
            let r = match step {
                Step::LoadModule { module } => {
                    ops.load_module(module).map_err(|source| StepError::Modprobe {
                        module: module.clone(),
                        source,
                    })
                }
                Step::Write { path, value, .. } => w.write(path, value),
                _ => check(&host, step, &mut out),
            };
            if let Err(detail) = r {
                failure = Some((what, detail));
                break;
            }
        }
    }
    if let Some((what, e)) = failure {
        let detail = ErrorChain(&e).to_string();
        let mut w = Writer {
            ops,
            journal: Some(&mut *journal),
            txn: txn.clone(),
            n: 0,
            undo: true,
        };
        let mut rev = plan.functions.clone();
        rev.reverse();
        let rollback = match restore_all(&mut w, &rev, |f| &f.before) {
            Ok(lines) => {
                journal.append(Record::RolledBack {
                    txn: txn.clone(),
                    error: format!("{what}: {detail}"),
                })?;
                format!("rolled back, nothing changed: {}", lines.join(", "))
            }
            Err(e) => {
                format!(
                    "rollback failed too ({}); the journal keeps the plan open: run `gpupass recover`",
                    ErrorChain(&e)
                )
            }
        };
        return Err(BindError::Failed {
            what: format!("{} {what}", plan.action),
            detail,
            rollback,
        });
    }
    journal.append(Record::Commit { txn })?;
    for f in &plan.functions {
        out.lines.push(format!(
            "{}: {} -> {}",
            f.address,
            f.before.driver.as_deref().unwrap_or("no driver"),
            current_driver(&host, &f.address).unwrap_or_else(|| "no driver".into())
        ));
        out.changed.push(f.address);
    }
    Ok(out)
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

/// Refuse when an unfinished transaction touches one of the plan's groups.
fn check_unfinished(open: &[journal::OpenTxn], plan: &Plan) -> Result<(), BindError> {
    for t in open {
        let touched: Vec<u32> = t
            .functions
            .iter()
            .filter_map(|f| f.group)
            .chain(t.groups.iter().copied())
            .collect();
        let fn_overlap = t
            .functions
            .iter()
            .any(|f| plan.functions.iter().any(|p| p.address == f.address));
        if let Some(g) = plan.groups.iter().find(|g| touched.contains(g)) {
            return Err(BindError::Unfinished {
                group: *g,
                txn: t.txn.clone(),
                action: t.action.to_string(),
                at: t.at,
                total: t.writes,
            });
        }
        if fn_overlap {
            return Err(BindError::Unfinished {
                group: t.groups.first().copied().unwrap_or(0),
                txn: t.txn.clone(),
                action: t.action.to_string(),
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
pub fn recheck(host: &HostRoot, inv: &Inventory, plan: &Plan) -> Result<(), BindError> {
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

/// Result of a bind/unbind command.
#[derive(Debug)]
pub struct Applied {
    pub plan: Plan,
    /// `None` for a dry run or when there was nothing to do.
    pub outcome: Option<Outcome>,
    pub warnings: Vec<String>,
}

fn change(
    ops: &dyn HostOps,
    scope: Scope,
    need: facts::Need,
    dry_run: bool,
    force: bool,
    announce: &dyn Fn(&Plan),
    make: impl Fn(&Inventory, &HostFacts, &journal::Replay) -> Plan,
) -> Result<Applied, BindError> {
    let host = ops.root().clone();
    let _lock = if dry_run {
        None
    } else {
        Some(journal::lock(&host, journal::lock_timeout())?)
    };
    tracing::debug!(dry_run, faults = crate::minor_faults(), "lock held");
    let replay = journal::read(&host)?;
    tracing::debug!(
        open = replay.open.len(),
        faults = crate::minor_faults(),
        "journal read"
    );
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
    if dry_run || plan.functions.is_empty() {
        return Ok(Applied {
            plan,
            outcome: None,
            warnings,
        });
    }
    announce(&plan);
    ops.before_apply();
    recheck(&host, &inv, &plan)?;
    tracing::debug!(faults = crate::minor_faults(), "rechecked");
    let lock = _lock
        .as_ref()
        .ok_or_else(|| BindError::Refused("internal: no lock".into()))?;
    let mut j = Journal::open(&host, lock, &replay)?;
    let outcome = execute(ops, &plan, &mut j)?;
    tracing::debug!(faults = crate::minor_faults(), "applied and verified");
    Ok(Applied {
        plan,
        outcome: Some(outcome),
        warnings,
    })
}

/// `gpupass bind`; `announce` sees the plan after the refusals passed and before any change.
pub fn bind(
    ops: &dyn HostOps,
    req: &BindRequest,
    force: bool,
    dry_run: bool,
    announce: &dyn Fn(&Plan),
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
        |inv, facts, _| plan_bind(inv, facts, req),
    )
}

/// `gpupass unbind`.
pub fn unbind(
    ops: &dyn HostOps,
    req: &UnbindRequest,
    force: bool,
    dry_run: bool,
    announce: &dyn Fn(&Plan),
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
        |inv, facts, replay| plan_unbind(inv, facts, &replay.bound, req),
    )
}

/// What `recover` did: its report lines, and the functions whose driver it changed (none on a
/// dry run).
#[derive(Debug, Default)]
pub struct Recovered {
    pub lines: Vec<String>,
    pub changed: Vec<PciAddress>,
}

/// `gpupass recover`: restore (or with `cont`, complete) every unfinished transaction.
pub fn recover(ops: &dyn HostOps, cont: bool, dry_run: bool) -> Result<Recovered, BindError> {
    let host = ops.root().clone();
    let lock = journal::lock(&host, journal::lock_timeout())?;
    let replay = journal::read(&host)?;
    let mut lines = Vec::new();
    if replay.open.is_empty() {
        // The other domains' plans (mdev) are recovered by their own modules (the command
        // `gpupass recover` runs each); say "nothing" only when there are none either.
        if replay.open_changes.is_empty() {
            lines.push("nothing to recover: the journal has no unfinished plan".to_string());
        }
        return Ok(Recovered {
            lines,
            changed: Vec::new(),
        });
    }
    let mut j = if dry_run {
        None
    } else {
        Some(Journal::open(&host, &lock, &replay)?)
    };
    let mut changed = Vec::new();
    for t in replay.open.iter().rev() {
        let mut funcs = t.functions.clone();
        if !cont {
            funcs.reverse();
        }
        lines.push(format!(
            "{} the unfinished {}",
            if cont { "completing" } else { "restoring" },
            t.describe()
        ));
        if dry_run {
            for f in &funcs {
                let target = if cont { &f.after } else { &f.before };
                lines.push(format!(
                    "  {}: now {}, would go to {} (driver_override {})",
                    f.address,
                    current_driver(&host, &f.address).unwrap_or_else(|| "no driver".into()),
                    target.driver.as_deref().unwrap_or("no driver"),
                    target.driver_override.as_deref().unwrap_or("cleared")
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
        let r = restore_all(&mut w, &funcs, |f| if cont { &f.after } else { &f.before });
        match r {
            Ok(ls) => {
                lines.extend(ls.into_iter().map(|l| format!("  {l}")));
                if let Some(j) = j.as_mut() {
                    j.append(Record::Recovered {
                        txn: t.txn.clone(),
                        to: if cont { "after" } else { "before" }.into(),
                    })?;
                }
                changed.extend(funcs.iter().map(|f| f.address));
            }
            Err(e) => {
                return Err(BindError::Failed {
                    what: format!("recover of txn {}", t.txn),
                    detail: ErrorChain(&e).to_string(),
                    rollback:
                        "the plan stays open in the journal; fix the cause and run `gpupass recover` again"
                            .into(),
                })
            }
        }
    }
    if cont {
        for t in &replay.open {
            for g in &t.groups {
                if t.action == Action::Bind && !dry_run {
                    let b = group_blockers(&host, *g);
                    if !b.is_empty() {
                        lines.push(format!("note: IOMMU group {g} is not viable: {}", b.join(", ")));
                    }
                }
            }
        }
    }
    if dry_run {
        changed.clear();
    }
    Ok(Recovered { lines, changed })
}
