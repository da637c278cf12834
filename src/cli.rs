//! The command line: clap definitions and the dispatch to each command.
//!
//! Every command has the shape `run(ctx, args, out) -> Result<exit status>`; `main.rs` only
//! parses, calls [`run`], prints the error chain once and exits. Exit statuses: 0 success,
//! 1 a host error (or `check` found passthrough cannot work), 2 a usage error.

use crate::host::HostRoot;
use crate::inventory;
use crate::model::{Inventory, PciAddress};
use crate::output::table;
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "gpupass",
    version,
    about = "Move GPUs and other PCI devices from a Linux host into VMs and containers",
    long_about = "gpupass reads the host's PCI devices, IOMMU groups, drivers and mediated \
devices from sysfs, and moves devices between host drivers and VFIO for VMs and containers."
)]
pub struct Cli {
    /// Read host paths under DIR instead of / (DIR/sys, DIR/proc, DIR/dev, DIR/etc)
    #[arg(long, global = true, env = "GPUPASS_ROOT", value_name = "DIR")]
    pub root: Option<PathBuf>,

    /// Render from an inventory saved with `gpupass list --all --json` instead of the host
    #[arg(long, global = true, value_name = "FILE")]
    pub from_json: Option<PathBuf>,

    /// Machine-readable JSON output (schema in docs/json.md)
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List GPUs and display devices (or every PCI function with --all)
    List {
        /// Every PCI function, not only GPUs and display devices
        #[arg(long)]
        all: bool,
    },
    /// Everything known about one PCI function and its IOMMU group
    Show {
        /// PCI address: 0000:01:00.0 or 01:00.0
        address: PciAddress,
    },
    /// IOMMU groups, their members, and whether each is viable for VFIO now
    Groups,
    /// Host readiness for passthrough (IOMMU, interrupt remapping, modules, device nodes)
    Check,
    /// Watch kernel uevents for PCI and mdev changes (add, remove, bind, unbind) and print them
    Events {
        /// Stop after this many events
        #[arg(long)]
        count: Option<usize>,
        /// Stop after this many seconds without exiting non-zero
        #[arg(long, value_name = "SECONDS", value_parser = parse_events_timeout)]
        timeout: Option<f64>,
    },
    /// Copy the sysfs/procfs/devfs subset gpupass reads into OUT (replay with --root OUT)
    Snapshot {
        /// New or empty directory
        out: PathBuf,
    },
    /// Bind PCI functions, with their IOMMU group companions, to vfio-pci (docs/bind.md)
    Bind(crate::bind::cmd::BindArgs),
    /// Give functions on VFIO back to the drivers they had before gpupass bound them
    Unbind(crate::bind::cmd::UnbindArgs),
    /// Restore (or --continue) a bind/unbind interrupted by a crash, from the journal
    Recover(crate::bind::cmd::RecoverArgs),
    /// Keep a binding across reboots (driverctl overrides; prints kernel/modprobe lines)
    Persist(crate::bind::cmd::PersistArgs),
    /// Mediated devices and NVIDIA vGPU: types, instances, create/remove, mdevctl-format
    /// definitions (docs/mdev.md)
    #[command(subcommand)]
    Mdev(crate::mdev::cli::MdevCommand),
    /// libvirt XML: hostdev elements or a complete q35 domain for passthrough
    #[command(subcommand)]
    Xml(crate::vmout::XmlCommand),
    /// QEMU -device arguments (pcie-root-port + vfio-pci) for passthrough on q35
    QemuArgs(crate::vmout::QemuArgsArgs),
    /// KubeVirt permittedHostDevices for the devices, with their Kubernetes resource names
    Kubevirt(crate::vmout::KubevirtArgs),
    /// Attach devices to a libvirt domain (needs the `libvirt` build feature)
    Attach(crate::vmout::AttachArgs),
    /// Detach devices from a libvirt domain (needs the `libvirt` build feature)
    Detach(crate::vmout::DetachArgs),
    /// Boot gpupass's firmware in a minimal KVM VM with one device and report what it sees
    #[command(group(clap::ArgGroup::new("target").required(true).args(["device", "mdev", "emulated"])))]
    Boot {
        /// PCI function bound to vfio-pci (`gpupass bind` it first)
        #[arg(long, value_name = "ADDRESS")]
        device: Option<PciAddress>,
        /// Mediated device UUID
        #[arg(long, value_name = "UUID", value_parser = parse_uuid_arg)]
        mdev: Option<String>,
        /// A small display device emulated inside gpupass (no VFIO needed)
        #[arg(long)]
        emulated: bool,
        /// Guest RAM (1M..3G, e.g. 64M)
        #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = crate::vmm::memory::parse_memory_size)]
        memory: u64,
        /// Guest firmware flat binary (default: the built-in one, see docs/vmm.md)
        #[arg(long, value_name = "FILE")]
        firmware: Option<PathBuf>,
        /// Seconds before the VM is stopped
        #[arg(long, value_name = "S", default_value = "10", value_parser = parse_timeout)]
        timeout: std::time::Duration,
        /// After enumeration, the firmware reads a BAR this many times (exit counting)
        #[arg(long, value_name = "N", default_value_t = 0)]
        read_loop: u32,
        /// BAR the read loop reads (default: BAR2 of a Bochs display, else the first memory BAR)
        #[arg(long, value_name = "BAR", value_parser = clap::value_parser!(u8).range(0..=5))]
        read_bar: Option<u8>,
    },
}

fn parse_uuid_arg(s: &str) -> Result<String, String> {
    crate::vfio_dev::parse_uuid(s).map_err(|e| e.to_string())
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(std::time::Duration::from_secs_f64(v)),
        _ => Err(format!(
            "invalid timeout {s:?}: expected seconds, more than 0 and at most 86400"
        )),
    }
}

/// `events --timeout`: finite seconds (an infinite or huge value would panic in `Duration`).
fn parse_events_timeout(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=31_536_000.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "invalid timeout {s:?}: expected seconds, from 0 to 31536000 (a year)"
        )),
    }
}

/// Shared state of one invocation.
pub struct Ctx {
    pub host: HostRoot,
    pub from_json: Option<PathBuf>,
    pub json: bool,
}

impl Ctx {
    pub fn from_cli(cli: &Cli) -> Self {
        Ctx {
            host: HostRoot::new(cli.root.clone().unwrap_or_else(|| PathBuf::from("/"))),
            from_json: cli.from_json.clone(),
            json: cli.json,
        }
    }

    /// The inventory: from the saved JSON if given, else read from the host.
    pub fn inventory(&self) -> Result<Inventory> {
        let inv = match &self.from_json {
            Some(p) => inventory::load_json(p)?,
            None => inventory::scan(&self.host)?,
        };
        for w in &inv.warnings {
            eprintln!("warning: {w}");
        }
        Ok(inv)
    }
}

/// VM-output errors: usage errors print and exit 2, the rest go up as host errors (exit 1).
fn vm_exit(r: Result<i32, crate::vmout::VmOutError>) -> Result<i32> {
    match r {
        Err(e) if e.is_usage() => {
            eprintln!("gpupass: {e}");
            Ok(2)
        }
        r => Ok(r?),
    }
}

/// `show --json`: the device and its group, fields in schema order.
#[derive(serde::Serialize)]
struct ShowJson<'a> {
    device: &'a crate::model::PciDevice,
    group: Option<&'a crate::model::IommuGroup>,
}

/// `groups --json`.
#[derive(serde::Serialize)]
struct GroupsJson<'a> {
    groups: &'a [crate::model::IommuGroup],
}

fn write_json<T: serde::Serialize>(out: &mut dyn Write, v: &T) -> Result<()> {
    serde_json::to_writer_pretty(&mut *out, v)?;
    writeln!(out)?;
    Ok(())
}

/// Run a parsed command line; returns the exit status.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<i32> {
    let ctx = Ctx::from_cli(&cli);
    let changes = matches!(
        cli.command,
        Command::Bind(_) | Command::Unbind(_) | Command::Recover(_)
    );
    if changes && ctx.from_json.is_some() {
        anyhow::bail!("bind/unbind/recover change the live host; they cannot run from --from-json");
    }
    if !changes && ctx.from_json.is_none() {
        // A crash between two writes of a bind leaves a plan open in the journal: say so.
        crate::bind::cmd::warn_unfinished(&ctx.host);
    }
    match cli.command {
        Command::List { all } => {
            let inv = ctx.inventory()?;
            let devices: Vec<_> = inv.devices.iter().filter(|d| all || d.is_gpu()).collect();
            if ctx.json {
                let mut sub = inv.clone();
                sub.devices = devices.into_iter().cloned().collect();
                write_json(out, &sub)?;
            } else {
                out.write_all(table::list(&inv, &devices).as_bytes())?;
            }
            Ok(0)
        }
        Command::Show { address } => {
            let inv = ctx.inventory()?;
            let d = inv
                .device(&address)
                .ok_or(inventory::InventoryError::NoSuchDevice { addr: address })?;
            if ctx.json {
                let group = d.iommu_group.and_then(|n| inv.group(n));
                write_json(out, &ShowJson { device: d, group })?;
            } else {
                out.write_all(table::show(&inv, d).as_bytes())?;
            }
            Ok(0)
        }
        Command::Groups => {
            let inv = ctx.inventory()?;
            if ctx.json {
                write_json(out, &GroupsJson { groups: &inv.groups })?;
            } else {
                out.write_all(table::groups(&inv).as_bytes())?;
            }
            Ok(0)
        }
        Command::Check => {
            if ctx.from_json.is_some() {
                anyhow::bail!("`check` reads the live host (modules, kernel command line); it cannot run from --from-json");
            }
            let inv = ctx.inventory()?;
            let r = crate::check::assess(&ctx.host, &inv);
            if ctx.json {
                write_json(out, &r)?;
            } else {
                out.write_all(table::check(&r).as_bytes())?;
            }
            Ok(if r.ready { 0 } else { 1 })
        }
        Command::Mdev(cmd) => {
            let load = || -> Result<Inventory, crate::mdev::MdevError> {
                let inv = match &ctx.from_json {
                    Some(p) => inventory::load_json(p)?,
                    None => inventory::scan(&ctx.host)?,
                };
                for w in &inv.warnings {
                    eprintln!("warning: {w}");
                }
                Ok(inv)
            };
            match crate::mdev::cli::run(&ctx.host, ctx.from_json.as_deref(), ctx.json, cmd, &load, out) {
                Ok(code) => Ok(code),
                Err(e) if e.is_usage() => {
                    eprintln!("gpupass: {e}");
                    Ok(2)
                }
                Err(e) => Err(e.into()),
            }
        }
        Command::Boot {
            device,
            mdev,
            emulated: _,
            memory,
            firmware,
            timeout,
            read_loop,
            read_bar,
        } => {
            use crate::vfio_dev::VfioTarget;
            use crate::vmm::{BootOptions, Target};
            let target = match (device, mdev) {
                (Some(a), _) => Target::Vfio(VfioTarget::Pci(a)),
                (None, Some(u)) => Target::Vfio(VfioTarget::Mdev(u)),
                (None, None) => Target::Emulated,
            };
            let inv = match target {
                Target::Emulated => None,
                Target::Vfio(_) => Some(ctx.inventory()?),
            };
            let opts = BootOptions {
                target,
                memory,
                firmware,
                timeout,
                read_loop,
                read_bar,
            };
            match crate::boot::run(&ctx.host, inv.as_ref(), &opts, ctx.json, out) {
                Ok(status) => Ok(status),
                Err(e) if e.is_usage() => {
                    eprintln!("gpupass: {e}");
                    Ok(2)
                }
                Err(e) => Err(e.into()),
            }
        }
        Command::Events { count, timeout } => {
            let sock = crate::events::UeventSocket::open()
                .context("cannot subscribe to kernel uevents (NETLINK_KOBJECT_UEVENT)")?;
            let deadline =
                timeout.map(|t| std::time::Instant::now() + std::time::Duration::from_secs_f64(t.max(0.0)));
            let mut seen = 0usize;
            while count.is_none_or(|c| seen < c) {
                let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
                let Some(ev) = sock.next(left)? else { break };
                if ctx.json {
                    serde_json::to_writer(&mut *out, &ev)?;
                    writeln!(out)?;
                } else {
                    writeln!(out, "{}", ev.line())?;
                }
                out.flush()?;
                seen += 1;
            }
            Ok(0)
        }
        Command::Snapshot { out: dir } => {
            let rep = crate::snapshot::snapshot(&ctx.host, &dir)
                .with_context(|| format!("snapshot of {} failed", ctx.host.root().display()))?;
            writeln!(
                out,
                "wrote {} files for {} PCI functions to {} (replay with: gpupass --root {} list --all)",
                rep.files,
                rep.devices,
                dir.display(),
                dir.display()
            )?;
            Ok(0)
        }
        Command::Bind(a) => Ok(crate::bind::cmd::run_bind(&ctx.host, a, ctx.json, out)?),
        Command::Unbind(a) => Ok(crate::bind::cmd::run_unbind(&ctx.host, a, ctx.json, out)?),
        Command::Recover(a) => Ok(crate::bind::cmd::run_recover(&ctx.host, a, ctx.json, out)?),
        Command::Persist(a) => {
            if ctx.from_json.is_some() {
                anyhow::bail!("persist reads and writes the live host; it cannot run from --from-json");
            }
            Ok(crate::bind::cmd::run_persist(&ctx.host, a, ctx.json, out)?)
        }
        Command::Xml(c) => vm_exit(crate::vmout::run_xml(&ctx.inventory()?, &c, ctx.json, out)),
        Command::QemuArgs(a) => vm_exit(crate::vmout::run_qemu(&ctx.inventory()?, &a, ctx.json, out)),
        Command::Kubevirt(a) => vm_exit(crate::vmout::run_kubevirt(&ctx.inventory()?, &a, ctx.json, out)),
        Command::Attach(a) => vm_exit(crate::vmout::run_attach(&ctx.inventory()?, &a, out)),
        Command::Detach(a) => vm_exit(crate::vmout::run_detach(&ctx.inventory()?, &a, out)),
    }
}
