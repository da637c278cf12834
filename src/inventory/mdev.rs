//! Mediated devices: the active instances (`sys/bus/mdev/devices`) and the parents that are
//! not PCI functions (the kernel's sample drivers' virtual parents).

use super::*;

pub(super) fn read_mdevs(host: &HostRoot, warnings: &mut Vec<String>) -> Vec<MdevInstance> {
    let dir = host.mdev_devices();
    let names = match dir_names(&dir) {
        Ok(n) => n,
        Err(e) => {
            warnings.push(format!("cannot list {}: {e}", host.display(&dir)));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for uuid in names {
        let p = dir.join(&uuid);
        let parent = std::fs::read_link(&p)
            .ok()
            .and_then(|t| {
                t.parent()
                    .and_then(|p| p.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .unwrap_or_default();
        let type_id = link_name(&p.join("mdev_type")).ok().flatten();
        let iommu_group = link_name(&p.join("iommu_group"))
            .ok()
            .flatten()
            .and_then(|n| n.parse().ok());
        let driver = link_name(&p.join("driver")).ok().flatten();
        // As for a PCI function: the cdev is `vfio-dev/vfioN` with a `dev` attribute.
        let vfio_cdev = dir_names(&p.join("vfio-dev")).ok().and_then(|v| {
            v.into_iter()
                .find(|n| n.starts_with("vfio") && p.join("vfio-dev").join(n).join("dev").exists())
        });
        out.push(MdevInstance {
            uuid,
            parent,
            type_id,
            iommu_group,
            driver,
            vfio_cdev,
        });
    }
    out
}

/// mdev parents under `sys/class/mdev_bus` that are not PCI functions of `devices` (the
/// kernel's sample drivers mbochs/mdpy/mtty live under `sys/devices/virtual/<drv>/<drv>`);
/// with `only`, that one (a name the class lists) without listing the class.
pub(super) fn read_virtual_mdev_parents(
    host: &HostRoot,
    devices: &[PciDevice],
    only: Option<&str>,
    only_type: Option<&str>,
    warnings: &mut Vec<String>,
) -> Vec<MdevParent> {
    let class = host.mdev_bus_class();
    let names = match only {
        Some(n) => vec![n.to_string()],
        None => match dir_names(&class) {
            Ok(n) => n,
            Err(e) => {
                warnings.push(format!("cannot list {}: {e}", host.display(&class)));
                return Vec::new();
            }
        },
    };
    let mut out = Vec::new();
    for name in names {
        if let Ok(a) = name.parse::<PciAddress>() {
            if devices.iter().any(|d| d.address == a) {
                continue;
            }
        }
        let link = class.join(&name);
        // The class link, resolved lexically: one readlink, not one per path component.
        let sysfs_path = std::fs::read_link(&link).ok().and_then(|t| {
            let mut real = class.clone();
            for c in t.components() {
                match c {
                    std::path::Component::ParentDir => {
                        real.pop();
                    }
                    std::path::Component::Normal(n) => real.push(n),
                    std::path::Component::RootDir => real = host.root().to_path_buf(),
                    _ => {}
                }
            }
            real.strip_prefix(host.root())
                .ok()
                .map(|r| format!("/{}", r.display()))
        });
        let tables = HostTables::default();
        let mut r = Reader::new(host, &tables, false);
        let mdev_types = r.mdev_types_of(&link.join("mdev_supported_types"), &name, only_type);
        warnings.extend(r.warnings);
        out.push(MdevParent {
            name,
            sysfs_path,
            mdev_types,
        });
    }
    out
}
