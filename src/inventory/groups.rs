//! IOMMU groups: `sys/kernel/iommu_groups/<N>/devices`, members PCI functions and mdevs alike.

use super::*;

pub(super) fn read_groups(
    host: &HostRoot,
    devices: &[PciDevice],
    mdevs: &[MdevInstance],
    warnings: &mut Vec<String>,
) -> Vec<IommuGroup> {
    read_groups_only(host, devices, mdevs, None, None, warnings)
}

/// [`read_groups`], limited to the group numbers in `only` when given.
pub(super) fn read_groups_only(
    host: &HostRoot,
    devices: &[PciDevice],
    mdevs: &[MdevInstance],
    only: Option<&[u32]>,
    listed: Option<&BTreeMap<u32, Vec<String>>>,
    warnings: &mut Vec<String>,
) -> Vec<IommuGroup> {
    let by_addr: HashMap<PciAddress, &PciDevice> = devices.iter().map(|d| (d.address, d)).collect();
    // One listing of /dev/vfio instead of a stat per group.
    let vfio_nodes: std::collections::HashSet<String> = dir_names(&host.dev_vfio())
        .unwrap_or_default()
        .into_iter()
        .collect();
    let gdir = host.iommu_groups();
    let mut numbers: Vec<u32> = match only {
        Some(o) => o.to_vec(),
        None => match dir_names(&gdir) {
            Ok(n) => n.iter().filter_map(|s| s.parse().ok()).collect(),
            Err(e) => {
                warnings.push(format!("cannot list {}: {e}", host.display(&gdir)));
                Vec::new()
            }
        },
    };
    // Groups named by devices but missing from sys/kernel/iommu_groups (a partial tree).
    let mut from_devices: BTreeMap<u32, Vec<PciAddress>> = BTreeMap::new();
    for d in devices {
        if let Some(g) = d.iommu_group {
            from_devices.entry(g).or_default().push(d.address);
        }
    }
    for g in from_devices.keys() {
        if !numbers.contains(g) {
            numbers.push(*g);
        }
    }
    numbers.sort_unstable();
    numbers.dedup();

    // The member listings, read on all cores (a large host has a group per function); a few
    // groups are read inline.
    const GROUPS_PER_THREAD: usize = 128;
    let gdir_ref = &gdir;
    let list = |part: &[u32]| {
        part.iter()
            .map(|n| dir_names(&gdir_ref.join(n.to_string()).join("devices")).unwrap_or_default())
            .collect::<Vec<_>>()
    };
    let listings: Vec<Vec<String>> =
        if let Some(l) = listed.filter(|l| numbers.iter().all(|n| l.contains_key(n))) {
            // Listed moments ago by the caller.
            numbers.iter().map(|n| l[n].clone()).collect()
        } else {
            in_chunks(&numbers, GROUPS_PER_THREAD, list)
                .into_iter()
                .flat_map(|r| r.unwrap_or_default())
                .collect()
        };
    let mut out = Vec::new();
    for (n, names) in numbers.into_iter().zip(listings) {
        let mut members: Vec<PciAddress> = Vec::new();
        let mut mdev_members = Vec::new();
        for name in names {
            match name.parse::<PciAddress>() {
                Ok(a) => members.push(a),
                Err(_) => mdev_members.push(name),
            }
        }
        for a in from_devices.get(&n).into_iter().flatten() {
            if !members.contains(a) {
                members.push(*a);
            }
        }
        for m in mdevs.iter().filter(|m| m.iommu_group == Some(n)) {
            if !mdev_members.contains(&m.uuid) {
                mdev_members.push(m.uuid.clone());
            }
        }
        members.sort();
        let blockers: Vec<Blocker> = members
            .iter()
            .filter_map(|a| {
                let d = by_addr.get(a)?;
                if d.is_bridge || driver_allows_vfio(d.driver.as_deref()) {
                    None
                } else {
                    Some(Blocker {
                        address: *a,
                        driver: d.driver.clone().unwrap_or_default(),
                    })
                }
            })
            .collect();
        out.push(IommuGroup {
            number: n,
            viable: blockers.is_empty(),
            blockers,
            vfio_node: format!("/dev/vfio/{n}"),
            vfio_node_present: vfio_nodes.contains(&n.to_string()),
            backends: Vec::new(),
            members,
            mdev_members,
        });
    }
    out
}
