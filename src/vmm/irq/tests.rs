use super::*;
use std::cell::RefCell;
use std::rc::Rc;

#[derive(Default)]
struct Log {
    calls: Vec<String>,
    fail_set: Option<u32>,
}

struct FakeKvm(Rc<RefCell<Log>>);
impl KvmIrq for FakeKvm {
    fn set_routes(&mut self, msi: &[MsiRoute]) -> Result<(), IrqError> {
        let r: Vec<String> = msi
            .iter()
            .map(|r| format!("{}={:#x}/{:#x}", r.gsi, r.address, r.data))
            .collect();
        self.0
            .borrow_mut()
            .calls
            .push(format!("routes [{}]", r.join(" ")));
        Ok(())
    }
    fn irqfd(&mut self, _fd: &EventFd, gsi: u32, resample: Option<&EventFd>) -> Result<(), IrqError> {
        let r = if resample.is_some() { " resample" } else { "" };
        self.0.borrow_mut().calls.push(format!("irqfd {gsi}{r}"));
        Ok(())
    }
    fn irqfd_remove(&mut self, _fd: &EventFd, gsi: u32) -> Result<(), IrqError> {
        self.0.borrow_mut().calls.push(format!("irqfd-remove {gsi}"));
        Ok(())
    }
}

struct FakeDev(Rc<RefCell<Log>>, [u32; 3]);
impl DeviceIrqs for FakeDev {
    fn count(&self, index: u32) -> u32 {
        self.1[index as usize]
    }
    fn set(&mut self, index: u32, fds: &[&EventFd]) -> Result<(), IrqError> {
        let mut l = self.0.borrow_mut();
        l.calls.push(format!("set {} {}", kind_name(index), fds.len()));
        if l.fail_set == Some(index) {
            return Err(std::io::Error::from_raw_os_error(22).into());
        }
        Ok(())
    }
    fn set_unmask(&mut self, _fd: &EventFd) -> Result<(), IrqError> {
        self.0.borrow_mut().calls.push("unmask".into());
        Ok(())
    }
    fn trigger(&mut self, index: u32, vector: u32) -> Result<(), IrqError> {
        self.0
            .borrow_mut()
            .calls
            .push(format!("trigger {} {vector}", kind_name(index)));
        Ok(())
    }
    fn trigger_name(&self) -> &'static str {
        "fake"
    }
}

fn msix_info(entries: u64) -> MsixInfo {
    MsixInfo {
        table_bar: 3,
        table_offset: 0,
        table_size: entries * 16,
        pba_bar: 3,
        pba_offset: 0x2000,
        pba_size: 8,
    }
}

fn setup(counts: [u32; 3], pin: u8, fail_set: Option<u32>) -> (Interrupts<'static>, Rc<RefCell<Log>>) {
    let log = Rc::new(RefCell::new(Log {
        fail_set,
        ..Log::default()
    }));
    let irq = Interrupts::new(
        Box::new(FakeKvm(log.clone())),
        Box::new(FakeDev(log.clone(), counts)),
        pin,
        Some(msix_info(5)),
    );
    (irq, log)
}

fn calls(log: &Rc<RefCell<Log>>) -> Vec<String> {
    std::mem::take(&mut log.borrow_mut().calls)
}

fn word(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}

#[test]
fn intx_is_wired_at_once_with_a_resample_fd() {
    let (irq, log) = setup([1, 1, 5], 1, None);
    assert_eq!(
        calls(&log),
        ["routes []", "irqfd 10 resample", "set intx 1", "unmask"]
    );
    assert!(irq.offers(INDEX_INTX) && irq.offers(INDEX_MSI) && irq.offers(INDEX_MSIX));
    assert_eq!(irq.msix_entries(), 5);
    assert_eq!(irq.report.intx.enabled, 1);
    // No pin: no INTx even though VFIO lists the index.
    let (irq, log) = setup([1, 0, 0], 0, None);
    assert_eq!(calls(&log), ["routes []"]);
    assert!(!irq.offers(INDEX_INTX) && !irq.offers(INDEX_MSI));
}

#[test]
fn enabling_msi_switches_vfio_from_intx_and_routes_the_message() {
    let (mut irq, log) = setup([1, 1, 0], 1, None);
    calls(&log);
    let msi = MsiConfig {
        enabled: true,
        address: 0xfee0_0000,
        data: 0x50,
        masked: false,
    };
    irq.sync(Some(msi), None);
    assert_eq!(
        calls(&log),
        [
            "set intx 0",
            "set msi 1",
            "routes [24=0xfee00000/0x50]",
            "irqfd 24"
        ]
    );
    // The same state again changes nothing.
    irq.sync(Some(msi), None);
    assert!(calls(&log).is_empty());
    // Masked: the irqfd goes, the route stays.
    irq.sync(Some(MsiConfig { masked: true, ..msi }), None);
    assert_eq!(calls(&log), ["irqfd-remove 24"]);
    // Disabled: back to INTx.
    irq.sync(Some(MsiConfig::default()), None);
    assert_eq!(calls(&log), ["set msi 0", "set intx 1", "unmask", "routes []"]);
    assert_eq!(irq.report.msi.enabled, 1);
    assert_eq!(irq.report.intx.enabled, 2);
}

#[test]
fn msix_follows_the_table_and_both_masks() {
    let (mut irq, log) = setup([0, 0, 5], 0, None);
    calls(&log);
    let ctl = |enabled, function_masked| {
        Some(MsixControl {
            enabled,
            function_masked,
        })
    };
    // Enabled with the function masked, as a driver programs it.
    irq.sync(None, ctl(true, true));
    assert_eq!(calls(&log), ["set msi-x 5"], "no entry holds a message yet");
    // Entry 1: address, data, unmask (qword write of the address).
    assert!(irq.table_write(3, 0x10, &(0xfee0_0000u64).to_le_bytes()));
    assert!(irq.table_write(3, 0x18, &word(0x61)));
    assert!(irq.table_write(3, 0x1c, &word(0)));
    let mut b = [0u8; 4];
    assert!(irq.table_read(3, 0x18, &mut b));
    assert_eq!(u32::from_le_bytes(b), 0x61);
    assert!(irq.table_read(3, 0x0c, &mut b));
    assert_eq!(u32::from_le_bytes(b), 1, "entry 0 still masked");
    assert!(!irq.table_read(3, 0x2000, &mut b), "the PBA is not the table");
    assert!(!irq.table_write(0, 0x10, &word(1)), "another BAR");
    irq.sync(None, ctl(true, true));
    assert_eq!(calls(&log), ["routes [26=0xfee00000/0x61]"]);
    irq.sync(None, ctl(true, false));
    assert_eq!(calls(&log), ["irqfd 26"]);
    irq.sync(None, ctl(true, true));
    assert_eq!(calls(&log), ["irqfd-remove 26"]);
    irq.sync(None, ctl(false, false));
    assert_eq!(calls(&log), ["set msi-x 0", "routes []"]);
    irq.request((INDEX_MSIX << 16) | 3);
    assert_eq!(calls(&log), ["trigger msi-x 3"]);
    assert_eq!(irq.report.msix.host_triggers, 1);
}

#[test]
fn a_refused_enable_is_reported_with_the_error() {
    let (mut irq, log) = setup([1, 1, 0], 1, Some(INDEX_MSI));
    irq.sync(
        Some(MsiConfig {
            enabled: true,
            address: 0xfee0_0000,
            data: 0x50,
            masked: false,
        }),
        None,
    );
    assert!(calls(&log).contains(&"set msi 1".to_string()));
    assert_eq!(
        irq.report.msi.errors,
        ["VFIO_DEVICE_SET_IRQS enable msi (1 vectors): Invalid argument (os error 22)"]
    );
    assert_eq!(irq.report.msi.enabled, 0);
    irq.shutdown();
    assert!(irq.report.intx.errors.is_empty());
}

#[test]
fn the_emulated_device_signals_its_msi_eventfd() {
    let mut e = EmulatedIrqs::default();
    assert_eq!(
        (e.count(INDEX_INTX), e.count(INDEX_MSI), e.count(INDEX_MSIX)),
        (0, 1, 0)
    );
    assert!(e
        .trigger(INDEX_MSI, 0)
        .unwrap_err()
        .to_string()
        .contains("not enabled"));
    let fd = EventFd::new(EFD_NONBLOCK).unwrap();
    e.set(INDEX_MSI, &[&fd]).unwrap();
    e.trigger(INDEX_MSI, 0).unwrap();
    assert_eq!(fd.read().unwrap(), 1);
    assert!(e.trigger(INDEX_MSIX, 0).is_err());
}
