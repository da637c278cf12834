use super::*;
use serde_json::json;

/// KEP-5304: every rewrite of a metadata file bumps `metadata.generation`; the same content
/// is no rewrite; a CDI spec is not touched.
#[test]
fn a_rewritten_metadata_file_gets_the_next_generation() {
    let doc = |v: &str, g: i64, backend: &str| {
        serde_json::to_string(&json!({
                "kind": "DeviceMetadata", "apiVersion": v,
                "metadata": {"name": "gpu", "namespace": "default", "uid": "u1", "generation": g},
                "requests": [{"name": "vfio", "devices": [{"attributes": {"gpupass.dev/backend": {"string": backend}}}]}],
            }))
            .unwrap()
    };
    let stream = |g: i64, backend: &str| {
        METADATA_VERSIONS
            .iter()
            .map(|v| doc(v, g, backend) + "\n")
            .collect::<String>()
    };
    let gens = |s: &str| -> Vec<i64> {
        metadata_stream(s)
            .unwrap()
            .iter()
            .map(|d| d["metadata"]["generation"].as_i64().unwrap())
            .collect()
    };
    let new = stream(1, "iommufd");
    assert_eq!(next_metadata(None, &new), new, "a new file: generation 1");
    assert_eq!(next_metadata(Some(&new), &new), new, "the same: no rewrite");
    let once = next_metadata(Some(&stream(1, "legacy")), &new);
    assert_eq!(gens(&once), [2, 2]);
    assert_eq!(once, stream(2, "iommufd"));
    let again = next_metadata(Some(&once), &stream(1, "legacy"));
    assert_eq!(gens(&again), [3, 3]);
    assert_eq!(
        next_metadata(Some(&again), &stream(1, "legacy")),
        again,
        "kept at 3"
    );
    assert_eq!(next_metadata(Some("garbage"), &new), new);
    let spec = r#"{"cdiVersion":"0.6.0","kind":"vfio.gpupass.dev/claim","devices":[]}"#;
    assert_eq!(next_metadata(Some(spec), spec), spec);
}

fn me() -> Identity {
    Identity {
        driver: "vfio.gpupass.dev".into(),
        node: "node-a".into(),
        pool: "node-a".into(),
    }
}

fn offered() -> Offered {
    Offered {
        groups: vec![Publishable {
            name: "pci-0000-00-05-0".into(),
            group: 4,
            lead: "0000:00:05.0".parse().unwrap(),
            members: vec!["0000:00:05.0".parse().unwrap(), "0000:00:05.1".parse().unwrap()],
        }],
        slots: Vec::new(),
    }
}

fn asked() -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        uid: "3f1c-uid".into(),
        name: "gpu".into(),
    }
}

/// A claim as the API server returns it, allocated to node-a's pool; `config` is the
/// allocation's config list.
fn claim(device: &str, config: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gpu", "namespace": "default", "uid": "3f1c-uid"},
            "spec": {"devices": {"requests": [{"name": "vfio", "exactly": {"deviceClassName": "vfio.gpupass.dev"}}]}},
            "status": {"allocation": {
                "devices": {
                    "results": [{"request": "vfio", "driver": "vfio.gpupass.dev", "pool": "node-a", "device": device}],
                    "config": config,
                },
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
                ]}]}
            }}
        }))
        .unwrap()
}

fn ours(params: serde_json::Value) -> serde_json::Value {
    json!([{"source": "FromClaim", "opaque": {"driver": "vfio.gpupass.dev", "parameters": params}}])
}

#[test]
fn a_good_claim_passes_with_the_whole_group() {
    let c = check(
        &asked(),
        &claim("pci-0000-00-05-0", json!([])),
        &me(),
        &offered(),
        Policy::Auto,
    )
    .unwrap();
    assert_eq!(c.devices.len(), 1);
    assert_eq!(c.devices[0].members.len(), 2);
    assert_eq!(c.policy, BackendPolicy::PreferIommufd);
}

#[test]
fn a_uid_that_is_not_the_one_asked_is_refused() {
    let mut a = asked();
    a.uid = "other".into();
    let e = check(
        &a,
        &claim("pci-0000-00-05-0", json!([])),
        &me(),
        &offered(),
        Policy::Auto,
    )
    .unwrap_err();
    assert!(matches!(e, ClaimError::UidMismatch { .. }), "{e}");
}

#[test]
fn another_node_or_pool_or_driver_is_refused() {
    let mut other = me();
    other.node = "node-b".into();
    let e = check(
        &asked(),
        &claim("pci-0000-00-05-0", json!([])),
        &other,
        &offered(),
        Policy::Auto,
    )
    .unwrap_err();
    assert!(
        matches!(e, ClaimError::WrongNode { ref found, .. } if found == "node-a"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("is allocated to node(s) node-a, not to this node node-b"),
        "{e}"
    );

    let mut c = claim("pci-0000-00-05-0", json!([]));
    let r = &mut c
        .status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap()[0];
    r.pool = "node-b".into();
    let e = check(&asked(), &c, &me(), &offered(), Policy::Auto).unwrap_err();
    assert!(matches!(e, ClaimError::ForeignPool { .. }), "{e}");

    let mut c = claim("pci-0000-00-05-0", json!([]));
    let r = &mut c
        .status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap()[0];
    r.driver = "gpu.nvidia.com".into();
    let e = check(&asked(), &c, &me(), &offered(), Policy::Auto).unwrap_err();
    assert!(matches!(e, ClaimError::NoDevices { .. }), "{e}");
}

#[test]
fn uids_and_request_names_that_could_leave_a_directory_are_refused() {
    let mut a = asked();
    a.uid = "../../etc/x".into();
    let e = check(
        &a,
        &claim("pci-0000-00-05-0", json!([])),
        &me(),
        &offered(),
        Policy::Auto,
    )
    .unwrap_err();
    assert!(e.to_string().contains("is not a Kubernetes name"), "{e}");
    for bad in ["../x", "a/../b", "", "a b"] {
        let mut c = claim("pci-0000-00-05-0", json!([]));
        c.status
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
            .results
            .as_mut()
            .unwrap()[0]
            .request = bad.into();
        let e = check(&asked(), &c, &me(), &offered(), Policy::Auto).unwrap_err();
        assert!(
            matches!(
                e,
                ClaimError::BadName {
                    what: "request name",
                    ..
                }
            ),
            "{bad}: {e}"
        );
    }
    // A subrequest (`request/sub`) is fine.
    let mut c = claim("pci-0000-00-05-0", json!([]));
    c.status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap()[0]
        .request = "vfio/big".into();
    assert!(check(&asked(), &c, &me(), &offered(), Policy::Auto).is_ok());
}

#[test]
fn a_device_name_that_is_not_ours_is_refused() {
    for name in ["pci-0000-00-06-0", "../../etc", "gpu-0"] {
        let e = check(&asked(), &claim(name, json!([])), &me(), &offered(), Policy::Auto).unwrap_err();
        assert!(matches!(e, ClaimError::UnknownDevice { .. }), "{e}");
    }
}

#[test]
fn unallocated_deleting_and_admin_access_claims_are_refused() {
    let mut c = claim("pci-0000-00-05-0", json!([]));
    c.status = None;
    assert!(matches!(
        check(&asked(), &c, &me(), &offered(), Policy::Auto),
        Err(ClaimError::NotAllocated { .. })
    ));

    let mut c: ResourceClaim = claim("pci-0000-00-05-0", json!([]));
    c.metadata.deletion_timestamp = serde_json::from_value(json!("2026-12-03T00:00:00Z")).unwrap();
    assert!(matches!(
        check(&asked(), &c, &me(), &offered(), Policy::Auto),
        Err(ClaimError::Deleting { .. })
    ));

    let mut c = claim("pci-0000-00-05-0", json!([]));
    c.status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap()[0]
        .admin_access = Some(true);
    assert!(matches!(
        check(&asked(), &c, &me(), &offered(), Policy::Auto),
        Err(ClaimError::AdminAccess { .. })
    ));
}

#[test]
fn the_opaque_config_sets_the_policy_and_unknown_fields_or_values_are_errors() {
    let ok = |p: serde_json::Value| {
        check(
            &asked(),
            &claim("pci-0000-00-05-0", ours(p)),
            &me(),
            &offered(),
            Policy::Auto,
        )
    };
    let c = ok(
        json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "backendPolicy": "require-iommufd"}),
    )
    .unwrap();
    assert_eq!(c.policy, BackendPolicy::RequireIommufd);
    let c = ok(json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "backendPolicy": "legacy"}))
        .unwrap();
    assert_eq!(c.policy, BackendPolicy::Legacy);
    for bad in [
        json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "backendPolicy": "LegacyOnly"}),
        json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "backend": "legacy"}),
        json!({"apiVersion": "gpupass.dev/v2", "kind": CONFIG_KIND}),
        json!({"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig"}),
        json!("legacy"),
    ] {
        let e = ok(bad.clone()).unwrap_err();
        assert!(matches!(e, ClaimError::Config { .. }), "{bad}: {e}");
        assert!(
            e.to_string()
                .contains("opaque configuration for vfio.gpupass.dev: "),
            "{e}"
        );
    }
    // Another driver's config is not ours to judge.
    let other = json!([{"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"whatever": 1}}}]);
    assert!(check(
        &asked(),
        &claim("pci-0000-00-05-0", other),
        &me(),
        &offered(),
        Policy::Legacy
    )
    .is_ok());
}

#[test]
fn the_claims_config_overrides_the_class_one() {
    let cfg = json!([
        {"source": "FromClass", "opaque": {"driver": "vfio.gpupass.dev", "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "backendPolicy": "legacy"}}},
        {"source": "FromClaim", "requests": ["vfio"], "opaque": {"driver": "vfio.gpupass.dev", "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "backendPolicy": "require-iommufd"}}},
    ]);
    let c = check(
        &asked(),
        &claim("pci-0000-00-05-0", cfg),
        &me(),
        &offered(),
        Policy::Auto,
    )
    .unwrap();
    assert_eq!(c.policy, BackendPolicy::RequireIommufd);
}

#[test]
fn kvm_comes_from_the_class_or_the_claim_and_adds_dev_kvm_once() {
    let cfg = |class: serde_json::Value, claim_p: serde_json::Value| {
        json!([
            {"source": "FromClass", "opaque": {"driver": "vfio.gpupass.dev", "parameters": class}},
            {"source": "FromClaim", "opaque": {"driver": "vfio.gpupass.dev", "parameters": claim_p}},
        ])
    };
    let base = json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND});
    let run = |c: serde_json::Value| {
        check(
            &asked(),
            &claim("pci-0000-00-05-0", c),
            &me(),
            &offered(),
            Policy::Auto,
        )
    };
    // No config: no /dev/kvm.
    assert!(!run(json!([])).unwrap().kvm);
    // A class that says kvm (the shipped vm.vfio.gpupass.dev), a claim that sets only the
    // backend: both hold.
    let c = run(cfg(
        json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "kvm": true}),
        json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "backendPolicy": "legacy"}),
    ))
    .unwrap();
    assert!(c.kvm);
    assert_eq!(c.policy, BackendPolicy::Legacy);
    // The claim's own kvm: false overrides the class's.
    let c = run(cfg(
        json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "kvm": true}),
        json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "kvm": false}),
    ))
    .unwrap();
    assert!(!c.kvm);
    // Not a boolean: refused, with the expected shape.
    let e = run(cfg(
        base.clone(),
        json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "kvm": "yes"}),
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("\"kvm\": true | false"), "{e}");

    // The per-claim CDI spec: /dev/kvm once, in the spec's own edits.
    let t = tempfile::tempdir().unwrap();
    crate::testkit::fixtures::build("workstation", t.path()).unwrap();
    let inv = crate::inventory::scan(&crate::host::HostRoot::new(t.path())).unwrap();
    let mut with = run(ours(
        json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "kvm": true}),
    ))
    .unwrap();
    let spec = |c: &Checked| -> serde_json::Value {
        serde_json::from_str(&result(&inv, "vfio.gpupass.dev", c, Backend::Legacy).files[0].contents).unwrap()
    };
    let s = spec(&with);
    assert_eq!(
        s["containerEdits"]["deviceNodes"],
        json!([{"path": "/dev/kvm"}]),
        "{s}"
    );
    with.kvm = false;
    let s = spec(&with);
    assert!(
        s["containerEdits"]
            .get("deviceNodes")
            .is_none_or(|n| n == &json!([])),
        "{s}"
    );
    assert!(!s.to_string().contains("/dev/kvm"), "{s}");

    // A node without /dev/kvm refuses the claim before anything is written; so does a
    // /dev/kvm that is not a character device.
    with.kvm = true;
    let host = crate::host::HostRoot::new(t.path());
    let _ = std::fs::remove_file(t.path().join("dev/kvm"));
    let e = precheck_kvm(&host, &with).unwrap_err().to_string();
    assert!(
        e.contains("asks for /dev/kvm (opaque config kvm: true), but this node has no /dev/kvm"),
        "{e}"
    );
    std::fs::create_dir_all(t.path().join("dev")).unwrap();
    std::fs::write(t.path().join("dev/kvm"), "").unwrap();
    let e = precheck_kvm(&host, &with).unwrap_err().to_string();
    assert!(e.contains("is not a character device"), "{e}");
    with.kvm = false;
    assert!(precheck_kvm(&host, &with).is_ok());
}

#[test]
fn one_claim_gets_one_backend_policy() {
    let mut c = claim(
        "pci-0000-00-05-0",
        json!([
            {"source": "FromClaim", "requests": ["other"], "opaque": {"driver": "vfio.gpupass.dev", "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "backendPolicy": "legacy"}}},
        ]),
    );
    let second = Publishable {
        name: "pci-0000-00-06-0".into(),
        group: 5,
        lead: "0000:00:06.0".parse().unwrap(),
        members: vec!["0000:00:06.0".parse().unwrap()],
    };
    let mut offered = offered();
    offered.groups.push(second);
    let results = c
        .status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap();
    let mut r2 = results[0].clone();
    r2.request = "other".into();
    r2.device = "pci-0000-00-06-0".into();
    results.push(r2);
    let e = check(&asked(), &c, &me(), &offered, Policy::Auto).unwrap_err();
    assert!(matches!(e, ClaimError::MixedPolicies { .. }), "{e}");
    assert!(
        e.to_string().contains(
            "its requests ask for different backend policies (other: legacy, vfio: prefer-iommufd)"
        ),
        "{e}"
    );
    // The same policy for both requests is fine.
    assert_eq!(
        check(&asked(), &c, &me(), &offered, Policy::Legacy)
            .unwrap()
            .policy,
        BackendPolicy::Legacy
    );
}

#[test]
fn paths_follow_the_kubelet_framework() {
    let c = check(
        &asked(),
        &claim("pci-0000-00-05-0", json!([])),
        &me(),
        &offered(),
        Policy::Auto,
    )
    .unwrap();
    assert_eq!(
        metadata_host_path("vfio.gpupass.dev", &c.claim, "vfio"),
        "/var/lib/kubelet/plugins/vfio.gpupass.dev/dra-device-metadata/default_gpu/vfio/metadata.json"
    );
    assert_eq!(
        metadata_container_path("vfio.gpupass.dev", &c, "vfio"),
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/gpu/vfio/vfio.gpupass.dev-metadata.json"
    );
    let mut t = c.clone();
    t.pod_claim_name = Some("passthrough".into());
    assert_eq!(
            metadata_container_path("vfio.gpupass.dev", &t, "vfio"),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/passthrough/vfio/vfio.gpupass.dev-metadata.json"
        );
}
