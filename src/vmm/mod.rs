//! `gpupass boot`: a minimal KVM VMM that boots gpupass's own firmware with one PCI device —
//! a VFIO-assigned function or mdev, or a small emulated display — and reports what the
//! firmware found (docs/vmm.md).
//!
//! One vCPU, RAM at GPA 0 (vm-memory), a PCI host bridge with config mechanism #1, the
//! device at 00:01.0 with its BARs virtualized ([`pci`]); mmappable BAR areas become KVM
//! memory slots that follow the BAR when the guest moves it, the rest is trapped and forwarded
//! ([`bars`]); COM1 goes to stdout ([`serial`]); port 0x501 ends the VM with a status
//! ([`vcpu`]). For VFIO devices all guest RAM is DMA-mapped (IOVA = GPA) first.
//!
//! The VMM does not depend on the CLI: `cli.rs` builds [`BootOptions`] and calls [`boot`].

pub mod bars;
pub mod dma;
pub mod emulated;
pub mod floor;
pub mod irq;
pub mod kmsg;
pub mod kvmstats;
pub mod memory;
pub mod pci;
/// The firmware interface (layout, ports, marks, boot info): the one source build.rs writes
/// the firmware's `protocol.h` from.
pub mod protocol;
pub mod report;
pub mod reset;
pub mod serial;
pub mod vcpu;
pub mod verdict;
pub mod vfio;

use crate::host::HostRoot;
use crate::model::Inventory;
use bars::SlotOps;
use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VmFd};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vfio::{VfioDevError, VfioTarget};

/// The default firmware, built from `firmware/` by build.rs.
pub(crate) static FIRMWARE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/firmware.bin"));

#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error(
        "{} is not a character device (is --root a snapshot or fixture tree? KVM needs the live host)", .path.display()
    )]
    KvmNotDevice { path: PathBuf },
    #[error("{} does not exist: KVM is not available here; load it (`modprobe kvm_intel` or `modprobe kvm_amd`), enable VT-x/AMD-V in the firmware setup, or use a VM with nested virtualization", .path.display())]
    KvmMissing { path: PathBuf },
    #[error("permission denied opening {}: run as root, or add your user to the `kvm` group (`usermod -aG kvm $USER`, then log in again)", .path.display())]
    KvmPermission { path: PathBuf },
    #[error("cannot open {}", .path.display())]
    KvmOpen {
        path: PathBuf,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("KVM {what} failed")]
    Kvm {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("{0}")]
    Memory(String),
    /// A guest-memory operation failed: what gpupass was doing, vm-memory's error as the source.
    #[error("{what}")]
    GuestMemory {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("firmware is {size} bytes; it must be 1 to {max} bytes (it is loaded at 0x1000 and must end below 0x80000)")]
    FirmwareSize { size: u64, max: u64 },
    #[error("cannot read firmware {}", .path.display())]
    FirmwareRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    MemorySize(String),
    #[error(transparent)]
    Vfio(#[from] VfioDevError),
    #[error("cannot map BAR{bar} at guest address {gpa:#x} as a KVM memory slot")]
    Slot {
        bar: u8,
        gpa: u64,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("the guest did not finish within {secs} s (timeout; raise it with --timeout); vCPU registers:\n{regs}")]
    Timeout { secs: f64, regs: String },
    #[error("the guest triple-faulted (KVM_EXIT_SHUTDOWN); vCPU registers:\n{regs}")]
    TripleFault { regs: String },
    #[error("KVM could not run the guest (KVM_EXIT_INTERNAL_ERROR: an instruction it could not emulate or an event it could not deliver; kvm_pvm reports a triple fault this way); vCPU registers:\n{regs}")]
    InternalError { regs: String },
    #[error("the guest halted (HLT) without writing a status to port 0x501; vCPU registers:\n{regs}")]
    Halted { regs: String },
    #[error("unexpected VM exit {exit}; vCPU registers:\n{regs}")]
    UnexpectedExit { exit: String, regs: String },
    #[error("KVM_RUN failed; vCPU registers:\n{regs}")]
    Run {
        #[source]
        source: kvm_ioctls::Error,
        regs: String,
    },
}

impl VmmError {
    /// Errors in what the user asked for (exit status 2) rather than in the host.
    pub(crate) fn is_usage(&self) -> bool {
        match self {
            VmmError::FirmwareSize { .. } | VmmError::MemorySize(_) => true,
            VmmError::Vfio(e) => e.is_usage(),
            _ => false,
        }
    }
}

/// What `gpupass boot` presents to the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Emulated,
    Vfio(VfioTarget),
}

#[derive(Debug, Clone)]
pub(crate) struct BootOptions {
    pub target: Target,
    /// Guest RAM in bytes ([`memory::parse_memory_size`]).
    pub memory: u64,
    /// Firmware file; `None`: the built-in [`FIRMWARE`].
    pub firmware: Option<PathBuf>,
    pub timeout: Duration,
    /// Reads the firmware's loop makes after enumeration (0: none).
    pub read_loop: u32,
    /// BAR the loop reads; `None`: the firmware picks (BAR2 of a Bochs display, else the
    /// first memory BAR).
    pub read_bar: Option<u8>,
    /// `--backend`: the VFIO backend a device is opened through (docs/iommufd.md).
    pub backend: crate::inventory::backend::Policy,
    /// MSI round trips the firmware times after its interrupt tests (0: none).
    pub irq_loop: u32,
    /// How MSI reaches the vCPU ([`irq::IrqPath`]).
    pub irq_path: irq::IrqPath,
    /// Create the in-kernel irqchip and run the interrupt tests (`--check`, `--irq-loop`). A
    /// plain `boot` does without (docs/performance.md: `--check` costs 3.3 ms more).
    pub interrupts: bool,
}

impl Default for BootOptions {
    fn default() -> Self {
        BootOptions {
            target: Target::Emulated,
            memory: memory::DEFAULT_MEMORY,
            firmware: None,
            timeout: Duration::from_secs(10),
            read_loop: 0,
            read_bar: None,
            backend: crate::inventory::backend::Policy::Auto,
            irq_loop: 0,
            irq_path: irq::IrqPath::Irqfd,
            interrupts: true,
        }
    }
}

/// The 64-bit MMIO window announced to the firmware, inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Mmio64Window {
    pub base: u64,
    pub limit: u64,
}

/// A seed for the firmware's DMA pattern that differs from run to run (the clock's
/// nanoseconds, never 0).
fn dma_seed() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.subsec_nanos() ^ (t.as_secs() as u32).rotate_left(16)) | 1
}

/// The guest physical address width in a CPUID list: leaf 0x80000008 EAX[7:0], or 36 (what
/// KVM assumes) when the leaf is missing.
pub(crate) fn cpu_phys_bits(entries: &[kvm_bindings::kvm_cpuid_entry2]) -> u32 {
    entries
        .iter()
        .find(|e| e.function == 0x8000_0008 && e.index == 0)
        .map(|e| e.eax & 0xff)
        .filter(|&b| b > 0)
        .unwrap_or(36)
}

/// Set to N (32-52) to give the firmware the 64-bit window of an N-bit guest address width
/// (CPUID unchanged): the failing case of `boot --check`'s `bars` verdict, a BAR too large for
/// the window. Honoured only by a `testkit` build.
pub(crate) const PHYS_BITS_ENV: &str = "GPUPASS_BOOT_PHYS_BITS";

fn phys_bits_override() -> Option<u32> {
    if !cfg!(feature = "testkit") {
        return None;
    }
    let v: u32 = std::env::var(PHYS_BITS_ENV).ok()?.parse().ok()?;
    (32..=52).contains(&v).then_some(v)
}

/// A trapped BAR and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct TrappedBar {
    pub bar: u8,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Timing {
    /// Open KVM (and VFIO), allocate and map RAM, load firmware.
    pub setup_us: u64,
    /// First KVM_RUN to the exit-port write.
    pub run_us: u64,
    /// Whole `boot()`.
    pub total_us: u64,
}

/// `--irq-loop`: N MSI round trips (raise, deliver, EOI) timed between the firmware's marks.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct IrqLoopReport {
    pub path: irq::IrqPath,
    /// `device` (edu raised it) or `host` (VFIO's software trigger / the emulated device).
    pub via: Option<String>,
    pub count: u32,
    pub delivered: u32,
    pub nanos: u64,
    pub per_second: f64,
    /// Messages the userspace path injected with `KVM_SIGNAL_MSI` over the whole run.
    pub userspace_injections: u64,
    pub userspace_errors: Vec<String>,
    pub window: vcpu::LoopWindow,
}

/// The `--json` result of `gpupass boot`.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct BootReport {
    pub device: String,
    /// Vendor:device IDs the VMM presents at 00:01.0 (read from the device's config space).
    pub presented_ids: String,
    /// The firmware's exit status (also gpupass's).
    pub status: u8,
    pub memory: u64,
    /// Guest physical address width the vCPU's CPUID reports (0x80000008 EAX[7:0]).
    pub guest_phys_bits: u32,
    /// Where the firmware may place 64-bit BARs (above 4 GiB); `None` without room there.
    pub mmio64_window: Option<Mmio64Window>,
    /// Bytes of guest RAM DMA-mapped through the VFIO container (0 for --emulated).
    pub dma_mapped: u64,
    /// Guest RAM was deliberately not DMA-mapped ([`dma::NO_DMA_MAP_ENV`]).
    pub dma_map_skipped: bool,
    /// The firmware's DMA test (QEMU's edu only; none for other devices).
    pub dma: Option<dma::DmaReport>,
    /// Its read from an IOVA outside the DMA-mapped RAM.
    pub isolation: Option<dma::IsolationReport>,
    /// The kernel's IOMMU fault lines logged during the run (`/dev/kmsg`; VFIO targets only).
    pub kernel_faults: Option<kmsg::KernelFaults>,
    /// `VFIO_DEVICE_RESET` before and after the run (none for --emulated).
    pub reset: Option<reset::ResetReport>,
    /// The interrupt layer: irqchip, what the device offers, what was enabled, failures.
    pub irq: irq::IrqReport,
    /// The presented function's Command register, Bus Master Enable probed before the run
    /// ([`pci::probe_bus_master`]): whether the function can initiate DMA at all (`--check`'s
    /// evidence for `dma`/`isolation` `absent`). `None` when no function was presented.
    pub bus_master: Option<pci::BusMaster>,
    /// KVM's counters over the firmware's interrupt tests (`irq_injections`, `halt_wakeup`).
    pub irq_kvm: Option<kvmstats::KvmCounts>,
    /// The MSI round-trip loop (`--irq-loop`): how MSI was delivered, round trips per second,
    /// exits and KVM's counters over it.
    pub irq_loop: Option<IrqLoopReport>,
    pub kvm_vfio_device: bool,
    /// The VFIO backend the device was opened through (`legacy` or `iommufd`; none for
    /// --emulated) and the nodes it opened.
    pub backend: Option<crate::model::Backend>,
    pub vfio_nodes: Vec<String>,
    pub firmware: report::FirmwareReport,
    /// BAR areas mapped as KVM memory slots, where they ended up.
    pub slots: Vec<bars::SlotState>,
    pub trapped: Vec<TrappedBar>,
    /// Slot moves done because the guest assigned or moved a BAR.
    pub slot_moves: u64,
    pub exits: vcpu::ExitCounts,
    /// KVM's own counters from the first `KVM_RUN` to the exit-port write (`KVM_GET_STATS_FD`;
    /// absent on kernels before 5.14). Unlike `exits`, they count the exits KVM handles itself.
    pub kvm_exits: Option<kvmstats::KvmCounts>,
    /// Exits between the firmware's loop marks, and how long the loop took.
    pub read_loop: Option<vcpu::LoopWindow>,
    pub timing: Timing,
    pub console: Vec<String>,
    pub console_truncated: bool,
}

struct KvmSlots<'a>(&'a VmFd);

impl SlotOps for KvmSlots<'_> {
    fn set_slot(&mut self, slot: u32, gpa: u64, size: u64, host_addr: u64) -> Result<(), kvm_ioctls::Error> {
        let region = kvm_userspace_memory_region {
            slot,
            guest_phys_addr: gpa,
            memory_size: size,
            userspace_addr: host_addr,
            flags: 0,
        };
        // SAFETY: `host_addr..host_addr+size` is a BAR mapping (VFIO mmap or emulated RAM)
        // owned by the presented device, which boot() keeps alive until Machine::teardown has
        // removed every slot; size 0 removes the slot.
        unsafe { self.0.set_user_memory_region(region) }
    }
}

/// Open `<root>/dev/kvm` with errors that say how to fix them.
pub(crate) fn open_kvm(host: &HostRoot) -> Result<Kvm, VmmError> {
    let path = host.dev_kvm();
    let shown = PathBuf::from(host.display(&path));
    match std::fs::metadata(&path) {
        Err(_) => return Err(VmmError::KvmMissing { path: shown }),
        Ok(m) if !std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type()) => {
            return Err(VmmError::KvmNotDevice { path: shown })
        }
        Ok(_) => {}
    }
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| VmmError::KvmMissing { path: shown.clone() })?;
    Kvm::new_with_path(&c).map_err(|e| open_error(e, shown))
}

/// The error for a failed open of `/dev/kvm`, by errno.
fn open_error(e: kvm_ioctls::Error, path: PathBuf) -> VmmError {
    match e.errno() {
        libc::EACCES | libc::EPERM => VmmError::KvmPermission { path },
        libc::ENOENT | libc::ENXIO | libc::ENODEV => VmmError::KvmMissing { path },
        _ => VmmError::KvmOpen { path, source: e },
    }
}

fn kvm_err(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> VmmError {
    move |source| VmmError::Kvm { what, source }
}

/// Boot the firmware with the target device. `inv` is needed for VFIO targets (group
/// viability); `console` receives the guest's serial output as it is written.
pub(crate) fn boot(
    host: &HostRoot,
    inv: Option<&Inventory>,
    opts: &BootOptions,
    console: Option<&mut dyn Write>,
) -> Result<BootReport, VmmError> {
    let t0 = Instant::now();
    let firmware: std::borrow::Cow<[u8]> = match &opts.firmware {
        Some(p) => {
            let meta = std::fs::metadata(p).map_err(|source| VmmError::FirmwareRead {
                path: p.clone(),
                source,
            })?;
            memory::check_firmware(meta.len().min(usize::MAX as u64) as usize)?;
            std::fs::read(p)
                .map_err(|source| VmmError::FirmwareRead {
                    path: p.clone(),
                    source,
                })?
                .into()
        }
        None => FIRMWARE.into(),
    };
    memory::check_firmware(firmware.len())?;
    if !(memory::MIN_MEMORY..=memory::MAX_MEMORY).contains(&opts.memory) || opts.memory % 4096 != 0 {
        return Err(VmmError::MemorySize(format!(
            "invalid memory size {}: must be a multiple of 4K between 1M and 3G",
            opts.memory
        )));
    }
    // Check the device before touching KVM: these errors are the common ones.
    let resolved = match &opts.target {
        Target::Emulated => None,
        Target::Vfio(t) => {
            let inv =
                inv.ok_or_else(|| VmmError::Memory("internal: VFIO boot without an inventory".into()))?;
            let r = vfio::resolve(host, inv, t, opts.backend)?;
            vfio::check_live_root(host)?;
            Some(r)
        }
    };

    // The userspace MSI path's injector (`--irq-path userspace`; idle otherwise). Declared
    // before the machine, which lends it to the interrupt layer.
    let injector = irq::Injector::default();
    // Declared first so it is dropped last: KVM slots and DMA maps point into it.
    let mem = memory::create(opts.memory)?;
    let kvm = open_kvm(host)?;
    // The vCPU gets KVM's supported CPUID (long mode needs CPUID.LM for EFER.LME); its
    // address width bounds the 64-bit MMIO window the firmware is given.
    let cpuid = kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_err("get supported CPUID"))?;
    let phys_bits = phys_bits_override().unwrap_or_else(|| cpu_phys_bits(cpuid.as_slice()));
    let ram = memory::regions(&mem)?;

    let vm = kvm.create_vm().map_err(kvm_err("create VM"))?;
    for (i, r) in ram.iter().enumerate() {
        let region = kvm_userspace_memory_region {
            slot: i as u32,
            guest_phys_addr: r.gpa,
            memory_size: r.len,
            userspace_addr: r.host as u64,
            flags: 0,
        };
        // SAFETY: the region is guest RAM owned by `mem`, which outlives `vm` (declared
        // before it, so dropped after it).
        unsafe { vm.set_user_memory_region(region) }.map_err(kvm_err("set guest RAM slot"))?;
    }
    // The in-kernel irqchip (LAPIC, IOAPIC, PIC) before any vCPU, after the RAM slot (on kvm_pvm a RAM slot
    // registered with the irqchip present took 5-11 ms instead of <0.5 ms); device interrupts reach
    // it through irqfds (irq.rs).
    let irqchip = if !opts.interrupts {
        Err(irq::NOT_REQUESTED.to_string())
    } else if !kvm.check_extension(kvm_ioctls::Cap::Irqfd) {
        Err("KVM lacks KVM_CAP_IRQFD".to_string())
    } else if !kvm.check_extension(kvm_ioctls::Cap::IrqRouting) {
        Err("KVM lacks KVM_CAP_IRQ_ROUTING".to_string())
    } else {
        vm.create_irq_chip()
            .map_err(|e| format!("KVM_CREATE_IRQCHIP failed: {e}"))
    };

    let mut session = None;
    let mut dma_mapped = 0;
    let skip_dma_map = resolved.is_some() && dma::skip_map();
    let mut dma_ranges: Vec<(u64, u64)> = ram.iter().map(|r| (r.gpa, r.len)).collect();
    let mut reset = None;
    let dev = match &resolved {
        None => emulated::device()?,
        Some(r) => {
            let s = session.insert(vfio::open(host, r, &vm)?);
            let mut rr = reset::ResetReport::new(s.can_reset(), r.reset_methods.clone(), r.mdev);
            if rr.wanted() {
                rr.before = Some(reset::attempt(|| s.reset()));
            }
            reset = Some(rr);
            if skip_dma_map {
                dma_ranges.clear();
            } else {
                dma_mapped = s.dma_map(&ram)?;
            }
            s.present()?
        }
    };
    let (parts, rest) = dev.split();

    let vcpu_fd = vm.create_vcpu(0).map_err(kvm_err("create vCPU"))?;
    vcpu_fd.set_cpuid2(&cpuid).map_err(kvm_err("set CPUID"))?;
    let mut sregs = vcpu_fd.get_sregs().map_err(kvm_err("get special registers"))?;
    // Real mode, CS base 0: the firmware starts at 0:0x1000 and switches to protected mode.
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu_fd
        .set_sregs(&sregs)
        .map_err(kvm_err("set special registers"))?;
    let mut regs = vcpu_fd.get_regs().map_err(kvm_err("get registers"))?;
    regs.rip = memory::FIRMWARE_LOAD;
    regs.rflags = 0x2;
    vcpu_fd.set_regs(&regs).map_err(kvm_err("set registers"))?;
    let stats = kvmstats::StatsReader::open(&vcpu_fd);
    let mut vcpu = vcpu::KvmVcpu(vcpu_fd);

    let setup = t0.elapsed();
    let mut m = vcpu::Machine::new(
        parts,
        opts.memory,
        ram.len() as u32,
        Box::new(KvmSlots(&vm)),
        serial::Serial::new(console.map(|c| {
            // Shorten the trait object's lifetime to the machine's.
            let c: &mut dyn Write = c;
            c
        })),
    );
    m.kvm_stats = stats;
    m.guest_mem = Some(&mem);
    // Before the guest runs (the function was just reset): can it master DMA at all?
    let bus_master = m.bus.function_mut(vcpu::DEVICE_SLOT).map(pci::probe_bus_master);
    let (pin, msi_capability, msix_capability, presented_ids) = match m.bus.function(vcpu::DEVICE_SLOT) {
        Some(f) => {
            let id = f.read(0, 4);
            (
                f.interrupt_pin(),
                f.msi_cap().is_some(),
                f.msix().is_some(),
                format!("{:04x}:{:04x}", id & 0xffff, id >> 16),
            )
        }
        None => (0, false, false, String::new()),
    };
    let irq_unavailable = match irqchip {
        Ok(()) => {
            let f = m.bus.function(vcpu::DEVICE_SLOT);
            let pin = f.map_or(0, |f| f.interrupt_pin());
            let msix = f.and_then(|f| f.msix());
            let dev: Box<dyn irq::DeviceIrqs> = match &session {
                Some(s) => Box::new(s.irqs()),
                None => Box::new(irq::EmulatedIrqs::default()),
            };
            let kvm_side = irq::KvmRouting {
                vm: &vm,
                skip_irqfd: irq::skip_irqfd(),
                injector: (opts.irq_path == irq::IrqPath::Userspace).then_some(&injector),
            };
            m.irq = Some(irq::Interrupts::new(Box::new(kvm_side), dev, pin, msix));
            None
        }
        Err(why) => Some(irq::Interrupts::unavailable(why)),
    };
    let (irq_flags, msix_entries) = match &m.irq {
        Some(i) => {
            let mut f = protocol::IRQ_F_IRQCHIP | protocol::IRQ_F_REQUESTED;
            for (index, flag) in [
                (irq::INDEX_INTX, protocol::IRQ_F_INTX),
                (irq::INDEX_MSI, protocol::IRQ_F_MSI),
                (irq::INDEX_MSIX, protocol::IRQ_F_MSIX),
            ] {
                if i.offers(index) {
                    f |= flag;
                }
            }
            (f, i.msix_entries())
        }
        // Asked for but without an irqchip: the firmware says so.
        None if opts.interrupts => (protocol::IRQ_F_REQUESTED, 0),
        None => (0, 0),
    };
    memory::load(
        &mem,
        &firmware,
        memory::BootInfo {
            ram_size: opts.memory as u32,
            loop_count: opts.read_loop,
            loop_bar: opts.read_bar.map_or(protocol::LOOP_BAR_AUTO, u32::from),
            phys_bits,
            dma_seed: dma_seed(),
            irq_flags,
            msix_entries,
            irq_loop: opts.irq_loop,
        },
    )?;
    // The kernel log from here on: the IOMMU's fault lines for the run (VFIO targets).
    let kmsg_cursor = resolved
        .as_ref()
        .map(|_| kmsg::Cursor::open(&host.path("dev/kmsg")));
    let kvm_before = m.kvm_stats.as_ref().map(|k| k.read());
    let t_run = Instant::now();
    let result = std::thread::scope(|sc| {
        if opts.irq_path == irq::IrqPath::Userspace {
            sc.spawn(|| injector.run(&vm));
        }
        let r = vcpu::run_with_timeout(&mut vcpu, &mut m, opts.timeout);
        injector.stop();
        r
    });
    let run = t_run.elapsed();
    let kvm_exits = match (&m.kvm_stats, kvm_before) {
        (Some(k), Some(b)) => Some(kvmstats::delta(&b, &k.read())),
        _ => None,
    };
    let slots = m.mapper.slots();
    let dma_nanos = m.mark_window(vcpu::MARK_DMA_BEGIN, vcpu::MARK_DMA_END);
    let iso_nanos = m.mark_window(vcpu::MARK_ISO_BEGIN, vcpu::MARK_ISO_END);
    m.teardown();
    let mut irq_report = match m.irq.take() {
        Some(i) => i.report,
        None => irq_unavailable.unwrap_or_default(),
    };
    irq_report.pin = pin;
    irq_report.msi_capability = msi_capability;
    irq_report.msix_capability = msix_capability;
    let irq_kvm = m.irq_kvm.take();
    let irq_loop_window = m.irq_loop_window.take();
    let kvm_vfio_device = session.as_ref().is_some_and(|s| s.kvm_vfio_device);
    drop(rest.keep);
    // Reset again once the BARs are unmapped (the guest's state must not reach the next user),
    // even when the run failed.
    if let (Some(rr), Some(s)) = (reset.as_mut(), session.as_ref()) {
        if rr.wanted() {
            rr.after = Some(reset::attempt(|| s.reset()));
        }
    }
    drop(session);
    let status = result?;

    let text = String::from_utf8_lossy(m.serial.transcript()).into_owned();
    let fw = report::parse(&text);
    let kernel_faults = kmsg_cursor.map(|c| match c {
        Ok(c) => c.faults(),
        Err(error) => kmsg::KernelFaults {
            source: host.display(&host.path("dev/kmsg")),
            error: Some(crate::model::ErrorChain(&error).to_string()),
            ..kmsg::KernelFaults::default()
        },
    });
    let host_bdf = resolved.as_ref().filter(|r| !r.mdev).map(|r| r.name.as_str());
    let dma_report = fw
        .dma
        .as_ref()
        .and_then(|d| dma::judge_dma(d, dma_mapped, skip_dma_map, dma_nanos));
    let isolation = fw
        .isolation
        .as_ref()
        .and_then(|i| dma::judge_isolation(i, &dma_ranges, iso_nanos, kernel_faults.as_ref(), host_bdf));
    let trapped = rest
        .trapped_why
        .into_iter()
        .map(|(bar, reason)| TrappedBar { bar, reason })
        .collect();
    Ok(BootReport {
        device: rest.name,
        presented_ids,
        status,
        memory: opts.memory,
        guest_phys_bits: phys_bits,
        mmio64_window: memory::mmio64_window(phys_bits).map(|(base, limit)| Mmio64Window { base, limit }),
        dma_mapped,
        dma_map_skipped: skip_dma_map,
        dma: dma_report,
        isolation,
        kernel_faults,
        reset,
        irq: irq_report,
        bus_master,
        irq_kvm,
        irq_loop: match (fw.irq_loop.as_ref(), irq_loop_window) {
            (Some(l), Some(w)) => Some(IrqLoopReport {
                path: opts.irq_path,
                via: l.via.clone(),
                count: l.count,
                delivered: l.delivered,
                nanos: w.nanos,
                per_second: if w.nanos > 0 {
                    f64::from(l.delivered) * 1e9 / w.nanos as f64
                } else {
                    0.0
                },
                userspace_injections: injector.injected.load(std::sync::atomic::Ordering::Relaxed),
                userspace_errors: injector.errors.lock().map(|e| e.clone()).unwrap_or_default(),
                window: w,
            }),
            _ => None,
        },
        kvm_vfio_device,
        backend: resolved.as_ref().map(|r| r.backend),
        vfio_nodes: resolved.as_ref().map(|r| r.nodes()).unwrap_or_default(),
        firmware: fw,
        slots,
        trapped,
        slot_moves: m.mapper.moves,
        exits: m.exits.clone(),
        kvm_exits,
        read_loop: m.loop_window.clone(),
        timing: Timing {
            setup_us: setup.as_micros() as u64,
            run_us: run.as_micros() as u64,
            total_us: t0.elapsed().as_micros() as u64,
        },
        console: text.lines().map(str::to_string).collect(),
        console_truncated: m.serial.truncated(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_open_errors_name_the_fix() {
        let e = open_error(kvm_ioctls::Error::new(libc::EACCES), "/dev/kvm".into());
        assert!(e.to_string().contains("usermod -aG kvm"), "{e}");
        let e = open_error(kvm_ioctls::Error::new(libc::ENXIO), "/dev/kvm".into());
        assert!(e.to_string().contains("modprobe kvm_intel"), "{e}");
        assert!(!VmmError::KvmPermission { path: PathBuf::new() }.is_usage());
        assert!(VmmError::FirmwareSize { size: 0, max: 1 }.is_usage());
    }

    #[test]
    fn phys_bits_come_from_leaf_0x80000008() {
        let leaf = |function, eax| kvm_bindings::kvm_cpuid_entry2 {
            function,
            eax,
            ..Default::default()
        };
        assert_eq!(cpu_phys_bits(&[leaf(0, 0xd), leaf(0x8000_0008, 0x3028)]), 40);
        assert_eq!(cpu_phys_bits(&[leaf(0, 0xd)]), 36);
    }
}
