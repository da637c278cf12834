use super::*;

#[test]
fn a_create_plan_writes_create_then_attrs_in_order() {
    let p = plan(
        "mdev create",
        vec![Change::Create {
            uuid: "u".into(),
            parent: "mtty".into(),
            mdev_type: "mtty-2".into(),
            attrs: vec![("b".into(), "2".into()), ("a".into(), "1".into())],
        }],
    );
    assert_eq!(p.write_count(), 3);
    let r: Vec<String> = p.steps().map(Step::render).collect();
    assert_eq!(
        r,
        [
            "write \"u\" > /sys/class/mdev_bus/mtty/mdev_supported_types/mtty-2/create",
            "check /sys/bus/mdev/devices/u exists",
            "write \"2\" > /sys/bus/mdev/devices/u/b",
            "write \"1\" > /sys/bus/mdev/devices/u/a",
        ]
    );
    // The changes round-trip through the journal's JSON.
    let v = serde_json::to_value(&p.parts[0].objects).unwrap();
    let back: Vec<Change> = serde_json::from_value(v).unwrap();
    assert_eq!(back, p.parts[0].objects);
}

use crate::change::{journal, recover};
use crate::host::ops::HostOps;
use crate::mdev::{ops, types, MdevUuid, OpenNodes};
use crate::testkit::FakeHost;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The fake kernel, dying (a panic: the lock's file closes as it unwinds, as it does
/// when a process dies) right after its `crash_after`-th write: the in-process twin of
/// `GPUPASS_CRASH_AFTER_WRITE`.
struct Crashing {
    inner: FakeHost,
    n: AtomicUsize,
    crash_after: usize,
}

impl HostOps for Crashing {
    fn root(&self) -> &HostRoot {
        self.inner.root()
    }
    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        self.inner.write(path, value)?;
        if self.n.fetch_add(1, Ordering::SeqCst) + 1 == self.crash_after {
            panic!("crash after write {}", self.crash_after);
        }
        Ok(())
    }
    fn load_module(&self, name: &str) -> io::Result<()> {
        self.inner.load_module(name)
    }
    fn writes(&self) -> Vec<(PathBuf, String)> {
        self.inner.writes()
    }
}

/// Everything under the root but `run/` (the journal): the host's state.
fn state(root: &Path) -> Vec<(String, String)> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let mut es: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        es.sort_by_key(|e| e.path());
        for e in es {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            if rel == "run" {
                continue;
            }
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                out.push((rel, std::fs::read_link(&p).unwrap().display().to_string()));
            } else if ft.is_dir() {
                out.push((rel, "dir".into()));
                walk(base, &p, out);
            } else {
                out.push((rel, String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into()));
            }
        }
    }
    let mut v = Vec::new();
    walk(root, root, &mut v);
    v
}

fn scratch(name: &str) -> (tempfile::TempDir, HostRoot) {
    let t = tempfile::tempdir().unwrap();
    crate::testkit::fixtures::build(name, t.path()).unwrap();
    let h = HostRoot::new(t.path());
    (t, h)
}

/// For each write of `make`'s plan (the count from the plan): crash after it, check the
/// journal holds the plan open at that write, `recover`, and find the host as before.
fn crash_each_write(name: &str, make: impl Fn(&HostRoot) -> MdevPlan) -> usize {
    let (_t0, h0) = scratch(name);
    let writes = make(&h0).write_count();
    assert!(writes > 0);
    for n in 1..=writes {
        let (_t, h) = scratch(name);
        let p = make(&h);
        let before = state(h.root());
        assert_eq!(p.write_count(), writes);
        let host = Crashing {
            inner: FakeHost::new(h.clone()),
            n: AtomicUsize::new(0),
            crash_after: n,
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| execute(&host, &p)));
        assert!(r.is_err(), "write {n}: no crash");
        let replay = journal::read(&h).unwrap();
        assert_eq!(replay.open.len(), 1, "write {n}");
        assert_eq!(replay.open[0].at, n);
        assert_eq!(replay.open[0].writes, writes);
        assert_ne!(state(h.root()), before, "write {n} changed nothing");
        let fake = FakeHost::new(h.clone());
        let rec = recover(&fake, false, false).unwrap();
        assert!(
            rec.lines[0].starts_with("restoring the unfinished"),
            "{:?}",
            rec.lines
        );
        assert_eq!(
            state(h.root()),
            before,
            "{}: recover after write {n}",
            p.describe()
        );
        assert!(journal::read(&h).unwrap().open.is_empty());
        // Twice is harmless.
        assert_eq!(
            recover(&fake, false, false).unwrap().lines,
            ["nothing to recover: the journal has no unfinished plan"]
        );
    }
    writes
}

fn mdev_create(h: &HostRoot, parent: &str, ty: &str, uuids: &[&str], count: u32) -> MdevPlan {
    let inv = crate::inventory::scan(h).unwrap();
    let parents = types::parents(&inv);
    let p = types::resolve(&inv, &parents, parent).unwrap();
    let t = p.find_type(ty).unwrap();
    let u: Vec<MdevUuid> = uuids.iter().map(|u| u.parse().unwrap()).collect();
    ops::plan_create(h, "mdev create", &inv, &p, t, &u, count, &[])
        .unwrap()
        .0
}

#[test]
fn a_crash_after_each_write_of_a_create_is_recovered() {
    let uuids = [
        "0f0e0d0c-0b0a-4908-8706-050403020100",
        "0f0e0d0c-0b0a-4908-8706-050403020101",
        "0f0e0d0c-0b0a-4908-8706-050403020102",
    ];
    let n = crash_each_write("mdev-t4", |h| {
        mdev_create(h, "0000:3b:00.0", "nvidia-222", &uuids, 3)
    });
    assert_eq!(n, 3);
    // NVIDIA vendor-VFIO vGPU: two VFs take the type.
    let n = crash_each_write("sriov-vgpu", |h| mdev_create(h, "41:00.0", "1045", &[], 2));
    assert_eq!(n, 2);
}

#[test]
fn a_crash_after_the_write_of_a_remove_is_recovered() {
    let u = "0f0e0d0c-0b0a-4908-8706-050403020100";
    let setup = |h: &HostRoot| {
        if !h.mdev_devices().join(u).exists() {
            let p = mdev_create(h, "0000:3b:00.0", "nvidia-222", &[u], 1);
            execute(&FakeHost::new(h.clone()), &p).unwrap();
        }
        let inv = crate::inventory::scan(h).unwrap();
        let uuid: MdevUuid = u.parse().unwrap();
        ops::plan_remove_mdev(h, &inv, &OpenNodes::default(), &uuid, "mdev remove")
            .unwrap()
            .0
    };
    // The instance exists before the plan is made (setup makes it on each scratch copy).
    let n = crash_each_write("mdev-t4", setup);
    assert_eq!(n, 1);
}

#[test]
fn a_failed_write_rolls_back_and_closes_the_plan() {
    let (_t, h) = scratch("mdev-t4");
    let before = state(h.root());
    let p = mdev_create(&h, "0000:3b:00.0", "nvidia-222", &[], 3);
    let e = execute(&FakeHost::new(h.clone()).fail_at(2), &p).unwrap_err();
    assert!(e.to_string().contains("cannot write"), "{e}");
    assert_eq!(state(h.root()), before);
    let r = journal::read(&h).unwrap();
    assert!(r.open.is_empty());
}
