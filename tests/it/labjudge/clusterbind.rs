//! The judge of `lab/scenarios/clusterbind.sh`: binding conditions (KEP-5007) on the cluster
//! lab's real scheduler, kubelet and API server. The guest's VGA+HDA group 00:05.x (bochs-drm
//! and snd_hda_intel) is a GPU and its HDMI audio, published with gpupass's binding
//! conditions; the plugin binds it before the Pod is bound, a host process holding the VGA's
//! DRM node makes that bind fail (the Pod goes back to the scheduler), and Pods are timed
//! from creation to Running with and without the conditions (docs/dra.md, "Binding
//! conditions"; docs/performance.md).

use serde_json::Value;

use super::{check, one_line, Judge, Out, Verdict};

const DEVICE: &str = "pci-0000-00-05-0";
const READY: &str = "gpupass.dev/GroupBound";
const FAILED: &str = "gpupass.dev/GroupBindFailed";
const MANAGER: &str = "gpupass-dra-plugin";
/// Pods timed each way when the guest says nothing else (`BIND_N`).
const MIN_TIMED: usize = 1;

pub fn judge() -> Judge {
    Judge {
        scenario: "clusterbind",
        host_steps: &[],
        checks: vec![
            check("start-drivers", |o| {
                let f = o.facts("start")?;
                let (v, a) = (f.get("vga.driver")?, f.get("aud.driver")?);
                if v.is_empty()
                    || v == "vfio-pci"
                    || a.is_empty()
                    || a == "vfio-pci"
                    || f.get("group")?.is_empty()
                {
                    return Err(format!(
                        "start: {v:?} {a:?} group {:?}: the group must start on its host drivers",
                        f.get("group")?
                    ));
                }
                Ok(format!(
                    "{v} {a}, group {}, DRM node {}",
                    f.get("group")?,
                    f.get("card")?
                ))
            }),
            check("plugin-registered", |o| {
                let f = o.facts("registered")?;
                if f.num("registered")? < 1 {
                    return Err("the kubelet never registered the plugin (bc-plugin.log)".into());
                }
                Ok(format!("after {} s", f.get("after")?))
            }),
            check("slices-conditions", |o| slices_have_conditions(o, "slices", true)),
            check("bound-condition", bound_condition),
            check("bound-before-binding", bound_before_binding),
            check("bound-running", |o| {
                pod_running(o, "bound")?;
                drivers_are(o, "bound", "vfio-pci vfio-pci")
            }),
            check("prepare-took-over", prepare_took_over),
            check("released", |o| drivers_are(o, "released", &start_drivers(o)?)),
            check("held-bind-failed", held_bind_failed),
            check("held-not-bound", held_not_bound),
            check("held-tainted", |o| {
                // While held, the device carries the busy taint (the scheduler chooses it no
                // more); once the holder has gone and the Pod runs, it carries none.
                let held = taints(o, "held-slices")?;
                let want = "gpupass.dev/busy=InUse:NoSchedule";
                if !held.iter().any(|t| t == want) {
                    return Err(format!("held-slices: {DEVICE} taints {held:?}, want {want}"));
                }
                let freed = taints(o, "freed-slices")?;
                if freed.iter().any(|t| t.starts_with("gpupass.dev/busy=")) {
                    return Err(format!("freed-slices: {DEVICE} still tainted: {freed:?}"));
                }
                Ok(format!("while held: {}; once freed: {freed:?}", held.join(", ")))
            }),
            check("freed-running", |o| {
                let f = o.facts("freed")?;
                f.is("holder.alive", "no")?;
                pod_running(o, "freed")?;
                let d = drivers_are(o, "freed", "vfio-pci vfio-pci")?;
                let s = samples(o, "bc-freed")?;
                Ok(format!(
                    "{d}; Running {} s after the holder went",
                    s.last().map_or(0.0, |x| x.t)
                ))
            }),
            check("bench-with", |o| bench(o, "with")),
            check("bench-without", |o| bench(o, "without")),
            check("slices-off", |o| slices_have_conditions(o, "slices-off", false)),
            check("checkpoint-empty", |o| {
                let c = o.cmd("checkpoint")?;
                if c.out.contains("\"uid\"") {
                    return Err(format!("claims left in the checkpoint: {}", one_line(&c.out)));
                }
                Ok("no claim left".into())
            }),
            check("journal-empty", |o| {
                let c = o.cmd("recover")?;
                c.rc_is(0)?;
                c.out_has("nothing to recover")?;
                Ok(one_line(&c.out))
            }),
            check("end-drivers", |o| drivers_are(o, "end", &start_drivers(o)?)),
        ],
    }
}

fn start_drivers(o: &Out) -> Result<String, String> {
    let f = o.facts("start")?;
    Ok(format!("{} {}", f.get("vga.driver")?, f.get("aud.driver")?))
}

/// The group's drivers after step `name` are `want` ("VGA AUD").
fn drivers_are(o: &Out, name: &str, want: &str) -> Verdict {
    let f = o.facts(name)?;
    let got = format!("{} {}", f.get("vga.driver")?, f.get("aud.driver")?);
    if got == want {
        Ok(format!("after {name}: {got}"))
    } else {
        Err(format!("after {name}: drivers {got:?}, want {want:?}"))
    }
}

/// `name`'s stdout as JSON, the command having exited 0.
/// The taints of [`DEVICE`] in the slices `name` shipped, as `KEY=VALUE:EFFECT`.
fn taints(o: &Out, name: &str) -> Result<Vec<String>, String> {
    super::device_taints(&json(o, name)?, DEVICE)
        .ok_or_else(|| format!("{name}: no {DEVICE} in the node's slices"))
}

fn json(o: &Out, name: &str) -> Result<Value, String> {
    let c = o.cmd(name)?;
    c.rc_is(0)?;
    c.json()
}

/// Every device of the slices in `name`: the group carries both conditions (`want`) or none;
/// no mdev slot ever does.
fn slices_have_conditions(o: &Out, name: &str, want: bool) -> Verdict {
    let j = json(o, name)?;
    let devices: Vec<&Value> = j["items"]
        .as_array()
        .ok_or("no items")?
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .collect();
    let group = devices
        .iter()
        .find(|d| d["name"] == DEVICE)
        .ok_or_else(|| format!("{name}: no device {DEVICE} among {} devices", devices.len()))?;
    let (bc, bfc) = (&group["bindingConditions"], &group["bindingFailureConditions"]);
    if want {
        if *bc != serde_json::json!([READY]) || *bfc != serde_json::json!([FAILED]) {
            return Err(format!("{name}: {DEVICE} has bindingConditions {bc} and bindingFailureConditions {bfc}, want [{READY}] and [{FAILED}]"));
        }
    } else if !bc.is_null() || !bfc.is_null() {
        return Err(format!(
            "{name}: {DEVICE} still has bindingConditions {bc} {bfc} with --binding-conditions off"
        ));
    }
    let slots: Vec<&&Value> = devices
        .iter()
        .filter(|d| d["name"].as_str().is_some_and(|n| n.starts_with("mdev-")))
        .collect();
    if let Some(s) = slots.iter().find(|d| !d["bindingConditions"].is_null()) {
        return Err(format!(
            "{name}: mdev slot {} has binding conditions (no driver switch for a slot)",
            s["name"]
        ));
    }
    Ok(format!(
        "{DEVICE}: {}; {} mdev slots without; {} devices",
        if want {
            format!("bindingConditions [{READY}], bindingFailureConditions [{FAILED}]")
        } else {
            "no binding conditions".into()
        },
        slots.len(),
        devices.len()
    ))
}

/// The claim's status entry for the group, and its condition of `type_`.
fn condition<'a>(claim: &'a Value, type_: &str) -> Option<&'a Value> {
    claim["status"]["devices"]
        .as_array()?
        .iter()
        .find(|d| d["device"] == DEVICE && d["driver"] == "vfio.gpupass.dev")?["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// When the API server recorded the plugin's write of the claim's status (its managed fields:
/// the API server's clock, as the scheduler's).
fn written_at(claim: &Value) -> Option<&str> {
    claim["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|m| m["manager"] == MANAGER && m["subresource"] == "status")?["time"]
        .as_str()
}

fn bound_condition(o: &Out) -> Verdict {
    let claim = json(o, "bound-claim")?;
    let c = condition(&claim, READY).ok_or_else(|| {
        format!(
            "bound-claim: no {READY} on {DEVICE}: {}",
            one_line(&claim["status"].to_string())
        )
    })?;
    if c["status"] != "True" || c["reason"] != "Bound" {
        return Err(format!(
            "bound-claim: {READY} is {} ({}), want True (Bound)",
            c["status"], c["reason"]
        ));
    }
    let at = written_at(&claim)
        .ok_or_else(|| format!("bound-claim: no status write by {MANAGER} in the managed fields"))?;
    Ok(format!(
        "{READY}=True by {MANAGER} at {at}: {}",
        c["message"].as_str().unwrap_or("")
    ))
}

/// One line of a `.samples` file.
struct Sample {
    t: f64,
    node: String,
    cond: String,
    phase: String,
}

fn samples(o: &Out, name: &str) -> Result<Vec<Sample>, String> {
    let text = o.text(&format!("{name}.samples"))?;
    let mut v = Vec::new();
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut s = Sample {
            t: 0.0,
            node: String::new(),
            cond: String::new(),
            phase: String::new(),
        };
        for (i, part) in l.split_whitespace().enumerate() {
            match (i, part.split_once('=')) {
                (0, _) => s.t = part.parse().map_err(|_| format!("{name}.samples: {l:?}"))?,
                (_, Some(("node", x))) => s.node = x.to_string(),
                (_, Some(("cond", x))) => s.cond = x.to_string(),
                (_, Some(("phase", x))) => s.phase = x.to_string(),
                _ => {}
            }
        }
        v.push(s);
    }
    if v.is_empty() {
        return Err(format!("{name}.samples is empty"));
    }
    Ok(v)
}

/// The events of `name` (`kc get events -o json`), as (reason, message, time).
fn events(o: &Out, name: &str) -> Result<Vec<(String, String, String)>, String> {
    let j = json(o, name)?;
    Ok(j["items"]
        .as_array()
        .ok_or("no items")?
        .iter()
        .map(|e| {
            let time = ["eventTime", "firstTimestamp", "lastTimestamp"]
                .iter()
                .find_map(|k| e[*k].as_str())
                .unwrap_or("")
                .to_string();
            (
                e["reason"].as_str().unwrap_or("").to_string(),
                e["message"].as_str().unwrap_or("").to_string(),
                time,
            )
        })
        .collect())
}

/// Seconds of an RFC 3339 time (UTC, `Z`), from its date and time to the second.
fn secs(t: &str) -> Option<i64> {
    let (d, rest) = t.split_once('T')?;
    let mut dp = d.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (dp.next()??, dp.next()??, dp.next()??);
    let hms = rest.get(..8)?;
    let mut tp = hms.split(':').map(|x| x.parse::<i64>().ok());
    let (h, mi, s) = (tp.next()??, tp.next()??, tp.next()??);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some((era * 146097 + doe - 719468) * 86400 + h * 3600 + mi * 60 + s)
}

/// The Pod's node was set only after the plugin's condition: the scheduler said it waits
/// (BindingConditionsPending), the API server recorded the plugin's write no later than the
/// Pod's PodScheduled condition (one clock, to the second), and no sample saw the Pod on the
/// node without the condition True.
fn bound_before_binding(o: &Out) -> Verdict {
    let ev = events(o, "bound-events")?;
    let pending = ev
        .iter()
        .find(|(r, _, _)| r == "BindingConditionsPending")
        .ok_or_else(|| {
            format!(
                "bound-events: no BindingConditionsPending event from the scheduler: {:?}",
                ev.iter().map(|e| &e.0).collect::<Vec<_>>()
            )
        })?;
    let claim = json(o, "bound-claim")?;
    let pod = json(o, "bound-pod")?;
    let written = written_at(&claim).ok_or("bound-claim: no status write of the plugin")?;
    let scheduled = pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| {
            cs.iter()
                .find(|c| c["type"] == "PodScheduled" && c["status"] == "True")
        })
        .and_then(|c| c["lastTransitionTime"].as_str())
        .ok_or("bound-pod: no PodScheduled=True condition")?;
    let (w, s) = (
        secs(written).ok_or("bad time")?,
        secs(scheduled).ok_or("bad time")?,
    );
    if w > s {
        return Err(format!(
            "the plugin's condition was written at {written}, after the Pod was scheduled at {scheduled}"
        ));
    }
    let ss = samples(o, "bc-run")?;
    let ready = |x: &Sample| x.cond.contains(&format!("{READY}=True"));
    if let Some(bad) = ss.iter().find(|x| x.node != "-" && !ready(x)) {
        return Err(format!(
            "at {} s the Pod was on node {} while the claim said {:?}",
            bad.t, bad.node, bad.cond
        ));
    }
    let first_cond = ss.iter().find(|x| ready(x)).map(|x| x.t);
    let first_node = ss.iter().find(|x| x.node != "-").map(|x| x.t);
    let window = ss.iter().filter(|x| ready(x) && x.node == "-").count();
    Ok(format!(
        "scheduler waited ({}: {}); condition written {written}, Pod scheduled {scheduled}; samples: condition first at {} s, node first at {} s, {window} samples with the condition and no node",
        pending.0,
        pending.1,
        first_cond.map_or("-".into(), |t| t.to_string()),
        first_node.map_or("-".into(), |t| t.to_string()),
    ))
}

/// `NAME-pod` is Running on the lab's node.
fn pod_running(o: &Out, name: &str) -> Verdict {
    let pod = json(o, &format!("{name}-pod"))?;
    if pod["status"]["phase"] != "Running" || pod["spec"]["nodeName"].as_str().is_none() {
        return Err(format!(
            "{name}-pod: phase {} on node {}",
            pod["status"]["phase"], pod["spec"]["nodeName"]
        ));
    }
    Ok(format!("Running on {}", pod["spec"]["nodeName"]))
}

/// The plugin bound the claim before binding, then the kubelet's Prepare found it bound (the
/// plugin's log: the bind, then Prepare, of the claim's UID).
fn prepare_took_over(o: &Out) -> Verdict {
    let claim = json(o, "bound-claim")?;
    let uid = claim["metadata"]["uid"].as_str().ok_or("bound-claim: no uid")?;
    let log = o.text("bc-plugin.log")?;
    let line_of = |needle: &str| log.lines().position(|l| l.contains(needle) && l.contains(uid));
    let bound = line_of("before binding:")
        .ok_or_else(|| format!("bc-plugin.log: no bind before binding of claim {uid}"))?;
    let prepared =
        line_of("prepared claim").ok_or_else(|| format!("bc-plugin.log: no Prepare of claim {uid}"))?;
    if prepared < bound {
        return Err(format!(
            "claim {uid} was prepared (line {}) before it was bound (line {})",
            prepared + 1,
            bound + 1
        ));
    }
    let l = log.lines().nth(bound).unwrap_or("");
    Ok(format!(
        "log line {}: {} ; then Prepare at line {}",
        bound + 1,
        l.split_once("INFO").map_or(l, |x| x.1).trim(),
        prepared + 1
    ))
}

/// The bind failed while the DRM node was held: the failure's reason InUse and the holder's pid
/// in the Pod's events (the scheduler's), also on the claim when a sample caught it.
fn held_bind_failed(o: &Out) -> Verdict {
    let f = o.facts("held")?;
    let pid = f.get("holder.pid")?;
    f.is("holder.alive", "yes")?;
    let ev = events(o, "held-events")?;
    let hit = ev
        .iter()
        .find(|(_, m, _)| m.contains("InUse") && m.contains(&format!("pid {pid}")))
        .ok_or_else(|| {
            format!(
                "held-events: no event with InUse and pid {pid}: {}",
                one_line(
                    &ev.iter()
                        .map(|e| format!("{}: {}", e.0, e.1))
                        .collect::<Vec<_>>()
                        .join("\n")
                )
            )
        })?;
    let ss = samples(o, "bc-held")?;
    let on_claim = ss
        .iter()
        .filter(|x| x.cond.contains(&format!("{FAILED}=True/InUse")))
        .count();
    let failures = ev
        .iter()
        .filter(|(r, m, _)| r == "FailedScheduling" && m.contains("InUse"))
        .count();
    Ok(format!(
        "{}: {}; {failures} FailedScheduling events with InUse; {on_claim} of {} samples saw {FAILED}=True/InUse on the claim",
        hit.0,
        hit.1.chars().take(300).collect::<String>(),
        ss.len()
    ))
}

/// While held: the Pod was never bound (no node in any sample, none in its object), it is
/// Pending with PodScheduled False, and the group stayed on its host drivers.
fn held_not_bound(o: &Out) -> Verdict {
    let pod = json(o, "held-pod")?;
    if let Some(n) = pod["spec"]["nodeName"].as_str() {
        return Err(format!("held-pod: bound to {n} while the group was held"));
    }
    if pod["status"]["phase"] != "Pending" {
        return Err(format!(
            "held-pod: phase {}, want Pending",
            pod["status"]["phase"]
        ));
    }
    let sched = pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "PodScheduled"))
        .ok_or("held-pod: no PodScheduled condition")?;
    if sched["status"] != "False" {
        return Err(format!("held-pod: PodScheduled {}", sched["status"]));
    }
    let ss = samples(o, "bc-held")?;
    if let Some(b) = ss.iter().find(|x| x.node != "-" || x.phase == "Running") {
        return Err(format!(
            "at {} s the Pod was on node {} ({})",
            b.t, b.node, b.phase
        ));
    }
    let d = drivers_are(o, "held", &start_drivers(o)?)?;
    Ok(format!(
        "Pending, PodScheduled False ({}: {}); {d}; {} samples, none with a node",
        sched["reason"].as_str().unwrap_or(""),
        sched["message"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(200)
            .collect::<String>(),
        ss.len()
    ))
}

/// The Pods timed `mode` (with or without binding conditions): each Running with the group on
/// vfio-pci; their creation-to-Running seconds.
fn bench(o: &Out, mode: &str) -> Verdict {
    let n = o.facts("bench")?.num("n")? as usize;
    if n < MIN_TIMED {
        return Err(format!("bench: n={n}, want at least {MIN_TIMED}"));
    }
    let mut v = Vec::new();
    for i in 1..=n {
        let name = format!("{mode}-{i}");
        let f = o.facts(&name)?;
        f.is("phase", "Running")?;
        drivers_are(o, &name, "vfio-pci vfio-pci")?;
        v.push(
            f.get("secs")?
                .parse::<f64>()
                .map_err(|_| format!("{name}: secs {:?}", f.get("secs")))?,
        );
    }
    let mut sorted = v.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let median = sorted[sorted.len() / 2];
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    Ok(format!(
        "{n} Pods {mode} binding conditions, creation to Running: {} s; median {median:.1} s, mean {mean:.1} s (load {})",
        v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(" "),
        o.facts("bench")?.get("loadavg")?
    ))
}

#[cfg(test)]
mod tests {
    use super::secs;

    #[test]
    fn rfc3339_seconds_are_read_to_the_second() {
        assert_eq!(secs("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(secs("2026-12-06T05:00:01Z"), Some(1_796_533_201));
        assert_eq!(secs("2026-12-06T05:00:01.123456Z"), secs("2026-12-06T05:00:01Z"));
        assert_eq!(secs("junk"), None);
    }
}
