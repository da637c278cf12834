//! Bind, unbind and mdev changes refresh the CDI spec gpupass wrote, so it never goes stale.

use crate::util::*;

fn run(root: &str, args: &[&str]) -> std::process::Output {
    let mut a = vec!["--root", root];
    a.extend_from_slice(args);
    fake_kernel(&a).output().unwrap()
}

fn spec(t: &tempfile::TempDir) -> serde_json::Value {
    let p = t.path().join("var/run/cdi/gpupass.json");
    serde_json::from_str(&std::fs::read_to_string(&p).expect("spec written")).unwrap()
}

fn names(v: &serde_json::Value) -> Vec<String> {
    v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn bind_and_unbind_refresh_the_written_spec() {
    let t = scratch_host("workstation");
    let root = t.path().to_str().unwrap();
    ok(&run(root, &["cdi", "generate", "--write"]));
    let before = names(&spec(&t));
    assert!(!before.iter().any(|n| n == "group-1"), "{before:?}");
    ok(&run(root, &["bind", "01:00.0"]));
    let after = names(&spec(&t));
    assert!(
        after.iter().any(|n| n == "group-1"),
        "bind did not refresh the spec: {after:?}"
    );
    assert!(after.iter().any(|n| n == "0000:01:00.0"), "{after:?}");
    ok(&run(root, &["unbind", "01:00.0"]));
    let back = names(&spec(&t));
    assert!(
        !back.iter().any(|n| n == "group-1"),
        "unbind did not refresh the spec: {back:?}"
    );
}

#[test]
fn mdev_create_and_remove_refresh_the_written_spec() {
    let t = scratch_host("mdev-t4");
    let root = t.path().to_str().unwrap();
    ok(&run(root, &["cdi", "generate", "--write"]));
    let u = "11111111-2222-4333-8444-555555555555";
    ok(&run(
        root,
        &[
            "mdev",
            "create",
            "--parent",
            "3b:00.0",
            "--type",
            "nvidia-222",
            "--uuid",
            u,
        ],
    ));
    assert!(names(&spec(&t)).iter().any(|n| n == u), "{:?}", names(&spec(&t)));
    ok(&run(root, &["mdev", "remove", u]));
    assert!(!names(&spec(&t)).iter().any(|n| n == u));
}

#[test]
fn no_spec_written_means_no_spec_created() {
    let t = scratch_host("workstation");
    let root = t.path().to_str().unwrap();
    ok(&run(root, &["bind", "01:00.0"]));
    assert!(!t.path().join("var/run/cdi/gpupass.json").exists());
}
