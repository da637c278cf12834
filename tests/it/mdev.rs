//! `gpupass mdev`: the real binary against fixture trees (golden outputs for the read side) and
//! against scratch copies driven by the fake kernel (`GPUPASS_FAKE_KERNEL=1`) for every change
//! and every refusal; mdevctl itself (Debian's package, run in a chroot of the scratch tree)
//! reads what gpupass writes and writes what gpupass reads.

use crate::util::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

const T4: &str = "0000:3b:00.0";
const T4_INSTANCE: &str = "2f3e4d5c-6b7a-4988-8776-655443322110";
const LAB_BUSY: &str = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001";
const LAB_MANUAL: &str = "5e1a3b9c-0d2f-4e6a-8b7c-9d0e1f2a3b4c";

/// `gpupass --root <dir> ARGS` with the fake kernel applying the writes.
fn fake(root: &Path, args: &[&str]) -> Output {
    fake_env(root, args, &[])
}

fn fake_env(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = crate::util::fake_kernel(&[]);
    c.arg("--root").arg(root).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run gpupass")
}

/// Every path under `root` with its content or link target: equal digests = nothing changed.
/// `run/` (the journal and the lock, which a change that rolled back leaves behind with its
/// `rolled_back` record) is not the host's state and is left out.
fn digest(root: &Path) -> BTreeMap<String, String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            if rel == "run" {
                continue;
            }
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                out.insert(rel, format!("-> {}", std::fs::read_link(&p).unwrap().display()));
            } else if ft.is_dir() {
                out.insert(rel, "dir".into());
                walk(base, &p, out);
            } else {
                out.insert(
                    rel,
                    String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned(),
                );
            }
        }
    }
    let mut m = BTreeMap::new();
    walk(root, root, &mut m);
    m
}

/// Assert a refusal: exit status `code`, stderr containing every `needles`, tree unchanged.
fn refused(root: &Path, args: &[&str], code: i32, needles: &[&str]) -> String {
    let before = digest(root);
    let o = fake(root, args);
    let err = stderr(&o);
    assert_eq!(
        o.status.code(),
        Some(code),
        "{args:?}: stdout {} stderr {err}",
        stdout(&o)
    );
    for n in needles {
        assert!(err.contains(n), "{args:?}: {n:?} not in {err}");
    }
    let after = digest(root);
    assert!(
        before == after,
        "{args:?} changed the host tree although it was refused"
    );
    err
}

fn read(root: &Path, rel: &str) -> String {
    std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn types_and_list_match_golden() {
    for h in ["mdev-t4", "mdev-lab", "sriov-vgpu", "workstation", "qemu-lab"] {
        golden(
            &format!("mdev/{h}/types.txt"),
            &ok(&on_host(h, &["mdev", "types"])),
        );
        golden(
            &format!("mdev/{h}/types.json"),
            &ok(&on_host(h, &["mdev", "types", "--json"])),
        );
        golden(&format!("mdev/{h}/list.txt"), &ok(&on_host(h, &["mdev", "list"])));
        golden(
            &format!("mdev/{h}/list.json"),
            &ok(&on_host(h, &["mdev", "list", "--json"])),
        );
        golden(
            &format!("mdev/{h}/defined.txt"),
            &ok(&on_host(h, &["mdev", "list", "--defined"])),
        );
    }
    golden(
        "mdev/mdev-lab/defined.json",
        &ok(&on_host("mdev-lab", &["mdev", "list", "--defined", "--json"])),
    );
    golden(
        "mdev/mdev-lab/types-mtty.txt",
        &ok(&on_host("mdev-lab", &["mdev", "types", "--parent", "mtty"])),
    );
    golden(
        "mdev/sriov-vgpu/types-vf.txt",
        &ok(&on_host("sriov-vgpu", &["mdev", "types", "--parent", "41:00.6"])),
    );
}

#[test]
fn read_side_facts() {
    // Virtual parents come from sys/class/mdev_bus, not from the PCI devices.
    let v = ok_json(&on_host("mdev-lab", &["mdev", "types", "--json"]));
    let names: Vec<&str> = v["parents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mbochs", "mdpy", "mtty"]);
    assert_eq!(v["parents"][0]["types"][2]["id"], "mbochs-small");
    assert_eq!(v["parents"][0]["types"][2]["available_instances"], 31);
    // The inventory carries them too (additive field).
    let inv = ok_json(&on_host("mdev-lab", &["list", "--all", "--json"]));
    assert_eq!(
        inv["mdev_parents"][0]["sysfs_path"],
        "/sys/devices/virtual/mbochs/mbochs"
    );
    // In use = some process holds /dev/vfio/N open.
    let l = ok_json(&on_host("mdev-lab", &["mdev", "list", "--json"]));
    let a = &l["active"][0];
    assert_eq!(a["instance"], LAB_BUSY);
    assert_eq!(a["parent"], "mbochs");
    assert_eq!(a["iommu_group"], 12);
    assert_eq!(a["vfio_node"], "/dev/vfio/12");
    assert_eq!(a["in_use"], true);
    assert_eq!(a["holders"][0]["pid"], 4242);
    assert_eq!(a["defined"], "auto");
    // NVIDIA vGPU: PF aggregates its VFs; the instance is the VF.
    let v = ok_json(&on_host("sriov-vgpu", &["mdev", "types", "--json"]));
    let p = &v["parents"][0];
    assert_eq!(p["name"], "0000:41:00.0");
    assert_eq!(p["kind"], "nvidia-vgpu");
    assert_eq!(p["types"][1]["id"], "1044");
    assert_eq!(p["types"][1]["available_instances"], 3);
    let l = ok_json(&on_host("sriov-vgpu", &["mdev", "list", "--json"]));
    assert_eq!(l["active"][0]["instance"], "0000:41:00.4");
    assert_eq!(l["active"][0]["type_id"], "1044");
    assert_eq!(l["active"][0]["type_name"], "NVIDIA H200-2-35C");
    // A saved inventory renders the same types.
    let saved = tempfile::tempdir().unwrap();
    let f = saved.path().join("inv.json");
    std::fs::write(&f, ok(&on_host("mdev-lab", &["list", "--all", "--json"]))).unwrap();
    let from = ok(&gpupass(&["--from-json", f.to_str().unwrap(), "mdev", "types"]));
    assert_eq!(from, ok(&on_host("mdev-lab", &["mdev", "types"])));
}

#[test]
fn create_and_remove_on_a_pci_parent() {
    let t = scratch_host("mdev-t4");
    let r = t.path();
    let avail = "sys/bus/pci/devices/0000:3b:00.0/mdev_supported_types/nvidia-222/available_instances";
    assert_eq!(read(r, avail).trim(), "15");
    let out = ok(&fake(
        r,
        &["mdev", "create", "--parent", "3b:00.0", "--type", "nvidia-222"],
    ));
    let uuid = out.trim().to_string();
    assert!(uuid.len() == 36 && &uuid[14..15] == "4", "a v4 UUID: {uuid}");
    let dev = r.join("sys/bus/mdev/devices").join(&uuid);
    assert!(dev.exists());
    let group = std::fs::read_link(dev.join("iommu_group")).unwrap();
    let g = group.file_name().unwrap().to_str().unwrap().to_string();
    assert!(r.join("dev/vfio").join(&g).exists(), "/dev/vfio/{g}");
    assert_eq!(read(r, avail).trim(), "14");
    let l = ok_json(&fake(r, &["mdev", "list", "--json"]));
    let row = l["active"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["instance"] == uuid.as_str())
        .expect("listed")
        .clone();
    assert_eq!(row["parent"], T4);
    assert_eq!(row["type_id"], "nvidia-222");
    assert_eq!(row["vfio_node"], format!("/dev/vfio/{g}"));
    assert_eq!(row["in_use"], false);
    // Fixed UUID, upper case accepted and normalised; --count with generated UUIDs.
    let fixed = "AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE";
    assert_eq!(
        ok(&fake(
            r,
            &["mdev", "create", "-p", T4, "-t", "nvidia-222", "-u", fixed]
        ))
        .trim(),
        fixed.to_lowercase()
    );
    let many = ok(&fake(
        r,
        &["mdev", "create", "-p", T4, "-t", "nvidia-222", "--count", "3"],
    ));
    assert_eq!(many.lines().count(), 3);
    assert_eq!(read(r, avail).trim(), "10");
    let rm = ok(&fake(r, &["mdev", "remove", &uuid]));
    assert!(rm.contains(&format!("removed {uuid} from {T4}")), "{rm}");
    assert!(!dev.exists());
    assert!(!r.join("dev/vfio").join(&g).exists());
    assert_eq!(read(r, avail).trim(), "11");
}

#[test]
fn create_on_a_virtual_parent() {
    let t = scratch_host("mdev-lab");
    let r = t.path();
    let u = ok(&fake(
        r,
        &["mdev", "create", "-p", "mbochs", "-t", "mbochs-large"],
    ));
    let link = std::fs::read_link(r.join("sys/bus/mdev/devices").join(u.trim())).unwrap();
    assert_eq!(
        link.display().to_string(),
        format!("../../../devices/virtual/mbochs/mbochs/{}", u.trim())
    );
    // mbochs-large is now exhausted.
    refused(
        r,
        &["mdev", "create", "-p", "mbochs", "-t", "mbochs-large"],
        1,
        &[
            "no available instances of mbochs-large on mbochs",
            "0 available, 1 wanted",
        ],
    );
    ok(&fake(r, &["mdev", "remove", u.trim()]));
    assert_eq!(
        read(
            r,
            "sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-large/available_instances"
        )
        .trim(),
        "1"
    );
}

#[test]
fn every_refusal_is_clear_and_changes_nothing() {
    let t = scratch_host("mdev-t4");
    let r = t.path();
    refused(
        r,
        &["mdev", "create", "-p", "3b:00.1", "-t", "nvidia-222"],
        1,
        &["no mdev parent \"3b:00.1\"", "did you mean \"0000:3b:00.0\"?"],
    );
    refused(
        r,
        &["mdev", "create", "-p", T4, "-t", "nvidia-22"],
        1,
        &[
            "has no mdev type \"nvidia-22\"",
            "valid types: nvidia-222, nvidia-223, nvidia-230, nvidia-234",
        ],
    );
    refused(
        r,
        &["mdev", "create", "-p", T4, "-t", "nvidia-223"],
        1,
        &["no available instances of nvidia-223 on 0000:3b:00.0"],
    );
    refused(
        r,
        &["mdev", "create", "-p", T4, "-t", "nvidia-222", "--count", "16"],
        1,
        &["15 available, 16 wanted"],
    );
    refused(
        r,
        &["mdev", "create", "-p", T4, "-t", "nvidia-222", "-u", "not-a-uuid"],
        2,
        &["is not a UUID"],
    );
    refused(
        r,
        &["mdev", "remove", "2f3e4d5c-6b7a-4988-8776"],
        2,
        &["neither an mdev UUID"],
    );
    refused(
        r,
        &["mdev", "create", "-p", T4, "-t", "nvidia-222", "--count", "0"],
        2,
        &["count"],
    );
    refused(
        r,
        &[
            "mdev",
            "create",
            "-p",
            T4,
            "-t",
            "nvidia-222",
            "-u",
            T4_INSTANCE,
            "--count",
            "2",
        ],
        2,
        &["--uuid names one instance"],
    );
    refused(
        r,
        &["mdev", "create", "-p", T4, "-t", "nvidia-222", "-u", T4_INSTANCE],
        1,
        &["mdev 2f3e4d5c-6b7a-4988-8776-655443322110 already exists (parent 0000:3b:00.0, type nvidia-222)"],
    );
    refused(
        r,
        &[
            "mdev",
            "create",
            "-p",
            T4,
            "-t",
            "nvidia-222",
            "--attr",
            "no-equals",
        ],
        2,
        &["NAME=VALUE"],
    );
    refused(
        r,
        &["mdev", "create", "-p", T4, "-t", "x", "--attr", "../x=1"],
        2,
        &["attribute name"],
    );
    refused(
        r,
        &["mdev", "remove", "11111111-2222-4333-8444-555555555555"],
        1,
        &["no active mdev 11111111-2222-4333-8444-555555555555"],
    );
    // In use: a QEMU holds the instance's /dev/vfio/100 open.
    std::fs::create_dir_all(r.join("proc/777/fd")).unwrap();
    std::fs::write(r.join("proc/777/comm"), "qemu-system-x86\n").unwrap();
    std::os::unix::fs::symlink("/dev/vfio/100", r.join("proc/777/fd/31")).unwrap();
    refused(
        r,
        &["mdev", "remove", T4_INSTANCE],
        1,
        &["is in use: /dev/vfio/100 is open by qemu-system-x86 (pid 777); stop the VM"],
    );
    refused(r, &["mdev", "stop", T4_INSTANCE], 1, &["in use"]);
    // A host without parents says so.
    let w = scratch_host("workstation");
    refused(
        w.path(),
        &["mdev", "create", "-p", "01:00.0", "-t", "x"],
        1,
        &["this host has none", "load the parent's driver"],
    );
    // A mutating command cannot run from a saved inventory.
    let o = gpupass(&["--from-json", "/nonexistent.json", "mdev", "remove", T4_INSTANCE]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn failures_after_the_first_write_roll_back() {
    let t = scratch_host("mdev-t4");
    let r = t.path();
    let before = digest(r);
    // --count 3, the second create fails: the first instance is removed again.
    let o = fake_env(
        r,
        &["mdev", "create", "-p", T4, "-t", "nvidia-222", "--count", "3"],
        &[("GPUPASS_FAIL_WRITE", "2")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("injected failure"), "{}", stderr(&o));
    // Group numbers are allocated and freed; the tree is back to where it was.
    assert!(digest(r) == before, "create --count rollback left changes");
    // An attribute the instance does not have: the kernel says ENOENT, gpupass removes it.
    let o = fake(
        r,
        &[
            "mdev",
            "create",
            "-p",
            T4,
            "-t",
            "nvidia-222",
            "--attr",
            "frame_rate_limiter=0",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("setting attribute frame_rate_limiter of mdev"), "{e}");
    assert!(e.contains("the instance was removed again"), "{e}");
    assert!(digest(r) == before, "attribute rollback left changes");
}

#[test]
fn attributes_are_written_in_order_after_create() {
    let t = scratch_host("mdev-lab");
    let r = t.path();
    // Give mtty-2 instances two writable attributes, as a vendor driver would.
    let u = "0f0e0d0c-0b0a-4908-8706-050403020100";
    ok(&fake(
        r,
        &[
            "mdev", "define", "-p", "mtty", "-t", "mtty-2", "-u", u, "--attr", "b=2", "--attr", "a=1",
        ],
    ));
    let text = read(r, &format!("etc/mdevctl.d/mtty/{u}"));
    assert!(
        text.find("\"b\"").unwrap() < text.find("\"a\"").unwrap(),
        "{text}"
    );
    // Starting it fails at attribute b (no such file in the fake instance): rolled back.
    let o = fake(r, &["mdev", "start", u]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("setting attribute b of mdev"),
        "{}",
        stderr(&o)
    );
    assert!(!r.join("sys/bus/mdev/devices").join(u).exists());
}

#[test]
fn definitions_define_start_stop_undefine() {
    let t = scratch_host("mdev-lab");
    let r = t.path();
    let u = ok(&fake(
        r,
        &["mdev", "define", "-p", "mdpy", "-t", "mdpy-vga", "--auto"],
    ));
    let u = u.trim();
    assert_eq!(
        read(r, &format!("etc/mdevctl.d/mdpy/{u}")),
        "{\n  \"mdev_type\": \"mdpy-vga\",\n  \"start\": \"auto\",\n  \"attrs\": []\n}"
    );
    refused(
        r,
        &["mdev", "define", "-p", "mdpy", "-t", "mdpy-vga", "-u", u],
        1,
        &["already defined"],
    );
    refused(
        r,
        &["mdev", "define", "-p", "mdyp", "-t", "mdpy-vga"],
        1,
        &["did you mean \"mdpy\"?", "--force"],
    );
    refused(
        r,
        &["mdev", "define", "-p", "mdpy", "-t", "mdpy-4k"],
        1,
        &["valid types: mdpy-hd, mdpy-vga, mdpy-xga"],
    );
    refused(
        r,
        &["mdev", "define", "-p", "mdpy"],
        2,
        &["both --parent and --type"],
    );
    // --auto-all starts auto definitions whose parent is present and that are not running
    // (the busy mbochs one already runs).
    let s = ok(&fake(r, &["mdev", "start", "--auto-all"]));
    assert_eq!(s.trim(), format!("started {u} (mdpy-vga on mdpy)"));
    assert!(r.join("sys/bus/mdev/devices").join(u).exists());
    assert!(ok(&fake(r, &["mdev", "start", "--auto-all"])).contains("nothing to start"));
    refused(r, &["mdev", "start", u], 1, &["already running on mdpy"]);
    let l = ok(&fake(r, &["mdev", "list", "--defined"]));
    assert!(
        l.lines()
            .any(|x| x.starts_with(u) && x.contains("auto") && x.contains("active")),
        "{l}"
    );
    ok(&fake(r, &["mdev", "stop", u]));
    assert!(!r.join("sys/bus/mdev/devices").join(u).exists());
    ok(&fake(r, &["mdev", "start", LAB_MANUAL]));
    assert!(r.join("sys/bus/mdev/devices").join(LAB_MANUAL).exists());
    ok(&fake(r, &["mdev", "undefine", u]));
    assert!(!r.join("etc/mdevctl.d/mdpy").join(u).exists());
    refused(r, &["mdev", "start", u], 1, &["no definition for mdev"]);
    // Define from a running instance: parent and type are copied.
    let running = ok(&fake(r, &["mdev", "create", "-p", "mtty", "-t", "mtty-1"]));
    ok(&fake(r, &["mdev", "define", "-u", running.trim()]));
    let d = read(r, &format!("etc/mdevctl.d/mtty/{}", running.trim()));
    assert!(
        d.contains("\"mdev_type\": \"mtty-1\"") && d.contains("\"manual\""),
        "{d}"
    );
    // Parent gone: a definition for a parent that is not here (defined with --force).
    let g = ok(&fake(
        r,
        &[
            "mdev",
            "define",
            "-p",
            "0000:65:00.0",
            "-t",
            "nvidia-222",
            "--force",
            "--auto",
        ],
    ));
    refused(
        r,
        &["mdev", "start", g.trim()],
        1,
        &["parent 0000:65:00.0 of mdev", "is not present on this host"],
    );
    // --auto-all skips it (parent absent) and says nothing failed.
    assert!(ok(&fake(r, &["mdev", "start", "--auto-all"])).contains("nothing to start"));
}

#[test]
fn nvidia_vendor_vfio_vgpu() {
    let t = scratch_host("sriov-vgpu");
    let r = t.path();
    let vf = |a: &str, f: &str| read(r, &format!("sys/bus/pci/devices/{a}/nvidia/{f}"));
    let out = fake(
        r,
        &["mdev", "create", "-p", "41:00.0", "-t", "1045", "--count", "2"],
    );
    assert_eq!(ok(&out), "0000:41:00.5\n0000:41:00.6\n");
    assert!(stderr(&out).contains("SR-IOV VF"), "{}", stderr(&out));
    assert_eq!(vf("0000:41:00.5", "current_vgpu_type").trim(), "1045");
    assert_eq!(
        vf("0000:41:00.5", "creatable_vgpu_types").trim(),
        "ID    : vGPU Name"
    );
    // By profile name, on the last free VF.
    assert_eq!(
        ok(&fake(
            r,
            &["mdev", "create", "-p", "0000:41:00.0", "-t", "NVIDIA H200-1-18C"]
        )),
        "0000:41:00.7\n"
    );
    refused(
        r,
        &["mdev", "create", "-p", "41:00.0", "-t", "1043"],
        1,
        &["no available instances of 1043"],
    );
    refused(
        r,
        &["mdev", "create", "-p", "41:00.0", "-t", "1043", "-u", T4_INSTANCE],
        2,
        &["take no --uuid"],
    );
    refused(
        r,
        &["mdev", "define", "-p", "41:00.0", "-t", "1043"],
        2,
        &["mdev devices only"],
    );
    let l = ok_json(&fake(r, &["mdev", "list", "--json"]));
    let names: Vec<&str> = l["active"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["instance"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["0000:41:00.4", "0000:41:00.5", "0000:41:00.6", "0000:41:00.7"]
    );
    assert!(l["active"]
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a["kind"] == "nvidia-vgpu"));
    // In use through the VF's group node: refused.
    std::fs::create_dir_all(r.join("proc/900/fd")).unwrap();
    std::fs::write(r.join("proc/900/comm"), "qemu-kvm\n").unwrap();
    std::os::unix::fs::symlink("/dev/vfio/23", r.join("proc/900/fd/40")).unwrap();
    refused(
        r,
        &["mdev", "remove", "41:00.5"],
        1,
        &["vGPU VF 0000:41:00.5 is in use", "qemu-kvm (pid 900)"],
    );
    let rm = ok(&fake(r, &["mdev", "remove", "41:00.6"]));
    assert_eq!(rm.trim(), "removed 0000:41:00.6 from 0000:41:00.0");
    assert_eq!(vf("0000:41:00.6", "current_vgpu_type").trim(), "0");
    assert!(vf("0000:41:00.6", "creatable_vgpu_types").contains("1045  : NVIDIA H200-4-71C"));
    refused(
        r,
        &["mdev", "remove", "41:00.6"],
        1,
        &["no NVIDIA vGPU type is set on it"],
    );
    // A VF named directly as the parent.
    assert_eq!(
        ok(&fake(r, &["mdev", "create", "-p", "41:00.6", "-t", "1044"])),
        "0000:41:00.6\n"
    );
}

// ---------------------------------------------------------------------------------------
// mdevctl interoperability: Debian's mdevctl (1.2.0 in bookworm) has no MDEVCTL_ENV_ROOT,
// so it runs chrooted into the scratch tree, where its /etc/mdevctl.d and /sys are the
// fixture's. Needs root (chroot) and mdevctl installed (.ci/run installs it).

fn mdevctl_bin() -> std::path::PathBuf {
    for p in [
        "/usr/sbin/mdevctl",
        "/usr/bin/mdevctl",
        "/sbin/mdevctl",
        "/bin/mdevctl",
    ] {
        if Path::new(p).exists() {
            return p.into();
        }
    }
    panic!("mdevctl is not installed: `apt-get install mdevctl` (.ci/run installs it); this interop test never skips")
}

/// Make `root` a chroot that can run mdevctl: the binary, its libraries, the directories
/// mdevctl insists on.
fn chroot_ready(root: &Path) {
    let bin = mdevctl_bin();
    let mut files = vec![bin.clone()];
    let ldd = Command::new("ldd").arg(&bin).output().expect("ldd");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let path = match line.split_once("=>") {
            Some((_, rhs)) => rhs.split_whitespace().next().map(str::to_string),
            None => line
                .split_whitespace()
                .next()
                .filter(|s| s.starts_with('/'))
                .map(str::to_string),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            files.push(p.into());
        }
    }
    for f in files {
        let dst = root.join(f.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(&f, &dst).unwrap_or_else(|e| panic!("copy {}: {e}", f.display()));
    }
    for d in [
        "etc/mdevctl.d/scripts.d/callouts",
        "etc/mdevctl.d/scripts.d/notifiers",
        "usr/lib/mdevctl/scripts.d/callouts",
        "usr/lib/mdevctl/scripts.d/notifiers",
        "sys/bus/mdev/devices",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
}

fn mdevctl(root: &Path, args: &[&str]) -> Output {
    let o = Command::new("chroot")
        .arg(root)
        .arg(mdevctl_bin())
        .args(args)
        .output()
        .expect("run chroot");
    assert!(
        o.status.success(),
        "chroot {} mdevctl {args:?} failed ({:?}; chroot needs root): {}{}",
        root.display(),
        o.status.code(),
        stdout(&o),
        stderr(&o)
    );
    o
}

#[test]
fn mdevctl_reads_what_gpupass_writes_and_the_reverse() {
    let t = scratch_host("mdev-lab");
    let r = t.path();
    chroot_ready(r);
    // gpupass define -> mdevctl list --defined shows it, with type, start and ordered attrs.
    let u = "1a2b3c4d-5e6f-4a0b-8c1d-2e3f4a5b6c7d";
    ok(&fake(
        r,
        &[
            "mdev",
            "define",
            "-p",
            "mbochs",
            "-t",
            "mbochs-medium",
            "-u",
            u,
            "--auto",
            "--attr",
            "z=9",
            "--attr",
            "y=8",
        ],
    ));
    let v: serde_json::Value =
        serde_json::from_slice(&mdevctl(r, &["list", "--defined", "--dumpjson"]).stdout).unwrap();
    let mine = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p.get("mbochs"))
        .flat_map(|devs| devs.as_array().unwrap().iter())
        .find_map(|d| d.get(u))
        .unwrap_or_else(|| panic!("mdevctl does not list {u}: {v}"));
    assert_eq!(mine["mdev_type"], "mbochs-medium");
    assert_eq!(mine["start"], "auto");
    assert_eq!(mine["attrs"], serde_json::json!([{"z": "9"}, {"y": "8"}]));
    let plain = stdout(&mdevctl(r, &["list", "--defined"]));
    assert!(
        plain.contains(&format!("{u} mbochs mbochs-medium auto")),
        "{plain}"
    );

    // mdevctl define -> gpupass lists it and starts it on the (fake) kernel.
    let m = "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a";
    mdevctl(r, &["define", "-u", m, "-p", "mdpy", "-t", "mdpy-hd", "--auto"]);
    let d = ok_json(&fake(r, &["mdev", "list", "--defined", "--json"]));
    let row = d["defined"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["uuid"] == m)
        .expect("gpupass sees it")
        .clone();
    assert_eq!(row["parent"], "mdpy");
    assert_eq!(row["mdev_type"], "mdpy-hd");
    assert_eq!(row["start"], "auto");
    assert_eq!(row["active"], false);
    ok(&fake(r, &["mdev", "start", m]));
    assert!(r.join("sys/bus/mdev/devices").join(m).exists());

    // What the fake kernel made is laid out so that mdevctl recognises it as running.
    let active = stdout(&mdevctl(r, &["list"]));
    assert!(
        active.contains(&format!("{m} mdpy mdpy-hd auto (defined)")),
        "{active}"
    );
    assert!(
        active.contains(&format!("{LAB_BUSY} mbochs mbochs-small auto (defined)")),
        "{active}"
    );

    // mdevctl undefine -> gpupass no longer lists it.
    mdevctl(r, &["undefine", "-u", m]);
    let d = ok_json(&fake(r, &["mdev", "list", "--defined", "--json"]));
    assert!(d["defined"].as_array().unwrap().iter().all(|x| x["uuid"] != m));
}

/// The number of sysfs writes `args` (an mdev change) plans: from its `--dry-run --json`.
fn plan_writes(root: &Path, args: &[&str]) -> usize {
    let mut a = args.to_vec();
    a.extend(["--dry-run", "--json"]);
    let v = ok_json(&fake(root, &a));
    assert_eq!(v["dry_run"], true);
    let n = v["plan"]["parts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["steps"].as_array().unwrap())
        .filter(|s| ["write", "write_file", "remove_file"].contains(&s["kind"].as_str().unwrap()))
        .count();
    assert_eq!(v["writes"].as_u64(), Some(n as u64));
    n
}

/// A crash after each write of an mdev plan (the count from the plan), then `recover`: the
/// host is back where it was; every later command says so until then; a change of the same
/// instance refuses to build on it. `recover --continue` finishes the plan instead.
fn crash_each_write_then_recover(base: &Path, args: &[&str], finished: impl Fn(&Path) -> bool) -> usize {
    let writes = plan_writes(base, args);
    assert!(writes > 0, "{args:?} plans no write");
    let before = digest(base);
    for n in 1..=writes {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        copy_tree(base, r);
        let o = fake_env(r, args, &[("GPUPASS_CRASH_AFTER_WRITE", &n.to_string())]);
        assert!(
            o.status.code().is_none(),
            "{args:?} crash {n}: should die by SIGABRT, got {:?} {}",
            o.status,
            stderr(&o)
        );
        assert!(digest(r) != before, "crash {n}: the write was made");
        let l = fake(r, &["mdev", "list"]);
        ok(&l);
        assert!(
            stderr(&l).contains(&format!("unfinished gpupass {}", args[..2].join(" ")))
                && stderr(&l).contains(&format!("stopped at write {n} of {writes}"))
                && stderr(&l).contains("gpupass recover"),
            "crash {n}: {}",
            stderr(&l)
        );
        // The same change again refuses (the instance is gone, or the unfinished plan touches
        // it), naming the unfinished plan; a create of generated UUIDs plans new ones. In a
        // copy, so the test goes on from the crash.
        if !args.contains(&"--count") {
            let t3 = tempfile::tempdir().unwrap();
            copy_tree(r, t3.path());
            let again = fake(t3.path(), args);
            assert_eq!(again.status.code(), Some(1), "{}", stderr(&again));
            assert!(
                stderr(&again).contains("an unfinished gpupass"),
                "{}",
                stderr(&again)
            );
        }
        let t2 = tempfile::tempdir().unwrap();
        copy_tree(r, t2.path());
        // ...recover --dry-run changes nothing, recover restores the state before.
        let d = digest(r);
        let out = ok(&fake(r, &["recover", "--dry-run"]));
        assert!(out.contains("restoring the unfinished"), "{out}");
        assert!(digest(r) == d, "recover --dry-run changed the host");
        let out = ok(&fake(r, &["recover"]));
        assert!(out.contains("restoring the unfinished"), "{out}");
        assert!(
            digest(r) == before,
            "{args:?} crash after write {n}: recover did not restore"
        );
        let l = fake(r, &["mdev", "list"]);
        assert!(!stderr(&l).contains("unfinished"), "{}", stderr(&l));
        assert!(ok(&fake(r, &["recover"])).contains("nothing to recover"));
        // --continue finishes it instead.
        let out = ok(&fake(t2.path(), &["recover", "--continue"]));
        assert!(out.contains("completing the unfinished"), "{out}");
        assert!(
            finished(t2.path()),
            "{args:?} crash {n}: recover --continue did not finish"
        );
        assert!(!stderr(&fake(t2.path(), &["mdev", "list"])).contains("unfinished"));
    }
    writes
}

fn instances(r: &Path) -> usize {
    std::fs::read_dir(r.join("sys/bus/mdev/devices"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn a_crash_after_each_write_of_an_mdev_plan_is_recovered() {
    // create --count 3 on a PCI parent: three writes, one per instance.
    let t = scratch_host("mdev-t4");
    let r = t.path();
    let had = instances(r);
    let args = ["mdev", "create", "-p", T4, "-t", "nvidia-222", "--count", "3"];
    assert_eq!(
        crash_each_write_then_recover(r, &args, |d| instances(d) == had + 3),
        3
    );
    // remove and stop: one write each; recover creates the instance again.
    let u = "0f0e0d0c-0b0a-4908-8706-050403020100";
    ok(&fake(
        r,
        &["mdev", "create", "-p", T4, "-t", "nvidia-222", "-u", u],
    ));
    let gone = |d: &Path| !d.join("sys/bus/mdev/devices").join(u).exists();
    assert_eq!(crash_each_write_then_recover(r, &["mdev", "remove", u], gone), 1);
    assert_eq!(crash_each_write_then_recover(r, &["mdev", "stop", u], gone), 1);
    // start of a definition: the create write.
    let t = scratch_host("mdev-lab");
    let r = t.path();
    let u2 = "1f0e0d0c-0b0a-4908-8706-050403020101";
    ok(&fake(
        r,
        &["mdev", "define", "-p", "mtty", "-t", "mtty-2", "-u", u2],
    ));
    let up = |d: &Path| d.join("sys/bus/mdev/devices").join(u2).exists();
    assert_eq!(crash_each_write_then_recover(r, &["mdev", "start", u2], up), 1);
    // NVIDIA vendor-VFIO vGPU: the type writes of two VFs, and the clear of one.
    let t = scratch_host("sriov-vgpu");
    let r = t.path();
    let ty = |d: &Path, a: &str| read(d, &format!("sys/bus/pci/devices/{a}/nvidia/current_vgpu_type"));
    let args = ["mdev", "create", "-p", "41:00.0", "-t", "1045", "--count", "2"];
    let set = |d: &Path| ty(d, "0000:41:00.5").trim() == "1045" && ty(d, "0000:41:00.6").trim() == "1045";
    assert_eq!(crash_each_write_then_recover(r, &args, set), 2);
    ok(&fake(r, &args));
    let cleared = |d: &Path| ty(d, "0000:41:00.5").trim() == "0";
    assert_eq!(
        crash_each_write_then_recover(r, &["mdev", "remove", "0000:41:00.5"], cleared),
        1
    );
}

#[test]
fn mdev_dry_run_prints_the_steps_and_changes_nothing() {
    let t = scratch_host("mdev-lab");
    let r = t.path();
    let before = digest(r);
    let u = "2f0e0d0c-0b0a-4908-8706-050403020102";
    let out = ok(&fake(
        r,
        &[
            "mdev",
            "create",
            "-p",
            "mtty",
            "-t",
            "mtty-2",
            "-u",
            u,
            "--attr",
            "b=2",
            "--dry-run",
        ],
    ));
    assert_eq!(
        out,
        format!(
            "plan: mdev create of {u} (mtty-2 on mtty) (2 writes)\nsteps:\n   \
             1. write \"{u}\" > /sys/class/mdev_bus/mtty/mdev_supported_types/mtty-2/create\n   \
             2. check /sys/bus/mdev/devices/{u} exists\n   \
             3. write \"2\" > /sys/bus/mdev/devices/{u}/b\n\
             dry run: nothing was changed\n"
        )
    );
    assert!(
        digest(r) == before && !r.join("run").exists(),
        "a dry run took the lock or wrote"
    );
    ok(&fake(
        r,
        &["mdev", "create", "-p", "mtty", "-t", "mtty-2", "-u", u],
    ));
    let out = ok(&fake(r, &["mdev", "remove", u, "--dry-run"]));
    assert!(
        out.contains(&format!("write \"1\" > /sys/bus/mdev/devices/{u}/remove")),
        "{out}"
    );
    assert!(
        out.contains(&format!("check /sys/bus/mdev/devices/{u} is gone")),
        "{out}"
    );
    assert!(r.join("sys/bus/mdev/devices").join(u).exists());
}

/// A change reads the host under the one lock: `mdev define -u U` started while another
/// gpupass holds the lock waits, and when U was defined meanwhile (by the lock's holder) it
/// refuses with "already defined" and leaves that definition as it is; it does not plan
/// from what it would have read before the wait and overwrite it.
#[test]
fn an_mdev_change_plans_from_the_host_as_it_is_once_the_lock_is_held() {
    let t = scratch_host("mdev-lab");
    let r = t.path();
    let u = "0b5b6c1e-7d2a-4f3e-9a8b-1c2d3e4f5a6b";
    let host = gpupass::host::HostRoot::new(r);
    let lock = gpupass::change::journal::lock(&host, std::time::Duration::ZERO).unwrap();
    let child = crate::util::fake_kernel(&[])
        .arg("--root")
        .arg(r)
        .args(["mdev", "define", "-p", "mdpy", "-t", "mdpy-vga", "-u", u])
        .env("GPUPASS_LOCK_TIMEOUT", "30")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Until it says it waits, it has not read the definitions: it waits before any read.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let theirs = "{\n  \"mdev_type\": \"mdpy-xga\",\n  \"start\": \"manual\",\n  \"attrs\": []\n}";
    std::fs::create_dir_all(r.join("etc/mdevctl.d/mdpy")).unwrap();
    std::fs::write(r.join(format!("etc/mdevctl.d/mdpy/{u}")), theirs).unwrap();
    drop(lock);
    let o = child.wait_with_output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("waiting for another gpupass"), "{e}");
    assert!(e.contains("already defined"), "{e}");
    assert_eq!(read(r, &format!("etc/mdevctl.d/mdpy/{u}")), theirs);
}
