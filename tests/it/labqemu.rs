//! The lab's QEMU (lab/tools/qemu.sh, lab/tools/aptfetch.sh) whatever QEMU the host has: none,
//! Debian 12's own 7.2, or bookworm-backports' 10.0 (issue 26).
//!
//! - `apt-get install -s` output, captured on a real Debian 12 machine in each of the three
//!   states (tests/fixtures/apt/*.sim), read by aptfetch's parser: for an upgrade apt prints
//!   `Inst PKG [INSTALLED] (NEW SUITE [ARCH])`, and the version to fetch is NEW, never the
//!   bracketed installed one (which no suite carries: the fetch failed with "Version
//!   '[1:7.2+dfsg-7+deb12u18+b2]' for 'qemu-system-x86' was not found").
//! - The cached QEMU, probed the way libvirt probes an emulator (qom-list-types loads every
//!   module) with Debian 7.2's modules in QEMU's compiled-in module directory: a private mount
//!   namespace lays them over `/usr/lib/x86_64-linux-gnu` (an overlay, nothing on the host
//!   changes). QEMU 10.0 looks there when a module is not in `QEMU_MODULE_DIR` and aborts on
//!   another build's module; the lab's tree holds every module of its build, so it never does.

use std::path::Path;
use std::process::Command;

use crate::util::manifest_dir;

fn parse(sim: &str) -> (bool, Vec<String>) {
    let (ok, out, _) = parse_file(&manifest_dir().join("tests/fixtures/apt").join(sim));
    (ok, out.lines().map(str::to_owned).collect())
}

/// aptfetch's parser over the file `f`: (success, stdout, stderr).
fn parse_file(f: &Path) -> (bool, String, String) {
    let o = Command::new("bash")
        .arg(manifest_dir().join("lab/tools/aptfetch.sh"))
        .args(["-", "-", "parse-inst"])
        .stdin(std::fs::File::open(f).unwrap())
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

const V10: &str = "1:10.0.2+ds-2+deb13u1~bpo12+1";

#[test]
fn aptfetch_fetches_the_new_version_on_a_host_without_qemu() {
    let (ok, l) = parse("none.sim");
    assert!(ok);
    assert_eq!(l.len(), 24, "{l:?}");
    assert!(l.contains(&format!("qemu-system-x86={V10}")), "{l:?}");
    assert!(l.contains(&"seabios=1.16.3-2~bpo12+1".to_string()), "{l:?}");
    assert!(l.iter().all(|p| !p.contains('[') && !p.contains('(')), "{l:?}");
}

#[test]
fn aptfetch_fetches_the_new_version_not_the_installed_one_over_debian_7_2() {
    let sim = std::fs::read_to_string(manifest_dir().join("tests/fixtures/apt/debian-7.2.sim")).unwrap();
    // The capture is of the case that failed: upgrades, with the installed version in brackets.
    assert!(sim.contains("Inst qemu-system-x86 [1:7.2+dfsg-7+deb12u18+b3] (1:10.0.2"));
    let (ok, l) = parse("debian-7.2.sim");
    assert!(ok);
    assert_eq!(l.len(), 13, "{l:?}");
    for p in [
        "qemu-system-x86",
        "qemu-system-common",
        "qemu-system-data",
        "qemu-system-gui",
    ] {
        assert!(l.contains(&format!("{p}={V10}")), "{p} at 10.0 in {l:?}");
    }
    assert!(l.iter().all(|p| !p.contains("7.2") && !p.contains('[')), "{l:?}");
}

#[test]
fn aptfetch_plans_nothing_over_backports_10_0_and_names_the_packages_itself() {
    let (ok, l) = parse("backports-10.0.sim");
    assert!(ok);
    assert!(l.is_empty(), "{l:?}");
    // With nothing to install, qemu.sh still names every package of the build: `plan` adds a
    // named package apt would not install, and qemu.sh names them all (BUILD_PACKAGES).
    let sh = std::fs::read_to_string(manifest_dir().join("lab/tools/qemu.sh")).unwrap();
    assert!(sh.contains("BUILD_PACKAGES=(qemu-system-x86 qemu-system-common qemu-system-data)"));
    let af = std::fs::read_to_string(manifest_dir().join("lab/tools/aptfetch.sh")).unwrap();
    assert!(af.contains("A named package is fetched even when installed"));
}

#[test]
fn aptfetch_refuses_a_line_without_a_version() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("bad.sim");
    std::fs::write(&f, "Inst qemu-system-x86 [1:7.2]\n").unwrap();
    let (ok, _, err) = parse_file(&f);
    assert!(!ok);
    assert!(
        err.contains("cannot read the version in: Inst qemu-system-x86"),
        "{err}"
    );
}

fn lab_cache() -> String {
    std::env::var("GPUPASS_LAB_CACHE").unwrap_or_else(|_| {
        format!(
            "{}/.cache/gpupass-lab",
            std::env::var("HOME").unwrap_or_else(|_| "/root".into())
        )
    })
}

/// libvirt's probe of the lab's QEMU with Debian 7.2's modules where QEMU 10.0 would look last.
#[test]
fn the_lab_qemu_never_loads_another_builds_modules() {
    let cache = lab_cache();
    let o = Command::new("bash")
        .arg(manifest_dir().join("lab/tools/qemu.sh"))
        .args(["prepare", &cache])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let qemu = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    // Debian 12's 7.2 modules (the packages that carry them), unpacked into a scratch directory.
    let t = tempfile::tempdir().unwrap();
    let debs = t.path().join("debs");
    // The suite alone (no backports in the private sources): the candidates are Debian 12's 7.2.
    let pk = ["qemu-system-common", "qemu-system-gui", "qemu-block-extra"];
    let o = Command::new("bash")
        .arg(manifest_dir().join("lab/tools/aptfetch.sh"))
        // A state of its own: the lab's (bookworm-backports) keeps its lists.
        .arg(Path::new(&cache).join("apt-bookworm"))
        .args(["bookworm", "download"])
        .arg(&debs)
        .args(pk)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let x = t.path().join("x");
    for d in std::fs::read_dir(&debs).unwrap() {
        let st = Command::new("dpkg")
            .arg("-x")
            .arg(d.unwrap().path())
            .arg(&x)
            .status()
            .unwrap();
        assert!(st.success());
    }
    let low = t.path().join("low");
    std::fs::create_dir_all(&low).unwrap();
    std::fs::rename(x.join("usr/lib/x86_64-linux-gnu/qemu"), low.join("qemu")).unwrap();
    let n = std::fs::read_dir(low.join("qemu")).unwrap().count();
    assert!(n >= 30, "Debian 7.2's packages carry {n} modules");
    let names: Vec<String> = std::fs::read_dir(&debs)
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|d| d.contains("_1%3a7.2")), "{names:?}");
    let probe = "printf '%s\\n' '{\"execute\":\"qmp_capabilities\"}' '{\"execute\":\"qom-list-types\"}' '{\"execute\":\"quit\"}'";
    let script = format!(
        "mount -t overlay overlay -o lowerdir={}:/usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu \
         && ls /usr/lib/x86_64-linux-gnu/qemu/ui-gtk.so >/dev/null && {probe} | \
         timeout 60 {qemu} -M none -nodefaults -display none -qmp stdio",
        low.display()
    );
    let o = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && out.contains("\"name\": \"vfio-pci\""),
        "the lab's QEMU failed libvirt's probe beside Debian 7.2's modules (exit {:?}):\n{err}\n{}",
        o.status.code(),
        out.lines()
            .filter(|l| !l.starts_with("{\"return"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(!err.contains("Only modules from the same build"), "{err}");
    assert!(!err.contains("Assertion"), "{err}");
}

/// aptfetch.sh against the real archive, in the lab cache's bookworm state: (success, stderr).
fn aptfetch_bookworm(args: &[&str]) -> (bool, String) {
    aptfetch_bookworm_over(None, args)
}

/// The same, with `status` as the dpkg status aptfetch reads (APTFETCH_STATUS).
fn aptfetch_bookworm_over(status: Option<&Path>, args: &[&str]) -> (bool, String) {
    let cache = lab_cache();
    let mut c = Command::new("bash");
    c.arg(manifest_dir().join("lab/tools/aptfetch.sh"))
        .arg(Path::new(&cache).join("apt-bookworm"))
        .arg("bookworm")
        .args(args);
    if let Some(s) = status {
        c.env("APTFETCH_STATUS", s);
    }
    let o = c.output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A download that really fails (a version no suite carries) names the package and version,
/// and fails: it is never an empty "nothing to fetch".
#[test]
fn aptfetch_names_the_package_when_a_download_really_fails() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("debs");
    let dest = dest.to_str().unwrap();
    let (ok, err) = aptfetch_bookworm(&["download", dest, "qemu-system-x86=9:9.9.9-no-such-version"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("aptfetch: could not download qemu-system-x86=9:9.9.9-no-such-version"),
        "{err}"
    );
    // A download that names a real package beside the bad one still names only the bad one.
    let (ok, err) = aptfetch_bookworm(&[
        "download",
        dest,
        "seabios",
        "qemu-system-data=9:9.9.9-no-such-version",
    ]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("could not download qemu-system-data=9:9.9.9-no-such-version from"),
        "{err}"
    );
    assert!(!err.contains("could not download seabios"), "{err}");
}

/// A package apt cannot resolve fails the plan (and so the closure) naming it.
#[test]
fn aptfetch_names_the_package_apt_cannot_resolve() {
    let (ok, err) = aptfetch_bookworm(&["plan", "gpupass-no-such-package"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("aptfetch: apt cannot resolve gpupass-no-such-package from bookworm"),
        "{err}"
    );
    assert!(err.contains("gpupass-no-such-package"), "{err}");
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("debs");
    let (ok, err) = aptfetch_bookworm(&["closure", dest.to_str().unwrap(), "gpupass-no-such-package"]);
    assert!(!ok, "{err}");
    assert!(err.contains("cannot resolve gpupass-no-such-package"), "{err}");
}

/// A package installed at a version no source of the suite carries (backports' build, with only
/// bookworm in aptfetch's sources) is still fetched, at the suite's own version: the candidate
/// comes from the sources, not from what is installed. Seen for real with backports' QEMU 10.0
/// installed ("Can't find a source to download version '1:10.0.2+ds-2+deb13u1~bpo12+1' of
/// 'qemu-system-common:amd64'"); here the installed version is a status stanza.
#[test]
fn aptfetch_fetches_from_the_suite_whatever_version_is_installed() {
    let t = tempfile::tempdir().unwrap();
    let status = t.path().join("status");
    std::fs::write(
        &status,
        "Package: seabios\nStatus: install ok installed\nPriority: optional\nSection: misc\n\
         Maintainer: Debian QEMU Team <pkg-qemu-devel@lists.alioth.debian.org>\nArchitecture: all\n\
         Version: 1.16.3-2~bpo12+1\nDescription: legacy BIOS implementation\n\n",
    )
    .unwrap();
    let dest = t.path().join("debs");
    let (ok, err) = aptfetch_bookworm_over(Some(&status), &["download", dest.to_str().unwrap(), "seabios"]);
    assert!(ok, "{err}");
    let got: Vec<String> = std::fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("seabios_") && !got[0].contains("bpo"),
        "{got:?}"
    );
    // The plan of a named package apt would not install takes the suite's version too.
    let (ok, err) = aptfetch_bookworm_over(Some(&status), &["plan", "seabios"]);
    assert!(ok, "{err}");
}
