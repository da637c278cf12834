//! The judges on outputs without a boot: the committed outputs of real lab runs
//! (tests/fixtures/lab/<scenario>, the files the judge reads, from `lab/lab.sh --kernel 6.1 run
//! bind mdev`) pass; copies altered the way a broken run would leave them (a file missing, a
//! driver wrong, an exit status changed) fail at the steps that read them, with messages that
//! say what is wrong; and lab.sh's report takes the judge's steps and verdict from judge.log.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{failures, judge_of, judges, Finding};

fn fixture(scenario: &str) -> PathBuf {
    crate::util::manifest_dir()
        .join("tests/fixtures/lab")
        .join(scenario)
}

/// A scratch copy of a committed output directory.
fn copy_of(scenario: &str) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture(scenario)).unwrap().flatten() {
        std::fs::copy(e.path(), t.path().join(e.file_name())).unwrap();
    }
    t
}

fn judge(scenario: &str, dir: &Path) -> Vec<Finding> {
    judge_of(scenario).expect("a judge").run(dir)
}

/// The steps that failed, and the failure lines.
fn failed(f: &[Finding]) -> (Vec<String>, String) {
    (
        f.iter().filter(|x| !x.pass).map(|x| x.step.clone()).collect(),
        failures(f).join("\n"),
    )
}

fn edit(dir: &Path, name: &str, from: &str, to: &str) {
    let p = dir.join(name);
    let text = std::fs::read_to_string(&p).unwrap();
    assert!(text.contains(from), "{name} has no {from:?}: {text}");
    std::fs::write(&p, text.replacen(from, to, 1)).unwrap();
}

/// Judges whose scenario has not had a passing lab run to commit outputs from yet (named here
/// so that this is said, not skipped silently): `clusterbind` (2026-12-06: no lab slot free
/// before the session's end; its flow is proved on the real control plane by
/// benches/bindcond.sh). Remove a name once tests/fixtures/lab/<scenario> is committed.
const NO_REAL_OUTPUT_YET: &[&str] = &["clusterbind"];

#[test]
fn real_outputs_pass() {
    for j in judges() {
        if NO_REAL_OUTPUT_YET.contains(&j.scenario) {
            assert!(
                !fixture(j.scenario).exists(),
                "{}: its real outputs are committed now: drop it from NO_REAL_OUTPUT_YET",
                j.scenario
            );
            continue;
        }
        let f = j.run(&fixture(j.scenario));
        let (bad, why) = failed(&f);
        assert!(bad.is_empty(), "{}: {why}", j.scenario);
        assert_eq!(f.len(), j.checks.len());
    }
}

#[test]
fn bind_a_missing_file_fails_its_steps_naming_it() {
    let t = copy_of("bind");
    std::fs::remove_file(t.path().join("bind.facts")).unwrap();
    let f = judge("bind", t.path());
    let (bad, why) = failed(&f);
    assert_eq!(bad, ["bind-drivers", "bind-node"], "{why}");
    assert!(
        why.contains("bind.facts is missing from") && why.contains("the guest did not ship it"),
        "{why}"
    );
}

#[test]
fn bind_a_wrong_driver_fails_naming_both() {
    let t = copy_of("bind");
    edit(
        t.path(),
        "bind.facts",
        "hda.driver=vfio-pci",
        "hda.driver=snd_hda_intel",
    );
    let (bad, why) = failed(&judge("bind", t.path()));
    assert_eq!(bad, ["bind-drivers"], "{why}");
    assert!(
        why.contains(
            r#"bind-drivers: after bind: drivers "vfio-pci snd_hda_intel", want "vfio-pci vfio-pci""#
        ),
        "{why}"
    );
    // A rollback that left the group half moved.
    let t = copy_of("bind");
    edit(
        t.path(),
        "rollback-4.facts",
        "vga.driver=bochs-drm",
        "vga.driver=vfio-pci",
    );
    let (bad, why) = failed(&judge("bind", t.path()));
    assert_eq!(bad, ["rollback-4"], "{why}");
    assert!(why.contains("vfio-pci snd_hda_intel / (null) (null)"), "{why}");
}

#[test]
fn bind_a_crash_that_did_not_crash_fails() {
    let t = copy_of("bind");
    std::fs::write(t.path().join("unbind-crash-2.rc"), "0\n").unwrap();
    let (bad, why) = failed(&judge("bind", t.path()));
    assert_eq!(bad, ["unbind-crash-2"], "{why}");
    assert!(why.contains("unbind-crash-2: rc=0 "), "{why}");
}

#[test]
fn bind_a_plan_with_another_write_count_fails() {
    let t = copy_of("bind");
    std::fs::write(t.path().join("dry-run.out"), "not json\n").unwrap();
    let (bad, why) = failed(&judge("bind", t.path()));
    assert_eq!(bad, ["dry-run", "bind-writes"], "{why}");
    assert!(why.contains("dry-run: stdout is not JSON"), "{why}");
}

#[test]
fn mdev_broken_outputs_fail() {
    // The exhausted create that succeeded.
    let t = copy_of("mdev");
    std::fs::write(t.path().join("exhausted.rc"), "0\n").unwrap();
    let (bad, why) = failed(&judge("mdev", t.path()));
    assert_eq!(bad, ["exhausted-error"], "{why}");
    assert!(why.contains("exhausted-error: rc=0 "), "{why}");
    // An instance whose node stayed after its removal.
    let t = copy_of("mdev");
    edit(t.path(), "remove-2.facts", "node=absent", "node=present");
    let (bad, why) = failed(&judge("mdev", t.path()));
    assert_eq!(bad, ["remove-each"], "{why}");
    assert!(why.contains("remove-2: /dev/vfio/"), "{why}");
    // mdevctl missing from the guest.
    let t = copy_of("mdev");
    std::fs::write(t.path().join("mdevctl.facts"), "present=no\n").unwrap();
    let (bad, why) = failed(&judge("mdev", t.path()));
    assert_eq!(bad, ["mdevctl-present"], "{why}");
    assert!(why.contains("the lab runner must copy /usr/bin/mdevctl"), "{why}");
}

/// A scenario is judged exactly when its script says `# lab-judge: rust`, and then it declares
/// no steps by hand: they are the judge's, each named once.
#[test]
fn judged_scenarios_say_so_and_declare_nothing() {
    let dir = crate::util::manifest_dir().join("lab/scenarios");
    let mut seen = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(s) = name.strip_suffix(".sh") else {
            continue;
        };
        let text = std::fs::read_to_string(e.path()).unwrap();
        let says = text.lines().any(|l| l.trim_end() == "# lab-judge: rust");
        assert_eq!(
            says,
            judge_of(s).is_some(),
            "{name}: `# lab-judge: rust` and tests/it/labjudge"
        );
        if says {
            assert!(
                !text.lines().any(|l| l.starts_with("# lab-steps")),
                "{name}: a judged scenario's steps are its judge's; drop its `# lab-steps:` lines"
            );
            seen.push(s.to_string());
        }
    }
    seen.sort();
    let mut all: Vec<String> = judges().iter().map(|j| j.scenario.to_string()).collect();
    all.sort();
    assert_eq!(seen, all);
    for j in judges() {
        let steps = j.steps();
        let mut uniq = steps.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), steps.len(), "{}: a step named twice", j.scenario);
        assert!(steps
            .iter()
            .all(|s| !s.contains(char::is_whitespace) && !s.is_empty()));
    }
}

/// lab.sh's report on a judged scenario: the steps are judge.log's `LAB-STEPS`, the results its
/// `LAB-RESULT` lines; a failing judge fails the verdict naming the step; a missing judge.log
/// fails it as "not judged"; a host step the judge names but the host check did not report is
/// missing.
#[test]
fn the_report_takes_steps_and_verdict_from_the_judge() {
    let report = |dir: &Path, host: &str| -> (i32, String) {
        std::fs::write(
            dir.join("guest.json"),
            r#"{"scenario":"bind","kernel":"6.1.0-57-amd64","done":true,"boot":[],"begun":true,"end_rc":0,"results":[],"files":[]}"#,
        )
        .unwrap();
        std::fs::write(dir.join("host-check.log"), host).unwrap();
        let out = dir.parent().unwrap();
        let o = Command::new("python3")
            .arg(crate::util::manifest_dir().join("lab/tools/labtool.py"))
            .args(["report", "--qemu-rc", "0", "--out"])
            .arg(out)
            .args(["--", "bind"])
            .output()
            .expect("python3 runs lab/tools/labtool.py (install python3)");
        let v = std::fs::read_to_string(dir.join("verdict")).unwrap_or_default();
        (o.status.code().unwrap_or(-1), v)
    };
    let j = judge_of("bind").unwrap();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("bind");
    std::fs::create_dir(&dir).unwrap();
    for e in std::fs::read_dir(fixture("bind")).unwrap().flatten() {
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let host_ok = "LAB-RESULT bind driverctl PASS d\n";
    // Not judged yet.
    let (code, v) = report(&dir, host_ok);
    assert_eq!(code, 1);
    assert!(v.contains("bind: not judged"), "{v}");
    // Judged, all pass.
    std::fs::write(dir.join("judge.log"), j.log(&j.run(&dir))).unwrap();
    let (code, v) = report(&dir, host_ok);
    assert_eq!((code, v.as_str()), (0, "PASS\n"));
    // The host step the judge names is required.
    let (code, v) = report(&dir, "");
    assert_eq!(code, 1);
    assert!(
        v.contains("bind/declared step host/driverctl was not reported"),
        "{v}"
    );
    // A failing judge.
    edit(&dir, "end.facts", "vga.driver=bochs-drm", "vga.driver=vfio-pci");
    std::fs::write(dir.join("judge.log"), j.log(&j.run(&dir))).unwrap();
    let (code, v) = report(&dir, host_ok);
    assert_eq!(code, 1);
    assert!(
        v.contains(r#"bind/end-drivers: after end: drivers "vfio-pci snd_hda_intel""#),
        "{v}"
    );
    // A judge.log that lost a step's result: the step is missing.
    let log: String = j
        .log(&j.run(&fixture("bind")))
        .lines()
        .filter(|l| !(l.starts_with("LAB-RESULT") && l.contains(" persist-lines ")))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(dir.join("judge.log"), log).unwrap();
    let (code, v) = report(&dir, host_ok);
    assert_eq!(code, 1);
    assert!(
        v.contains("bind/declared step persist-lines was not reported"),
        "{v}"
    );
}
