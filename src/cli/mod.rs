//! The command line: clap definitions and the dispatch to each command.
//!
//! [`run`] dispatches each parsed command to its module's entry point, which returns an exit
//! status (the entry points do not share one signature yet: issue #14); `main.rs` only parses,
//! calls [`run`], prints the error chain once and exits. Exit statuses: 0 success,
//! 1 a host error (or `check` found passthrough cannot work), 2 a usage error.

pub mod bind;
#[cfg(feature = "vmm")]
pub mod boot;
pub mod mdev;
pub mod startup;
pub mod vmout;

use crate::host::ops::HostOps;
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
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_long_help = EXIT_STATUS_HELP
)]
pub struct Cli {
    #[command(flatten)]
    pub globals: Globals,

    #[command(subcommand)]
    pub command: Command,
}

// The options every command takes (`global`: before or after the command name). A plain
// comment: a doc comment here would become the about text of every command it flattens into.
#[derive(Debug, clap::Args)]
pub struct Globals {
    /// More log output on stderr: -v info, -vv debug (every sysfs write), -vvv trace
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Log format on stderr: `text` for people, `json` (one object per line) for machines
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Colour in tables and logs: auto (when stdout is a terminal), always, never
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,

    /// Read host paths under DIR instead of / (DIR/sys, DIR/proc, DIR/dev, DIR/etc)
    #[arg(long, global = true, env = "GPUPASS_ROOT", value_name = "DIR")]
    pub root: Option<PathBuf>,

    /// Render from an inventory saved with `gpupass list --all --json` instead of the host
    #[arg(long, global = true, value_name = "FILE")]
    pub from_json: Option<PathBuf>,

    /// Machine-readable JSON output (schema in docs/json.md)
    #[arg(long, global = true)]
    pub json: bool,
}

const ABOUT: &str = "Move GPUs and other PCI devices from a Linux host into VMs and containers";
const LONG_ABOUT: &str = "gpupass reads the host's PCI devices, IOMMU groups, drivers and mediated \
devices from sysfs, and moves devices between host drivers and VFIO for VMs and containers.";
const BIND_ABOUT: &str = "Bind PCI functions, with their IOMMU group companions, to vfio-pci (docs/bind.md)";
const UNBIND_ABOUT: &str = "Give functions on VFIO back to the drivers they had before gpupass bound them";
const OCI_HOOK_ABOUT: &str =
    "OCI runtime hook (createRuntime or prestart): give a container the VFIO device \
nodes named by its `gpupass.dev/devices` annotation (reads the OCI state on stdin)";

/// Parse the process's arguments.
///
/// The commands that run in loops (`bind`, `unbind`, and `oci-hook` at every container
/// start) are parsed against a tree holding only that command: clap builds every command and
/// argument of the tree before it parses, which was 40% of a `bind`'s instructions. The
/// small tree is made from the same definitions (the command's `Args`, [`Globals`], the same
/// about texts), and `tests/cli.rs` checks that both trees parse, explain and refuse alike.
pub fn parse() -> Cli {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut cmd = command_for(args.get(1).and_then(|a| a.to_str()));
    let matches = cmd.try_get_matches_from_mut(args).unwrap_or_else(|e| e.exit());
    // Leaked, not freed: freeing the tree costs more than the exit does.
    std::mem::forget(cmd);
    let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    std::mem::forget(matches);
    cli
}

/// The clap tree to parse a command line whose first argument is `first`: the whole tree, or
/// for the hot commands a tree of that command alone.
pub fn command_for(first: Option<&str>) -> clap::Command {
    use clap::{Args, CommandFactory};
    let sub = match first {
        Some("bind") => {
            crate::cli::bind::BindArgs::augment_args(clap::Command::new("bind").about(BIND_ABOUT))
        }
        Some("unbind") => {
            crate::cli::bind::UnbindArgs::augment_args(clap::Command::new("unbind").about(UNBIND_ABOUT))
        }
        Some("oci-hook") => clap::Command::new("oci-hook").about(OCI_HOOK_ABOUT),
        _ => return Cli::command(),
    };
    let top = clap::Command::new("gpupass")
        .version(env!("CARGO_PKG_VERSION"))
        .about(ABOUT)
        .long_about(LONG_ABOUT)
        .after_long_help(EXIT_STATUS_HELP)
        .subcommand_required(true)
        .arg_required_else_help(true);
    Globals::augment_args(top).subcommand(sub)
}

/// Exit statuses, shown in `--help` and the man page.
pub const EXIT_STATUS_HELP: &str = "EXIT STATUS:
  0    success
  1    a host error (the device, group, driver, kernel or file system said no), or `check`
       found that passthrough cannot work; nothing was left half-changed
  2    a usage error: an unknown option, a malformed PCI address, UUID or size
  101  never on purpose: a panic is a bug, please report it with `gpupass snapshot`
Errors and what to do about each: docs/errors.md.";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// Whether to colour stdout.
    pub fn enabled_for_stdout(self) -> bool {
        use std::io::IsTerminal;
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => std::env::var_os("NO_COLOR").is_none() && std::io::stdout().is_terminal(),
        }
    }
}

/// Shells `gpupass completions` writes scripts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Set up `tracing` on stderr from -v and --log-format. Quiet (warnings only) by default.
pub fn init_logging(verbose: u8, format: LogFormat, color: ColorChoice) {
    use tracing_subscriber::filter::LevelFilter;
    let level = match verbose {
        0 => LevelFilter::WARN,
        1 => LevelFilter::INFO,
        2 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    };
    let ansi = match color {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            use std::io::IsTerminal;
            std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal()
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(ansi).without_time().try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
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
    /// Boot-time entry point (contrib/systemd/gpupass-startup.service): bind every function whose
    /// driverctl override names a VFIO driver, then start every `auto` mdev definition
    Startup {
        /// Print what would be done; change nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Print a shell completion script (bash, zsh, fish) generated from the command definitions
    Completions { shell: Shell },
    /// Print the man page (roff) generated from the command definitions
    Man,
    /// Copy the sysfs/procfs/devfs subset gpupass reads into OUT (replay with --root OUT)
    Snapshot {
        /// New or empty directory
        out: PathBuf,
    },
    /// CDI (Container Device Interface) specs for podman, containerd, CRI-O, Docker
    Cdi {
        #[command(subcommand)]
        cmd: CdiCommand,
    },
    /// What a container needs from the host's native NVIDIA driver
    Container {
        #[command(subcommand)]
        cmd: ContainerCommand,
    },
    #[command(about = OCI_HOOK_ABOUT)]
    OciHook,
    /// Kubernetes device plugin (kubelet deviceplugin API v1beta1) for VFIO-bound devices
    /// and mdevs, one resource per device model / mdev type
    // Only with the `deviceplugin` build feature (on by default; docs/ARCHITECTURE.md, "Features").
    #[cfg(feature = "deviceplugin")]
    DevicePlugin {
        /// Directory of kubelet.sock and the plugin sockets [default: ROOT/var/lib/kubelet/device-plugins]
        #[arg(long, value_name = "DIR")]
        socket_dir: Option<PathBuf>,
        /// How often to check device health and the kubelet socket, in milliseconds
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=10_000))]
        poll_ms: u64,
        /// Name CDI devices in Allocate replies: auto (when a gpupass spec exists in
        /// /var/run/cdi or /etc/cdi), always, never
        #[arg(long, value_enum, default_value_t = crate::containers::deviceplugin::CdiMode::Auto)]
        cdi: crate::containers::deviceplugin::CdiMode,
        /// CDI kind of those names
        #[arg(long, default_value = crate::output::cdi::DEFAULT_KIND)]
        cdi_kind: crate::output::cdi::Kind,
        /// VFIO node set of each allocated function: legacy (/dev/vfio/N + /dev/vfio/vfio),
        /// iommufd (/dev/vfio/devices/vfioN + /dev/iommu), auto (iommufd where the kernel serves
        /// the function through it, else legacy). docs/iommufd.md
        #[arg(long, value_enum, default_value_t = crate::inventory::backend::Policy::Auto)]
        backend: crate::inventory::backend::Policy,
    },
    #[command(about = BIND_ABOUT)]
    Bind(crate::cli::bind::BindArgs),
    #[command(about = UNBIND_ABOUT)]
    Unbind(crate::cli::bind::UnbindArgs),
    /// Restore (or --continue) a bind/unbind interrupted by a crash, from the journal
    Recover(crate::cli::bind::RecoverArgs),
    /// Keep a binding across reboots (driverctl overrides; prints kernel/modprobe lines)
    Persist(crate::cli::bind::PersistArgs),
    /// Mediated devices and NVIDIA vGPU: types, instances, create/remove, mdevctl-format
    /// definitions (docs/mdev.md)
    #[command(subcommand)]
    Mdev(crate::cli::mdev::MdevCommand),
    /// libvirt XML: hostdev elements or a complete q35 domain for passthrough
    #[command(subcommand)]
    Xml(crate::cli::vmout::XmlCommand),
    /// QEMU -device arguments (pcie-root-port + vfio-pci) for passthrough on q35
    QemuArgs(crate::cli::vmout::QemuArgsArgs),
    /// As root: open /dev/iommu and the devices' VFIO cdevs, then exec a VMM (QEMU) with them
    /// inherited and its device arguments pointing at them (fd=), optionally as another user
    Launch(crate::cli::vmout::launch::LaunchArgs),
    /// KubeVirt permittedHostDevices for the devices, with their Kubernetes resource names
    Kubevirt(crate::cli::vmout::KubevirtArgs),
    /// Attach devices to a libvirt domain (needs the `libvirt` build feature)
    Attach(crate::cli::vmout::AttachArgs),
    /// Detach devices from a libvirt domain (needs the `libvirt` build feature)
    Detach(crate::cli::vmout::DetachArgs),
    /// Boot gpupass's firmware in a minimal KVM VM with one device and report what it sees
    // Only with the `vmm` build feature (on by default; docs/ARCHITECTURE.md, "Features").
    #[cfg(feature = "vmm")]
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
        /// VFIO backend: the group + container (legacy), the device cdev + /dev/iommu
        /// (iommufd), or iommufd where the kernel serves the device through it (auto; an mdev
        /// stays legacy under auto)
        #[arg(long, value_enum, default_value_t = crate::inventory::backend::Policy::Auto)]
        backend: crate::inventory::backend::Policy,
        /// After the interrupt tests, time this many MSI round trips (raise, deliver, EOI)
        #[arg(long, value_name = "N", default_value_t = 0)]
        irq_loop: u32,
        /// How MSI reaches the vCPU: the kernel's irqfd, or gpupass injecting each message from
        /// userspace with KVM_SIGNAL_MSI (the comparison of the interrupt benchmark)
        #[arg(long, value_enum, default_value_t = crate::vmm::irq::IrqPath::Irqfd)]
        irq_path: crate::vmm::irq::IrqPath,
        /// Self-test: one verdict line per capability a guest driver needs (config, bars, dma,
        /// isolation, msi-x, msi, intx, reset), each pass, fail or absent with the reason;
        /// exit status 0 only when none fails (docs/vmm.md, "boot --check")
        #[arg(long)]
        check: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum CdiCommand {
    /// Write a CDI spec: one device per VFIO group and per VFIO-bound function, one per
    /// active mdev, one per GPU on the native NVIDIA driver
    Generate {
        /// Write the spec to FILE (atomically) instead of standard output
        #[arg(long, value_name = "FILE", conflicts_with = "write")]
        output: Option<PathBuf>,
        /// Write it to ROOT/var/run/cdi (atomically) and keep it fresh on bind/unbind/mdev changes
        #[arg(long)]
        write: bool,
        /// With --write: keep running and rewrite the spec on every kernel uevent for a PCI
        /// function, VFIO node or mdev (changes made by other tools too: driverctl, virsh)
        #[arg(long, requires = "write")]
        watch: bool,
        /// Pin cdiVersion (default: the lowest version the spec's fields need)
        #[arg(long, value_name = "V")]
        cdi_version: Option<crate::output::cdi::CdiVersion>,
        /// CDI kind, vendor/class
        #[arg(long, value_name = "K", default_value = crate::output::cdi::DEFAULT_KIND)]
        kind: crate::output::cdi::Kind,
        /// The host's /dev as the container runtime sees it (adds hostPath to device nodes)
        #[arg(long, value_name = "DIR", default_value = "/dev")]
        dev_root: String,
        /// The host's / as the container runtime sees it, for the driver's files
        #[arg(long, value_name = "DIR", default_value = "/")]
        driver_root: String,
        /// VFIO node set of each device: legacy (/dev/vfio/N + /dev/vfio/vfio), iommufd
        /// (/dev/vfio/devices/vfioN + /dev/iommu), auto (iommufd where the kernel serves the
        /// device through it, else legacy; devices both serve also get legacy-NAME and
        /// iommufd-NAME). docs/iommufd.md
        #[arg(long, value_enum, default_value_t = crate::inventory::backend::Policy::Auto)]
        backend: crate::inventory::backend::Policy,
    },
}

#[derive(Debug, Subcommand)]
pub enum ContainerCommand {
    /// Device nodes, binaries, libraries and IPC sockets of the native NVIDIA driver, as
    /// found on the host (what `nvidia-container-cli list` prints)
    List {
        /// Only this GPU's device node (PCI address)
        #[arg(long, value_name = "ADDRESS")]
        device: Option<PciAddress>,
    },
}

#[cfg(feature = "vmm")]
fn parse_uuid_arg(s: &str) -> Result<String, String> {
    crate::vmm::vfio::parse_uuid(s).map_err(|e| e.to_string())
}

#[cfg(feature = "vmm")]
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
    /// Colour on stdout (from --color and whether stdout is a terminal).
    pub color: bool,
    pub host: HostRoot,
    /// Every change to the host goes through these, built once here for the whole invocation
    /// (the real kernel; in a `testkit` build, what the test kit's environment asks for).
    pub ops: Box<dyn HostOps>,
    pub from_json: Option<PathBuf>,
    pub json: bool,
}

impl Ctx {
    pub fn from_cli(cli: &Cli) -> Self {
        let host = HostRoot::new(cli.globals.root.clone().unwrap_or_else(|| PathBuf::from("/")));
        Ctx {
            color: cli.globals.color.enabled_for_stdout(),
            ops: crate::host::ops::for_process(host.clone()),
            host,
            from_json: cli.globals.from_json.clone(),
            json: cli.globals.json,
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
fn vm_exit(r: Result<i32, crate::cli::vmout::VmOutError>) -> Result<i32> {
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
    // These read (and most change) the live host; a saved inventory cannot stand in for it.
    let live = match cli.command {
        Command::Bind(_) => Some("bind"),
        Command::Unbind(_) => Some("unbind"),
        Command::Recover(_) => Some("recover"),
        Command::Persist(_) => Some("persist"),
        Command::Check => Some("check"),
        Command::Startup { .. } => Some("startup"),
        Command::OciHook => Some("oci-hook"),
        #[cfg(feature = "deviceplugin")]
        Command::DevicePlugin { .. } => Some("device-plugin"),
        Command::Launch(_) => Some("launch"),
        _ => None,
    };
    if let (Some(name), Some(_)) = (live, &ctx.from_json) {
        eprintln!(
            "gpupass: `gpupass {name}` works on the live host; it cannot run from --from-json (drop it)"
        );
        return Ok(2);
    }
    if !changes && ctx.from_json.is_none() {
        // A crash between two writes of a bind leaves a plan open in the journal: say so.
        crate::cli::bind::warn_unfinished(&ctx.host);
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
            let inv = ctx.inventory()?;
            let r = crate::inventory::readiness::assess(&ctx.host, &inv);
            if ctx.json {
                write_json(out, &r)?;
            } else {
                out.write_all(table::check(&r, ctx.color).as_bytes())?;
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
            let (from_json, json) = (ctx.from_json.as_deref(), ctx.json);
            match crate::cli::mdev::run(ctx.ops.as_ref(), from_json, json, cmd, &load, out) {
                Ok(code) => Ok(code),
                Err(e) if e.is_usage() => {
                    eprintln!("gpupass: {e}");
                    Ok(2)
                }
                Err(e) => Err(e.into()),
            }
        }
        #[cfg(feature = "vmm")]
        Command::Boot {
            device,
            mdev,
            emulated: _,
            memory,
            firmware,
            timeout,
            read_loop,
            read_bar,
            backend,
            check,
            irq_loop,
            irq_path,
        } => {
            use crate::vmm::vfio::VfioTarget;
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
                backend,
                irq_loop,
                irq_path,
                interrupts: check || irq_loop > 0,
            };
            match crate::cli::boot::run(&ctx.host, inv.as_ref(), &opts, ctx.json, check, out) {
                Ok(status) => Ok(status),
                Err(e) if e.is_usage() => {
                    eprintln!("gpupass: {e}");
                    Ok(2)
                }
                Err(e) => Err(e.into()),
            }
        }
        Command::Events { count, timeout } => {
            let sock = crate::host::uevents::UeventSocket::open()
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
        Command::Startup { dry_run } => crate::cli::startup::run(ctx.ops.as_ref(), dry_run, out),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            let sh = match shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
            };
            clap_complete::generate(sh, &mut cmd, "gpupass", out);
            Ok(0)
        }
        Command::Man => {
            use clap::CommandFactory;
            clap_mangen::Man::new(Cli::command()).render(out)?;
            Ok(0)
        }
        Command::Snapshot { out: dir } => {
            let rep = crate::inventory::snapshot::snapshot(&ctx.host, &dir)
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
        Command::Cdi {
            cmd:
                CdiCommand::Generate {
                    output,
                    write,
                    watch,
                    cdi_version,
                    kind,
                    dev_root,
                    driver_root,
                    backend,
                },
        } => {
            let inv = ctx.inventory()?;
            let files = crate::containers::native::discover(&ctx.host);
            let opts = crate::output::cdi::Options {
                kind,
                version: cdi_version,
                dev_root,
                driver_root,
                backend,
            };
            let usage = |e: &crate::output::cdi::CdiError| {
                matches!(e, crate::output::cdi::CdiError::VersionTooLow { .. })
            };
            if write {
                let path = match crate::output::cdi::write_to_host(&ctx.host, &inv, &files, &opts) {
                    Ok((path, warnings)) => {
                        for w in warnings {
                            eprintln!("warning: {w}");
                        }
                        writeln!(out, "wrote {}", path.display())?;
                        path
                    }
                    Err(crate::output::cdi::CdiError::Empty) if watch => {
                        let path = crate::output::cdi::record_emptied(&ctx.host, &opts)?;
                        writeln!(
                            out,
                            "nothing to describe yet; {} appears when a device is bound to VFIO",
                            path.display()
                        )?;
                        path
                    }
                    Err(e) if usage(&e) => {
                        eprintln!("gpupass: {e}");
                        return Ok(2);
                    }
                    Err(e) => return Err(e.into()),
                };
                if watch {
                    out.flush()?;
                    let sock = crate::host::uevents::UeventSocket::open()
                        .context("cannot subscribe to kernel uevents for --watch")?;
                    while let Some(ev) = sock.next(None)? {
                        match crate::output::cdi::refresh(&ctx.host) {
                            Ok(()) => writeln!(out, "refreshed {} after {}", path.display(), ev.line())?,
                            Err(e) => eprintln!("warning: refresh after {} failed: {e}", ev.line()),
                        }
                        out.flush()?;
                    }
                }
                Ok(0)
            } else {
                let r = match crate::output::cdi::render(&inv, &files, &opts) {
                    Ok(r) => r,
                    Err(e) if usage(&e) => {
                        eprintln!("gpupass: {e}");
                        return Ok(2);
                    }
                    Err(e) => return Err(e.into()),
                };
                for w in &r.warnings {
                    eprintln!("warning: {w}");
                }
                let text = crate::output::cdi::to_json(&r.spec);
                match output {
                    Some(p) => crate::output::cdi::write_atomic(&p, text.as_bytes())
                        .with_context(|| format!("cannot write {}", p.display()))?,
                    None => out.write_all(text.as_bytes())?,
                }
                Ok(0)
            }
        }
        Command::Container {
            cmd: ContainerCommand::List { device },
        } => {
            let inv = ctx.inventory()?;
            let files = crate::containers::native::discover(&ctx.host);
            for w in &files.warnings {
                eprintln!("warning: {w}");
            }
            if ctx.json {
                write_json(
                    out,
                    &crate::containers::native::list_json(&inv, &files, device.as_ref())?,
                )?;
            } else {
                out.write_all(
                    crate::containers::native::list_text(&inv, &files, device.as_ref())?.as_bytes(),
                )?;
            }
            Ok(0)
        }
        Command::OciHook => crate::containers::oci_hook::run_cli(ctx.ops.as_ref()),
        #[cfg(feature = "deviceplugin")]
        Command::DevicePlugin {
            socket_dir,
            poll_ms,
            cdi,
            cdi_kind,
            backend,
        } => {
            let dir = socket_dir.unwrap_or_else(|| ctx.host.kubelet_device_plugins());
            let cfg = crate::containers::deviceplugin::Config {
                host: ctx.host.clone(),
                socket_dir: dir,
                poll: std::time::Duration::from_millis(poll_ms),
                cdi,
                cdi_kind,
                backend,
            };
            crate::containers::deviceplugin::server::run(cfg)?;
            Ok(0)
        }
        Command::Bind(a) => Ok(crate::cli::bind::run_bind(ctx.ops.as_ref(), a, ctx.json, out)?),
        Command::Unbind(a) => Ok(crate::cli::bind::run_unbind(ctx.ops.as_ref(), a, ctx.json, out)?),
        Command::Recover(a) => Ok(crate::cli::bind::run_recover(ctx.ops.as_ref(), a, ctx.json, out)?),
        Command::Persist(a) => Ok(crate::cli::bind::run_persist(&ctx.host, a, ctx.json, out)?),
        Command::Xml(c) => vm_exit(crate::cli::vmout::run_xml(&ctx.inventory()?, &c, ctx.json, out)),
        Command::Launch(a) => vm_exit(crate::cli::vmout::launch::run(
            &ctx.host,
            &ctx.inventory()?,
            &a,
            &mut std::io::stderr(),
        )),
        Command::QemuArgs(a) => vm_exit(crate::cli::vmout::run_qemu(&ctx.inventory()?, &a, ctx.json, out)),
        Command::Kubevirt(a) => vm_exit(crate::cli::vmout::run_kubevirt(
            &ctx.inventory()?,
            &a,
            ctx.json,
            out,
        )),
        Command::Attach(a) => vm_exit(crate::cli::vmout::run_attach(&ctx.inventory()?, &a, out)),
        Command::Detach(a) => vm_exit(crate::cli::vmout::run_detach(&ctx.inventory()?, &a, out)),
    }
}

#[cfg(test)]
mod parse_tests {
    use super::*;
    use clap::CommandFactory;

    fn parse_with(mut cmd: clap::Command, argv: &[&str]) -> Result<String, String> {
        match cmd.try_get_matches_from_mut(argv) {
            Ok(m) => <Cli as clap::FromArgMatches>::from_arg_matches(&m)
                .map(|c| format!("{c:?}"))
                .map_err(|e| e.to_string()),
            Err(e) => Err(format!("{:?}: {}", e.kind(), e.render())),
        }
    }

    /// The one-command trees of the hot commands explain themselves exactly as the whole tree
    /// does: same help (short and long), same usage, same top-level texts.
    #[test]
    fn hot_command_trees_have_the_whole_trees_help() {
        for name in ["bind", "unbind", "oci-hook"] {
            let mut full = Cli::command();
            full.build();
            let mut small = command_for(Some(name));
            small.build();
            assert_eq!(
                full.get_about().map(|s| s.to_string()),
                small.get_about().map(|s| s.to_string())
            );
            assert_eq!(full.get_version(), small.get_version());
            assert_eq!(
                full.get_after_long_help().map(|s| s.to_string()),
                small.get_after_long_help().map(|s| s.to_string())
            );
            let f = full.find_subcommand_mut(name).expect("in the whole tree");
            let s = small.find_subcommand_mut(name).expect("in the small tree");
            assert_eq!(
                f.render_help().to_string(),
                s.render_help().to_string(),
                "{name} -h"
            );
            assert_eq!(
                f.render_long_help().to_string(),
                s.render_long_help().to_string(),
                "{name} --help"
            );
            assert_eq!(
                f.render_usage().to_string(),
                s.render_usage().to_string(),
                "{name} usage"
            );
        }
    }

    /// ...and parse, and refuse, every command line alike.
    #[test]
    fn hot_command_trees_parse_and_refuse_alike() {
        let cases: &[&[&str]] = &[
            &["gpupass", "bind", "01:00.0"],
            &[
                "gpupass",
                "bind",
                "0000:01:00.0",
                "02:00.0",
                "--only",
                "--dry-run",
                "--force",
                "--json",
            ],
            &[
                "gpupass",
                "bind",
                "01:00.0",
                "--driver",
                "nvgrace_gpu_vfio_pci",
                "-vv",
                "--log-format",
                "json",
            ],
            &[
                "gpupass",
                "bind",
                "01:00.0",
                "--root",
                "/tmp/x",
                "--color",
                "never",
                "--from-json",
                "f.json",
            ],
            &["gpupass", "bind"],
            &["gpupass", "bind", "zz:00.0"],
            &["gpupass", "bind", "01:00.0", "--driver", "../etc"],
            &["gpupass", "bind", "01:00.0", "--bogus"],
            &["gpupass", "bind", "--help"],
            &["gpupass", "bind", "--version"],
            &["gpupass", "unbind", "01:00.0"],
            &["gpupass", "unbind", "--group", "12"],
            &["gpupass", "unbind", "--all", "--dry-run"],
            &["gpupass", "unbind", "--all", "01:00.0"],
            &["gpupass", "unbind"],
            &["gpupass", "unbind", "--group", "x"],
            &["gpupass", "oci-hook"],
            &["gpupass", "oci-hook", "extra"],
            &["gpupass", "oci-hook", "--json"],
        ];
        for argv in cases {
            let full = parse_with(Cli::command(), argv);
            let small = parse_with(command_for(argv.get(1).copied()), argv);
            assert_eq!(full, small, "{argv:?}");
        }
    }

    #[test]
    fn other_commands_get_the_whole_tree() {
        for first in [None, Some("list"), Some("-v"), Some("--root"), Some("bindx")] {
            let c = command_for(first);
            assert!(c.find_subcommand("list").is_some(), "{first:?}");
        }
    }
}
