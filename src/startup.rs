//! `gpupass startup`: what a host needs early in boot, in one idempotent command.
//!
//! 1. Persistent binds: every `etc/driverctl.d/pci-<address>` file (the format `gpupass persist`
//!    and driverctl write) that names a VFIO driver or `pci-stub`, for a device that is present
//!    and not on that driver yet, is bound with `gpupass bind --only` semantics (the user
//!    persisted exactly those functions). Where driverctl itself is installed its udev rule
//!    may have done it already; then this step finds nothing to do.
//! 2. Persistent mdevs: `gpupass mdev start --auto-all`.
//!
//! Each step runs even if the other fails; the exit status is 1 if anything failed.

use crate::bind::cmd::{run_bind, BindArgs};
use crate::host::{dir_names, read_attr, HostRoot};
use crate::model::{is_vfio_driver, PciAddress};
use std::io::Write;

/// Devices whose persistent driver is a VFIO driver (or pci-stub) and which are present but
/// not on it: (address, driver).
pub fn pending_binds(host: &HostRoot) -> Vec<(PciAddress, String)> {
    let mut out = Vec::new();
    for name in dir_names(&host.driverctl_dir()).unwrap_or_default() {
        let Some(addr) = name
            .strip_prefix("pci-")
            .and_then(|a| a.parse::<PciAddress>().ok())
        else {
            continue;
        };
        let Ok(drv) = read_attr(&host.driverctl_dir().join(&name)) else {
            continue;
        };
        let drv = drv.trim().to_string();
        if !(is_vfio_driver(&drv) || drv == "pci-stub") {
            continue;
        }
        let dev = host.pci_device(&addr);
        if !dev.exists() {
            continue;
        }
        let cur = crate::host::link_name(&dev.join("driver")).ok().flatten();
        if cur.as_deref() != Some(drv.as_str()) {
            out.push((addr, drv));
        }
    }
    out
}

pub fn run(host: &HostRoot, dry_run: bool, out: &mut dyn Write) -> anyhow::Result<i32> {
    let mut failed = false;
    let pending = pending_binds(host);
    if pending.is_empty() {
        writeln!(out, "persistent binds: nothing to do")?;
    }
    // One bind per driver, so a variant driver and vfio-pci do not mix in one plan.
    let mut drivers: Vec<String> = pending.iter().map(|(_, d)| d.clone()).collect();
    drivers.sort();
    drivers.dedup();
    for drv in drivers {
        let addresses: Vec<PciAddress> = pending
            .iter()
            .filter(|(_, d)| *d == drv)
            .map(|(a, _)| *a)
            .collect();
        writeln!(
            out,
            "persistent binds to {drv}: {}",
            crate::bind::cmd::addrs(&addresses)
        )?;
        let args = BindArgs {
            addresses,
            only: true,
            driver: Some(drv.clone()),
            force: false,
            dry_run,
        };
        if let Err(e) = run_bind(host, args, false, out) {
            eprintln!("gpupass startup: {e}");
            failed = true;
        }
    }
    writeln!(out, "mdev definitions with start=auto:")?;
    if dry_run {
        let (defs, _) = crate::mdev::defs::read_all(host);
        for d in defs
            .iter()
            .filter(|d| d.start == crate::mdev::defs::StartMode::Auto)
        {
            writeln!(out, "  would start {} ({} on {})", d.uuid, d.mdev_type, d.parent)?;
        }
    } else {
        let load = || -> Result<crate::model::Inventory, crate::mdev::MdevError> {
            Ok(crate::inventory::scan(host)?)
        };
        let cmd = crate::mdev::cli::MdevCommand::Start {
            uuid: None,
            parent: None,
            auto_all: true,
        };
        match crate::mdev::cli::run(host, None, false, cmd, &load, out) {
            Ok(0) => {}
            Ok(_) => failed = true,
            Err(e) => {
                eprintln!("gpupass startup: {e}");
                failed = true;
            }
        }
    }
    Ok(if failed { 1 } else { 0 })
}
