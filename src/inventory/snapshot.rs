//! `gpupass snapshot OUT`: copy the part of sysfs/procfs/devfs gpupass reads into a tree that
//! `--root OUT` replays, symlinks preserved verbatim (they are relative in sysfs, so they
//! stay valid inside the copy). Users attach it to bug reports; the tests replay captured
//! trees from real kernels.
//!
//! Nothing is followed out of the tree: directories are walked with `symlink_metadata`, every
//! read is bounded, and device nodes become empty regular files (only their existence matters).

use crate::host::{dir_names, HostRoot};
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Attributes of a PCI function directory that are copied.
const DEVICE_ATTRS: &[&str] = &[
    "vendor",
    "device",
    "subsystem_vendor",
    "subsystem_device",
    "class",
    "revision",
    "numa_node",
    "local_cpulist",
    "driver_override",
    "resource",
    "boot_vga",
    "reset_method",
    "modalias",
    "sriov_totalvfs",
    "sriov_numvfs",
    "enable",
    "irq",
    "current_link_speed",
    "current_link_width",
    "max_link_speed",
    "max_link_width",
    "config",
    "uevent",
];
/// Write-only or presence-only attributes: copied as empty files.
const PRESENCE_ATTRS: &[&str] = &["reset", "remove", "rescan"];
const LINK_NAMES: &[&str] = &["driver", "iommu_group", "physfn", "mdev_type"];
const FILE_LIMIT: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub(crate) enum SnapshotError {
    #[error("snapshot target {} exists and is not empty; choose a new directory", .path.display())]
    NotEmpty { path: PathBuf },
    #[error("cannot write snapshot at {}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot list PCI devices at {}; is --root (or GPUPASS_ROOT) a Linux host's root with sysfs?", .path.display())]
    NoPciBus {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

use crate::host::join_link as resolve;

struct Copier<'a> {
    src: &'a HostRoot,
    out: PathBuf,
    files: usize,
}

impl Copier<'_> {
    fn werr(&self, p: &Path, e: io::Error) -> SnapshotError {
        SnapshotError::Write {
            path: p.to_path_buf(),
            source: e,
        }
    }

    fn ensure_dir(&self, rel: &Path) -> Result<(), SnapshotError> {
        let p = self.out.join(rel);
        fs::create_dir_all(&p).map_err(|e| self.werr(&p, e))
    }

    /// Copy a regular file (bounded); unreadable files are skipped (sysfs has many).
    fn copy_file(&mut self, rel: &Path) -> Result<(), SnapshotError> {
        let src = self.src.root().join(rel);
        let Ok(meta) = fs::symlink_metadata(&src) else {
            return Ok(());
        };
        if !meta.is_file() {
            return Ok(());
        }
        let mut buf = Vec::new();
        if let Ok(f) = fs::File::open(&src) {
            if f.take(FILE_LIMIT).read_to_end(&mut buf).is_err() {
                return Ok(());
            }
        } else {
            return Ok(());
        }
        self.write(rel, &buf)
    }

    fn write(&mut self, rel: &Path, data: &[u8]) -> Result<(), SnapshotError> {
        let p = self.out.join(rel);
        if let Some(d) = p.parent() {
            fs::create_dir_all(d).map_err(|e| self.werr(d, e))?;
        }
        fs::write(&p, data).map_err(|e| self.werr(&p, e))?;
        self.files += 1;
        Ok(())
    }

    /// Recreate a symlink with the same (relative) text. Absolute targets are kept out.
    fn copy_link(&mut self, rel: &Path) -> Result<Option<PathBuf>, SnapshotError> {
        let src = self.src.root().join(rel);
        let Ok(target) = fs::read_link(&src) else {
            return Ok(None);
        };
        if target.is_absolute() {
            return Ok(None);
        }
        let p = self.out.join(rel);
        if let Some(d) = p.parent() {
            fs::create_dir_all(d).map_err(|e| self.werr(d, e))?;
        }
        let _ = fs::remove_file(&p);
        std::os::unix::fs::symlink(&target, &p).map_err(|e| self.werr(&p, e))?;
        self.files += 1;
        Ok(Some(target))
    }

    fn copy_if_exists_empty(&mut self, rel: &Path) -> Result<(), SnapshotError> {
        if fs::symlink_metadata(self.src.root().join(rel)).is_ok() {
            self.write(rel, b"")?;
        }
        Ok(())
    }

    /// Every regular file directly in a directory (bounded), plus subdirectories to `depth`.
    fn copy_tree(&mut self, rel: &Path, depth: u32) -> Result<(), SnapshotError> {
        let src = self.src.root().join(rel);
        for name in dir_names(&src).unwrap_or_default() {
            let r = rel.join(&name);
            let Ok(m) = fs::symlink_metadata(self.src.root().join(&r)) else {
                continue;
            };
            if m.file_type().is_symlink() {
                self.copy_link(&r)?;
            } else if m.is_dir() {
                self.ensure_dir(&r)?;
                if depth > 0 {
                    self.copy_tree(&r, depth - 1)?;
                }
            } else if m.is_file() {
                self.copy_file(&r)?;
            }
        }
        Ok(())
    }

    fn device(&mut self, dir: &Path) -> Result<(), SnapshotError> {
        self.ensure_dir(dir)?;
        for a in DEVICE_ATTRS {
            self.copy_file(&dir.join(a))?;
        }
        for a in PRESENCE_ATTRS {
            self.copy_if_exists_empty(&dir.join(a))?;
        }
        let names = dir_names(&self.src.root().join(dir)).unwrap_or_default();
        for name in &names {
            let r = dir.join(name);
            if LINK_NAMES.contains(&name.as_str()) || name.starts_with("virtfn") {
                if let Some(t) = self.copy_link(&r)? {
                    // The driver directory and its back link, for a link that points at a
                    // driver (a broken tree's `driver -> driver` loop is copied as it is).
                    if name == "driver" && t.components().any(|c| c.as_os_str() == "drivers") {
                        let ddir = resolve(dir, &t);
                        self.ensure_dir(&ddir)?;
                        if let Some(addr) = dir.file_name() {
                            let back = ddir.join(addr);
                            self.copy_link(&back)?;
                        }
                    }
                }
            }
        }
        for sub in ["mdev_supported_types", "nvidia", "vfio-dev"] {
            let r = dir.join(sub);
            if self.src.root().join(&r).is_dir() {
                self.ensure_dir(&r)?;
                self.copy_tree(&r, 2)?;
            }
        }
        if self.src.root().join(dir).join("pci_bus").is_dir() {
            self.ensure_dir(&dir.join("pci_bus"))?;
        }
        // Active mdev instances live under their parent as <uuid>/.
        for name in names.iter().filter(|n| is_uuid(n)) {
            let r = dir.join(name);
            self.ensure_dir(&r)?;
            for l in ["mdev_type", "iommu_group", "driver"] {
                self.copy_link(&r.join(l))?;
            }
            self.copy_if_exists_empty(&r.join("remove"))?;
        }
        Ok(())
    }
}

use crate::model::is_uuid;

/// Summary of what was written.
pub(crate) struct SnapshotReport {
    pub devices: usize,
    pub files: usize,
}

pub(crate) fn snapshot(src: &HostRoot, out: &Path) -> Result<SnapshotReport, SnapshotError> {
    if out.exists() && fs::read_dir(out).map(|mut d| d.next().is_some()).unwrap_or(true) {
        return Err(SnapshotError::NotEmpty {
            path: out.to_path_buf(),
        });
    }
    let mut c = Copier {
        src,
        out: out.to_path_buf(),
        files: 0,
    };
    // Every path below is one `HostRoot` builds, taken relative to the root: the copy has the
    // same layout under `out`.
    let rel = |p: PathBuf| p.strip_prefix(src.root()).map(Path::to_path_buf).unwrap_or(p);
    let bus_rel = rel(src.sys_bus_pci_devices());
    let bus = src.root().join(&bus_rel);
    let names = fs::read_dir(&bus)
        .map_err(|e| SnapshotError::NoPciBus {
            path: bus.clone(),
            source: e,
        })?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect::<Vec<_>>();
    c.ensure_dir(&bus_rel)?;
    c.ensure_dir(&rel(src.sys_bus_pci_drivers()))?;
    let sys_devices = rel(src.sys_devices());
    let mut devices = 0;
    for name in &names {
        let link = bus_rel.join(name);
        if let Some(t) = c.copy_link(&link)? {
            let dir = resolve(&bus_rel, &t);
            if dir.starts_with(&sys_devices) {
                c.device(&dir)?;
                devices += 1;
            }
        }
    }
    // mdev parents that are not PCI functions (the kernel's sample drivers, some vendors'
    // virtual parents): copy their types and instances too.
    let mdev_bus = &rel(src.mdev_bus_class());
    for name in dir_names(&src.root().join(mdev_bus)).unwrap_or_default() {
        let link = mdev_bus.join(&name);
        if let Some(t) = c.copy_link(&link)? {
            let dir = resolve(mdev_bus, &t);
            if dir.starts_with(&sys_devices) && !c.out.join(&dir).join("mdev_supported_types").exists() {
                c.device(&dir)?;
            }
        }
    }
    for r in [src.iommu_groups(), src.mdev_devices(), src.mdev_bus_class()].map(rel) {
        if src.root().join(&r).is_dir() {
            c.ensure_dir(&r)?;
            c.copy_tree(&r, 3)?;
        }
    }
    // NUMA nodes: CPUs and hugepage pools (guest placement, --hugepages).
    let nodes = &rel(src.sys_numa_nodes());
    for n in dir_names(&src.root().join(nodes)).unwrap_or_default() {
        if !n.starts_with("node") || n[4..].parse::<u32>().is_err() {
            continue;
        }
        let d = nodes.join(&n);
        c.copy_file(&d.join("cpulist"))?;
        for h in dir_names(&src.root().join(d.join("hugepages"))).unwrap_or_default() {
            for f in ["nr_hugepages", "free_hugepages"] {
                c.copy_file(&d.join("hugepages").join(&h).join(f))?;
            }
        }
    }
    // IOMMU units: the links in sys/class/iommu and the registers that give the address width.
    let units = &rel(src.sys_class("iommu"));
    for u in dir_names(&src.root().join(units)).unwrap_or_default() {
        let link = units.join(&u);
        if let Some(target) = c.copy_link(&link)? {
            let dir = resolve(units, &target);
            for f in ["intel-iommu/cap", "amd-iommu/features"] {
                c.copy_file(&dir.join(f))?;
            }
        }
    }
    // Loaded modules: names only, plus the VFIO interrupt knob.
    for m in dir_names(&src.sys_modules()).unwrap_or_default() {
        c.ensure_dir(&rel(src.sys_module(&m)))?;
    }
    c.copy_file(&rel(src
        .sys_module("vfio_iommu_type1")
        .join("parameters/allow_unsafe_interrupts")))?;
    for t in ["DMAR", "IVRS"] {
        c.copy_if_exists_empty(&rel(src.acpi_tables().join(t)))?;
    }
    for f in [src.proc_cmdline(), src.proc_osrelease(), src.proc_interrupts()] {
        c.copy_file(&rel(f))?;
    }
    let nv = &rel(src.nvidia_gpus_proc());
    for g in dir_names(&src.root().join(nv)).unwrap_or_default() {
        c.copy_file(&nv.join(&g).join("information"))?;
    }
    // Device nodes: presence only.
    for d in [src.dev_vfio(), src.dev_vfio_devices(), src.dev_dri()].map(rel) {
        for n in dir_names(&src.root().join(&d)).unwrap_or_default() {
            let r = d.join(&n);
            if !src.root().join(&r).is_dir() {
                c.copy_if_exists_empty(&r)?;
            }
        }
    }
    for n in dir_names(&src.dev()).unwrap_or_default() {
        if n == "kvm" || n == "iommu" || n.starts_with("nvidia") {
            c.copy_if_exists_empty(&rel(src.dev().join(n)))?;
        }
    }
    for d in [src.driverctl_dir(), src.mdevctl_dir()].map(rel) {
        if src.root().join(&d).is_dir() {
            c.copy_tree(&d, 2)?;
        }
    }
    // The kernel's module tables, cut to what gpupass looks up (VFIO variants, availability).
    // The kernel config: `/proc/config.gz` by presence (gpupass does not inflate it), and
    // `/boot/config-<release>` cut to the VFIO/iommufd options the backend facts read.
    c.copy_if_exists_empty(&rel(src.proc_config_gz()))?;
    // The CPU's vendor and address sizes (the 64-bit window check), cut to those lines of the
    // first CPU.
    if let Ok(text) = crate::host::read_bounded(&src.proc_cpuinfo(), 1 << 20) {
        let kept: String = ["vendor_id", "address sizes"]
            .iter()
            .filter_map(|k| text.lines().find(|l| l.starts_with(k)))
            .map(|l| format!("{l}\n"))
            .collect();
        if !kept.is_empty() {
            c.write(&rel(src.proc_cpuinfo()), kept.as_bytes())?;
        }
    }
    if let Ok(release) = crate::host::read_attr(&src.proc_osrelease()) {
        let [boot_config, _] = src.kernel_configs(release.trim());
        let cfg = rel(boot_config);
        if let Ok(text) = crate::host::read_bounded(&src.root().join(&cfg), 8 << 20) {
            let lines: String = text
                .lines()
                .filter(|l| l.contains("CONFIG_VFIO") || l.contains("CONFIG_IOMMUFD"))
                .map(|l| format!("{l}\n"))
                .collect();
            c.write(&cfg, lines.as_bytes())?;
        }
        let mdir = rel(src.modules_dir(release.trim()));
        for (table, keep) in [
            ("modules.alias", &["vfio_pci:"][..]),
            ("modules.dep", &["vfio", "mdev", "kvm"][..]),
            ("modules.builtin", &["vfio", "mdev", "kvm"][..]),
        ] {
            let p = src.root().join(&mdir).join(table);
            if let Ok(text) = crate::host::read_bounded(&p, 64 << 20) {
                let lines: String = text
                    .lines()
                    .filter(|l| keep.iter().any(|k| l.contains(k)))
                    .map(|l| format!("{l}\n"))
                    .collect();
                c.write(&mdir.join(table), lines.as_bytes())?;
            }
        }
    }
    crate::host::keep_empty_dirs(out).map_err(|e| SnapshotError::Write {
        path: out.to_path_buf(),
        source: e,
    })?;
    Ok(SnapshotReport {
        devices,
        files: c.files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_resolution() {
        assert_eq!(
            resolve(
                Path::new("sys/bus/pci/devices"),
                Path::new("../../../devices/pci0000:00/0000:00:02.0")
            ),
            PathBuf::from("sys/devices/pci0000:00/0000:00:02.0")
        );
    }

    #[test]
    fn uuids() {
        assert!(is_uuid("2f3e4d5c-6b7a-4988-8776-655443322110"));
        assert!(!is_uuid("2f3e4d5c-6b7a-4988-8776-65544332211"));
        assert!(!is_uuid("0000:00:02.0"));
    }
}
