//! Fake host trees laid out exactly as the kernel lays out sysfs, for fixtures, tests and the
//! benchmark generator.
//!
//! The layout (all links relative, as the kernel makes them):
//! - `sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/` holds the attributes;
//! - `sys/bus/pci/devices/0000:01:00.0 -> ../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0`;
//! - `<dev>/driver -> ../../../../bus/pci/drivers/nvidia` and the driver's back link;
//! - `<dev>/iommu_group -> ../../../../kernel/iommu_groups/1` and
//!   `sys/kernel/iommu_groups/1/devices/0000:01:00.0 -> ../../../../devices/...`;
//! - bridges have a `pci_bus/` directory; VFs a `physfn` link, PFs `virtfnN` links;
//! - mdev parents have `mdev_supported_types/<type>/{name,description,available_instances,
//!   device_api,create,devices/}` and a `sys/class/mdev_bus/<parent>` link.
//!
//! Device nodes (`dev/vfio/N`) are plain empty files: gpupass only checks that they exist.

use crate::model::PciAddress;
use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Sysfs resource flags used when writing `resource`.
pub const MEM: u64 = 0x0004_0200;
pub const MEM_PREF: u64 = 0x0004_2200;
pub const MEM64_PREF: u64 = 0x0014_220c;
pub const MEM64: u64 = 0x0014_0204;
pub const IO: u64 = 0x0004_0101;
pub const ROM: u64 = 0x0004_6200;

/// One function to lay down.
#[derive(Debug, Clone)]
pub struct DevSpec {
    pub addr: PciAddress,
    pub vendor: u16,
    pub device: u16,
    pub subsystem: Option<(u16, u16)>,
    pub class: u32,
    pub revision: u8,
    pub driver: Option<String>,
    pub group: Option<u32>,
    pub numa: i32,
    pub cpulist: String,
    /// (index, start, size, flags)
    pub resources: Vec<(u32, u64, u64, u64)>,
    pub boot_vga: Option<bool>,
    pub reset_method: Option<String>,
    pub parent: Option<PciAddress>,
    pub sriov_total: Option<u32>,
    pub physfn: Option<PciAddress>,
}

impl DevSpec {
    pub fn new(addr: &str, vendor: u16, device: u16, class: u32) -> Self {
        DevSpec {
            addr: addr.parse().expect("fixture address"),
            vendor,
            device,
            subsystem: None,
            class,
            revision: 0xa1,
            driver: None,
            group: None,
            numa: -1,
            cpulist: "0-15".into(),
            resources: Vec::new(),
            boot_vga: None,
            reset_method: Some("flr bus".into()),
            parent: None,
            sriov_total: None,
            physfn: None,
        }
    }
    pub fn driver(mut self, d: &str) -> Self {
        self.driver = Some(d.into());
        self
    }
    pub fn group(mut self, g: u32) -> Self {
        self.group = Some(g);
        self
    }
    pub fn numa(mut self, n: i32, cpus: &str) -> Self {
        self.numa = n;
        self.cpulist = cpus.into();
        self
    }
    pub fn sub(mut self, v: u16, d: u16) -> Self {
        self.subsystem = Some((v, d));
        self
    }
    pub fn res(mut self, index: u32, start: u64, size: u64, flags: u64) -> Self {
        self.resources.push((index, start, size, flags));
        self
    }
    pub fn boot_vga(mut self, b: bool) -> Self {
        self.boot_vga = Some(b);
        self
    }
    pub fn reset(mut self, m: Option<&str>) -> Self {
        self.reset_method = m.map(str::to_string);
        self
    }
    pub fn under(mut self, parent: &str) -> Self {
        self.parent = Some(parent.parse().expect("fixture parent"));
        self
    }
    pub fn rev(mut self, r: u8) -> Self {
        self.revision = r;
        self
    }
    pub fn sriov(mut self, total: u32) -> Self {
        self.sriov_total = Some(total);
        self
    }
    pub fn vf_of(mut self, pf: &str) -> Self {
        self.physfn = Some(pf.parse().expect("fixture pf"));
        self
    }
}

/// The first 256 bytes of configuration space, consistent with the other attributes: IDs,
/// command (memory + I/O decode, bus master), revision, class, header type (1 for bridges, with
/// the multifunction bit on function 0 of a slot that has more), subsystem IDs, BAR registers
/// with their type bits, and for bridges the bus numbers.
fn config_space(s: &DevSpec, sv: u16, sd: u16) -> Vec<u8> {
    let mut c = vec![0u8; 256];
    c[0..2].copy_from_slice(&s.vendor.to_le_bytes());
    c[2..4].copy_from_slice(&s.device.to_le_bytes());
    c[4..6].copy_from_slice(&0x0007u16.to_le_bytes());
    c[6..8].copy_from_slice(&0x0010u16.to_le_bytes()); // capability list present
    c[8] = s.revision;
    c[9] = s.class as u8;
    c[10] = (s.class >> 8) as u8;
    c[11] = (s.class >> 16) as u8;
    let bridge = s.class >> 8 == 0x0604;
    c[0x0e] = if bridge { 1 } else { 0 };
    if !bridge {
        c[0x2c..0x2e].copy_from_slice(&sv.to_le_bytes());
        c[0x2e..0x30].copy_from_slice(&sd.to_le_bytes());
        let mut i = 0;
        while i < 6 {
            let reg = 0x10 + 4 * i;
            if let Some(&(_, start, _, flags)) = s.resources.iter().find(|r| r.0 == i as u32) {
                let io = flags & IO & 0x100 != 0;
                let is64 = flags & 0x0010_0000 != 0;
                let pref = flags & 0x2000 != 0;
                let low = if io {
                    (start as u32 & !0x3) | 1
                } else {
                    (start as u32 & !0xf) | if is64 { 4 } else { 0 } | if pref { 8 } else { 0 }
                };
                c[reg..reg + 4].copy_from_slice(&low.to_le_bytes());
                if is64 && i < 5 {
                    c[reg + 4..reg + 8].copy_from_slice(&((start >> 32) as u32).to_le_bytes());
                    i += 1;
                }
            }
            i += 1;
        }
    } else {
        c[0x18] = s.addr.bus;
        c[0x19] = s.addr.bus.wrapping_add(1);
        c[0x1a] = s.addr.bus.wrapping_add(1);
    }
    c[0x34] = 0x40;
    // One PCI Express capability so tools that look for it find a well-formed list end.
    c[0x40] = 0x10;
    c[0x41] = 0x00;
    c[0x42] = 0x02;
    c
}

/// Relative link target from the directory holding `link` to `target` (both root-relative).
fn relative(link: &Path, target: &Path) -> PathBuf {
    let from: Vec<Component> = link.parent().unwrap_or(Path::new("")).components().collect();
    let to: Vec<Component> = target.components().collect();
    let common = from.iter().zip(to.iter()).take_while(|(a, b)| a == b).count();
    let mut p = PathBuf::new();
    for _ in common..from.len() {
        p.push("..");
    }
    for c in &to[common..] {
        p.push(c.as_os_str());
    }
    p
}

/// Builds a fake host under a root directory.
pub struct HostBuilder {
    root: PathBuf,
    dirs: HashMap<PciAddress, PathBuf>,
}

impl HostBuilder {
    pub fn new(root: impl Into<PathBuf>) -> io::Result<Self> {
        let root = root.into();
        for d in [
            "sys/bus/pci/devices",
            "sys/bus/pci/drivers",
            "sys/kernel/iommu_groups",
            "sys/module",
            "dev",
            "proc/sys/kernel",
        ] {
            fs::create_dir_all(root.join(d))?;
        }
        Ok(HostBuilder {
            root,
            dirs: HashMap::new(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Write a root-relative file, creating its directory.
    pub fn file(&self, rel: impl AsRef<Path>, content: &str) -> io::Result<()> {
        let p = self.root.join(rel);
        if let Some(d) = p.parent() {
            fs::create_dir_all(d)?;
        }
        fs::write(p, content)
    }

    /// `proc/cpuinfo` reduced to its address-sizes line (what gpupass reads).
    pub fn cpu_address_bits(&self, physical: u8, virtual_: u8) -> io::Result<()> {
        self.file(
            "proc/cpuinfo",
            &format!("address sizes\t: {physical} bits physical, {virtual_} bits virtual\n"),
        )
    }

    /// A NUMA node with its CPUs and hugepage pools `(size KiB, reserved, free)`.
    pub fn numa_node(&self, node: u32, cpulist: &str, pools: &[(u64, u64, u64)]) -> io::Result<()> {
        let d = format!("sys/devices/system/node/node{node}");
        self.file(format!("{d}/cpulist"), &format!("{cpulist}\n"))?;
        for (kib, total, free) in pools {
            let h = format!("{d}/hugepages/hugepages-{kib}kB");
            self.file(format!("{h}/nr_hugepages"), &format!("{total}\n"))?;
            self.file(format!("{h}/free_hugepages"), &format!("{free}\n"))?;
        }
        Ok(())
    }

    /// An IOMMU unit in `sys/class/iommu`: Intel (`dmarN`, its `cap` register) or AMD (`ivhdN`,
    /// its extended feature register), the link pointing into `sys/devices/virtual/iommu`.
    pub fn iommu_unit(&self, name: &str, register: &str) -> io::Result<()> {
        let file = if name.starts_with("dmar") {
            "intel-iommu/cap"
        } else {
            "amd-iommu/features"
        };
        self.file(
            format!("sys/devices/virtual/iommu/{name}/{file}"),
            &format!("{register}\n"),
        )?;
        let link = self.root.join("sys/class/iommu").join(name);
        fs::create_dir_all(link.parent().unwrap())?;
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(format!("../../devices/virtual/iommu/{name}"), link)
    }

    /// Write a root-relative binary file.
    pub fn bytes(&self, rel: impl AsRef<Path>, content: &[u8]) -> io::Result<()> {
        let p = self.root.join(rel);
        if let Some(d) = p.parent() {
            fs::create_dir_all(d)?;
        }
        fs::write(p, content)
    }

    /// A relative symlink at root-relative `link` pointing at root-relative `target`.
    pub fn link(&self, link: impl AsRef<Path>, target: impl AsRef<Path>) -> io::Result<()> {
        let (link, target) = (link.as_ref(), target.as_ref());
        let p = self.root.join(link);
        if let Some(d) = p.parent() {
            fs::create_dir_all(d)?;
        }
        let _ = fs::remove_file(&p);
        std::os::unix::fs::symlink(relative(link, target), p)
    }

    /// Root-relative directory of an added device.
    pub fn dev_dir(&self, addr: &PciAddress) -> Option<&Path> {
        self.dirs.get(addr).map(|p| p.as_path())
    }

    pub fn add(&mut self, s: &DevSpec) -> io::Result<()> {
        let dir = match s.parent.or(s.physfn.and_then(|pf| self.parent_of(&pf))) {
            Some(p) => self
                .dirs
                .get(&p)
                .ok_or_else(|| io::Error::other(format!("parent {p} of {} not added yet", s.addr)))?
                .join(s.addr.to_string()),
            None => PathBuf::from(format!("sys/devices/pci{:04x}:{:02x}", s.addr.domain, s.addr.bus))
                .join(s.addr.to_string()),
        };
        self.dirs.insert(s.addr, dir.clone());
        let a = s.addr.to_string();
        self.file(dir.join("vendor"), &format!("0x{:04x}\n", s.vendor))?;
        self.file(dir.join("device"), &format!("0x{:04x}\n", s.device))?;
        let (sv, sd) = s.subsystem.unwrap_or((s.vendor, 0));
        self.file(dir.join("subsystem_vendor"), &format!("0x{sv:04x}\n"))?;
        self.file(dir.join("subsystem_device"), &format!("0x{sd:04x}\n"))?;
        self.file(dir.join("class"), &format!("0x{:06x}\n", s.class))?;
        self.file(dir.join("revision"), &format!("0x{:02x}\n", s.revision))?;
        self.file(dir.join("numa_node"), &format!("{}\n", s.numa))?;
        self.file(dir.join("local_cpulist"), &format!("{}\n", s.cpulist))?;
        self.file(dir.join("driver_override"), "(null)\n")?;
        self.file(dir.join("enable"), "1\n")?;
        self.file(dir.join("irq"), "16\n")?;
        let modalias = format!(
            "pci:v{:08X}d{:08X}sv{:08X}sd{:08X}bc{:02X}sc{:02X}i{:02X}",
            s.vendor,
            s.device,
            sv,
            sd,
            s.class >> 16,
            (s.class >> 8) & 0xff,
            s.class & 0xff
        );
        self.file(dir.join("modalias"), &format!("{modalias}\n"))?;
        let is_bridge = s.class >> 8 == 0x0604;
        let lines = if is_bridge { 17 } else { 13 };
        let mut res = String::new();
        for i in 0..lines {
            match s.resources.iter().find(|r| r.0 == i) {
                Some(&(_, start, size, flags)) => res.push_str(&format!(
                    "0x{:016x} 0x{:016x} 0x{:016x}\n",
                    start,
                    start + size - 1,
                    flags
                )),
                None => res.push_str(&format!("0x{:016x} 0x{:016x} 0x{:016x}\n", 0, 0, 0)),
            }
        }
        self.file(dir.join("resource"), &res)?;
        self.bytes(dir.join("config"), &config_space(s, sv, sd))?;
        if let Some(b) = s.boot_vga {
            self.file(dir.join("boot_vga"), if b { "1\n" } else { "0\n" })?;
        }
        if let Some(m) = &s.reset_method {
            self.file(dir.join("reset_method"), &format!("{m}\n"))?;
            self.file(dir.join("reset"), "")?;
        }
        if is_bridge {
            fs::create_dir_all(self.root.join(&dir).join("pci_bus"))?;
        }
        self.link(format!("sys/bus/pci/devices/{a}"), &dir)?;
        if let Some(d) = &s.driver {
            self.bind_driver(&s.addr, d)?;
        }
        if let Some(g) = s.group {
            let gdir = PathBuf::from(format!("sys/kernel/iommu_groups/{g}"));
            fs::create_dir_all(self.root.join(&gdir).join("devices"))?;
            self.link(dir.join("iommu_group"), &gdir)?;
            self.link(gdir.join("devices").join(&a), &dir)?;
        }
        if let Some(t) = s.sriov_total {
            self.file(dir.join("sriov_totalvfs"), &format!("{t}\n"))?;
            self.file(dir.join("sriov_numvfs"), "0\n")?;
        }
        if let Some(pf) = s.physfn {
            let pfdir = self
                .dirs
                .get(&pf)
                .cloned()
                .ok_or_else(|| io::Error::other("pf first"))?;
            self.link(dir.join("physfn"), &pfdir)?;
            let n = fs::read_dir(self.root.join(&pfdir))?
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("virtfn"))
                .count();
            self.link(pfdir.join(format!("virtfn{n}")), &dir)?;
            self.file(pfdir.join("sriov_numvfs"), &format!("{}\n", n + 1))?;
        }
        Ok(())
    }

    fn parent_of(&self, addr: &PciAddress) -> Option<PciAddress> {
        let d = self.dirs.get(addr)?;
        d.parent()?.file_name()?.to_str()?.parse().ok()
    }

    /// Point a device's `driver` link at a driver (and the driver's back link at the device).
    pub fn bind_driver(&self, addr: &PciAddress, driver: &str) -> io::Result<()> {
        let dir = self
            .dirs
            .get(addr)
            .ok_or_else(|| io::Error::other("unknown device"))?;
        let ddir = PathBuf::from(format!("sys/bus/pci/drivers/{driver}"));
        fs::create_dir_all(self.root.join(&ddir))?;
        self.link(dir.join("driver"), &ddir)?;
        self.link(ddir.join(addr.to_string()), dir)
    }

    pub fn mdev_type(
        &self,
        parent: &PciAddress,
        id: &str,
        name: &str,
        description: &str,
        available: u32,
        api: &str,
    ) -> io::Result<()> {
        let dir = self
            .dirs
            .get(parent)
            .ok_or_else(|| io::Error::other("unknown parent"))?
            .clone();
        let t = dir.join("mdev_supported_types").join(id);
        self.file(t.join("name"), &format!("{name}\n"))?;
        self.file(t.join("description"), &format!("{description}\n"))?;
        self.file(t.join("available_instances"), &format!("{available}\n"))?;
        self.file(t.join("device_api"), &format!("{api}\n"))?;
        self.file(t.join("create"), "")?;
        fs::create_dir_all(self.root.join(t.join("devices")))?;
        self.link(format!("sys/class/mdev_bus/{parent}"), &dir)
    }

    /// An active mdev instance of `type_id` under `parent`, in IOMMU group `group`.
    pub fn mdev_instance(
        &self,
        parent: &PciAddress,
        type_id: &str,
        uuid: &str,
        group: u32,
    ) -> io::Result<()> {
        let pdir = self
            .dirs
            .get(parent)
            .ok_or_else(|| io::Error::other("unknown parent"))?
            .clone();
        self.instance_under(&pdir, type_id, uuid, group)
    }

    /// A virtual mdev parent (the kernel's sample drivers: `sys/devices/virtual/<class>/<name>`
    /// linked from `sys/class/mdev_bus/<name>`) with its types
    /// `(id, name, description or None, available, device_api)`.
    pub fn virtual_mdev_parent(
        &self,
        class: &str,
        name: &str,
        types: &[(&str, &str, Option<&str>, u32, &str)],
    ) -> io::Result<()> {
        let dir = PathBuf::from(format!("sys/devices/virtual/{class}/{name}"));
        self.file(dir.join("uevent"), &format!("MAJOR=0\nMINOR=0\nDEVNAME={name}\n"))?;
        for (id, tname, desc, avail, api) in types {
            let t = dir.join("mdev_supported_types").join(id);
            self.file(t.join("name"), &format!("{tname}\n"))?;
            if let Some(d) = desc {
                self.file(t.join("description"), &format!("{d}\n"))?;
            }
            self.file(t.join("available_instances"), &format!("{avail}\n"))?;
            self.file(t.join("device_api"), &format!("{api}\n"))?;
            self.file(t.join("create"), "")?;
            fs::create_dir_all(self.root.join(t.join("devices")))?;
        }
        self.link(format!("sys/class/mdev_bus/{name}"), &dir)
    }

    /// An active instance under a virtual parent made by [`Self::virtual_mdev_parent`].
    pub fn virtual_mdev_instance(
        &self,
        class: &str,
        name: &str,
        type_id: &str,
        uuid: &str,
        group: u32,
    ) -> io::Result<()> {
        let pdir = PathBuf::from(format!("sys/devices/virtual/{class}/{name}"));
        self.instance_under(&pdir, type_id, uuid, group)
    }

    fn instance_under(&self, pdir: &Path, type_id: &str, uuid: &str, group: u32) -> io::Result<()> {
        let dir = pdir.join(uuid);
        let tdir = pdir.join("mdev_supported_types").join(type_id);
        self.file(dir.join("remove"), "")?;
        self.link(dir.join("mdev_type"), &tdir)?;
        self.link(tdir.join("devices").join(uuid), &dir)?;
        self.link(format!("sys/bus/mdev/devices/{uuid}"), &dir)?;
        let gdir = PathBuf::from(format!("sys/kernel/iommu_groups/{group}"));
        self.link(dir.join("iommu_group"), &gdir)?;
        self.link(gdir.join("devices").join(uuid), &dir)?;
        let ddir = PathBuf::from("sys/bus/mdev/drivers/vfio_mdev");
        fs::create_dir_all(self.root.join(&ddir))?;
        self.link(dir.join("driver"), &ddir)?;
        self.file(format!("dev/vfio/{group}"), "")
    }

    /// A process (`proc/<pid>/comm`) holding `target` open as fd `fd` (`proc/<pid>/fd/<fd>`
    /// is a symlink whose text is the path the process opened, e.g. `/dev/vfio/12`).
    pub fn process_fd(&self, pid: u32, comm: &str, fd: u32, target: &str) -> io::Result<()> {
        self.file(format!("proc/{pid}/comm"), &format!("{comm}\n"))?;
        let l = self.root.join(format!("proc/{pid}/fd/{fd}"));
        fs::create_dir_all(l.parent().unwrap_or(&self.root))?;
        let _ = fs::remove_file(&l);
        std::os::unix::fs::symlink(target, l)
    }

    /// NVIDIA vendor-VFIO vGPU profile files on a VF.
    pub fn nvidia_vgpu(&self, vf: &PciAddress, creatable: &[(u32, &str)], current: u32) -> io::Result<()> {
        let dir = self
            .dirs
            .get(vf)
            .ok_or_else(|| io::Error::other("unknown vf"))?
            .join("nvidia");
        let mut t = String::from("ID    : vGPU Name\n");
        for (id, name) in creatable {
            t.push_str(&format!("{id:<5} : {name}\n"));
        }
        self.file(dir.join("creatable_vgpu_types"), &t)?;
        self.file(dir.join("current_vgpu_type"), &format!("{current}\n"))
    }

    /// `/proc/driver/nvidia/gpus/<addr>/information`, as the native driver writes it.
    pub fn nvidia_info(&self, addr: &PciAddress, minor: u32, model: &str, uuid: &str) -> io::Result<()> {
        self.file(
            format!("proc/driver/nvidia/gpus/{addr}/information"),
            &format!(
                "Model: \t\t {model}\nIRQ:   \t\t {}\nGPU UUID: \t {uuid}\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {addr}\nDevice Minor: \t {minor}\nGPU Firmware: \t 550.90.07\nGPU Excluded:\t No\n",
                100 + minor
            ),
        )?;
        self.file(format!("dev/nvidia{minor}"), "")
    }

    /// Kernel release, command line, loaded modules and device nodes for `gpupass check`.
    pub fn kernel(&self, release: &str, cmdline: &str, modules: &[&str]) -> io::Result<()> {
        self.file("proc/sys/kernel/osrelease", &format!("{release}\n"))?;
        self.file("proc/cmdline", &format!("{cmdline}\n"))?;
        for m in modules {
            fs::create_dir_all(self.root.join("sys/module").join(m))?;
        }
        Ok(())
    }

    /// The VFIO cdev of a function (`<dev>/vfio-dev/vfioN/dev` and `dev/vfio/devices/vfioN`),
    /// as kernels with `CONFIG_VFIO_DEVICE_CDEV` show it.
    pub fn vfio_cdev(&self, addr: &PciAddress, n: u32) -> io::Result<()> {
        let dir = self
            .dirs
            .get(addr)
            .ok_or_else(|| io::Error::other("unknown device"))?
            .join("vfio-dev")
            .join(format!("vfio{n}"));
        self.file(dir.join("dev"), &format!("511:{n}\n"))?;
        self.file(format!("dev/vfio/devices/vfio{n}"), "")
    }

    /// The user-space files of the native NVIDIA driver `version`: versioned libraries with
    /// their soname links in `libdir` (root-relative), binaries in `usr/bin`, and, with
    /// `ld_cache`, an `etc/ld.so.cache` listing the sonames (plus a 32-bit copy of libcuda and
    /// libc, which the reader must skip or ignore).
    pub fn nvidia_driver_files(&self, version: &str, libdir: &str, ld_cache: bool) -> io::Result<()> {
        use crate::inventory::native::ldcache::{Entry, FLAG_ELF_LIBC6, FLAG_X8664_LIB64};
        let libs = [
            "libnvidia-ml",
            "libcuda",
            "libnvidia-ptxjitcompiler",
            "libnvidia-encode",
            "libnvcuvid",
            "libEGL_nvidia",
        ];
        let mut entries = Vec::new();
        for l in libs {
            let real = format!("{libdir}/{l}.so.{version}");
            self.file(&real, &format!("fake {l} {version}\n"))?;
            let soname = format!("{libdir}/{l}.so.1");
            let p = self.root.join(&soname);
            let _ = fs::remove_file(&p);
            std::os::unix::fs::symlink(format!("{l}.so.{version}"), p)?;
            // The development link, which must not be picked up.
            let dev = self.root.join(format!("{libdir}/{l}.so"));
            let _ = fs::remove_file(&dev);
            std::os::unix::fs::symlink(format!("{l}.so.1"), dev)?;
            entries.push(Entry {
                flags: FLAG_ELF_LIBC6 | FLAG_X8664_LIB64,
                key: format!("{l}.so.1"),
                value: format!("/{soname}"),
            });
        }
        self.file(format!("{libdir}/libc.so.6"), "fake libc\n")?;
        entries.push(Entry {
            flags: FLAG_ELF_LIBC6 | FLAG_X8664_LIB64,
            key: "libc.so.6".into(),
            value: format!("/{libdir}/libc.so.6"),
        });
        entries.push(Entry {
            flags: FLAG_ELF_LIBC6,
            key: "libcuda.so.1".into(),
            value: "/usr/lib/i386-linux-gnu/libcuda.so.1".into(),
        });
        for b in ["nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"] {
            self.file(
                format!("usr/bin/{b}"),
                &format!("#!/bin/sh\necho fake {b} {version}\n"),
            )?;
        }
        self.file("var/run/nvidia-persistenced/socket", "")?;
        if ld_cache {
            let p = self.root.join("etc/ld.so.cache");
            fs::create_dir_all(self.root.join("etc"))?;
            fs::write(p, crate::inventory::native::ldcache::write(&entries))?;
        }
        Ok(())
    }

    /// A block device under a function: `<dev>/<sub>/<disk>[/<part>]`, with its
    /// `sys/class/block/<name>` and `sys/dev/block/<major:minor>` links. `sub` is the
    /// controller path (`nvme/nvme0`), `disk` the whole disk; `part` a partition of it.
    pub fn block_dev(
        &self,
        owner: &PciAddress,
        sub: &str,
        disk: &str,
        part: Option<&str>,
        majmin: &str,
    ) -> io::Result<()> {
        let dir = self
            .dirs
            .get(owner)
            .ok_or_else(|| io::Error::other("unknown device"))?
            .join(sub)
            .join(disk);
        let (dir, name) = match part {
            Some(p) => (dir.join(p), p),
            None => (dir, disk),
        };
        self.file(dir.join("dev"), &format!("{majmin}\n"))?;
        fs::create_dir_all(self.root.join(&dir).join("slaves"))?;
        self.link(format!("sys/class/block/{name}"), &dir)?;
        self.link(format!("sys/dev/block/{majmin}"), &dir)
    }

    /// A mounted filesystem: a line in `proc/self/mountinfo` and `proc/self/mounts`.
    pub fn mount(&self, majmin: &str, source: &str, mountpoint: &str, fstype: &str) -> io::Result<()> {
        use std::io::Write;
        fs::create_dir_all(self.root.join("proc/self"))?;
        let id = fs::read_to_string(self.root.join("proc/self/mountinfo"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
            + 20;
        let mut mi = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("proc/self/mountinfo"))?;
        writeln!(
            mi,
            "{id} 1 {majmin} / {mountpoint} rw,relatime shared:1 - {fstype} {source} rw"
        )?;
        let mut m = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("proc/self/mounts"))?;
        writeln!(m, "{source} {mountpoint} {fstype} rw,relatime 0 0")
    }

    /// A network interface on a function (`<dev>/net/<name>`, `sys/class/net/<name>`).
    pub fn net_iface(&self, owner: &PciAddress, name: &str, up: bool) -> io::Result<()> {
        let fdir = self
            .dirs
            .get(owner)
            .ok_or_else(|| io::Error::other("unknown device"))?
            .clone();
        let dir = fdir.join("net").join(name);
        self.file(dir.join("operstate"), if up { "up\n" } else { "down\n" })?;
        self.file(dir.join("flags"), if up { "0x1003\n" } else { "0x1002\n" })?;
        self.link(dir.join("device"), &fdir)?;
        self.link(format!("sys/class/net/{name}"), &dir)
    }

    /// A DRM node (`card0`, `renderD128`) on a function.
    pub fn drm_node(&self, owner: &PciAddress, name: &str) -> io::Result<()> {
        let fdir = self
            .dirs
            .get(owner)
            .ok_or_else(|| io::Error::other("unknown device"))?
            .clone();
        let dir = fdir.join("drm").join(name);
        self.file(dir.join("dev"), "226:0\n")?;
        self.link(dir.join("device"), &fdir)?;
        self.link(format!("sys/class/drm/{name}"), &dir)?;
        self.file(format!("dev/dri/{name}"), "")
    }

    /// A framebuffer (`fb0`) on a function.
    pub fn framebuffer(&self, owner: &PciAddress, fb: &str) -> io::Result<()> {
        let fdir = self
            .dirs
            .get(owner)
            .ok_or_else(|| io::Error::other("unknown device"))?
            .clone();
        let dir = fdir.join("graphics").join(fb);
        self.file(dir.join("name"), "drmfb\n")?;
        self.link(dir.join("device"), &fdir)?;
        self.link(format!("sys/class/graphics/{fb}"), &dir)
    }

    /// A virtual console driver: `sys/class/vtconsole/vtconN/{name,bind}`.
    pub fn vtconsole(&self, n: u32, name: &str, bound: bool) -> io::Result<()> {
        let dir = PathBuf::from(format!("sys/devices/virtual/vtconsole/vtcon{n}"));
        self.file(dir.join("name"), &format!("{name}\n"))?;
        self.file(dir.join("bind"), if bound { "1\n" } else { "0\n" })?;
        self.link(format!("sys/class/vtconsole/vtcon{n}"), &dir)
    }

    /// An open file of a process: `proc/<pid>/fd/<fd> -> <target>` (absolute, as the kernel
    /// shows it) and `proc/<pid>/comm`.
    pub fn open_fd(&self, pid: u32, comm: &str, fd: u32, target: &str) -> io::Result<()> {
        self.file(format!("proc/{pid}/comm"), &format!("{comm}\n"))?;
        let l = self.root.join(format!("proc/{pid}/fd/{fd}"));
        fs::create_dir_all(l.parent().unwrap_or(&self.root))?;
        let _ = fs::remove_file(&l);
        std::os::unix::fs::symlink(target, l)
    }

    /// `lib/modules/<release>/modules.alias` lines (`alias <pattern> <module>`).
    pub fn modules_alias(&self, release: &str, lines: &[(&str, &str)]) -> io::Result<()> {
        let mut t = String::from("# Aliases extracted from modules themselves.\n");
        for (p, m) in lines {
            t.push_str(&format!("alias {p} {m}\n"));
        }
        self.file(format!("lib/modules/{release}/modules.alias"), &t)
    }

    /// Mark groups as held by VFIO: `dev/vfio/vfio` and `dev/vfio/N`.
    pub fn vfio_nodes(&self, groups: &[u32]) -> io::Result<()> {
        self.file("dev/vfio/vfio", "")?;
        for g in groups {
            self.file(format!("dev/vfio/{g}"), "")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_links_match_the_kernel() {
        assert_eq!(
            relative(
                Path::new("sys/bus/pci/devices/0000:01:00.0"),
                Path::new("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0")
            ),
            PathBuf::from("../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0")
        );
        assert_eq!(
            relative(
                Path::new("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/iommu_group"),
                Path::new("sys/kernel/iommu_groups/1")
            ),
            PathBuf::from("../../../../kernel/iommu_groups/1")
        );
    }
}
