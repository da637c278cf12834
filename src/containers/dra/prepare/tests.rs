use super::*;
use crate::containers::kubelet::claims::{fetch, Dir};
use crate::host::HostRoot;
use crate::testkit::hostgen::{DevSpec, HostBuilder};
use crate::testkit::FakeHost;
use std::time::{Duration, Instant};

fn driver_of(root: &std::path::Path, a: &str) -> Option<String> {
    std::fs::read_link(root.join("sys/bus/pci/devices").join(a).join("driver"))
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

const DRIVER: &str = "vfio.gpupass.dev";

fn node_a() -> Identity {
    Identity {
        driver: DRIVER.into(),
        node: "node-a".into(),
        pool: "node-a".into(),
    }
}

fn gpu_claim() -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        uid: "u1".into(),
        name: "gpu".into(),
    }
}

/// The lab's IOMMU group 4 (a VGA function on bochs-drm and its audio companion on
/// snd_hda_intel, one DRA device `pci-0000-00-05-0`) and the claim default/gpu (UID u1)
/// allocated that device on node-a. Returns the scratch directory, the host root and the
/// claims directory.
fn lab_claim() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    lab_claim_with(|_| {})
}

/// [`lab_claim`], with `more` added to the host.
fn lab_claim_with(
    more: impl FnOnce(&mut HostBuilder),
) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("host");
    let mut h = HostBuilder::new(&root).unwrap();
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
    more(&mut h);
    let claims = t.path().join("claims");
    std::fs::create_dir_all(claims.join("default")).unwrap();
    write_claim(&claims, "gpu", "u1");
    (t, root, claims)
}

/// Writes the claim default/NAME (UID `uid`) allocated the lab's `pci-0000-00-05-0` on node-a
/// to `claims`, as the kubelet-plugin kit would read it, and returns its reference.
fn write_claim(claims: &std::path::Path, name: &str, uid: &str) -> ClaimRef {
    let c = serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "status": {"allocation": {
            "devices": {"results": [{"request": "vfio", "driver": DRIVER, "pool": "node-a", "device": "pci-0000-00-05-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}
        }}
    });
    std::fs::write(claims.join(format!("default/{name}.json")), c.to_string()).unwrap();
    ClaimRef {
        namespace: "default".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

/// A second claim, default/gpu2 (UID u2), allocated the same device as [`lab_claim`]'s.
fn second_claim(claims: &std::path::Path) -> ClaimRef {
    write_claim(claims, "gpu2", "u2")
}

/// The driver as the kubelet-plugin kit drives it, with claims read from `claims`: a
/// claim prepared already is answered from the checkpoint, any other is read and handed
/// to the driver ([`crate::containers::kubelet::plugin`]'s worker does the same).
struct Kit<'a> {
    d: Driver<'a>,
    src: Dir,
}

impl<'a> std::ops::Deref for Kit<'a> {
    type Target = Driver<'a>;
    fn deref(&self) -> &Driver<'a> {
        &self.d
    }
}

impl std::ops::DerefMut for Kit<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.d
    }
}

impl Kit<'_> {
    fn prepare(&mut self, c: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        self.prepare_until(c, None)
    }

    fn prepare_until(
        &mut self,
        c: &ClaimRef,
        deadline: Option<Instant>,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        if let Some(d) = self.d.prepared(c) {
            return Ok(d);
        }
        let claim = fetch(&self.src, c).expect("the claim is readable");
        self.d.prepare_until(&claim, deadline)
    }

    fn cleanup_at_start(&mut self) -> Vec<String> {
        self.d.cleanup_at_start(&self.src)
    }

    fn with_lock_wait(self, wait: Duration) -> Self {
        Kit {
            d: self.d.with_lock_wait(wait),
            src: self.src,
        }
    }
}

fn kit<'a>(d: Driver<'a>, claims: &std::path::Path) -> Kit<'a> {
    Kit {
        d,
        src: Dir {
            dir: claims.to_path_buf(),
        },
    }
}

fn engine<'a>(ops: &'a dyn HostOps, claims: &std::path::Path) -> Kit<'a> {
    kit(
        Driver::new(ops, node_a(), Policy::Auto, "b1".into()).unwrap(),
        claims,
    )
}

/// What a claim's plan changes on the host: each function's driver and override, whether
/// the group's VFIO node exists, and every file (path and content) under the CDI spec
/// directory and the plugin's metadata directory. (Not the checkpoint, the journal, or
/// the fake kernel's own bookkeeping.)
fn state(root: &std::path::Path) -> BTreeMap<String, String> {
    fn files(base: &std::path::Path, dir: &std::path::Path, out: &mut BTreeMap<String, String>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                files(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().display().to_string();
                out.insert(rel, std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    let mut m = BTreeMap::new();
    for a in ["0000:00:05.0", "0000:00:05.1"] {
        m.insert(format!("{a} driver"), driver_of(root, a).unwrap_or_default());
        let ov = std::fs::read_to_string(root.join("sys/bus/pci/devices").join(a).join("driver_override"))
            .unwrap_or_default();
        m.insert(format!("{a} override"), ov.trim().to_string());
    }
    m.insert("dev/vfio/4".into(), root.join("dev/vfio/4").exists().to_string());
    files(root, &root.join("var/run/cdi"), &mut m);
    files(
        root,
        &root
            .join("var/lib/kubelet/plugins")
            .join(DRIVER)
            .join("dra-device-metadata"),
        &mut m,
    );
    m
}

fn journal(root: &std::path::Path) -> String {
    std::fs::read_to_string(crate::change::journal::journal_path(&HostRoot::new(root))).unwrap_or_default()
}

/// Prepare is one plan of the change engine owned by the claim: one `change` record (the
/// group bind and the claim's three files, owner `dra-claim:u1`), one commit. A retry, in
/// this plugin or a restarted one (the checkpoint by claim UID), returns the same devices
/// and writes nothing; Unprepare is one plan too and gives the host back as it was.
#[test]
fn prepare_is_one_owned_plan_and_retries_write_nothing() {
    let (_t, root, claims) = lab_claim();
    let before = state(&root);
    let ops = FakeHost::new(HostRoot::new(&root));
    let mut e = engine(&ops, &claims);
    let devs = e.prepare(&gpu_claim()).unwrap();
    assert_eq!(devs[0].device, "pci-0000-00-05-0");
    let after = state(&root);
    assert_eq!(after["0000:00:05.0 driver"], "vfio-pci");
    assert_eq!(after["0000:00:05.1 driver"], "vfio-pci");
    assert_eq!(
        after.keys().filter(|k| k.ends_with(".json")).count(),
        3,
        "{after:?}"
    );
    let j = journal(&root);
    assert_eq!(j.matches("\"op\":\"change\"").count(), 1, "{j}");
    assert_eq!(j.matches("\"op\":\"extend\"").count(), 1, "{j}");
    assert_eq!(j.matches("\"owner\":\"dra-claim:u1\"").count(), 1, "{j}");
    assert_eq!(j.matches("\"op\":\"commit\"").count(), 1, "{j}");
    // Six sysfs writes of the bind, three files.
    assert_eq!(j.matches("\"op\":\"step\"").count(), 9, "{j}");
    // kubelet retries: same answer, nothing written; a restarted plugin too.
    assert_eq!(e.prepare(&gpu_claim()).unwrap(), devs);
    let mut restarted = engine(&ops, &claims);
    assert_eq!(restarted.prepare(&gpu_claim()).unwrap(), devs);
    assert_eq!(journal(&root), j);
    assert_eq!(state(&root), after);
    // Unprepare: the plan's undo, one plan owned by the claim (the journal folded the
    // committed prepare into its `state` record first, which keeps what the claim holds),
    // releasing the claim's hold on the group.
    restarted.unprepare("u1").unwrap();
    assert_eq!(state(&root), before);
    let j = journal(&root);
    assert_eq!(j.matches("\"op\":\"change\"").count(), 1, "{j}");
    assert_eq!(
        j.matches("\"owner\":\"dra-claim:u1\",\"changes\"").count(),
        1,
        "{j}"
    );
    assert_eq!(
        j.matches("\"owner\":\"dra-claim:u1\",\"label\"").count(),
        2,
        "{j}"
    );
    assert_eq!(j.matches("\"releases\":true").count(), 1, "{j}");
    let r = crate::change::journal::read(&HostRoot::new(&root)).unwrap();
    assert!(r.held.is_empty(), "{:?}", r.held);
    assert_eq!(j.matches("\"domain\":\"unbind+dra\"").count(), 1, "{j}");
    assert_eq!(j.matches("\"op\":\"step\"").count(), 9, "{j}");
    assert!(!root
        .join("var/lib/kubelet/plugins")
        .join(DRIVER)
        .join("dra-device-metadata/default_gpu")
        .exists());
    assert!(restarted.checkpoint().claims.is_empty());
}

/// One owner per group, whatever the scheduler allocated and whatever the plugin's
/// checkpoint says: the journal records what a live claim holds. A second claim given the
/// device a live claim holds (a double allocation, as with the scheduler's counters off),
/// seen by a plugin whose checkpoint was lost (a reinstall), is refused naming the holder
/// and changes nothing; the host's `gpupass unbind` (and `--all`) refuse to take the
/// group from under the claim's Pod unless forced; once the first claim is unprepared
/// the second prepares.
#[test]
fn one_owner_per_group_against_a_second_claim_and_the_host() {
    let (_t, root, claims) = lab_claim();
    let second = second_claim(&claims);
    let ops = FakeHost::new(HostRoot::new(&root));
    let mut e = engine(&ops, &claims);
    e.prepare(&gpu_claim()).unwrap();
    let held = state(&root);
    let j = journal(&root);
    // A plugin that lost its checkpoint knows nothing of u1: the journal does.
    let cp = root
        .join("var/lib/kubelet/plugins")
        .join(DRIVER)
        .join("checkpoint.json");
    let kept = std::fs::read(&cp).unwrap();
    std::fs::remove_file(&cp).unwrap();
    let mut fresh = engine(&ops, &claims);
    let err = crate::model::ErrorChain(&fresh.prepare(&second).unwrap_err()).to_string();
    assert!(
        err.contains("is held by claim default/gpu (u1)") && err.contains("one owner per group"),
        "{err}"
    );
    assert_eq!(state(&root), held);
    assert_eq!(journal(&root), j, "a refused claim journals nothing");
    assert!(fresh.checkpoint().claims.is_empty());
    drop(fresh);
    std::fs::write(&cp, kept).unwrap();
    let mut e = engine(&ops, &claims);
    let unbind = |addresses: Vec<PciAddress>, all: bool, force: bool| {
        let req = crate::bind::UnbindRequest {
            addresses,
            group: None,
            all,
            only: false,
        };
        crate::bind::apply::unbind(&ops, &req, force, false, &|_| {})
    };
    let vga: PciAddress = "0000:00:05.0".parse().unwrap();
    for all in [false, true] {
        let addrs = if all { Vec::new() } else { vec![vga] };
        let err = crate::model::ErrorChain(&unbind(addrs, all, false).unwrap_err()).to_string();
        assert!(err.contains("held by claim default/gpu (u1)"), "{err}");
        assert!(err.contains("--force"), "{err}");
        assert_eq!(state(&root), held);
    }
    // The claim gone (unprepared), the second one prepares and holds the group in turn.
    e.unprepare("u1").unwrap();
    e.prepare(&second).unwrap();
    let err = crate::model::ErrorChain(&unbind(vec![vga], false, false).unwrap_err()).to_string();
    assert!(err.contains("held by claim default/gpu2 (u2)"), "{err}");
    // Forced, the host takes it back (a claim whose plugin is gone).
    unbind(vec![vga], false, true).unwrap();
    assert_eq!(driver_of(&root, "0000:00:05.0").as_deref(), Some("bochs-drm"));
    // The claim's unprepare then gives back what is left and releases its hold.
    e.unprepare("u2").unwrap();
    let r = crate::change::journal::read(&HostRoot::new(&root)).unwrap();
    assert!(r.held.is_empty(), "{:?}", r.held);
}

/// A `require-iommufd` claim on a node whose kernel has no iommufd (this 6.1 host: no
/// `/dev/iommu`, no VFIO device cdev) is refused before the first write, with the
/// kernel's reason: no journal record, no checkpoint entry, the group on its drivers, and
/// every kubelet retry refused the same way without binding and rolling back.
/// KEP-5304: `metadata.generation` increases on every rewrite of a claim's metadata file.
/// A Prepare that finds the file saying something else (here: an earlier version at
/// generation 4 naming another backend, the plugin's checkpoint lost) rewrites it at 5; one
/// that finds it as wanted leaves it (and its generation) alone.
#[test]
fn a_rewritten_metadata_file_gets_a_higher_generation() {
    let (_t, root, claims) = lab_claim();
    let ops = FakeHost::new(HostRoot::new(&root));
    let meta = root
        .join("var/lib/kubelet/plugins")
        .join(DRIVER)
        .join("dra-device-metadata/default_gpu/vfio/metadata.json");
    let gens = || -> Vec<i64> {
        serde_json::Deserializer::from_str(&std::fs::read_to_string(&meta).unwrap())
            .into_iter::<serde_json::Value>()
            .map(|d| d.unwrap()["metadata"]["generation"].as_i64().unwrap())
            .collect()
    };
    let cp = checkpoint::path(&HostRoot::new(&root), DRIVER);
    engine(&ops, &claims).prepare(&gpu_claim()).unwrap();
    assert_eq!(gens(), [1, 1]);
    let now = std::fs::read_to_string(&meta).unwrap();
    assert!(
        now.contains(r#""gpupass.dev/backend":{"string":"legacy"}"#),
        "{now}"
    );
    let earlier = now
        .replace(r#""generation":1"#, r#""generation":4"#)
        .replace(r#"{"string":"legacy"}"#, r#"{"string":"iommufd"}"#);
    std::fs::write(&meta, earlier).unwrap();
    std::fs::remove_file(&cp).unwrap();
    engine(&ops, &claims).prepare(&gpu_claim()).unwrap();
    assert_eq!(gens(), [5, 5]);
    let rewritten = std::fs::read_to_string(&meta).unwrap();
    assert_eq!(rewritten, now.replace(r#""generation":1"#, r#""generation":5"#));
    let written = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).unwrap();
        (m.ino(), m.mtime(), m.mtime_nsec())
    };
    let before = written(&meta);
    std::fs::remove_file(&cp).unwrap();
    engine(&ops, &claims).prepare(&gpu_claim()).unwrap();
    assert_eq!(gens(), [5, 5], "the same content is no rewrite");
    assert_eq!(std::fs::read_to_string(&meta).unwrap(), rewritten);
    assert_eq!(written(&meta), before, "the file was not written again");
}

#[test]
fn require_iommufd_on_a_kernel_without_it_is_refused_before_any_write() {
    let (_t, root, claims) = lab_claim();
    let c = serde_json::json!({
        "metadata": {"name": "gpu", "namespace": "default", "uid": "u1"},
        "status": {"allocation": {
            "devices": {
                "results": [{"request": "vfio", "driver": DRIVER, "pool": "node-a", "device": "pci-0000-00-05-0"}],
                "config": [{"source": "FromClaim", "requests": ["vfio"], "opaque": {"driver": DRIVER, "parameters": {
                    "apiVersion": claim::CONFIG_API_VERSION, "kind": claim::CONFIG_KIND, "backendPolicy": "require-iommufd"}}}]
            },
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}
        }}
    });
    std::fs::write(claims.join("default/gpu.json"), c.to_string()).unwrap();
    let before = state(&root);
    let ops = FakeHost::new(HostRoot::new(&root));
    let mut e = engine(&ops, &claims);
    for attempt in 0..2 {
        let err = e.prepare(&gpu_claim()).unwrap_err();
        let msg = crate::model::ErrorChain(&err).to_string();
        assert!(msg.contains("require-iommufd"), "attempt {attempt}: {msg}");
        assert!(msg.contains("0000:00:05.0"), "attempt {attempt}: {msg}");
        assert!(
            msg.contains("use prefer-iommufd or legacy"),
            "attempt {attempt}: {msg}"
        );
        assert_eq!(state(&root), before, "attempt {attempt}");
        assert_eq!(journal(&root), "", "attempt {attempt}: nothing journaled");
        assert!(e.checkpoint().claims.is_empty(), "attempt {attempt}");
    }
}

/// A prepared claim does not change what the node offers: the slices rendered from the
/// host while the group is on vfio-pci equal the ones from before the Prepare (the
/// `driver` attribute keeps the driver the function had), so the pool is not republished.
#[test]
fn a_prepared_group_is_offered_as_it_was_before() {
    let (_t, root, claims) = lab_claim();
    let ops = FakeHost::new(HostRoot::new(&root));
    let host = HostRoot::new(&root);
    let before = super::super::slices::devices(&crate::inventory::scan(&host).unwrap());
    let mut e = engine(&ops, &claims);
    e.prepare(&gpu_claim()).unwrap();
    let now = crate::inventory::scan(&host).unwrap();
    assert_ne!(
        super::super::slices::devices(&now),
        before,
        "the bind changed the driver attribute"
    );
    assert_eq!(super::super::slices::devices(&e.as_offered(&now)), before);
    e.unprepare("u1").unwrap();
    let after = crate::inventory::scan(&host).unwrap();
    assert_eq!(super::super::slices::devices(&e.as_offered(&after)), before);
}

/// The kernel's signals reach the pool: a function that lost its host driver makes its
/// device unhealthy and tainted NoSchedule (driver-lost); a claim for it is prepared all
/// the same (the scheduler let it through: a toleration); prepared and on vfio-pci it is
/// healthy, in D3cold it is not; given back driverless it is tainted again, and a driver
/// clears it.
#[test]
fn an_unhealthy_device_is_tainted_and_a_claim_for_it_is_prepared_all_the_same() {
    let (_t, root, claims) = lab_claim();
    let ops = FakeHost::new(HostRoot::new(&root));
    let mut e = engine(&ops, &claims);
    let dev = "pci-0000-00-05-0";
    let look = |e: &mut Kit| {
        let r = DraDriver::resources(&mut e.d).unwrap();
        let h = r.health.iter().find(|h| h.device == dev).cloned().unwrap();
        let d = r.pool.devices.iter().find(|d| d.name == dev).cloned().unwrap();
        let t: Vec<(String, String)> = d
            .taints
            .unwrap_or_default()
            .into_iter()
            .map(|t| (t.value.unwrap_or_default(), t.effect))
            .collect();
        (h, t)
    };
    let (h, t) = look(&mut e);
    assert!(h.healthy && t.is_empty(), "{h:?} {t:?}");
    let link = root.join("sys/bus/pci/devices/0000:00:05.1/driver");
    let target = std::fs::read_link(&link).unwrap();
    std::fs::remove_file(&link).unwrap();
    let (h, t) = look(&mut e);
    assert!(!h.healthy, "{h:?}");
    assert!(
        h.message.contains("0000:00:05.1 lost its driver snd_hda_intel"),
        "{}",
        h.message
    );
    assert_eq!(t, [("driver-lost".to_string(), "NoSchedule".to_string())]);
    // Tolerated by the claim (the scheduler's business): Prepare does not refuse it.
    e.prepare(&gpu_claim()).unwrap();
    let (h, t) = look(&mut e);
    assert!(
        h.healthy && t.is_empty(),
        "prepared, both on vfio-pci: {h:?} {t:?}"
    );
    let ps = root.join("sys/bus/pci/devices/0000:00:05.0/power_state");
    std::fs::write(&ps, "D3cold\n").unwrap();
    let (h, t) = look(&mut e);
    assert!(!h.healthy && h.message.contains("D3cold"), "{h:?}");
    assert_eq!(t, [("d3cold".to_string(), "NoSchedule".to_string())]);
    std::fs::write(&ps, "D0\n").unwrap();
    assert!(look(&mut e).0.healthy);
    e.unprepare("u1").unwrap();
    let (h, t) = look(&mut e);
    assert!(!h.healthy && t.len() == 1, "given back driverless: {h:?} {t:?}");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (h, t) = look(&mut e);
    assert!(h.healthy && t.is_empty(), "{h:?} {t:?}");
}

/// A failure at any write of the prepare plan rolls the whole plan back (the bind and the
/// files already written); the checkpoint holds nothing, and the retry prepares the claim.
#[test]
fn a_failure_at_every_write_of_a_prepare_rolls_it_all_back() {
    for k in 1..=9 {
        let (_t, root, claims) = lab_claim();
        let before = state(&root);
        let ops = crate::testkit::Failpoints::new(FakeHost::new(HostRoot::new(&root))).fail_at(k);
        let mut e = engine(&ops, &claims);
        let err = e.prepare(&gpu_claim()).unwrap_err();
        let msg = crate::model::ErrorChain(&err).to_string();
        assert!(msg.contains("rolled back, nothing changed"), "write {k}: {msg}");
        assert!(msg.contains("injected failure"), "write {k}: {msg}");
        assert_eq!(state(&root), before, "write {k}");
        assert!(e.checkpoint().claims.is_empty(), "write {k}");
        let r = crate::change::journal::read(&HostRoot::new(&root)).unwrap();
        assert!(r.open.is_empty() && r.bound.is_empty(), "write {k}");
        // The retry (the failpoint spent) prepares it.
        let fresh = FakeHost::new(HostRoot::new(&root));
        engine(&fresh, &claims).prepare(&gpu_claim()).unwrap();
        assert_eq!(driver_of(&root, "0000:00:05.1").as_deref(), Some("vfio-pci"));
    }
}

/// The plugin dying after each write of a prepare (the test kit's crash failpoint, as a
/// panic the test survives) leaves the claim's plan open in the journal, owned by the
/// claim; `gpupass recover` puts the host back as it was before the Prepare. `recover
/// --continue` after a write of the files makes it exactly what a Prepare without a crash
/// makes; after a write of the bind (the files not planned yet: they are planned from the
/// host the bind leaves) it finishes the bind and writes no file. After either, the
/// kubelet's retry (a restarted plugin, the checkpoint's `started` entry) prepares the
/// claim and Unprepare gives the host back.
#[test]
fn a_crash_after_every_write_of_a_prepare_is_recovered_to_before_or_prepared() {
    let prepared = {
        let (_t, root, claims) = lab_claim();
        let ops = FakeHost::new(HostRoot::new(&root));
        engine(&ops, &claims).prepare(&gpu_claim()).unwrap();
        state(&root)
    };
    for n in 1..=9 {
        for cont in [false, true] {
            let (_t, root, claims) = lab_claim();
            let host = HostRoot::new(&root);
            let before = state(&root);
            let crashing = crate::testkit::Failpoints::new(FakeHost::new(host.clone())).panic_after(n);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                engine(&crashing, &claims).prepare(&gpu_claim())
            }));
            assert!(r.is_err(), "write {n}: no crash");
            let open = crate::change::journal::read(&host).unwrap().open;
            assert_eq!(open.len(), 1, "write {n}");
            assert_eq!(open[0].owner.as_deref(), Some("dra-claim:u1"));
            assert_eq!(
                (open[0].at, open[0].writes),
                (n, if n <= 6 { 6 } else { 9 }),
                "write {n}"
            );
            assert_ne!(state(&root), before, "write {n} changed nothing");
            let ops = FakeHost::new(host.clone());
            crate::change::recover(&ops, cont, false).unwrap();
            assert!(crate::change::journal::read(&host).unwrap().open.is_empty());
            if cont && n > 6 {
                assert_eq!(state(&root), prepared, "recover --continue after write {n}");
            } else if cont {
                let bound: BTreeMap<String, String> = prepared
                    .iter()
                    .filter(|(k, _)| !k.ends_with(".json"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert_eq!(state(&root), bound, "recover --continue after write {n}");
            } else {
                assert_eq!(state(&root), before, "recover after write {n}");
            }
            // The kubelet retries with a restarted plugin: prepared; then unprepared.
            let mut e = engine(&ops, &claims);
            assert_eq!(e.checkpoint().claims["u1"].state, State::Started);
            e.prepare(&gpu_claim()).unwrap();
            assert_eq!(state(&root), prepared, "retry after write {n} (continue: {cont})");
            e.unprepare("u1").unwrap();
            assert_eq!(
                state(&root),
                before,
                "unprepare after write {n} (continue: {cont})"
            );
        }
    }
}

/// The plugin dying after each write of an Unprepare (six sysfs writes of the restore,
/// three file removals), then starting again: its start undoes the unfinished plan (the
/// claim prepared as it was, the journal closed), the checkpoint still holds the claim, and
/// the kubelet's retry of the Unprepare gives the host back as it was before the Prepare.
#[test]
fn a_crash_after_every_write_of_an_unprepare_is_undone_at_start_and_the_retry_finishes() {
    for n in 1..=9 {
        let (_t, root, claims) = lab_claim();
        let host = HostRoot::new(&root);
        let before = state(&root);
        let ops = FakeHost::new(host.clone());
        engine(&ops, &claims).prepare(&gpu_claim()).unwrap();
        let prepared = state(&root);
        let crashing = crate::testkit::Failpoints::new(FakeHost::new(host.clone())).panic_after(n);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine(&crashing, &claims).unprepare("u1")
        }));
        assert!(r.is_err(), "write {n}: no crash");
        let open = crate::change::journal::read(&host).unwrap().open;
        assert_eq!(open.len(), 1, "write {n}");
        assert_eq!(open[0].owner.as_deref(), Some("dra-claim:u1"));
        assert_eq!((open[0].at, open[0].writes), (n, 9), "write {n}");
        assert_ne!(state(&root), prepared, "write {n} changed nothing");
        // The restarted plugin: its own unfinished plan undone before it serves.
        let mut e = engine(&ops, &claims);
        let said = e.cleanup_at_start();
        assert!(
            said.iter()
                .any(|l| l.contains("interrupted before this start was undone")),
            "write {n}: {said:?}"
        );
        assert!(
            crate::change::journal::read(&host).unwrap().open.is_empty(),
            "write {n}"
        );
        assert_eq!(state(&root), prepared, "undone after write {n}");
        assert_eq!(e.checkpoint().claims["u1"].state, State::Completed, "write {n}");
        // The kubelet retries the Unprepare.
        e.unprepare("u1").unwrap();
        assert_eq!(state(&root), before, "retried unprepare after write {n}");
        assert!(e.checkpoint().claims.is_empty(), "write {n}");
    }
}

/// The plugin dying after each write of a prepare, then starting again: before anything
/// else it undoes its own unfinished plan (the host as before the Prepare, the journal
/// closed), so the kubelet's retry prepares the claim instead of being refused for an
/// unfinished plan; a `gpupass bind` that died beside it (another owner) stays open for
/// `gpupass recover`, its function untouched.
#[test]
fn a_restarted_plugin_undoes_its_own_unfinished_prepare_and_nothing_else() {
    for n in 1..=9 {
        let (_t, root, claims) = lab_claim_with(|h| {
            h.add(
                &DevSpec::new("00:07.0", 0x8086, 0x10d3, 0x020000)
                    .group(6)
                    .driver("e1000e"),
            )
            .unwrap();
        });
        let host = HostRoot::new(&root);
        let before = state(&root);
        // A human's bind of 00:07.0 dies after its first write.
        let crashing = crate::testkit::Failpoints::new(FakeHost::new(host.clone())).panic_after(1);
        let req = crate::bind::BindRequest {
            addresses: vec!["0000:00:07.0".parse().unwrap()],
            only: false,
            driver: None,
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::bind::apply::bind(&crashing, &req, false, false, &|_| {})
        }));
        assert!(r.is_err(), "the bind did not crash");
        let bind_state = state(&root);
        let crashing = crate::testkit::Failpoints::new(FakeHost::new(host.clone())).panic_after(n);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine(&crashing, &claims).prepare(&gpu_claim())
        }));
        assert!(r.is_err(), "write {n}: no crash");
        assert_eq!(crate::change::journal::read(&host).unwrap().open.len(), 2);
        let ops = FakeHost::new(host.clone());
        let mut e = engine(&ops, &claims);
        let lines = e.cleanup_at_start();
        assert!(
            lines[0].contains("interrupted before this start was undone"),
            "{lines:?}"
        );
        assert!(lines.iter().any(|l| l.contains("for dra-claim:u1")), "{lines:?}");
        assert_eq!(
            state(&root),
            bind_state,
            "write {n}: the host as before the Prepare"
        );
        let open = crate::change::journal::read(&host).unwrap().open;
        assert_eq!(open.len(), 1, "write {n}");
        assert_eq!(open[0].owner, None, "write {n}: the bind's plan stays");
        // The kubelet's retry is not refused: the claim's functions have no open plan.
        e.prepare(&gpu_claim()).unwrap();
        assert_eq!(driver_of(&root, "0000:00:05.0").as_deref(), Some("vfio-pci"));
        e.unprepare("u1").unwrap();
        // `gpupass recover` then takes the bind's plan back.
        crate::change::recover(&ops, false, false).unwrap();
        assert_eq!(state(&root), before, "write {n}");
    }
}

/// The lab's mtty parent (types mtty-1 with 2 instances, mtty-2 with 1) beside the lab's
/// group, and the claim default/tty (UID m1) allocated slot `mdev-mtty-mtty-2-0`.
fn mtty_claim() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let (t, root, claims) = lab_claim_with(|h| {
        h.virtual_mdev_parent(
            "mtty",
            "mtty",
            &[
                ("mtty-1", "Single port serial", None, 2, "vfio-pci"),
                ("mtty-2", "Dual port serial", None, 1, "vfio-pci"),
            ],
        )
        .unwrap();
    });
    let c = serde_json::json!({
        "metadata": {"name": "tty", "namespace": "default", "uid": "m1"},
        "status": {"allocation": {
            "devices": {"results": [{"request": "serial", "driver": DRIVER, "pool": "node-a", "device": "mdev-mtty-mtty-2-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}
        }}
    });
    std::fs::write(claims.join("default/tty.json"), c.to_string()).unwrap();
    (t, root, claims)
}

fn tty_claim() -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        uid: "m1".into(),
        name: "tty".into(),
    }
}

/// An mdev slot's Prepare creates one instance of the slot's type through the engine (one
/// plan owned by the claim, UUID saved in the checkpoint first), hands the container the
/// instance's VFIO nodes and KubeVirt its `mdevUUID` (no `pciBusID`), leaves the node's
/// pool as published, writes nothing on a retry, and Unprepare removes the instance and
/// the files.
#[test]
fn an_mdev_slot_is_created_for_its_claim_and_removed_after() {
    let (_t, root, claims) = mtty_claim();
    let host = HostRoot::new(&root);
    let ops = FakeHost::new(host.clone());
    let mut e = engine(&ops, &claims);
    let inv0 = crate::inventory::scan(&host).unwrap();
    let pool0 = super::super::slices::pool(&inv0);
    let names: Vec<&str> = pool0.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "pci-0000-00-05-0",
            "mdev-mtty-mtty-1-0",
            "mdev-mtty-mtty-1-1",
            "mdev-mtty-mtty-2-0"
        ]
    );
    let devs = e.prepare(&tty_claim()).unwrap();
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0].device, "mdev-mtty-mtty-2-0");
    let entry = e.checkpoint().claims["m1"].clone();
    let uuid = entry.devices[0].mdev.as_ref().unwrap().uuid.clone();
    assert!(crate::model::is_uuid(&uuid), "{uuid}");
    let inv = crate::inventory::scan(&host).unwrap();
    let inst = inv.mdev(&uuid).expect("the instance exists");
    assert_eq!(inst.type_id.as_deref(), Some("mtty-2"));
    let g = inst.iommu_group.unwrap();
    // The group device was not touched.
    assert_eq!(driver_of(&root, "0000:00:05.0").as_deref(), Some("bochs-drm"));
    let spec = std::fs::read_to_string(root.join("var/run/cdi/vfio.gpupass.dev_claim_m1.json")).unwrap();
    assert!(spec.contains("\"/dev/vfio/vfio\""), "{spec}");
    assert!(spec.contains(&format!("\"/dev/vfio/{g}\"")), "{spec}");
    assert!(
        spec.contains(&format!("GPUPASS_DRA_MDEV_MTTY_MTTY_2_0={uuid}")),
        "{spec}"
    );
    let meta = std::fs::read_to_string(root.join(format!(
        "var/lib/kubelet/plugins/{DRIVER}/dra-device-metadata/default_tty/serial/metadata.json"
    )))
    .unwrap();
    for line in meta.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let a = &v["requests"][0]["devices"][0]["attributes"];
        assert_eq!(a["mdevUUID"]["string"], uuid.as_str(), "{line}");
        assert_eq!(a["gpupass.dev/mdevType"]["string"], "mtty-2", "{line}");
        assert!(a.get("resource.kubernetes.io/pciBusID").is_none(), "{line}");
    }
    // The scheduler allocated from the pool as it was: the claim's own instance does not
    // shrink it.
    assert_eq!(super::super::slices::pool(&e.as_offered(&inv)), pool0);
    // The slot is healthy while its instance lives.
    let h = e.health(&inv);
    let slot = h.iter().find(|x| x.device == "mdev-mtty-mtty-2-0").unwrap();
    assert!(slot.healthy, "{slot:?}");
    // A retry answers from the checkpoint.
    let writes = crate::testkit::Failpoints::new(FakeHost::new(host.clone()));
    let mut again = engine(&writes, &claims);
    assert_eq!(again.prepare(&tty_claim()).unwrap(), devs);
    assert_eq!(writes.writes(), 0);
    e.unprepare("m1").unwrap();
    let after = crate::inventory::scan(&host).unwrap();
    assert!(after.mdev(&uuid).is_none());
    assert_eq!(super::super::slices::pool(&after), pool0);
    assert!(!root.join("var/run/cdi/vfio.gpupass.dev_claim_m1.json").exists());
    assert!(!root
        .join(format!(
            "var/lib/kubelet/plugins/{DRIVER}/dra-device-metadata/default_tty"
        ))
        .exists());
    assert!(crate::change::journal::read(&host).unwrap().open.is_empty());
}

/// A slot whose type filled up behind the scheduler's back (another user took the last
/// instance) fails its Prepare with the kernel's count, before any write; a slot name that
/// is not offered is refused as unknown; and a Prepare killed after each write of its plan
/// is undone at the next start, the kubelet's retry then preparing it with the UUID the
/// checkpoint kept.
#[test]
fn a_full_type_is_refused_and_a_crashed_mdev_prepare_is_undone_then_retried() {
    let (_t, root, claims) = mtty_claim();
    let host = HostRoot::new(&root);
    let ops = FakeHost::new(host.clone());
    std::fs::write(
        root.join("sys/devices/virtual/mtty/mtty/mdev_supported_types/mtty-2/available_instances"),
        "0\n",
    )
    .unwrap();
    let mut e = engine(&ops, &claims);
    let err = crate::model::ErrorChain(&e.prepare(&tty_claim()).unwrap_err()).to_string();
    // The slot is not offered any more (its type has none available).
    assert!(
        err.contains("mdev-mtty-mtty-2-0") && err.contains("not a device this node offers"),
        "{err}"
    );
    assert!(e.checkpoint().claims.is_empty());
    std::fs::write(
        root.join("sys/devices/virtual/mtty/mtty/mdev_supported_types/mtty-2/available_instances"),
        "1\n",
    )
    .unwrap();
    // Count the plan's writes: create, then the files.
    let counting = crate::testkit::Failpoints::new(FakeHost::new(host.clone()));
    engine(&counting, &claims).prepare(&tty_claim()).unwrap();
    let n_writes = counting.writes();
    assert!(n_writes >= 4, "{n_writes}");
    engine(&ops, &claims).unprepare("m1").unwrap();
    let clean = crate::inventory::scan(&host).unwrap();
    assert!(clean.mdevs.is_empty());
    for n in 1..=n_writes {
        let crashing = crate::testkit::Failpoints::new(FakeHost::new(host.clone())).panic_after(n);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine(&crashing, &claims).prepare(&tty_claim())
        }));
        assert!(r.is_err(), "write {n}: no crash");
        let mut e = engine(&ops, &claims);
        let kept = e.checkpoint().claims["m1"].devices[0].mdev.clone().unwrap().uuid;
        let lines = e.cleanup_at_start();
        assert!(
            lines.iter().any(|l| l.contains("for dra-claim:m1")),
            "write {n}: {lines:?}"
        );
        let now = crate::inventory::scan(&host).unwrap();
        assert!(now.mdevs.is_empty(), "write {n}: the instance was undone");
        assert!(
            crate::change::journal::read(&host).unwrap().open.is_empty(),
            "write {n}"
        );
        e.prepare(&tty_claim()).unwrap();
        let uuid = e.checkpoint().claims["m1"].devices[0].mdev.clone().unwrap().uuid;
        assert_eq!(uuid, kept, "write {n}: the retry kept the UUID");
        assert!(crate::inventory::scan(&host).unwrap().mdev(&uuid).is_some());
        e.unprepare("m1").unwrap();
        assert!(
            crate::inventory::scan(&host).unwrap().mdevs.is_empty(),
            "write {n}"
        );
    }
}

/// A device held by a host process fails the Prepare at once, naming the holder, with
/// nothing changed and nothing held in the checkpoint (the kubelet retries); another
/// gpupass holding the lock fails it after the engine's bounded wait, not GPUPASS_LOCK_TIMEOUT's
/// 30 s, and a call's deadline shortens that wait.
#[test]
fn a_device_in_use_or_a_held_lock_fails_fast_naming_why() {
    let (_t, root, claims) = lab_claim_with(|h| {
        h.drm_node(&"0000:00:05.0".parse().unwrap(), "card0").unwrap();
        h.open_fd(4321, "Xorg", 7, "/dev/dri/card0").unwrap();
    });
    let host = HostRoot::new(&root);
    let before = state(&root);
    let ops = FakeHost::new(host.clone());
    let mut e = engine(&ops, &claims);
    let t0 = Instant::now();
    let err = crate::model::ErrorChain(&e.prepare(&gpu_claim()).unwrap_err()).to_string();
    assert!(err.contains("is open by pid 4321 (Xorg)"), "{err}");
    assert!(
        err.starts_with("claim default/gpu (u1): prepare failed: "),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(state(&root), before);
    assert!(e.checkpoint().claims.is_empty());
    std::fs::remove_dir_all(root.join("proc/4321")).unwrap();

    // Another gpupass holds the lock.
    let held = crate::change::journal::lock(&host, Duration::ZERO).unwrap();
    let mut e = engine(&ops, &claims).with_lock_wait(Duration::from_millis(300));
    let t0 = Instant::now();
    let err = crate::model::ErrorChain(&e.prepare(&gpu_claim()).unwrap_err()).to_string();
    assert!(err.contains("did not finish within 0.3 s"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(e.checkpoint().claims.is_empty());
    // A deadline sooner than the wait shortens it; one already past tries once.
    let e = e.with_lock_wait(Duration::from_secs(30));
    let soon = e.wait_for(Some(Instant::now() + Duration::from_secs(2)));
    assert!(
        soon <= Duration::from_millis(1500) && soon > Duration::from_millis(1000),
        "{soon:?}"
    );
    assert_eq!(e.wait_for(Some(Instant::now())), Duration::ZERO);
    assert_eq!(e.wait_for(None), Duration::from_secs(30));
    let mut e = e;
    let t0 = Instant::now();
    let err = e
        .prepare_until(&gpu_claim(), Some(Instant::now() + Duration::from_millis(700)))
        .unwrap_err();
    assert!(
        crate::model::ErrorChain(&err)
            .to_string()
            .contains("did not finish within 0"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_millis(1500), "{:?}", t0.elapsed());
    drop(held);
    assert_eq!(state(&root), before);
    e.prepare(&gpu_claim()).unwrap();
    assert_eq!(driver_of(&root, "0000:00:05.0").as_deref(), Some("vfio-pci"));
}

/// A group of two GPUs in different slots, one of them bound to vfio-pci before gpupass
/// (a boot-time bind): Prepare binds the other, Unprepare gives back only that one.
#[test]
fn a_member_on_vfio_before_stays_there_and_only_moved_functions_go_back() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("host");
    let mut h = HostBuilder::new(&root).unwrap();
    h.kernel(
        "6.1.0-27-amd64",
        "ro intel_iommu=on",
        &["vfio", "vfio_pci", "nvidia"],
    )
    .unwrap();
    h.add(
        &DevSpec::new("03:00.0", 0x10de, 0x2684, 0x030000)
            .group(7)
            .driver("nvidia"),
    )
    .unwrap();
    h.add(
        &DevSpec::new("04:00.0", 0x10de, 0x2684, 0x030000)
            .group(7)
            .driver("vfio-pci"),
    )
    .unwrap();
    h.file("dev/vfio/vfio", "").unwrap();
    let claims = t.path().join("claims");
    std::fs::create_dir_all(claims.join("default")).unwrap();
    let c = serde_json::json!({
        "metadata": {"name": "gpu", "namespace": "default", "uid": "u1"},
        "status": {"allocation": {
            "devices": {"results": [{"request": "vfio", "driver": "vfio.gpupass.dev", "pool": "node-a", "device": "pci-0000-03-00-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}
        }}
    });
    std::fs::write(claims.join("default/gpu.json"), c.to_string()).unwrap();
    let ops = FakeHost::new(HostRoot::new(&root));
    let me = Identity {
        driver: "vfio.gpupass.dev".into(),
        node: "node-a".into(),
        pool: "node-a".into(),
    };
    let mut e = kit(Driver::new(&ops, me, Policy::Auto, "b1".into()).unwrap(), &claims);
    let r = ClaimRef {
        namespace: "default".into(),
        uid: "u1".into(),
        name: "gpu".into(),
    };
    let devs = e.prepare(&r).unwrap();
    assert_eq!(devs[0].device, "pci-0000-03-00-0");
    assert_eq!(driver_of(&root, "0000:03:00.0").as_deref(), Some("vfio-pci"));
    assert_eq!(driver_of(&root, "0000:04:00.0").as_deref(), Some("vfio-pci"));
    let entry = &e.checkpoint().claims["u1"];
    assert_eq!(entry.state, State::Completed);
    assert_eq!(entry.moved(), ["0000:03:00.0".parse::<PciAddress>().unwrap()]);
    e.unprepare("u1").unwrap();
    assert_eq!(driver_of(&root, "0000:03:00.0").as_deref(), Some("nvidia"));
    assert_eq!(
        driver_of(&root, "0000:04:00.0").as_deref(),
        Some("vfio-pci"),
        "a boot-time bind stays"
    );

    // A claim deleted while the plugin was down: unprepared when the plugin starts.
    e.prepare(&r).unwrap();
    let claim_file = t.path().join("claims/default/gpu.json");
    let text = std::fs::read_to_string(&claim_file).unwrap();
    std::fs::remove_file(&claim_file).unwrap();
    let source = t.path().join("claims");
    let mut restarted = kit(
        Driver::new(&ops, e.me.clone(), Policy::Auto, "b1".into()).unwrap(),
        &source,
    );
    assert_eq!(
        restarted.cleanup_at_start(),
        ["claim default/gpu (u1) deleted: unprepared"]
    );
    assert_eq!(driver_of(&root, "0000:03:00.0").as_deref(), Some("nvidia"));
    assert!(restarted.checkpoint().claims.is_empty());

    // A claim of an earlier boot: at start its files go, its functions are not touched.
    std::fs::write(&claim_file, text).unwrap();
    restarted.prepare(&r).unwrap();
    let mut after_reboot = kit(
        Driver::new(&ops, e.me.clone(), Policy::Auto, "b2".into()).unwrap(),
        &source,
    );
    let lines = after_reboot.cleanup_at_start();
    assert_eq!(
        lines,
        ["claim default/gpu (u1) prepared before the node rebooted: unprepared"]
    );
    assert!(after_reboot.checkpoint().claims.is_empty());
    assert!(!root.join("var/run/cdi/vfio.gpupass.dev_claim_u1.json").exists());
    assert_eq!(
        driver_of(&root, "0000:03:00.0").as_deref(),
        Some("vfio-pci"),
        "the fake host did not reboot; a real reboot would have reset it"
    );
}

/// Binding conditions (super::binding): the group that needs a switch is published with
/// them (a group on vfio-pci already is not, and a group a claim moved keeps them); a
/// member held by a host process fails the bind before binding as `InUse`, naming the
/// holder, changing nothing; without the holder the group is bound (no files) and recorded
/// `bound` with the drivers before; a second bind changes nothing; Prepare then finds the
/// group bound and writes only the files, Unprepare gives it back; a claim bound before
/// binding and then gone is given back by the plugin, a prepared one is not.
#[test]
fn a_group_bound_before_binding_is_taken_over_by_prepare_or_given_back() {
    use crate::containers::kubelet::binding::DeviceKey;
    let (_t, root, claims) = lab_claim_with(|h| {
        h.drm_node(&"0000:00:05.0".parse().unwrap(), "card0").unwrap();
        h.open_fd(4321, "Xorg", 7, "/dev/dri/card0").unwrap();
        h.add(
            &DevSpec::new("00:06.0", 0x1234, 0x11e8, 0x00ff00)
                .group(5)
                .driver("vfio-pci"),
        )
        .unwrap();
    });
    let host = HostRoot::new(&root);
    let ops = FakeHost::new(host.clone());
    let mut e = engine(&ops, &claims);
    e.binding_conditions = true;
    type Conds = (Option<Vec<String>>, Option<Vec<String>>);
    let conds = |e: &mut Kit<'_>| -> BTreeMap<String, Conds> {
        e.resources()
            .unwrap()
            .pool
            .devices
            .into_iter()
            .map(|d| (d.name, (d.binding_conditions, d.binding_failure_conditions)))
            .collect()
    };
    let marked = (
        Some(vec![super::super::slices::READY.to_string()]),
        Some(vec![super::super::slices::FAILED.to_string()]),
    );
    let c = conds(&mut e);
    assert_eq!(c["pci-0000-00-05-0"], marked);
    assert_eq!(
        c["pci-0000-00-06-0"],
        (None, None),
        "on vfio-pci already: no switch"
    );
    let keys = [DeviceKey {
        request: "vfio".into(),
        pool: "node-a".into(),
        device: "pci-0000-00-05-0".into(),
    }];
    let claim = fetch(&e.src, &gpu_claim()).unwrap();
    let before = state(&root);

    let f = e.bind_early(&claim, &keys).unwrap_err();
    assert_eq!(f.reason, "InUse", "{f:?}");
    assert!(f.message.contains("is open by pid 4321 (Xorg)"), "{}", f.message);
    assert_eq!(state(&root), before);
    assert!(e.checkpoint().claims.is_empty());
    // Busy: published with the busy taint (and still Healthy: nothing is wrong with it), so
    // the scheduler does not choose it again while the holder runs; rechecked on every refresh.
    let taints = |e: &mut Kit<'_>| -> BTreeMap<String, Vec<String>> {
        let r = e.resources().unwrap();
        assert!(r.health.iter().all(|h| h.healthy), "{:?}", r.health);
        r.pool
            .devices
            .into_iter()
            .map(|d| {
                let t = d.taints.unwrap_or_default();
                (
                    d.name,
                    t.iter()
                        .map(|t| format!("{}={}:{}", t.key, t.value.clone().unwrap_or_default(), t.effect))
                        .collect(),
                )
            })
            .collect()
    };
    for _ in 0..2 {
        let t = taints(&mut e);
        assert_eq!(t["pci-0000-00-05-0"], ["gpupass.dev/busy=InUse:NoSchedule"]);
        assert!(t["pci-0000-00-06-0"].is_empty(), "{t:?}");
    }

    std::fs::remove_dir_all(root.join("proc/4321")).unwrap();
    assert!(
        taints(&mut e)["pci-0000-00-05-0"].is_empty(),
        "the holder is gone: the taint goes at the next refresh"
    );
    let msg = e.bind_early(&claim, &keys).unwrap();
    assert!(msg.contains("IOMMU group 4 on vfio-pci"), "{msg}");
    assert_eq!(driver_of(&root, "0000:00:05.0").as_deref(), Some("vfio-pci"));
    assert_eq!(driver_of(&root, "0000:00:05.1").as_deref(), Some("vfio-pci"));
    let entry = &e.checkpoint().claims["u1"];
    assert_eq!(entry.state, State::Bound);
    assert_eq!(
        entry.drivers_before.values().cloned().collect::<Vec<_>>(),
        [Some("bochs-drm".to_string()), Some("snd_hda_intel".to_string())]
    );
    assert!(
        !state(&root).keys().any(|k| k.starts_with("var/")),
        "no files before Prepare"
    );
    assert_eq!(
        conds(&mut e)["pci-0000-00-05-0"],
        marked,
        "published as before the bind"
    );
    let j = journal(&root);
    assert!(e.bind_early(&claim, &keys).unwrap().contains("already"));
    assert_eq!(journal(&root), j, "a second bind writes nothing");

    // Prepare takes it over: no bind, only the files; Unprepare gives the group back.
    e.prepare(&gpu_claim()).unwrap();
    assert_eq!(e.checkpoint().claims["u1"].state, State::Completed);
    assert_eq!(
        e.checkpoint().claims["u1"].drivers_before[&"0000:00:05.0".parse::<PciAddress>().unwrap()].as_deref(),
        Some("bochs-drm")
    );
    assert!(state(&root).keys().any(|k| k.starts_with("var/run/cdi")));
    assert!(
        e.release_early(&|_| true).is_empty(),
        "a prepared claim is the kubelet's"
    );
    e.unprepare("u1").unwrap();
    assert_eq!(state(&root), before);

    // Bound before binding, then deallocated: the plugin gives it back.
    e.bind_early(&claim, &keys).unwrap();
    assert!(e.release_early(&|c| c.uid != "u1").is_empty());
    let lines = e.release_early(&|c| c.uid == "u1");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("given back"), "{lines:?}");
    assert_eq!(state(&root), before);
    assert!(e.checkpoint().claims.is_empty());
}

/// A host `gpupass bind` that wins the race for the lock while a claim's attempt waits for it
/// (the attempt recorded the drivers before it had the lock): the claim did not move the
/// group, so its record is settled to the drivers the bind left and its Unprepare leaves them
/// (the clusterhelm race with binding conditions on); a function the plan did move is
/// recorded as on the driver the plan moved it from.
#[test]
fn drivers_recorded_before_the_lock_are_settled_against_what_the_plan_moved() {
    let (_t, root, claims) = lab_claim();
    let ops = FakeHost::new(HostRoot::new(&root));
    let mut e = engine(&ops, &claims);
    e.prepare(&gpu_claim()).unwrap();
    let vga: PciAddress = "0000:00:05.0".parse().unwrap();
    let aud: PciAddress = "0000:00:05.1".parse().unwrap();
    let entry = |e: &Kit<'_>| e.checkpoint().claims["u1"].clone();
    assert_eq!(entry(&e).moved(), [vga, aud]);
    // The plan moved 00:05.0 only, from simpledrm (the view the claim was checked against
    // said bochs-drm), and 00:05.1 was bound by someone else meanwhile: 00:05.0 is recorded
    // as on simpledrm, 00:05.1 is settled to the vfio-pci it is on.
    let from = BTreeMap::from([(vga, Some("simpledrm".to_string()))]);
    e.settle_before("u1", &BTreeMap::new(), &from);
    assert_eq!(entry(&e).moved(), [vga]);
    assert_eq!(entry(&e).drivers_before[&vga].as_deref(), Some("simpledrm"));
    assert_eq!(entry(&e).drivers_before[&aud].as_deref(), Some("vfio-pci"));
    // Drivers an earlier attempt recorded are kept whatever this one moved.
    let mut e = engine(&ops, &claims);
    let kept = BTreeMap::from([(vga, Some("bochs-drm".to_string()))]);
    e.settle_before("u1", &kept, &from);
    assert_eq!(entry(&e).drivers_before[&vga].as_deref(), Some("bochs-drm"));
    // Unprepare gives back only what the claim moved.
    e.unprepare("u1").unwrap();
    assert_eq!(driver_of(&root, "0000:00:05.0").as_deref(), Some("bochs-drm"));
    assert_eq!(driver_of(&root, "0000:00:05.1").as_deref(), Some("vfio-pci"));
}

/// A Prepare checks its claim against the host its slices were last published from, not a
/// read of its own: the host may have changed since (here 00:05.1 moved to another driver),
/// and what the claim records is what the engine found under the lock, so its Unprepare
/// gives the function back to the driver it was on when the claim took it.
#[test]
fn a_claim_checked_against_the_published_view_records_the_drivers_found_under_the_lock() {
    let (_t, root, claims) = lab_claim();
    let ops = FakeHost::new(HostRoot::new(&root));
    let mut e = engine(&ops, &claims);
    // Published: 00:05.1 on snd_hda_intel.
    let r = e.resources().unwrap();
    assert!(
        r.pool.devices.iter().any(|d| d.name == "pci-0000-00-05-0"),
        "{:?}",
        r.pool
    );
    crate::testkit::fixtures::point_driver(&root, "0000:00:05.1", "snd_hda_codec_generic").unwrap();
    let start = crate::inventory::counted::scans();
    e.prepare(&gpu_claim()).unwrap();
    let now = crate::inventory::counted::scans();
    // The bind's group scan and the read after the writes (for the claim's files): the
    // claim check read nothing.
    assert_eq!((now.0 - start.0, now.1 - start.1), (1, 1));
    let aud: PciAddress = "0000:00:05.1".parse().unwrap();
    let before = e.checkpoint().claims["u1"].drivers_before.clone();
    assert_eq!(
        before[&aud].as_deref(),
        Some("snd_hda_codec_generic"),
        "{before:?}"
    );
    e.unprepare("u1").unwrap();
    assert_eq!(driver_of(&root, "0000:00:05.0").as_deref(), Some("bochs-drm"));
    assert_eq!(
        driver_of(&root, "0000:00:05.1").as_deref(),
        Some("snd_hda_codec_generic")
    );
}

/// A bind before binding refused at its claim check (here: the group is held by another
/// claim of this boot) changes nothing, so the view it took is the host's still: the next
/// request reads no whole host again.
#[test]
fn a_bind_before_binding_refused_at_the_claim_check_keeps_the_view() {
    use crate::containers::kubelet::binding::DeviceKey;
    let (_t, root, claims) = lab_claim();
    let second = second_claim(&claims);
    let ops = FakeHost::new(HostRoot::new(&root));
    let mut e = engine(&ops, &claims);
    e.binding_conditions = true;
    e.prepare(&gpu_claim()).unwrap();
    let held = state(&root);
    let keys = [DeviceKey {
        request: "vfio".into(),
        pool: "node-a".into(),
        device: "pci-0000-00-05-0".into(),
    }];
    let claim = fetch(&e.src, &second).unwrap();
    let start = crate::inventory::counted::scans();
    for _ in 0..2 {
        let f = e.bind_early(&claim, &keys).unwrap_err();
        assert_eq!(f.reason, "HeldByClaim", "{f:?}");
        assert!(
            f.message.contains("is prepared for claim default/gpu (u1)"),
            "{f:?}"
        );
    }
    let now = crate::inventory::counted::scans();
    assert_eq!(
        (now.0 - start.0, now.1 - start.1),
        (0, 0),
        "two refusals read the host"
    );
    assert_eq!(state(&root), held);
    e.unprepare("u1").unwrap();
}
