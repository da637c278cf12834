//! The QEMU IOMMU lab tier (docs/lab.md): a real Debian kernel under QEMU with an emulated
//! Intel IOMMU and emulated GPUs, running gpupass inside the guest.
//!
//! All scenarios share one boot (`lab/lab.sh run smoke inventory snapshot demo`, ~10 s once the
//! kernel is cached, ~90 s on a fresh machine); each `#[test]` then asserts its own scenario's
//! verdict. The lab installs its host packages with apt and downloads the kernel from the
//! Debian mirror when needed. When that is impossible (no QEMU, no kernel, no root) the tests
//! FAIL with the runner's message: this tier never passes or skips silently.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Every scenario the tests below assert on, run in one boot, in this order.
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
    "concurrency",
    "cdiwatch",
    "startup",
];

struct LabRun {
    status: Option<i32>,
    output: String,
    out_root: PathBuf,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn lab_run() -> &'static LabRun {
    static RUN: OnceLock<LabRun> = OnceLock::new();
    RUN.get_or_init(|| {
        let repo = repo();
        let out_root = std::env::var_os("GPUPASS_LAB_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo.join("target/lab/out"));
        let result = Command::new("bash")
            .arg(repo.join("lab/lab.sh"))
            .arg("run")
            .args(SCENARIOS)
            .current_dir(&repo)
            // The console is kept in target/lab/out/<scenario>/console.log; the report
            // (printed on failure) is what a test log needs.
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

/// Passes iff the shared lab boot ran and `scenario` passed in it.
fn assert_scenario(scenario: &str) {
    let run = lab_run();
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
                    "lab scenario {scenario} FAILED:\n{v}\n--- lab output ---\n{}\n\
                     console: {}",
                    run.output,
                    run.out_root.join(scenario).join("console.log").display()
                );
            }
        }
        _ => {}
    }
    panic!(
        "the QEMU lab could not run (exit status {:?}); scenario {scenario} did not run.\n\
         The lab needs root (apt installs), the Debian mirror, qemu-system-x86, busybox-static, \
         cpio, kmod; see docs/lab.md.\n--- lab output ---\n{}",
        run.status, run.output
    );
}

#[test]
fn lab_smoke() {
    assert_scenario("smoke");
}

#[test]
fn lab_inventory() {
    assert_scenario("inventory");
}

#[test]
fn lab_snapshot() {
    assert_scenario("snapshot");
}

#[test]
fn lab_demo() {
    assert_scenario("demo");
}

#[test]
fn lab_events() {
    assert_scenario("events");
}

#[test]
fn lab_bind() {
    assert_scenario("bind");
}

/// A mounted filesystem (virtio-blk) and an up interface (virtio-net) refuse the bind.
#[test]
fn lab_inuse() {
    assert_scenario("inuse");
}

/// Unrelated devices in one group (behind a PCIe-to-PCI bridge): refused, naming the other.
#[test]
fn lab_mixedgroup() {
    assert_scenario("mixedgroup");
}

#[test]
fn lab_mdev() {
    assert_scenario("mdev");
}

#[test]
fn lab_boot() {
    assert_scenario("boot");
}

#[test]
fn lab_startup() {
    assert_scenario("startup");
}

#[test]
fn lab_cdiwatch() {
    assert_scenario("cdiwatch");
}

#[test]
fn lab_concurrency() {
    assert_scenario("concurrency");
}
