use super::*;
use crate::containers::dra::testing::{scan, vgpu_host};
use crate::testkit::hostgen::{DevSpec, HostBuilder};

fn gpu_and_audio(h: &mut HostBuilder) {
    h.add(
        &DevSpec::new("00:05.0", 0x1234, 0x1111, 0x030000)
            .group(4)
            .driver("bochs-drm"),
    )
    .unwrap();
    h.add(
        &DevSpec::new("00:05.1", 0x8086, 0x293e, 0x040300)
            .group(4)
            .driver("snd_hda_intel"),
    )
    .unwrap();
}

#[test]
fn a_gpu_and_its_audio_are_one_device_named_after_the_gpu() {
    let (_t, inv) = scan(gpu_and_audio);
    let p = publishable(&inv);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].name, "pci-0000-00-05-0");
    assert_eq!(p[0].group, 4);
    assert_eq!(p[0].members.len(), 2);
    let a = attributes(&inv, &p[0]);
    assert_eq!(
        a["resource.kubernetes.io/pciBusID"].string.as_deref(),
        Some("0000:00:05.0")
    );
    assert_eq!(
        a["resource.kubernetes.io/pcieRoot"].string.as_deref(),
        Some("pci0000:00")
    );
    assert_eq!(
        a["gpupass.dev/members"].string.as_deref(),
        Some("0000:00:05.0,0000:00:05.1")
    );
    assert_eq!(a["gpupass.dev/iommuGroup"].int, Some(4));
    assert_eq!(a["gpupass.dev/driver"].string.as_deref(), Some("bochs-drm"));
    assert_eq!(a["gpupass.dev/sriovRole"].string.as_deref(), Some("none"));
}

/// KEP-6072's `resource.kubernetes.io/numaNode`: the lead function's (or an mdev slot's
/// parent's) node where the kernel gives one; absent where it says -1, so a selector on it
/// must be guarded on a host without NUMA (contrib/dra/claim-examples.yaml).
#[test]
fn the_standard_numa_node_is_published_only_where_the_kernel_gives_one() {
    let (_t, inv) = scan(|h| {
        gpu_and_audio(h);
        h.add(
            &DevSpec::new("41:00.0", 0x10de, 0x1eb8, 0x030200)
                .group(7)
                .driver("nvidia")
                .numa(1, "8-15"),
        )
        .unwrap();
        h.mdev_type(
            &"0000:41:00.0".parse().unwrap(),
            "nvidia-63",
            "GRID T4-1B",
            "num_heads=4, framebuffer=1024M",
            1,
            "vfio-pci",
        )
        .unwrap();
    });
    let devs = devices(&inv);
    let numa = |name: &str| {
        let d = devs.iter().find(|d| d.name == name).unwrap();
        let a = d.attributes.as_ref().unwrap();
        assert_eq!(
            a.get("resource.kubernetes.io/numaNode").map(|v| v.int),
            a.get("gpupass.dev/numaNode").map(|v| v.int),
            "{name}: the standard and gpupass's attribute agree"
        );
        a.get("resource.kubernetes.io/numaNode").and_then(|v| v.int)
    };
    assert_eq!(numa("pci-0000-00-05-0"), None, "numa_node -1: not published");
    assert_eq!(numa("pci-0000-41-00-0"), Some(1));
    assert_eq!(numa("mdev-0000-41-00-0-nvidia-63-0"), Some(1));
    for d in &devs {
        assert!(
            d.attributes.as_ref().unwrap().len() <= MAX_ATTRIBUTES,
            "{}",
            d.name
        );
    }
}

#[test]
fn a_group_with_a_host_nic_is_refused_naming_it() {
    let (_t, inv) = scan(|h| {
        gpu_and_audio(h);
        h.add(
            &DevSpec::new("00:06.0", 0x8086, 0x10d3, 0x020000)
                .group(4)
                .driver("e1000e"),
        )
        .unwrap();
    });
    assert!(publishable(&inv).is_empty());
    let d = decide(&inv);
    let r = d[0].reason.as_deref().unwrap();
    assert!(r.starts_with("also holds 0000:00:06.0"), "{r}");
    assert!(r.contains("e1000e"), "{r}");
}

#[test]
fn the_boot_vga_device_is_not_offered() {
    let (_t, inv) = scan(|h| {
        h.add(
            &DevSpec::new("00:02.0", 0x8086, 0x46a6, 0x030000)
                .group(0)
                .driver("i915")
                .boot_vga(true),
        )
        .unwrap();
    });
    assert!(publishable(&inv).is_empty());
    assert!(decide(&inv)[0].reason.as_deref().unwrap().contains("boot VGA"));
}

#[test]
fn a_pool_larger_than_a_slice_is_split_with_one_slice_count() {
    let (_t, inv) = scan(|h| {
        for i in 0..300u32 {
            let a = format!("{:02x}:{:02x}.0", 1 + i / 32, i % 32);
            h.add(
                &DevSpec::new(&a, 0x10de, 0x2684, 0x030000)
                    .group(i)
                    .driver("nvidia"),
            )
            .unwrap();
        }
    });
    let opts = SliceOptions {
        node: "n1".into(),
        driver: "vfio.gpupass.dev".into(),
        generation: 7,
    };
    let s = render(&inv, &opts);
    let sizes: Vec<usize> = s.iter().map(|x| x.spec.devices.as_ref().unwrap().len()).collect();
    assert_eq!(sizes, [128, 128, 44]);
    for x in &s {
        assert_eq!(x.spec.pool.resource_slice_count, 3);
        assert_eq!(x.spec.pool.generation, 7);
        assert_eq!(x.spec.pool.name, "n1");
        assert_eq!(x.spec.node_name.as_deref(), Some("n1"));
    }
    let names: std::collections::BTreeSet<_> = s.iter().map(|x| x.metadata.name.clone().unwrap()).collect();
    assert_eq!(names.len(), 3);
    // An empty pool is one slice with no devices.
    let (_t, empty) = scan(|_| {});
    let e = render(&empty, &opts);
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].spec.pool.resource_slice_count, 1);
    assert!(e[0].spec.devices.as_ref().unwrap().is_empty());
}

#[test]
fn long_member_lists_are_cut_to_the_api_limit_with_a_count() {
    let m: Vec<PciAddress> = (0..8)
        .map(|f| format!("0000:3b:00.{f}").parse().unwrap())
        .collect();
    let l = member_list(&m);
    assert!(l.len() <= MAX_VALUE_LEN, "{l}");
    assert!(
        l.starts_with("0000:3b:00.0,0000:3b:00.1,0000:3b:00.2,0000:3b:00.3"),
        "{l}"
    );
    assert!(l.ends_with(",+4"), "{l}");
    let short = &m[..2];
    assert_eq!(member_list(short), "0000:3b:00.0,0000:3b:00.1");
}

#[test]
fn string_values_are_cut_on_a_char_boundary() {
    let long = "é".repeat(40);
    let v = s(long).string.unwrap();
    assert!(v.len() <= MAX_VALUE_LEN);
    assert!(v.ends_with("..."));
}

#[test]
fn the_whole_gpu_consumes_every_counter_of_its_vgpus_and_counters_get_slices_of_their_own() {
    let (_t, inv) = scan(vgpu_host);
    let slices = render(
        &inv,
        &SliceOptions {
            node: "n1".into(),
            driver: "vfio.gpupass.dev".into(),
            generation: 3,
        },
    );
    // The GPU group and the six slots all consume counters: one slice of devices, one of
    // counter sets; never both in one slice.
    assert_eq!(slices.len(), 2);
    for s in &slices {
        assert!(s.spec.devices.is_some() != s.spec.shared_counters.is_some());
        assert_eq!(s.spec.pool.resource_slice_count, 2);
    }
    let devs = slices[0].spec.devices.as_ref().unwrap();
    let gpu = devs.iter().find(|d| d.name == "pci-0000-01-00-0").unwrap();
    let c = gpu.consumes_counters.as_ref().unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].counter_set, "mdev-0000-01-00-0");
    assert_eq!(c[0].counters["nvidia-63"].value.0, "2");
    assert_eq!(c[0].counters["nvidia-64"].value.0, "1");
    let ga = gpu.attributes.as_ref().unwrap();
    assert_eq!(ga["gpupass.dev/type"].string.as_deref(), Some("group"));
    assert_eq!(slices[1].spec.shared_counters.as_ref().unwrap().len(), 2);
}

#[test]
fn many_slots_go_64_to_a_slice_and_a_type_offers_at_most_64() {
    let (_t, inv) = scan(|h| {
        h.virtual_mdev_parent(
            "mbochs",
            "mbochs",
            &[
                ("mbochs-1", "a", None, 200, "vfio-pci"),
                ("mbochs-2", "b", None, 50, "vfio-pci"),
            ],
        )
        .unwrap();
    });
    let (slots, d) = slots::decide(&inv);
    assert_eq!(slots.len(), 64 + 50);
    assert!(d[0]
        .reason
        .as_deref()
        .unwrap()
        .contains("200 available; offered 64"));
    let s = render(
        &inv,
        &SliceOptions {
            node: "n1".into(),
            driver: "vfio.gpupass.dev".into(),
            generation: 1,
        },
    );
    let sizes: Vec<usize> = s
        .iter()
        .map(|x| x.spec.devices.as_ref().map_or(0, Vec::len))
        .collect();
    assert_eq!(sizes, [64, 50, 0]);
    assert_eq!(
        s[2].spec.shared_counters.as_ref().unwrap()[0].counters["mbochs-1"]
            .value
            .0,
        "64"
    );
}
