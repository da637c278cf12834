//! Container paths run as the real binary: `cdi generate` (golden specs, the official CDI JSON
//! schema, `--write` and refresh) and `container list` against the fixture hosts, and the
//! generated specs consumed by podman (a real CDI loader) when it is installed.

use crate::util::*;
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) const HOSTS: &[&str] = &[
    "workstation",
    "hgx-8gpu",
    "sriov-vgpu",
    "mdev-t4",
    "nvidia-minors",
    "vfio-numa",
];

/// The official CDI schema (tests/schemas) as one document: `defs.json#/definitions/X`
/// references point at the definitions merged in.
fn cdi_validator() -> jsonschema::Validator {
    let dir = manifest_dir().join("tests/schemas");
    let schema = std::fs::read_to_string(dir.join("cdi-schema.json")).unwrap();
    let defs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cdi-defs.json")).unwrap()).unwrap();
    let mut schema: serde_json::Value =
        serde_json::from_str(&schema.replace("defs.json#/definitions/", "#/definitions/")).unwrap();
    schema["definitions"] = defs["definitions"].clone();
    jsonschema::validator_for(&schema).expect("the CDI schema compiles")
}

/// What the Go CDI loader checks beyond the schema (podman/containerd/CRI-O reject these).
fn loader_checks(spec: &serde_json::Value) {
    let v = spec["cdiVersion"].as_str().unwrap();
    assert!(
        ["0.3.0", "0.4.0", "0.5.0"].contains(&v),
        "cdiVersion {v} is newer than podman 4.3 accepts"
    );
    let devs = spec["devices"].as_array().unwrap();
    assert!(!devs.is_empty(), "a spec needs at least one device");
    let mut names = std::collections::HashSet::new();
    for d in devs {
        let n = d["name"].as_str().unwrap();
        assert!(names.insert(n), "duplicate device {n}");
        assert!(gpupass::output::cdi::valid_device_name(n), "bad device name {n}");
        for e in d["containerEdits"]["env"].as_array().into_iter().flatten() {
            assert!(e.as_str().unwrap().contains('='), "env without '=': {e}");
        }
        for m in d["containerEdits"]["mounts"].as_array().into_iter().flatten() {
            assert!(m["containerPath"].as_str().unwrap().starts_with('/'));
        }
        for n in d["containerEdits"]["deviceNodes"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert!(n["path"].as_str().unwrap().starts_with("/dev/"));
        }
    }
    // Unknown fields: the loader is strict; our own strict types must read it back.
    let _: gpupass::output::cdi::Spec = serde_json::from_value(spec.clone()).expect("no unknown fields");
}

/// Every environment variable of every generated CDI spec survives a shell: busybox `sh` and
/// dash (Debian's /bin/sh) pass it on to what they run. A name with `-` (once
/// `PCI_RESOURCE_PCI-1234_GPUPASS_IO_1111`) is dropped by both, and most entrypoints are shell
/// scripts.
#[test]
fn cdi_env_names_survive_a_shell() {
    let mut seen = 0;
    for h in HOSTS {
        let o = on_host(h, &["cdi", "generate"]);
        let spec: serde_json::Value = serde_json::from_str(&ok(&o)).unwrap();
        // One container's environment per device (devices of one model set the same name).
        let devices = spec["devices"].as_array().unwrap().iter();
        for e in std::iter::once(&spec["containerEdits"]).chain(devices.map(|d| &d["containerEdits"])) {
            let env: Vec<String> = e["env"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            if env.is_empty() {
                continue;
            }
            for sh in [&["/bin/busybox", "sh"][..], &["dash"][..]] {
                let out = Command::new("env")
                    .arg("-i")
                    .args(&env)
                    .args(sh)
                    .args(["-c", "env"])
                    .output()
                    .unwrap();
                let got = String::from_utf8_lossy(&out.stdout);
                for kv in &env {
                    assert!(
                        got.lines().any(|l| l == kv),
                        "{h}: {sh:?} dropped {kv:?}; it passed on:\n{got}"
                    );
                    let name = kv.split_once('=').unwrap().0;
                    assert!(gpupass::output::naming::is_posix_env_name(name), "{h}: {name}");
                }
            }
            seen += env.len();
        }
    }
    assert!(seen > 5, "the fixture hosts' specs set only {seen} variables");
}

#[test]
fn cdi_specs_match_golden_and_validate_against_the_official_schema() {
    let validator = cdi_validator();
    for h in HOSTS {
        let o = on_host(h, &["cdi", "generate"]);
        let text = ok(&o);
        golden(&format!("{h}/cdi.json"), &text);
        golden(&format!("{h}/cdi-warnings.txt"), &stderr(&o));
        let spec: serde_json::Value = serde_json::from_str(&text).unwrap();
        let errors: Vec<String> = validator.iter_errors(&spec).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{h}: spec violates the CDI schema: {errors:?}");
        loader_checks(&spec);
    }
}

#[test]
fn the_schema_check_can_fail() {
    // A validator that accepts everything would make the test above worthless.
    let v = cdi_validator();
    let bad = serde_json::json!({"cdiVersion": "0.5.0", "kind": "a/b", "devices": [{"name": "x"}]});
    assert!(!v.is_valid(&bad), "containerEdits is required");
    let bad = serde_json::json!({"cdiVersion": "0.5.0", "kind": "a/b", "devices": [
        {"name": "x", "containerEdits": {"deviceNodes": [{"hostPath": "/dev/x"}]}}]});
    assert!(!v.is_valid(&bad), "a device node needs a path");
}

#[test]
fn cdi_content_for_vfio_hosts() {
    let spec: serde_json::Value =
        serde_json::from_str(&ok(&on_host("vfio-numa", &["cdi", "generate"]))).unwrap();
    assert_eq!(spec["kind"], "gpupass.dev/pci");
    assert_eq!(spec["cdiVersion"], "0.5.0", "names start with a digit");
    let dev = |n: &str| {
        spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == n)
            .unwrap_or_else(|| panic!("no device {n}"))
            .clone()
    };
    let paths = |d: &serde_json::Value| -> Vec<String> {
        d["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["path"].as_str().unwrap().to_string())
            .collect()
    };
    // One backend per CDI device (docs/iommufd.md): the host has both, so `auto` gives the
    // cdev + iommufd under the plain name, and each backend under its own name.
    assert_eq!(
        paths(&dev("0000:17:00.0")),
        ["/dev/iommu", "/dev/vfio/devices/vfio0"]
    );
    assert_eq!(
        paths(&dev("legacy-0000:17:00.0")),
        ["/dev/vfio/vfio", "/dev/vfio/40"]
    );
    assert_eq!(
        paths(&dev("iommufd-0000:17:00.0")),
        ["/dev/iommu", "/dev/vfio/devices/vfio0"]
    );
    // The group with GPU + audio: both cdevs, one env per model, only that group's addresses.
    let g = dev("group-42");
    assert_eq!(
        paths(&g),
        ["/dev/iommu", "/dev/vfio/devices/vfio4", "/dev/vfio/devices/vfio5"]
    );
    assert_eq!(paths(&dev("legacy-group-42")), ["/dev/vfio/vfio", "/dev/vfio/42"]);
    assert_eq!(
        g["containerEdits"]["env"],
        serde_json::json!([
            "PCI_RESOURCE_NVIDIA_COM_GA102GL_RTX_A6000=0000:4b:00.0",
            "PCI_RESOURCE_NVIDIA_COM_GA102_HIGH_DEFINITION_AUDIO_CONTROLLER=0000:4b:00.1"
        ])
    );
    // The audio function alone still gets its group.
    assert_eq!(
        dev("0000:4b:00.1")["containerEdits"]["env"],
        serde_json::json!(["PCI_RESOURCE_NVIDIA_COM_GA102_HIGH_DEFINITION_AUDIO_CONTROLLER=0000:4b:00.1"])
    );
    // The GPU on the native driver: its own minor's node, not a VFIO node.
    assert_eq!(
        paths(&dev("0000:b1:00.0")),
        ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    );
    // Bridges are never devices.
    assert!(spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["name"] != "0000:16:01.0"));
}

#[test]
fn cdi_native_gpus_use_the_driver_minor_and_mount_the_libraries_found() {
    let spec: serde_json::Value =
        serde_json::from_str(&ok(&on_host("nvidia-minors", &["cdi", "generate"]))).unwrap();
    let devs = spec["devices"].as_array().unwrap();
    // PCI order 07, 0f, 47, 4e has minors 2, 0, 3, 1.
    let first: Vec<(String, String)> = devs
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap().to_string(),
                d["containerEdits"]["deviceNodes"][0]["path"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        first,
        [
            ("0000:07:00.0".into(), "/dev/nvidia2".into()),
            ("0000:0f:00.0".into(), "/dev/nvidia0".into()),
            ("0000:47:00.0".into(), "/dev/nvidia3".into()),
            ("0000:4e:00.0".into(), "/dev/nvidia1".into())
        ]
    );
    let mounts: Vec<&str> = devs[0]["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap())
        .collect();
    assert!(
        mounts.contains(&"/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        "{mounts:?}"
    );
    assert!(mounts.contains(&"/usr/bin/nvidia-smi"));
    assert!(mounts.contains(&"/var/run/nvidia-persistenced/socket"));
    assert!(
        !mounts.iter().any(|m| m.contains("i386")),
        "32-bit libraries are skipped"
    );
    assert!(
        !mounts.iter().any(|m| m.ends_with("libc.so.6")),
        "only driver libraries"
    );
    assert!(!mounts.iter().any(|m| m.ends_with(".so")), "no development links");
    for m in devs[0]["containerEdits"]["mounts"].as_array().unwrap() {
        assert_eq!(m["options"], serde_json::json!(["ro", "nosuid", "nodev", "bind"]));
    }
}

#[test]
fn cdi_version_and_kind_options() {
    // Pinning a newer version is allowed, an older one than needed is a usage error.
    let s: serde_json::Value = serde_json::from_str(&ok(&on_host(
        "vfio-numa",
        &["cdi", "generate", "--cdi-version", "0.6.0"],
    )))
    .unwrap();
    assert_eq!(s["cdiVersion"], "0.6.0");
    let o = on_host("vfio-numa", &["cdi", "generate", "--cdi-version", "0.4.0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("needs cdiVersion 0.5.0"), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
    for bad in [
        &["cdi", "generate", "--cdi-version", "0.9.9"][..],
        &["cdi", "generate", "--kind", "nope"],
        &["cdi", "generate", "--kind", "a/b c"],
        &["cdi", "generate", "--write", "--output", "/tmp/x"],
    ] {
        let o = on_host("vfio-numa", bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
    }
    let s: serde_json::Value = serde_json::from_str(&ok(&on_host(
        "vfio-numa",
        &["cdi", "generate", "--kind", "example.com/gpu.vfio"],
    )))
    .unwrap();
    assert_eq!(s["kind"], "example.com/gpu.vfio");
    assert_eq!(s["cdiVersion"], "0.6.0", "a '.' in the class needs 0.6.0");
    // --dev-root / --driver-root make host paths explicit.
    let s: serde_json::Value = serde_json::from_str(&ok(&on_host(
        "nvidia-minors",
        &[
            "cdi",
            "generate",
            "--dev-root",
            "/host/dev",
            "--driver-root",
            "/host",
        ],
    )))
    .unwrap();
    let d = &s["devices"][0]["containerEdits"];
    assert_eq!(
        d["deviceNodes"][0],
        serde_json::json!({"path": "/dev/nvidia2", "hostPath": "/host/dev/nvidia2"})
    );
    assert!(d["mounts"][0]["hostPath"]
        .as_str()
        .unwrap()
        .starts_with("/host/usr/"));
}

#[test]
fn cdi_nothing_to_describe_is_a_host_error() {
    let o = on_host("legacy-bridge", &["cdi", "generate"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("nothing to describe"), "{}", stderr(&o));
}

#[test]
fn cdi_output_file_and_from_json() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("spec.json");
    let o = on_host("vfio-numa", &["cdi", "generate", "--output", f.to_str().unwrap()]);
    ok(&o);
    let direct = ok(&on_host("vfio-numa", &["cdi", "generate"]));
    assert_eq!(std::fs::read_to_string(&f).unwrap(), direct);
    // From a saved inventory (driver files still come from --root).
    let inv = t.path().join("inv.json");
    std::fs::write(&inv, ok(&on_host("vfio-numa", &["list", "--all", "--json"]))).unwrap();
    let from = ok(&on_host(
        "vfio-numa",
        &["--from-json", inv.to_str().unwrap(), "cdi", "generate"],
    ));
    assert_eq!(from, direct);
}

#[test]
fn cdi_write_and_refresh_after_unbind() {
    let t = scratch_host("vfio-numa");
    let root = t.path().to_str().unwrap().to_string();
    let run = |args: &[&str]| {
        let mut all = vec!["--root", root.as_str()];
        all.extend_from_slice(args);
        gpupass(&all)
    };
    let spec_path = t.path().join("var/run/cdi/gpupass.json");
    // Refresh without a spec written before: nothing happens.
    gpupass::containers::cdi::refresh(&gpupass::testkit::FakeHost::new(gpupass::host::HostRoot::new(
        t.path(),
    )))
    .unwrap();
    assert!(!spec_path.exists());
    let o = run(&["cdi", "generate", "--write"]);
    assert!(ok(&o).contains("var/run/cdi/gpupass.json"));
    let before = std::fs::read_to_string(&spec_path).unwrap();
    assert!(before.contains("\"0000:31:00.0\""));
    // No temporary files are left beside it.
    let names: Vec<String> = std::fs::read_dir(t.path().join("var/run/cdi"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["gpupass.json"]);
    // Unbind 0000:31:00.0 the way the kernel shows it, then refresh (the bind hook's call).
    let dev = t.path().join("sys/bus/pci/devices/0000:31:00.0");
    std::fs::remove_file(dev.join("driver")).unwrap();
    std::fs::remove_file(t.path().join("dev/vfio/41")).unwrap();
    gpupass::containers::cdi::refresh(&gpupass::testkit::FakeHost::new(gpupass::host::HostRoot::new(
        t.path(),
    )))
    .unwrap();
    let after = std::fs::read_to_string(&spec_path).unwrap();
    assert!(
        !after.contains("\"0000:31:00.0\"") && !after.contains("group-41"),
        "{after}"
    );
    assert!(after.contains("\"0000:17:00.0\""));
}

#[test]
fn container_list_matches_golden() {
    for h in ["nvidia-minors", "hgx-8gpu", "vfio-numa", "workstation"] {
        golden(
            &format!("{h}/container-list.txt"),
            &ok(&on_host(h, &["container", "list"])),
        );
    }
    golden(
        "nvidia-minors/container-list.json",
        &ok(&on_host("nvidia-minors", &["container", "list", "--json"])),
    );
    // One GPU: the control nodes and only its own minor (07:00.0 has minor 2).
    let one = ok(&on_host(
        "nvidia-minors",
        &["container", "list", "--device", "07:00.0"],
    ));
    let nodes: Vec<&str> = one.lines().filter(|l| l.starts_with("/dev/")).collect();
    assert_eq!(
        nodes,
        [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset",
            "/dev/nvidia2"
        ]
    );
    // Without ld.so.cache (hgx-8gpu), the library directories are searched.
    let v: serde_json::Value =
        serde_json::from_str(&ok(&on_host("hgx-8gpu", &["container", "list", "--json"]))).unwrap();
    assert_eq!(v["library_source"], "library directories");
    assert_eq!(v["libraries"][1]["path"], "/usr/lib64/libcuda.so.1");
    assert_eq!(v["libraries"][1]["target"], "/usr/lib64/libcuda.so.535.183.01");
}

#[test]
fn container_list_errors() {
    let o = on_host("vfio-numa", &["container", "list", "--device", "17:00.0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("bound to vfio-pci"), "{}", stderr(&o));
    let o = on_host("vfio-numa", &["container", "list", "--device", "99:00.0"]);
    assert_eq!(o.status.code(), Some(1));
    let o = on_host("vfio-numa", &["container", "list", "--device", "zz"]);
    assert_eq!(o.status.code(), Some(2));
}

// ---------------------------------------------------------------- podman, a real CDI consumer

/// A busybox image imported into podman's store (once per tag).
fn busybox_image(tag: &str) {
    let t = tempfile::tempdir().unwrap();
    let rootfs = t.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    let bb = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox-static");
    std::fs::copy(bb, rootfs.join("bin/busybox")).unwrap();
    for tool in ["sh", "ls", "cat", "env", "stat", "test"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(tool)).unwrap();
    }
    let tar = t.path().join("rootfs.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let o = Command::new("podman")
        .args(["import", "--change", "CMD [\"/bin/sh\"]"])
        .arg(&tar)
        .arg(tag)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "podman import: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Removes the CDI specs the test put into /var/run/cdi.
struct SpecGuard(Vec<PathBuf>);
impl Drop for SpecGuard {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn podman_run(conf: &Path, devices: &[String], script: &str) -> std::process::Output {
    let mut c = Command::new("podman");
    c.env("CONTAINERS_CONF", conf).args(["run", "--rm"]);
    for d in devices {
        c.args(["--device", d]);
    }
    c.args(["localhost/gpupass-test-busybox:latest", "/bin/sh", "-c", script]);
    c.output().unwrap()
}

#[test]
fn podman_consumes_the_generated_specs() {
    if !need_tool("podman") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let conf = work.path().join("containers.conf");
    std::fs::write(
        &conf,
        "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\n[engine]\nruntime = \"runc\"\n",
    )
    .unwrap();
    busybox_image("localhost/gpupass-test-busybox:latest");

    // Stand-in device nodes (this machine has no VFIO devices): majors 240-242 are the
    // kernel's "local/experimental" range, unused here.
    let vfio = scratch_host("vfio-numa");
    let v = vfio.path();
    vfio_stand_in_nodes(v);
    mknod(&v.join("dev/nvidia0"), 195, 0);
    mknod(&v.join("dev/nvidiactl"), 195, 255);
    mknod(&v.join("dev/nvidia-uvm"), 242, 0);
    let native = scratch_host("nvidia-minors");
    let n = native.path();
    for m in 0..4 {
        mknod(&n.join(format!("dev/nvidia{m}")), 195, m);
    }
    mknod(&n.join("dev/nvidiactl"), 195, 255);
    mknod(&n.join("dev/nvidia-modeset"), 195, 254);
    mknod(&n.join("dev/nvidia-uvm"), 242, 0);
    mknod(&n.join("dev/nvidia-uvm-tools"), 242, 1);

    let pid = std::process::id();
    let kv = format!("gpupass-test.dev/v{pid}");
    let kn = format!("gpupass-test.dev/n{pid}");
    let spec_v = PathBuf::from(format!("/var/run/cdi/gpupass-test-v{pid}.json"));
    let spec_n = PathBuf::from(format!("/var/run/cdi/gpupass-test-n{pid}.json"));
    let _guard = SpecGuard(vec![spec_v.clone(), spec_n.clone()]);
    for (root, kind, out) in [(v, &kv, &spec_v), (n, &kn, &spec_n)] {
        let dev_root = root.join("dev");
        ok(&gpupass(&[
            "--root",
            root.to_str().unwrap(),
            "cdi",
            "generate",
            "--kind",
            kind,
            "--dev-root",
            dev_root.to_str().unwrap(),
            "--driver-root",
            root.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ]));
    }

    // One VFIO function through iommufd (the plain name under `auto`): its cdev and iommufd,
    // never the group or container node, and the env.
    let o = podman_run(
        &conf,
        &[format!("{kv}=0000:17:00.0")],
        "stat -c '%n %F %t %T' /dev/iommu /dev/vfio/devices/vfio0; \
         test -e /dev/vfio/41 && echo LEAK; test -e /dev/vfio/40 && echo MIXED; \
         test -e /dev/vfio/vfio && echo MIXED; env",
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "podman: {}\n{out}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("/dev/vfio/devices/vfio0 character special file f1 0"),
        "{out}"
    );
    assert!(out.contains("/dev/iommu character special file a 7b"), "{out}");
    assert!(!out.contains("LEAK"), "another group's node leaked in: {out}");
    assert!(!out.contains("MIXED"), "legacy nodes with the iommufd set: {out}");
    // The same function through the legacy backend, by its legacy- name.
    let o = podman_run(
        &conf,
        &[format!("{kv}=legacy-0000:17:00.0")],
        "stat -c '%n %F %t %T' /dev/vfio/vfio /dev/vfio/40; \
         test -e /dev/iommu && echo MIXED; test -e /dev/vfio/devices/vfio0 && echo MIXED; env",
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "podman: {}\n{out}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("/dev/vfio/40 character special file f0 28"), "{out}");
    assert!(
        out.contains("/dev/vfio/vfio character special file a c4"),
        "{out}"
    );
    assert!(!out.contains("MIXED"), "iommufd nodes with the legacy set: {out}");
    assert!(
        out.contains("PCI_RESOURCE_NVIDIA_COM_AD102GL_L40S=0000:17:00.0\n"),
        "{out}"
    );

    // A whole group by its group name: GPU + audio.
    let o = podman_run(
        &conf,
        &[format!("{kv}=group-42")],
        "stat -c '%n %t %T' /dev/vfio/devices/vfio4 /dev/vfio/devices/vfio5; env",
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "podman: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("/dev/vfio/devices/vfio5 f1 5"), "{out}");
    assert!(
        out.contains("PCI_RESOURCE_NVIDIA_COM_GA102GL_RTX_A6000=0000:4b:00.0"),
        "{out}"
    );
    assert!(out.contains("PCI_RESOURCE_NVIDIA_COM_GA102_HIGH_DEFINITION_AUDIO_CONTROLLER=0000:4b:00.1"));

    // A native GPU: its minor's node, the control nodes and the driver's files, read-only.
    let o = podman_run(
        &conf,
        &[format!("{kn}=0000:07:00.0")],
        "stat -c '%n %t %T' /dev/nvidia2 /dev/nvidiactl /dev/nvidia-uvm; \
         test -e /dev/nvidia0 && echo LEAK; cat /usr/lib/x86_64-linux-gnu/libcuda.so.1; \
         cat /usr/bin/nvidia-smi; echo x > /usr/lib/x86_64-linux-gnu/libcuda.so.1 || echo READONLY",
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "podman: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("/dev/nvidia2 c3 2"), "{out}");
    assert!(out.contains("/dev/nvidiactl c3 ff"), "{out}");
    assert!(!out.contains("LEAK"), "{out}");
    assert!(out.contains("fake libcuda 550.90.07"), "{out}");
    assert!(out.contains("echo fake nvidia-smi"), "{out}");
    assert!(out.contains("READONLY"), "{out}");

    // A name the spec does not have is refused by podman (the test can fail).
    let o = podman_run(&conf, &[format!("{kv}=0000:99:00.0")], "true");
    assert!(!o.status.success());
}
