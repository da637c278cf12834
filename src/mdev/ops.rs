//! Changing the host: create and remove instances through [`HostOps`], check first, verify
//! after, and undo what was done when a later step fails.
//!
//! Every check that can be made before the first write is made before it (parent, type,
//! UUID collision, available instances, open VFIO nodes), so a refused command changes
//! nothing. After the first write, failures roll back: attributes that cannot be set remove
//! the instance again; `--count N` removes the instances it made when instance k fails.

use super::types::{Parent, ParentKind, TypeInfo};
use super::{MdevError, MdevUuid, OpenNodes};
use crate::host::ops::HostOps;
use crate::host::read_attr;
use crate::model::{Inventory, PciAddress};
use std::path::Path;

fn write(ops: &dyn HostOps, path: &Path, value: &str) -> Result<(), MdevError> {
    ops.write(path, value).map_err(|source| MdevError::Write {
        path: ops.root().display(path).into(),
        value: value.trim_end().to_string(),
        source,
    })
}

/// The created instances: UUIDs, or VF addresses for NVIDIA vGPU.
pub type Created = Vec<String>;

/// Make `count` instances of `ty` on `parent` (UUIDs given or generated for mdev; free VFs
/// for NVIDIA vGPU), then set `attrs` in order on each mdev.
pub fn create(
    ops: &dyn HostOps,
    inv: &Inventory,
    parent: &Parent,
    ty: &TypeInfo,
    uuids: &[MdevUuid],
    count: u32,
    attrs: &[(String, String)],
) -> Result<Created, MdevError> {
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
            let mut done: Created = Vec::new();
            for u in &wanted {
                match create_one(ops, parent, &ty.t.id, u, attrs) {
                    Ok(()) => done.push(u.to_string()),
                    Err(e) => {
                        for d in done.iter().rev() {
                            let _ = ops.write(&ops.root().mdev_devices().join(d).join("remove"), "1");
                        }
                        return Err(e);
                    }
                }
            }
            Ok(done)
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
            let mut done: Vec<PciAddress> = Vec::new();
            for vf in ty.vfs.iter().take(count as usize) {
                match set_vgpu_type(ops, vf, &ty.t.id) {
                    Ok(()) => done.push(*vf),
                    Err(e) => {
                        for d in done.iter().rev() {
                            let _ = ops.write(&vgpu_type_file(ops, d), "0");
                        }
                        return Err(e);
                    }
                }
            }
            Ok(done.iter().map(|a| a.to_string()).collect())
        }
    }
}

fn create_one(
    ops: &dyn HostOps,
    parent: &Parent,
    ty: &str,
    uuid: &MdevUuid,
    attrs: &[(String, String)],
) -> Result<(), MdevError> {
    let root = ops.root();
    let create = root
        .mdev_bus_class()
        .join(&parent.name)
        .join("mdev_supported_types")
        .join(ty)
        .join("create");
    if let Err(e) = write(ops, &create, uuid.as_str()) {
        if !root.mdev_bus_class().join(&parent.name).exists() {
            return Err(MdevError::ParentGone {
                parent: parent.name.clone(),
                uuid: uuid.to_string(),
            });
        }
        return Err(e);
    }
    let dev = root.mdev_devices().join(uuid.as_str());
    if !dev.exists() {
        return Err(MdevError::NotCreated {
            path: root.display(&create).into(),
            value: uuid.to_string(),
            expect: root.display(&dev),
        });
    }
    for (k, v) in attrs {
        let p = dev.join(k);
        if let Err(source) = ops.write(&p, v) {
            let rollback_ok = ops.write(&dev.join("remove"), "1").is_ok();
            return Err(MdevError::AttrFailed {
                uuid: uuid.to_string(),
                attr: k.clone(),
                path: root.display(&p).into(),
                source,
                rollback_ok,
            });
        }
    }
    Ok(())
}

fn vgpu_type_file(ops: &dyn HostOps, vf: &PciAddress) -> std::path::PathBuf {
    ops.root().pci_device(vf).join("nvidia").join("current_vgpu_type")
}

fn set_vgpu_type(ops: &dyn HostOps, vf: &PciAddress, id: &str) -> Result<(), MdevError> {
    let f = vgpu_type_file(ops, vf);
    if !ops.root().pci_device(vf).exists() {
        return Err(MdevError::ParentGone {
            parent: vf.to_string(),
            uuid: vf.to_string(),
        });
    }
    write(ops, &f, id)?;
    let now = read_attr(&f).unwrap_or_default();
    if now.trim() != id {
        return Err(MdevError::NotCreated {
            path: ops.root().display(&f).into(),
            value: id.to_string(),
            expect: format!("the type in {} (reads {:?})", ops.root().display(&f), now.trim()),
        });
    }
    Ok(())
}

/// Refuse when a process holds the instance's VFIO node open.
fn check_unused(
    ops: &dyn HostOps,
    open: &OpenNodes,
    what: &str,
    group: Option<u32>,
    cdev: Option<&str>,
) -> Result<(), MdevError> {
    let root = ops.root();
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

/// Remove an active mdev (`1` to `sys/bus/mdev/devices/<uuid>/remove`), unless it is open.
pub fn remove_mdev(
    ops: &dyn HostOps,
    inv: &Inventory,
    open: &OpenNodes,
    uuid: &MdevUuid,
) -> Result<String, MdevError> {
    let m = inv
        .mdev(uuid.as_str())
        .ok_or_else(|| MdevError::NotActive(uuid.to_string()))?;
    check_unused(ops, open, &format!("mdev {uuid}"), m.iommu_group, None)?;
    let dev = ops.root().mdev_devices().join(&m.uuid);
    write(ops, &dev.join("remove"), "1")?;
    if dev.exists() {
        return Err(MdevError::NotCreated {
            path: ops.root().display(&dev.join("remove")).into(),
            value: "1".into(),
            expect: format!("the removal of {}", ops.root().display(&dev)),
        });
    }
    Ok(m.parent.clone())
}

/// Clear an NVIDIA vGPU VF (`0` to `nvidia/current_vgpu_type`), unless it is open.
pub fn remove_vgpu(
    ops: &dyn HostOps,
    inv: &Inventory,
    open: &OpenNodes,
    vf: &PciAddress,
) -> Result<String, MdevError> {
    let d = inv
        .device(vf)
        .filter(|d| d.current_vgpu_type.is_some())
        .ok_or_else(|| MdevError::NotActive(format!("{vf} (no NVIDIA vGPU type is set on it)")))?;
    check_unused(
        ops,
        open,
        &format!("vGPU VF {vf}"),
        d.iommu_group,
        d.vfio_cdev.as_deref(),
    )?;
    let f = vgpu_type_file(ops, vf);
    write(ops, &f, "0")?;
    let now = read_attr(&f).unwrap_or_default();
    if !matches!(now.trim(), "0" | "") {
        return Err(MdevError::NotCreated {
            path: ops.root().display(&f).into(),
            value: "0".into(),
            expect: format!("a cleared type (reads {:?})", now.trim()),
        });
    }
    Ok(d.physfn.unwrap_or(d.address).to_string())
}
