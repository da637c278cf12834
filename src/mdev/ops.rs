//! The checks and the plans of creating and removing instances: every refusal is decided
//! here, then the plan ([`super::plan`]) is applied by the change engine
//! ([`super::plan::execute_in`]) under the lock and the journal, verified, rolled back when a
//! later step fails and recoverable after a crash.
//!
//! Every check that can be made before the first write is made before it (parent, type,
//! UUID collision, available instances, open VFIO nodes), so a refused command changes
//! nothing. After the first write, failures roll back: attributes that cannot be set remove
//! the instance again; `--count N` removes the instances it made when instance k fails.

use super::plan::{self, Change, MdevPlan};
use super::types::{Parent, ParentKind, TypeInfo};
use super::{MdevError, MdevUuid, OpenNodes};
use crate::host::HostRoot;
use crate::model::{Inventory, PciAddress};

/// The created instances: UUIDs, or VF addresses for NVIDIA vGPU.
pub(crate) type Created = Vec<String>;

/// The plan of `mdev create` (and `start`): `count` instances of `ty` on `parent` (UUIDs
/// given or generated for mdev; free VFs for NVIDIA vGPU), then `attrs` in order on each mdev;
/// and the instances it makes. Every refusal comes from here, before anything is written.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_create(
    host: &HostRoot,
    action: &str,
    inv: &Inventory,
    parent: &Parent,
    ty: &TypeInfo,
    uuids: &[MdevUuid],
    count: u32,
    attrs: &[(String, String)],
) -> Result<(MdevPlan, Created), MdevError> {
    match parent.kind {
        ParentKind::Mdev => {
            let wanted: Vec<MdevUuid> = if uuids.is_empty() {
                (0..count).map(|_| MdevUuid::random()).collect::<Result<_, _>>()?
            } else {
                uuids.to_vec()
            };
            for u in &wanted {
                if let Some(m) = inv.mdev(u.as_str()) {
                    return Err(MdevError::UuidExists {
                        uuid: u.to_string(),
                        parent: m.parent.clone(),
                        ty: m.type_id.clone().unwrap_or_else(|| "?".into()),
                    });
                }
            }
            let available = ty.t.available_instances.unwrap_or(0);
            if available < wanted.len() as u32 {
                return Err(MdevError::NoAvailable {
                    parent: parent.name.clone(),
                    ty: ty.t.id.clone(),
                    available,
                    wanted: wanted.len() as u32,
                });
            }
            let changes = wanted
                .iter()
                .map(|u| Change::Create {
                    uuid: u.to_string(),
                    parent: parent.name.clone(),
                    mdev_type: ty.t.id.clone(),
                    attrs: attrs.to_vec(),
                })
                .collect();
            Ok((
                plan::plan(action, changes),
                wanted.iter().map(|u| u.to_string()).collect(),
            ))
        }
        ParentKind::NvidiaVgpu => {
            if !uuids.is_empty() {
                return Err(MdevError::Usage(format!(
                    "{} is an NVIDIA vendor-VFIO vGPU parent: its instances are SR-IOV VFs named by PCI address and take no --uuid",
                    parent.name
                )));
            }
            if !attrs.is_empty() {
                return Err(MdevError::Usage(
                    "--attr applies to mdev instances only, not to NVIDIA vendor-VFIO vGPU VFs".into(),
                ));
            }
            if (ty.vfs.len() as u32) < count {
                return Err(MdevError::NoAvailable {
                    parent: parent.name.clone(),
                    ty: ty.t.id.clone(),
                    available: ty.vfs.len() as u32,
                    wanted: count,
                });
            }
            let vfs: Vec<PciAddress> = ty.vfs.iter().take(count as usize).copied().collect();
            for vf in &vfs {
                if !host.pci_device(vf).exists() {
                    return Err(MdevError::ParentGone {
                        parent: vf.to_string(),
                        uuid: vf.to_string(),
                    });
                }
            }
            let changes = vfs
                .iter()
                .map(|vf| Change::VgpuSet {
                    vf: *vf,
                    mdev_type: ty.t.id.clone(),
                })
                .collect();
            Ok((
                plan::plan(action, changes),
                vfs.iter().map(|a| a.to_string()).collect(),
            ))
        }
    }
}

/// Refuse when a process holds the instance's VFIO node open.
fn check_unused(
    root: &HostRoot,
    open: &OpenNodes,
    what: &str,
    group: Option<u32>,
    cdev: Option<&str>,
) -> Result<(), MdevError> {
    let mut nodes = Vec::new();
    if let Some(g) = group {
        nodes.push(root.display(&root.dev_vfio().join(g.to_string())));
    }
    if let Some(c) = cdev {
        nodes.push(root.display(&root.dev_vfio().join("devices").join(c)));
    }
    for n in nodes {
        let h = open.of(&n);
        if !h.is_empty() {
            return Err(MdevError::InUse {
                what: what.to_string(),
                node: n.into(),
                holders: h,
            });
        }
    }
    Ok(())
}

/// The plan of removing an active mdev (`1` to `sys/bus/mdev/devices/<uuid>/remove`, `mdev
/// remove` and `stop`), unless it is open, and the instance's parent.
pub(crate) fn plan_remove_mdev(
    host: &HostRoot,
    inv: &Inventory,
    open: &OpenNodes,
    uuid: &MdevUuid,
    action: &str,
) -> Result<(MdevPlan, String), MdevError> {
    let m = inv
        .mdev(uuid.as_str())
        .ok_or_else(|| MdevError::NotActive(uuid.to_string()))?;
    check_unused(host, open, &format!("mdev {uuid}"), m.iommu_group, None)?;
    let c = Change::Remove {
        uuid: m.uuid.clone(),
        parent: m.parent.clone(),
        mdev_type: m.type_id.clone().unwrap_or_default(),
    };
    Ok((plan::plan(action, vec![c]), m.parent.clone()))
}

/// The plan of clearing an NVIDIA vGPU VF (`0` to `nvidia/current_vgpu_type`), unless it is
/// open, and the physical function (the parent).
pub(crate) fn plan_remove_vgpu(
    host: &HostRoot,
    inv: &Inventory,
    open: &OpenNodes,
    vf: &PciAddress,
) -> Result<(MdevPlan, String), MdevError> {
    let d = inv
        .device(vf)
        .filter(|d| d.current_vgpu_type.is_some())
        .ok_or_else(|| MdevError::NotActive(format!("{vf} (no NVIDIA vGPU type is set on it)")))?;
    check_unused(
        host,
        open,
        &format!("vGPU VF {vf}"),
        d.iommu_group,
        d.vfio_cdev.as_deref(),
    )?;
    let was = d.current_vgpu_type.clone().unwrap_or_default();
    let c = Change::VgpuClear { vf: *vf, was };
    Ok((
        plan::plan("mdev remove", vec![c]),
        d.physfn.unwrap_or(d.address).to_string(),
    ))
}
