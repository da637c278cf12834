//! The QEMU IOMMU lab tier (docs/lab.md): a real Linux kernel under QEMU with an emulated
//! Intel IOMMU and emulated GPUs, running gpupass inside the guest, on both kernel legs:
//!
//! - `leg_6_1`: Debian 12's kernel package (cgroup v1 devices, the legacy VFIO container);
//! - `leg_6_12`: the lab's build of Debian's `linux-source-6.12` (lab/kernel/: iommufd, the VFIO
//!   device cdev, the unified cgroup v2 hierarchy only), as current distributions run.
//!
//! All scenarios of a leg share one boot (`lab/lab.sh --kernel LEG run SCENARIOS...`); each
//! `#[test]` then asserts its own scenario's verdict. Both legs and the cluster lab start at the
//! first lab test, each as a process of its own (`BOOTS`); the L2 boot of each leg starts
//! when that leg's shared boot has ended, and the 6.1 cluster boot when the 6.12 one has
//! (`Boot::after`). The lab fetches its QEMU and kernels with apt (into its cache;
//! nothing is installed but the build tools) and builds the 6.12 kernel once (~25 min on two
//! cores, then cached). When that is impossible the tests FAIL with the runner's message: this
//! tier never passes or skips silently.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once, OnceLock};

/// Every scenario the tests below assert on, run in one boot per leg, in this order.
const SCENARIOS: &[&str] = &[
    "smoke",
    "inventory",
    "snapshot",
    "demo",
    "events",
    "bind",
    "inuse",
    "mixedgroup",
    "mdev",
    "mdevcrash",
    "boot",
    "iommufd",
    "nested",
    "concurrency",
    "cdiwatch",
    "startup",
    "vfioids",
    "cgroupv2",
    "selftest",
];

struct LabRun {
    status: Option<i32>,
    output: String,
    out_root: PathBuf,
}

/// Where a boot's results go: `$GPUPASS_LAB_OUT/<name>`, else `target/lab/test-out/<name>`.
fn out_root(name: &str) -> PathBuf {
    match std::env::var_os("GPUPASS_LAB_OUT") {
        Some(p) => PathBuf::from(p).join(name),
        None => crate::util::manifest_dir().join("target/lab/test-out").join(name),
    }
}

/// `lab/lab.sh --kernel LEG run SCENARIOS...`, its results under `out_root`.
fn lab_command(leg: &str, scenarios: &[&str], out_root: &std::path::Path) -> Command {
    let repo = crate::util::manifest_dir();
    let mut c = Command::new("bash");
    c.arg(repo.join("lab/lab.sh"))
        .args(["--kernel", leg, "run"])
        .args(scenarios)
        .current_dir(&repo)
        .env("GPUPASS_LAB_OUT", out_root)
        // The console is kept in <out>/<scenario>/console.log; the report (printed on
        // failure) is what a test log needs.
        .env("GPUPASS_LAB_QUIET", "1");
    c
}

/// One boot of the lab: a leg's kernel and the scenarios it runs, started as a process of its
/// own and awaited by the tests that assert on it.
struct Boot {
    /// Its results directory under `out_root`, and its output file's name.
    name: &'static str,
    leg: &'static str,
    scenarios: &'static [&'static str],
    /// The boot this one starts after (when that one was started): at most three lab boots run
    /// at once, as before `l2linux` joined.
    after: Option<&'static str>,
    /// The process once started (or why it could not start).
    child: Mutex<Option<Result<Child, String>>>,
    /// Set by `spawn`: the boot was started (it may be running, or have ended). Not derivable
    /// from `child` and `run`: a waiting test has taken the child before `run` is set.
    spawned: AtomicBool,
    run: OnceLock<LabRun>,
    /// Started by the end of `after`'s run, whoever waited for it, rather than by a test
    /// thread that reaches one of its tests (`follows`).
    eager: bool,
    /// Set by `start_all` for an eager boot whose tests are selected.
    wanted: AtomicBool,
}

impl Boot {
    const fn new(name: &'static str, leg: &'static str, scenarios: &'static [&'static str]) -> Boot {
        Boot {
            name,
            leg,
            scenarios,
            after: None,
            child: Mutex::new(None),
            spawned: AtomicBool::new(false),
            run: OnceLock::new(),
            eager: false,
            wanted: AtomicBool::new(false),
        }
    }

    /// A boot started the moment `first` has ended, by whichever thread waited for `first`:
    /// no test thread is held to start it, so it runs beside what the threads go on to.
    const fn follows(
        name: &'static str,
        leg: &'static str,
        scenarios: &'static [&'static str],
        first: &'static str,
    ) -> Boot {
        let mut b = Boot::after(name, leg, scenarios, first);
        b.eager = true;
        b
    }

    /// A boot that starts when `first` has ended (if `first` runs at all).
    const fn after(
        name: &'static str,
        leg: &'static str,
        scenarios: &'static [&'static str],
        first: &'static str,
    ) -> Boot {
        let mut b = Boot::new(name, leg, scenarios);
        b.after = Some(first);
        b
    }

    /// Whether the boot was started (it may have ended).
    fn started(&self) -> bool {
        self.spawned.load(Ordering::SeqCst)
    }

    fn log(&self) -> PathBuf {
        crate::util::manifest_dir()
            .join("target/lab/test-out")
            .join(format!("{}.log", self.name))
    }

    /// Starts the boot; its output goes to a file, so that a process nobody reads yet never
    /// blocks on a full pipe.
    fn spawn(&self) {
        self.spawned.store(true, Ordering::SeqCst);
        let log = self.log();
        let child = std::fs::create_dir_all(log.parent().unwrap())
            .and_then(|_| std::fs::File::create(&log))
            .and_then(|f| {
                let e = f.try_clone()?;
                lab_command(self.leg, self.scenarios, &out_root(self.name))
                    .stdin(Stdio::null())
                    .stdout(f)
                    .stderr(e)
                    .spawn()
            })
            .map_err(|e| format!("cannot run bash lab/lab.sh: {e}"));
        *self.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
    }

    /// The boot's result, waiting for it to end (every boot is started first).
    fn run(&'static self) -> &'static LabRun {
        start_all();
        self.run.get_or_init(|| {
            if let Some(first) = self.after.map(lab_boot) {
                if first.started() {
                    first.run();
                }
            }
            let out_root = out_root(self.name);
            let taken = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
            // Not started when start_all read the selection differently from the harness.
            let child = taken.unwrap_or_else(|| {
                self.spawn();
                let started = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
                started.expect("spawn sets it")
            });
            let status = match child {
                Ok(mut c) => c.wait().ok().and_then(|s| s.code()),
                Err(output) => {
                    return LabRun {
                        status: None,
                        output,
                        out_root,
                    }
                }
            };
            for b in BOOTS.iter().filter(|b| b.eager && b.after == Some(self.name)) {
                if b.wanted.load(Ordering::SeqCst) && !b.started() {
                    b.spawn();
                }
            }
            LabRun {
                status,
                output: std::fs::read_to_string(self.log()).unwrap_or_default(),
                out_root,
            }
        })
    }
}

/// The cluster lab's scenarios (docs/cluster.md), one boot on the 6.12 kernel.
const CLUSTER_SCENARIOS: &[&str] = &["cluster", "clusterdp", "clusterhook", "clusterdra"];

/// The cluster as users run it (issues 44 and 45): the chart installed with helm, what the
/// scheduler learns over time (slices resynced, health, taints), binding conditions, a VM in a
/// Pod. A 6.12 cluster boot of its own, started the moment the 6.12 cluster boot has ended by
/// whichever thread waited for that (`Boot::follows`), so it runs beside the 6.1 cluster boot
/// and the L2 boots and holds no test thread: the threads reach its tests (module
/// `users_6_12`, which sorts last) only after the L2 tests. In the shared 6.12 cluster boot it
/// would lengthen the cluster chain, which is what delays the start of the 6.1 L2 boot, CI's
/// critical path (docs/testing.md, "CI's time").
const CLUSTER_USERS_SCENARIOS: &[&str] = &["clustervm", "clusterhelm", "clusterslices", "clusterbind"];

/// `l2linux` (docs/lab.md, "`l2linux`, `l2ovmf`, `l2huge`": an L2 Linux started inside the guest from
/// `gpupass qemu-args`, its own kernel judging every passed BAR), in a boot of its own per leg,
/// started when that leg's shared boot has ended: the runs that cleared it for the tests were
/// each a boot of their own (docs/testing.md, "`l2linux`, run after run"), and at most three
/// TCG boots share the two cores, as before it joined (with five at once, a cluster boot's
/// second vCPU lost its timer interrupt for good on 2026-12-04: docs/lab.md).
const L2_SCENARIOS: &[&str] = &["l2linux"];

/// The 6.1 leg's L2 boot runs `l2huge` (docs/lab.md, "`l2huge`"): the window shown both ways
/// under OVMF, what users boot, for a 64 GiB BAR, larger than QEMU's and OVMF's default 32 GiB:
/// the L2 kernel leaves it unassigned ("no space") with the defaults and assigns it in the window
/// `gpupass qemu-args` sizes. `l2libvirt` follows: the success from the QEMU command line libvirt
/// 9.0 makes of `gpupass xml domain` (on the host, over virtio-9p; `lab/tools/libvirtnative.py`).
/// Their three L2 boots run under TCG inside TCG (minutes each, docs/lab.md), so on the 6.1 leg
/// only, whose L2 boots are about twice as fast as 6.12's, one TCG boot at a time. `l2linux`
/// (SeaBIOS, the 16 GiB BAR) runs on the 6.12 leg only since 2026-12-06: on 6.1 its checks are
/// `l2huge`'s `huge-*` ones on the same legacy container (every BAR placed above 4 GiB inside
/// gpupass's window, `/proc/iomem`, `lspci -vv`, reads through), and it took 443-481 s of TCG
/// inside TCG in CI's runs (docs/testing.md, "CI's time").
const L2_SCENARIOS_6_1: &[&str] = &["l2huge", "l2libvirt"];

/// The DRA plugin on the 6.1 kernel (docs/dra.md, "Legacy-only nodes"): Debian 12's kernel,
/// booted with the unified cgroup hierarchy as Debian boots it (kubelet 1.37 refuses v1), no
/// iommufd: claims get the legacy container, a `require-iommufd` claim is refused before any
/// write. A boot of its own, started when the 6.12 cluster boot has ended (one cluster, two
/// vCPUs, at a time). `clustervm` passes on this leg too (its 6.1 steps, its fixture
/// tests/fixtures/lab/clustervm/6.1) but is not in this boot: with it, CI's cold run took
/// 84 minutes (docs/testing.md, "Measured cold on 2026-12-06 (sixth session)").
const CLUSTER_6_1_SCENARIOS: &[&str] = &["clusterdra"];

/// Two nodes (docs/cluster.md, "Two nodes"): two 6.12 guests at once (`# lab-nodes: 2`, one vCPU
/// and 1.5 GiB each), the nodes `lab` and `lab2`, joined to one control plane on the host, the
/// DRA plugin on both. A boot of its own, started when the 6.1 cluster boot has ended (one
/// cluster on the host at a time; its two vCPUs are as many as one cluster boot's).
const CLUSTER_TWO_SCENARIOS: &[&str] = &["clustertwo"];

/// Every boot the tests assert on. All are started at the first lab test, as processes: a test
/// waiting for one holds a test thread, and with two threads (two cores) waiting in turn the
/// boots would run one after another (the cluster's tests sort first and would hold both
/// threads through the 6.12 kernel's build and the cluster boot before either leg began). The
/// 6.1 leg runs at once (Debian's kernel); the 6.12 leg and the cluster wait for the 6.12
/// kernel (lab/lab.sh takes the cache's lock) and then run side by side.
static BOOTS: [Boot; 8] = [
    Boot::new("6.1", "6.1", SCENARIOS),
    Boot::new("6.12", "6.12", SCENARIOS),
    Boot::new("cluster-6.12", "6.12", CLUSTER_SCENARIOS),
    Boot::follows("l2-6.1", "6.1", L2_SCENARIOS_6_1, "6.1"),
    Boot::after("l2-6.12", "6.12", L2_SCENARIOS, "6.12"),
    Boot::after("cluster-6.1", "6.1", CLUSTER_6_1_SCENARIOS, "cluster-6.12"),
    Boot::after("cluster-two", "6.12", CLUSTER_TWO_SCENARIOS, "cluster-6.1"),
    Boot::follows("cluster-users", "6.12", CLUSTER_USERS_SCENARIOS, "cluster-6.12"),
];

/// Starts every boot that a selected test asserts on (all of them under a plain `cargo test`).
fn start_all() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let (filters, skips, exact) = test_selection(std::env::args().skip(1));
        let selected = |name: &str| {
            let hit = |f: &String| {
                if exact {
                    name == f
                } else {
                    name.contains(f.as_str())
                }
            };
            (filters.is_empty() || filters.iter().any(hit)) && !skips.iter().any(hit)
        };
        for b in BOOTS.iter().filter(|b| b.eager) {
            if eager_tests(b).iter().any(|t| selected(t)) {
                b.wanted.store(true, Ordering::SeqCst);
            }
        }
        for b in BOOTS.iter().filter(|b| b.after.is_none()) {
            let module = match b.name {
                "6.1" => "leg_6_1",
                "6.12" => "leg_6_12",
                _ => "cluster_6_12",
            };
            let mut tests: Vec<String> = b
                .scenarios
                .iter()
                .map(|s| format!("lab::{module}::{s}"))
                .collect();
            if b.scenarios == SCENARIOS {
                // A leg's selftest_verdicts test waits on its boot too.
                tests.push(format!("lab::{module}::selftest_verdicts"));
            }
            if tests.iter().any(|t| selected(t)) {
                b.spawn();
            }
        }
        // An eager boot starts when its first boot ends, whoever waits for that: a thread of
        // its own waits here, so that it starts then even while both test threads wait on
        // other boots (on 2026-12-06 the 6.1 leg ended 9 minutes before a test thread
        // reached a test of its L2 boot, CI's last: docs/testing.md, "CI's time").
        for b in BOOTS
            .iter()
            .filter(|b| b.eager && b.wanted.load(Ordering::SeqCst))
        {
            let first = lab_boot(b.after.expect("an eager boot follows another"));
            if first.started() {
                std::thread::spawn(move || {
                    first.run();
                });
            }
        }
    });
}

/// The tests that assert on an eager boot's scenarios, by module.
fn eager_tests(b: &Boot) -> Vec<String> {
    b.scenarios
        .iter()
        .map(|s| {
            let module = match (b.name, *s) {
                ("l2-6.1", "l2huge") => "huge_6_1",
                ("l2-6.1", "l2libvirt") => "libvirt_6_1",
                _ => "users_6_12",
            };
            format!("lab::{module}::{s}")
        })
        .collect()
}

/// The test harness's filters, `--skip` patterns and `--exact`, from its command line.
fn test_selection(args: impl Iterator<Item = String>) -> (Vec<String>, Vec<String>, bool) {
    let (mut filters, mut skips, mut exact) = (Vec::new(), Vec::new(), false);
    let mut args = args.peekable();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--exact" => exact = true,
            "--skip" => skips.extend(args.next()),
            // Options of libtest that take a value as the next word.
            "--test-threads" | "--logfile" | "--format" | "--color" | "-Z" | "--shuffle-seed" => {
                args.next();
            }
            _ if a.starts_with("--skip=") => skips.push(a["--skip=".len()..].to_string()),
            _ if a.starts_with('-') => {}
            _ => filters.push(a),
        }
    }
    (filters, skips, exact)
}

/// The selection is read as libtest reads it, so that `cargo test --test it lab::leg_6_1::`
/// boots one leg and not the cluster.
#[test]
fn the_harness_selection_is_read_from_its_arguments() {
    let args = |a: &[&str]| test_selection(a.iter().map(|s| s.to_string()));
    let none: Vec<String> = Vec::new();
    assert_eq!(args(&[]), (none.clone(), none.clone(), false));
    assert_eq!(
        args(&[
            "--test-threads",
            "2",
            "lab::leg_6_1::",
            "--skip",
            "cluster",
            "--nocapture"
        ]),
        (
            vec!["lab::leg_6_1::".to_string()],
            vec!["cluster".to_string()],
            false
        )
    );
    assert_eq!(
        args(&["--exact", "--skip=x", "--format", "terse", "lab::leg_6_12::smoke"]),
        (
            vec!["lab::leg_6_12::smoke".to_string()],
            vec!["x".to_string()],
            true
        )
    );
}

fn lab_boot(leg: &str) -> &'static Boot {
    BOOTS.iter().find(|b| b.name == leg).expect("a boot of that name")
}

/// Passes iff the leg's shared lab boot ran and `scenario` passed in it. A judged scenario
/// (`# lab-judge: rust`) is judged here first, by its judge in `tests/it/labjudge`, on what the
/// guest shipped: a failure names the judge's failing steps (lab.sh's report, whose verdict
/// follows, runs the same judge as `lab/judge`).
fn assert_scenario(run: &LabRun, leg: &str, scenario: &str) {
    let dir = run.out_root.join(scenario);
    if let Some(judge) = crate::labjudge::judge_of(scenario) {
        // Only where the boot ran (collect wrote guest.json); else the panic below says why not.
        if dir.join("guest.json").is_file() {
            let failed = crate::labjudge::failures(&judge.run(&dir));
            assert!(
                failed.is_empty(),
                "lab scenario {scenario} FAILED on the {leg} kernel, judged by \
                 tests/it/labjudge/{scenario}.rs on {}:\n{}\nconsole: {}",
                dir.display(),
                failed.join("\n"),
                dir.join("console.log").display()
            );
        }
    }
    let verdict_path = dir.join("verdict");
    match run.status {
        Some(0) => return,
        // 1: the boot happened and something failed; the per-scenario verdict says what.
        Some(1) => {
            if let Ok(v) = std::fs::read_to_string(&verdict_path) {
                if v.starts_with("PASS") {
                    return;
                }
                panic!(
                    "lab scenario {scenario} FAILED on the {leg} kernel:\n{v}\n\
                     --- lab output ---\n{}\nconsole: {}",
                    run.output,
                    run.out_root.join(scenario).join("console.log").display()
                );
            }
        }
        _ => {}
    }
    panic!(
        "the QEMU lab could not run on the {leg} kernel (exit status {:?}); scenario {scenario} \
         did not run.\nThe lab needs root (apt), the Debian mirror, busybox-static, cpio, kmod, \
         and for 6.12 the kernel build tools; see docs/lab.md.\n--- lab output ---\n{}",
        run.status, run.output
    );
}

/// What a function's config space (sysfs `config`, read in the guest without gpupass) says it
/// has: (MSI capability, MSI-X capability, interrupt pin).
fn config_facts(cfg: &[u8]) -> (bool, bool, bool) {
    let b = |o: usize| cfg.get(o).copied().unwrap_or(0);
    let (mut msi, mut msix) = (false, false);
    if b(0x06) & 0x10 != 0 {
        let mut p = (b(0x34) & 0xfc) as usize;
        for _ in 0..48 {
            if p < 0x40 {
                break;
            }
            match b(p) {
                0x05 => msi = true,
                0x11 => msix = true,
                _ => {}
            }
            p = (b(p + 1) & 0xfc) as usize;
        }
    }
    (msi, msix, b(0x3d) != 0)
}

fn verdicts(j: &serde_json::Value) -> Vec<(String, String, String)> {
    j["verdicts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| {
                    let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
                    (s("check"), s("result"), s("reason"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Judge the selftest scenario's shipped reports: every verdict against what the device has.
fn check_selftest(run: &LabRun, leg: &str) {
    assert_scenario(run, leg, "selftest");
    let dir = run.out_root.join("selftest");
    let load = |name: &str| -> serde_json::Value {
        let p = dir.join(name);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", p.display()))
    };
    let mut problems = Vec::new();
    // (report, facts name, DMA, kinds raised by the device). DMA: `pass` for edu (the DMA
    // engine the firmware drives); `untested` for the other QEMU PCI devices, which can all
    // master (QEMU's PCI core makes Bus Master Enable writable on every emulated function,
    // hw/pci/pci.c `pci_init_wmask`) but have no engine gpupass drives; `absent` for the mbochs
    // mdev, whose config space ignores Command writes (samples/vfio-mdev/mbochs.c handles
    // only BAR writes; Command reads I/O | memory) so Bus Master Enable stays 0.
    let cases: &[(&str, Option<&str>, &str, &[&str])] = &[
        ("edu.json", Some("edu"), "pass", &["msi", "intx"]),
        ("nic.json", Some("nic"), "untested", &["msi-x"]),
        ("big.json", Some("big"), "untested", &[]),
        ("vga.json", Some("vga"), "untested", &[]),
        ("rst.json", Some("rst"), "untested", &[]),
        ("mdev.json", None, "absent", &[]),
    ];
    for (report, facts, dma, by_device) in cases {
        let j = load(report);
        let (msi, msix, pin, reset) = match facts {
            Some(n) => {
                let cfg = std::fs::read(dir.join(format!("{n}.config"))).unwrap_or_default();
                let (msi, msix, pin) = config_facts(&cfg);
                let rm = std::fs::read_to_string(dir.join(format!("{n}.reset_method"))).unwrap_or_default();
                (msi, msix, pin, !rm.trim().is_empty())
            }
            // mbochs: no config capabilities, no interrupt, no reset flag.
            None => (false, false, false, false),
        };
        let want = |has: bool| if has { "pass" } else { "absent" };
        // An interrupt kind the device has but was not made to raise itself is raised by the
        // host (VFIO's software trigger): `untested`, however many vectors arrived.
        let irq = |name: &str, has: bool| match (has, by_device.contains(&name)) {
            (false, _) => "absent",
            (true, true) => "pass",
            (true, false) => "untested",
        };
        let expected = [
            ("config", "pass"),
            ("bars", "pass"),
            ("dma", *dma),
            ("isolation", *dma),
            ("msi-x", irq("msi-x", msix)),
            ("msi", irq("msi", msi)),
            ("intx", irq("intx", pin)),
            ("reset", want(reset)),
        ];
        let got = verdicts(&j);
        let names: Vec<&str> = got.iter().map(|g| g.0.as_str()).collect();
        if names != expected.iter().map(|e| e.0).collect::<Vec<_>>() {
            problems.push(format!("{report}: verdicts {names:?}"));
            continue;
        }
        for ((name, want), (_, result, reason)) in expected.iter().zip(&got) {
            if result != want {
                problems.push(format!(
                    "{report}: {name} is {result}, the device says {want}: {reason}"
                ));
            }
            if by_device.contains(name) && !reason.contains("raised by the device") {
                problems.push(format!("{report}: {name} was not raised by the device: {reason}"));
            }
            if *result == "untested"
                && ["msi-x", "msi", "intx"].contains(name)
                && !(reason.contains("raised from the host (vfio-trigger)")
                    && reason.contains("needs the device itself to raise it"))
            {
                problems.push(format!(
                    "{report}: {name} untested without the host-raise reason: {reason}"
                ));
            }
        }
        if j["ok"] != true {
            problems.push(format!("{report}: ok is {}", j["ok"]));
        }
        // The evidence behind dma: Bus Master Enable probed, and put back as it was.
        let bm = &j["boot"]["bus_master"];
        if bm["capable"] != (*dma != "absent") || bm["restored"] != true {
            problems.push(format!("{report}: bus_master {bm} for dma {dma}"));
        }
        // The summary counts what the verdicts say.
        for word in ["pass", "fail", "absent", "untested"] {
            let n = got.iter().filter(|g| g.1 == word).count() as u64;
            if j["summary"][word].as_u64() != Some(n) {
                problems.push(format!("{report}: summary {} but {n} {word}", j["summary"]));
            }
        }
        // KVM's own count: every delivery the firmware counted (or its timer) was injected by
        // KVM; KVM may count more (it re-injects an event whose delivery a VM exit interrupted).
        let boot = &j["boot"];
        let delivered: u64 = boot["firmware"]["irqs"]
            .as_array()
            .map(|a| a.iter().filter_map(|i| i["delivered"].as_u64()).sum())
            .unwrap_or(0);
        let timer = boot["firmware"]["irq_timer"].as_u64().unwrap_or(0);
        if let Some(n) = boot["irq_kvm"]["delta"]["irq_injections"].as_u64() {
            if n < delivered + timer {
                problems.push(format!(
                    "{report}: KVM irq_injections {n} < {delivered} delivered + {timer} timer"
                ));
            }
        } else {
            problems.push(format!("{report}: no KVM irq_injections count"));
        }
    }
    let big = verdicts(&load("big.json"));
    if !big
        .iter()
        .any(|v| v.0 == "bars" && v.2.contains("16 GiB") && v.2.contains("above 4 GiB"))
    {
        problems.push(format!("big.json: no 16 GiB BAR above 4 GiB: {big:?}"));
    }
    // The failing cases fail where they should, and only there.
    // (With no DMA map the isolation probe cannot run either: it needs the mapped copy.)
    for (report, failing) in [
        ("edu-nomap.json", &["dma", "isolation"][..]),
        ("edu-noirq.json", &["msi", "intx"][..]),
        ("nic-noirq.json", &["msi-x", "msi", "intx"][..]),
        ("big-nowindow.json", &["bars"][..]),
    ] {
        let j = load(report);
        let mut failed: Vec<String> = verdicts(&j)
            .into_iter()
            .filter(|v| v.1 == "fail")
            .map(|v| v.0)
            .collect();
        failed.sort();
        let mut want: Vec<String> = failing.iter().map(|s| s.to_string()).collect();
        want.sort();
        if failed != want {
            problems.push(format!("{report}: failing verdicts {failed:?}, want {want:?}"));
        }
        if j["ok"] != false {
            problems.push(format!("{report}: ok is {}", j["ok"]));
        }
    }
    if leg == "6.12" {
        for (report, backend) in [("edu-iommufd.json", "iommufd"), ("edu-legacy.json", "legacy")] {
            let j = load(report);
            if j["ok"] != true || j["boot"]["backend"] != backend {
                problems.push(format!(
                    "{report}: ok {} backend {}: {:?}",
                    j["ok"],
                    j["boot"]["backend"],
                    verdicts(&j)
                ));
            }
        }
    }
    assert!(problems.is_empty(), "selftest on {leg}:\n{}", problems.join("\n"));
}

/// One `#[test]` per scenario and leg: `leg_6_1::smoke`, `leg_6_12::smoke`, ...
/// `$attr` goes on each scenario test: a `doc` for a leg that runs (an `ignore` with the reason
/// would park a leg that is not green).
macro_rules! leg {
    ($module:ident, $leg:literal, #[$attr:meta], [$($scenario:ident),* $(,)?]) => {
        mod $module {
            use super::*;
            #[test]
            fn every_scenario_has_a_test() {
                let mine = [$(stringify!($scenario)),*];
                assert_eq!(mine.as_slice(), SCENARIOS, "SCENARIOS and the tests of {}", $leg);
            }
            $(
                #[test]
                #[$attr]
                fn $scenario() {
                    assert_scenario(lab_boot($leg).run(), $leg, stringify!($scenario));
                }
            )*
            /// The selftest scenario's `boot --check` reports, judged here against each
            /// device's own config space and reset_method as the guest shipped them.
            #[test]
            #[$attr]
            fn selftest_verdicts() {
                check_selftest(lab_boot($leg).run(), $leg);
            }
        }
    };
}

leg!(
    leg_6_1,
    "6.1",
    #[doc = "Runs in the 6.1 leg's shared boot."],
    [
        smoke,
        inventory,
        snapshot,
        demo,
        events,
        bind,
        inuse,
        mixedgroup,
        mdev,
        mdevcrash,
        boot,
        iommufd,
        nested,
        concurrency,
        cdiwatch,
        startup,
        vfioids,
        cgroupv2,
        selftest
    ]
);
leg!(
    leg_6_12,
    "6.12",
    #[doc = "Runs in the 6.12 leg's shared boot (the lab's own kernel build)."],
    [
        smoke,
        inventory,
        snapshot,
        demo,
        events,
        bind,
        inuse,
        mixedgroup,
        mdev,
        mdevcrash,
        boot,
        iommufd,
        nested,
        concurrency,
        cdiwatch,
        startup,
        vfioids,
        cgroupv2,
        selftest
    ]
);

/// The cluster lab (docs/cluster.md): a boot of its own on the 6.12 kernel (cgroup v2), with the
/// control plane on the host's loopback (lab/cluster/host.sh) and the kubelet, containerd 2.x
/// and runc 1.5 of the cluster build in the guest; `.ci/run` builds those binaries in the
/// background (lab/cluster/build.sh; the boot waits on the build's lock).
mod cluster_6_12 {
    use super::*;
    fn run() -> &'static LabRun {
        lab_boot("cluster-6.12").run()
    }

    /// The node goes Ready by itself and a Pod the scheduler placed runs through containerd.
    #[test]
    fn cluster() {
        assert_scenario(run(), "6.12 (cluster)", "cluster");
    }

    /// gpupass device-plugin against the real kubelet: legacy, iommufd and CDI-only pods.
    #[test]
    fn clusterdp() {
        assert_scenario(run(), "6.12 (cluster)", "clusterdp");
    }

    /// gpupass oci-hook as the createRuntime hook of a containerd runtime handler, runc 1.5.
    #[test]
    fn clusterhook() {
        assert_scenario(run(), "6.12 (cluster)", "clusterhook");
    }

    /// gpupass dra-plugin against the real kubelet, scheduler and API server: slices published,
    /// the VGA+audio group allocated by CEL, prepared (legacy, iommufd) and given back.
    #[test]
    fn clusterdra() {
        assert_scenario(run(), "6.12 (cluster)", "clusterdra");
    }
}

/// The cluster lab on the 6.1 kernel: `clusterdra` where the kernel has no iommufd.
mod cluster_6_1 {
    use super::*;

    /// gpupass dra-plugin on a legacy-only node: the same real kubelet, scheduler and API
    /// server; the default claim gets the legacy container (the slices say `backend: legacy`),
    /// a `require-iommufd` claim fails its Prepare with the kernel's reason and never moves
    /// the group.
    #[test]
    fn clusterdra() {
        assert_scenario(lab_boot("cluster-6.1").run(), "6.1 (cluster)", "clusterdra");
    }
}

/// Two nodes, one control plane: the plugin on both, each node its own pool; the claim only
/// lab2's device matches runs on lab2, a second Pod for the held group stays Pending with the
/// scheduler's reason, each node unprepares its own claims and ends on its original drivers.
/// Judged by tests/it/labjudge/clustertwo.rs.
mod cluster_two {
    use super::*;

    #[test]
    fn clustertwo() {
        assert_scenario(lab_boot("cluster-two").run(), "6.12 (two nodes)", "clustertwo");
    }
}

/// The "Booted" proof with SeaBIOS on the 6.12 leg (`lab/scenarios/l2linux.sh`; on 6.1 `l2huge`
/// carries the same checks under OVMF): Linux in an L2 VM under TCG, started from `gpupass
/// qemu-args 0000:00:03.0 0000:00:0c.0` as printed, lists both functions with every BAR
/// assigned inside its host bridge's windows (its `/proc/iomem`, `lspci -vv`), the 16 GiB BAR
/// above 4 GiB in the window gpupass sized, and reads through them.
mod l2_6_12 {
    use super::*;
    #[test]
    fn l2linux() {
        assert_scenario(lab_boot("l2-6.12").run(), "6.12", "l2linux");
    }
}

/// The window matters, both ways, under OVMF (`lab/scenarios/l2huge.sh`), for a 64 GiB BAR:
/// with `--pci-hole64 off` (QEMU's and OVMF's default 32 GiB) it stays unassigned and the L2
/// kernel says "no space"; with `gpupass qemu-args`'s 128 GiB window it is assigned above 4 GiB
/// inside the root bus window, in `/proc/iomem` and `lspci -vv`, and read through (on this
/// leg's legacy container with `x-no-mmap`, so that the BAR is not walked).
mod huge_6_1 {
    use super::*;
    #[test]
    fn l2huge() {
        assert_scenario(lab_boot("l2-6.1").run(), "6.1", "l2huge");
    }
}

/// The same under libvirt (`lab/scenarios/l2libvirt.sh`): `gpupass xml domain` made in L1,
/// turned into a QEMU command line by the host's libvirt 9.0 (`virsh domxml-to-native`), which
/// carries gpupass's window and aperture; the L2 Linux booted from that line under OVMF assigns
/// the 64 GiB BAR inside the 128 GiB window.
mod libvirt_6_1 {
    use super::*;
    #[test]
    fn l2libvirt() {
        assert_scenario(lab_boot("l2-6.1").run(), "6.1", "l2libvirt");
    }
}

/// The cluster as users run it: a 6.12 cluster boot of its own (`CLUSTER_USERS_SCENARIOS`),
/// started when the 6.12 cluster boot ends (see there).
mod users_6_12 {
    use super::*;
    fn run() -> &'static LabRun {
        lab_boot("cluster-users").run()
    }

    /// The chart installed with helm (docs/deploy.md, "In the cluster lab"): the image imported
    /// with its digest, the plugin a DaemonSet Pod on its ServiceAccount (least privilege asked
    /// of the authorizer), upgrade and uninstall with a claim held, a host bind racing a
    /// Prepare. Judged by tests/it/labjudge/clusterhelm.rs.
    #[test]
    fn clusterhelm() {
        assert_scenario(run(), "6.12 (cluster, users)", "clusterhelm");
    }

    /// Judged in Rust (tests/it/labjudge/clusterslices.rs).
    #[test]
    fn clusterslices() {
        assert_scenario(run(), "6.12 (cluster, users)", "clusterslices");
    }

    /// Binding conditions on the real scheduler: the group bound before the Pod is, a bind
    /// failing as InUse sends the Pod back to the scheduler; judged in Rust
    /// (tests/it/labjudge/clusterbind.rs).
    #[test]
    fn clusterbind() {
        assert_scenario(run(), "6.12 (cluster, users)", "clusterbind");
    }

    /// A VM in a Pod: a claim of class vm.vfio.gpupass.dev (the group and /dev/kvm), and its
    /// unprivileged container boots `gpupass boot --dra-metadata` on the device under nested
    /// KVM, legacy and iommufd (judged by tests/it/labjudge/clustervm.rs).
    #[test]
    fn clustervm() {
        assert_scenario(run(), "6.12 (cluster, users)", "clustervm");
    }
}
