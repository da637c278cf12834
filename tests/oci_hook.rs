//! `gpupass oci-hook` under runc with a real OCI bundle (`runc spec`, busybox rootfs): the
//! VFIO nodes appear inside the container (and can be opened: the devices cgroup allows
//! them), not on the host; every malformed input is refused with nothing created.

mod util;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use util::*;

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

#[test]
fn hook_gives_a_runc_container_its_vfio_nodes() {
    if !need_tool("runc") {
        return;
    }
    let host = hook_host();
    let work = tempfile::tempdir().unwrap();
    let script = "stat -c '%n %F %t %T %a' /dev/vfio/vfio /dev/vfio/40 /dev/vfio/42 /dev/iommu \
                  /dev/vfio/devices/vfio0 /dev/vfio/devices/vfio4 /dev/vfio/devices/vfio5; \
                  test -e /dev/vfio/41 && echo LEAK; cat /dev/vfio/40; cat /dev/vfio/42; echo done";
    let b = bundle(work.path(), host.path(), Some("0000:17:00.0,42"), script);
    let id = format!("gpupass-hook-{}", std::process::id());
    let o = runc_run(&work.path().join("state"), &b, &id);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "runc failed: {err}\n{out}");
    for want in [
        "/dev/vfio/vfio character special file a c4",
        "/dev/vfio/40 character special file f0 28",
        "/dev/vfio/42 character special file f0 2a",
        "/dev/iommu character special file a 7b",
        "/dev/vfio/devices/vfio0 character special file f1 0",
        "/dev/vfio/devices/vfio4 character special file f1 4",
        "/dev/vfio/devices/vfio5 character special file f1 5",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}\n{err}");
    }
    assert!(!out.contains("LEAK"), "{out}");
    // The devices cgroup lets the open through to the (absent) driver: ENXIO, not EPERM.
    let all = format!("{out}{err}");
    assert!(!all.contains("Operation not permitted"), "{all}");
    assert!(all.contains("No such device or address"), "{all}");
    assert!(out.contains("done"));
    // Created in the container's mount namespace only.
    assert!(
        !b.join("rootfs/dev/vfio").exists(),
        "nodes leaked onto the host rootfs"
    );
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
    let b = dir.join("b");
    std::fs::create_dir_all(b.join("rootfs")).unwrap();
    let mut c = serde_json::json!({"ociVersion": "1.0.2", "root": {"path": "rootfs"}});
    if let Some(a) = annotation {
        c["annotations"] = serde_json::json!({ "gpupass.dev/devices": a });
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
        stderr(&o).contains("/dev/vfio/devices/vfio1 is missing"),
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
    for (i, link_at) in ["dev", "dev/vfio"].iter().enumerate() {
        let b = plain_bundle(&work.path().join(format!("s{i}")), Some("0000:17:00.0"));
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
