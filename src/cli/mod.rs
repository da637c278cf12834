//! The command line: clap definitions and the dispatch to each command.
//!
//! [`run`] hands each parsed command to its module's `run(ctx, args, out) -> Result<Exit,
//! Error>`: [`Ctx`] is built once from the global options (the host root, the host operations,
//! `--from-json`, `--json`), [`Error`] knows its exit status ([`error`]), and everything said on
//! stderr goes through [`crate::messages`]. `main.rs` only parses, calls [`run`], prints an
//! error once and exits. Exit statuses: 0 success, 1 a host error (or `check` found
//! passthrough cannot work), 2 a usage error.

// One module per command (a family of subcommands shares one): each owns its arguments and has
// `run(ctx, args, out) -> Result<Exit, Error>`.
pub mod bind;
#[cfg(feature = "vmm")]
pub mod boot;
pub mod cdi;
pub mod check;
pub mod completions;
pub mod container;
pub mod ctx;
#[cfg(feature = "deviceplugin")]
pub mod device_plugin;
#[cfg(feature = "dra")]
pub mod dra_plugin;
pub mod error;
pub mod events;
mod fastparse;
pub mod groups;
pub mod list;
pub mod man;
pub mod mdev;
pub mod oci_hook;
pub mod persist;
pub mod recover;
pub mod show;
pub mod snapshot;
pub mod startup;
pub mod unbind;
pub mod vmout;

pub use ctx::{write_json, Ctx};
pub use error::{Error, Exit, Result};

use crate::host::HostRoot;
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
const MDEV_ABOUT: &str = "Mediated devices and NVIDIA vGPU: types, instances, create/remove, mdevctl-format \
definitions (docs/mdev.md)";
const OCI_HOOK_ABOUT: &str =
    "OCI runtime hook (createRuntime or prestart): give a container the VFIO device \
nodes named by its `gpupass.dev/devices` annotation (reads the OCI state on stdin)";

/// Parse the process's arguments.
///
/// The commands that run in loops (`bind`, `unbind`, `mdev` create/remove, and `oci-hook` at
/// every container start) are parsed against a tree holding only that command: clap builds every command and
/// argument of the tree before it parses, which was 40% of a `bind`'s instructions. The
/// small tree is made from the same definitions (the command's `Args`, [`Globals`], the same
/// about texts), and `tests/cli.rs` checks that both trees parse, explain and refuse alike.
///
/// `gpupass --version` (or `-V`) alone is answered before clap: it is what scripts and package
/// checks run to see that gpupass is there, and the whole tree costs it most of its start
/// (docs/performance.md, "Start-up"); the line is clap's (`version_line_is_claps`).
pub fn parse() -> Cli {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.len() == 2 && (args[1] == "--version" || args[1] == "-V") {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let code = match out.write_all(VERSION_LINE.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => 0,
            // As clap does when stdout is closed or full.
            Err(_) => 1,
        };
        std::process::exit(code);
    }
    // The plain command lines of the mdev changes, read without clap (`fastparse`).
    if let Some(cli) = fastparse::parse(&args, std::env::var_os("GPUPASS_ROOT")) {
        return cli;
    }
    let mut cmd = command_for(command_name(&args));
    let matches = cmd.try_get_matches_from_mut(args).unwrap_or_else(|e| e.exit());
    // Leaked, not freed: freeing the tree costs more than the exit does.
    std::mem::forget(cmd);
    let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    std::mem::forget(matches);
    cli
}

/// The command named on a command line (`args[0]` is the program): the first argument after
/// the global options (`gpupass --root DIR -v mdev create ...` names `mdev`). `None` at an
/// option that is not a global one, where the whole tree must parse (and explain) it.
pub(crate) fn command_name<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Option<&str> {
    const WITH_VALUE: [&str; 4] = ["--root", "--from-json", "--log-format", "--color"];
    let mut it = args.iter().skip(1).map(|a| a.as_ref().to_str());
    while let Some(a) = it.next() {
        let a = a?;
        if a == "--json"
            || a == "--verbose"
            || (a.len() > 1 && a.starts_with('-') && a[1..].bytes().all(|b| b == b'v'))
        {
            continue;
        }
        if WITH_VALUE.contains(&a) {
            it.next();
            continue;
        }
        if WITH_VALUE
            .iter()
            .any(|o| a.strip_prefix(o).is_some_and(|r| r.starts_with('=')))
        {
            continue;
        }
        return if a.starts_with('-') { None } else { Some(a) };
    }
    None
}

/// The clap tree to parse a command line whose command is `first` ([`command_name`]): the whole
/// tree, or for the hot commands a tree of that command alone.
pub(crate) fn command_for(first: Option<&str>) -> clap::Command {
    use clap::{Args, CommandFactory, Subcommand};
    let sub = match first {
        Some("bind") => bind::BindArgs::augment_args(clap::Command::new("bind").about(BIND_ABOUT)),
        Some("unbind") => unbind::UnbindArgs::augment_args(clap::Command::new("unbind").about(UNBIND_ABOUT)),
        Some("oci-hook") => clap::Command::new("oci-hook").about(OCI_HOOK_ABOUT),
        Some("mdev") => mdev::MdevCommand::augment_subcommands(clap::Command::new("mdev").about(MDEV_ABOUT))
            .subcommand_required(true)
            .arg_required_else_help(true),
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

/// What `gpupass --version` prints.
pub(crate) const VERSION_LINE: &str = concat!("gpupass ", env!("CARGO_PKG_VERSION"), "\n");

/// Exit statuses, shown in `--help` and the man page.
pub(crate) const EXIT_STATUS_HELP: &str = "EXIT STATUS:
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
pub(crate) enum Shell {
    Bash,
    Zsh,
    Fish,
}

impl Cli {
    /// Whether this command line needs a log subscriber ([`init_logging`]): when -v or
    /// `--log-format json` asks for logs, and for the long-running plugins, whose warnings
    /// (`tracing::warn!`) go to the log at every verbosity. No other command logs below -v, so
    /// the others start without the subscriber and its registry.
    pub fn wants_logging(&self) -> bool {
        if self.globals.verbose > 0 || self.globals.log_format == LogFormat::Json {
            return true;
        }
        match self.command {
            #[cfg(feature = "deviceplugin")]
            Command::DevicePlugin(_) => true,
            #[cfg(feature = "dra")]
            Command::DraPlugin(_) | Command::Dra(_) => true,
            _ => false,
        }
    }
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
    List(list::Args),
    /// Everything known about one PCI function and its IOMMU group
    Show(show::Args),
    /// IOMMU groups, their members, and whether each is viable for VFIO now
    Groups(groups::Args),
    /// Host readiness for passthrough (IOMMU, interrupt remapping, modules, device nodes)
    Check(check::Args),
    /// Watch kernel uevents for PCI and mdev changes (add, remove, bind, unbind) and print them
    Events(events::Args),
    /// Boot-time entry point (contrib/systemd/gpupass-startup.service): bind every function whose
    /// driverctl override names a VFIO driver, then start every `auto` mdev definition
    Startup(startup::Args),
    /// Print a shell completion script (bash, zsh, fish) generated from the command definitions
    Completions(completions::Args),
    /// Print the man page (roff) generated from the command definitions
    Man(man::Args),
    /// Copy the sysfs/procfs/devfs subset gpupass reads into OUT (replay with --root OUT)
    Snapshot(snapshot::Args),
    /// CDI (Container Device Interface) specs for podman, containerd, CRI-O, Docker
    Cdi(cdi::Args),
    /// What a container needs from the host's native NVIDIA driver
    Container(container::Args),
    #[command(about = OCI_HOOK_ABOUT)]
    OciHook(oci_hook::Args),
    /// Kubernetes device plugin (kubelet deviceplugin API v1beta1) for VFIO-bound devices
    /// and mdevs, one resource per device model / mdev type
    // Only with the `deviceplugin` build feature (on by default; docs/ARCHITECTURE.md, "Features").
    #[cfg(feature = "deviceplugin")]
    DevicePlugin(device_plugin::Args),
    /// Kubernetes DRA kubelet plugin (resource.k8s.io/v1): one device per IOMMU group,
    /// journaled group binds on Prepare, KEP-5304 metadata for KubeVirt (docs/dra.md)
    // Only with the `dra` build feature (docs/ARCHITECTURE.md, "Features").
    #[cfg(feature = "dra")]
    DraPlugin(dra_plugin::Args),
    /// DRA read commands: this node's ResourceSlices and why each IOMMU group is or is not
    /// published; whether the running plugin answers (probe)
    #[cfg(feature = "dra")]
    #[command(subcommand)]
    Dra(dra_plugin::DraCommand),
    #[command(about = BIND_ABOUT)]
    Bind(bind::BindArgs),
    #[command(about = UNBIND_ABOUT)]
    Unbind(unbind::UnbindArgs),
    /// Restore (or --continue) a bind/unbind interrupted by a crash, from the journal
    Recover(recover::RecoverArgs),
    /// Keep a binding across reboots (driverctl overrides; prints kernel/modprobe lines)
    Persist(persist::PersistArgs),
    #[command(subcommand, about = MDEV_ABOUT)]
    Mdev(mdev::MdevCommand),
    /// libvirt XML: hostdev elements or a complete q35 domain for passthrough
    #[command(subcommand)]
    Xml(vmout::XmlCommand),
    /// QEMU -device arguments (pcie-root-port + vfio-pci) for passthrough on q35
    QemuArgs(vmout::QemuArgsArgs),
    /// As root: open /dev/iommu and the devices' VFIO cdevs, then exec a VMM (QEMU) with them
    /// inherited and its device arguments pointing at them (fd=), optionally as another user
    Launch(vmout::launch::LaunchArgs),
    /// KubeVirt permittedHostDevices for the devices, with their Kubernetes resource names
    Kubevirt(vmout::KubevirtArgs),
    /// Attach devices to a libvirt domain (needs the `libvirt` build feature)
    Attach(vmout::AttachArgs),
    /// Detach devices from a libvirt domain (needs the `libvirt` build feature)
    Detach(vmout::DetachArgs),
    /// Boot gpupass's firmware in a minimal KVM VM with one device and report what it sees
    // Only with the `vmm` build feature (on by default; docs/ARCHITECTURE.md, "Features").
    #[cfg(feature = "vmm")]
    Boot(boot::Args),
}

impl Command {
    /// `bind`, `unbind` and `recover` read the journal themselves, under its lock; so do the
    /// mdev changes (not their dry runs), which warn of an unfinished plan from that read
    /// (`change::journal::warn_open`) instead of reading the journal a second time first.
    fn reads_journal_under_lock(&self) -> bool {
        match self {
            Command::Bind(_) | Command::Unbind(_) | Command::Recover(_) => true,
            Command::Mdev(m) => m.takes_lock(),
            _ => false,
        }
    }
}

/// Run a parsed command line: the one shape, `run(ctx, args, out) -> Result<Exit, Error>`,
/// for every command.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<Exit> {
    let ctx = Ctx::new(
        HostRoot::new(cli.globals.root.clone().unwrap_or_else(|| PathBuf::from("/"))),
        cli.globals.color.enabled_for_stdout(),
        cli.globals.from_json.clone(),
        cli.globals.json,
    );
    if !cli.command.reads_journal_under_lock() && ctx.from_json.is_none() {
        // A crash between two writes of a bind leaves a plan open in the journal: say so.
        crate::change::journal::warn_unfinished(&ctx.host);
    }
    match cli.command {
        Command::List(a) => list::run(&ctx, a, out),
        Command::Show(a) => show::run(&ctx, a, out),
        Command::Groups(a) => groups::run(&ctx, a, out),
        Command::Check(a) => check::run(&ctx, a, out),
        Command::Events(a) => events::run(&ctx, a, out),
        Command::Startup(a) => startup::run(&ctx, a, out),
        Command::Completions(a) => completions::run(&ctx, a, out),
        Command::Man(a) => man::run(&ctx, a, out),
        Command::Snapshot(a) => snapshot::run(&ctx, a, out),
        Command::Cdi(a) => cdi::run(&ctx, a, out),
        Command::Container(a) => container::run(&ctx, a, out),
        Command::OciHook(a) => oci_hook::run(&ctx, a, out),
        #[cfg(feature = "deviceplugin")]
        Command::DevicePlugin(a) => device_plugin::run(&ctx, a, out),
        #[cfg(feature = "dra")]
        Command::DraPlugin(a) => dra_plugin::run(&ctx, a, out),
        #[cfg(feature = "dra")]
        Command::Dra(a) => dra_plugin::run_dra(&ctx, a, out),
        Command::Bind(a) => bind::run(&ctx, a, out),
        Command::Unbind(a) => unbind::run(&ctx, a, out),
        Command::Recover(a) => recover::run(&ctx, a, out),
        Command::Persist(a) => persist::run(&ctx, a, out),
        Command::Mdev(a) => mdev::run(&ctx, a, out),
        Command::Xml(a) => vmout::run_xml(&ctx, a, out),
        Command::QemuArgs(a) => vmout::run_qemu(&ctx, a, out),
        Command::Launch(a) => vmout::launch::run(&ctx, a, out),
        Command::Kubevirt(a) => vmout::run_kubevirt(&ctx, a, out),
        Command::Attach(a) => vmout::run_attach(&ctx, a, out),
        Command::Detach(a) => vmout::run_detach(&ctx, a, out),
        #[cfg(feature = "vmm")]
        Command::Boot(a) => boot::run(&ctx, a, out),
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
        for name in ["bind", "unbind", "oci-hook", "mdev"] {
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
            &[
                "gpupass",
                "mdev",
                "create",
                "-p",
                "mbochs",
                "-t",
                "mbochs-small",
                "-u",
                "dddddddd-1111-4222-8333-444444444444",
            ],
            &[
                "gpupass",
                "mdev",
                "create",
                "--parent",
                "mtty",
                "--type",
                "mtty-1",
                "--count",
                "2",
                "--attr",
                "a=1",
                "--dry-run",
                "--json",
            ],
            &[
                "gpupass", "mdev", "create", "-p", "mbochs", "-t", "x", "-u", "1234",
            ],
            &["gpupass", "mdev", "create", "-p", "mbochs"],
            &[
                "gpupass",
                "mdev",
                "remove",
                "dddddddd-1111-4222-8333-444444444444",
                "-vv",
                "--log-format",
                "json",
            ],
            &["gpupass", "mdev", "remove", "0000:01:00.4", "--dry-run"],
            &[
                "gpupass", "mdev", "define", "-p", "mdpy", "-t", "mdpy-vga", "--auto", "--manual",
            ],
            &[
                "gpupass",
                "mdev",
                "undefine",
                "dddddddd-1111-4222-8333-444444444444",
                "--root",
                "/tmp/x",
            ],
            &["gpupass", "mdev", "start", "--auto-all", "--dry-run"],
            &["gpupass", "mdev", "start"],
            &["gpupass", "mdev", "stop", "dddddddd-1111-4222-8333-444444444444"],
            &["gpupass", "mdev", "list", "--defined", "--json"],
            &["gpupass", "mdev", "types", "-p", "mbochs"],
            &["gpupass", "mdev"],
            &["gpupass", "mdev", "bogus"],
            &["gpupass", "mdev", "--help"],
            &["gpupass", "mdev", "create", "--help"],
        ];
        let globals_first: &[&[&str]] = &[
            &[
                "gpupass",
                "--root",
                "/tmp/x",
                "mdev",
                "create",
                "-p",
                "mtty",
                "-t",
                "mtty-1",
                "--dry-run",
            ],
            &["gpupass", "-vv", "--log-format=json", "bind", "01:00.0"],
            &["gpupass", "--json", "--color", "never", "oci-hook"],
            &["gpupass", "--from-json=f.json", "-v", "unbind", "--all"],
            &[
                "gpupass",
                "--verbose",
                "--root=/tmp/x",
                "mdev",
                "remove",
                "--help",
            ],
            &["gpupass", "--root", "/tmp/x", "mdev"],
        ];
        for argv in cases.iter().chain(globals_first) {
            let name = command_name(argv);
            assert!(name.is_some(), "{argv:?}");
            let full = parse_with(Cli::command(), argv);
            let small = parse_with(command_for(name), argv);
            assert_eq!(full, small, "{argv:?}");
        }
    }

    /// The line `--version` prints before clap is the one clap would print.
    #[test]
    fn version_line_is_claps() {
        assert_eq!(Cli::command().render_version(), VERSION_LINE);
    }

    /// Logging is set up for -v, --log-format json and the plugins, not for the rest.
    #[test]
    fn logging_only_when_asked_for_or_long_running() {
        let wants = |argv: &[&str]| Cli::try_parse_from(argv).unwrap().wants_logging();
        assert!(!wants(&["gpupass", "list"]));
        assert!(!wants(&["gpupass", "oci-hook"]));
        assert!(!wants(&["gpupass", "mdev", "list", "--log-format", "text"]));
        assert!(wants(&["gpupass", "list", "-v"]));
        assert!(wants(&["gpupass", "bind", "01:00.0", "--log-format", "json"]));
        #[cfg(feature = "deviceplugin")]
        assert!(wants(&["gpupass", "device-plugin"]));
    }

    /// The command is found after the global options; an unknown option, `--` or nothing
    /// leaves it to the whole tree.
    #[test]
    fn the_command_is_named_after_the_global_options() {
        let name = |a: &[&str]| command_name(a).map(str::to_string);
        assert_eq!(
            name(&["gpupass", "--root", "mdev", "bind"]).as_deref(),
            Some("bind")
        );
        assert_eq!(
            name(&["gpupass", "-vvv", "--color=never", "list"]).as_deref(),
            Some("list")
        );
        assert_eq!(name(&["gpupass", "--bogus", "bind"]), None);
        assert_eq!(name(&["gpupass", "-x", "bind"]), None);
        assert_eq!(name(&["gpupass", "--", "bind"]), None);
        assert_eq!(name(&["gpupass", "--root"]), None);
        assert_eq!(name(&["gpupass"]), None);
    }

    #[test]
    fn other_commands_get_the_whole_tree() {
        for first in [None, Some("list"), Some("-v"), Some("--root"), Some("bindx")] {
            let c = command_for(first);
            assert!(c.find_subcommand("list").is_some(), "{first:?}");
        }
    }
}
