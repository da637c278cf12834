//! The parsers of what the kernel and the NVIDIA driver print: a function's `resource`
//! (BARs), its `modalias` (IDs), NVIDIA's `information` and `creatable_vgpu_types`. Pure
//! functions of text, fuzzed (`fuzz/`).

use super::*;

/// Sysfs resource flags (include/linux/ioport.h).
pub(super) const IORESOURCE_IO: u64 = 0x0000_0100;
pub(super) const IORESOURCE_MEM: u64 = 0x0000_0200;
pub(super) const IORESOURCE_PREFETCH: u64 = 0x0000_2000;
pub(super) const IORESOURCE_MEM_64: u64 = 0x0010_0000;

/// Parse sysfs `resource` into BARs (index, kind, start, size, flags). Unassigned lines
/// (all zero) are skipped; garbled lines are reported in the error list.
pub(super) const ZERO64: &str = "0x0000000000000000";

pub fn parse_resource(text: &str) -> (Vec<Bar>, Vec<String>) {
    let mut bars = Vec::new();
    let mut errs = Vec::new();
    let bytes = text.as_bytes();
    let mut pos = 0;
    let mut i = 0;
    // Lines as `str::lines` splits them (`\n` or `\r\n`), walked by hand: a kernel line is
    // taken whole by its length, without searching for its end.
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        // The kernel's own format (`0x%016llx 0x%016llx 0x%016llx`), parsed from the bytes;
        // anything else takes the general path below.
        if rest.len() >= KERNEL_LINE && rest.get(KERNEL_LINE).is_none_or(|c| *c == b'\n') {
            let line = &rest[..KERNEL_LINE];
            if line == ZERO_LINE.as_bytes() {
                (pos, i) = (pos + KERNEL_LINE + 1, i + 1);
                continue;
            }
            if let Some([start, end, flags]) = kernel_resource_line(line) {
                if !(start == 0 && end == 0) {
                    bars.extend(resource_bar(i, start, end, flags, &mut errs));
                }
                (pos, i) = (pos + KERNEL_LINE + 1, i + 1);
                continue;
            }
        }
        let (line, next) = match rest.iter().position(|c| *c == b'\n') {
            Some(n) => {
                let l = &text[pos..pos + n];
                (l.strip_suffix('\r').unwrap_or(l), pos + n + 1)
            }
            None => (&text[pos..], bytes.len()),
        };
        parse_resource_line(i, line, &mut bars, &mut errs);
        (pos, i) = (next, i + 1);
    }
    (bars, errs)
}

/// The length of a `resource` line as the kernel prints it, and an unassigned one.
pub(super) const KERNEL_LINE: usize = 3 * 18 + 2;
pub(super) const ZERO_LINE: &str = "0x0000000000000000 0x0000000000000000 0x0000000000000000";

/// Line `i` of `resource` in any spacing and hex spelling.
pub(super) fn parse_resource_line(i: usize, line: &str, bars: &mut Vec<Bar>, errs: &mut Vec<String>) {
    let mut it = line.split_whitespace();
    let (Some(f0), Some(f1), Some(f2), None) = (it.next(), it.next(), it.next(), it.next()) else {
        let n = line.split_whitespace().count();
        errs.push(format!("line {i} has {n} fields, expected 3"));
        return;
    };
    // All-zero lines (absent BARs) are most of the file: no number to parse.
    if f0 == ZERO64 && f1 == ZERO64 {
        return;
    }
    let (Some(start), Some(end), Some(flags)) = (parse_hex(f0), parse_hex(f1), parse_hex(f2)) else {
        errs.push(format!("line {i} is not hex"));
        return;
    };
    if start == 0 && end == 0 {
        return;
    }
    bars.extend(resource_bar(i, start, end, flags, errs));
}

/// The three numbers of a `resource` line exactly as the kernel prints it: `0x` and 16 hex
/// digits, three times, separated by one space.
pub(super) fn kernel_resource_line(line: &[u8]) -> Option<[u64; 3]> {
    if line.len() != 3 * 18 + 2 {
        return None;
    }
    let mut out = [0u64; 3];
    for (k, v) in out.iter_mut().enumerate() {
        let f = &line[k * 19..k * 19 + 18];
        if k > 0 && line[k * 19 - 1] != b' ' {
            return None;
        }
        if &f[..2] != b"0x" {
            return None;
        }
        for &c in &f[2..] {
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return None,
            };
            *v = (*v << 4) | d as u64;
        }
    }
    Some(out)
}

/// Resource line `i` as a BAR; `None` for a line that is not an I/O or memory resource, or is
/// garbled (then `errs` says why).
pub(super) fn resource_bar(
    i: usize,
    start: u64,
    end: u64,
    flags: u64,
    errs: &mut Vec<String>,
) -> Option<Bar> {
    if end < start {
        errs.push(format!("line {i} ends before it starts"));
        return None;
    }
    // Found by fuzzing: 0..=u64::MAX has no u64 size.
    let Some(size) = (end - start).checked_add(1) else {
        errs.push(format!("line {i} spans the whole 64-bit address space"));
        return None;
    };
    let kind = if flags & IORESOURCE_IO != 0 {
        BarKind::Io
    } else if flags & IORESOURCE_MEM != 0 {
        BarKind::Memory
    } else {
        return None;
    };
    Some(Bar {
        index: i as u32,
        kind,
        start,
        size,
        is_64bit: flags & IORESOURCE_MEM_64 != 0,
        prefetchable: flags & IORESOURCE_PREFETCH != 0,
    })
}

/// IDs from a PCI `modalias` (`pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModaliasIds {
    pub vendor: u16,
    pub device: u16,
    pub subvendor: u16,
    pub subdevice: u16,
    pub class: u32,
}

/// Parse a PCI modalias; `None` when it is not exactly the kernel's format.
pub fn parse_pci_modalias(s: &str) -> Option<ModaliasIds> {
    let s = s.trim().strip_prefix("pci:")?;
    let mut rest = s;
    let mut field = |tag: &str, digits: usize| -> Option<u32> {
        let r = rest.strip_prefix(tag)?;
        let (h, tail) = (r.get(..digits)?, r.get(digits..)?);
        if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        rest = tail;
        u32::from_str_radix(h, 16).ok()
    };
    let vendor = field("v", 8)?;
    let device = field("d", 8)?;
    let subvendor = field("sv", 8)?;
    let subdevice = field("sd", 8)?;
    let bc = field("bc", 2)?;
    let sc = field("sc", 2)?;
    let pi = field("i", 2)?;
    if !rest.is_empty() || [vendor, device, subvendor, subdevice].iter().any(|v| *v > 0xffff) {
        return None;
    }
    Some(ModaliasIds {
        vendor: vendor as u16,
        device: device as u16,
        subvendor: subvendor as u16,
        subdevice: subdevice as u16,
        class: (bc << 16) | (sc << 8) | pi,
    })
}

/// Parse `/proc/driver/nvidia/gpus/<addr>/information` (`Key: value` lines).
pub fn parse_nvidia_information(text: &str) -> NvidiaInfo {
    let mut info = NvidiaInfo {
        minor: None,
        model: None,
        uuid: None,
    };
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "Device Minor" => info.minor = v.parse().ok(),
            "Model" if !v.is_empty() => info.model = Some(v.to_string()),
            "GPU UUID" if !v.is_empty() => info.uuid = Some(v.to_string()),
            _ => {}
        }
    }
    info
}

/// Parse NVIDIA's `creatable_vgpu_types` table: a header line (`ID    : vGPU Name`) then one
/// `<id> : <name>` row per profile that can be created on this VF now.
pub fn parse_creatable_vgpu_types(text: &str) -> Vec<MdevType> {
    text.lines()
        .filter_map(|l| {
            let (id, name) = l.split_once(':')?;
            let id = id.trim();
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some(MdevType {
                id: id.to_string(),
                name: Some(name.trim().to_string()),
                description: None,
                available_instances: Some(1),
                device_api: Some("vfio-pci".to_string()),
            })
        })
        .collect()
}
