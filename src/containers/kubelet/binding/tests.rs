use super::*;
use serde_json::json;

fn conds() -> Conditions {
    Conditions {
        ready: "gpupass.dev/GroupBound".into(),
        failed: "gpupass.dev/GroupBindFailed".into(),
    }
}

fn claim(results: serde_json::Value, devices: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "default", "uid": "u1"},
        "spec": {},
        "status": {
            "allocation": {"devices": {"results": results}},
            "devices": devices,
        }
    }))
    .unwrap()
}

fn result(device: &str, bc: bool) -> serde_json::Value {
    let mut r = json!({"request": "vfio", "driver": "vfio.gpupass.dev", "pool": "node-a", "device": device});
    if bc {
        r["bindingConditions"] = json!(["gpupass.dev/GroupBound"]);
        r["bindingFailureConditions"] = json!(["gpupass.dev/GroupBindFailed"]);
    }
    r
}

fn status(device: &str, t: &str, s: &str) -> serde_json::Value {
    json!({"driver": "vfio.gpupass.dev", "pool": "node-a", "device": device, "conditions": [
        {"type": t, "status": s, "reason": "R", "message": "", "lastTransitionTime": "2026-12-06T00:00:00Z"}
    ]})
}

fn key(device: &str) -> DeviceKey {
    DeviceKey {
        request: "vfio".into(),
        pool: "node-a".into(),
        device: device.into(),
    }
}

/// Only devices of this driver in this pool that wait on its condition and have no outcome
/// yet are worked on; a True condition or failure ends it; other pools, unallocated and
/// deleting claims are not here.
#[test]
fn a_device_waiting_on_our_condition_without_an_outcome_is_bound() {
    let c = conds();
    let w = |cl: &ResourceClaim| want(cl, "vfio.gpupass.dev", "node-a", &c);
    assert_eq!(
        w(&claim(
            json!([result("pci-a", true), result("pci-b", false)]),
            json!([])
        )),
        Want::Bind(vec![key("pci-a")])
    );
    assert_eq!(
        w(&claim(json!([result("pci-b", false)]), json!([]))),
        Want::Nothing
    );
    assert_eq!(
        w(&claim(
            json!([result("pci-a", true)]),
            json!([status("pci-a", "gpupass.dev/GroupBound", "True")])
        )),
        Want::Nothing
    );
    assert_eq!(
        w(&claim(
            json!([result("pci-a", true)]),
            json!([status("pci-a", "gpupass.dev/GroupBindFailed", "True")])
        )),
        Want::Nothing
    );
    // A False condition (the failure's companion) is no outcome of a new allocation.
    assert_eq!(
        w(&claim(
            json!([result("pci-a", true)]),
            json!([status("pci-a", "gpupass.dev/GroupBound", "False")])
        )),
        Want::Bind(vec![key("pci-a")])
    );
    let mut other = result("pci-a", true);
    other["pool"] = json!("node-b");
    assert_eq!(w(&claim(json!([other]), json!([]))), Want::NotHere);
    let mut deleting = claim(json!([result("pci-a", true)]), json!([]));
    deleting.metadata.deletion_timestamp = serde_json::from_value(json!("2026-12-06T00:00:00Z")).unwrap();
    assert_eq!(w(&deleting), Want::NotHere);
    let unallocated: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "default", "uid": "u1"}, "spec": {}
    }))
    .unwrap();
    assert_eq!(w(&unallocated), Want::NotHere);
}

/// The apply body names only this driver's entries; success sets the binding condition,
/// a failure sets the failure condition True and the binding condition False with the
/// reason, and long messages are cut.
#[test]
fn the_status_apply_sets_one_outcome_per_device() {
    let c = conds();
    let r = ClaimRef {
        namespace: "default".into(),
        name: "c".into(),
        uid: "u1".into(),
    };
    let ok = status_apply(
        &r,
        "vfio.gpupass.dev",
        &[key("pci-a")],
        &Ok("bound".into()),
        &c,
        "T",
    );
    assert_eq!(ok["kind"], "ResourceClaim");
    assert_eq!(ok["metadata"]["name"], "c");
    let d = &ok["status"]["devices"][0];
    assert_eq!(
        (d["driver"].as_str(), d["pool"].as_str(), d["device"].as_str()),
        (Some("vfio.gpupass.dev"), Some("node-a"), Some("pci-a"))
    );
    assert_eq!(d["conditions"].as_array().unwrap().len(), 1);
    assert_eq!(d["conditions"][0]["type"], "gpupass.dev/GroupBound");
    assert_eq!(d["conditions"][0]["status"], "True");
    assert_eq!(d["conditions"][0]["lastTransitionTime"], "T");
    let long = "é".repeat(MAX_MESSAGE);
    let f = Failure {
        reason: "InUse".into(),
        message: long,
    };
    let bad = status_apply(
        &r,
        "vfio.gpupass.dev",
        &[key("pci-a"), key("pci-b")],
        &Err(f),
        &c,
        "T",
    );
    let ds = bad["status"]["devices"].as_array().unwrap();
    assert_eq!(ds.len(), 2);
    let cs = ds[1]["conditions"].as_array().unwrap();
    assert_eq!(cs[0]["type"], "gpupass.dev/GroupBindFailed");
    assert_eq!(cs[0]["status"], "True");
    assert_eq!(cs[0]["reason"], "InUse");
    assert_eq!(cs[1]["type"], "gpupass.dev/GroupBound");
    assert_eq!(cs[1]["status"], "False");
    assert!(cs[0]["message"].as_str().unwrap().len() <= MAX_MESSAGE);
}
