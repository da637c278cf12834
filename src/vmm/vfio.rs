//! A thin wrapper over vfio-ioctls for `gpupass boot`: check a device can be opened (driver,
//! IOMMU group viability, device nodes), open it through one VFIO backend (the legacy
//! container/group, or the device cdev bound to iommufd: docs/iommufd.md), map guest RAM for
//! DMA, and describe its BARs for the VMM.
//!
//! VFIO facts used here:
//! - A PCI function is opened by name (its address) through its group's `/dev/vfio/<N>`; an
//!   mdev by its UUID, its group read from `/sys/bus/mdev/devices/<uuid>/iommu_group`.
//! - The kernel refuses a group unless every member is bound to a VFIO driver (or is
//!   driverless / pci-stub / a bridge): the inventory's `viable` and `blockers` say the same
//!   beforehand, with names.
//! - Regions 0-5 are the BARs, 6 the ROM, 7 config space. `VFIO_REGION_INFO_FLAG_MMAP` says a
//!   region may be mmapped from the device fd at the region's offset; a sparse-mmap capability
//!   narrows that to listed areas. Any region can be read/written with pread/pwrite.
//! - `VFIO_IOMMU_MAP_DMA` (type1v2) maps process memory at an IOVA; with IOVA = GPA the device
//!   sees guest RAM where the guest's drivers will point it.
//!
//! - iommufd (Linux 6.6+): the function's cdev `/dev/vfio/devices/vfioN` (named by
//!   `<sysfs>/vfio-dev/vfioN`) is opened, added to the KVM VFIO device
//!   (`KVM_DEV_VFIO_FILE_ADD`, before the bind: drivers such as NVIDIA's vGPU need the KVM
//!   pointer when the device is opened), bound to an iommufd (`VFIO_DEVICE_BIND_IOMMUFD`) and
//!   attached to an IOAS (`VFIO_DEVICE_ATTACH_IOMMUFD_PT`); guest RAM is mapped into the IOAS
//!   at IOVA = GPA (`IOMMU_IOAS_MAP`). vfio-ioctls' `VfioDevice::new_from_fd` does the three
//!   steps in that order. An mdev gets a cdev too where its parent's driver supports it.
//!
//! vfio-ioctls 0.10 opens `/dev/vfio/vfio` and `/dev/vfio/<N>` itself (no root override), so
//! the nodes are checked under the [`HostRoot`] and the open itself needs the live root `/`;
//! the iommufd path opens `/dev/iommu` and the cdev through the [`HostRoot`].

use crate::host::HostRoot;
use crate::inventory::backend::{self, BackendError, Policy};
use crate::model::{Backend, Inventory, NotReady, PciAddress};
use crate::vmm::bars::{carve_pieces, BarRegions, HostArea, PresentedDevice};
use crate::vmm::memory::RamRegion;
use crate::vmm::pci::{walk_capabilities, BarSpec, ConfigBackend};
use kvm_ioctls::VmFd;
use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vfio_bindings::bindings::vfio::{
    vfio_device_info, VFIO_DEVICE_FLAGS_RESET, VFIO_PCI_CONFIG_REGION_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
};
use vfio_ioctls::{VfioContainer, VfioDevice, VfioDeviceFd, VfioIommufd, VfioOps, VfioRegionInfoCap};
use vm_memory::{FileOffset, MmapRegion};

/// What to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum VfioTarget {
    Pci(PciAddress),
    /// An mdev UUID (validated by [`parse_uuid`]).
    Mdev(String),
}

#[derive(Debug, thiserror::Error)]
pub enum VfioDevError {
    #[error("no PCI device {addr} on this host; `gpupass list --all` shows the devices there are")]
    NoSuchDevice { addr: PciAddress },
    #[error("{addr} is {}, not vfio-pci; run `gpupass bind {addr}` first", match driver { Some(d) => format!("bound to {d}"), None => "not bound to any driver".to_string() })]
    NotOnVfio {
        addr: PciAddress,
        driver: Option<String>,
    },
    #[error("{what} has no IOMMU group; enable the IOMMU (intel_iommu=on or amd_iommu=on on the kernel command line) — `gpupass check` says what is missing")]
    NoGroup { what: String },
    #[error("IOMMU group {group} is not viable: it also holds {blockers}; `gpupass bind` (without --only) binds the whole group, or unbind those members, then rerun")]
    NotViable { group: u32, blockers: String },
    #[error("invalid mdev UUID {input:?}: expected 8-4-4-4-12 hex digits like 2f3e4d5c-6b7a-4988-8776-655443322110")]
    BadUuid { input: String },
    #[error("no mediated device {uuid} ({}); create it first (`gpupass mdev create` or mdevctl), `gpupass list --all --json` lists the active ones", .path.display())]
    NoSuchMdev { uuid: String, path: PathBuf },
    #[error("{} does not exist; load VFIO (`modprobe vfio-pci`) and bind the device (`gpupass bind`)", .node.display())]
    NoNode { node: PathBuf },
    #[error("VFIO needs the live host: vfio-ioctls opens /dev/vfio itself, so `--root {}` cannot be used with --device/--mdev (the checks above passed against that root)", .root.display())]
    NotLiveRoot { root: PathBuf },
    #[error("opening {what} through VFIO failed")]
    Open {
        what: String,
        #[source]
        source: vfio_ioctls::VfioError,
    },
    #[error("VFIO DMA map of guest RAM at {gpa:#x} ({len:#x} bytes) failed (is RLIMIT_MEMLOCK large enough? `ulimit -l`)")]
    DmaMap {
        gpa: u64,
        len: u64,
        #[source]
        source: vfio_ioctls::VfioError,
    },
    #[error("cannot mmap BAR{bar} of {what}: {reason}")]
    Mmap { what: String, bar: u8, reason: String },
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("cannot open {} for {what}; `gpupass check` shows whether iommufd is usable here, or use --backend legacy", .node.display())]
    OpenNode {
        node: std::path::PathBuf,
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl VfioDevError {
    /// The wording here of the model's readiness reasons for the PCI function `addr`.
    fn not_ready(addr: PciAddress, e: NotReady) -> VfioDevError {
        match e {
            NotReady::NotOnVfio { driver } => VfioDevError::NotOnVfio { addr, driver },
            NotReady::NotViable { group, .. } => VfioDevError::not_viable(group, &e),
            // `resolve` checks the nodes itself, per backend, on the host.
            NotReady::NoGroup | NotReady::NoNode { .. } => VfioDevError::NoGroup {
                what: addr.to_string(),
            },
        }
    }

    fn not_viable(group: u32, e: &NotReady) -> VfioDevError {
        VfioDevError::NotViable {
            group,
            blockers: e.blocker_list(),
        }
    }

    /// Errors in what the user typed (exit status 2).
    pub(crate) fn is_usage(&self) -> bool {
        matches!(self, VfioDevError::BadUuid { .. })
    }
}

/// Validate an mdev UUID (8-4-4-4-12 hex digits); returned lower-case.
pub(crate) fn parse_uuid(input: &str) -> Result<String, VfioDevError> {
    crate::model::canonical_uuid(input).ok_or_else(|| VfioDevError::BadUuid {
        input: input.to_string(),
    })
}

/// A target that passed the checks: its sysfs path (what vfio-ioctls opens), group, name, and
/// the backend it will be opened through (with its cdev's name under iommufd).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub sysfs: PathBuf,
    pub group: u32,
    pub name: String,
    pub backend: Backend,
    /// `vfioN` under iommufd: the node is `/dev/vfio/devices/vfioN`.
    pub cdev: Option<String>,
    /// The function's sysfs `reset_method` as the inventory read it (`None` for an mdev or
    /// when the file is absent).
    pub reset_methods: Option<Vec<String>>,
    pub mdev: bool,
}

impl Resolved {
    /// The device nodes this backend opens, as the user sees them.
    pub(crate) fn nodes(&self) -> Vec<String> {
        backend::node_paths(self.backend, self.group, self.cdev.as_deref())
    }
}

/// The single `vfio-dev/vfioN` entry under a device's sysfs directory that is a character
/// device (has a `dev` attribute: 6.6+; on 6.1 the directory exists without one): the cdev.
fn sysfs_cdev(sysfs: &Path) -> Option<String> {
    let dir = sysfs.join("vfio-dev");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("vfio") && dir.join(n).join("dev").exists())
        .collect();
    (names.len() == 1).then(|| names.remove(0))
}

/// Check `target` against the inventory and the device nodes, without opening anything, and
/// pick its backend by `policy` (docs/iommufd.md: `auto` is iommufd where the kernel serves the
/// function through it; an mdev stays on its group under `auto`, as in every other consumer).
pub(crate) fn resolve(
    host: &HostRoot,
    inv: &Inventory,
    target: &VfioTarget,
    policy: Policy,
) -> Result<Resolved, VfioDevError> {
    let reset_methods = match target {
        VfioTarget::Pci(addr) => inv.device(addr).and_then(|d| d.reset_methods.clone()),
        VfioTarget::Mdev(_) => None,
    };
    let (sysfs, group, name) = match target {
        VfioTarget::Pci(addr) => {
            let d = inv
                .device(addr)
                .ok_or(VfioDevError::NoSuchDevice { addr: *addr })?;
            let g = inv.vfio_group(d).map_err(|e| VfioDevError::not_ready(*addr, e))?;
            (host.pci_device(addr), g.number, addr.to_string())
        }
        VfioTarget::Mdev(uuid) => {
            let uuid = parse_uuid(uuid)?;
            let path = host.mdev_devices().join(&uuid);
            if !path.exists() {
                return Err(VfioDevError::NoSuchMdev {
                    path: host.display(&path).into(),
                    uuid,
                });
            }
            let g = inv
                .mdev(&uuid)
                .and_then(|m| m.iommu_group)
                .or_else(|| {
                    crate::host::link_name(&path.join("iommu_group"))
                        .ok()
                        .flatten()
                        .and_then(|n| n.parse().ok())
                })
                .ok_or_else(|| VfioDevError::NoGroup {
                    what: format!("mdev {uuid}"),
                })?;
            if let Some(group) = inv.group(g) {
                group
                    .check_viable()
                    .map_err(|e| VfioDevError::not_viable(g, &e))?;
            }
            (path, g, format!("mdev {uuid}"))
        }
    };
    let (backend, cdev) = match target {
        VfioTarget::Pci(addr) => match backend::resolve_vm(policy, inv, &[*addr], None)? {
            Backend::Legacy => (Backend::Legacy, None),
            Backend::Iommufd => {
                let cdev = inv
                    .device(addr)
                    .and_then(|d| d.vfio_cdev.clone())
                    .or_else(|| sysfs_cdev(&sysfs));
                (Backend::Iommufd, cdev)
            }
        },
        VfioTarget::Mdev(_) if policy != Policy::Iommufd => (Backend::Legacy, None),
        VfioTarget::Mdev(_) => {
            backend::iommufd_ready(inv).map_err(|e| BackendError::IommufdUnavailable {
                what: name.clone(),
                reason: e.to_string(),
            })?;
            let cdev = sysfs_cdev(&sysfs).ok_or_else(|| BackendError::IommufdUnavailable {
                what: name.clone(),
                reason: format!(
                    "{} has no vfio-dev/vfioN (its parent driver registers no VFIO device cdev)",
                    host.display(&sysfs)
                ),
            })?;
            (Backend::Iommufd, Some(cdev))
        }
    };
    let nodes = match (backend, &cdev) {
        (Backend::Legacy, _) => vec![
            host.dev_vfio().join("vfio"),
            host.dev_vfio().join(group.to_string()),
        ],
        (Backend::Iommufd, Some(c)) => vec![host.dev_vfio().join("devices").join(c), host.dev_iommu()],
        (Backend::Iommufd, None) => {
            return Err(BackendError::IommufdUnavailable {
                what: name,
                reason: "it has no vfio-dev/vfioN in sysfs".into(),
            }
            .into())
        }
    };
    for node in nodes {
        if !node.exists() {
            return Err(VfioDevError::NoNode {
                node: host.display(&node).into(),
            });
        }
    }
    Ok(Resolved {
        sysfs,
        group,
        name,
        backend,
        cdev,
        reset_methods,
        mdev: matches!(target, VfioTarget::Mdev(_)),
    })
}

/// An open device and its IOMMU context (the legacy container or an iommufd IOAS); unmaps its
/// DMA mappings when dropped.
pub(crate) struct VfioSession {
    ops: Arc<dyn VfioOps>,
    device: Arc<VfioDevice>,
    mapped: Vec<(u64, u64)>,
    /// Whether the group was added to a KVM VFIO device (KVM_DEV_TYPE_VFIO).
    pub kvm_vfio_device: bool,
    pub name: String,
}

impl Drop for VfioSession {
    fn drop(&mut self) {
        for (iova, len) in self.mapped.drain(..) {
            let _ = self.ops.vfio_dma_unmap(iova, len as usize);
        }
    }
}

/// vfio-ioctls opens `/dev/vfio/...` itself: refuse any other root before opening.
pub(crate) fn check_live_root(host: &HostRoot) -> Result<(), VfioDevError> {
    if host.root() != Path::new("/") {
        return Err(VfioDevError::NotLiveRoot {
            root: host.root().to_path_buf(),
        });
    }
    Ok(())
}

/// Open a resolved target. `vm` gets a KVM VFIO device for the group when KVM offers one.
pub(crate) fn open(host: &HostRoot, r: &Resolved, vm: &VmFd) -> Result<VfioSession, VfioDevError> {
    check_live_root(host)?;
    let mut kvm_dev = kvm_bindings::kvm_create_device {
        type_: kvm_bindings::kvm_device_type_KVM_DEV_TYPE_VFIO,
        fd: 0,
        flags: 0,
    };
    let handle = vm
        .create_device(&mut kvm_dev)
        .ok()
        .map(|fd| Arc::new(VfioDeviceFd::new_from_kvm(fd)));
    let kvm_vfio_device = handle.is_some();
    let open_err = |source| VfioDevError::Open {
        what: r.name.clone(),
        source,
    };
    let (ops, device): (Arc<dyn VfioOps>, VfioDevice) = match (r.backend, &r.cdev) {
        (Backend::Iommufd, Some(cdev)) => {
            let open_rw = |node: PathBuf| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&node)
                    .map_err(|source| VfioDevError::OpenNode {
                        node: host.display(&node).into(),
                        what: r.name.clone(),
                        source,
                    })
            };
            let iommu = open_rw(host.dev_iommu())?;
            let cdev_file = open_rw(host.dev_vfio().join("devices").join(cdev))?;
            let iommufd = Arc::new(iommufd_ioctls::IommuFd::new_from_fd(iommu));
            // Allocates the IOAS; the KVM VFIO device gets the cdev (KVM_DEV_VFIO_FILE_ADD)
            // before the bind, inside new_from_fd.
            let ctx = Arc::new(VfioIommufd::new(iommufd, None, handle).map_err(open_err)?);
            let device = VfioDevice::new_from_fd(cdev_file, ctx.clone(), true).map_err(open_err)?;
            (ctx, device)
        }
        _ => {
            let container: Arc<dyn VfioOps> = Arc::new(VfioContainer::new(handle).map_err(open_err)?);
            let device = VfioDevice::new(&r.sysfs, container.clone(), false).map_err(open_err)?;
            (container, device)
        }
    };
    Ok(VfioSession {
        ops,
        device: Arc::new(device),
        mapped: Vec::new(),
        kvm_vfio_device,
        name: r.name.clone(),
    })
}

vmm_sys_util::ioctl_io_nr!(VFIO_DEVICE_GET_INFO, 0x3b, 100 + 7);
vmm_sys_util::ioctl_io_nr!(VFIO_DEVICE_RESET, 0x3b, 100 + 11);

impl VfioSession {
    /// `VFIO_DEVICE_FLAGS_RESET` of `VFIO_DEVICE_GET_INFO`: the device can be reset
    /// (vfio-ioctls keeps the flags private and its `reset()` drops the result).
    pub(crate) fn irqs(&self) -> VfioIrqs {
        VfioIrqs(self.device.clone())
    }

    pub(crate) fn can_reset(&self) -> bool {
        let mut info = vfio_device_info {
            argsz: std::mem::size_of::<vfio_device_info>() as u32,
            ..Default::default()
        };
        // SAFETY: the device fd is open while `self.device` lives; VFIO_DEVICE_GET_INFO writes
        // at most `argsz` bytes into `info`, which lives across the call.
        let ret = unsafe {
            vmm_sys_util::ioctl::ioctl_with_mut_ref(&*self.device, VFIO_DEVICE_GET_INFO(), &mut info)
        };
        ret >= 0 && info.flags & VFIO_DEVICE_FLAGS_RESET != 0
    }

    /// `VFIO_DEVICE_RESET`, with its error.
    pub(crate) fn reset(&self) -> std::io::Result<()> {
        // SAFETY: the device fd is open while `self.device` lives; VFIO_DEVICE_RESET takes no
        // argument and touches no memory of this process.
        let ret = unsafe { vmm_sys_util::ioctl::ioctl(&*self.device, VFIO_DEVICE_RESET()) };
        if ret < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Map guest RAM for device DMA at IOVA = GPA.
    pub(crate) fn dma_map(&mut self, ram: &[RamRegion]) -> Result<u64, VfioDevError> {
        let mut total = 0;
        for r in ram {
            // SAFETY: `r.host` is the start of a live guest-RAM mapping of `r.len` bytes that
            // outlives this session (boot() drops the session, which unmaps, before the
            // memory). gpupass only touches guest RAM through vm-memory's volatile accessors,
            // never through Rust references, so device DMA into it is not undefined behaviour.
            unsafe { self.ops.vfio_dma_map(r.gpa, r.len as usize, r.host) }.map_err(|source| {
                VfioDevError::DmaMap {
                    gpa: r.gpa,
                    len: r.len,
                    source,
                }
            })?;
            self.mapped.push((r.gpa, r.len));
            total += r.len;
        }
        Ok(total)
    }

    /// Describe the device for the VMM: config through the config region, BARs from region
    /// info and the BAR registers' type bits, mmappable areas mapped now.
    pub(crate) fn present(&self) -> Result<PresentedDevice, VfioDevError> {
        let dev = &self.device;
        let config = VfioConfig(dev.clone());
        let caps = walk_capabilities(&config);
        let mut bars = Vec::new();
        let mut areas = Vec::new();
        let mut maps: Vec<MmapRegion> = Vec::new();
        let mut trapped_why = Vec::new();
        let mut i = 0u32;
        while i < 6 {
            let size = dev.get_region_size(i);
            let reg = read_config(&config, 0x10 + 4 * i as u16);
            if size == 0 || !size.is_power_of_two() {
                i += 1;
                continue;
            }
            let spec = BarSpec::from_register(i as u8, reg, size);
            bars.push(spec);
            let flags = dev.get_region_flags(i);
            if spec.ty == crate::vmm::pci::BarType::Io {
                trapped_why.push((i as u8, "I/O BAR (port accesses always exit)".to_string()));
            } else if flags & VFIO_REGION_INFO_FLAG_MMAP == 0 {
                trapped_why.push((i as u8, "VFIO region is not mmappable".to_string()));
            } else {
                let mut pieces: Vec<(u64, u64)> = Vec::new();
                let caps_i = dev.get_region_caps(i);
                let sparse = caps_i.iter().find_map(|c| match c {
                    VfioRegionInfoCap::SparseMmap(s) => Some(s.areas.clone()),
                    _ => None,
                });
                match sparse {
                    Some(list) => pieces.extend(list.iter().map(|a| (a.offset, a.size))),
                    None => pieces.push((0, size)),
                }
                if let Some(m) = caps.msix {
                    let mut holes = Vec::new();
                    if m.table_bar as u32 == i {
                        holes.push((m.table_offset, m.table_size));
                    }
                    if m.pba_bar as u32 == i {
                        holes.push((m.pba_offset, m.pba_size));
                    }
                    if !holes.is_empty() {
                        trapped_why.push((i as u8, "MSI-X table/PBA pages are trapped".to_string()));
                        pieces = carve_pieces(pieces, &holes);
                    }
                }
                for (off, len) in pieces {
                    if len == 0 || len % 4096 != 0 || off % 4096 != 0 {
                        trapped_why.push((i as u8, format!("area {off:#x}+{len:#x} is not page-aligned")));
                        continue;
                    }
                    let m = self.mmap(i, off, len)?;
                    areas.push(HostArea {
                        bar: i as u8,
                        offset: off,
                        size: len,
                        host_addr: m.as_ptr() as u64,
                    });
                    maps.push(m);
                }
            }
            i += if spec.ty == crate::vmm::pci::BarType::Mem64 {
                2
            } else {
                1
            };
        }
        Ok(PresentedDevice {
            name: self.name.clone(),
            config: Box::new(config),
            bars,
            areas,
            regions: Box::new(VfioRegions(dev.clone())),
            trapped_why,
            keep: Box::new(maps),
        })
    }

    fn mmap(&self, index: u32, off: u64, len: u64) -> Result<MmapRegion, VfioDevError> {
        let err = |reason: String| VfioDevError::Mmap {
            what: self.name.clone(),
            bar: index as u8,
            reason,
        };
        // SAFETY: the device fd stays open for as long as `self.device` lives, and we only
        // borrow it here to duplicate it.
        let fd = unsafe { BorrowedFd::borrow_raw(self.device.as_raw_fd()) };
        let file = File::from(fd.try_clone_to_owned().map_err(|e| err(e.to_string()))?);
        let at = self.device.get_region_offset(index) + off;
        MmapRegion::build(
            Some(FileOffset::new(file, at)),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
        )
        .map_err(|e| err(e.to_string()))
    }
}

fn read_config(c: &VfioConfig, offset: u16) -> u32 {
    let mut b = [0u8; 4];
    c.config_read(offset, &mut b);
    u32::from_le_bytes(b)
}

/// Config space through the VFIO config region (vfio-pci virtualizes parts of it itself).
/// The device's interrupts through `VFIO_DEVICE_SET_IRQS` ([`crate::vmm::irq`]).
pub(crate) struct VfioIrqs(Arc<VfioDevice>);

/// vfio-ioctls' error with the errno the failed ioctl left (its error types drop it).
fn irq_err(e: vfio_ioctls::VfioError) -> crate::vmm::irq::IrqError {
    crate::vmm::irq::IrqError::Vfio {
        vfio: e,
        errno: std::io::Error::last_os_error(),
    }
}

impl crate::vmm::irq::DeviceIrqs for VfioIrqs {
    fn count(&self, index: u32) -> u32 {
        self.0.get_irq_info(index).map_or(0, |i| i.count)
    }

    fn set(
        &mut self,
        index: u32,
        fds: &[&vmm_sys_util::eventfd::EventFd],
    ) -> Result<(), crate::vmm::irq::IrqError> {
        if fds.is_empty() {
            self.0.disable_irq(index).map_err(irq_err)
        } else {
            self.0.enable_irq(index, fds.to_vec()).map_err(irq_err)
        }
    }

    fn set_unmask(&mut self, fd: &vmm_sys_util::eventfd::EventFd) -> Result<(), crate::vmm::irq::IrqError> {
        self.0
            .set_irq_resample_fd(crate::vmm::irq::INDEX_INTX, vec![fd])
            .map_err(irq_err)
    }

    fn trigger(&mut self, index: u32, vector: u32) -> Result<(), crate::vmm::irq::IrqError> {
        self.0.trigger_irq(index, vector).map_err(irq_err)
    }

    fn trigger_name(&self) -> &'static str {
        "vfio-trigger"
    }
}

struct VfioConfig(Arc<VfioDevice>);

impl ConfigBackend for VfioConfig {
    fn config_read(&self, offset: u16, data: &mut [u8]) {
        data.fill(0xff);
        self.0
            .region_read(VFIO_PCI_CONFIG_REGION_INDEX, data, u64::from(offset));
    }

    fn config_write(&mut self, offset: u16, data: &[u8]) {
        self.0
            .region_write(VFIO_PCI_CONFIG_REGION_INDEX, data, u64::from(offset));
    }
}

/// Trapped BAR accesses as VFIO region pread/pwrite.
struct VfioRegions(Arc<VfioDevice>);

impl BarRegions for VfioRegions {
    fn read(&mut self, bar: u8, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        self.0.region_read(u32::from(bar), data, offset);
    }

    fn write(&mut self, bar: u8, offset: u64, data: &[u8]) {
        self.0.region_write(u32::from(bar), data, offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids() {
        assert_eq!(
            parse_uuid("2F3E4D5C-6B7A-4988-8776-655443322110").unwrap(),
            "2f3e4d5c-6b7a-4988-8776-655443322110"
        );
        for bad in [
            "",
            "2f3e4d5c",
            "2f3e4d5c-6b7a-4988-8776-65544332211",
            "../../etc-6b7a-4988-8776-655443322110",
            "2f3e4d5c-6b7a-4988-8776-65544332211g",
        ] {
            assert!(parse_uuid(bad).unwrap_err().is_usage(), "{bad}");
        }
    }
}
