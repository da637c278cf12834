//! Unit tests of the change engine: one plan composed of parts (a group bind, a CDI spec file,
//! a metadata file replacing an older one), applied under one lock with an owner; a failure
//! at every write rolls the whole plan back; a crash after every write is recovered to the
//! state before (or, with `--continue`, after); an unfinished plan blocks plans that share an
//! object with it. The write counts come from the plan.

use super::*;
use crate::bind::{self, facts, BindRequest};
use crate::host::ops::HostOps;
use crate::testkit::hostgen::{DevSpec, HostBuilder};
use crate::testkit::FakeHost;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

const OWNER: &str = "claim-7f3a";
const SPEC: &str = "{\"cdiVersion\":\"0.5.0\",\"kind\":\"gpupass.dev/claim\"}\n";
const META: &str = "{\"group\":4}\n";
const OLD_META: &str = "{\"group\":null}\n";

/// A host like the lab's: a VGA function and its audio companion in IOMMU group 4, and an
/// older metadata file the plan replaces.
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
    let meta = root.path(&meta_path(&root));
    std::fs::create_dir_all(meta.parent().unwrap()).unwrap();
    std::fs::write(&meta, OLD_META).unwrap();
    (t, root)
}

fn spec_path(h: &HostRoot) -> String {
    logical(h, &h.cdi_dynamic_dir().join("claim-7f3a.json"))
}

fn meta_path(h: &HostRoot) -> String {
    logical(h, &h.gpupass_run_dir().join("claims").join("7f3a.json"))
}

/// A claim's prepare as the DRA plugin will make it: the group bind, then the claim's CDI
/// spec and its metadata, one plan with the claim as owner.
fn claim_plan(h: &HostRoot) -> Plan {
    let inv = crate::inventory::scan(h).unwrap();
    let f = facts::gather(h, &inv);
    let req = BindRequest {
        addresses: vec!["00:05.0".parse().unwrap()],
        ..Default::default()
    };
    let b = bind::plan_bind(&inv, &f, &req);
    assert!(b.refusals.is_empty(), "{:?}", b.refusals);
    let mut files = Part::new("dra", "claim 7f3a files");
    files
        .file(h, &spec_path(h), Some(SPEC.into()), false)
        .file(h, &meta_path(h), Some(META.into()), false);
    let mut plan = Plan::default().owned_by(OWNER);
    plan.push(b.to_part()).push(files);
    plan
}

/// The host's state the plan changes: each function's driver and override, and the files.
fn state(h: &HostRoot) -> Vec<(String, Option<String>)> {
    let mut v = Vec::new();
    for a in ["0000:00:05.0", "0000:00:05.1"] {
        let d = h.sys_bus_pci_devices().join(a);
        v.push((
            format!("{a} driver"),
            crate::host::link_name(&d.join("driver")).unwrap(),
        ));
        v.push((
            format!("{a} override"),
            crate::host::read_attr(&d.join("driver_override")).ok(),
        ));
    }
    for p in [spec_path(h), meta_path(h)] {
        v.push((p.clone(), read_file_now(h, &p)));
    }
    v
}

fn journal_text(h: &HostRoot) -> String {
    std::fs::read_to_string(journal::journal_path(h)).unwrap_or_default()
}

#[test]
fn a_composed_plan_prints_its_exact_steps_and_commits_as_one_transaction() {
    let (_t, h) = lab_like();
    let plan = claim_plan(&h);
    // The bind's six sysfs writes, then the two files: the count the failpoints take.
    assert_eq!(plan.write_count(), 8);
    assert_eq!(plan.domain(), "bind+dra");
    assert_eq!(plan.to_json()["writes"], 8);
    let text = plan.render();
    assert!(
        text.starts_with(&format!(
            "plan: bind of IOMMU group 4 + claim 7f3a files (for {OWNER}) (8 writes)\nsteps:\n"
        )),
        "{text}"
    );
    let lines: Vec<&str> = text.lines().skip(2).collect();
    assert_eq!(lines.len(), plan.steps().count());
    assert!(
        lines[0].ends_with("load module vfio_pci (modprobe vfio_pci)"),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .rev()
            .take(2)
            .all(|l| l.contains("write file /var/run/")),
        "{text}"
    );
    assert!(lines.contains(
        &format!(
            "  {:>2}. write file {} ({} bytes, atomically)",
            lines.len() - 1,
            spec_path(&h),
            SPEC.len()
        )
        .as_str()
    ));

    let ops = FakeHost::new(h.clone());
    let out = apply(&ops, &plan).unwrap();
    assert_eq!(out.verified_viable, [4]);
    let s = state(&h);
    assert_eq!(s[0].1.as_deref(), Some("vfio-pci"));
    assert_eq!(s[2].1.as_deref(), Some("vfio-pci"));
    assert_eq!(s[4].1.as_deref(), Some(SPEC));
    assert_eq!(s[5].1.as_deref(), Some(META));
    // One transaction: one `change` naming the owner, a `step` per write, one `commit`.
    let j = journal_text(&h);
    assert_eq!(j.matches("\"op\":\"change\"").count(), 1, "{j}");
    assert_eq!(j.matches(&format!("\"owner\":\"{OWNER}\"")).count(), 1, "{j}");
    assert_eq!(j.matches("\"domain\":\"bind+dra\"").count(), 1, "{j}");
    assert_eq!(j.matches("\"op\":\"step\"").count(), 8, "{j}");
    assert_eq!(j.matches("\"op\":\"commit\"").count(), 1, "{j}");
    // The bind part settles into the bound state (unbind gives the functions back).
    let r = journal::read(&h).unwrap();
    assert!(r.open.is_empty());
    assert_eq!(r.bound.len(), 2);
    // An empty plan changes and journals nothing.
    let before = journal_text(&h);
    apply(&ops, &Plan::default()).unwrap();
    assert_eq!(journal_text(&h), before);
}

#[test]
fn a_failure_at_every_write_rolls_the_whole_plan_back() {
    let writes = claim_plan(&lab_like().1).write_count();
    for k in 1..=writes {
        let (_t, h) = lab_like();
        let before = state(&h);
        let plan = claim_plan(&h);
        let e = apply(&FakeHost::new(h.clone()).fail_at(k), &plan).unwrap_err();
        let ChangeError::Failed(f) = &e else {
            panic!("write {k}: {e}")
        };
        assert!(f.rollback_ok(), "write {k}: {e}");
        assert!(e.to_string().contains("rolled back, nothing changed"), "{e}");
        assert!(e.to_string().contains("injected failure"), "{e}");
        assert_eq!(state(&h), before, "write {k}: not rolled back");
        let r = journal::read(&h).unwrap();
        assert!(r.open.is_empty() && r.bound.is_empty(), "write {k}");
        assert_eq!(journal_text(&h).matches("\"op\":\"rolled_back\"").count(), 1);
    }
}

/// The fake kernel, dying (a panic: the lock's file closes as it unwinds, as it does when a
/// process dies) right after its `crash_after`-th write of any kind: the in-process twin of
/// `GPUPASS_CRASH_AFTER_WRITE`.
struct Crashing {
    inner: FakeHost,
    n: AtomicUsize,
    crash_after: usize,
}

impl Crashing {
    fn counted(&self, r: io::Result<()>) -> io::Result<()> {
        r?;
        if self.n.fetch_add(1, Ordering::SeqCst) + 1 == self.crash_after {
            panic!("crash after write {}", self.crash_after);
        }
        Ok(())
    }
}

impl HostOps for Crashing {
    fn root(&self) -> &HostRoot {
        self.inner.root()
    }
    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        self.counted(self.inner.write(path, value))
    }
    fn write_file(&self, path: &Path, contents: &str) -> io::Result<()> {
        self.counted(self.inner.write_file(path, contents))
    }
    fn remove_file(&self, path: &Path, prune: super::Prune) -> io::Result<()> {
        self.counted(self.inner.remove_file(path, prune))
    }
    fn load_module(&self, name: &str) -> io::Result<()> {
        self.inner.load_module(name)
    }
    fn writes(&self) -> Vec<(std::path::PathBuf, String)> {
        self.inner.writes()
    }
}

/// Crash after write `n` of the claim plan on a fresh host; returns the host and its state
/// before.
fn crash_at(n: usize) -> (tempfile::TempDir, HostRoot, Vec<(String, Option<String>)>) {
    let (t, h) = lab_like();
    let before = state(&h);
    let plan = claim_plan(&h);
    let host = Crashing {
        inner: FakeHost::new(h.clone()),
        n: AtomicUsize::new(0),
        crash_after: n,
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| apply(&host, &plan)));
    assert!(r.is_err(), "write {n}: no crash");
    (t, h, before)
}

#[test]
fn a_crash_after_every_write_is_recovered_to_before_or_after() {
    let writes = claim_plan(&lab_like().1).write_count();
    let mut after = None;
    for n in 1..=writes {
        let (_t, h, before) = crash_at(n);
        let r = journal::read(&h).unwrap();
        assert_eq!(r.open.len(), 1, "write {n}");
        let t = &r.open[0];
        assert_eq!((t.at, t.writes), (n, writes));
        assert_eq!(t.owner.as_deref(), Some(OWNER));
        assert!(t.describe().contains(&format!("for {OWNER}")), "{}", t.describe());
        assert_ne!(state(&h), before, "write {n} changed nothing");
        // A dry run says what it would do and changes nothing.
        let fake = FakeHost::new(h.clone());
        let mid = state(&h);
        let dry = recover(&fake, false, true).unwrap();
        assert!(
            dry.lines[0].starts_with("restoring the unfinished"),
            "{:?}",
            dry.lines
        );
        assert!(
            dry.lines
                .iter()
                .any(|l| l.contains(&format!("would undo {}", meta_path(&h)))),
            "{:?}",
            dry.lines
        );
        assert_eq!(state(&h), mid);
        // recover: the whole plan goes back, files included; twice is harmless.
        let rec = recover(&fake, false, false).unwrap();
        assert!(rec.changed);
        assert_eq!(rec.functions.len(), 2);
        assert_eq!(state(&h), before, "recover after write {n}");
        assert!(journal::read(&h).unwrap().open.is_empty());
        assert_eq!(
            recover(&fake, false, false).unwrap().lines,
            ["nothing to recover: the journal has no unfinished plan"]
        );
        // recover --continue finishes it instead: the state of a plan that committed.
        let (_t2, h2, _) = crash_at(n);
        recover(&FakeHost::new(h2.clone()), true, false).unwrap();
        let done = state(&h2);
        assert_eq!(done[4].1.as_deref(), Some(SPEC));
        assert_eq!(done[5].1.as_deref(), Some(META));
        if let Some(a) = &after {
            assert_eq!(&done, a, "recover --continue after write {n}");
        }
        after = Some(done);
        let r = journal::read(&h2).unwrap();
        assert!(r.open.is_empty());
        assert_eq!(r.bound.len(), 2, "a completed bind is remembered");
    }
}

#[test]
fn an_unfinished_plan_blocks_plans_that_share_an_object() {
    let (_t, h, _) = crash_at(7);
    let fake = FakeHost::new(h.clone());
    let mut same = Part::new("dra", "another claim's metadata");
    same.file(&h, &meta_path(&h), Some("{}\n".into()), false);
    let e = apply(&fake, &Plan::of(same)).unwrap_err();
    let ChangeError::Unfinished { open, key } = &e else {
        panic!("{e}")
    };
    assert_eq!(open.owner.as_deref(), Some(OWNER));
    assert_eq!(key, &format!("file {}", meta_path(&h)));
    assert!(e.to_string().contains("gpupass recover"), "{e}");
    // A plan that touches nothing of it goes through.
    let other = logical(&h, &h.gpupass_run_dir().join("claims").join("other.json"));
    let mut part = Part::new("dra", "an unrelated claim");
    part.file(&h, &other, Some("{}\n".into()), false);
    apply(&fake, &Plan::of(part)).unwrap();
    assert_eq!(read_file_now(&h, &other).as_deref(), Some("{}\n"));
    // A file already as wanted adds no step.
    let mut again = Part::new("dra", "unchanged");
    again.file(&h, &other, Some("{}\n".into()), false);
    assert!(again.is_empty());
}

/// The DRA plugin's shape: the bind, then a part planned from the host as the bind left it
/// (here a file naming the driver 00:05.0 is on then), applied by
/// [`Session::apply_then`] as one transaction: one `change` and one `extend` record, one
/// commit; a crash after any of its writes is recovered to before; an error planning the
/// part rolls the bind back.
#[test]
fn a_part_planned_after_the_bind_is_one_transaction_with_it() {
    fn bind_only(h: &HostRoot) -> Plan {
        let mut p = claim_plan(h);
        p.parts.truncate(1);
        p
    }
    fn then(h: &HostRoot) -> Result<Part, Box<dyn std::error::Error + Send + Sync>> {
        let d = engine::current_driver(h, &"00:05.0".parse().unwrap()).unwrap_or_default();
        let mut files = Part::new("dra", "claim 7f3a files");
        files
            .file(h, &spec_path(h), Some(format!("{{\"driver\":\"{d}\"}}\n")), false)
            .file(h, &meta_path(h), Some(META.into()), false);
        Ok(files)
    }
    let (_t, h) = lab_like();
    let ops = FakeHost::new(h.clone());
    let mut s = Session::lock(&ops, journal::lock_timeout()).unwrap();
    s.apply_then(&bind_only(&h), &mut then).unwrap();
    drop(s);
    assert_eq!(
        read_file_now(&h, &spec_path(&h)).as_deref(),
        Some("{\"driver\":\"vfio-pci\"}\n"),
        "planned after the bind"
    );
    let j = journal_text(&h);
    for (op, n) in [("change", 1), ("extend", 1), ("step", 8), ("commit", 1)] {
        assert_eq!(j.matches(&format!("\"op\":\"{op}\"")).count(), n, "{op}: {j}");
    }
    assert_eq!(journal::read(&h).unwrap().bound.len(), 2);

    for n in 1..=8 {
        let (_t, h) = lab_like();
        let before = state(&h);
        let host = Crashing {
            inner: FakeHost::new(h.clone()),
            n: AtomicUsize::new(0),
            crash_after: n,
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut s = Session::lock(&host, journal::lock_timeout()).unwrap();
            s.apply_then(&bind_only(&h), &mut then)
        }));
        assert!(r.is_err(), "write {n}: no crash");
        let open = journal::read(&h).unwrap().open;
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].owner.as_deref(), Some(OWNER));
        assert_eq!(open[0].writes, if n <= 6 { 6 } else { 8 }, "write {n}");
        assert_eq!(
            open[0].domain,
            if n <= 6 { "bind" } else { "bind+dra" },
            "write {n}"
        );
        recover(&FakeHost::new(h.clone()), false, false).unwrap();
        assert_eq!(state(&h), before, "recover after write {n}");
    }

    let (_t, h) = lab_like();
    let before = state(&h);
    let ops = FakeHost::new(h.clone());
    let mut s = Session::lock(&ops, journal::lock_timeout()).unwrap();
    let mut fails = |_: &HostRoot| -> Result<Part, Box<dyn std::error::Error + Send + Sync>> {
        Err("the claim's backend cannot be served".into())
    };
    let e = s.apply_then(&bind_only(&h), &mut fails).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("planning the part after step"), "{text}");
    assert!(text.contains("the claim's backend cannot be served"), "{text}");
    assert!(text.contains("rolled back, nothing changed"), "{text}");
    assert_eq!(state(&h), before);
    assert!(s.replay().open.is_empty());
}

/// A removal's prune level reads from journals written before levels existed (`true`) and from
/// new ones (a number), and is left out at 0; each level removes one more emptied directory,
/// and a directory that is not empty ends it.
#[test]
fn prune_levels_read_old_journals_and_remove_only_emptied_directories() {
    let old: Step = serde_json::from_str(r#"{"kind":"remove_file","path":"/a/b","prune":true}"#).unwrap();
    let again = serde_json::to_value(&old).unwrap();
    let back: Step = serde_json::from_value(again.clone()).unwrap();
    assert_eq!(back, old);
    assert!(again.to_string().contains("\"prune\":1"), "{again}");
    match old {
        Step::RemoveFile { prune, .. } => assert_eq!(prune, Prune(1)),
        other => panic!("{other:?}"),
    }
    let none = serde_json::to_value(Step::RemoveFile {
        path: "/x".into(),
        prune: Prune(0),
    })
    .unwrap();
    assert!(!none.to_string().contains("prune"), "{none}");

    let t = tempfile::tempdir().unwrap();
    let ops = crate::host::ops::RealHost::new(HostRoot::new(t.path()));
    let claim = t.path().join("meta/ns_claim");
    std::fs::create_dir_all(claim.join("req1")).unwrap();
    std::fs::create_dir_all(claim.join("req2")).unwrap();
    std::fs::write(claim.join("req1/metadata.json"), "{}").unwrap();
    std::fs::write(claim.join("req2/metadata.json"), "{}").unwrap();
    ops.remove_file(&claim.join("req1/metadata.json"), Prune(2))
        .unwrap();
    // req1 went; the claim's directory still holds req2.
    assert!(!claim.join("req1").exists());
    assert!(claim.join("req2").exists());
    ops.remove_file(&claim.join("req2/metadata.json"), Prune(2))
        .unwrap();
    assert!(!claim.exists());
    assert!(t.path().join("meta").exists(), "never more than the level");
}

/// What a session knows of the journal after each of its plans (the lines it appended,
/// replayed on top of what it read under the lock) is what reading the journal gives; a
/// journal whose fold is empty is truncated, not rewritten; one with state keeps its `state`
/// record; a `step` of each write is still there for the messages of a crash.
#[test]
fn a_sessions_replay_is_the_journal_as_read_after_each_plan() {
    let (_t, h) = lab_like();
    let ops = FakeHost::new(h.clone());
    let same = |s: &Session<'_>, what: &str| {
        let r = journal::read(&h).unwrap();
        let m = s.replay();
        assert_eq!(m.bound, r.bound, "{what}");
        assert_eq!(m.held, r.held, "{what}");
        assert_eq!(m.open, r.open, "{what}");
        assert_eq!((m.records, m.bad_lines), (r.records, r.bad_lines), "{what}");
    };
    let file = |content: Option<&str>| {
        let mut p = Part::new("test", "a file");
        p.file(&h, &spec_path(&h), content.map(str::to_string), false);
        Plan::of(p)
    };
    let mut s = Session::lock(&ops, journal::lock_timeout()).unwrap();
    s.apply(&file(Some("one"))).unwrap();
    same(&s, "first plan");
    s.apply(&file(None)).unwrap();
    same(&s, "second plan");
    // Nothing bound, nothing held: the two finished plans fold into nothing.
    s.apply(&file(Some("two"))).unwrap();
    same(&s, "after the truncation");
    let j = journal_text(&h);
    assert_eq!(j.lines().count(), 3, "change, step, commit: {j}");
    assert!(!j.contains("\"op\":\"state\""), "{j}");
    assert!(j.contains("\"op\":\"step\""), "{j}");
    // A bind: state to keep from now on.
    s.apply(&claim_plan(&h)).unwrap();
    same(&s, "the bind");
    s.apply(&file(Some("three"))).unwrap();
    same(&s, "after the compaction");
    let j = journal_text(&h);
    assert!(j.starts_with("{\"v\":1,\"op\":\"state\""), "{j}");
    assert_eq!(s.replay().bound.len(), 2);
    drop(s);
    // A later process reads the same.
    let s2 = Session::lock(&ops, journal::lock_timeout()).unwrap();
    assert_eq!(s2.replay().bound.len(), 2);
    assert!(s2.replay().open.is_empty());
}
