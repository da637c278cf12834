//! The read side of parents and types: a pure function of the inventory.
//!
//! Three kinds of parent end up in one list: PCI functions with `mdev_supported_types`,
//! virtual parents from `sys/class/mdev_bus` (mbochs, mdpy, mtty), and NVIDIA vendor-VFIO
//! vGPU physical functions, whose types are the union of their VFs' `creatable_vgpu_types`
//! (available instances = VFs that offer the type now and have no type set).

use super::MdevError;
use crate::model::{Inventory, MdevType, PciAddress};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

/// How instances of a parent are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ParentKind {
    /// The mdev bus: write a UUID to `mdev_supported_types/<type>/create`.
    Mdev,
    /// NVIDIA vendor-VFIO vGPU: write a type id to `<VF>/nvidia/current_vgpu_type`.
    NvidiaVgpu,
}

/// One type as offered by a parent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct TypeInfo {
    #[serde(flatten)]
    pub t: MdevType,
    /// NVIDIA vGPU: the VFs that can take this type now (no type set, type creatable).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vfs: Vec<PciAddress>,
}

/// A parent and its types.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Parent {
    /// The parent's name: a PCI address (`0000:3b:00.0`) or a virtual device (`mbochs`).
    pub name: String,
    pub kind: ParentKind,
    /// Set for PCI parents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciAddress>,
    /// The device's name (PCI) or its sysfs path (virtual).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub about: Option<String>,
    pub types: Vec<TypeInfo>,
}

impl Parent {
    pub(crate) fn find_type(&self, ty: &str) -> Option<&TypeInfo> {
        self.types.iter().find(|t| t.t.id == ty).or_else(|| {
            // vGPU types may be named by their profile name ("NVIDIA H200-2-35C") too.
            (self.kind == ParentKind::NvidiaVgpu)
                .then(|| self.types.iter().find(|t| t.t.name.as_deref() == Some(ty)))
                .flatten()
        })
    }
    pub(crate) fn type_ids(&self) -> Vec<String> {
        self.types.iter().map(|t| t.t.id.clone()).collect()
    }
}

fn vgpu_type_order(id: &str) -> (u64, String) {
    (id.parse().unwrap_or(u64::MAX), id.to_string())
}

/// Every parent on the host, PCI parents in address order, then virtual ones by name, then
/// NVIDIA vGPU PFs.
pub(crate) fn parents(inv: &Inventory) -> Vec<Parent> {
    let mut out = Vec::new();
    let mut pci: Vec<_> = inv.devices.iter().filter(|d| !d.mdev_types.is_empty()).collect();
    pci.sort_by_key(|d| d.address);
    for d in pci {
        out.push(Parent {
            name: d.address.to_string(),
            kind: ParentKind::Mdev,
            pci: Some(d.address),
            about: Some(d.display_name()),
            types: d
                .mdev_types
                .iter()
                .map(|t| TypeInfo {
                    t: t.clone(),
                    vfs: Vec::new(),
                })
                .collect(),
        });
    }
    for p in &inv.mdev_parents {
        out.push(Parent {
            name: p.name.clone(),
            kind: ParentKind::Mdev,
            pci: None,
            about: p.sysfs_path.clone(),
            types: p
                .mdev_types
                .iter()
                .map(|t| TypeInfo {
                    t: t.clone(),
                    vfs: Vec::new(),
                })
                .collect(),
        });
    }
    // NVIDIA vGPU: group VFs with vGPU state by their PF.
    let mut by_pf: BTreeMap<PciAddress, Vec<&crate::model::PciDevice>> = BTreeMap::new();
    for d in &inv.devices {
        if !d.vgpu_types.is_empty() || d.current_vgpu_type.is_some() {
            by_pf.entry(d.physfn.unwrap_or(d.address)).or_default().push(d);
        }
    }
    for (pf, mut vfs) in by_pf {
        vfs.sort_by_key(|d| d.address);
        out.push(vgpu_parent(inv, pf, &vfs));
    }
    out
}

fn vgpu_parent(inv: &Inventory, name_addr: PciAddress, vfs: &[&crate::model::PciDevice]) -> Parent {
    let mut types: BTreeMap<(u64, String), TypeInfo> = BTreeMap::new();
    for vf in vfs {
        for t in &vf.vgpu_types {
            let e = types.entry(vgpu_type_order(&t.id)).or_insert_with(|| TypeInfo {
                t: MdevType {
                    available_instances: Some(0),
                    ..t.clone()
                },
                vfs: Vec::new(),
            });
            if vf.current_vgpu_type.is_none() {
                e.vfs.push(vf.address);
                e.t.available_instances = Some(e.vfs.len() as u32);
            }
        }
    }
    Parent {
        name: name_addr.to_string(),
        kind: ParentKind::NvidiaVgpu,
        pci: Some(name_addr),
        about: inv.device(&name_addr).map(|d| d.display_name()),
        types: types.into_values().collect(),
    }
}

/// The vGPU name of a type id, looked up in any VF of the same GPU that still offers it.
pub(crate) fn vgpu_type_name(inv: &Inventory, pf: Option<PciAddress>, id: &str) -> Option<String> {
    inv.devices
        .iter()
        .filter(|d| pf.is_none() || d.physfn == pf || Some(d.address) == pf)
        .flat_map(|d| d.vgpu_types.iter())
        .find(|t| t.id == id)
        .and_then(|t| t.name.clone())
}

/// Find the parent the user named: a parent name, or a PCI address in full or short form.
/// A VF address of an NVIDIA vGPU GPU names that one VF.
pub(crate) fn resolve(inv: &Inventory, parents: &[Parent], input: &str) -> Result<Parent, MdevError> {
    if let Ok(a) = input.parse::<PciAddress>() {
        if let Some(p) = parents.iter().find(|p| p.pci == Some(a)) {
            return Ok(p.clone());
        }
        if let Some(d) = inv.device(&a) {
            if !d.vgpu_types.is_empty() || d.current_vgpu_type.is_some() {
                return Ok(vgpu_parent(inv, a, &[d]));
            }
        }
    } else if let Some(p) = parents.iter().find(|p| p.name == input) {
        return Ok(p.clone());
    }
    let known: Vec<String> = parents.iter().map(|p| p.name.clone()).collect();
    // Compare addresses in their full form, so `3b:00.1` is near `0000:3b:00.0`.
    let norm = input
        .parse::<PciAddress>()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| input.to_string());
    Err(MdevError::UnknownParent {
        input: input.to_string(),
        suggestion: super::closest(&norm, known.iter().map(String::as_str)).map(str::to_string),
        known,
        hint: None,
    })
}

/// `gpupass mdev types` as text: per parent, per type, the facts mdevctl prints.
pub(crate) fn render(parents: &[Parent]) -> String {
    if parents.is_empty() {
        return "no mdev parents on this host (nothing in /sys/class/mdev_bus, no NVIDIA vGPU VFs)\n".into();
    }
    let mut s = String::new();
    for p in parents {
        let kind = match p.kind {
            ParentKind::Mdev if p.pci.is_some() => "PCI mdev parent",
            ParentKind::Mdev => "virtual mdev parent",
            ParentKind::NvidiaVgpu => "NVIDIA vendor-VFIO vGPU",
        };
        let about = p.about.as_ref().map(|a| format!("{a}; ")).unwrap_or_default();
        let _ = writeln!(s, "{} ({about}{kind})", p.name);
        if p.kind == ParentKind::NvidiaVgpu {
            let _ = writeln!(
                s,
                "  instances are SR-IOV VFs of this GPU, named by PCI address (no UUID)"
            );
        }
        if p.types.is_empty() {
            let _ = writeln!(s, "  (no types creatable now)");
        }
        for t in &p.types {
            let _ = writeln!(s, "  {}", t.t.id);
            let avail =
                t.t.available_instances
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "?".into());
            let _ = writeln!(s, "    Available instances: {avail}");
            let _ = writeln!(s, "    Device API: {}", t.t.device_api.as_deref().unwrap_or("?"));
            if let Some(n) = &t.t.name {
                let _ = writeln!(s, "    Name: {n}");
            }
            if let Some(d) = &t.t.description {
                let _ = writeln!(s, "    Description: {}", d.replace('\n', " "));
            }
            if !t.vfs.is_empty() {
                let v: Vec<String> = t.vfs.iter().map(|a| a.to_string()).collect();
                let _ = writeln!(s, "    VFs: {}", v.join(" "));
            }
        }
    }
    s
}
