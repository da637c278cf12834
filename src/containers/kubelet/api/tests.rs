use super::*;

/// A pool of three devices (what a driver gives the kit).
fn inv() -> Pool {
    Pool {
        devices: ["pci-0000-01-00-0", "pci-0000-02-00-0", "pci-0000-41-00-0"]
            .iter()
            .map(|n| Device {
                name: n.to_string(),
                ..Default::default()
            })
            .collect(),
        counter_sets: Vec::new(),
    }
}

fn owner() -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: "n1".into(),
        uid: "node-uid".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// What the API server would hold after `ops` were applied to `existing`.
fn applied(existing: &[ResourceSlice], ops: &[SliceOp]) -> Vec<ResourceSlice> {
    let mut v: Vec<ResourceSlice> = existing.to_vec();
    for op in ops {
        match op {
            SliceOp::Create(s) => {
                assert!(
                    v.iter().all(|e| e.metadata.name != s.metadata.name),
                    "create of an existing slice"
                );
                v.push(s.clone());
            }
            SliceOp::Replace(s) => {
                let e = v
                    .iter_mut()
                    .find(|e| e.metadata.name == s.metadata.name)
                    .expect("replace of a missing slice");
                assert_eq!(e.metadata.resource_version, s.metadata.resource_version);
                *e = s.clone();
            }
            SliceOp::Delete(n) => v.retain(|e| e.metadata.name.as_ref() != Some(n)),
        }
    }
    for (i, s) in v.iter_mut().enumerate() {
        s.metadata.resource_version = Some(format!("rv{i}"));
    }
    v
}

#[test]
fn the_first_publication_creates_generation_one_and_a_second_changes_nothing() {
    let inv = inv();
    let ops = reconcile(&[], &inv, "n1", "vfio.gpupass.dev", Some(&owner()));
    assert!(!ops.is_empty());
    assert!(ops
        .iter()
        .all(|o| matches!(o, SliceOp::Create(s) if s.spec.pool.generation == 1
            && s.metadata.owner_references.as_deref() == Some(&[owner()][..]))));
    let now = applied(&[], &ops);
    assert_eq!(pool_devices(&now), inv.devices);
    assert_eq!(
        reconcile(&now, &inv, "n1", "vfio.gpupass.dev", Some(&owner())),
        Vec::new()
    );
}

#[test]
fn a_changed_host_bumps_the_generation_and_replaces_in_place() {
    let inv = inv();
    let now = applied(
        &[],
        &reconcile(&[], &inv, "n1", "vfio.gpupass.dev", Some(&owner())),
    );
    // A device gone from the host: the slice that held it is replaced, generation 2.
    let mut fewer = now.clone();
    for s in &mut fewer {
        if let Some(d) = s.spec.devices.as_mut() {
            d.push(Device {
                name: "stale".into(),
                ..Default::default()
            });
        }
    }
    let ops = reconcile(&fewer, &inv, "n1", "vfio.gpupass.dev", Some(&owner()));
    assert!(
        ops.iter()
            .all(|o| matches!(o, SliceOp::Replace(s) if s.spec.pool.generation == 2)),
        "{ops:?}"
    );
    let after = applied(&fewer, &ops);
    assert_eq!(pool_devices(&after), inv.devices);
    assert_eq!(
        reconcile(&after, &inv, "n1", "vfio.gpupass.dev", Some(&owner())),
        Vec::new()
    );
}

#[test]
fn slices_the_pool_no_longer_has_are_deleted_and_an_old_owner_is_replaced() {
    let inv = inv();
    let now = applied(
        &[],
        &reconcile(&[], &inv, "n1", "vfio.gpupass.dev", Some(&owner())),
    );
    let mut extra = now.clone();
    let mut s = now[0].clone();
    s.metadata.name = Some(pool::slice_name("n1", "vfio.gpupass.dev", 7));
    extra.push(s);
    let ops = reconcile(&extra, &inv, "n1", "vfio.gpupass.dev", Some(&owner()));
    assert!(
        ops.contains(&SliceOp::Delete(pool::slice_name("n1", "vfio.gpupass.dev", 7))),
        "{ops:?}"
    );
    assert_eq!(applied(&extra, &ops).len(), now.len());
    // The node was deleted and registered again (a new UID): every slice gets the new owner.
    let mut o2 = owner();
    o2.uid = "node-uid-2".into();
    let ops = reconcile(&now, &inv, "n1", "vfio.gpupass.dev", Some(&o2));
    assert!(!ops.is_empty());
    let after = applied(&now, &ops);
    assert!(after
        .iter()
        .all(|s| s.metadata.owner_references.as_deref() == Some(&[o2.clone()][..])));
}

/// A device tainted as gpupass's driver taints an unhealthy one.
fn tainted(mut inv: Pool, i: usize) -> Pool {
    inv.devices[i].taints = Some(vec![k8s_openapi::api::resource::v1::DeviceTaint {
        key: "gpupass.dev/unhealthy".into(),
        value: Some("driver-lost".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }]);
    inv
}

/// What the API server does to a taint written without a time: it stamps one.
fn stamped(mut v: Vec<ResourceSlice>) -> Vec<ResourceSlice> {
    for d in v.iter_mut().flat_map(|s| s.spec.devices.iter_mut().flatten()) {
        for t in d.taints.iter_mut().flatten() {
            t.time_added.get_or_insert_with(|| {
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-12-06T05:00:00Z".parse().unwrap())
            });
        }
    }
    v
}

#[test]
fn a_taint_the_server_stamped_is_not_written_again_and_goes_when_the_device_heals() {
    let sick = tainted(inv(), 1);
    let o = Some(owner());
    let now = stamped(applied(&[], &reconcile(&[], &inv(), "n1", "d", o.as_ref())));
    // The device turns unhealthy: one replace with the taint, no time of gpupass's own.
    let ops = reconcile(&now, &sick, "n1", "d", o.as_ref());
    assert!(!ops.is_empty());
    let after = stamped(applied(&now, &ops));
    let t = &pool_devices(&after)[1].taints.clone().unwrap()[0];
    assert_eq!(
        (t.key.as_str(), t.effect.as_str()),
        ("gpupass.dev/unhealthy", "NoSchedule")
    );
    // The same sick pool again (every poll): the stamped taint is the same taint, nothing
    // is written.
    assert_eq!(reconcile(&after, &sick, "n1", "d", o.as_ref()), Vec::new());
    // Healed: the taint goes.
    let healed = applied(&after, &reconcile(&after, &inv(), "n1", "d", o.as_ref()));
    assert!(pool_devices(&healed).iter().all(|d| d.taints.is_none()));
    assert_eq!(reconcile(&healed, &inv(), "n1", "d", o.as_ref()), Vec::new());
    // Another problem on the same device is another taint: written.
    let mut other = sick.clone();
    other.devices[1].taints.as_mut().unwrap()[0].value = Some("aer".into());
    assert!(!reconcile(&after, &other, "n1", "d", o.as_ref()).is_empty());
}

#[test]
fn slices_deleted_or_edited_behind_the_plugins_back_are_put_back_and_only_those() {
    let o = Some(owner());
    let pool = Pool {
        devices: (0..200)
            .map(|i| Device {
                name: format!("pci-0000-{:02x}-00-0", i),
                ..Default::default()
            })
            .collect(),
        counter_sets: Vec::new(),
    };
    let now = applied(&[], &reconcile(&[], &pool, "n1", "d", o.as_ref()));
    assert_eq!(now.len(), 2, "200 devices: two slices");
    // The kubelet's wipe at its start: every slice gone; all created again.
    let ops = reconcile(&[], &pool, "n1", "d", o.as_ref());
    assert!(ops.iter().all(|o| matches!(o, SliceOp::Create(_))) && ops.len() == 2);
    // `kubectl delete resourceslice` of one: the pool is incomplete (the other slice
    // says two): a new generation, the survivor replaced, the deleted one created.
    let one = vec![now[1].clone()];
    let ops = reconcile(&one, &pool, "n1", "d", o.as_ref());
    let after = applied(&one, &ops);
    assert_eq!(pool_devices(&after), pool.devices);
    assert!(after.iter().all(|s| s.spec.pool.generation == 2));
    assert_eq!(reconcile(&after, &pool, "n1", "d", o.as_ref()), Vec::new());
    // An edit (a device removed by hand): put back.
    let mut edited = now.clone();
    edited[0].spec.devices.as_mut().unwrap().pop();
    let ops = reconcile(&edited, &pool, "n1", "d", o.as_ref());
    assert!(!ops.is_empty());
    assert_eq!(pool_devices(&applied(&edited, &ops)), pool.devices);
    // An edit of the pool's generation alone (all slices still agree): not a difference
    // worth a write.
    let mut bumped = now.clone();
    for s in &mut bumped {
        s.spec.pool.generation = 9;
    }
    assert_eq!(reconcile(&bumped, &pool, "n1", "d", o.as_ref()), Vec::new());
}
