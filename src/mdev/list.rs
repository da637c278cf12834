//! The read side of instances and definitions: pure over the inventory, the definitions and
//! the open-node scan.

use super::defs::{Definition, StartMode};
use super::types::ParentKind;
use super::{Holder, OpenNodes};
use crate::host::HostRoot;
use crate::model::Inventory;
use crate::output::table::columns;
use serde::Serialize;
use std::fmt::Write;

/// One active instance: an mdev (by UUID) or an NVIDIA vGPU VF (by PCI address).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Active {
    /// The UUID, or for NVIDIA vendor-VFIO vGPU the VF's PCI address.
    pub instance: String,
    pub kind: ParentKind,
    pub parent: String,
    pub type_id: Option<String>,
    pub type_name: Option<String>,
    pub iommu_group: Option<u32>,
    /// `/dev/vfio/N` of the instance's group.
    pub vfio_node: Option<String>,
    pub vfio_node_present: bool,
    /// Processes holding the node (or the VF's VFIO cdev) open.
    pub holders: Vec<Holder>,
    pub in_use: bool,
    /// `auto`/`manual` when a definition with this UUID exists for this parent.
    pub defined: Option<StartMode>,
}

/// One definition, with whether it is running and whether its parent is here.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Defined {
    #[serde(flatten)]
    pub def: Definition,
    pub active: bool,
    pub parent_present: bool,
}

/// Inputs that come from the host besides the inventory.
pub(crate) struct HostFacts<'a> {
    pub root: &'a HostRoot,
    pub open: &'a OpenNodes,
    pub defs: &'a [Definition],
}

/// Active instances, mdevs first (by parent, UUID), then vGPU VFs (by address).
pub(crate) fn active(inv: &Inventory, f: &HostFacts) -> Vec<Active> {
    let node = |g: Option<u32>| g.map(|g| f.root.display(&f.root.dev_vfio().join(g.to_string())));
    let mut out = Vec::new();
    let mut mdevs: Vec<_> = inv.mdevs.iter().collect();
    mdevs.sort_by(|a, b| (&a.parent, &a.uuid).cmp(&(&b.parent, &b.uuid)));
    for m in mdevs {
        let vfio_node = node(m.iommu_group);
        let holders = vfio_node.as_deref().map(|n| f.open.of(n)).unwrap_or_default();
        let type_name = m.type_id.as_ref().and_then(|t| {
            let types = match m.parent.parse() {
                Ok(a) => inv.device(&a).map(|d| &d.mdev_types),
                Err(_) => inv
                    .mdev_parents
                    .iter()
                    .find(|p| p.name == m.parent)
                    .map(|p| &p.mdev_types),
            };
            types?.iter().find(|x| &x.id == t)?.name.clone()
        });
        out.push(Active {
            instance: m.uuid.clone(),
            kind: ParentKind::Mdev,
            parent: m.parent.clone(),
            type_id: m.type_id.clone(),
            type_name,
            iommu_group: m.iommu_group,
            vfio_node_present: vfio_node.as_ref().is_some_and(|_| {
                m.iommu_group
                    .is_some_and(|g| f.root.dev_vfio().join(g.to_string()).exists())
            }),
            vfio_node,
            in_use: !holders.is_empty(),
            holders,
            defined: f
                .defs
                .iter()
                .find(|d| d.uuid.eq_ignore_ascii_case(&m.uuid) && d.parent == m.parent)
                .map(|d| d.start),
        });
    }
    let mut vfs: Vec<_> = inv
        .devices
        .iter()
        .filter(|d| d.current_vgpu_type.is_some())
        .collect();
    vfs.sort_by_key(|d| d.address);
    for d in vfs {
        let vfio_node = node(d.iommu_group);
        let mut holders = vfio_node.as_deref().map(|n| f.open.of(n)).unwrap_or_default();
        if let Some(c) = &d.vfio_cdev {
            let cdev = f.root.display(&f.root.dev_vfio().join("devices").join(c));
            holders.extend(f.open.of(&cdev));
        }
        let pf = d.physfn.unwrap_or(d.address);
        let id = d.current_vgpu_type.clone();
        out.push(Active {
            instance: d.address.to_string(),
            kind: ParentKind::NvidiaVgpu,
            parent: pf.to_string(),
            type_name: id
                .as_deref()
                .and_then(|id| super::types::vgpu_type_name(inv, Some(pf), id)),
            type_id: id,
            iommu_group: d.iommu_group,
            vfio_node_present: d
                .iommu_group
                .is_some_and(|g| f.root.dev_vfio().join(g.to_string()).exists()),
            vfio_node,
            in_use: !holders.is_empty(),
            holders,
            defined: None,
        });
    }
    out
}

/// Definitions with their live state.
pub(crate) fn defined(
    inv: &Inventory,
    parents: &[super::types::Parent],
    defs: &[Definition],
) -> Vec<Defined> {
    defs.iter()
        .map(|d| Defined {
            def: d.clone(),
            active: inv
                .mdevs
                .iter()
                .any(|m| m.uuid.eq_ignore_ascii_case(&d.uuid) && m.parent == d.parent),
            parent_present: parents.iter().any(|p| p.name == d.parent),
        })
        .collect()
}

/// `gpupass mdev list` as text.
pub(crate) fn render_active(rows: &[Active], unreadable: usize) -> String {
    if rows.is_empty() {
        return "no active mediated devices or NVIDIA vGPU VFs\n".into();
    }
    let mut t = vec![vec![
        "INSTANCE".to_string(),
        "PARENT".into(),
        "TYPE".into(),
        "GROUP".into(),
        "VFIO NODE".into(),
        "DEFINED".into(),
        "IN USE".into(),
    ]];
    for r in rows {
        let ty = match (&r.type_id, &r.type_name) {
            (Some(i), Some(n)) if i != n => format!("{i} ({n})"),
            (Some(i), _) => i.clone(),
            _ => "-".into(),
        };
        let node = match (&r.vfio_node, r.vfio_node_present) {
            (Some(n), true) => n.clone(),
            (Some(n), false) => format!("{n} (absent)"),
            _ => "-".into(),
        };
        let used = if r.in_use {
            let h: Vec<String> = r
                .holders
                .iter()
                .map(|h| format!("{} (pid {})", h.comm, h.pid))
                .collect();
            format!("yes: {}", h.join(", "))
        } else {
            "no".into()
        };
        t.push(vec![
            r.instance.clone(),
            r.parent.clone(),
            ty,
            r.iommu_group.map(|g| g.to_string()).unwrap_or_else(|| "-".into()),
            node,
            r.defined
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|| "-".into()),
            used,
        ]);
    }
    let mut s = columns(&t);
    if rows.iter().any(|r| r.kind == ParentKind::NvidiaVgpu) {
        s.push_str(
            "\nNVIDIA vendor-VFIO vGPU: an instance named by a PCI address is an SR-IOV VF carrying a vGPU\n\
             type (nvidia/current_vgpu_type); it has no UUID. Give the VF to a VM as a PCI device;\n\
             `gpupass mdev remove <VF>` clears the type.\n",
        );
    }
    if unreadable > 0 {
        let _ = writeln!(
            s,
            "\nnote: the open files of {unreadable} processes could not be read (not root); \"no\" may be wrong"
        );
    }
    s
}

/// `gpupass mdev list --defined` as text.
pub(crate) fn render_defined(rows: &[Defined]) -> String {
    if rows.is_empty() {
        return "no mdev definitions (etc/mdevctl.d is empty)\n".into();
    }
    let mut t = vec![vec![
        "UUID".to_string(),
        "PARENT".into(),
        "TYPE".into(),
        "START".into(),
        "STATE".into(),
        "ATTRS".into(),
    ]];
    for r in rows {
        let state = match (r.active, r.parent_present) {
            (true, _) => "active",
            (false, true) => "stopped",
            (false, false) => "parent absent",
        };
        let attrs: Vec<String> = r.def.attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        t.push(vec![
            r.def.uuid.clone(),
            r.def.parent.clone(),
            r.def.mdev_type.clone(),
            r.def.start.as_str().into(),
            state.into(),
            if attrs.is_empty() {
                "-".into()
            } else {
                attrs.join(",")
            },
        ]);
    }
    columns(&t)
}
