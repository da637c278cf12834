//! The DMA and isolation results of a run: what the firmware's edu test printed
//! ([`super::report::FwDma`], [`super::report::FwIso`]), what the VMM mapped, the marks' times
//! and the kernel's IOMMU fault lines ([`super::kmsg`]), judged.
//!
//! - `dma` passes when both transfers finished and every byte the device wrote back equals
//!   the pattern; the buffers are guest RAM, DMA-mapped at IOVA = GPA.
//! - `isolation` passes when the IOVA read lies outside every DMA-mapped range and the device
//!   got no data from it (its buffer came back as zeros, all-ones, or still holding the
//!   earlier pattern); `data` fails it; a copy back that did not arrive, or a transfer that never
//!   finished, leaves it `inconclusive`. The kernel's fault lines are reported beside it (the
//!   IOMMU's own word that it blocked the read) but do not decide it: reading them may need
//!   privileges the run does not have.

use super::kmsg::{self, KernelFaults};
use super::report::{FwDma, FwIso};
use serde::Serialize;

/// Environment variable that makes `boot` skip the DMA map of guest RAM (to show that the DMA
/// check fails when the device cannot reach guest memory).
pub(crate) const NO_DMA_MAP_ENV: &str = "GPUPASS_BOOT_NO_DMA_MAP";

/// Whether [`NO_DMA_MAP_ENV`] asks for the failing case: honoured only by a `testkit` build
/// (the tests' and the lab's), never by a release binary.
pub(crate) fn skip_map() -> bool {
    cfg!(feature = "testkit") && std::env::var_os(NO_DMA_MAP_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct DmaReport {
    /// The function on the guest's bus (`00:01.0`).
    pub device: String,
    /// Bytes each way (RAM -> device buffer, device buffer -> RAM).
    pub bytes: u64,
    pub source_iova: u64,
    pub destination_iova: u64,
    pub to_device_done: bool,
    pub from_device_done: bool,
    /// Bytes of the destination equal to the source.
    pub matched: u64,
    pub first_mismatch: Option<u64>,
    /// `pass` or `fail`.
    pub result: &'static str,
    pub reason: String,
    /// Both transfers, from the firmware's marks (the device's own pace: QEMU's edu finishes a
    /// transfer from a 100 ms timer).
    pub nanos: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct IsolationReport {
    pub device: String,
    /// The IOVA the device was told to read.
    pub iova: u64,
    pub bytes: u64,
    /// The IOVA lies outside every range gpupass DMA-mapped.
    pub outside_mapped: bool,
    /// What the device's buffer held after the read (`FW iso ... saw`).
    pub saw: String,
    /// `pass`, `fail` or `inconclusive`.
    pub result: &'static str,
    pub reason: String,
    pub nanos: Option<u64>,
    /// The kernel's IOMMU fault lines for this function during the run (all of the run's
    /// DMA faults: also those of a failed mapped copy).
    pub kernel_faults: Vec<String>,
    /// The kernel fault line for this IOVA, when the kernel logged one.
    pub kernel_fault_at_iova: Option<String>,
}

/// Judge the mapped copy. `mapped`: bytes of guest RAM DMA-mapped (0: none).
pub(crate) fn judge_dma(fw: &FwDma, mapped: u64, skipped_map: bool, nanos: Option<u64>) -> Option<DmaReport> {
    if fw.skipped.is_some() {
        return None;
    }
    let to = fw.to_device_polls.is_some();
    let from = fw.from_device_polls.is_some();
    let all = fw.bytes > 0 && fw.matched == fw.bytes;
    let (result, reason) = if to && from && all {
        (
            "pass",
            format!(
                "{} bytes copied RAM -> device -> RAM through the IOMMU, all equal",
                fw.bytes
            ),
        )
    } else {
        let why = if !to {
            "the RAM -> device transfer never finished".to_string()
        } else if !from {
            "the device -> RAM transfer never finished".to_string()
        } else {
            format!(
                "{} of {} bytes came back equal (first difference at +{:#x})",
                fw.matched,
                fw.bytes,
                fw.first_mismatch.unwrap_or(0)
            )
        };
        let map = if skipped_map {
            format!("; guest RAM was not DMA-mapped ({NO_DMA_MAP_ENV} set)")
        } else if mapped == 0 {
            "; no guest RAM was DMA-mapped".to_string()
        } else {
            String::new()
        };
        ("fail", format!("{why}{map}"))
    };
    Some(DmaReport {
        device: fw.device.clone().unwrap_or_default(),
        bytes: fw.bytes,
        source_iova: super::memory::DMA_SRC,
        destination_iova: super::memory::DMA_DST,
        to_device_done: to,
        from_device_done: from,
        matched: fw.matched,
        first_mismatch: fw.first_mismatch,
        result,
        reason,
        nanos,
    })
}

/// Judge the read from an unmapped IOVA. `mapped`: the DMA-mapped ranges (IOVA, length);
/// `host_bdf`: the host function, to pick its lines from `faults`.
pub(crate) fn judge_isolation(
    fw: &FwIso,
    mapped: &[(u64, u64)],
    nanos: Option<u64>,
    faults: Option<&KernelFaults>,
    host_bdf: Option<&str>,
) -> Option<IsolationReport> {
    if fw.skipped.is_some() {
        return None;
    }
    let iova = fw.iova?;
    let end = iova.saturating_add(fw.bytes.max(1));
    let outside = mapped
        .iter()
        .all(|&(a, l)| end <= a || iova >= a.saturating_add(l));
    let saw = fw.saw.clone().unwrap_or_default();
    let (result, reason) = if !outside {
        (
            "inconclusive",
            format!("IOVA {iova:#x} lies inside a DMA-mapped range"),
        )
    } else if fw.read_polls.is_none() || fw.copy_back_polls.is_none() {
        ("inconclusive", "a transfer never finished".to_string())
    } else {
        match saw.as_str() {
            "zeros" | "ones" => ("pass", format!("the device read no data from unmapped IOVA {iova:#x} (its buffer came back as {saw})")),
            "unchanged" => ("pass", format!("the device read no data from unmapped IOVA {iova:#x} (its buffer kept the earlier pattern)")),
            "data" => ("fail", format!("the device read data from unmapped IOVA {iova:#x}: the IOMMU did not block it")),
            "no-copy-back" => ("inconclusive", "the copy of the device buffer back to RAM did not arrive".to_string()),
            other => ("inconclusive", format!("unknown outcome {other:?}")),
        }
    };
    let mine: Vec<String> = match (faults, host_bdf) {
        (Some(f), Some(b)) => kmsg::lines_for(f, b).into_iter().map(str::to_string).collect(),
        (Some(f), None) => f.lines.clone(),
        _ => Vec::new(),
    };
    let at = format!("fault addr {iova:#x} ");
    let at_iova = mine
        .iter()
        .find(|l| l.contains(&at) || l.ends_with(&at[..at.len() - 1]))
        .cloned();
    Some(IsolationReport {
        device: fw.device.clone().unwrap_or_default(),
        iova,
        bytes: fw.bytes,
        outside_mapped: outside,
        saw,
        result,
        reason,
        nanos,
        kernel_faults: mine,
        kernel_fault_at_iova: at_iova,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fw_dma(matched: u64) -> FwDma {
        FwDma {
            device: Some("00:01.0".into()),
            bytes: 4096,
            to_device_polls: Some(3),
            from_device_polls: Some(4),
            matched,
            first_mismatch: (matched < 4096).then_some(0),
            seed: Some(1),
            skipped: None,
        }
    }

    #[test]
    fn the_copy_passes_only_when_every_byte_matches() {
        let r = judge_dma(&fw_dma(4096), 64 << 20, false, Some(5)).unwrap();
        assert_eq!(r.result, "pass");
        let r = judge_dma(&fw_dma(16), 0, true, None).unwrap();
        assert_eq!(r.result, "fail");
        assert!(
            r.reason.contains("16 of 4096") && r.reason.contains(NO_DMA_MAP_ENV),
            "{}",
            r.reason
        );
        let mut t = fw_dma(4096);
        t.from_device_polls = None;
        assert!(judge_dma(&t, 1, false, None)
            .unwrap()
            .reason
            .contains("never finished"));
        let skipped = FwDma {
            skipped: Some("no-bar0".into()),
            ..FwDma::default()
        };
        assert!(judge_dma(&skipped, 1, false, None).is_none());
    }

    #[test]
    fn isolation_needs_an_unmapped_iova_and_no_data() {
        let fw = |saw: &str, iova| FwIso {
            device: Some("00:01.0".into()),
            iova: Some(iova),
            bytes: 4096,
            read_polls: Some(1),
            copy_back_polls: Some(1),
            saw: Some(saw.into()),
            skipped: None,
        };
        let mapped = [(0, 64 << 20)];
        let faults = KernelFaults {
            lines: vec![
                "DMAR: [DMA Read NO_PASID] Request device [00:06.0] fault addr 0x4000000 [fault reason 0x06] PTE Read access is not set".into(),
                "DMAR: [DMA Read NO_PASID] Request device [00:07.0] fault addr 0x4000000 [fault reason 0x06] PTE Read access is not set".into(),
            ],
            ..KernelFaults::default()
        };
        let r = judge_isolation(
            &fw("zeros", 64 << 20),
            &mapped,
            None,
            Some(&faults),
            Some("0000:00:06.0"),
        )
        .unwrap();
        assert_eq!((r.result, r.outside_mapped), ("pass", true));
        assert_eq!(r.kernel_faults.len(), 1, "only this function's lines");
        assert!(r.kernel_fault_at_iova.is_some());
        assert_eq!(
            judge_isolation(&fw("data", 64 << 20), &mapped, None, None, None)
                .unwrap()
                .result,
            "fail"
        );
        assert_eq!(
            judge_isolation(&fw("unchanged", 64 << 20), &mapped, None, None, None)
                .unwrap()
                .result,
            "pass"
        );
        let inside = judge_isolation(&fw("zeros", 0x1000), &mapped, None, None, None).unwrap();
        assert_eq!((inside.result, inside.outside_mapped), ("inconclusive", false));
        assert_eq!(
            judge_isolation(&fw("no-copy-back", 64 << 20), &mapped, None, None, None)
                .unwrap()
                .result,
            "inconclusive"
        );
    }
}
