//! Planner and apply tests against the fixture hosts and the fake kernel.

use super::apply;
use super::facts::{self, HostFacts, Use};
use super::*;
use crate::host::ops::HostOps;
use crate::host::HostRoot;
use crate::inventory;
use crate::testkit::hostgen::{DevSpec, HostBuilder};
use crate::testkit::FakeHost;
use std::path::PathBuf;

fn fixture(name: &str) -> HostRoot {
    HostRoot::new(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/hosts")
            .join(name),
    )
}

fn view(name: &str) -> (Inventory, HostFacts) {
    let h = fixture(name);
    let inv = inventory::scan(&h).unwrap();
    let f = facts::gather(&h, &inv);
    (inv, f)
}

fn a(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn req(addrs: &[&str]) -> BindRequest {
    BindRequest {
        addresses: addrs.iter().map(|x| a(x)).collect(),
        ..Default::default()
    }
}

fn writes(p: &Plan) -> Vec<(String, String)> {
    p.steps
        .iter()
        .filter_map(|s| match s {
            Step::Write { path, value, .. } => Some((path.clone(), value.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn workstation_gpu_binds_whole_group_audio_first_bridge_untouched() {
    let (inv, f) = view("workstation");
    let p = plan_bind(&inv, &f, &req(&["01:00.0"]));
    assert!(p.refusals.is_empty(), "{:?}", p.refusals);
    assert_eq!(p.groups, vec![1]);
    let addrs: Vec<String> = p.functions.iter().map(|f| f.address.to_string()).collect();
    assert_eq!(addrs, ["0000:01:00.1", "0000:01:00.0"]);
    let w = writes(&p);
    assert_eq!(
        w,
        vec![
            (
                "/sys/bus/pci/devices/0000:01:00.1/driver_override".into(),
                "vfio-pci".into()
            ),
            (
                "/sys/bus/pci/drivers/snd_hda_intel/unbind".into(),
                "0000:01:00.1".into()
            ),
            ("/sys/bus/pci/drivers_probe".into(), "0000:01:00.1".into()),
            (
                "/sys/bus/pci/devices/0000:01:00.0/driver_override".into(),
                "vfio-pci".into()
            ),
            ("/sys/bus/pci/drivers/nvidia/unbind".into(), "0000:01:00.0".into()),
            ("/sys/bus/pci/drivers_probe".into(), "0000:01:00.0".into()),
        ]
    );
    assert!(!w.iter().any(|(p, _)| p.contains("new_id")));
    assert!(!w.iter().any(|(p, _)| p.contains("00:01.0")), "bridge touched");
    assert!(p.steps.contains(&Step::CheckViable { group: 1 }));
    assert!(p
        .steps
        .iter()
        .any(|s| matches!(s, Step::CheckNode { group: 1, .. })));
    // Every write is followed (per function) by a driver check.
    let checks = p
        .steps
        .iter()
        .filter(|s| matches!(s, Step::CheckDriver { .. }))
        .count();
    assert_eq!(checks, 2);
    // Naming the audio function plans the same thing.
    let p2 = plan_bind(&inv, &f, &req(&["01:00.1"]));
    assert_eq!(writes(&p2), w);
}

#[test]
fn every_refusal_has_reason_and_fix() {
    let (inv, f) = view("workstation");
    for (addr, needle, forceable) in [
        ("00:02.0", "boot VGA", true),
        ("00:02.0", "/dev/dri/card1 is open by pid 1337 (Xorg)", true),
        ("02:00.0", "mounted filesystem / (ext4 on /dev/nvme0n1p2)", true),
        ("03:00.0", "enp3s0 is up", true),
        ("00:01.0", "is a PCI bridge", false),
        ("0000:7f:00.0", "no such PCI device", false),
    ] {
        let p = plan_bind(&inv, &f, &req(&[addr]));
        let r = p
            .refusals
            .iter()
            .find(|r| r.reason.contains(needle))
            .unwrap_or_else(|| panic!("{addr}: no refusal with {needle:?}: {:?}", p.refusals));
        assert_eq!(r.forceable, forceable, "{addr} {needle}");
        assert!(!r.fix.is_empty());
        assert!(!p.blocking(false).is_empty());
        assert_eq!(
            p.blocking(true).is_empty(),
            forceable || p.refusals.iter().all(|r| r.forceable)
        );
    }
    let (inv, f) = view("legacy-bridge");
    let p = plan_bind(&inv, &f, &req(&["05:00.0"]));
    let mixed = p
        .refusals
        .iter()
        .find(|r| r.reason.contains("also holds 0000:05:01.0"))
        .unwrap();
    assert!(!mixed.forceable);
    assert!(
        mixed.fix.contains("--only") && mixed.fix.contains("ACS"),
        "{}",
        mixed.fix
    );
    assert!(p.refusals.iter().any(|r| r.reason.contains("boot VGA")));
    // Naming the NIC too removes the mixed-group refusal but not its own in-use one.
    let p = plan_bind(&inv, &f, &req(&["05:00.0", "05:01.0"]));
    assert!(!p.refusals.iter().any(|r| r.reason.contains("also holds")));
    assert!(p.refusals.iter().any(|r| r.reason.contains("enp5s1 is up")));
}

#[test]
fn no_iommu_group_and_bad_driver_are_refused() {
    let (inv, f) = view("nvidia-minors");
    let p = plan_bind(&inv, &f, &req(&["07:00.0"]));
    assert!(
        p.refusals[0].reason.contains("no IOMMU group"),
        "{:?}",
        p.refusals
    );
    let (inv, f) = view("workstation");
    let mut r = req(&["01:00.0"]);
    r.driver = Some("nouveau".into());
    let p = plan_bind(&inv, &f, &r);
    assert!(p.refusals.iter().any(|r| r.reason.contains("not a VFIO driver")));
    assert!(valid_driver_name("mlx5_vfio_pci") && valid_driver_name("vfio-pci"));
    assert!(!valid_driver_name("../x") && !valid_driver_name("") && !valid_driver_name("a b"));
}

#[test]
fn only_warns_which_members_block_viability() {
    let (inv, f) = view("workstation");
    let mut r = req(&["01:00.0"]);
    r.only = true;
    let p = plan_bind(&inv, &f, &r);
    assert!(p.refusals.is_empty());
    assert_eq!(p.functions.len(), 1);
    assert_eq!(p.warnings.len(), 1);
    assert!(
        p.warnings[0].contains("group 1 will not be viable"),
        "{}",
        p.warnings[0]
    );
    assert!(
        p.warnings[0].contains("0000:01:00.1 (snd_hda_intel"),
        "{}",
        p.warnings[0]
    );
    assert!(!p.steps.iter().any(|s| matches!(s, Step::CheckViable { .. })));
}

#[test]
fn variant_driver_is_chosen_and_overridable() {
    let (inv, mut f) = view("workstation");
    f.variants.insert(a("01:00.0"), "nvgrace_gpu_vfio_pci".into());
    let p = plan_bind(&inv, &f, &req(&["01:00.0"]));
    let gpu = p.functions.iter().find(|x| x.address == a("01:00.0")).unwrap();
    assert_eq!(gpu.after.driver.as_deref(), Some("nvgrace_gpu_vfio_pci"));
    assert!(p.steps.contains(&Step::LoadModule {
        module: "nvgrace_gpu_vfio_pci".into()
    }));
    assert!(p.notes.iter().any(|n| n.contains("variant")));
    let mut r = req(&["01:00.0"]);
    r.driver = Some("vfio-pci".into());
    let p = plan_bind(&inv, &f, &r);
    assert!(p
        .functions
        .iter()
        .all(|x| x.after.driver.as_deref() == Some("vfio-pci")));
}

#[test]
fn variant_from_modules_alias() {
    let t = tempfile::tempdir().unwrap();
    let mut h = HostBuilder::new(t.path()).unwrap();
    h.kernel("6.8.0-1-nvidia-64k", "", &["nvidia"]).unwrap();
    h.add(
        &DevSpec::new("0009:01:00.0", 0x10de, 0x2342, 0x030200)
            .group(9)
            .driver("nvidia"),
    )
    .unwrap();
    h.modules_alias(
        "6.8.0-1-nvidia-64k",
        &[
            ("pci:v000010DEd*sv*sd*bc03sc02i00*", "nvidia"),
            ("vfio_pci:v000010DEd*sv*sd*bc*sc*i*", "too_broad_vfio_pci"),
            (
                "vfio_pci:v000010DEd00002342sv*sd*bc*sc*i*",
                "nvgrace_gpu_vfio_pci",
            ),
        ],
    )
    .unwrap();
    let host = HostRoot::new(t.path());
    let inv = inventory::scan(&host).unwrap();
    let f = facts::gather(&host, &inv);
    assert_eq!(
        f.variants.get(&a("0009:01:00.0")).map(String::as_str),
        Some("nvgrace_gpu_vfio_pci")
    );
}

#[test]
fn in_use_detection_reads_the_host() {
    let (_, f) = view("workstation");
    assert!(f
        .uses_of(&a("02:00.0"))
        .iter()
        .any(|u| matches!(u, Use::Mount { mountpoint, .. } if mountpoint == "/")));
    assert!(f.uses_of(&a("03:00.0")).contains(&Use::NetUp {
        iface: "enp3s0".into()
    }));
    assert!(f
        .uses_of(&a("00:02.0"))
        .iter()
        .any(|u| matches!(u, Use::Framebuffer { console: Some(_), .. })));
    assert!(
        f.uses_of(&a("01:00.0")).is_empty(),
        "{:?}",
        f.uses_of(&a("01:00.0"))
    );
    assert!(f.loaded_drivers.contains("nvidia"));
}

#[test]
fn unbind_plan_restores_journaled_drivers_and_refuses_open_groups() {
    let (inv, mut f) = view("hgx-8gpu");
    let _ = &mut f;
    // Nothing is on VFIO there: unbind has nothing to do.
    let p = plan_unbind(
        &inv,
        &f,
        &BoundState::new(),
        &UnbindRequest {
            addresses: vec![a("03:00.0")],
            ..Default::default()
        },
    );
    assert!(p.functions.is_empty());
    assert!(p.notes[0].contains("not on a VFIO driver"), "{:?}", p.notes);
}

/// A two-function group on the fake kernel, like the lab's 00:05.0 + 00:05.1.
fn lab_like() -> (tempfile::TempDir, HostRoot) {
    let t = tempfile::tempdir().unwrap();
    let mut h = HostBuilder::new(t.path()).unwrap();
    h.kernel("6.1.0-57-amd64", "intel_iommu=on", &["bochs", "snd_hda_intel"])
        .unwrap();
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
    let root = HostRoot::new(t.path());
    (t, root)
}

fn drivers(h: &HostRoot) -> Vec<(String, Option<String>, String)> {
    ["0000:00:05.0", "0000:00:05.1"]
        .iter()
        .map(|x| {
            let d = h.sys_bus_pci_devices().join(x);
            (
                x.to_string(),
                crate::host::link_name(&d.join("driver")).unwrap(),
                crate::host::read_attr(&d.join("driver_override")).unwrap(),
            )
        })
        .collect()
}

fn no_announce(_: &Plan) {}

#[test]
fn rollback_at_every_write_restores_everything() {
    let (_t, h) = lab_like();
    let orig = drivers(&h);
    // Count the writes of a clean bind first.
    let n = {
        let (_t2, h2) = lab_like();
        let ops = FakeHost::new(h2.clone());
        let r = apply::bind(&ops, &req(&["00:05.0"]), false, false, &no_announce).unwrap();
        assert!(r.outcome.is_some());
        ops.writes().len()
    };
    assert_eq!(n, 6);
    for k in 1..=n {
        let ops = FakeHost::new(h.clone()).fail_at(k);
        let e = apply::bind(&ops, &req(&["00:05.0"]), false, false, &no_announce).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("rolled back"), "write {k}: {msg}");
        assert_eq!(drivers(&h), orig, "after failing write {k}");
        assert!(!h.dev_vfio().join("4").exists(), "write {k}");
        let r = crate::change::journal::read(&h).unwrap();
        assert!(r.open.is_empty() && r.bound.is_empty(), "write {k}");
    }
    // Unbind rollback: a failed unbind leaves the group on VFIO.
    let ops = FakeHost::new(h.clone());
    apply::bind(&ops, &req(&["00:05.0"]), false, false, &no_announce).unwrap();
    let bound = drivers(&h);
    for k in 1..=6 {
        let ops = FakeHost::new(h.clone()).fail_at(k);
        let e = apply::unbind(
            &ops,
            &UnbindRequest {
                addresses: vec![a("00:05.0")],
                ..Default::default()
            },
            false,
            false,
            &no_announce,
        )
        .unwrap_err();
        assert!(e.to_string().contains("rolled back"), "unbind write {k}: {e}");
        assert_eq!(drivers(&h), bound, "unbind write {k}");
        assert!(h.dev_vfio().join("4").exists());
    }
    let ops = FakeHost::new(h.clone());
    apply::unbind(
        &ops,
        &UnbindRequest {
            addresses: vec![a("00:05.1")],
            ..Default::default()
        },
        false,
        false,
        &no_announce,
    )
    .unwrap();
    assert_eq!(drivers(&h), orig);
}

#[test]
fn probe_that_binds_nothing_is_caught_and_rolled_back() {
    let (_t, h) = lab_like();
    let orig = drivers(&h);
    std::fs::write(
        h.sys_bus_pci_devices().join("0000:00:05.0/.fake_refuse_bind"),
        "vfio-pci\n",
    )
    .unwrap();
    let ops = FakeHost::new(h.clone());
    let e = apply::bind(&ops, &req(&["00:05.1"]), false, false, &no_announce).unwrap_err();
    let m = e.to_string();
    assert!(m.contains("driverless after drivers_probe, not vfio-pci"), "{m}");
    assert!(m.contains("rolled back"), "{m}");
    assert_eq!(drivers(&h), orig);
}

#[test]
fn refused_unbind_is_rolled_back() {
    let (_t, h) = lab_like();
    let ops = FakeHost::new(h.clone());
    apply::bind(&ops, &req(&["00:05.0"]), false, false, &no_announce).unwrap();
    let bound = drivers(&h);
    std::fs::write(
        h.sys_bus_pci_devices().join("0000:00:05.1/.fake_refuse_unbind"),
        "vfio-pci\n",
    )
    .unwrap();
    let e = apply::unbind(
        &ops,
        &UnbindRequest {
            addresses: vec![a("00:05.0")],
            ..Default::default()
        },
        false,
        false,
        &no_announce,
    )
    .unwrap_err();
    assert!(e.to_string().contains("Device or resource busy"), "{e}");
    assert_eq!(drivers(&h), bound);
}

#[test]
fn unbind_refused_while_a_process_holds_the_group() {
    let (_t, h) = lab_like();
    let ops = FakeHost::new(h.clone());
    apply::bind(&ops, &req(&["00:05.0"]), false, false, &no_announce).unwrap();
    let b = HostBuilder::new(h.root()).unwrap();
    b.open_fd(4242, "qemu-system-x86", 30, "/dev/vfio/4").unwrap();
    let e = apply::unbind(
        &ops,
        &UnbindRequest {
            group: Some(4),
            ..Default::default()
        },
        false,
        false,
        &no_announce,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("open by pid 4242 (qemu-system-x86)"),
        "{e}"
    );
}

#[test]
fn selection_refusals_are_one_record_in_bind_unbind_and_persist() {
    // The text is what docs/errors.md (E-BIND-02, -03, -08) and the golden outputs show.
    let (inv, f) = view("workstation");
    let missing = a("0000:7f:00.0");
    let bridge = a("00:01.0");
    let expect = [
        (
            Refusal::no_such_device(missing),
            "no such PCI device on this host",
            "`gpupass list --all` shows the devices there are",
        ),
        (
            Refusal::bridge_bind(bridge),
            "is a PCI bridge; VFIO assigns endpoint devices and bridges never block a group",
            "bind the device behind it (`gpupass groups` lists the group's endpoints)",
        ),
        (
            Refusal::bridge_unbind(bridge),
            "is a PCI bridge; gpupass never binds bridges",
            "name the device behind it",
        ),
    ];
    for (r, reason, fix) in &expect {
        assert_eq!(
            (r.reason.as_str(), r.fix.as_str(), r.forceable),
            (*reason, *fix, false)
        );
    }
    let unbind = |addr: PciAddress| {
        plan_unbind(
            &inv,
            &f,
            &BoundState::new(),
            &UnbindRequest {
                addresses: vec![addr],
                ..Default::default()
            },
        )
        .refusals
    };
    let persist = |addr: PciAddress, remove: bool| {
        let r = BindRequest {
            addresses: vec![addr],
            ..Default::default()
        };
        persist::plan_persist(&inv, &f, &BoundState::new(), &r, remove).refusals
    };
    let missing_req = req(&["0000:7f:00.0"]);
    assert_eq!(
        plan_bind(&inv, &f, &missing_req).refusals,
        [Refusal::no_such_device(missing)]
    );
    assert_eq!(unbind(missing), [Refusal::no_such_device(missing)]);
    assert_eq!(persist(missing, false), [Refusal::no_such_device(missing)]);
    assert_eq!(persist(missing, true), [Refusal::no_such_device(missing)]);
    assert_eq!(
        plan_bind(&inv, &f, &req(&["00:01.0"])).refusals,
        [Refusal::bridge_bind(bridge)]
    );
    assert_eq!(persist(bridge, false), [Refusal::bridge_bind(bridge)]);
    assert_eq!(unbind(bridge), [Refusal::bridge_unbind(bridge)]);
    let (inv, f) = view("nvidia-minors");
    let p = plan_bind(&inv, &f, &req(&["07:00.0"]));
    assert_eq!(p.refusals, [Refusal::no_iommu_group(a("07:00.0"))]);
    assert_eq!(
        p.refusals[0].fix,
        "enable the IOMMU (intel_iommu=on or amd_iommu=on on the kernel command line; see `gpupass check`)"
    );
}

/// A GPU on NVIDIA's driver with a CUDA process holding its `/dev/nvidia<minor>` is refused
/// (forceable), naming the node, the pid and nvidia-smi; a GPU whose node nobody holds, and
/// the shared `/dev/nvidiactl`, do not count.
#[test]
fn a_process_on_dev_nvidia_minor_refuses_the_bind() {
    let t = tempfile::tempdir().unwrap();
    let mut b = HostBuilder::new(t.path()).unwrap();
    b.kernel("6.8.0-1-generic", "intel_iommu=on", &["nvidia"])
        .unwrap();
    for (addr, group, minor) in [("07:00.0", 7u32, 2u32), ("0f:00.0", 15, 0)] {
        b.add(
            &DevSpec::new(addr, 0x10de, 0x20b0, 0x030200)
                .group(group)
                .driver("nvidia"),
        )
        .unwrap();
        b.nvidia_info(&a(addr), minor, "NVIDIA A100-SXM4-40GB", &format!("GPU-{minor}"))
            .unwrap();
    }
    b.open_fd(777, "python3", 5, "/dev/nvidia2").unwrap();
    b.open_fd(777, "python3", 6, "/dev/nvidiactl").unwrap();
    b.open_fd(778, "nvidia-persiste", 3, "/dev/nvidiactl").unwrap();
    let h = HostRoot::new(t.path());
    let inv = inventory::scan(&h).unwrap();
    let f = facts::gather(&h, &inv);
    assert_eq!(
        f.uses_of(&a("07:00.0")),
        &[Use::NvidiaOpen {
            node: "nvidia2".into(),
            pid: 777,
            comm: "python3".into()
        }]
    );
    assert!(f.uses_of(&a("0f:00.0")).is_empty());
    let p = plan_bind(&inv, &f, &req(&["07:00.0"]));
    assert_eq!(p.refusals.len(), 1, "{:?}", p.refusals);
    let r = &p.refusals[0];
    assert!(
        r.reason.contains("/dev/nvidia2 is open by pid 777 (python3)"),
        "{}",
        r.reason
    );
    assert!(r.fix.contains("nvidia-smi"), "{}", r.fix);
    assert!(r.forceable && p.blocking(true).is_empty(), "--force overrides it");
    assert!(plan_bind(&inv, &f, &req(&["0f:00.0"])).refusals.is_empty());
}
