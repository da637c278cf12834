//! KVM's own per-vCPU counters, read through the binary statistics interface
//! (`KVM_GET_STATS_FD`, Linux 5.14+; Documentation/virt/kvm/api.rst, "KVM_GET_STATS_FD").
//!
//! gpupass counts the exits that return to it from `KVM_RUN`; KVM counts every exit, those it
//! handles in the kernel too (host interrupts, nested page faults, emulation). A claim such as
//! "the reads of a mapped BAR do not exit" rests on KVM's `mmio_exits` and `exits`, read here
//! before and after the window.
//!
//! File layout (all little-endian, read with `pread`): a `kvm_stats_header` at offset 0
//! (`flags`, `name_size`, `num_desc`, `id_offset`, `desc_offset`, `data_offset`, each u32); at
//! `desc_offset`, `num_desc` descriptors of `16 + name_size` bytes (`flags` u32, `exponent` i16,
//! `size` u16, `offset` u32, `bucket_size` u32, then the NUL-padded name); at `data_offset` the
//! values, `size` u64s per statistic at `data_offset + offset`. The descriptors never change
//! for an fd, the data does.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

/// The counters gpupass reports (x86 vCPU statistics, `arch/x86/kvm/x86.c`).
pub(crate) const REPORTED: &[&str] = &[
    "exits",
    "mmio_exits",
    "io_exits",
    "irq_exits",
    "halt_exits",
    "halt_wakeup",
    "signal_exits",
    "request_irq_exits",
    "insn_emulation",
    "irq_injections",
];

vmm_sys_util::ioctl_io_nr!(KVM_GET_STATS_FD, kvm_bindings::KVMIO, 0xce);

/// An open stats fd with its descriptors resolved to the [`REPORTED`] names.
pub(crate) struct StatsReader {
    file: File,
    data_offset: u64,
    /// (name, offset of its first u64 in the data block)
    wanted: Vec<(&'static str, u64)>,
}

/// A reading: counter name -> value.
pub(crate) type Snapshot = BTreeMap<&'static str, u64>;

/// Counters read before and after a window, and their difference.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct KvmCounts {
    /// Where the numbers come from, for a reader of the JSON.
    pub source: &'static str,
    pub delta: Snapshot,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

/// Parse the descriptor block of a stats file: (name, offset of its first value in the data
/// block) for every statistic with at least one value.
pub(crate) fn parse_layout(descs: &[u8], name_size: usize) -> Vec<(String, u64)> {
    let step = 16 + name_size;
    let mut out = Vec::new();
    for d in descs.chunks_exact(step) {
        let (Some(size), Some(offset)) = (u16_at(d, 6), u32_at(d, 8)) else {
            continue;
        };
        if size == 0 {
            continue;
        }
        let name = &d[16..];
        let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        if let Ok(n) = std::str::from_utf8(&name[..end]) {
            out.push((n.to_string(), u64::from(offset)));
        }
    }
    out
}

impl StatsReader {
    /// `KVM_GET_STATS_FD` on a vCPU fd; `None` where the kernel lacks it (before 5.14).
    pub(crate) fn open(vcpu: &impl AsRawFd) -> Option<StatsReader> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new descriptor (or -1);
        // `vcpu` is an open vCPU fd for the duration of the call.
        let fd = unsafe { vmm_sys_util::ioctl::ioctl(vcpu, KVM_GET_STATS_FD()) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        let mut head = [0u8; 24];
        file.read_exact_at(&mut head, 0).ok()?;
        let name_size = u32_at(&head, 4)? as usize;
        let num_desc = u32_at(&head, 8)? as usize;
        let desc_offset = u32_at(&head, 16)?;
        let data_offset = u32_at(&head, 20)?;
        if name_size > 4096 || num_desc > 4096 {
            return None;
        }
        let mut descs = vec![0u8; num_desc * (16 + name_size)];
        file.read_exact_at(&mut descs, u64::from(desc_offset)).ok()?;
        let layout = parse_layout(&descs, name_size);
        let wanted = REPORTED
            .iter()
            .filter_map(|w| layout.iter().find(|(n, _)| n == w).map(|(_, off)| (*w, *off)))
            .collect();
        Some(StatsReader {
            file,
            data_offset: u64::from(data_offset),
            wanted,
        })
    }

    /// The reported counters now.
    pub(crate) fn read(&self) -> Snapshot {
        let mut s = Snapshot::new();
        for (name, off) in &self.wanted {
            let mut b = [0u8; 8];
            if self.file.read_exact_at(&mut b, self.data_offset + off).is_ok() {
                s.insert(*name, u64::from_le_bytes(b));
            }
        }
        s
    }
}

/// `after - before` per counter.
pub(crate) fn delta(before: &Snapshot, after: &Snapshot) -> KvmCounts {
    KvmCounts {
        source: "KVM_GET_STATS_FD (the vCPU's own counters)",
        delta: after
            .iter()
            .map(|(k, v)| (*k, v.saturating_sub(before.get(k).copied().unwrap_or(0))))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(name: &str, size: u16, offset: u32, name_size: usize) -> Vec<u8> {
        let mut d = vec![0u8; 16 + name_size];
        d[6..8].copy_from_slice(&size.to_le_bytes());
        d[8..12].copy_from_slice(&offset.to_le_bytes());
        d[16..16 + name.len()].copy_from_slice(name.as_bytes());
        d
    }

    #[test]
    fn layout_names_and_offsets() {
        let ns = 48;
        let mut descs = desc("exits", 1, 0, ns);
        descs.extend(desc("halt_poll_success_hist", 0, 8, ns));
        descs.extend(desc("mmio_exits", 1, 16, ns));
        let l = parse_layout(&descs, ns);
        assert_eq!(l, vec![("exits".to_string(), 0), ("mmio_exits".to_string(), 16)]);
    }

    #[test]
    fn deltas() {
        let before: Snapshot = [("exits", 10), ("mmio_exits", 4)].into_iter().collect();
        let after: Snapshot = [("exits", 13), ("mmio_exits", 4)].into_iter().collect();
        let d = delta(&before, &after);
        assert_eq!(d.delta["exits"], 3);
        assert_eq!(d.delta["mmio_exits"], 0);
    }
}
