//! Mediated devices through DRA: every mdev type of this node, offered as one DRA device per
//! instance it can still create (a *slot*), and one KEP-4815 counter set per parent whose
//! counters are the types' available instances. Pure over the [`Inventory`].
//!
//! **The model.** The kernel tells, per type, how many more instances it can create
//! (`available_instances`); it does not tell what the types of one parent share (mtty's serial
//! ports, mbochs's memory, an NVIDIA GPU's framebuffer). So each parent is a counter set
//! (`mdev-<parent>`) with one counter per type, worth its available instances; each slot of a
//! type consumes 1 of its type's counter. When the parent is itself a PCI function this node
//! offers as a whole group (a GPU that can be passed through or split into vGPUs), the group's
//! device consumes *every* counter of the parent in full, so the scheduler never hands out the
//! whole GPU and one of its vGPUs at once. Types sharing a parent's capacity can be offered more
//! in sum than the parent holds: the Prepare that finds its type full fails with the kernel's
//! count, and the slices are republished with the kernel's new counts (docs/dra.md, "mdev").
//!
//! Instances this node's claims created are counted back by the plugin
//! ([`super::prepare::Driver::as_offered`]): a claim's own instance must not shrink the pool the
//! scheduler already allocated it from.

use super::attrs::{self, int, s};
use super::DOMAIN;
use crate::model::{Inventory, MdevType, PciAddress};
use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceAttribute, DeviceCounterConsumption,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Serialize;
use std::collections::BTreeMap;

/// The most slots one type is offered with (a type with more available instances is offered
/// with this many; the counter says the same).
pub(crate) const MAX_SLOTS_PER_TYPE: u32 = 64;
/// The most counters one counter set holds (`ResourceSliceMaxCountersPerCounterSet`): a parent
/// with more types offers its first 32.
pub(crate) const MAX_COUNTERS_PER_SET: usize = 32;
/// The longest DNS label (device, counter set and counter names).
const MAX_LABEL: usize = 63;

/// One instance an mdev type can still create: the DRA device a claim gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct MdevSlot {
    /// The DRA device name: `mdev-<parent>-<type>-<index>`.
    pub name: String,
    /// The parent's name under `sys/class/mdev_bus` (`mtty`, `0000:01:00.0`).
    pub parent: String,
    /// The parent as a PCI function, when it is one.
    pub parent_pci: Option<PciAddress>,
    /// The type's directory name (`mtty-2`, `nvidia-1043`).
    pub mdev_type: String,
    /// The type's `name` and `device_api` files, as read with it.
    pub type_name: Option<String>,
    pub device_api: Option<String>,
    pub index: u32,
    /// The counter set and counter it consumes 1 of.
    pub counter_set: String,
    pub counter: String,
}

/// What was decided for one type of one parent (`gpupass dra slices --explain`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct TypeDecision {
    pub parent: String,
    pub mdev_type: String,
    /// Slots offered.
    pub slots: u32,
    /// Why none (or fewer than available), when so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `mtty-2` as a DNS label: lower case, every other character `-`, no leading, trailing or
/// doubled `-`.
pub(crate) fn label(raw: &str) -> String {
    let mut out = String::new();
    for c in raw.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// The counter set of a parent: `mdev-<parent>` (`mdev-0000-01-00-0` for a PCI parent).
pub(crate) fn counter_set_name(parent: &str) -> String {
    format!("mdev-{}", label(parent))
}

/// Every mdev parent of the host with its types: PCI functions with `mdev_types` first (address
/// order), then the virtual parents (name order).
pub(crate) fn parents(inv: &Inventory) -> Vec<(String, Option<PciAddress>, &[MdevType])> {
    let mut pci: Vec<_> = inv
        .devices
        .iter()
        .filter(|d| !d.mdev_types.is_empty())
        .map(|d| (d.address.to_string(), Some(d.address), d.mdev_types.as_slice()))
        .collect();
    pci.sort_by_key(|p| p.1);
    let mut virt: Vec<_> = inv
        .mdev_parents
        .iter()
        .filter(|p| !p.mdev_types.is_empty())
        .map(|p| (p.name.clone(), None, p.mdev_types.as_slice()))
        .collect();
    virt.sort_by(|a, b| a.0.cmp(&b.0));
    pci.extend(virt);
    pci
}

/// Decide every type: its slots, or why none.
pub(crate) fn decide(inv: &Inventory) -> (Vec<MdevSlot>, Vec<TypeDecision>) {
    let mut slots = Vec::new();
    let mut decisions = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for (parent, pci, types) in parents(inv) {
        let set = counter_set_name(&parent);
        let mut counters = std::collections::BTreeSet::new();
        let mut sorted: Vec<&MdevType> = types.iter().collect();
        sorted.sort_by(|a, b| a.id.cmp(&b.id));
        for t in sorted {
            let mut d = TypeDecision {
                parent: parent.clone(),
                mdev_type: t.id.clone(),
                slots: 0,
                reason: None,
            };
            let counter = label(&t.id);
            let avail = t.available_instances;
            let why = if set.len() > MAX_LABEL {
                Some(format!(
                    "the parent's name makes a counter set name longer than {MAX_LABEL}"
                ))
            } else if counter.is_empty() || counter.len() > MAX_LABEL || !counters.insert(counter.clone()) {
                Some("its name gives no DNS label distinct from another type's".to_string())
            } else if counters.len() > MAX_COUNTERS_PER_SET {
                Some(format!("the parent has more than {MAX_COUNTERS_PER_SET} types (one counter set holds {MAX_COUNTERS_PER_SET})"))
            } else if t.device_api.as_deref().is_some_and(|a| a != "vfio-pci") {
                Some(format!(
                    "its device_api is {} (only vfio-pci mediated devices are offered to containers)",
                    t.device_api.as_deref().unwrap_or_default()
                ))
            } else {
                match avail {
                    None => Some("the kernel gives no available_instances for it".to_string()),
                    Some(0) => Some("no instance available (the parent is full)".to_string()),
                    Some(_) => None,
                }
            };
            if let Some(r) = why {
                d.reason = Some(r);
                decisions.push(d);
                continue;
            }
            let n = avail.unwrap_or(0).min(MAX_SLOTS_PER_TYPE);
            if n < avail.unwrap_or(0) {
                d.reason = Some(format!(
                    "{} available; offered {MAX_SLOTS_PER_TYPE} (the most per type)",
                    avail.unwrap_or(0)
                ));
            }
            let mut offered = 0;
            for i in 0..n {
                let name = format!("mdev-{}-{counter}-{i}", label(&parent));
                if name.len() > MAX_LABEL || !names.insert(name.clone()) {
                    d.reason = Some(format!(
                        "its device names (mdev-{}-{counter}-N) are longer than {MAX_LABEL} characters or taken",
                        label(&parent)
                    ));
                    break;
                }
                offered += 1;
                slots.push(MdevSlot {
                    name,
                    parent: parent.clone(),
                    parent_pci: pci,
                    mdev_type: t.id.clone(),
                    type_name: t.name.clone(),
                    device_api: t.device_api.clone(),
                    index: i,
                    counter_set: set.clone(),
                    counter: counter.clone(),
                });
            }
            d.slots = offered;
            decisions.push(d);
        }
    }
    (slots, decisions)
}

/// The slots this node offers, in parent, type and index order.
pub(crate) fn offered(inv: &Inventory) -> Vec<MdevSlot> {
    decide(inv).0
}

fn quantity(n: u32) -> Counter {
    Counter {
        value: Quantity(n.to_string()),
    }
}

/// The counter sets of the offered slots: per parent, per type, the number of its slots.
pub(crate) fn counter_sets(slots: &[MdevSlot]) -> Vec<CounterSet> {
    let mut sets: BTreeMap<&str, BTreeMap<String, u32>> = BTreeMap::new();
    for s in slots {
        *sets
            .entry(s.counter_set.as_str())
            .or_default()
            .entry(s.counter.clone())
            .or_default() += 1;
    }
    sets.into_iter()
        .map(|(name, counters)| CounterSet {
            name: name.to_string(),
            counters: counters.into_iter().map(|(k, v)| (k, quantity(v))).collect(),
        })
        .collect()
}

/// What a group device consumes when one of its members is an mdev parent with slots: all of
/// that parent's counters (passing the whole function through excludes every instance of it).
pub(crate) fn group_consumption(
    members: &[PciAddress],
    sets: &[CounterSet],
) -> Vec<DeviceCounterConsumption> {
    members
        .iter()
        .filter_map(|a| {
            let name = counter_set_name(&a.to_string());
            sets.iter().find(|s| s.name == name)
        })
        .take(2)
        .map(|s| DeviceCounterConsumption {
            counter_set: s.name.clone(),
            counters: s.counters.clone(),
            ..Default::default()
        })
        .collect()
}

/// The attributes of a slot (qualified names).
pub(crate) fn attributes(inv: &Inventory, slot: &MdevSlot) -> BTreeMap<String, DeviceAttribute> {
    let ours = |n: &str| format!("{DOMAIN}/{n}");
    let mut a = BTreeMap::new();
    a.insert(ours("type"), s("mdev"));
    a.insert(ours("mdevType"), s(slot.mdev_type.as_str()));
    a.insert(ours("mdevParent"), s(slot.parent.as_str()));
    if let Some(n) = &slot.type_name {
        a.insert(ours("mdevTypeName"), s(n.clone()));
    }
    if let Some(api) = &slot.device_api {
        a.insert(ours("deviceAPI"), s(api.clone()));
    }
    a.insert(ours("backend"), s(attrs::node_backend(inv).as_str()));
    if let Some(d) = slot.parent_pci.and_then(|p| inv.device(&p)) {
        attrs::standard_pci(inv, &d.address, &mut a);
        a.insert(ours("parentPciBusID"), s(d.address.to_string()));
        a.insert(ours("vendorID"), s(d.vendor_id.as_str()));
        a.insert(ours("deviceID"), s(d.device_id.as_str()));
        if let Some(n) = &d.device_name {
            a.insert(ours("productName"), s(n.clone()));
        }
        if let Some(n) = d.numa_node.filter(|n| *n >= 0) {
            a.insert(ours("numaNode"), int(i64::from(n)));
        }
    }
    a
}

/// The DRA device of a slot.
pub(crate) fn device(inv: &Inventory, slot: &MdevSlot) -> Device {
    Device {
        name: slot.name.clone(),
        attributes: Some(attributes(inv, slot)),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: slot.counter_set.clone(),
            counters: BTreeMap::from([(slot.counter.clone(), quantity(1))]),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::containers::dra::testing::{scan, vgpu_host};

    #[test]
    fn each_available_instance_is_a_slot_consuming_its_types_counter() {
        let (_t, inv) = scan(vgpu_host);
        let (slots, decisions) = decide(&inv);
        let names: Vec<&str> = slots.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "mdev-0000-01-00-0-nvidia-63-0",
                "mdev-0000-01-00-0-nvidia-63-1",
                "mdev-0000-01-00-0-nvidia-64-0",
                "mdev-mtty-mtty-1-0",
                "mdev-mtty-mtty-1-1",
                "mdev-mtty-mtty-1-2",
            ]
        );
        let why = |t: &str| {
            decisions
                .iter()
                .find(|d| d.mdev_type == t)
                .unwrap()
                .reason
                .clone()
        };
        assert!(why("Odd_Type").unwrap().contains("vfio-ccw"));
        assert!(why("mtty-full").unwrap().contains("no instance available"));
        assert_eq!(why("mtty-1"), None);
        let sets = counter_sets(&slots);
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0].name, "mdev-0000-01-00-0");
        assert_eq!(sets[0].counters["nvidia-63"].value.0, "2");
        assert_eq!(sets[0].counters["nvidia-64"].value.0, "1");
        assert_eq!(sets[1].name, "mdev-mtty");
        assert_eq!(sets[1].counters["mtty-1"].value.0, "3");
        let d = device(&inv, &slots[0]);
        let c = &d.consumes_counters.as_ref().unwrap()[0];
        assert_eq!(c.counter_set, "mdev-0000-01-00-0");
        assert_eq!(c.counters["nvidia-63"].value.0, "1");
        let a = d.attributes.unwrap();
        assert_eq!(a["gpupass.dev/type"].string.as_deref(), Some("mdev"));
        assert_eq!(a["gpupass.dev/mdevType"].string.as_deref(), Some("nvidia-63"));
        assert_eq!(
            a["gpupass.dev/parentPciBusID"].string.as_deref(),
            Some("0000:01:00.0")
        );
        // Never the standard pciBusID: KubeVirt would take the slot for a passthrough device.
        assert!(!a.contains_key("resource.kubernetes.io/pciBusID"));
        assert!(a.len() <= crate::containers::dra::attrs::MAX_ATTRIBUTES);
    }

    #[test]
    fn labels_are_dns_labels() {
        assert_eq!(label("i915-GVTg_V5_4"), "i915-gvtg-v5-4");
        assert_eq!(label("0000:01:00.0"), "0000-01-00-0");
        assert_eq!(label("__x__"), "x");
        assert_eq!(counter_set_name("mtty"), "mdev-mtty");
    }
}
