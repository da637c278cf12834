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

use crate::host::{self, dir_names, link_name, parse_hex, read_attr, HostRoot};
use crate::model::*;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;

/// Why the inventory could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("cannot list PCI devices at {path}: {error}; is this a Linux host with sysfs mounted (or is --root right)?")]
    NoPciBus { path: String, error: io::Error },
    #[error("cannot read saved inventory {path}: {reason}")]
    BadJson { path: String, reason: String },
    #[error("no PCI device {addr} on this host; `gpupass list --all` shows the devices there are")]
    NoSuchDevice { addr: PciAddress },
}

/// Sysfs resource flags (include/linux/ioport.h).
const IORESOURCE_IO: u64 = 0x0000_0100;
const IORESOURCE_MEM: u64 = 0x0000_0200;
const IORESOURCE_PREFETCH: u64 = 0x0000_2000;
const IORESOURCE_MEM_64: u64 = 0x0010_0000;

/// Parse sysfs `resource` into BARs (index, kind, start, size, flags). Unassigned lines
/// (all zero) are skipped; garbled lines are reported in the error list.
const ZERO64: &str = "0x0000000000000000";

pub fn parse_resource(text: &str) -> (Vec<Bar>, Vec<String>) {
    let mut bars = Vec::new();
    let mut errs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut it = line.split_whitespace();
        let (Some(f0), Some(f1), Some(f2), None) = (it.next(), it.next(), it.next(), it.next()) else {
            let n = line.split_whitespace().count();
            errs.push(format!("line {i} has {n} fields, expected 3"));
            continue;
        };
        // All-zero lines (absent BARs) are most of the file: no number to parse.
        if f0 == ZERO64 && f1 == ZERO64 {
            continue;
        }
        let (Some(start), Some(end), Some(flags)) = (parse_hex(f0), parse_hex(f1), parse_hex(f2)) else {
            errs.push(format!("line {i} is not hex"));
            continue;
        };
        if start == 0 && end == 0 {
            continue;
        }
        if end < start {
            errs.push(format!("line {i} ends before it starts"));
            continue;
        }
        // Found by fuzzing: 0..=u64::MAX has no u64 size.
        let Some(size) = (end - start).checked_add(1) else {
            errs.push(format!("line {i} spans the whole 64-bit address space"));
            continue;
        };
        let kind = if flags & IORESOURCE_IO != 0 {
            BarKind::Io
        } else if flags & IORESOURCE_MEM != 0 {
            BarKind::Memory
        } else {
            continue;
        };
        bars.push(Bar {
            index: i as u32,
            kind,
            start,
            size,
            is_64bit: flags & IORESOURCE_MEM_64 != 0,
            prefetchable: flags & IORESOURCE_PREFETCH != 0,
        });
    }
    (bars, errs)
}

/// IDs from a PCI `modalias` (`pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModaliasIds {
    pub vendor: u16,
    pub device: u16,
    pub subvendor: u16,
    pub subdevice: u16,
    pub class: u32,
}

/// Parse a PCI modalias; `None` when it is not exactly the kernel's format.
pub fn parse_pci_modalias(s: &str) -> Option<ModaliasIds> {
    let s = s.trim().strip_prefix("pci:")?;
    let mut rest = s;
    let mut field = |tag: &str, digits: usize| -> Option<u32> {
        let r = rest.strip_prefix(tag)?;
        let (h, tail) = (r.get(..digits)?, r.get(digits..)?);
        if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        rest = tail;
        u32::from_str_radix(h, 16).ok()
    };
    let vendor = field("v", 8)?;
    let device = field("d", 8)?;
    let subvendor = field("sv", 8)?;
    let subdevice = field("sd", 8)?;
    let bc = field("bc", 2)?;
    let sc = field("sc", 2)?;
    let pi = field("i", 2)?;
    if !rest.is_empty() || [vendor, device, subvendor, subdevice].iter().any(|v| *v > 0xffff) {
        return None;
    }
    Some(ModaliasIds {
        vendor: vendor as u16,
        device: device as u16,
        subvendor: subvendor as u16,
        subdevice: subdevice as u16,
        class: (bc << 16) | (sc << 8) | pi,
    })
}

/// Parse `/proc/driver/nvidia/gpus/<addr>/information` (`Key: value` lines).
pub fn parse_nvidia_information(text: &str) -> NvidiaInfo {
    let mut info = NvidiaInfo {
        minor: None,
        model: None,
        uuid: None,
    };
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "Device Minor" => info.minor = v.parse().ok(),
            "Model" if !v.is_empty() => info.model = Some(v.to_string()),
            "GPU UUID" if !v.is_empty() => info.uuid = Some(v.to_string()),
            _ => {}
        }
    }
    info
}

/// pci.ids names: (vendor, device, subsystem, class).
fn names(
    vendor: u16,
    device: u16,
    sub: Option<(u16, u16)>,
    class: u32,
) -> (Option<String>, Option<String>, Option<String>, Option<String>) {
    use pci_ids::FromId;
    let vname = pci_ids::Vendor::from_id(vendor).map(|v| v.name().to_string());
    let dev = pci_ids::Device::from_vid_pid(vendor, device);
    let dname = dev.map(|d| d.name().to_string());
    let sname = match (dev, sub) {
        (Some(d), Some((sv, sd))) => d
            .subsystems()
            .find(|s| s.subvendor() == sv && s.subdevice() == sd)
            .map(|s| s.name().to_string()),
        _ => None,
    };
    let base = (class >> 16) as u8;
    let subc = (class >> 8) as u8;
    let cname = pci_ids::Subclass::from_cid_sid(base, subc)
        .map(|s| s.name().to_string())
        .or_else(|| pci_ids::Class::from_id(base).map(|c| c.name().to_string()));
    (vname, dname, sname, cname)
}

/// Host-wide tables read once per scan rather than once per device.
#[derive(Default)]
struct HostTables {
    /// `etc/driverctl.d/pci-<addr>` contents.
    driverctl: HashMap<String, String>,
    /// Addresses with a `proc/driver/nvidia/gpus/<addr>` directory.
    nvidia_gpus: std::collections::HashSet<String>,
}

impl HostTables {
    fn read(host: &HostRoot, light: bool) -> Self {
        let mut t = HostTables::default();
        for n in dir_names(&host.driverctl_dir()).unwrap_or_default() {
            if let Some(addr) = n.strip_prefix("pci-") {
                if let Ok(v) = read_attr(&host.driverctl_dir().join(&n)) {
                    let v = v.trim().to_string();
                    if !v.is_empty() {
                        t.driverctl.insert(addr.to_string(), v);
                    }
                }
            }
        }
        if !light {
            t.nvidia_gpus = dir_names(&host.nvidia_gpus_proc())
                .unwrap_or_default()
                .into_iter()
                .collect();
        }
        t
    }
}

/// Attributes a light read leaves out: placement, resources and capabilities that no plan of a
/// bind, an unbind or a container's device nodes looks at.
const LIGHT_SKIPS: &[&str] = &[
    "numa_node",
    "local_cpulist",
    "resource",
    "revision",
    "reset_method",
    "sriov_totalvfs",
    "sriov_numvfs",
];

/// The entries of a device directory, sorted for lookups, with whether each is a regular file.
#[derive(Default)]
struct Listing(Vec<(String, bool)>);

impl Listing {
    fn new(mut v: Vec<(String, bool)>) -> Self {
        v.sort_unstable();
        Listing(v)
    }
    fn find(&self, name: &str) -> Option<&(String, bool)> {
        self.0
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()
            .map(|i| &self.0[i])
    }
    fn contains(&self, name: &str) -> bool {
        self.find(name).is_some()
    }
    fn is_regular(&self, name: &str) -> bool {
        self.find(name).is_some_and(|(_, r)| *r)
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.0.iter().map(|(n, _)| n.clone())
    }
}

struct Reader<'a> {
    host: &'a HostRoot,
    tables: &'a HostTables,
    warnings: Vec<String>,
    /// Entries of the device directory being read: attributes that are absent are not opened.
    present: Listing,
    /// A light read (see [`scan_groups`]): what planning a bind or a container's devices needs.
    light: bool,
    /// The device directory being read, open.
    cur: Option<host::AttrDir>,
    /// `local_cpulist` per NUMA node (-1: no node), see `device()`.
    cpulists: HashMap<i32, String>,
}

impl Reader<'_> {
    /// An attribute of the current device directory (see `present`).
    fn attr(&mut self, _dir: &Path, addr: &str, name: &str) -> Option<String> {
        if !self.present.contains(name) || (self.light && LIGHT_SKIPS.contains(&name)) {
            return None;
        }
        let cur = self.cur.as_ref()?;
        let r = if self.present.is_regular(name) {
            cur.read_listed_regular(name, host::ATTR_LIMIT as usize)
        } else {
            cur.read(name, host::ATTR_LIMIT as usize)
        };
        match r {
            Ok(s) => Some(s),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                self.warnings.push(format!("{addr}: cannot read {name}: {e}"));
                None
            }
        }
    }

    /// An optional attribute: missing is normal (`None`, no warning); unreadable warns.
    fn opt(&mut self, dir: &Path, addr: &str, name: &str) -> Option<String> {
        match read_attr(&dir.join(name)) {
            Ok(s) => Some(s),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                self.warnings.push(format!("{addr}: cannot read {name}: {e}"));
                None
            }
        }
    }

    /// A hex ID attribute of the device directory rendered as `width` lower-case hex digits.
    fn hex_id_attr(
        &mut self,
        dir: &Path,
        addr: &str,
        name: &str,
        width: usize,
        required: bool,
    ) -> Option<String> {
        let raw = self.attr(dir, addr, name);
        match raw.as_deref().map(parse_hex) {
            Some(Some(v)) if width >= 16 || v < (1u64 << (4 * width)) => Some(format!("{v:0width$x}")),
            Some(_) => {
                self.warnings.push(format!(
                    "{addr}: {name} holds {:?}, not a hex number",
                    raw.unwrap_or_default()
                ));
                None
            }
            None => {
                if required {
                    self.warnings.push(format!("{addr}: {name} is missing"));
                }
                None
            }
        }
    }

    /// A link of the current device directory (see `present`).
    fn dev_link(&mut self, _dir: &Path, addr: &str, name: &str) -> Option<String> {
        if !self.present.contains(name) {
            return None;
        }
        match self.cur.as_ref()?.link_name(name) {
            Ok(v) => v,
            Err(e) => {
                self.warnings
                    .push(format!("{addr}: cannot read link {name}: {e}"));
                None
            }
        }
    }

    fn addr_link(&mut self, dir: &Path, addr: &str, name: &str) -> Option<PciAddress> {
        self.dev_link(dir, addr, name).and_then(|n| n.parse().ok())
    }

    fn mdev_types(&mut self, types_dir: &Path, addr: &str) -> Vec<MdevType> {
        let mut out = Vec::new();
        let ids = match dir_names(types_dir) {
            Ok(v) => v,
            Err(e) => {
                self.warnings.push(format!(
                    "{addr}: cannot list {}: {e}",
                    self.host.display(types_dir)
                ));
                return out;
            }
        };
        for id in ids {
            let d = types_dir.join(&id);
            let name = self.opt(&d, addr, "name");
            let description = self.opt(&d, addr, "description");
            let avail_raw = self.opt(&d, addr, "available_instances");
            let available_instances = avail_raw.as_deref().and_then(|s| s.trim().parse().ok());
            if avail_raw.is_some() && available_instances.is_none() {
                self.warnings.push(format!(
                    "{addr}: mdev type {id}: available_instances is not a number"
                ));
            }
            let device_api = self.opt(&d, addr, "device_api");
            out.push(MdevType {
                id,
                name,
                description,
                available_instances,
                device_api,
            });
        }
        out
    }

    fn device(&mut self, addr: PciAddress, link_target: Option<&Path>) -> PciDevice {
        let a = addr.to_string();
        // Resolve the bus link once (lexically: sysfs links are relative and the bus directory
        // is real), so each attribute open does not walk the symlink again.
        let dir = match link_target {
            Some(t) => host::join_link(&self.host.sys_bus_pci_devices(), t),
            None => self.host.pci_device(&addr),
        };
        self.cur = None;
        self.present = match host::AttrDir::open(&dir).and_then(|d| {
            let entries = d.entries()?;
            self.cur = Some(d);
            Ok(entries)
        }) {
            Ok(v) => Listing::new(v),
            Err(e) => {
                if e.kind() != io::ErrorKind::NotFound {
                    self.warnings
                        .push(format!("{a}: cannot list its sysfs directory: {e}"));
                }
                Default::default()
            }
        };
        // One read of `modalias` gives vendor, device, subsystem and class; the separate
        // attributes are the fallback when it is missing or garbled.
        let modalias = self.attr(&dir, &a, "modalias");
        let ids = modalias.as_deref().and_then(parse_pci_modalias);
        let (vendor_id, device_id, subsystem_vendor_id, subsystem_device_id, class) = match ids {
            Some(m) => (
                format!("{:04x}", m.vendor),
                format!("{:04x}", m.device),
                Some(format!("{:04x}", m.subvendor)),
                Some(format!("{:04x}", m.subdevice)),
                format!("{:06x}", m.class),
            ),
            None => (
                self.hex_id_attr(&dir, &a, "vendor", 4, true)
                    .unwrap_or_else(|| "ffff".into()),
                self.hex_id_attr(&dir, &a, "device", 4, true)
                    .unwrap_or_else(|| "ffff".into()),
                self.hex_id_attr(&dir, &a, "subsystem_vendor", 4, false),
                self.hex_id_attr(&dir, &a, "subsystem_device", 4, false),
                self.hex_id_attr(&dir, &a, "class", 6, true)
                    .unwrap_or_else(|| "ff0000".into()),
            ),
        };
        let revision = self.hex_id_attr(&dir, &a, "revision", 2, false);
        let class_code = u32::from_str_radix(&class, 16).unwrap_or(0);
        let vid = u16::from_str_radix(&vendor_id, 16).unwrap_or(0xffff);
        let did = u16::from_str_radix(&device_id, 16).unwrap_or(0xffff);
        let sub = match (&subsystem_vendor_id, &subsystem_device_id) {
            (Some(v), Some(d)) => Some((
                u16::from_str_radix(v, 16).unwrap_or(0),
                u16::from_str_radix(d, 16).unwrap_or(0),
            )),
            _ => None,
        };
        let (vendor_name, device_name, subsystem_name, class_name) = names(vid, did, sub, class_code);

        let group_link = self.dev_link(&dir, &a, "iommu_group");
        let iommu_group = group_link.as_deref().and_then(|n| n.parse().ok());
        if let (Some(n), None) = (&group_link, iommu_group) {
            self.warnings.push(format!(
                "{a}: iommu_group links to {n:?}, not a group number; treated as having no IOMMU group"
            ));
        }
        // The kernel's link is `../../../bus/pci/drivers/<name>`; anything else (a loop, a link
        // to elsewhere) is a broken tree, not a driver. One readlink gives both.
        let driver = match self
            .present
            .contains("driver")
            .then_some(self.cur.as_ref())
            .flatten()
        {
            None => None,
            Some(c) => match c.link_target("driver") {
                Ok(Some(t)) if t.contains("/drivers/") => t.rsplit('/').next().map(str::to_string),
                Ok(Some(t)) => {
                    self.warnings.push(format!(
                        "{a}: driver links to {t:?}, not to a driver under bus/pci/drivers; treated as driverless"
                    ));
                    None
                }
                Ok(None) => None,
                Err(e) => {
                    self.warnings.push(format!("{a}: cannot read link driver: {e}"));
                    None
                }
            },
        };
        let driver_override = self
            .attr(&dir, &a, "driver_override")
            .filter(|s| !s.is_empty() && s != "(null)");
        let numa_node = match self.attr(&dir, &a, "numa_node") {
            Some(s) => match s.trim().parse::<i32>() {
                Ok(n) if n >= 0 => Some(n),
                Ok(_) => None,
                Err(_) => {
                    self.warnings
                        .push(format!("{a}: numa_node holds {s:?}, not a number"));
                    None
                }
            },
            None => None,
        };
        // The kernel prints cpumask_of_node(node) here (all online CPUs without a node), so
        // every device of one node has the same list: read it once per node.
        let node_key = numa_node.unwrap_or(-1);
        let local_cpulist = match self.cpulists.get(&node_key) {
            Some(v) if self.present.contains("local_cpulist") => Some(v.clone()),
            _ => {
                let v = self.attr(&dir, &a, "local_cpulist");
                if let Some(v) = &v {
                    self.cpulists.insert(node_key, v.clone());
                }
                v
            }
        };

        let mut bars = Vec::new();
        let mut rom = None;
        let mut vf_bars = Vec::new();
        if let Some(text) = self.attr(&dir, &a, "resource") {
            let (parsed, errs) = parse_resource(&text);
            for e in errs {
                self.warnings.push(format!("{a}: resource: {e}"));
            }
            for b in parsed {
                match b.index {
                    0..=5 => bars.push(b),
                    6 => rom = Some(b),
                    7..=12 => vf_bars.push(b),
                    _ => {}
                }
            }
        }
        let boot_vga = self.attr(&dir, &a, "boot_vga").map(|s| s.trim() == "1");
        let reset_methods = self
            .attr(&dir, &a, "reset_method")
            .map(|s| s.split_whitespace().map(str::to_string).collect());
        let base = (class_code >> 16) as u8;
        let subc = (class_code >> 8) as u8;
        let is_bridge = (base == 0x06 && matches!(subc, 0x04 | 0x09)) || self.present.contains("pci_bus");
        let parent = link_target.and_then(|t| {
            t.parent()
                .and_then(|p| p.file_name())
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse().ok())
        });

        let sriov = match self.attr(&dir, &a, "sriov_totalvfs") {
            Some(t) => {
                let total_vfs = t.trim().parse().unwrap_or(0);
                let num_vfs = self
                    .opt(&dir, &a, "sriov_numvfs")
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                let mut vfs: Vec<PciAddress> = Vec::new();
                {
                    let mut idx: Vec<(u32, String)> = self
                        .present
                        .names()
                        .filter_map(|n| {
                            n.strip_prefix("virtfn")
                                .and_then(|i| i.parse().ok())
                                .map(|i| (i, n))
                        })
                        .collect();
                    idx.sort();
                    for (_, n) in idx {
                        if let Some(v) = self.addr_link(&dir, &a, &n) {
                            vfs.push(v);
                        }
                    }
                }
                Some(Sriov {
                    total_vfs,
                    num_vfs,
                    vfs,
                    vf_bars,
                })
            }
            None => None,
        };
        let physfn = self.addr_link(&dir, &a, "physfn");
        let mdev_types = {
            let td = dir.join("mdev_supported_types");
            if self.present.contains("mdev_supported_types") && !self.light {
                self.mdev_types(&td, &a)
            } else {
                Vec::new()
            }
        };
        let (vgpu_types, current_vgpu_type) = self.nvidia_vgpu(&dir, &a);
        let nvidia = if !self.tables.nvidia_gpus.contains(&a) {
            None
        } else {
            let p = self.host.nvidia_gpus_proc().join(&a).join("information");
            match host::read_bounded(&p, host::ATTR_LIMIT) {
                Ok(t) => Some(parse_nvidia_information(&t)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => {
                    self.warnings
                        .push(format!("{a}: cannot read {}: {e}", self.host.display(&p)));
                    None
                }
            }
        };
        // `vfio-dev/vfioN` is the VFIO device's sysfs node (Linux 6.1+); it is a character
        // device, the cdev, only where it has a `dev` attribute (6.6+ with
        // CONFIG_VFIO_DEVICE_CDEV): on 6.1 the directory is there and the `dev` file is not.
        let vfio_cdev = if self.present.contains("vfio-dev") {
            dir_names(&dir.join("vfio-dev")).ok().and_then(|v| {
                v.into_iter().find_map(|n| {
                    let dev = read_attr(&dir.join("vfio-dev").join(&n).join("dev")).ok()?;
                    n.starts_with("vfio").then_some((n, dev))
                })
            })
        } else {
            None
        };
        let (vfio_cdev, vfio_cdev_dev, vfio_cdev_node_present) = match vfio_cdev {
            Some((c, dev)) => {
                let present = Some(self.host.vfio_cdev_node(&c).exists());
                (Some(c), Some(dev), present)
            }
            None => (None, None, None),
        };
        let persistent_driver = self.tables.driverctl.get(&a).cloned();

        PciDevice {
            address: addr,
            vendor_id,
            device_id,
            subsystem_vendor_id,
            subsystem_device_id,
            revision,
            class,
            class_name,
            vendor_name,
            device_name,
            subsystem_name,
            iommu_group,
            driver,
            driver_override,
            numa_node,
            local_cpulist,
            bars,
            rom,
            boot_vga,
            reset_methods,
            is_bridge,
            parent,
            modalias,
            sriov,
            physfn,
            mdev_types,
            vgpu_types,
            current_vgpu_type,
            nvidia,
            vfio_cdev,
            vfio_cdev_dev,
            vfio_cdev_node_present,
            backends: Vec::new(),
            persistent_driver,
        }
    }

    /// NVIDIA vendor-VFIO vGPU (kernel 6.8+, vGPU 17+): `nvidia/creatable_vgpu_types` lists
    /// `ID : Name` rows after a header; `nvidia/current_vgpu_type` holds the active id (0 = none).
    fn nvidia_vgpu(&mut self, dir: &Path, a: &str) -> (Vec<MdevType>, Option<String>) {
        if !self.present.contains("nvidia") || self.light {
            return (Vec::new(), None);
        }
        let nd = dir.join("nvidia");
        let Some(text) = self.opt(&nd, a, "creatable_vgpu_types") else {
            return (Vec::new(), None);
        };
        let types = parse_creatable_vgpu_types(&text);
        let current = self
            .opt(&nd, a, "current_vgpu_type")
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty() && s != "0");
        (types, current)
    }
}

/// Parse NVIDIA's `creatable_vgpu_types` table: a header line (`ID    : vGPU Name`) then one
/// `<id> : <name>` row per profile that can be created on this VF now.
pub fn parse_creatable_vgpu_types(text: &str) -> Vec<MdevType> {
    text.lines()
        .filter_map(|l| {
            let (id, name) = l.split_once(':')?;
            let id = id.trim();
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some(MdevType {
                id: id.to_string(),
                name: Some(name.trim().to_string()),
                description: None,
                available_instances: Some(1),
                device_api: Some("vfio-pci".to_string()),
            })
        })
        .collect()
}

/// Order devices for display: GPUs (and accelerators) first, then everything else, each by
/// address.
pub fn sort_devices(devices: &mut [PciDevice]) {
    devices.sort_by_key(|d| (!d.is_gpu(), d.address));
}

/// Read the whole host.
pub fn scan(host: &HostRoot) -> Result<Inventory, InventoryError> {
    let bus = host.sys_bus_pci_devices();
    let names = std::fs::read_dir(&bus).map_err(|e| InventoryError::NoPciBus {
        path: bus.display().to_string(),
        error: e,
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
    let mdev_parents = read_virtual_mdev_parents(host, &devices, &mut warnings);
    let groups = read_groups(host, &devices, &mdevs, &mut warnings);
    let kernel = read_attr(&host.path("proc/sys/kernel/osrelease")).ok();
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
        numa_nodes: read_numa_nodes(host),
        iommu_addr_bits: read_iommu_addr_bits(host),
        warnings,
    };
    crate::backend::annotate(host, &mut inv);
    Ok(inv)
}

/// `f` over `items` in chunks of at least `per_thread`, one thread per chunk up to the cores (8
/// at most); one chunk runs on the calling thread, since a thread's start costs more than a few
/// reads. Results in order; `None` for a chunk whose thread panicked.
fn in_chunks<T: Sync, R: Send>(
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

/// Read devices, spread over the machine's cores (each device is independent).
fn read_devices(
    host: &HostRoot,
    entries: &[(PciAddress, Option<std::path::PathBuf>)],
    light: bool,
    warnings: &mut Vec<String>,
) -> Vec<PciDevice> {
    let tables = HostTables::read(host, light);
    let tables = &tables;
    // Few devices (a bind reads one or two groups): no threads, whose start costs more than
    // the reads.
    const PER_THREAD: usize = 64;
    let read_part = |part: &[(PciAddress, Option<std::path::PathBuf>)]| {
        let mut r = Reader {
            host,
            tables,
            warnings: Vec::new(),
            present: Default::default(),
            light,
            cur: None,
            cpulists: HashMap::new(),
        };
        // A device that vanished since the listing (hot unplug) is skipped.
        let devs: Vec<PciDevice> = part
                        .iter()
                        .filter_map(|(a, t)| {
                            let before = r.warnings.len();
                            let link = t.clone().or_else(|| std::fs::read_link(host.pci_device(a)).ok());
                            let d = r.device(*a, link.as_deref());
                            if !r.present.is_empty() {
                                return Some(d);
                            }
                            // One warning, not one per attribute it could not read.
                            let why = r
                                .warnings
                                .get(before)
                                .filter(|w| w.contains("cannot list its sysfs directory"))
                                .cloned();
                            r.warnings.truncate(before);
                            r.warnings.push(match why {
                                Some(w) => format!("{w}; skipped"),
                                None => format!(
                                    "{a}: its sysfs directory is gone or empty (unplugged during the scan, or a dangling link); skipped"
                                ),
                            });
                            None
                        })
                        .collect();
        (devs, r.warnings)
    };
    let results: Vec<(Vec<PciDevice>, Vec<String>)> = in_chunks(entries, PER_THREAD, read_part)
        .into_iter()
        .map(|r| r.unwrap_or_else(|| (Vec::new(), vec!["a reader thread failed".into()])))
        .collect();
    let mut out = Vec::with_capacity(entries.len());
    for (d, w) in results {
        out.extend(d);
        warnings.extend(w);
    }
    out
}

fn read_mdevs(host: &HostRoot, warnings: &mut Vec<String>) -> Vec<MdevInstance> {
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
        out.push(MdevInstance {
            uuid,
            parent,
            type_id,
            iommu_group,
            driver,
        });
    }
    out
}

/// mdev parents under `sys/class/mdev_bus` that are not PCI functions of `devices` (the
/// kernel's sample drivers mbochs/mdpy/mtty live under `sys/devices/virtual/<drv>/<drv>`).
fn read_virtual_mdev_parents(
    host: &HostRoot,
    devices: &[PciDevice],
    warnings: &mut Vec<String>,
) -> Vec<MdevParent> {
    let class = host.mdev_bus_class();
    let names = match dir_names(&class) {
        Ok(n) => n,
        Err(e) => {
            warnings.push(format!("cannot list {}: {e}", host.display(&class)));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for name in names {
        if let Ok(a) = name.parse::<PciAddress>() {
            if devices.iter().any(|d| d.address == a) {
                continue;
            }
        }
        let link = class.join(&name);
        let sysfs_path = std::fs::canonicalize(&link).ok().and_then(|real| {
            let root = std::fs::canonicalize(host.root()).ok()?;
            real.strip_prefix(root).ok().map(|r| format!("/{}", r.display()))
        });
        let tables = HostTables::default();
        let mut r = Reader {
            host,
            tables: &tables,
            warnings: Vec::new(),
            present: Default::default(),
            light: false,
            cur: None,
            cpulists: HashMap::new(),
        };
        let mdev_types = r.mdev_types(&link.join("mdev_supported_types"), &name);
        warnings.extend(r.warnings);
        out.push(MdevParent {
            name,
            sysfs_path,
            mdev_types,
        });
    }
    out
}

fn read_groups(
    host: &HostRoot,
    devices: &[PciDevice],
    mdevs: &[MdevInstance],
    warnings: &mut Vec<String>,
) -> Vec<IommuGroup> {
    read_groups_only(host, devices, mdevs, None, None, warnings)
}

/// [`read_groups`], limited to the group numbers in `only` when given.
fn read_groups_only(
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
    let bus = host.sys_bus_pci_devices();
    if !bus.is_dir() {
        return Err(InventoryError::NoPciBus {
            path: bus.display().to_string(),
            error: std::io::Error::from(std::io::ErrorKind::NotFound),
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
        kernel: read_attr(&host.path("proc/sys/kernel/osrelease")).ok(),
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
        numa_nodes: Vec::new(),
        iommu_addr_bits: None,
        warnings,
    };
    crate::backend::annotate(host, &mut inv);
    Ok(inv)
}

/// The host's NUMA nodes with their CPUs and hugepage pools (`sys/devices/system/node/node<N>`),
/// by node number.
pub fn read_numa_nodes(host: &HostRoot) -> Vec<NumaNode> {
    let base = host.sys_numa_nodes();
    let mut nodes: Vec<NumaNode> = dir_names(&base)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| {
            let node: i32 = n.strip_prefix("node")?.parse().ok()?;
            let dir = base.join(n);
            let cpulist = read_attr(&dir.join("cpulist")).ok();
            let mut hugepages: Vec<HugePool> = dir_names(&dir.join("hugepages"))
                .unwrap_or_default()
                .iter()
                .filter_map(|h| {
                    let size_kib = h.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok()?;
                    let num = |f: &str| {
                        read_attr(&dir.join("hugepages").join(h).join(f))
                            .ok()?
                            .parse()
                            .ok()
                    };
                    Some(HugePool {
                        size_kib,
                        total: num("nr_hugepages")?,
                        free: num("free_hugepages")?,
                    })
                })
                .collect();
            hugepages.sort_by_key(|p| p.size_kib);
            Some(NumaNode {
                node,
                cpulist,
                hugepages,
            })
        })
        .collect();
    nodes.sort_by_key(|n| n.node);
    nodes
}

/// The narrowest input address width among the host's IOMMUs (`sys/class/iommu/<unit>`): Intel
/// VT-d's MGAW (capability register bits 21:16, plus one) and AMD-Vi's HATS (extended feature
/// register bits 11:10: 4, 5 or 6 page-table levels, 48, 57 or 64 bits).
pub fn read_iommu_addr_bits(host: &HostRoot) -> Option<u8> {
    let base = host.sys_class("iommu");
    dir_names(&base)
        .unwrap_or_default()
        .iter()
        .filter_map(|u| {
            let dir = base.join(u);
            if let Ok(cap) = read_attr(&dir.join("intel-iommu/cap")) {
                return intel_mgaw(&cap);
            }
            amd_hats(&read_attr(&dir.join("amd-iommu/features")).ok()?)
        })
        .min()
}

fn intel_mgaw(cap: &str) -> Option<u8> {
    let v = u64::from_str_radix(cap.trim().trim_start_matches("0x"), 16).ok()?;
    Some(((v >> 16) & 0x3f) as u8 + 1)
}

/// `features` holds the extended feature register, on newer kernels followed by `:EFR2`.
fn amd_hats(features: &str) -> Option<u8> {
    let efr = features.trim().split(':').next()?;
    let v = u64::from_str_radix(efr.trim_start_matches("0x"), 16).ok()?;
    match (v >> 10) & 3 {
        0 => Some(48),
        1 => Some(57),
        2 => Some(64),
        _ => None,
    }
}

/// The CPU's physical address width from `proc/cpuinfo` ("address sizes : 46 bits physical,
/// 48 bits virtual"), the first CPU's line.
pub fn read_cpu_phys_bits(host: &HostRoot) -> Option<u8> {
    let text = crate::host::read_bounded(&host.path("proc/cpuinfo"), 1 << 20).ok()?;
    parse_phys_bits(&text)
}

fn parse_phys_bits(cpuinfo: &str) -> Option<u8> {
    let line = cpuinfo.lines().find(|l| l.starts_with("address sizes"))?;
    let (_, v) = line.split_once(':')?;
    let bits = v.trim().split(" bits physical").next()?.trim();
    bits.parse().ok().filter(|b| (32..=64).contains(b))
}

/// Load an inventory saved with `--json`.
pub fn load_json(path: &Path) -> Result<Inventory, InventoryError> {
    let text = host::read_bounded_any(path, 256 * 1024 * 1024).map_err(|e| InventoryError::BadJson {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    let mut inv: Inventory = serde_json::from_str(&text).map_err(|e| InventoryError::BadJson {
        path: path.display().to_string(),
        reason: format!("{e} (expected the output of `gpupass list --all --json`)"),
    })?;
    if inv.schema_version > SCHEMA_VERSION {
        return Err(InventoryError::BadJson {
            path: path.display().to_string(),
            reason: format!(
                "schema_version {} is newer than this gpupass understands ({SCHEMA_VERSION})",
                inv.schema_version
            ),
        });
    }
    if inv.iommufd.is_none() {
        // Saved before backends were recorded: derive them from the nodes it did record.
        crate::backend::fill_backends(&mut inv);
    }
    Ok(inv)
}

#[cfg(test)]
mod tests {
    use super::*;

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
