//! `gpupass boot --check`: one verdict per capability a guest driver needs, judged from a
//! [`BootReport`] (what the firmware saw, what the VMM and the kernel did, KVM's counters).
//!
//! The names (`config`, `bars`, `dma`, `isolation`, `msi-x`, `msi`, `intx`, `reset`) and the
//! results are an interface: scripts read them.
//!
//! - `pass`: tested, and it worked.
//! - `fail`: tested (or due to be), and it did not work.
//! - `absent`: the device does not have the capability, by its own config space (no BAR
//!   implemented; Bus Master Enable hard-wired to 0: no DMA; no MSI / MSI-X capability in the
//!   list; Interrupt Pin 0: no INTx) or, for `reset`, by the kernel (no reset method).
//! - `untested`: the device has it, but gpupass cannot exercise it on this device; the reason
//!   says why and what would test it. Today: DMA and isolation on anything but QEMU's edu,
//!   whose DMA engine is the one the firmware can drive; an interrupt kind the device was not
//!   made to raise itself (anything but edu's INTx and MSI and e1000e's MSI-X), which the host
//!   raised through VFIO's software trigger even when every vector arrived.
//!
//! The exit status is 1 when a verdict is `fail`, and with `--strict` also when one is
//! `untested`: a self-test that did not test what the device has does not pass under
//! `--strict`.

use super::irq::{self, IrqReport};
use super::report::{size, FwIrq};
use super::BootReport;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Outcome {
    Pass,
    Fail,
    Absent,
    Untested,
}

impl Outcome {
    pub(crate) fn word(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::Absent => "absent",
            Outcome::Untested => "untested",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Verdict {
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

/// How many verdicts have each result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Counts {
    pub pass: usize,
    pub fail: usize,
    pub absent: usize,
    pub untested: usize,
}

impl Counts {
    pub(crate) fn of(verdicts: &[Verdict]) -> Counts {
        let n = |o: Outcome| verdicts.iter().filter(|v| v.result == o).count();
        Counts {
            pass: n(Outcome::Pass),
            fail: n(Outcome::Fail),
            absent: n(Outcome::Absent),
            untested: n(Outcome::Untested),
        }
    }
}

/// The `--check --json` document.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CheckReport {
    pub device: String,
    /// `--strict`: an `untested` verdict fails the check too.
    pub strict: bool,
    /// The check passed (exit status 0): no verdict is `fail` and, with `strict`, none is
    /// `untested`.
    pub ok: bool,
    /// Verdicts per result.
    pub summary: Counts,
    pub verdicts: Vec<Verdict>,
    pub boot: BootReport,
}

impl CheckReport {
    pub(crate) fn new(boot: BootReport, strict: bool) -> CheckReport {
        let verdicts = judge(&boot);
        let summary = Counts::of(&verdicts);
        CheckReport {
            device: boot.device.clone(),
            strict,
            ok: passed(&summary, strict),
            summary,
            verdicts,
            boot,
        }
    }

    /// The text form: one `NAME RESULT REASON` line per verdict, names and results padded to
    /// one column.
    pub(crate) fn lines(&self) -> String {
        let mut s = String::new();
        for x in &self.verdicts {
            s.push_str(&format!("{:<9} {:<8} {}\n", x.check, x.result.word(), x.reason));
        }
        s
    }

    /// The summary for stderr: the count of each result, and under `--strict` what went
    /// untested.
    pub(crate) fn summary_lines(&self) -> String {
        let c = &self.summary;
        let mut s = format!(
            "gpupass: boot --check: {} pass, {} fail, {} absent, {} untested\n",
            c.pass, c.fail, c.absent, c.untested
        );
        if self.strict && c.untested > 0 {
            let names: Vec<&str> = self
                .verdicts
                .iter()
                .filter(|v| v.result == Outcome::Untested)
                .map(|v| v.check)
                .collect();
            s.push_str(&format!(
                "gpupass: --strict: {} untested ({}): the device has them and gpupass could not test them here\n",
                c.untested,
                names.join(", ")
            ));
        }
        s
    }
}

/// The check's pass rule: nothing failed, and under `strict` nothing went untested.
pub(crate) fn passed(c: &Counts, strict: bool) -> bool {
    c.fail == 0 && !(strict && c.untested > 0)
}

/// Every verdict, in the order they are printed (the names are the interface, see above).
pub(crate) fn judge(r: &BootReport) -> Vec<Verdict> {
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

/// Whether the function cannot do DMA, by its config space: Bus Master Enable hard-wired to 0
/// (a function that initiates no requests may hard-wire it; one with MSI or MSI-X cannot, as
/// those are memory writes). `Some(reason)` when it cannot.
fn no_dma(r: &BootReport) -> Option<String> {
    if r.backend.is_none() && r.dma_mapped == 0 && r.bus_master.is_some() {
        // --emulated: gpupass's own device model, which has no DMA engine (its Bus Master
        // Enable is writable for its MSI only).
        return Some("the emulated device has no DMA engine (gpupass's own model)".to_string());
    }
    match r.bus_master {
        Some(b) if !b.capable => Some(format!(
            "Bus Master Enable (Command register bit 2) is hard-wired to 0: it read 0 after a write of 1 (Command {:#06x}), so the function cannot initiate DMA",
            b.command
        )),
        _ => None,
    }
}

/// Why gpupass cannot test DMA on this device (it has it: Bus Master Enable is writable).
fn dma_untested(r: &BootReport) -> String {
    format!(
        "the function can master DMA (Bus Master Enable writable), but gpupass drives no DMA engine on {} (only QEMU's edu 1234:11e8: a device's DMA engine is device-specific); {} MiB of guest RAM was DMA-mapped",
        r.presented_ids,
        r.dma_mapped >> 20
    )
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
        _ => match no_dma(r) {
            Some(why) => v("dma", Outcome::Absent, why),
            None => v("dma", Outcome::Untested, dma_untested(r)),
        },
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
        _ => match no_dma(r) {
            Some(why) => v("isolation", Outcome::Absent, why),
            None => v(
                "isolation",
                Outcome::Untested,
                format!(
                    "the probe makes the device read an unmapped IOVA, which needs a DMA engine gpupass can drive (QEMU's edu); {}",
                    dma_untested(r)
                ),
            ),
        },
    }
}

fn kind_present(irq: &IrqReport, index: u32) -> (bool, &'static str) {
    match index {
        irq::INDEX_INTX => (
            irq.pin != 0,
            "Interrupt Pin (config 0x3d) is 0: the function has no INTx",
        ),
        irq::INDEX_MSI => (
            irq.msi_capability,
            "no MSI capability (ID 0x05) in the config space's capability list",
        ),
        _ => (
            irq.msix_capability,
            "no MSI-X capability (ID 0x11) in the config space's capability list",
        ),
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
    let counted_by_kvm = injections(r);
    let kvm = match counted_by_kvm {
        Some((n, delivered, timer)) => format!(
            ", KVM irq_injections {n} over the interrupt tests: {delivered} delivered + {timer} timer"
        ),
        None => {
            ", KVM's counters not readable (KVM_GET_STATS_FD needs Linux 5.14+): deliveries not cross-checked"
                .to_string()
        }
    };
    let path = match index {
        irq::INDEX_INTX => "irqfd + resample on IOAPIC pin 10",
        irq::INDEX_MSI => "MSI route + irqfd",
        _ => "MSI-X routes + irqfds",
    };
    let counted = format!("{}/{} delivered", fw.delivered, fw.expected);
    // KVM's own count of what it put into the vCPU is the ground truth the firmware's count is
    // checked against: a delivery KVM never injected means the firmware's count cannot be
    // trusted. KVM can count one interrupt twice: when a VM exit interrupts an injected event's
    // delivery (a nested page fault on the IDT or the stack, frequent under nesting and load),
    // it re-injects the event and `irq_injections` goes up again (the vendor code's
    // complete_interrupts re-queues it). So more injections than deliveries is said, not failed.
    let kvm_short = counted_by_kvm.filter(|(n, delivered, timer)| *n < delivered + timer);
    if let Some((n, delivered, timer)) = kvm_short {
        v(
            name,
            Outcome::Fail,
            format!(
                "{counted} ({via}; {path}), but KVM injected {n} interrupts over the interrupt tests where the firmware counted {delivered} deliveries (every kind) + {timer} timer{errors}"
            ),
        )
    } else if fw.expected > 0 && fw.delivered == fw.expected && k.errors.is_empty() {
        let again = match counted_by_kvm {
            Some((n, delivered, timer)) if n > delivered + timer => format!(
                " ({} more than counted: re-injections of interrupted deliveries)",
                n - delivered - timer
            ),
            _ => String::new(),
        };
        let seen = format!("{counted} ({via}; {path}{kvm}{again})");
        if host_raised(r, fw) {
            // VFIO's software trigger (VFIO_DEVICE_SET_IRQS, DATA_NONE | ACTION_TRIGGER):
            // vfio-pci signals the vector's eventfd itself. The path from that eventfd to the
            // guest worked, but the device never raised anything, so the device's own
            // interrupt is not tested.
            v(
                name,
                Outcome::Untested,
                format!(
                    "{seen}: the host raised it (VFIO_DEVICE_SET_IRQS with DATA_NONE | ACTION_TRIGGER signals the vector's eventfd; the device raised nothing), which tests VFIO's eventfd -> KVM -> guest path only; testing the device's {name} needs the device itself to raise it, as QEMU's edu does for INTx and MSI (its raise register 0x60) and e1000e 8086:10d3 for MSI-X (its ICS register), and gpupass makes no {} raise it",
                    r.presented_ids
                ),
            )
        } else {
            v(name, Outcome::Pass, seen)
        }
    } else {
        v(
            name,
            Outcome::Fail,
            format!("{counted} within 500 ms each ({via}; {path}{kvm}){errors}"),
        )
    }
}

/// Whether the host raised the kind's vectors through VFIO's software trigger (the device did
/// not). The emulated device is gpupass's own model: its raise is the device's own, as edu's.
fn host_raised(r: &BootReport, fw: &FwIrq) -> bool {
    fw.via.as_deref() != Some("device") && r.irq.host_trigger != "emulated"
}

/// KVM's `irq_injections` over the interrupt tests, with the firmware's own total of
/// deliveries (every kind) and LAPIC timer interrupts, which together should equal it.
pub(crate) fn injections(r: &BootReport) -> Option<(u64, u64, u64)> {
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

#[cfg(test)]
mod tests;
