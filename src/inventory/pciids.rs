//! The pci.ids names (vendor, device, subsystem, class), from tables that need no relocation.
//!
//! The `pci-ids` crate keeps its database as Rust statics of `&'static str`s: ~55,000 pointers
//! that the dynamic loader must rewrite at every start of a position-independent binary (what
//! `cargo build --release` makes), touching every page they are on, whatever the command. So
//! the crate is a build dependency only: build.rs walks its database once and writes it to
//! `OUT_DIR/pci_ids.bin` (format below), which is included here as bytes and searched in place.
//! The names are the crate's, entry for entry (`every_name_is_the_crates`, test builds).
//!
//! Format (little endian): a header of five u32 counts (vendors, devices, subsystems, classes,
//! subclasses), then the records, each kind sorted by its key, then the names (UTF-8):
//! - vendor `u16 id, u32 name`; class `u8 id, u32 name`; subclass `u8 class, u8 id, u32 name`;
//! - device `u16 vendor, u16 id, u32 name, u32 first subsystem, u32 subsystem count`;
//! - subsystem `u16 subvendor, u16 subdevice, u32 name` (a device's in the database's order);
//! - a `name` is `u32 offset << 8 | length` into the names, lengths below 256.

static DB: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pci_ids.bin"));

const VENDOR: usize = 6;
const DEVICE: usize = 16;
const SUBSYSTEM: usize = 8;
const CLASS: usize = 5;
const SUBCLASS: usize = 6;

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

struct Tables {
    vendors: &'static [u8],
    devices: &'static [u8],
    subsystems: &'static [u8],
    classes: &'static [u8],
    subclasses: &'static [u8],
    names: &'static [u8],
}

fn tables() -> Tables {
    let count = |i: usize| u32_at(DB, 4 * i) as usize;
    let mut at = 20;
    let mut take = |len: usize| {
        let s = &DB[at..at + len];
        at += len;
        s
    };
    let vendors = take(count(0) * VENDOR);
    let devices = take(count(1) * DEVICE);
    let subsystems = take(count(2) * SUBSYSTEM);
    let classes = take(count(3) * CLASS);
    let subclasses = take(count(4) * SUBCLASS);
    Tables {
        vendors,
        devices,
        subsystems,
        classes,
        subclasses,
        names: &DB[at..],
    }
}

impl Tables {
    fn name(&self, packed: u32) -> Option<&'static str> {
        let (off, len) = ((packed >> 8) as usize, (packed & 0xff) as usize);
        std::str::from_utf8(self.names.get(off..off + len)?).ok()
    }
}

/// The record whose key (`key` of the record) is `want`, in `records` of `size` bytes each,
/// sorted by their keys.
fn find(records: &'static [u8], size: usize, want: u32, key: impl Fn(&[u8]) -> u32) -> Option<&'static [u8]> {
    let n = records.len() / size;
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = (lo + hi) / 2;
        let r = &records[mid * size..(mid + 1) * size];
        match key(r).cmp(&want) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => return Some(r),
        }
    }
    None
}

/// The vendor's name.
pub(crate) fn vendor(vendor: u16) -> Option<&'static str> {
    let t = tables();
    let r = find(t.vendors, VENDOR, vendor as u32, |r| u16_at(r, 0) as u32)?;
    t.name(u32_at(r, 2))
}

fn device_record(t: &Tables, vendor: u16, device: u16) -> Option<&'static [u8]> {
    let want = (vendor as u32) << 16 | device as u32;
    find(t.devices, DEVICE, want, |r| {
        (u16_at(r, 0) as u32) << 16 | u16_at(r, 2) as u32
    })
}

/// The device's name, and with `sub` the first of its subsystems with that subvendor and
/// subdevice.
pub(crate) fn device(
    vendor: u16,
    device: u16,
    sub: Option<(u16, u16)>,
) -> (Option<&'static str>, Option<&'static str>) {
    let t = tables();
    let Some(r) = device_record(&t, vendor, device) else {
        return (None, None);
    };
    let sname = sub.and_then(|(sv, sd)| {
        let (first, n) = (u32_at(r, 8) as usize, u32_at(r, 12) as usize);
        let subs = t.subsystems.get(first * SUBSYSTEM..(first + n) * SUBSYSTEM)?;
        subs.chunks_exact(SUBSYSTEM)
            .find(|s| u16_at(s, 0) == sv && u16_at(s, 2) == sd)
            .and_then(|s| t.name(u32_at(s, 4)))
    });
    (t.name(u32_at(r, 4)), sname)
}

/// The name of the subclass, else of the class.
pub(crate) fn class(base: u8, sub: u8) -> Option<&'static str> {
    let t = tables();
    let want = (base as u32) << 8 | sub as u32;
    find(t.subclasses, SUBCLASS, want, |r| (r[0] as u32) << 8 | r[1] as u32)
        .and_then(|r| t.name(u32_at(r, 2)))
        .or_else(|| find(t.classes, CLASS, base as u32, |r| r[0] as u32).and_then(|r| t.name(u32_at(r, 1))))
}

#[cfg(test)]
mod tests {
    /// Every vendor, device, subsystem, class and subclass of the `pci-ids` crate (the same
    /// version build.rs read) has the crate's name here.
    #[test]
    fn every_name_is_the_crates() {
        use pci_ids::FromId;
        let mut n = [0usize; 4];
        for v in pci_ids::Vendors::iter() {
            assert_eq!(super::vendor(v.id()), Some(v.name()));
            n[0] += 1;
            for d in v.devices() {
                assert_eq!(super::device(v.id(), d.id(), None), (Some(d.name()), None));
                n[1] += 1;
                for s in d.subsystems() {
                    let first = d
                        .subsystems()
                        .find(|x| x.subvendor() == s.subvendor() && x.subdevice() == s.subdevice())
                        .unwrap();
                    let got = super::device(v.id(), d.id(), Some((s.subvendor(), s.subdevice())));
                    assert_eq!(got, (Some(d.name()), Some(first.name())));
                    n[2] += 1;
                }
            }
        }
        for c in pci_ids::Classes::iter() {
            n[3] += 1;
            for s in c.subclasses() {
                assert_eq!(super::class(c.id(), s.id()), Some(s.name()));
            }
            // A subclass the database does not name falls back to the class.
            if pci_ids::Subclass::from_cid_sid(c.id(), 0xfe).is_none() {
                assert_eq!(
                    super::class(c.id(), 0xfe),
                    pci_ids::Class::from_id(c.id()).map(|c| c.name())
                );
            }
        }
        assert!(n[0] > 2000 && n[1] > 15000 && n[2] > 10000 && n[3] > 15, "{n:?}");
        assert_eq!(
            super::vendor(0xfffe),
            pci_ids::Vendor::from_id(0xfffe).map(|v| v.name())
        );
        assert_eq!(super::device(0x10de, 0xfffe, Some((1, 1))), (None, None));
    }
}
