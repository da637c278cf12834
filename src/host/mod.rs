//! The host: every path gpupass reads or writes is built here, from one root.
//!
//! `HostRoot::new("/")` is the running machine; `HostRoot::new("tests/fixtures/hosts/x")` is a
//! fixture tree laid out exactly like the kernel's (`sys/`, `proc/`, `dev/`, `etc/`). No other
//! module spells out `/sys`: they ask this one for `sys_bus_pci_devices()` and friends, so the
//! whole program can be pointed at a snapshot with `--root` or `GPUPASS_ROOT`.
//!
//! Reads are bounded (sysfs attributes are at most a page; a hostile or broken tree must not
//! make gpupass read forever) and return `None`/errors instead of panicking.

pub mod ops;

/// Host paths as the kernel names them, before the root: what a change plan (bind, unbind,
/// mdev, vGPU type) records, prints in `--dry-run` and journals (`HostRoot::path` maps one
/// under the root when it is written).
pub mod logical {
    use crate::model::PciAddress;

    pub(crate) const DRIVERS_PROBE: &str = "/sys/bus/pci/drivers_probe";

    pub(crate) fn override_path(a: &PciAddress) -> String {
        format!("/sys/bus/pci/devices/{a}/driver_override")
    }

    pub(crate) fn driver_link_path(a: &PciAddress) -> String {
        format!("/sys/bus/pci/devices/{a}/driver")
    }

    pub(crate) fn unbind_path(driver: &str) -> String {
        format!("/sys/bus/pci/drivers/{driver}/unbind")
    }

    /// An mdev type's `create` on `parent`.
    pub(crate) fn mdev_create_path(parent: &str, ty: &str) -> String {
        format!("/sys/class/mdev_bus/{parent}/mdev_supported_types/{ty}/create")
    }

    /// An mdev instance's directory.
    pub(crate) fn mdev_instance_path(uuid: &str) -> String {
        format!("/sys/bus/mdev/devices/{uuid}")
    }

    /// A VF's vGPU type (NVIDIA vendor-specific VFIO).
    pub(crate) fn vgpu_type_path(vf: &PciAddress) -> String {
        format!("/sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type")
    }
}
pub mod uevents;

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Largest attribute gpupass reads. sysfs attributes are at most one page; procfs
/// `information` files and `modules.alias`-style tables are read with their own limits.
pub(crate) const ATTR_LIMIT: u64 = 64 * 1024;

/// Root of all host paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot {
    root: PathBuf,
}

impl Default for HostRoot {
    fn default() -> Self {
        HostRoot::new("/")
    }
}

impl HostRoot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        HostRoot { root: root.into() }
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<rel>`; `rel` is relative (no leading slash).
    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    pub(crate) fn sys(&self) -> PathBuf {
        self.path("sys")
    }
    pub(crate) fn proc_dir(&self) -> PathBuf {
        self.path("proc")
    }
    pub(crate) fn dev(&self) -> PathBuf {
        self.path("dev")
    }
    #[cfg(test)]
    pub(crate) fn sys_bus_pci(&self) -> PathBuf {
        self.path("sys/bus/pci")
    }
    pub(crate) fn sys_bus_pci_devices(&self) -> PathBuf {
        self.path("sys/bus/pci/devices")
    }
    pub(crate) fn pci_device(&self, addr: &crate::model::PciAddress) -> PathBuf {
        self.sys_bus_pci_devices().join(addr.to_string())
    }
    pub(crate) fn sys_bus_pci_drivers(&self) -> PathBuf {
        self.path("sys/bus/pci/drivers")
    }
    pub(crate) fn iommu_groups(&self) -> PathBuf {
        self.path("sys/kernel/iommu_groups")
    }
    pub(crate) fn mdev_bus_class(&self) -> PathBuf {
        self.path("sys/class/mdev_bus")
    }
    pub(crate) fn mdev_devices(&self) -> PathBuf {
        self.path("sys/bus/mdev/devices")
    }
    pub(crate) fn sys_module(&self, name: &str) -> PathBuf {
        self.sys_modules().join(name)
    }
    pub(crate) fn dev_vfio(&self) -> PathBuf {
        self.path("dev/vfio")
    }
    /// `/dev/vfio/devices/<name>`: a VFIO device cdev (`vfio0`).
    pub(crate) fn vfio_cdev_node(&self, name: &str) -> PathBuf {
        self.dev_vfio_devices().join(name)
    }
    /// `/dev/vfio/devices`: the VFIO device cdevs.
    pub(crate) fn dev_vfio_devices(&self) -> PathBuf {
        self.path("dev/vfio/devices")
    }
    /// `/dev/iommu`: iommufd.
    pub(crate) fn dev_iommu(&self) -> PathBuf {
        self.path("dev/iommu")
    }
    /// `/sys/class/misc/<name>`: a misc character device (`vfio`, `iommu`).
    pub(crate) fn sys_class_misc(&self, name: &str) -> PathBuf {
        self.path("sys/class/misc").join(name)
    }
    /// The running kernel's build config: `/proc/config.gz` (gzip) and `/boot/config-<release>`.
    pub(crate) fn kernel_configs(&self, release: &str) -> [PathBuf; 2] {
        [
            self.path("boot").join(format!("config-{release}")),
            self.proc_config_gz(),
        ]
    }
    /// `/proc/config.gz`: the running kernel's build config, compressed.
    pub(crate) fn proc_config_gz(&self) -> PathBuf {
        self.path("proc/config.gz")
    }
    /// `/sys/devices`: where every device directory really is (the bus and class links
    /// point into it).
    pub(crate) fn sys_devices(&self) -> PathBuf {
        self.path("sys/devices")
    }
    /// `/sys/module`: a directory per loaded (or built-in) module.
    pub(crate) fn sys_modules(&self) -> PathBuf {
        self.path("sys/module")
    }
    /// `/sys/firmware/acpi/tables`: `DMAR` (Intel IOMMU), `IVRS` (AMD IOMMU).
    pub(crate) fn acpi_tables(&self) -> PathBuf {
        self.path("sys/firmware/acpi/tables")
    }
    /// `/proc/cmdline`: the kernel command line.
    pub(crate) fn proc_cmdline(&self) -> PathBuf {
        self.path("proc/cmdline")
    }
    /// `/proc/sys/kernel/osrelease`: the running kernel's release.
    pub(crate) fn proc_osrelease(&self) -> PathBuf {
        self.path("proc/sys/kernel/osrelease")
    }
    /// `/proc/interrupts`: interrupt counts per CPU (interrupt remapping shows there).
    pub(crate) fn proc_interrupts(&self) -> PathBuf {
        self.path("proc/interrupts")
    }
    /// `/proc/cpuinfo`: the CPU's address sizes.
    pub(crate) fn proc_cpuinfo(&self) -> PathBuf {
        self.path("proc/cpuinfo")
    }
    /// `/dev/dri`: DRM device nodes.
    pub(crate) fn dev_dri(&self) -> PathBuf {
        self.path("dev/dri")
    }
    /// `/dev/kvm`, which `gpupass boot` opens and a DRA claim with `kvm: true` hands on.
    #[cfg(any(feature = "vmm", feature = "dra"))]
    pub(crate) fn dev_kvm(&self) -> PathBuf {
        self.path("dev/kvm")
    }
    pub(crate) fn nvidia_gpus_proc(&self) -> PathBuf {
        self.path("proc/driver/nvidia/gpus")
    }
    pub(crate) fn driverctl_dir(&self) -> PathBuf {
        self.path("etc/driverctl.d")
    }
    pub(crate) fn mdevctl_dir(&self) -> PathBuf {
        self.path("etc/mdevctl.d")
    }
    /// `lib/modules/<release>` for the running kernel's module tables.
    pub(crate) fn modules_dir(&self, release: &str) -> PathBuf {
        self.path("lib/modules").join(release)
    }

    /// `var/run/cdi`: CDI's dynamic spec directory (podman, containerd, CRI-O read it).
    pub(crate) fn cdi_dynamic_dir(&self) -> PathBuf {
        self.path("var/run/cdi")
    }
    /// `etc/cdi`: CDI's static spec directory (the device plugin looks for specs there too).
    #[cfg(feature = "deviceplugin")]
    pub(crate) fn cdi_static_dir(&self) -> PathBuf {
        self.path("etc/cdi")
    }
    /// `var/run/gpupass`: gpupass's own runtime state (e.g. how a CDI spec was generated).
    pub(crate) fn gpupass_run_dir(&self) -> PathBuf {
        self.path("var/run/gpupass")
    }
    /// `etc/ld.so.cache`: the dynamic linker's cache of libraries.
    pub(crate) fn ld_so_cache(&self) -> PathBuf {
        self.path("etc/ld.so.cache")
    }
    /// `var/lib/kubelet/device-plugins`: where the kubelet and device plugins put sockets.
    #[cfg(feature = "deviceplugin")]
    pub(crate) fn kubelet_device_plugins(&self) -> PathBuf {
        self.path("var/lib/kubelet/device-plugins")
    }
    /// `sys/fs/cgroup`: the cgroup hierarchies (v1 controllers in subdirectories, or v2).
    pub(crate) fn cgroup_root(&self) -> PathBuf {
        self.path("sys/fs/cgroup")
    }
    /// `sys/bus/pci/drivers/<name>` (a loaded PCI driver).
    pub(crate) fn pci_driver(&self, name: &str) -> PathBuf {
        self.sys_bus_pci_drivers().join(name)
    }
    /// `run/gpupass`: journal and lock of the commands that change drivers.
    pub(crate) fn run_gpupass(&self) -> PathBuf {
        self.path("run/gpupass")
    }
    pub(crate) fn proc_self_mountinfo(&self) -> PathBuf {
        self.path("proc/self/mountinfo")
    }
    pub(crate) fn proc_self_mounts(&self) -> PathBuf {
        self.path("proc/self/mounts")
    }
    pub(crate) fn proc_swaps(&self) -> PathBuf {
        self.path("proc/swaps")
    }
    /// `sys/class/<class>` (block, net, drm, graphics, vtconsole).
    pub(crate) fn sys_class(&self, class: &str) -> PathBuf {
        self.path("sys/class").join(class)
    }
    /// `sys/devices/system/node`: the NUMA nodes.
    pub(crate) fn sys_numa_nodes(&self) -> PathBuf {
        self.path("sys/devices/system/node")
    }
    /// `sys/dev/block/<major:minor>`.
    pub(crate) fn sys_dev_block(&self, majmin: &str) -> PathBuf {
        self.path("sys/dev/block").join(majmin)
    }
    /// `proc/<pid>` of one process.
    pub(crate) fn proc_pid(&self, pid: u32) -> PathBuf {
        self.proc_dir().join(pid.to_string())
    }

    /// Show a path as the user knows it: relative to the root, with a leading `/`.
    pub(crate) fn display(&self, p: &Path) -> String {
        match p.strip_prefix(&self.root) {
            Ok(rel) => format!("/{}", rel.display()),
            Err(_) => p.display().to_string(),
        }
    }
}

/// An open sysfs directory: attributes are opened relative to it (`openat`), so reading the
/// twenty-odd attributes of a device walks its path once instead of twenty times, and a device
/// that disappears mid-read fails consistently instead of half-way through a new path walk.
pub(crate) struct AttrDir {
    fd: rustix::fd::OwnedFd,
}

impl AttrDir {
    pub(crate) fn open(path: &Path) -> io::Result<Self> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(AttrDir { fd })
    }

    /// [`for_each_entry`] on this directory.
    pub(crate) fn for_each_entry(&self, f: impl FnMut(&[u8], bool)) -> io::Result<()> {
        for_each_entry(&self.fd, f)
    }

    /// Read at most `limit` bytes of an attribute into `buf`, trailing newlines and NULs
    /// trimmed. `buf` is cleared first and keeps its capacity, so a scan that reads thousands
    /// of attributes allocates one buffer, and nothing is zeroed before the kernel fills it.
    /// `listed_regular`: the directory listing reported the entry as a regular file
    /// ([`entries`](Self::entries)), so the `fstat` that refuses FIFOs and device nodes is
    /// skipped. (Should the entry be swapped for a FIFO since, the non-blocking open and read
    /// still return at once.)
    ///
    /// A sysfs attribute's `show()` fills its whole page on the first read, so a read shorter
    /// than the buffer is the end of the file; this saves the second, empty read per attribute.
    pub(crate) fn read_into<P: rustix::path::Arg>(
        &self,
        name: P,
        limit: usize,
        listed_regular: bool,
        buf: &mut Vec<u8>,
    ) -> io::Result<()> {
        use rustix::fs::{Mode, OFlags};
        buf.clear();
        // O_NONBLOCK: a FIFO planted where an attribute belongs must not block the open.
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        )?;
        if !listed_regular {
            regular_only(&fd)?;
        }
        buf.reserve(4096.min(limit));
        loop {
            let want = buf.capacity() - buf.len();
            let n = rustix::io::read(&fd, rustix::buffer::spare_capacity(buf))?;
            if buf.len() >= limit {
                buf.truncate(limit);
                break;
            }
            if n == 0 || n < want {
                break;
            }
            // Full: grow (doubling) and read on.
            buf.reserve(buf.len().min(limit - buf.len()));
        }
        let end = buf
            .iter()
            .rposition(|b| !matches!(b, b'\n' | b'\0'))
            .map_or(0, |i| i + 1);
        buf.truncate(end);
        Ok(())
    }

    /// A symlink's whole target into `buf` (cleared first, its capacity kept); `false` when the
    /// link does not exist.
    pub(crate) fn link_into<P: rustix::path::Arg + Copy>(
        &self,
        name: P,
        buf: &mut Vec<u8>,
    ) -> io::Result<bool> {
        buf.clear();
        buf.reserve(256);
        loop {
            let room = buf.capacity();
            match rustix::fs::readlinkat_raw(&self.fd, name, rustix::buffer::spare_capacity(buf)) {
                // Filled the buffer: the target may be longer; read it again into a bigger one.
                Ok(n) if n >= room => {
                    buf.clear();
                    buf.reserve(room * 2);
                }
                Ok(_) => return Ok(true),
                Err(rustix::io::Errno::NOENT) => return Ok(false),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The bytes after the last `/` (all of them when there is none).
pub(crate) fn last_component(b: &[u8]) -> &[u8] {
    b.rsplit(|c| *c == b'/').next().unwrap_or(b)
}

/// Bytes as text: borrowed when they are UTF-8 (sysfs always is), else lossily converted.
/// `from_utf8` validates far faster than the lossy decoder walks valid input.
pub(crate) fn utf8(b: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(b) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(b),
    }
}

/// Refuse anything but a regular file: sysfs attributes and procfs files are regular files,
/// while a FIFO, a socket or a device node (`/dev/zero` behind a link) in a hostile or broken
/// tree would block or never end.
fn regular_only(fd: &rustix::fd::OwnedFd) -> io::Result<u64> {
    let st = rustix::fs::fstat(fd)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile {
        Ok(st.st_size.max(0) as u64)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file (a FIFO, socket or device node where a sysfs/procfs file belongs)",
        ))
    }
}

/// Read at most `limit` bytes of a host file (sysfs, procfs, configuration) as UTF-8 (lossy),
/// trimmed of the trailing newline. Only regular files are read, and the open does not block
/// (see [`regular_only`]); files the user names (`--from-json`) use [`read_bounded_any`].
pub(crate) fn read_bounded(path: &Path, limit: u64) -> io::Result<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    let fd: rustix::fd::OwnedFd = f.into();
    let size = regular_only(&fd)?;
    read_all_bounded_sized(fs::File::from(fd), limit, Some(size))
}

/// Like [`read_bounded`], but any readable file, pipes included (`--from-json <(ssh host gpupass
/// list --all --json)`): for files the user names, never for host paths.
pub(crate) fn read_bounded_any(path: &Path, limit: u64) -> io::Result<String> {
    read_all_bounded_sized(fs::File::open(path)?, limit, None)
}

/// What sysfs reports as the size of every attribute.
const SYSFS_PAGE: u64 = 4096;

/// Read at most `limit` bytes (lossy UTF-8, trailing newlines and NULs trimmed). `size`, the
/// file's `st_size` when known, sizes the buffer: one read instead of a doubling series from 32
/// bytes. A sysfs attribute (size 4096) is filled by its show() on the first read, so a read
/// shorter than the page is the whole value and the second, empty read is skipped; procfs
/// files say 0 and are read to the end.
fn read_all_bounded_sized(f: fs::File, limit: u64, size: Option<u64>) -> io::Result<String> {
    let mut f = f.take(limit);
    let mut buf = Vec::new();
    match size {
        Some(SYSFS_PAGE) => {
            buf.resize(SYSFS_PAGE as usize + 1, 0);
            let n = f.read(&mut buf)?;
            buf.truncate(n);
            if n == 0 || n as u64 >= SYSFS_PAGE {
                f.read_to_end(&mut buf)?;
            }
        }
        Some(0) => {
            buf.reserve(4096);
            f.read_to_end(&mut buf)?;
        }
        Some(n) => {
            buf.reserve(n.min(limit) as usize + 1);
            f.read_to_end(&mut buf)?;
        }
        None => {
            f.read_to_end(&mut buf)?;
        }
    }
    let s = utf8(&buf);
    Ok(s.trim_end_matches(['\n', '\0']).to_string())
}

/// Read at most `limit` bytes of a file as raw bytes.
pub(crate) fn read_bounded_bytes(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let f = fs::File::open(path)?;
    let mut buf = Vec::new();
    f.take(limit).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Read a sysfs attribute (bounded to [`ATTR_LIMIT`]).
pub(crate) fn read_attr(path: &Path) -> io::Result<String> {
    read_bounded(path, ATTR_LIMIT)
}

/// The last path component a symlink points at (`driver -> ../../bus/pci/drivers/nvidia` gives
/// `nvidia`), `None` when the link does not exist.
pub(crate) fn link_name(path: &Path) -> io::Result<Option<String>> {
    match fs::read_link(path) {
        Ok(t) => Ok(t.file_name().map(|n| n.to_string_lossy().into_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Lexically join a relative symlink target onto the directory holding the link
/// (`sys/bus/pci/devices` + `../../../devices/pci0000:00/X` = `sys/devices/pci0000:00/X`).
/// Valid for sysfs, whose link directories are real directories.
pub(crate) fn join_link(dir: &Path, target: &Path) -> PathBuf {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let (d, t) = (dir.as_os_str().as_bytes(), target.as_os_str().as_bytes());
    // The bytes directly when `dir` is in normal form (no empty, `.` or `..` component, no
    // trailing slash) and `target` is relative, as with every bus link: the same result as the
    // component walk below, without it (a scan joins one link per function).
    let normal = !d.is_empty()
        && (d == b"/" || !d.ends_with(b"/"))
        && d.split(|c| *c == b'/')
            .skip(1)
            .all(|c| !matches!(c, b"" | b"." | b".."))
        && !matches!(d.split(|c| *c == b'/').next(), Some(b"." | b".."));
    if normal && !t.starts_with(b"/") {
        let mut out = d.to_vec();
        for c in t.split(|c| *c == b'/') {
            match c {
                b"" | b"." => {}
                b".." => match out.iter().rposition(|c| *c == b'/') {
                    Some(0) => out.truncate(1),
                    Some(i) => out.truncate(i),
                    None => out.clear(),
                },
                c => {
                    if !out.is_empty() && !out.ends_with(b"/") {
                        out.push(b'/');
                    }
                    out.extend_from_slice(c);
                }
            }
        }
        return PathBuf::from(std::ffi::OsString::from_vec(out));
    }
    join_components(dir, target)
}

/// [`join_link`]'s general form: `target`'s components applied to `dir` one by one.
fn join_components(dir: &Path, target: &Path) -> PathBuf {
    let mut out = dir.to_path_buf();
    for c in target.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Put an empty `.keep` file in every empty directory under `dir` (not following links), so a
/// fixture or snapshot tree keeps its empty directories (`sys/module/<name>`, `pci_bus`) through
/// git, which stores no empty directories. Listings skip dot-files.
pub fn keep_empty_dirs(dir: &Path) -> io::Result<()> {
    let mut empty = true;
    for e in fs::read_dir(dir)? {
        let e = e?;
        empty = false;
        if e.file_type()?.is_dir() {
            keep_empty_dirs(&e.path())?;
        }
    }
    if empty {
        fs::write(dir.join(".keep"), "")?;
    }
    Ok(())
}

/// Create or replace a file atomically, the one way gpupass writes its own files (CDI specs,
/// driverctl overrides, mdevctl definitions, the bind journal): the content goes to a
/// temporary file in the same directory (`.<name>.gpupass-tmp.<pid>`: a dot file that neither
/// driverctl's `pci-*` nor a CDI watcher's `*.json`/`*.yaml` matches), is fsynced, renamed over
/// `path`, and the directory is fsynced, so a crash leaves the old file or the new one, never
/// half of one, and the rename survives a power cut. Directories are created as needed; the
/// file gets mode 0644. The temporary file is removed when a step fails.
pub(crate) fn write_atomic(path: &Path, content: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} has no file name", path.display())))?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.gpupass-tmp.{}", std::process::id()));
    let res = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(content)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        // The rename is durable once the directory is; a directory that cannot be opened for
        // the fsync (unusual permissions) does not undo a write that has happened.
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// Parse a sysfs hex attribute like `0x10de`.
pub(crate) fn parse_hex(s: &str) -> Option<u64> {
    let t = s.trim();
    let t = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")).unwrap_or(t);
    if t.is_empty() || t.len() > 16 {
        return None;
    }
    u64::from_str_radix(t, 16).ok()
}

/// Sorted names of the entries of a directory; empty when it does not exist.
pub(crate) fn dir_names(path: &Path) -> io::Result<Vec<String>> {
    let fd = match rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut v = names_of_dir_fd(&fd)?;
    v.sort();
    Ok(v)
}

/// The entry names of an open directory (unsorted, without `.`, `..` and dot-files), read with
/// `getdents64` into one buffer: an open, two `getdents64` and a close per directory, where
/// `readdir(3)` adds an `fstat`. sysfs and procfs directories are read by the thousand in a
/// scan, so the call count is the cost.
pub(crate) fn names_of_dir_fd(fd: &impl rustix::fd::AsFd) -> io::Result<Vec<String>> {
    Ok(entries_of_dir_fd(fd)?.into_iter().map(|(n, _)| n).collect())
}

/// [`names_of_dir_fd`] with whether each entry is a regular file (`d_type`).
pub(crate) fn entries_of_dir_fd(fd: &impl rustix::fd::AsFd) -> io::Result<Vec<(String, bool)>> {
    let mut v = Vec::new();
    for_each_entry(fd, |n, regular| v.push((utf8(n).into_owned(), regular)))?;
    Ok(v)
}

/// Call `f` with the name and "is a regular file" (`d_type`) of each entry of an open
/// directory, without `.`, `..` and dot-files, read with `getdents64`; nothing is allocated
/// per entry.
pub(crate) fn for_each_entry(fd: &impl rustix::fd::AsFd, mut f: impl FnMut(&[u8], bool)) -> io::Result<()> {
    let mut buf = Vec::with_capacity(16 * 1024);
    let mut it = rustix::fs::RawDir::new(fd, buf.spare_capacity_mut());
    while let Some(e) = it.next() {
        let e = e?;
        let n = e.file_name().to_bytes();
        // sysfs has no dot-files; fixture trees use `.keep` to survive version control.
        if n.first() == Some(&b'.') {
            continue;
        }
        f(n, e.file_type() == rustix::fs::FileType::RegularFile);
    }
    Ok(())
}

/// A file some process holds open: `proc/<pid>/fd/<n>` whose link text (the path as the
/// process opened it) `wanted` accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenFile {
    pub pid: u32,
    pub comm: String,
    pub target: String,
}

/// The open files of every process that `wanted` accepts, and how many processes could not be
/// inspected (their `fd` directory is readable only by root). On a real procfs, kernel threads
/// and zombies have no `exe` and no open files: one `readlink` tells them apart, instead of
/// opening and listing an empty `fd` directory (on a typical host half the pids are kernel
/// threads). Trees that only imitate procfs (fixtures, snapshots) get every `fd` directory
/// read. Each process appears once per target.
pub(crate) fn open_files(host: &HostRoot, wanted: &dyn Fn(&str) -> bool) -> (Vec<OpenFile>, usize) {
    use rustix::fs::{Mode, OFlags};
    let mut out: Vec<OpenFile> = Vec::new();
    let mut unreadable = 0;
    let proc_dir = host.proc_dir();
    // Every lookup below is relative to this descriptor: `N/exe`, not `/proc/N/exe`.
    let Ok(proc_fd) = rustix::fs::open(
        &proc_dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return (out, unreadable);
    };
    let Ok(mut pids) = names_of_dir_fd(&proc_fd) else {
        return (out, unreadable);
    };
    pids.sort();
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    // f_type is i64 on x86_64, another width elsewhere.
    #[allow(clippy::unnecessary_cast)]
    let real_procfs = rustix::fs::fstatfs(&proc_fd).is_ok_and(|s| s.f_type as i64 == PROC_SUPER_MAGIC);
    for p in pids {
        let Ok(pid) = p.parse::<u32>() else { continue };
        if real_procfs
            && matches!(
                rustix::fs::readlinkat(&proc_fd, format!("{p}/exe"), Vec::new()),
                Err(rustix::io::Errno::NOENT)
            )
        {
            continue;
        }
        let fd = match rustix::fs::openat(
            &proc_fd,
            format!("{p}/fd"),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            // Exited since the listing.
            Err(rustix::io::Errno::NOENT) => continue,
            Err(_) => {
                unreadable += 1;
                continue;
            }
        };
        let Ok(fds) = names_of_dir_fd(&fd) else {
            unreadable += 1;
            continue;
        };
        let mut comm: Option<String> = None;
        for n in fds {
            let Ok(t) = rustix::fs::readlinkat(&fd, n.as_str(), Vec::new()) else {
                continue;
            };
            let t = String::from_utf8_lossy(t.to_bytes()).into_owned();
            if !wanted(&t) {
                continue;
            }
            let c = comm
                .get_or_insert_with(|| {
                    read_attr(&proc_dir.join(&p).join("comm")).unwrap_or_else(|_| "?".into())
                })
                .clone();
            if !out.iter().any(|o| o.pid == pid && o.target == t) {
                out.push(OpenFile {
                    pid,
                    comm: c,
                    target: t,
                });
            }
        }
    }
    (out, unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_hang_off_the_root() {
        let h = HostRoot::new("/tmp/x");
        assert_eq!(
            h.sys_bus_pci_devices(),
            PathBuf::from("/tmp/x/sys/bus/pci/devices")
        );
        assert_eq!(h.display(&h.dev_vfio().join("3")), "/dev/vfio/3");
    }

    #[test]
    fn hex_parsing() {
        assert_eq!(parse_hex("0x10de\n"), Some(0x10de));
        assert_eq!(parse_hex("0x030000"), Some(0x030000));
        assert_eq!(parse_hex("zz"), None);
        assert_eq!(parse_hex(""), None);
        assert_eq!(parse_hex("0x11112222333344445"), None);
    }

    #[test]
    fn link_joins() {
        // The byte path and the component walk agree (the second for the forms the first
        // leaves to it).
        let walk = |dir: &str, t: &str| join_components(Path::new(dir), Path::new(t));
        for dir in [
            "/r/sys/bus/pci/devices",
            "/",
            "r/sys",
            "r",
            "/r//sys/",
            "./r/sys",
            "/r/./x/../sys",
        ] {
            for t in [
                "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0",
                "../../../../../../../../x",
                "a/./b//c/",
                "..",
                "",
                "/abs/x",
            ] {
                assert_eq!(
                    join_link(Path::new(dir), Path::new(t)),
                    walk(dir, t),
                    "{dir} + {t}"
                );
            }
        }
    }

    #[test]
    fn bounded_read_stops() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("big");
        fs::write(&p, vec![b'a'; 200_000]).unwrap();
        assert_eq!(read_bounded(&p, 10).unwrap().len(), 10);
        assert_eq!(read_attr(&p).unwrap().len() as u64, ATTR_LIMIT);
    }
}
