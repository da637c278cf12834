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

#[test]
fn real_outputs_pass() {
    for j in judges() {
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

/// clustervm's judge on an output directory built here (the real run's files are
/// tests/fixtures/lab/clustervm, judged by `real_outputs_pass`), whose Pod logs carry the lines
/// `gpupass boot --device 0000:00:03.0` printed in a real 6.12 lab boot (the `boot` scenario's
/// vfio.txt and vfio.txt.stderr), so each altered copy fails at exactly its steps.
fn clustervm_output(dir: &Path) {
    let w = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    let cmd = |name: &str, out: &str| {
        w(&format!("{name}.out"), out);
        w(&format!("{name}.err"), "");
        w(&format!("{name}.rc"), "0\n");
    };
    w(
        "start.facts",
        "kernel=6.12.60-lab\nvga.driver=bochs-drm\nvga.group=2\ndev.kvm=char\n",
    );
    w("plugin.facts", "registered=1\nseconds=6.2\nlast=...\n");
    cmd(
        "classes",
        "deviceclass.resource.k8s.io/vfio.gpupass.dev unchanged\ndeviceclass.resource.k8s.io/vm.vfio.gpupass.dev created\n",
    );
    for (b, policy, nodes, devnodes) in [
        (
            "legacy",
            "legacy",
            "/dev/vfio/vfio + /dev/vfio/2",
            "DEVNODE /dev/vfio/2\nDEVNODE /dev/vfio/vfio\n",
        ),
        (
            "iommufd",
            "require-iommufd",
            "/dev/iommu + /dev/vfio/devices/vfio0",
            "DEVNODE /dev/iommu\nDEVNODE /dev/vfio/devices/vfio0\n",
        ),
    ] {
        cmd(
            &format!("{b}-claim"),
            &format!(
                r#"{{"metadata":{{"name":"vm-{b}-vfio-x7k2p"}},"status":{{"allocation":{{"devices":{{
                "results":[{{"request":"vfio","driver":"vfio.gpupass.dev","pool":"lab","device":"pci-0000-00-03-0"}}],
                "config":[{{"source":"FromClass","opaque":{{"driver":"vfio.gpupass.dev","parameters":{{"apiVersion":"gpupass.dev/v1alpha1","kind":"VfioConfig","kvm":true}}}}}},
                          {{"source":"FromClaim","requests":["vfio"],"opaque":{{"driver":"vfio.gpupass.dev","parameters":{{"apiVersion":"gpupass.dev/v1alpha1","kind":"VfioConfig","backendPolicy":"{policy}"}}}}}}]}}}}}}}}"#
            ),
        );
        cmd(
            &format!("{b}-pod"),
            r#"{"spec":{"containers":[{"name":"vm","securityContext":{"privileged":false,"allowPrivilegeEscalation":false}}]},
               "status":{"phase":"Succeeded","containerStatuses":[{"state":{"terminated":{"exitCode":0,"reason":"Completed"}}}]}}"#,
        );
        cmd(
            &format!("{b}-log"),
            &format!(
                "DEVNODE /dev/full\nDEVNODE /dev/kvm\nDEVNODE /dev/null\n{devnodes}DRIVER vfio-pci\nCDEV vfio0\n\
                 gpupass: --dra-metadata: default/vm-{b}-vfio-x7k2p request vfio: vfio.gpupass.dev/pci-0000-00-03-0 (pciBusID 0000:00:03.0) from /var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/vfio/vfio/vfio.gpupass.dev-metadata.json; backend {b} by the claim's gpupass.dev/backend\n\
                 FW hello v4 ram 0x400000 mmio 0xc0000000-0xfebfffff mmio64 0x100000000-0xffffffffff phys-bits 40\n\
                 FW dev 00:00.0 1b36:0008 class 060000 hdr 00\n\
                 FW dev 00:01.0 1234:1111 class 038000 hdr 00\n\
                 FW bar 0 mem32 pref addr 0xc0000000 size 0x1000000 first 0x0 last 0x0\n\
                 FW bar 2 mem32 addr 0xc1000000 size 0x1000 first 0xffffff00 last 0xffffffff\n\
                 FW dispi 00:01.0 0xb0c5\n\
                 FW done devices 2\n\
                 gpupass: 0000:00:03.0: firmware exited with status 0 after 28.29 ms (setup 208.01 ms)\n\
                 gpupass: VFIO backend {b}: {nodes}\n"
            ),
        );
        cmd(
            &format!("{b}-events"),
            "Scheduled: ...\nStarted: Started container vm\n",
        );
        cmd(&format!("{b}-delete"), &format!("pod \"vm-{b}\" deleted\n"));
        w(&format!("{b}-ran.facts"), "seconds=41.3\nhost.driver=vfio-pci\n");
        w(
            &format!("{b}-after.facts"),
            "seconds=9.8\nvga.driver=bochs-drm\nclaim.gone=yes\n",
        );
    }
    w("end.facts", "checkpoint.uids=0\nvga.driver=bochs-drm\n");
    cmd(
        "recover",
        "gpupass: nothing to recover: the journal has no unfinished change\n",
    );
    w("plugin-stop.facts", "stopped=yes\nseconds=1.0\n");
    w(
        "frame.facts",
        "cgroup=v2\nup=yes\nteardown=PASS every component stopped in 3 s\n",
    );
}

#[test]
fn clustervm_judge_on_a_built_output() {
    let t = tempfile::tempdir().unwrap();
    clustervm_output(t.path());
    let (bad, why) = failed(&judge("clustervm", t.path()));
    assert!(bad.is_empty(), "{why}");
    // iommufd that fell back to the group: the backend and the nodes are wrong.
    let t = tempfile::tempdir().unwrap();
    clustervm_output(t.path());
    edit(
        t.path(),
        "iommufd-log.out",
        "gpupass: VFIO backend iommufd: /dev/iommu + /dev/vfio/devices/vfio0",
        "gpupass: VFIO backend legacy: /dev/vfio/vfio + /dev/vfio/2",
    );
    let (bad, why) = failed(&judge("clustervm", t.path()));
    assert_eq!(bad, ["iommufd-vfio-backend"], "{why}");
    // A container given another group's node too; a dispi that is not Bochs's; a group left
    // on vfio-pci; a plugin that never registered.
    let t = tempfile::tempdir().unwrap();
    clustervm_output(t.path());
    edit(
        t.path(),
        "legacy-log.out",
        "DEVNODE /dev/vfio/vfio\n",
        "DEVNODE /dev/vfio/vfio\nDEVNODE /dev/vfio/4\n",
    );
    edit(
        t.path(),
        "iommufd-log.out",
        "FW dispi 00:01.0 0xb0c5",
        "FW dispi 00:01.0 0xffff",
    );
    edit(
        t.path(),
        "legacy-after.facts",
        "vga.driver=bochs-drm",
        "vga.driver=vfio-pci",
    );
    edit(t.path(), "plugin.facts", "registered=1", "registered=0");
    let (bad, why) = failed(&judge("clustervm", t.path()));
    assert_eq!(
        bad,
        [
            "plugin-registered",
            "legacy-only-its-nodes",
            "legacy-group-restored",
            "iommufd-vm-dispi"
        ],
        "{why}"
    );
    assert!(why.contains("/dev/vfio/4"), "{why}");
    // The Pod's log missing: every step that reads it says so.
    let t = tempfile::tempdir().unwrap();
    clustervm_output(t.path());
    std::fs::remove_file(t.path().join("legacy-log.out")).unwrap();
    let (bad, why) = failed(&judge("clustervm", t.path()));
    assert_eq!(
        bad,
        [
            "legacy-metadata-read",
            "legacy-vm-ids",
            "legacy-vm-dispi",
            "legacy-vfio-backend",
            "legacy-only-its-nodes"
        ],
        "{why}"
    );
}
