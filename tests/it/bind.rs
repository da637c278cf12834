//! `gpupass bind / unbind / recover / persist` run as the real binary against copies of the
//! fixture hosts with the fake kernel (`GPUPASS_FAKE_KERNEL=1`): plans (golden), refusals,
//! rollback at every write, recovery after a crash at every write, the lock, persistence
//! (read back by Debian's real `driverctl`).

use crate::util::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn cmd(root: &Path, args: &[&str]) -> Command {
    let mut c = fake_kernel(&["--root", root.to_str().expect("a UTF-8 root")]);
    c.args(args);
    c
}

fn run(root: &Path, args: &[&str]) -> Output {
    cmd(root, args).output().expect("run gpupass")
}

fn run_env(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = cmd(root, args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run gpupass")
}

fn fail(o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(1),
        "expected exit 1\nstdout:\n{}\nstderr:\n{}",
        stdout(o),
        stderr(o)
    );
    stderr(o)
}

/// Driver link and driver_override of every PCI function, and the VFIO nodes.
fn state(root: &Path) -> BTreeMap<String, (Option<String>, String)> {
    let mut m = BTreeMap::new();
    let devs = root.join("sys/bus/pci/devices");
    for e in std::fs::read_dir(&devs).unwrap() {
        let e = e.unwrap();
        let d = e.path();
        let drv = std::fs::read_link(d.join("driver"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
        let ov = std::fs::read_to_string(d.join("driver_override")).unwrap_or_default();
        m.insert(
            e.file_name().to_string_lossy().into_owned(),
            (drv, ov.trim().to_string()),
        );
    }
    for e in std::fs::read_dir(root.join("dev/vfio")).into_iter().flatten() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        m.insert(format!("/dev/vfio/{n}"), (None, String::new()));
    }
    m
}

fn journal(root: &Path) -> String {
    std::fs::read_to_string(root.join("run/gpupass/journal.jsonl")).unwrap_or_default()
}

const GPU: &str = "0000:01:00.0";
const AUDIO: &str = "0000:01:00.1";

#[test]
fn dry_run_plans_match_golden_and_change_nothing() {
    let t = scratch_host("workstation");
    let before = state(t.path());
    golden(
        "bind/workstation-bind-01:00.0.txt",
        &ok(&run(t.path(), &["bind", "01:00.0", "--dry-run"])),
    );
    golden(
        "bind/workstation-bind-01:00.0.json",
        &ok(&run(t.path(), &["bind", "01:00.0", "--dry-run", "--json"])),
    );
    golden(
        "bind/workstation-bind-only-01:00.0.txt",
        &ok(&run(t.path(), &["bind", "--only", "01:00.0", "--dry-run"])),
    );
    // A refused dry run prints the plan and the refusals, exits 1.
    let o = run(t.path(), &["bind", "00:02.0", "--dry-run"]);
    assert_eq!(o.status.code(), Some(1));
    golden("bind/workstation-bind-00:02.0-refused.txt", &stdout(&o));
    assert_eq!(state(t.path()), before);
    assert!(
        !t.path().join("run").exists(),
        "a dry run must not create the journal"
    );
}

#[test]
fn bind_then_unbind_round_trip() {
    let t = scratch_host("workstation");
    let r = t.path();
    let before = state(r);
    let out = ok(&run(r, &["bind", "01:00.0"]));
    assert!(out.contains("IOMMU group 1 is viable: /dev/vfio/1"), "{out}");
    assert_eq!(driver(r, GPU).as_deref(), Some("vfio-pci"));
    assert_eq!(driver(r, AUDIO).as_deref(), Some("vfio-pci"));
    assert_eq!(
        driver(r, "0000:00:01.0").as_deref(),
        Some("pcieport"),
        "bridge left alone"
    );
    assert!(r.join("dev/vfio/1").exists());
    let g: serde_json::Value = serde_json::from_str(&ok(&run(r, &["groups", "--json"]))).unwrap();
    let g1 = group_json(&g, 1);
    assert_eq!(g1["viable"], true, "{g1}");
    // Again: a no-op that says so.
    let again = ok(&run(r, &["bind", "01:00.1"]));
    assert!(again.contains("already on vfio-pci, nothing to do"), "{again}");
    let j = journal(r);
    assert_eq!(j.matches("\"op\":\"commit\"").count(), 1, "{j}");
    assert_eq!(j.matches("\"op\":\"step\"").count(), 6);
    // Every write was journaled before it was made: the steps' paths are the writes.
    assert!(j.contains("\"path\":\"/sys/bus/pci/drivers/nvidia/unbind\""));

    let out = ok(&run(r, &["unbind", "01:00.1"]));
    assert!(out.contains("0000:01:00.0: vfio-pci -> nvidia"), "{out}");
    assert!(out.contains("0000:01:00.1: vfio-pci -> snd_hda_intel"), "{out}");
    assert_eq!(state(r), before);
}

#[test]
fn refusals_exit_1_with_reason_and_way_out_and_change_nothing() {
    let t = scratch_host("workstation");
    let r = t.path();
    let before = state(r);
    for (addr, needles) in [
        (
            "00:02.0",
            &[
                "boot VGA",
                "framebuffer console",
                "/dev/dri/card1 is open by pid 1337 (Xorg)",
                "--force",
            ][..],
        ),
        (
            "02:00.0",
            &[
                "mounted filesystem / (ext4 on /dev/nvme0n1p2)",
                "unmount",
                "--force",
            ][..],
        ),
        ("03:00.0", &["enp3s0 is up", "ip link set enp3s0 down"][..]),
        ("00:01.0", &["is a PCI bridge", "device behind it"][..]),
        ("0000:42:00.0", &["no such PCI device", "gpupass list --all"][..]),
    ] {
        let e = fail(&run(r, &["bind", addr]));
        for n in needles {
            assert!(e.contains(n), "bind {addr}: missing {n:?} in:\n{e}");
        }
        assert_eq!(state(r), before, "bind {addr} changed the host");
    }
    // A bridge is refused even with --force; an up NIC is not.
    fail(&run(r, &["bind", "--force", "00:01.0"]));
    let o = run(r, &["bind", "--force", "03:00.0"]);
    ok(&o);
    assert!(stderr(&o).contains("--force: 0000:03:00.0: network interface enp3s0 is up"));
    assert_eq!(driver(r, "0000:03:00.0").as_deref(), Some("vfio-pci"));

    let t = scratch_host("legacy-bridge");
    let r = t.path();
    let before = state(r);
    let e = fail(&run(r, &["bind", "05:00.0"]));
    for n in ["also holds 0000:05:01.0 (e1000", "--only", "ACS", "boot VGA"] {
        assert!(e.contains(n), "missing {n:?}:\n{e}");
    }
    assert_eq!(state(r), before);
    // Usage errors: exit 2, nothing changed.
    for args in [
        &["bind", "zz:00.0"][..],
        &["bind", "05:00.0", "--driver", "../../x"],
        &["bind"],
    ] {
        let o = run(r, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
    assert_eq!(state(r), before);
}

#[test]
fn only_reports_viability_first_and_binds_just_that_function() {
    let t = scratch_host("workstation");
    let r = t.path();
    let o = run(r, &["bind", "--only", "01:00.0"]);
    let out = ok(&o);
    let err = stderr(&o);
    assert!(
        err.contains("IOMMU group 1 will not be viable") && err.contains("0000:01:00.1 (snd_hda_intel"),
        "{err}"
    );
    assert!(
        out.contains("IOMMU group 1 is not viable: 0000:01:00.1 (snd_hda_intel)"),
        "{out}"
    );
    assert_eq!(driver(r, GPU).as_deref(), Some("vfio-pci"));
    assert_eq!(driver(r, AUDIO).as_deref(), Some("snd_hda_intel"));
    let g: serde_json::Value = serde_json::from_str(&ok(&run(r, &["groups", "--json"]))).unwrap();
    let g1 = group_json(&g, 1);
    assert_eq!(g1["viable"], false);
    assert_eq!(g1["blockers"][0]["address"], AUDIO);
}

/// The sysfs writes the plan of `gpupass VERB ADDR` makes (`--dry-run --json`, steps of kind
/// `write`): "every write" comes from the plan, not from a number written here.
fn plan_writes(root: &Path, verb: &str, addr: &str) -> usize {
    let o = run(root, &[verb, "--dry-run", "--json", addr]);
    let v: serde_json::Value = serde_json::from_str(&ok(&o)).expect("plan JSON");
    let n = v["plan"]["steps"]
        .as_array()
        .map(|s| s.iter().filter(|s| s["kind"] == "write").count())
        .unwrap_or(0);
    assert!(n > 0, "no writes in the {verb} plan: {v}");
    n
}

#[test]
fn rollback_at_every_write_of_bind_and_unbind() {
    let t = scratch_host("workstation");
    let r = t.path();
    let before = state(r);
    let writes = plan_writes(r, "bind", "01:00.0");
    for n in 1..=writes {
        let o = run_env(r, &["bind", "01:00.0"], &[("GPUPASS_FAIL_WRITE", &n.to_string())]);
        let e = fail(&o);
        assert!(
            e.contains("injected failure") && e.contains("rolled back"),
            "write {n}: {e}"
        );
        assert_eq!(state(r), before, "write {n}: not rolled back");
        // The journal keeps the last transaction (earlier ones are folded into its `state`
        // record when the next one starts): this one, rolled back.
        let j = journal(r);
        assert_eq!(j.matches("\"op\":\"rolled_back\"").count(), 1, "write {n}: {j}");
        assert_eq!(j.matches("\"op\":\"change\"").count(), 1, "write {n}: {j}");
    }
    ok(&run(r, &["bind", "01:00.0"]));
    let bound = state(r);
    for n in 1..=plan_writes(r, "unbind", "01:00.0") {
        let o = run_env(
            r,
            &["unbind", "01:00.0"],
            &[("GPUPASS_FAIL_WRITE", &n.to_string())],
        );
        let e = fail(&o);
        assert!(e.contains("rolled back"), "unbind write {n}: {e}");
        assert_eq!(state(r), bound, "unbind write {n}");
    }
    ok(&run(r, &["unbind", "01:00.0"]));
    assert_eq!(state(r), before);
}

#[test]
fn crash_after_every_write_then_recover_restores() {
    let base = scratch_host("workstation");
    let before = state(base.path());
    let writes = plan_writes(base.path(), "bind", "01:00.0");
    for n in 1..=writes {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        copy_tree(base.path(), r);
        let o = run_env(
            r,
            &["bind", "01:00.0"],
            &[("GPUPASS_CRASH_AFTER_WRITE", &n.to_string())],
        );
        assert!(
            o.status.code().is_none(),
            "crash {n}: should die by SIGABRT, got {:?}",
            o.status
        );
        // Any later command notices the unfinished plan...
        let l = run(r, &["list"]);
        ok(&l);
        assert!(
            stderr(&l).contains("unfinished gpupass bind of IOMMU group 1")
                && stderr(&l).contains("gpupass recover"),
            "crash {n}: {}",
            stderr(&l)
        );
        // ...a bind of the same group refuses to build on it...
        let e = fail(&run(r, &["bind", "01:00.1"]));
        assert!(
            e.contains("unfinished gpupass plan") && e.contains(&format!("stopped at write {n} of {writes}")),
            "{e}"
        );
        // ...and recover restores the drivers of before.
        let out = ok(&run(r, &["recover", "--dry-run"]));
        assert!(out.contains("would go to nvidia"), "{out}");
        let out = ok(&run(r, &["recover"]));
        assert!(out.contains("restoring the unfinished bind"), "{out}");
        assert_eq!(state(r), before, "crash after write {n}: recover did not restore");
        let l = run(r, &["list"]);
        assert!(!stderr(&l).contains("unfinished"), "{}", stderr(&l));
        assert!(ok(&run(r, &["recover"])).contains("nothing to recover"));
        // A recovered bind is not "bound by gpupass".
        assert!(ok(&run(r, &["unbind", "--all"])).contains("no function bound by gpupass"));
    }
    // --continue finishes the plan instead.
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    copy_tree(base.path(), r);
    let o = run_env(r, &["bind", "01:00.0"], &[("GPUPASS_CRASH_AFTER_WRITE", "3")]);
    assert!(o.status.code().is_none());
    ok(&run(r, &["recover", "--continue"]));
    assert_eq!(driver(r, GPU).as_deref(), Some("vfio-pci"));
    assert_eq!(driver(r, AUDIO).as_deref(), Some("vfio-pci"));
    // ...and then it counts as bound by gpupass: unbind --all restores it.
    ok(&run(r, &["unbind", "--all"]));
    assert_eq!(state(r), before);
    // A crash during unbind: recover puts the group back on VFIO (the state before).
    ok(&run(r, &["bind", "01:00.0"]));
    let bound = state(r);
    for n in 1..=plan_writes(r, "unbind", "01:00.0") {
        let o = run_env(
            r,
            &["unbind", "01:00.0"],
            &[("GPUPASS_CRASH_AFTER_WRITE", &n.to_string())],
        );
        assert!(o.status.code().is_none());
        ok(&run(r, &["recover"]));
        assert_eq!(state(r), bound, "unbind crash {n}");
    }
}

#[test]
fn verify_catches_a_probe_that_binds_nothing() {
    let t = scratch_host("workstation");
    let r = t.path();
    let before = state(r);
    std::fs::write(
        r.join("sys/bus/pci/devices").join(GPU).join(".fake_refuse_bind"),
        "vfio-pci\n",
    )
    .unwrap();
    let e = fail(&run(r, &["bind", "01:00.0"]));
    assert!(
        e.contains("driverless after drivers_probe, not vfio-pci") && e.contains("rolled back"),
        "{e}"
    );
    assert_eq!(state(r), before);
}

#[test]
fn unbind_without_journal_reprobes_and_reports() {
    let t = scratch_host("workstation");
    let r = t.path();
    // Bound to vfio-pci by someone else (no journal): the fake kernel knows the native driver.
    ok(&run(r, &["bind", "01:00.0"]));
    std::fs::remove_dir_all(r.join("run")).unwrap();
    let out = ok(&run(r, &["unbind", "01:00.0"]));
    assert!(out.contains("0000:01:00.0 was not bound by gpupass"), "{out}");
    assert!(out.contains("0000:01:00.0: reprobed, claimed by nvidia"), "{out}");
    assert!(
        out.contains("0000:01:00.1: reprobed, claimed by snd_hda_intel"),
        "{out}"
    );
    assert!(ok(&run(r, &["unbind", "01:00.0"])).contains("not on a VFIO driver"));
}

#[test]
fn the_lock_serializes_binds_of_one_group() {
    let t = scratch_host("workstation");
    let r = t.path();
    let before = state(r);
    // Held by someone else: a short wait reports the holder and changes nothing.
    let host = gpupass::host::HostRoot::new(r);
    let lock = gpupass::change::journal::lock(&host, std::time::Duration::ZERO).unwrap();
    let o = run_env(r, &["bind", "01:00.0"], &[("GPUPASS_LOCK_TIMEOUT", "0.3")]);
    let e = fail(&o);
    assert!(
        e.contains(&format!("another gpupass (pid {})", std::process::id())),
        "{e}"
    );
    assert_eq!(state(r), before);
    // A longer wait waits, then binds once the lock is free.
    let child = cmd(r, &["bind", "01:00.0"])
        .env("GPUPASS_LOCK_TIMEOUT", "20")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(state(r), before, "it must wait for the lock");
    drop(lock);
    let o = child.wait_with_output().unwrap();
    ok(&o);
    assert!(
        stderr(&o).contains("waiting for another gpupass"),
        "{}",
        stderr(&o)
    );
    assert_eq!(driver(r, GPU).as_deref(), Some("vfio-pci"));
    ok(&run(r, &["unbind", "01:00.0"]));

    // Real races: two binds of one group at once, several rounds. Both succeed (one binds,
    // the other waits and finds the group on vfio-pci); never a half-bound group.
    for round in 0..5 {
        let spawn = |a: &str| {
            cmd(r, &["bind", a])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (c1, c2) = (spawn("01:00.0"), spawn("01:00.1"));
        let (o1, o2) = (c1.wait_with_output().unwrap(), c2.wait_with_output().unwrap());
        let (s1, s2) = (ok(&o1), ok(&o2));
        assert!(
            s1.contains("nothing to do") || s2.contains("nothing to do"),
            "round {round}: one of them must find the work done:\n{s1}\n{s2}"
        );
        assert_eq!(driver(r, GPU).as_deref(), Some("vfio-pci"));
        assert_eq!(driver(r, AUDIO).as_deref(), Some("vfio-pci"));
        // Exactly one of them bound (the journal holds the latest transaction), and committed.
        let j = journal(r);
        assert_eq!(j.matches("\"op\":\"change\"").count(), 1, "round {round}: {j}");
        assert_eq!(j.matches("\"domain\":\"bind\"").count(), 1, "round {round}: {j}");
        assert_eq!(j.matches("\"op\":\"commit\"").count(), 1, "round {round}: {j}");
        assert!(!j.contains("rolled_back"), "round {round}: {j}");
        ok(&run(r, &["unbind", "01:00.0"]));
        assert_eq!(state(r), before);
    }
}

#[test]
fn variant_driver_from_modules_alias_is_picked() {
    let t = tempfile::tempdir().unwrap();
    let mut h = gpupass::testkit::hostgen::HostBuilder::new(t.path()).unwrap();
    h.kernel(
        "6.8.0-1-nvidia-64k",
        "iommu.passthrough=1",
        &["nvidia", "vfio", "vfio_pci"],
    )
    .unwrap();
    h.add(
        &gpupass::testkit::hostgen::DevSpec::new("0009:01:00.0", 0x10de, 0x2342, 0x030200)
            .group(9)
            .driver("nvidia"),
    )
    .unwrap();
    h.modules_alias(
        "6.8.0-1-nvidia-64k",
        &[
            ("pci:v000010DEd*sv*sd*bc03sc02i00*", "nvidia"),
            (
                "vfio_pci:v000010DEd00002342sv*sd*bc*sc*i*",
                "nvgrace_gpu_vfio_pci",
            ),
        ],
    )
    .unwrap();
    let r = t.path();
    let out = ok(&run(r, &["bind", "0009:01:00.0", "--dry-run"]));
    assert!(out.contains("load module nvgrace_gpu_vfio_pci"), "{out}");
    assert!(
        out.contains("write \"nvgrace_gpu_vfio_pci\" > /sys/bus/pci/devices/0009:01:00.0/driver_override"),
        "{out}"
    );
    assert!(out.contains("variant driver nvgrace_gpu_vfio_pci"), "{out}");
    let out = ok(&run(
        r,
        &["bind", "0009:01:00.0", "--driver", "vfio-pci", "--dry-run"],
    ));
    assert!(out.contains("write \"vfio-pci\" > "), "{out}");
    // And the fake kernel binds it for real (modprobe registers the variant's driver).
    ok(&run(r, &["bind", "0009:01:00.0"]));
    assert_eq!(driver(r, "0009:01:00.0").as_deref(), Some("nvgrace_gpu_vfio_pci"));
    ok(&run(r, &["unbind", "0009:01:00.0"]));
    assert_eq!(driver(r, "0009:01:00.0").as_deref(), Some("nvidia"));
}

#[test]
fn persist_writes_driverctl_files_and_prints_boot_config() {
    let t = scratch_host("workstation");
    let r = t.path();
    let out = ok(&run(r, &["persist", "01:00.0"]));
    golden("bind/workstation-persist-01:00.0.txt", &out);
    for a in [GPU, AUDIO] {
        let f = r.join(format!("etc/driverctl.d/pci-{a}"));
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "vfio-pci\n");
    }
    assert!(
        !r.join("etc/driverctl.d/pci-0000:00:01.0").exists(),
        "no file for the bridge"
    );
    // The inventory shows them.
    let v: serde_json::Value = serde_json::from_str(&ok(&run(r, &["show", "01:00.0", "--json"]))).unwrap();
    assert_eq!(v["device"]["persistent_driver"], "vfio-pci");
    let out = ok(&run(r, &["persist", "--remove", "01:00.0"]));
    assert!(out.contains("removed /etc/driverctl.d/pci-0000:01:00.0"), "{out}");
    assert!(!r.join("etc/driverctl.d/pci-0000:01:00.0").exists());
    assert!(!r.join("etc/driverctl.d/pci-0000:01:00.1").exists());
    // Refusals apply as for bind.
    let e = fail(&run(r, &["persist", "00:01.0"]));
    assert!(e.contains("is a PCI bridge"), "{e}");
}

/// The real consumer: Debian's `driverctl` reads the files gpupass writes. It only knows
/// `/etc/driverctl.d` and `/sys`, so it runs in a private mount namespace where both are bind
/// mounts of a scratch fake host (in domain 0042, which no real machine has): `load-override`
/// reads our file and writes its driver into the fake `driver_override`, and `list-overrides`
/// then lists it. Needs root, `unshare` and the driverctl package (.ci/run installs it).
#[test]
fn debian_driverctl_reads_persisted_overrides() {
    let driverctl = Path::new("/usr/sbin/driverctl");
    assert!(
        driverctl.exists(),
        "install driverctl (apt-get install driverctl) to run this test"
    );
    let t = tempfile::tempdir().unwrap();
    let mut h = gpupass::testkit::hostgen::HostBuilder::new(t.path()).unwrap();
    h.kernel(
        "6.1.0-27-amd64",
        "intel_iommu=on",
        &["vfio", "vfio_pci", "nvidia"],
    )
    .unwrap();
    h.add(
        &gpupass::testkit::hostgen::DevSpec::new("0042:01:00.0", 0x10de, 0x2684, 0x030000)
            .group(1)
            .driver("nvidia"),
    )
    .unwrap();
    h.add(
        &gpupass::testkit::hostgen::DevSpec::new("0042:01:00.1", 0x10de, 0x22ba, 0x040300)
            .group(1)
            .driver("snd_hda_intel"),
    )
    .unwrap();
    // driverctl checks /sys/module/<driver name> before it would modprobe.
    std::fs::create_dir_all(t.path().join("sys/module/vfio-pci")).unwrap();
    std::fs::write(t.path().join("sys/.gpupass-fake"), "").unwrap();
    let r = t.path();
    ok(&run(r, &["persist", "0042:01:00.0"]));
    let script = format!(
        "set -e; mount --bind {sys} /sys; mount --bind {etc} /etc/driverctl.d; \
         test -e /sys/.gpupass-fake; \
         for d in 0042:01:00.0 0042:01:00.1; do {dc} --noprobe --nosave load-override $d; done; \
         {dc} list-overrides",
        sys = r.join("sys").display(),
        etc = r.join("etc/driverctl.d").display(),
        dc = driverctl.display()
    );
    std::fs::create_dir_all("/etc/driverctl.d").ok();
    let o = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("unshare");
    let out = ok(&o);
    assert!(out.contains("0042:01:00.0"), "{out}");
    assert!(out.contains("0042:01:00.1"), "{out}");
    for a in ["0042:01:00.0", "0042:01:00.1"] {
        let ov =
            std::fs::read_to_string(r.join("sys/bus/pci/devices").join(a).join("driver_override")).unwrap();
        assert_eq!(ov.trim(), "vfio-pci", "driverctl applied {ov:?} to {a}");
    }
}
