//! `gpupass boot --check`: one verdict per capability a guest driver needs, judged from a
//! [`BootReport`] (what the firmware saw, what the VMM and the kernel did, KVM's counters).
//!
//! The names (`config`, `bars`, `dma`, `isolation`, `msi-x`, `msi`, `intx`, `reset`) and the
//! results (`pass`, `fail`, `absent`) are an interface: scripts read them. `absent` means the
//! device does not have the capability, or gpupass has no way to exercise it on this device
//! (the reason says which); only `fail` makes the check fail.

use super::irq::{self, IrqReport};
use super::report::{size, FwIrq};
use super::BootReport;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail,
    Absent,
}

impl Outcome {
    pub fn word(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::Absent => "absent",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub check: &'static str,
    pub result: Outcome,
    pub reason: String,
}

fn v(check: &'static str, result: Outcome, reason: impl Into<String>) -> Verdict {
    Verdict {
        check,
        result,
        reason: reason.into(),
    }
}

/// The `--check --json` document.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub device: String,
    /// No verdict is `fail`.
    pub ok: bool,
    pub verdicts: Vec<Verdict>,
    pub boot: BootReport,
}

impl CheckReport {
    pub fn new(boot: BootReport) -> CheckReport {
        let verdicts = judge(&boot);
        CheckReport {
            device: boot.device.clone(),
            ok: verdicts.iter().all(|v| v.result != Outcome::Fail),
            verdicts,
            boot,
        }
    }

    /// The text form: one `NAME RESULT REASON` line per verdict, names padded to one column.
    pub fn lines(&self) -> String {
        let mut s = String::new();
        for x in &self.verdicts {
            s.push_str(&format!("{:<9} {:<6} {}\n", x.check, x.result.word(), x.reason));
        }
        s
    }
}

/// Every verdict, in the order they are printed (the names are the interface, see above).
pub fn judge(r: &BootReport) -> Vec<Verdict> {
    vec![
        config(r),
        bars(r),
        dma(r),
        isolation(r),
        interrupt(r, irq::INDEX_MSIX),
        interrupt(r, irq::INDEX_MSI),
        interrupt(r, irq::INDEX_INTX),
        reset(r),
    ]
}

/// The presented function as the firmware enumerated it.
fn fw_device(r: &BootReport) -> Option<&super::report::FwDevice> {
    r.firmware.devices.iter().find(|d| d.address == "00:01.0")
}

fn config(r: &BootReport) -> Verdict {
    let Some(d) = fw_device(r) else {
        return v("config", Outcome::Fail, "the firmware found no device at 00:01.0");
    };
    let seen = format!("{}:{}", d.vendor_id, d.device_id);
    if seen != r.presented_ids {
        return v(
            "config",
            Outcome::Fail,
            format!("the guest read IDs {seen}, the device has {}", r.presented_ids),
        );
    }
    if let Some(f) = &r.firmware.fault {
        return v(
            "config",
            Outcome::Fail,
            format!("the firmware took exception {f} (see the console)"),
        );
    }
    if !r.firmware.done {
        return v("config", Outcome::Fail, "the firmware did not run to its end");
    }
    v(
        "config",
        Outcome::Pass,
        format!(
            "00:01.0 {seen} class {} read by the guest through configuration mechanism #1",
            d.class
        ),
    )
}

fn bars(r: &BootReport) -> Verdict {
    let Some(d) = fw_device(r) else {
        return v("bars", Outcome::Fail, "no device to size BARs on");
    };
    if d.bars.is_empty() {
        return v("bars", Outcome::Absent, "the device implements no BARs");
    }
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for b in &d.bars {
        let name = format!("BAR{} {} {}", b.index, b.kind, size(b.size));
        match b.address {
            None => bad.push(format!(
                "{name} unassigned (no room: guest physical address width {} bits)",
                r.guest_phys_bits
            )),
            Some(a) if b.first.is_none() => bad.push(format!("{name} at {a:#x} could not be read")),
            Some(a) => {
                let slot = r.slots.iter().any(|s| s.bar as u32 == b.index && s.gpa.is_some());
                let how = if slot { "KVM slot" } else { "trapped" };
                let high = if a >= 1 << 32 { ", above 4 GiB" } else { "" };
                ok.push(format!("{name} at {a:#x} ({how}{high})"));
            }
        }
    }
    if !bad.is_empty() {
        return v("bars", Outcome::Fail, bad.join("; "));
    }
    let mut reason = format!("first and last dword read: {}", ok.join(", "));
    if let (Some(l), Some(k)) = (&r.read_loop, r.read_loop.as_ref().and_then(|l| l.kvm.as_ref())) {
        let mmio = k.delta.get("mmio_exits").copied().unwrap_or(0);
        reason.push_str(&format!(
            "; read loop: {} gpupass-counted exits, KVM mmio_exits {mmio}",
            l.exits.total
        ));
    }
    v("bars", Outcome::Pass, reason)
}

fn dma(r: &BootReport) -> Verdict {
    match (&r.dma, &r.firmware.dma) {
        (Some(d), _) => {
            let result = if d.result == "pass" {
                Outcome::Pass
            } else {
                Outcome::Fail
            };
            v("dma", result, d.reason.clone())
        }
        (None, Some(fw)) if fw.skipped.is_some() => v(
            "dma",
            Outcome::Fail,
            format!(
                "the DMA test could not run: {}",
                fw.skipped.as_deref().unwrap_or("?")
            ),
        ),
        _ if r.dma_mapped == 0 && r.backend.is_none() => {
            v("dma", Outcome::Absent, "the emulated device does no DMA")
        }
        _ => v(
            "dma",
            Outcome::Absent,
            format!(
                "{} MiB of guest RAM DMA-mapped, but gpupass drives no DMA engine on {} (it does on QEMU's edu)",
                r.dma_mapped >> 20,
                r.presented_ids
            ),
        ),
    }
}

fn isolation(r: &BootReport) -> Verdict {
    match (&r.isolation, &r.firmware.isolation) {
        (Some(i), _) => {
            let result = match i.result {
                "pass" => Outcome::Pass,
                _ => Outcome::Fail,
            };
            v("isolation", result, i.reason.clone())
        }
        (None, Some(fw)) if fw.skipped.is_some() => v(
            "isolation",
            Outcome::Fail,
            format!(
                "the isolation probe could not run: {}",
                fw.skipped.as_deref().unwrap_or("?")
            ),
        ),
        _ => v(
            "isolation",
            Outcome::Absent,
            "needs a DMA engine gpupass can drive (QEMU's edu)",
        ),
    }
}

fn kind_present(irq: &IrqReport, index: u32) -> (bool, &'static str) {
    match index {
        irq::INDEX_INTX => (irq.pin != 0, "interrupt pin 0: no INTx"),
        irq::INDEX_MSI => (irq.msi_capability, "no MSI capability"),
        _ => (irq.msix_capability, "no MSI-X capability"),
    }
}

fn interrupt(r: &BootReport, index: u32) -> Verdict {
    let name: &'static str = irq::kind_name(index);
    let (present, why_absent) = kind_present(&r.irq, index);
    if !present {
        return v(name, Outcome::Absent, why_absent);
    }
    if !r.irq.irqchip {
        return v(
            name,
            Outcome::Fail,
            format!(
                "no in-kernel irqchip: {}",
                r.irq.error.as_deref().unwrap_or("unknown")
            ),
        );
    }
    let k = r.irq.kind(index);
    let errors = if k.errors.is_empty() {
        String::new()
    } else {
        format!("; {}", k.errors.join("; "))
    };
    let fw: Option<&FwIrq> = r.firmware.irqs.iter().find(|i| i.kind == name);
    let Some(fw) = fw else {
        return v(
            name,
            Outcome::Fail,
            format!("not tested: the firmware reported nothing for it{errors}"),
        );
    };
    if let Some(why) = &fw.skipped {
        let reason = match why.as_str() {
            "not-offered" if k.vectors == 0 => {
                format!("the device has it but VFIO offers no {name} vectors (VFIO_DEVICE_GET_IRQ_INFO count 0){errors}")
            }
            other => format!("not tested: {other}{errors}"),
        };
        return v(name, Outcome::Fail, reason);
    }
    let via = match fw.via.as_deref() {
        Some("device") => "raised by the device".to_string(),
        Some("host") if r.irq.host_trigger == "emulated" => "raised by gpupass's device model".to_string(),
        Some("host") => format!("raised from the host ({})", r.irq.host_trigger),
        other => format!("raised by {}", other.unwrap_or("?")),
    };
    let kvm = injections(r)
        .map(|(n, delivered, timer)| {
            format!(
                ", KVM irq_injections {n} over the interrupt tests: {delivered} delivered + {timer} timer"
            )
        })
        .unwrap_or_default();
    let path = match index {
        irq::INDEX_INTX => "irqfd + resample on IOAPIC pin 10",
        irq::INDEX_MSI => "MSI route + irqfd",
        _ => "MSI-X routes + irqfds",
    };
    let counted = format!("{}/{} delivered", fw.delivered, fw.expected);
    if fw.expected > 0 && fw.delivered == fw.expected && k.errors.is_empty() {
        v(name, Outcome::Pass, format!("{counted} ({via}; {path}{kvm})"))
    } else {
        v(
            name,
            Outcome::Fail,
            format!("{counted} within 500 ms each ({via}; {path}{kvm}){errors}"),
        )
    }
}

/// KVM's `irq_injections` over the interrupt tests, with the firmware's own total of
/// deliveries (every kind) and LAPIC timer interrupts, which together should equal it.
pub fn injections(r: &BootReport) -> Option<(u64, u64, u64)> {
    let n = *r.irq_kvm.as_ref()?.delta.get("irq_injections")?;
    let delivered = r.firmware.irqs.iter().map(|i| u64::from(i.delivered)).sum();
    Some((n, delivered, u64::from(r.firmware.irq_timer.unwrap_or(0))))
}

fn reset(r: &BootReport) -> Verdict {
    let Some(rr) = &r.reset else {
        return v("reset", Outcome::Absent, "the emulated device has no reset");
    };
    if !rr.wanted() {
        return v("reset", Outcome::Absent, rr.summary());
    }
    let result = if rr.passed() { Outcome::Pass } else { Outcome::Fail };
    v("reset", result, rr.summary())
}
