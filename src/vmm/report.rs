//! The firmware's `FW ...` console lines, parsed into the `--json` result of `gpupass boot`.
//!
//! Grammar (one line each; tokens separated by single spaces; numbers `0x`-hex unless noted):
//!
//! ```text
//! FW hello v3 ram <bytes> mmio <base>-<limit> mmio64 <base>-<limit> phys-bits <decimal>
//! FW dev <bb:dd.f> <vvvv>:<dddd> class <cccccc> hdr <hh>
//! FW bar <n, decimal> io|mem32|mem64 [pref] [addr <a>] size <s>
//!        (first <v> [last <v>] | first unmapped | unassigned)
//! FW dispi <bb:dd.f> <id>
//! FW loop <bb:dd.f> bar <n> count <decimal> last <v>   |   FW loop none <why>
//! FW dma <bb:dd.f> bytes <dec> to-device (ok polls <dec>|timeout) from-device (ok polls <dec>|timeout)
//!        match <dec> first-mismatch (<off>|none) seed <v>          |   FW dma none <why>
//! FW iso <bb:dd.f> iova <a> bytes <dec> read (ok polls <dec>|timeout) copy-back (...)
//!        saw zeros|ones|unchanged|no-copy-back|data              |   FW iso none <why>
//! FW done devices <decimal>
//! FW error <what>
//! ```
//! `bar` lines belong to the `dev` line before them. Other console lines are kept as they are.

use serde::Serialize;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct FwBar {
    pub index: u32,
    /// `io`, `mem32` or `mem64`.
    pub kind: String,
    pub prefetchable: bool,
    /// Guest address the firmware assigned; `null` when it did not fit the MMIO hole.
    pub address: Option<u64>,
    pub size: u64,
    /// First dword read through the BAR.
    pub first: Option<u64>,
    /// Last dword read through the BAR (memory BARs: at `address + size - 4`).
    pub last: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct FwDevice {
    /// Guest address on bus 0 (`00:01.0`).
    pub address: String,
    pub vendor_id: String,
    pub device_id: String,
    pub class: String,
    pub header_type: String,
    pub bars: Vec<FwBar>,
    /// Bochs VBE dispi ID (BAR2 + 0x500) for 1234:1111 devices.
    pub dispi_id: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct FwLoop {
    pub device: Option<String>,
    pub bar: Option<u32>,
    pub count: u64,
    pub last: Option<u64>,
    /// Why no loop ran (`no-memory-bar`...), when it did not.
    pub skipped: Option<String>,
}

/// The firmware's DMA test on edu: a pattern copied RAM -> device -> RAM.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct FwDma {
    pub device: Option<String>,
    pub bytes: u64,
    /// Polls of the command register until each transfer finished; `None`: it never did.
    pub to_device_polls: Option<u64>,
    pub from_device_polls: Option<u64>,
    /// Bytes of the destination equal to the source.
    pub matched: u64,
    pub first_mismatch: Option<u64>,
    pub seed: Option<u64>,
    /// Why no test ran, when it did not.
    pub skipped: Option<String>,
}

/// The firmware's isolation probe: a device read from an IOVA outside guest RAM, copied back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct FwIso {
    pub device: Option<String>,
    pub iova: Option<u64>,
    pub bytes: u64,
    pub read_polls: Option<u64>,
    pub copy_back_polls: Option<u64>,
    /// What the device buffer held afterwards: `zeros`, `ones`, `unchanged` (the pattern it
    /// had), `no-copy-back` (the copy back did not arrive either), `data` (anything else).
    pub saw: Option<String>,
    pub skipped: Option<String>,
}

/// One interrupt kind the firmware tested (or could not).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct FwIrq {
    pub device: Option<String>,
    /// `intx`, `msi` or `msi-x`.
    pub kind: String,
    /// Who raised it: `device` (the device itself, made to fire by the firmware) or `host`
    /// (the VMM on the firmware's request: VFIO's software trigger, or the emulated device).
    /// `boot --check` calls a kind VFIO's software trigger raised `untested`: the device did
    /// not raise it ([`super::verdict`]).
    pub via: Option<String>,
    pub expected: u32,
    pub delivered: u32,
    /// Why it was not tested (`not-offered`, `no-irqchip`...).
    pub skipped: Option<String>,
}

/// The firmware's MSI round-trip loop.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct FwIrqLoop {
    pub device: Option<String>,
    /// `device` or `host`, as for [`FwIrq`].
    pub via: Option<String>,
    pub count: u32,
    pub delivered: u32,
    pub skipped: Option<String>,
}

/// `ok polls N` / `timeout` at `t[i..]`: the polls and how many tokens were used.
fn polls(t: &[&str]) -> Option<(Option<u64>, usize)> {
    match t {
        ["ok", "polls", n, ..] => Some((Some(n.parse().ok()?), 3)),
        ["timeout", ..] => Some((None, 1)),
        _ => None,
    }
}

fn parse_dma(addr: &str, t: &[&str]) -> Option<FwDma> {
    let mut d = FwDma {
        device: Some(addr.to_string()),
        ..FwDma::default()
    };
    let mut i = 0;
    while i < t.len() {
        match t[i] {
            "bytes" => d.bytes = t.get(i + 1)?.parse().ok()?,
            "match" => d.matched = t.get(i + 1)?.parse().ok()?,
            "seed" => d.seed = Some(hex(t.get(i + 1)?)?),
            "first-mismatch" => {
                d.first_mismatch = match *t.get(i + 1)? {
                    "none" => None,
                    v => Some(hex(v)?),
                }
            }
            "to-device" | "from-device" => {
                let (p, n) = polls(&t[i + 1..])?;
                if t[i] == "to-device" {
                    d.to_device_polls = p;
                } else {
                    d.from_device_polls = p;
                }
                i += 1 + n;
                continue;
            }
            _ => return None,
        }
        i += 2;
    }
    Some(d)
}

fn parse_iso(addr: &str, t: &[&str]) -> Option<FwIso> {
    let mut d = FwIso {
        device: Some(addr.to_string()),
        ..FwIso::default()
    };
    let mut i = 0;
    while i < t.len() {
        match t[i] {
            "bytes" => d.bytes = t.get(i + 1)?.parse().ok()?,
            "iova" => d.iova = Some(hex(t.get(i + 1)?)?),
            "saw" => d.saw = Some(t.get(i + 1)?.to_string()),
            "read" | "copy-back" => {
                let (p, n) = polls(&t[i + 1..])?;
                if t[i] == "read" {
                    d.read_polls = p;
                } else {
                    d.copy_back_polls = p;
                }
                i += 1 + n;
                continue;
            }
            _ => return None,
        }
        i += 2;
    }
    Some(d)
}

/// What the firmware reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct FirmwareReport {
    pub hello: Option<String>,
    pub devices: Vec<FwDevice>,
    #[serde(rename = "loop")]
    pub read_loop: Option<FwLoop>,
    pub dma: Option<FwDma>,
    pub isolation: Option<FwIso>,
    /// `FW irq` lines, in order.
    pub irqs: Vec<FwIrq>,
    /// `FW irqloop ...`: the MSI round-trip loop.
    pub irq_loop: Option<FwIrqLoop>,
    /// `FW irq timer N`: LAPIC timer interrupts the firmware took (each a wait that ran out).
    pub irq_timer: Option<u32>,
    /// `FW note` lines: what the firmware saw when something did not work (diagnostics).
    pub notes: Vec<String>,
    /// An exception the firmware took (`FW fault vector N`), which ended it.
    pub fault: Option<String>,
    /// `FW done` seen: the firmware ran to its end.
    pub done: bool,
    pub errors: Vec<String>,
    /// `FW` lines that did not parse.
    pub unparsed: Vec<String>,
}

/// A byte count as people write it: the largest unit it is a whole multiple of.
pub(crate) fn size(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

fn hex(s: &str) -> Option<u64> {
    let t = s.strip_prefix("0x")?;
    if t.is_empty() || t.len() > 16 {
        return None;
    }
    u64::from_str_radix(t, 16).ok()
}

/// Parse the console transcript.
pub(crate) fn parse(console: &str) -> FirmwareReport {
    let mut r = FirmwareReport::default();
    for line in console.lines() {
        let Some(rest) = line.trim_end_matches('\r').strip_prefix("FW ") else {
            continue;
        };
        if !parse_line(&mut r, rest) {
            r.unparsed.push(line.to_string());
        }
    }
    r
}

fn parse_line(r: &mut FirmwareReport, rest: &str) -> bool {
    let t: Vec<&str> = rest.split(' ').collect();
    match t.as_slice() {
        ["hello", ..] => {
            r.hello = Some(rest.to_string());
            true
        }
        ["dev", addr, ids, "class", class, "hdr", hdr] => {
            let Some((v, d)) = ids.split_once(':') else {
                return false;
            };
            r.devices.push(FwDevice {
                address: addr.to_string(),
                vendor_id: v.to_string(),
                device_id: d.to_string(),
                class: class.to_string(),
                header_type: hdr.to_string(),
                bars: Vec::new(),
                dispi_id: None,
            });
            true
        }
        ["bar", idx, kind, more @ ..] => {
            let Some(dev) = r.devices.last_mut() else {
                return false;
            };
            let Ok(index) = idx.parse() else {
                return false;
            };
            let mut bar = FwBar {
                index,
                kind: kind.to_string(),
                ..FwBar::default()
            };
            let mut i = 0;
            let mut sized = false;
            while i < more.len() {
                match (more[i], more.get(i + 1)) {
                    ("pref", _) => {
                        bar.prefetchable = true;
                        i += 1;
                    }
                    ("unassigned", _) => i += 1,
                    ("addr", Some(v)) => {
                        bar.address = hex(v);
                        i += 2;
                    }
                    ("size", Some(v)) => {
                        bar.size = hex(v).unwrap_or(0);
                        sized = true;
                        i += 2;
                    }
                    ("first", Some(v)) => {
                        bar.first = hex(v);
                        i += 2;
                    }
                    ("last", Some(v)) => {
                        bar.last = hex(v);
                        i += 2;
                    }
                    _ => return false,
                }
            }
            if !sized {
                return false;
            }
            dev.bars.push(bar);
            true
        }
        ["dispi", addr, id] => match (r.devices.iter_mut().rev().find(|d| d.address == *addr), hex(id)) {
            (Some(d), Some(v)) => {
                d.dispi_id = Some(v);
                true
            }
            _ => false,
        },
        ["loop", "none", why] => {
            r.read_loop = Some(FwLoop {
                skipped: Some(why.to_string()),
                ..FwLoop::default()
            });
            true
        }
        ["loop", addr, "bar", bar, "count", count, "last", last] => {
            r.read_loop = Some(FwLoop {
                device: Some(addr.to_string()),
                bar: bar.parse().ok(),
                count: count.parse().unwrap_or(0),
                last: hex(last),
                skipped: None,
            });
            true
        }
        ["dma", "none", why] => {
            r.dma = Some(FwDma {
                skipped: Some(why.to_string()),
                ..FwDma::default()
            });
            true
        }
        ["dma", addr, more @ ..] => match parse_dma(addr, more) {
            Some(d) => {
                r.dma = Some(d);
                true
            }
            None => false,
        },
        ["iso", "none", why] => {
            r.isolation = Some(FwIso {
                skipped: Some(why.to_string()),
                ..FwIso::default()
            });
            true
        }
        ["iso", addr, more @ ..] => match parse_iso(addr, more) {
            Some(d) => {
                r.isolation = Some(d);
                true
            }
            None => false,
        },
        ["irqloop", "none", why] => {
            r.irq_loop = Some(FwIrqLoop {
                skipped: Some(why.to_string()),
                ..FwIrqLoop::default()
            });
            true
        }
        ["irqloop", addr, "msi", "via", via, "count", c, "delivered", d] => match (c.parse(), d.parse()) {
            (Ok(count), Ok(delivered)) => {
                r.irq_loop = Some(FwIrqLoop {
                    device: Some(addr.to_string()),
                    via: Some(via.to_string()),
                    count,
                    delivered,
                    skipped: None,
                });
                true
            }
            _ => false,
        },
        ["irq", "timer", n] => match n.parse() {
            Ok(n) => {
                r.irq_timer = Some(n);
                true
            }
            Err(_) => false,
        },
        ["irq", "none", why] => {
            r.irqs.push(FwIrq {
                skipped: Some(why.to_string()),
                ..FwIrq::default()
            });
            true
        }
        ["irq", addr, kind, "none", why] => {
            r.irqs.push(FwIrq {
                device: Some(addr.to_string()),
                kind: kind.to_string(),
                skipped: Some(why.to_string()),
                ..FwIrq::default()
            });
            true
        }
        ["irq", addr, kind, "via", via, "expected", e, "delivered", d] => match (e.parse(), d.parse()) {
            (Ok(expected), Ok(delivered)) => {
                r.irqs.push(FwIrq {
                    device: Some(addr.to_string()),
                    kind: kind.to_string(),
                    via: Some(via.to_string()),
                    expected,
                    delivered,
                    skipped: None,
                });
                true
            }
            _ => false,
        },
        ["note", ..] => {
            r.notes.push(rest.to_string());
            true
        }
        ["fault", "vector", v] => {
            r.fault = Some(v.to_string());
            true
        }
        ["done", ..] => {
            r.done = true;
            true
        }
        ["error", what @ ..] => {
            r.errors.push(what.join(" "));
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn firmware_lines_become_devices() {
        let console = "noise\nFW hello v3 ram 0x4000000 mmio 0xc0000000-0xfebfffff mmio64 0x100000000-0xffffffffff phys-bits 40\n\
            FW dev 00:00.0 1b36:0008 class 060000 hdr 00\n\
            FW dev 00:01.0 1234:1111 class 030000 hdr 00\n\
            FW bar 0 mem32 pref addr 0xc0000000 size 0x1000000 first 0x46504247 last 0x0\n\
            FW bar 2 mem32 addr 0xc1000000 size 0x1000 first 0xffffff00 last 0xffffffff\n\
            FW bar 4 mem64 pref size 0x40000000000 unassigned\n\
            FW bar 5 mem64 pref addr 0x400000000 size 0x400000000 first 0x1 last 0x2\n\
            FW dispi 00:01.0 0xb0c5\n\
            FW loop 00:01.0 bar 2 count 100000 last 0xffffff00\n\
            FW done devices 2\n";
        let r = parse(console);
        assert!(r.done);
        assert!(r.unparsed.is_empty(), "{:?}", r.unparsed);
        assert_eq!(r.devices.len(), 2);
        let d = &r.devices[1];
        assert_eq!((d.vendor_id.as_str(), d.device_id.as_str()), ("1234", "1111"));
        assert_eq!(d.dispi_id, Some(0xb0c5));
        assert_eq!(d.bars.len(), 4);
        assert_eq!(d.bars[0].address, Some(0xc000_0000));
        assert!(d.bars[0].prefetchable);
        assert_eq!(d.bars[1].first, Some(0xffff_ff00));
        assert_eq!(d.bars[1].last, Some(0xffff_ffff));
        assert_eq!(d.bars[2].address, None);
        assert_eq!(d.bars[2].size, 0x400_0000_0000);
        assert_eq!(d.bars[3].address, Some(0x4_0000_0000));
        assert_eq!((d.bars[3].first, d.bars[3].last), (Some(1), Some(2)));
        let l = r.read_loop.unwrap();
        assert_eq!((l.bar, l.count), (Some(2), 100_000));
    }

    #[test]
    fn dma_and_isolation_lines() {
        let r = parse(
            "FW dma 00:01.0 bytes 4096 to-device ok polls 12 from-device timeout match 17 first-mismatch 0x3 seed 0xab\n\
             FW iso 00:01.0 iova 0x4000000 bytes 4096 read ok polls 5 copy-back ok polls 6 saw zeros\n",
        );
        assert!(r.unparsed.is_empty(), "{:?}", r.unparsed);
        let d = r.dma.unwrap();
        assert_eq!(
            (d.bytes, d.to_device_polls, d.from_device_polls),
            (4096, Some(12), None)
        );
        assert_eq!((d.matched, d.first_mismatch, d.seed), (17, Some(3), Some(0xab)));
        let i = r.isolation.unwrap();
        assert_eq!(
            (i.iova, i.read_polls, i.copy_back_polls),
            (Some(0x400_0000), Some(5), Some(6))
        );
        assert_eq!(i.saw.as_deref(), Some("zeros"));
        let r = parse("FW dma none no-bar0\nFW iso none dma-failed\nFW dma 00:01.0 bytes x\n");
        assert_eq!(r.isolation.unwrap().skipped.as_deref(), Some("dma-failed"));
        assert_eq!(r.dma.unwrap().skipped.as_deref(), Some("no-bar0"));
        assert_eq!(r.unparsed.len(), 1, "a bad dma line is kept");
        let r = parse("FW dma 00:01.0 bytes 4096 match 4096 first-mismatch none\n");
        assert_eq!(r.dma.unwrap().first_mismatch, None);
    }

    #[test]
    fn irq_lines() {
        let r = parse(
            "FW irq 00:01.0 intx via device expected 1 delivered 1\n\
             FW irq 00:01.0 msi-x via host expected 5 delivered 3\n\
             FW irq 00:01.0 msi none not-offered\n\
             FW irq none no-irqchip\n\
             FW irq 00:01.0 msi via host expected x delivered 1\n\
             FW irq timer 2\n\
             FW irqloop 00:01.0 msi via device count 1000 delivered 999\n\
             FW fault vector 0xd\n",
        );
        assert_eq!(r.unparsed.len(), 1, "{:?}", r.unparsed);
        assert_eq!(r.irqs.len(), 4);
        assert_eq!(
            (
                r.irqs[0].kind.as_str(),
                r.irqs[0].via.as_deref(),
                r.irqs[0].delivered
            ),
            ("intx", Some("device"), 1)
        );
        assert_eq!((r.irqs[1].expected, r.irqs[1].delivered), (5, 3));
        assert_eq!(r.irqs[2].skipped.as_deref(), Some("not-offered"));
        assert_eq!(r.irqs[3].device, None);
        assert_eq!(r.fault.as_deref(), Some("0xd"));
        assert_eq!(r.irq_timer, Some(2));
        let l = r.irq_loop.unwrap();
        assert_eq!(
            (l.count, l.delivered, l.via.as_deref()),
            (1000, 999, Some("device"))
        );
    }

    #[test]
    fn garbage_is_kept_not_fatal() {
        let r = parse("FW bar 0 mem32 size 0x10\nFW dev x\nFW error no-boot-info\nFW bar x\n");
        assert_eq!(
            r.unparsed.len(),
            3,
            "a bar before any dev, a short dev, a bad bar"
        );
        assert_eq!(r.errors, vec!["no-boot-info"]);
        assert!(!r.done);
    }
}
