use super::super::emulated;
use super::*;
use kvm_ioctls::VcpuExit;

/// One scripted exit. Data for `In`/`MmioRead` is filled by the machine and recorded.
#[derive(Clone, Debug)]
enum Step {
    Out(u16, Vec<u8>),
    In(u16, usize),
    MmioRead(u64, usize),
    MmioWrite(u64, Vec<u8>),
    Hlt,
    Shutdown,
    Intr,
    Debug,
    Eintr,
}

struct FakeVcpu {
    script: Vec<Step>,
    next: usize,
    buf: Vec<u8>,
    /// What the machine answered to each `In` / `MmioRead`, in order.
    answers: Vec<Vec<u8>>,
    pending: bool,
}

impl FakeVcpu {
    fn new(script: Vec<Step>) -> FakeVcpu {
        FakeVcpu {
            script,
            next: 0,
            buf: vec![0; 8],
            answers: Vec::new(),
            pending: false,
        }
    }
    fn value(a: &[u8]) -> u64 {
        let mut b = [0u8; 8];
        b[..a.len()].copy_from_slice(a);
        u64::from_le_bytes(b)
    }
}

impl Vcpu for FakeVcpu {
    fn run(&mut self) -> Result<VcpuExit<'_>, kvm_ioctls::Error> {
        if self.pending {
            self.answers.push(self.buf.clone());
            self.pending = false;
        }
        let step = self.script.get(self.next).cloned().unwrap_or(Step::Hlt);
        self.next += 1;
        Ok(match step {
            Step::Out(p, d) => {
                self.buf = d;
                VcpuExit::IoOut(p, &self.buf)
            }
            Step::In(p, n) => {
                self.buf = vec![0; n];
                self.pending = true;
                VcpuExit::IoIn(p, &mut self.buf)
            }
            Step::MmioRead(a, n) => {
                self.buf = vec![0; n];
                self.pending = true;
                VcpuExit::MmioRead(a, &mut self.buf)
            }
            Step::MmioWrite(a, d) => {
                self.buf = d;
                VcpuExit::MmioWrite(a, &self.buf)
            }
            Step::Hlt => VcpuExit::Hlt,
            Step::Shutdown => VcpuExit::Shutdown,
            Step::Intr => VcpuExit::Intr,
            Step::Debug => VcpuExit::Unknown,
            Step::Eintr => return Err(kvm_ioctls::Error::new(libc::EINTR)),
        })
    }
    fn dump(&self) -> String {
        "  rip=0xfake".to_string()
    }
}

#[derive(Default)]
struct Slots(Vec<(u32, u64, u64)>);
impl SlotOps for std::rc::Rc<std::cell::RefCell<Slots>> {
    fn set_slot(&mut self, slot: u32, gpa: u64, size: u64, _h: u64) -> Result<(), kvm_ioctls::Error> {
        self.borrow_mut().0.push((slot, gpa, size));
        Ok(())
    }
}

fn cfg_addr(dev: u32, off: u32) -> Vec<u8> {
    (0x8000_0000u32 | (dev << 11) | off).to_le_bytes().to_vec()
}

struct Outcome {
    result: Result<u8, VmmError>,
    vcpu: FakeVcpu,
    slots: Vec<(u32, u64, u64)>,
    exits: ExitCounts,
    console: Vec<u8>,
    read_loop: Option<LoopWindow>,
    /// (DMA window, isolation window) from the marks.
    dma_windows: (Option<u64>, Option<u64>),
}

fn run(script: Vec<Step>) -> Outcome {
    let (parts, _rest) = emulated::device().unwrap().split();
    let slots = std::rc::Rc::new(std::cell::RefCell::new(Slots::default()));
    let mut out = Vec::new();
    let mut vcpu = FakeVcpu::new(script);
    let (r, exits, lw, dw) = {
        let mut m = Machine::new(
            parts,
            64 << 20,
            1,
            Box::new(slots.clone()),
            Serial::new(Some(&mut out)),
        );
        let r = run_loop(&mut vcpu, &mut m, &AtomicBool::new(false), Duration::from_secs(1));
        let dw = (
            m.mark_window(MARK_DMA_BEGIN, MARK_DMA_END),
            m.mark_window(MARK_ISO_BEGIN, MARK_ISO_END),
        );
        (r, m.exits.clone(), m.loop_window.clone(), dw)
    };
    let slots = slots.borrow().0.clone();
    Outcome {
        result: r,
        vcpu,
        slots,
        exits,
        console: out,
        read_loop: lw,
        dma_windows: dw,
    }
}

#[test]
fn exit_port_ends_the_run_with_its_status() {
    let o = run(vec![
        Step::Out(0x3f8, b"h".to_vec()),
        Step::Out(0x3f8, b"\n".to_vec()),
        Step::Out(PORT_EXIT, vec![7]),
        Step::Out(0x3f8, b"never".to_vec()),
    ]);
    let exits = o.exits;
    assert_eq!(o.result.unwrap(), 7);
    assert_eq!(o.console, b"h\n");
    assert_eq!(exits.total, 3);
    // Several bytes at the data register in one exit: all are sent.
    let o = run(vec![
        Step::Out(0x3f8, b"FW a\n".to_vec()),
        Step::Out(PORT_EXIT, vec![0]),
    ]);
    assert_eq!(o.console, b"FW a\n");
    assert_eq!(o.exits.by_kind["io-serial"], 1);
    assert_eq!(exits.by_kind["io-serial"], 2);
    assert_eq!(exits.by_kind["io-exit"], 1);
}

#[test]
fn bar_assignment_maps_the_framebuffer_and_traps_the_registers() {
    let o = run(vec![
        // Read 00:01.0 vendor/device.
        Step::Out(0xcf8, cfg_addr(1, 0)),
        Step::In(0xcfc, 4),
        // BAR0 at 0xc0000000, BAR2 at 0xc1000000, memory decode on.
        Step::Out(0xcf8, cfg_addr(1, 0x10)),
        Step::Out(0xcfc, 0xc000_0000u32.to_le_bytes().to_vec()),
        Step::Out(0xcf8, cfg_addr(1, 0x18)),
        Step::Out(0xcfc, 0xc100_0000u32.to_le_bytes().to_vec()),
        Step::Out(0xcf8, cfg_addr(1, 0x04)),
        Step::Out(0xcfc, vec![0x02, 0x00]),
        // Dispi ID through the trapped BAR2, then a loop of two trapped reads.
        Step::MmioRead(0xc100_0500, 2),
        Step::Out(PORT_MARK, 1u32.to_le_bytes().to_vec()),
        Step::MmioRead(0xc100_0000, 4),
        Step::MmioRead(0xc100_0000, 4),
        Step::Out(PORT_MARK, 2u32.to_le_bytes().to_vec()),
        // Move BAR0: the slot follows.
        Step::Out(0xcf8, cfg_addr(1, 0x10)),
        Step::Out(0xcfc, 0xd000_0000u32.to_le_bytes().to_vec()),
        // Unassigned space reads all-ones; a dispi register write sticks.
        Step::MmioRead(0xe000_0000, 4),
        Step::MmioWrite(0xc100_0502, 800u16.to_le_bytes().to_vec()),
        Step::MmioRead(0xc100_0502, 2),
        Step::Eintr,
        Step::Out(PORT_EXIT, vec![0]),
    ]);
    let (vcpu, exits) = (&o.vcpu, &o.exits);
    assert_eq!(o.result.unwrap(), 0);
    assert_eq!(FakeVcpu::value(&vcpu.answers[0]), 0x1111_1234);
    assert_eq!(FakeVcpu::value(&vcpu.answers[1]), u64::from(emulated::DISPI_ID));
    assert_eq!(FakeVcpu::value(&vcpu.answers[2]), 0xffff_ff00);
    assert_eq!(FakeVcpu::value(&vcpu.answers[4]), 0xffff_ffff);
    assert_eq!(FakeVcpu::value(&vcpu.answers[5]), 800);
    assert_eq!(
        o.slots,
        vec![
            (1, 0xc000_0000, emulated::FRAMEBUFFER_SIZE),
            (1, 0xc000_0000, 0),
            (1, 0xd000_0000, emulated::FRAMEBUFFER_SIZE)
        ]
    );
    assert_eq!(exits.by_kind["mmio-bar"], 5);
    assert_eq!(exits.by_kind["mmio-unclaimed"], 1);
    assert_eq!(exits.by_kind["intr"], 1);
    let lw = o.read_loop.unwrap();
    assert_eq!(lw.exits.total, 2);
    assert_eq!(lw.exits.by_kind["mmio-bar"], 2);
}

#[test]
fn faults_end_the_run_with_registers() {
    let e = run(vec![Step::Out(0x3f8, b"x".to_vec()), Step::Shutdown])
        .result
        .unwrap_err();
    assert!(matches!(e, VmmError::TripleFault { .. }));
    assert!(e.to_string().contains("rip=0xfake"), "{e}");
    let e = run(vec![Step::Hlt]).result.unwrap_err();
    assert!(matches!(e, VmmError::Halted { .. }));
    assert!(e.to_string().contains("0x501"), "{e}");
    let e = run(vec![Step::Intr, Step::Debug]).result.unwrap_err();
    assert!(matches!(e, VmmError::UnexpectedExit { .. }), "{e}");
}

#[test]
fn a_raised_stop_flag_is_a_timeout() {
    let (parts, _rest) = emulated::device().unwrap().split();
    let slots = std::rc::Rc::new(std::cell::RefCell::new(Slots::default()));
    let mut m = Machine::new(parts, 64 << 20, 1, Box::new(slots), Serial::new(None));
    let mut vcpu = FakeVcpu::new(vec![Step::Intr; 10]);
    let e = run_loop(
        &mut vcpu,
        &mut m,
        &AtomicBool::new(true),
        Duration::from_millis(5),
    )
    .unwrap_err();
    assert!(matches!(e, VmmError::Timeout { .. }));
    assert!(e.to_string().contains("0.005"), "{e}");
}

#[test]
fn unclaimed_ports_read_all_ones() {
    let o = run(vec![
        Step::In(0x60, 1),
        Step::Out(0x80, vec![1]),
        Step::Out(PORT_EXIT, vec![3]),
    ]);
    assert_eq!(o.result.unwrap(), 3);
    assert_eq!(o.vcpu.answers[0], vec![0xff]);
    assert_eq!(o.exits.by_kind["io-unclaimed"], 2);
}

struct RouteLog(std::rc::Rc<std::cell::RefCell<Vec<String>>>);
impl super::super::irq::KvmIrq for RouteLog {
    fn set_routes(&mut self, msi: &[super::super::irq::MsiRoute]) -> Result<(), super::super::irq::IrqError> {
        let r: Vec<String> = msi
            .iter()
            .map(|r| format!("{}={:#x}/{:#x}", r.gsi, r.address, r.data))
            .collect();
        self.0.borrow_mut().push(format!("routes [{}]", r.join(" ")));
        Ok(())
    }
    fn irqfd(
        &mut self,
        _fd: &vmm_sys_util::eventfd::EventFd,
        gsi: u32,
        _r: Option<&vmm_sys_util::eventfd::EventFd>,
    ) -> Result<(), super::super::irq::IrqError> {
        self.0.borrow_mut().push(format!("irqfd {gsi}"));
        Ok(())
    }
    fn irqfd_remove(
        &mut self,
        _fd: &vmm_sys_util::eventfd::EventFd,
        gsi: u32,
    ) -> Result<(), super::super::irq::IrqError> {
        self.0.borrow_mut().push(format!("irqfd-remove {gsi}"));
        Ok(())
    }
}

/// The guest programs the emulated device's MSI through ECAM, asks for it on port 0x503 and
/// logs a line through port 0x504: the machine routes, raises and prints.
#[test]
fn ecam_msi_programming_irq_requests_and_log_lines() {
    use super::super::irq::{EmulatedIrqs, Interrupts, INDEX_MSI};
    use super::super::protocol::{ECAM_BASE, FW_LOG_BUF};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
    let mem: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    mem.write_slice(b"FW hi\n", GuestAddress(FW_LOG_BUF)).unwrap();
    let (parts, _rest) = emulated::device().unwrap().split();
    let slots = std::rc::Rc::new(std::cell::RefCell::new(Slots::default()));
    let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let mut out = Vec::new();
    let dev = |reg: u64| ECAM_BASE | (1 << 15) | reg;
    let mut vcpu = FakeVcpu::new(vec![
        Step::MmioRead(dev(0), 4),
        Step::MmioWrite(dev(0x54), 0xfee0_0000u32.to_le_bytes().to_vec()),
        Step::MmioWrite(dev(0x58), 0x50u16.to_le_bytes().to_vec()),
        Step::MmioWrite(dev(0x52), 1u16.to_le_bytes().to_vec()),
        Step::MmioRead(dev(0x52), 2),
        Step::Out(PORT_IRQ, (INDEX_MSI << 16).to_le_bytes().to_vec()),
        Step::Out(super::super::protocol::PORT_LOG, 6u32.to_le_bytes().to_vec()),
        Step::Out(PORT_EXIT, vec![0]),
    ]);
    let report = {
        let mut m = Machine::new(parts, 1 << 20, 1, Box::new(slots), Serial::new(Some(&mut out)));
        m.guest_mem = Some(&mem);
        m.irq = Some(Interrupts::new(
            Box::new(RouteLog(log.clone())),
            Box::new(EmulatedIrqs::default()),
            0,
            None,
        ));
        assert_eq!(
            run_loop(&mut vcpu, &mut m, &AtomicBool::new(false), Duration::from_secs(1)).unwrap(),
            0
        );
        assert_eq!(m.exits.by_kind["mmio-pci-config"], 5);
        assert_eq!(m.exits.by_kind["io-log"], 1);
        m.irq.take().unwrap().report
    };
    assert_eq!(FakeVcpu::value(&vcpu.answers[0]), 0x1111_1234, "IDs through ECAM");
    assert_eq!(FakeVcpu::value(&vcpu.answers[1]), 1, "MSI enable reads back");
    assert_eq!(
        *log.borrow(),
        ["routes []", "routes [24=0xfee00000/0x50]", "irqfd 24"]
    );
    assert_eq!((report.msi.enabled, report.msi.host_triggers), (1, 1));
    assert!(report.msi.errors.is_empty(), "{:?}", report.msi.errors);
    assert_eq!(out, b"FW hi\n");
}

#[test]
fn dma_marks_time_the_transfers() {
    let mark = |v: u32| Step::Out(PORT_MARK, v.to_le_bytes().to_vec());
    let o = run(vec![
        mark(MARK_DMA_BEGIN),
        mark(MARK_DMA_END),
        mark(MARK_ISO_BEGIN),
        Step::Out(PORT_EXIT, vec![0]),
    ]);
    assert_eq!(o.result.unwrap(), 0);
    assert!(o.dma_windows.0.is_some(), "3..4 is a window");
    assert_eq!(o.dma_windows.1, None, "5 without 6 is none");
    assert_eq!(o.exits.by_kind["io-mark"], 3);
    assert!(o.read_loop.is_none(), "DMA marks are not the read loop");
}
