//! A reader (and, for fixtures, a writer) of glibc's `/etc/ld.so.cache`, new format
//! `glibc-ld.so.cache1.1` (the only format glibc ≥ 2.32 writes by default).
//!
//! Layout (all integers in the byte order given by `flags`, in practice the host's):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 17 | magic `glibc-ld.so.cache` |
//! | 17 | 3 | version `1.1` |
//! | 20 | 4 | `nlibs`: number of entries |
//! | 24 | 4 | `len_strings`: size of the string table |
//! | 28 | 1 | `flags`: bits 0-1 endianness (0 unknown, 2 little, 3 big) |
//! | 29 | 3 | padding |
//! | 32 | 4 | `extension_offset` (glibc-hwcaps data; ignored here) |
//! | 36 | 12 | unused |
//! | 48 | 24 × nlibs | entries: `i32 flags, u32 key, u32 value, u32 osversion, u64 hwcap` |
//!
//! `key` (the soname, `libcuda.so.1`) and `value` (the path, `/usr/lib/x86_64-linux-gnu/libcuda.so.1`)
//! are offsets of NUL-terminated strings counted from the start of this header. Entry `flags`:
//! low byte the kind (`3` = ELF libc6), high byte the ABI (`0x03` x86-64, `0x0a` AArch64, `0x00`
//! i386 and other 32-bit; see glibc `ldconfig.h`). Files in the old `ld.so-1.7.0` format are
//! followed by a new-format header on an 8-byte boundary, which is what this reader uses.

use std::fmt;

const MAGIC_NEW: &[u8] = b"glibc-ld.so.cache1.1";
const MAGIC_OLD: &[u8] = b"ld.so-1.7.0";
const HEADER: usize = 48;
const ENTRY: usize = 24;
const OLD_ENTRY: usize = 12;

/// ELF libc6 library (entry flag low byte).
pub(crate) const FLAG_ELF_LIBC6: i32 = 0x0003;
/// x86-64 64-bit ABI (entry flag high byte).
pub(crate) const FLAG_X8664_LIB64: i32 = 0x0300;
/// AArch64 64-bit ABI.
pub(crate) const FLAG_AARCH64_LIB64: i32 = 0x0a00;

/// The entry flags of the libraries this build's ABI loads.
pub(crate) fn native_flags() -> i32 {
    if cfg!(target_arch = "aarch64") {
        FLAG_ELF_LIBC6 | FLAG_AARCH64_LIB64
    } else {
        FLAG_ELF_LIBC6 | FLAG_X8664_LIB64
    }
}

/// One library known to the dynamic linker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub flags: i32,
    /// The soname, `libcuda.so.1`.
    pub key: String,
    /// The host path, `/usr/lib/x86_64-linux-gnu/libcuda.so.1`.
    pub value: String,
}

/// Why a cache file was not understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError(pub &'static str);

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "not a glibc ld.so.cache (format glibc-ld.so.cache1.1): {}",
            self.0
        )
    }
}

impl std::error::Error for FormatError {}

fn u32_at(b: &[u8], off: usize, big: bool) -> Option<u32> {
    let s: [u8; 4] = b.get(off..off.checked_add(4)?)?.try_into().ok()?;
    Some(if big {
        u32::from_be_bytes(s)
    } else {
        u32::from_le_bytes(s)
    })
}

fn cstr_at(b: &[u8], off: usize) -> Option<String> {
    let tail = b.get(off..)?;
    let end = tail.iter().position(|&c| c == 0)?;
    std::str::from_utf8(&tail[..end]).ok().map(str::to_string)
}

/// Parse a whole cache file. Bounds are checked against the buffer, never trusted.
pub fn parse(buf: &[u8]) -> Result<Vec<Entry>, FormatError> {
    let mut start = 0usize;
    if buf.starts_with(MAGIC_OLD) {
        let n = u32_at(buf, MAGIC_OLD.len(), cfg!(target_endian = "big"))
            .ok_or(FormatError("truncated old-format header"))? as usize;
        let old_end = n
            .checked_mul(OLD_ENTRY)
            .and_then(|x| x.checked_add(MAGIC_OLD.len() + 4))
            .ok_or(FormatError("old-format entry count overflows"))?;
        start = old_end.div_ceil(8) * 8;
    }
    let b = buf
        .get(start..)
        .ok_or(FormatError("truncated after the old-format part"))?;
    if !b.starts_with(MAGIC_NEW) {
        return Err(FormatError("the magic `glibc-ld.so.cache1.1` is missing"));
    }
    if b.len() < HEADER {
        return Err(FormatError("truncated header"));
    }
    let big = match b[28] & 3 {
        2 => false,
        3 => true,
        _ => cfg!(target_endian = "big"),
    };
    let nlibs = u32_at(b, 20, big).ok_or(FormatError("truncated header"))? as usize;
    let table_end = nlibs
        .checked_mul(ENTRY)
        .and_then(|x| x.checked_add(HEADER))
        .ok_or(FormatError("entry count overflows"))?;
    if table_end > b.len() {
        return Err(FormatError("entry table runs past the end of the file"));
    }
    let mut out = Vec::with_capacity(nlibs);
    for i in 0..nlibs {
        let e = HEADER + i * ENTRY;
        let flags = u32_at(b, e, big).ok_or(FormatError("truncated entry"))? as i32;
        let key = u32_at(b, e + 4, big).ok_or(FormatError("truncated entry"))? as usize;
        let value = u32_at(b, e + 8, big).ok_or(FormatError("truncated entry"))? as usize;
        let key = cstr_at(b, key).ok_or(FormatError("a library name points outside the file"))?;
        let value = cstr_at(b, value).ok_or(FormatError("a library path points outside the file"))?;
        out.push(Entry { flags, key, value });
    }
    Ok(out)
}

/// Write a new-format cache holding `entries` (little-endian), as `ldconfig` lays it out.
/// Used by the fixture generator; glibc only needs the layout above.
pub fn write(entries: &[Entry]) -> Vec<u8> {
    let mut strings: Vec<u8> = Vec::new();
    let strings_at = HEADER + entries.len() * ENTRY;
    let mut offs = Vec::new();
    for e in entries {
        let k = strings_at + strings.len();
        strings.extend_from_slice(e.key.as_bytes());
        strings.push(0);
        let v = strings_at + strings.len();
        strings.extend_from_slice(e.value.as_bytes());
        strings.push(0);
        offs.push((k as u32, v as u32));
    }
    let mut b = Vec::with_capacity(strings_at + strings.len());
    b.extend_from_slice(MAGIC_NEW);
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    b.extend_from_slice(&(strings.len() as u32).to_le_bytes());
    b.push(2); // little endian
    b.extend_from_slice(&[0; 3]);
    b.extend_from_slice(&0u32.to_le_bytes()); // no extension section
    b.extend_from_slice(&[0; 12]);
    for (e, (k, v)) in entries.iter().zip(offs) {
        b.extend_from_slice(&e.flags.to_le_bytes());
        b.extend_from_slice(&k.to_le_bytes());
        b.extend_from_slice(&v.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
    }
    b.extend_from_slice(&strings);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(flags: i32, key: &str, value: &str) -> Entry {
        Entry {
            flags,
            key: key.into(),
            value: value.into(),
        }
    }

    #[test]
    fn round_trip() {
        let v = vec![
            e(0x303, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            e(0x003, "libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"),
        ];
        assert_eq!(parse(&write(&v)).unwrap(), v);
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(parse(b"").is_err());
        assert!(parse(b"glibc-ld.so.cache1.1").is_err());
        let mut b = write(&[e(0x303, "a", "/a")]);
        b[20] = 0xff; // nlibs far past the end
        assert!(parse(&b).unwrap_err().0.contains("past the end"));
        let mut b = write(&[e(0x303, "a", "/a")]);
        b[52] = 0xff; // key offset outside
        b[53] = 0xff;
        assert!(parse(&b).is_err());
        let b = write(&[e(0x303, "a", "/a")]);
        for n in 0..b.len() {
            let _ = parse(&b[..n]);
        }
    }

    #[test]
    fn old_format_prefix_is_skipped() {
        let new = write(&[e(0x303, "libz.so.1", "/lib/libz.so.1")]);
        let mut b = MAGIC_OLD.to_vec();
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&[0u8; OLD_ENTRY]);
        while b.len() % 8 != 0 {
            b.push(0);
        }
        // The new header's string offsets count from the new header.
        b.extend_from_slice(&new);
        assert_eq!(parse(&b).unwrap()[0].key, "libz.so.1");
    }

    /// The real cache of this machine agrees with `ldconfig -p` (glibc's own reader).
    #[test]
    fn agrees_with_ldconfig_on_this_machine() {
        // Every glibc system has both (Debian: libc-bin); a test that skipped without them
        // would claim an agreement it never checked.
        let buf = std::fs::read("/etc/ld.so.cache").expect("/etc/ld.so.cache (glibc's ldconfig writes it)");
        let out = std::process::Command::new("ldconfig")
            .arg("-p")
            .output()
            .expect("ldconfig (libc-bin)");
        let entries = parse(&buf).expect("this machine's cache parses");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut listed = 0;
        for line in text.lines().skip(1) {
            let Some((left, path)) = line.trim().split_once(" => ") else {
                continue;
            };
            let key = left.split(" (").next().unwrap_or("");
            listed += 1;
            assert!(
                entries.iter().any(|x| x.key == key && x.value == path),
                "ldconfig lists {key} => {path}, the parser does not"
            );
        }
        assert_eq!(listed, entries.len());
        assert!(entries
            .iter()
            .any(|x| x.key == "libc.so.6" && x.flags == native_flags()));
    }
}
