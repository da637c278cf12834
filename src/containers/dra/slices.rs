//! Which IOMMU groups this node offers through DRA, and the `resource.k8s.io/v1` ResourceSlices
//! that say so: pure functions of the [`Inventory`] (so `gpupass dra slices` works with
//! `--root` and `--from-json` like every read command).
//!
//! **One DRA device per publishable IOMMU group.** VFIO opens a function through its whole
//! group, so the group is what a claim gets: the device is named after the group's lead
//! function (`pci-0000-00-05-0`), carries that function's `resource.kubernetes.io/pciBusID` and
//! lists every member. The scheduler can then never hand two members of one group to two
//! claims, with no alpha or beta API (KEP-4815 shared counters would model the same with one
//! device per function consuming a per-group counter; docs/dra.md says why not).
//!
//! A group is published when every endpoint member is something a guest should get: a display
//! controller, a processing accelerator or co-processor, a function the administrator already
//! put on a VFIO driver, or an audio/USB/serial-bus companion in the same slot as one of those.
//! Everything else (storage, NICs on host drivers, chipset functions, the boot VGA device, a
//! PF whose VFs are enabled, a parent with live mediated devices) is not published, and
//! [`decide`] says why for each group.

use super::attrs::{self, int, node_backend, s, MAX_ATTRIBUTES, MAX_VALUE_LEN};
use super::slots;
use super::{DOMAIN, STANDARD_DOMAIN};
use crate::containers::kubelet::pool;
/// How a pool is told the API server (the kit's: [`crate::containers::kubelet::pool`]).
pub use crate::containers::kubelet::pool::{to_list_json, Pool, SliceOptions};
use crate::model::{is_vfio_driver, BarKind, Inventory, IommuGroup, PciAddress, PciDevice};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSlice};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// A group this node offers: the DRA device a claim gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Publishable {
    /// The DRA device name (`pci-0000-00-05-0`, from the lead function).
    pub name: String,
    pub group: u32,
    /// The function whose `pciBusID` the device carries (KubeVirt passes it to the VM).
    pub lead: PciAddress,
    /// Every endpoint function of the group, in address order (what Prepare binds).
    pub members: Vec<PciAddress>,
}

/// What [`decide`] concluded for one group (or one function without a group).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct GroupDecision {
    /// `null` for a function the IOMMU does not isolate at all.
    pub group: Option<u32>,
    /// Its functions (bridges included), in address order.
    pub members: Vec<PciAddress>,
    /// The DRA device, when published.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Why not, when not published.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The DRA device name of a group led by `a`: a DNS label (`pci-0000-00-05-0`).
pub(crate) fn device_name(a: &PciAddress) -> String {
    format!(
        "pci-{:04x}-{:02x}-{:02x}-{:x}",
        a.domain, a.bus, a.device, a.function
    )
}

/// Functions a guest should get as the main device of a group.
fn is_primary(d: &PciDevice) -> bool {
    let (base, sub) = (d.base_class(), d.subclass());
    base == 0x03 || base == 0x12 || (base == 0x0b && sub == 0x40)
}

/// Functions that go along with a primary one of the same slot (HDMI audio, USB-C, UCSI).
fn is_companion(d: &PciDevice) -> bool {
    let (base, sub) = (d.base_class(), d.subclass());
    (base == 0x04 && sub == 0x03) || (base == 0x0c && matches!(sub, 0x03 | 0x80))
}

fn on_vfio(d: &PciDevice) -> bool {
    d.driver.as_deref().is_some_and(is_vfio_driver)
}

fn label(d: &PciDevice) -> String {
    format!(
        "{} ({}, {})",
        d.address,
        d.class_name.as_deref().unwrap_or("class ").trim_end(),
        d.driver.as_deref().unwrap_or("no driver")
    )
}

/// Decide one group: `Ok(lead)` or the reason it is not published.
fn judge<'a>(
    inv: &Inventory,
    g: &IommuGroup,
    members: &[&'a PciDevice],
    mdev_parents: &HashMap<String, usize>,
) -> Result<&'a PciDevice, String> {
    if !g.mdev_members.is_empty() {
        return Err(format!(
            "is the group of mediated device {}: mdev instances are offered through their parent's types (the slots of `gpupass dra slices --explain`), not as groups",
            g.mdev_members.join(", ")
        ));
    }
    let endpoints: Vec<&PciDevice> = members.iter().copied().filter(|d| !d.is_bridge).collect();
    if endpoints.is_empty() {
        return Err("holds only bridges (VFIO passes endpoint functions, not bridges)".into());
    }
    for d in &endpoints {
        if d.boot_vga == Some(true) && !on_vfio(d) {
            return Err(format!(
                "{} is the boot VGA device: taking it would take the host's console",
                d.address
            ));
        }
        if let Some(s) = d.sriov.as_ref().filter(|s| s.num_vfs > 0) {
            return Err(format!(
                "{} is an SR-IOV PF with {} VF(s) enabled: unbinding its driver would remove them (its VFs are offered instead)",
                d.address, s.num_vfs
            ));
        }
        if let Some(n) = mdev_parents.get(&d.address.to_string()) {
            return Err(format!(
                "{} is the parent of {n} live mediated device(s): binding it to VFIO would remove them",
                d.address
            ));
        }
        if d.current_vgpu_type.as_deref().is_some_and(|t| t != "0") {
            return Err(format!("{} has an active vGPU type", d.address));
        }
        if !d.vgpu_types.is_empty() && d.physfn.is_some() {
            return Err(format!(
                "{} is an NVIDIA vendor-VFIO vGPU VF: without a vGPU type its guest driver cannot use it, and DRA does not offer vGPU types on VFs yet (gpupass mdev create gives it one; docs/dra.md)",
                d.address
            ));
        }
    }
    let primaries: Vec<&PciDevice> = endpoints
        .iter()
        .copied()
        .filter(|d| is_primary(d) || on_vfio(d))
        .collect();
    let Some(lead) = primaries.first().copied() else {
        let names: Vec<String> = endpoints.iter().map(|d| label(d)).collect();
        return Err(format!(
            "has no GPU, accelerator or function already on vfio-pci ({}); bind one to vfio-pci \
             (gpupass bind) to offer it",
            names.join(", ")
        ));
    };
    for d in &endpoints {
        let ok = is_primary(d)
            || on_vfio(d)
            || (is_companion(d) && primaries.iter().any(|p| p.address.same_slot(&d.address)));
        if !ok {
            return Err(format!(
                "also holds {}, which is not a passthrough device: a claim would take it from \
                 the host (move the card to a slot with ACS, or bind it to vfio-pci yourself)",
                label(d)
            ));
        }
    }
    let _ = inv;
    Ok(lead)
}

/// Every group of the host (and every function without one), with the decision, in group
/// order; functions without a group last.
pub(crate) fn decide(inv: &Inventory) -> Vec<GroupDecision> {
    let by_addr: HashMap<PciAddress, &PciDevice> = inv.devices.iter().map(|d| (d.address, d)).collect();
    let mut mdev_parents: HashMap<String, usize> = HashMap::new();
    for m in &inv.mdevs {
        *mdev_parents.entry(m.parent.clone()).or_default() += 1;
    }
    let mut groups: Vec<&IommuGroup> = inv.groups.iter().collect();
    groups.sort_by_key(|g| g.number);
    let mut out = Vec::with_capacity(groups.len());
    for g in groups {
        let members: Vec<&PciDevice> = g.members.iter().filter_map(|a| by_addr.get(a).copied()).collect();
        let (device, reason) = match judge(inv, g, &members, &mdev_parents) {
            Ok(lead) => (Some(device_name(&lead.address)), None),
            Err(r) => (None, Some(r)),
        };
        out.push(GroupDecision {
            group: Some(g.number),
            members: g.members.clone(),
            device,
            reason,
        });
    }
    let mut lone: Vec<&PciDevice> = inv
        .devices
        .iter()
        .filter(|d| d.iommu_group.is_none() && !d.is_bridge)
        .collect();
    lone.sort_by_key(|d| d.address);
    for d in lone {
        out.push(GroupDecision {
            group: None,
            members: vec![d.address],
            device: None,
            reason: Some(format!(
                "{} has no IOMMU group: the IOMMU is off or does not cover it, so VFIO cannot isolate it",
                d.address
            )),
        });
    }
    out
}

/// The groups this node offers, in device-name (lead address) order.
pub(crate) fn publishable(inv: &Inventory) -> Vec<Publishable> {
    let by_addr: HashMap<PciAddress, &PciDevice> = inv.devices.iter().map(|d| (d.address, d)).collect();
    let mut out: Vec<Publishable> = decide(inv)
        .into_iter()
        .filter_map(|d| {
            let name = d.device?;
            let group = d.group?;
            let members: Vec<PciAddress> = d
                .members
                .iter()
                .filter(|a| by_addr.get(a).is_some_and(|x| !x.is_bridge))
                .copied()
                .collect();
            let lead = members.iter().copied().find(|a| device_name(a) == name)?;
            Some(Publishable {
                name,
                group,
                lead,
                members,
            })
        })
        .collect();
    out.sort_by_key(|p| p.lead);
    out
}

/// The members as one string attribute: `0000:00:05.0,0000:00:05.1`; when that is longer than
/// the API allows, as many as fit and `,+N` for the rest (`groupSize` has the count).
fn member_list(members: &[PciAddress]) -> String {
    let all: Vec<String> = members.iter().map(|a| a.to_string()).collect();
    (0..=all.len())
        .rev()
        .map(|k| {
            let mut t = all[..k].join(",");
            if k < all.len() {
                if k > 0 {
                    t.push(',');
                }
                t.push_str(&format!("+{}", all.len() - k));
            }
            t
        })
        .find(|t| t.len() <= MAX_VALUE_LEN)
        .unwrap_or_default()
}

/// The attributes of one published group (qualified names; ours under [`DOMAIN`]).
pub(crate) fn attributes(inv: &Inventory, p: &Publishable) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    let ours = |n: &str| format!("{DOMAIN}/{n}");
    let std = |n: &str| format!("{STANDARD_DOMAIN}/{n}");
    a.insert(ours("type"), s("group"));
    a.insert(std("pciBusID"), s(p.lead.to_string()));
    attrs::standard_pci(inv, &p.lead, &mut a);
    let Some(d) = inv.device(&p.lead) else { return a };
    a.insert(ours("vendorID"), s(d.vendor_id.as_str()));
    a.insert(ours("deviceID"), s(d.device_id.as_str()));
    a.insert(ours("class"), s(d.class.as_str()));
    if let (Some(sv), Some(sd)) = (&d.subsystem_vendor_id, &d.subsystem_device_id) {
        a.insert(ours("subsystemID"), s(format!("{sv}:{sd}")));
    }
    if let Some(n) = &d.vendor_name {
        a.insert(ours("vendorName"), s(n.clone()));
    }
    if let Some(n) = &d.device_name {
        a.insert(ours("productName"), s(n.clone()));
    }
    a.insert(ours("iommuGroup"), int(i64::from(p.group)));
    a.insert(ours("groupSize"), int(p.members.len() as i64));
    a.insert(ours("members"), s(member_list(&p.members)));
    if let Some(n) = d.numa_node.filter(|n| *n >= 0) {
        a.insert(ours("numaNode"), int(i64::from(n)));
    }
    a.insert(ours("backend"), s(node_backend(inv).as_str()));
    if let Some(m) = d.reset_methods.as_ref().and_then(|m| m.first()) {
        a.insert(ours("resetMethod"), s(m.clone()));
    }
    let bar64: u64 = p
        .members
        .iter()
        .filter_map(|m| inv.device(m))
        .flat_map(|m| m.bars.iter())
        .filter(|b| b.is_64bit && b.kind == BarKind::Memory)
        .map(|b| b.size)
        .sum();
    a.insert(ours("bar64Bytes"), int(i64::try_from(bar64).unwrap_or(i64::MAX)));
    a.insert(
        ours("driver"),
        s(d.driver.clone().unwrap_or_else(|| "none".into())),
    );
    let role = if d.physfn.is_some() {
        "vf"
    } else if d.sriov.as_ref().is_some_and(|s| s.total_vfs > 0) {
        "pf"
    } else {
        "none"
    };
    a.insert(ours("sriovRole"), s(role));
    if let Some(pf) = &d.physfn {
        a.insert(ours("physfn"), s(pf.to_string()));
    }
    debug_assert!(a.len() <= MAX_ATTRIBUTES);
    a
}

/// The pool of this node.
pub fn pool(inv: &Inventory) -> Pool {
    let slots = slots::offered(inv);
    let counter_sets = slots::counter_sets(&slots);
    let mut devices: Vec<Device> = publishable(inv)
        .iter()
        .map(|p| {
            let consumes = slots::group_consumption(&p.members, &counter_sets);
            Device {
                name: p.name.clone(),
                attributes: Some(attributes(inv, p)),
                consumes_counters: (!consumes.is_empty()).then_some(consumes),
                ..Default::default()
            }
        })
        .collect();
    devices.extend(slots.iter().map(|s| slots::device(inv, s)));
    Pool {
        devices,
        counter_sets,
    }
}

/// The DRA devices of this node: [`pool()`]'s devices.
pub fn devices(inv: &Inventory) -> Vec<Device> {
    pool(inv).devices
}

/// The node's pool as ResourceSlices ([`pool::render`] of [`pool()`]).
pub fn render(inv: &Inventory, opts: &SliceOptions) -> Vec<ResourceSlice> {
    pool::render(pool(inv), opts)
}

// ---- binding conditions (KEP-5007; docs/dra.md "Binding conditions", `super::binding`)

/// The binding condition of a group that needs a driver switch: True once the plugin bound it.
pub(crate) const READY: &str = "gpupass.dev/GroupBound";
/// Its failure condition: True when the bind failed (the reason says why).
pub(crate) const FAILED: &str = "gpupass.dev/GroupBindFailed";

/// [`READY`] and [`FAILED`] for the kit's watcher.
pub(crate) fn conditions() -> crate::containers::kubelet::binding::Conditions {
    crate::containers::kubelet::binding::Conditions {
        ready: READY.into(),
        failed: FAILED.into(),
    }
}

/// Whether a member is on a VFIO driver in `inv`.
fn member_on_vfio(inv: &Inventory, a: &PciAddress) -> bool {
    inv.device(a)
        .and_then(|d| d.driver.as_deref())
        .is_some_and(is_vfio_driver)
}

/// Give every group device of `pool` that needs a driver switch in `inv` (the inventory as
/// offered: `Driver::as_offered`, so a group a claim moved keeps its conditions) the binding
/// and failure conditions. mdev slots and groups already on vfio-pci get none. Pure.
pub(crate) fn mark(pool: &mut Pool, inv: &Inventory) {
    let groups = publishable(inv);
    for d in pool.devices.iter_mut() {
        let Some(g) = groups.iter().find(|g| g.name == d.name) else {
            continue;
        };
        if g.members.iter().any(|a| !member_on_vfio(inv, a)) {
            d.binding_conditions = Some(vec![READY.to_string()]);
            d.binding_failure_conditions = Some(vec![FAILED.to_string()]);
        }
    }
}

#[cfg(test)]
mod tests;
