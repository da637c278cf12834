use super::*;

/// A device like QEMU's std VGA: 16 MiB prefetchable BAR0, 4 KiB BAR2, and a 64-bit BAR4.
fn vga() -> VirtFunction {
    let mut c = StaticConfig::new(0x1234, 0x1111, 0x03_00_00, 2);
    c.bytes[0x0e] = 0x80; // multifunction bit set on the "host" device
                          // Capability list: 0x40 vendor-specific -> 0x50 MSI (64-bit) -> 0x70 MSI-X -> end.
    c.bytes[0x06] = 0x10;
    c.bytes[0x34] = 0x40;
    c.put(0x40, &[0x09, 0x50, 0x08, 0xaa]);
    c.put(0x50, &[CAP_MSI, 0x70, 0x80, 0x00]);
    c.writable[0x52] = 0x01; // MSI enable would be writable on real hardware
    c.put(0x70, &[CAP_MSIX, 0x00, 0x03, 0x00]); // 4 entries
    c.put(0x74, &0x0000_2002u32.to_le_bytes()); // table in BAR2 at 0x2000
    c.put(0x78, &0x0000_3002u32.to_le_bytes()); // PBA in BAR2 at 0x3000
    VirtFunction::new(
        Box::new(c),
        &[
            BarSpec {
                index: 0,
                ty: BarType::Mem32,
                prefetchable: true,
                size: 16 << 20,
            },
            BarSpec {
                index: 2,
                ty: BarType::Mem32,
                prefetchable: false,
                size: 0x4000,
            },
            BarSpec {
                index: 4,
                ty: BarType::Mem64,
                prefetchable: true,
                size: 8 << 30,
            },
        ],
    )
}

#[test]
fn bar_sizing_returns_the_mask_and_keeps_type_bits() {
    let mut f = vga();
    assert_eq!(
        f.read(0x10, 4),
        0x8,
        "unassigned prefetchable mem32 BAR reads its type"
    );
    f.write(0x10, 4, 0xffff_ffff);
    assert_eq!(f.read(0x10, 4), 0xff00_0008);
    f.write(0x18, 4, 0xffff_ffff);
    assert_eq!(f.read(0x18, 4), 0xffff_c000);
    // 64-bit, 8 GiB: the low register has no address bits, the high one masks bit 32-33.
    f.write(0x20, 4, 0xffff_ffff);
    f.write(0x24, 4, 0xffff_ffff);
    assert_eq!(f.read(0x20, 4), 0x0000_000c);
    assert_eq!(f.read(0x24, 4), 0xffff_fffe);
    // Unimplemented BARs read zero whatever is written.
    f.write(0x14, 4, 0xffff_ffff);
    assert_eq!(f.read(0x14, 4), 0);
    assert_eq!(f.read(0x30, 4), 0, "no expansion ROM is presented");
}

#[test]
fn bar_relocation_moves_the_window_only_with_decode_on() {
    let mut f = vga();
    assert!(f.write(0x18, 4, 0xc100_0000));
    assert_eq!(f.bar_address(2), 0xc100_0000);
    assert!(f.windows().is_empty(), "memory decode is off");
    assert!(f.write(0x04, 2, 0x0002));
    assert_eq!(
        f.windows(),
        vec![Window {
            bar: 2,
            io: false,
            base: 0xc100_0000,
            size: 0x4000
        }]
    );
    // Unaligned addresses are truncated to the BAR's size, like hardware.
    f.write(0x18, 4, 0xc200_1234);
    assert_eq!(f.bar_address(2), 0xc200_0000);
    assert_eq!(f.windows()[0].base, 0xc200_0000);
    // A byte write changes only its byte.
    f.write(0x1b, 1, 0xd0);
    assert_eq!(f.bar_address(2), 0xd000_0000);
    // 64-bit BAR above 4 GiB.
    f.write(0x20, 4, 0);
    f.write(0x24, 4, 0x4);
    assert_eq!(f.bar_address(4), 0x4_0000_0000);
    assert_eq!(f.windows().len(), 2);
    f.write(0x04, 2, 0);
    assert!(f.windows().is_empty());
}

#[test]
fn read_only_registers_ignore_writes() {
    let mut f = vga();
    f.write(0x00, 4, 0xdead_beef);
    assert_eq!(f.read(0x00, 4), 0x1111_1234);
    f.write(0x08, 4, 0xffff_ffff);
    assert_eq!(f.read(0x08, 4), 0x0300_0002);
    f.write(0x04, 2, 0xffff);
    assert_eq!(
        f.read(0x04, 2),
        0x0007,
        "only the command bits the device implements stick"
    );
    f.write(0x3c, 1, 0x0b);
    assert_eq!(f.read(0x3c, 1), 0x0b);
}

#[test]
fn capability_list_passes_through_and_msi_writes_are_dropped() {
    let mut f = vga();
    assert_eq!(f.read(0x06, 2) & 0x10, 0x10);
    assert_eq!(f.read(0x34, 1), 0x40);
    let mut chain = Vec::new();
    let mut p = f.read(0x34, 1) as u16;
    while p != 0 {
        chain.push((f.read(p, 1) as u8, p));
        p = f.read(p + 1, 1) as u16;
    }
    assert_eq!(chain, vec![(0x09, 0x40), (CAP_MSI, 0x50), (CAP_MSIX, 0x70)]);
    assert_eq!(f.capabilities(), &chain[..]);
    assert_eq!(f.read(0x42, 2), 0xaa08, "capability bodies read through");
    assert!(!f.take_irq_dirty());
    f.write(0x52, 1, 0x01);
    assert_eq!(f.read(0x52, 1), 0x81, "MSI enable is virtualized: it reads back");
    assert!(f.take_irq_dirty());
    let m = f.msix().unwrap();
    assert_eq!((m.table_bar, m.table_offset, m.table_size), (2, 0x2000, 64));
    assert_eq!((m.pba_bar, m.pba_offset, m.pba_size), (2, 0x3000, 8));
}

#[test]
fn header_type_hides_multifunction() {
    let f = vga();
    assert_eq!(f.read(0x0e, 1), 0x00);
}

#[test]
fn a_looping_capability_list_terminates() {
    let mut c = StaticConfig::new(1, 2, 0, 0);
    c.bytes[0x06] = 0x10;
    c.bytes[0x34] = 0x40;
    c.put(0x40, &[0x09, 0x40]);
    let f = VirtFunction::new(Box::new(c), &[]);
    assert_eq!(f.capabilities().len(), 48);
}

#[test]
fn ecam_reaches_the_same_registers_in_one_access() {
    let mut bus = PciBus::new();
    bus.add(0, host_bridge());
    bus.add(1, vga());
    let rd = |bus: &PciBus, off: u64, len: usize| {
        let mut d = vec![0u8; len];
        bus.ecam_read(off, &mut d);
        let mut b = [0u8; 4];
        b[..len].copy_from_slice(&d);
        u32::from_le_bytes(b)
    };
    assert_eq!(rd(&bus, 0, 4), 0x0008_1b36);
    assert_eq!(rd(&bus, 1 << 15, 4), 0x1111_1234);
    assert_eq!(rd(&bus, (1 << 15) | 2, 2), 0x1111);
    assert_eq!(
        bus.ecam_write((1 << 15) | 0x18, &0xffff_ffffu32.to_le_bytes()),
        Some(1)
    );
    assert_eq!(rd(&bus, (1 << 15) | 0x18, 4), 0xffff_c000);
    // Empty slots, other functions, and registers past 0xff read all-ones.
    assert_eq!(rd(&bus, 2 << 15, 4), 0xffff_ffff);
    assert_eq!(rd(&bus, (1 << 15) | (1 << 12), 4), 0xffff_ffff);
    assert_eq!(rd(&bus, (1 << 15) | 0x100, 4), 0xffff_ffff);
    assert_eq!(bus.ecam_write((1 << 15) | (1 << 12), &[0; 4]), None);
}

#[test]
fn mechanism_one_routes_to_the_selected_function() {
    let mut bus = PciBus::new();
    bus.add(0, host_bridge());
    bus.add(1, vga());
    let rd = |bus: &PciBus, port: u16, len: usize| {
        let mut d = vec![0u8; len];
        bus.io_read(port, &mut d);
        let mut b = [0u8; 4];
        b[..len].copy_from_slice(&d);
        u32::from_le_bytes(b)
    };
    bus.io_write(0xcf8, &0x8000_0000u32.to_le_bytes());
    assert_eq!(rd(&bus, 0xcf8, 4), 0x8000_0000);
    assert_eq!(rd(&bus, 0xcfc, 4), 0x0008_1b36);
    assert_eq!(rd(&bus, 0xcfe, 2), 0x0008);
    bus.io_write(0xcf8, &0x8000_0008u32.to_le_bytes());
    assert_eq!(rd(&bus, 0xcfc, 4) >> 8, 0x06_00_00);
    // 00:01.0 BAR2 through the data port, sized via byte lanes.
    bus.io_write(0xcf8, &0x8000_0818u32.to_le_bytes());
    assert_eq!(bus.io_write(0xcfc, &0xffff_ffffu32.to_le_bytes()), Some(1));
    assert_eq!(rd(&bus, 0xcfc, 4), 0xffff_c000);
    assert_eq!(rd(&bus, 0xcfd, 1), 0xc0);
    // Empty slots, other buses and functions, and disabled cycles read all-ones.
    bus.io_write(0xcf8, &0x8000_1000u32.to_le_bytes());
    assert_eq!(rd(&bus, 0xcfc, 4), 0xffff_ffff);
    bus.io_write(0xcf8, &0x8001_0800u32.to_le_bytes());
    assert_eq!(rd(&bus, 0xcfc, 2), 0xffff);
    bus.io_write(0xcf8, &0x8000_0900u32.to_le_bytes());
    assert_eq!(rd(&bus, 0xcfc, 4), 0xffff_ffff);
    bus.io_write(0xcf8, &0x0000_0800u32.to_le_bytes());
    assert_eq!(rd(&bus, 0xcfc, 4), 0xffff_ffff);
    // A word access that would cross the dword is refused.
    bus.io_write(0xcf8, &0x8000_0800u32.to_le_bytes());
    assert_eq!(rd(&bus, 0xcff, 2), 0xffff);
    assert!(PciBus::claims(0xcff) && !PciBus::claims(0xd00));
}

#[test]
fn bus_master_probe_reads_what_the_command_register_keeps() {
    // Writable (StaticConfig::new makes bits 0-2 writable): capable, and put back as it was.
    let mut f = VirtFunction::new(Box::new(StaticConfig::new(1, 2, 0, 0)), &[]);
    f.write(0x04, 2, 0x2); // memory decode on
    let b = probe_bus_master(&mut f);
    assert_eq!(
        b,
        BusMaster {
            command: 0x2,
            capable: true,
            restored: true
        }
    );
    assert_eq!(
        f.read(0x04, 2),
        0x2,
        "the probe leaves the register as it found it"
    );
    // Hard-wired to 0 (only the decode bits writable): the function cannot master.
    let mut c = StaticConfig::new(1, 2, 0, 0);
    c.writable[0x04] = 0x03;
    let mut f = VirtFunction::new(Box::new(c), &[]);
    f.write(0x04, 2, 0x3);
    let b = probe_bus_master(&mut f);
    assert!(!b.capable && b.restored, "{b:?}");
    assert_eq!(f.read(0x04, 2), 0x3);
    // Already enabled: capable without a write.
    let mut f = VirtFunction::new(Box::new(StaticConfig::new(1, 2, 0, 0)), &[]);
    f.write(0x04, 2, 0x6);
    assert!(probe_bus_master(&mut f).capable);
    assert_eq!(f.read(0x04, 2), 0x6);
}
