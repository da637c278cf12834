//! The judge of `lab/scenarios/clusterdra.sh`: `gpupass dra-plugin` against the cluster lab's
//! real kubelet, scheduler, controller manager and API server (docs/dra.md, "On the real
//! cluster: `clusterdra`"), on both kernel legs. The plugin serves and the kubelet registers
//! it; its slices are on the API server (what `dra slices --explain` offers, no more);
//! contrib/dra's manifests apply; the shipped `lab-vga` template is allocated the lab's VGA +
//! HDA audio group 00:05.0 + 00:05.1 (bochs-drm, snd_hda_intel), prepared (both functions on
//! vfio-pci, the container opens the group's legacy nodes and reads its KEP-5304 metadata, the
//! device stays Healthy, the host's `unbind --all` is refused) and unprepared; an mtty-2 mdev
//! slot (KEP-4815 counters) gets its instance and loses it; a claim with no config takes the
//! plugin's `--backend auto` (iommufd on 6.12; on 6.1, whose kernel has none, legacy, and a
//! claim that requires iommufd is refused before anything is written); a bad opaque config is
//! refused in the Pod's events; the API server unreachable and back; the plugin killed inside a
//! Prepare, its plan undone at the next start and the kubelet's retry prepared; nothing left.
//!
//! The steps of each leg: the guest ships `leg.facts` (`Out::leg`), and the `iommufd-*` steps
//! are 6.12's, the `auto-*` and `require-iommufd-*` steps 6.1's.

use serde_json::Value;

use super::{check, on_leg, one_line, Check, Facts, Judge, Out, Verdict};

const VGA: &str = "0000:00:05.0";
const AUD: &str = "0000:00:05.1";
/// The group as a DRA device.
const DEV: &str = "pci-0000-00-05-0";
const DRIVER: &str = "vfio.gpupass.dev";
const PDIR: &str = "/var/lib/kubelet/plugins/vfio.gpupass.dev";
/// 00:07.0, bound while the API server is unreachable, as a DRA device.
const TDEV: &str = "pci-0000-00-07-0";
const VFIO: &str = "vfio-pci vfio-pci";
/// The mtty parent's counter set, the type the `lab-mtty` template asks for, and its slots'
/// names.
const MDEV_SET: &str = "mdev-mtty";
const MDEV_TYPE: &str = "mtty-2";
const MDEV_SLOT: &str = "mdev-mtty-mtty-2-";
/// How long the Pod's device must stay Healthy with nothing changed: longer than the kubelet's
/// health_check_timeout_seconds (30 s), after which a silent plugin's device turns Unknown.
const QUIET_S: f64 = 40.0;
/// What the guest times a claim's wait from.
const CREATED: &str = "the Pod was created";
/// The plugin's logs (cluster_end ships `$CL_LOG/*.log`): the first start, the one that
/// crashes in a Prepare, the one started after it.
const PLUGIN_LOGS: [&str; 3] = [
    "dra-plugin.log",
    "dra-plugin-crash.log",
    "dra-plugin-restarted.log",
];

pub fn judge() -> Judge {
    let mut c: Vec<Check> = vec![
        check("drivers-before", |o| {
            let f = o.facts("start")?;
            let (v, a, g) = (f.get("vga.driver")?, f.get("aud.driver")?, f.get("group")?);
            if v == "vfio-pci" || a == "vfio-pci" || g.is_empty() {
                return Err(format!(
                    "{VGA} {v}, {AUD} {a}, group {g:?}: the group must start on its own drivers"
                ));
            }
            Ok(format!("{VGA} {v}, {AUD} {a}, group {g}"))
        }),
        // 1. The plugin serves, the kubelet registers it.
        check("plugin-start", |o| {
            let (_, s) = waited(o, "plugin-start", &format!("{PDIR}/dra.sock"))
                .map_err(|e| format!("{e}; dra-plugin.log: {}", tail(o, "dra-plugin.log", 2)))?;
            Ok(format!("serving {PDIR}/dra.sock after {s} s"))
        }),
        check("plugin-registered", |o| {
            let (_, s) = waited(o, "registered", "the kubelet's registration").map_err(|e| {
                let kubelet: Vec<String> = o
                    .text("kubelet.log")
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| {
                        [
                            "vfio.gpupass.dev",
                            "plugin_watcher",
                            "pluginwatcher",
                            "reconciler",
                        ]
                        .iter()
                        .any(|n| l.contains(n))
                    })
                    .map(str::to_string)
                    .collect();
                let kubelet = kubelet[kubelet.len().saturating_sub(3)..].join("\n");
                format!(
                    "{e}; kubelet: {}; plugin: {}; sockets: {}",
                    one_line(&kubelet),
                    tail(o, "dra-plugin.log", 3),
                    o.cmd("sockets")
                        .map(|c| one_line(&format!("{}{}", c.out, c.err)))
                        .unwrap_or_else(|e| e)
                )
            })?;
            Ok(format!("the kubelet registered {DRIVER} after {s} s"))
        }),
        // 2. The slices on the API server, and what is not in them.
        check("slices-published", |o| {
            let (_, s) = waited(o, "published", &format!("{DEV} in this node's slices"))?;
            let v = json(o, "slices")?;
            let names = device_names(&v);
            if !names.iter().any(|n| n == DEV) {
                return Err(format!("slices: no {DEV} among {}", names.join(" ")));
            }
            let slices: Vec<String> = items(&v)
                .iter()
                .map(|i| {
                    format!(
                        "{} gen {}: {} devices",
                        i["metadata"]["name"].as_str().unwrap_or("?"),
                        i["spec"]["pool"]["generation"],
                        i["spec"]["devices"].as_array().map_or(0, Vec::len)
                    )
                })
                .collect();
            Ok(format!(
                "{DEV} among {} devices after {s} s ({}); {}",
                names.len(),
                slices.join("; "),
                log_line(o, "dra-plugin.log", "published the ResourceSlices").unwrap_or_default()
            ))
        }),
        check("refused-not-published", refused_not_published),
        check("manifests-applied", |o| {
            let mut said = String::new();
            for n in ["classes", "templates"] {
                let c = o.cmd(n)?;
                c.rc_is(0)?;
                said += &c.out;
            }
            Ok(said.lines().collect::<Vec<_>>().join(";"))
        }),
        // 3. The shipped lab-vga template, backendPolicy legacy.
        check("legacy-claim-allocated", |o| claim_allocated(o, "legacy")),
        check("legacy-pod-running", |o| pod_running(o, "legacy", CREATED)),
        check("legacy-group-on-vfio", |o| {
            let d = drivers(&o.facts("legacy-held")?)?;
            if d != VFIO {
                return Err(format!("while the Pod ran: drivers {d:?}, want {VFIO:?}"));
            }
            Ok(d)
        }),
        check("legacy-opens", |o| {
            let g = group(o)?;
            legacy_opens(o, "legacy", &g)?;
            Ok(format!(
                "/dev/vfio/{g} and /dev/vfio/vfio open in the container, no /dev/iommu (one backend)"
            ))
        }),
        check("legacy-metadata", |o| {
            let log = pod_log(o, "legacy")?;
            let docs = metadata(&log);
            let hit = docs
                .iter()
                .any(|d| attribute_is(d, "resource.kubernetes.io/pciBusID", VGA));
            if !hit {
                return Err(format!(
                    "no metadata file with pciBusID {VGA} in the container: {}",
                    one_line(&log)
                ));
            }
            Ok(format!(
                "{}: {} with resource.kubernetes.io/pciBusID {VGA}",
                metadata_paths(&log).join(" "),
                versions(&docs).join(" and ")
            ))
        }),
        check("legacy-health-stays", health_stays),
        check("legacy-host-unbind-refused", host_unbind_refused),
        check("legacy-pod-deleted", |o| pod_deleted(o, "legacy")),
        check("legacy-group-restored", |o| group_restored(o, "legacy")),
        // 4. An mtty-2 mdev slot.
        check("mdev-counters-published", mdev_counters),
        check("mdev-claim-allocated", |o| {
            let (_, s) = waited(o, "mdev-allocated", "the claim's allocation")
                .map_err(|e| format!("{e}; {}", claim_status(o, "mdev")))?;
            let claim = json(o, "mdev-claim")?;
            let r = results(&claim)?;
            let device = r[0]["device"].as_str().unwrap_or("");
            if r.len() != 1 || !device.starts_with(MDEV_SLOT) || r[0]["driver"] != DRIVER {
                return Err(format!(
                    "mdev-claim: allocated {}, want one {MDEV_SLOT}* slot of {DRIVER}",
                    one_line(&Value::Array(r.to_vec()).to_string())
                ));
            }
            Ok(format!(
                "claim {}: {device} by the scheduler after {s} s",
                claim["metadata"]["name"].as_str().unwrap_or("?")
            ))
        }),
        check("mdev-pod-running", |o| pod_running(o, "mdev", CREATED)),
        check("mdev-instance-created", mdev_created),
        check("mdev-opens", mdev_opens),
        check("mdev-metadata", |o| {
            let uuid = o.facts("mdev-instance")?.get("uuid")?.to_string();
            let log = pod_log(o, "mdev")?;
            let docs = metadata(&log);
            if uuid.is_empty()
                || !docs.iter().any(|d| attribute_is(d, "mdevUUID", &uuid))
                || log.contains("resource.kubernetes.io/pciBusID")
            {
                return Err(format!(
                    "no mdevUUID {uuid:?} (or a pciBusID) in the container's metadata: {}",
                    one_line(&log)
                ));
            }
            Ok(format!(
                "the container's metadata file gives mdevUUID {uuid} and no pciBusID ({})",
                versions(&docs).join(" and ")
            ))
        }),
        check("mdev-pod-deleted", |o| pod_deleted(o, "mdev")),
        check("mdev-instance-removed", |o| {
            let before = o.facts("mdev-before")?.num("available")?;
            let uuid = o.facts("mdev-instance")?.get("uuid")?.to_string();
            let after = o.facts("mdev-after")?;
            let why = format!(
                "instances: {}; available {}; {}",
                after.get("instances")?,
                after.get("available")?,
                last_warning(o)
            );
            let (_, s) =
                waited(o, "mdev-removed", "the instance's removal").map_err(|e| format!("{e}; {why}"))?;
            if after.get("present")? != "no" || after.num("available")? != before {
                return Err(format!("mdev {uuid} after the delete: {why}"));
            }
            Ok(format!(
                "mdev {uuid} gone, {MDEV_TYPE} available_instances {before} again after {s} s"
            ))
        }),
    ];
    // 5. A claim with no config: the plugin's --backend auto. 6.12: iommufd.
    c.extend(
        [
            check("iommufd-claim-allocated", |o| claim_allocated(o, "iommufd")),
            check("iommufd-pod-running", |o| pod_running(o, "iommufd", CREATED)),
            check("iommufd-opens", |o| {
                let f = o.facts("iommufd-held")?;
                let cdev = f
                    .get("cdev")?
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_string();
                let log = pod_log(o, "iommufd")?;
                let (ok, failed) = opened(&log);
                let want = [format!("/dev/vfio/devices/{cdev}"), "/dev/iommu".to_string()];
                if cdev.is_empty()
                    || !want.iter().all(|w| ok.contains(w))
                    || !failed.is_empty()
                    || ok.iter().any(|n| n == "/dev/vfio/vfio")
                {
                    return Err(format!(
                        "cdev {cdev:?}, drivers {}: want {} open, no /dev/vfio/vfio, nothing failed: {}",
                        drivers(&f)?,
                        want.join(" and "),
                        one_line(&log)
                    ));
                }
                Ok(format!(
                    "/dev/vfio/devices/{cdev} and /dev/iommu open, no /dev/vfio/vfio (one backend); drivers {}",
                    drivers(&f)?
                ))
            }),
            check("iommufd-pod-deleted", |o| pod_deleted(o, "iommufd")),
            check("iommufd-group-restored", |o| group_restored(o, "iommufd")),
        ]
        .map(|x| on_leg("6.12", x)),
    );
    // 6.1: no iommufd. The same template on the legacy container, and a claim that requires
    // iommufd refused before anything is written.
    c.extend(
        [
            check("auto-claim-allocated", |o| claim_allocated(o, "auto")),
            check("auto-pod-running", |o| pod_running(o, "auto", CREATED)),
            check("auto-opens", auto_opens),
            check("auto-pod-deleted", |o| pod_deleted(o, "auto")),
            check("auto-group-restored", |o| group_restored(o, "auto")),
            check("require-iommufd-event", |o| {
                let s = o.facts("require-event")?.get("seconds")?.to_string();
                let ev = events(o, "require-events")?;
                let (r, m) = ev
                    .iter()
                    .find(|(_, m)| m.contains("require-iommufd"))
                    .ok_or_else(|| format!("no event names require-iommufd: {}", list(&ev)))?;
                Ok(format!("after {s} s: {r}: {}", cut(m, 400)))
            }),
            check("require-iommufd-untouched", require_untouched),
        ]
        .map(|x| on_leg("6.1", x)),
    );
    c.extend([
        // 7. A bad opaque config.
        check("bad-config-event", |o| {
            let ev = events(o, "bad-events")?;
            let (_, s) = waited(o, "bad-event", "an event naming `fastest`")
                .map_err(|e| format!("{e}: {}", list(&ev)))?;
            let (r, m) = ev
                .iter()
                .find(|(_, m)| m.contains("fastest"))
                .ok_or_else(|| format!("no event names `fastest`: {}", list(&ev)))?;
            Ok(format!("after {s} s: {r}: {}", cut(m, 400)))
        }),
        check("bad-config-untouched", |o| {
            drivers_are(o, "bad-untouched", &start_drivers(o)?)
        }),
        // 8. The API server unreachable, then back.
        check("api-down-said", |o| {
            let f = o.facts("api-down-log")?;
            let (_, s) = waited(o, "api-down", "a new `cannot publish the ResourceSlices` warning")
                .map_err(|e| {
                    format!(
                        "{e}; bind: {}; plugin: {}",
                        o.cmd("td-bind").map(|c| c.last_err().to_string()).unwrap_or_else(|e| e),
                        tail(o, "dra-plugin.log", 1)
                    )
                })?;
            if f.num("after")? <= f.num("before")? {
                return Err(format!(
                    "api-down-log: {} warnings before, {} after",
                    f.get("before")?,
                    f.get("after")?
                ));
            }
            Ok(format!("after {s} s: {}", f.get("last")?))
        }),
        check("api-back-republished", |o| {
            let v = json(o, "api-back-slices")?;
            let names = device_names(&v);
            let (_, s) = waited(o, "api-back", &format!("{TDEV} on the API server"))
                .map_err(|e| format!("{e}: offered {}", names.join(" ")))?;
            if !names.iter().any(|n| n == TDEV) {
                return Err(format!("api-back-slices: no {TDEV} among {}", names.join(" ")));
            }
            Ok(format!(
                "{TDEV} (bound while the API server was unreachable) offered on the API server {s} s after the routes came back; {}",
                o.facts("api-back-log")?.get("last")?
            ))
        }),
        check("api-back-node-ready", |o| {
            let node = json(o, "api-back-node")?;
            let conds = node["status"]["conditions"].as_array().ok_or("api-back-node: no conditions")?;
            let ready = conds.iter().find(|c| c["type"] == "Ready");
            let (_, s) = waited(o, "api-back-ready", "the node Ready").map_err(|e| {
                format!(
                    "{e}: {}",
                    conds
                        .iter()
                        .map(|c| format!("{}={} {}", c["type"], c["status"], c["reason"]))
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            })?;
            if ready.is_none_or(|r| r["status"] != "True") {
                return Err(format!("api-back-node: Ready is {:?}", ready.map(|r| &r["status"])));
            }
            Ok(format!(
                "{} Ready {s} s after the routes came back",
                node["metadata"]["name"].as_str().unwrap_or("?")
            ))
        }),
        check("api-back-unbind", |o| {
            let c = o.cmd("td-unbind")?;
            c.rc_is(0)?;
            Ok(format!("gpupass unbind 0000:00:07.0: {}", one_line(&c.out)))
        }),
        // 9. The plugin killed inside a Prepare.
        check("crash-plugin-died", |o| {
            let (f, s) = waited(o, "crash-died", "the plugin's abort").map_err(|e| {
                format!("{e}; dra-plugin-crash.log: {}", tail(o, "dra-plugin-crash.log", 2))
            })?;
            log_line(o, "dra-plugin-crash.log", "GPUPASS_CRASH_AFTER_WRITE=3: aborting now")?;
            let claim = json(o, "crash-claim-then")?;
            Ok(format!(
                "in the Prepare of claim {}, {s} s after the Pod was created; drivers then {}",
                claim["metadata"]["name"].as_str().unwrap_or("?"),
                drivers(&f)?
            ))
        }),
        check("crash-left-open", |o| {
            let uid = uid_of(&json(o, "crash-claim-then")?)?;
            let c = o.cmd("crash-recover")?;
            let said = format!("{}{}", c.out, c.err);
            if !said.contains(&format!("for dra-claim:{uid}")) {
                return Err(format!(
                    "recover --dry-run names no plan for dra-claim:{uid}: {}",
                    one_line(&said)
                ));
            }
            Ok(said
                .lines()
                .find(|l| l.contains("unfinished"))
                .unwrap_or("")
                .trim()
                .to_string())
        }),
        check("crash-undone", |o| {
            let (_, s) = waited(o, "crash-undone", "the restarted plugin's undo").map_err(|e| {
                format!("{e}; dra-plugin-restarted.log: {}", tail(o, "dra-plugin-restarted.log", 3))
            })?;
            let log = o.text("dra-plugin-restarted.log")?;
            let lines: Vec<&str> = log.lines().collect();
            let at = lines
                .iter()
                .position(|l| l.contains("interrupted before this start was undone"))
                .ok_or("dra-plugin-restarted.log: no `interrupted before this start was undone`")?;
            let said: Vec<&str> = lines[at..lines.len().min(at + 4)]
                .iter()
                .map(|l| l.split_once("INFO").map_or(*l, |x| x.1).trim())
                .collect();
            Ok(format!("after {s} s: {}", cut(&said.join(" "), 400)))
        }),
        check("crash-retry-running", |o| {
            let v = pod_running(o, "crash", "the plugin's restart")?;
            Ok(format!("the kubelet's retry prepared the claim; READY {v}"))
        }),
        check("crash-pod-deleted", |o| pod_deleted(o, "crash")),
        check("crash-group-restored", |o| group_restored(o, "crash")),
        // 10. Nothing left.
        check("checkpoint-empty", |o| {
            let c = o.cmd("checkpoint")?;
            if c.rc != 0 {
                c.err_has("No such file")?;
                return Ok(format!("no {PDIR}/checkpoint.json"));
            }
            let v = c.json()?;
            let n = v["claims"].as_object().map_or(0, |m| m.len());
            if n != 0 || c.out.contains("\"uid\"") {
                return Err(format!("claims left in the checkpoint: {}", one_line(&c.out)));
            }
            Ok(one_line(&c.out))
        }),
        check("journal-empty", |o| {
            let c = o.cmd("recover")?;
            c.rc_is(0)?;
            let said = format!("{}{}", c.out, c.err);
            if !said.contains("nothing to recover") {
                return Err(format!("recover --dry-run: {}", one_line(&said)));
            }
            Ok(one_line(&said))
        }),
        check("plugin-stop", |o| {
            let (_, s) = waited(o, "plugin-stop", "the plugin's exit on SIGTERM")?;
            let c = o.cmd("plugin-files")?;
            let left = format!("{}{}", c.out, c.err);
            // Its own two: the service socket and the registration socket (other plugins of
            // the boot may have theirs in plugins_registry).
            let own = ["dra.sock", &format!("{DRIVER}-reg.sock")];
            if let Some(s) = own.iter().find(|s| left.split_whitespace().any(|w| w == **s)) {
                return Err(format!("{s} left after the plugin stopped: {}", one_line(&left)));
            }
            Ok(format!("stopped on SIGTERM in {s} s, sockets removed: {}", one_line(&left)))
        }),
    ]);
    Judge {
        scenario: "clusterdra",
        host_steps: &["host-teardown", "host-control-plane"],
        checks: c,
    }
}

// ---------------------------------------------------------------- what the guest shipped

/// A wait of the guest (`waited NAME`): what it waited for held within its bound. Its facts
/// and the seconds it took.
fn waited(o: &Out, name: &str, what: &str) -> Result<(Facts, String), String> {
    let f = o.facts(name)?;
    let s = f.get("seconds")?.to_string();
    if f.get("ok")? != "1" {
        return Err(format!("{name}: no {what} within the guest's wait ({s} s)"));
    }
    Ok((f, s))
}

/// `name`'s stdout as JSON, the command having exited 0.
fn json(o: &Out, name: &str) -> Result<Value, String> {
    let c = o.cmd(name)?;
    c.rc_is(0)?;
    c.json()
}

/// "VGA-driver AUD-driver" of a state's facts.
fn drivers(f: &Facts) -> Result<String, String> {
    Ok(format!("{} {}", f.get("vga.driver")?, f.get("aud.driver")?))
}

fn start_drivers(o: &Out) -> Result<String, String> {
    drivers(&o.facts("start")?)
}

/// The group's drivers after step `name` are `want`.
fn drivers_are(o: &Out, name: &str, want: &str) -> Verdict {
    let got = drivers(&o.facts(name)?)?;
    if got == want {
        Ok(got)
    } else {
        Err(format!("after {name}: drivers {got:?}, want {want:?}"))
    }
}

/// The group's IOMMU group number, as the guest read it at the start.
fn group(o: &Out) -> Result<String, String> {
    Ok(o.facts("start")?.get("group")?.to_string())
}

/// The last `n` lines of a shipped log, on one line (or why there is none).
fn tail(o: &Out, file: &str, n: usize) -> String {
    match o.text(file) {
        Ok(t) => {
            let l: Vec<&str> = t.lines().collect();
            one_line(&l[l.len().saturating_sub(n)..].join("\n"))
        }
        Err(e) => e,
    }
}

/// The first line of a shipped log that contains `needle`, from `needle` on.
fn log_line(o: &Out, file: &str, needle: &str) -> Result<String, String> {
    let t = o.text(file)?;
    let l = t
        .lines()
        .find(|l| l.contains(needle))
        .ok_or_else(|| format!("{file}: no line says {needle:?}"))?;
    Ok(cut(&l[l.find(needle).unwrap_or(0)..], 300))
}

/// The plugins' last WARN or ERROR line, for a failure's message.
fn last_warning(o: &Out) -> String {
    PLUGIN_LOGS
        .iter()
        .filter_map(|f| o.text(f).ok())
        .flat_map(|t| {
            t.lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .last()
        .map_or_else(
            || "no WARN or ERROR in the plugin's logs".into(),
            |l| cut(&l, 300),
        )
}

fn cut(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

fn items(v: &Value) -> Vec<&Value> {
    v["items"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// The devices of a ResourceSlice list.
fn devices(v: &Value) -> Vec<&Value> {
    items(v)
        .into_iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .collect()
}

fn device_names(v: &Value) -> Vec<String> {
    devices(v)
        .iter()
        .filter_map(|d| d["name"].as_str().map(str::to_string))
        .collect()
}

/// A claim's allocation results.
fn results(claim: &Value) -> Result<&Vec<Value>, String> {
    claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .filter(|r| !r.is_empty())
        .ok_or_else(|| {
            format!(
                "claim {} is not allocated: {}",
                claim["metadata"]["name"],
                one_line(&claim["status"].to_string())
            )
        })
}

fn uid_of(v: &Value) -> Result<String, String> {
    v["metadata"]["uid"]
        .as_str()
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .ok_or_else(|| format!("no metadata.uid in {}", cut(&v.to_string(), 200)))
}

/// The claim's status as shipped with the Pod (`PREFIX-claim`), for a failure's message.
fn claim_status(o: &Out, p: &str) -> String {
    match json(o, &format!("{p}-claim")) {
        Ok(c) => format!(
            "claim {}: {}",
            c["metadata"]["name"],
            cut(&c["status"].to_string(), 400)
        ),
        Err(e) => e,
    }
}

/// The events of `name` (`kubectl get events -o json`), as (reason, message).
fn events(o: &Out, name: &str) -> Result<Vec<(String, String)>, String> {
    let v = json(o, name)?;
    Ok(items(&v)
        .iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or("").to_string(),
                e["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect())
}

fn list(ev: &[(String, String)]) -> String {
    if ev.is_empty() {
        return "no events".into();
    }
    cut(
        &ev.iter()
            .map(|(r, m)| format!("{r}: {m}"))
            .collect::<Vec<_>>()
            .join("; "),
        600,
    )
}

/// What the Pod's container printed (`cl_claim_pod`'s probe: `open OK|FAILED NODE` for each
/// VFIO/iommufd node it has, each KEP-5304 metadata file, READY).
fn pod_log(o: &Out, p: &str) -> Result<String, String> {
    Ok(o.cmd(&format!("{p}-log"))?.out)
}

/// The nodes the container opened, and those it failed to open.
fn opened(log: &str) -> (Vec<String>, Vec<String>) {
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    for l in log.lines() {
        if let Some(n) = l.trim_end().strip_prefix("open OK ") {
            ok.push(n.to_string());
        } else if let Some(n) = l.trim_end().strip_prefix("open FAILED ") {
            failed.push(n.to_string());
        }
    }
    (ok, failed)
}

/// The legacy container's nodes: `/dev/vfio/GROUP` and `/dev/vfio/vfio` open, nothing failed,
/// no `/dev/iommu` (one backend).
fn legacy_opens(o: &Out, p: &str, group: &str) -> Result<(), String> {
    let log = pod_log(o, p)?;
    let (ok, failed) = opened(&log);
    let want = [format!("/dev/vfio/{group}"), "/dev/vfio/vfio".to_string()];
    if !want.iter().all(|w| ok.contains(w)) || !failed.is_empty() || ok.iter().any(|n| n == "/dev/iommu") {
        return Err(format!(
            "want {} open, no /dev/iommu, nothing failed: {}",
            want.join(" and "),
            one_line(&log)
        ));
    }
    Ok(())
}

/// The metadata documents the container printed (each file's JSON lines).
fn metadata(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "DeviceMetadata")
        .collect()
}

fn metadata_paths(log: &str) -> Vec<&str> {
    log.lines().filter_map(|l| l.strip_prefix("metadata ")).collect()
}

fn versions(docs: &[Value]) -> Vec<String> {
    docs.iter()
        .map(|d| d["apiVersion"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// A device of a metadata document has attribute `key` with string value `want`.
fn attribute_is(doc: &Value, key: &str, want: &str) -> bool {
    doc["requests"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["devices"].as_array().into_iter().flatten())
        .any(|d| d["attributes"][key]["string"] == want)
}

// ---------------------------------------------------------------- the steps

fn refused_not_published(o: &Out) -> Verdict {
    let e = json(o, "explain")?;
    let all = e.as_array().ok_or("explain: not a JSON array")?;
    let groups: Vec<&Value> = all.iter().filter(|x| x.get("members").is_some()).collect();
    let types: Vec<&Value> = all.iter().filter(|x| x.get("mdev_type").is_some()).collect();
    let offered: Vec<&str> = groups.iter().filter_map(|g| g["device"].as_str()).collect();
    let slots: u64 = types.iter().filter_map(|t| t["slots"].as_u64()).sum();
    let refused: Vec<&&Value> = groups
        .iter()
        .filter(|g| g["device"].is_null())
        .chain(types.iter().filter(|t| t["slots"] == 0))
        .collect();
    if let Some(r) = refused
        .iter()
        .find(|r| r["reason"].as_str().is_none_or(str::is_empty))
    {
        return Err(format!("explain: not published without a reason: {r}"));
    }
    let names = device_names(&json(o, "slices")?);
    if let Some(d) = offered.iter().find(|d| !names.iter().any(|n| n == *d)) {
        return Err(format!("explain offers {d}, the API server has no such device"));
    }
    let total = offered.len() as u64 + slots;
    if refused.is_empty() || names.len() as u64 != total {
        return Err(format!(
            "explain: {} groups + {slots} mdev slots offered, {} refused; the API server has {} devices",
            offered.len(),
            refused.len(),
            names.len()
        ));
    }
    Ok(format!(
        "{} groups + {slots} mdev slots offered = {} devices on the API server; {} not published, each with its reason: {}",
        offered.len(),
        names.len(),
        refused.len(),
        refused[0]["reason"].as_str().unwrap_or("")
    ))
}

/// `PREFIX`'s claim was allocated the group by the scheduler.
fn claim_allocated(o: &Out, p: &str) -> Verdict {
    let (_, s) = waited(o, &format!("{p}-allocated"), "allocation of the group")
        .map_err(|e| format!("{e}; {}", claim_status(o, p)))?;
    let claim = json(o, &format!("{p}-claim"))?;
    let r = results(&claim)?;
    if r.len() != 1 || r[0]["device"] != DEV || r[0]["driver"] != DRIVER {
        return Err(format!(
            "{p}-claim: allocated {}, want {DRIVER}'s {DEV} alone",
            one_line(&Value::Array(r.to_vec()).to_string())
        ));
    }
    let x = &r[0];
    Ok(format!(
        "claim {}: {}/{}/{} (request {}) by the scheduler after {s} s",
        claim["metadata"]["name"].as_str().unwrap_or("?"),
        x["driver"].as_str().unwrap_or(""),
        x["pool"].as_str().unwrap_or(""),
        x["device"].as_str().unwrap_or(""),
        x["request"].as_str().unwrap_or("")
    ))
}

/// `PREFIX`'s Pod runs: its container said READY (so its claim was prepared). The seconds,
/// since `from` (what the guest timed the wait from), and the group's drivers then.
fn pod_running(o: &Out, p: &str, from: &str) -> Verdict {
    let why = || {
        events(o, &format!("{p}-events"))
            .map(|e| list(&e))
            .unwrap_or_else(|e| e)
    };
    let (f, s) = waited(o, &format!("{p}-running"), "READY from the Pod's container")
        .map_err(|e| format!("{e}; events: {}", why()))?;
    let log = pod_log(o, p)?;
    if !log.lines().any(|l| l.trim_end() == "READY") {
        return Err(format!("{p}-log: no READY: {}", one_line(&log)));
    }
    Ok(format!("{s} s after {from}; 00:05.x on {}", drivers(&f)?))
}

/// `PREFIX`'s Pod deleted (`kubectl delete --wait`).
fn pod_deleted(o: &Out, p: &str) -> Verdict {
    let c = o.cmd(&format!("{p}-delete"))?;
    c.rc_is(0)?;
    let s = o.facts(&format!("{p}-deleted"))?.get("seconds")?.to_string();
    Ok(format!("after {s} s"))
}

/// After `PREFIX`'s Pod was deleted, the kubelet's Unprepare put the group back on the drivers
/// it started on.
fn group_restored(o: &Out, p: &str) -> Verdict {
    let start = start_drivers(o)?;
    let (f, s) = waited(o, &format!("{p}-restored"), "return of the group's drivers").map_err(|e| {
        format!(
            "{e}: drivers {}, expected {start}; {}",
            o.facts(&format!("{p}-restored"))
                .and_then(|f| drivers(&f))
                .unwrap_or_default(),
            last_warning(o)
        )
    })?;
    let d = drivers(&f)?;
    if d != start {
        return Err(format!("drivers now {d:?}, expected {start:?}"));
    }
    let unprepared = json(o, &format!("{p}-claim"))
        .and_then(|c| uid_of(&c))
        .ok()
        .and_then(|uid| {
            PLUGIN_LOGS.iter().find_map(|f| {
                o.text(f).ok().and_then(|t| {
                    t.lines()
                        .find(|l| l.contains("unprepared claim") && l.contains(&uid))
                        .map(|l| cut(l.split_once("INFO").map_or(l, |x| x.1).trim(), 200))
                })
            })
        })
        .unwrap_or_default();
    Ok(format!("{VGA} and {AUD} on {d} again after {s} s; {unprepared}"))
}

fn health_stays(o: &Out) -> Verdict {
    let s: f64 = o
        .facts("health")?
        .get("seconds")?
        .parse()
        .map_err(|_| "health.facts: seconds is not a number".to_string())?;
    if s < QUIET_S {
        return Err(format!("only {s} s quiet, want {QUIET_S}"));
    }
    let pod = json(o, "health")?;
    let mut seen = Vec::new();
    for cs in pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for a in cs["allocatedResourcesStatus"].as_array().into_iter().flatten() {
            for r in a["resources"].as_array().into_iter().flatten() {
                seen.push((
                    a["name"].as_str().unwrap_or("").to_string(),
                    r["resourceID"].as_str().unwrap_or("").to_string(),
                    r["health"].as_str().unwrap_or("").to_string(),
                ));
            }
        }
    }
    let said = seen
        .iter()
        .map(|(n, id, h)| format!("{n}: {id}={h}"))
        .collect::<Vec<_>>()
        .join("; ");
    match seen.iter().find(|(_, id, _)| id.ends_with(DEV)) {
        Some((_, _, h)) if h == "Healthy" => Ok(format!("after {s} s with nothing changed: {said}")),
        _ => Err(format!(
            "after {s} s: allocatedResourcesStatus {said:?}, want {DEV}=Healthy"
        )),
    }
}

fn host_unbind_refused(o: &Out) -> Verdict {
    let c = o.cmd("host-unbind")?;
    let claim = json(o, "legacy-claim")?;
    let name = claim["metadata"]["name"]
        .as_str()
        .ok_or("legacy-claim: no name")?;
    let said = format!("{}{}", c.out, c.err);
    let d = drivers(&o.facts("host-unbind")?)?;
    let needle = format!("held by claim default/{name}");
    if c.rc == 0 || !said.contains(&needle) || d != VFIO {
        return Err(format!(
            "exit {}, drivers {d}: want a refusal saying {needle:?}, the group still on vfio-pci: {}",
            c.rc,
            one_line(&said)
        ));
    }
    Ok(format!(
        "exit {}, {}; group still {d}",
        c.rc,
        said.lines()
            .find(|l| l.contains("held by claim"))
            .map_or("", str::trim)
    ))
}

fn mdev_counters(o: &Out) -> Verdict {
    let before = o.facts("mdev-before")?.num("available")?;
    let v = json(o, "mdev-slices")?;
    let set = items(&v)
        .into_iter()
        .flat_map(|s| s["spec"]["sharedCounters"].as_array().into_iter().flatten())
        .find(|c| c["name"] == MDEV_SET)
        .ok_or_else(|| format!("mdev-slices: no counter set {MDEV_SET}"))?;
    let value = &set["counters"][MDEV_TYPE]["value"];
    let counter = value
        .as_i64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
        .ok_or_else(|| format!("{MDEV_SET}: counter {MDEV_TYPE} is {value}"))?;
    let consumers = devices(&v)
        .iter()
        .filter(|d| {
            d["consumesCounters"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["counterSet"] == MDEV_SET)
        })
        .count();
    if counter != before || consumers == 0 {
        return Err(format!(
            "counter {MDEV_TYPE} {counter}, the kernel's available_instances {before}, {consumers} devices consume from {MDEV_SET}"
        ));
    }
    Ok(format!(
        "counter set {MDEV_SET}: {MDEV_TYPE} = {counter} (the kernel's available_instances {before}); {consumers} devices consume from it"
    ))
}

/// Any object of `v` (at any depth) has `"uuid": want`.
fn has_uuid(v: &Value, want: &str) -> bool {
    match v {
        Value::Object(m) => m
            .iter()
            .any(|(k, x)| (k == "uuid" && x == want) || has_uuid(x, want)),
        Value::Array(a) => a.iter().any(|x| has_uuid(x, want)),
        _ => false,
    }
}

fn mdev_created(o: &Out) -> Verdict {
    let before = o.facts("mdev-before")?.num("available")?;
    let f = o.facts("mdev-instance")?;
    let (uuid, group) = (f.get("uuid")?, f.get("group")?);
    let during = f.num("available")?;
    let ck = json(o, "mdev-checkpoint")?;
    if uuid.is_empty() || group.is_empty() || during != before - 1 || !has_uuid(&ck, uuid) {
        return Err(format!(
            "uuid {uuid:?} group {group:?} available {before} -> {during}; checkpoint: {}",
            cut(&ck.to_string(), 300)
        ));
    }
    Ok(format!(
        "mdev {uuid} ({MDEV_TYPE}, IOMMU group {group}) recorded in the checkpoint; available_instances {before} -> {during}"
    ))
}

/// The instance's nodes in the container: its group and the container (legacy), or its cdev
/// and /dev/iommu (iommufd); nothing failed, never both backends.
fn mdev_opens(o: &Out) -> Verdict {
    let f = o.facts("mdev-instance")?;
    let (group, cdev) = (f.get("group")?, f.get("cdev")?);
    let log = pod_log(o, "mdev")?;
    let (ok, failed) = opened(&log);
    let has = |n: &str| ok.iter().any(|x| x == n);
    if failed.is_empty()
        && !group.is_empty()
        && has(&format!("/dev/vfio/{group}"))
        && has("/dev/vfio/vfio")
        && !has("/dev/iommu")
    {
        return Ok(format!(
            "legacy: /dev/vfio/{group} (the instance's group) and /dev/vfio/vfio open in the container"
        ));
    }
    if failed.is_empty()
        && !cdev.is_empty()
        && has(&format!("/dev/vfio/devices/{cdev}"))
        && has("/dev/iommu")
        && !has("/dev/vfio/vfio")
    {
        return Ok(format!(
            "iommufd: /dev/vfio/devices/{cdev} (the instance's cdev) and /dev/iommu open in the container, no /dev/vfio/vfio"
        ));
    }
    Err(format!(
        "group {group:?} cdev {cdev:?}: neither the legacy nor the iommufd nodes alone: {}",
        one_line(&log)
    ))
}

/// 6.1: the template with no config on the legacy container: the slice says backend legacy, the
/// container opens the group's nodes and no iommufd node.
fn auto_opens(o: &Out) -> Verdict {
    let kernel = o.facts("leg")?.get("kernel")?.to_string();
    let v = json(o, "auto-slices")?;
    let backend = devices(&v)
        .into_iter()
        .find(|d| d["name"] == DEV)
        .map(|d| d["attributes"]["gpupass.dev/backend"]["string"].clone())
        .unwrap_or(Value::Null);
    let g = group(o)?;
    let d = drivers(&o.facts("auto-held")?)?;
    let log = pod_log(o, "auto")?;
    let (ok, _) = opened(&log);
    if backend != "legacy" {
        return Err(format!("auto-slices: {DEV} says backend {backend}, want legacy"));
    }
    legacy_opens(o, "auto", &g).map_err(|e| format!("drivers {d}: {e}"))?;
    if let Some(n) = ok.iter().find(|n| n.starts_with("/dev/vfio/devices/")) {
        return Err(format!("a cdev opened on a kernel without iommufd: {n}"));
    }
    Ok(format!(
        "kernel {kernel}: the slice says backend legacy; /dev/vfio/{g} and /dev/vfio/vfio open, no /dev/iommu, no cdev; drivers {d}"
    ))
}

/// 6.1: the claim that requires iommufd changed nothing: every sample of the group's drivers
/// while the kubelet retried, and the drivers after, are the start's; the claim is not in the
/// checkpoint; the journal holds nothing.
fn require_untouched(o: &Out) -> Verdict {
    let start = start_drivers(o)?;
    let f = o.facts("require-untouched")?;
    let samples: Vec<&str> = f.get("samples")?.split_whitespace().collect();
    let want = start.replace(' ', "+");
    if samples.is_empty() {
        return Err("require-untouched: no samples".into());
    }
    if let Some(s) = samples.iter().find(|s| **s != want) {
        return Err(format!(
            "a sample read {s:?} while the kubelet retried, want {want:?}"
        ));
    }
    let now = drivers(&f)?;
    if now != start {
        return Err(format!("drivers now {now:?}, want {start:?}"));
    }
    let uid = uid_of(&json(o, "require-claim")?)?;
    let ck = o.cmd("require-checkpoint")?;
    if ck.rc == 0 && ck.out.contains(&uid) {
        return Err(format!("claim {uid} is in the checkpoint: {}", one_line(&ck.out)));
    }
    let r = o.cmd("require-recover")?;
    let said = format!("{}{}", r.out, r.err);
    if !said.contains("nothing to recover") {
        return Err(format!("recover --dry-run: {}", one_line(&said)));
    }
    Ok(format!(
        "{} samples of the group's drivers while the kubelet retried, all '{start}'; claim {uid} not in the checkpoint; journal: {}",
        samples.len(),
        said.lines().next().unwrap_or("")
    ))
}
