//! Which devices a VM output carries: resolve `DEVICE` arguments (PCI addresses, mdev UUIDs)
//! against the inventory, expand each PCI function to its IOMMU group, group functions of one
//! slot together, and check that VFIO can actually hand them to a guest.
//!
//! Shared by the libvirt, QEMU and KubeVirt renderers so that all three agree on what "pass
//! 01:00.0" means. Pure: reads only the [`Inventory`].
//!
//! Kernel facts encoded here:
//! - VFIO gives a VM whole IOMMU groups: the group is usable only when every member is on a
//!   VFIO driver, driverless, on pci-stub, or a bridge. Bridges (root ports, switch ports) are
//!   never passed; every other member goes to the guest unless the user says `--only`.
//! - A guest sees the other functions of a slot only if function 0 is present and flagged
//!   multifunction, so functions of one host slot stay in one guest slot, function 0 first.
//! - QEMU and an unmanaged libvirt hostdev open `/dev/vfio/<group>`, which exists only while a
//!   VFIO driver (vfio-pci or a variant such as `nvgrace_gpu_vfio_pci`) holds the function.
//!   NVIDIA's vendor-specific vGPU (kernel 6.8+, vGPU 17+) is the exception: a VF with a
//!   profile in `nvidia/current_vgpu_type` stays on `nvidia` and is still passed as a PCI
//!   function.

use crate::model::{Inventory, MdevInstance, MdevType, PciAddress, PciDevice};
use std::fmt;
use std::str::FromStr;

/// One `DEVICE` argument: a PCI function or an mdev instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceArg {
    Pci(PciAddress),
    /// Lower-case UUID of a mediated device.
    Mdev(String),
}

/// A `DEVICE` argument that is neither an address nor a UUID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid device {input:?}: expected a PCI address (0000:01:00.0 or 01:00.0) or an mdev UUID (like 2f3e4d5c-6b7a-4988-8776-655443322110); {reason}")]
pub struct DeviceArgError {
    pub input: String,
    pub reason: String,
}

impl FromStr for DeviceArg {
    type Err = DeviceArgError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if let Some(u) = crate::model::canonical_uuid(t) {
            return Ok(DeviceArg::Mdev(u));
        }
        t.parse::<PciAddress>()
            .map(DeviceArg::Pci)
            .map_err(|e| DeviceArgError {
                input: s.to_string(),
                reason: format!("as an address: {}", e.reason),
            })
    }
}

impl fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceArg::Pci(a) => write!(f, "{a}"),
            DeviceArg::Mdev(u) => f.write_str(u),
        }
    }
}

/// Who will consume the output: decides the driver rule and the hints in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Consumer {
    /// libvirt with `managed='yes'`: libvirt detaches the functions itself at VM start.
    LibvirtManaged,
    /// libvirt with `managed='no'`: the functions must already be on a VFIO driver.
    LibvirtUnmanaged,
    /// QEMU command line: the functions must already be on a VFIO driver.
    Qemu,
    /// KubeVirt: its device plugin offers only functions on a VFIO driver.
    Kubevirt,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct SelectOptions {
    /// Emit only the named functions, not their IOMMU-group companions.
    pub only: bool,
    pub consumer: Consumer,
}

/// One PCI function going to the guest.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SelectedFunction {
    pub device: PciDevice,
    /// Named on the command line (not only pulled in as a group companion). Per-device
    /// options such as `--rom-file` apply to these.
    pub requested: bool,
    /// Function number in the guest slot: the host's when the host slot's function 0 is
    /// passed, else 0, 1, ... in host order (a guest slot needs a function 0).
    pub guest_function: u8,
}

/// Functions of one host slot: one guest slot, multifunction when more than one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SlotGroup {
    /// Sorted by host function number.
    pub functions: Vec<SelectedFunction>,
}

impl SlotGroup {
    pub(crate) fn is_multifunction(&self) -> bool {
        self.functions.len() > 1
    }

    /// Host address of the first function.
    pub(crate) fn first(&self) -> PciAddress {
        self.functions[0].device.address
    }
}

/// One mdev instance going to the guest.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SelectedMdev {
    pub instance: MdevInstance,
    /// The type as the parent advertises it (name, device_api), when the inventory has it.
    pub mdev_type: Option<MdevType>,
    /// The parent PCI function, when the parent is one.
    pub parent: Option<PciDevice>,
}

impl SelectedMdev {
    /// A display-capable vGPU: a vfio-pci mdev whose parent is a display controller
    /// (class 03). Only these can take libvirt `display='on'` / QEMU `display=on`.
    pub(crate) fn display_capable(&self) -> bool {
        let api_pci = self
            .mdev_type
            .as_ref()
            .and_then(|t| t.device_api.as_deref())
            .is_some_and(|a| a == "vfio-pci");
        let parent_display = self.parent.as_ref().is_some_and(|p| p.base_class() == 0x03);
        api_pci && parent_display
    }

    /// The type's `name` (what KubeVirt's `mdevNameSelector` matches), else its id.
    pub(crate) fn type_name(&self) -> Option<&str> {
        self.mdev_type
            .as_ref()
            .and_then(|t| t.name.as_deref())
            .or(self.instance.type_id.as_deref())
    }
}

/// One guest slot's worth of devices, in the order first named on the command line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Target {
    Slot(SlotGroup),
    Mdev(Box<SelectedMdev>),
}

/// The resolved device list every VM renderer works from.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Selection {
    pub targets: Vec<Target>,
    /// Things the user should know (companions added, groups left partly on the host):
    /// printed to stderr, never into the rendered output.
    pub notes: Vec<String>,
}

impl Selection {
    pub(crate) fn slots(&self) -> impl Iterator<Item = &SlotGroup> {
        self.targets.iter().filter_map(|t| match t {
            Target::Slot(s) => Some(s),
            Target::Mdev(_) => None,
        })
    }

    pub(crate) fn mdevs(&self) -> impl Iterator<Item = &SelectedMdev> {
        self.targets.iter().filter_map(|t| match t {
            Target::Mdev(m) => Some(&**m),
            Target::Slot(_) => None,
        })
    }

    /// Every selected PCI function, slot by slot.
    pub(crate) fn functions(&self) -> impl Iterator<Item = &SelectedFunction> {
        self.slots().flat_map(|s| s.functions.iter())
    }
}

/// Why the devices cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("no PCI device {addr} in the inventory; `gpupass list --all` shows the devices there are")]
    NoSuchDevice { addr: PciAddress },
    #[error("no mediated device {uuid} in the inventory (active mdevs are under /sys/bus/mdev/devices); create it first (mdevctl start, or libvirt nodedev-create)")]
    NoSuchMdev { uuid: String },
    #[error("{addr} is a PCI bridge ({name}); bridges stay with the host: name the device behind it")]
    Bridge { addr: PciAddress, name: String },
    #[error("{addr} has no IOMMU group, so VFIO cannot pass it to a VM; enable the IOMMU (intel_iommu=on or amd_iommu=on) and check with `gpupass check`")]
    NoIommuGroup { addr: PciAddress },
    #[error("{listing} {verb} not bound to vfio-pci (or a VFIO variant driver); {who} can pass only devices a VFIO driver holds. Bind first: {commands}{managed_hint}")]
    NotVfio {
        listing: String,
        verb: &'static str,
        who: &'static str,
        commands: String,
        managed_hint: &'static str,
        offenders: Vec<PciAddress>,
    },
}

fn requires_vfio(c: Consumer) -> bool {
    !matches!(c, Consumer::LibvirtManaged)
}

/// NVIDIA vendor-specific vGPU: a VF with a non-zero `current_vgpu_type`.
fn is_nvidia_vendor_vgpu(d: &PciDevice) -> bool {
    d.physfn.is_some()
        && d.current_vgpu_type
            .as_deref()
            .is_some_and(|t| !t.is_empty() && t != "0")
}

/// Resolve `args` into a [`Selection`].
pub(crate) fn select(
    inv: &Inventory,
    args: &[DeviceArg],
    opts: SelectOptions,
) -> Result<Selection, SelectError> {
    /// A guest slot in first-mention order: a host slot (index into `slots`) or an mdev.
    enum Entry {
        Slot(usize),
        Mdev(Box<SelectedMdev>),
    }
    let mut entries: Vec<Entry> = Vec::new();
    // Host slots, each with its function addresses and whether they were named.
    let mut slots: Vec<Vec<(PciAddress, bool)>> = Vec::new();
    let mut notes = Vec::new();
    let mut add_fn = |entries: &mut Vec<Entry>, addr: PciAddress, requested: bool| {
        let i = match slots.iter().position(|fns| fns[0].0.same_slot(&addr)) {
            Some(i) => i,
            None => {
                slots.push(Vec::new());
                entries.push(Entry::Slot(slots.len() - 1));
                slots.len() - 1
            }
        };
        match slots[i].iter_mut().find(|(a, _)| *a == addr) {
            Some(f) => f.1 |= requested,
            None => slots[i].push((addr, requested)),
        }
    };

    for arg in args {
        match arg {
            DeviceArg::Pci(addr) => {
                let d = inv
                    .device(addr)
                    .ok_or(SelectError::NoSuchDevice { addr: *addr })?;
                if d.is_bridge {
                    return Err(SelectError::Bridge {
                        addr: *addr,
                        name: d.display_name(),
                    });
                }
                let Some(group) = d.iommu_group.and_then(|n| inv.group(n)) else {
                    return Err(SelectError::NoIommuGroup { addr: *addr });
                };
                add_fn(&mut entries, *addr, true);
                let companions = group
                    .members
                    .iter()
                    .filter(|m| *m != addr)
                    .filter_map(|m| inv.device(m))
                    .filter(|m| !m.is_bridge);
                for c in companions {
                    let drv = c.driver.as_deref().unwrap_or("no driver");
                    if opts.only {
                        if !crate::model::driver_allows_vfio(c.driver.as_deref()) {
                            notes.push(format!(
                                "IOMMU group {} also holds {} ({drv}), left out by --only: the group cannot be opened while it stays on {drv}; `gpupass bind {addr}` moves the whole group",
                                group.number, c.address
                            ));
                        }
                    } else {
                        notes.push(format!(
                            "added {} ({drv}, {}): it shares IOMMU group {} with {addr}, and VFIO gives a VM whole groups (--only passes just the devices you name)",
                            c.address,
                            c.display_name(),
                            group.number
                        ));
                        add_fn(&mut entries, c.address, false);
                    }
                }
            }
            DeviceArg::Mdev(uuid) => {
                let dup = entries
                    .iter()
                    .any(|e| matches!(e, Entry::Mdev(m) if m.instance.uuid.eq_ignore_ascii_case(uuid)));
                if dup {
                    continue;
                }
                let m = inv
                    .mdev(uuid)
                    .ok_or_else(|| SelectError::NoSuchMdev { uuid: uuid.clone() })?;
                let parent = m
                    .parent
                    .parse::<PciAddress>()
                    .ok()
                    .and_then(|a| inv.device(&a))
                    .cloned();
                let mdev_type = parent.as_ref().and_then(|p| {
                    p.mdev_types
                        .iter()
                        .find(|t| Some(&t.id) == m.type_id.as_ref())
                        .cloned()
                });
                entries.push(Entry::Mdev(Box::new(SelectedMdev {
                    instance: m.clone(),
                    mdev_type,
                    parent,
                })));
            }
        }
    }

    let slot_group = |fns: &[(PciAddress, bool)]| {
        let mut fns = fns.to_vec();
        fns.sort_by_key(|(a, _)| a.function);
        let has_fn0 = fns.iter().any(|(a, _)| a.function == 0);
        let functions = fns
            .iter()
            .enumerate()
            .filter_map(|(i, (a, requested))| {
                inv.device(a).map(|d| SelectedFunction {
                    device: d.clone(),
                    requested: *requested,
                    guest_function: if has_fn0 { a.function } else { i as u8 },
                })
            })
            .collect();
        SlotGroup { functions }
    };
    let mut sel = Selection {
        targets: entries
            .into_iter()
            .map(|e| match e {
                Entry::Slot(i) => Target::Slot(slot_group(&slots[i])),
                Entry::Mdev(m) => Target::Mdev(m),
            })
            .collect(),
        notes,
    };
    check_drivers(&mut sel, opts.consumer)?;
    Ok(sel)
}

fn check_drivers(sel: &mut Selection, consumer: Consumer) -> Result<(), SelectError> {
    if !requires_vfio(consumer) {
        return Ok(());
    }
    let mut offenders: Vec<PciDevice> = Vec::new();
    let mut notes = Vec::new();
    for f in sel.functions() {
        let d = &f.device;
        // The model's first readiness check; the group's own checks are the notes of
        // `select` (companions added, or left out by --only).
        match (d.check_vfio_driver(), d.driver.as_deref()) {
            (Ok(()), _) => {}
            (Err(_), Some(drv)) if is_nvidia_vendor_vgpu(d) => notes.push(format!(
                "{} carries NVIDIA vGPU profile {} and stays on {drv} (vendor-specific VFIO): passed as a PCI function",
                d.address,
                d.current_vgpu_type.as_deref().unwrap_or("?")
            )),
            _ => offenders.push(d.clone()),
        }
    }
    sel.notes.extend(notes);
    if offenders.is_empty() {
        return Ok(());
    }
    let listing = offenders
        .iter()
        .map(|d| format!("{} ({})", d.address, d.driver.as_deref().unwrap_or("no driver")))
        .collect::<Vec<_>>()
        .join(", ");
    // One bind per IOMMU group: `gpupass bind` moves the whole group.
    let mut groups: Vec<(u32, PciAddress)> = Vec::new();
    for d in &offenders {
        let g = d.iommu_group.unwrap_or(u32::MAX);
        if !groups.iter().any(|(n, _)| *n == g) {
            groups.push((g, d.address));
        }
    }
    let commands = groups
        .iter()
        .map(|(_, a)| format!("`gpupass bind {a}`"))
        .collect::<Vec<_>>()
        .join(" and ");
    Err(SelectError::NotVfio {
        verb: if offenders.len() == 1 { "is" } else { "are" },
        listing,
        who: match consumer {
            Consumer::Qemu => "QEMU",
            Consumer::Kubevirt => "KubeVirt's device plugins",
            _ => "libvirt with managed='no'",
        },
        commands,
        managed_hint: match consumer {
            Consumer::LibvirtUnmanaged => {
                ", or pass --managed so that libvirt detaches them when the VM starts (and reattaches them to the host driver when it stops)"
            }
            _ => "",
        },
        offenders: offenders.iter().map(|d| d.address).collect(),
    })
}
