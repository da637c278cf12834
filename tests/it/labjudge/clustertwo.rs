//! The judge of `lab/scenarios/clustertwo.sh` (docs/cluster.md, "Two nodes"): two 6.12 guests,
//! the nodes `lab` and `lab2`, joined to one control plane on the host. `lab` drives (kubectl);
//! `lab2` serves and ships what only it can read. Its files carry the prefix `node2.`
//! (lab/lab.sh, `node2_collect`): `node2.held.facts` is what lab2 read while the Pods ran.
//!
//! The devices differ: lab2 alone has an ATI Radeon 7000 (QEMU's `ati-vga`, 1002:5159, no host
//! driver) with an ICH6 HDA function (snd_hda_intel) in slot 00:18, one IOMMU group; both have
//! the VGA + HDA group 00:05 (bochs-drm, snd_hda_intel).
//!
//! The plugin runs as users run it: the image imported into both nodes' containerd, the chart
//! installed with helm, its DaemonSet's Pod on each node. The last part is binding conditions
//! across nodes: lab's 00:05 held by a host process, a Pod that prefers lab fails binding there
//! (InUse), lab's device is tainted `gpupass.dev/busy`, and the Pod runs on lab2.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{check, one_line, Check, Facts, Judge, Out, Verdict};

const DRIVER: &str = "vfio.gpupass.dev";
const VGA: &str = "0000:00:05.0";
const HDA: &str = "0000:00:05.1";
const AMD: &str = "0000:00:18.0";
const AMD_HDA: &str = "0000:00:18.1";
/// The DRA devices (named after the group's lead function).
const VGA_DEV: &str = "pci-0000-00-05-0";
const AMD_DEV: &str = "pci-0000-00-18-0";
/// What only lab2 has, as the claim selects it.
const AMD_VENDOR: &str = "1002";

pub fn judge() -> Judge {
    let c: Vec<Check> = vec![
        // The two guests and their cluster.
        check("bringup-lab", |o| bringup(o, "")),
        check("bringup-lab2", |o| bringup(o, "node2.")),
        check("lab2-ran", lab2_ran),
        check("two-nodes-ready", two_nodes_ready),
        check("start-drivers-lab", |o| {
            start_drivers(&o.facts("before")?, "lab", false)
        }),
        check("start-drivers-lab2", |o| {
            start_drivers(&o.facts("node2.before")?, "lab2", true)
        }),
        // The chart: the image in both nodes' containerd, the DaemonSet's plugin on both; each
        // node its own pool.
        check("image-imported", |o| {
            for p in ["import", "node2.import"] {
                o.cmd(p)?.rc_is(0)?;
            }
            let c = o.cmd("helm-install")?;
            c.rc_is(0)?;
            Ok(format!(
                "gpupass.dev/gpupass:lab-1 imported on lab and lab2; helm install: {}",
                one_line(&c.out)
            ))
        }),
        check("daemonset-on-both", daemonset_on_both),
        check("plugin-on-lab", |o| plugin_registered(o, "")),
        check("plugin-on-lab2", |o| plugin_registered(o, "node2.")),
        check("own-pools", own_pools),
        check("manifests-applied", |o| {
            let c = o.cmd("manifests")?;
            c.rc_is(0)?;
            Ok(one_line(&c.out))
        }),
        // 1. The claim that only lab2's device matches runs there.
        check("amd-on-lab2", |o| {
            pod_on(o, "amd-pod", "lab2")?;
            allocated(o, "amd-claim", "lab2", AMD_DEV)
        }),
        check("amd-prepared-on-lab2", |o| {
            let f = o.facts("node2.held")?;
            drivers(&f, &[(AMD, "vfio-pci"), (AMD_HDA, "vfio-pci")])?;
            f.is(&format!("node.{AMD}"), "char")?;
            f.is("checkpoint.claims", "1")?;
            Ok(format!(
                "lab2: {AMD} and {AMD_HDA} on vfio-pci, /dev/vfio/{} a character device, one claim in lab2's checkpoint",
                f.get(&format!("group.{AMD}"))?
            ))
        }),
        check("amd-opens", |o| opens(o, "node2.held-amd-log", AMD)),
        // 2. lab's own group, pinned to lab, prepared on lab only.
        check("vga-on-lab", |o| {
            pod_on(o, "vga-pod", "lab")?;
            allocated(o, "vga-claim", "lab", VGA_DEV)
        }),
        check("vga-prepared-on-lab", |o| {
            let f = o.facts("vga-held")?;
            drivers(&f, &[(VGA, "vfio-pci"), (HDA, "vfio-pci")])?;
            f.is(&format!("node.{VGA}"), "char")?;
            Ok(format!("lab: {VGA} and {HDA} on vfio-pci"))
        }),
        check("vga-opens", |o| opens(o, "vga-log", VGA)),
        check("lab2-group-untouched", |o| {
            // While lab's 00:05 was on vfio-pci, lab2's stayed on its drivers.
            let f = o.facts("node2.held")?;
            drivers(&f, &[(VGA, "bochs-drm"), (HDA, "snd_hda_intel")])?;
            Ok(format!(
                "lab2's {VGA} bochs-drm, {HDA} snd_hda_intel while lab's were prepared"
            ))
        }),
        // 3. The held group: a second Pod stays Pending, the scheduler says why.
        check("held-pending", |o| {
            let p = o.cmd("held-pod")?.json()?;
            let phase = p["status"]["phase"].as_str().unwrap_or("");
            let node = p["spec"]["nodeName"].as_str();
            if phase == "Pending" && node.is_none() {
                Ok("two-amd-held Pending, placed on no node".into())
            } else {
                Err(format!(
                    "two-amd-held is {phase:?} on node {node:?}, want Pending on none"
                ))
            }
        }),
        check("held-reason", held_reason),
        check("lab2-answered", |o| {
            for p in [
                "phase-held",
                "phase-released",
                "phase-busy",
                "phase-busy-released",
                "phase-end",
            ] {
                o.cmd(p)?.rc_is(0)?;
            }
            Ok("lab2 answered the phases held, released, busy, busy-released, end".into())
        }),
        // 4. Deleting the Pods unprepares each on its node.
        check("pods-deleted", |o| {
            for p in ["held-deleted", "running-deleted"] {
                o.cmd(p)?.rc_is(0)?;
            }
            Ok("two-amd-held, two-amd, two-vga deleted".into())
        }),
        check("amd-unprepared-on-lab2", |o| {
            let f = o.facts("node2.released")?;
            drivers(&f, &[(AMD, "none"), (AMD_HDA, "snd_hda_intel")])?;
            f.is(&format!("node.{AMD}"), "absent")?;
            f.is("checkpoint.claims", "0")?;
            Ok(format!(
                "lab2: {AMD} without a driver, {AMD_HDA} snd_hda_intel again; lab2's checkpoint empty"
            ))
        }),
        check("vga-unprepared-on-lab", |o| {
            let f = o.facts("released")?;
            drivers(&f, &[(VGA, "bochs-drm"), (HDA, "snd_hda_intel")])?;
            f.is(&format!("node.{VGA}"), "absent")?;
            f.is("checkpoint.claims", "0")?;
            Ok(format!(
                "lab: {VGA} bochs-drm, {HDA} snd_hda_intel again; lab's checkpoint empty"
            ))
        }),
        check("journals-empty", |o| {
            for p in ["released-recover", "node2.released-recover"] {
                let c = o.cmd(p)?;
                c.rc_is(0)?;
                let all = format!("{}{}", c.out, c.err);
                if !all.contains("nothing to recover") {
                    return Err(format!("{p}: {}", one_line(&all)));
                }
            }
            Ok("gpupass recover --dry-run: nothing to recover on lab and on lab2".into())
        }),
        check("claims-gone", |o| {
            let v = o.cmd("claims-after")?.json()?;
            let left: Vec<String> = items(&v)
                .iter()
                .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
                .collect();
            if left.is_empty() {
                Ok("no ResourceClaim left".into())
            } else {
                Err(format!("ResourceClaims left: {}", left.join(" ")))
            }
        }),
        // 5. Binding conditions across nodes: held on lab, the Pod runs on lab2.
        check("busy-failed-on-lab", busy_failed_on_lab),
        check("busy-tainted", |o| {
            let t = busy_taints(o, "busy-slices")?;
            let want = "gpupass.dev/busy=InUse:NoSchedule";
            if t.iter().any(|x| x == want) {
                Ok(format!("lab's {VGA_DEV} while held: taints {}", t.join(", ")))
            } else {
                Err(format!("lab's {VGA_DEV} while held: taints {t:?}, want {want}"))
            }
        }),
        check("busy-ran-on-lab2", |o| {
            pod_on(o, "busy-pod", "lab2")?;
            let a = allocated(o, "busy-claim", "lab2", VGA_DEV)?;
            let f = o.facts("node2.busy")?;
            drivers(&f, &[(VGA, "vfio-pci"), (HDA, "vfio-pci")])?;
            let l = o.facts("busy")?;
            drivers(&l, &[(VGA, "bochs-drm"), (HDA, "snd_hda_intel")])?;
            let secs = o.facts("busy-time")?.get("seconds")?.to_string();
            Ok(format!(
                "{a}; lab2's {VGA} and {HDA} on vfio-pci, lab's on bochs-drm and snd_hda_intel (held); creation to Running {secs} s"
            ))
        }),
        check("busy-opens", |o| opens(o, "node2.busy-log", VGA)),
        check("busy-taint-gone", |o| {
            let f = o.facts("freed-time")?;
            f.is("holder.alive", "no")?;
            let t = busy_taints(o, "freed-slices")?;
            if t.iter().any(|x| x.starts_with("gpupass.dev/busy=")) {
                return Err(format!("lab's {VGA_DEV} after the holder went: taints {t:?}"));
            }
            Ok(format!(
                "the holder gone, lab's {VGA_DEV} lost its busy taint within {} s (taints now: {t:?})",
                f.get("seconds")?
            ))
        }),
        check("busy-unprepared-on-lab2", |o| {
            o.cmd("busy-deleted")?.rc_is(0)?;
            let f = o.facts("node2.busy-released")?;
            drivers(&f, &[(VGA, "bochs-drm"), (HDA, "snd_hda_intel")])?;
            f.is("checkpoint.claims", "0")?;
            let c = o.cmd("node2.busy-recover")?;
            c.rc_is(0)?;
            if !format!("{}{}", c.out, c.err).contains("nothing to recover") {
                return Err(format!("node2.busy-recover: {}", one_line(&c.out)));
            }
            Ok(format!(
                "two-busy deleted: lab2's {VGA} bochs-drm, {HDA} snd_hda_intel again, checkpoint empty, nothing to recover"
            ))
        }),
        // The end: helm uninstall takes the plugin off both nodes; every function of both
        // nodes on its original driver.
        check("plugins-stopped", |o| {
            o.cmd("helm-uninstall")?.rc_is(0)?;
            o.cmd("plugin-stop")?.rc_is(0)?;
            o.cmd("node2.plugin-stop")?.rc_is(0)?;
            Ok(
                "helm uninstall: the plugin's containers and registration sockets gone on lab and lab2"
                    .into(),
            )
        }),
        check("end-drivers-lab", |o| same_drivers(o, "", "lab")),
        check("end-drivers-lab2", |o| same_drivers(o, "node2.", "lab2")),
        check("teardown-lab", |o| teardown(o, "")),
        check("teardown-lab2", |o| teardown(o, "node2.")),
    ];
    Judge {
        scenario: "clustertwo",
        host_steps: &["host-teardown", "host-control-plane"],
        checks: c,
    }
}

/// The cluster library's bring-up lines of one node (`cluster.txt`: "STEP PASS|FAIL detail"):
/// no FAIL, and node-ready among them (its teardown line is `teardown-*`'s).
fn bringup(o: &Out, prefix: &str) -> Verdict {
    let t = o.text(&format!("{prefix}cluster.txt"))?;
    if let Some(l) = t
        .lines()
        .filter(|l| !l.starts_with("teardown "))
        .find(|l| l.split_whitespace().nth(1) == Some("FAIL"))
    {
        return Err(format!("{prefix}cluster.txt: {l}"));
    }
    t.lines()
        .find(|l| l.starts_with("node-ready PASS"))
        .map(str::to_string)
        .ok_or_else(|| format!("{prefix}cluster.txt has no node-ready line: {}", one_line(&t)))
}

/// The second guest ran its script to the end, and its QEMU exited 0.
fn lab2_ran(o: &Out) -> Verdict {
    let g: Value = serde_json::from_str(&o.text("node2.guest.json")?)
        .map_err(|e| format!("node2.guest.json is not JSON: {e}"))?;
    let rc = o.text("node2.qemu.rc")?;
    if g["begun"] != true || g["end_rc"] != 0 || g["done"] != true {
        return Err(format!(
            "lab2's guest: begun {} end_rc {} done {} (node2.console.log)",
            g["begun"], g["end_rc"], g["done"]
        ));
    }
    if rc.trim() != "0" {
        return Err(format!("lab2's QEMU exited {}", rc.trim()));
    }
    let failed: Vec<String> = g["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["status"] != "PASS")
        .map(|r| format!("{} {}", r["step"], r["detail"]))
        .collect();
    if !failed.is_empty() {
        return Err(format!("lab2 reported: {}", failed.join("; ")));
    }
    Ok(format!("kernel {}, script exit 0, QEMU exit 0", g["kernel"]))
}

/// Events as one line, each `REASON: MESSAGE` (for a failure's message).
fn events_line(evs: &[Value]) -> String {
    one_line(
        &evs.iter()
            .map(|e| format!("{}: {}", e["reason"], e["message"]))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

fn items(v: &Value) -> Vec<Value> {
    v["items"].as_array().cloned().unwrap_or_default()
}

fn two_nodes_ready(o: &Out) -> Verdict {
    let v = o.cmd("nodes")?.json()?;
    let mut seen = BTreeMap::new();
    for n in items(&v) {
        let name = n["metadata"]["name"].as_str().unwrap_or("?").to_string();
        let ready = n["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        let ip = n["status"]["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["type"] == "InternalIP")
            .and_then(|a| a["address"].as_str())
            .unwrap_or("?")
            .to_string();
        seen.insert(name, (ready, ip));
    }
    let names: Vec<&str> = seen.keys().map(String::as_str).collect();
    if names != ["lab", "lab2"] {
        return Err(format!("nodes {names:?}, want [\"lab\", \"lab2\"]"));
    }
    let not: Vec<&str> = seen
        .iter()
        .filter(|(_, (r, _))| !r)
        .map(|(n, _)| n.as_str())
        .collect();
    if !not.is_empty() {
        return Err(format!("not Ready: {}", not.join(" ")));
    }
    Ok(seen
        .iter()
        .map(|(n, (_, ip))| format!("{n} Ready ({ip})"))
        .collect::<Vec<_>>()
        .join(", "))
}

/// Before anything: the groups on their own drivers (00:18.0 has none in the lab kernel).
fn start_drivers(f: &Facts, node: &str, amd: bool) -> Verdict {
    f.is("node", node)?;
    drivers(f, &[(VGA, "bochs-drm"), (HDA, "snd_hda_intel")])?;
    if amd {
        drivers(f, &[(AMD, "none"), (AMD_HDA, "snd_hda_intel")])?;
        let (g1, g2) = (
            f.get(&format!("group.{AMD}"))?,
            f.get(&format!("group.{AMD_HDA}"))?,
        );
        if g1.is_empty() || g1 != g2 {
            return Err(format!(
                "{AMD} in group {g1:?}, {AMD_HDA} in {g2:?}: want one group"
            ));
        }
    } else if f.map.contains_key(&format!("drv.{AMD}")) {
        return Err(format!("lab has {AMD}: only lab2 should"));
    }
    let n = f.map.keys().filter(|k| k.starts_with("drv.")).count();
    Ok(format!(
        "{node}: {n} functions; {VGA} bochs-drm, {HDA} snd_hda_intel{}",
        if amd {
            format!(", {AMD} no driver, {AMD_HDA} snd_hda_intel")
        } else {
            String::new()
        }
    ))
}

/// `drv.BDF` is each driver named.
fn drivers(f: &Facts, want: &[(&str, &str)]) -> Result<(), String> {
    for (b, d) in want {
        f.is(&format!("drv.{b}"), d)?;
    }
    Ok(())
}

/// The DaemonSet's Pod on the node (its log read through the node's CRI) was registered by
/// the kubelet.
fn plugin_registered(o: &Out, prefix: &str) -> Verdict {
    o.cmd(&format!("{prefix}dra-up"))?.rc_is(0)?;
    let log = o.cmd(&format!("{prefix}plugin-log"))?.out.clone();
    let want = format!("the kubelet registered {DRIVER}");
    log.lines()
        .find(|l| l.contains(&want))
        .map(one_line)
        .ok_or_else(|| format!("{prefix}plugin-log never says {want:?}: {}", one_line(&log)))
}

/// The chart's DaemonSet: scheduled on both nodes and ready on both; its Pods, one per node,
/// owned by it, Ready, with the chart's ServiceAccount.
fn daemonset_on_both(o: &Out) -> Verdict {
    let ds = o.cmd("daemonset")?.json()?;
    let d = items(&ds);
    if d.len() != 1 {
        return Err(format!("{} DaemonSets in the chart's namespace, want 1", d.len()));
    }
    let st = &d[0]["status"];
    let name = d[0]["metadata"]["name"].as_str().unwrap_or("?").to_string();
    if st["desiredNumberScheduled"] != 2 || st["numberReady"] != 2 {
        return Err(format!(
            "DaemonSet {name}: desired {}, ready {}; want 2 and 2",
            st["desiredNumberScheduled"], st["numberReady"]
        ));
    }
    let pods = o.cmd("plugin-pods")?.json()?;
    let mut on = Vec::new();
    for p in items(&pods) {
        let pname = p["metadata"]["name"].as_str().unwrap_or("?");
        let owned = p["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["kind"] == "DaemonSet" && r["name"] == name.as_str());
        let ready = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        let sa = p["spec"]["serviceAccountName"].as_str().unwrap_or("");
        if !owned || !ready || sa.is_empty() || sa == "default" {
            return Err(format!(
                "Pod {pname}: owned by {name} {owned}, Ready {ready}, service account {sa:?}"
            ));
        }
        on.push(p["spec"]["nodeName"].as_str().unwrap_or("").to_string());
    }
    on.sort();
    if on != ["lab", "lab2"] {
        return Err(format!(
            "the plugin's Pods are on nodes {on:?}, want one on lab and one on lab2"
        ));
    }
    Ok(format!(
        "DaemonSet {name}: 2 scheduled, 2 ready; one Pod on lab, one on lab2, each Ready, owned by it"
    ))
}

/// The taints of lab's 00:05 device in the slices `name` shipped, as `KEY=VALUE:EFFECT`.
fn busy_taints(o: &Out, name: &str) -> Result<Vec<String>, String> {
    super::device_taints(&o.cmd(name)?.json()?, VGA_DEV)
        .ok_or_else(|| format!("{name}: lab's slices have no {VGA_DEV}"))
}

/// The busy Pod's events: the bind before binding failed on lab as InUse, naming the holder's
/// pid (the scheduler's FailedScheduling after the failure condition), while the holder lived.
fn busy_failed_on_lab(o: &Out) -> Verdict {
    let f = o.facts("busy-time")?;
    let pid = f.get("holder.pid")?;
    f.is("holder.alive", "yes")?;
    let v = o.cmd("busy-events")?.json()?;
    let evs = items(&v);
    let hit = evs
        .iter()
        .find(|e| {
            let m = e["message"].as_str().unwrap_or("");
            m.contains("InUse") && m.contains(&format!("pid {pid}"))
        })
        .ok_or_else(|| {
            format!(
                "busy-events: no event with InUse and pid {pid}: {}",
                events_line(&evs)
            )
        })?;
    Ok(format!(
        "{}: {}",
        hit["reason"].as_str().unwrap_or(""),
        hit["message"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(300)
            .collect::<String>()
    ))
}

/// Every slice of the driver: its pool is its node's; lab2's offer 00:18's group (vendor 1002),
/// lab's do not; both offer 00:05's.
fn own_pools(o: &Out) -> Verdict {
    let v = o.cmd("slices")?.json()?;
    let mut by_node: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for s in items(&v) {
        let spec = &s["spec"];
        if spec["driver"] != DRIVER {
            continue;
        }
        let node = spec["nodeName"].as_str().unwrap_or("").to_string();
        let pool = spec["pool"]["name"].as_str().unwrap_or("");
        if node.is_empty() || pool != node {
            return Err(format!(
                "slice {}: pool {pool:?} on node {node:?}, want the node's own pool",
                s["metadata"]["name"]
            ));
        }
        for d in spec["devices"].as_array().into_iter().flatten() {
            let name = d["name"].as_str().unwrap_or("").to_string();
            let vendor = d["attributes"]["gpupass.dev/vendorID"]["string"]
                .as_str()
                .unwrap_or("")
                .to_string();
            by_node.entry(node.clone()).or_default().push((name, vendor));
        }
    }
    let nodes: Vec<&str> = by_node.keys().map(String::as_str).collect();
    if nodes != ["lab", "lab2"] {
        return Err(format!("pools of nodes {nodes:?}, want lab and lab2"));
    }
    let has = |n: &str, dev: &str| by_node[n].iter().any(|(d, _)| d == dev);
    let amd = |n: &str| by_node[n].iter().filter(|(_, v)| v == AMD_VENDOR).count();
    if !has("lab", VGA_DEV) || !has("lab2", VGA_DEV) {
        return Err(format!("{VGA_DEV} is not in both pools"));
    }
    if !has("lab2", AMD_DEV) || amd("lab2") != 1 || amd("lab") != 0 {
        return Err(format!(
            "vendor {AMD_VENDOR} devices: lab {}, lab2 {} (with {AMD_DEV}: {}); want 0 and 1",
            amd("lab"),
            amd("lab2"),
            has("lab2", AMD_DEV)
        ));
    }
    Ok(format!(
        "pool lab: {} devices, pool lab2: {} devices; {AMD_DEV} (vendor {AMD_VENDOR}) only in lab2's",
        by_node["lab"].len(),
        by_node["lab2"].len()
    ))
}

/// The Pod runs on `node` (its container ready).
fn pod_on(o: &Out, name: &str, node: &str) -> Result<(), String> {
    let p = o.cmd(name)?.json()?;
    let on = p["spec"]["nodeName"].as_str().unwrap_or("");
    let ready = p["status"]["containerStatuses"][0]["ready"] == true;
    if on == node && ready {
        Ok(())
    } else {
        Err(format!(
            "{}: on node {on:?} (want {node}), phase {}, container ready {ready}",
            p["metadata"]["name"], p["status"]["phase"]
        ))
    }
}

/// The claim is allocated `device` from `node`'s pool, for that node.
fn allocated(o: &Out, name: &str, node: &str, device: &str) -> Verdict {
    let c = o.cmd(name)?.json()?;
    let alloc = &c["status"]["allocation"];
    let r = &alloc["devices"]["results"][0];
    let (drv, pool, dev) = (
        r["driver"].as_str().unwrap_or(""),
        r["pool"].as_str().unwrap_or(""),
        r["device"].as_str().unwrap_or(""),
    );
    if drv != DRIVER || pool != node || dev != device {
        return Err(format!(
            "{}: allocated {drv}/{pool}/{dev}, want {DRIVER}/{node}/{device}",
            c["metadata"]["name"]
        ));
    }
    let sel = alloc["nodeSelector"].to_string();
    if !sel.contains(&format!("\"{node}\"")) {
        return Err(format!(
            "the allocation's nodeSelector does not name {node}: {sel}"
        ));
    }
    Ok(format!(
        "claim {}: {drv}/{pool}/{dev}, for node {node}",
        c["metadata"]["name"].as_str().unwrap_or("?")
    ))
}

/// The container opened every VFIO node it was given and saw the group's pciBusID.
fn opens(o: &Out, name: &str, bus_id: &str) -> Verdict {
    let c = o.cmd(name)?;
    let ok: Vec<&str> = c.out.lines().filter(|l| l.starts_with("open OK ")).collect();
    if ok.is_empty() || c.out.contains("open FAILED") || !c.out.lines().any(|l| l == "READY") {
        return Err(format!("{name}: {}", one_line(&c.out)));
    }
    let want = format!("\"resource.kubernetes.io/pciBusID\":{{\"string\":\"{bus_id}\"}}");
    if !c.out.contains(&want) {
        return Err(format!(
            "{name}: no metadata with pciBusID {bus_id}: {}",
            one_line(&c.out)
        ));
    }
    Ok(format!("{}; metadata pciBusID {bus_id}", ok.join(", ")))
}

/// The held Pod's events: the scheduler's FailedScheduling, saying no node of the two can
/// allocate its claim.
fn held_reason(o: &Out) -> Verdict {
    let v = o.cmd("held-events")?.json()?;
    let evs = items(&v);
    let msg = evs
        .iter()
        .find(|e| e["reason"] == "FailedScheduling")
        .and_then(|e| e["message"].as_str())
        .ok_or_else(|| {
            format!(
                "no FailedScheduling event for two-amd-held: {}",
                events_line(&evs)
            )
        })?;
    if msg.contains("0/2 nodes are available") && msg.contains("claim") {
        Ok(format!("FailedScheduling: {msg}"))
    } else {
        Err(format!(
            "FailedScheduling does not say that none of the 2 nodes can allocate the claim: {msg}"
        ))
    }
}

/// Every function's driver at the end is the one it had before anything.
fn same_drivers(o: &Out, prefix: &str, node: &str) -> Verdict {
    let before = o.facts(&format!("{prefix}before"))?;
    let end = o.facts(&format!("{prefix}end"))?;
    let drv = |f: &Facts| -> BTreeMap<String, String> {
        f.map
            .iter()
            .filter(|(k, _)| k.starts_with("drv."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let (b, e) = (drv(&before), drv(&end));
    if b.is_empty() {
        return Err(format!("{prefix}before.facts has no drv. lines"));
    }
    let moved: Vec<String> = b
        .iter()
        .filter(|(k, v)| e.get(*k) != Some(*v))
        .map(|(k, v)| {
            format!(
                "{} {v} -> {}",
                &k[4..],
                e.get(k).map(String::as_str).unwrap_or("(gone)")
            )
        })
        .collect();
    if moved.is_empty() && b.len() == e.len() {
        Ok(format!(
            "{node}: all {} functions on the drivers they started with",
            b.len()
        ))
    } else {
        Err(format!("{node}: {}", moved.join(", ")))
    }
}

fn teardown(o: &Out, prefix: &str) -> Verdict {
    let t = o.text(&format!("{prefix}cluster.txt"))?;
    t.lines()
        .find(|l| l.starts_with("teardown "))
        .ok_or_else(|| format!("{prefix}cluster.txt has no teardown line"))
        .and_then(|l| {
            if l.starts_with("teardown PASS") {
                Ok(l.to_string())
            } else {
                Err(l.to_string())
            }
        })
}
