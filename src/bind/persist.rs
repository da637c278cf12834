//! `gpupass persist`: make a binding survive reboot, in driverctl's format.
//!
//! driverctl keeps one file per device, `/etc/driverctl.d/<bus>-<address>`, holding the driver
//! name (it writes it with `echo "$drv" >`, so with a trailing newline). Its udev rule runs
//! `driverctl load-override <dev>` when the device appears, which reads the file (`$(< file)`)
//! and binds through `driver_override`, so the override is in place from the moment of
//! discovery, before any native driver can take the device. gpupass writes those files for
//! every function its bind would move, and prints the two older, global mechanisms for users
//! who do not run driverctl: `vfio-pci.ids=` on the kernel command line (by vendor:device, so it
//! also takes every other device with the same IDs) and `softdep <native> pre: vfio-pci` in
//! modprobe.d, so vfio-pci is loaded before the native driver.

use super::facts::HostFacts;
use super::{select_functions, target_driver, Action, BindRequest, BoundState, Plan, Refusal};
use crate::change::{Part, Plan as Plan2};
use crate::host::HostRoot;
use crate::model::{is_vfio_driver, Inventory, PciAddress};
use serde::Serialize;
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// One driverctl file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct OverrideFile {
    pub address: PciAddress,
    /// As on the host: `/etc/driverctl.d/pci-0000:01:00.0`.
    pub path: String,
    pub driver: String,
}

/// What `persist` (or `persist --remove`) writes, removes and prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct PersistPlan {
    pub remove: bool,
    pub files: Vec<OverrideFile>,
    /// `vfio-pci.ids=vvvv:dddd,...` for the kernel command line, when vfio-pci is the driver.
    pub cmdline: Option<String>,
    /// modprobe.d lines: `softdep <native module> pre: vfio-pci`.
    pub softdeps: Vec<String>,
    pub refusals: Vec<Refusal>,
    pub warnings: Vec<String>,
}

/// The driverctl file of a function.
pub(crate) fn override_file(host: &HostRoot, a: &PciAddress) -> std::path::PathBuf {
    host.driverctl_dir().join(format!("pci-{a}"))
}

/// Plan `persist`: pure over the inventory, host facts and journal state.
pub(crate) fn plan_persist(
    inv: &Inventory,
    facts: &HostFacts,
    bound: &BoundState,
    req: &BindRequest,
    remove: bool,
) -> PersistPlan {
    let mut sel = Plan::new(Action::Bind);
    let funcs: Vec<PciAddress> = if remove {
        // Remove whatever overrides the selection's groups hold; no refusals about the group.
        let mut set = BTreeSet::new();
        for a in &req.addresses {
            let Some(d) = inv.device(a) else {
                sel.refusals.push(Refusal::no_such_device(*a));
                continue;
            };
            set.insert(*a);
            if let (false, Some(g)) = (req.only, d.iommu_group.and_then(|g| inv.group(g))) {
                set.extend(g.members.iter().copied());
            }
        }
        set.into_iter()
            .filter(|a| inv.device(a).is_some_and(|d| d.persistent_driver.is_some()))
            .collect()
    } else {
        select_functions(inv, req, &mut sel)
    };
    let mut p = PersistPlan {
        remove,
        files: Vec::new(),
        cmdline: None,
        softdeps: Vec::new(),
        refusals: sel.refusals,
        warnings: Vec::new(),
    };
    let mut ids: BTreeSet<String> = BTreeSet::new();
    let mut natives: BTreeSet<String> = BTreeSet::new();
    for a in &funcs {
        let Some(d) = inv.device(a) else { continue };
        let driver = if remove {
            d.persistent_driver.clone().unwrap_or_default()
        } else {
            target_driver(d, req.driver.as_deref(), facts)
        };
        if driver == "vfio-pci" {
            ids.insert(format!("{}:{}", d.vendor_id, d.device_id));
        }
        let native = match &d.driver {
            Some(cur) if !is_vfio_driver(cur) => Some(cur.clone()),
            _ => bound.get(a).and_then(|s| s.driver.clone()),
        };
        if let Some(n) = native.filter(|n| !is_vfio_driver(n)) {
            natives.insert(super::module_for_driver(&n, facts));
        }
        if let (false, Some(old)) = (remove, &d.persistent_driver) {
            if old != &driver {
                p.warnings.push(format!(
                    "{a}: replacing the driverctl override {old} with {driver}"
                ));
            }
        }
        p.files.push(OverrideFile {
            address: *a,
            path: format!("/etc/driverctl.d/pci-{a}"),
            driver,
        });
    }
    if !ids.is_empty() {
        let list: Vec<String> = ids.iter().cloned().collect();
        p.cmdline = Some(format!("vfio-pci.ids={}", list.join(",")));
        let others: Vec<String> = inv
            .devices
            .iter()
            .filter(|d| !funcs.contains(&d.address))
            .filter(|d| ids.contains(&format!("{}:{}", d.vendor_id, d.device_id)))
            .map(|d| d.address.to_string())
            .collect();
        if !others.is_empty() && !remove {
            p.warnings.push(format!(
                "vfio-pci.ids= matches by vendor:device, so it would also take {} (same IDs); \
                 use only the driverctl files for these",
                others.join(", ")
            ));
        }
    }
    p.softdeps = natives
        .into_iter()
        .map(|m| format!("softdep {m} pre: vfio-pci"))
        .collect();
    p
}

impl PersistPlan {
    pub(crate) fn render(&self, dry_run: bool) -> String {
        let mut s = String::new();
        for w in &self.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        let verb = match (self.remove, dry_run) {
            (false, false) => "wrote",
            (false, true) => "would write",
            (true, false) => "removed",
            (true, true) => "would remove",
        };
        if self.files.is_empty() {
            let _ = writeln!(
                s,
                "{}",
                if self.remove {
                    "no driverctl override to remove"
                } else {
                    "nothing to persist"
                }
            );
            return s;
        }
        for f in &self.files {
            let _ = writeln!(s, "{verb} {} ({})", f.path, f.driver);
        }
        if self.remove {
            let _ = writeln!(
                s,
                "The devices stay on their current driver until `gpupass unbind` or a reboot."
            );
            if let Some(c) = &self.cmdline {
                let _ = writeln!(
                    s,
                    "If you added them, also remove `{c}` from the kernel command line"
                );
            }
            for l in &self.softdeps {
                let _ = writeln!(s, "and the modprobe.d line `{l}`");
            }
            return s;
        }
        let _ = writeln!(
            s,
            "driverctl's udev rule applies these when the devices appear at boot (install the driverctl \
             package); `driverctl list-overrides` then shows them."
        );
        if let Some(c) = &self.cmdline {
            let _ = writeln!(
                s,
                "Without driverctl, add to the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub, then update-grub):\n  {c}"
            );
        }
        if !self.softdeps.is_empty() {
            let _ = writeln!(
                s,
                "and load vfio-pci before the native drivers (/etc/modprobe.d/gpupass-vfio.conf, then update-initramfs -u):"
            );
            for l in &self.softdeps {
                let _ = writeln!(s, "  {l}");
            }
        }
        s
    }
}

impl PersistPlan {
    /// The files as a plan for the change engine: one part (domain `persist`) that writes
    /// each driverctl file (`DRIVER\n`, as driverctl's `echo` leaves it) or removes it, each a
    /// file object with its content before and after, so the write is journaled and `gpupass
    /// recover` restores the files a crash left half-written. A file already as wanted adds
    /// no step.
    pub(crate) fn to_change(&self, host: &HostRoot) -> Plan2 {
        let what = format!(
            "persist{} of {}",
            if self.remove { " --remove" } else { "" },
            self.files
                .iter()
                .map(|f| f.address.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let mut part = Part::new("persist", what);
        for f in &self.files {
            let path = crate::change::logical(host, &override_file(host, &f.address));
            let after = (!self.remove).then(|| format!("{}\n", f.driver));
            part.file(host, &path, after, false);
        }
        Plan2::of(part)
    }
}

/// What `gpupass persist` planned and (unless a dry run) applied.
#[derive(Debug)]
pub(crate) struct Persisted {
    pub persist: PersistPlan,
    /// The file writes as the engine's plan.
    pub plan: Plan2,
}

/// `gpupass persist` (`remove`: `--remove`): under the one lock, the host read and the
/// driverctl files planned, refused with every reason and its fix, then applied through the
/// change engine (journaled; `recover` restores them after a crash). A dry run reads without
/// the lock and applies nothing.
pub(crate) fn persist(
    ops: &dyn crate::host::ops::HostOps,
    req: &BindRequest,
    remove: bool,
    dry_run: bool,
) -> Result<Persisted, super::BindError> {
    use crate::change::{journal, Session};
    let host = ops.root();
    let mut session = if dry_run {
        None
    } else {
        Some(Session::lock(ops, journal::lock_timeout())?)
    };
    let inv = crate::inventory::scan(host)?;
    let facts = super::facts::gather(host, &inv);
    let bound = match &session {
        Some(s) => s.replay().bound.clone(),
        None => journal::read(host)?.bound,
    };
    let p = plan_persist(&inv, &facts, &bound, req, remove);
    if !p.refusals.is_empty() {
        let mut s = format!(
            "refusing to persist ({} problem{}):",
            p.refusals.len(),
            if p.refusals.len() == 1 { "" } else { "s" }
        );
        for r in &p.refusals {
            s.push_str(&format!("\n  {}: {}\n    fix: {}", r.address, r.reason, r.fix));
        }
        return Err(super::BindError::Refused(s));
    }
    let plan = p.to_change(host);
    if let Some(s) = session.as_mut() {
        s.apply(&plan)?;
    }
    Ok(Persisted { persist: p, plan })
}
