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
pub mod native;
pub mod readiness;
pub mod snapshot;

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
    let bytes = text.as_bytes();
    let mut pos = 0;
    let mut i = 0;
    // Lines as `str::lines` splits them (`\n` or `\r\n`), walked by hand: a kernel line is
    // taken whole by its length, without searching for its end.
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        // The kernel's own format (`0x%016llx 0x%016llx 0x%016llx`), parsed from the bytes;
        // anything else takes the general path below.
        if rest.len() >= KERNEL_LINE && rest.get(KERNEL_LINE).is_none_or(|c| *c == b'\n') {
            let line = &rest[..KERNEL_LINE];
            if line == ZERO_LINE.as_bytes() {
                (pos, i) = (pos + KERNEL_LINE + 1, i + 1);
                continue;
            }
            if let Some([start, end, flags]) = kernel_resource_line(line) {
                if !(start == 0 && end == 0) {
                    bars.extend(resource_bar(i, start, end, flags, &mut errs));
                }
                (pos, i) = (pos + KERNEL_LINE + 1, i + 1);
                continue;
            }
        }
        let (line, next) = match rest.iter().position(|c| *c == b'\n') {
            Some(n) => {
                let l = &text[pos..pos + n];
                (l.strip_suffix('\r').unwrap_or(l), pos + n + 1)
            }
            None => (&text[pos..], bytes.len()),
        };
        parse_resource_line(i, line, &mut bars, &mut errs);
        (pos, i) = (next, i + 1);
    }
    (bars, errs)
}

/// The length of a `resource` line as the kernel prints it, and an unassigned one.
const KERNEL_LINE: usize = 3 * 18 + 2;
const ZERO_LINE: &str = "0x0000000000000000 0x0000000000000000 0x0000000000000000";

/// Line `i` of `resource` in any spacing and hex spelling.
fn parse_resource_line(i: usize, line: &str, bars: &mut Vec<Bar>, errs: &mut Vec<String>) {
    let mut it = line.split_whitespace();
    let (Some(f0), Some(f1), Some(f2), None) = (it.next(), it.next(), it.next(), it.next()) else {
        let n = line.split_whitespace().count();
        errs.push(format!("line {i} has {n} fields, expected 3"));
        return;
    };
    // All-zero lines (absent BARs) are most of the file: no number to parse.
    if f0 == ZERO64 && f1 == ZERO64 {
        return;
    }
    let (Some(start), Some(end), Some(flags)) = (parse_hex(f0), parse_hex(f1), parse_hex(f2)) else {
        errs.push(format!("line {i} is not hex"));
        return;
    };
    if start == 0 && end == 0 {
        return;
    }
    bars.extend(resource_bar(i, start, end, flags, errs));
}

/// The three numbers of a `resource` line exactly as the kernel prints it: `0x` and 16 hex
/// digits, three times, separated by one space.
fn kernel_resource_line(line: &[u8]) -> Option<[u64; 3]> {
    if line.len() != 3 * 18 + 2 {
        return None;
    }
    let mut out = [0u64; 3];
    for (k, v) in out.iter_mut().enumerate() {
        let f = &line[k * 19..k * 19 + 18];
        if k > 0 && line[k * 19 - 1] != b' ' {
            return None;
        }
        if &f[..2] != b"0x" {
            return None;
        }
        for &c in &f[2..] {
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return None,
            };
            *v = (*v << 4) | d as u64;
        }
    }
    Some(out)
}

/// Resource line `i` as a BAR; `None` for a line that is not an I/O or memory resource, or is
/// garbled (then `errs` says why).
fn resource_bar(i: usize, start: u64, end: u64, flags: u64, errs: &mut Vec<String>) -> Option<Bar> {
    if end < start {
        errs.push(format!("line {i} ends before it starts"));
        return None;
    }
    // Found by fuzzing: 0..=u64::MAX has no u64 size.
    let Some(size) = (end - start).checked_add(1) else {
        errs.push(format!("line {i} spans the whole 64-bit address space"));
        return None;
    };
    let kind = if flags & IORESOURCE_IO != 0 {
        BarKind::Io
    } else if flags & IORESOURCE_MEM != 0 {
        BarKind::Memory
    } else {
        return None;
    };
    Some(Bar {
        index: i as u32,
        kind,
        start,
        size,
        is_64bit: flags & IORESOURCE_MEM_64 != 0,
        prefetchable: flags & IORESOURCE_PREFETCH != 0,
    })
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

/// pci.ids names: [vendor, device, subsystem, class].
fn names(vendor: u16, device: u16, sub: Option<(u16, u16)>, class: u32) -> Names {
    use pci_ids::FromId;
    let vname = pci_ids::Vendor::from_id(vendor).map(|v| v.name());
    let dev = pci_ids::Device::from_vid_pid(vendor, device);
    let dname = dev.map(|d| d.name());
    let sname = match (dev, sub) {
        (Some(d), Some((sv, sd))) => d
            .subsystems()
            .find(|s| s.subvendor() == sv && s.subdevice() == sd)
            .map(|s| s.name()),
        _ => None,
    };
    let base = (class >> 16) as u8;
    let subc = (class >> 8) as u8;
    let cname = pci_ids::Subclass::from_cid_sid(base, subc)
        .map(|s| s.name())
        .or_else(|| pci_ids::Class::from_id(base).map(|c| c.name()));
    [vname, dname, sname, cname]
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

/// The attributes of a device directory the reader looks at: bits of a [`Listing`], and the
/// names it opens them by (C strings, so an open copies no path).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Attr {
    Modalias,
    Vendor,
    Device,
    SubsystemVendor,
    SubsystemDevice,
    Class,
    Revision,
    IommuGroup,
    Driver,
    DriverOverride,
    NumaNode,
    LocalCpulist,
    Resource,
    BootVga,
    ResetMethod,
    PciBus,
    SriovTotalvfs,
    SriovNumvfs,
    Physfn,
    MdevSupportedTypes,
    Nvidia,
    VfioDev,
}

impl Attr {
    /// Every attribute (for the tests).
    #[cfg(test)]
    const ALL: [Attr; 22] = [
        Attr::Modalias,
        Attr::Vendor,
        Attr::Device,
        Attr::SubsystemVendor,
        Attr::SubsystemDevice,
        Attr::Class,
        Attr::Revision,
        Attr::IommuGroup,
        Attr::Driver,
        Attr::DriverOverride,
        Attr::NumaNode,
        Attr::LocalCpulist,
        Attr::Resource,
        Attr::BootVga,
        Attr::ResetMethod,
        Attr::PciBus,
        Attr::SriovTotalvfs,
        Attr::SriovNumvfs,
        Attr::Physfn,
        Attr::MdevSupportedTypes,
        Attr::Nvidia,
        Attr::VfioDev,
    ];

    fn c_name(self) -> &'static std::ffi::CStr {
        match self {
            Attr::Modalias => c"modalias",
            Attr::Vendor => c"vendor",
            Attr::Device => c"device",
            Attr::SubsystemVendor => c"subsystem_vendor",
            Attr::SubsystemDevice => c"subsystem_device",
            Attr::Class => c"class",
            Attr::Revision => c"revision",
            Attr::IommuGroup => c"iommu_group",
            Attr::Driver => c"driver",
            Attr::DriverOverride => c"driver_override",
            Attr::NumaNode => c"numa_node",
            Attr::LocalCpulist => c"local_cpulist",
            Attr::Resource => c"resource",
            Attr::BootVga => c"boot_vga",
            Attr::ResetMethod => c"reset_method",
            Attr::PciBus => c"pci_bus",
            Attr::SriovTotalvfs => c"sriov_totalvfs",
            Attr::SriovNumvfs => c"sriov_numvfs",
            Attr::Physfn => c"physfn",
            Attr::MdevSupportedTypes => c"mdev_supported_types",
            Attr::Nvidia => c"nvidia",
            Attr::VfioDev => c"vfio-dev",
        }
    }

    /// The name as text, for warnings.
    fn name(self) -> &'static str {
        self.c_name().to_str().unwrap_or("?")
    }

    fn from_name(n: &[u8]) -> Option<Attr> {
        // Most entries of a device directory are not looked at; the names of each length are
        // few, so a miss costs a comparison or two.
        let of_len: &[Attr] = match n.len() {
            5 => &[Attr::Class],
            6 => &[
                Attr::Vendor,
                Attr::Device,
                Attr::Driver,
                Attr::Physfn,
                Attr::Nvidia,
            ],
            7 => &[Attr::PciBus],
            8 => &[
                Attr::Modalias,
                Attr::Revision,
                Attr::Resource,
                Attr::BootVga,
                Attr::VfioDev,
            ],
            9 => &[Attr::NumaNode],
            11 => &[Attr::IommuGroup],
            12 => &[Attr::ResetMethod, Attr::SriovNumvfs],
            13 => &[Attr::LocalCpulist],
            14 => &[Attr::SriovTotalvfs],
            15 => &[Attr::DriverOverride],
            16 => &[Attr::SubsystemVendor, Attr::SubsystemDevice],
            20 => &[Attr::MdevSupportedTypes],
            _ => &[],
        };
        of_len.iter().copied().find(|a| a.c_name().to_bytes() == n)
    }

    fn bit(self) -> u32 {
        1 << self as u32
    }

    /// Attributes a light read leaves out: placement, resources and capabilities that no plan
    /// of a bind, an unbind or a container's device nodes looks at.
    fn light_skips(self) -> bool {
        matches!(
            self,
            Attr::NumaNode
                | Attr::LocalCpulist
                | Attr::Resource
                | Attr::Revision
                | Attr::ResetMethod
                | Attr::SriovTotalvfs
                | Attr::SriovNumvfs
        )
    }
}

/// What one listing (`getdents64`) of a device directory said: which of the attributes the
/// reader knows are there and which of them are regular files, the `virtfn<N>` links, and
/// whether the directory had any entry at all. Nothing is allocated per entry.
#[derive(Default)]
struct Listing {
    present: u32,
    regular: u32,
    any: bool,
    /// `virtfn<N>` entries by N.
    virtfns: Vec<(u32, String)>,
}

impl Listing {
    fn read(d: &host::AttrDir) -> io::Result<Self> {
        let mut l = Listing::default();
        d.for_each_entry(|n, regular| {
            l.any = true;
            if let Some(a) = Attr::from_name(n) {
                l.present |= a.bit();
                if regular {
                    l.regular |= a.bit();
                }
            } else if let Some(i) = n.strip_prefix(b"virtfn") {
                let n = host::utf8(n);
                if let Ok(i) = host::utf8(i).parse() {
                    l.virtfns.push((i, n.into_owned()));
                }
            }
        })?;
        l.virtfns.sort();
        Ok(l)
    }
    fn contains(&self, a: Attr) -> bool {
        self.present & a.bit() != 0
    }
    fn is_regular(&self, a: Attr) -> bool {
        self.regular & a.bit() != 0
    }
    fn is_empty(&self) -> bool {
        !self.any
    }
}

/// pci.ids names of (vendor, device, subsystem, class).
type Names = [Option<&'static str>; 4];
/// What the pci.ids names are looked up by: vendor, device, subsystem, class.
type NamesKey = (u16, u16, Option<(u16, u16)>, u32);

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
    /// The one buffer every attribute and link of the scan is read into.
    buf: Vec<u8>,
    /// pci.ids lookups already made (a large host has many functions of few models).
    names: HashMap<NamesKey, Names>,
    /// `sys/bus/pci/devices`, which the bus links are relative to.
    bus: std::path::PathBuf,
}

impl<'a> Reader<'a> {
    fn new(host: &'a HostRoot, tables: &'a HostTables, light: bool) -> Self {
        Reader {
            host,
            tables,
            warnings: Vec::new(),
            present: Default::default(),
            light,
            cur: None,
            cpulists: HashMap::new(),
            buf: Vec::new(),
            names: HashMap::new(),
            bus: host.sys_bus_pci_devices(),
        }
    }
}

impl Reader<'_> {
    /// Read an attribute of the current device directory (see `present`) into `self.buf`;
    /// `false` when it is absent, skipped or unreadable (which warns).
    fn read(&mut self, addr: &str, a: Attr) -> bool {
        if !self.present.contains(a) || (self.light && a.light_skips()) {
            return false;
        }
        let Some(cur) = self.cur.as_ref() else {
            return false;
        };
        match cur.read_into(
            a.c_name(),
            host::ATTR_LIMIT as usize,
            self.present.is_regular(a),
            &mut self.buf,
        ) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => {
                self.warnings
                    .push(format!("{addr}: cannot read {}: {e}", a.name()));
                false
            }
        }
    }

    /// An attribute of the current device directory as text, borrowed from `self.buf`.
    fn text(&mut self, addr: &str, a: Attr) -> Option<std::borrow::Cow<'_, str>> {
        self.read(addr, a).then(|| host::utf8(&self.buf))
    }

    /// An attribute of the current device directory as an owned string.
    fn attr(&mut self, addr: &str, a: Attr) -> Option<String> {
        self.text(addr, a).map(|s| s.into_owned())
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

    /// A hex ID attribute of the device directory as a number below `16^width`.
    fn hex_id_attr(&mut self, addr: &str, a: Attr, width: usize, required: bool) -> Option<u64> {
        if !self.read(addr, a) {
            if required {
                self.warnings.push(format!("{addr}: {} is missing", a.name()));
            }
            return None;
        }
        let raw = host::utf8(&self.buf);
        match parse_hex(&raw) {
            Some(v) if width >= 16 || v < (1u64 << (4 * width)) => Some(v),
            _ => {
                let w = format!("{addr}: {} holds {:?}, not a hex number", a.name(), raw);
                self.warnings.push(w);
                None
            }
        }
    }

    /// Read a link of the current device directory (see `present`) into `self.buf`; `false`
    /// when it is absent or unreadable (which warns).
    fn link(&mut self, addr: &str, name: &std::ffi::CStr, listed: bool) -> bool {
        if !listed {
            return false;
        }
        let Some(cur) = self.cur.as_ref() else {
            return false;
        };
        match cur.link_into(name, &mut self.buf) {
            Ok(found) => found,
            Err(e) => {
                let n = name.to_string_lossy();
                self.warnings.push(format!("{addr}: cannot read link {n}: {e}"));
                false
            }
        }
    }

    /// The last component of a link of the current device directory, borrowed from `self.buf`.
    fn link_last(&mut self, addr: &str, a: Attr) -> Option<std::borrow::Cow<'_, str>> {
        let listed = self.present.contains(a);
        self.link(addr, a.c_name(), listed)
            .then(|| host::utf8(host::last_component(&self.buf)))
    }

    /// The address a link of the current device directory (`physfn`, `virtfn<N>`) points at.
    fn addr_link(&mut self, addr: &str, name: &std::ffi::CStr, listed: bool) -> Option<PciAddress> {
        if !self.link(addr, name, listed) {
            return None;
        }
        host::utf8(host::last_component(&self.buf)).parse().ok()
    }

    /// pci.ids names, looked up once per model.
    fn names(&mut self, vendor: u16, device: u16, sub: Option<(u16, u16)>, class: u32) -> Names {
        *self
            .names
            .entry((vendor, device, sub, class))
            .or_insert_with(|| names(vendor, device, sub, class))
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
            Some(t) => host::join_link(&self.bus, t),
            None => self.host.pci_device(&addr),
        };
        self.cur = None;
        self.present = match host::AttrDir::open(&dir).and_then(|d| {
            let listing = Listing::read(&d)?;
            self.cur = Some(d);
            Ok(listing)
        }) {
            Ok(l) => l,
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
        let modalias = self.attr(&a, Attr::Modalias);
        let ids = modalias.as_deref().and_then(parse_pci_modalias);
        let (vid, did, sv, sd, class_code) = match ids {
            Some(m) => (m.vendor, m.device, Some(m.subvendor), Some(m.subdevice), m.class),
            None => (
                self.hex_id_attr(&a, Attr::Vendor, 4, true)
                    .map_or(0xffff, |v| v as u16),
                self.hex_id_attr(&a, Attr::Device, 4, true)
                    .map_or(0xffff, |v| v as u16),
                self.hex_id_attr(&a, Attr::SubsystemVendor, 4, false)
                    .map(|v| v as u16),
                self.hex_id_attr(&a, Attr::SubsystemDevice, 4, false)
                    .map(|v| v as u16),
                self.hex_id_attr(&a, Attr::Class, 6, true)
                    .map_or(0xff0000, |v| v as u32),
            ),
        };
        let sub = sv.zip(sd);
        let vendor_id = PciId::from_u16(vid);
        let device_id = PciId::from_u16(did);
        let subsystem_vendor_id = sv.map(PciId::from_u16);
        let subsystem_device_id = sd.map(PciId::from_u16);
        // `class` was checked to fit six digits, and a modalias has 24 bits.
        let class = ClassCode::from_bits(class_code);
        let revision = self
            .hex_id_attr(&a, Attr::Revision, 2, false)
            .map(|v| Revision::from_u8(v as u8));
        let [vendor_name, device_name, subsystem_name, class_name] = self
            .names(vid, did, sub, class_code)
            .map(|n| n.map(str::to_string));

        let (iommu_group, bad_group) = match self.link_last(&a, Attr::IommuGroup) {
            Some(n) => match n.parse::<u32>() {
                Ok(g) => (Some(g), None),
                Err(_) => (None, Some(n.into_owned())),
            },
            None => (None, None),
        };
        if let Some(n) = bad_group {
            self.warnings.push(format!(
                "{a}: iommu_group links to {n:?}, not a group number; treated as having no IOMMU group"
            ));
        }
        // The kernel's link is `../../../bus/pci/drivers/<name>`; anything else (a loop, a link
        // to elsewhere) is a broken tree, not a driver. One readlink gives both.
        let driver = if self.link(&a, c"driver", self.present.contains(Attr::Driver)) {
            let t = &self.buf;
            if t.windows(9).any(|w| w == b"/drivers/") {
                Some(host::utf8(host::last_component(t)).into_owned())
            } else {
                let t = host::utf8(t).into_owned();
                self.warnings.push(format!(
                    "{a}: driver links to {t:?}, not to a driver under bus/pci/drivers; treated as driverless"
                ));
                None
            }
        } else {
            None
        };
        let driver_override = self
            .text(&a, Attr::DriverOverride)
            .filter(|s| !s.is_empty() && s != "(null)")
            .map(|s| s.into_owned());
        let numa_node = if self.read(&a, Attr::NumaNode) {
            let s = host::utf8(&self.buf);
            match s.trim().parse::<i32>() {
                Ok(n) if n >= 0 => Some(n),
                Ok(_) => None,
                Err(_) => {
                    let w = format!("{a}: numa_node holds {s:?}, not a number");
                    self.warnings.push(w);
                    None
                }
            }
        } else {
            None
        };
        // The kernel prints cpumask_of_node(node) here (all online CPUs without a node), so
        // every device of one node has the same list: read it once per node.
        let node_key = numa_node.unwrap_or(-1);
        let local_cpulist = match self.cpulists.get(&node_key) {
            Some(v) if self.present.contains(Attr::LocalCpulist) => Some(v.clone()),
            _ => {
                let v = self.attr(&a, Attr::LocalCpulist);
                if let Some(v) = &v {
                    self.cpulists.insert(node_key, v.clone());
                }
                v
            }
        };

        let mut bars = Vec::new();
        let mut rom = None;
        let mut vf_bars = Vec::new();
        if self.read(&a, Attr::Resource) {
            let (parsed, errs) = parse_resource(&host::utf8(&self.buf));
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
        let boot_vga = self.text(&a, Attr::BootVga).map(|s| s.trim() == "1");
        let reset_methods = self
            .text(&a, Attr::ResetMethod)
            .map(|s| s.split_whitespace().map(str::to_string).collect());
        let base = (class_code >> 16) as u8;
        let subc = (class_code >> 8) as u8;
        let is_bridge = (base == 0x06 && matches!(subc, 0x04 | 0x09)) || self.present.contains(Attr::PciBus);
        let parent = link_target.and_then(|t| {
            t.parent()
                .and_then(|p| p.file_name())
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse().ok())
        });

        let sriov = match self
            .text(&a, Attr::SriovTotalvfs)
            .map(|t| t.trim().parse().unwrap_or(0))
        {
            Some(total_vfs) => {
                let num_vfs = self
                    .text(&a, Attr::SriovNumvfs)
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                let mut vfs: Vec<PciAddress> = Vec::new();
                for (_, n) in std::mem::take(&mut self.present.virtfns) {
                    let Ok(n) = std::ffi::CString::new(n) else {
                        continue;
                    };
                    if let Some(v) = self.addr_link(&a, &n, true) {
                        vfs.push(v);
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
        let physfn = self.addr_link(&a, c"physfn", self.present.contains(Attr::Physfn));
        let mdev_types = {
            let td = dir.join("mdev_supported_types");
            if self.present.contains(Attr::MdevSupportedTypes) && !self.light {
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
        let vfio_cdev = if self.present.contains(Attr::VfioDev) {
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
        if !self.present.contains(Attr::Nvidia) || self.light {
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
    // The key once per device: `is_gpu` parses the class text.
    devices.sort_by_cached_key(|d| (!d.is_gpu(), d.address));
}

/// Read the whole host.
pub fn scan(host: &HostRoot) -> Result<Inventory, InventoryError> {
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
    crate::inventory::backend::annotate(host, &mut inv);
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

/// The target of the bus link `sys/bus/pci/devices/<addr>`, read relative to the open bus
/// directory when there is one; `None` when it cannot be read.
fn bus_link(host: &HostRoot, bus: Option<&host::AttrDir>, a: &PciAddress) -> Option<std::path::PathBuf> {
    let Some(bus) = bus else {
        return std::fs::read_link(host.pci_device(a)).ok();
    };
    let mut v = Vec::new();
    let name = a.to_string();
    bus.link_into(name.as_str(), &mut v).ok()?.then(|| {
        use std::os::unix::ffi::OsStringExt;
        std::ffi::OsString::from_vec(v).into()
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
        let mut r = Reader::new(host, tables, light);
        // The bus links are read relative to the open bus directory.
        let bus = host::AttrDir::open(&host.sys_bus_pci_devices()).ok();
        // A device that vanished since the listing (hot unplug) is skipped.
        let devs: Vec<PciDevice> = part
                        .iter()
                        .filter_map(|(a, t)| {
                            let before = r.warnings.len();
                            let link = t.clone().or_else(|| bus_link(host, bus.as_ref(), a));
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
        let mut r = Reader::new(host, &tables, false);
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
    crate::inventory::backend::annotate(host, &mut inv);
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
    fn listing_names() {
        for a in Attr::ALL {
            assert_eq!(Attr::from_name(a.c_name().to_bytes()), Some(a));
        }
        assert_eq!(Attr::from_name(b"vendorx"), None);
        assert_eq!(Attr::from_name(b"x"), None);
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
