//! `gpupass bind` / `unbind` / `recover` / `persist`: moving PCI functions between their host
//! drivers and VFIO.
//!
//! The flow is inventory → plan → apply:
//! - [`checks`] reads the facts the inventory does not hold (mounts, network interfaces, open
//!   DRM and VFIO nodes, framebuffers and consoles, loaded drivers, VFIO variant aliases);
//! - [`plan_bind`] / [`plan_unbind`] are pure functions of the [`Inventory`], those facts and
//!   the request: they return a [`Plan`], an ordered list of sysfs writes and checks plus the
//!   refusals. `--dry-run` prints exactly this plan;
//! - [`apply`] takes the one lock, plans under it, re-checks the groups and hands the plan
//!   ([`Plan::to_change`]) to the one change engine ([`crate::change`]), which journals every
//!   write before making it, verifies the result (the kernel's `drivers_probe` reports success
//!   even when nothing bound) and rolls back on failure.
//!
//! Kernel facts encoded here:
//! - Binding one function: write the driver name to `driver_override`, write the address to
//!   the current driver's `unbind`, write it to `sys/bus/pci/drivers_probe`, then check the
//!   `driver` link. Never `new_id`: it registers a vendor:device pair for *every* device with
//!   those IDs.
//! - Clearing `driver_override` needs a non-empty write: a newline (`"\n"`); a zero-byte write
//!   may be ignored and a stale override keeps the native driver from binding.
//! - A group is viable for VFIO only when every member is driverless, on a VFIO driver or
//!   `pci-stub`, or a bridge. So gpupass binds every endpoint function of the group.
//! - VFIO variant drivers (`mlx5_vfio_pci`, `nvgrace_gpu_vfio_pci`...) carry `vfio_pci:`
//!   aliases in `modules.alias`; they bind only through `driver_override`.

pub mod apply;
pub mod facts;
pub mod persist;

pub use crate::change::{Action, BoundState, DriverState, Expect, FuncPlan, Step};
use crate::change::{Object, Part, Role};

use crate::model::{driver_allows_vfio, is_vfio_driver, Inventory, PciAddress, PciDevice};
use facts::{HostFacts, Use};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// Errors of bind, unbind, recover and persist.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BindError {
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
    /// The lock, the journal, a failed step (rolled back) or recover (the change engine).
    #[error(transparent)]
    Change(#[from] crate::change::ChangeError),
    #[error("group {group} has an unfinished gpupass plan (txn {txn}, {action}, stopped at write {at} of {total}); run `gpupass recover` to restore it (or `gpupass recover --continue` to finish it) first")]
    Unfinished {
        group: u32,
        txn: String,
        action: String,
        at: usize,
        total: usize,
    },
    #[error("IOMMU group {group} changed after the plan was made ({change}); nothing was changed: rerun the command to plan with the group as it is now")]
    GroupChanged { group: u32, change: String },
    #[error("output")]
    Output(#[from] std::io::Error),
}

/// Why gpupass will not do what was asked, and the way out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub address: PciAddress,
    pub reason: String,
    pub fix: String,
    /// `--force` overrides it.
    pub forceable: bool,
}

impl Refusal {
    /// A refusal `--force` does not override.
    pub(crate) fn hard(address: PciAddress, reason: impl Into<String>, fix: impl Into<String>) -> Self {
        Refusal {
            address,
            reason: reason.into(),
            fix: fix.into(),
            forceable: false,
        }
    }

    /// A refusal `--force` overrides (the device is in use by the host).
    pub(crate) fn forceable(address: PciAddress, reason: impl Into<String>, fix: impl Into<String>) -> Self {
        Refusal {
            forceable: true,
            ..Refusal::hard(address, reason, fix)
        }
    }

    /// The address names no device in the inventory (bind, unbind, persist).
    pub(crate) fn no_such_device(address: PciAddress) -> Self {
        Refusal::hard(
            address,
            "no such PCI device on this host",
            "`gpupass list --all` shows the devices there are",
        )
    }

    /// A function a live DRA claim holds (the journal's holds, [`crate::change::Holds`]):
    /// the host does not take it from under the claim's Pod unless forced.
    pub(crate) fn held_by_claim(address: PciAddress, holder: &str, action: &str) -> Self {
        Refusal::forceable(
            address,
            format!("is held by {holder}, which a Pod is using; {action} it would take it from under that Pod"),
            "delete that claim's Pod (the kubelet then unprepares it and gives the group back), or pass --force if the claim is gone (a plugin removed while it was prepared)",
        )
    }

    /// Bind (and persist) of a bridge: VFIO assigns endpoints.
    pub(crate) fn bridge_bind(address: PciAddress) -> Self {
        Refusal::hard(
            address,
            "is a PCI bridge; VFIO assigns endpoint devices and bridges never block a group",
            "bind the device behind it (`gpupass groups` lists the group's endpoints)",
        )
    }

    /// Unbind of a bridge: gpupass never bound it.
    pub(crate) fn bridge_unbind(address: PciAddress) -> Self {
        Refusal::hard(
            address,
            "is a PCI bridge; gpupass never binds bridges",
            "name the device behind it",
        )
    }

    /// The device has no IOMMU group, so VFIO cannot isolate it.
    pub(crate) fn no_iommu_group(address: PciAddress) -> Self {
        Refusal::hard(
            address,
            "has no IOMMU group: the IOMMU is off or unsupported, so VFIO cannot isolate it",
            "enable the IOMMU (intel_iommu=on or amd_iommu=on on the kernel command line; see `gpupass check`)",
        )
    }
}

/// The whole change: functions, ordered steps, refusals, and what the user should know first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Plan {
    pub action: Action,
    pub groups: Vec<u32>,
    pub functions: Vec<FuncPlan>,
    pub steps: Vec<Step>,
    pub refusals: Vec<Refusal>,
    /// Said before anything is done (`--only` viability, forced refusals, persisted overrides).
    pub warnings: Vec<String>,
    /// Informational (already on vfio-pci, nothing to do).
    pub notes: Vec<String>,
}

impl Plan {
    fn new(action: Action) -> Self {
        Plan {
            action,
            groups: Vec::new(),
            functions: Vec::new(),
            steps: Vec::new(),
            refusals: Vec::new(),
            warnings: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// `bind of IOMMU group 1, 2`: the journal's `what`, and the warnings' words.
    pub(crate) fn describe(&self) -> String {
        let groups: Vec<String> = self.groups.iter().map(|g| g.to_string()).collect();
        format!("{} of IOMMU group {}", self.action, groups.join(", "))
    }

    /// The plan as the change engine applies it: one part (domain `bind` or `unbind`) whose
    /// objects are the functions with their driver before and after, and the same steps.
    pub(crate) fn to_part(&self) -> Part {
        let mut p = Part::new(self.action.to_string(), self.describe());
        p.objects = self
            .functions
            .iter()
            .map(|f| Object::function(self.action, f))
            .collect();
        p.steps = self.steps.clone();
        p
    }

    /// Refusals that block the plan, given `--force`.
    pub(crate) fn blocking(&self, force: bool) -> Vec<&Refusal> {
        self.refusals.iter().filter(|r| !(force && r.forceable)).collect()
    }

    /// The refusal message: every reason with its way out.
    pub(crate) fn refusal_text(&self, force: bool) -> String {
        let b = self.blocking(force);
        let mut s = format!(
            "refusing to {} ({} problem{}):",
            self.action,
            b.len(),
            plural(b.len())
        );
        for r in b {
            let _ = write!(s, "\n  {}: {}\n    fix: {}", r.address, r.reason, r.fix);
            if r.forceable {
                s.push_str(" (or --force)");
            }
        }
        s
    }

    /// The plan as `--dry-run` prints it.
    pub(crate) fn render(&self) -> String {
        let mut s = String::new();
        for w in &self.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        for n in &self.notes {
            let _ = writeln!(s, "{n}");
        }
        if self.functions.is_empty() {
            let _ = writeln!(s, "nothing to {}", self.action);
            return s;
        }
        let groups: Vec<String> = self.groups.iter().map(|g| g.to_string()).collect();
        let _ = writeln!(
            s,
            "plan: {} {} function{} (IOMMU group{} {})",
            self.action,
            self.functions.len(),
            plural(self.functions.len()),
            plural(self.groups.len()),
            groups.join(", ")
        );
        for f in &self.functions {
            let _ = writeln!(
                s,
                "  {}  {} -> {}",
                f.address,
                f.before.driver.as_deref().unwrap_or("(no driver)"),
                f.after.driver.as_deref().unwrap_or("(no driver)")
            );
        }
        let _ = writeln!(s, "steps:");
        for (i, st) in self.steps.iter().enumerate() {
            let _ = writeln!(s, "  {:>2}. {}", i + 1, st.render());
        }
        s
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `gpupass bind` as the planner sees it.
#[derive(Debug, Clone, Default)]
pub(crate) struct BindRequest {
    pub addresses: Vec<PciAddress>,
    pub only: bool,
    pub driver: Option<String>,
}

/// `gpupass unbind` as the planner sees it.
#[derive(Debug, Clone, Default)]
pub(crate) struct UnbindRequest {
    pub addresses: Vec<PciAddress>,
    pub group: Option<u32>,
    pub all: bool,
    pub only: bool,
}

/// A driver name a user may give: letters, digits, `_` and `-` (it becomes a sysfs path).
pub(crate) fn valid_driver_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The module to `modprobe` for a driver name: `vfio-pci` is module `vfio_pci`; variants
/// register their module name as the driver name.
pub(crate) fn module_for_driver(driver: &str, facts: &HostFacts) -> String {
    if let Some(m) = facts.driver_modules.get(driver) {
        return m.clone();
    }
    driver.replace('-', "_")
}

/// The kernel's way to move one function to another driver, as plan steps: write
/// `driver_override`, unbind it from `from` (when it has a driver), ask `drivers_probe` to bind
/// it, then check the `driver` link (the probe reports success even when nothing binds).
fn push_move(
    body: &mut Vec<Step>,
    a: &PciAddress,
    override_value: String,
    from: Option<&str>,
    expect: Expect,
) {
    let role = || Role::Driver { address: *a };
    body.push(Step::Write {
        path: override_path(a),
        value: override_value,
        role: role(),
    });
    if let Some(cur) = from {
        body.push(Step::Write {
            path: unbind_path(cur),
            value: a.to_string(),
            role: role(),
        });
    }
    body.push(Step::Write {
        path: PROBE_PATH.into(),
        value: a.to_string(),
        role: role(),
    });
    body.push(Step::CheckDriver {
        address: *a,
        path: driver_link_path(a),
        expect,
    });
}

use crate::host::logical::{driver_link_path, override_path, unbind_path, DRIVERS_PROBE as PROBE_PATH};

/// The VFIO driver gpupass would pick for a device: `--driver`, else the best VFIO variant
/// alias, else `vfio-pci`.
pub(crate) fn target_driver(dev: &PciDevice, req_driver: Option<&str>, facts: &HostFacts) -> String {
    if let Some(d) = req_driver {
        return d.to_string();
    }
    facts
        .variants
        .get(&dev.address)
        .cloned()
        .unwrap_or_else(|| "vfio-pci".to_string())
}

fn dev_label(d: &PciDevice) -> String {
    format!(
        "{} ({}, {})",
        d.address,
        d.driver.as_deref().unwrap_or("no driver"),
        d.display_name()
    )
}

/// Which functions a bind (or persist) of `req` covers, with the refusals about the selection
/// itself (missing address, bridge, no group, a group mixing unrelated devices). Shared by bind
/// and persist.
pub(crate) fn select_functions(inv: &Inventory, req: &BindRequest, plan: &mut Plan) -> Vec<PciAddress> {
    let mut set: BTreeSet<PciAddress> = BTreeSet::new();
    let named: BTreeSet<PciAddress> = req.addresses.iter().copied().collect();
    let mut groups: BTreeSet<u32> = BTreeSet::new();
    for a in &req.addresses {
        let Some(d) = inv.device(a) else {
            plan.refusals.push(Refusal::no_such_device(*a));
            continue;
        };
        if d.is_bridge {
            plan.refusals.push(Refusal::bridge_bind(*a));
            continue;
        }
        let Some(g) = d.iommu_group else {
            plan.refusals.push(Refusal::no_iommu_group(*a));
            continue;
        };
        set.insert(*a);
        groups.insert(g);
        if req.only {
            continue;
        }
        let Some(group) = inv.group(g) else { continue };
        for m in &group.members {
            let Some(md) = inv.device(m) else { continue };
            if md.is_bridge || set.contains(m) {
                continue;
            }
            let related = named.iter().any(|n| n.same_slot(m)) || named.contains(m);
            if !related {
                plan.refusals.push(Refusal::hard(
                    *a,
                    format!(
                        "IOMMU group {g} also holds {}, which is not a function of the named device; \
                         binding the group would take it from the host too",
                        dev_label(md)
                    ),
                    format!(
                        "name it as well to move both (gpupass bind {a} {m}), or bind only {a} with --only \
                         (the group then stays unusable for a VM), or move the card to a slot whose \
                         upstream port has ACS so it gets its own group"
                    ),
                ));
                continue;
            }
            set.insert(*m);
        }
    }
    plan.groups = groups.into_iter().collect();
    set.into_iter().collect()
}

/// Order of binding: per group, companions (higher function numbers: audio, USB-C) first and
/// function 0 (the display function) last; unbinding runs the reverse, so the GPU's driver is
/// back before the audio driver that may look for it.
fn bind_order(inv: &Inventory, funcs: &mut [PciAddress]) {
    funcs.sort_by_key(|a| {
        let g = inv.device(a).and_then(|d| d.iommu_group).unwrap_or(u32::MAX);
        (g, a.domain, a.bus, a.device, std::cmp::Reverse(a.function))
    });
}

fn use_refusal(addr: PciAddress, dev: &PciDevice, u: &Use) -> Option<Refusal> {
    let (reason, fix) = match u {
        Use::Mount {
            block,
            mountpoint,
            fstype,
        } => (
            format!("backs the mounted filesystem {mountpoint} ({fstype} on /dev/{block})"),
            format!("unmount {mountpoint} first; the host would lose it"),
        ),
        Use::Swap { block } => (
            format!("backs active swap on /dev/{block}"),
            format!("swapoff /dev/{block} first"),
        ),
        Use::NetUp { iface } => (
            format!("network interface {iface} is up on it"),
            format!("bring it down first (ip link set {iface} down); check you are not connected through it"),
        ),
        Use::DrmOpen { node, pid, comm } => (
            format!("/dev/dri/{node} is open by pid {pid} ({comm})"),
            format!("stop {comm} (pid {pid}) or log out of the graphical session on this GPU"),
        ),
        Use::NvidiaOpen { node, pid, comm } => (
            format!("/dev/{node} is open by pid {pid} ({comm}): it is using this GPU through NVIDIA's driver"),
            format!("stop {comm} (pid {pid}) first (`nvidia-smi` lists the GPU's processes); unbinding under it can hang or kill it"),
        ),
        Use::Framebuffer { fb, console } => {
            if dev.boot_vga != Some(true) {
                return None;
            }
            let con = match console {
                Some(v) => format!(" and the framebuffer console ({v}) is bound to it"),
                None => String::new(),
            };
            (
                format!("is the boot VGA device with framebuffer {fb} on it{con}; binding it takes the host console away"),
                "use a serial or network console, or unbind the framebuffer console first \
                 (echo 0 > /sys/class/vtconsole/vtconN/bind) and stop the display manager"
                    .to_string(),
            )
        }
    };
    Some(Refusal::forceable(addr, reason, fix))
}

/// What holds one of `members` on the host now, as the bind's in-use refusal says it (a DRM or
/// NVIDIA node open, a mount, swap, an interface up, the boot framebuffer), or `None` when
/// nothing does: the check a bind runs, alone. Reads only the users of the functions (no
/// variant drivers, no VFIO holders). The DRA driver's busy devices are rechecked with it.
#[cfg(feature = "dra")]
pub(crate) fn in_use(
    host: &crate::host::HostRoot,
    inv: &Inventory,
    members: &[PciAddress],
) -> Option<String> {
    let need = facts::Need {
        uses: true,
        vfio_open: false,
        variants: false,
    };
    let f = facts::gather_for(host, inv, need);
    members.iter().find_map(|a| {
        let d = inv.device(a)?;
        f.uses_of(a)
            .iter()
            .find_map(|u| use_refusal(*a, d, u))
            .map(|r| format!("{a} {}", r.reason))
    })
}

/// Plan `gpupass bind`: pure over the inventory, the host facts and the request.
pub(crate) fn plan_bind(inv: &Inventory, facts: &HostFacts, req: &BindRequest) -> Plan {
    let mut plan = Plan::new(Action::Bind);
    if let Some(d) = &req.driver {
        if !driver_allows_vfio(Some(d)) {
            if let Some(a) = req.addresses.first() {
                plan.refusals.push(Refusal::hard(
                    *a,
                    format!("--driver {d} is not a VFIO driver or pci-stub, so the group would not be usable by VFIO"),
                    "use --driver vfio-pci or a VFIO variant driver (name ending in _vfio_pci)",
                ));
            }
        }
    }
    let mut funcs = select_functions(inv, req, &mut plan);
    bind_order(inv, &mut funcs);

    // --only: say up front which members will keep the group from being viable.
    if req.only {
        for g in &plan.groups {
            let Some(group) = inv.group(*g) else { continue };
            let blockers: Vec<String> = group
                .members
                .iter()
                .filter(|m| !funcs.contains(m))
                .filter_map(|m| inv.device(m))
                .filter(|d| !d.is_bridge && !driver_allows_vfio(d.driver.as_deref()))
                .map(dev_label)
                .collect();
            if !blockers.is_empty() {
                plan.warnings.push(format!(
                    "--only: IOMMU group {g} will not be viable (VFIO cannot open it for a VM) while {} \
                     stay{} on the host; bind {} too, or drop --only",
                    blockers.join(", "),
                    if blockers.len() == 1 { "s" } else { "" },
                    if blockers.len() == 1 { "it" } else { "them" },
                ));
            }
        }
    }

    let mut loads: Vec<String> = Vec::new();
    let mut body: Vec<Step> = Vec::new();
    let mut checks: Vec<Step> = Vec::new();
    let mut vfio_groups: BTreeSet<u32> = BTreeSet::new();
    for a in &funcs {
        let Some(d) = inv.device(a) else { continue };
        for u in facts.uses_of(a) {
            if let Some(r) = use_refusal(*a, d, u) {
                plan.refusals.push(r);
            }
        }
        let target = target_driver(d, req.driver.as_deref(), facts);
        if let Some(cur) = &d.driver {
            if cur == &target || (is_vfio_driver(cur) && req.driver.is_none()) {
                plan.notes.push(format!("{a} is already on {cur}, nothing to do"));
                if let Some(g) = d.iommu_group {
                    vfio_groups.insert(g);
                }
                continue;
            }
        }
        if target != "vfio-pci" && req.driver.is_none() {
            plan.notes.push(format!(
                "{a}: the kernel offers the VFIO variant driver {target} for it (modules.alias); --driver vfio-pci overrides"
            ));
        }
        if !facts.loaded_drivers.contains(&target) {
            let m = module_for_driver(&target, facts);
            if !loads.contains(&m) {
                loads.push(m);
            }
        }
        let before = DriverState {
            driver: d.driver.clone(),
            module: d.driver.as_ref().map(|x| module_for_driver(x, facts)),
            driver_override: d.driver_override.clone(),
        };
        let after = DriverState {
            driver: Some(target.clone()),
            module: Some(module_for_driver(&target, facts)),
            driver_override: Some(target.clone()),
        };
        push_move(
            &mut body,
            a,
            target.clone(),
            d.driver.as_deref(),
            Expect::Driver {
                driver: target.clone(),
            },
        );
        if let Some(g) = d.iommu_group {
            if is_vfio_driver(&target) {
                vfio_groups.insert(g);
            }
        }
        plan.functions.push(FuncPlan {
            address: *a,
            group: d.iommu_group,
            before,
            after,
        });
        if let Some(p) = &d.persistent_driver {
            if p != &target {
                plan.warnings.push(format!(
                    "{a} has a driverctl override to {p} (/etc/driverctl.d/pci-{a}); it will be back on {p} after a reboot"
                ));
            }
        }
    }
    if plan.functions.is_empty() {
        return plan;
    }
    for g in &vfio_groups {
        checks.push(Step::CheckNode {
            group: *g,
            path: format!("/dev/vfio/{g}"),
        });
        if !req.only {
            checks.push(Step::CheckViable { group: *g });
        }
    }
    plan.steps = loads
        .into_iter()
        .map(|module| Step::LoadModule { module })
        .chain(body)
        .chain(checks)
        .collect();
    plan
}

/// Plan `gpupass unbind`: give functions on a VFIO driver back to the driver they had before
/// gpupass bound them (from `bound`), or reprobe them when gpupass did not bind them.
pub(crate) fn plan_unbind(
    inv: &Inventory,
    facts: &HostFacts,
    bound: &BoundState,
    req: &UnbindRequest,
) -> Plan {
    let mut plan = Plan::new(Action::Unbind);
    let mut set: BTreeSet<PciAddress> = BTreeSet::new();
    let add_group = |g: u32, set: &mut BTreeSet<PciAddress>| {
        if let Some(group) = inv.group(g) {
            for m in &group.members {
                if inv.device(m).is_some_and(|d| !d.is_bridge) {
                    set.insert(*m);
                }
            }
        }
    };
    for a in &req.addresses {
        let Some(d) = inv.device(a) else {
            plan.refusals.push(Refusal::no_such_device(*a));
            continue;
        };
        if d.is_bridge {
            plan.refusals.push(Refusal::bridge_unbind(*a));
            continue;
        }
        match (req.only, d.iommu_group) {
            (false, Some(g)) => add_group(g, &mut set),
            _ => {
                set.insert(*a);
            }
        }
    }
    if let Some(g) = req.group {
        if inv.group(g).is_none() {
            plan.notes
                .push(format!("there is no IOMMU group {g} on this host"));
        }
        add_group(g, &mut set);
    }
    if req.all {
        set.extend(bound.keys().filter(|a| inv.device(a).is_some()));
        if bound.is_empty() {
            plan.notes.push(
                "the journal holds no function bound by gpupass; name an address or --group N to unbind others"
                    .into(),
            );
        }
    }
    let mut funcs: Vec<PciAddress> = set.into_iter().collect();
    bind_order(inv, &mut funcs);
    funcs.reverse();

    let mut loads: Vec<String> = Vec::new();
    let mut body = Vec::new();
    let mut groups = BTreeSet::new();
    for a in &funcs {
        let Some(d) = inv.device(a) else { continue };
        let Some(cur) = d.driver.clone().filter(|c| is_vfio_driver(c)) else {
            if req.addresses.contains(a) || req.only {
                plan.notes.push(format!(
                    "{a} is not on a VFIO driver ({}), nothing to do",
                    d.driver.as_deref().unwrap_or("no driver")
                ));
            }
            continue;
        };
        if let Some(g) = d.iommu_group {
            groups.insert(g);
            if let Some(users) = facts.vfio_open.get(&g) {
                for (pid, comm) in users {
                    plan.refusals.push(Refusal::hard(
                        *a,
                        format!(
                            "IOMMU group {g} is open by pid {pid} ({comm}) through /dev/vfio/{g}; \
                             the kernel would block the unbind until it lets go"
                        ),
                        format!("stop the VM or container using it (pid {pid}) first"),
                    ));
                }
            }
        }
        let orig = bound.get(a).cloned();
        let (after, expect) = match &orig {
            Some(o) => {
                let exp = match &o.driver {
                    Some(drv) => Expect::Driver { driver: drv.clone() },
                    None => Expect::NotVfio,
                };
                (o.clone(), exp)
            }
            None => {
                plan.notes.push(format!(
                    "{a} was not bound by gpupass (no journal entry); it will be reprobed and gpupass reports which driver claims it"
                ));
                (DriverState::default(), Expect::NotVfio)
            }
        };
        if let Some(drv) = &after.driver {
            if !facts.loaded_drivers.contains(drv) {
                let m = after
                    .module
                    .clone()
                    .unwrap_or_else(|| module_for_driver(drv, facts));
                if !loads.contains(&m) {
                    loads.push(m);
                }
            }
        }
        let override_value = match &after.driver_override {
            Some(o) if !is_vfio_driver(o) => o.clone(),
            _ => "\n".to_string(),
        };
        push_move(&mut body, a, override_value, Some(&cur), expect);
        if let Some(p) = &d.persistent_driver {
            if is_vfio_driver(p) {
                plan.warnings.push(format!(
                    "{a} is persisted to {p} with driverctl (/etc/driverctl.d/pci-{a}); it will be back on {p} after a reboot unless you run `gpupass persist --remove {a}`"
                ));
            }
        }
        plan.functions.push(FuncPlan {
            address: *a,
            group: d.iommu_group,
            before: DriverState {
                driver: Some(cur.clone()),
                module: Some(module_for_driver(&cur, facts)),
                driver_override: d.driver_override.clone(),
            },
            after: DriverState {
                driver: after.driver.clone(),
                module: after.module.clone(),
                driver_override: after.driver_override.clone().filter(|o| !is_vfio_driver(o)),
            },
        });
    }
    plan.groups = groups.into_iter().collect();
    plan.steps = loads
        .into_iter()
        .map(|module| Step::LoadModule { module })
        .chain(body)
        .collect();
    plan
}

#[cfg(test)]
mod tests;
