use super::*;

#[test]
fn sizes_parse() {
    assert_eq!("auto".parse(), Ok(Hole64::Auto));
    assert_eq!("off".parse(), Ok(Hole64::Off));
    assert_eq!("64G".parse(), Ok(Hole64::Size(64 << 30)));
    assert_eq!("2T".parse(), Ok(Hole64::Size(2 << 40)));
    for bad in ["", "48G", "512M", "64", "64K", "G", "99999999999T"] {
        assert!(bad.parse::<Hole64>().is_err(), "{bad}");
    }
    assert_eq!(size_suffix(64 << 30), "64G");
    assert_eq!(size_suffix(4 << 40), "4T");
}

#[test]
fn hugepages_checked_against_the_nodes() {
    use crate::model::{HugePool, Inventory, NumaNode};
    let mut inv: Inventory =
        serde_json::from_str(r#"{"schema_version":1,"devices":[],"groups":[]}"#).unwrap();
    assert_eq!(
        check_hugepages(&inv, HugePages::Gib1, 8 << 20, &[(Some(0), 8 << 20)]),
        Ok(false)
    );
    inv.numa_nodes = vec![
        NumaNode {
            node: 0,
            cpulist: Some("0-3".into()),
            hugepages: vec![HugePool {
                size_kib: 1 << 20,
                total: 16,
                free: 8,
            }],
        },
        NumaNode {
            node: 1,
            cpulist: Some("4-7".into()),
            hugepages: vec![HugePool {
                size_kib: 1 << 20,
                total: 16,
                free: 2,
            }],
        },
    ];
    assert_eq!(check_hugepages(&inv, HugePages::Off, 3 << 10, &[]), Ok(true));
    assert_eq!(
        check_hugepages(&inv, HugePages::Gib1, 8 << 20, &[(Some(0), 8 << 20)]),
        Ok(true)
    );
    let e = check_hugepages(&inv, HugePages::Gib1, 8 << 20, &[(Some(1), 8 << 20)])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("needs 8 free 1G pages on host node 1") && e.contains("has 2 free of 16"),
        "{e}"
    );
    assert_eq!(
        check_hugepages(&inv, HugePages::Gib1, 10 << 20, &[(None, 10 << 20)]),
        Ok(true)
    );
    assert!(check_hugepages(&inv, HugePages::Gib1, 11 << 20, &[(None, 11 << 20)]).is_err());
    let e = check_hugepages(&inv, HugePages::Gib1, (8 << 20) + 1024, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a whole number of 1G pages"), "{e}");
    assert!(check_hugepages(&inv, HugePages::Mib2, 8 << 20, &[(Some(0), 8 << 20)]).is_err());
}

/// The firmware's own rule, worked by hand: OVMF aligns the aperture to its size above the
/// top of RAM (4 GiB + RAM - 2 GiB for q35 guests of 2.75 GiB or more).
#[test]
fn ovmf_places_the_window_above_ram_aligned_to_its_size() {
    const T: u64 = 1 << 40;
    let g = |n: u64| n << 30;
    let ovmf = |ram: Option<u64>, w: u64| place(GuestFirmware::Ovmf, ram, w, &[], false);
    // (RAM, window, base, end, bits)
    let table: &[(Option<u64>, u64, u64, u64, u32)] = &[
        (Some(g(64)), 2 * T, 2 * T, 4 * T, 42),
        (Some(2 * T), 2 * T, 4 * T, 6 * T, 43),
        (Some(g(2)), g(32), g(32), g(64), 36),
        (None, g(32), g(32), g(64), 36),
        (Some(g(30)), g(32), g(32), g(64), 36),
        (Some(g(31)), g(32), g(64), g(96), 37),
        (Some(g(16)), g(128), g(128), g(256), 38),
        (Some(g(512)), 2 * T, 2 * T, 4 * T, 42),
        (Some(g(2046)), 2 * T, 2 * T, 4 * T, 42),
        (Some(g(2047)), 2 * T, 4 * T, 6 * T, 43),
    ];
    for &(ram, w, base, end, bits) in table {
        let p = ovmf(ram, w);
        assert_eq!((p.base, p.end, p.bits()), (base, end, bits), "{ram:?} {w:#x}");
    }
    assert_eq!(q35_ram_top(Some(g(2))), g(4));
    assert_eq!(q35_ram_top(Some(0xb000_0000)), g(4) + 0xb000_0000 - g(2));
    assert_eq!(bits_for(1 << 42), 42);
    assert_eq!(bits_for((1 << 42) + 1), 43);
}

#[test]
fn seabios_packs_the_bars_above_ram_aligned_to_the_largest() {
    let g = |n: u64| n << 30;
    // One 16 GiB BAR (+ 16 MiB) over 8 GiB of RAM: top 10 GiB, base 16 GiB, the root port's
    // window (the sum rounded up to the largest BAR) 32 GiB, so the BARs end at 48 GiB,
    // after QEMU's 32 GiB window from 10 GiB (42 GiB).
    let p = place(
        GuestFirmware::SeaBios,
        Some(g(8)),
        g(32),
        &[(g(16) + (16 << 20), g(16))],
        false,
    );
    assert_eq!((p.base, p.end), (g(10), g(48)));
    // Four 128 GiB BARs over 1 TiB of RAM: top 1026 GiB, base 1152 GiB (128 GiB aligned),
    // end 1664 GiB; QEMU's 64 GiB window ends earlier.
    let p = place(
        GuestFirmware::SeaBios,
        Some(g(1024)),
        g(64),
        &[(g(128), g(128)); 4],
        false,
    );
    assert_eq!(p.end, g(1664));
}

#[test]
fn limits_invert_the_placement() {
    let g = |n: u64| n << 30;
    // 42 bits: a 2 TiB window fits over at most 2046 GiB of RAM.
    assert_eq!(
        max_ram(GuestFirmware::Ovmf, 42, 2 << 40, &[], false),
        Some(g(2046))
    );
    assert_eq!(max_ram(GuestFirmware::Ovmf, 41, 2 << 40, &[], false), None);
    // 36 bits, small RAM: 32 GiB at 32 GiB is the largest.
    assert_eq!(max_window(GuestFirmware::Ovmf, None, 36, &[], false), Some(g(32)));
    assert_eq!(
        max_window(GuestFirmware::Ovmf, Some(g(64)), 40, &[], false),
        Some(g(512))
    );
    for (ram, bits) in [(g(64), 40), (g(1000), 42), (g(3), 36)] {
        let w = max_window(GuestFirmware::Ovmf, Some(ram), bits, &[], false).unwrap();
        assert!(place(GuestFirmware::Ovmf, Some(ram), w, &[], false).end <= 1 << bits);
        assert!(place(GuestFirmware::Ovmf, Some(ram), w * 2, &[], false).end > 1 << bits);
    }
}

/// QEMU moves an AMD guest's RAM above 4 GiB to 1 TiB once the layout reaches the
/// HyperTransport hole (hw/i386/pc.c): the window then lies above 1 TiB + RAM. Worked by
/// hand; the boundaries are QEMU 10.0's own start check's (tests/it/vm_outputs.rs).
#[test]
fn an_amd_guest_s_ram_moves_to_1t_and_the_window_with_it() {
    const T: u64 = 1 << 40;
    let g = |n: u64| n << 30;
    // 1000 GiB under a 32 GiB window: QEMU's end 1002G + 32G passes 1012G, so the 998 GiB
    // above 4 GiB start at 1 TiB (top 2022 GiB) and OVMF's window is 2048-2080 GiB.
    let amd = place(GuestFirmware::Ovmf, Some(g(1000)), g(32), &[], true);
    assert_eq!(
        (amd.ram_top, amd.base, amd.end, amd.relocated),
        (T + g(998), g(2048), g(2080), true)
    );
    let intel = place(GuestFirmware::Ovmf, Some(g(1000)), g(32), &[], false);
    assert_eq!(
        (intel.base, intel.end, intel.relocated),
        (g(1024), g(1056), false)
    );
    // Small layouts do not move: 64 GiB under 32 GiB ends far below the hole.
    let small = place(GuestFirmware::Ovmf, Some(g(64)), g(32), &[], true);
    assert_eq!((small.base, small.relocated), (g(96), false));
    // A 2 TiB window always reaches the hole: 42 bits hold 1026 GiB of RAM, not 2046.
    assert_eq!(max_ram(GuestFirmware::Ovmf, 42, 2 * T, &[], true), Some(g(1026)));
    assert_eq!(max_ram(GuestFirmware::Ovmf, 42, 2 * T, &[], false), Some(g(2046)));
    // SeaBIOS sees the same moved RAM.
    let sb = place(
        GuestFirmware::SeaBios,
        Some(g(1000)),
        g(32),
        &[(g(16), g(16))],
        true,
    );
    assert!(sb.relocated && sb.base >= T + g(998), "{sb:?}");
    let fit = fit_window(
        GuestFirmware::Ovmf,
        Some(g(1027)),
        Mmio64 {
            bars: 4 * g(128),
            count: 4,
            window: 2 * T,
        },
        &[],
        Widths {
            cpu: Some(42),
            iommu: None,
            phys_bits: None,
            amd: true,
        },
    )
    .unwrap_err();
    let m = fit.to_string();
    assert!(
        m.contains("QEMU put the RAM above 4 GiB at 1T-2049G: an AMD guest CPU"),
        "{m}"
    );
    assert!(m.contains("--memory 1026G or less"), "{m}");
}

/// The check follows the firmware's rule (docs/cluster-and-dra.md, "The guest firmware
/// places the 64-bit window"): the same 2 TiB window fits 42 bits over 64 GiB of RAM (it
/// ends at 4 TiB) and needs 43 over 2 TiB (it ends at 6 TiB), which the old "2^k needs k+1
/// bits" rule passed.
#[test]
fn the_window_check_follows_the_firmware() {
    const T: u64 = 1 << 40;
    let g = |n: u64| n << 30;
    // Four H100s: 4 x (128 GiB + 2 x 32 MiB... as bars64 sums them) -> a 2 TiB window.
    let four = Mmio64 {
        bars: 4 * (g(128) + (64 << 20)),
        count: 12,
        window: 2 * T,
    };
    let w = |cpu: u32, iommu: u32| Widths {
        cpu: Some(cpu),
        iommu: Some(iommu),
        phys_bits: None,
        amd: false,
    };
    use GuestFirmware::{Ovmf, SeaBios};
    // (firmware, RAM, window, slots, CPU, IOMMU) -> end, bits, refusal code
    type Row<'a> = (
        GuestFirmware,
        Option<u64>,
        Mmio64,
        &'a [(u64, u64)],
        u32,
        u32,
        u64,
        u32,
        Option<&'a str>,
    );
    let h100: &[(u64, u64)] = &[(g(128), g(128)); 4];
    let small = Mmio64 {
        window: g(32),
        ..four
    };
    let table: &[Row] = &[
        (Ovmf, Some(g(64)), four, &[], 42, 48, 4 * T, 42, None),
        (Ovmf, Some(2 * T), four, &[], 42, 48, 6 * T, 43, Some("E-OUT-15")),
        (Ovmf, Some(2 * T), four, &[], 46, 42, 6 * T, 43, Some("E-OUT-19")),
        (Ovmf, Some(2 * T), four, &[], 43, 48, 6 * T, 43, None),
        (Ovmf, None, four, &[], 42, 42, 4 * T, 42, None),
        (Ovmf, Some(g(2046)), four, &[], 42, 48, 4 * T, 42, None),
        (
            Ovmf,
            Some(g(2047)),
            four,
            &[],
            42,
            48,
            6 * T,
            43,
            Some("E-OUT-15"),
        ),
        // SeaBIOS packs the BARs whatever the window: a 32 GiB window fits 39 bits for
        // OVMF, but the four 128 GiB BARs over 8 GiB end at 640 GiB (40 bits).
        (Ovmf, Some(g(8)), small, h100, 39, 48, g(64), 36, None),
        (
            SeaBios,
            Some(g(8)),
            small,
            h100,
            39,
            48,
            g(640),
            40,
            Some("E-OUT-15"),
        ),
        (SeaBios, Some(g(8)), small, h100, 40, 48, g(640), 40, None),
        // And its end follows QEMU's window over RAM as OVMF's does.
        (
            SeaBios,
            Some(2 * T),
            four,
            h100,
            42,
            48,
            4 * T + g(2),
            43,
            Some("E-OUT-15"),
        ),
    ];
    for &(fw, ram, mmio, slots, cpu, iommu, end, bits, code) in table {
        let r = fit_window(fw, ram, mmio, slots, w(cpu, iommu));
        let (fit, got) = match &r {
            Ok(f) => (*f, None),
            Err(e) => (*e.fit, Some(e.code())),
        };
        assert_eq!(
            (fit.place.end, fit.place.bits(), got),
            (end, bits, code),
            "{fw:?} {ram:?} {mmio:?} {cpu} {iommu}"
        );
    }
    // The refusal names RAM, window, end and widths, and the RAM and window that fit.
    let e = fit_window(Ovmf, Some(2 * T), four, &[], w(42, 48)).unwrap_err();
    let m = e.to_string();
    for want in [
            "a 64-bit PCI window of 2T (for 12 64-bit BAR(s), 512.25 GiB in all) over 2048 GiB of guest RAM ends at 6T",
            "OVMF places it above guest RAM, aligned to its own size, at 4T-6T, so it needs 43 physical address bits",
            "the guest gets this host CPU's 42 (/proc/cpuinfo, address sizes; IOMMU: 48 bits)",
            "less guest RAM (--memory 2046G or less), or fewer devices, or a smaller window with --pci-hole64 SIZE (at most 1T over this RAM)",
            "; nothing was written",
        ] {
            assert!(m.contains(want), "{want}\n{m}");
        }
    let e = fit_window(Ovmf, Some(2 * T), four, &[], w(46, 42)).unwrap_err();
    assert!(
            e.to_string().contains("this host's IOMMU translates 42 (sys/class/iommu: the narrowest unit's address width; guest CPU: 46 bits), so VFIO could not map the BARs"),
            "{e}"
        );
    // --phys-bits below the CPU's width is the guest's width.
    let p = Widths {
        phys_bits: Some(41),
        ..w(46, 48)
    };
    let e = fit_window(Ovmf, Some(g(64)), four, &[], p).unwrap_err();
    assert_eq!(
        (e.source, e.bits, e.code()),
        (WidthSource::PhysBits, 41, "E-OUT-15")
    );
    assert!(
        e.to_string().contains("(--phys-bits; this host's CPU has 46)"),
        "{e}"
    );
    assert!(e.to_string().contains("a larger --phys-bits"), "{e}");
    // Nothing known: nothing refused.
    let f = fit_window(Ovmf, Some(4 * T), four, &[], Widths::default()).unwrap();
    assert_eq!(f.limit, None);
}

#[test]
fn memlock() {
    assert_eq!(memlock_bytes(8 << 30, false, 4), 9 << 30);
    assert_eq!(memlock_bytes(8 << 30, true, 2), 17 << 30);
    assert_eq!(memlock_bytes(8 << 30, true, 0), 9 << 30);
}
