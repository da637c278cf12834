//! Reading one PCI function's directory: the attributes present (one listing), each read
//! relative to the open directory (`openat`), links, pci.ids names, and the host-wide tables
//! (driverctl overrides, NVIDIA's GPUs) read once per scan; devices are read on all cores.

use super::*;

/// pci.ids names: [vendor, device, subsystem, class].
pub(super) fn names(vendor: u16, device: u16, sub: Option<(u16, u16)>, class: u32) -> Names {
    let (dname, sname) = super::pciids::device(vendor, device, sub);
    let cname = super::pciids::class((class >> 16) as u8, (class >> 8) as u8);
    [super::pciids::vendor(vendor), dname, sname, cname]
}

/// Host-wide tables read once per scan rather than once per device.
#[derive(Default)]
pub(super) struct HostTables {
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
pub(super) enum Attr {
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
pub(super) struct Listing {
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
pub(super) type Names = [Option<&'static str>; 4];
/// What the pci.ids names are looked up by: vendor, device, subsystem, class.
pub(super) type NamesKey = (u16, u16, Option<(u16, u16)>, u32);

pub(super) struct Reader<'a> {
    host: &'a HostRoot,
    tables: &'a HostTables,
    pub(super) warnings: Vec<String>,
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
    pub(super) fn new(host: &'a HostRoot, tables: &'a HostTables, light: bool) -> Self {
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

    pub(super) fn mdev_types(&mut self, types_dir: &Path, addr: &str) -> Vec<MdevType> {
        self.mdev_types_of(types_dir, addr, None)
    }

    /// [`Reader::mdev_types`]; with `only`, that one type when `types_dir` has it (the type a
    /// command names: the others' attributes are not read), else every type as without.
    pub(super) fn mdev_types_of(
        &mut self,
        types_dir: &Path,
        addr: &str,
        only: Option<&str>,
    ) -> Vec<MdevType> {
        let mut out = Vec::new();
        let one = only.filter(|t| {
            !t.is_empty() && !t.contains('/') && !t.starts_with('.') && types_dir.join(t).is_dir()
        });
        let ids = match one {
            Some(t) => Ok(vec![t.to_string()]),
            None => dir_names(types_dir),
        };
        let ids = match ids {
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

/// The target of the bus link `sys/bus/pci/devices/<addr>`, read relative to the open bus
/// directory when there is one; `None` when it cannot be read.
pub(super) fn bus_link(
    host: &HostRoot,
    bus: Option<&host::AttrDir>,
    a: &PciAddress,
) -> Option<std::path::PathBuf> {
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
pub(super) fn read_devices(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_names() {
        for a in Attr::ALL {
            assert_eq!(Attr::from_name(a.c_name().to_bytes()), Some(a));
        }
        assert_eq!(Attr::from_name(b"vendorx"), None);
        assert_eq!(Attr::from_name(b"x"), None);
    }
}
