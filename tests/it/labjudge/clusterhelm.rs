//! The judge of `lab/scenarios/clusterhelm.sh`: the DRA driver deployed as users deploy it
//! (docs/deploy.md, "In the cluster lab"), on the cluster lab's real kubelet, scheduler and
//! containerd. The image deploy/image/build.sh made on the host, imported into the node's
//! containerd with its digest; `helm install` of deploy/helm/gpupass; the plugin a DaemonSet Pod
//! that talks to the API server with the chart's ServiceAccount (kube-rs's in-cluster
//! configuration), whose rights the API server's authorizer shows to be exactly what the code
//! needs; a claim prepared and given back; `helm upgrade` to a rebuilt image and `helm
//! uninstall`, each with a claim held; a host `gpupass bind` racing a Prepare on the lock both
//! share through `/run/gpupass`.
//!
//! The guest's group is the lab's VGA + HDA audio 00:05.0 + 00:05.1 (bochs-drm, snd_hda_intel),
//! which the shipped `lab-vga` claim template selects.

use serde_json::Value;

use super::{check, one_line, Check, Cmd, Facts, Judge, Out, Verdict};

const DRIVER: &str = "vfio.gpupass.dev";
const HOST: &str = "bochs-drm snd_hda_intel";
const VFIO: &str = "vfio-pci vfio-pci";
const NS: &str = "gpupass-system";
/// The chart's names for release `gpupass` (the fullname is the release name when that holds
/// the chart's name).
const SA: &str = "gpupass";
const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The host paths the chart mounts, and no others (docs/deploy.md, "On the node").
const MOUNTS: &[&str] = &[
    "/dev/vfio",
    "/lib/modules",
    "/run/gpupass",
    "/sys",
    "/var/lib/kubelet/plugins/vfio.gpupass.dev",
    "/var/lib/kubelet/plugins_registry",
    "/var/run/cdi",
];
/// `kubectl auth can-i` as the plugin's service account: what the code does (yes) and what it
/// must not be able to do (no). `VERB RESOURCE NAMESPACE SUBRESOURCE` as the guest asked.
const CAN: &[(&str, bool)] = &[
    ("get resourceclaims.resource.k8s.io default -", true),
    ("list resourceslices.resource.k8s.io - -", true),
    ("create resourceslices.resource.k8s.io - -", true),
    ("update resourceslices.resource.k8s.io - -", true),
    ("delete resourceslices.resource.k8s.io - -", true),
    ("get nodes - -", true),
    ("delete pods default -", false),
    ("list secrets gpupass-system -", false),
    ("get secrets kube-system -", false),
    ("create pods default -", false),
    ("update resourceclaims.resource.k8s.io default -", false),
    ("update resourceclaims.resource.k8s.io default status", false),
    // The binding conditions' claim watcher (docs/dra.md, "Binding conditions") lists and
    // watches claims; the publisher watches its node's slices ("Slices resynced").
    ("list resourceclaims.resource.k8s.io default -", true),
    ("watch resourceslices.resource.k8s.io - -", true),
    ("patch nodes - -", false),
    ("update nodes - status", false),
    ("delete deviceclasses.resource.k8s.io - -", false),
    ("create serviceaccounts gpupass-system token", false),
];
/// The plugin logs the guest shipped (every plugin Pod the scenario ran).
const PLUGIN_LOGS: &[&str] = &[
    "install-log",
    "upgrade-log",
    "upgrade-log-after",
    "reinstall-log",
    "race-plugin-log",
];

pub fn judge() -> Judge {
    let c: Vec<Check> = vec![
        check("start-drivers", |o| {
            let f = o.facts("start")?;
            drivers_are(&f, HOST)?;
            f.is("open", "0")?;
            Ok(format!("group {}: {HOST}, no unfinished plan", f.get("group")?))
        }),
        // 1. The image, built on the host, imported with its digest.
        check("images-built", |o| {
            let b = built(o)?;
            if b[0].1 == b[1].1 {
                return Err(format!(
                    "lab-1 and lab-2 have one digest {}: the upgrade would change nothing",
                    b[0].1
                ));
            }
            Ok(format!("{} {}; {} {}", b[0].0, b[0].1, b[1].0, b[1].1))
        }),
        check("image-imported", |o| imported(o, "import-1", "images-1", 0)),
        // 2. helm install: the plugin as the DaemonSet's Pod.
        check("helm-installed", |o| deployed(o, "helm-install", 1)),
        check("plugin-pod-ready", |o| {
            let p = pod(o, "install-pod")?;
            let img = pod_ready(&p, "gpupass.dev/gpupass:lab-1")?;
            let secs = o.facts("install-time")?.get("seconds")?.to_string();
            Ok(format!("{img}; Ready {secs} s after helm install"))
        }),
        check("plugin-service-account", |o| {
            let p = pod(o, "install-pod")?;
            service_account(o, &p)
        }),
        check("plugin-host-network", |o| {
            let p = pod(o, "install-pod")?;
            if p["spec"]["hostNetwork"] != true {
                return Err(format!(
                    "spec.hostNetwork is {}, want true (lab values)",
                    p["spec"]["hostNetwork"]
                ));
            }
            let host = env(&p, "KUBERNETES_SERVICE_HOST")?;
            let port = env(&p, "KUBERNETES_SERVICE_PORT")?;
            if host != "10.0.2.2" || port.parse::<u16>().is_err() {
                return Err(format!(
                    "KUBERNETES_SERVICE_HOST/PORT {host}:{port}, want 10.0.2.2 and the API port"
                ));
            }
            let log = o.cmd("install-log")?;
            let want = format!("API server https://{host}:{port}");
            if !all(&log).contains(&want) {
                return Err(format!(
                    "the plugin's log does not say {want:?}: {}",
                    one_line(&all(&log))
                ));
            }
            Ok(format!("hostNetwork, KUBERNETES_SERVICE_HOST={host} KUBERNETES_SERVICE_PORT={port} (the kubelet's own would be the Service's ClusterIP)"))
        }),
        check("plugin-mounts", |o| {
            let p = pod(o, "install-pod")?;
            let mut paths: Vec<String> = p["spec"]["volumes"]
                .as_array()
                .ok_or("no spec.volumes")?
                .iter()
                .filter_map(|v| v["hostPath"]["path"].as_str().map(str::to_string))
                .collect();
            paths.sort();
            if paths != MOUNTS {
                return Err(format!("hostPath volumes {paths:?}, want exactly {MOUNTS:?}"));
            }
            Ok(paths.join(" "))
        }),
        check("plugin-registered", |o| {
            let log = all(&o.cmd("install-log")?);
            line_with(&log, &format!("the kubelet registered {DRIVER}"))
        }),
        check("slices-published", |o| {
            let s = o.cmd("install-slices")?.json()?;
            let items = s["items"].as_array().ok_or("no items")?;
            let mut devices = Vec::new();
            for i in items {
                if i["spec"]["driver"] != DRIVER || i["spec"]["nodeName"] != "lab" {
                    return Err(format!(
                        "slice {} is driver {} node {}",
                        i["metadata"]["name"], i["spec"]["driver"], i["spec"]["nodeName"]
                    ));
                }
                for d in i["spec"]["devices"].as_array().into_iter().flatten() {
                    devices.push(d["name"].as_str().unwrap_or("?").to_string());
                }
            }
            if !devices.iter().any(|d| d == "pci-0000-00-05-0") {
                return Err(format!("no pci-0000-00-05-0 among {devices:?}"));
            }
            Ok(format!(
                "{} slices, {} devices: {}",
                items.len(),
                devices.len(),
                devices.join(" ")
            ))
        }),
        check("device-classes", |o| {
            let v = o.cmd("install-classes")?.json()?;
            let mut names = Vec::new();
            for i in v["items"].as_array().ok_or("no items")? {
                let n = i["metadata"]["name"].as_str().unwrap_or("?");
                if n.ends_with(DRIVER) {
                    if i["metadata"]["labels"]["app.kubernetes.io/managed-by"] != "Helm" {
                        return Err(format!(
                            "DeviceClass {n} is not the release's (no managed-by Helm label)"
                        ));
                    }
                    names.push(n.to_string());
                }
            }
            names.sort();
            // The chart's four (values `deviceClasses`), sorted: the VM class (`kvm: true`,
            // docs/dra.md "A VM in a Pod") sorts after the driver's own.
            let want = [
                format!("mdev.{DRIVER}"),
                format!("nvidia-gpu-iommufd.{DRIVER}"),
                DRIVER.to_string(),
                format!("vm.{DRIVER}"),
            ];
            if names != want {
                return Err(format!("DeviceClasses {names:?}, want {want:?}"));
            }
            Ok(names.join(" "))
        }),
        check("least-privilege", least_privilege),
        check("no-forbidden", |o| {
            for n in PLUGIN_LOGS {
                let text = all(&o.cmd(n)?);
                if let Some(l) = text
                    .lines()
                    .find(|l| l.to_ascii_lowercase().contains("forbidden") || l.contains(" 403"))
                {
                    return Err(format!("{n}: {}", l.trim()));
                }
            }
            let lines: usize = PLUGIN_LOGS
                .iter()
                .map(|n| o.cmd(n).map(|c| all(&c).lines().count()).unwrap_or(0))
                .sum();
            Ok(format!("{lines} lines of the plugin Pods' logs, none forbidden"))
        }),
        // 3. A claim through the chart's DeviceClass.
        check("claim-prepared", |o| {
            let f = o.facts("a-running")?;
            prepared(o, &f, "a-log")
        }),
        // 4. helm upgrade with the claim held.
        check("image-2-imported", |o| imported(o, "import-2", "images-2", 1)),
        check("helm-upgraded", |o| deployed(o, "helm-upgrade", 2)),
        check("upgrade-new-pod", |o| {
            let p = pod(o, "upgrade-pod")?;
            let img = pod_ready(&p, "gpupass.dev/gpupass:lab-2")?;
            let f = o.facts("upgraded")?;
            let old = f.get("old.pod")?;
            let new = p["metadata"]["name"].as_str().unwrap_or("");
            if new.is_empty() || new == old {
                return Err(format!(
                    "the plugin Pod is {new:?}, the one before the upgrade was {old:?}"
                ));
            }
            let old_id = pod(o, "install-pod")?["status"]["containerStatuses"][0]["imageID"].clone();
            let new_id = &p["status"]["containerStatuses"][0]["imageID"];
            if &old_id == new_id {
                return Err(format!("the new Pod runs imageID {new_id}, as the old one did"));
            }
            Ok(format!(
                "{old} -> {new}: {img}, {} s after helm upgrade",
                f.get("seconds")?
            ))
        }),
        check("upgrade-group-held", |o| {
            let f = o.facts("upgraded")?;
            let n = samples_all(&f, "vfio-pci+vfio-pci")?;
            drivers_are(&f, VFIO)?;
            let claim = f.get("claim")?;
            in_checkpoint(&f, claim)?;
            Ok(format!(
                "{n} samples during the rollout, all vfio-pci; claim {claim} in the checkpoint"
            ))
        }),
        check("upgrade-takeover", |o| {
            let f = o.facts("a-deleted")?;
            let claim = f.get("claim")?;
            let log = all(&o.cmd("upgrade-log-after")?);
            let l = line_with(&log, &format!("({claim})"))?;
            if !l.contains("unprepared claim") {
                return Err(format!(
                    "the new plugin's line for {claim} is not an Unprepare: {l}"
                ));
            }
            Ok(format!(
                "the new Pod unprepared the claim the old one prepared: {l}"
            ))
        }),
        check("upgrade-restored", |o| given_back(o, "a-deleted", "a-recover")),
        // 5. helm uninstall with a claim held; installed again.
        check("uninstall-done", |o| {
            let c = o.cmd("helm-uninstall")?;
            c.rc_is(0)?;
            c.out_has("uninstalled")?;
            let f = o.facts("uninstalled")?;
            f.is("plugin.pods", "")?;
            f.is("reg.sock", "absent")?;
            f.is("release", "")?;
            Ok(format!(
                "{}; no plugin Pod, no registration socket",
                one_line(&c.out)
            ))
        }),
        check("uninstall-group-stays", |o| {
            let f = o.facts("uninstalled")?;
            let n = samples_all(&f, "vfio-pci+vfio-pci")?;
            drivers_are(&f, VFIO)?;
            f.is("b.container", "CONTAINER_RUNNING")?;
            f.is("b.phase", "Running")?;
            let claim = f.get("claim")?;
            in_checkpoint(&f, claim)?;
            f.is("open", "0")?;
            Ok(format!(
                "{n} samples over 20 s with no plugin: vfio-pci; the Pod's container runs; claim {claim} in the checkpoint"
            ))
        }),
        check("uninstall-classes-gone", |o| {
            o.facts("uninstalled")?.is("classes", "0")?;
            Ok("the release's DeviceClasses are gone; the allocated claim is not".into())
        }),
        check("reinstalled", |o| {
            deployed(o, "helm-reinstall", 1)?;
            let f = o.facts("reinstalled")?;
            if f.get("plugin.pods")?.is_empty() {
                return Err("no plugin Pod after the reinstall".into());
            }
            f.is("reg.sock", "present")?;
            drivers_are(&f, VFIO)?;
            Ok(format!(
                "plugin {} registered {} s after helm install",
                f.get("plugin.pods")?.trim(),
                f.get("seconds")?
            ))
        }),
        check("reinstall-unprepared", |o| {
            let f = o.facts("b-deleted")?;
            let claim = f.get("claim")?;
            let log = all(&o.cmd("reinstall-log")?);
            let l = line_with(&log, &format!("({claim})"))?;
            if !l.contains("unprepared claim") {
                return Err(format!(
                    "the reinstalled plugin's line for {claim} is not an Unprepare: {l}"
                ));
            }
            given_back(o, "b-deleted", "b-recover")?;
            Ok(l)
        }),
        // 6. A host bind racing a Prepare.
        check("race-bind-holds-lock", |o| {
            let c = o.cmd("race-bind")?;
            let pid = pause_pid(&c)?;
            o.facts("race-held")?.is("bind.running", "yes")?;
            Ok(format!(
                "gpupass bind (pid {pid}) held the lock before its first write"
            ))
        }),
        check("race-prepare-refused", |o| {
            let pid = pause_pid(&o.cmd("race-bind")?)?;
            let ev = o.cmd("race-events")?;
            let l = line_with(&ev.out, "is changing devices")?;
            if !l.contains(&format!("another gpupass (pid {pid})")) {
                return Err(format!(
                    "the Prepare's refusal does not name the bind's pid {pid}: {l}"
                ));
            }
            Ok(l)
        }),
        check("race-nothing-written", |o| {
            let f = o.facts("race-held")?;
            let n = samples_all(&f, "bochs-drm+snd_hda_intel").or_else(|e| {
                if f.get("samples")?.trim().is_empty() {
                    Ok(0)
                } else {
                    Err(e)
                }
            })?;
            drivers_are(&f, HOST)?;
            let held = f.get("checkpoint")?.trim().to_string();
            if held.is_empty() {
                return Ok(format!(
                    "{n} samples while the lock was held, and after: {HOST}; no claim checkpointed"
                ));
            }
            // With binding conditions (on by default where the API server keeps them) the
            // plugin records its bind-before-binding attempt in its own checkpoint before it
            // waits for the lock, and drops the record when the wait fails: a record of the
            // plugin's, not a change to the host, which the drivers above say is untouched.
            let ev = o.cmd("race-events")?;
            let l = line_with(&ev.out, "device binding failed")?;
            if !l.contains("reason=Locked") {
                return Err(format!(
                    "the checkpoint holds {held:?} while the bind held the lock, and the binding failure is not the lock's: {l}"
                ));
            }
            Ok(format!(
                "{n} samples while the lock was held, and after: {HOST}; the plugin's checkpoint held its bind-before-binding attempt {held} while it waited, and the scheduler was told: {l}"
            ))
        }),
        check("race-bind-won", |o| {
            let c = o.cmd("race-bind")?;
            c.rc_is(0)?;
            let f = o.facts("race-bound")?;
            drivers_are(&f, VFIO)?;
            f.is("open", "0")?;
            Ok(format!("the host's bind finished: {VFIO}, no unfinished plan"))
        }),
        check("race-retry-prepared", |o| {
            let f = o.facts("race-running")?;
            prepared(o, &f, "race-log")
        }),
        check("race-claim-left-host-bind", |o| {
            let f = o.facts("race-deleted")?;
            drivers_are(&f, VFIO)?;
            let claim = f.get("claim")?;
            not_in_checkpoint(&f, claim)?;
            f.is("open", "0")?;
            Ok(format!(
                "claim {claim} unprepared; the group stays on vfio-pci, where the host's bind put it"
            ))
        }),
        check("race-host-unbind", |o| {
            o.cmd("race-unbind")?.rc_is(0)?;
            let f = o.facts("race-unbound")?;
            drivers_are(&f, HOST)?;
            f.is("open", "0")?;
            let r = o.cmd("race-recover")?;
            r.out_has("nothing to recover")?;
            Ok(format!("{HOST} again; {}", one_line(&r.out)))
        }),
        check("helm-end", |o| {
            o.cmd("helm-end")?.rc_is(0)?;
            let f = o.facts("end")?;
            f.is("plugin.pods", "")?;
            drivers_are(&f, HOST)?;
            f.is("open", "0")?;
            Ok("uninstalled, nothing held".into())
        }),
    ];
    Judge {
        scenario: "clusterhelm",
        host_steps: &[],
        checks: c,
    }
}

/// stdout and stderr together (a log through `crictl logs`).
fn all(c: &Cmd) -> String {
    format!("{}{}", c.out, c.err)
}

/// The first line of `text` that holds `needle`, trimmed.
fn line_with(text: &str, needle: &str) -> Verdict {
    text.lines()
        .find(|l| l.contains(needle))
        .map(|l| l.trim().to_string())
        .ok_or_else(|| format!("no line says {needle:?}: {}", one_line(text)))
}

fn drivers_are(f: &Facts, want: &str) -> Verdict {
    let got = format!("{} {}", f.get("vga.driver")?, f.get("aud.driver")?);
    if got == want {
        Ok(got)
    } else {
        Err(format!("after {}: drivers {got:?}, want {want:?}", f.name))
    }
}

fn in_checkpoint(f: &Facts, claim: &str) -> Verdict {
    if !claim.is_empty() && f.get("checkpoint")?.split_whitespace().any(|u| u == claim) {
        Ok(claim.to_string())
    } else {
        Err(format!(
            "after {}: claim {claim:?} not in the checkpoint ({:?})",
            f.name,
            f.get("checkpoint")?
        ))
    }
}

fn not_in_checkpoint(f: &Facts, claim: &str) -> Verdict {
    if claim.is_empty() {
        return Err(format!("after {}: no claim UID recorded", f.name));
    }
    if f.get("checkpoint")?.split_whitespace().any(|u| u == claim) {
        Err(format!("after {}: claim {claim} still in the checkpoint", f.name))
    } else {
        Ok(claim.to_string())
    }
}

/// Every word of the `samples` fact is `want` (at least one); their number.
fn samples_all(f: &Facts, want: &str) -> Result<usize, String> {
    let s: Vec<&str> = f.get("samples")?.split_whitespace().collect();
    if s.is_empty() {
        return Err(format!("after {}: no samples", f.name));
    }
    match s.iter().find(|w| **w != want) {
        Some(w) => Err(format!(
            "after {}: a sample read {w:?}, want {want:?} throughout: {}",
            f.name,
            s.join(" ")
        )),
        None => Ok(s.len()),
    }
}

/// `images-built`: `(ref, digest)` of lab-1 and lab-2, as deploy/image/build.sh printed them.
fn built(o: &Out) -> Result<Vec<(String, String)>, String> {
    let c = o.cmd("images-built")?;
    c.rc_is(0)?;
    let v: Vec<(String, String)> = c
        .out
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 3).then(|| (w[0].to_string(), w[1].to_string()))
        })
        .collect();
    let tags: Vec<&str> = v.iter().map(|(r, _)| r.as_str()).collect();
    if tags != ["gpupass.dev/gpupass:lab-1", "gpupass.dev/gpupass:lab-2"]
        || !v.iter().all(|(_, d)| d.starts_with("sha256:") && d.len() == 71)
    {
        return Err(format!("images.txt: {}", one_line(&c.out)));
    }
    Ok(v)
}

/// The image `n` (0: lab-1) imported by `import` and listed by `ls` with the built digest.
fn imported(o: &Out, import: &str, ls: &str, n: usize) -> Verdict {
    let (r, d) = built(o)?.swap_remove(n);
    let i = o.cmd(import)?;
    i.rc_is(0)?;
    let l = o.cmd(ls)?;
    l.rc_is(0)?;
    let row = l
        .out
        .lines()
        .find(|row| row.split_whitespace().next() == Some(r.as_str()))
        .ok_or_else(|| format!("ctr images ls has no {r}: {}", one_line(&l.out)))?;
    if !row.split_whitespace().any(|w| w == d) {
        return Err(format!("containerd has {r} as {}, built as {d}", one_line(row)));
    }
    Ok(format!(
        "{r} {d} in containerd (k8s.io), the digest deploy/image/build.sh printed"
    ))
}

/// `helm install`/`upgrade` said the release is deployed at `revision`.
fn deployed(o: &Out, name: &str, revision: u32) -> Verdict {
    let c = o.cmd(name)?;
    c.rc_is(0)?;
    c.out_has("STATUS: deployed")?;
    c.out_has(&format!("REVISION: {revision}"))?;
    Ok(format!("{name}: deployed, revision {revision}"))
}

fn pod(o: &Out, name: &str) -> Result<Value, String> {
    let c = o.cmd(name)?;
    c.rc_is(0)?;
    c.json()
}

/// The plugin Pod runs `image`, Running and Ready; its image and imageID.
fn pod_ready(p: &Value, image: &str) -> Verdict {
    let cs = &p["status"]["containerStatuses"][0];
    if p["status"]["phase"] != "Running" || cs["ready"] != true {
        return Err(format!(
            "{}: phase {}, ready {}, state {}",
            p["metadata"]["name"], p["status"]["phase"], cs["ready"], cs["state"]
        ));
    }
    if p["spec"]["containers"][0]["image"] != image {
        return Err(format!(
            "the Pod runs {}, want {image}",
            p["spec"]["containers"][0]["image"]
        ));
    }
    Ok(format!(
        "{} Running, Ready, {image} (imageID {})",
        p["metadata"]["name"].as_str().unwrap_or("?"),
        cs["imageID"].as_str().unwrap_or("?")
    ))
}

fn env(p: &Value, name: &str) -> Result<String, String> {
    p["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .map(str::to_string)
        .ok_or_else(|| format!("the plugin's container has no {name} value"))
}

/// The Pod's credentials are the chart's ServiceAccount's token and nothing else: no
/// kubeconfig in its arguments, environment or volumes, the projected token at its place, and
/// the plugin says it uses it.
fn service_account(o: &Out, p: &Value) -> Verdict {
    let sa = o.facts("sa")?;
    sa.is("name", SA)?;
    if p["spec"]["serviceAccountName"] != SA {
        return Err(format!(
            "serviceAccountName {}, want {SA}",
            p["spec"]["serviceAccountName"]
        ));
    }
    let ct = &p["spec"]["containers"][0];
    let spec = ct.to_string();
    if spec.to_ascii_lowercase().contains("kubeconfig") {
        return Err(format!("the container names a kubeconfig: {}", one_line(&spec)));
    }
    let vols = p["spec"]["volumes"].as_array().ok_or("no spec.volumes")?;
    if let Some(v) = vols.iter().find(|v| {
        v["hostPath"]["path"]
            .as_str()
            .is_some_and(|h| h.starts_with("/lab") || h.contains("kube/config"))
    }) {
        return Err(format!("a host path with credentials is mounted: {v}"));
    }
    let token = vols
        .iter()
        .find(|v| {
            v["projected"]["sources"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s.get("serviceAccountToken").is_some()))
        })
        .and_then(|v| v["name"].as_str())
        .ok_or("no projected service account token volume")?;
    let mounted = ct["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["name"] == token && m["mountPath"] == TOKEN_DIR);
    if !mounted {
        return Err(format!("the token volume {token} is not mounted at {TOKEN_DIR}"));
    }
    let log = all(&o.cmd("install-log")?);
    let l = line_with(
        &log,
        &format!("with the token {TOKEN_DIR}/token (in-cluster configuration)"),
    )?;
    Ok(format!(
        "serviceAccountName {SA}, token volume {token} at {TOKEN_DIR}, no kubeconfig; the plugin: {l}"
    ))
}

fn least_privilege(o: &Out) -> Verdict {
    let c = o.cmd("can-i")?;
    let mut yes = 0;
    let mut no = 0;
    for (q, want) in CAN {
        let answer = can_i_answer(&c.out, q)?;
        let got = match answer.as_str() {
            "yes" => true,
            "no" => false,
            a => return Err(format!("`{q}`: {a:?} is neither yes nor no")),
        };
        if got != *want {
            return Err(format!(
                "system:serviceaccount:{NS}:{SA} can-i {q}: {answer}, want {}",
                if *want {
                    "yes (the code does it)"
                } else {
                    "no (the plugin never needs it)"
                }
            ));
        }
        if got {
            yes += 1
        } else {
            no += 1
        }
    }
    Ok(format!("{yes} rights the code uses: yes; {no} it does not need (delete pods, list secrets, claim updates, node writes, ...): no"))
}

/// kubectl's answer to question `q` in the guest's `QUESTION ANSWER` lines: the last word
/// before the next question (a kubectl that also printed a warning, "resource 'nodes' is not
/// namespace scoped", has its answer on a line of its own after it).
fn can_i_answer(out: &str, q: &str) -> Result<String, String> {
    let questions: Vec<String> = CAN.iter().map(|(q, _)| format!("{q} ")).collect();
    let mut lines = out.lines().skip_while(|l| !l.starts_with(&format!("{q} ")));
    let first = lines
        .next()
        .ok_or_else(|| format!("no answer to `{q}`: {}", one_line(out)))?;
    let mut block = vec![&first[q.len()..]];
    block.extend(lines.take_while(|l| !questions.iter().any(|x| l.starts_with(x.as_str()))));
    block
        .iter()
        .rev()
        .find(|l| !l.trim().is_empty())
        .and_then(|l| l.split_whitespace().last())
        .map(str::to_string)
        .ok_or_else(|| format!("`{q}`: no answer"))
}

/// A claim's Pod runs with the group: its container opened the group's node and said READY,
/// both functions are on vfio-pci, the claim is in the checkpoint.
fn prepared(o: &Out, f: &Facts, log: &str) -> Verdict {
    let g = o.facts("start")?.get("group")?.to_string();
    let l = o.cmd(log)?;
    if !l.out.lines().any(|x| x == "READY") || !l.out.lines().any(|x| x == format!("open OK /dev/vfio/{g}")) {
        return Err(format!("{log}: {}", one_line(&l.out)));
    }
    if l.out.contains("open FAILED") {
        return Err(format!("{log}: {}", one_line(&l.out)));
    }
    drivers_are(f, VFIO)?;
    let claim = f.get("claim")?;
    in_checkpoint(f, claim)?;
    Ok(format!(
        "claim {claim}: {VFIO}, /dev/vfio/{g} opened in the container, in the checkpoint"
    ))
}

/// After the Pod's deletion: the drivers back, the claim out of the checkpoint, no unfinished
/// plan (`recover` as NAME).
fn given_back(o: &Out, facts: &str, recover: &str) -> Verdict {
    let f = o.facts(facts)?;
    drivers_are(&f, HOST)?;
    let claim = f.get("claim")?;
    not_in_checkpoint(&f, claim)?;
    f.is("open", "0")?;
    let r = o.cmd(recover)?;
    r.out_has("nothing to recover")?;
    Ok(format!(
        "{HOST} again, claim {claim} out of the checkpoint; {}",
        one_line(&r.out)
    ))
}

/// The pid the paused bind printed (`GPUPASS_PAUSE_BEFORE_APPLY=...: holding the lock ... (pid N)`).
fn pause_pid(c: &Cmd) -> Result<u32, String> {
    let l = line_with(&c.err, "holding the lock")?;
    l.rsplit_once("(pid ")
        .and_then(|(_, r)| r.trim_end_matches(')').parse().ok())
        .ok_or_else(|| format!("no pid in {l:?}"))
}
