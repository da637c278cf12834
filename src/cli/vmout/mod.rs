//! The VM-output commands: `xml hostdev`, `xml domain`, `qemu-args`, `kubevirt`, `launch` and
//! (with the `libvirt` cargo feature) `attach` / `detach`.
//!
//! Each command: resolve the DEVICE arguments against the inventory
//! ([`crate::output::selection`]), render with a pure renderer in [`crate::output`], write
//! the result to `out` and notes to stderr. `cli/mod.rs` only dispatches here; each command's
//! `run` loads the inventory.
//!
//! One file per command, with its clap arguments and its run function: [`xml`] (`xml hostdev`,
//! `xml domain`), [`qemu_args`], [`kubevirt`], [`attach`] (`attach`, `detach` and their
//! libvirt API calls), [`launch`]; [`domxml`] reads and edits domain XML for `attach`. This
//! file holds what they share: the errors (`launch`'s [`LaunchError`] too, so that
//! `cli/error.rs`, which converts them, names no command file), the option groups and value
//! parsers, device selection and the notes.

pub mod attach;
// The domain XML edits of `vm attach`/`detach` through libvirt (feature `libvirt`); pure and
// tested in every build.
#[cfg_attr(not(feature = "libvirt"), allow(dead_code))]
pub mod domxml;
pub mod kubevirt;
#[allow(unsafe_code)] // IOMMU_OPTION ioctl on /dev/iommu
pub mod launch;
pub mod qemu_args;
pub mod xml;

pub use attach::{run_attach, run_detach, AttachArgs, DetachArgs};
pub use kubevirt::{run_kubevirt, KubevirtArgs};
pub use qemu_args::{run_qemu, QemuArgsArgs};
pub use xml::{run_xml, DomainArgs, HostdevArgs, XmlCommand};

use crate::messages;
use crate::model::Inventory;
use crate::output::selection::{self, Consumer, DeviceArg, SelectError, SelectOptions, Selection};
use crate::output::{libvirt, qemu};
use clap::{Args, ValueEnum};
use std::io::{self, Write};
use std::path::PathBuf;

/// Why a VM-output command failed.
#[derive(Debug, thiserror::Error)]
pub enum VmOutError {
    #[error(transparent)]
    Select(#[from] SelectError),
    #[error(transparent)]
    Libvirt(#[from] libvirt::LibvirtError),
    #[error(transparent)]
    Qemu(#[from] qemu::QemuError),
    #[error(transparent)]
    DomXml(#[from] domxml::DomXmlError),
    #[error("writing the output failed")]
    Io(#[from] io::Error),
    /// A combination of options that cannot work (exit status 2).
    #[error("{0}")]
    Usage(String),
    #[error("gpupass was built without libvirt support; rebuild with `cargo build --features libvirt` (needs libvirt-dev and pkg-config), or render the XML with `gpupass xml hostdev ...` and use `virsh attach-device`")]
    NoLibvirt,
    /// An error libvirt reported, passed through with what gpupass was doing.
    #[error("libvirt: {doing}: {message}{hint}")]
    LibvirtApi {
        doing: String,
        message: String,
        /// What to do about it, starting with "; " (or empty).
        hint: String,
    },
    #[error("{0}")]
    Verify(String),
    /// A VM layout that cannot work on this host (exit status 1), with the numbers.
    #[error(transparent)]
    Plan(#[from] crate::output::plan::Refusal),
    #[error(transparent)]
    Backend(#[from] crate::inventory::backend::BackendError),
    #[error(transparent)]
    Launch(#[from] LaunchError),
}

/// Why `gpupass launch` failed on the live host.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("gpupass launch opens the live host's /dev/iommu and VFIO cdevs for the VMM; it cannot run against --root {} (drop --root)", root.display())]
    NotLive { root: PathBuf },
    #[error("cannot open {node}; gpupass launch opens the VFIO nodes itself and must run as root")]
    Open {
        /// As the user knows it (`HostRoot::display`).
        node: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot switch {node} to per-process memlock accounting (IOMMU_OPTION_RLIMIT_MODE); it needs CAP_SYS_RESOURCE (run as root), or pass --keep-user-accounting")]
    RlimitMode {
        node: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set RLIMIT_MEMLOCK to {value}")]
    Memlock {
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot keep descriptor {fd} open across exec")]
    Inherit {
        fd: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run {}", program.display())]
    Exec {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl VmOutError {
    /// Exit status 2 for usage errors, 1 for everything else.
    pub(crate) fn is_usage(&self) -> bool {
        matches!(
            self,
            VmOutError::Usage(_)
                | VmOutError::Libvirt(
                    libvirt::LibvirtError::GuestAddressTooMany { .. }
                        | libvirt::LibvirtError::GuestAddressNotFunction0 { .. }
                )
                | VmOutError::Qemu(qemu::QemuError::BadFirstSlot { .. })
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

impl OnOff {
    fn bool(self) -> bool {
        self == OnOff::On
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NumaArg {
    Auto,
    Strict,
    Off,
}

impl NumaArg {
    fn mode(self) -> crate::output::plan::NumaMode {
        use crate::output::plan::NumaMode;
        match self {
            NumaArg::Auto => NumaMode::Auto,
            NumaArg::Strict => NumaMode::Strict,
            NumaArg::Off => NumaMode::Off,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FirmwareArg {
    Efi,
    Bios,
}

impl FirmwareArg {
    /// The firmware whose placement rule the address-width check applies.
    pub fn guest(self) -> crate::output::layout::GuestFirmware {
        match self {
            FirmwareArg::Efi => crate::output::layout::GuestFirmware::Ovmf,
            FirmwareArg::Bios => crate::output::layout::GuestFirmware::SeaBios,
        }
    }
}

/// Device options shared by the libvirt outputs.
#[derive(Debug, Clone, Args)]
pub struct LibvirtDeviceArgs {
    /// managed='yes': libvirt moves the functions to vfio-pci when the VM starts and back when
    /// it stops (default: managed='no', the functions must already be bound: `gpupass bind`)
    #[arg(long, conflicts_with = "unmanaged")]
    pub managed: bool,
    /// managed='no' (the default): the functions must already be on vfio-pci
    #[arg(long)]
    pub unmanaged: bool,
    /// Expansion ROM BAR visible to the guest (on the devices you name, not their companions)
    #[arg(long, value_enum, value_name = "on|off")]
    pub rom_bar: Option<OnOff>,
    /// ROM image the guest sees instead of the device's (on the devices you name)
    #[arg(long, value_name = "PATH")]
    pub rom_file: Option<PathBuf>,
    /// display='on' for display-capable vGPUs (mdev of device_api vfio-pci on a display controller)
    #[arg(long)]
    pub display: bool,
    /// Only the devices named, not the other endpoints of their IOMMU groups
    #[arg(long)]
    pub only: bool,
}

impl LibvirtDeviceArgs {
    fn consumer(&self) -> Consumer {
        if self.managed {
            Consumer::LibvirtManaged
        } else {
            Consumer::LibvirtUnmanaged
        }
    }

    fn hostdev_options(&self) -> libvirt::HostdevOptions {
        libvirt::HostdevOptions {
            managed: self.managed,
            rom_bar: self.rom_bar.map(OnOff::bool),
            rom_file: self.rom_file.as_ref().map(|p| p.display().to_string()),
            display: self.display,
            iommufd: false,
        }
    }
}

/// The VFIO backend of `xml` and the libvirt it targets (docs/iommufd.md).
#[derive(Debug, Clone, Args)]
pub struct XmlBackendArgs {
    /// VFIO backend of the PCI functions: legacy (group + container), iommufd (<driver
    /// iommufd='yes'/> per hostdev, libvirt 12.1+; the domain-wide <iommufd enabled='yes'/>,
    /// 12.2+), auto (iommufd where the kernel and the target libvirt have it, else legacy)
    #[arg(long, value_enum, default_value_t = crate::inventory::backend::Policy::Auto)]
    pub backend: crate::inventory::backend::Policy,
    /// The libvirt the XML is for, X.Y (default: the installed libvirt's version, from `virsh
    /// --version` or its library, else 9.0)
    #[arg(long, value_name = "X.Y")]
    pub libvirt_version: Option<libvirt::LibvirtVersion>,
}

/// The installed libvirt's version and how it was read: `virsh --version`, else the name of
/// the library (`libvirt.so.0.<major*1000+minor>.<micro>`), else [`libvirt::LibvirtVersion::FALLBACK`].
pub(crate) fn installed_libvirt() -> (libvirt::LibvirtVersion, String) {
    if let Ok(o) = std::process::Command::new("virsh")
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    {
        if let Ok(v) = String::from_utf8_lossy(&o.stdout).trim().parse() {
            if o.status.success() {
                return (v, "installed, from virsh --version".into());
            }
        }
    }
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ] {
        let Ok(rd) = std::fs::read_dir(dir) else { continue };
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("libvirt.so.0.")) else {
                continue;
            };
            if let Some(n) = rest.split('.').next().and_then(|n| n.parse::<u32>().ok()) {
                if n >= 1000 {
                    let v = libvirt::LibvirtVersion {
                        major: n / 1000,
                        minor: n % 1000,
                    };
                    return (v, format!("installed, from {dir}/{}", name.to_string_lossy()));
                }
            }
        }
    }
    (
        libvirt::LibvirtVersion::FALLBACK,
        "no installed libvirt found; the default".into(),
    )
}

/// Domain names: libvirt's schema allows anything but a newline; the QEMU driver also
/// refuses '/'. Control characters cannot be written in XML 1.0 at all.
pub(crate) fn parse_domain_name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("the domain name is empty".into());
    }
    if s.contains('/') {
        return Err("a domain name cannot contain '/' (libvirt's QEMU driver refuses it)".into());
    }
    if s.chars().any(char::is_control) {
        return Err("a domain name cannot contain control characters such as a newline".into());
    }
    Ok(s.to_string())
}

/// A memory size in KiB. Units as libvirt reads them: K/KiB, M/MiB, G/GiB, T/TiB are powers
/// of 1024, KB/MB/GB/TB powers of 1000; a bare number is MiB.
pub(crate) fn parse_memory_kib(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 8G, 8GiB, 4096M or 8GB"))?;
    let bytes_per: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "m" | "mib" => 1 << 20,
        "k" | "kib" => 1 << 10,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        u => {
            return Err(format!(
                "unknown size unit {u:?} in {s:?}; use K, M, G, T (binary) or KB, MB, GB, TB"
            ))
        }
    };
    let bytes = n
        .checked_mul(bytes_per)
        .ok_or_else(|| format!("{s:?} is too large"))?;
    let kib = bytes.div_ceil(1024);
    if kib < 1024 {
        return Err(format!("{s:?} is less than 1 MiB of guest memory"));
    }
    // libvirt keeps memory in KiB in an unsigned long long but refuses more than 2^53 bytes.
    if bytes > 1 << 53 {
        return Err(format!("{s:?} is more memory than libvirt accepts"));
    }
    Ok(kib)
}

pub(crate) fn parse_cpu(s: &str) -> Result<String, String> {
    let t = s.trim();
    if t.is_empty() || t.starts_with('-') || t.starts_with(',') || t.contains(char::is_whitespace) {
        return Err(format!(
            "{s:?} is not a -cpu value: give a model and its flags like host or host,kvm=off, or none"
        ));
    }
    Ok(t.to_string())
}

fn parse_slot(s: &str) -> Result<u8, String> {
    let t = s.trim();
    let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u8::from_str_radix(h, 16),
        None => t.parse::<u8>(),
    };
    match v {
        Ok(n @ 0x01..=0x1e) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a usable pcie.0 slot: use 0x01-0x1e (q35 keeps 0x00 for the host bridge and 0x1f for the LPC/SATA/SMBus functions)"
        )),
    }
}

fn print_notes<T: std::fmt::Display>(notes: &[T]) {
    for n in notes {
        messages::note(n);
    }
}

fn select(
    inv: &Inventory,
    devices: &[DeviceArg],
    only: bool,
    consumer: Consumer,
) -> Result<Selection, VmOutError> {
    let sel = selection::select(inv, devices, SelectOptions { only, consumer })?;
    print_notes(&sel.notes);
    Ok(sel)
}

fn json_out(out: &mut dyn Write, v: &serde_json::Value) -> Result<(), VmOutError> {
    serde_json::to_writer_pretty(&mut *out, v).map_err(io::Error::from)?;
    writeln!(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory_kib("8G").unwrap(), 8 << 20);
        assert_eq!(parse_memory_kib("8GiB").unwrap(), 8 << 20);
        assert_eq!(parse_memory_kib("4096").unwrap(), 4 << 20);
        assert_eq!(parse_memory_kib("4096M").unwrap(), 4 << 20);
        assert_eq!(parse_memory_kib("8GB").unwrap(), 7_812_500);
        assert_eq!(parse_memory_kib("1T").unwrap(), 1 << 30);
        for bad in [
            "",
            "G",
            "8X",
            "-1G",
            "1K",
            "99999999999999999999T",
            "9007199254740993K",
        ] {
            assert!(parse_memory_kib(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn domain_names() {
        assert!(parse_domain_name("a<b&c \"q\" 'x' ü").is_ok());
        assert!(parse_domain_name("a/b").is_err());
        assert!(parse_domain_name("a\nb").is_err());
        assert!(parse_domain_name("").is_err());
    }
}
