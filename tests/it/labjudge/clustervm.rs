//! The judge of `lab/scenarios/clustervm.sh`: a VM in a Pod on the real kubelet of the cluster
//! lab, on both kernel legs. Per backend (legacy, then iommufd): the scheduler allocates the claim (class
//! `vm.vfio.gpupass.dev`: the group plus `/dev/kvm`) for the bochs-display 00:03.0, the Pod
//! runs to Succeeded unprivileged, its container held exactly its group's VFIO nodes and
//! `/dev/kvm`, and `gpupass boot --dra-metadata` found the device in the claim's KEP-5304 file
//! and booted its firmware on it under nested KVM, reading the device's ids and the Bochs dispi
//! id through VFIO with the claim's backend; deleting the Pod gives the function back to its
//! driver. Then the plugin's checkpoint and the journal are empty and the plugin stops.
//!
//! 6.1 has no iommufd: there the claim that requires it is refused at the device's binding
//! conditions, before the scheduler binds the Pod (`iommufd-refused`: the Pod Pending on no
//! node, gpupass's reason in its events), and the function never leaves its driver
//! (`iommufd-untouched`); the VM steps of that backend are 6.12's.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{check, on_leg, one_line, Check, Judge, Out, Verdict};

const VGA: &str = "0000:00:03.0";
const DEVICE: &str = "pci-0000-00-03-0";
const DRIVER: &str = "vfio.gpupass.dev";
/// The function's host driver (the lab's bochs-display).
const HOST_DRIVER: &str = "bochs-drm";
const BACKENDS: [&str; 2] = ["legacy", "iommufd"];
/// Where the kubelet mounts a template claim's metadata file for request `vfio`.
const METADATA: &str =
    "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/vfio/vfio/vfio.gpupass.dev-metadata.json";

pub fn judge() -> Judge {
    let mut c: Vec<Check> = vec![
        check("start", |o| {
            let f = o.facts("start")?;
            f.is("vga.driver", HOST_DRIVER)?;
            f.is("dev.kvm", "char")?;
            let g = f.num("vga.group")?;
            Ok(format!(
                "kernel {}, {VGA} on {HOST_DRIVER} in group {g}, /dev/kvm on the node",
                f.get("kernel")?
            ))
        }),
        check("plugin-registered", |o| {
            let f = o.facts("plugin")?;
            if f.num("registered")? < 1 {
                return Err(format!(
                    "the kubelet did not register {DRIVER}: {}",
                    f.get("last")?
                ));
            }
            Ok(format!(
                "the kubelet registered {DRIVER} after {} s",
                f.get("seconds")?
            ))
        }),
        check("classes-applied", |o| {
            let c = o.cmd("classes")?;
            c.rc_is(0)?;
            c.out_has(&format!("deviceclass.resource.k8s.io/vm.{DRIVER}"))?;
            Ok(one_line(&c.out))
        }),
    ];
    for b in BACKENDS {
        c.extend(per_backend(b));
    }
    c.extend([
        check("checkpoint-empty", |o| {
            let f = o.facts("end")?;
            f.is("checkpoint.uids", "0")?;
            Ok("no claim in the plugin's checkpoint".into())
        }),
        check("journal-empty", |o| {
            let c = o.cmd("recover")?;
            c.rc_is(0)?;
            c.out_has("nothing to recover")?;
            Ok(one_line(&c.out))
        }),
        check("plugin-stop", |o| {
            let f = o.facts("plugin-stop")?;
            f.is("stopped", "yes")?;
            Ok(format!("stopped on SIGTERM in {} s", f.get("seconds")?))
        }),
        check("cluster-frame", |o| {
            let f = o.facts("frame")?;
            f.is("up", "yes")?;
            let failed: Vec<String> = f
                .map
                .iter()
                .filter(|(_, v)| v.starts_with("FAIL"))
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            if !failed.is_empty() {
                return Err(format!("the cluster lab's frame failed: {}", failed.join("; ")));
            }
            Ok(format!("teardown: {}", f.get("teardown")?))
        }),
    ]);
    Judge {
        scenario: "clustervm",
        host_steps: &[],
        checks: c,
    }
}

/// A backend's steps: the VM's on every leg for legacy; for iommufd the VM's on 6.12 and the
/// refusal on 6.1, then on both the Pod's delete and the function back on its driver.
fn per_backend(b: &'static str) -> Vec<Check> {
    let mut c = vm_steps(b);
    if b == "iommufd" {
        c = c.into_iter().map(|x| on_leg("6.12", x)).collect();
        c.extend([
            on_leg("6.1", check(format!("{b}-refused"), move |o| refused(o, b))),
            on_leg("6.1", check(format!("{b}-untouched"), move |o| untouched(o, b))),
        ]);
    }
    c.extend([
        check(format!("{b}-pod-deleted"), move |o| {
            o.cmd(&format!("{b}-delete"))?.rc_is(0)?;
            let f = o.facts(&format!("{b}-after"))?;
            f.is("claim.gone", "yes")?;
            Ok(format!("Pod and its claim deleted ({} s)", f.get("seconds")?))
        }),
        check(format!("{b}-group-restored"), move |o| {
            let f = o.facts(&format!("{b}-after"))?;
            f.is("vga.driver", HOST_DRIVER)?;
            Ok(format!(
                "{VGA} on {HOST_DRIVER} again {} s after the delete",
                f.get("seconds")?
            ))
        }),
    ]);
    c
}

/// The steps of a VM that ran on backend `b`: allocated, Succeeded, the metadata read, the
/// firmware's reads through VFIO, the backend's nodes and no other.
fn vm_steps(b: &'static str) -> Vec<Check> {
    vec![
        check(format!("{b}-claim-allocated"), move |o| claim_allocated(o, b)),
        check(format!("{b}-pod-succeeded"), move |o| pod_succeeded(o, b)),
        check(format!("{b}-metadata-read"), move |o| {
            let log = o.cmd(&format!("{b}-log"))?;
            let line = line_with(&log.out, "gpupass: --dra-metadata: ")?;
            for want in [
                format!("request vfio: {DRIVER}/{DEVICE} (pciBusID {VGA})"),
                format!("from {METADATA};"),
                format!("backend {b} by the claim's gpupass.dev/backend"),
            ] {
                if !line.contains(&want) {
                    return Err(format!("{b}-log: {line:?} does not say {want:?}"));
                }
            }
            Ok(line)
        }),
        check(format!("{b}-vm-ids"), move |o| {
            let log = o.cmd(&format!("{b}-log"))?;
            let line = line_with(&log.out, "FW dev 00:01.0 ")?;
            match line.split_whitespace().nth(3) {
                Some("1234:1111") => Ok(line),
                other => Err(format!(
                    "{b}-log: the guest read ids {other:?}, want 1234:1111: {line}"
                )),
            }
        }),
        check(format!("{b}-vm-dispi"), move |o| {
            let log = o.cmd(&format!("{b}-log"))?;
            let line = line_with(&log.out, "FW dispi ")?;
            if line.trim() == "FW dispi 00:01.0 0xb0c5" {
                Ok(line)
            } else {
                Err(format!("{b}-log: {line:?}, want \"FW dispi 00:01.0 0xb0c5\""))
            }
        }),
        check(format!("{b}-vfio-backend"), move |o| vfio_backend(o, b)),
        check(format!("{b}-only-its-nodes"), move |o| only_its_nodes(o, b)),
    ]
}

/// 6.1: the claim that requires iommufd was refused before the Pod was bound: an event names
/// `require-iommufd` and gpupass's reason, the Pod is Pending on no node with no container.
fn refused(o: &Out, b: &str) -> Verdict {
    let s = o.facts(&format!("{b}-refused"))?.get("seconds")?.to_string();
    let ev = o.cmd(&format!("{b}-events"))?;
    let line = ev
        .out
        .lines()
        .find(|l| l.contains("require-iommufd") && l.contains("cannot use iommufd"))
        .ok_or_else(|| {
            format!(
                "{b}-events: no event names require-iommufd and why the function cannot use it: {}",
                one_line(&ev.out)
            )
        })?;
    let p = o.cmd(&format!("{b}-pod"))?.json()?;
    let phase = p["status"]["phase"].as_str().unwrap_or("?");
    let node = p["spec"]["nodeName"].as_str().unwrap_or("");
    if phase != "Pending" || !node.is_empty() || !p["status"]["containerStatuses"].is_null() {
        return Err(format!(
            "vm-{b}: phase {phase}, node {node:?}, containers {}: want Pending on no node, no container",
            one_line(&p["status"]["containerStatuses"].to_string())
        ));
    }
    let line: String = line.chars().take(300).collect();
    Ok(format!(
        "after {s} s, the Pod Pending and bound to no node: {line}"
    ))
}

/// 6.1: the refused claim changed nothing: every sample of the function's driver while the
/// scheduler retried, and the driver after, are the host's; the claim is not in the plugin's
/// checkpoint; the journal holds nothing.
fn untouched(o: &Out, b: &str) -> Verdict {
    let f = o.facts(&format!("{b}-untouched"))?;
    let samples: Vec<&str> = f.get("samples")?.split_whitespace().collect();
    if samples.is_empty() {
        return Err(format!("{b}-untouched: no samples"));
    }
    if let Some(s) = samples.iter().find(|s| **s != HOST_DRIVER) {
        return Err(format!(
            "{VGA} was on {s} while the claim was retried, want {HOST_DRIVER} throughout"
        ));
    }
    f.is("host.driver", HOST_DRIVER)?;
    let claim = o.cmd(&format!("{b}-claim"))?;
    claim.rc_is(0)?;
    let uid = claim.json()?["metadata"]["uid"]
        .as_str()
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .ok_or_else(|| format!("{b}-claim: no metadata.uid"))?;
    // No checkpoint file (rc 1) holds nothing; one that names the claim means Prepare ran.
    let ck = o.cmd(&format!("{b}-checkpoint"))?;
    if ck.rc == 0 && ck.out.contains(&uid) {
        return Err(format!(
            "claim {uid} is in the plugin's checkpoint: {}",
            one_line(&ck.out)
        ));
    }
    let r = o.cmd(&format!("{b}-recover"))?;
    let said = format!("{}{}", r.out, r.err);
    if !said.contains("nothing to recover") {
        return Err(format!("recover --dry-run: {}", one_line(&said)));
    }
    Ok(format!(
        "{} samples of {VGA}'s driver, all {HOST_DRIVER}; claim {uid} not in the checkpoint; journal: {}",
        samples.len(),
        said.lines().next().unwrap_or("")
    ))
}

/// The first line of `text` that contains `needle`.
fn line_with(text: &str, needle: &str) -> Result<String, String> {
    text.lines()
        .find(|l| l.contains(needle))
        .map(str::to_string)
        .ok_or_else(|| format!("no line with {needle:?} in: {}", one_line(text)))
}

fn claim_allocated(o: &Out, b: &str) -> Verdict {
    let c = o.cmd(&format!("{b}-claim"))?;
    c.rc_is(0)?;
    let j = c.json()?;
    let results = &j["status"]["allocation"]["devices"]["results"];
    let r = results
        .as_array()
        .filter(|a| a.len() == 1)
        .map(|a| &a[0])
        .ok_or_else(|| format!("{b}-claim: want one result, got {results}"))?;
    if r["device"] != DEVICE || r["driver"] != DRIVER {
        return Err(format!(
            "{b}-claim: allocated {}/{}, want {DRIVER}/{DEVICE}",
            r["driver"], r["device"]
        ));
    }
    // The class's config (kvm) and the claim's (the backend), as the kubelet hands them over.
    let configs = j["status"]["allocation"]["devices"]["config"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let of = |source: &str, key: &str| -> Option<Value> {
        configs
            .iter()
            .filter(|c| c["source"] == source)
            .find_map(|c| c["opaque"]["parameters"].get(key).cloned())
    };
    let policy = if b == "legacy" {
        "legacy"
    } else {
        "require-iommufd"
    };
    if of("FromClass", "kvm") != Some(Value::Bool(true)) {
        return Err(format!(
            "{b}-claim: no kvm: true from the class vm.{DRIVER} in {}",
            one_line(&Value::Array(configs).to_string())
        ));
    }
    if of("FromClaim", "backendPolicy").as_ref().and_then(Value::as_str) != Some(policy) {
        return Err(format!("{b}-claim: the claim's backendPolicy is not {policy}"));
    }
    Ok(format!(
        "claim {}: {DRIVER}/{}/{DEVICE} by the scheduler; kvm from the class, backendPolicy {policy} from the claim",
        j["metadata"]["name"].as_str().unwrap_or("?"),
        r["pool"].as_str().unwrap_or("?")
    ))
}

fn pod_succeeded(o: &Out, b: &str) -> Verdict {
    let c = o.cmd(&format!("{b}-pod"))?;
    c.rc_is(0)?;
    let p = c.json()?;
    let events = o
        .cmd(&format!("{b}-events"))
        .map(|e| one_line(&e.out))
        .unwrap_or_default();
    let phase = p["status"]["phase"].as_str().unwrap_or("?");
    let st = &p["status"]["containerStatuses"][0]["state"]["terminated"];
    if phase != "Succeeded" || st["exitCode"] != 0 {
        return Err(format!(
            "vm-{b}: phase {phase}, container terminated {}; events: {events}",
            one_line(&st.to_string())
        ));
    }
    // Unprivileged: no privileged flag, no capability added, no host namespace.
    let ctr = &p["spec"]["containers"][0];
    let sc = &ctr["securityContext"];
    if sc["privileged"] == true
        || sc["capabilities"]["add"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    {
        return Err(format!("vm-{b}: the container is not unprivileged: {sc}"));
    }
    for ns in ["hostNetwork", "hostPID", "hostIPC"] {
        if p["spec"][ns] == true {
            return Err(format!("vm-{b}: {ns} is set"));
        }
    }
    let ran = o.facts(&format!("{b}-ran"))?;
    Ok(format!(
        "vm-{b} Succeeded (exit 0) {} s after it was created; container unprivileged ({sc})",
        ran.get("seconds")?
    ))
}

/// The nodes a backend opens for the function: legacy `/dev/vfio/vfio` + `/dev/vfio/<group>`,
/// iommufd `/dev/vfio/devices/<cdev>` + `/dev/iommu`.
fn want_nodes(o: &Out, b: &str) -> Result<BTreeSet<String>, String> {
    let group = o.facts("start")?.num("vga.group")?;
    let log = o.cmd(&format!("{b}-log"))?;
    Ok(match b {
        "legacy" => ["/dev/vfio/vfio".to_string(), format!("/dev/vfio/{group}")].into(),
        _ => {
            let cdev = line_with(&log.out, "CDEV ")?;
            let cdev = cdev.trim_start_matches("CDEV ").trim();
            if !cdev.starts_with("vfio") || cdev.contains(' ') {
                return Err(format!(
                    "{b}-log: the container saw cdev {cdev:?} for {VGA} in sysfs"
                ));
            }
            [format!("/dev/vfio/devices/{cdev}"), "/dev/iommu".to_string()].into()
        }
    })
}

fn vfio_backend(o: &Out, b: &str) -> Verdict {
    let log = o.cmd(&format!("{b}-log"))?;
    let line = line_with(&log.out, "gpupass: VFIO backend ")?;
    let at = line.find("gpupass: VFIO backend ").unwrap_or(0);
    let (backend, nodes) = line[at..]
        .trim_start_matches("gpupass: VFIO backend ")
        .split_once(": ")
        .ok_or_else(|| format!("{b}-log: {line:?} is not `VFIO backend B: NODES`"))?;
    let opened: BTreeSet<String> = nodes.split(" + ").map(|s| s.trim().to_string()).collect();
    let want = want_nodes(o, b)?;
    if backend != b || opened != want {
        return Err(format!(
            "{b}-log: gpupass boot opened {backend} {opened:?}, want {b} {want:?}"
        ));
    }
    let exit = line_with(&log.out, "firmware exited with status ")?;
    if !exit.contains("firmware exited with status 0 ") {
        return Err(format!("{b}-log: {exit}"));
    }
    Ok(format!("{line}; {exit}"))
}

fn only_its_nodes(o: &Out, b: &str) -> Verdict {
    let log = o.cmd(&format!("{b}-log"))?;
    let nodes: BTreeSet<String> = log
        .out
        .lines()
        .filter_map(|l| l.strip_prefix("DEVNODE "))
        .map(|s| s.trim().to_string())
        .collect();
    if nodes.is_empty() {
        return Err(format!(
            "{b}-log: the container listed no device nodes: {}",
            one_line(&log.out)
        ));
    }
    let vfio: BTreeSet<String> = nodes
        .iter()
        .filter(|n| n.starts_with("/dev/vfio/") || *n == "/dev/iommu")
        .cloned()
        .collect();
    let want = want_nodes(o, b)?;
    if vfio != want {
        return Err(format!(
            "{b}: the container's VFIO nodes are {vfio:?}, want exactly {want:?}"
        ));
    }
    if !nodes.contains("/dev/kvm") {
        return Err(format!("{b}: no /dev/kvm in the container: {nodes:?}"));
    }
    let driver = line_with(&log.out, "DRIVER ")?;
    if driver.trim() != "DRIVER vfio-pci" {
        return Err(format!(
            "{b}: while the container ran {VGA} was on {driver:?}, want vfio-pci"
        ));
    }
    Ok(format!(
        "{} + /dev/kvm and no other VFIO node; {VGA} on vfio-pci while it ran; all: {}",
        want.iter().cloned().collect::<Vec<_>>().join(" + "),
        nodes.iter().cloned().collect::<Vec<_>>().join(" ")
    ))
}
