//! Hostile and broken hosts: symlink loops, files that never end, garbage, unreadable entries,
//! devices vanishing mid-listing, a group that changes between plan and apply. Every command
//! must finish (a deadline kills a hang), never panic, and say what is wrong.

use crate::util::{drivers, run_bounded, scratch_host};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

const GPU: &str = "0000:01:00.0";
const AUDIO: &str = "0000:01:00.1";
const NIC: &str = "0000:03:00.0";
const NVME: &str = "0000:02:00.0";

fn gp(root: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut c = crate::util::fake_kernel(&[]);
    c.arg("--root").arg(root).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let r = run_bounded(c, 30);
    assert_ne!(r.0, Some(101), "{args:?} panicked:\n{}", r.2);
    assert!(r.0.is_some(), "{args:?} was killed by a signal:\n{}", r.2);
    r
}

/// The real directory of a device (the bus entry is a link into sys/devices).
fn dev_dir(root: &Path, addr: &str) -> PathBuf {
    std::fs::canonicalize(root.join("sys/bus/pci/devices").join(addr)).unwrap()
}

fn replace(p: &Path, with: impl FnOnce(&Path)) {
    let _ = std::fs::remove_file(p);
    let _ = std::fs::remove_dir_all(p);
    with(p);
}

/// Every read command on the tree: finishes, no panic; returns the stderr of `list --all`.
fn read_commands_survive(root: &Path) -> String {
    let (code, out, err) = gp(root, &["list", "--all"], &[]);
    assert_eq!(code, Some(0), "list --all:\n{out}\n{err}");
    let (code, out, _) = gp(root, &["list", "--all", "--json"], &[]);
    assert_eq!(code, Some(0));
    serde_json::from_str::<serde_json::Value>(&out).expect("list --json stays valid JSON");
    for args in [
        &["groups"][..],
        &["show", GPU],
        &["mdev", "list"],
        &["mdev", "types"],
        &["bind", "--dry-run", GPU],
    ] {
        let (code, _, e) = gp(root, args, &[]);
        assert!(matches!(code, Some(0 | 1)), "{args:?}: {code:?}\n{e}");
    }
    let (code, _, e) = gp(root, &["check"], &[]);
    assert!(matches!(code, Some(0 | 1)), "check: {code:?}\n{e}");
    err
}

#[test]
fn symlink_loops_and_vanished_devices_are_reported_and_skipped() {
    let t = scratch_host("workstation");
    let r = t.path();
    // A device's driver link pointing at itself; an iommu_group link loop.
    replace(&dev_dir(r, GPU).join("driver"), |p| symlink("driver", p).unwrap());
    replace(&dev_dir(r, AUDIO).join("iommu_group"), |p| {
        symlink("iommu_group", p).unwrap()
    });
    let bus = r.join("sys/bus/pci/devices");
    // A bus entry that loops, and one whose device directory vanished (dangling link).
    symlink("0000:09:00.0", bus.join("0000:09:00.0")).unwrap();
    symlink(
        "../../../devices/pci0000:00/0000:00:1c.0/0000:0a:00.0",
        bus.join("0000:0a:00.0"),
    )
    .unwrap();
    // An IOMMU group directory that loops.
    let g = r.join("sys/kernel/iommu_groups/99");
    std::fs::create_dir_all(&g).unwrap();
    symlink("devices", g.join("devices")).unwrap();
    let err = read_commands_survive(r);
    for n in [
        "0000:01:00.0: driver links to \"driver\", not to a driver",
        "0000:01:00.1: iommu_group links to \"iommu_group\", not a group number",
        "0000:09:00.0: cannot list its sysfs directory: Too many levels of symbolic links",
        "0000:0a:00.0: its sysfs directory is gone or empty",
    ] {
        assert!(err.contains(n), "missing warning {n:?}:\n{err}");
    }
    // One warning per vanished device, not one per attribute.
    assert_eq!(err.matches("0000:0a:00.0").count(), 1, "{err}");
    let (_, out, _) = gp(r, &["list", "--all"], &[]);
    assert!(
        !out.contains("0000:09:00.0") && !out.contains("0000:0a:00.0"),
        "{out}"
    );
    // A snapshot of the broken tree completes too.
    let s = tempfile::tempdir().unwrap();
    let (code, _, e) = gp(r, &["snapshot", s.path().join("snap").to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{e}");
}

#[test]
fn files_that_never_end_are_refused_not_read_forever() {
    let t = scratch_host("workstation");
    let r = t.path();
    let nic = dev_dir(r, NIC);
    // /dev/zero as an attribute.
    replace(&nic.join("vendor"), |p| symlink("/dev/zero", p).unwrap());
    replace(&nic.join("resource"), |p| symlink("/dev/zero", p).unwrap());
    // A FIFO with no writer (an open would block) and one with a writer that never stops.
    replace(&nic.join("modalias"), |p| {
        rustix::fs::mkfifoat(rustix::fs::CWD, p, 0o644.into()).unwrap()
    });
    let endless = dev_dir(r, NVME).join("modalias");
    replace(&endless, |p| {
        rustix::fs::mkfifoat(rustix::fs::CWD, p, 0o644.into()).unwrap()
    });
    let mut writer = Command::new("sh")
        .arg("-c")
        .arg(format!("yes pci:v0000144Dd0000A80A > '{}'", endless.display()))
        .spawn()
        .unwrap();
    // procfs files the bind checks read, as FIFO and /dev/zero.
    std::fs::create_dir_all(r.join("proc/self")).unwrap();
    replace(&r.join("proc/self/mountinfo"), |p| {
        rustix::fs::mkfifoat(rustix::fs::CWD, p, 0o644.into()).unwrap()
    });
    replace(&r.join("proc/swaps"), |p| symlink("/dev/zero", p).unwrap());
    replace(&r.join("proc/cmdline"), |p| symlink("/dev/zero", p).unwrap());
    let err = read_commands_survive(r);
    let _ = writer.kill();
    let _ = writer.wait();
    assert!(
        err.contains("0000:03:00.0: cannot read modalias: not a regular file"),
        "{err}"
    );
    assert!(
        err.contains("0000:03:00.0: cannot read vendor: not a regular file"),
        "{err}"
    );
    assert!(
        err.contains("0000:02:00.0: cannot read modalias: not a regular file"),
        "{err}"
    );
}

#[test]
fn garbage_values_become_warnings_and_nulls() {
    let t = scratch_host("workstation");
    let r = t.path();
    let nic = dev_dir(r, NIC);
    let gpu = dev_dir(r, GPU);
    std::fs::write(nic.join("modalias"), b"\xff\xfe\x00garbage\n").unwrap();
    std::fs::write(nic.join("vendor"), b"\xff\xfe not hex\n").unwrap();
    std::fs::write(nic.join("device"), "0x123456789abcdef01\n").unwrap();
    std::fs::write(nic.join("class"), "\n").unwrap();
    std::fs::write(nic.join("numa_node"), "99999999999999999999\n").unwrap();
    std::fs::write(nic.join("resource"), "0xzz 0x1 0x2\nnot a line\n\n").unwrap();
    std::fs::write(gpu.join("driver_override"), b"\xff\xff\xff\n").unwrap();
    std::fs::write(gpu.join("current_link_speed"), vec![b'9'; 100_000]).unwrap();
    let err = read_commands_survive(r);
    assert!(err.contains("0000:03:00.0: vendor holds"), "{err}");
    assert!(err.contains("0000:03:00.0: numa_node holds"), "{err}");
    let (_, out, _) = gp(r, &["show", NIC, "--json"], &[]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["device"]["address"], NIC);
}

#[test]
fn unreadable_and_missing_entries_degrade() {
    let t = scratch_host("workstation");
    let r = t.path();
    let nic = dev_dir(r, NIC);
    // Directories where files belong (EISDIR), a dangling link, missing attributes.
    for a in ["modalias", "class", "resource"] {
        replace(&nic.join(a), |p| std::fs::create_dir(p).unwrap());
    }
    replace(&nic.join("numa_node"), |p| {
        symlink("/nonexistent/numa", p).unwrap()
    });
    for a in ["vendor", "device"] {
        let _ = std::fs::remove_file(nic.join(a));
    }
    // The IOMMU groups directory itself is a file.
    let groups = r.join("sys/kernel/iommu_groups");
    std::fs::remove_dir_all(&groups).unwrap();
    std::fs::write(&groups, "").unwrap();
    let err = read_commands_survive(r);
    assert!(err.contains("0000:03:00.0: cannot read modalias"), "{err}");
    assert!(err.contains("0000:03:00.0: vendor is missing"), "{err}");
}

#[test]
fn a_group_that_changes_between_plan_and_apply_is_not_half_bound() {
    let t = scratch_host("workstation");
    let r = t.path();
    let before = drivers(r);
    // A new member hot-plugged into group 1 after the plan was made.
    let hotplug = "ln -s ../../../../devices/pci0000:00/0000:00:01.0/0000:01:00.2 \
                   sys/kernel/iommu_groups/1/devices/0000:01:00.2";
    let (code, out, err) = gp(r, &["bind", GPU], &[("GPUPASS_FAKE_BEFORE_APPLY", hotplug)]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("IOMMU group 1 changed after the plan was made (new member 0000:01:00.2)"),
        "{err}"
    );
    assert_eq!(drivers(r), before, "nothing may be bound");
    let journal = std::fs::read_to_string(r.join("run/gpupass/journal.jsonl")).unwrap_or_default();
    assert!(
        !journal.contains("\"begin\""),
        "no transaction was started: {journal}"
    );

    // A member that another tool moved to a different driver in that window.
    let t = scratch_host("workstation");
    let r = t.path();
    let rebind = format!(
        "rm {d}/driver && ln -s ../../../../bus/pci/drivers/pci-stub {d}/driver",
        d = format!("sys/bus/pci/devices/{AUDIO}")
    );
    let (code, _, err) = gp(r, &["bind", GPU], &[("GPUPASS_FAKE_BEFORE_APPLY", &rebind)]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("0000:01:00.1 is now on pci-stub, the plan expected snd_hda_intel"),
        "{err}"
    );
    assert_eq!(drivers(r)[GPU].as_deref(), Some("nvidia"));

    // Without the change the same bind goes through.
    let t = scratch_host("workstation");
    let (code, _, err) = gp(t.path(), &["bind", GPU], &[]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn hostile_journal_and_lock_do_not_hang_or_panic() {
    let t = scratch_host("workstation");
    let r = t.path();
    let run = r.join("run/gpupass");
    std::fs::create_dir_all(&run).unwrap();
    // Garbage journal lines, a journal that is a FIFO.
    std::fs::write(run.join("journal.jsonl"), b"\xff\xfe{not json\n{\"v\":99}\n\n").unwrap();
    let (code, _, err) = gp(r, &["recover"], &[]);
    assert_eq!(code, Some(0), "{err}");
    replace(&run.join("journal.jsonl"), |p| {
        rustix::fs::mkfifoat(rustix::fs::CWD, p, 0o644.into()).unwrap()
    });
    let (code, _, err) = gp(r, &["bind", GPU], &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("journal /run/gpupass/journal.jsonl; check that the directory is writable (gpupass needs root to change drivers): not a regular file"),
        "{err}"
    );
    let (code, _, _) = gp(r, &["list"], &[]);
    assert_eq!(code, Some(0));
}
