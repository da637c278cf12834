//! Shared helpers of the integration tests (every module of tests/it): run the real binary,
//! compare with golden files, copy fixture hosts, read drivers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A shipped fixture host tree.
pub fn host(name: &str) -> PathBuf {
    manifest_dir().join("tests/fixtures/hosts").join(name)
}

/// Run `gpupass ARGS` (the real binary) with GPUPASS_ROOT cleared.
pub fn gpupass(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpupass"))
        .args(args)
        .env_remove("GPUPASS_ROOT")
        .output()
        .expect("run gpupass")
}

/// Run against a fixture host: `gpupass --root <host> ARGS`.
pub fn on_host(host_name: &str, args: &[&str]) -> Output {
    let root = host(host_name);
    let mut all = vec!["--root", root.to_str().unwrap()];
    all.extend_from_slice(args);
    gpupass(&all)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// [`ok`], parsed as JSON.
pub fn ok_json(o: &Output) -> serde_json::Value {
    serde_json::from_str(&ok(o)).expect("valid JSON")
}

/// The driver `addr` is bound to on a (fixture) root, by its `driver` link.
pub fn driver(root: &Path, addr: &str) -> Option<String> {
    std::fs::read_link(root.join("sys/bus/pci/devices").join(addr).join("driver"))
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// Address -> driver of every PCI function on a (fixture) root.
pub fn drivers(root: &Path) -> std::collections::BTreeMap<String, Option<String>> {
    let bus = root.join("sys/bus/pci/devices");
    let mut out = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(&bus).into_iter().flatten().flatten() {
        let d = std::fs::read_link(e.path().join("driver"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
        out.insert(e.file_name().to_string_lossy().into_owned(), d);
    }
    out
}

/// Assert success and return stdout; print both streams on failure.
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "gpupass failed with {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        stdout(o),
        stderr(o)
    );
    assert_ne!(o.status.code(), Some(101), "gpupass panicked: {}", stderr(o));
    stdout(o)
}

/// Compare `actual` with `tests/golden/<name>`; `GPUPASS_REGENERATE=1` rewrites the file.
pub fn golden(name: &str, actual: &str) {
    let p = manifest_dir().join("tests/golden").join(name);
    if std::env::var_os("GPUPASS_REGENERATE").is_some() {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&p).unwrap_or_else(|_| {
        panic!(
            "golden file {} missing; run with GPUPASS_REGENERATE=1 to create it",
            p.display()
        )
    });
    if expected != actual {
        let diff: Vec<String> = expected
            .lines()
            .zip(actual.lines())
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .take(5)
            .map(|(i, (a, b))| format!("line {}:\n  golden: {a}\n  actual: {b}", i + 1))
            .collect();
        panic!(
            "output differs from {} ({} vs {} lines)\n{}\n(GPUPASS_REGENERATE=1 rewrites it)",
            p.display(),
            expected.lines().count(),
            actual.lines().count(),
            diff.join("\n")
        );
    }
}

/// Copy a fixture host into a temp dir (symlinks preserved) so a test may change it.
pub fn scratch_host(name: &str) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    copy_tree(&host(name), t.path());
    t
}

pub fn copy_tree(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let (s, d) = (e.path(), dst.join(e.file_name()));
        let ft = e.file_type().unwrap();
        if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&s).unwrap(), &d).unwrap();
        } else if ft.is_dir() {
            copy_tree(&s, &d);
        } else {
            std::fs::copy(&s, &d).unwrap();
        }
    }
}

/// Run the real binary with a deadline (a hang is a failure, not a stuck test run).
pub fn run_bounded(c: Command, secs: u64) -> (Option<i32>, String, String) {
    run_bounded_stdin(c, secs, None)
}

/// [`run_bounded`] with standard input read from `stdin` (a file) instead of /dev/null.
pub fn run_bounded_stdin(mut c: Command, secs: u64, stdin: Option<&Path>) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let (o, e) = (dir.path().join("out"), dir.path().join("err"));
    match stdin {
        Some(p) => c.stdin(std::fs::File::open(p).unwrap()),
        None => c.stdin(std::process::Stdio::null()),
    };
    c.stdout(std::fs::File::create(&o).unwrap())
        .stderr(std::fs::File::create(&e).unwrap());
    let mut child = c.spawn().expect("run gpupass");
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > std::time::Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gpupass hung (killed after {secs} s): {c:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    (
        status.code(),
        String::from_utf8_lossy(&std::fs::read(&o).unwrap()).into_owned(),
        String::from_utf8_lossy(&std::fs::read(&e).unwrap()).into_owned(),
    )
}

/// Whether a privileged tool is usable (installed, and we are root); in CI (CI=true) a missing
/// one fails the test, elsewhere the test says SKIPPED.
pub fn need_tool(tool: &str) -> bool {
    let is_root = rustix::process::geteuid().is_root();
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if found && is_root {
        return true;
    }
    let why = if !found {
        format!("{tool} is not installed")
    } else {
        "not root".into()
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{why}: CI must run this test (tests/install-deps.sh installs it)");
    }
    eprintln!("SKIPPED: {why} (mandatory when CI=true)");
    false
}

/// The real binary on the fake kernel (`GPUPASS_FAKE_KERNEL=1`: writes under `--root` take
/// the kernel's visible effect), with no root or failpoint inherited from the environment.
pub fn fake_kernel(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpupass"));
    c.args(args)
        .env_remove("GPUPASS_ROOT")
        .env_remove("GPUPASS_FAIL_WRITE")
        .env_remove("GPUPASS_CRASH_AFTER_WRITE")
        .env("GPUPASS_FAKE_KERNEL", "1");
    c
}

/// IOMMU group `n` of `gpupass groups --json` output (panics when it is not there).
pub fn group_json(groups: &serde_json::Value, n: u64) -> serde_json::Value {
    groups["groups"]
        .as_array()
        .expect("a groups array")
        .iter()
        .find(|g| g["number"] == n)
        .unwrap_or_else(|| panic!("no group {n} in {groups}"))
        .clone()
}

/// Stand-in VFIO nodes on a fixture root (this machine has no VFIO devices): the container
/// (10:196) and iommufd (10:123) nodes, groups 40-42, 60, 61 as 240:N and cdevs vfio0-5 as
/// 241:N (240-242 are the kernel's local/experimental majors, unused here).
pub fn vfio_stand_in_nodes(r: &Path) {
    mknod(&r.join("dev/vfio/vfio"), 10, 196);
    for g in [40, 41, 42, 60, 61] {
        mknod(&r.join(format!("dev/vfio/{g}")), 240, g);
    }
    mknod(&r.join("dev/iommu"), 10, 123);
    for n in 0..6 {
        mknod(&r.join(format!("dev/vfio/devices/vfio{n}")), 241, n);
    }
}

/// A character device node (stand-in for /dev/vfio/N in container tests).
pub fn mknod(path: &Path, major: u32, minor: u32) {
    let _ = std::fs::remove_file(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let st = Command::new("mknod")
        .arg(path)
        .args(["c", &major.to_string(), &minor.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "mknod {}", path.display());
}

/// Where this machine mounts the unified (cgroup v2) hierarchy: `/sys/fs/cgroup` on a v2-only
/// host, `/sys/fs/cgroup/unified` on a hybrid one.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mi.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next() == Some("cgroup2"))
            .then(|| PathBuf::from(pre.split_whitespace().nth(4).unwrap()))
    })
}

/// Whether to run the KVM tests; panics with the reason when KVM is unusable.
/// `GPUPASS_SKIP_KVM_TESTS` skips them visibly, except under `CI=true`, where nothing skips.
pub fn kvm_available() -> bool {
    if std::env::var_os("GPUPASS_SKIP_KVM_TESTS").is_some() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "GPUPASS_SKIP_KVM_TESTS is set, but CI=true runs every test: CI must boot this \
             test's VM on /dev/kvm; unset GPUPASS_SKIP_KVM_TESTS and run on a machine with KVM \
             (kvm_intel, kvm_amd or kvm_pvm)"
        );
        eprintln!(
            "SKIPPED: GPUPASS_SKIP_KVM_TESTS is set; this test needs /dev/kvm (mandatory when CI=true)"
        );
        return false;
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        panic!(
            "this test boots a VM and needs /dev/kvm, which cannot be opened here ({e}); \
             run on a machine with KVM (kvm_intel, kvm_amd or kvm_pvm), or set \
             GPUPASS_SKIP_KVM_TESTS=1 to skip it visibly"
        );
    }
    true
}
