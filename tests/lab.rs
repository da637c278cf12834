//! The QEMU IOMMU lab tier (docs/lab.md): a real Linux kernel under QEMU with an emulated
//! Intel IOMMU and emulated GPUs, running gpupass inside the guest, on both kernel legs:
//!
//! - `leg_6_1`: Debian 12's kernel package (cgroup v1 devices, the legacy VFIO container);
//! - `leg_6_12`: the lab's build of Debian's `linux-source-6.12` (lab/kernel/: iommufd, the VFIO
//!   device cdev, the unified cgroup v2 hierarchy only), as current distributions run.
//!
//! All scenarios of a leg share one boot (`lab/lab.sh --kernel LEG run SCENARIOS...`); each
//! `#[test]` then asserts its own scenario's verdict. The two legs boot in parallel when the
//! test harness has two threads. The lab fetches its QEMU and kernels with apt (into its cache;
//! nothing is installed but the build tools) and builds the 6.12 kernel once (~25 min on two
//! cores, then cached). When that is impossible the tests FAIL with the runner's message: this
//! tier never passes or skips silently.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

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
    "boot",
    "iommufd",
    "nested",
    "concurrency",
    "cdiwatch",
    "startup",
    "vfioids",
    "cgroupv2",
];

struct LabRun {
    status: Option<i32>,
    output: String,
    out_root: PathBuf,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn lab_run(leg: &'static str, cell: &'static OnceLock<LabRun>) -> &'static LabRun {
    cell.get_or_init(|| {
        let repo = repo();
        let out_root = match std::env::var_os("GPUPASS_LAB_OUT") {
            Some(p) => PathBuf::from(p).join(leg),
            None => repo.join("target/lab/test-out").join(leg),
        };
        let result = Command::new("bash")
            .arg(repo.join("lab/lab.sh"))
            .args(["--kernel", leg, "run"])
            .args(SCENARIOS)
            .current_dir(&repo)
            .env("GPUPASS_LAB_OUT", &out_root)
            // The console is kept in <out>/<scenario>/console.log; the report (printed on
            // failure) is what a test log needs.
            .env("GPUPASS_LAB_QUIET", "1")
            .output();
        match result {
            Ok(o) => LabRun {
                status: o.status.code(),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ),
                out_root,
            },
            Err(e) => LabRun {
                status: None,
                output: format!("cannot run bash lab/lab.sh: {e}"),
                out_root,
            },
        }
    })
}

/// Passes iff the leg's shared lab boot ran and `scenario` passed in it.
fn assert_scenario(run: &LabRun, leg: &str, scenario: &str) {
    let verdict_path = run.out_root.join(scenario).join("verdict");
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

/// One `#[test]` per scenario and leg: `leg_6_1::smoke`, `leg_6_12::smoke`, ...
/// `$attr` goes on each scenario test: a `doc` for a leg that runs (an `ignore` with the reason
/// would park a leg that is not green).
macro_rules! leg {
    ($module:ident, $leg:literal, #[$attr:meta], [$($scenario:ident),* $(,)?]) => {
        mod $module {
            use super::*;
            static RUN: OnceLock<LabRun> = OnceLock::new();
            #[test]
            fn every_scenario_has_a_test() {
                let mine = [$(stringify!($scenario)),*];
                assert_eq!(mine.as_slice(), SCENARIOS, "SCENARIOS and the tests of {}", $leg);
            }
            $(
                #[test]
                #[$attr]
                fn $scenario() {
                    assert_scenario(lab_run($leg, &RUN), $leg, stringify!($scenario));
                }
            )*
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
        boot,
        iommufd,
        nested,
        concurrency,
        cdiwatch,
        startup,
        vfioids,
        cgroupv2
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
        boot,
        iommufd,
        nested,
        concurrency,
        cdiwatch,
        startup,
        vfioids,
        cgroupv2
    ]
);
