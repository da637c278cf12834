//! Guest physical memory: one RAM region at GPA 0 (vm-memory, anonymous mmap), the firmware
//! image and the boot-info block in it, and the layout the firmware is told about.
//!
//! ```text
//! 0x0000_0500  boot_info (src/vmm/protocol.rs), written by the VMM
//! 0x0000_1000  firmware, flat binary, entered in real mode at CS:IP = 0:0x1000
//! 0x0008_0000  end of the firmware area (max image 508 KiB)
//! 0x0008_0000  DMA test buffers (source, destination, isolation; 4 KiB each)
//! 0x0009_0000  firmware stack top (grows down); the firmware's page tables from here
//! 0x0010_0000  end of the page-table pool
//! ...          RAM up to --memory (1 MiB .. 3 GiB)
//! 0xC000_0000  MMIO hole for 32-bit BARs, up to 0xFEBF_FFFF (below the IOAPIC/LAPIC range)
//! 4 GiB        64-bit MMIO window for 64-bit BARs, up to 2^phys-bits (at most 2^47) - 1
//! ```

use super::VmmError;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::protocol as p;

// The layout is src/vmm/protocol.rs's (the firmware's protocol.h is generated from it).
pub(crate) const BOOT_INFO_ADDR: u64 = p::FW_BOOT_INFO;
pub(crate) const FIRMWARE_LOAD: u64 = p::FW_LOAD;
pub(crate) const FIRMWARE_END: u64 = p::FW_END;
pub(crate) const FIRMWARE_MAX: u64 = FIRMWARE_END - FIRMWARE_LOAD;
/// The firmware's DMA test buffers: IOVA = GPA.
pub(crate) const DMA_SRC: u64 = p::FW_DMA_SRC;
pub(crate) const DMA_DST: u64 = p::FW_DMA_DST;
pub(crate) const MMIO_BASE: u64 = p::MMIO_BASE;
pub(crate) const MMIO_LIMIT: u64 = p::MMIO_LIMIT;
pub(crate) const IO_BASE: u32 = p::IO_BASE;
pub(crate) const IO_LIMIT: u32 = p::IO_LIMIT;
pub(crate) const MIN_MEMORY: u64 = 1 << 20;
pub(crate) const MAX_MEMORY: u64 = MMIO_BASE;
pub(crate) const DEFAULT_MEMORY: u64 = 64 << 20;
pub(crate) const BOOT_MAGIC: u32 = p::FW_BOOT_MAGIC;
pub(crate) const BOOT_VERSION: u32 = p::FW_BOOT_VERSION;
pub(crate) const BOOT_INFO_LEN: usize = p::FW_BOOT_INFO_LEN;
/// Where the 64-bit window starts: the first address above 4 GiB.
pub(crate) const MMIO64_BASE: u64 = p::MMIO64_BASE;
/// The firmware identity-maps what it reads, so a BAR must sit below the canonical 2^47.
pub(crate) const MMIO64_MAX_BITS: u32 = p::MMIO64_MAX_BITS;

/// The 64-bit MMIO window `[base, limit]` for a vCPU with `phys_bits` of guest physical
/// address (CPUID 0x80000008 EAX[7:0]); `None` when nothing lies above 4 GiB.
pub(crate) fn mmio64_window(phys_bits: u32) -> Option<(u64, u64)> {
    let bits = phys_bits.min(MMIO64_MAX_BITS);
    (bits > 32).then(|| (MMIO64_BASE, (1u64 << bits) - 1))
}

/// Text that is not a memory size [`parse_memory_size`] takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid memory size {text:?}: {reason}")]
pub(crate) struct MemorySizeError {
    pub text: String,
    pub reason: String,
}

/// Parse a memory size: bytes, or a number with K/M/G (binary multiples, optional `iB`/`B`).
/// It must be a multiple of 4 KiB between 1 MiB and 3 GiB (RAM ends where the MMIO hole for
/// BARs starts).
pub(crate) fn parse_memory_size(s: &str) -> Result<u64, MemorySizeError> {
    let bad = |reason: &str| MemorySizeError {
        text: s.to_string(),
        reason: reason.to_string(),
    };
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    if num.is_empty() {
        return Err(bad("expected a number like 64M, 1G or 1048576"));
    }
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(bad(&format!("unknown unit {unit:?} (use K, M or G)"))),
    };
    let n: u64 = num.parse().map_err(|_| bad("number too large"))?;
    let bytes = n.checked_mul(1 << shift).ok_or_else(|| bad("too large"))?;
    if !(MIN_MEMORY..=MAX_MEMORY).contains(&bytes) {
        return Err(bad(
            "must be between 1M and 3G (guest RAM ends at the 0xC0000000 MMIO hole)",
        ));
    }
    if bytes % 4096 != 0 {
        return Err(bad("must be a multiple of 4K"));
    }
    Ok(bytes)
}

/// The boot-info block (`struct boot_info`, laid out by src/vmm/protocol.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BootInfo {
    pub ram_size: u32,
    pub loop_count: u32,
    /// 0-5, or 0xff: let the firmware pick.
    pub loop_bar: u32,
    /// The guest physical address width the vCPU's CPUID reports.
    pub phys_bits: u32,
    /// Seeds the firmware's DMA test pattern (a new one per run, so a device buffer left
    /// over from an earlier run cannot pass for this run's copy).
    pub dma_seed: u32,
    /// `IRQ_F_*`: the interrupts the VMM delivers ([`super::irq`]).
    pub irq_flags: u32,
    /// MSI-X table entries VFIO offers (0: none).
    pub msix_entries: u32,
    /// MSI round trips the firmware times (0: none).
    pub irq_loop: u32,
}

impl BootInfo {
    pub(crate) fn to_bytes(self) -> [u8; BOOT_INFO_LEN] {
        let (base, limit) = mmio64_window(self.phys_bits).unwrap_or((0, 0));
        let fields: [(&str, u64); 18] = [
            ("magic", BOOT_MAGIC.into()),
            ("version", BOOT_VERSION.into()),
            ("ram_size", self.ram_size.into()),
            ("mmio_base", MMIO_BASE),
            ("mmio_limit", MMIO_LIMIT),
            ("io_base", IO_BASE.into()),
            ("io_limit", IO_LIMIT.into()),
            ("loop_count", self.loop_count.into()),
            ("loop_bar", self.loop_bar.into()),
            ("phys_bits", self.phys_bits.into()),
            ("mmio64_base", base),
            ("mmio64_limit", limit),
            ("dma_seed", self.dma_seed.into()),
            ("irq_flags", self.irq_flags.into()),
            ("msix_entries", self.msix_entries.into()),
            ("irq_loop", self.irq_loop.into()),
            ("boot_flags", p::BOOT_F_PAGE_TABLES.into()),
            ("reserved", 0),
        ];
        let mut out = [0u8; BOOT_INFO_LEN];
        for (name, size, _) in p::BOOT_INFO_FIELDS {
            let (_, v) = fields
                .iter()
                .find(|(n, _)| n == name)
                .expect("every boot-info field has a value (memory tests)");
            let off = p::boot_info_offset(name).expect("a listed field has an offset");
            out[off..off + size].copy_from_slice(&v.to_le_bytes()[..*size]);
        }
        out
    }
}

/// Guest RAM: `size` bytes at GPA 0.
pub(crate) fn create(size: u64) -> Result<GuestMemoryMmap, VmmError> {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size as usize)]).map_err(|e| VmmError::GuestMemory {
        what: format!("cannot allocate {size} bytes of guest RAM"),
        source: e.into(),
    })
}

/// Check a firmware image fits its area.
pub(crate) fn check_firmware(len: usize) -> Result<(), VmmError> {
    if len == 0 || len as u64 > FIRMWARE_MAX {
        return Err(VmmError::FirmwareSize {
            size: len as u64,
            max: FIRMWARE_MAX,
        });
    }
    Ok(())
}

/// Copy the firmware to [`FIRMWARE_LOAD`] and the boot info to [`BOOT_INFO_ADDR`].
/// The identity map of the low 4 GiB the firmware runs on (boot-info `BOOT_F_PAGE_TABLES`):
/// PML4[0] -> PDPT, PDPT[0..3] -> PD0..PD3, 2 MiB pages from physical 0, those of the 3-4 GiB
/// MMIO hole uncached (PWT | PCD). Written by the VMM, as Firecracker builds its guests' page
/// tables: on kvm_pvm, where KVM's emulator runs every instruction of the firmware (its
/// `insn_emulation` counter), the firmware's own 2048-entry loop cost a boot ~17,000 emulated
/// instructions, ~12 ms.
pub(crate) fn page_tables() -> Vec<u8> {
    let base = p::FW_PT_BASE;
    let mut t = vec![0u8; 6 * 4096];
    let mut put = |at: u64, v: u64| {
        let o = (at - base) as usize;
        t[o..o + 8].copy_from_slice(&v.to_le_bytes());
    };
    put(base, (base + 0x1000) | 0x3);
    for i in 0..4u64 {
        put(base + 0x1000 + 8 * i, (base + 0x2000 + 0x1000 * i) | 0x3);
    }
    for i in 0..2048u64 {
        let uc = if i >= 1536 { 0x18 } else { 0 };
        put(base + 0x2000 + 8 * i, (i << 21) | 0x83 | uc);
    }
    t
}

pub(crate) fn load(mem: &GuestMemoryMmap, firmware: &[u8], info: BootInfo) -> Result<(), VmmError> {
    check_firmware(firmware.len())?;
    mem.write_slice(&page_tables(), GuestAddress(p::FW_PT_BASE))
        .map_err(|e| VmmError::GuestMemory {
            what: "cannot write page tables".into(),
            source: e.into(),
        })?;
    mem.write_slice(firmware, GuestAddress(FIRMWARE_LOAD))
        .map_err(|e| VmmError::GuestMemory {
            what: "cannot load firmware".into(),
            source: e.into(),
        })?;
    mem.write_slice(&info.to_bytes(), GuestAddress(BOOT_INFO_ADDR))
        .map_err(|e| VmmError::GuestMemory {
            what: "cannot write boot info".into(),
            source: e.into(),
        })?;
    Ok(())
}

/// A RAM region: guest address, length, host address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RamRegion {
    pub gpa: u64,
    pub len: u64,
    pub host: *mut u8,
}

/// Every RAM region with its host mapping (for KVM slots and VFIO DMA maps).
pub(crate) fn regions(mem: &GuestMemoryMmap) -> Result<Vec<RamRegion>, VmmError> {
    let mut v = Vec::new();
    for r in mem.iter() {
        let host = r
            .get_host_address(vm_memory::MemoryRegionAddress(0))
            .map_err(|e| VmmError::GuestMemory {
                what: "guest RAM region without a host mapping".into(),
                source: e.into(),
            })?;
        v.push(RamRegion {
            gpa: r.start_addr().0,
            len: r.len(),
            host,
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_64_bit_window_follows_the_address_width() {
        assert_eq!(mmio64_window(36), Some((1 << 32, (1 << 36) - 1)));
        assert_eq!(
            mmio64_window(52),
            Some((1 << 32, (1 << 47) - 1)),
            "capped at 2^47"
        );
        assert_eq!(mmio64_window(32), None);
        assert_eq!(mmio64_window(0), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_memory_size("64M"), Ok(64 << 20));
        assert_eq!(parse_memory_size("1G"), Ok(1 << 30));
        assert_eq!(parse_memory_size("2048k"), Ok(2 << 20));
        assert_eq!(parse_memory_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_memory_size("3GiB"), Ok(3 << 30));
        for bad in [
            "",
            "M",
            "0",
            "512K",
            "4G",
            "1T",
            "64Q",
            "1048577",
            "99999999999999999999G",
            "-1M",
        ] {
            assert!(parse_memory_size(bad).is_err(), "{bad}");
        }
        assert!(parse_memory_size("4G").unwrap_err().to_string().contains("3G"));
    }

    #[test]
    fn firmware_and_boot_info_land_where_the_firmware_looks() {
        let mem = create(2 << 20).unwrap();
        let info = BootInfo {
            ram_size: 2 << 20,
            loop_count: 7,
            loop_bar: 0xff,
            phys_bits: 40,
            dma_seed: 0x1234_5678,
            irq_flags: 0xb,
            msix_entries: 5,
            irq_loop: 9,
        };
        load(&mem, &[0xfa, 0xfc], info).unwrap();
        let mut b = [0u8; 2];
        mem.read_slice(&mut b, GuestAddress(FIRMWARE_LOAD)).unwrap();
        assert_eq!(b, [0xfa, 0xfc]);
        let magic: u32 = mem.read_obj(GuestAddress(BOOT_INFO_ADDR)).unwrap();
        assert_eq!(magic, BOOT_MAGIC);
        let loop_count: u32 = mem.read_obj(GuestAddress(BOOT_INFO_ADDR + 28)).unwrap();
        assert_eq!(loop_count, 7);
        let phys_bits: u32 = mem.read_obj(GuestAddress(BOOT_INFO_ADDR + 36)).unwrap();
        assert_eq!(phys_bits, 40);
        let base: u64 = mem.read_obj(GuestAddress(BOOT_INFO_ADDR + 40)).unwrap();
        let limit: u64 = mem.read_obj(GuestAddress(BOOT_INFO_ADDR + 48)).unwrap();
        assert_eq!((base, limit), (1 << 32, (1 << 40) - 1));
        let seed: u32 = mem.read_obj(GuestAddress(BOOT_INFO_ADDR + 56)).unwrap();
        assert_eq!(seed, 0x1234_5678);
        let flags: u32 = mem.read_obj(GuestAddress(BOOT_INFO_ADDR + 60)).unwrap();
        let entries: u32 = mem.read_obj(GuestAddress(BOOT_INFO_ADDR + 64)).unwrap();
        assert_eq!((flags, entries), (0xb, 5));
        let irq_loop: u32 = mem.read_obj(GuestAddress(BOOT_INFO_ADDR + 68)).unwrap();
        assert_eq!(irq_loop, 9);
        let flags: u32 = mem.read_obj(GuestAddress(BOOT_INFO_ADDR + 72)).unwrap();
        assert_eq!(flags, p::BOOT_F_PAGE_TABLES);
        // The page tables: PML4[0], PDPT[3], the PDE of 3 GiB (uncached) and of 2 MiB.
        let pt = |o: u64| -> u64 { mem.read_obj(GuestAddress(p::FW_PT_BASE + o)).unwrap() };
        assert_eq!(pt(0), p::FW_PT_BASE + 0x1003);
        assert_eq!(pt(0x1018), p::FW_PT_BASE + 0x5003);
        assert_eq!(pt(0x2000 + 8 * 1536), 0xc000_0000 | 0x9b);
        assert_eq!(pt(0x2008), 0x20_0000 | 0x83);
        assert!(matches!(
            load(&mem, &vec![0; FIRMWARE_MAX as usize + 1], info),
            Err(VmmError::FirmwareSize { .. })
        ));
        assert_eq!(regions(&mem).unwrap()[0].len, 2 << 20);
    }
}
