//! The VM-output commands: `xml hostdev`, `xml domain`, `qemu-args`, `kubevirt`, and (with
//! the `libvirt` cargo feature) `attach` / `detach`.
//!
//! Each command: resolve the DEVICE arguments against the inventory
//! ([`crate::output::selection`]), render with a pure renderer in [`crate::output`], write
//! the result to `out` and notes to stderr. `cli.rs` only loads the inventory and dispatches
//! here.

pub mod attach;
pub mod domxml;
#[allow(unsafe_code)] // IOMMU_OPTION ioctl on /dev/iommu
pub mod launch;

use super::{Ctx, Error, Exit};
use crate::messages;
use crate::model::{Inventory, PciAddress};
use crate::output::selection::{self, Consumer, DeviceArg, SelectError, SelectOptions, Selection};
use crate::output::{kubevirt, libvirt, qemu};
use clap::{Args, Subcommand, ValueEnum};
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
    Launch(#[from] launch::LaunchError),
}

impl VmOutError {
    /// Exit status 2 for usage errors, 1 for everything else.
    pub fn is_usage(&self) -> bool {
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
pub fn installed_libvirt() -> (libvirt::LibvirtVersion, String) {
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

/// Run `binary --version` (at most 10 s) and read the QEMU version from its first line.
pub fn probe_qemu(binary: &std::path::Path) -> Result<qemu::QemuVersion, String> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {} --version: {e}", binary.display()))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{} --version did not exit within 10 s", binary.display()));
            }
            Err(e) => return Err(format!("waiting for {} --version: {e}", binary.display())),
        }
    };
    let mut text = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.by_ref().take(64 * 1024).read_to_string(&mut text);
    }
    if !status.success() {
        return Err(format!("{} --version failed ({status})", binary.display()));
    }
    qemu::QemuVersion::from_version_output(&text).ok_or_else(|| {
        format!(
            "{} --version printed no \"QEMU emulator version X.Y\" line",
            binary.display()
        )
    })
}

/// The QEMU version `qemu-args` targets and where it came from: `--qemu-version`, else
/// `--qemu BINARY --version`, else `qemu-system-x86_64 --version` from PATH; `None` with the
/// reason when none can be told.
fn target_qemu(a: &QemuArgsArgs) -> (Option<qemu::QemuVersion>, String) {
    if let Some(v) = a.qemu_version {
        return (Some(v), "from --qemu-version".into());
    }
    let binary = a
        .qemu
        .clone()
        .unwrap_or_else(|| PathBuf::from("qemu-system-x86_64"));
    match probe_qemu(&binary) {
        Ok(v) => (Some(v), format!("{} --version", binary.display())),
        Err(why) => (None, why),
    }
}

/// Resolve `qemu-args --backend` for the PCI functions `addrs`: the kernel decides first
/// (E-BACKEND-01), then the QEMU (8.2 for iommufd): under `auto` an older or unknown QEMU
/// means legacy, with a note; `iommufd` with an older one is refused, with an unknown one
/// taken as asked, with a note.
fn qemu_backend(
    inv: &Inventory,
    a: &QemuArgsArgs,
    addrs: &[PciAddress],
) -> Result<crate::model::Backend, VmOutError> {
    use crate::inventory::backend::Policy;
    use crate::model::Backend;
    let kernel = crate::inventory::backend::resolve_vm(a.backend, inv, addrs, None)?;
    if kernel != Backend::Iommufd || addrs.is_empty() {
        return Ok(kernel);
    }
    let needed = qemu::QemuVersion::IOMMUFD;
    match target_qemu(a) {
        (Some(v), _) if v >= needed => Ok(Backend::Iommufd),
        (Some(version), source) => {
            if a.backend == Policy::Iommufd {
                return Err(qemu::QemuError::IommufdTooOld {
                    version,
                    source_: source,
                    needed,
                }
                .into());
            }
            messages::note(format_args!(
                "--backend auto: the QEMU {version} ({source}) has no iommufd backend for vfio-pci (8.2+); using the legacy group and container"
            ));
            Ok(Backend::Legacy)
        }
        (None, why) => {
            if a.backend == Policy::Iommufd {
                messages::note(format_args!(
                    "--backend iommufd: the QEMU's version is unknown ({why}); -object iommufd needs QEMU 8.2 or newer"
                ));
                return Ok(Backend::Iommufd);
            }
            messages::note(format_args!(
                "--backend auto: the QEMU's version is unknown ({why}); using the legacy group and container (name the VM's QEMU with --qemu BINARY or --qemu-version X.Y to use iommufd, 8.2+)"
            ));
            Ok(Backend::Legacy)
        }
    }
}

/// Resolve `xml --backend`: the kernel decides first (E-BACKEND-01), then the target
/// libvirt (12.1 for `<driver iommufd='yes'/>`, 12.2 for the domain-wide element).
fn xml_iommufd(
    inv: &Inventory,
    sel: &Selection,
    a: &XmlBackendArgs,
    domain: bool,
) -> Result<libvirt::IommufdXml, VmOutError> {
    let addrs: Vec<_> = sel.functions().map(|f| f.device.address).collect();
    let kernel = crate::inventory::backend::resolve_vm(a.backend, inv, &addrs, None)?;
    if kernel != crate::model::Backend::Iommufd || addrs.is_empty() {
        return Ok(libvirt::IommufdXml::default());
    }
    let (target, source) = match a.libvirt_version {
        Some(v) => (v, "from --libvirt-version".to_string()),
        None => installed_libvirt(),
    };
    let mut x = target.iommufd();
    if !x.per_hostdev {
        if a.backend == crate::inventory::backend::Policy::Iommufd {
            return Err(libvirt::LibvirtError::IommufdTooOld {
                target,
                source_: source,
                per_hostdev: libvirt::LibvirtVersion::HOSTDEV_IOMMUFD,
                domain_wide: libvirt::LibvirtVersion::DOMAIN_IOMMUFD,
            }
            .into());
        }
        messages::note(format_args!(
            "--backend auto: the target libvirt {target} ({source}) has no iommufd hostdevs (12.1+); using the legacy group and container (name the VM's libvirt with --libvirt-version)"
        ));
        return Ok(libvirt::IommufdXml::default());
    }
    if sel.mdevs().next().is_some() {
        messages::note(format_args!(
            "mdevs stay on the legacy group and container; only the PCI functions use iommufd{}",
            if domain {
                " (so no domain-wide <iommufd/>)"
            } else {
                ""
            }
        ));
        x.domain_wide = false;
    } else if domain && !x.domain_wide {
        messages::note(format_args!(
            "libvirt {target} ({source}): iommufd per hostdev only; the domain-wide <iommufd enabled='yes'/> needs 12.2"
        ));
    }
    if !domain {
        x.domain_wide = false;
    }
    Ok(x)
}

#[derive(Debug, Subcommand)]
pub enum XmlCommand {
    /// libvirt hostdev elements for PCI functions (with their IOMMU-group companions) and mdevs
    Hostdev(HostdevArgs),
    /// A complete q35 KVM domain with the devices behind their own pcie-root-ports
    Domain(DomainArgs),
}

#[derive(Debug, Args)]
pub struct HostdevArgs {
    /// PCI addresses (0000:01:00.0, 01:00.0) or mdev UUIDs
    #[arg(required = true, value_name = "ADDRESS|UUID")]
    pub devices: Vec<DeviceArg>,
    #[command(flatten)]
    pub dev: LibvirtDeviceArgs,
    /// Guest PCI address for one device, or function 0 of one multifunction slot (siblings
    /// share the slot): e.g. 0000:05:00.0, bus 05 being a pcie-root-port of your domain
    #[arg(long, value_name = "ADDRESS")]
    pub guest_address: Option<PciAddress>,
    #[command(flatten)]
    pub vfio: XmlBackendArgs,
}

#[derive(Debug, Args)]
pub struct DomainArgs {
    /// Domain name (any characters but '/' and control characters; XML-escaped in the output)
    #[arg(long, value_parser = parse_domain_name)]
    pub name: String,
    /// Guest memory: 8G, 8GiB, 4096M, 8GB (10^9), or a number of MiB
    #[arg(long, value_parser = parse_memory_kib, value_name = "SIZE")]
    pub memory: u64,
    /// Virtual CPUs
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub vcpus: u32,
    /// Devices to pass: PCI addresses or mdev UUIDs (repeat or list several)
    #[arg(long = "device", required = true, num_args = 1.., value_name = "ADDRESS|UUID")]
    pub devices: Vec<DeviceArg>,
    /// Disk image for the guest (virtio, vda); qcow2 if it ends in .qcow2, else raw
    #[arg(long, value_name = "PATH")]
    pub disk: Option<PathBuf>,
    /// Guest firmware: efi (OVMF; sizes the MMIO window for large GPU BARs) or bios (SeaBIOS)
    #[arg(long, value_enum, default_value = "efi")]
    pub firmware: FirmwareArg,
    /// Give the guest an emulated Intel IOMMU (iommu model intel, split I/O APIC), for
    /// VFIO or DPDK inside the guest; plain GPU passthrough does not need it
    #[arg(long)]
    pub viommu: bool,
    /// Lock all guest memory (memoryBacking/locked) (libvirt already raises the memlock
    /// limit for VFIO by itself)
    #[arg(long)]
    pub locked: bool,
    /// The guest's 64-bit PCI window: auto (sized from the devices' 64-bit BARs: twice the
    /// next power of two of their sum, at least 32G), off, or a size (64G, 2T)
    #[arg(long, value_name = "auto|off|SIZE", default_value = "auto")]
    pub pci_hole64: crate::output::layout::Hole64,
    /// The guest CPU's physical address bits at most N (32-64; qemu-args
    /// host-phys-bits-limit=N, libvirt <maxphysaddr limit='N'/>); the IOMMU's width limits them
    /// by itself when it is narrower than the host CPU's
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(32..=64))]
    pub phys_bits: Option<u32>,
    /// `<memtune><hard_limit>` = what VFIO pins (RAM + 1 GiB; with --viommu RAM per VFIO
    /// device + 1 GiB), also the domain's memory cgroup limit: on (default) or off (libvirt
    /// then raises the memlock limit by the same rule and sets no cgroup limit)
    #[arg(long, value_enum, value_name = "on|off", default_value = "on")]
    pub memtune: OnOff,
    /// NUMA placement: auto (vCPUs on the devices' local CPUs and memory bound to their node
    /// when they share one), strict (the same, and devices on several nodes are an error), off
    #[arg(long, value_enum, default_value = "auto")]
    pub numa: NumaArg,
    /// Back guest RAM with hugepages of this size (off, 2M, 1G): <memoryBacking><hugepages>;
    /// refused when the host nodes the guest is bound to have too few free
    #[arg(long, value_enum, default_value = "off", value_name = "off|2M|1G")]
    pub hugepages: crate::output::layout::HugePages,
    #[command(flatten)]
    pub dev: LibvirtDeviceArgs,
    #[command(flatten)]
    pub vfio: XmlBackendArgs,
}

#[derive(Debug, Args)]
pub struct QemuArgsArgs {
    /// PCI addresses (0000:01:00.0, 01:00.0) or mdev UUIDs
    #[arg(required = true, value_name = "ADDRESS|UUID")]
    pub devices: Vec<DeviceArg>,
    /// Only the devices named, not the other endpoints of their IOMMU groups
    #[arg(long)]
    pub only: bool,
    /// rombar=1|0 on the devices you name
    #[arg(long, value_enum, value_name = "on|off")]
    pub rom_bar: Option<OnOff>,
    /// romfile=PATH on the devices you name
    #[arg(long, value_name = "PATH")]
    pub rom_file: Option<PathBuf>,
    /// display=on for display-capable vGPUs
    #[arg(long)]
    pub display: bool,
    /// First pcie.0 slot for the root ports (hex like 0x10 or decimal)
    #[arg(long, value_parser = parse_slot, default_value = "0x10", value_name = "SLOT")]
    pub first_slot: u8,
    /// VFIO backend of the PCI functions: legacy (group + container), iommufd (-object
    /// iommufd and iommufd= on each vfio-pci; QEMU 8.2+, Linux 6.6+), auto (iommufd where
    /// the kernel and the QEMU have it, else legacy). docs/iommufd.md
    #[arg(long, value_enum, default_value_t = crate::inventory::backend::Policy::Auto)]
    pub backend: crate::inventory::backend::Policy,
    /// The QEMU the arguments are for, X.Y (default: what --qemu BINARY, else
    /// qemu-system-x86_64 on PATH, prints for --version)
    #[arg(long, value_name = "X.Y", conflicts_with = "qemu")]
    pub qemu_version: Option<qemu::QemuVersion>,
    /// The QEMU binary the arguments are for: its --version decides whether iommufd is used
    #[arg(long, value_name = "BINARY")]
    pub qemu: Option<PathBuf>,
    /// The guest's 64-bit PCI window (-global q35-pcihost.pci-hole64-size= and OVMF's
    /// X-PciMmio64Mb): auto (sized from the devices' 64-bit BARs: twice the next power of two
    /// of their sum, at least 32G), off, or a size (64G, 2T)
    #[arg(long, value_name = "auto|off|SIZE", default_value = "auto")]
    pub pci_hole64: crate::output::layout::Hole64,
    /// The guest firmware you boot (qemu-args does not choose it): efi (OVMF, the default) or
    /// bios (SeaBIOS, QEMU's own default); the address-width check places the 64-bit window as
    /// that firmware does
    #[arg(long, value_enum, default_value = "efi")]
    pub firmware: FirmwareArg,
    /// The guest CPU's physical address bits at most N (32-64; qemu-args
    /// host-phys-bits-limit=N, libvirt <maxphysaddr limit='N'/>); the IOMMU's width limits them
    /// by itself when it is narrower than the host CPU's
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(32..=64))]
    pub phys_bits: Option<u32>,
    /// The -cpu value gpupass emits, with host-phys-bits=on (and host-phys-bits-limit=N) added:
    /// host (the default), your own model and flags (e.g. 'host,kvm=off'; QEMU takes only the
    /// last -cpu), or none (no -cpu: add those properties to yours)
    #[arg(long, value_name = "MODEL[,FLAGS]|none", default_value = "host", value_parser = parse_cpu)]
    pub cpu: String,
    /// Guest memory (8G, 4096M): emits -m and the memory backends that bind it to the
    /// devices' NUMA node(s) or put it on hugepages (do not pass your own -m then)
    #[arg(long, value_parser = parse_memory_kib, value_name = "SIZE")]
    pub memory: Option<u64>,
    /// Virtual CPUs: emits -smp (with --memory, the guest NUMA nodes' CPUs)
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub vcpus: Option<u32>,
    /// Back guest RAM with hugepages (off, 2M, 1G): memory-backend-memfd,hugetlb=on; needs
    /// --memory; refused when the host nodes the guest is bound to have too few free
    #[arg(
        long,
        value_enum,
        default_value = "off",
        value_name = "off|2M|1G",
        requires = "memory"
    )]
    pub hugepages: crate::output::layout::HugePages,
    /// NUMA placement: auto (memory bound to the devices' node when they share one; devices on
    /// several nodes get one pxb-pcie expander bus per node, and with --memory and --vcpus one
    /// guest NUMA node per host node), strict (devices on several nodes are an error), off
    #[arg(long, value_enum, default_value = "auto")]
    pub numa: NumaArg,
}

#[derive(Debug, Args)]
pub struct KubevirtArgs {
    /// PCI addresses (0000:01:00.0, 01:00.0) or mdev UUIDs
    #[arg(required = true, value_name = "ADDRESS|UUID")]
    pub devices: Vec<DeviceArg>,
    /// Only the devices named, not the other endpoints of their IOMMU groups
    #[arg(long)]
    pub only: bool,
    /// Mark the resources as provided by an external device plugin (gpupass's or NVIDIA's
    /// kubevirt-gpu-device-plugin) instead of KubeVirt's own
    #[arg(long)]
    pub external_provider: bool,
    /// VFIO backend of the PCI functions: legacy (group + container), iommufd (KubeVirt
    /// 1.9's IOMMUFD feature gate; needs --external-provider: gpupass device-plugin --backend
    /// iommufd hands out the cdev), auto (iommufd where the kernel has it and the resources
    /// come from an external provider, else legacy). docs/iommufd.md
    #[arg(long, value_enum, default_value_t = crate::inventory::backend::Policy::Auto)]
    pub backend: crate::inventory::backend::Policy,
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// libvirt connection URI (qemu:///system, test:///default, ...)
    #[arg(long, env = "LIBVIRT_DEFAULT_URI", value_name = "URI")]
    pub connect: String,
    /// Domain name
    #[arg(long, value_name = "NAME")]
    pub domain: String,
    /// PCI addresses (0000:01:00.0, 01:00.0) or mdev UUIDs
    #[arg(required = true, value_name = "ADDRESS|UUID")]
    pub devices: Vec<DeviceArg>,
    /// Change the running domain (default: the running domain if it runs, plus the persistent
    /// definition if it has one)
    #[arg(long)]
    pub live: bool,
    /// Change the persistent definition (takes effect at next boot)
    #[arg(long)]
    pub config: bool,
    /// Guest PCI address (one device or one multifunction slot), as for `xml hostdev`
    #[arg(long, value_name = "ADDRESS")]
    pub guest_address: Option<PciAddress>,
    #[command(flatten)]
    pub dev: LibvirtDeviceArgs,
}

#[derive(Debug, Args)]
pub struct DetachArgs {
    /// libvirt connection URI (qemu:///system, test:///default, ...)
    #[arg(long, env = "LIBVIRT_DEFAULT_URI", value_name = "URI")]
    pub connect: String,
    /// Domain name
    #[arg(long, value_name = "NAME")]
    pub domain: String,
    /// PCI addresses (0000:01:00.0, 01:00.0) or mdev UUIDs
    #[arg(required = true, value_name = "ADDRESS|UUID")]
    pub devices: Vec<DeviceArg>,
    /// Only the devices named, not the other endpoints of their IOMMU groups
    #[arg(long)]
    pub only: bool,
    /// Change the running domain
    #[arg(long)]
    pub live: bool,
    /// Change the persistent definition
    #[arg(long)]
    pub config: bool,
}

/// Domain names: libvirt's schema allows anything but a newline; the QEMU driver also
/// refuses '/'. Control characters cannot be written in XML 1.0 at all.
pub fn parse_domain_name(s: &str) -> Result<String, String> {
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
pub fn parse_memory_kib(s: &str) -> Result<u64, String> {
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

/// Why the guest's address bits are limited, for the notes.
fn limit_reason(w: &crate::output::layout::Widths, limit: u32) -> String {
    match (w.phys_bits, w.iommu) {
        (Some(p), _) if p == limit => "--phys-bits".to_string(),
        (_, Some(i)) if i == limit => format!(
            "this host's IOMMU translates {i} bits{}",
            w.cpu.map(|c| format!(", its CPU has {c}")).unwrap_or_default()
        ),
        _ => "--phys-bits".to_string(),
    }
}

/// Say what `-cpu` gives the guest, and how to keep it with a `-cpu` of your own.
pub(crate) fn cpu_note(c: &qemu::GuestCpu, w: &crate::output::layout::Widths) {
    let props = match c.limit {
        Some(n) => format!("host-phys-bits=on,host-phys-bits-limit={n}"),
        None => "host-phys-bits=on".to_string(),
    };
    let why = match c.limit {
        Some(n) => format!(
            "the host CPU's physical address bits, at most {n} ({})",
            limit_reason(w, n)
        ),
        None => "the host CPU's physical address bits".to_string(),
    };
    if c.model == "none" {
        messages::note(format_args!(
            "--cpu none: add {props} to your -cpu, so the guest gets {why} and the firmware can place the 64-bit window above RAM"
        ));
    } else {
        messages::note(format_args!(
            "-cpu {}: the guest gets {why}, so the firmware can place the 64-bit window above RAM; QEMU takes only the last -cpu, so pass your own model and flags as --cpu MODEL,FLAGS (or --cpu none and add {props} to yours)",
            c.value()
        ));
    }
}

/// Whether `xml domain` writes the plan's address-bit limit on `<maxphysaddr>`: only where the
/// target libvirt has `limit` (9.3+; the installed libvirt unless `--libvirt-version`), else a
/// note that the guest gets all of the CPU's bits. The target is asked only when a limit applies.
fn xml_maxphysaddr_limit(plan: &crate::output::plan::VmPlan, a: &XmlBackendArgs) -> bool {
    let w = plan.widths;
    let Some(n) = plan.phys_limit else {
        return false;
    };
    let (target, source) = match a.libvirt_version {
        Some(v) => (v, "from --libvirt-version".to_string()),
        None => installed_libvirt(),
    };
    if target >= libvirt::LibvirtVersion::MAXPHYSADDR_LIMIT {
        messages::note(format_args!(
            "<maxphysaddr mode='passthrough' limit='{n}'/>: the guest gets the host CPU's physical address bits, at most {n} ({})",
            limit_reason(&w, n)
        ));
        return true;
    }
    messages::note(format_args!(
        "the guest's physical address bits should be at most {n} ({}), but the target libvirt {target} ({source}) has no limit on <maxphysaddr> (9.3+): the guest gets all of the host CPU's, and OVMF may place BARs where the IOMMU cannot map them; name a libvirt 9.3 or newer with --libvirt-version",
        limit_reason(&w, n)
    ));
    false
}

fn json_out(out: &mut dyn Write, v: &serde_json::Value) -> Result<(), VmOutError> {
    serde_json::to_writer_pretty(&mut *out, v).map_err(io::Error::from)?;
    writeln!(out)?;
    Ok(())
}

fn multifunction_note(sel: &Selection) {
    for g in sel.slots().filter(|g| g.is_multifunction()) {
        messages::note(format_args!(
            "without --guest-address libvirt places {} in separate guest slots; pass --guest-address BB:00.0 (a free pcie-root-port bus of your domain) to keep them one multifunction device",
            g.functions
                .iter()
                .map(|f| f.device.address.to_string())
                .collect::<Vec<_>>()
                .join(" and ")
        ));
    }
}

/// `gpupass xml hostdev|domain`.
fn xml(inv: &Inventory, cmd: &XmlCommand, json: bool, out: &mut dyn Write) -> Result<Exit, VmOutError> {
    match cmd {
        XmlCommand::Hostdev(a) => {
            // A kernel without iommufd fails `--backend iommufd` before anything else is said.
            crate::inventory::backend::resolve_vm(a.vfio.backend, inv, &[], None)?;
            let sel = select(inv, &a.devices, a.dev.only, a.dev.consumer())?;
            let mut opts = a.dev.hostdev_options();
            opts.iommufd = xml_iommufd(inv, &sel, &a.vfio, false)?.per_hostdev;
            print_notes(&libvirt::check_display(&sel, &opts)?);
            let devs = libvirt::hostdevs(&sel, &opts, a.guest_address)?;
            if a.guest_address.is_none() {
                multifunction_note(&sel);
            }
            if json {
                let list: Vec<serde_json::Value> = devs
                    .iter()
                    .map(|d| serde_json::json!({ "device": d.label, "xml": d.xml }))
                    .collect();
                json_out(out, &serde_json::json!({ "hostdevs": list }))?;
            } else {
                for d in &devs {
                    out.write_all(d.xml.as_bytes())?;
                }
            }
            Ok(Exit::SUCCESS)
        }
        XmlCommand::Domain(a) => {
            crate::inventory::backend::resolve_vm(a.vfio.backend, inv, &[], None)?;
            let sel = select(inv, &a.devices, a.dev.only, a.dev.consumer())?;
            let x = xml_iommufd(inv, &sel, &a.vfio, true)?;
            let mut hostdev = a.dev.hostdev_options();
            hostdev.iommufd = x.per_hostdev;
            print_notes(&libvirt::check_display(&sel, &hostdev)?);
            // Every refusal (window, NUMA, hugepages) comes before a note is printed or XML
            // written: the plan decides them all.
            let plan = crate::output::plan::plan(
                inv,
                &sel,
                &crate::output::plan::VmRequest {
                    renderer: crate::output::plan::Renderer::Libvirt,
                    memory_kib: Some(a.memory),
                    vcpus: Some(a.vcpus),
                    firmware: a.firmware.guest(),
                    hole64: a.pci_hole64,
                    phys_bits: a.phys_bits,
                    numa: a.numa.mode(),
                    hugepages: a.hugepages,
                    viommu: a.viommu,
                    memtune: a.memtune.bool(),
                },
            )?;
            print_notes(&plan.notes);
            let maxphysaddr_limit = xml_maxphysaddr_limit(&plan, &a.vfio);
            let spec = libvirt::DomainSpec {
                name: a.name.clone(),
                memory_kib: a.memory,
                vcpus: a.vcpus,
                disk: a.disk.as_ref().map(|p| p.display().to_string()),
                firmware: match a.firmware {
                    FirmwareArg::Efi => libvirt::Firmware::Efi,
                    FirmwareArg::Bios => libvirt::Firmware::Bios,
                },
                viommu: a.viommu,
                locked: a.locked,
                hostdev,
                iommufd_domain: x.domain_wide,
                maxphysaddr_limit,
                memtune: a.memtune.bool(),
            };
            let xml = libvirt::domain(&sel, &spec, &plan)?;
            if json {
                json_out(out, &serde_json::json!({ "name": a.name, "xml": xml }))?;
            } else {
                out.write_all(xml.as_bytes())?;
            }
            Ok(Exit::SUCCESS)
        }
    }
}

/// `gpupass qemu-args`.
fn qemu(inv: &Inventory, a: &QemuArgsArgs, json: bool, out: &mut dyn Write) -> Result<Exit, VmOutError> {
    // A kernel without iommufd fails `--backend iommufd` before anything else is said.
    crate::inventory::backend::resolve_vm(a.backend, inv, &[], None)?;
    let sel = select(inv, &a.devices, a.only, Consumer::Qemu)?;
    let addrs: Vec<_> = sel.functions().map(|f| f.device.address).collect();
    let backend = qemu_backend(inv, a, &addrs)?;
    // Every refusal (window, NUMA, hugepages) comes before a note is printed: the plan decides
    // them all.
    let plan = crate::output::plan::plan(
        inv,
        &sel,
        &crate::output::plan::VmRequest {
            renderer: crate::output::plan::Renderer::Qemu,
            memory_kib: a.memory,
            vcpus: a.vcpus,
            firmware: a.firmware.guest(),
            hole64: a.pci_hole64,
            phys_bits: a.phys_bits,
            numa: a.numa.mode(),
            hugepages: a.hugepages,
            viommu: false,
            memtune: false,
        },
    )?;
    let cpu = plan.sets_address_bits().then(|| qemu::GuestCpu {
        model: a.cpu.clone(),
        limit: plan.phys_limit,
    });
    let opts = qemu::QemuOptions {
        rom_bar: a.rom_bar.map(OnOff::bool),
        rom_file: a.rom_file.as_ref().map(|p| p.display().to_string()),
        display: a.display,
        first_slot: a.first_slot,
        iommufd: backend == crate::model::Backend::Iommufd,
        fds: None,
        cpu: Some(a.cpu.clone()).filter(|c| c != "none"),
        guest_memory: true,
    };
    print_notes(&plan.notes);
    if let Some(c) = &cpu {
        cpu_note(c, &plan.widths);
    }
    if opts.iommufd && sel.mdevs().next().is_some() {
        messages::note(format_args!(
            "mdevs stay on the legacy group and container (sysfsdev=); only the PCI functions use iommufd"
        ));
    }
    let hd = libvirt::HostdevOptions {
        display: a.display,
        ..Default::default()
    };
    print_notes(&libvirt::check_display(&sel, &hd)?);
    let args = qemu::args(&sel, &opts, &plan)?;
    messages::note(format_args!(
        "these arguments assume -machine q35 (they put root ports on pcie.0)"
    ));
    if sel
        .mdevs()
        .any(|m| m.parent.as_ref().is_some_and(|p| p.vendor_id == "10de"))
    {
        messages::note(format_args!(
            "NVIDIA vGPU needs the VM's UUID on the QEMU command line: add -uuid <uuid>"
        ));
    }
    if json {
        json_out(out, &serde_json::json!({ "args": args }))?;
    } else {
        out.write_all(qemu::text(&args).as_bytes())?;
    }
    Ok(Exit::SUCCESS)
}

/// `gpupass kubevirt`.
fn kubevirt(inv: &Inventory, a: &KubevirtArgs, json: bool, out: &mut dyn Write) -> Result<Exit, VmOutError> {
    use crate::inventory::backend::Policy;
    if a.backend == Policy::Iommufd && !a.external_provider {
        return Err(VmOutError::Usage(
            "--backend iommufd needs --external-provider: KubeVirt's own PCI device plugin hands out the group node (legacy); iommufd needs a device plugin that hands out /dev/vfio/devices/vfioN and /dev/iommu (gpupass device-plugin --backend iommufd)".into(),
        ));
    }
    crate::inventory::backend::resolve_vm(a.backend, inv, &[], None)?;
    let sel = select(inv, &a.devices, a.only, Consumer::Kubevirt)?;
    let addrs: Vec<_> = sel.functions().map(|f| f.device.address).collect();
    // auto without an external provider: KubeVirt's own plugin gives the group, so legacy.
    let policy = if a.external_provider {
        a.backend
    } else {
        Policy::Legacy
    };
    let iommufd = !addrs.is_empty()
        && crate::inventory::backend::resolve_vm(policy, inv, &addrs, None)?
            == crate::model::Backend::Iommufd;
    if iommufd && sel.mdevs().next().is_some() {
        messages::note(format_args!(
            "mdevs stay on the legacy group and container; only the PCI functions use iommufd"
        ));
    }
    let p = kubevirt::permitted(&sel);
    if json {
        json_out(out, &kubevirt::json_patch(&p, a.external_provider, iommufd))?;
    } else {
        out.write_all(kubevirt::yaml(&p, a.external_provider, iommufd).as_bytes())?;
    }
    Ok(Exit::SUCCESS)
}

/// `gpupass attach`.
fn attach_cmd(inv: &Inventory, a: &AttachArgs, out: &mut dyn Write) -> Result<Exit, VmOutError> {
    let sel = select(inv, &a.devices, a.dev.only, a.dev.consumer())?;
    let opts = a.dev.hostdev_options();
    print_notes(&libvirt::check_display(&sel, &opts)?);
    let devs = libvirt::hostdevs(&sel, &opts, a.guest_address)?;
    let scope = attach::Scope::from_flags(a.live, a.config);
    let msg = attach::attach(&a.connect, &a.domain, &devs, scope)?;
    writeln!(out, "{msg}")?;
    Ok(Exit::SUCCESS)
}

/// `gpupass detach`.
fn detach_cmd(inv: &Inventory, a: &DetachArgs, out: &mut dyn Write) -> Result<Exit, VmOutError> {
    // Detaching needs no driver check (the functions are the guest's now), and the notes
    // about group viability do not apply.
    let sel = selection::select(
        inv,
        &a.devices,
        SelectOptions {
            only: a.only,
            consumer: Consumer::LibvirtManaged,
        },
    )?;
    let devs = libvirt::hostdevs(&sel, &libvirt::HostdevOptions::default(), None)?;
    let scope = attach::Scope::from_flags(a.live, a.config);
    let msg = attach::detach(&a.connect, &a.domain, &devs, scope)?;
    writeln!(out, "{msg}")?;
    Ok(Exit::SUCCESS)
}

/// `gpupass xml hostdev|domain`.
pub fn run_xml(ctx: &Ctx, cmd: XmlCommand, out: &mut dyn Write) -> Result<Exit, Error> {
    Ok(xml(&ctx.inventory()?, &cmd, ctx.json, out)?)
}

/// `gpupass qemu-args`.
pub fn run_qemu(ctx: &Ctx, a: QemuArgsArgs, out: &mut dyn Write) -> Result<Exit, Error> {
    Ok(qemu(&ctx.inventory()?, &a, ctx.json, out)?)
}

/// `gpupass kubevirt`.
pub fn run_kubevirt(ctx: &Ctx, a: KubevirtArgs, out: &mut dyn Write) -> Result<Exit, Error> {
    Ok(kubevirt(&ctx.inventory()?, &a, ctx.json, out)?)
}

/// `gpupass attach`.
pub fn run_attach(ctx: &Ctx, a: AttachArgs, out: &mut dyn Write) -> Result<Exit, Error> {
    Ok(attach_cmd(&ctx.inventory()?, &a, out)?)
}

/// `gpupass detach`.
pub fn run_detach(ctx: &Ctx, a: DetachArgs, out: &mut dyn Write) -> Result<Exit, Error> {
    Ok(detach_cmd(&ctx.inventory()?, &a, out)?)
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

    /// `probe_qemu` runs the binary with `--version` and reads the first line; a fake QEMU is
    /// a shell script printing what a release prints.
    #[test]
    fn qemu_version_probe() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let v81 = script(
            "qemu-8.1",
            r#"[ "$1" = --version ] || exit 3; echo 'QEMU emulator version 8.1.5 (Debian 1:8.1.5+ds-1)'; echo 'Copyright (c) 2003-2023 Fabrice Bellard and the QEMU Project developers'"#,
        );
        assert_eq!(probe_qemu(&v81), Ok(qemu::QemuVersion { major: 8, minor: 1 }));
        let v10 = script("qemu-10", "echo 'QEMU emulator version 10.0.2'");
        assert_eq!(probe_qemu(&v10), Ok(qemu::QemuVersion { major: 10, minor: 0 }));
        let other = script("vmm", "echo 'cloud-hypervisor v44.0'");
        assert!(probe_qemu(&other)
            .unwrap_err()
            .contains("printed no \"QEMU emulator version X.Y\" line"));
        let failing = script("broken", "echo 'QEMU emulator version 9.2.0'; exit 1");
        assert!(probe_qemu(&failing).unwrap_err().contains("--version failed"));
        let missing = dir.path().join("absent");
        assert!(probe_qemu(&missing).unwrap_err().starts_with("cannot run"));
    }

    #[test]
    fn domain_names() {
        assert!(parse_domain_name("a<b&c \"q\" 'x' ü").is_ok());
        assert!(parse_domain_name("a/b").is_err());
        assert!(parse_domain_name("a\nb").is_err());
        assert!(parse_domain_name("").is_err());
    }
}
