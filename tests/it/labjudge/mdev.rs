//! The judge of `lab/scenarios/mdev.sh`: `gpupass mdev` on the kernel's sample parents (mbochs,
//! mdpy, mtty): types, create (sysfs device, IOMMU group, `/dev/vfio` node), the in-use
//! refusal, exhaustion, remove, errors that change nothing, mdevctl interop both ways and the
//! create+remove timing beside mdevctl's start+stop.
//!
//! Every step the busybox script asserted before it was judged here is a check below, under the
//! same name and with the same conditions, except `remove-*>=2` (one step per instance, named
//! by its UUID), which is `remove-each`: at least two instances, each removed (docs/lab.md,
//! "Judged scenarios", has the table).

use serde_json::Value;

use super::{check, one_line, Check, Judge, Out, Verdict};

/// The UUIDs the script gives its definitions (lab/scenarios/mdev.sh).
const UA: &str = "aaaaaaaa-1111-4222-8333-444444444444";
const UB: &str = "bbbbbbbb-1111-4222-8333-444444444444";

pub fn judge() -> Judge {
    let mut c: Vec<Check> = vec![
        check("types", |o| ran(o, "types")),
        check("types-json", |o| {
            let (_, j) = json_ok(o, "types-json")?;
            Ok(format!("{} parents", parents(&j)?.len()))
        }),
    ];
    for p in ["mbochs", "mdpy", "mtty"] {
        c.push(check(format!("parent-{p}"), move |o| {
            let (_, j) = json_ok(o, "types-json")?;
            let names = parents(&j)?;
            if names.iter().any(|n| n == p) {
                Ok("listed".into())
            } else {
                Err(format!("{p} not in gpupass mdev types: {names:?}"))
            }
        }));
    }
    c.extend([
        check("types-agree", |o| {
            let want = o.facts("start")?.num("large.available")?;
            let (_, j) = json_ok(o, "types-mbochs")?;
            let got = j["parents"]
                .as_array()
                .and_then(|a| a.iter().find(|p| p["name"] == "mbochs"))
                .and_then(|p| p["types"].as_array())
                .and_then(|t| t.iter().find(|t| t["id"] == "mbochs-large"))
                .map(|t| t["available_instances"].clone())
                .ok_or_else(|| format!("no mbochs-large under mbochs: {}", one_line(&j.to_string())))?;
            if got == want {
                Ok(format!("{want}"))
            } else {
                Err(format!("gpupass says {got} mbochs-large available, the kernel {want}"))
            }
        }),
        // 2. create: the instance in sysfs, its group, its node, in `mdev list`.
        check("create", |o| {
            let c = o.cmd("create")?;
            c.rc_is(0)?;
            uuid(o)
        }),
        check("sysfs-device", |o| {
            let u = uuid(o)?;
            let f = o.facts("create")?;
            f.is("sysfs", "present")
                .map_err(|_| format!("no /sys/bus/mdev/devices/{u}"))?;
            Ok(format!("/sys/bus/mdev/devices/{u} group {}", f.get("group")?))
        }),
        check("vfio-node", |o| {
            let f = o.facts("create")?;
            let g = f.get("group")?;
            f.is("node", "char")
                .map(|_| format!("/dev/vfio/{g}"))
                .map_err(|_| format!("no /dev/vfio/{g}"))
        }),
        check("list", |o| json_ok(o, "list").map(|(_, j)| format!("{} active", active(&j).len()))),
        check("list-shows", |o| {
            let u = uuid(o)?;
            let g = o.facts("create")?.get("group")?.to_string();
            let (_, j) = json_ok(o, "list")?;
            let node = format!("/dev/vfio/{g}");
            match active(&j).into_iter().find(|a| a["instance"] == u.as_str()) {
                Some(a) if a["vfio_node"] == node.as_str() => Ok(format!("{u} {node}")),
                Some(a) => Err(format!("{u} listed with vfio_node {}, want {node}", a["vfio_node"])),
                None => Err(format!("{u} not listed with {node}")),
            }
        }),
        // 3. in use: remove refused, nothing changed; list names the holder.
        check("remove-in-use-refused", |o| {
            let c = o.cmd("remove-in-use")?;
            let f = o.facts("remove-in-use")?;
            if c.rc == 1 && c.err.contains("is in use") && f.get("sysfs")? == "present" {
                Ok(one_line(&c.err))
            } else {
                Err(format!(
                    "rc={} instance {} :: {}",
                    c.rc,
                    f.get("sysfs")?,
                    one_line(&c.err)
                ))
            }
        }),
        check("list-in-use", |o| {
            let u = uuid(o)?;
            let pid = o.facts("remove-in-use")?.num("holder.pid")?;
            let (_, j) = json_ok(o, "list-busy")?;
            let a = active(&j)
                .into_iter()
                .find(|a| a["instance"] == u.as_str())
                .ok_or_else(|| format!("{u} not in mdev list --json"))?;
            let holds = a["holders"]
                .as_array()
                .is_some_and(|h| h.iter().any(|h| h["pid"] == pid && h["comm"] == "sleep"));
            if holds && a["in_use"] != false && !a["in_use"].is_null() {
                Ok(format!("sleep (pid {pid})"))
            } else {
                Err(format!(
                    "{u}: in_use {} holders {}, want sleep (pid {pid})",
                    a["in_use"], a["holders"]
                ))
            }
        }),
        // 4. exhaustion: gpupass's clear error, and the kernel agrees.
        check("exhaust-fill", |o| {
            let left = o.facts("exhausted")?.num("left")?;
            if left == 0 {
                return Ok("none left to fill".into());
            }
            let c = o.cmd("exhaust-fill")?;
            c.rc_is(0)?;
            let n = c.out.lines().filter(|l| !l.trim().is_empty()).count() as i64;
            if n == left {
                Ok(format!("{n} more created"))
            } else {
                Err(format!("{left} left, {n} created: {}", one_line(&c.out)))
            }
        }),
        check("exhausted-error", |o| {
            let c = o.cmd("exhausted")?;
            let f = o.facts("exhausted")?;
            let (b, a) = (f.num("before")?, f.num("after")?);
            if c.rc == 1 && c.err.contains("no available instances of mbochs-large on mbochs") && b == a {
                Ok(one_line(&c.err))
            } else {
                Err(format!("rc={} before={b} after={a} {}", c.rc, one_line(&c.err)))
            }
        }),
        check("kernel-agrees", |o| match o.facts("exhausted")?.get("direct-create")? {
            "refused" => Ok("direct create refused by the kernel too".into()),
            other => Err(format!(
                "the kernel {other} a create with available_instances=0"
            )),
        }),
        // 5. remove: each instance (at least the first and one more) with its node.
        check("remove-each", |o| {
            let n = o.facts("removed")?.num("instances")?;
            if n < 2 {
                return Err(format!("{n} instances removed, want at least 2"));
            }
            let mut done = Vec::new();
            for i in 1..=n {
                let step = format!("remove-{i}");
                let c = o.cmd(&step)?;
                let f = o.facts(&step)?;
                let u = f.get("uuid")?;
                c.rc_is(0)?;
                f.is("sysfs", "absent")
                    .map_err(|_| format!("{step}: /sys/bus/mdev/devices/{u} still there"))?;
                if f.get("node")? != "absent" {
                    return Err(format!(
                        "{step}: /dev/vfio/{} of {u} is {}",
                        f.get("group")?,
                        f.get("node")?
                    ));
                }
                done.push(u.to_string());
            }
            Ok(format!("{n} removed, nodes gone: {}", done.join(" ")))
        }),
        check("available-restored", |o| {
            let want = o.facts("start")?.get("large.available")?.to_string();
            o.facts("removed")?.is("large.available", &want)
        }),
        // 6. errors that change nothing.
        check("unknown-parent", |o| refused(o, "unknown-parent", 1, "did you mean \"mbochs\"")),
        check("unknown-type", |o| {
            refused(o, "unknown-type", 1, "valid types: mdpy-hd, mdpy-vga, mdpy-xga")
        }),
        check("malformed-uuid", |o| refused(o, "malformed-uuid", 2, "")),
        check("attr-rollback", |o| {
            refused(o, "attr-rollback", 1, "the instance was removed again")
        }),
        check("errors-changed-nothing", |o| {
            let f = o.facts("errors")?;
            let want = f.get("before")?.to_string();
            f.is("after", &want)
        }),
        // 7. mdevctl interop, both ways.
        check("mdevctl-present", |o| {
            let f = o.facts("mdevctl")?;
            if f.get("present")? == "yes" {
                Ok(f.get("version")?.to_string())
            } else {
                Err("mdevctl is not in the guest: the lab runner must copy /usr/bin/mdevctl and its libraries (lab-files)".into())
            }
        }),
        check("gpupass-define", |o| ran(o, "gpupass-define")),
        check("mdevctl-sees-gpupass-definition", |o| {
            let c = o.cmd("mdevctl-defined")?;
            let all = format!("{}{}", c.out, c.err);
            line_with(&all, &format!("{UA} mdpy mdpy-vga auto"))
        }),
        check("mdevctl-define", |o| ran(o, "mdevctl-define")),
        check("gpupass-sees-mdevctl-definition", |o| {
            let (_, j) = json_ok(o, "gp-defined")?;
            let d = defined(&j)
                .into_iter()
                .find(|d| d["uuid"] == UB)
                .ok_or_else(|| format!("{UB} not in gpupass mdev list --defined --json"))?;
            if d["mdev_type"] == "mtty-2" && d["start"] == "manual" {
                Ok(format!("{UB} {} {} {}", d["parent"], d["mdev_type"], d["start"]))
            } else {
                Err(format!("{UB}: mdev_type {} start {}, want mtty-2 manual", d["mdev_type"], d["start"]))
            }
        }),
        check("gpupass-start-mdevctl-definition", |o| {
            let c = o.cmd("gpupass-start")?;
            c.rc_is(0)?;
            o.facts("gpupass-start")?
                .is("sysfs", "present")
                .map_err(|_| format!("started but no /sys/bus/mdev/devices/{UB}"))?;
            Ok(one_line(&c.out))
        }),
        check("mdevctl-sees-gpupass-start", |o| {
            let c = o.cmd("mdevctl-active")?;
            line_with(&format!("{}{}", c.out, c.err), &format!("{UB} mtty mtty-2"))
        }),
        check("mdevctl-stops-it", |o| {
            o.cmd("mdevctl-stop")?.rc_is(0)?;
            o.facts("mdevctl-stop")?
                .is("sysfs", "absent")
                .map(|_| "gone".to_string())
        }),
        check("start-auto-all", |o| {
            let c = o.cmd("start-auto-all")?;
            c.rc_is(0)?;
            o.facts("start-auto-all")?
                .is("sysfs", "present")
                .map_err(|_| format!("no /sys/bus/mdev/devices/{UA}: {}", one_line(&c.out)))?;
            Ok(one_line(&c.out))
        }),
        check("undefine-both", |o| {
            let (_, j) = json_ok(o, "undefine-both")?;
            let left: Vec<String> = defined(&j)
                .into_iter()
                .filter(|d| d["uuid"] == UA || d["uuid"] == UB)
                .map(|d| d["uuid"].to_string())
                .collect();
            if left.is_empty() {
                Ok("gone".into())
            } else {
                Err(format!("still defined: {}", left.join(" ")))
            }
        }),
        // 8. the timing, with every command of it exiting 0.
        check("bench", |o| {
            let f = o.facts("bench")?;
            let text = o.text("bench.txt")?;
            match f.num("failed")? {
                0 => Ok(one_line(&text)),
                n => Err(format!(
                    "{n} of {} create/remove/start/stop failed: {}",
                    f.get("commands")?,
                    one_line(&text)
                )),
            }
        }),
    ]);
    Judge {
        scenario: "mdev",
        host_steps: &[],
        checks: c,
    }
}

fn ran(o: &Out, name: &str) -> Verdict {
    let c = o.cmd(name)?;
    c.rc_is(0)?;
    Ok(format!("rc=0 {}", c.out.lines().next().unwrap_or("").trim()))
}

fn json_ok(o: &Out, name: &str) -> Result<(super::Cmd, Value), String> {
    let c = o.cmd(name)?;
    c.rc_is(0)?;
    let j = c.json()?;
    Ok((c, j))
}

/// The parents' names in `mdev types --json`.
fn parents(j: &Value) -> Result<Vec<String>, String> {
    j["parents"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p["name"].as_str().map(str::to_string))
                .collect()
        })
        .ok_or_else(|| format!("no parents in {}", one_line(&j.to_string())))
}

fn active(j: &Value) -> Vec<&Value> {
    j["active"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn defined(j: &Value) -> Vec<&Value> {
    j["defined"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// The instance `create` made: its stdout, one UUID.
fn uuid(o: &Out) -> Verdict {
    let c = o.cmd("create")?;
    let u = c.out.trim();
    let ok = u.len() == 36 && u.chars().filter(|&ch| ch == '-').count() == 4;
    if ok {
        Ok(u.to_string())
    } else {
        Err(format!(
            "create printed {:?}, not one UUID :: {}",
            u,
            c.last_err()
        ))
    }
}

/// The command exited `rc` and its stderr says `needle`.
fn refused(o: &Out, name: &str, rc: i32, needle: &str) -> Verdict {
    let c = o.cmd(name)?;
    if c.rc == rc && c.err.contains(needle) {
        Ok(if needle.is_empty() {
            format!("exit {rc}")
        } else {
            one_line(&c.err)
        })
    } else {
        Err(format!("rc={} (want {rc}) {}", c.rc, one_line(&c.err)))
    }
}

/// The line of `text` containing `needle`.
fn line_with(text: &str, needle: &str) -> Verdict {
    text.lines()
        .find(|l| l.contains(needle))
        .map(|l| l.trim().to_string())
        .ok_or_else(|| format!("no {needle:?} in: {}", one_line(text)))
}
