//! Interrupt delivery for `gpupass boot`: the device's INTx, MSI and MSI-X reach the guest
//! through KVM's in-kernel irqchip without a trip through gpupass.
//!
//! - **INTx**: the device's interrupt eventfd (`VFIO_DEVICE_SET_IRQS`, index INTx) is a KVM
//!   irqfd on IOAPIC pin [`INTX_GSI`] with a *resample* eventfd: the guest's EOI of the
//!   level-triggered pin makes KVM lower the line and signal the resample fd, which VFIO takes
//!   as the unmask (`VFIO_IRQ_SET_ACTION_UNMASK` with an eventfd), so the next assertion
//!   arrives. This is the path QEMU and cloud-hypervisor use.
//! - **MSI / MSI-X**: the guest's writes to the MSI capability and to the MSI-X table are
//!   virtualized (config in [`super::pci`], the table here). When the guest enables one, the
//!   VFIO eventfds of its vectors are handed to the kernel (INTx is switched off first: vfio-pci
//!   allows one interrupt type at a time), each vector's message becomes a `KVM_SET_GSI_ROUTING`
//!   MSI route from GSI [`MSI_GSI_BASE`] on, and each unmasked vector's eventfd is a KVM irqfd on
//!   its GSI. A masked MSI-X vector (entry or function mask) has its irqfd removed.
//!
//! The kernel then delivers device interrupts to the vCPU directly. The syscalls sit behind
//! two traits ([`KvmIrq`], [`DeviceIrqs`]) so the unit tests run the state machine with fakes.

use super::pci::{MsiConfig, MsixControl, MsixInfo};
pub use super::protocol::{
    INTX_GSI, IRQ_INDEX_INTX as INDEX_INTX, IRQ_INDEX_MSI as INDEX_MSI, IRQ_INDEX_MSIX as INDEX_MSIX,
    MSI_GSI_BASE,
};
use crate::model::ErrorChain;
use serde::Serialize;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// The irqchip error of a boot that did not ask for interrupts.
pub(crate) const NOT_REQUESTED: &str = "not requested (interrupts are tested by boot --check and --irq-loop)";

/// An MSI route: the message of one vector, on its GSI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MsiRoute {
    pub gsi: u32,
    pub address: u64,
    pub data: u32,
}

/// Why an interrupt call failed: [`KvmIrq`]'s and [`DeviceIrqs`]' error. The run goes on; the
/// report records the call and this error (its chain, `call: cause`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum IrqError {
    /// A system call (eventfd, `KVM_IRQFD`, `KVM_SET_GSI_ROUTING`...) failed.
    #[error(transparent)]
    Os(#[from] std::io::Error),
    #[error(transparent)]
    Kvm(#[from] kvm_ioctls::Error),
    #[error("eventfd")]
    EventFd(#[source] std::io::Error),
    /// The routing table could not be built (vmm-sys-util's error, as it debug-prints).
    #[error("{0}")]
    Routing(String),
    /// A VFIO interrupt ioctl: vfio-ioctls' error and the errno the failed ioctl left (its
    /// error types drop it), as `<vfio error> (<errno>)`.
    #[error("{vfio} ({errno})")]
    Vfio {
        vfio: vfio_ioctls::VfioError,
        errno: std::io::Error,
    },
    /// What the emulated device does not have.
    #[error("{0}")]
    Emulated(String),
    #[error("poisoned")]
    Poisoned,
}

/// KVM's side: GSI routing and irqfds.
pub(crate) trait KvmIrq {
    /// `KVM_SET_GSI_ROUTING` with the IOAPIC's pins and these MSI routes.
    fn set_routes(&mut self, msi: &[MsiRoute]) -> Result<(), IrqError>;
    /// `KVM_IRQFD`: `fd` injects on `gsi`; with `resample`, as a level-triggered line.
    fn irqfd(&mut self, fd: &EventFd, gsi: u32, resample: Option<&EventFd>) -> Result<(), IrqError>;
    /// `KVM_IRQFD` with `KVM_IRQFD_FLAG_DEASSIGN`.
    fn irqfd_remove(&mut self, fd: &EventFd, gsi: u32) -> Result<(), IrqError>;
}

/// The device's side: its interrupt sources (VFIO, or the emulated device).
pub(crate) trait DeviceIrqs {
    /// Vectors interrupt `index` offers (0: none).
    fn count(&self, index: u32) -> u32;
    /// The eventfds the device signals for interrupt `index`; empty: disable it.
    fn set(&mut self, index: u32, fds: &[&EventFd]) -> Result<(), IrqError>;
    /// INTx: the eventfd whose signal unmasks it.
    fn set_unmask(&mut self, fd: &EventFd) -> Result<(), IrqError>;
    /// Raise vector `vector` of `index` from the host side (VFIO's software trigger; the
    /// emulated device's own interrupt).
    fn trigger(&mut self, index: u32, vector: u32) -> Result<(), IrqError>;
    /// What [`trigger`](Self::trigger) is, for the report.
    fn trigger_name(&self) -> &'static str;
}

/// The interrupt kind of a VFIO index, as reports name it.
pub(crate) fn kind_name(index: u32) -> &'static str {
    match index {
        INDEX_INTX => "intx",
        INDEX_MSI => "msi",
        INDEX_MSIX => "msi-x",
        _ => "other",
    }
}

struct Vector {
    fd: EventFd,
    gsi: u32,
    attached: bool,
}

impl Vector {
    fn new(gsi: u32) -> Result<Vector, IrqError> {
        let fd = EventFd::new(EFD_NONBLOCK).map_err(IrqError::EventFd)?;
        Ok(Vector {
            fd,
            gsi,
            attached: false,
        })
    }
}

/// Which interrupt type the device signals now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    None,
    Intx,
    Msi,
    Msix,
}

/// One kind's counters in the report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct KindReport {
    /// Vectors the device offers (VFIO's `count`).
    pub vectors: u32,
    /// Times the guest turned it on (VFIO eventfds handed over).
    pub enabled: u64,
    /// Host-side raises the firmware asked for ([`DeviceIrqs::trigger`]).
    pub host_triggers: u64,
    /// What failed (a syscall, with its error); empty when all worked.
    pub errors: Vec<String>,
}

/// What the interrupt layer did during a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct IrqReport {
    /// The device's interrupt pin register (0: no INTx; 1-4: INTA-INTD).
    pub pin: u8,
    /// The device has an MSI / MSI-X capability.
    pub msi_capability: bool,
    pub msix_capability: bool,
    /// An in-kernel irqchip was created (`KVM_CREATE_IRQCHIP`); without one nothing is
    /// delivered and `error` says why.
    pub irqchip: bool,
    pub error: Option<String>,
    /// How host-side raises are made (`vfio-trigger`, `emulated`).
    pub host_trigger: &'static str,
    pub intx: KindReport,
    pub msi: KindReport,
    pub msix: KindReport,
    /// `KVM_SET_GSI_ROUTING` calls.
    pub route_updates: u64,
}

impl IrqReport {
    pub(crate) fn kind(&self, index: u32) -> &KindReport {
        match index {
            INDEX_INTX => &self.intx,
            INDEX_MSI => &self.msi,
            _ => &self.msix,
        }
    }

    fn kind_mut(&mut self, index: u32) -> &mut KindReport {
        match index {
            INDEX_INTX => &mut self.intx,
            INDEX_MSI => &mut self.msi,
            _ => &mut self.msix,
        }
    }
}

/// The interrupt state of the presented device.
pub(crate) struct Interrupts<'a> {
    kvm: Box<dyn KvmIrq + 'a>,
    dev: Box<dyn DeviceIrqs + 'a>,
    mode: Mode,
    intx: Option<(Vector, EventFd)>,
    msi: Option<Vector>,
    msix: Option<Vec<Vector>>,
    msix_info: Option<MsixInfo>,
    /// The virtualized MSI-X table: (address low, address high, data, vector control).
    table: Vec<[u32; 4]>,
    routes: Vec<MsiRoute>,
    pub report: IrqReport,
}

impl<'a> Interrupts<'a> {
    /// Set up what the device offers: INTx wired at once (when it has a pin), MSI and MSI-X
    /// eventfds ready for the guest to enable. `msix` is where its table lives.
    pub(crate) fn new(
        kvm: Box<dyn KvmIrq + 'a>,
        dev: Box<dyn DeviceIrqs + 'a>,
        pin: u8,
        msix: Option<MsixInfo>,
    ) -> Interrupts<'a> {
        let mut report = IrqReport {
            irqchip: true,
            host_trigger: dev.trigger_name(),
            ..IrqReport::default()
        };
        for index in [INDEX_INTX, INDEX_MSI, INDEX_MSIX] {
            report.kind_mut(index).vectors = dev.count(index);
        }
        let entries = msix.map_or(0, |m| (m.table_size / 16) as usize);
        let mut irq = Interrupts {
            kvm,
            dev,
            mode: Mode::None,
            intx: None,
            msi: None,
            msix: None,
            msix_info: msix,
            // Out of reset every MSI-X vector is masked.
            table: vec![[0, 0, 0, 1]; entries],
            routes: Vec::new(),
            report,
        };
        // The IOAPIC-only routing from the start (before INTx can assert its GSI).
        irq.report.route_updates += 1;
        if let Err(e) = irq.kvm.set_routes(&[]) {
            irq.fail(
                INDEX_INTX,
                format!("KVM_SET_GSI_ROUTING (IOAPIC pins): {}", ErrorChain(&e)),
            );
        }
        if irq.report.intx.vectors > 0 && pin != 0 {
            match (Vector::new(INTX_GSI), EventFd::new(EFD_NONBLOCK)) {
                (Ok(mut v), Ok(resample)) => match irq.kvm.irqfd(&v.fd, INTX_GSI, Some(&resample)) {
                    Ok(()) => {
                        v.attached = true;
                        irq.intx = Some((v, resample));
                        irq.enter(Mode::Intx);
                    }
                    Err(e) => irq.fail(
                        INDEX_INTX,
                        format!("KVM_IRQFD (resample) on GSI {INTX_GSI}: {}", ErrorChain(&e)),
                    ),
                },
                (Err(e), _) => irq.fail(INDEX_INTX, ErrorChain(&e).to_string()),
                (_, Err(e)) => irq.fail(INDEX_INTX, format!("eventfd: {e}")),
            }
        }
        if irq.report.msi.vectors > 0 {
            match Vector::new(MSI_GSI_BASE) {
                Ok(v) => irq.msi = Some(v),
                Err(e) => irq.fail(INDEX_MSI, ErrorChain(&e).to_string()),
            }
        }
        let n = (irq.report.msix.vectors as usize).min(entries);
        if n > 0 {
            let v: Result<Vec<Vector>, IrqError> =
                (0..n).map(|i| Vector::new(MSI_GSI_BASE + 1 + i as u32)).collect();
            match v {
                Ok(v) => irq.msix = Some(v),
                Err(e) => irq.fail(INDEX_MSIX, ErrorChain(&e).to_string()),
            }
        }
        irq
    }

    /// No irqchip: nothing can be delivered; `why` is reported.
    pub(crate) fn unavailable(why: String) -> IrqReport {
        IrqReport {
            irqchip: false,
            error: Some(why),
            ..IrqReport::default()
        }
    }

    /// Whether the kind is wired and could be delivered.
    pub(crate) fn offers(&self, index: u32) -> bool {
        match index {
            INDEX_INTX => self.intx.is_some(),
            INDEX_MSI => self.msi.is_some(),
            INDEX_MSIX => self.msix.is_some(),
            _ => false,
        }
    }

    /// MSI-X entries wired (0: none).
    pub(crate) fn msix_entries(&self) -> u32 {
        self.msix.as_ref().map_or(0, |v| v.len() as u32)
    }

    fn fail(&mut self, index: u32, e: String) {
        let errors = &mut self.report.kind_mut(index).errors;
        // A repeated failure is reported once.
        if errors.len() < 8 && !errors.contains(&e) {
            errors.push(e);
        }
    }

    /// Hand the current mode's eventfds to the device (or take them back with `on` false).
    fn device_set(&mut self, mode: Mode, on: bool) {
        let (index, fds): (u32, Vec<&EventFd>) = match mode {
            Mode::None => return,
            Mode::Intx => (INDEX_INTX, self.intx.iter().map(|(v, _)| &v.fd).collect()),
            Mode::Msi => (INDEX_MSI, self.msi.iter().map(|v| &v.fd).collect()),
            Mode::Msix => (INDEX_MSIX, self.msix.iter().flatten().map(|v| &v.fd).collect()),
        };
        let fds = if on { fds } else { Vec::new() };
        let n = fds.len();
        let r = self.dev.set(index, &fds);
        let what = kind_name(index);
        match r {
            Ok(()) if on => self.report.kind_mut(index).enabled += 1,
            Ok(()) => {}
            Err(e) => {
                let verb = if on { "enable" } else { "disable" };
                self.fail(
                    index,
                    format!(
                        "VFIO_DEVICE_SET_IRQS {verb} {what} ({n} vectors): {}",
                        ErrorChain(&e)
                    ),
                );
                return;
            }
        }
        if mode == Mode::Intx && on {
            if let Some((_, resample)) = &self.intx {
                if let Err(e) = self.dev.set_unmask(resample) {
                    self.fail(
                        INDEX_INTX,
                        format!("VFIO_DEVICE_SET_IRQS INTx unmask eventfd: {}", ErrorChain(&e)),
                    );
                }
            }
        }
    }

    fn enter(&mut self, mode: Mode) {
        if mode == self.mode {
            return;
        }
        let old = self.mode;
        self.device_set(old, false);
        self.mode = mode;
        self.device_set(mode, true);
    }

    /// Follow what the guest programmed: the MSI capability, the MSI-X control bits and table.
    pub(crate) fn sync(&mut self, msi: Option<MsiConfig>, msix: Option<MsixControl>) {
        let msix = msix.unwrap_or_default();
        let msi = msi.unwrap_or_default();
        let mode = if msix.enabled && self.msix.is_some() {
            Mode::Msix
        } else if msi.enabled && self.msi.is_some() {
            Mode::Msi
        } else if self.intx.is_some() {
            Mode::Intx
        } else {
            Mode::None
        };
        self.enter(mode);

        let mut routes = Vec::new();
        if let Some(v) = &self.msi {
            if msi.enabled {
                routes.push(MsiRoute {
                    gsi: v.gsi,
                    address: msi.address,
                    data: msi.data,
                });
            }
        }
        if let Some(vs) = &self.msix {
            if msix.enabled {
                // Only entries holding a message (an address): an unprogrammed one has none.
                for (v, e) in vs.iter().zip(&self.table).filter(|(_, e)| e[0] != 0 || e[1] != 0) {
                    routes.push(MsiRoute {
                        gsi: v.gsi,
                        address: u64::from(e[1]) << 32 | u64::from(e[0]),
                        data: e[2],
                    });
                }
            }
        }
        if routes != self.routes {
            self.report.route_updates += 1;
            match self.kvm.set_routes(&routes) {
                Ok(()) => self.routes = routes,
                Err(e) => {
                    let index = if mode == Mode::Msix { INDEX_MSIX } else { INDEX_MSI };
                    self.fail(
                        index,
                        format!(
                            "KVM_SET_GSI_ROUTING ({} MSI routes): {}",
                            routes.len(),
                            ErrorChain(&e)
                        ),
                    );
                }
            }
        }

        // irqfds: attached while the vector is enabled and unmasked.
        let msi_on = mode == Mode::Msi && !msi.masked;
        let mut errs = Vec::new();
        if let Some(v) = self.msi.as_mut() {
            attach(self.kvm.as_mut(), v, msi_on, &mut errs, INDEX_MSI);
        }
        if let Some(vs) = self.msix.as_mut() {
            for (v, e) in vs.iter_mut().zip(&self.table) {
                let programmed = e[0] != 0 || e[1] != 0;
                let on = mode == Mode::Msix && !msix.function_masked && e[3] & 1 == 0 && programmed;
                attach(self.kvm.as_mut(), v, on, &mut errs, INDEX_MSIX);
            }
        }
        for (index, e) in errs {
            self.fail(index, e);
        }
    }

    /// The BAR offset of MSI-X table entry `i` word `w`, if `(bar, offset)` is one.
    fn table_word(&self, bar: u8, offset: u64, len: usize) -> Option<(usize, usize)> {
        let m = self.msix_info?;
        if bar != m.table_bar || offset < m.table_offset || offset >= m.table_offset + m.table_size {
            return None;
        }
        let rel = offset - m.table_offset;
        // Only aligned dword (or qword, split) accesses are defined for the table.
        if rel % 4 != 0 || !(len == 4 || len == 8) {
            return Some((usize::MAX, 0));
        }
        Some(((rel / 16) as usize, ((rel % 16) / 4) as usize))
    }

    /// A guest read of the MSI-X table; `false` when `(bar, offset)` is not in it.
    pub(crate) fn table_read(&self, bar: u8, offset: u64, data: &mut [u8]) -> bool {
        let Some((entry, word)) = self.table_word(bar, offset, data.len()) else {
            return false;
        };
        data.fill(0xff);
        for (k, chunk) in data.chunks_mut(4).enumerate() {
            if let Some(v) = self.table.get(entry).and_then(|e| e.get(word + k)) {
                chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
            }
        }
        true
    }

    /// A guest write to the MSI-X table; `false` when `(bar, offset)` is not in it. The
    /// caller then [`sync`](Self::sync)s.
    pub(crate) fn table_write(&mut self, bar: u8, offset: u64, data: &[u8]) -> bool {
        let Some((entry, word)) = self.table_word(bar, offset, data.len()) else {
            return false;
        };
        for (k, chunk) in data.chunks(4).enumerate() {
            let mut b = [0u8; 4];
            b[..chunk.len()].copy_from_slice(chunk);
            if let Some(v) = self.table.get_mut(entry).and_then(|e| e.get_mut(word + k)) {
                // Vector control: only the mask bit is defined.
                *v = if word + k == 3 {
                    u32::from_le_bytes(b) & 1
                } else {
                    u32::from_le_bytes(b)
                };
            }
        }
        true
    }

    /// The firmware asked (port [`super::protocol::PORT_IRQ`]) for `(index << 16) | vector`
    /// to be raised from the host side.
    pub(crate) fn request(&mut self, value: u32) {
        let (index, vector) = (value >> 16, value & 0xffff);
        if index > INDEX_MSIX {
            return;
        }
        self.report.kind_mut(index).host_triggers += 1;
        if let Err(e) = self.dev.trigger(index, vector) {
            let what = kind_name(index);
            self.fail(
                index,
                format!("host-side raise of {what} vector {vector}: {}", ErrorChain(&e)),
            );
        }
    }

    /// Take every eventfd back from the device and KVM (before the device is reset).
    pub(crate) fn shutdown(&mut self) {
        let mode = self.mode;
        self.device_set(mode, false);
        self.mode = Mode::None;
        let mut errs = Vec::new();
        if let Some((v, _)) = self.intx.as_mut() {
            attach(self.kvm.as_mut(), v, false, &mut errs, INDEX_INTX);
        }
        if let Some(v) = self.msi.as_mut() {
            attach(self.kvm.as_mut(), v, false, &mut errs, INDEX_MSI);
        }
        for v in self.msix.iter_mut().flatten() {
            attach(self.kvm.as_mut(), v, false, &mut errs, INDEX_MSIX);
        }
        for (index, e) in errs {
            self.fail(index, e);
        }
    }
}

fn attach(kvm: &mut dyn KvmIrq, v: &mut Vector, on: bool, errs: &mut Vec<(u32, String)>, index: u32) {
    if on == v.attached {
        return;
    }
    let r = if on {
        kvm.irqfd(&v.fd, v.gsi, None)
    } else {
        kvm.irqfd_remove(&v.fd, v.gsi)
    };
    match r {
        Ok(()) => v.attached = on,
        Err(e) => {
            let verb = if on { "assign" } else { "deassign" };
            errs.push((
                index,
                format!("KVM_IRQFD {verb} on GSI {}: {}", v.gsi, ErrorChain(&e)),
            ));
        }
    }
}

/// Set to 1 to leave every interrupt unrouted (no irqfd is assigned): the failing case of
/// `boot --check`'s interrupt verdicts, as [`super::dma::NO_DMA_MAP_ENV`] is for DMA.
pub(crate) const NO_IRQFD_ENV: &str = "GPUPASS_BOOT_NO_IRQFD";

/// Whether [`NO_IRQFD_ENV`] is set: honoured only by a `testkit` build (the tests' and the
/// lab's), never by a release binary.
pub(crate) fn skip_irqfd() -> bool {
    cfg!(feature = "testkit") && std::env::var_os(NO_IRQFD_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// How MSI / MSI-X reach the vCPU (`boot --irq-path`): the kernel's irqfd (what gpupass and
/// every modern VMM use), or gpupass reading the eventfds in userspace and injecting each
/// message with `KVM_SIGNAL_MSI` (the comparison of the interrupt benchmark).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IrqPath {
    #[default]
    Irqfd,
    Userspace,
}

/// The userspace path: a thread polls the MSI vectors' eventfds and injects their messages.
#[derive(Default)]
pub(crate) struct Injector {
    fds: std::sync::Mutex<Vec<(u32, EventFd)>>,
    routes: std::sync::Mutex<std::collections::HashMap<u32, (u64, u32)>>,
    stop: std::sync::atomic::AtomicBool,
    /// Messages injected with `KVM_SIGNAL_MSI`.
    pub injected: std::sync::atomic::AtomicU64,
    pub errors: std::sync::Mutex<Vec<String>>,
}

impl Injector {
    fn add(&self, gsi: u32, fd: &EventFd) -> Result<(), IrqError> {
        let fd = fd.try_clone()?;
        let mut fds = self.fds.lock().map_err(|_| IrqError::Poisoned)?;
        fds.retain(|(g, _)| *g != gsi);
        fds.push((gsi, fd));
        Ok(())
    }

    fn remove(&self, gsi: u32) {
        if let Ok(mut fds) = self.fds.lock() {
            fds.retain(|(g, _)| *g != gsi);
        }
    }

    fn set_routes(&self, msi: &[MsiRoute]) {
        if let Ok(mut r) = self.routes.lock() {
            r.clear();
            r.extend(msi.iter().map(|m| (m.gsi, (m.address, m.data))));
        }
    }

    /// Stop [`run`](Self::run) (from another thread).
    pub(crate) fn stop(&self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Poll the eventfds and inject each signalled vector's message until stopped.
    pub(crate) fn run(&self, vm: &kvm_ioctls::VmFd) {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        use std::sync::atomic::Ordering;
        let tick = Timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        while !self.stop.load(Ordering::Acquire) {
            let Ok(fds) = self.fds.lock() else { return };
            if fds.is_empty() {
                drop(fds);
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            use std::os::fd::{AsRawFd, BorrowedFd};
            let borrowed: Vec<BorrowedFd> = fds
                .iter()
                // SAFETY: each EventFd stays open while `fds` is locked, which outlives
                // `borrowed` and `polled` (both dropped before the lock is released).
                .map(|(_, f)| unsafe { BorrowedFd::borrow_raw(f.as_raw_fd()) })
                .collect();
            let mut polled: Vec<PollFd> = borrowed.iter().map(|f| PollFd::new(f, PollFlags::IN)).collect();
            if poll(&mut polled, Some(&tick)).unwrap_or(0) == 0 {
                continue;
            }
            let ready: Vec<usize> = (0..polled.len())
                .filter(|&i| polled[i].revents().contains(PollFlags::IN))
                .collect();
            drop(polled);
            drop(borrowed);
            for i in ready {
                let (gsi, fd) = &fds[i];
                if fd.read().is_err() {
                    continue;
                }
                let route = self.routes.lock().ok().and_then(|r| r.get(gsi).copied());
                let Some((address, data)) = route else { continue };
                let msi = kvm_bindings::kvm_msi {
                    address_lo: address as u32,
                    address_hi: (address >> 32) as u32,
                    data,
                    ..Default::default()
                };
                match vm.signal_msi(msi) {
                    Ok(_) => {
                        self.injected.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        if let Ok(mut errs) = self.errors.lock() {
                            if errs.len() < 4 {
                                errs.push(format!("KVM_SIGNAL_MSI on GSI {gsi}: {e}"));
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The real KVM side of [`KvmIrq`].
pub(crate) struct KvmRouting<'a> {
    pub vm: &'a kvm_ioctls::VmFd,
    /// [`NO_IRQFD_ENV`]: irqfds are not assigned (reported as assigned).
    pub skip_irqfd: bool,
    /// [`IrqPath::Userspace`]: MSI vectors go to this injector instead of an irqfd.
    pub injector: Option<&'a Injector>,
}

impl KvmIrq for KvmRouting<'_> {
    fn set_routes(&mut self, msi: &[MsiRoute]) -> Result<(), IrqError> {
        use kvm_bindings::{
            kvm_irq_routing_entry, KvmIrqRouting, KVM_IRQCHIP_IOAPIC, KVM_IRQ_ROUTING_IRQCHIP,
            KVM_IRQ_ROUTING_MSI,
        };
        let mut entries = Vec::new();
        // The IOAPIC's 24 pins only. KVM's default routing also wires GSI 0-15 to the 8259
        // PICs, whose unprogrammed vector base would turn the INTx GSI into an ExtINT
        // interrupt on vector 2 (seen in the lab as a spurious "NMI"): nothing here uses them.
        for gsi in 0..24u32 {
            let mut e = kvm_irq_routing_entry {
                gsi,
                type_: KVM_IRQ_ROUTING_IRQCHIP,
                ..Default::default()
            };
            e.u.irqchip.irqchip = KVM_IRQCHIP_IOAPIC;
            e.u.irqchip.pin = gsi;
            entries.push(e);
        }
        for r in msi {
            let mut e = kvm_irq_routing_entry {
                gsi: r.gsi,
                type_: KVM_IRQ_ROUTING_MSI,
                ..Default::default()
            };
            e.u.msi.address_lo = r.address as u32;
            e.u.msi.address_hi = (r.address >> 32) as u32;
            e.u.msi.data = r.data;
            entries.push(e);
        }
        let table = KvmIrqRouting::from_entries(&entries).map_err(|e| IrqError::Routing(format!("{e:?}")))?;
        if let Some(inj) = self.injector {
            inj.set_routes(msi);
        }
        Ok(self.vm.set_gsi_routing(&table)?)
    }

    fn irqfd(&mut self, fd: &EventFd, gsi: u32, resample: Option<&EventFd>) -> Result<(), IrqError> {
        if self.skip_irqfd {
            return Ok(());
        }
        if let (Some(inj), true) = (self.injector, gsi >= MSI_GSI_BASE) {
            return inj.add(gsi, fd);
        }
        match resample {
            Some(r) => self.vm.register_irqfd_with_resample(fd, r, gsi),
            None => self.vm.register_irqfd(fd, gsi),
        }
        .map_err(IrqError::from)
    }

    fn irqfd_remove(&mut self, fd: &EventFd, gsi: u32) -> Result<(), IrqError> {
        if self.skip_irqfd {
            return Ok(());
        }
        if let (Some(inj), true) = (self.injector, gsi >= MSI_GSI_BASE) {
            inj.remove(gsi);
            return Ok(());
        }
        Ok(self.vm.unregister_irqfd(fd, gsi)?)
    }
}

/// The emulated device's interrupt: one MSI vector, raised by gpupass itself (a device model
/// signals its irqfd as QEMU's and cloud-hypervisor's do).
#[derive(Default)]
pub(crate) struct EmulatedIrqs {
    msi: Option<EventFd>,
}

impl DeviceIrqs for EmulatedIrqs {
    fn count(&self, index: u32) -> u32 {
        u32::from(index == INDEX_MSI)
    }

    fn set(&mut self, index: u32, fds: &[&EventFd]) -> Result<(), IrqError> {
        if index != INDEX_MSI {
            return Err(IrqError::Emulated(format!(
                "the emulated device has no {}",
                kind_name(index)
            )));
        }
        self.msi = match fds.first() {
            Some(fd) => Some(fd.try_clone()?),
            None => None,
        };
        Ok(())
    }

    fn set_unmask(&mut self, _fd: &EventFd) -> Result<(), IrqError> {
        Err(IrqError::Emulated("the emulated device has no INTx".into()))
    }

    fn trigger(&mut self, index: u32, vector: u32) -> Result<(), IrqError> {
        match (&self.msi, index, vector) {
            (Some(fd), INDEX_MSI, 0) => Ok(fd.write(1)?),
            (None, INDEX_MSI, _) => Err(IrqError::Emulated("MSI is not enabled".into())),
            _ => Err(IrqError::Emulated(format!(
                "the emulated device has no {} vector {vector}",
                kind_name(index)
            ))),
        }
    }

    fn trigger_name(&self) -> &'static str {
        "emulated"
    }
}

#[cfg(test)]
mod tests;
