//! `gpupass xml hostdev` and `gpupass xml domain`: libvirt `<hostdev>` elements for the
//! devices, or a complete q35 KVM domain with them, and the choice of the VFIO backend for the
//! target libvirt.

use super::{
    installed_libvirt, json_out, parse_domain_name, parse_memory_kib, print_notes, select, FirmwareArg,
    LibvirtDeviceArgs, NumaArg, OnOff, VmOutError, XmlBackendArgs,
};
use crate::cli::ctx::Ctx;
use crate::cli::error::{Error, Exit};
use crate::messages;
use crate::model::{Inventory, PciAddress};
use crate::output::libvirt;
use crate::output::selection::{DeviceArg, Selection};
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::PathBuf;

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
            w.limit_reason(n)
        ));
        return true;
    }
    messages::note(format_args!(
        "the guest's physical address bits should be at most {n} ({}), but the target libvirt {target} ({source}) has no limit on <maxphysaddr> (9.3+): the guest gets all of the host CPU's, and OVMF may place BARs where the IOMMU cannot map them; name a libvirt 9.3 or newer with --libvirt-version",
        w.limit_reason(n)
    ));
    false
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
                    cpu: None,
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

/// `gpupass xml hostdev|domain`.
pub fn run_xml(ctx: &Ctx, cmd: XmlCommand, out: &mut dyn Write) -> Result<Exit, Error> {
    Ok(xml(&ctx.inventory()?, &cmd, ctx.json, out)?)
}
