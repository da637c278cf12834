//! `gpupass qemu-args`: the QEMU command-line arguments that pass the devices, and the QEMU
//! version probe that decides whether they use iommufd.

use super::{
    json_out, parse_cpu, parse_memory_kib, parse_slot, print_notes, select, FirmwareArg, NumaArg, OnOff,
    VmOutError,
};
use crate::cli::ctx::Ctx;
use crate::cli::error::{Error, Exit};
use crate::messages;
use crate::model::{Inventory, PciAddress};
use crate::output::selection::{Consumer, DeviceArg};
use crate::output::{libvirt, qemu};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

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

/// Run `binary --version` (at most 10 s) and read the QEMU version from its first line.
fn probe_qemu(binary: &std::path::Path) -> Result<qemu::QemuVersion, String> {
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
            cpu: Some(a.cpu.clone()),
        },
    )?;
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

/// `gpupass qemu-args`.
pub fn run_qemu(ctx: &Ctx, a: QemuArgsArgs, out: &mut dyn Write) -> Result<Exit, Error> {
    Ok(qemu(&ctx.inventory()?, &a, ctx.json, out)?)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
