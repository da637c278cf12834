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
pub use platform::{read_cpu_phys_bits, read_cpu_vendor, read_iommu_addr_bits, read_numa_nodes};
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
pub fn sort_devices(devices: &mut [PciDevice]) {
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
    let mdev_parents = read_virtual_mdev_parents(host, &devices, None, &mut warnings);
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
pub fn scan_groups(
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
/// `scope` narrows it further: [`MdevScope::Parent`] reads that one parent when
/// `sys/class/mdev_bus` lists it (else, for a vGPU function or a name to suggest against,
/// everything above); [`MdevScope::Instances`] reads only the active instances (`remove` and
/// `stop` of a UUID look at nothing else).
pub fn scan_mdev(host: &HostRoot, scope: MdevScope<'_>) -> Result<Inventory, InventoryError> {
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
    if let MdevScope::Parent(p) = scope {
        let name = p
            .parse::<PciAddress>()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| p.to_string());
        let listed = !name.contains('/') && !name.starts_with('.') && class_dir.join(&name).exists();
        if listed {
            match name.parse::<PciAddress>() {
                Ok(a) => inv.devices = read_devices(host, &[(a, None)], false, &mut warnings),
                Err(_) => inv.mdev_parents = read_virtual_mdev_parents(host, &[], Some(&name), &mut warnings),
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
    inv.mdev_parents = read_virtual_mdev_parents(host, &devices, None, &mut warnings);
    inv.devices = devices;
    inv.warnings = warnings;
    Ok(inv)
}

/// What [`scan_mdev`] reads beyond the active instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MdevScope<'a> {
    /// Every parent and vGPU function.
    All,
    /// The parent the user named (a name or a PCI address, short or full).
    Parent(&'a str),
    /// Nothing beyond the active instances.
    Instances,
}

/// Load an inventory saved with `--json`.
pub fn load_json(path: &Path) -> Result<Inventory, InventoryError> {
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
mod tests {
    use super::*;

    /// `scan_mdev` finds the parents, types and instances `scan` finds, on every shipped
    /// fixture host (virtual parents, a PCI mdev parent, NVIDIA vendor-VFIO vGPU VFs, hosts
    /// without any); a named parent's scope finds that parent as the whole scan does; the
    /// instances scope finds the instances and nothing else.
    #[test]
    fn the_mdev_scan_finds_what_the_whole_scan_finds() {
        use crate::mdev::types::parents;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hosts");
        let json = |v: &dyn erased::Ser| v.value();
        let mut seen_parents = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let host = HostRoot::new(e.unwrap().path());
            let full = scan(&host).unwrap();
            let all = scan_mdev(&host, MdevScope::All).unwrap();
            let want = parents(&full);
            assert_eq!(json(&want), json(&parents(&all)), "{}", host.root().display());
            assert_eq!(json(&full.mdevs), json(&all.mdevs), "{}", host.root().display());
            for p in &want {
                seen_parents += 1;
                let one = scan_mdev(&host, MdevScope::Parent(&p.name)).unwrap();
                let got = parents(&one);
                let found = got.iter().find(|g| g.name == p.name);
                assert_eq!(
                    found.map(|g| json(g)),
                    Some(json(p)),
                    "{} {}",
                    host.root().display(),
                    p.name
                );
                assert_eq!(json(&full.mdevs), json(&one.mdevs));
            }
            let inst = scan_mdev(&host, MdevScope::Instances).unwrap();
            assert_eq!(json(&full.mdevs), json(&inst.mdevs));
            assert!(inst.devices.is_empty() && inst.mdev_parents.is_empty());
        }
        assert!(
            seen_parents >= 6,
            "the fixtures hold mdev and vGPU parents: {seen_parents}"
        );
    }

    mod erased {
        pub trait Ser {
            fn value(&self) -> serde_json::Value;
        }
        impl<T: serde::Serialize> Ser for T {
            fn value(&self) -> serde_json::Value {
                serde_json::to_value(self).unwrap()
            }
        }
    }

    #[test]
    fn iommu_widths() {
        // QEMU 10's intel-iommu (aw-bits=48) as the 6.12 lab guest reads it; a 39-bit unit.
        assert_eq!(intel_mgaw("d2008c202f0466"), Some(48));
        assert_eq!(intel_mgaw("0xd2008c202f0466\n"), Some(48));
        assert_eq!(intel_mgaw("d2008c20260466"), Some(39));
        assert_eq!(intel_mgaw("nonsense"), None);
        assert_eq!(amd_hats("58f77ef22294200:5"), Some(48));
        assert_eq!(amd_hats("58f77ef22294600"), Some(57));
        assert_eq!(amd_hats("58f77ef22294a00"), Some(64));
        assert_eq!(amd_hats(""), None);
    }

    #[test]
    fn cpu_phys_bits_from_cpuinfo() {
        let c = "processor\t: 0\nflags\t\t: fpu\naddress sizes\t: 46 bits physical, 57 bits virtual\n";
        assert_eq!(parse_phys_bits(c), Some(46));
        assert_eq!(
            parse_phys_bits("address sizes : 40 bits physical, 48 bits virtual"),
            Some(40)
        );
        assert_eq!(parse_phys_bits("processor : 0\n"), None);
        assert_eq!(parse_phys_bits("address sizes : many bits physical"), None);
    }

    #[test]
    fn cpu_vendor_from_cpuinfo() {
        let c = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n";
        assert_eq!(parse_vendor(c).as_deref(), Some("AuthenticAMD"));
        assert_eq!(
            parse_vendor("vendor_id : GenuineIntel").as_deref(),
            Some("GenuineIntel")
        );
        assert_eq!(parse_vendor("processor : 0\n"), None);
        assert_eq!(parse_vendor("vendor_id : \n"), None);
        assert_eq!(parse_vendor("vendor_id : ../../etc\n"), None);
    }

    #[test]
    fn resource_lines() {
        let text = "0x00000000fd000000 0x00000000fdffffff 0x0000000000040200\n\
                    0x00000000e0000000 0x00000000efffffff 0x000000000014220c\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                    0x000000000000e000 0x000000000000e07f 0x0000000000040101\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                    0x00000000fe000000 0x00000000fe07ffff 0x0000000000046200\n";
        let (bars, errs) = parse_resource(text);
        assert!(errs.is_empty());
        assert_eq!(bars.len(), 4);
        assert_eq!(bars[0].size, 16 << 20);
        assert!(!bars[0].prefetchable && !bars[0].is_64bit);
        assert_eq!(bars[1].index, 1);
        assert!(bars[1].prefetchable && bars[1].is_64bit);
        assert_eq!(bars[2].kind, BarKind::Io);
        assert_eq!(bars[2].size, 0x80);
        assert_eq!(bars[3].index, 6);
    }

    #[test]
    fn resource_garbage_is_reported_not_fatal() {
        let (bars, errs) = parse_resource(
            "zz 0x1 0x200\n0x1000 0x1fff\n0x2000 0x1000 0x200\n0x0 0xffffffffffffffff 0x200\n",
        );
        assert!(bars.is_empty());
        assert_eq!(errs.len(), 4);
    }

    #[test]
    fn resource_kernel_lines_and_other_spellings_agree() {
        // The kernel's spelling takes the byte path; the same numbers spelled otherwise
        // (upper-case prefix, extra spaces, CRLF, no prefix) take the general one.
        let kernel = "0x00000000fd000000 0x00000000fdffffff 0x0000000000040200\n\
                      0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                      0x00000000E0000000 0x00000000EFFFFFFF 0x000000000014220C\n\
                      0x0000000000000000 0x0000000000000000 0x0000000000000100\n\
                      0x0000000000002000 0x0000000000001000 0x0000000000000200";
        let other = "0X00000000fd000000  0x00000000fdffffff 0x0000000000040200\r\n\
                     0x0 0x0 0x0\n\
                     e0000000 efffffff 14220c\n\
                     0x0000000000000000 0x0000000000000000\t0x0000000000000100\n\
                     0x2000 0x1000 0x200";
        let (a, ea) = parse_resource(kernel);
        let (b, eb) = parse_resource(other);
        assert_eq!(a, b);
        assert_eq!(ea, eb);
        assert_eq!(a.len(), 2);
        assert_eq!((a[1].index, a[1].size), (2, 0x1000_0000));
        assert_eq!(ea, vec!["line 4 ends before it starts".to_string()]);
        // Line numbers count empty lines and a last line without its newline.
        let (c, ec) = parse_resource("\n0x0000000000001000 0x0000000000001fff 0x0000000000000200\n\nx");
        assert_eq!(c[0].index, 1);
        assert_eq!(
            ec,
            vec![
                "line 0 has 0 fields, expected 3",
                "line 2 has 0 fields, expected 3",
                "line 3 has 1 fields, expected 3"
            ]
        );
    }

    #[test]
    fn modalias_ids() {
        let m = parse_pci_modalias("pci:v000010DEd00002684sv00001043sd0000889Cbc03sc00i00\n").unwrap();
        assert_eq!(
            (m.vendor, m.device, m.subvendor, m.subdevice, m.class),
            (0x10de, 0x2684, 0x1043, 0x889c, 0x030000)
        );
        for bad in [
            "",
            "usb:v1d2",
            "pci:v000010DEd00002684sv00001043sd0000889Cbc03sc00",
            "pci:v000010DEd00002684sv00001043sd0000889Cbc03sc00i00x",
            "pci:v0001_0DEd00002684sv00001043sd0000889Cbc03sc00i00",
            "pci:v100010DEd00002684sv00001043sd0000889Cbc03sc00i00",
        ] {
            assert_eq!(parse_pci_modalias(bad), None, "{bad}");
        }
    }

    #[test]
    fn nvidia_information() {
        let t = "Model: \t\t NVIDIA H200\nIRQ:   \t\t 310\nGPU UUID: \t GPU-0b1c\nBus Location: \t 0000:18:00.0\nDevice Minor: \t 2\n";
        let i = parse_nvidia_information(t);
        assert_eq!(i.minor, Some(2));
        assert_eq!(i.model.as_deref(), Some("NVIDIA H200"));
        assert_eq!(i.uuid.as_deref(), Some("GPU-0b1c"));
    }

    #[test]
    fn creatable_vgpu_types_table() {
        let t = "ID    : vGPU Name\n1043  : NVIDIA H200-1-18C\n1044  : NVIDIA H200-2-35C\n";
        let v = parse_creatable_vgpu_types(t);
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].id, "1044");
        assert_eq!(v[1].name.as_deref(), Some("NVIDIA H200-2-35C"));
    }
}
