use super::*;

#[test]
fn vfio_driver_spellings() {
    for d in [
        "vfio-pci",
        "vfio_pci",
        "nvgrace_gpu_vfio_pci",
        "mlx5-vfio-pci",
        "vfio_ap",
        "vfio-mdev",
    ] {
        assert!(is_vfio_driver(d), "{d}");
    }
    for d in [
        "",
        "vfio",
        "vfiopci",
        "nvidia",
        "pci-stub",
        "xvfio_pci",
        "vfio",
        "é_vfio_pci_",
    ] {
        assert!(!is_vfio_driver(d), "{d}");
    }
}

#[test]
fn hex_ids_are_their_strings() {
    let v = PciId::new(0x10de).unwrap();
    assert_eq!(
        (v.as_str(), v.value(), v.to_string()),
        ("10de", 0x10de, "10de".to_string())
    );
    assert_eq!(serde_json::to_string(&v).unwrap(), "\"10de\"");
    assert_eq!(serde_json::from_str::<PciId>("\"10DE\"").unwrap(), v);
    assert!(serde_json::from_str::<PciId>("\"10de0\"").is_err());
    assert!(serde_json::from_str::<PciId>("\"0x10\"").is_err());
    assert_eq!(ClassCode::new(0x30000).unwrap().as_str(), "030000");
    assert_eq!(Revision::new(0x100), None);
    assert_eq!(
        format!("{:>6}|{:?}", Revision::new(0xa1).unwrap(), v),
        "    a1|\"10de\""
    );
    assert!(v == "10de");
}

#[test]
fn address_text_is_the_kernels() {
    for a in [
        PciAddress::new(0, 0, 0, 0),
        PciAddress::new(0, 0x3b, 0x1f, 7),
        PciAddress::new(0x10000, 0xff, 0x1f, 0xff),
        PciAddress::new(u32::MAX, 1, 2, 3),
    ] {
        let want = format!("{:04x}:{:02x}:{:02x}.{:x}", a.domain, a.bus, a.device, a.function);
        assert_eq!(a.to_string(), want);
        assert_eq!(serde_json::to_string(&a).unwrap(), format!("\"{want}\""));
    }
}

#[test]
fn parses_full_and_short_addresses() {
    let a: PciAddress = "0000:01:00.0".parse().unwrap();
    assert_eq!(a, PciAddress::new(0, 1, 0, 0));
    let b: PciAddress = "01:00.1".parse().unwrap();
    assert_eq!(b, PciAddress::new(0, 1, 0, 1));
    let c: PciAddress = "10000:e1:1F.7".parse().unwrap();
    assert_eq!(c.to_string(), "10000:e1:1f.7");
}

#[test]
fn rejects_bad_addresses_with_reason() {
    for (bad, why) in [
        ("", "empty"),
        ("01:00", "function"),
        ("0g:00.0", "bus"),
        ("0000:01:00:00.0", "number of"),
        ("../01:00.0", "path separator"),
        ("01:20.0", "above 1f"),
        ("01:00.8", "function"),
        ("01:00.10", "function"),
        ("123:00.0", "bus"),
    ] {
        let e = bad.parse::<PciAddress>().unwrap_err();
        assert!(e.to_string().contains(why), "{bad}: {e}");
        assert!(e.to_string().contains("expected"), "{bad}: {e}");
    }
}

#[test]
fn address_round_trips_through_json() {
    let a = PciAddress::new(0, 0x65, 0x1f, 3);
    let j = serde_json::to_string(&a).unwrap();
    assert_eq!(j, "\"0000:65:1f.3\"");
    assert_eq!(serde_json::from_str::<PciAddress>(&j).unwrap(), a);
}

#[test]
fn vfio_driver_names() {
    assert!(is_vfio_driver("vfio-pci"));
    assert!(is_vfio_driver("mlx5_vfio_pci"));
    assert!(is_vfio_driver("nvgrace_gpu_vfio_pci"));
    assert!(!is_vfio_driver("nvidia"));
    assert!(driver_allows_vfio(None));
    assert!(driver_allows_vfio(Some("pci-stub")));
    assert!(!driver_allows_vfio(Some("snd_hda_intel")));
}

/// The readiness checks run in order, each with its reason; the Display is the short one.
#[test]
fn vfio_readiness_reasons_in_order() {
    let dir = tempfile::tempdir().unwrap();
    crate::testkit::fixtures::build("vfio-numa", dir.path()).unwrap();
    let mut inv = crate::inventory::scan(&crate::host::HostRoot::new(dir.path())).unwrap();
    let a: PciAddress = "0000:17:00.0".parse().unwrap();
    let ready = |inv: &Inventory| {
        let d = inv.device(&a).unwrap();
        (
            inv.vfio_group(d).map(|g| g.number),
            inv.vfio_readiness(d).map(|g| g.number),
        )
    };
    let n = inv.device(&a).unwrap().iommu_group.unwrap();
    assert_eq!(ready(&inv), (Ok(n), Ok(n)));

    let i = inv.devices.iter().position(|d| d.address == a).unwrap();
    inv.devices[i].backends.clear();
    let (group, full) = ready(&inv);
    assert_eq!(group, Ok(n));
    assert_eq!(full.unwrap_err().to_string(), format!("/dev/vfio/{n} is missing"));

    let gi = inv.groups.iter().position(|g| g.number == n).unwrap();
    let blocker = Blocker {
        address: "0000:17:00.1".parse().unwrap(),
        driver: "snd_hda_intel".into(),
    };
    inv.groups[gi].viable = false;
    inv.groups[gi].blockers = vec![blocker.clone(), blocker];
    let e = ready(&inv).1.unwrap_err();
    assert_eq!(e.to_string(), format!("group {n} is not viable"));
    assert_eq!(
        e.blocker_list(),
        "0000:17:00.1 (snd_hda_intel), 0000:17:00.1 (snd_hda_intel)"
    );

    inv.devices[i].iommu_group = None;
    assert_eq!(ready(&inv).0, Err(NotReady::NoGroup));
    assert_eq!(NotReady::NoGroup.to_string(), "no IOMMU group");

    inv.devices[i].driver = None;
    let e = ready(&inv).0.unwrap_err();
    assert_eq!(e, NotReady::NotOnVfio { driver: None });
    assert_eq!(e.to_string(), "bound to no driver, not vfio-pci");
    assert_eq!(e.blocker_list(), "");
}
