use super::*;

#[test]
fn kinds_and_versions_parse() {
    assert_eq!(Kind::default().to_string(), "gpupass.dev/pci");
    assert!("a.b/c-d".parse::<Kind>().is_ok());
    for bad in [
        "",
        "pci",
        "/pci",
        "gpupass.dev/",
        "1x/pci",
        "x/pci-",
        "x/p ci",
        "x/p/ci",
    ] {
        assert!(bad.parse::<Kind>().is_err(), "{bad}");
    }
    assert_eq!("0.5.0".parse::<CdiVersion>().unwrap(), CdiVersion(0, 5, 0));
    assert_eq!("v1.1.0".parse::<CdiVersion>().unwrap(), CdiVersion(1, 1, 0));
    for bad in ["0.2.0", "0.5", "1.2.0", "x", ""] {
        assert!(bad.parse::<CdiVersion>().is_err(), "{bad}");
    }
}

/// Every fixture host, every policy: one node set per CDI device; a mixed set is refused.
#[test]
fn one_backend_per_device() {
    let dir = tempfile::tempdir().unwrap();
    for name in crate::testkit::fixtures::NAMES {
        let root = dir.path().join(name);
        crate::testkit::fixtures::build(name, &root).unwrap();
        let inv = crate::inventory::scan(&HostRoot::new(&root)).unwrap();
        for policy in [Policy::Legacy, Policy::Iommufd, Policy::Auto] {
            let opts = Options {
                backend: policy,
                ..Options::default()
            };
            let Ok(r) = render(&inv, &DriverFiles::default(), &opts) else {
                continue;
            };
            check_backends(&r.spec.devices).unwrap();
            for d in &r.spec.devices {
                let paths = d.container_edits.device_nodes.iter().map(|n| n.path.as_str());
                let b = backend::check_one_backend(paths).unwrap();
                match (policy, b) {
                    (Policy::Legacy, Some(Backend::Iommufd)) | (Policy::Iommufd, Some(Backend::Legacy)) => {
                        panic!("{name} {policy}: {} carries {b:?}", d.name)
                    }
                    _ => {}
                }
            }
        }
    }
    let mixed = Device {
        name: "0000:01:00.0".into(),
        container_edits: ContainerEdits {
            env: Vec::new(),
            device_nodes: [
                "/dev/vfio/vfio",
                "/dev/vfio/1",
                "/dev/iommu",
                "/dev/vfio/devices/vfio0",
            ]
            .iter()
            .map(|p| Options::default().node(p))
            .collect(),
            mounts: Vec::new(),
        },
    };
    let e = check_backends(&[mixed]).unwrap_err().to_string();
    assert!(e.contains("mixed VFIO backends"), "{e}");
}

/// vfio-numa (6.8, cdev + iommufd): auto gives iommufd under the plain names and both
/// backends under legacy-/iommufd- names; legacy gives today's legacy set; 6.1 and
/// --backend iommufd is an error naming the kernel requirement.
#[test]
fn backend_policies_on_a_cdev_host() {
    let dir = tempfile::tempdir().unwrap();
    crate::testkit::fixtures::build("vfio-numa", dir.path()).unwrap();
    let inv = crate::inventory::scan(&HostRoot::new(dir.path())).unwrap();
    let spec = |p| {
        let opts = Options {
            backend: p,
            ..Options::default()
        };
        render(&inv, &DriverFiles::default(), &opts).unwrap().spec
    };
    let nodes = |s: &Spec, n: &str| -> Vec<String> {
        s.devices
            .iter()
            .find(|d| d.name == n)
            .unwrap_or_else(|| panic!("no {n}"))
            .container_edits
            .device_nodes
            .iter()
            .map(|d| d.path.clone())
            .collect()
    };
    let auto = spec(Policy::Auto);
    assert_eq!(
        nodes(&auto, "0000:17:00.0"),
        ["/dev/iommu", "/dev/vfio/devices/vfio0"]
    );
    assert_eq!(
        nodes(&auto, "legacy-0000:17:00.0"),
        ["/dev/vfio/vfio", "/dev/vfio/40"]
    );
    assert_eq!(
        nodes(&auto, "iommufd-group-40"),
        ["/dev/iommu", "/dev/vfio/devices/vfio0"]
    );
    let legacy = spec(Policy::Legacy);
    assert_eq!(nodes(&legacy, "group-40"), ["/dev/vfio/vfio", "/dev/vfio/40"]);
    assert!(!legacy.devices.iter().any(|d| d.name.starts_with("legacy-")));
    let iommufd = spec(Policy::Iommufd);
    assert_eq!(
        nodes(&iommufd, "group-42"),
        ["/dev/iommu", "/dev/vfio/devices/vfio4", "/dev/vfio/devices/vfio5"]
    );

    let old = tempfile::tempdir().unwrap();
    crate::testkit::fixtures::build("hgx-8gpu", old.path()).unwrap();
    let inv = crate::inventory::scan(&HostRoot::new(old.path())).unwrap();
    let opts = Options {
        backend: Policy::Iommufd,
        ..Options::default()
    };
    let e = render(&inv, &DriverFiles::default(), &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("6.1 predates") && e.contains("Linux 6.6"), "{e}");
}

#[test]
fn device_names() {
    for ok in [
        "0000:01:00.0",
        "group-14",
        "2f3e4d5c-6b7a-4988-8776-655443322110",
        "a",
    ] {
        assert!(valid_device_name(ok), "{ok}");
    }
    for bad in ["", "-a", "a-", "a/b", "a b"] {
        assert!(!valid_device_name(bad), "{bad}");
    }
}

fn spec_with(names: &[&str], edits: ContainerEdits, kind: &str) -> Spec {
    Spec {
        cdi_version: String::new(),
        kind: kind.into(),
        devices: names
            .iter()
            .map(|n| Device {
                name: n.to_string(),
                container_edits: edits.clone(),
            })
            .collect(),
        container_edits: ContainerEdits::default(),
    }
}

#[test]
fn minimum_versions_follow_the_fields() {
    let e = ContainerEdits::default();
    assert_eq!(
        min_version(&spec_with(&["group-1"], e.clone(), "a.b/c")).0,
        CdiVersion(0, 3, 0)
    );
    assert_eq!(
        min_version(&spec_with(&["0000:01:00.0"], e.clone(), "a.b/c")).0,
        CdiVersion(0, 5, 0)
    );
    assert_eq!(
        min_version(&spec_with(&["group-1"], e.clone(), "a.b/c.d")).0,
        CdiVersion(0, 6, 0)
    );
    let typed = ContainerEdits {
        mounts: vec![Mount {
            host_path: "/a".into(),
            container_path: "/a".into(),
            options: vec![],
            mount_type: Some("bind".into()),
        }],
        ..ContainerEdits::default()
    };
    assert_eq!(
        min_version(&spec_with(&["group-1"], typed, "a/c")).0,
        CdiVersion(0, 4, 0)
    );
    let host = ContainerEdits {
        device_nodes: vec![DeviceNode {
            path: "/dev/x".into(),
            host_path: Some("/h/dev/x".into()),
        }],
        ..ContainerEdits::default()
    };
    assert_eq!(
        min_version(&spec_with(&["group-1"], host, "a/c")).0,
        CdiVersion(0, 5, 0)
    );
}

#[test]
fn dev_root_adds_host_paths() {
    let o = Options {
        dev_root: "/host/dev/".into(),
        driver_root: "/host".into(),
        ..Options::default()
    };
    assert_eq!(
        o.node("/dev/vfio/3").host_path.as_deref(),
        Some("/host/dev/vfio/3")
    );
    assert_eq!(Options::default().node("/dev/vfio/3").host_path, None);
    assert_eq!(
        o.bind("/usr/bin/nvidia-smi").host_path,
        "/host/usr/bin/nvidia-smi"
    );
    assert_eq!(
        Options::default().bind("/usr/bin/nvidia-smi").host_path,
        "/usr/bin/nvidia-smi"
    );
}

#[test]
fn atomic_write_replaces_and_leaves_no_temp() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("cdi/x.json");
    write_atomic(&p, b"one").unwrap();
    write_atomic(&p, b"two").unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
    assert_eq!(std::fs::read_dir(d.path().join("cdi")).unwrap().count(), 1);
}
