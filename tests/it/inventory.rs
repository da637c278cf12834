//! Inventory commands (`list`, `show`, `groups`, `check`, `snapshot`, `--from-json`) run as the
//! real binary against the fixture host trees, compared with golden outputs.

use crate::util::*;

const HOSTS: &[&str] = &[
    "workstation",
    "hgx-8gpu",
    "sriov-vgpu",
    "mdev-t4",
    "nvidia-minors",
    "legacy-bridge",
    // Captured from the QEMU lab's real kernel with `gpupass snapshot` (lab/lab.sh run snapshot
    // --update-fixture): VGA+HDA sharing a group, a device behind a root port, mdev parents.
    "qemu-lab",
];

#[test]
fn list_tables_and_json_match_golden() {
    for h in HOSTS {
        golden(&format!("{h}/list.txt"), &ok(&on_host(h, &["list"])));
        golden(&format!("{h}/list-all.txt"), &ok(&on_host(h, &["list", "--all"])));
        golden(
            &format!("{h}/list-all.json"),
            &ok(&on_host(h, &["list", "--all", "--json"])),
        );
        golden(&format!("{h}/groups.txt"), &ok(&on_host(h, &["groups"])));
        golden(
            &format!("{h}/groups.json"),
            &ok(&on_host(h, &["groups", "--json"])),
        );
    }
}

#[test]
fn show_matches_golden() {
    for (h, a) in [
        ("workstation", "01:00.0"),
        ("hgx-8gpu", "0000:83:00.0"),
        ("sriov-vgpu", "41:00.0"),
        ("sriov-vgpu", "41:00.5"),
        ("mdev-t4", "3b:00.0"),
        ("legacy-bridge", "05:00.0"),
        ("qemu-lab", "00:05.0"),
        ("qemu-lab", "01:00.0"),
    ] {
        golden(&format!("{h}/show-{a}.txt"), &ok(&on_host(h, &["show", a])));
        golden(
            &format!("{h}/show-{a}.json"),
            &ok(&on_host(h, &["show", a, "--json"])),
        );
    }
}

#[test]
fn json_has_the_documented_fields() {
    let v = ok_json(&on_host("workstation", &["list", "--all", "--json"]));
    assert_eq!(v["schema_version"], 1);
    let devs = v["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 11);
    for d in devs {
        for k in [
            "address",
            "vendor_id",
            "device_id",
            "class",
            "vendor_name",
            "device_name",
            "driver",
            "iommu_group",
            "numa_node",
            "bars",
        ] {
            assert!(d.get(k).is_some(), "device lacks {k}: {d}");
        }
    }
    // GPUs first.
    assert_eq!(devs[0]["address"], "0000:00:02.0");
    assert_eq!(devs[1]["address"], "0000:01:00.0");
    let gpu = &devs[1];
    assert_eq!(gpu["vendor_name"], "NVIDIA Corporation");
    assert_eq!(gpu["device_name"], "AD102 [GeForce RTX 4090]");
    assert_eq!(gpu["iommu_group"], 1);
    assert_eq!(gpu["driver"], "nvidia");
    assert_eq!(gpu["parent"], "0000:00:01.0");
    assert_eq!(gpu["bars"][1]["size"].as_u64(), Some(32 << 30));
    assert_eq!(gpu["bars"][1]["is_64bit"], true);
    assert_eq!(gpu["bars"][1]["prefetchable"], true);
    assert_eq!(gpu["rom"]["size"].as_u64(), Some(512 << 10));
    assert_eq!(gpu["reset_methods"], serde_json::json!(["bus"]));
    assert_eq!(gpu["nvidia"]["minor"], 0);
}

#[test]
fn groups_know_viability_and_blockers() {
    let v = ok_json(&on_host("workstation", &["groups", "--json"]));
    let g1 = group_json(&v, 1);
    assert_eq!(g1["members"].as_array().unwrap().len(), 3);
    assert_eq!(g1["viable"], false);
    let blockers: Vec<&str> = g1["blockers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["address"].as_str().unwrap())
        .collect();
    // The root port is a bridge: it never blocks.
    assert_eq!(blockers, ["0000:01:00.0", "0000:01:00.1"]);
}

#[test]
fn nvidia_minors_come_from_proc_not_order() {
    let v = ok_json(&on_host("nvidia-minors", &["list", "--json"]));
    let minors: Vec<u64> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["nvidia"]["minor"].as_u64().unwrap())
        .collect();
    assert_eq!(minors, [2, 0, 3, 1]);
}

#[test]
fn sriov_and_vgpu_profiles() {
    let v = ok_json(&on_host("sriov-vgpu", &["show", "41:00.0", "--json"]));
    let sr = &v["device"]["sriov"];
    assert_eq!(sr["total_vfs"], 16);
    assert_eq!(sr["num_vfs"], 4);
    assert_eq!(sr["vfs"][3], "0000:41:00.7");
    let vf = ok_json(&on_host("sriov-vgpu", &["show", "41:00.5", "--json"]));
    assert_eq!(vf["device"]["physfn"], "0000:41:00.0");
    assert_eq!(vf["device"]["vgpu_types"][1]["name"], "NVIDIA H200-2-35C");
    let vf0 = ok_json(&on_host("sriov-vgpu", &["show", "41:00.4", "--json"]));
    assert_eq!(vf0["device"]["current_vgpu_type"], "1044");
}

#[test]
fn mdev_types_and_instances() {
    let v = ok_json(&on_host("mdev-t4", &["list", "--all", "--json"]));
    let t4 = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["address"] == "0000:3b:00.0")
        .unwrap();
    let types = t4["mdev_types"].as_array().unwrap();
    assert_eq!(types.len(), 4);
    assert_eq!(types[0]["id"], "nvidia-222");
    assert_eq!(types[0]["available_instances"], 15);
    assert_eq!(types[0]["device_api"], "vfio-pci");
    let m = &v["mdevs"][0];
    assert_eq!(m["uuid"], "2f3e4d5c-6b7a-4988-8776-655443322110");
    assert_eq!(m["parent"], "0000:3b:00.0");
    assert_eq!(m["type_id"], "nvidia-222");
    assert_eq!(m["iommu_group"], 100);
}

#[test]
fn json_round_trips_through_from_json() {
    for h in HOSTS {
        let saved = ok(&on_host(h, &["list", "--all", "--json"]));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("inv.json");
        std::fs::write(&f, &saved).unwrap();
        let fj = f.to_str().unwrap();
        for args in [
            &["list", "--all", "--json"][..],
            &["list"],
            &["groups"],
            &["groups", "--json"],
        ] {
            let mut a = vec!["--from-json", fj];
            a.extend_from_slice(args);
            let live = ok(&on_host(h, args));
            assert_eq!(ok(&gpupass(&a)), live, "{h} {args:?} differs from --from-json");
        }
    }
}

#[test]
fn bad_addresses_are_usage_errors() {
    for bad in [
        "0g:00.0",
        "01:00",
        "0000:01:00:00.0",
        "../../etc/passwd",
        "01:00.9",
        "x",
        "0000:01:00.0/driver",
    ] {
        let o = on_host("workstation", &["show", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        assert!(stderr(&o).contains("expected"), "{bad}: {}", stderr(&o));
    }
}

#[test]
fn missing_device_is_a_host_error() {
    let o = on_host("workstation", &["show", "09:00.0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no PCI device 0000:09:00.0"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn missing_root_is_a_clear_error() {
    let o = gpupass(&["--root", "/nonexistent-gpupass-root", "list"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cannot list PCI devices"), "{}", stderr(&o));
}

#[test]
fn bad_from_json_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x.json");
    std::fs::write(&f, "{\"devices\": 3}").unwrap();
    let o = gpupass(&["--from-json", f.to_str().unwrap(), "list"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("cannot read saved inventory"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn garbled_attributes_degrade_with_warnings() {
    let t = scratch_host("workstation");
    let dev = t.path().join("sys/bus/pci/devices/0000:01:00.0");
    std::fs::write(dev.join("numa_node"), "banana\n").unwrap();
    std::fs::write(dev.join("resource"), "\u{0}\u{ff}garbage\n").unwrap();
    // A garbled modalias makes gpupass fall back to the separate ID attributes.
    std::fs::write(dev.join("modalias"), "pci:vZZZZ\n").unwrap();
    std::fs::write(dev.join("vendor"), [0xff, 0xfe, 0x00]).unwrap();
    std::fs::remove_file(dev.join("class")).unwrap();
    let o = gpupass(&["--root", t.path().to_str().unwrap(), "list", "--all", "--json"]);
    let out = ok(&o);
    let err = stderr(&o);
    assert!(err.contains("numa_node"), "{err}");
    assert!(err.contains("resource"), "{err}");
    assert!(err.contains("vendor"), "{err}");
    assert!(err.contains("class is missing"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let d = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["address"] == "0000:01:00.0")
        .unwrap();
    assert_eq!(d["numa_node"], serde_json::Value::Null);
    assert_eq!(d["bars"].as_array().unwrap().len(), 0);
    assert_eq!(d["driver"], "nvidia");
}

#[test]
fn check_reports_and_exits_by_readiness() {
    let o = on_host("workstation", &["check"]);
    golden("workstation/check.txt", &ok(&o));
    // No IOMMU groups: passthrough cannot work.
    let o = on_host("nvidia-minors", &["check"]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(out.contains("FAIL  iommu"), "{out}");
    assert!(out.contains("intel_iommu=on"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&on_host("nvidia-minors", &["check", "--json"]))).unwrap();
    assert_eq!(v["ready"], false);
}

#[test]
fn snapshot_replays_identically() {
    for h in HOSTS {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("snap");
        ok(&on_host(h, &["snapshot", out.to_str().unwrap()]));
        let replay = ok(&gpupass(&[
            "--root",
            out.to_str().unwrap(),
            "list",
            "--all",
            "--json",
        ]));
        assert_eq!(replay, ok(&on_host(h, &["list", "--all", "--json"])), "{h}");
    }
    // Refuses to write into a non-empty directory.
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("x"), "").unwrap();
    let o = on_host("workstation", &["snapshot", t.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not empty"));
}

#[test]
fn captured_lab_host_has_the_real_kernel_layout() {
    let v = ok_json(&on_host("qemu-lab", &["groups", "--json"]));
    let groups = v["groups"].as_array().unwrap();
    // The VGA+HDA multifunction pair shares one group, like a GPU with HDMI audio.
    let pair = groups
        .iter()
        .find(|g| {
            g["members"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m == "0000:00:05.0")
        })
        .unwrap();
    assert_eq!(
        pair["members"],
        serde_json::json!(["0000:00:05.0", "0000:00:05.1"])
    );
    assert_eq!(pair["viable"], false);
    let d = ok_json(&on_host("qemu-lab", &["show", "00:02.0", "--json"]));
    assert_eq!(d["device"]["boot_vga"], true);
    assert_eq!(d["device"]["driver"], "bochs-drm");
    // Behind the root port, in its own group apart from the port.
    let d = ok_json(&on_host("qemu-lab", &["show", "01:00.0", "--json"]));
    assert_eq!(d["device"]["parent"], "0000:00:08.0");
    assert_eq!(d["group"]["members"], serde_json::json!(["0000:01:00.0"]));
}

/// The VFIO cdev of each function (name, major:minor, node) and the backends that serve it now,
/// in `show`, `list --json` and `groups`; `check` says whether iommufd is usable and why not.
#[test]
fn cdev_and_backends_per_function() {
    let v = ok_json(&on_host("vfio-numa", &["show", "17:00.0", "--json"]));
    let d = &v["device"];
    assert_eq!(d["vfio_cdev"], "vfio0");
    assert_eq!(d["vfio_cdev_dev"], "511:0");
    assert_eq!(d["vfio_cdev_node_present"], true);
    assert_eq!(d["backends"], serde_json::json!(["legacy", "iommufd"]));
    assert_eq!(v["group"]["backends"], serde_json::json!(["legacy", "iommufd"]));
    let text = ok(&on_host("vfio-numa", &["show", "17:00.0"]));
    assert!(text.contains("/dev/vfio/devices/vfio0 511:0"), "{text}");
    assert!(text.contains("legacy,iommufd"), "{text}");
    let v = ok_json(&on_host("vfio-numa", &["list", "--all", "--json"]));
    assert_eq!(v["iommufd"]["usable"], true);
    assert_eq!(v["iommufd"]["vfio_container"], "legacy");
    let on_nvidia = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["driver"] == "nvidia")
        .unwrap();
    assert!(on_nvidia.get("backends").is_none(), "{on_nvidia}");
    let g = ok(&on_host("vfio-numa", &["groups"]));
    assert!(g.contains("BACKENDS"), "{g}");
    assert!(g.contains("legacy,iommufd"), "{g}");
    let g = ok_json(&on_host("vfio-numa", &["groups", "--json"]));
    assert!(g["groups"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["backends"] == serde_json::json!(["legacy", "iommufd"])));

    let c = ok(&on_host("vfio-numa", &["check"]));
    assert!(
        c.contains("PASS  iommufd") && c.contains("iommufd is usable"),
        "{c}"
    );
    assert!(c.contains("legacy container"), "{c}");
    // 6.1: no cdev; said, and not an error.
    let c = ok(&on_host("qemu-lab", &["check"]));
    assert!(c.contains("PASS  iommufd"), "{c}");
    assert!(c.contains("6.1 predates the VFIO device cdev (6.6)"), "{c}");
}

/// Linux 6.1 already gives a VFIO device its sysfs node `vfio-dev/vfioN`, but no character
/// device (no `dev` attribute) before 6.6: that is no cdev, and iommufd does not serve it.
#[test]
fn a_vfio_dev_directory_without_dev_is_no_cdev() {
    let t = scratch_host("vfio-numa");
    let root = t.path().to_str().unwrap();
    let dev = t
        .path()
        .join("sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/vfio-dev/vfio0/dev");
    let show = |root: &str| {
        let o = gpupass(&["--root", root, "--json", "show", "17:00.0"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (v["device"]["vfio_cdev"].clone(), v["device"]["backends"].clone())
    };
    assert_eq!(show(root).0, "vfio0");
    std::fs::remove_file(&dev).unwrap();
    let (cdev, backends) = show(root);
    assert!(cdev.is_null(), "{cdev}");
    assert_eq!(backends, serde_json::json!(["legacy"]));
}
