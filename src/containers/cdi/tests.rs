//! How many times one request reads the host, counted by the test kit
//! (`inventory::counted`): a `gpupass bind` and a DRA Prepare and Unprepare, each on a host
//! where `cdi generate --write` recorded a spec, so the refresh that follows the change runs.
//! `benches/scans.sh` runs these and prints the figures (docs/performance.md, "Host reads per
//! request").

use super::*;
use crate::inventory::counted::scans;
use crate::testkit::hostgen::{DevSpec, HostBuilder};
use crate::testkit::FakeHost;

/// The lab's IOMMU group 4: a VGA function on bochs-drm and its audio companion.
fn group4(root: &std::path::Path) {
    let mut h = HostBuilder::new(root).unwrap();
    h.kernel("6.1.0-57-amd64", "intel_iommu=on", &["bochs", "snd_hda_intel"])
        .unwrap();
    h.add(
        &DevSpec::new("00:05.0", 0x1234, 0x1111, 0x030000)
            .group(4)
            .driver("bochs-drm"),
    )
    .unwrap();
    h.add(
        &DevSpec::new("00:05.1", 0x8086, 0x293e, 0x040300)
            .group(4)
            .driver("snd_hda_intel"),
    )
    .unwrap();
    h.file("dev/vfio/vfio", "").unwrap();
}

/// The full scans and group scans since `start`.
fn since(start: (usize, usize)) -> (usize, usize) {
    let now = scans();
    (now.0 - start.0, now.1 - start.1)
}

fn spec(root: &std::path::Path) -> String {
    std::fs::read_to_string(root.join("var/run/cdi/gpupass.json")).unwrap_or_default()
}

/// `cdi generate --write --watch`'s record: nothing on VFIO yet, the options kept for the
/// first refresh that has a device.
fn record_spec(ops: &dyn HostOps) {
    write(ops, &cdi::Options::default(), true, false).unwrap();
    assert!(spec(ops.root().root()).is_empty());
}

#[test]
fn a_bind_reads_its_groups_once_and_the_whole_host_once_for_the_refresh() {
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
    let a = crate::bind::apply::bind_then(&ops, &req, false, false, &|_| {}, &mut Refresh).unwrap();
    let (full, groups) = since(start);
    println!("scans: bind: full {full}, groups {groups}");
    assert!(a.outcome.is_some());
    assert!(spec(&root).contains("\"0000:00:05.0\""), "the refresh ran");
    assert_eq!((full, groups), (1, 1));
}

#[cfg(feature = "dra")]
#[test]
fn a_dra_prepare_reads_the_whole_host_once_after_its_writes_and_its_refresh_health_and_slices_reuse_it() {
    use crate::containers::dra::claim::{ClaimRef, Identity};
    use crate::containers::dra::prepare::Driver;
    use crate::containers::kubelet::claims::{fetch, Dir};
    use crate::containers::kubelet::plugin::DraDriver;
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
    let mut nope = c.clone();
    nope["metadata"] = serde_json::json!({"name": "nope", "namespace": "default", "uid": "u2"});
    nope["status"]["allocation"]["devices"]["results"][0]["device"] = "pci-0000-00-09-0".into();
    std::fs::write(claims.join("default/nope.json"), nope.to_string()).unwrap();
    let ops = FakeHost::new(HostRoot::new(&root));
    record_spec(&ops);
    let mut e = Driver::new(
        &ops,
        Identity {
            driver: DRIVER.into(),
            node: "node-a".into(),
            pool: "node-a".into(),
        },
        crate::inventory::backend::Policy::Auto,
        "b1".into(),
    )
    .unwrap();
    let claim = ClaimRef {
        namespace: "default".into(),
        uid: "u1".into(),
        name: "gpu".into(),
    };
    // The kubelet-plugin kit reads the claim (the API server's, no host read) and hands it on.
    let refused = ClaimRef {
        namespace: "default".into(),
        uid: "u2".into(),
        name: "nope".into(),
    };
    let refused = fetch(&Dir { dir: claims.clone() }, &refused).unwrap();
    let claim = fetch(&Dir { dir: claims }, &claim).unwrap();
    // A claim refused by its checks: the host read for them is the one the refresh uses.
    let start = scans();
    let err = e.prepare(&refused).unwrap_err().to_string();
    assert!(err.contains("pci-0000-00-09-0"), "{err}");
    e.resources().unwrap();
    assert_eq!(since(start), (1, 0));
    // As the kit serves a call: the call, then the driver's resources (health and slices).
    let start = scans();
    e.prepare(&claim).unwrap();
    let r = e.resources().unwrap();
    let (full, groups) = since(start);
    println!("scans: DRA Prepare: full {full}, groups {groups}");
    assert!(spec(&root).contains("\"0000:00:05.0\""), "the refresh ran");
    assert!(
        r.health
            .iter()
            .any(|h| h.device == "pci-0000-00-05-0" && h.healthy),
        "{:?}",
        r.health
    );
    // The claim is checked against the host the last refresh published from (no read); the
    // bind's group scan; the host after the bind, for the claim's files, the CDI refresh, the
    // health and the slices.
    assert_eq!((full, groups), (1, 1));
    // The next refresh (a poll, a uevent) reads the host again.
    let start = scans();
    assert_eq!(e.resources().unwrap(), r);
    assert_eq!(since(start), (1, 0));
    let start = scans();
    e.unprepare("u1").unwrap();
    let r = e.resources().unwrap();
    let (full, groups) = since(start);
    println!("scans: DRA Unprepare: full {full}, groups {groups}");
    assert!(!spec(&root).contains("\"0000:00:05.0\""), "the refresh ran");
    assert!(
        r.health
            .iter()
            .any(|h| h.device == "pci-0000-00-05-0" && h.healthy),
        "{:?}",
        r.health
    );
    // The unbind's groups, then the host after it (the refresh, the health and the slices).
    assert_eq!((full, groups), (1, 1));
}
