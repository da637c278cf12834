//! Everyday-use features: logs (-v, --log-format json), completions, the man page, --color.

mod util;
use util::*;

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
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_gpupass"))
            .args(args)
            .env("GPUPASS_FAKE_KERNEL", "1")
            .env_remove("GPUPASS_ROOT")
            .output()
            .unwrap()
    };
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
