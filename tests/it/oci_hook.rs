//! `gpupass oci-hook` under runc with a real OCI bundle (`runc spec`, busybox rootfs): the
//! VFIO nodes appear inside the container (and can be opened: the devices cgroup allows
//! them), not on the host; every malformed input is refused with nothing created.

use crate::util::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The vfio-numa host with stand-in char nodes, and the real /proc and cgroup tree (the hook
/// needs the container's real pid, mount namespace and cgroup).
fn hook_host() -> tempfile::TempDir {
    let t = scratch_host("vfio-numa");
    let r = t.path();
    vfio_stand_in_nodes(r);
    std::fs::remove_dir_all(r.join("proc")).unwrap();
    std::os::unix::fs::symlink("/proc", r.join("proc")).unwrap();
    std::fs::create_dir_all(r.join("sys/fs")).unwrap();
    std::os::unix::fs::symlink("/sys/fs/cgroup", r.join("sys/fs/cgroup")).unwrap();
    t
}

fn busybox_rootfs(rootfs: &Path) {
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    let bb = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox-static");
    std::fs::copy(bb, rootfs.join("bin/busybox")).unwrap();
    for tool in ["sh", "ls", "cat", "stat", "test", "echo"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(tool)).unwrap();
    }
}

/// A bundle from `runc spec` running `script`, with gpupass as a createRuntime hook.
fn bundle(dir: &Path, host_root: &Path, annotation: Option<&str>, script: &str) -> PathBuf {
    bundle_on(dir, host_root, annotation, None, script)
}

/// `bundle` with the `gpupass.dev/backend` annotation too.
fn bundle_on(
    dir: &Path,
    host_root: &Path,
    annotation: Option<&str>,
    backend: Option<&str>,
    script: &str,
) -> PathBuf {
    let b = dir.join("bundle");
    std::fs::create_dir_all(&b).unwrap();
    busybox_rootfs(&b.join("rootfs"));
    let st = Command::new("runc").arg("spec").current_dir(&b).status().unwrap();
    assert!(st.success(), "runc spec");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(b.join("config.json")).unwrap()).unwrap();
    c["process"]["terminal"] = false.into();
    c["process"]["args"] = serde_json::json!(["/bin/sh", "-c", script]);
    if let Some(a) = annotation {
        c["annotations"] = serde_json::json!({ "gpupass.dev/devices": a });
        if let Some(be) = backend {
            c["annotations"]["gpupass.dev/backend"] = be.into();
        }
    }
    c["hooks"] = serde_json::json!({ "createRuntime": [{
        "path": env!("CARGO_BIN_EXE_gpupass"),
        "args": ["gpupass", "--root", host_root.to_str().unwrap(), "oci-hook"],
        "timeout": 10
    }]});
    std::fs::write(b.join("config.json"), serde_json::to_string_pretty(&c).unwrap()).unwrap();
    b
}

fn runc_run(state: &Path, bundle: &Path, id: &str) -> Output {
    Command::new("runc")
        .arg("--root")
        .arg(state)
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(id)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// One backend's node set per device (docs/iommufd.md): on this cdev host `auto` gives the
/// cdevs and `/dev/iommu` and never the group or container; `gpupass.dev/backend: legacy`
/// gives the group and container and never the cdevs.
#[test]
fn hook_gives_a_runc_container_its_vfio_nodes() {
    if !need_tool("runc") {
        return;
    }
    let host = hook_host();
    for (backend, script, want, gone) in [
        (
            None,
            "stat -c '%n %F %t %T %a' /dev/iommu /dev/vfio/devices/vfio0 /dev/vfio/devices/vfio4 \
             /dev/vfio/devices/vfio5; for n in /dev/vfio/vfio /dev/vfio/40 /dev/vfio/42 /dev/vfio/41 \
             /dev/vfio/devices/vfio1; do test -e $n && echo LEAK $n; done; cat /dev/iommu; \
             cat /dev/vfio/devices/vfio0; echo done",
            &[
                "/dev/iommu character special file a 7b",
                "/dev/vfio/devices/vfio0 character special file f1 0",
                "/dev/vfio/devices/vfio4 character special file f1 4",
                "/dev/vfio/devices/vfio5 character special file f1 5",
            ][..],
            "legacy",
        ),
        (
            Some("legacy"),
            "stat -c '%n %F %t %T %a' /dev/vfio/vfio /dev/vfio/40 /dev/vfio/42; \
             for n in /dev/iommu /dev/vfio/devices /dev/vfio/41; do test -e $n && echo LEAK $n; done; \
             cat /dev/vfio/40; cat /dev/vfio/42; echo done",
            &[
                "/dev/vfio/vfio character special file a c4",
                "/dev/vfio/40 character special file f0 28",
                "/dev/vfio/42 character special file f0 2a",
            ][..],
            "iommufd",
        ),
    ] {
        let work = tempfile::tempdir().unwrap();
        let b = bundle_on(work.path(), host.path(), Some("0000:17:00.0,42"), backend, script);
        let id = format!(
            "gpupass-hook-{}-{}",
            std::process::id(),
            backend.unwrap_or("auto")
        );
        let o = runc_run(&work.path().join("state"), &b, &id);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "runc failed: {err}\n{out}");
        for w in want {
            assert!(out.contains(w), "{backend:?}: missing {w:?} in:\n{out}\n{err}");
        }
        assert!(
            !out.contains("LEAK"),
            "{backend:?}: {gone} nodes handed out too:\n{out}"
        );
        // The devices cgroup lets the open through to the (absent) driver: ENXIO, not EPERM.
        let all = format!("{out}{err}");
        assert!(!all.contains("Operation not permitted"), "{all}");
        assert!(all.contains("No such device or address"), "{all}");
        assert!(out.contains("done"));
        // Created in the container's mount namespace only.
        assert!(
            !b.join("rootfs/dev/vfio").exists() && !b.join("rootfs/dev/iommu").exists(),
            "nodes leaked onto the host rootfs"
        );
    }
}

#[test]
fn runc_refuses_to_start_when_the_hook_refuses() {
    if !need_tool("runc") {
        return;
    }
    let host = hook_host();
    let work = tempfile::tempdir().unwrap();
    // 0000:b1:00.0 is on the nvidia driver.
    let b = bundle(work.path(), host.path(), Some("0000:b1:00.0"), "echo STARTED");
    let o = runc_run(
        &work.path().join("state"),
        &b,
        &format!("gpupass-hook-bad-{}", std::process::id()),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{out}");
    assert!(!out.contains("STARTED"));
    assert!(err.contains("bound to nvidia, not to vfio-pci"), "{err}");
}

/// Run the hook directly with a state document.
fn hook(host: &Path, state: &str) -> Output {
    use std::io::Write;
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpupass"))
        .args(["--root", host.to_str().unwrap(), "oci-hook"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(state.as_bytes()).unwrap();
    c.wait_with_output().unwrap()
}

fn plain_bundle(dir: &Path, annotation: Option<&str>) -> PathBuf {
    plain_bundle_on(dir, annotation, "legacy")
}

fn plain_bundle_on(dir: &Path, annotation: Option<&str>, backend: &str) -> PathBuf {
    let b = dir.join("b");
    std::fs::create_dir_all(b.join("rootfs")).unwrap();
    let mut c = serde_json::json!({"ociVersion": "1.0.2", "root": {"path": "rootfs"}});
    if let Some(a) = annotation {
        // These tests are about the group node paths: pin the legacy backend (this host has
        // the cdevs too, where `auto` would pick iommufd).
        c["annotations"] = serde_json::json!({ "gpupass.dev/devices": a, "gpupass.dev/backend": backend });
    }
    std::fs::write(b.join("config.json"), c.to_string()).unwrap();
    b
}

fn state(bundle: &Path, pid: u32) -> String {
    serde_json::json!({"ociVersion": "1.0.2-dev", "id": "c1", "status": "creating", "pid": pid,
        "bundle": bundle.to_str().unwrap()})
    .to_string()
}

#[test]
fn malformed_inputs_are_refused_and_nothing_is_created() {
    let host = hook_host();
    let work = tempfile::tempdir().unwrap();
    let me = std::process::id();
    let cases: Vec<(String, Option<&str>, i32, &str)> = vec![
        ("".into(), None, 2, "malformed OCI state"),
        ("{".into(), None, 2, "malformed OCI state"),
        ("[]".into(), None, 2, "malformed OCI state"),
        (
            r#"{"ociVersion":"1","id":"x","pid":1}"#.into(),
            None,
            2,
            "missing field `bundle`",
        ),
        (
            r#"{"ociVersion":"1","id":"x","pid":1,"bundle":"rel/dir"}"#.into(),
            None,
            2,
            "not an absolute path",
        ),
        (
            state(Path::new("/nonexistent/bundle"), me),
            None,
            1,
            "cannot read config.json",
        ),
        (
            "STATE".into(),
            Some("0000:99:00.0"),
            1,
            "PCI function 0000:99:00.0 is not on this host",
        ),
        (
            "STATE".into(),
            Some("0000:b1:00.0"),
            1,
            "bound to nvidia, not to vfio-pci",
        ),
        (
            "STATE".into(),
            Some("50"),
            1,
            "group 50 has no function on vfio-pci",
        ),
        (
            "STATE".into(),
            Some("999"),
            1,
            "IOMMU group 999 is not on this host",
        ),
        ("STATE".into(), Some("17:00.0,bogus"), 2, "\"bogus\" is neither"),
        ("STATE".into(), Some("0000:16:01.0"), 1, "bound to pcieport"),
        ("NOPID".into(), Some("0000:17:00.0"), 2, "no pid"),
    ];
    for (i, (st, ann, code, msg)) in cases.into_iter().enumerate() {
        let d = work.path().join(i.to_string());
        let b = plain_bundle(&d, ann);
        let st = match st.as_str() {
            "STATE" => state(&b, me),
            "NOPID" => {
                serde_json::json!({"ociVersion": "1", "id": "x", "bundle": b.to_str().unwrap()}).to_string()
            }
            _ => st,
        };
        let o = hook(host.path(), &st);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "case {i}: {err}");
        assert!(err.contains(msg), "case {i}: expected {msg:?} in {err:?}");
        assert!(err.starts_with("gpupass oci-hook: "), "{err}");
        assert_eq!(
            std::fs::read_dir(b.join("rootfs")).unwrap().count(),
            0,
            "case {i}: something was created"
        );
    }
    // A missing host node (group 41's /dev/vfio/41 gone) is refused before anything is made.
    std::fs::remove_file(host.path().join("dev/vfio/41")).unwrap();
    std::fs::remove_file(host.path().join("dev/vfio/devices/vfio1")).unwrap();
    let b = plain_bundle(&work.path().join("missing"), Some("0000:17:00.0,0000:31:00.0"));
    let o = hook(host.path(), &state(&b, me));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("host device node /dev/vfio/41 is missing"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_dir(b.join("rootfs")).unwrap().count(), 0);
    // No annotation: nothing to do, success.
    let b = plain_bundle(&work.path().join("none"), None);
    let o = hook(host.path(), &state(&b, me));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn symlinks_in_the_rootfs_are_not_followed() {
    if !need_tool("runc") {
        return;
    }
    // A process of our own in a private mount namespace stands in for the container (the
    // rootfs is then the bundle directory itself, as before pivot_root).
    let host = hook_host();
    let work = tempfile::tempdir().unwrap();
    let outside = work.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    for (i, link_at) in ["dev", "dev/vfio", "dev/vfio/devices"].iter().enumerate() {
        // iommufd: its nodes are under all three (/dev/iommu, /dev/vfio/devices/vfio0).
        let b = plain_bundle_on(
            &work.path().join(format!("s{i}")),
            Some("0000:17:00.0"),
            "iommufd",
        );
        let at = b.join("rootfs").join(link_at);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&outside, &at).unwrap();
        let mut sleeper = Command::new("unshare")
            .args(["-m", "sleep", "30"])
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let o = hook(host.path(), &state(&b, sleeper.id()));
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{link_at}: {err}");
        assert!(err.contains("is a symlink or not a directory"), "{err}");
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "escaped through {link_at}"
        );
        // The stand-in container shares this test's devices cgroup: the failed hook must not
        // have denied its devices there (it once did, and mknod of /dev/vfio/vfio failed for
        // every process in the cgroup from then on).
        let probe = work.path().join(format!("probe{i}"));
        mknod(&probe, 10, 196);
        mknod(&probe, 240, 40);
    }
}

/// podman runs the hook from a hooks directory (OCI hooks 1.0.0, stage createRuntime) for a
/// container with the annotation, on runc with the containers.conf these machines need.
#[test]
fn podman_runs_the_hook_from_a_hooks_dir() {
    if !need_tool("podman") || !need_tool("runc") {
        return;
    }
    let host = hook_host();
    let work = tempfile::tempdir().unwrap();
    let conf = work.path().join("containers.conf");
    std::fs::write(
        &conf,
        "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\n[engine]\nruntime = \"runc\"\n",
    )
    .unwrap();
    // Image: a busybox rootfs imported under a tag of its own.
    let rootfs = work.path().join("rootfs");
    busybox_rootfs(&rootfs);
    let tar = work.path().join("rootfs.tar");
    assert!(Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap()
        .success());
    let tag = "localhost/gpupass-hook-busybox:latest";
    let o = Command::new("podman")
        .args(["import", "--change", "CMD [\"/bin/sh\"]"])
        .arg(&tar)
        .arg(tag)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let hooks = work.path().join("hooks.d");
    std::fs::create_dir_all(&hooks).unwrap();
    let hook = serde_json::json!({
        "version": "1.0.0",
        "hook": {"path": env!("CARGO_BIN_EXE_gpupass"), "args": ["gpupass", "oci-hook"],
                 "env": [format!("GPUPASS_ROOT={}", host.path().display())]},
        "when": {"annotations": {"^gpupass\\.dev/devices$": ".+"}},
        "stages": ["createRuntime"]
    });
    std::fs::write(hooks.join("gpupass.json"), hook.to_string()).unwrap();
    let run = |annotation: Option<&str>| {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", &conf)
            .arg("--hooks-dir")
            .arg(&hooks)
            .args(["run", "--rm"]);
        if let Some(a) = annotation {
            c.args(["--annotation", &format!("gpupass.dev/devices={a}")]);
            c.args(["--annotation", "gpupass.dev/backend=legacy"]);
        }
        c.args([
            tag,
            "sh",
            "-c",
            "stat -c '%n %t %T' /dev/vfio/vfio /dev/vfio/41; cat /dev/vfio/41; echo end",
        ]);
        c.output().unwrap()
    };
    let o = run(Some("0000:31:00.0"));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(all.contains("/dev/vfio/41 f0 29"), "{all}");
    assert!(
        all.contains("No such device or address"),
        "the cgroup must allow it: {all}"
    );
    assert!(all.contains("end"));
    // Without the annotation the hook does not run: no VFIO nodes.
    let o = run(None);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!all.contains("/dev/vfio/41 f0"), "{all}");
    // A device on a host driver: podman fails to start the container, with the hook's reason.
    let o = run(Some("0000:b1:00.0"));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!o.status.success() && !all.contains("end"), "{all}");
}

/// "Allow c 1:3 (/dev/null), deny everything else": a runtime's device program in small.
fn runtime_program() -> Vec<gpupass::containers::oci_hook::bpf::Insn> {
    use gpupass::containers::oci_hook::bpf::Insn;
    vec![
        Insn::ldx_w(2, 1, 0),
        Insn::and_imm(2, 0xffff),
        Insn::ldx_w(4, 1, 4),
        Insn::ldx_w(5, 1, 8),
        Insn::jne_imm(2, 2, 4),
        Insn::jne_imm(4, 1, 3),
        Insn::jne_imm(5, 3, 2),
        Insn::mov_imm(0, 1),
        Insn::exit(),
        Insn::mov_imm(0, 0),
        Insn::exit(),
    ]
}

/// A stand-in container on the real kernel's cgroup v2 hierarchy: a process in a private mount
/// namespace, in a fresh cgroup with `runtime_program` attached as runc attaches its filter
/// (BPF_F_ALLOW_MULTI). It waits for a line on stdin, then runs `script`.
struct V2Container {
    cg: PathBuf,
    child: std::process::Child,
    original: u32,
}

impl V2Container {
    fn new(host: &Path, tag: &str, script: &str) -> V2Container {
        use gpupass::containers::oci_hook::bpf;
        use std::os::fd::AsFd;
        let mount = cgroup2_mount().expect("no cgroup2 mount: the cgroup v2 hook test needs one");
        let cg = mount.join(format!("gpupass-test-{}-{tag}", std::process::id()));
        std::fs::create_dir(&cg).unwrap();
        let dir = std::fs::File::open(&cg).unwrap();
        let prog = bpf::load(&runtime_program(), "test_runtime").expect("BPF_PROG_LOAD (CONFIG_CGROUP_BPF?)");
        bpf::attach(dir.as_fd(), prog.as_fd(), bpf::BPF_F_ALLOW_MULTI, None).unwrap();
        let original = bpf::query(dir.as_fd(), false).unwrap().ids;
        assert_eq!(original.len(), 1);
        let child = Command::new("unshare")
            .args(["-m", "sh", "-c", &format!("read go; {script}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        std::fs::write(cg.join("cgroup.procs"), pid.to_string()).unwrap();
        let rel = cg.strip_prefix(&mount).unwrap().display().to_string();
        let p = host.join(format!("proc/{pid}"));
        std::fs::create_dir_all(p.join("ns")).unwrap();
        std::fs::write(p.join("cgroup"), format!("0::/{rel}\n")).unwrap();
        // unshare has made its namespace once its pid's ns link differs from ours.
        for _ in 0..100 {
            if std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()
                != std::fs::read_link("/proc/self/ns/mnt").ok()
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::os::unix::fs::symlink(format!("/proc/{pid}/ns/mnt"), p.join("ns/mnt")).unwrap();
        V2Container {
            cg,
            child,
            original: original[0],
        }
    }
    fn programs(&self) -> Vec<u32> {
        use std::os::fd::AsFd;
        let dir = std::fs::File::open(&self.cg).unwrap();
        gpupass::containers::oci_hook::bpf::query(dir.as_fd(), false)
            .unwrap()
            .ids
    }
    fn pid(&self) -> u32 {
        self.child.id()
    }
    /// Let the script run; its output.
    fn run(mut self) -> String {
        use std::io::Write;
        self.child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let o = std::mem::replace(&mut self.child, Command::new("true").spawn().unwrap());
        let o = o.wait_with_output().unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    }
}

impl Drop for V2Container {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for _ in 0..50 {
            if std::fs::remove_dir(&self.cg).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// A host whose cgroup tree is this machine's unified hierarchy and whose /proc is made per
/// test (the container's cgroup line and its namespace link), with stand-in VFIO nodes.
fn v2_host() -> tempfile::TempDir {
    let t = scratch_host("vfio-numa");
    let r = t.path();
    vfio_stand_in_nodes(r);
    std::fs::remove_dir_all(r.join("proc")).unwrap();
    std::fs::create_dir_all(r.join("sys/fs")).unwrap();
    let _ = std::fs::remove_dir_all(r.join("sys/fs/cgroup"));
    std::os::unix::fs::symlink(cgroup2_mount().expect("a cgroup2 mount"), r.join("sys/fs/cgroup")).unwrap();
    t
}

/// Open each path; one line per path: `<label>: OK` or `<label>: <error>`.
fn probe_script(items: &[(&str, String)]) -> String {
    items
        .iter()
        .map(|(label, path)| format!("if r=$(head -c1 {path} 2>&1 >/dev/null); then echo '{label}: OK'; else echo \"{label}: $r\"; fi; "))
        .collect()
}

/// cgroup v2 on the real kernel (this machine's unified hierarchy; the BPF device hook also
/// runs there on a hybrid host): the hook replaces the runtime's device program with one that
/// allows the requested nodes and otherwise runs the runtime's instructions; a failure after
/// the swap puts the runtime's program back.
#[test]
fn cgroup_v2_device_filter_is_extended_and_restored() {
    if !need_tool("unshare") {
        return;
    }
    let host = v2_host();
    let r = host.path();
    let work = tempfile::tempdir().unwrap();
    let b = plain_bundle(&work.path().join("ok"), Some("0000:17:00.0"));
    let rootfs = b.join("rootfs");
    let script = probe_script(&[
        ("requested", rootfs.join("dev/vfio/40").display().to_string()),
        ("not-requested", r.join("dev/vfio/41").display().to_string()),
        ("runtime-allowed", "/dev/null".into()),
        ("runtime-denied", "/dev/zero".into()),
    ]);
    let c = V2Container::new(r, "ok", &script);
    let o = hook(r, &state(&b, c.pid()));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let now = c.programs();
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now[0], c.original, "the runtime's program was not replaced");
    let out = c.run();
    for want in [
        "requested: head: cannot open",
        "not-requested: head: cannot open",
        "runtime-allowed: OK",
        "runtime-denied: head: cannot open",
    ] {
        assert!(out.contains(want), "{want:?} in:\n{out}");
    }
    let line = |l: &str| out.lines().find(|x| x.starts_with(l)).unwrap_or("").to_string();
    assert!(line("requested:").contains("No such device or address"), "{out}");
    assert!(
        line("not-requested:").contains("Operation not permitted"),
        "{out}"
    );
    assert!(
        line("runtime-denied:").contains("Operation not permitted"),
        "{out}"
    );

    // A file planted where /dev/vfio/40 goes: the hook fails after the swap; the runtime's
    // program is back and the node stays denied.
    let b = plain_bundle(&work.path().join("planted"), Some("0000:17:00.0"));
    std::fs::create_dir_all(b.join("rootfs/dev/vfio")).unwrap();
    std::fs::write(b.join("rootfs/dev/vfio/40"), "planted").unwrap();
    let script = probe_script(&[("host-40", r.join("dev/vfio/40").display().to_string())]);
    let c = V2Container::new(r, "planted", &script);
    let o = hook(r, &state(&b, c.pid()));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("/dev/vfio/40 under the rootfs: something else already exists there"),
        "{err}"
    );
    assert_eq!(
        c.programs(),
        [c.original],
        "the runtime's program was not restored"
    );
    let out = c.run();
    assert!(
        out.contains("host-40: ") && out.contains("Operation not permitted"),
        "{out}"
    );
    let left: Vec<_> = std::fs::read_dir(b.join("rootfs/dev/vfio"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["40"], "nodes made before the failure were not removed");
}

/// A file or a different node where a requested node goes is refused ("something else already
/// exists there"), the nodes made before it are removed; the same node already there is fine.
#[test]
fn something_else_where_a_node_goes_is_refused() {
    if !need_tool("unshare") {
        return;
    }
    let host = hook_host();
    let work = tempfile::tempdir().unwrap();
    for (i, plant) in ["file", "other-node", "same-node"].iter().enumerate() {
        let b = plain_bundle(&work.path().join(format!("p{i}")), Some("0000:17:00.0"));
        let at = b.join("rootfs/dev/vfio/40");
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        match *plant {
            "file" => std::fs::write(&at, "x").unwrap(),
            "other-node" => mknod(&at, 1, 3),
            _ => mknod(&at, 240, 40),
        }
        let mut sleeper = Command::new("unshare")
            .args(["-m", "sleep", "30"])
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let o = hook(host.path(), &state(&b, sleeper.id()));
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        let err = stderr(&o);
        let mut left: Vec<String> = std::fs::read_dir(b.join("rootfs/dev/vfio"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        if *plant == "same-node" {
            assert_eq!(o.status.code(), Some(0), "{err}");
            assert_eq!(left, ["40", "vfio"], "{err}");
        } else {
            assert_eq!(o.status.code(), Some(1), "{plant}: {err}");
            assert!(
                err.contains("refusing /dev/vfio/40 under the rootfs: something else already exists there"),
                "{plant}: {err}"
            );
            assert_eq!(
                left,
                ["40"],
                "{plant}: /dev/vfio/vfio made before it was not removed"
            );
        }
    }
}
