//! The one change engine from the command line: `persist`, `mdev define`/`undefine`, `cdi
//! generate --write` and the CDI refresh after an unbind are plans of file writes, journaled
//! like bind's and mdev's sysfs writes. For each: `--dry-run --json` gives the write count;
//! a crash after each write (`GPUPASS_CRASH_AFTER_WRITE=N`, the test kit's failpoints, which
//! count file writes as writes) leaves the plan open in the journal, the next command warns,
//! `gpupass recover` restores the host as it was, and `recover --continue` finishes the plan
//! (the host as a run without a crash leaves it).

use crate::util::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

fn fake_env(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = crate::util::fake_kernel(&[]);
    c.arg("--root").arg(root).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run gpupass")
}

fn fake(root: &Path, args: &[&str]) -> Output {
    fake_env(root, args, &[])
}

/// Every path under `root` with its content or link target, but `run/` (the journal and the
/// lock) and empty directories (a directory a file write made, such as `etc/driverctl.d`, is
/// not the file).
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

/// The writes `args` plans, from its `--dry-run --json` (`writes`, which must be the number
/// of write steps in the plan it prints).
fn plan_writes(root: &Path, args: &[&str]) -> usize {
    let mut a = args.to_vec();
    a.extend(["--dry-run", "--json"]);
    let o = fake(root, &a);
    let v = ok_json(&o);
    let steps: Vec<&serde_json::Value> = v["plan"]["parts"]
        .as_array()
        .unwrap_or_else(|| panic!("{args:?}: no plan in {v}"))
        .iter()
        .flat_map(|p| p["steps"].as_array().unwrap())
        .collect();
    let n = steps
        .iter()
        .filter(|s| ["write", "write_file", "remove_file"].contains(&s["kind"].as_str().unwrap()))
        .count();
    assert_eq!(v["writes"].as_u64(), Some(n as u64), "{v}");
    n
}

/// Run `args` on a copy of `base` with a crash after write `n`; returns the copy.
fn crashed(base: &Path, args: &[&str], n: usize) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    copy_tree(base, t.path());
    let o = fake_env(t.path(), args, &[("GPUPASS_CRASH_AFTER_WRITE", &n.to_string())]);
    assert!(
        o.status.code().is_none(),
        "{args:?} crash {n}: should die by SIGABRT, got {:?} {}",
        o.status,
        stderr(&o)
    );
    t
}

/// For each of the `writes` writes of `args`: crash after it, see the journal hold the plan
/// open and the next command warn, `recover` to the host before, `recover --continue` to the
/// host after a clean run.
fn crash_each_write(base: &Path, args: &[&str], writes: usize, what: &str) {
    assert!(writes > 0, "{args:?} plans no write");
    let before = digest(base);
    let done = {
        let t = tempfile::tempdir().unwrap();
        copy_tree(base, t.path());
        ok(&fake(t.path(), args));
        digest(t.path())
    };
    assert!(done != before, "{args:?} changed nothing");
    for n in 1..=writes {
        let t = crashed(base, args, n);
        let r = t.path();
        assert!(digest(r) != before, "crash {n}: no write was made");
        let l = fake(r, &["list"]);
        ok(&l);
        assert!(
            stderr(&l).contains(&format!("unfinished gpupass {what}"))
                && stderr(&l).contains(&format!("stopped at write {n} of {writes}"))
                && stderr(&l).contains("gpupass recover"),
            "{args:?} crash {n}: {}",
            stderr(&l)
        );
        let t2 = tempfile::tempdir().unwrap();
        copy_tree(r, t2.path());
        let d = digest(r);
        let out = ok(&fake(r, &["recover", "--dry-run"]));
        assert!(out.contains("restoring the unfinished"), "{out}");
        assert!(digest(r) == d, "recover --dry-run changed the host");
        let out = ok(&fake(r, &["recover"]));
        assert!(out.contains(&format!("restoring the unfinished {what}")), "{out}");
        assert!(
            digest(r) == before,
            "{args:?} crash after write {n}: recover did not restore:\n{out}"
        );
        assert!(ok(&fake(r, &["recover"])).contains("nothing to recover"));
        let out = ok(&fake(t2.path(), &["recover", "--continue"]));
        assert!(out.contains("completing the unfinished"), "{out}");
        assert!(
            digest(t2.path()) == done,
            "{args:?} crash {n}: recover --continue did not finish:\n{out}"
        );
    }
}

#[test]
fn persist_and_its_removal_are_journaled_and_recovered() {
    let t = scratch_host("workstation");
    let r = t.path();
    let args = ["persist", "01:00.0"];
    let writes = plan_writes(r, &args);
    // One driverctl file per function of the group (GPU and audio).
    assert_eq!(writes, 2);
    let out = ok(&fake(r, &["persist", "01:00.0", "--dry-run"]));
    assert!(
        out.contains("write file /etc/driverctl.d/pci-0000:01:00.0 (9 bytes, atomically)"),
        "{out}"
    );
    assert!(!r.join("etc/driverctl.d").exists(), "a dry run wrote");
    crash_each_write(r, &args, writes, "persist of 0000:01:00.0, 0000:01:00.1");
    // The removal, from a host where the files are there.
    ok(&fake(r, &args));
    assert_eq!(
        std::fs::read_to_string(r.join("etc/driverctl.d/pci-0000:01:00.0")).unwrap(),
        "vfio-pci\n"
    );
    let rm = ["persist", "--remove", "01:00.0"];
    let writes = plan_writes(r, &rm);
    assert_eq!(writes, 2);
    crash_each_write(r, &rm, writes, "persist --remove of");
    // Persisting again what is persisted writes nothing.
    assert_eq!(plan_writes(r, &args), 0);
}

#[test]
fn mdev_define_and_undefine_are_journaled_and_recovered() {
    let t = scratch_host("mdev-lab");
    let r = t.path();
    let u = "2f0e0d0c-0b0a-4908-8706-0504030201aa";
    let def = [
        "mdev", "define", "-p", "mtty", "-t", "mtty-2", "-u", u, "--attr", "b=2",
    ];
    let writes = plan_writes(r, &def);
    assert_eq!(writes, 1);
    let out = ok(&fake(r, &[&def[..], &["--dry-run"]].concat()));
    assert!(
        out.starts_with(&format!(
            "plan: mdev define of {u} (mtty-2 on mtty) (1 writes)\nsteps:\n   1. write file /etc/mdevctl.d/mtty/{u} ("
        )),
        "{out}"
    );
    crash_each_write(r, &def, writes, &format!("mdev define of {u}"));
    ok(&fake(r, &def));
    let undef = ["mdev", "undefine", u];
    let writes = plan_writes(r, &undef);
    assert_eq!(writes, 1);
    crash_each_write(r, &undef, writes, &format!("mdev undefine of {u}"));
    ok(&fake(r, &undef));
    assert!(!r.join("etc/mdevctl.d/mtty").join(u).exists());
}

#[test]
fn cdi_spec_writes_are_journaled_and_recovered() {
    let t = scratch_host("vfio-numa");
    let r = t.path();
    let args = ["cdi", "generate", "--write"];
    // The spec and the record of its options.
    let writes = plan_writes(r, &args);
    assert_eq!(writes, 2);
    crash_each_write(r, &args, writes, "cdi spec /var/run/cdi/gpupass.json");
    ok(&fake(r, &args));
    // Written again unchanged: no write.
    assert_eq!(plan_writes(r, &args), 0);
    // The refresh after an unbind is a plan of its own, after the unbind's: a crash after its
    // write (the one after the unbind's, whose count the unbind's dry run gives) leaves it
    // open and the next command says so; `recover` undoes it and, the host having changed
    // (the unbind is done), refreshes the spec again, as `recover --continue` finishes it:
    // either way the spec a clean unbind leaves.
    let unbind = ["unbind", "0000:31:00.0"];
    let o = fake(r, &[&unbind[..], &["--dry-run", "--json"]].concat());
    let v = ok_json(&o);
    let bind_writes = v["plan"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "write")
        .count();
    assert!(bind_writes > 0);
    let spec = "var/run/cdi/gpupass.json";
    let old = std::fs::read_to_string(r.join(spec)).unwrap();
    assert!(old.contains("\"0000:31:00.0\""));
    let clean = tempfile::tempdir().unwrap();
    copy_tree(r, clean.path());
    ok(&fake(clean.path(), &unbind));
    assert_ne!(driver(clean.path(), "0000:31:00.0").as_deref(), Some("vfio-pci"));
    let new = std::fs::read_to_string(clean.path().join(spec)).unwrap();
    assert!(!new.contains("\"0000:31:00.0\""));
    for cont in [false, true] {
        let t2 = crashed(r, &unbind, bind_writes + 1);
        let l = fake(t2.path(), &["list"]);
        assert!(
            stderr(&l).contains("unfinished gpupass cdi spec /var/run/cdi/gpupass.json")
                && stderr(&l).contains("stopped at write 1 of 1"),
            "{}",
            stderr(&l)
        );
        let args: &[&str] = if cont {
            &["recover", "--continue"]
        } else {
            &["recover"]
        };
        let out = ok(&fake(t2.path(), args));
        assert!(out.contains("the unfinished cdi spec"), "{out}");
        assert_eq!(
            driver(t2.path(), "0000:31:00.0"),
            driver(clean.path(), "0000:31:00.0"),
            "the unbind stays done"
        );
        assert!(
            std::fs::read_to_string(t2.path().join(spec)).unwrap() == new,
            "{args:?}: the spec is not the one a clean unbind leaves"
        );
        assert!(ok(&fake(t2.path(), &["recover"])).contains("nothing to recover"));
    }
}
