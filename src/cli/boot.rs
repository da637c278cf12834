//! `gpupass boot`: run the VMM ([`crate::vmm`]) and render its result.
//!
//! Without `--json` the guest's serial console is streamed to stdout as it is written and a
//! summary goes to stderr; with `--json` stdout carries only the [`BootReport`]. The exit
//! status is the firmware's (port 0x501). With `--check` stdout carries one verdict line per
//! capability instead (or, with `--json`, the [`vmm::verdict::CheckReport`]).

use crate::host::HostRoot;
use crate::model::Inventory;
use crate::vmm::{self, BootOptions, BootReport, VmmError};
use std::io::Write;

/// Boot and print; returns the firmware's status, or with `check` the self-test's: 0 when no
/// verdict is `fail`, 1 otherwise ([`vmm::verdict`]).
pub fn run(
    host: &HostRoot,
    inv: Option<&Inventory>,
    opts: &BootOptions,
    json: bool,
    check: bool,
    out: &mut dyn Write,
) -> Result<i32, VmmError> {
    if check {
        let report = vmm::verdict::CheckReport::new(vmm::boot(host, inv, opts, None)?);
        if json {
            let _ = serde_json::to_writer_pretty(&mut *out, &report);
            let _ = writeln!(out);
        } else {
            let _ = write!(out, "{}", report.lines());
        }
        return Ok(if report.ok { 0 } else { 1 });
    }
    let report = if json {
        vmm::boot(host, inv, opts, None)?
    } else {
        vmm::boot(host, inv, opts, Some(out))?
    };
    if json {
        let _ = serde_json::to_writer_pretty(&mut *out, &report);
        let _ = writeln!(out);
    } else {
        let _ = out.flush();
        eprint!("{}", summary(&report));
    }
    Ok(i32::from(report.status))
}

use crate::vmm::report::size;

/// The human summary printed after the console.
pub fn summary(r: &BootReport) -> String {
    let mut s = format!(
        "gpupass: {}: firmware exited with status {} after {:.2} ms (setup {:.2} ms)\n",
        r.device,
        r.status,
        r.timing.run_us as f64 / 1000.0,
        r.timing.setup_us as f64 / 1000.0
    );
    if let Some(b) = r.backend {
        s.push_str(&format!(
            "gpupass: VFIO backend {b}: {}\n",
            r.vfio_nodes.join(" + ")
        ));
    }
    match r.mmio64_window {
        Some(w) => s.push_str(&format!(
            "gpupass: guest physical address width {} bits (CPUID); 64-bit BARs go to {:#x}-{:#x}\n",
            r.guest_phys_bits, w.base, w.limit
        )),
        None => s.push_str(&format!(
            "gpupass: guest physical address width {} bits (CPUID): no room for BARs above 4 GiB\n",
            r.guest_phys_bits
        )),
    }
    if let Some(rr) = &r.reset {
        s.push_str(&format!("gpupass: {}\n", rr.summary()));
    }
    let kinds: Vec<String> = r.exits.by_kind.iter().map(|(k, v)| format!("{k} {v}")).collect();
    s.push_str(&format!(
        "gpupass: {} VM exits: {}\n",
        r.exits.total,
        kinds.join(", ")
    ));
    for sl in &r.slots {
        match sl.gpa {
            Some(g) => s.push_str(&format!(
                "gpupass: BAR{} +{:#x} ({}) mapped as KVM slot {} at {g:#x}: guest accesses do not exit\n",
                sl.bar,
                sl.offset,
                size(sl.size),
                sl.slot
            )),
            None => s.push_str(&format!(
                "gpupass: BAR{} +{:#x} ({}) not mapped (BAR not decoded)\n",
                sl.bar,
                sl.offset,
                size(sl.size)
            )),
        }
    }
    for t in &r.trapped {
        s.push_str(&format!("gpupass: BAR{} trapped: {}\n", t.bar, t.reason));
    }
    if let (Some(w), Some(l)) = (&r.read_loop, &r.firmware.read_loop) {
        let per = if l.count > 0 {
            w.exits.total as f64 / l.count as f64
        } else {
            0.0
        };
        s.push_str(&format!(
            "gpupass: read loop: {} reads of BAR{} in {:.2} ms, {} VM exits ({per:.2} per read)\n",
            l.count,
            l.bar.map_or("?".to_string(), |b| b.to_string()),
            w.nanos as f64 / 1e6,
            w.exits.total
        ));
    }
    if let Some(k) = r.read_loop.as_ref().and_then(|w| w.kvm.as_ref()) {
        let v = |n: &str| k.delta.get(n).copied().unwrap_or(0);
        s.push_str(&format!(
            "gpupass: read loop, as KVM counted it (KVM_GET_STATS_FD, the end mark included): {} exits, {} MMIO, {} I/O, {} host-interrupt\n",
            v("exits"),
            v("mmio_exits"),
            v("io_exits"),
            v("irq_exits")
        ));
    }
    if r.dma_map_skipped {
        s.push_str(&format!(
            "gpupass: guest RAM NOT DMA-mapped ({} set): the device cannot reach guest memory\n",
            vmm::dma::NO_DMA_MAP_ENV
        ));
    }
    if let Some(d) = &r.dma {
        s.push_str(&format!(
            "gpupass: DMA: {}: {}{}\n",
            d.result,
            d.reason,
            d.nanos.map_or(String::new(), |n| format!(
                ", {:.1} ms for both transfers",
                n as f64 / 1e6
            ))
        ));
    }
    if let Some(i) = &r.isolation {
        let kernel = match (&r.kernel_faults, &i.kernel_fault_at_iova) {
            (_, Some(l)) => format!("; the kernel logged: {l}"),
            (Some(k), None) if k.error.is_some() => {
                format!(
                    "; the kernel's fault log was not readable ({})",
                    k.error.as_deref().unwrap_or("")
                )
            }
            _ => "; the kernel logged no IOMMU fault for it".to_string(),
        };
        s.push_str(&format!(
            "gpupass: isolation: {}: {}{kernel}\n",
            i.result, i.reason
        ));
    }
    if !r.firmware.done {
        s.push_str("gpupass: warning: the firmware did not print `FW done`\n");
    }
    s
}
