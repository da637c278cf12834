//! `benches/scans.sh --before` (not a bench target: cargo discovers only `benches/*.rs`): the requests of `src/containers/cdi/tests.rs` through the API
//! before the engine change (9eecfb21: the CDI refresh in `cli::cdi`, after its own lock, as
//! `cli::bind::after_change` and the DRA plugin's `with_after_change` called it), counted by
//! the same test-kit counter (`inventory::counted`). Copied into that tree by the script;
//! not part of this crate's build.

use crate::host::ops::HostOps;
use crate::host::HostRoot;
use crate::inventory::counted::scans;
use crate::testkit::hostgen::{DevSpec, HostBuilder};
use crate::testkit::FakeHost;

fn group4(root: &std::path::Path) {
    let mut h = HostBuilder::new(root).unwrap();
    h.kernel("6.1.0-57-amd64", "intel_iommu=on", &["bochs", "snd_hda_intel"])
        .unwrap();
    h.add(&DevSpec::new("00:05.0", 0x1234, 0x1111, 0x030000).group(4).driver("bochs-drm"))
        .unwrap();
    h.add(&DevSpec::new("00:05.1", 0x8086, 0x293e, 0x040300).group(4).driver("snd_hda_intel"))
        .unwrap();
    h.file("dev/vfio/vfio", "").unwrap();
}

fn since(start: (usize, usize)) -> (usize, usize) {
    let now = scans();
    (now.0 - start.0, now.1 - start.1)
}

fn spec(root: &std::path::Path) -> String {
    std::fs::read_to_string(root.join("var/run/cdi/gpupass.json")).unwrap_or_default()
}

fn record_spec(ops: &dyn HostOps) {
    let host = ops.root();
    let inv = crate::inventory::scan(host).unwrap();
    let files = crate::inventory::native::discover(host);
    let opts = crate::output::cdi::Options::default();
    let (part, _) = crate::cli::cdi::spec_part(host, &inv, &files, &opts, true).unwrap();
    crate::change::apply(ops, &crate::change::Plan::of(part)).unwrap();
}

#[test]
fn bind() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("host");
    group4(&root);
    let ops = FakeHost::new(HostRoot::new(&root));
    record_spec(&ops);
    let req = crate::bind::BindRequest {
        addresses: vec!["0000:00:05.0".parse().unwrap()],
        only: false,
        driver: None,
    };
    let start = scans();
    crate::bind::apply::bind(&ops, &req, false, false, &|_| {}).unwrap();
    crate::cli::cdi::refresh(&ops).unwrap();
    let (full, groups) = since(start);
    println!("scans: bind: full {full}, groups {groups}");
    assert!(spec(&root).contains("\"0000:00:05.0\""));
}

#[test]
fn dra() {
    use crate::containers::dra::claim::{ClaimRef, Identity};
    use crate::containers::dra::prepare::Engine;
    const DRIVER: &str = "vfio.gpupass.dev";
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("host");
    group4(&root);
    let claims = t.path().join("claims");
    std::fs::create_dir_all(claims.join("default")).unwrap();
    let c = serde_json::json!({
        "metadata": {"name": "gpu", "namespace": "default", "uid": "u1"},
        "status": {"allocation": {
            "devices": {"results": [{"request": "vfio", "driver": DRIVER, "pool": "node-a", "device": "pci-0000-00-05-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}
        }}
    });
    std::fs::write(claims.join("default/gpu.json"), c.to_string()).unwrap();
    let ops = FakeHost::new(HostRoot::new(&root));
    record_spec(&ops);
    let me = Identity {
        driver: DRIVER.into(),
        node: "node-a".into(),
        pool: "node-a".into(),
    };
    let mut e = Engine::new(
        &ops,
        Box::new(crate::containers::dra::source::Dir { dir: claims }),
        me,
        crate::inventory::backend::Policy::Auto,
        "b1".into(),
    )
    .unwrap()
    .with_after_change(|ops, wait| crate::cli::cdi::refresh_within(ops, wait).map_err(|e| e.to_string()));
    let claim = ClaimRef {
        namespace: "default".into(),
        uid: "u1".into(),
        name: "gpu".into(),
    };
    let start = scans();
    e.prepare(&claim).unwrap();
    let (full, groups) = since(start);
    println!("scans: DRA Prepare: full {full}, groups {groups}");
    assert!(spec(&root).contains("\"0000:00:05.0\""));
    let start = scans();
    e.unprepare("u1").unwrap();
    let (full, groups) = since(start);
    println!("scans: DRA Unprepare: full {full}, groups {groups}");
}
