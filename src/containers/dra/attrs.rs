//! The attribute vocabulary both kinds of DRA device use (a group, `slices`; an mdev slot,
//! `slots`): the value constructors held to the API's limits, and the standard
//! `resource.kubernetes.io` attributes of a PCI function. Pure; it names neither module, so the
//! two depend on it and `slices` on `slots`, one way.

use super::STANDARD_DOMAIN;
use crate::inventory::backend;
use crate::model::{Backend, Inventory, PciAddress};
use k8s_openapi::api::resource::v1::DeviceAttribute;
use std::collections::BTreeMap;

/// The longest string attribute value the API accepts (`DeviceAttributeMaxValueLength`).
pub(crate) const MAX_VALUE_LEN: usize = 64;
/// The most attributes plus capacities one device may carry
/// (`ResourceSliceMaxAttributesAndCapacitiesPerDevice`).
pub(crate) const MAX_ATTRIBUTES: usize = 32;

/// A string attribute, cut on a character boundary to [`MAX_VALUE_LEN`] (`...` marks a cut).
pub(crate) fn s(v: impl Into<String>) -> DeviceAttribute {
    let mut v: String = v.into();
    if v.len() > MAX_VALUE_LEN {
        let mut cut = MAX_VALUE_LEN - 3;
        while !v.is_char_boundary(cut) {
            cut -= 1;
        }
        v.truncate(cut);
        v.push_str("...");
    }
    DeviceAttribute {
        string: Some(v),
        ..Default::default()
    }
}

/// An int attribute.
pub(crate) fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..Default::default()
    }
}

/// The VFIO backend a claim on this node gets by default (`--backend auto`): iommufd where the
/// kernel serves it, else legacy. One value for the whole node, so a node never offers a
/// mix (docs/iommufd.md).
pub(crate) fn node_backend(inv: &Inventory) -> Backend {
    if backend::iommufd_ready(inv).is_ok() {
        Backend::Iommufd
    } else {
        Backend::Legacy
    }
}

/// `pci<domain>:<bus>`: the root complex a function hangs under (the first component of its
/// `/sys/devices` path), as Kubernetes' `resource.kubernetes.io/pcieRoot` spells it.
pub(crate) fn pcie_root(inv: &Inventory, a: &PciAddress) -> String {
    let mut top = *a;
    // Parent links form a tree; the bound guards against a malformed inventory.
    for _ in 0..64 {
        match inv.device(&top).and_then(|d| d.parent) {
            Some(p) => top = p,
            None => break,
        }
    }
    format!("pci{:04x}:{:02x}", top.domain, top.bus)
}

/// The NUMA node of function `a` as the kernel reports it (`numa_node`); `None` where it says
/// -1 (no NUMA, or the firmware did not tell) or the function is unknown.
pub(crate) fn numa_node(inv: &Inventory, a: &PciAddress) -> Option<i64> {
    inv.device(a)
        .and_then(|d| d.numa_node)
        .filter(|n| *n >= 0)
        .map(i64::from)
}

/// The standard attributes of a device that sits on PCI function `a` (the group's lead, or an
/// mdev slot's parent): `resource.kubernetes.io/pcieRoot`, and `resource.kubernetes.io/numaNode`
/// (KEP-6072, stable in Kubernetes 1.37) only where the kernel gives a node, so a selector on a
/// host without NUMA must guard it (`!has(...) || ...`, contrib/dra/claim-examples.yaml).
pub(crate) fn standard_pci(inv: &Inventory, a: &PciAddress, out: &mut BTreeMap<String, DeviceAttribute>) {
    out.insert(format!("{STANDARD_DOMAIN}/pcieRoot"), s(pcie_root(inv, a)));
    if let Some(n) = numa_node(inv, a) {
        out.insert(format!("{STANDARD_DOMAIN}/numaNode"), int(n));
    }
}
