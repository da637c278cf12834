//! `gpupass startup`: what a host needs early in boot, in one idempotent command.
//!
//! 1. Persistent binds: every `etc/driverctl.d/pci-<address>` file (the format `gpupass persist`
//!    and driverctl write) that names a VFIO driver or `pci-stub`, for a device that is present
//!    and not on that driver yet, is bound with `gpupass bind --only` semantics (the user
//!    persisted exactly those functions). Where driverctl itself is installed its udev rule
//!    may have done it already; then this step finds nothing to do.
//!    A file it cannot use (a `pci-` name without a valid address, an empty or unreadable
//!    file) is skipped with a warning naming it; the others still count.
//! 2. Persistent mdevs: `gpupass mdev start --auto-all`.
//!
//! Each step runs even if the other fails; the exit status is 1 if anything failed.

use super::bind::BindArgs;
use super::ctx::Ctx;
use super::error::{Exit, Result};
use crate::host::{dir_names, read_attr, HostRoot};
use crate::messages;
use crate::model::{is_vfio_driver, PciAddress};
use std::io::Write;

/// What `startup` found in `etc/driverctl.d`: the binds to make, and the files it skipped.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Pending {
    /// Devices whose persistent driver is a VFIO driver (or pci-stub) and which are present but
    /// not on it: (address, driver).
    pub binds: Vec<(PciAddress, String)>,
    /// One line per override file that could not be used (name or content), naming the file.
    pub warnings: Vec<String>,
}

/// Read every driverctl override file. Files of other buses (`usb-...`) are driverctl's
/// business and skipped quietly; a `pci-` file whose address does not parse, a name that is not
/// `<bus>-<device>` at all, an unreadable or empty file is skipped with a warning, and the
/// others still count.
pub(crate) fn pending_binds(host: &HostRoot) -> Pending {
    let mut out = Pending::default();
    let dir = host.driverctl_dir();
    for name in dir_names(&dir).unwrap_or_default() {
        let shown = host.display(&dir.join(&name));
        let addr = match name.split_once('-') {
            Some(("pci", a)) => match a.parse::<PciAddress>() {
                Ok(addr) => addr,
                Err(e) => {
                    out.warnings.push(format!(
                        "{shown}: skipped: the name does not end in a PCI address ({e}); driverctl names \
                         the file pci-<address>, e.g. pci-0000:01:00.0"
                    ));
                    continue;
                }
            },
            Some(_) => continue,
            None => {
                out.warnings.push(format!(
                    "{shown}: skipped: not a driverctl override (driverctl names them <bus>-<device>, \
                     e.g. pci-0000:01:00.0)"
                ));
                continue;
            }
        };
        let drv = match read_attr(&dir.join(&name)) {
            Ok(d) => d.trim().to_string(),
            Err(e) => {
                out.warnings
                    .push(format!("{shown}: skipped: cannot read it: {e}"));
                continue;
            }
        };
        if drv.is_empty() {
            out.warnings.push(format!(
                "{shown}: skipped: it is empty (it should hold the driver name, e.g. vfio-pci)"
            ));
            continue;
        }
        if !(is_vfio_driver(&drv) || drv == "pci-stub") {
            continue;
        }
        let dev = host.pci_device(&addr);
        if !dev.exists() {
            continue;
        }
        let cur = crate::host::link_name(&dev.join("driver")).ok().flatten();
        if cur.as_deref() != Some(drv.as_str()) {
            out.binds.push((addr, drv));
        }
    }
    out
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print what would be done; change nothing
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(ctx: &Ctx, args: Args, out: &mut dyn Write) -> Result<Exit> {
    let dry_run = args.dry_run;
    let host = ctx.live("startup")?.root();
    let mut failed = false;
    let Pending {
        binds: pending,
        warnings,
    } = pending_binds(host);
    for w in warnings {
        messages::warn(w);
    }
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
            crate::cli::bind::addrs(&addresses)
        )?;
        let args = BindArgs {
            addresses,
            only: true,
            driver: Some(drv.clone()),
            force: false,
            dry_run,
        };
        // `--json` is not startup's: its steps print their plain output.
        if let Err(e) = super::bind::run_plain(ctx, args, out) {
            messages::error("gpupass startup", &e);
            failed = true;
        }
    }
    writeln!(out, "mdev definitions with start=auto:")?;
    // `mdev start --auto-all`, its plans printed with --dry-run (the exact writes and checks
    // of each definition, as the binds above print theirs).
    let cmd = super::mdev::MdevCommand::Start {
        uuid: None,
        parent: None,
        auto_all: true,
        dry_run,
    };
    match super::mdev::run_plain(ctx, cmd, out) {
        Ok(Exit::SUCCESS) => {}
        Ok(_) => failed = true,
        Err(e) => {
            messages::error("gpupass startup", &e);
            failed = true;
        }
    }
    Ok(Exit::failure_if(failed))
}
