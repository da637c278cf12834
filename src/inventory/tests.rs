use super::*;

/// `scan_mdev` finds the parents, types and instances `scan` finds, on every shipped
/// fixture host (virtual parents, a PCI mdev parent, NVIDIA vendor-VFIO vGPU VFs, hosts
/// without any); a named parent's scope finds that parent as the whole scan does; the
/// instances scope finds the instances and nothing else.
#[test]
fn the_mdev_scan_finds_what_the_whole_scan_finds() {
    use crate::mdev::types::parents;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hosts");
    let json = |v: &dyn erased::Ser| v.value();
    let mut seen_parents = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let host = HostRoot::new(e.unwrap().path());
        let full = scan(&host).unwrap();
        let all = scan_mdev(&host, MdevScope::All).unwrap();
        let want = parents(&full);
        assert_eq!(json(&want), json(&parents(&all)), "{}", host.root().display());
        assert_eq!(json(&full.mdevs), json(&all.mdevs), "{}", host.root().display());
        for p in &want {
            seen_parents += 1;
            let one = scan_mdev(&host, MdevScope::Parent(&p.name)).unwrap();
            let got = parents(&one);
            let found = got.iter().find(|g| g.name == p.name);
            assert_eq!(
                found.map(|g| json(g)),
                Some(json(p)),
                "{} {}",
                host.root().display(),
                p.name
            );
            assert_eq!(json(&full.mdevs), json(&one.mdevs));
            // One type named: that type as the whole scan reads it (of a virtual parent, the
            // only one read); a type the parent lacks: every type, for the error.
            for t in &p.types {
                let typed = parents(&scan_mdev(&host, MdevScope::Type(&p.name, &t.t.id)).unwrap());
                let found = typed.iter().find(|g| g.name == p.name).expect("the parent");
                let ft = found.types.iter().find(|x| x.t.id == t.t.id);
                assert_eq!(ft.map(|x| json(x)), Some(json(t)), "{} {}", p.name, t.t.id);
                if p.pci.is_none() {
                    assert_eq!(found.types.len(), 1, "{} {}", p.name, t.t.id);
                }
            }
            let lacking = parents(&scan_mdev(&host, MdevScope::Type(&p.name, "no-such-type")).unwrap());
            assert_eq!(
                lacking.iter().find(|g| g.name == p.name).map(|g| json(g)),
                Some(json(p)),
                "{}",
                p.name
            );
        }
        let inst = scan_mdev(&host, MdevScope::Instances).unwrap();
        assert_eq!(json(&full.mdevs), json(&inst.mdevs));
        assert!(inst.devices.is_empty() && inst.mdev_parents.is_empty());
    }
    assert!(
        seen_parents >= 6,
        "the fixtures hold mdev and vGPU parents: {seen_parents}"
    );
}

mod erased {
    pub trait Ser {
        fn value(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Ser for T {
        fn value(&self) -> serde_json::Value {
            serde_json::to_value(self).unwrap()
        }
    }
}

#[test]
fn iommu_widths() {
    // QEMU 10's intel-iommu (aw-bits=48) as the 6.12 lab guest reads it; a 39-bit unit.
    assert_eq!(intel_mgaw("d2008c202f0466"), Some(48));
    assert_eq!(intel_mgaw("0xd2008c202f0466\n"), Some(48));
    assert_eq!(intel_mgaw("d2008c20260466"), Some(39));
    assert_eq!(intel_mgaw("nonsense"), None);
    assert_eq!(amd_hats("58f77ef22294200:5"), Some(48));
    assert_eq!(amd_hats("58f77ef22294600"), Some(57));
    assert_eq!(amd_hats("58f77ef22294a00"), Some(64));
    assert_eq!(amd_hats(""), None);
}

#[test]
fn cpu_phys_bits_from_cpuinfo() {
    let c = "processor\t: 0\nflags\t\t: fpu\naddress sizes\t: 46 bits physical, 57 bits virtual\n";
    assert_eq!(parse_phys_bits(c), Some(46));
    assert_eq!(
        parse_phys_bits("address sizes : 40 bits physical, 48 bits virtual"),
        Some(40)
    );
    assert_eq!(parse_phys_bits("processor : 0\n"), None);
    assert_eq!(parse_phys_bits("address sizes : many bits physical"), None);
}

#[test]
fn cpu_vendor_from_cpuinfo() {
    let c = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n";
    assert_eq!(parse_vendor(c).as_deref(), Some("AuthenticAMD"));
    assert_eq!(
        parse_vendor("vendor_id : GenuineIntel").as_deref(),
        Some("GenuineIntel")
    );
    assert_eq!(parse_vendor("processor : 0\n"), None);
    assert_eq!(parse_vendor("vendor_id : \n"), None);
    assert_eq!(parse_vendor("vendor_id : ../../etc\n"), None);
}

#[test]
fn resource_lines() {
    let text = "0x00000000fd000000 0x00000000fdffffff 0x0000000000040200\n\
                    0x00000000e0000000 0x00000000efffffff 0x000000000014220c\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                    0x000000000000e000 0x000000000000e07f 0x0000000000040101\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                    0x00000000fe000000 0x00000000fe07ffff 0x0000000000046200\n";
    let (bars, errs) = parse_resource(text);
    assert!(errs.is_empty());
    assert_eq!(bars.len(), 4);
    assert_eq!(bars[0].size, 16 << 20);
    assert!(!bars[0].prefetchable && !bars[0].is_64bit);
    assert_eq!(bars[1].index, 1);
    assert!(bars[1].prefetchable && bars[1].is_64bit);
    assert_eq!(bars[2].kind, BarKind::Io);
    assert_eq!(bars[2].size, 0x80);
    assert_eq!(bars[3].index, 6);
}

#[test]
fn resource_garbage_is_reported_not_fatal() {
    let (bars, errs) =
        parse_resource("zz 0x1 0x200\n0x1000 0x1fff\n0x2000 0x1000 0x200\n0x0 0xffffffffffffffff 0x200\n");
    assert!(bars.is_empty());
    assert_eq!(errs.len(), 4);
}

#[test]
fn resource_kernel_lines_and_other_spellings_agree() {
    // The kernel's spelling takes the byte path; the same numbers spelled otherwise
    // (upper-case prefix, extra spaces, CRLF, no prefix) take the general one.
    let kernel = "0x00000000fd000000 0x00000000fdffffff 0x0000000000040200\n\
                      0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                      0x00000000E0000000 0x00000000EFFFFFFF 0x000000000014220C\n\
                      0x0000000000000000 0x0000000000000000 0x0000000000000100\n\
                      0x0000000000002000 0x0000000000001000 0x0000000000000200";
    let other = "0X00000000fd000000  0x00000000fdffffff 0x0000000000040200\r\n\
                     0x0 0x0 0x0\n\
                     e0000000 efffffff 14220c\n\
                     0x0000000000000000 0x0000000000000000\t0x0000000000000100\n\
                     0x2000 0x1000 0x200";
    let (a, ea) = parse_resource(kernel);
    let (b, eb) = parse_resource(other);
    assert_eq!(a, b);
    assert_eq!(ea, eb);
    assert_eq!(a.len(), 2);
    assert_eq!((a[1].index, a[1].size), (2, 0x1000_0000));
    assert_eq!(ea, vec!["line 4 ends before it starts".to_string()]);
    // Line numbers count empty lines and a last line without its newline.
    let (c, ec) = parse_resource("\n0x0000000000001000 0x0000000000001fff 0x0000000000000200\n\nx");
    assert_eq!(c[0].index, 1);
    assert_eq!(
        ec,
        vec![
            "line 0 has 0 fields, expected 3",
            "line 2 has 0 fields, expected 3",
            "line 3 has 1 fields, expected 3"
        ]
    );
}

#[test]
fn modalias_ids() {
    let m = parse_pci_modalias("pci:v000010DEd00002684sv00001043sd0000889Cbc03sc00i00\n").unwrap();
    assert_eq!(
        (m.vendor, m.device, m.subvendor, m.subdevice, m.class),
        (0x10de, 0x2684, 0x1043, 0x889c, 0x030000)
    );
    for bad in [
        "",
        "usb:v1d2",
        "pci:v000010DEd00002684sv00001043sd0000889Cbc03sc00",
        "pci:v000010DEd00002684sv00001043sd0000889Cbc03sc00i00x",
        "pci:v0001_0DEd00002684sv00001043sd0000889Cbc03sc00i00",
        "pci:v100010DEd00002684sv00001043sd0000889Cbc03sc00i00",
    ] {
        assert_eq!(parse_pci_modalias(bad), None, "{bad}");
    }
}

#[test]
fn nvidia_information() {
    let t = "Model: \t\t NVIDIA H200\nIRQ:   \t\t 310\nGPU UUID: \t GPU-0b1c\nBus Location: \t 0000:18:00.0\nDevice Minor: \t 2\n";
    let i = parse_nvidia_information(t);
    assert_eq!(i.minor, Some(2));
    assert_eq!(i.model.as_deref(), Some("NVIDIA H200"));
    assert_eq!(i.uuid.as_deref(), Some("GPU-0b1c"));
}

#[test]
fn creatable_vgpu_types_table() {
    let t = "ID    : vGPU Name\n1043  : NVIDIA H200-1-18C\n1044  : NVIDIA H200-2-35C\n";
    let v = parse_creatable_vgpu_types(t);
    assert_eq!(v.len(), 2);
    assert_eq!(v[1].id, "1044");
    assert_eq!(v[1].name.as_deref(), Some("NVIDIA H200-2-35C"));
}
