//! The fake kernel: a fixture tree that behaves like the kernel for the writes gpupass makes.
//!
//! [`FakeHost`] writes into a fixture tree and then applies the *visible effect* the kernel
//! would (re-points the `driver` link, creates `/dev/vfio/N`, makes an mdev instance
//! directory), and records every write. With it (and [`Failpoints`] in front of it),
//! planning, rollback and journal recovery are testable without hardware; the QEMU lab proves
//! the real kernel agrees.

use super::Failpoints;
use crate::host::ops::HostOps;
use crate::host::HostRoot;
use crate::model::is_vfio_driver;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A fixture tree that behaves like the kernel for the writes gpupass makes.
#[derive(Debug)]
pub struct FakeHost {
    root: HostRoot,
    log: Mutex<Vec<(PathBuf, String)>>,
    /// Serializes effects (the kernel holds the device lock).
    lock: Mutex<()>,
    /// Shell command run (in the root) between plan and apply: see [`FakeHost::before_apply`].
    before_apply: Option<String>,
}

impl FakeHost {
    pub fn new(root: HostRoot) -> Self {
        FakeHost {
            root,
            log: Mutex::new(Vec::new()),
            lock: Mutex::new(()),
            before_apply: None,
        }
    }

    /// Run `cmd` with `sh -c` in the root after a bind/unbind plan is made and before it is
    /// applied, so a test can change the host in that window (a device hot-plugged into the
    /// group). From `GPUPASS_FAKE_BEFORE_APPLY` in [`super::host_ops`].
    pub fn before_apply(mut self, cmd: Option<String>) -> Self {
        self.before_apply = cmd;
        self
    }

    /// Fail the N-th write (1-based) with EIO: this fake kernel behind [`Failpoints`].
    pub fn fail_at(self, n: usize) -> Failpoints<FakeHost> {
        Failpoints::new(self).fail_at(n)
    }

    fn rel<'a>(&self, path: &'a Path) -> Option<&'a Path> {
        path.strip_prefix(self.root.root()).ok()
    }

    fn dev_dir(&self, addr: &str) -> PathBuf {
        self.root.sys_bus_pci_devices().join(addr)
    }

    fn current_driver(&self, addr: &str) -> Option<String> {
        crate::host::link_name(&self.dev_dir(addr).join("driver"))
            .ok()
            .flatten()
    }

    fn group_of(&self, addr: &str) -> Option<String> {
        crate::host::link_name(&self.dev_dir(addr).join("iommu_group"))
            .ok()
            .flatten()
    }

    fn link(&self, link: &Path, target: &Path) -> io::Result<()> {
        let _ = fs::remove_file(link);
        std::os::unix::fs::symlink(target, link)
    }

    /// Whether a marker file in the device directory lists `driver` (one name per line).
    fn marked(&self, addr: &str, marker: &str, driver: &str) -> bool {
        crate::host::read_attr(&self.dev_dir(addr).join(marker))
            .map(|t| t.lines().any(|l| l.trim() == driver || l.trim() == "*"))
            .unwrap_or(false)
    }

    /// Bind `addr` to `driver`: both links, and the VFIO group node.
    ///
    /// Like the kernel, a driver's probe can refuse a device: vfio-pci refuses bridges
    /// (non-endpoint headers), and a fixture can make any driver refuse by listing it in
    /// `<dev>/.fake_refuse_bind` (as vfio-pci refuses NVIDIA vGPU VFs with EINVAL).
    fn do_bind(&self, addr: &str, driver: &str) -> io::Result<()> {
        let ddir = self.root.sys_bus_pci_drivers().join(driver);
        if !ddir.is_dir() {
            return Err(io::Error::from_raw_os_error(19)); // ENODEV: no such driver loaded
        }
        let dev = self.dev_dir(addr);
        if self.marked(addr, ".fake_refuse_bind", driver)
            || (is_vfio_driver(driver) && dev.join("pci_bus").is_dir())
        {
            return Err(io::Error::from_raw_os_error(22)); // EINVAL from the driver's probe
        }
        let real = fs::canonicalize(&dev)?;
        let rel_dev = real
            .strip_prefix(fs::canonicalize(self.root.root())?)
            .map_err(io::Error::other)?;
        let depth = rel_dev.components().count() - 1;
        let up = "../".repeat(depth);
        self.link(
            &dev.join("driver"),
            Path::new(&format!("{up}bus/pci/drivers/{driver}")),
        )?;
        let under_sys = rel_dev.strip_prefix("sys").unwrap_or(rel_dev);
        self.link(&ddir.join(addr), &Path::new("../../../..").join(under_sys))?;
        if is_vfio_driver(driver) {
            if let Some(g) = self.group_of(addr) {
                fs::create_dir_all(self.root.dev_vfio())?;
                fs::write(self.root.dev_vfio().join(&g), "")?;
                if !self.root.dev_vfio().join("vfio").exists() {
                    fs::write(self.root.dev_vfio().join("vfio"), "")?;
                }
            }
        }
        Ok(())
    }

    /// Unbind; `<dev>/.fake_refuse_unbind` listing the driver makes the write fail with EBUSY
    /// (a driver whose remove path cannot let go, or a sysfs write interrupted by a signal).
    fn do_unbind(&self, addr: &str, driver: &str) -> io::Result<()> {
        if self.current_driver(addr).as_deref() != Some(driver) {
            return Err(io::Error::from_raw_os_error(19)); // ENODEV
        }
        if self.marked(addr, ".fake_refuse_unbind", driver) {
            return Err(io::Error::from_raw_os_error(16)); // EBUSY
        }
        let _ = fs::remove_file(self.dev_dir(addr).join("driver"));
        let _ = fs::remove_file(self.root.sys_bus_pci_drivers().join(driver).join(addr));
        if is_vfio_driver(driver) {
            if let Some(g) = self.group_of(addr) {
                // The group node goes when no member is on a VFIO driver any more.
                let members = crate::host::dir_names(&self.root.iommu_groups().join(&g).join("devices"))?;
                let still = members.iter().any(|m| {
                    m != addr
                        && self
                            .current_driver(m)
                            .map(|d| is_vfio_driver(&d))
                            .unwrap_or(false)
                });
                if !still {
                    let _ = fs::remove_file(self.root.dev_vfio().join(&g));
                }
            }
        }
        Ok(())
    }

    /// What `drivers_probe` binds: the override if set, else the device's native driver,
    /// remembered in `<dev>/.fake_native_driver` (written by the fixture or on first unbind).
    fn probe(&self, addr: &str) -> io::Result<()> {
        if self.current_driver(addr).is_some() {
            return Ok(());
        }
        let dev = self.dev_dir(addr);
        let ov = crate::host::read_attr(&dev.join("driver_override")).unwrap_or_default();
        let want = if !ov.is_empty() && ov != "(null)" {
            Some(ov)
        } else {
            crate::host::read_attr(&dev.join(".fake_native_driver"))
                .ok()
                .filter(|s| !s.is_empty())
        };
        if let Some(d) = want {
            // Like the kernel, a probe that finds no loaded driver succeeds and binds nothing.
            let _ = self.do_bind(addr, &d);
        }
        Ok(())
    }

    fn effect(&self, rel: &Path, value: &str) -> io::Result<()> {
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let p: Vec<&str> = parts.iter().map(String::as_str).collect();
        let v = value.trim();
        match p.as_slice() {
            ["sys", "bus", "pci", "drivers_probe"] => self.probe(v),
            ["sys", "bus", "pci", "drivers", drv, "unbind"] => self.do_unbind(v, drv),
            ["sys", "bus", "pci", "drivers", drv, "bind"] => {
                if self.current_driver(v).is_some() {
                    return Err(io::Error::from_raw_os_error(16)); // EBUSY
                }
                self.do_bind(v, drv)
            }
            ["sys", "bus", "pci", "devices", addr, "driver", "unbind"] => {
                let d = self
                    .current_driver(addr)
                    .ok_or_else(|| io::Error::from_raw_os_error(2))?;
                self.do_unbind(addr, &d)
            }
            ["sys", "bus", "pci", "devices", addr, "driver_override"] => {
                let f = self.dev_dir(addr).join("driver_override");
                // The kernel keeps the old value on an empty write; a newline clears it.
                if value.is_empty() {
                    return Ok(());
                }
                fs::write(
                    f,
                    if v.is_empty() {
                        "(null)\n".to_string()
                    } else {
                        format!("{v}\n")
                    },
                )
            }
            [.., "mdev_supported_types", ty, "create"] => self.mdev_create(rel, ty, v),
            ["sys", "bus", "pci", "devices", addr, "nvidia", "current_vgpu_type"] => self.vgpu_set(addr, v),
            ["sys", "bus", "mdev", "devices", uuid, "remove"] => self.mdev_remove(uuid),
            ["sys", "fs", "cgroup", "devices", .., file]
                if *file == "devices.allow" || *file == "devices.deny" =>
            {
                self.devices_rule(rel, *file == "devices.allow", v)
            }
            _ => {
                let full = self.root.root().join(rel);
                if !full.exists() {
                    return Err(io::Error::from_raw_os_error(2));
                }
                fs::write(full, value)
            }
        }
    }

    /// The cgroup v1 devices controller: a rule written to `devices.allow` shows in the cgroup's
    /// `devices.list`, the same rule written to `devices.deny` takes it out again.
    fn devices_rule(&self, rel: &Path, allow: bool, rule: &str) -> io::Result<()> {
        let full = self.root.root().join(rel);
        if !full.exists() {
            return Err(io::Error::from_raw_os_error(2));
        }
        let list = full.with_file_name("devices.list");
        let text = match fs::read_to_string(&list) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let mut rules: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        if allow {
            if !rules.contains(&rule) {
                rules.push(rule);
            }
        } else {
            rules.retain(|r| *r != rule);
        }
        fs::write(list, rules.iter().map(|r| format!("{r}\n")).collect::<String>())
    }

    fn mdev_create(&self, rel: &Path, ty: &str, uuid: &str) -> io::Result<()> {
        if !crate::model::is_uuid(uuid) {
            return Err(io::Error::from_raw_os_error(22)); // EINVAL
        }
        if self.root.mdev_devices().join(uuid).exists() {
            return Err(io::Error::from_raw_os_error(17)); // EEXIST
        }
        let tdir = self.root.root().join(rel.parent().unwrap_or(Path::new("")));
        let avail: u32 = crate::host::read_attr(&tdir.join("available_instances"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if avail == 0 {
            return Err(io::Error::from_raw_os_error(87)); // EUSERS, as mdev_device_create
        }
        fs::write(tdir.join("available_instances"), format!("{}\n", avail - 1))?;
        // <parent>/mdev_supported_types/<type>/create -> <parent>/<uuid>
        let parent_dir = tdir
            .parent()
            .and_then(|p| p.parent())
            .ok_or_else(|| io::Error::other("bad path"))?;
        let inst = parent_dir.join(uuid);
        fs::create_dir_all(&inst)?;
        fs::write(inst.join("remove"), "")?;
        self.link(
            &inst.join("mdev_type"),
            Path::new(&format!("../mdev_supported_types/{ty}")),
        )?;
        fs::create_dir_all(tdir.join("devices"))?;
        self.link(
            &tdir.join("devices").join(uuid),
            Path::new(&format!("../../../{uuid}")),
        )?;
        // A fresh IOMMU group (the kernel allocates the next free number).
        let groups = self.root.iommu_groups();
        fs::create_dir_all(&groups)?;
        let next = crate::host::dir_names(&groups)?
            .iter()
            .filter_map(|n| n.parse::<u32>().ok())
            .max()
            .map_or(0, |m| m + 1);
        let g = groups.join(next.to_string());
        fs::create_dir_all(g.join("devices"))?;
        let canon_root = fs::canonicalize(self.root.root())?;
        let rel_inst = fs::canonicalize(&inst)?
            .strip_prefix(&canon_root)
            .map_err(io::Error::other)?
            .to_path_buf();
        let depth = rel_inst.components().count() - 1;
        self.link(
            &inst.join("iommu_group"),
            Path::new(&format!("{}kernel/iommu_groups/{next}", "../".repeat(depth))),
        )?;
        let under_sys = rel_inst.strip_prefix("sys").unwrap_or(&rel_inst).to_path_buf();
        self.link(
            &g.join("devices").join(uuid),
            &Path::new("../../../..").join(&under_sys),
        )?;
        let bus = self.root.mdev_devices();
        fs::create_dir_all(&bus)?;
        self.link(&bus.join(uuid), &Path::new("../../..").join(&under_sys))?;
        fs::create_dir_all(self.root.dev_vfio())?;
        fs::write(self.root.dev_vfio().join(next.to_string()), "")
    }

    /// NVIDIA vendor-VFIO vGPU: a type id written to `<VF>/nvidia/current_vgpu_type` must be
    /// in the VF's `creatable_vgpu_types` (else EINVAL) and the VF must have no type yet (else
    /// EBUSY); once set, the VF's creatable list is empty (header only), as the real driver
    /// shows a VF whose capacity is taken. `0` clears the type and restores the list (kept in
    /// `nvidia/.fake_creatable_vgpu_types` meanwhile).
    fn vgpu_set(&self, addr: &str, v: &str) -> io::Result<()> {
        let nd = self.dev_dir(addr).join("nvidia");
        let cur_f = nd.join("current_vgpu_type");
        let list_f = nd.join("creatable_vgpu_types");
        let saved_f = nd.join(".fake_creatable_vgpu_types");
        if !cur_f.exists() {
            return Err(io::Error::from_raw_os_error(2));
        }
        let cur = crate::host::read_attr(&cur_f)?.trim().to_string();
        let set = !cur.is_empty() && cur != "0";
        let id: u64 = v.parse().map_err(|_| io::Error::from_raw_os_error(22))?;
        if id == 0 {
            if set {
                if let Ok(saved) = fs::read_to_string(&saved_f) {
                    fs::write(&list_f, saved)?;
                    let _ = fs::remove_file(&saved_f);
                }
            }
            return fs::write(&cur_f, "0\n");
        }
        if set {
            return Err(io::Error::from_raw_os_error(16)); // EBUSY
        }
        let list = fs::read_to_string(&list_f).unwrap_or_default();
        let offered = crate::inventory::parse_creatable_vgpu_types(&list)
            .iter()
            .any(|t| t.id == id.to_string());
        if !offered {
            return Err(io::Error::from_raw_os_error(22)); // EINVAL
        }
        fs::write(&saved_f, &list)?;
        let header = list.lines().next().unwrap_or("ID    : vGPU Name");
        fs::write(&list_f, format!("{header}\n"))?;
        fs::write(&cur_f, format!("{id}\n"))
    }

    fn mdev_remove(&self, uuid: &str) -> io::Result<()> {
        let link = self.root.mdev_devices().join(uuid);
        let inst = fs::canonicalize(&link).map_err(|_| io::Error::from_raw_os_error(19))?;
        let ty = fs::canonicalize(inst.join("mdev_type"))?;
        let avail: u32 = crate::host::read_attr(&ty.join("available_instances"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        fs::write(ty.join("available_instances"), format!("{}\n", avail + 1))?;
        let _ = fs::remove_file(ty.join("devices").join(uuid));
        if let Some(g) = crate::host::link_name(&inst.join("iommu_group"))? {
            let _ = fs::remove_dir_all(self.root.iommu_groups().join(&g));
            let _ = fs::remove_file(self.root.dev_vfio().join(&g));
        }
        fs::remove_dir_all(&inst)?;
        fs::remove_file(&link)
    }
}

impl HostOps for FakeHost {
    fn root(&self) -> &HostRoot {
        &self.root
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let n = self.log.lock().unwrap_or_else(|e| e.into_inner()).len() + 1;
        tracing::debug!(path = %path.display(), value = %value.escape_debug(), n, "sysfs write (fake kernel)");
        let rel = self
            .rel(path)
            .ok_or_else(|| io::Error::other("write outside the fake root"))?
            .to_path_buf();
        // Remember the native driver the first time a device leaves it.
        if let ["sys", "bus", "pci", "devices", addr, "driver_override"] = rel
            .components()
            .map(|c| c.as_os_str().to_str().unwrap_or(""))
            .collect::<Vec<_>>()
            .as_slice()
        {
            let native = self.dev_dir(addr).join(".fake_native_driver");
            if !native.exists() {
                if let Some(d) = self.current_driver(addr).filter(|d| !is_vfio_driver(d)) {
                    fs::write(native, d)?;
                }
            }
        }
        self.effect(&rel, value)?;
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((path.to_path_buf(), value.to_string()));
        Ok(())
    }

    fn load_module(&self, name: &str) -> io::Result<()> {
        let m = name.replace('-', "_");
        fs::create_dir_all(self.root.sys_module(&m))?;
        // vfio_pci registers the PCI driver "vfio-pci"; variants register their own name.
        let drv = if m == "vfio_pci" {
            "vfio-pci".to_string()
        } else {
            m.clone()
        };
        fs::create_dir_all(self.root.sys_bus_pci_drivers().join(drv))?;
        if m.starts_with("vfio") {
            fs::create_dir_all(self.root.dev_vfio())?;
            fs::write(self.root.dev_vfio().join("vfio"), "")?;
        }
        Ok(())
    }

    fn writes(&self) -> Vec<(PathBuf, String)> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn before_apply(&self) {
        if let Some(cmd) = &self.before_apply {
            let _ = std::process::Command::new("sh")
                .arg("-c")
                .arg(cmd)
                .current_dir(self.root.root())
                .status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PciAddress;
    use crate::testkit::hostgen::{DevSpec, HostBuilder};

    fn host() -> (tempfile::TempDir, FakeHost) {
        let t = tempfile::tempdir().unwrap();
        let mut h = HostBuilder::new(t.path()).unwrap();
        h.add(
            &DevSpec::new("00:05.0", 0x1234, 0x1111, 0x030000)
                .group(4)
                .driver("bochs-drm"),
        )
        .unwrap();
        h.add(
            &DevSpec::new("00:05.1", 0x8086, 0x293e, 0x040300)
                .group(4)
                .driver("snd_hda_intel"),
        )
        .unwrap();
        let f = FakeHost::new(HostRoot::new(t.path()));
        (t, f)
    }

    #[test]
    fn override_unbind_probe_binds_vfio_and_creates_node() {
        let (_t, f) = host();
        let r = f.root().clone();
        f.load_module("vfio-pci").unwrap();
        let a = "0000:00:05.0";
        f.write(
            &r.sys_bus_pci_devices().join(a).join("driver_override"),
            "vfio-pci",
        )
        .unwrap();
        f.write(&r.sys_bus_pci_drivers().join("bochs-drm/unbind"), a)
            .unwrap();
        assert_eq!(f.current_driver(a), None);
        f.write(&r.sys_bus_pci().join("drivers_probe"), a).unwrap();
        assert_eq!(f.current_driver(a).as_deref(), Some("vfio-pci"));
        assert!(r.dev_vfio().join("4").exists());
        let back = fs::canonicalize(r.sys_bus_pci_drivers().join("vfio-pci").join(a)).unwrap();
        assert_eq!(back, fs::canonicalize(r.sys_bus_pci_devices().join(a)).unwrap());
        // Back: clear the override with a newline, unbind, reprobe -> native driver.
        f.write(&r.sys_bus_pci_devices().join(a).join("driver_override"), "\n")
            .unwrap();
        f.write(&r.sys_bus_pci_drivers().join("vfio-pci/unbind"), a)
            .unwrap();
        assert!(!r.dev_vfio().join("4").exists());
        f.write(&r.sys_bus_pci().join("drivers_probe"), a).unwrap();
        assert_eq!(f.current_driver(a).as_deref(), Some("bochs-drm"));
        assert_eq!(f.writes().len(), 6);
    }

    #[test]
    fn probe_without_loaded_driver_succeeds_and_binds_nothing() {
        let (_t, f) = host();
        let r = f.root().clone();
        let a = "0000:00:05.1";
        f.write(
            &r.sys_bus_pci_devices().join(a).join("driver_override"),
            "vfio-pci",
        )
        .unwrap();
        f.write(&r.sys_bus_pci_drivers().join("snd_hda_intel/unbind"), a)
            .unwrap();
        f.write(&r.sys_bus_pci().join("drivers_probe"), a).unwrap();
        assert_eq!(f.current_driver(a), None);
    }

    #[test]
    fn vgpu_type_set_and_clear() {
        let t = tempfile::tempdir().unwrap();
        let mut h = HostBuilder::new(t.path()).unwrap();
        h.add(
            &DevSpec::new("41:00.0", 0x10de, 0x2335, 0x030200)
                .group(1)
                .sriov(4),
        )
        .unwrap();
        h.add(
            &DevSpec::new("41:00.4", 0x10de, 0x2335, 0x030200)
                .vf_of("41:00.0")
                .group(2),
        )
        .unwrap();
        let vf: PciAddress = "41:00.4".parse().unwrap();
        h.nvidia_vgpu(
            &vf,
            &[(1043, "NVIDIA H200-1-18C"), (1044, "NVIDIA H200-2-35C")],
            0,
        )
        .unwrap();
        let f = FakeHost::new(HostRoot::new(t.path()));
        let nd = f.root().pci_device(&vf).join("nvidia");
        let cur = nd.join("current_vgpu_type");
        let types = |f: &FakeHost| {
            let _ = f;
            crate::inventory::parse_creatable_vgpu_types(
                &fs::read_to_string(nd.join("creatable_vgpu_types")).unwrap(),
            )
        };
        assert_eq!(f.write(&cur, "999").unwrap_err().raw_os_error(), Some(22));
        f.write(&cur, "1044").unwrap();
        assert_eq!(fs::read_to_string(&cur).unwrap(), "1044\n");
        assert!(types(&f).is_empty());
        assert_eq!(f.write(&cur, "1043").unwrap_err().raw_os_error(), Some(16));
        f.write(&cur, "0").unwrap();
        assert_eq!(fs::read_to_string(&cur).unwrap(), "0\n");
        assert_eq!(types(&f).len(), 2);
    }

    #[test]
    fn cgroup_v1_device_rules_show_in_devices_list() {
        let (t, f) = host();
        let cg = f.root().cgroup_root().join("devices/ctr");
        fs::create_dir_all(&cg).unwrap();
        for n in ["devices.allow", "devices.deny"] {
            fs::write(cg.join(n), "").unwrap();
        }
        fs::write(cg.join("devices.list"), "c 136:* rwm\n").unwrap();
        let list = || fs::read_to_string(cg.join("devices.list")).unwrap();
        f.write(&cg.join("devices.allow"), "c 10:196 rwm").unwrap();
        f.write(&cg.join("devices.allow"), "c 10:196 rwm").unwrap();
        assert_eq!(list(), "c 136:* rwm\nc 10:196 rwm\n");
        f.write(&cg.join("devices.deny"), "c 10:196 rwm").unwrap();
        assert_eq!(list(), "c 136:* rwm\n");
        // No controller there: ENOENT, as on a host without the v1 devices hierarchy.
        let other = t.path().join("sys/fs/cgroup/devices/other/devices.allow");
        assert_eq!(f.write(&other, "c 1:3 rwm").unwrap_err().raw_os_error(), Some(2));
    }

    #[test]
    fn injected_failure() {
        let (_t, f) = host();
        let f = f.fail_at(2);
        let r = f.root().clone();
        let a = "0000:00:05.0";
        f.write(
            &r.sys_bus_pci_devices().join(a).join("driver_override"),
            "vfio-pci",
        )
        .unwrap();
        assert!(f
            .write(&r.sys_bus_pci_drivers().join("bochs-drm/unbind"), a)
            .is_err());
        assert_eq!(f.inner().current_driver(a).as_deref(), Some("bochs-drm"));
    }
}
