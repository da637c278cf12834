//! `gpupass check`: is this host ready for device passthrough?
//!
//! Kernel facts used:
//! - IOMMU on means `sys/kernel/iommu_groups/` has entries (libvirt's virt-host-validate uses
//!   the same test). The firmware tables `sys/firmware/acpi/tables/DMAR` (Intel VT-d) and
//!   `IVRS` (AMD-Vi) tell which kernel parameter to suggest.
//! - Interrupt remapping in use shows as `IR-` prefixed chips (`IR-PCI-MSI`) in
//!   `proc/interrupts`; without it VFIO refuses MSI unless
//!   `vfio_iommu_type1.allow_unsafe_interrupts=1`.
//! - A module is loaded when `sys/module/<name>` exists; it is available when
//!   `lib/modules/<release>/modules.dep` or `modules.builtin` names it.

use crate::host::{read_bounded, HostRoot};
use crate::model::Inventory;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    Pass,
    Warn,
    Fail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CheckItem {
    pub name: String,
    pub status: Status,
    pub detail: String,
    /// What to do about a warn/fail.
    pub fix: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Readiness {
    pub items: Vec<CheckItem>,
    /// False when passthrough cannot work (any `fail`).
    pub ready: bool,
}

fn item(name: &str, status: Status, detail: String, fix: Option<String>) -> CheckItem {
    CheckItem {
        name: name.into(),
        status,
        detail,
        fix,
    }
}

enum ModState {
    Loaded,
    Available,
    Missing,
    Unknown,
}

fn module_state(host: &HostRoot, release: Option<&str>, name: &str) -> ModState {
    if host.sys_module(name).exists() {
        return ModState::Loaded;
    }
    let Some(rel) = release else {
        return ModState::Unknown;
    };
    let dir = host.modules_dir(rel);
    let pat_names = [format!("/{}.ko", name), format!("/{}.ko", name.replace('_', "-"))];
    let mut seen_table = false;
    for table in ["modules.dep", "modules.builtin"] {
        if let Ok(text) = read_bounded(&dir.join(table), 16 * 1024 * 1024) {
            seen_table = true;
            if text.lines().any(|l| {
                let path = l.split(':').next().unwrap_or("");
                pat_names.iter().any(|p| path.contains(p.as_str()))
            }) {
                return ModState::Available;
            }
        }
    }
    if seen_table {
        ModState::Missing
    } else {
        ModState::Unknown
    }
}

/// Assess readiness from the host tree and its inventory.
pub(crate) fn assess(host: &HostRoot, inv: &Inventory) -> Readiness {
    let mut items = Vec::new();
    let cmdline = read_bounded(&host.proc_cmdline(), 64 * 1024).unwrap_or_default();
    let args: Vec<&str> = cmdline.split_whitespace().collect();
    let intel = host.acpi_tables().join("DMAR").exists();
    let amd = host.acpi_tables().join("IVRS").exists();
    let suggested = if amd {
        "amd_iommu=on iommu=pt"
    } else {
        "intel_iommu=on iommu=pt"
    };

    // 1. IOMMU groups.
    let groups = inv.groups.len();
    if groups > 0 {
        items.push(item(
            "iommu",
            Status::Pass,
            format!("IOMMU enabled: {groups} IOMMU groups"),
            None,
        ));
    } else {
        let hw = match (intel, amd) {
            (true, _) => "the firmware has an Intel VT-d (DMAR) table",
            (_, true) => "the firmware has an AMD-Vi (IVRS) table",
            _ => "no DMAR/IVRS table found: enable VT-d / AMD-Vi (IOMMU) in the firmware setup first",
        };
        items.push(item(
            "iommu",
            Status::Fail,
            format!("no IOMMU groups in /sys/kernel/iommu_groups: the IOMMU is off ({hw})"),
            Some(format!(
                "add `{suggested}` to the kernel command line (GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub, then update-grub) and reboot"
            )),
        ));
    }

    // 2. Kernel command line.
    let iommu_args: Vec<&str> = args
        .iter()
        .copied()
        .filter(|a| a.starts_with("intel_iommu=") || a.starts_with("amd_iommu=") || a.starts_with("iommu="))
        .collect();
    if args
        .iter()
        .any(|a| *a == "intel_iommu=off" || *a == "amd_iommu=off" || *a == "iommu=off")
    {
        items.push(item(
            "cmdline",
            Status::Fail,
            format!(
                "the kernel command line turns the IOMMU off: {}",
                iommu_args.join(" ")
            ),
            Some(format!("replace it with `{suggested}` and reboot")),
        ));
    } else if iommu_args.is_empty() {
        items.push(item(
            "cmdline",
            if groups > 0 { Status::Pass } else { Status::Warn },
            "no IOMMU option on the kernel command line (the kernel default applies)".into(),
            if groups > 0 {
                None
            } else {
                Some(format!("add `{suggested}`"))
            },
        ));
    } else {
        items.push(item(
            "cmdline",
            Status::Pass,
            format!("kernel command line has {}", iommu_args.join(" ")),
            None,
        ));
    }

    // 3. Interrupt remapping.
    let interrupts = read_bounded(&host.proc_interrupts(), 4 * 1024 * 1024).ok();
    let unsafe_ok = read_bounded(
        &host
            .sys_module("vfio_iommu_type1")
            .join("parameters/allow_unsafe_interrupts"),
        16,
    )
    .map(|s| s.trim() == "Y" || s.trim() == "1")
    .unwrap_or(false);
    match interrupts {
        Some(t) if t.contains("IR-") => items.push(item(
            "interrupt-remapping",
            Status::Pass,
            "interrupt remapping is in use (IR- interrupt chips in /proc/interrupts)".into(),
            None,
        )),
        Some(_) if unsafe_ok => items.push(item(
            "interrupt-remapping",
            Status::Warn,
            "no interrupt remapping; vfio_iommu_type1 allow_unsafe_interrupts=Y lets VFIO work without isolation of MSIs".into(),
            Some("enable interrupt remapping (x2APIC / `intremap=on`) to isolate device interrupts".into()),
        )),
        Some(_) => items.push(item(
            "interrupt-remapping",
            if groups > 0 { Status::Warn } else { Status::Fail },
            "no interrupt remapping seen in /proc/interrupts: VFIO will refuse MSI/MSI-X".into(),
            Some("enable interrupt remapping (firmware x2APIC, kernel `intremap=on`), or as a last resort `vfio_iommu_type1.allow_unsafe_interrupts=1`".into()),
        )),
        None => items.push(item(
            "interrupt-remapping",
            Status::Warn,
            "cannot read /proc/interrupts: interrupt remapping unknown".into(),
            None,
        )),
    }

    // 4. Modules.
    let release = inv.kernel.clone();
    for (name, required) in [
        ("vfio", true),
        ("vfio_iommu_type1", true),
        ("vfio_pci", true),
        ("mdev", false),
        ("kvm", false),
    ] {
        let st = module_state(host, release.as_deref(), name);
        let (status, detail, fix) = match st {
            ModState::Loaded => (Status::Pass, format!("module {name} is loaded"), None),
            ModState::Available => (
                Status::Pass,
                format!("module {name} is available (not loaded yet; gpupass loads it when binding)"),
                None,
            ),
            ModState::Missing | ModState::Unknown if !required => (
                Status::Warn,
                format!("module {name} is neither loaded nor found"),
                Some(format!("modprobe {name}")),
            ),
            ModState::Unknown => (
                Status::Warn,
                format!("module {name} is not loaded and the module tables cannot be read"),
                Some(format!("modprobe {name}")),
            ),
            ModState::Missing => (
                Status::Fail,
                format!("module {name} is not loaded and not in this kernel's modules"),
                Some("install a kernel built with VFIO (CONFIG_VFIO_PCI)".into()),
            ),
        };
        items.push(item(&format!("module:{name}"), status, detail, fix));
    }

    // 5. Device nodes.
    items.push(if inv.vfio_container_present {
        item("dev-vfio", Status::Pass, "/dev/vfio/vfio exists".into(), None)
    } else {
        item(
            "dev-vfio",
            Status::Warn,
            "/dev/vfio/vfio is missing (the vfio module is not loaded)".into(),
            Some("modprobe vfio-pci".into()),
        )
    });
    if inv.iommufd_present {
        items.push(item(
            "dev-iommu",
            Status::Pass,
            "/dev/iommu (iommufd) exists".into(),
            None,
        ));
    }
    items.extend(iommufd_items(inv));
    items.push(if host.dev().join("kvm").exists() {
        item("dev-kvm", Status::Pass, "/dev/kvm exists".into(), None)
    } else {
        item(
            "dev-kvm",
            Status::Warn,
            "/dev/kvm is missing: VMs (and `gpupass boot`) need KVM".into(),
            Some(
                "enable virtualization (VT-x/AMD-V) in the firmware and modprobe kvm_intel or kvm_amd".into(),
            ),
        )
    });
    let ready = !items.iter().any(|i| i.status == Status::Fail);
    Readiness { items, ready }
}

/// iommufd readiness and what serves `/dev/vfio/vfio` (docs/iommufd.md). A kernel older than
/// the VFIO cdev (6.1) is no error: the legacy backend serves everything there.
fn iommufd_items(inv: &Inventory) -> Vec<CheckItem> {
    use crate::model::VfioContainer;
    let Some(f) = &inv.iommufd else {
        return Vec::new();
    };
    let old_kernel = inv
        .kernel
        .as_deref()
        .and_then(crate::inventory::backend::kernel_version)
        .is_some_and(|v| v < crate::inventory::backend::CDEV_SINCE)
        && f.kernel_cdev != Some(true);
    let mut items = vec![if f.usable {
        let n = inv.devices.iter().filter(|d| d.vfio_cdev.is_some()).count();
        item(
            "iommufd",
            Status::Pass,
            format!(
                "iommufd is usable: /dev/iommu exists and the kernel has the VFIO device cdev ({n} function(s) have one); --backend auto uses it"
            ),
            None,
        )
    } else {
        let reason = f.reason.clone().unwrap_or_default();
        let kernel_lacks = old_kernel || f.kernel_cdev == Some(false);
        let fix = if kernel_lacks {
            None
        } else if !f.loaded {
            Some(
                "modprobe iommufd (a kernel built with CONFIG_IOMMUFD and CONFIG_VFIO_DEVICE_CDEV, 6.6+)"
                    .into(),
            )
        } else {
            Some(format!(
                "{}; until then --backend auto uses legacy",
                crate::inventory::backend::IOMMUFD_NEEDS
            ))
        };
        item(
            "iommufd",
            if kernel_lacks { Status::Pass } else { Status::Warn },
            format!("iommufd is not usable: {reason}"),
            fix,
        )
    }];
    let detail = match f.vfio_container {
        VfioContainer::Legacy => "/dev/vfio/vfio is VFIO's legacy container (type1 IOMMU)",
        VfioContainer::IommufdEmulation => {
            "/dev/vfio/vfio is iommufd's emulation of the legacy container (CONFIG_IOMMUFD_VFIO_CONTAINER)"
        }
        VfioContainer::Absent => "/dev/vfio/vfio does not exist",
        VfioContainer::Unknown => {
            "/dev/vfio/vfio exists; whether it is the legacy container or iommufd's emulation is unknown (no kernel config, vfio_iommu_type1 not loaded)"
        }
    };
    items.push(item("vfio-container", Status::Pass, detail.into(), None));
    items
}
