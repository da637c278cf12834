//! The inventory: one read-only pass over sysfs/procfs that fills the [`model`](crate::model).
//!
//! Kernel facts this module encodes:
//! - `sys/bus/pci/devices/<addr>` is a symlink into `sys/devices/pci<dom>:<bus>/...`; the path
//!   component above the device is its upstream bridge when that component is an address.
//! - `vendor`, `device`, `subsystem_*`, `class`, `revision` hold `0x`-prefixed hex.
//! - Line N of `resource` is `start end flags` in hex for resource N: 0-5 the BARs, 6 the
//!   expansion ROM, 7-12 the SR-IOV VF BARs (bridges have 17 lines: 13-16 are their windows).
//! - `driver` and `iommu_group` are symlinks whose last component is the driver name / group
//!   number; `driver_override` reads `(null)` when unset; `numa_node` reads `-1` without NUMA.
//! - `sys/kernel/iommu_groups/<N>/devices/` links every member, PCI functions and mdevs alike.
//! - `proc/driver/nvidia/gpus/<addr>/information` carries `Device Minor:`, the N of
//!   `/dev/nvidiaN`, which is *not* the enumeration index.
//!
//! Anything unreadable or garbled degrades to `null` for that field plus a warning; the listing
//! never aborts because one attribute is bad.

pub mod backend;
mod groups;
mod mdev;
pub mod native;
mod parse;
mod pciids;
mod platform;
mod reader;
pub mod readiness;
pub mod snapshot;

use groups::*;
use mdev::*;
pub use parse::{
    parse_creatable_vgpu_types, parse_nvidia_information, parse_pci_modalias, parse_resource, ModaliasIds,
};
#[cfg(test)]
use platform::*;
pub(crate) use platform::{read_cpu_phys_bits, read_cpu_vendor, read_iommu_addr_bits, read_numa_nodes};
use reader::*;

use crate::host::{self, dir_names, link_name, parse_hex, read_attr, HostRoot};
use crate::model::*;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};

/// Why the inventory could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("cannot list PCI devices at {}; is this a Linux host with sysfs mounted (or is --root right)?", .path.display())]
    NoPciBus {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read saved inventory {}: {reason}", .path.display())]
    BadJson { path: PathBuf, reason: String },
    #[error("no PCI device {addr} on this host; `gpupass list --all` shows the devices there are")]
    NoSuchDevice { addr: PciAddress },
}

/// Order devices for display: GPUs (and accelerators) first, then everything else, each by
/// address.
pub(crate) fn sort_devices(devices: &mut [PciDevice]) {
    // The key once per device: `is_gpu` parses the class text.
    devices.sort_by_cached_key(|d| (!d.is_gpu(), d.address));
}

/// The test kit's count of this thread's host reads, by kind: how many times a request reads
/// the host (`src/containers/cdi/tests.rs`, `benches/scans.sh`, docs/performance.md "Host
/// reads per request").
#[cfg(feature = "testkit")]
pub mod counted {
    use std::cell::Cell;

    thread_local! {
        static FULL: Cell<usize> = const { Cell::new(0) };
        static GROUPS: Cell<usize> = const { Cell::new(0) };
    }

    pub(super) fn full() {
        FULL.with(|c| c.set(c.get() + 1));
    }

    pub(super) fn groups() {
        GROUPS.with(|c| c.set(c.get() + 1));
    }

    /// This thread's [`super::scan`]s and [`super::scan_groups`] so far.
    pub fn scans() -> (usize, usize) {
        (FULL.with(Cell::get), GROUPS.with(Cell::get))
    }
}

/// Read the whole host.
pub fn scan(host: &HostRoot) -> Result<Inventory, InventoryError> {
    #[cfg(feature = "testkit")]
    counted::full();
    let bus = host.sys_bus_pci_devices();
    let names = std::fs::read_dir(&bus).map_err(|e| InventoryError::NoPciBus {
        path: bus.clone(),
        source: e,
    })?;
    let mut warnings = Vec::new();
    let mut entries: Vec<(PciAddress, Option<std::path::PathBuf>)> = Vec::new();
    for e in names {
        let e = match e {
            Ok(e) => e,
            Err(err) => {
                warnings.push(format!("listing {}: {err}", host.display(&bus)));
                continue;
            }
        };
        let name = e.file_name().to_string_lossy().into_owned();
        match name.parse::<PciAddress>() {
            // The bus link is read by the worker that reads the device (in parallel).
            Ok(a) => entries.push((a, None)),
            Err(_) => warnings.push(format!(
                "ignoring {name:?} in {}: not a PCI address",
                host.display(&bus)
            )),
        }
    }
    entries.sort();

    let devices = read_devices(host, &entries, false, &mut warnings);
    let mut devices: Vec<PciDevice> = devices;
    sort_devices(&mut devices);

    let mdevs = read_mdevs(host, &mut warnings);
    let mdev_parents = read_virtual_mdev_parents(host, &devices, None, None, &mut warnings);
    let groups = read_groups(host, &devices, &mdevs, &mut warnings);
    let kernel = read_attr(&host.proc_osrelease()).ok();
    let mut inv = Inventory {
        schema_version: SCHEMA_VERSION,
        kernel,
        devices,
        groups,
        mdevs,
        mdev_parents,
        vfio_container_present: host.dev_vfio().join("vfio").exists(),
        iommufd_present: host.dev().join("iommu").exists(),
        iommufd: None,
        cpu_phys_bits: read_cpu_phys_bits(host),
        cpu_vendor: read_cpu_vendor(host),
        numa_nodes: read_numa_nodes(host),
        iommu_addr_bits: read_iommu_addr_bits(host),
        warnings,
    };
    crate::inventory::backend::annotate(host, &mut inv);
    Ok(inv)
}

/// `f` over `items` in chunks of at least `per_thread`, one thread per chunk up to the cores (8
/// at most); one chunk runs on the calling thread, since a thread's start costs more than a few
/// reads. Results in order; `None` for a chunk whose thread panicked.
pub(super) fn in_chunks<T: Sync, R: Send>(
    items: &[T],
    per_thread: usize,
    f: impl Fn(&[T]) -> R + Sync,
) -> Vec<Option<R>> {
    if items.len() <= per_thread {
        return vec![Some(f(items))];
    }
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8);
    let chunk = items.len().div_ceil(threads).max(per_thread);
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = items.chunks(chunk).map(|part| s.spawn(move || f(part))).collect();
        handles.into_iter().map(|h| h.join().ok()).collect()
    })
}

/// Read only the IOMMU groups `groups` and those of the functions `addrs`, with their member
/// functions (no mdevs): for callers on a hot path that need a few devices of a large host
/// (the OCI hook runs on every container start, bind and unbind plan from it). Unknown
/// addresses and groups are simply absent from the result.
///
/// The devices are read light: identity, class, driver, override, group, boot VGA, SR-IOV
/// parent and VFIO cdev, without NUMA placement, BARs, revision, reset methods, SR-IOV
/// counts, mdev types or NVIDIA details (`LIGHT_SKIPS`), which no such plan looks at.
pub(crate) fn scan_groups(
    host: &HostRoot,
    addrs: &[PciAddress],
    groups: &[u32],
) -> Result<Inventory, InventoryError> {
    #[cfg(feature = "testkit")]
    counted::groups();
    let bus = host.sys_bus_pci_devices();
    if !bus.is_dir() {
        return Err(InventoryError::NoPciBus {
            path: bus,
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
    }
    let mut warnings = Vec::new();
    let mut numbers: Vec<u32> = groups.to_vec();
    for a in addrs {
        if let Ok(Some(n)) = link_name(&bus.join(a.to_string()).join("iommu_group")) {
            if let Ok(n) = n.parse() {
                numbers.push(n);
            }
        }
    }
    numbers.sort_unstable();
    numbers.dedup();
    let gdir = host.iommu_groups();
    let mut members: Vec<PciAddress> = addrs.to_vec();
    let mut listed: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for n in &numbers {
        let names = dir_names(&gdir.join(n.to_string()).join("devices")).unwrap_or_default();
        for name in &names {
            if let Ok(a) = name.parse() {
                members.push(a);
            }
        }
        listed.insert(*n, names);
    }
    members.sort();
    members.dedup();
    let entries: Vec<(PciAddress, Option<std::path::PathBuf>)> = members
        .into_iter()
        .filter_map(|a| {
            // The bus link: gone (not a function of this host) drops the address.
            match std::fs::read_link(bus.join(a.to_string())) {
                Ok(t) => Some((a, Some(t))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(_) => Some((a, None)),
            }
        })
        .collect();
    let mut devices = read_devices(host, &entries, true, &mut warnings);
    sort_devices(&mut devices);
    let numbers: Vec<u32> = numbers
        .into_iter()
        .filter(|n| {
            listed.get(n).is_some_and(|m| !m.is_empty())
                || gdir.join(n.to_string()).is_dir()
                || devices.iter().any(|d| d.iommu_group == Some(*n))
        })
        .collect();
    let groups = read_groups_only(host, &devices, &[], Some(&numbers), Some(&listed), &mut warnings);
    let mut inv = Inventory {
        schema_version: SCHEMA_VERSION,
        kernel: read_attr(&host.proc_osrelease()).ok(),
        devices,
        groups,
        mdevs: Vec::new(),
        mdev_parents: Vec::new(),
        vfio_container_present: host.dev_vfio().join("vfio").exists(),
        iommufd_present: host.dev().join("iommu").exists(),
        iommufd: None,
        // The host facts only the VM layouts use are not read here: this scan runs on every
        // container start (the OCI hook) and in every bind, which need none of them.
        cpu_phys_bits: None,
        cpu_vendor: None,
        numa_nodes: Vec::new(),
        iommu_addr_bits: None,
        warnings,
    };
    crate::inventory::backend::annotate(host, &mut inv);
    Ok(inv)
}

/// Read what a change to mdev instances needs, for `mdev create/remove/define/undefine/start/
/// stop` (each runs as its own process, so this is their hot path): the active instances,
/// every mdev parent with its types and available instances, and the NVIDIA vendor-VFIO vGPU
/// functions with their physical functions. The parents are the same [`scan`] finds; what is
/// left out is what no mdev plan or check looks at: the other PCI functions, the IOMMU group
/// table, the platform facts (CPU address bits, NUMA, IOMMU widths) and the VFIO backend.
///
/// The PCI functions read (in full, as [`scan`] reads them) are those listed in
/// `sys/class/mdev_bus` (mdev parents that are PCI functions), those with an `nvidia`
/// directory (vendor-VFIO vGPU VFs and PFs) and their physical functions: one directory
/// listing and one `stat` per function instead of a read of every attribute of every function.
///
/// `scope` narrows it further: [`MdevScope::Parent`] (and [`MdevScope::Type`]) reads that one parent when
/// `sys/class/mdev_bus` lists it (else, for a vGPU function or a name to suggest against,
/// everything above); [`MdevScope::Instances`] reads only the active instances (`remove` and
/// `stop` of a UUID look at nothing else).
pub(crate) fn scan_mdev(host: &HostRoot, scope: MdevScope<'_>) -> Result<Inventory, InventoryError> {
    let bus = host.sys_bus_pci_devices();
    let mut warnings = Vec::new();
    let mut inv = Inventory {
        schema_version: SCHEMA_VERSION,
        kernel: None,
        devices: Vec::new(),
        groups: Vec::new(),
        mdevs: read_mdevs(host, &mut warnings),
        mdev_parents: Vec::new(),
        vfio_container_present: host.dev_vfio().join("vfio").exists(),
        iommufd_present: host.dev().join("iommu").exists(),
        iommufd: None,
        cpu_phys_bits: None,
        cpu_vendor: None,
        numa_nodes: Vec::new(),
        iommu_addr_bits: None,
        warnings: Vec::new(),
    };
    if scope == MdevScope::Instances {
        inv.warnings = warnings;
        return Ok(inv);
    }
    let class_dir = host.mdev_bus_class();
    if let MdevScope::Parent(p) | MdevScope::Type(p, _) = scope {
        let only_type = match scope {
            MdevScope::Type(_, t) => Some(t),
            _ => None,
        };
        let name = p
            .parse::<PciAddress>()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| p.to_string());
        let listed = !name.contains('/') && !name.starts_with('.') && class_dir.join(&name).exists();
        if listed {
            match name.parse::<PciAddress>() {
                Ok(a) => inv.devices = read_devices(host, &[(a, None)], false, &mut warnings),
                Err(_) => {
                    inv.mdev_parents =
                        read_virtual_mdev_parents(host, &[], Some(&name), only_type, &mut warnings)
                }
            }
            inv.warnings = warnings;
            return Ok(inv);
        }
    }
    let names = dir_names(&bus).map_err(|e| InventoryError::NoPciBus {
        path: bus.clone(),
        source: e,
    })?;
    let class: std::collections::HashSet<String> =
        dir_names(&class_dir).unwrap_or_default().into_iter().collect();
    let mut entries: Vec<(PciAddress, Option<PathBuf>)> = names
        .iter()
        .filter(|n| class.contains(*n) || bus.join(n).join("nvidia").exists())
        .filter_map(|n| n.parse::<PciAddress>().ok())
        .map(|a| (a, None))
        .collect();
    entries.sort();
    let mut devices = read_devices(host, &entries, false, &mut warnings);
    // The physical functions of vGPU VFs: a parent's name and description come from its PF.
    let mut pfs: Vec<(PciAddress, Option<PathBuf>)> = devices
        .iter()
        .filter_map(|d| d.physfn)
        .filter(|pf| !devices.iter().any(|d| d.address == *pf))
        .map(|pf| (pf, None))
        .collect();
    pfs.sort();
    pfs.dedup();
    if !pfs.is_empty() {
        devices.extend(read_devices(host, &pfs, false, &mut warnings));
    }
    sort_devices(&mut devices);
    inv.mdev_parents = read_virtual_mdev_parents(host, &devices, None, None, &mut warnings);
    inv.devices = devices;
    inv.warnings = warnings;
    Ok(inv)
}

/// What [`scan_mdev`] reads beyond the active instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MdevScope<'a> {
    /// Every parent and vGPU function.
    All,
    /// The parent the user named (a name or a PCI address, short or full).
    Parent(&'a str),
    /// As `Parent`, and of a virtual parent (mbochs, mdpy, mtty) only the type named second
    /// when the parent has it: a create, start or define reads the attributes of the type it
    /// makes, not of every type (a name it lacks reads them all, for the "valid types" of the
    /// error).
    Type(&'a str, &'a str),
    /// Nothing beyond the active instances.
    Instances,
}

/// Load an inventory saved with `--json`.
pub(crate) fn load_json(path: &Path) -> Result<Inventory, InventoryError> {
    let text = host::read_bounded_any(path, 256 * 1024 * 1024).map_err(|e| InventoryError::BadJson {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut inv: Inventory = serde_json::from_str(&text).map_err(|e| InventoryError::BadJson {
        path: path.to_path_buf(),
        reason: format!("{e} (expected the output of `gpupass list --all --json`)"),
    })?;
    if inv.schema_version > SCHEMA_VERSION {
        return Err(InventoryError::BadJson {
            path: path.to_path_buf(),
            reason: format!(
                "schema_version {} is newer than this gpupass understands ({SCHEMA_VERSION})",
                inv.schema_version
            ),
        });
    }
    if inv.iommufd.is_none() {
        // Saved before backends were recorded: derive them from the nodes it did record.
        crate::inventory::backend::fill_backends(&mut inv);
    }
    Ok(inv)
}

#[cfg(test)]
mod tests;
