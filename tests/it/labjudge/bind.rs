//! The judge of `lab/scenarios/bind.sh`: bind, unbind, `--only`, the boot VGA refusal, a
//! failing write at every position and a crash after every write (with `recover`) for bind and
//! for unbind, devices held open, addresses that cannot be bound, vfio-pci loaded on demand, a
//! group bound by someone else, persist. The guest's VGA+HDA group 00:05.x (bochs-drm and
//! snd_hda_intel) is the GPU and its HDMI audio.
//!
//! Every step the busybox script asserted before it was judged here is a check below, under the
//! same name and with the same conditions (docs/lab.md, "Judged scenarios", has the table).

use serde_json::Value;

use super::{check, plan_writes, Check, Facts, Judge, Out, Verdict};

const VGA: &str = "0000:00:05.0";
const HDA: &str = "0000:00:05.1";
/// The drivers the group has on the host, and on VFIO.
const HOST: &str = "bochs-drm snd_hda_intel";
const VFIO: &str = "vfio-pci vfio-pci";
const NO_OVERRIDES: &str = "(null) (null)";
/// "drivers / overrides": the group as it was, and as gpupass binds it.
const UNBOUND: &str = "bochs-drm snd_hda_intel / (null) (null)";
const BOUND: &str = "vfio-pci vfio-pci / vfio-pci vfio-pci";
/// The writes of a bind (and of an unbind) of the group: an override, an unbind and a probe for
/// each of the two functions.
const WRITES: usize = 6;

pub fn judge() -> Judge {
    let mut c: Vec<Check> = vec![
        check("start-drivers", |o| drivers_are(o, "start", HOST)),
        check("same-group", |o| {
            let f = o.facts("start")?;
            let (v, h) = (f.get("vga.group")?, f.get("hda.group")?);
            if !v.is_empty() && v == h {
                Ok(format!("{VGA} and {HDA} in group {v}"))
            } else {
                Err(format!("{VGA} in group {v:?}, {HDA} in group {h:?}"))
            }
        }),
        // 1. The plan; nothing changes.
        check("dry-run", |o| {
            let (c, j) = json_ok(o, "dry-run")?;
            if j["dry_run"] != true || j["applied"] != false {
                return Err(format!(
                    "dry-run: dry_run {} applied {}, want true false",
                    j["dry_run"], j["applied"]
                ));
            }
            Ok(format!("rc={} {}", c.rc, describe(&j)))
        }),
        check("dry-run-changes-nothing", |o| drivers_are(o, "dry-run", HOST)),
        // 2. Naming one function binds the group.
        check("bind", |o| applied(o, "bind")),
        check("bind-drivers", |o| drivers_are(o, "bind", VFIO)),
        check("bind-node", |o| node_is(o, "bind", "char")),
        check("bind-viable", |o| viable_is(o, "bind-groups", true)),
        check("bind-again", |o| ran(o, "bind-again")),
        check("bind-noop", |o| {
            let c = o.cmd("bind-again")?;
            c.out_has("already on vfio-pci, nothing to do")?;
            Ok("second bind is a no-op".into())
        }),
        // 3. Unbind restores the drivers gpupass recorded; the node goes.
        check("unbind", |o| applied(o, "unbind")),
        check("unbind-drivers", |o| drivers_are(o, "unbind", HOST)),
        check("unbind-overrides", |o| overrides_are(o, "unbind", NO_OVERRIDES)),
        check("unbind-node", |o| node_is(o, "unbind", "absent")),
        // 4. --only: said up front, naming the member that blocks viability.
        check("only-warning", |o| {
            let c = o.cmd("only")?;
            c.rc_is(0)?;
            c.err_has("will not be viable")?;
            c.err_has(&format!("{HDA} (snd_hda_intel"))?;
            Ok(first_line_with(&c.err, "will not be viable"))
        }),
        check("only-drivers", |o| {
            drivers_are(o, "only", "vfio-pci snd_hda_intel")
        }),
        check("only-not-viable", |o| viable_is(o, "only-groups", false)),
        check("only-unbind", |o| applied(o, "only-unbind")),
        check("only-unbind-drivers", |o| drivers_are(o, "only-unbind", HOST)),
        // 5. The boot VGA with the framebuffer console.
        check("bootvga-refused", |o| {
            let c = o.cmd("bootvga")?;
            c.rc_is(1)?;
            c.err_has("boot VGA")?;
            c.err_has("--force")?;
            Ok(first_line_with(&c.err, "boot VGA"))
        }),
        check("bootvga-untouched", |o| {
            o.facts("bootvga")?.is("bootvga.driver", "bochs-drm")
        }),
        check("bootvga-force-dry-run", |o| {
            let (c, j) = json_ok(o, "bootvga-force-dry-run")?;
            Ok(format!("rc={} {}", c.rc, describe(&j)))
        }),
        check("bootvga-still-untouched", |o| {
            o.facts("bootvga-force-dry-run")?
                .is("bootvga.driver", "bochs-drm")
        }),
        check("bind-writes", |o| writes_are(o, "dry-run")),
    ];
    // 6, 7. A failing write at every position; a crash after every write, then recover.
    c.extend(fail_loop("bind", "rollback", UNBOUND));
    c.extend(crash_loop("bind", "crash", UNBOUND));
    c.extend([
        check("recover-continue", |o| {
            o.cmd("recover-continue.crash")?.rc_at_least(128)?;
            ran(o, "recover-continue")
        }),
        check("continue-drivers", |o| drivers_are(o, "recover-continue", VFIO)),
        check("continue-unbind", |o| ran(o, "continue-unbind")),
        check("continue-unbind-drivers", |o| {
            drivers_are(o, "continue-unbind", HOST)
        }),
        // 7a. The same for unbind, from the group bound by gpupass.
        check("unbind-loops-bind", |o| ran(o, "unbind-loops-bind")),
        check("unbind-dry-run", |o| {
            let (c, j) = json_ok(o, "unbind-dry-run")?;
            Ok(format!("rc={} {}", c.rc, describe(&j)))
        }),
        check("unbind-writes", |o| writes_are(o, "unbind-dry-run")),
    ]);
    c.extend(fail_loop("unbind", "unbind-rollback", BOUND));
    c.extend(crash_loop("unbind", "unbind-crash", BOUND));
    c.extend([
        check("unbind-recover-continue", |o| {
            o.cmd("unbind-recover-continue.crash")?.rc_at_least(128)?;
            ran(o, "unbind-recover-continue")
        }),
        check("unbind-continue-drivers", |o| {
            drivers_are(o, "unbind-recover-continue", HOST)
        }),
        check("unbind-continue-overrides", |o| {
            overrides_are(o, "unbind-recover-continue", NO_OVERRIDES)
        }),
        // 7b. In use: refused naming the holder, nothing changed.
        check("drm-open-refused", |o| held(o, "drm-open-refused", HOST)),
        check("inuse-bind", |o| ran(o, "inuse-bind")),
        check("vfio-open-refused", |o| held(o, "vfio-open-refused", VFIO)),
        check("inuse-unbind", |o| ran(o, "inuse-unbind")),
        check("inuse-end-drivers", |o| drivers_are(o, "inuse-unbind", HOST)),
        // 7b'. Addresses that cannot be bound.
        check("no-such-address", |o| {
            let c = o.cmd("no-such-address")?;
            c.rc_is(1)?;
            c.err_has("no such PCI device")?;
            Ok(first_line_with(&c.err, "no such PCI device"))
        }),
        check("bridge-refused", |o| {
            let c = o.cmd("bridge-refused")?;
            c.rc_is(1)?;
            c.err_has("bridge")?;
            o.facts("bridge-refused")?.is("bridge.driver", "pcieport")?;
            Ok(first_line_with(&c.err, "bridge"))
        }),
        // 7c. vfio-pci not loaded: bind loads it.
        check("vfio-pci-loaded", |o| {
            let r = o.cmd("rmmod")?;
            if r.rc != 0 {
                return Err(format!(
                    "cannot unload vfio_pci to test it: rmmod exited {} :: {}",
                    r.rc,
                    r.last_err()
                ));
            }
            applied(o, "vfio-pci-loaded")?;
            let f = o.facts("vfio-pci-loaded")?;
            f.is("vfio_pci.module", "loaded")?;
            drivers_are(o, "vfio-pci-loaded", VFIO)?;
            Ok("bind loaded vfio_pci and bound the group".into())
        }),
        check("unbind-group", |o| applied(o, "unbind-group")),
        check("unbind-group-drivers", |o| drivers_are(o, "unbind-group", HOST)),
        // 7d. A group bound by someone else.
        check("foreign-bound", |o| drivers_are(o, "foreign-bound", VFIO)),
        check("foreign-unbind", |o| ran(o, "foreign-unbind")),
        check("foreign-unbind-reports", |o| {
            let c = o.cmd("foreign-unbind")?;
            c.out_has("no journal entry")?;
            c.out_has(&format!("{VGA}: reprobed, claimed by bochs-drm"))?;
            c.out_has(&format!("{HDA}: reprobed, claimed by snd_hda_intel"))?;
            Ok(format!(
                "{} functions reprobed, each driver named",
                c.out.matches("reprobed, claimed by").count()
            ))
        }),
        check("foreign-unbind-drivers", |o| {
            drivers_are(o, "foreign-unbind", HOST)
        }),
        // 8. persist: driverctl's files.
        check("persist", |o| ran(o, "persist")),
        check("persist-file", |o| {
            o.facts("persist")?.is("driverctl.vga", "vfio-pci")
        }),
        check("persist-file-hda", |o| {
            o.facts("persist")?.is("driverctl.hda", "vfio-pci")
        }),
        check("persist-lines", |o| {
            let c = o.cmd("persist")?;
            c.out_has("softdep bochs pre: vfio-pci")?;
            c.out_has("vfio-pci.ids=1234:1111,8086:293e")?;
            Ok(first_line_with(&c.out, "vfio-pci.ids=1234:1111,8086:293e"))
        }),
        check("persist-shown", |o| {
            let c = o.cmd("persist-show")?;
            let all = format!("{}{}", c.out, c.err);
            all.lines()
                .find(|l| {
                    l.find("Persistent driver")
                        .is_some_and(|i| l[i..].contains("vfio-pci (driverctl)"))
                })
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .ok_or_else(|| {
                    format!(
                        "show 00:05.0 names no persisted vfio-pci (driverctl): {}",
                        super::one_line(&all)
                    )
                })
        }),
        check("persist-remove", |o| ran(o, "persist-remove")),
        check("persist-removed", |o| {
            let f = o.facts("persist-remove")?;
            let (v, h) = (f.get("driverctl.vga")?, f.get("driverctl.hda")?);
            if v == "(absent)" && h == "(absent)" {
                Ok("no driverctl files".into())
            } else {
                Err(format!("files remain: pci-{VGA} {v:?}, pci-{HDA} {h:?}"))
            }
        }),
        check("end-drivers", |o| drivers_are(o, "end", HOST)),
    ]);
    Judge {
        scenario: "bind",
        // bind.check: Debian's driverctl reads the files persist wrote.
        host_steps: &["driverctl"],
        checks: c,
    }
}

/// `{vga.driver} {hda.driver}`.
fn drivers(f: &Facts) -> Result<String, String> {
    Ok(format!("{} {}", f.get("vga.driver")?, f.get("hda.driver")?))
}

/// `{vga.override} {hda.override}`.
fn overrides(f: &Facts) -> Result<String, String> {
    Ok(format!("{} {}", f.get("vga.override")?, f.get("hda.override")?))
}

fn drivers_are(o: &Out, step: &str, want: &str) -> Verdict {
    let got = drivers(&o.facts(step)?)?;
    if got == want {
        Ok(got)
    } else {
        Err(format!("after {step}: drivers {got:?}, want {want:?}"))
    }
}

fn overrides_are(o: &Out, step: &str, want: &str) -> Verdict {
    let got = overrides(&o.facts(step)?)?;
    if got == want {
        Ok(got)
    } else {
        Err(format!("after {step}: driver_override {got:?}, want {want:?}"))
    }
}

/// "drivers / overrides" after `step`.
fn group_state(o: &Out, step: &str) -> Result<String, String> {
    let f = o.facts(step)?;
    Ok(format!("{} / {}", drivers(&f)?, overrides(&f)?))
}

/// `/dev/vfio/<group>` after `step`: `char` (a character device), `absent`.
fn node_is(o: &Out, step: &str, want: &str) -> Verdict {
    let g = group(o)?;
    let got = o.facts(step)?.get("node")?.to_string();
    match (got == want, want) {
        (true, "char") => Ok(format!("/dev/vfio/{g} is a character device")),
        (true, _) => Ok(format!("/dev/vfio/{g} gone")),
        (false, _) => Err(format!("after {step}: /dev/vfio/{g} is {got}, want {want}")),
    }
}

/// The group's number, as the guest read it from sysfs at the start.
fn group(o: &Out) -> Result<u32, String> {
    let v = o.facts("start")?.get("vga.group")?.to_string();
    v.parse()
        .map_err(|_| format!("start: {VGA} has no IOMMU group ({v:?})"))
}

/// The command ran and exited 0.
fn ran(o: &Out, name: &str) -> Verdict {
    let c = o.cmd(name)?;
    c.rc_is(0)?;
    Ok(format!("rc=0 {}", super::one_line(&c.out)))
}

/// A `--json` command that exited 0 with JSON on stdout.
fn json_ok(o: &Out, name: &str) -> Result<(super::Cmd, Value), String> {
    let c = o.cmd(name)?;
    c.rc_is(0)?;
    let j = c.json()?;
    Ok((c, j))
}

/// A `bind`/`unbind --json` that exited 0 and applied its plan.
fn applied(o: &Out, name: &str) -> Verdict {
    let (c, j) = json_ok(o, name)?;
    if j["applied"] != true {
        return Err(format!(
            "{name}: rc=0 but applied is {} ({})",
            j["applied"],
            describe(&j)
        ));
    }
    Ok(format!("rc={} {}", c.rc, describe(&j)))
}

/// `bind of IOMMU group 4: 6 writes` for a plan's JSON.
fn describe(j: &Value) -> String {
    let p = &j["plan"];
    let groups: Vec<String> = p["groups"]
        .as_array()
        .map(|a| a.iter().map(|g| g.to_string()).collect())
        .unwrap_or_default();
    format!(
        "{} of IOMMU group {}: {} writes",
        p["action"].as_str().unwrap_or("?"),
        groups.join(", "),
        plan_writes(j).map(|n| n.to_string()).unwrap_or_else(|e| e)
    )
}

/// The `--dry-run --json` plan of `name` has [`WRITES`] writes.
fn writes_are(o: &Out, name: &str) -> Verdict {
    let (_, j) = json_ok(o, name)?;
    let n = plan_writes(&j)?;
    if n == WRITES {
        Ok(format!("{n} writes"))
    } else {
        Err(format!(
            "{name}: the plan has {n} writes, want {WRITES}: {}",
            describe(&j)
        ))
    }
}

/// The group's `viable` in `gpupass groups --json` (the command `name`).
fn viable_is(o: &Out, name: &str, want: bool) -> Verdict {
    let g = group(o)?;
    let (_, j) = json_ok(o, name)?;
    let grp = j["groups"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["number"] == g))
        .ok_or_else(|| format!("{name}: no group {g} in groups --json"))?;
    if grp["viable"] == want {
        Ok(format!("group {g} viable: {want}"))
    } else {
        Err(format!(
            "{name}: group {g} viable is {}, want {want}; blockers {}",
            grp["viable"], grp["blockers"]
        ))
    }
}

/// `PREFIX-1` ... `PREFIX-6`: a failing write N of `gpupass VERB 00:05.0` exits 1, says it
/// rolled back, and leaves the group `want` ("drivers / overrides").
fn fail_loop(verb: &'static str, prefix: &'static str, want: &'static str) -> Vec<Check> {
    (1..=WRITES)
        .map(|n| {
            let step = format!("{prefix}-{n}");
            let name = step.clone();
            check(step, move |o| {
                let c = o.cmd(&name)?;
                let got = group_state(o, &name)?;
                if c.rc == 1 && c.err.contains("rolled back") && got == want {
                    Ok(format!("write {n} of {verb} failed, rolled back: {got}"))
                } else {
                    Err(format!(
                        "rc={} state={got:?} want {want:?} :: {}",
                        c.rc,
                        c.last_err()
                    ))
                }
            })
        })
        .collect()
}

/// `PREFIX-1` ... `PREFIX-6`: a crash after write N of `gpupass VERB 00:05.0` (killed by the
/// signal), the next command warns of the unfinished VERB, `recover` exits 0 and the group is
/// `want` again.
fn crash_loop(verb: &'static str, prefix: &'static str, want: &'static str) -> Vec<Check> {
    (1..=WRITES)
        .map(|n| {
            let step = format!("{prefix}-{n}");
            let name = step.clone();
            check(step, move |o| {
                let c = o.cmd(&name)?;
                let mid = group_state(o, &name)?;
                let list = o.cmd(&format!("{name}.list"))?;
                let warned = list.err.contains(&format!("unfinished gpupass {verb}"));
                let rec = o.cmd(&format!("{name}.recover"))?;
                let got = group_state(o, &format!("{name}.recover"))?;
                if c.rc >= 128 && warned && rec.rc == 0 && got == want {
                    Ok(format!(
                        "rc={} mid-state {mid:?}, list warned, recover -> {got}",
                        c.rc
                    ))
                } else {
                    Err(format!(
                        "rc={} mid={mid:?} list {} recover-rc={} state={got:?} want {want:?} :: {}",
                        c.rc,
                        if warned { "warned" } else { "silent" },
                        rec.rc,
                        rec.last_err()
                    ))
                }
            })
        })
        .collect()
}

/// While a process held a node open (its pid a fact of the step), the command exited 1 naming
/// that pid, and the drivers stayed `want`.
fn held(o: &Out, step: &str, want: &str) -> Verdict {
    let f = o.facts(step)?;
    let pid = f.get("holder.pid").map_err(|_| {
        format!(
            "no holder: {}",
            f.get("holder.node").unwrap_or("(no holder.node)")
        )
    })?;
    let c = o.cmd(step)?;
    let got = drivers(&f)?;
    if c.rc == 1 && c.err.contains(&format!("pid {pid}")) && got == want {
        Ok(format!("rc=1, names pid {pid}, nothing changed"))
    } else {
        Err(format!(
            "rc={} drivers={got:?} want {want:?} holder pid {pid} :: {}",
            c.rc,
            super::one_line(&c.err)
        ))
    }
}

/// The first line of `text` containing `needle`, trimmed.
fn first_line_with(text: &str, needle: &str) -> String {
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or("")
        .trim()
        .to_string()
}
