// The firmware interface: guest memory layout, I/O ports, marks and the boot-info block, in
// one place. The VMM uses these constants (`vmm::protocol`); build.rs includes this file too
// and writes the firmware's `protocol.h` (C and assembly) from `CONSTANTS` and
// `BOOT_INFO_FIELDS`, so the firmware and the VMM cannot disagree (docs/vmm.md).
//
// Plain `//` comments at the top: build.rs pulls the file in with `include!`, where inner
// doc comments are not allowed. Everything here must compile in build.rs as well (core only).

macro_rules! first_doc {
    ($first:literal $($rest:literal)*) => {
        $first
    };
}

macro_rules! interface {
    ($( $(#[doc = $doc:literal])+ $name:ident: $ty:ty = $val:expr; )*) => {
        $( $(#[doc = $doc])+ pub const $name: $ty = $val; )*
        /// Every constant as (name, value, first doc line): the C header's `#define`s.
        pub const CONSTANTS: &[(&str, u64, &str)] =
            &[$((stringify!($name), $name as u64, first_doc!($($doc)+))),*];
    };
}

interface! {
    /// Boot-info block (struct boot_info), written by the VMM.
    FW_BOOT_INFO: u64 = 0x500;
    /// Boot-info magic, "GPBI".
    FW_BOOT_MAGIC: u32 = 0x4942_5047;
    /// Boot-info version: 3 adds the DMA seed (2: the 64-bit window).
    FW_BOOT_VERSION: u32 = 3;
    /// Bytes of struct boot_info.
    FW_BOOT_INFO_LEN: usize = 64;
    /// Flat binary load and entry address (real mode, CS:IP 0:0x1000).
    FW_LOAD: u64 = 0x1000;
    /// End of the firmware image area (an image may be 508 KiB).
    FW_END: u64 = 0x8_0000;
    /// DMA test source buffer (edu reads it; IOVA = GPA).
    FW_DMA_SRC: u64 = 0x8_0000;
    /// DMA test destination buffer (edu writes the copy back here).
    FW_DMA_DST: u64 = 0x8_1000;
    /// Isolation copy-back buffer (the device buffer after a read from an unmapped IOVA).
    FW_DMA_ISO: u64 = 0x8_2000;
    /// Bytes of each DMA test buffer (edu's whole buffer).
    FW_DMA_LEN: u64 = 0x1000;
    /// Firmware stack top (grows down towards the DMA buffers).
    FW_STACK_TOP: u64 = 0x9_0000;
    /// Page tables: PML4, one PDPT, four PDs identity-mapping the low 4 GiB (2 MiB pages).
    FW_PT_BASE: u64 = 0x9_0000;
    /// Pool of page-table pages for BARs above 4 GiB, mapped on demand.
    FW_PT_POOL: u64 = 0x9_6000;
    /// End of the page-table pool (below 1 MiB, the smallest --memory).
    FW_PT_END: u64 = 0x10_0000;
    /// 32-bit MMIO hole for BARs: first address.
    MMIO_BASE: u64 = 0xC000_0000;
    /// 32-bit MMIO hole: last address (below the IOAPIC/LAPIC range).
    MMIO_LIMIT: u64 = 0xFEBF_FFFF;
    /// I/O port window for I/O BARs: first port.
    IO_BASE: u32 = 0xC000;
    /// I/O port window: last port.
    IO_LIMIT: u32 = 0xFFFF;
    /// 64-bit MMIO window: the first address above 4 GiB.
    MMIO64_BASE: u64 = 1 << 32;
    /// The firmware identity-maps what it reads, so the window ends below 2^47 (canonical).
    MMIO64_MAX_BITS: u32 = 47;
    /// COM1 (16550): a byte written to THR is console output.
    PORT_SERIAL: u16 = 0x3f8;
    /// out8: end the VM with this status.
    PORT_EXIT: u16 = 0x501;
    /// out32: a phase mark (MARK_*).
    PORT_MARK: u16 = 0x502;
    /// PCI configuration mechanism #1: address.
    PORT_PCI_ADDR: u16 = 0xcf8;
    /// PCI configuration mechanism #1: data (0xcfc-0xcff).
    PORT_PCI_DATA: u16 = 0xcfc;
    /// Mark: the read loop begins.
    MARK_LOOP_BEGIN: u32 = 1;
    /// Mark: the read loop ends.
    MARK_LOOP_END: u32 = 2;
    /// Mark: the DMA test's mapped RAM -> device -> RAM copy begins.
    MARK_DMA_BEGIN: u32 = 3;
    /// Mark: the mapped copy ends.
    MARK_DMA_END: u32 = 4;
    /// Mark: the read from an unmapped IOVA (and its copy back) begins.
    MARK_ISO_BEGIN: u32 = 5;
    /// Mark: the isolation probe ends.
    MARK_ISO_END: u32 = 6;
    /// Boot info loop_bar: let the firmware pick the BAR.
    LOOP_BAR_AUTO: u32 = 0xff;
}

// The layout fits together (checked at compile time, in the crate and in build.rs).
const _: () = {
    assert!(
        FW_LOAD < FW_END && FW_END <= FW_DMA_SRC,
        "image area below the DMA buffers"
    );
    assert!(
        FW_DMA_ISO + FW_DMA_LEN < FW_STACK_TOP,
        "the stack has room above the buffers"
    );
    assert!(FW_PT_END <= 1 << 20, "page tables below the smallest --memory");
    assert!(
        FW_BOOT_INFO + FW_BOOT_INFO_LEN as u64 <= FW_LOAD,
        "boot info below the image"
    );
};

/// struct boot_info, in order: (field, bytes (4 or 8), comment). Offsets follow from the
/// sizes; every u64 sits at a multiple of 8 (a test and the generated header check it).
pub const BOOT_INFO_FIELDS: &[(&str, usize, &str)] = &[
    ("magic", 4, "FW_BOOT_MAGIC"),
    ("version", 4, "FW_BOOT_VERSION"),
    ("ram_size", 4, "bytes of guest RAM at GPA 0"),
    (
        "mmio_base",
        4,
        "32-bit MMIO hole for BARs: [mmio_base, mmio_limit]",
    ),
    ("mmio_limit", 4, "inclusive"),
    ("io_base", 4, "I/O port window for I/O BARs: [io_base, io_limit]"),
    ("io_limit", 4, "inclusive"),
    ("loop_count", 4, "read loop: number of reads (0 = no loop)"),
    ("loop_bar", 4, "BAR to read in the loop, LOOP_BAR_AUTO = pick"),
    (
        "phys_bits",
        4,
        "guest physical address width the vCPU's CPUID reports",
    ),
    ("mmio64_base", 8, "64-bit MMIO window above 4 GiB (0: none)"),
    ("mmio64_limit", 8, "inclusive; below 2^phys_bits and 2^47"),
    (
        "dma_seed",
        4,
        "v3: seeds the DMA test pattern (a new one per run)",
    ),
    ("reserved", 4, "0"),
];

/// Byte offset of a boot-info field; `None` for an unknown name.
pub fn boot_info_offset(field: &str) -> Option<usize> {
    let mut off = 0;
    for (name, size, _) in BOOT_INFO_FIELDS {
        if *name == field {
            return Some(off);
        }
        off += size;
    }
    None
}

/// The firmware's `protocol.h`: every constant as a `#define` (plain hex, so GNU as reads them
/// too) and, for C only, `struct boot_info` with static assertions of its size and offsets.
pub fn c_header() -> String {
    let mut h = String::from(
        "/* Generated by build.rs from src/vmm/protocol.rs (the firmware interface's one\n \
         * source, shared with the VMM): do not edit; docs/vmm.md explains it. */\n\
         #ifndef GPUPASS_FW_PROTOCOL_H\n#define GPUPASS_FW_PROTOCOL_H\n\n",
    );
    for (name, value, doc) in CONSTANTS {
        h.push_str(&format!("#define {name:<17} {value:#x} /* {} */\n", doc.trim()));
    }
    h.push_str("\n#ifndef __ASSEMBLER__\nstruct boot_info {\n");
    for (name, size, doc) in BOOT_INFO_FIELDS {
        let ty = if *size == 8 {
            "unsigned long long"
        } else {
            "unsigned int"
        };
        h.push_str(&format!("\t{ty} {name}; /* {doc} */\n"));
    }
    h.push_str("};\n");
    h.push_str("_Static_assert(sizeof(struct boot_info) == FW_BOOT_INFO_LEN, \"boot_info size\");\n");
    for (name, _, _) in BOOT_INFO_FIELDS {
        let off = boot_info_offset(name).unwrap_or(0);
        h.push_str(&format!(
            "_Static_assert(__builtin_offsetof(struct boot_info, {name}) == {off}, \"{name}\");\n"
        ));
    }
    h.push_str("#endif\n\n#endif\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_info_layout_is_packed_and_aligned() {
        let mut off = 0;
        for (name, size, _) in BOOT_INFO_FIELDS {
            assert!(*size == 4 || *size == 8, "{name}");
            assert_eq!(off % size, 0, "{name} at {off} is not aligned");
            assert_eq!(boot_info_offset(name), Some(off));
            off += size;
        }
        assert_eq!(off, FW_BOOT_INFO_LEN);
        assert_eq!(boot_info_offset("phys_bits"), Some(36));
        assert_eq!(boot_info_offset("mmio64_base"), Some(40));
        assert_eq!(boot_info_offset("dma_seed"), Some(56));
        assert_eq!(boot_info_offset("nope"), None);
    }

    #[test]
    fn the_header_defines_every_constant_once() {
        let h = c_header();
        for (name, value, _) in CONSTANTS {
            let line = format!("#define {name:<17} {value:#x} ");
            assert_eq!(h.matches(&line).count(), 1, "{name}");
        }
        assert!(h.contains("\tunsigned long long mmio64_base; "));
        assert!(h.contains("__builtin_offsetof(struct boot_info, dma_seed) == 56"));
        assert!(!h.contains("*/ */"));
    }
}
