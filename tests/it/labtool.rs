//! The lab's verdict (lab/tools/labtool.py `report`, docs/lab.md "Declared steps") without a
//! boot: a scenario passes only when every step its `# lab-steps:` lines declare was reported,
//! so a step that silently stops being emitted fails it. Each case writes a scenario header and
//! the guest's parsed results (`guest.json`, as `labtool collect` leaves them) into a scratch
//! directory and runs the report on them. Needs `python3` (as the lab itself does).

use std::process::Command;

/// One scenario `s`: its script header, the steps the guest reported (name, status), the host
/// check's steps and the booted kernel. Returns (exit status, verdict file).
fn report(header: &str, guest: &[(&str, &str)], host: &[(&str, &str)], kernel: &str) -> (i32, String) {
    let t = tempfile::tempdir().unwrap();
    let scen = t.path().join("scenarios");
    let out = t.path().join("out");
    std::fs::create_dir_all(&scen).unwrap();
    std::fs::create_dir_all(out.join("s")).unwrap();
    std::fs::write(scen.join("s.sh"), format!("{header}lab_pass x y\n")).unwrap();
    let results: Vec<String> = guest
        .iter()
        .map(|(step, st)| format!(r#"{{"step":"{step}","status":"{st}","detail":"d"}}"#))
        .collect();
    std::fs::write(
        out.join("s/guest.json"),
        format!(
            r#"{{"scenario":"s","kernel":"{kernel}","done":true,"boot":[],"begun":true,"end_rc":0,"results":[{}],"files":[]}}"#,
            results.join(",")
        ),
    )
    .unwrap();
    let host_log: String = host
        .iter()
        .map(|(step, st)| format!("LAB-RESULT s {step} {st} d\n"))
        .collect();
    std::fs::write(out.join("s/host-check.log"), host_log).unwrap();
    let tool = crate::util::manifest_dir().join("lab/tools/labtool.py");
    let o = Command::new("python3")
        .arg(&tool)
        .args(["report", "--qemu-rc", "0", "--out"])
        .arg(&out)
        .arg("--scenarios-dir")
        .arg(&scen)
        .args(["--", "s"])
        .output()
        .expect("python3 runs lab/tools/labtool.py (install python3)");
    let verdict = std::fs::read_to_string(out.join("s/verdict")).unwrap_or_default();
    let code = o.status.code().unwrap_or(-1);
    assert!(
        code == 0 || code == 1,
        "labtool report exited {code}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    (code, verdict)
}

const K61: &str = "6.1.0-57-amd64";

#[test]
fn every_declared_step_reported_passes() {
    let (code, v) = report(
        "# lab-steps: a b\n# lab-steps: c\n",
        &[("a", "PASS"), ("b", "PASS"), ("c", "PASS")],
        &[],
        K61,
    );
    assert_eq!((code, v.as_str()), (0, "PASS\n"));
    // Steps nobody declared do not matter.
    let (code, _) = report("# lab-steps: a\n", &[("a", "PASS"), ("extra", "PASS")], &[], K61);
    assert_eq!(code, 0);
}

#[test]
fn a_declared_step_not_reported_fails_naming_it() {
    let (code, v) = report("# lab-steps: a b c\n", &[("a", "PASS"), ("c", "PASS")], &[], K61);
    assert_eq!(code, 1);
    assert!(v.starts_with("FAIL\n"), "{v}");
    assert!(v.contains("s/declared step b was not reported"), "{v}");
    assert!(!v.contains("step a ") && !v.contains("step c "), "{v}");
}

#[test]
fn a_scenario_that_declares_nothing_fails() {
    let (code, v) = report("# lab-about: x\n", &[("a", "PASS")], &[], K61);
    assert_eq!(code, 1);
    assert!(v.contains("declares no steps"), "{v}");
}

#[test]
fn globs_and_minimum_counts() {
    let three = [
        ("rollback-1", "PASS"),
        ("rollback-2", "PASS"),
        ("rollback-3", "PASS"),
    ];
    assert_eq!(report("# lab-steps: rollback-*>=3\n", &three, &[], K61).0, 0);
    assert_eq!(report("# lab-steps: rollback-*\n", &three[..1], &[], K61).0, 0);
    let (code, v) = report("# lab-steps: rollback-*>=3\n", &three[..2], &[], K61);
    assert_eq!(code, 1);
    assert!(
        v.contains("declared steps rollback-*>=3: 2 reported (rollback-1 rollback-2)"),
        "{v}"
    );
    let (code, v) = report("# lab-steps: crash-*\n", &three, &[], K61);
    assert_eq!(code, 1);
    assert!(v.contains("declared steps crash-*: none reported"), "{v}");
    // A repeated step name counts once.
    let twice = [("remove-x", "PASS"), ("remove-x", "PASS")];
    assert_eq!(report("# lab-steps: remove-*>=2\n", &twice, &[], K61).0, 1);
}

#[test]
fn host_check_steps_are_declared_with_host_prefix() {
    let h = "# lab-steps: a host/driverctl\n";
    assert_eq!(report(h, &[("a", "PASS")], &[("driverctl", "PASS")], K61).0, 0);
    // A guest step of that name is not the host's.
    let (code, v) = report(h, &[("a", "PASS"), ("driverctl", "PASS")], &[], K61);
    assert_eq!(code, 1);
    assert!(v.contains("declared step host/driverctl was not reported"), "{v}");
}

#[test]
fn leg_lines_apply_to_their_kernel_only() {
    let h = "# lab-steps: a\n# lab-steps-6.1: only61\n# lab-steps-6.12: only612\n";
    assert_eq!(report(h, &[("a", "PASS"), ("only61", "PASS")], &[], K61).0, 0);
    assert_eq!(
        report(h, &[("a", "PASS"), ("only612", "PASS")], &[], "6.12.117").0,
        0
    );
    let (code, v) = report(h, &[("a", "PASS"), ("only61", "PASS")], &[], "6.12.117");
    assert_eq!(code, 1);
    assert!(v.contains("declared step only612 was not reported"), "{v}");
}

#[test]
fn a_reported_failure_still_fails() {
    let (code, v) = report("# lab-steps: a\n", &[("a", "FAIL")], &[], K61);
    assert_eq!(code, 1);
    assert!(v.contains("s/a: d"), "{v}");
}

/// Every scenario in lab/scenarios declares its steps, and every word parses.
#[test]
fn every_lab_scenario_declares_its_steps() {
    let dir = crate::util::manifest_dir().join("lab/scenarios");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".sh").map(str::to_string))
        .collect();
    names.sort();
    assert!(names.len() >= 10, "{names:?}");
    let tool = crate::util::manifest_dir().join("lab/tools/labtool.py");
    for kernel in [K61, "6.12.117"] {
        let o = Command::new("python3")
            .arg(&tool)
            .args(["steps", "--kernel", kernel, "--"])
            .args(&names)
            .output()
            .expect("python3 runs lab/tools/labtool.py (install python3)");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8_lossy(&o.stdout);
        for line in text.lines() {
            assert!(
                !line.ends_with("(none declared)"),
                "{line}: add `# lab-steps:` (docs/lab.md)"
            );
        }
        assert_eq!(text.lines().count(), names.len(), "{text}");
    }
}

/// `labtool monitor` (lab.sh's snapshot of a boot that runs out of time, docs/lab.md
/// "Troubleshooting"): against a stand-in for QEMU's human monitor on a unix socket (a banner
/// and `(qemu) ` prompt, each command echoed with the terminal's escapes before its reply, as
/// QEMU 10.0 does), each command's reply comes back under its own `== COMMAND` header, without
/// the echo or the prompts; a socket nobody listens on is a message and exit status 1.
#[test]
fn monitor_snapshot_reads_each_reply() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    let t = tempfile::tempdir().unwrap();
    let sock = t.path().join("monitor.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut w = s.try_clone().unwrap();
        w.write_all(b"QEMU 10.0.2 monitor - type 'help' for more information\r\n(qemu) ")
            .unwrap();
        let mut seen = Vec::new();
        for line in BufReader::new(s).lines() {
            let cmd = line.unwrap();
            let reply = match cmd.as_str() {
                "info registers" => "EIP=0000b7ee EFL=00000246 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=1\r\n",
                "info lapic" => "Timer\t DCR=0x0 (divide by 2) initial_count = 0 current_count = 0\r\n",
                _ => "unknown command\r\n",
            };
            w.write_all(format!("{cmd}\r\n\x1b[K{reply}(qemu) ").as_bytes())
                .unwrap();
            seen.push(cmd);
        }
        seen
    });
    let tool = crate::util::manifest_dir().join("lab/tools/labtool.py");
    let o = Command::new("python3")
        .arg(&tool)
        .args(["monitor", "--socket"])
        .arg(&sock)
        .args(["--", "info registers", "info lapic"])
        .output()
        .expect("python3 runs lab/tools/labtool.py (install python3)");
    let out = String::from_utf8_lossy(&o.stdout).replace('\r', "");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(server.join().unwrap(), ["info registers", "info lapic"]);
    let regs = out.split("== info lapic").next().unwrap();
    assert!(regs.starts_with("== info registers\n"), "{out}");
    assert!(regs.contains("SMM=0 HLT=1") && !regs.contains("(qemu)"), "{out}");
    assert!(
        out.contains("== info lapic\n") && out.contains("initial_count = 0"),
        "{out}"
    );
    assert!(
        !out.contains("QEMU 10.0.2 monitor"),
        "the banner is not a reply: {out}"
    );
    // Nobody listening: said so, exit 1.
    let o = Command::new("python3")
        .arg(&tool)
        .args(["monitor", "--socket"])
        .arg(t.path().join("none.sock"))
        .args(["--", "info registers"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("cannot connect"));
}
