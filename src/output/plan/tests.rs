use super::*;
use crate::host::HostRoot;
use crate::output::selection::{select, Consumer, SelectOptions};

/// The HGX fixture (CPU 52 bits, IOMMU 48, H100s on nodes 0 and 1, four per PCIe switch),
/// selected as libvirt with `--managed` would (no driver check).
fn hgx(devices: &[&str]) -> (Inventory, Selection) {
    let host = HostRoot::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/hosts/hgx-8gpu"
    ));
    let inv = crate::inventory::scan(&host).unwrap();
    let args: Vec<_> = devices.iter().map(|d| d.parse().unwrap()).collect();
    let sel = select(
        &inv,
        &args,
        SelectOptions {
            only: false,
            consumer: Consumer::LibvirtManaged,
        },
    )
    .unwrap();
    (inv, sel)
}

fn request(memory_gib: u64) -> VmRequest {
    VmRequest {
        renderer: Renderer::Libvirt,
        memory_kib: Some(memory_gib << 20),
        vcpus: Some(8),
        firmware: GuestFirmware::Ovmf,
        hole64: Hole64::Auto,
        phys_bits: None,
        numa: NumaMode::Auto,
        hugepages: HugePages::Off,
        viommu: false,
        memtune: true,
        cpu: None,
    }
}

#[test]
fn one_pure_function_decides_the_layout() {
    let (inv, sel) = hgx(&["03:00.0", "04:00.0", "05:00.0", "06:00.0"]);
    let p = plan(&inv, &sel, &request(64)).unwrap();
    // Four H100s: a 2 TiB window, which OVMF puts at 2T-4T over 64 GiB (42 bits, within the
    // IOMMU's 48), the guest's bits limited to the IOMMU's (narrower than the CPU's 52).
    assert_eq!(p.mmio.map(|m| m.window), Some(2 << 40));
    let fit = p.fit.unwrap();
    assert_eq!(
        (fit.place.base, fit.place.end, fit.place.bits()),
        (2 << 40, 4 << 40, 42)
    );
    assert_eq!(p.phys_limit, Some(48));
    assert!(p.sets_address_bits());
    // One switch: one clique of four; all on node 0; RAM + 1 GiB pinned.
    assert_eq!(p.cliques.len(), 4);
    assert!(
        matches!(p.numa, GuestNuma::Pinned { node: 0, .. }),
        "{:?}",
        p.numa
    );
    assert_eq!(p.memlock_bytes, Some(65 << 30));
    let kinds: Vec<&str> = p
        .notes
        .iter()
        .map(|n| match n {
            Note::Memlock { .. } => "memlock",
            Note::Window(_) => "window",
            Note::Numa { .. } => "numa",
            Note::Hugepages { .. } => "hugepages",
            Note::Cliques { .. } => "cliques",
            Note::QemuMemlock => "qemu-memlock",
            Note::Cpu { .. } => "cpu",
        })
        .collect();
    assert_eq!(kinds, ["memlock", "window", "numa", "cliques"]);
    assert!(p.notes[1]
        .to_string()
        .contains("OVMF places it at 2T-4T, within 48 address bits (the IOMMU's)"));

    // QEMU: no memlock figure (its RAM may be unknown), its own memlock note last.
    // For QEMU, RAM and vCPUs may be unknown.
    let qemu = |cpu: Option<&str>| VmRequest {
        renderer: Renderer::Qemu,
        memory_kib: None,
        vcpus: None,
        cpu: cpu.map(str::to_string),
        ..request(0)
    };
    let q = plan(&inv, &sel, &qemu(None)).unwrap();
    assert_eq!(q.memlock_bytes, None);
    assert_eq!(q.notes.last(), Some(&Note::QemuMemlock));

    // A `-cpu` model: the guest CPU with the IOMMU's limit, its note last, as data.
    let c = plan(&inv, &sel, &qemu(Some("host"))).unwrap();
    let cpu = GuestCpu {
        model: "host".into(),
        limit: Some(48),
    };
    assert_eq!(c.cpu.as_ref(), Some(&cpu));
    assert_eq!(
        c.notes.last(),
        Some(&Note::Cpu {
            cpu,
            widths: c.widths
        })
    );
    assert!(c.notes.last().unwrap().to_string().starts_with(
            "-cpu host,host-phys-bits=on,host-phys-bits-limit=48: the guest gets the host CPU's physical address bits, at most 48 (this host's IOMMU translates 48 bits, its CPU has 52)"
        ));
}

#[test]
fn refusals_are_typed() {
    let (inv, sel) = hgx(&["03:00.0", "83:00.0"]);
    let strict = VmRequest {
        numa: NumaMode::Strict,
        ..request(8)
    };
    assert_eq!(
        plan(&inv, &sel, &strict),
        Err(Refusal::NumaStrict { nodes: "0, 1".into() })
    );
    let one = VmRequest {
        vcpus: Some(1),
        ..request(8)
    };
    assert!(matches!(
        plan(&inv, &sel, &one),
        Err(Refusal::TooFewVcpus {
            vcpus: 1,
            needed: 2,
            ..
        })
    ));
    let pages = VmRequest {
        hugepages: HugePages::Gib1,
        memory_kib: Some((8 << 20) + 1024),
        ..request(8)
    };
    assert!(matches!(
        plan(&inv, &sel, &pages),
        Err(Refusal::HugepagesNotWhole { pages: "1G", .. })
    ));
    let narrow = VmRequest {
        phys_bits: Some(36),
        ..request(8)
    };
    match plan(&inv, &sel, &narrow) {
        Err(Refusal::Window(w)) => assert_eq!((w.code(), w.bits), ("E-OUT-15", 36)),
        other => panic!("{other:?}"),
    }
}
