//! The vCPU run loop and the dispatch of its exits to the machine's devices.
//!
//! The syscall layer is the [`Vcpu`] trait: [`KvmVcpu`] calls `KVM_RUN` through kvm-ioctls;
//! the unit tests below script exits with a fake and run the real dispatch.
//!
//! Port map (the protocol the firmware speaks; src/vmm/protocol.rs, docs/vmm.md):
//! - 0x3F8-0x3FF COM1 (output to gpupass's stdout)
//! - 0x501 exit: an 8-bit write ends the VM; the byte is gpupass's exit status
//! - 0x502 mark: a 32-bit write of 1 / 2 brackets the firmware's read loop, whose exits
//!   are reported apart; 3 / 4 and 5 / 6 bracket its DMA test's transfers (timed); 7 / 8 its
//!   interrupt tests (KVM's counters are read at both)
//! - 0x504 log: a 32-bit write of N hands over N console bytes at `FW_LOG_BUF` in guest RAM
//!   (the firmware's lines, one exit each instead of one per byte)
//! - 0x503 irq: a 32-bit write of `(index << 16) | vector` asks for that interrupt to be
//!   raised from the host side ([`super::irq::Interrupts::request`])
//! - 0xCF8-0xCFF PCI configuration mechanism #1; MMIO `ECAM_BASE` + 1 MiB the same registers
//!   through PCIe ECAM (one exit per access)
//! - I/O BAR windows the guest assigned; anything else reads all-ones and ignores writes.

use super::bars::{BarMapper, Hit, PresentedDevice, SlotOps};
use super::pci::{self, PciBus, VirtFunction};
use super::serial::Serial;
use super::VmmError;
use kvm_ioctls::{VcpuExit, VcpuFd};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use super::protocol::{
    MARK_DMA_BEGIN, MARK_DMA_END, MARK_IRQLOOP_BEGIN, MARK_IRQLOOP_END, MARK_IRQ_BEGIN, MARK_IRQ_END,
    MARK_ISO_BEGIN, MARK_ISO_END, MARK_LOOP_BEGIN, MARK_LOOP_END, PORT_EXIT, PORT_IRQ, PORT_LOG, PORT_MARK,
};
/// The presented device's slot on bus 0 (00:01.0); the host bridge is 00:00.0.
pub(crate) const DEVICE_SLOT: u8 = 1;

/// The syscall layer of one vCPU.
pub(crate) trait Vcpu {
    /// Enter the guest until the next exit (`KVM_RUN`).
    fn run(&mut self) -> Result<VcpuExit<'_>, kvm_ioctls::Error>;
    /// The registers, formatted for an error message.
    fn dump(&self) -> String;
    /// Whether the vCPU sits in HLT (`KVM_GET_MP_STATE`): with an in-kernel irqchip KVM keeps a
    /// halted vCPU in the kernel, so a halt shows only when the run is stopped.
    fn halted(&self) -> bool {
        false
    }
}

/// A real KVM vCPU.
pub(crate) struct KvmVcpu(pub VcpuFd);

impl Vcpu for KvmVcpu {
    fn run(&mut self) -> Result<VcpuExit<'_>, kvm_ioctls::Error> {
        self.0.run()
    }

    fn halted(&self) -> bool {
        self.0
            .get_mp_state()
            .is_ok_and(|m| m.mp_state == kvm_bindings::KVM_MP_STATE_HALTED)
    }

    fn dump(&self) -> String {
        let regs = match self.0.get_regs() {
            Ok(r) => r,
            Err(e) => return format!("  (registers unavailable: {e})"),
        };
        let mut s = format!(
            "  rip={:#010x} rsp={:#010x} rflags={:#x}\n  rax={:#x} rbx={:#x} rcx={:#x} rdx={:#x} rsi={:#x} rdi={:#x} rbp={:#x}",
            regs.rip, regs.rsp, regs.rflags, regs.rax, regs.rbx, regs.rcx, regs.rdx, regs.rsi, regs.rdi, regs.rbp
        );
        if let Ok(sr) = self.0.get_sregs() {
            s.push_str(&format!(
                "\n  cr0={:#x} cr3={:#x} cr4={:#x} efer={:#x} cs={:#06x} (base {:#x}) ds={:#06x} ss={:#06x}",
                sr.cr0, sr.cr3, sr.cr4, sr.efer, sr.cs.selector, sr.cs.base, sr.ds.selector, sr.ss.selector
            ));
        }
        s
    }
}

/// Counts of VM exits (returns from `KVM_RUN` to gpupass), by what they hit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct ExitCounts {
    pub total: u64,
    pub by_kind: BTreeMap<&'static str, u64>,
}

impl ExitCounts {
    fn count(&mut self, kind: &'static str) {
        self.total += 1;
        *self.by_kind.entry(kind).or_insert(0) += 1;
    }

    /// Exits in `self` that are not in `earlier`.
    pub(crate) fn since(&self, earlier: &ExitCounts) -> ExitCounts {
        let mut by_kind = BTreeMap::new();
        for (k, v) in &self.by_kind {
            let d = v - earlier.by_kind.get(k).copied().unwrap_or(0);
            if d > 0 {
                by_kind.insert(*k, d);
            }
        }
        ExitCounts {
            total: self.total - earlier.total,
            by_kind,
        }
    }
}

/// The firmware's read loop as the VMM saw it (between the two marks).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct LoopWindow {
    pub exits: ExitCounts,
    pub nanos: u64,
    /// KVM's own counters over the same window (`None` without `KVM_GET_STATS_FD`). They are
    /// read while the marks' exits are handled, so they include the end mark's own I/O exit.
    pub kvm: Option<super::kvmstats::KvmCounts>,
}

/// Exits, time and KVM's counters when a measured window began.
type WindowStart = (ExitCounts, Instant, Option<super::kvmstats::Snapshot>);

/// What continues after an exit.
enum Flow {
    Continue,
    Exit(u8),
}

/// The parts of a [`PresentedDevice`] the machine takes over (its mappings' owner stays
/// with the caller, to outlive the slots).
pub(crate) struct DeviceParts {
    pub config: Box<dyn pci::ConfigBackend>,
    pub bars: Vec<pci::BarSpec>,
    pub areas: Vec<super::bars::HostArea>,
    pub regions: Box<dyn super::bars::BarRegions>,
}

/// What the caller keeps of a [`PresentedDevice`]: its name, why BARs are trapped, and the
/// owner of its host mappings (dropped only after the slots are gone).
pub(crate) struct DeviceRest {
    pub name: String,
    pub trapped_why: Vec<(u8, String)>,
    pub keep: Box<dyn std::any::Any + Send>,
}

impl PresentedDevice {
    /// Split into what the machine takes and what the caller keeps.
    pub(crate) fn split(self) -> (DeviceParts, DeviceRest) {
        (
            DeviceParts {
                config: self.config,
                bars: self.bars,
                areas: self.areas,
                regions: self.regions,
            },
            DeviceRest {
                name: self.name,
                trapped_why: self.trapped_why,
                keep: self.keep,
            },
        )
    }
}

/// The devices behind the vCPU: serial, PCI bus, BAR windows, control ports.
pub(crate) struct Machine<'a> {
    pub serial: Serial<'a>,
    pub bus: PciBus,
    pub mapper: BarMapper,
    pub regions: Box<dyn super::bars::BarRegions>,
    pub slots: Box<dyn SlotOps + 'a>,
    pub exits: ExitCounts,
    loop_begin: Option<WindowStart>,
    pub loop_window: Option<LoopWindow>,
    /// Every mark the firmware wrote, with when it arrived (the DMA test is timed from them).
    pub marks: Vec<(u32, Instant)>,
    /// KVM's statistics of the vCPU, where the kernel offers them.
    pub kvm_stats: Option<super::kvmstats::StatsReader>,
    /// The device's interrupts (none without an in-kernel irqchip).
    pub irq: Option<super::irq::Interrupts<'a>>,
    /// Guest RAM, where PORT_LOG's lines are read (none: PORT_LOG is ignored).
    pub guest_mem: Option<&'a vm_memory::GuestMemoryMmap>,
    irq_begin: Option<super::kvmstats::Snapshot>,
    /// KVM's counters over the firmware's interrupt tests (marks 7 to 8).
    pub irq_kvm: Option<super::kvmstats::KvmCounts>,
    irqloop_begin: Option<WindowStart>,
    /// The MSI round-trip loop (marks 9 to 10), as the read loop's window.
    pub irq_loop_window: Option<LoopWindow>,
}

impl<'a> Machine<'a> {
    /// Nanoseconds from the last `begin` mark to the first `end` mark after it.
    pub(crate) fn mark_window(&self, begin: u32, end: u32) -> Option<u64> {
        let i = self.marks.iter().rposition(|(m, _)| *m == begin)?;
        let (_, t0) = self.marks[i];
        self.marks[i + 1..]
            .iter()
            .find(|(m, _)| *m == end)
            .map(|(_, t1)| t1.duration_since(t0).as_nanos() as u64)
    }

    /// Bus 0 with the host bridge at 00:00.0 and `dev` at 00:01.0.
    pub(crate) fn new(
        dev: DeviceParts,
        ram_end: u64,
        first_slot: u32,
        slots: Box<dyn SlotOps + 'a>,
        serial: Serial<'a>,
    ) -> Machine<'a> {
        let func = VirtFunction::new(dev.config, &dev.bars);
        let msix = func.msix();
        let mut bus = PciBus::new();
        bus.add(0, pci::host_bridge());
        bus.add(DEVICE_SLOT, func);
        Machine {
            serial,
            bus,
            mapper: BarMapper::new(&dev.areas, first_slot, ram_end, msix),
            regions: dev.regions,
            slots,
            exits: ExitCounts::default(),
            loop_begin: None,
            loop_window: None,
            marks: Vec::new(),
            kvm_stats: None,
            irq: None,
            guest_mem: None,
            irqloop_begin: None,
            irq_loop_window: None,
            irq_begin: None,
            irq_kvm: None,
        }
    }

    /// The counters at a window's begin mark.
    fn window_start(&self) -> WindowStart {
        (
            self.exits.clone(),
            Instant::now(),
            self.kvm_stats.as_ref().map(|k| k.read()),
        )
    }

    /// The window from `start` to now: gpupass's exits, the time, KVM's counters.
    fn window_end(&self, (before, t0, kvm_before): WindowStart) -> LoopWindow {
        let nanos = t0.elapsed().as_nanos() as u64;
        let kvm = match (&self.kvm_stats, kvm_before) {
            (Some(k), Some(b)) => Some(super::kvmstats::delta(&b, &k.read())),
            _ => None,
        };
        LoopWindow {
            exits: self.exits.since(&before),
            nanos,
            kvm,
        }
    }

    /// Hand the guest's MSI / MSI-X programming to the interrupt layer when it changed.
    fn irq_sync(&mut self) {
        let Some(f) = self.bus.function_mut(DEVICE_SLOT) else {
            return;
        };
        if !f.take_irq_dirty() {
            return;
        }
        let (msi, msix) = (f.msi_config(), f.msix_control());
        if let Some(irq) = self.irq.as_mut() {
            irq.sync(msi, msix);
        }
    }

    fn decode_changed(&mut self, dev: u8) -> Result<(), VmmError> {
        let windows = match self.bus.function(dev) {
            Some(f) if dev == DEVICE_SLOT => f.windows(),
            _ => return Ok(()),
        };
        self.mapper.update(windows, self.slots.as_mut())
    }

    fn io_out(&mut self, port: u16, data: &[u8]) -> Result<Flow, VmmError> {
        let value = {
            let mut b = [0u8; 4];
            let n = data.len().min(4);
            b[..n].copy_from_slice(&data[..n]);
            u32::from_le_bytes(b)
        };
        if Serial::claims(port) {
            self.exits.count("io-serial");
            if port == super::serial::COM1 {
                // Several bytes at the data register (a wider `out`, or string PIO that KVM
                // hands over at once): each byte is sent.
                for b in data {
                    self.serial.write(port, *b);
                }
            } else {
                for (i, b) in data.iter().enumerate() {
                    self.serial.write(port + i as u16, *b);
                }
            }
        } else if PciBus::claims(port) {
            self.exits.count("io-pci-config");
            if let Some(dev) = self.bus.io_write(port, data) {
                self.decode_changed(dev)?;
            }
            self.irq_sync();
        } else if port == PORT_EXIT {
            self.exits.count("io-exit");
            return Ok(Flow::Exit(data.first().copied().unwrap_or(0)));
        } else if port == PORT_LOG {
            self.exits.count("io-log");
            if let Some(mem) = self.guest_mem {
                use vm_memory::Bytes;
                let n = (value as usize).min(super::protocol::FW_LOG_LEN as usize);
                let mut buf = vec![0u8; n];
                if mem
                    .read_slice(&mut buf, vm_memory::GuestAddress(super::protocol::FW_LOG_BUF))
                    .is_ok()
                {
                    for b in buf {
                        self.serial.write(super::serial::COM1, b);
                    }
                }
            }
        } else if port == PORT_IRQ {
            self.exits.count("io-irq");
            if let Some(irq) = self.irq.as_mut() {
                irq.request(value);
            }
        } else if port == PORT_MARK {
            self.marks.push((value, Instant::now()));
            match value {
                MARK_IRQLOOP_BEGIN => {
                    self.exits.count("io-mark");
                    self.irqloop_begin = Some(self.window_start());
                }
                MARK_IRQLOOP_END => {
                    if let Some(start) = self.irqloop_begin.take() {
                        self.irq_loop_window = Some(self.window_end(start));
                    }
                    self.exits.count("io-mark");
                }
                MARK_IRQ_BEGIN => {
                    self.exits.count("io-mark");
                    self.irq_begin = self.kvm_stats.as_ref().map(|k| k.read());
                }
                MARK_IRQ_END => {
                    if let (Some(k), Some(b)) = (&self.kvm_stats, self.irq_begin.take()) {
                        self.irq_kvm = Some(super::kvmstats::delta(&b, &k.read()));
                    }
                    self.exits.count("io-mark");
                }
                MARK_LOOP_BEGIN => {
                    self.exits.count("io-mark");
                    self.loop_begin = Some(self.window_start());
                }
                MARK_LOOP_END => {
                    if let Some(start) = self.loop_begin.take() {
                        self.loop_window = Some(self.window_end(start));
                    }
                    self.exits.count("io-mark");
                }
                _ => self.exits.count("io-mark"),
            }
        } else if let Some(Hit::Bar { bar, offset }) = self.mapper.find(u64::from(port), true) {
            self.exits.count("io-bar");
            self.regions.write(bar, offset, data);
        } else {
            self.exits.count("io-unclaimed");
        }
        Ok(Flow::Continue)
    }

    fn io_in(&mut self, port: u16, data: &mut [u8]) {
        if Serial::claims(port) {
            self.exits.count("io-serial");
            for (i, b) in data.iter_mut().enumerate() {
                *b = self.serial.read(port + i as u16);
            }
        } else if PciBus::claims(port) {
            self.exits.count("io-pci-config");
            self.bus.io_read(port, data);
        } else if let Some(Hit::Bar { bar, offset }) = self.mapper.find(u64::from(port), true) {
            self.exits.count("io-bar");
            self.regions.read(bar, offset, data);
        } else {
            self.exits.count("io-unclaimed");
            data.fill(0xff);
        }
    }

    fn ecam(addr: u64) -> Option<u64> {
        use super::protocol::{ECAM_BASE, ECAM_SIZE};
        (ECAM_BASE..ECAM_BASE + ECAM_SIZE)
            .contains(&addr)
            .then(|| addr - ECAM_BASE)
    }

    fn mmio_read(&mut self, addr: u64, data: &mut [u8]) {
        if let Some(off) = Self::ecam(addr) {
            self.exits.count("mmio-pci-config");
            self.bus.ecam_read(off, data);
            return;
        }
        match self.mapper.find(addr, false) {
            Some(Hit::Bar { bar, offset }) => {
                self.exits.count("mmio-bar");
                self.regions.read(bar, offset, data);
            }
            Some(Hit::Msix { bar, offset }) => {
                self.exits.count("mmio-msix");
                let virtualized = self.irq.as_ref().is_some_and(|i| i.table_read(bar, offset, data));
                if !virtualized {
                    self.regions.read(bar, offset, data);
                }
            }
            None => {
                self.exits.count("mmio-unclaimed");
                data.fill(0xff);
            }
        }
    }

    fn mmio_write(&mut self, addr: u64, data: &[u8]) -> Result<(), VmmError> {
        if let Some(off) = Self::ecam(addr) {
            self.exits.count("mmio-pci-config");
            if let Some(dev) = self.bus.ecam_write(off, data) {
                self.decode_changed(dev)?;
            }
            self.irq_sync();
            return Ok(());
        }
        match self.mapper.find(addr, false) {
            Some(Hit::Bar { bar, offset }) => {
                self.exits.count("mmio-bar");
                self.regions.write(bar, offset, data);
            }
            Some(Hit::Msix { bar, offset }) => {
                self.exits.count("mmio-msix");
                let f = self.bus.function(DEVICE_SLOT);
                let (msi, msix) = (f.and_then(|f| f.msi_config()), f.and_then(|f| f.msix_control()));
                let mut handled = false;
                if let Some(i) = self.irq.as_mut() {
                    handled = i.table_write(bar, offset, data);
                    if handled {
                        i.sync(msi, msix);
                    }
                }
                if !handled {
                    self.regions.write(bar, offset, data);
                }
            }
            None => self.exits.count("mmio-unclaimed"),
        }
        Ok(())
    }

    /// Take the interrupt eventfds back and remove the BAR slots (before the device's
    /// mappings go away and it is reset).
    pub(crate) fn teardown(&mut self) {
        if let Some(irq) = self.irq.as_mut() {
            irq.shutdown();
        }
        self.mapper.unmap_all(self.slots.as_mut());
        self.serial.flush();
    }
}

/// Why the loop stopped without an exit-port write.
enum Fault {
    Shutdown,
    Internal,
    Halted,
    Unexpected(String),
    Run(kvm_ioctls::Error),
    Device(VmmError),
}

/// Run until the guest writes the exit port (its status is returned), `stop` is raised
/// (timeout), or the guest faults.
pub(crate) fn run_loop(
    vcpu: &mut dyn Vcpu,
    m: &mut Machine<'_>,
    stop: &AtomicBool,
    timeout: Duration,
) -> Result<u8, VmmError> {
    loop {
        if stop.load(Ordering::Acquire) {
            if vcpu.halted() {
                return Err(VmmError::Halted { regs: vcpu.dump() });
            }
            return Err(VmmError::Timeout {
                secs: timeout.as_secs_f64(),
                regs: vcpu.dump(),
            });
        }
        let step: Result<Flow, Fault> = match vcpu.run() {
            Ok(VcpuExit::IoOut(port, data)) => m.io_out(port, data).map_err(Fault::Device),
            Ok(VcpuExit::IoIn(port, data)) => {
                m.io_in(port, data);
                Ok(Flow::Continue)
            }
            Ok(VcpuExit::MmioRead(addr, data)) => {
                m.mmio_read(addr, data);
                Ok(Flow::Continue)
            }
            Ok(VcpuExit::MmioWrite(addr, data)) => m
                .mmio_write(addr, data)
                .map(|()| Flow::Continue)
                .map_err(Fault::Device),
            Ok(VcpuExit::Intr) => {
                m.exits.count("intr");
                Ok(Flow::Continue)
            }
            Ok(VcpuExit::Hlt) => {
                m.exits.count("hlt");
                Err(Fault::Halted)
            }
            Ok(VcpuExit::Shutdown) => {
                m.exits.count("shutdown");
                Err(Fault::Shutdown)
            }
            Ok(VcpuExit::InternalError) => {
                m.exits.count("internal-error");
                Err(Fault::Internal)
            }
            Ok(other) => {
                m.exits.count("other");
                Err(Fault::Unexpected(format!("{other:?}")))
            }
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                m.exits.count("intr");
                Ok(Flow::Continue)
            }
            Err(e) => Err(Fault::Run(e)),
        };
        match step {
            Ok(Flow::Continue) => {}
            Ok(Flow::Exit(status)) => return Ok(status),
            Err(f) => {
                let regs = vcpu.dump();
                return Err(match f {
                    Fault::Shutdown => VmmError::TripleFault { regs },
                    Fault::Internal => VmmError::InternalError { regs },
                    Fault::Halted => VmmError::Halted { regs },
                    Fault::Unexpected(exit) => VmmError::UnexpectedExit { exit, regs },
                    Fault::Run(source) => VmmError::Run { source, regs },
                    Fault::Device(e) => e,
                });
            }
        }
    }
}

/// Signal used to kick the vCPU thread out of `KVM_RUN` on timeout.
fn kick_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// [`run_loop`] on this thread with a watchdog: after `timeout` it raises `stop` and signals
/// this thread until the loop notices (a signal makes `KVM_RUN` return `EINTR`).
pub(crate) fn run_with_timeout(
    vcpu: &mut dyn Vcpu,
    m: &mut Machine<'_>,
    timeout: Duration,
) -> Result<u8, VmmError> {
    static HANDLER: std::sync::Once = std::sync::Once::new();
    HANDLER.call_once(|| {
        // Without the handler the kick would kill the process; the loop then only stops
        // at an exit, which the timeout message will show.
        let _ = vmm_sys_util::signal::register_signal_handler(kick_signal(), on_kick);
    });
    // SAFETY: pthread_self has no preconditions and returns this thread's id.
    let me = unsafe { libc::pthread_self() };
    let stop = AtomicBool::new(false);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (stop, done) = (&stop, &done);
        s.spawn(move || {
            if rx.recv_timeout(timeout) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                return;
            }
            stop.store(true, Ordering::Release);
            while !done.load(Ordering::Acquire) {
                // SAFETY: `me` is the vCPU thread, alive until `done` is set (the scope
                // joins this thread before the vCPU thread leaves `run_with_timeout`); the
                // signal has a no-op handler installed above.
                unsafe { libc::pthread_kill(me, kick_signal()) };
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let r = run_loop(vcpu, m, stop, timeout);
        done.store(true, Ordering::Release);
        drop(tx);
        r
    })
}

#[cfg(test)]
mod tests;
