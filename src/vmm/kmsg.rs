//! The kernel's IOMMU fault lines over a run, from `/dev/kmsg`.
//!
//! A cursor is opened before the vCPU starts: non-blocking, positioned at the end of the log
//! (`SEEK_END`), so only records logged during the run are read. After the run the records
//! are read until the log is drained (`EAGAIN`) or [`MAX_RECORDS`] were read, and those that
//! report a DMA fault (Intel `DMAR: [DMA Read|Write ...] Request device [..] fault addr ..`,
//! AMD `AMD-Vi: Event logged [IO_PAGE_FAULT ...]`, the generic `iommu ... fault`) are kept.
//! Reading `/dev/kmsg` needs CAP_SYSLOG where `kernel.dmesg_restrict` is set; without it the
//! report says why and the check carries on without the kernel's word.

use serde::Serialize;
use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// At most this many records are read after a run (a bound on the work, not on the faults:
/// the kernel rate-limits DMAR fault lines itself).
pub(crate) const MAX_RECORDS: usize = 4096;
/// At most this many fault lines are kept.
pub(crate) const MAX_LINES: usize = 64;

/// The IOMMU fault lines the kernel logged during the run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct KernelFaults {
    /// Where they were read (`/dev/kmsg`).
    pub source: String,
    /// Why the log could not be read (then `lines` is empty and says nothing).
    pub error: Option<String>,
    /// The fault lines, message text only, in log order.
    pub lines: Vec<String>,
    /// Records read after the run (all kinds).
    pub records: usize,
    /// Records were lost to the ring buffer's wrap (`EPIPE`) or the bound was reached.
    pub incomplete: bool,
}

/// A position in the kernel log, taken before the run.
/// Why the kernel log cannot be followed (the report says so; the run goes on).
#[derive(Debug, thiserror::Error)]
pub(crate) enum KmsgError {
    #[error("cannot open {}", .path.display())]
    Open {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot seek to the end of {}", .path.display())]
    Seek {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug)]
pub(crate) struct Cursor {
    file: File,
    source: String,
}

impl Cursor {
    /// Open `path` (the live host's `/dev/kmsg`) at its end; `Err`: why not.
    pub(crate) fn open(path: &Path) -> Result<Cursor, KmsgError> {
        let source = path.display().to_string();
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| KmsgError::Open {
                path: path.to_path_buf(),
                source: e,
            })?;
        file.seek(SeekFrom::End(0)).map_err(|e| KmsgError::Seek {
            path: path.to_path_buf(),
            source: e,
        })?;
        Ok(Cursor { file, source })
    }

    /// Read what was logged since [`Cursor::open`] and keep the IOMMU fault lines.
    pub(crate) fn faults(mut self) -> KernelFaults {
        let mut out = KernelFaults {
            source: self.source.clone(),
            ..KernelFaults::default()
        };
        // One record per read; 8 KiB is more than the kernel's record limit (1 KiB + dict).
        let mut buf = vec![0u8; 8192];
        while out.records < MAX_RECORDS {
            match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    out.records += 1;
                    if let Some(msg) = record_message(&buf[..n]) {
                        if is_iommu_fault(&msg) && out.lines.len() < MAX_LINES {
                            out.lines.push(msg);
                        }
                    }
                }
                // EPIPE: records were overwritten before we read them; the next read goes on.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => out.incomplete = true,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    out.error = Some(format!("reading {}: {e}", self.source));
                    break;
                }
            }
        }
        if out.records >= MAX_RECORDS {
            out.incomplete = true;
        }
        out
    }
}

/// The message of one `/dev/kmsg` record (`prio,seq,usec,flags[,..];text\n[ KEY=value\n]...`):
/// the text up to the first newline, `\xNN` escapes left as they are.
pub(crate) fn record_message(rec: &[u8]) -> Option<String> {
    let s = String::from_utf8_lossy(rec);
    let (_, rest) = s.split_once(';')?;
    Some(rest.split('\n').next().unwrap_or("").to_string())
}

/// A line that reports a DMA fault of an IOMMU.
pub(crate) fn is_iommu_fault(msg: &str) -> bool {
    (msg.starts_with("DMAR: [DMA ") && msg.contains(" fault addr "))
        || (msg.contains("AMD-Vi") && msg.contains("IO_PAGE_FAULT"))
        || (msg.contains("DMAR:") && msg.contains("fault addr"))
}

/// The lines that name the PCI function `bdf` (`0000:00:06.0`; DMAR prints `[00:06.0]`).
pub(crate) fn lines_for<'a>(faults: &'a KernelFaults, bdf: &str) -> Vec<&'a str> {
    let short = bdf.split_once(':').map_or(bdf, |(_, s)| s);
    faults
        .lines
        .iter()
        .map(String::as_str)
        .filter(|l| l.contains(&format!("[{short}]")) || l.contains(bdf))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_fault_lines() {
        let rec = b"3,1234,5678901,-,caller=T1;DMAR: [DMA Read NO_PASID] Request device [00:06.0] fault addr 0x4000000 [fault reason 0x06] PTE Read access is not set\n SUBSYSTEM=pci\n";
        let m = record_message(rec).unwrap();
        assert!(m.starts_with("DMAR: [DMA Read NO_PASID]"), "{m}");
        assert!(!m.contains("SUBSYSTEM"));
        assert!(is_iommu_fault(&m));
        assert!(is_iommu_fault(
            "vfio-pci 0000:00:06.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0001 address=0x4000000 flags=0x0000]"
        ));
        assert!(!is_iommu_fault("DMAR: DRHD: handling fault status reg 2"));
        assert!(!is_iommu_fault("vfio-pci 0000:00:06.0: enabling device"));
        assert_eq!(record_message(b"no separator"), None);
        let f = KernelFaults {
            lines: vec![
                m.clone(),
                "DMAR: [DMA Write NO_PASID] Request device [00:07.0] fault addr 0x1".into(),
            ],
            ..KernelFaults::default()
        };
        assert_eq!(lines_for(&f, "0000:00:06.0"), vec![m.as_str()]);
    }

    #[test]
    fn a_cursor_reads_only_what_follows_it() {
        // A regular file stands in for /dev/kmsg: the cursor starts at its end, so nothing
        // written before counts; reading a regular file returns whole chunks, not records, so
        // only the open/seek/drain path is exercised here.
        let dir = std::env::temp_dir().join(format!("gpupass-kmsg-{}", std::process::id()));
        std::fs::write(
            &dir,
            b"3,1,1,-;DMAR: [DMA Read NO_PASID] Request device [00:06.0] fault addr 0x1\n",
        )
        .unwrap();
        let c = Cursor::open(&dir).unwrap();
        let f = c.faults();
        assert_eq!((f.records, f.lines.len(), f.error.clone()), (0, 0, None));
        std::fs::remove_file(&dir).unwrap();
        assert!(Cursor::open(Path::new("/nonexistent/kmsg"))
            .unwrap_err()
            .to_string()
            .contains("cannot open"));
    }
}
