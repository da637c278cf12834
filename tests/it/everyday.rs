//! Everyday-use features: logs (-v, --log-format json), completions, the man page, --color.

use crate::util::*;

#[test]
fn completions_for_each_shell() {
    for (sh, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef gpupass"),
        ("fish", "complete -c gpupass"),
    ] {
        let out = ok(&gpupass(&["completions", sh]));
        assert!(out.contains(marker), "{sh}: {}", &out[..out.len().min(200)]);
        // Subcommands and their options are in the script.
        for word in ["bind", "mdev", "snapshot"] {
            assert!(out.contains(word), "{sh} completion lacks {word}");
        }
    }
    let o = gpupass(&["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn man_page_documents_commands_and_exit_statuses() {
    let out = ok(&gpupass(&["man"]));
    assert!(
        out.starts_with(".ie") || out.contains(".TH gpupass 1"),
        "{}",
        &out[..200]
    );
    assert!(out.contains("EXIT STATUS"));
    assert!(out.contains("usage error"));
    for cmd in ["list", "bind", "unbind", "mdev", "boot", "events"] {
        assert!(out.contains(cmd), "man page lacks {cmd}");
    }
}

#[test]
fn quiet_by_default_and_every_sysfs_write_logged_with_vv() {
    let t = scratch_host("workstation");
    let root = t.path().to_str().unwrap();
    let run = |args: &[&str]| fake_kernel(args).output().unwrap();
    let o = run(&["--root", root, "bind", "01:00.0"]);
    ok(&o);
    assert!(
        !stderr(&o).contains("sysfs write"),
        "default is quiet: {}",
        stderr(&o)
    );
    let o = run(&["-vv", "--root", root, "unbind", "01:00.0"]);
    ok(&o);
    let err = stderr(&o);
    let writes: Vec<&str> = err.lines().filter(|l| l.contains("sysfs write")).collect();
    // Two functions: clear override, unbind, reprobe each.
    assert_eq!(writes.len(), 6, "{err}");
    assert!(
        writes
            .iter()
            .any(|l| l.contains("driver_override") && l.contains("value=\\n")),
        "{err}"
    );
    let o = run(&["-vv", "--log-format", "json", "--root", root, "bind", "01:00.0"]);
    ok(&o);
    let mut n = 0;
    for l in stderr(&o).lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value = serde_json::from_str(l).expect("JSON log line");
        if v["fields"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("sysfs write")
        {
            assert!(v["fields"]["path"].as_str().unwrap().contains("/sys/bus/pci/"));
            n += 1;
        }
    }
    assert_eq!(n, 6);
}

#[test]
fn color_choice() {
    let plain = ok(&on_host("workstation", &["--color", "never", "check"]));
    assert!(!plain.contains('\u{1b}'));
    let auto = ok(&on_host("workstation", &["check"]));
    assert!(!auto.contains('\u{1b}'), "stdout is not a terminal here");
    let col = ok(&on_host("workstation", &["--color", "always", "check"]));
    assert!(col.contains("\u{1b}[1;32mPASS\u{1b}[0m"));
}

#[test]
fn startup_reapplies_persistent_binds_and_is_idempotent() {
    let t = scratch_host("workstation");
    let root = t.path().to_str().unwrap();
    let dir = t.path().join("etc/driverctl.d");
    std::fs::create_dir_all(&dir).unwrap();
    for a in ["0000:01:00.0", "0000:01:00.1"] {
        std::fs::write(dir.join(format!("pci-{a}")), "vfio-pci\n").unwrap();
    }
    // A non-VFIO override is driverctl's business, not a bind.
    std::fs::write(dir.join("pci-0000:03:00.0"), "igc\n").unwrap();
    let run = |args: &[&str]| fake_kernel(args).output().unwrap();
    let out = ok(&run(&["--root", root, "startup"]));
    assert!(
        out.contains("persistent binds to vfio-pci: 0000:01:00.0 0000:01:00.1"),
        "{out}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&ok(&run(&["--root", root, "groups", "--json"]))).unwrap();
    let g1 = group_json(&v, 1);
    assert_eq!(g1["viable"], true, "{g1}");
    let again = ok(&run(&["--root", root, "startup"]));
    assert!(again.contains("persistent binds: nothing to do"), "{again}");
}

#[test]
fn startup_warns_about_override_files_it_cannot_use_and_binds_the_rest() {
    let t = scratch_host("workstation");
    let root = t.path().to_str().unwrap();
    let dir = t.path().join("etc/driverctl.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("pci-0000:01:00.0"), "vfio-pci\n").unwrap();
    std::fs::write(dir.join("pci-0000:01:00"), "vfio-pci\n").unwrap(); // no function number
    std::fs::write(dir.join("pci-0000:01:00.1"), "\n").unwrap(); // no driver
    std::fs::write(dir.join("README"), "notes\n").unwrap();
    std::fs::create_dir(dir.join("pci-0000:03:00.0")).unwrap(); // unreadable as a file
    std::fs::write(dir.join("usb-1-1"), "usbhid\n").unwrap(); // another bus: driverctl's business
    let o = fake_kernel(&["--root", root, "startup"]).output().unwrap();
    let out = ok(&o);
    let err = stderr(&o);
    assert!(
        out.contains("persistent binds to vfio-pci: 0000:01:00.0\n"),
        "{out}"
    );
    for line in [
        "warning: /etc/driverctl.d/pci-0000:01:00: skipped: the name does not end in a PCI address \
         (invalid PCI address \"0000:01:00\": the function number after '.' is missing;",
        "warning: /etc/driverctl.d/pci-0000:01:00.1: skipped: it is empty (it should hold the driver name",
        "warning: /etc/driverctl.d/README: skipped: not a driverctl override (driverctl names them \
         <bus>-<device>",
        "warning: /etc/driverctl.d/pci-0000:03:00.0: skipped: cannot read it: ",
    ] {
        assert!(err.contains(line), "stderr lacks {line:?}:\n{err}");
    }
    assert_eq!(err.matches("warning: /etc/driverctl.d/").count(), 4, "{err}");
    assert!(!err.contains("usb-1-1"), "{err}");
}

#[test]
fn install_script_places_unit_rule_man_and_completion() {
    let d = tempfile::tempdir().unwrap();
    let o = std::process::Command::new("bash")
        .arg(manifest_dir().join("contrib/install.sh"))
        .env("DESTDIR", d.path())
        .env("PREFIX", "/usr")
        .env("NO_BUILD", "1")
        .env("GPUPASS_BIN_PATH", env!("CARGO_BIN_EXE_gpupass"))
        .output()
        .unwrap();
    ok(&o);
    let unit = std::fs::read_to_string(d.path().join("etc/systemd/system/gpupass-startup.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/gpupass startup"), "{unit}");
    let rule = std::fs::read_to_string(d.path().join("etc/udev/rules.d/90-gpupass.rules")).unwrap();
    assert!(
        rule.contains("RUN+=\"/usr/bin/gpupass startup\"") && !rule.contains("@BINDIR@"),
        "{rule}"
    );
    assert!(d.path().join("usr/bin/gpupass").exists());
    let man = std::fs::read_to_string(d.path().join("usr/share/man/man1/gpupass.1")).unwrap();
    assert!(man.contains("EXIT STATUS"));
    assert!(d
        .path()
        .join("usr/share/bash-completion/completions/gpupass")
        .exists());
}
