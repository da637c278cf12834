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
    /// Boot-info version: 4 adds the interrupt fields (3: the DMA seed; 2: the 64-bit window).
    FW_BOOT_VERSION: u32 = 4;
    /// Bytes of struct boot_info.
    FW_BOOT_INFO_LEN: usize = 80;
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
    /// Console line buffer: the firmware writes a line here and its length to PORT_LOG.
    FW_LOG_BUF: u64 = 0x8_3000;
    /// Bytes of the console line buffer.
    FW_LOG_LEN: u64 = 0x1000;
    /// Boot page tables (PML4, PDPT, PD: the first 2 MiB), only until long mode has built the
    /// real ones at FW_PT_BASE.
    FW_BOOT_PT: u64 = 0x8_4000;
    /// Firmware stack top (grows down towards the boot page tables).
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
    /// PCIe ECAM (enhanced configuration) of bus 0: function `dev.fn` at `+ (dev << 15 | fn << 12)`,
    /// one MMIO exit per access instead of mechanism #1's two port exits (boot-info v4).
    ECAM_BASE: u64 = 0xFED0_0000;
    /// Bytes of the ECAM window (bus 0 only: 32 devices x 8 functions x 4 KiB).
    ECAM_SIZE: u64 = 0x10_0000;
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
    /// out32: the firmware's console, N bytes at FW_LOG_BUF (one exit per line, not per byte).
    PORT_LOG: u16 = 0x504;
    /// out32: raise interrupt `(index << 16) | vector` the way the VMM can (VFIO's software
    /// trigger, or the emulated device): for a device gpupass cannot make fire itself.
    PORT_IRQ: u16 = 0x503;
    /// Mark: the interrupt tests begin (KVM's counters are read here).
    MARK_IRQ_BEGIN: u32 = 7;
    /// Mark: the interrupt tests end.
    MARK_IRQ_END: u32 = 8;
    /// Mark: the MSI round-trip loop begins.
    MARK_IRQLOOP_BEGIN: u32 = 9;
    /// Mark: the MSI round-trip loop ends.
    MARK_IRQLOOP_END: u32 = 10;
    /// Boot info boot_flags: the VMM wrote the identity map of the low 4 GiB at FW_PT_BASE
    /// (PML4, PDPT, four PDs of 2 MiB pages, 3-4 GiB uncached), as Firecracker does for its
    /// guests: the firmware only loads CR3.
    BOOT_F_PAGE_TABLES: u32 = 1;
    /// Byte offset of boot_flags in the boot-info block (entry.S reads it in 32-bit code).
    FW_BOOT_FLAGS_OFFSET: u64 = 72;
    /// Boot info irq_flags: an in-kernel irqchip (LAPIC, IOAPIC) is present.
    IRQ_F_IRQCHIP: u32 = 1;
    /// Boot info irq_flags: interrupt tests were asked for (0: none, and no line about them).
    IRQ_F_REQUESTED: u32 = 16;
    /// Boot info irq_flags: INTx is routed (IOAPIC pin INTX_GSI, level, resampled).
    IRQ_F_INTX: u32 = 2;
    /// Boot info irq_flags: the VMM virtualizes the MSI capability.
    IRQ_F_MSI: u32 = 4;
    /// Boot info irq_flags: the VMM virtualizes the MSI-X capability and table.
    IRQ_F_MSIX: u32 = 8;
    /// The IOAPIC pin (and GSI) the device's INTx is wired to.
    INTX_GSI: u32 = 10;
    /// The first GSI the VMM routes MSI / MSI-X messages from (above the IOAPIC's 24 pins).
    MSI_GSI_BASE: u32 = 24;
    /// VFIO's interrupt indexes, as PORT_IRQ takes them: INTx.
    IRQ_INDEX_INTX: u32 = 0;
    /// VFIO interrupt index: MSI.
    IRQ_INDEX_MSI: u32 = 1;
    /// VFIO interrupt index: MSI-X.
    IRQ_INDEX_MSIX: u32 = 2;
    /// Vector of the LAPIC timer that bounds each wait for an interrupt.
    VEC_TIMER: u32 = 0x30;
    /// Vector the IOAPIC delivers INTx on.
    VEC_INTX: u32 = 0x40;
    /// Vector of the MSI message.
    VEC_MSI: u32 = 0x50;
    /// Vector of MSI-X table entry 0 (entry i: VEC_MSIX + i).
    VEC_MSIX: u32 = 0x60;
    /// MSI-X entries the firmware tests (the first ones of the table).
    MSIX_TESTED_MAX: u32 = 16;
    /// Local APIC base (xAPIC MMIO), also the MSI address for APIC ID 0.
    LAPIC_BASE: u64 = 0xFEE0_0000;
    /// IOAPIC base (IOREGSEL; IOWIN at +0x10).
    IOAPIC_BASE: u64 = 0xFEC0_0000;
    /// LAPIC timer ticks (KVM: 1 ns each at divide-by-1) before a wait for an interrupt
    /// gives up.
    IRQ_WAIT_TICKS: u32 = 500_000_000;
}

// The layout fits together (checked at compile time, in the crate and in build.rs).
const _: () = {
    assert!(
        FW_LOAD < FW_END && FW_END <= FW_DMA_SRC,
        "image area below the DMA buffers"
    );
    assert!(
        FW_DMA_ISO + FW_DMA_LEN <= FW_LOG_BUF && FW_LOG_BUF + FW_LOG_LEN <= FW_BOOT_PT,
        "the log buffer above the DMA buffers, the boot tables above it"
    );
    assert!(
        FW_BOOT_PT + 0x3000 + 0x8000 <= FW_STACK_TOP,
        "32 KiB of stack above the boot tables"
    );
    assert!(FW_PT_END <= 1 << 20, "page tables below the smallest --memory");
    assert!(
        ECAM_BASE > MMIO_LIMIT && ECAM_BASE >= IOAPIC_BASE + 0x1000 && ECAM_BASE + ECAM_SIZE <= LAPIC_BASE,
        "ECAM between the IOAPIC and the LAPIC, above the BAR hole"
    );
    assert!(
        VEC_MSIX + MSIX_TESTED_MAX <= 0x70,
        "MSI-X vectors below the firmware's last stub"
    );
    assert!(VEC_TIMER >= 0x20, "interrupt vectors above the exceptions");
    assert!(
        FW_BOOT_INFO + FW_BOOT_INFO_LEN as u64 <= FW_LOAD,
        "boot info below the image"
    );
};

/// struct boot_info, in order: (field, bytes (4 or 8), comment). Offsets follow from the
/// sizes; every u64 sits at a multiple of 8 (a test and the generated header check it).
pub(crate) const BOOT_INFO_FIELDS: &[(&str, usize, &str)] = &[
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
    (
        "irq_flags",
        4,
        "v4: IRQ_F_* - what the VMM delivers (0: no interrupt tests)",
    ),
    ("msix_entries", 4, "v4: MSI-X entries VFIO offers (0: none)"),
    ("irq_loop", 4, "v4: MSI round trips the firmware times (0: none)"),
    (
        "boot_flags",
        4,
        "v4: BOOT_F_* (BOOT_F_PAGE_TABLES: the VMM built the low 4 GiB map at FW_PT_BASE)",
    ),
    ("reserved", 4, "0"),
];

/// Byte offset of a boot-info field; `None` for an unknown name.
pub(crate) fn boot_info_offset(field: &str) -> Option<usize> {
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
/// `pub`, as `CONSTANTS`: build.rs `include!`s this file and calls it (nothing in the crate does).
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
        assert_eq!(boot_info_offset("irq_flags"), Some(60));
        assert_eq!(boot_info_offset("msix_entries"), Some(64));
        assert_eq!(
            boot_info_offset("boot_flags"),
            Some(FW_BOOT_FLAGS_OFFSET as usize)
        );
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
