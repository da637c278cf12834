//! `gpupass dra slices` as the real binary: golden ResourceSlices and `--explain` tables for the
//! fixture hosts, the API's limits on the 4096-function generated host, and `--from-json`
//! giving what `--root` gives. (The plugin's gRPC services are tested in
//! src/containers/dra/tests.rs with a tonic client over unix sockets.)

use crate::util::*;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// tests/dra-validate (Kubernetes' own Go code at v0.37.2: k8s.io/api's resource/v1 types and
/// limits, k8s.io/dynamic-resource-allocation's metadata reader), built once per run into the
/// test target directory with the go of `lab/tools/go.sh`; None (SKIPPED) when no Go 1.26 can be
/// had outside CI.
fn dra_validator() -> Option<&'static PathBuf> {
    static HELPER: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let r = HELPER.get_or_init(|| {
        let go = crate::cdi_validate::go()?;
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dra-validate");
        let tmp = out.with_extension("tmp");
        let o = Command::new(&go)
            .current_dir(manifest_dir().join("tests/dra-validate"))
            .args(["build", "-trimpath", "-o"])
            .arg(&tmp)
            .arg(".")
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-mod=readonly")
            .output()
            .map_err(|e| format!("{}: {e}", go.display()))?;
        if !o.status.success() {
            return Err(format!(
                "go build of tests/dra-validate failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        std::fs::rename(&tmp, &out).map_err(|e| e.to_string())?;
        Ok(out)
    });
    match r {
        Ok(p) => Some(p),
        Err(why) if why.starts_with(crate::cdi_validate::NO_GO) => {
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "{why}: CI must run this test"
            );
            eprintln!("SKIPPED: {why} (mandatory when CI=true)");
            None
        }
        Err(why) => panic!("{why}"),
    }
}

/// `dra-validate MODE` on `text`: its OK line (panics with its message otherwise).
fn dra_validate(helper: &PathBuf, mode: &str, text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("input.json");
    std::fs::write(&f, text).unwrap();
    let o = Command::new(helper).arg(mode).arg(&f).output().unwrap();
    assert!(
        o.status.success(),
        "dra-validate {mode} refused it: {}\n{text}",
        stderr(&o)
    );
    let line = stdout(&o);
    assert!(line.starts_with(&format!("OK {mode} ")), "{line}");
    line
}

/// Every shipped fixture host but the lab capture's twin sets (qemu-lab has the lab's
/// 00:05.0 + 00:05.1 group).
const HOSTS: &[&str] = &[
    "workstation",
    "hgx-8gpu",
    "sriov-vgpu",
    "mdev-t4",
    "nvidia-minors",
    "vfio-numa",
    "legacy-bridge",
    "qemu-lab",
];

/// The API's limits, checked on any rendered List (k8s.io/api v0.37.2 resource/v1).
fn check_limits(list: &serde_json::Value) -> usize {
    let items = list["items"].as_array().expect("items");
    assert!(!items.is_empty(), "a pool has at least one slice");
    let mut names = std::collections::BTreeSet::new();
    let mut devices = 0;
    for s in items {
        assert_eq!(s["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(s["kind"], "ResourceSlice");
        let spec = &s["spec"];
        assert_eq!(
            spec["pool"]["resourceSliceCount"].as_u64().unwrap() as usize,
            items.len()
        );
        assert_eq!(spec["pool"]["name"], spec["nodeName"]);
        // KEP-4815: a slice holds devices or counter sets, never both; a slice whose devices
        // consume counters holds at most 64 (ResourceSliceMaxDevicesWithAdvancedFeatures).
        let empty = Vec::new();
        let devs = spec["devices"].as_array().unwrap_or(&empty);
        let sets = spec["sharedCounters"].as_array().unwrap_or(&empty);
        assert!(
            devs.is_empty() || sets.is_empty(),
            "devices and counters in one slice"
        );
        assert!(sets.len() <= 8, "ResourceSliceMaxCounterSets: {}", sets.len());
        let counting = devs.iter().any(|d| d.get("consumesCounters").is_some());
        let most = if counting { 64 } else { 128 };
        assert!(
            devs.len() <= most,
            "ResourceSliceMaxDevices: {} (most {most})",
            devs.len()
        );
        for d in devs {
            let name = d["name"].as_str().unwrap();
            assert!(
                name.len() <= 63
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            );
            assert!(names.insert(name.to_string()), "{name} twice in the pool");
            let attrs = d["attributes"].as_object().unwrap();
            assert!(
                attrs.len() <= 32,
                "ResourceSliceMaxAttributesAndCapacitiesPerDevice"
            );
            for (k, v) in attrs {
                let (domain, id) = k.split_once('/').unwrap();
                assert!(domain.len() <= 63 && id.len() <= 32, "{k}");
                assert_eq!(v.as_object().unwrap().len(), 1, "{k}: exactly one value");
                if let Some(s) = v["string"].as_str() {
                    assert!(s.len() <= 64, "{k}: {s}");
                }
            }
            // A whole group carries the standard pciBusID (KubeVirt's passthrough key); an mdev
            // slot never does (KubeVirt would take it for a PCI device).
            match attrs["gpupass.dev/type"]["string"].as_str() {
                Some("group") => {
                    assert!(attrs.contains_key("resource.kubernetes.io/pciBusID"));
                    assert!(attrs.contains_key("resource.kubernetes.io/pcieRoot"));
                }
                Some("mdev") => {
                    assert!(!attrs.contains_key("resource.kubernetes.io/pciBusID"));
                    assert!(attrs.contains_key("gpupass.dev/mdevType"));
                    assert!(d["consumesCounters"].is_array(), "{name}");
                }
                other => panic!("{name}: type {other:?}"),
            }
            devices += 1;
        }
    }
    devices
}

#[test]
fn slices_and_explanations_match_golden_and_keep_the_api_limits() {
    for h in HOSTS {
        let o = on_host(h, &["dra", "slices", "--node", "node-a"]);
        let text = ok(&o);
        golden(&format!("{h}/dra-slices.json"), &text);
        let list: serde_json::Value = serde_json::from_str(&text).unwrap();
        let published = check_limits(&list);
        if let Some(v) = dra_validator() {
            let line = dra_validate(v, "slices", &text);
            assert!(line.ends_with(&format!(" devices {published}\n")), "{h}: {line}");
        }
        let explain = ok(&on_host(h, &["dra", "slices", "--explain"]));
        golden(&format!("{h}/dra-explain.txt"), &explain);
        let decisions = ok_json(&on_host(h, &["--json", "dra", "slices", "--explain"]));
        let all = decisions.as_array().unwrap();
        let groups: Vec<&serde_json::Value> = all.iter().filter(|d| d.get("members").is_some()).collect();
        let types: Vec<&serde_json::Value> = all.iter().filter(|d| d.get("mdev_type").is_some()).collect();
        assert_eq!(groups.len() + types.len(), all.len(), "{h}");
        let n = groups.iter().filter(|d| d["device"].is_string()).count()
            + types
                .iter()
                .map(|t| t["slots"].as_u64().unwrap() as usize)
                .sum::<usize>();
        assert_eq!(n, published, "{h}: --explain and the slices agree");
        for d in groups {
            assert!(d["device"].is_string() != d["reason"].is_string(), "{h}: {d}");
        }
        for d in types {
            assert!(
                d["slots"].as_u64() != Some(0) || d["reason"].is_string(),
                "{h}: {d}"
            );
        }
    }
}

/// The shipped DeviceClasses and claim examples (contrib/dra) on every fixture host's slices,
/// through the scheduler's own CEL (tests/dra-validate `cel`: a class's selectors, then the
/// request's, on every device): no selector errors (a selector that reads an attribute a device
/// lacks fails the whole allocation), on hosts with NUMA (`hgx-8gpu`, `vfio-numa`: the standard
/// `resource.kubernetes.io/numaNode` published) and without (`workstation`, `qemu-lab`: absent).
#[test]
fn the_claim_examples_evaluate_on_every_host_with_or_without_numa() {
    let Some(v) = dra_validator() else { return };
    let dir = manifest_dir().join("contrib/dra");
    let mut seen = Vec::new();
    for h in HOSTS {
        let text = ok(&on_host(h, &["dra", "slices", "--node", "node-a"]));
        let list: serde_json::Value = serde_json::from_str(&text).unwrap();
        let numa = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter(|d| d["attributes"].get("resource.kubernetes.io/numaNode").is_some())
            .count();
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), &text).unwrap();
        let o = Command::new(v)
            .arg("cel")
            .arg(f.path())
            .arg(dir.join("deviceclass.yaml"))
            .arg(dir.join("claim-examples.yaml"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{h}: {}", stderr(&o));
        let line = stdout(&o);
        seen.push(format!("{h} numa={numa}: {}", line.trim_end()));
    }
    let seen = seen.join("\n");
    // hgx-8gpu: 8 GPUs with 64 GiB BARs, 4 on each of 2 nodes; the workstation's GPU has no
    // NUMA node and is taken anywhere; the lab's VGA and mtty slots are what the lab claims.
    for want in [
        "hgx-8gpu numa=8: OK cel big-bar-gpu=4 ",
        "workstation numa=0: OK cel big-bar-gpu=1 ",
        "qemu-lab numa=0: OK cel big-bar-gpu=0 lab-mtty=12 lab-vga=1 ",
    ] {
        assert!(seen.contains(want), "{want}\n{seen}");
    }
}

#[test]
fn the_lab_group_is_one_device_and_refusals_say_why() {
    let list = ok_json(&on_host("qemu-lab", &["dra", "slices", "--node", "node-a"]));
    let devs = list["items"][0]["spec"]["devices"].as_array().unwrap();
    let d = devs
        .iter()
        .find(|d| d["name"] == "pci-0000-00-05-0")
        .expect("the 00:05.0 group");
    assert_eq!(
        d["attributes"]["gpupass.dev/members"]["string"],
        "0000:00:05.0,0000:00:05.1"
    );
    assert_eq!(d["attributes"]["gpupass.dev/iommuGroup"]["int"], 4);
    assert!(
        !devs.iter().any(|d| d["name"] == "pci-0000-00-05-1"),
        "one device per group"
    );
    let explain = ok(&on_host("workstation", &["dra", "slices", "--explain"]));
    assert!(
        explain.contains("0000:02:00.0\n       not published: has no GPU, accelerator or function already on vfio-pci (0000:02:00.0 (Non-Volatile memory controller, nvme))"),
        "{explain}"
    );
    assert!(explain.contains("boot VGA"), "{explain}");
}

#[test]
fn the_4096_function_host_is_split_into_slices_of_at_most_128() {
    let t = tempfile::tempdir().unwrap();
    // The benches' generator at 4096 functions, GPU-dense (1000 GPUs with their audio
    // functions and root ports, NICs for the rest) so the pool needs more than one slice; the
    // benches' own mix (64 GPUs) publishes 64 devices, one slice.
    gpupass::testkit::fixtures::synthetic(t.path(), 4096, 1000).unwrap();
    let root = t.path().to_str().unwrap();
    let start = std::time::Instant::now();
    let list = ok_json(&gpupass(&["--root", root, "dra", "slices", "--node", "big"]));
    let took = start.elapsed();
    let devices = check_limits(&list);
    let slices = list["items"].as_array().unwrap().len();
    if let Some(v) = dra_validator() {
        let line = dra_validate(v, "slices", &list.to_string());
        assert_eq!(line, format!("OK slices {slices} devices {devices}\n"));
    }
    let explain = ok_json(&gpupass(&[
        "--root",
        root,
        "--json",
        "dra",
        "slices",
        "--explain",
    ]));
    let published = explain
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["device"].is_string())
        .count();
    assert_eq!(devices, published);
    assert!(devices > 0);
    assert_eq!(devices, 1000);
    assert_eq!(slices, 8, "1000 devices, at most 128 per slice");
    eprintln!("4096 functions: {devices} devices in {slices} slices, rendered in {took:?} (scan included)");
}

#[test]
fn from_json_gives_what_root_gives() {
    let t = tempfile::tempdir().unwrap();
    let inv = t.path().join("inv.json");
    std::fs::write(&inv, ok(&on_host("hgx-8gpu", &["list", "--all", "--json"]))).unwrap();
    let direct = ok(&on_host("hgx-8gpu", &["dra", "slices", "--node", "n1"]));
    let from = ok(&gpupass(&[
        "--from-json",
        inv.to_str().unwrap(),
        "dra",
        "slices",
        "--node",
        "n1",
    ]));
    assert_eq!(from, direct);
    let direct = ok(&on_host("hgx-8gpu", &["dra", "slices", "--explain"]));
    let from = ok(&gpupass(&[
        "--from-json",
        inv.to_str().unwrap(),
        "dra",
        "slices",
        "--explain",
    ]));
    assert_eq!(from, direct);
}

#[test]
fn the_plugin_needs_the_live_host_and_a_valid_driver_name() {
    let t = tempfile::tempdir().unwrap();
    let inv = t.path().join("inv.json");
    std::fs::write(&inv, ok(&on_host("qemu-lab", &["list", "--all", "--json"]))).unwrap();
    let o = gpupass(&["--from-json", inv.to_str().unwrap(), "dra-plugin", "--node", "n"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("`gpupass dra-plugin` works on the live host"),
        "{}",
        stderr(&o)
    );
    // A root without a boot id (the fixtures have none): refused before anything is created.
    let scratch = scratch_host("qemu-lab");
    let root = scratch.path().to_str().unwrap();
    let before = drivers(scratch.path());
    let o = gpupass(&["--root", root, "dra-plugin", "--node", "n"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("cannot read the boot id"), "{}", stderr(&o));
    assert!(!scratch.path().join("var/lib/kubelet").exists());
    assert_eq!(drivers(scratch.path()), before);
    // The fixtures have no proc/sys/kernel/hostname.
    let o = on_host("qemu-lab", &["dra", "slices"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot tell this node's name"),
        "{}",
        stderr(&o)
    );
    let o = on_host(
        "qemu-lab",
        &["dra", "slices", "--driver", "Not_A.DNS", "--node", "n"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("invalid DRA driver name"), "{}", stderr(&o));
}

/// The CDI specs a Prepare writes (the claim's VFIO nodes, and the metadata bind mount), for
/// both backends, load in the reference CDI library (tests/cdi-validate, as `cdi generate`'s
/// specs do), and its metadata file is read by Kubernetes' own KEP-5304 reader
/// (tests/dra-validate).
#[test]
fn prepared_claim_specs_load_in_the_reference_cdi_library() {
    use gpupass::containers::dra::claim::{self, BackendPolicy, Checked, ClaimDevice, ClaimRef};
    let Some(helper) = crate::cdi_validate::need_helper() else {
        return;
    };
    let inv = gpupass::inventory::scan(&gpupass::host::HostRoot::new(host("qemu-lab"))).unwrap();
    let a = |s: &str| s.parse::<gpupass::model::PciAddress>().unwrap();
    let checked = Checked {
        claim: ClaimRef {
            namespace: "default".into(),
            uid: "6b1e0c3a-0f0e-4f5e-9d7c-2a1b3c4d5e6f".into(),
            name: "gpu".into(),
        },
        pod_claim_name: Some("passthrough".into()),
        devices: vec![ClaimDevice {
            request: "vfio".into(),
            pool: "node-a".into(),
            device: "pci-0000-00-05-0".into(),
            group: 4,
            lead: Some(a("0000:00:05.0")),
            members: vec![a("0000:00:05.0"), a("0000:00:05.1")],
            mdev: None,
        }],
        policy: BackendPolicy::Legacy,
        // A VM launcher's claim: the spec's own edits add /dev/kvm (loaded by the library too).
        kvm: true,
    };
    for backend in [gpupass::model::Backend::Legacy, gpupass::model::Backend::Iommufd] {
        let p = claim::result(&inv, "vfio.gpupass.dev", &checked, backend);
        let specs: Vec<_> = p
            .files
            .iter()
            .filter(|f| f.path.starts_with("/var/run/cdi/"))
            .collect();
        assert_eq!(specs.len(), 2, "the claim's spec and the metadata spec");
        assert!(specs[0].contents.contains("/dev/kvm"), "{}", specs[0].contents);
        let mut loaded = Vec::new();
        for f in specs {
            let name = f.path.rsplit('/').next().unwrap().trim_end_matches(".json");
            let names = crate::cdi_validate::validate(helper, name, &f.contents)
                .unwrap_or_else(|e| panic!("{} ({backend}): {e}\n{}", f.path, f.contents));
            loaded.extend(names);
        }
        // The metadata file, read by Kubernetes' own reader (and as a v1alpha1-only reader).
        if let Some(line) = metadata_read(&p) {
            assert_eq!(line, "OK metadata default gpu pci-0000-00-05-0 0000:00:05.0\n");
        }
        // Every CDI device ID handed to the kubelet is one the library loaded.
        for id in &p.devices[0].cdi_device_ids {
            assert!(loaded.contains(id), "{id} not in {loaded:?}");
        }
    }
    // An mdev slot's claim (the lab capture's mbochs instance, group 12): the CDI spec hands
    // the instance's group, and Kubernetes' reader (and a v1alpha1-only one, as KubeVirt's
    // is) finds its mdevUUID and no pciBusID.
    let inv = gpupass::inventory::scan(&gpupass::host::HostRoot::new(host("mdev-lab"))).unwrap();
    let uuid = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001";
    let checked = Checked {
        claim: ClaimRef {
            namespace: "default".into(),
            uid: "0c1d2e3f-0f0e-4f5e-9d7c-2a1b3c4d5e6f".into(),
            name: "display".into(),
        },
        pod_claim_name: None,
        devices: vec![ClaimDevice {
            request: "mdev".into(),
            pool: "node-a".into(),
            device: "mdev-mbochs-mbochs-small-0".into(),
            group: 0,
            lead: None,
            members: Vec::new(),
            mdev: Some(claim::ClaimMdev {
                parent: "mbochs".into(),
                mdev_type: "mbochs-small".into(),
                uuid: uuid.into(),
            }),
        }],
        policy: BackendPolicy::Legacy,
        kvm: false,
    };
    assert_eq!(
        claim::choose_backend(&inv, &checked).unwrap(),
        gpupass::model::Backend::Legacy
    );
    let p = claim::result(
        &inv,
        "vfio.gpupass.dev",
        &checked,
        gpupass::model::Backend::Legacy,
    );
    let spec = p
        .files
        .iter()
        .find(|f| f.path.ends_with(&format!("_claim_{}.json", checked.claim.uid)))
        .unwrap();
    assert!(
        spec.contains_nodes(&["/dev/vfio/vfio", "/dev/vfio/12"]),
        "{}",
        spec.contents
    );
    let name = spec.path.rsplit('/').next().unwrap().trim_end_matches(".json");
    crate::cdi_validate::validate(helper, name, &spec.contents)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", spec.path, spec.contents));
    if let Some(line) = metadata_read(&p) {
        assert_eq!(
            line,
            format!("OK metadata default display mdev-mbochs-mbochs-small-0 {uuid}\n")
        );
    }
}

/// The prepared claim's metadata file read by Kubernetes' reader (tests/dra-validate): its OK
/// line; `None` where the helper is skipped.
fn metadata_read(p: &gpupass::containers::dra::claim::Prepared) -> Option<String> {
    let v = dra_validator()?;
    let m = p
        .files
        .iter()
        .find(|f| f.path.ends_with("/metadata.json"))
        .unwrap();
    Some(dra_validate(v, "metadata", &m.contents))
}

trait Nodes {
    fn contains_nodes(&self, paths: &[&str]) -> bool;
}

impl Nodes for gpupass::containers::dra::claim::FileWrite {
    /// Whether the spec's JSON names each of `paths` as a device node path.
    fn contains_nodes(&self, paths: &[&str]) -> bool {
        paths.iter().all(|p| {
            self.contents.contains(&format!("\"path\": \"{p}\""))
                || self.contents.contains(&format!("\"path\":\"{p}\""))
        })
    }
}
