//! The judge of `lab/scenarios/clusterslices.sh`: what the cluster knows of gpupass's devices
//! over time, on the real kubelet, scheduler and API server of the cluster lab (docs/dra.md,
//! "Slices resynced", "Health signals", "Taints").
//!
//! The guest ran the commands (`kubectl ... -o json` as `NAME.out`) and shipped what it waited
//! for as `NAME.facts` (`ok=1|0`, the seconds it took, the group's drivers then); every step is
//! decided here from those files.

use serde_json::Value;

use super::{check, one_line, Check, Judge, Out, Verdict};

/// The lab's VGA + audio group as a DRA device (lab/scenarios/clusterslices.sh).
const DEV: &str = "pci-0000-00-05-0";
const DRIVER: &str = "vfio.gpupass.dev";
const TAINT_KEY: &str = "gpupass.dev/unhealthy";
/// The longest the slices may take to come back after the kubelet's start (which wipes
/// them): the kubelet's own start-up under TCG is most of it.
const KUBELET_BACK_MAX_S: f64 = 90.0;
/// The longest a slice deleted by hand may take to come back.
const DELETE_BACK_MAX_S: f64 = 20.0;

pub fn judge() -> Judge {
    let checks: Vec<Check> = vec![
        check("registered", |o| waited(o, "registered")),
        check("published", |o| {
            waited(o, "published")?;
            let d = device(o, "slices-start")?;
            no_taint(&d, "slices-start")?;
            Ok(format!("{DEV} published, untainted"))
        }),
        // 2. The kubelet restarted: its start wipes the node's slices; they come back.
        check("kubelet-slices-back", |o| {
            let s = seconds(o, "kubelet-back", KUBELET_BACK_MAX_S)?;
            let u = o.facts("kubelet-uids")?;
            let (before, after) = (u.get("before")?.trim(), u.get("after")?.trim());
            if before.is_empty() || after.is_empty() || before == after {
                return Err(format!(
                    "the slice holding {DEV} had UID {before:?} before the kubelet's restart and {after:?} after: want a new one (the kubelet wiped it, the plugin created it again)"
                ));
            }
            device(o, "slices-after-kubelet")?;
            Ok(format!(
                "{DEV} on the API server again {s} s after the kubelet started (slice {before} wiped, {after} created)"
            ))
        }),
        check("kubelet-node-ready", |o| waited(o, "node-ready")),
        check("kubelet-new-claim-allocated", |o| {
            waited(o, "after-restart-allocated")?;
            allocated_to_dev(o, "after-restart-claim")
        }),
        check("kubelet-new-claim-prepared", |o| {
            waited(o, "after-restart-running")?;
            opened(o, "after-restart-log")
        }),
        check("kubelet-new-claim-released", |o| {
            drivers_back(o, "after-restart-restored")
        }),
        // 3. A slice deleted by hand.
        check("delete-slice-back", |o| {
            o.cmd("delete-slice")?.rc_is(0)?;
            let s = seconds(o, "delete-back", DELETE_BACK_MAX_S)?;
            device(o, "slices-after-delete")?;
            Ok(format!(
                "`kubectl delete resourceslice` of {DEV}'s slice: back after {s} s"
            ))
        }),
        // 4. Nothing written when nothing differs: the API server's own counters.
        check("no-write-when-same", |o| {
            let before = counters(o, "metrics-before")?;
            let after = counters(o, "metrics-after")?;
            let quiet = o.facts("quiet")?.get("seconds")?.to_string();
            let (wb, wa) = (writes(&before), writes(&after));
            if wb == 0.0 {
                return Err(format!(
                    "the API server counted no resourceslices writes at all before the quiet time: the counters do not cover the plugin's writes ({})",
                    one_line(&o.text("metrics-before.out")?)
                ));
            }
            if wa != wb {
                return Err(format!(
                    "{} resourceslices writes in {quiet} s of nothing changing ({wb} before, {wa} after): {}",
                    wa - wb,
                    diff(&before, &after)
                ));
            }
            Ok(format!(
                "apiserver_request_total for resourceslices: {wb} writes (POST/PUT/PATCH/DELETE/DELETECOLLECTION) before and after {quiet} s with nothing changed; {} reads then {}",
                reads(&before),
                reads(&after)
            ))
        }),
        // 5. Health that reaches the Pod.
        check("health-healthy", |o| {
            waited(o, "health-running")?;
            waited(o, "health-healthy-first")
        }),
        check("health-unhealthy-in-pod", |o| {
            o.cmd("health-unbind")?.rc_is(0)?;
            let s = waited(o, "health-unhealthy")?;
            let h = pod_health(o, "health-sick-pod")?;
            if h != "Unhealthy" {
                return Err(format!(
                    "the Pod's allocatedResourcesStatus says {DEV}={h}, want Unhealthy"
                ));
            }
            Ok(format!(
                "{DEV}=Unhealthy in the Pod's status.containerStatuses[].allocatedResourcesStatus ({s})"
            ))
        }),
        check("health-taint-while-sick", |o| {
            let d = device(o, "slices-health-sick")?;
            taint(&d, "slices-health-sick", "left-vfio")
        }),
        check("health-healthy-again", |o| {
            o.cmd("health-rebind")?.rc_is(0)?;
            let s = waited(o, "health-recovered")?;
            let h = pod_health(o, "health-well-pod")?;
            if h != "Healthy" {
                return Err(format!(
                    "the Pod's allocatedResourcesStatus says {DEV}={h}, want Healthy"
                ));
            }
            no_taint(&device(o, "slices-health-well")?, "slices-health-well")?;
            Ok(format!("{DEV}=Healthy again, untainted ({s})"))
        }),
        check("health-released", |o| drivers_back(o, "health-restored")),
        // 6. Taints.
        check("taint-published", |o| {
            o.cmd("taint-unbind")?.rc_is(0)?;
            let s = waited(o, "taint-published")?;
            let d = device(o, "slices-tainted")?;
            Ok(format!("{} ({s})", taint(&d, "slices-tainted", "driver-lost")?))
        }),
        check("taint-claim-pending", |o| {
            let claim = o.cmd("untolerated-claim")?.json()?;
            if !claim["status"]["allocation"].is_null() {
                return Err(format!(
                    "the claim without a toleration was allocated: {}",
                    one_line(&claim["status"]["allocation"].to_string())
                ));
            }
            for name in ["untolerated-pod", "untolerated-still"] {
                let pod = o.cmd(name)?.json()?;
                let phase = pod["status"]["phase"].as_str().unwrap_or("");
                if phase != "Pending" || !pod["spec"]["nodeName"].is_null() {
                    return Err(format!(
                        "{name}: the Pod is {phase:?} on {}, want Pending and unbound",
                        pod["spec"]["nodeName"]
                    ));
                }
            }
            Ok("the claim without a toleration is unallocated and its Pod Pending, also after the tolerating claim got the device".into())
        }),
        check("taint-scheduler-reason", |o| {
            waited(o, "untolerated-unschedulable")?;
            let pod = o.cmd("untolerated-pod")?.json()?;
            let cond = pod["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "PodScheduled"))
                .ok_or_else(|| "the Pod has no PodScheduled condition".to_string())?;
            let (reason, message) = (
                cond["reason"].as_str().unwrap_or(""),
                cond["message"].as_str().unwrap_or(""),
            );
            if cond["status"] != "False" || reason != "Unschedulable" || !message.contains("claim") {
                return Err(format!(
                    "PodScheduled {} reason {reason:?}: {message:?}, want False, Unschedulable, a message about the claim",
                    cond["status"]
                ));
            }
            let events = o.cmd("untolerated-events")?.json()?;
            let failed = events["items"]
                .as_array()
                .map(|v| v.iter().filter(|e| e["reason"] == "FailedScheduling").count())
                .unwrap_or(0);
            if failed == 0 {
                return Err("no FailedScheduling event for the Pod".into());
            }
            Ok(format!(
                "PodScheduled False, Unschedulable: {message:?} ({failed} FailedScheduling events)"
            ))
        }),
        check("toleration-allocated", |o| {
            waited(o, "tolerated-allocated")?;
            let c = o.cmd("tolerated-claim")?.json()?;
            let tol = &c["spec"]["devices"]["requests"][0]["exactly"]["tolerations"][0];
            if tol["key"] != TAINT_KEY {
                return Err(format!(
                    "the tolerating claim has no toleration of {TAINT_KEY}: {}",
                    one_line(&c["spec"].to_string())
                ));
            }
            allocated_to_dev(o, "tolerated-claim")
        }),
        check("toleration-prepared", |o| {
            waited(o, "tolerated-running")?;
            opened(o, "tolerated-log")
        }),
        check("taint-removed", |o| {
            waited(o, "tolerated-restored")?;
            o.cmd("taint-rebind")?.rc_is(0)?;
            let s = waited(o, "taint-removed")?;
            no_taint(&device(o, "slices-end")?, "slices-end")?;
            Ok(format!("the driver back, the taint gone ({s})"))
        }),
        check("plugin-stopped", |o| {
            let start = o.facts("start")?;
            let end = o.facts("end")?;
            end.is("plugin.alive", "0")?;
            for k in ["vga.driver", "aud.driver"] {
                end.is(k, start.get(k)?)?;
            }
            Ok(format!(
                "stopped; the group on {} {} as it started",
                start.get("vga.driver")?,
                start.get("aud.driver")?
            ))
        }),
    ];
    Judge {
        scenario: "clusterslices",
        host_steps: &[],
        checks,
    }
}

/// `NAME.facts` says the wait succeeded: its seconds and drivers.
fn waited(o: &Out, name: &str) -> Verdict {
    let f = o.facts(name)?;
    if f.get("ok")? != "1" {
        return Err(format!(
            "{name}: not seen within the guest's wait ({} s; drivers {})",
            f.get("seconds")?,
            f.get("drivers").unwrap_or("?")
        ));
    }
    Ok(format!("after {} s", f.get("seconds")?))
}

/// The wait `name` succeeded within `max` seconds: its seconds.
fn seconds(o: &Out, name: &str, max: f64) -> Result<f64, String> {
    waited(o, name)?;
    let s: f64 = o
        .facts(name)?
        .get("seconds")?
        .parse()
        .map_err(|_| format!("{name}: seconds is not a number"))?;
    if s > max {
        return Err(format!("{name}: {s} s, want at most {max} s"));
    }
    Ok(s)
}

/// `DEV` in the slices `NAME.out` lists (the JSON of `kubectl get resourceslices`).
fn device(o: &Out, name: &str) -> Result<Value, String> {
    let c = o.cmd(name)?;
    c.rc_is(0)?;
    let j = c.json()?;
    let items = j["items"].as_array().ok_or_else(|| format!("{name}: no items"))?;
    items
        .iter()
        .filter(|s| s["spec"]["driver"] == DRIVER)
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["name"] == DEV)
        .ok_or_else(|| {
            format!(
                "{name}: {DEV} is not in this node's slices ({} slices)",
                items.len()
            )
        })
}

fn no_taint(d: &Value, name: &str) -> Result<(), String> {
    match d["taints"].as_array() {
        Some(t) if !t.is_empty() => Err(format!(
            "{name}: {DEV} is tainted: {}",
            one_line(&d["taints"].to_string())
        )),
        _ => Ok(()),
    }
}

/// `d` has gpupass's taint with `value`, effect NoSchedule, stamped by the API server.
fn taint(d: &Value, name: &str, value: &str) -> Verdict {
    let t = d["taints"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["key"] == TAINT_KEY))
        .ok_or_else(|| {
            format!(
                "{name}: {DEV} has no {TAINT_KEY} taint: {}",
                one_line(&d.to_string())
            )
        })?;
    if t["value"] != value || t["effect"] != "NoSchedule" || !t["timeAdded"].is_string() {
        return Err(format!(
            "{name}: {DEV}'s taint is {}, want value {value}, effect NoSchedule, a timeAdded",
            one_line(&t.to_string())
        ));
    }
    Ok(format!(
        "{DEV} tainted {TAINT_KEY}={value}:NoSchedule since {}",
        t["timeAdded"].as_str().unwrap_or("")
    ))
}

/// The claim `NAME.out` is allocated `DEV` of this driver.
fn allocated_to_dev(o: &Out, name: &str) -> Verdict {
    let c = o.cmd(name)?.json()?;
    let r = &c["status"]["allocation"]["devices"]["results"][0];
    if r["device"] != DEV || r["driver"] != DRIVER {
        return Err(format!(
            "{name}: allocated {}, want {DRIVER}/{DEV}",
            one_line(&r.to_string())
        ));
    }
    Ok(format!(
        "claim {} allocated {}/{}/{}",
        c["metadata"]["name"].as_str().unwrap_or("?"),
        r["driver"].as_str().unwrap_or(""),
        r["pool"].as_str().unwrap_or(""),
        r["device"].as_str().unwrap_or("")
    ))
}

/// The Pod's log (`NAME.out`, cl_logs) opened the group's nodes and said READY.
fn opened(o: &Out, name: &str) -> Verdict {
    let out = o.cmd(name)?.out;
    let group = o.facts("start")?.get("group")?.to_string();
    let node = format!("open OK /dev/vfio/{group}");
    if out.lines().any(|l| l == node) && out.lines().any(|l| l == "READY") && !out.contains("open FAILED") {
        Ok(format!("prepared: the Pod's container says {node:?} and READY"))
    } else {
        Err(format!(
            "{name}: want {node:?} and READY, no open FAILED: {}",
            one_line(&out)
        ))
    }
}

/// The wait `name` saw both functions on the drivers they started on.
fn drivers_back(o: &Out, name: &str) -> Verdict {
    waited(o, name)?;
    let start = o.facts("start")?;
    let want = format!("{} {}", start.get("vga.driver")?, start.get("aud.driver")?);
    o.facts(name)?.is("drivers", &want)?;
    Ok(format!("the group back on {want}"))
}

/// `DEV`'s health in the Pod `NAME.out`'s allocatedResourcesStatus.
fn pod_health(o: &Out, name: &str) -> Result<String, String> {
    let pod = o.cmd(name)?.json()?;
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| {
            c["allocatedResourcesStatus"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|s| s["resources"].as_array().cloned().unwrap_or_default())
        .find(|r| r["resourceID"].as_str().is_some_and(|id| id.ends_with(DEV)))
        .map(|r| r["health"].as_str().unwrap_or("").to_string())
        .ok_or_else(|| {
            format!(
                "{name}: no {DEV} in allocatedResourcesStatus: {}",
                one_line(&pod["status"]["containerStatuses"].to_string())
            )
        })
}

/// `apiserver_request_total{...resource="resourceslices"...} N` lines: (verb, code) → N.
fn counters(o: &Out, name: &str) -> Result<Vec<(String, String, f64)>, String> {
    let c = o.cmd(name)?;
    c.rc_is(0)?;
    let mut v = Vec::new();
    for l in c
        .out
        .lines()
        .filter(|l| l.contains("resource=\"resourceslices\""))
    {
        let label = |k: &str| {
            l.split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let n: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("{name}: no count on {l:?}"))?;
        v.push((label("verb"), label("code"), n));
    }
    if v.is_empty() {
        return Err(format!(
            "{name}: no apiserver_request_total line for resourceslices"
        ));
    }
    Ok(v)
}

fn is_write(verb: &str) -> bool {
    matches!(verb, "POST" | "PUT" | "PATCH" | "DELETE" | "DELETECOLLECTION")
}

fn writes(c: &[(String, String, f64)]) -> f64 {
    c.iter().filter(|(v, _, _)| is_write(v)).map(|(_, _, n)| n).sum()
}

fn reads(c: &[(String, String, f64)]) -> f64 {
    c.iter().filter(|(v, _, _)| !is_write(v)).map(|(_, _, n)| n).sum()
}

/// The write counters that changed, `VERB code: before -> after`.
fn diff(before: &[(String, String, f64)], after: &[(String, String, f64)]) -> String {
    after
        .iter()
        .filter(|(v, _, _)| is_write(v))
        .filter_map(|(v, c, n)| {
            let b = before
                .iter()
                .find(|(bv, bc, _)| bv == v && bc == c)
                .map_or(0.0, |x| x.2);
            (b != *n).then(|| format!("{v} {c}: {b} -> {n}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}
