use super::*;

fn fp(addr: &str, before: Option<&str>, after: Option<&str>) -> FuncPlan {
    FuncPlan {
        address: addr.parse().unwrap(),
        group: Some(1),
        before: DriverState {
            driver: before.map(str::to_string),
            module: None,
            driver_override: None,
        },
        after: DriverState {
            driver: after.map(str::to_string),
            module: None,
            driver_override: after.map(str::to_string),
        },
    }
}

fn line(rec: Record) -> String {
    serde_json::to_string(&Line { v: 1, rec }).unwrap()
}

#[test]
fn replay_tracks_bound_and_open() {
    let b = |txn: &str, action: Action, f: Vec<FuncPlan>| change(txn, action, f, 6);
    let text = [
        line(b(
            "a",
            Action::Bind,
            vec![fp("01:00.0", Some("nvidia"), Some("vfio-pci"))],
        )),
        line(Record::Commit { txn: "a".into() }),
        line(b(
            "b",
            Action::Bind,
            vec![fp("02:00.0", Some("igc"), Some("vfio-pci"))],
        )),
        line(Record::RolledBack {
            txn: "b".into(),
            error: "x".into(),
        }),
        line(b(
            "c",
            Action::Bind,
            vec![fp("03:00.0", Some("nvme"), Some("vfio-pci"))],
        )),
        line(Record::Step {
            txn: "c".into(),
            n: 2,
            path: "/sys/x".into(),
            value: "y".into(),
        }),
        "{\"v\":1,\"op\":\"comm".to_string(),
    ]
    .join("\n");
    let r = replay(&text);
    assert_eq!(r.bad_lines, 1);
    assert_eq!(r.bound.len(), 1);
    let a: PciAddress = "01:00.0".parse().unwrap();
    assert_eq!(r.bound[&a].driver.as_deref(), Some("nvidia"));
    assert_eq!(r.open.len(), 1);
    assert_eq!(r.open[0].txn, "c");
    assert_eq!(r.open[0].at, 2);
    // An unbind commit forgets the function.
    let text2 = format!(
        "{text}\n{}\n{}\n",
        line(b(
            "d",
            Action::Unbind,
            vec![fp("01:00.0", Some("vfio-pci"), Some("nvidia"))]
        )),
        line(Record::Commit { txn: "d".into() })
    );
    assert!(replay(&text2).bound.is_empty());
    // The bind-only header of older versions is still read: open, then settled.
    let old = Record::Begin {
        txn: "e".into(),
        time: 0,
        pid: 1,
        action: Action::Bind,
        groups: vec![4],
        functions: vec![fp("04:00.0", Some("igc"), Some("vfio-pci"))],
        writes: 3,
    };
    let r = replay(&line(old.clone()));
    assert_eq!(r.open.len(), 1);
    assert_eq!(r.open[0].what, "bind of IOMMU group 4");
    assert_eq!(r.open[0].keys(), ["pci:0000:04:00.0", "group:1"]);
    let r = replay(&format!(
        "{}\n{}",
        line(old),
        line(Record::Commit { txn: "e".into() })
    ));
    assert!(r.open.is_empty());
    assert_eq!(r.bound.len(), 1);
}

fn change(txn: &str, action: Action, f: Vec<FuncPlan>, writes: usize) -> Record {
    let objects: Vec<Object> = f.iter().map(|x| Object::function(action, x)).collect();
    Record::Change {
        txn: txn.into(),
        time: 0,
        pid: 1,
        domain: action.to_string(),
        what: format!("{action} of IOMMU group 1"),
        owner: None,
        changes: serde_json::to_value(objects).unwrap(),
        writes,
        holds: None,
        releases: false,
    }
}

fn owned(txn: &str, owner: &str, holds: Option<Holds>, releases: bool) -> Record {
    Record::Change {
        txn: txn.into(),
        time: 0,
        pid: 1,
        domain: "dra".into(),
        what: "files".into(),
        owner: Some(owner.into()),
        changes: serde_json::json!([]),
        writes: 0,
        holds,
        releases,
    }
}

fn holds(label: &str, alone: &[&str], shared: &[&str]) -> Option<Holds> {
    Some(Holds {
        label: label.into(),
        alone: alone.iter().map(|s| s.to_string()).collect(),
        shared: shared.iter().map(|s| s.to_string()).collect(),
    })
}

/// One owner per group: a committed plan's holds are replayed (a rolled-back one's are
/// not), a second owner is refused what another holds alone, sharers of an mdev parent
/// keep each other company, a release gives everything back, and compaction keeps what
/// is held.
#[test]
fn holds_are_replayed_released_and_compacted() {
    let c = |t: &str| line(Record::Commit { txn: t.into() });
    let text = [
        line(owned(
            "a",
            "dra-claim:A",
            holds("claim ns/a (A)", &["0000:00:05.0", "0000:00:05.1"], &[]),
            false,
        )),
        c("a"),
        line(owned(
            "b",
            "dra-claim:B",
            holds("claim ns/b (B)", &["0000:00:06.0"], &[]),
            false,
        )),
        line(Record::RolledBack {
            txn: "b".into(),
            error: "x".into(),
        }),
        line(owned(
            "m1",
            "dra-claim:M1",
            holds("claim ns/m1 (M1)", &[], &["mtty"]),
            false,
        )),
        c("m1"),
        line(owned(
            "m2",
            "dra-claim:M2",
            holds("claim ns/m2 (M2)", &[], &["mtty"]),
            false,
        )),
        c("m2"),
    ]
    .join("\n");
    let r = replay(&text);
    let keys: Vec<&String> = r.held.keys().collect();
    assert_eq!(keys, ["0000:00:05.0", "0000:00:05.1", "mtty"], "{:?}", r.held);
    assert_eq!(r.held["mtty"].len(), 2);
    // Another claim on the group is refused, naming the holder; the holder itself is not.
    let k = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let against = r.holders_against(Some("dra-claim:C"), &k(&["0000:00:05.1"]), &[]);
    assert_eq!(against.len(), 1);
    assert_eq!(against[0].1.label, "claim ns/a (A)");
    assert!(r
        .holders_against(Some("dra-claim:A"), &k(&["0000:00:05.0"]), &[])
        .is_empty());
    // The host CLI (no owner) is refused too.
    assert_eq!(r.holders_against(None, &k(&["0000:00:05.0"]), &[]).len(), 1);
    // A third vGPU shares the parent; a whole-device claim on it is refused by both.
    assert!(r
        .holders_against(Some("dra-claim:M3"), &[], &k(&["mtty"]))
        .is_empty());
    assert_eq!(
        r.holders_against(Some("dra-claim:W"), &k(&["mtty"]), &[]).len(),
        2
    );
    // A release gives back all of A's keys.
    let text2 = format!(
        "{text}\n{}\n{}",
        line(owned("u", "dra-claim:A", None, true)),
        c("u")
    );
    let r2 = replay(&text2);
    assert!(!r2.held.contains_key("0000:00:05.0"), "{:?}", r2.held);
    assert_eq!(r2.held["mtty"].len(), 2);
    // Compaction keeps the holders.
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("journal.jsonl");
    compact(&p, &r.bound, &r.held).unwrap();
    let back = replay(&std::fs::read_to_string(&p).unwrap());
    assert_eq!(back.held, r.held);
}

#[test]
fn lock_excludes_and_compaction_keeps_state() {
    let t = tempfile::tempdir().unwrap();
    let host = HostRoot::new(t.path());
    // The lock refuses a root without sysfs (a wrong --root gets nothing created under it).
    assert!(matches!(
        lock(&host, Duration::from_millis(0)),
        Err(ChangeError::Inventory(_))
    ));
    assert!(!host.run_gpupass().exists());
    std::fs::create_dir_all(host.sys_bus_pci_devices()).unwrap();
    let l = lock(&host, Duration::from_millis(0)).unwrap();
    assert_eq!(lock_holder(&host), Some(std::process::id().to_string()));
    // A second open file description cannot take it.
    let e = lock(&host, Duration::from_millis(30)).unwrap_err();
    assert!(e.to_string().contains("another gpupass"), "{e}");
    let mut j = Journal::open(&host, &l, &Replay::default()).unwrap();
    j.append(change(
        "t",
        Action::Bind,
        vec![fp("01:00.0", Some("nvidia"), Some("vfio-pci"))],
        3,
    ))
    .unwrap();
    j.append(Record::Commit { txn: "t".into() }).unwrap();
    let r = read(&host).unwrap();
    compact(&journal_path(&host), &r.bound, &r.held).unwrap();
    let r2 = read(&host).unwrap();
    assert_eq!(r.bound, r2.bound);
    assert_eq!(r2.bound.len(), 1);
    drop(l);
    assert!(lock(&host, Duration::from_millis(0)).is_ok());
}

/// Read the whole lock file.
fn lock_holder(host: &HostRoot) -> Option<String> {
    use std::io::Read;
    let mut s = String::new();
    File::open(lock_path(host)).ok()?.read_to_string(&mut s).ok()?;
    Some(s.trim().to_string())
}
