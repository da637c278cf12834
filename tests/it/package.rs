//! The Debian package and the static release binary (`contrib/package.sh`): built, checked by
//! lintian, installed with the real dpkg into a throwaway root, used there, enabled with the
//! real `systemctl --root`, purged, and the root compared with its listing from before.
//!
//! The package is built as a user builds it (a release build, static, without the test kit),
//! so the first run of this test in a clean target dir pays one release build.

use crate::util::{host, manifest_dir, need_tool, ok, stdout};
use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every path under `root` with its kind (and a symlink's target), relative to `root`.
fn listing(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let t = e.file_type().unwrap();
            if t.is_symlink() {
                out.insert(format!("{rel} -> {}", std::fs::read_link(&p).unwrap().display()));
            } else if t.is_dir() {
                out.insert(format!("{rel}/"));
                walk(root, &p, out);
            } else {
                out.insert(rel);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

/// Whether an ELF file asks for a program interpreter (PT_INTERP): a dynamically linked one does.
fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(&elf[..5], b"\x7fELF\x02", "not a 64-bit ELF file");
    let u16at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16at(0x36), u16at(0x38));
    (0..phnum).any(|i| u32::from_le_bytes(elf[phoff + i * phentsize..][..4].try_into().unwrap()) == 3)
}

fn dpkg(root: &Path, log: &Path, args: &[&str]) -> std::process::Output {
    let mut c = Command::new("dpkg");
    c.arg(format!("--root={}", root.display()))
        .arg(format!("--log={}", log.display()))
        // The maintainer scripts run on this host with DPKG_ROOT set (they honour it), not
        // chrooted into a root that has no shell.
        .arg("--force-script-chrootless")
        .args(args);
    c.output().unwrap()
}

#[test]
fn the_package_installs_runs_and_purges_leaving_nothing() {
    if !["dpkg", "dpkg-deb", "lintian", "systemctl"]
        .iter()
        .all(|t| need_tool(t))
    {
        return;
    }
    // Build (a no-op when the release build and the package are current).
    let o = Command::new("bash")
        .arg(manifest_dir().join("contrib/package.sh"))
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    let out = ok(&o);
    let deb = manifest_dir().join(out.lines().last().expect("package.sh names the .deb"));
    assert!(deb.extension().is_some_and(|e| e == "deb"), "{out}");
    let pkgdir = deb.parent().unwrap();
    let sums = std::fs::read_to_string(pkgdir.join("SHA256SUMS")).unwrap();
    assert!(
        sums.contains(&deb.file_name().unwrap().to_string_lossy().to_string()),
        "{sums}"
    );
    let release = std::fs::read_dir(pkgdir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with("-x86_64-linux"))
        .expect("the static release binary beside the package");
    assert!(
        !has_interpreter(&std::fs::read(&release).unwrap()),
        "{} is not static",
        release.display()
    );

    // lintian, as Debian runs it: no error, no warning (the overrides say why they are there).
    let l = Command::new("lintian")
        .args(["--fail-on", "error,warning"])
        .arg(&deb)
        .output()
        .unwrap();
    let said = format!("{}{}", stdout(&l), String::from_utf8_lossy(&l.stderr));
    assert!(l.status.success(), "lintian: {said}");
    assert!(
        !said.lines().any(|x| x.starts_with("E:") || x.starts_with("W:")),
        "lintian: {said}"
    );

    // The throwaway root: an empty dpkg database, nothing else.
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    let admin = root.join("var/lib/dpkg");
    for d in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(admin.join(d)).unwrap();
    }
    std::fs::write(admin.join("status"), "").unwrap();
    // ...and systemd's unit directory, as on any systemd host (`systemctl enable` below links there).
    std::fs::create_dir_all(root.join("etc/systemd/system")).unwrap();
    let log = t.path().join("dpkg.log");
    let before = listing(&root);

    ok(&dpkg(&root, &log, &["--install", deb.to_str().unwrap()]));
    let st = Command::new("dpkg-query")
        .arg(format!("--root={}", root.display()))
        .args(["-W", "-f", "${Status} ${Version}", "gpupass"])
        .output()
        .unwrap();
    assert!(
        stdout(&st).starts_with("install ok installed 0."),
        "{}",
        stdout(&st)
    );

    // Used: the installed binary is the static one, and reads a host as the test build does.
    let bin = root.join("usr/bin/gpupass");
    let elf = std::fs::read(&bin).unwrap();
    assert!(!has_interpreter(&elf), "the packaged gpupass is not static");
    assert_eq!(
        elf,
        std::fs::read(&release).unwrap(),
        "the package holds the release binary"
    );
    let v = ok(&Command::new(&bin).arg("--version").output().unwrap());
    assert_eq!(v, format!("gpupass {}\n", env!("CARGO_PKG_VERSION")));
    let workstation = host("workstation");
    let args = ["--root", workstation.to_str().unwrap(), "list"];
    let listed = ok(&Command::new(&bin)
        .args(args)
        .env_remove("GPUPASS_ROOT")
        .output()
        .unwrap());
    let tested = ok(&Command::new(env!("CARGO_BIN_EXE_gpupass"))
        .args(args)
        .env_remove("GPUPASS_ROOT")
        .output()
        .unwrap());
    assert_eq!(
        listed, tested,
        "the packaged binary lists the workstation as the test build does"
    );
    assert!(listed.contains("0000:01:00.0"), "{listed}");

    // Where packages put the man page, completions, unit and rule.
    let mut man = String::new();
    let gz = std::fs::File::open(root.join("usr/share/man/man1/gpupass.1.gz")).unwrap();
    Command::new("gzip")
        .args(["-dc"])
        .stdin(gz)
        .output()
        .unwrap()
        .stdout
        .as_slice()
        .read_to_string(&mut man)
        .unwrap();
    assert!(
        man.contains(".TH gpupass 1") && man.contains("EXIT STATUS"),
        "{man:.300}"
    );
    for (path, marker) in [
        ("usr/share/bash-completion/completions/gpupass", "_gpupass()"),
        ("usr/share/zsh/vendor-completions/_gpupass", "#compdef gpupass"),
        (
            "usr/share/fish/vendor_completions.d/gpupass.fish",
            "complete -c gpupass",
        ),
        (
            "lib/systemd/system/gpupass-startup.service",
            "ExecStart=/usr/bin/gpupass startup",
        ),
        (
            "lib/udev/rules.d/90-gpupass.rules",
            "RUN+=\"/usr/bin/gpupass startup\"",
        ),
        ("usr/share/doc/gpupass/copyright", "License: Apache-2.0"),
    ] {
        let text = std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(text.contains(marker), "{path} lacks {marker:?}");
    }
    // Every file dpkg says it installed is there.
    let files = ok(&Command::new("dpkg-query")
        .arg(format!("--root={}", root.display()))
        .args(["-L", "gpupass"])
        .output()
        .unwrap());
    for f in files.lines().filter(|f| f.starts_with('/')) {
        assert!(root.join(&f[1..]).exists(), "dpkg lists {f}, not on disk");
    }

    // Enabled as an admin would (systemd's own tool, on the root), then purged: the postrm
    // removes the enablement link, dpkg everything else.
    let en = Command::new("systemctl")
        .arg(format!("--root={}", root.display()))
        .args(["enable", "gpupass-startup.service"])
        .output()
        .unwrap();
    assert!(
        en.status.success(),
        "systemctl enable: {}",
        String::from_utf8_lossy(&en.stderr)
    );
    let wants = root.join("etc/systemd/system/sysinit.target.wants/gpupass-startup.service");
    assert!(wants.symlink_metadata().is_ok(), "systemctl enable made no link");

    ok(&dpkg(&root, &log, &["--purge", "gpupass"]));
    let st = Command::new("dpkg-query")
        .arg(format!("--root={}", root.display()))
        .args(["-W", "gpupass"])
        .output()
        .unwrap();
    assert!(
        !st.status.success(),
        "gpupass still known to dpkg: {}",
        stdout(&st)
    );

    // Nothing left: outside dpkg's own database the root is as before; in the database no file
    // of the package's.
    let admin_rel = PathBuf::from("var/lib/dpkg");
    let after = listing(&root);
    let left: Vec<String> = after
        .difference(&before)
        .filter(|p| !Path::new(p.as_str()).starts_with(&admin_rel))
        .cloned()
        .collect();
    assert!(left.is_empty(), "left in the root after the purge: {left:?}");
    let gone: Vec<&String> = before.difference(&after).collect();
    assert!(gone.is_empty(), "removed from the root by the purge: {gone:?}");
    let info: Vec<String> = std::fs::read_dir(admin.join("info"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("gpupass."))
        .collect();
    assert!(info.is_empty(), "dpkg's info still holds {info:?}");
    let status = std::fs::read_to_string(admin.join("status")).unwrap();
    assert!(!status.contains("Package: gpupass"), "{status}");
}
