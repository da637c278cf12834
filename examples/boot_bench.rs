//! Benchmark of `gpupass boot` (docs/performance.md, "boot"). Not a timed test: it prints
//! figures to copy into the docs.
//!
//! ```text
//! cargo build --release --bin gpupass --example kvm_floor --example boot_bench
//! target/release/examples/boot_bench [RUNS]            # on this machine (--emulated)
//! GPUPASS_BENCH_DEVICE=0000:00:03.0 boot_bench         # with a VFIO device (lab)
//! GPUPASS_BENCH_BIN_B=/path/to/older/gpupass boot_bench  # an earlier build in the same rounds
//! ```
//!
//! Measures exec-to-exit wall time of `gpupass boot --emulated` (or `--device`) against the
//! floor (`kvm_floor`: create VM + vCPU, run one `hlt`), the two interleaved run by run, and
//! reports the ratio of the medians; then counts VM exits of a 100k-read
//! loop over a BAR mapped as a KVM slot vs. a trapped BAR (from `--json`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

fn sibling(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe dir");
    // examples live in target/<profile>/examples, the binary one level up.
    for cand in [dir.join(name), dir.join("..").join(name)] {
        if cand.exists() {
            return cand;
        }
    }
    panic!(
        "{name} not found next to {}; build it first (see the header)",
        exe.display()
    );
}

fn time_runs(runs: usize, cmd: &mut dyn FnMut() -> Command) -> Vec<f64> {
    let mut v = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let out = cmd().output().expect("run");
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        assert!(
            out.status.success(),
            "{:?} failed: {}",
            cmd(),
            String::from_utf8_lossy(&out.stderr)
        );
        v.push(ms);
    }
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    v
}

fn stats(name: &str, v: &[f64]) {
    let med = v[v.len() / 2];
    let p90 = v[(v.len() * 9 / 10).min(v.len() - 1)];
    println!(
        "{name:<40} min {:7.2} ms  median {med:7.2} ms  p90 {p90:7.2} ms  (n={})",
        v[0],
        v.len()
    );
}

fn main() {
    let runs: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(30);
    let gpupass = sibling("gpupass");
    let floor = sibling("kvm_floor");
    let target: Vec<String> = match std::env::var("GPUPASS_BENCH_DEVICE") {
        Ok(d) if d.contains('-') => vec!["--mdev".into(), d],
        Ok(d) => vec!["--device".into(), d],
        Err(_) => vec!["--emulated".into()],
    };

    // Interleaved: floor, gpupass, gpupass --check, [build B], floor, ... so all see the same
    // load. GPUPASS_BENCH_BIN_B: a second gpupass build (an earlier commit) in the same rounds.
    let bin_b = std::env::var_os("GPUPASS_BENCH_BIN_B").map(PathBuf::from);
    let mut f = Vec::new();
    let mut g = Vec::new();
    let mut gc = Vec::new();
    let mut b = Vec::new();
    for _ in 0..runs {
        f.extend(time_runs(1, &mut || Command::new(&floor)));
        g.extend(time_runs(1, &mut || {
            let mut c = Command::new(&gpupass);
            c.arg("boot").args(&target).arg("--json");
            c
        }));
        gc.extend(time_runs(1, &mut || {
            let mut c = Command::new(&gpupass);
            c.arg("boot").args(&target).args(["--json", "--check"]);
            c
        }));
        if let Some(bb) = &bin_b {
            b.extend(time_runs(1, &mut || {
                let mut c = Command::new(bb);
                c.arg("boot").args(&target).arg("--json");
                c
            }));
        }
    }
    for v in [&mut f, &mut g, &mut gc, &mut b] {
        v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    }
    stats("floor: exec + KVM create + run hlt", &f);
    stats(&format!("gpupass boot {}", target.join(" ")), &g);
    stats(&format!("gpupass boot {} --check", target.join(" ")), &gc);
    let med = |v: &[f64]| v[v.len() / 2];
    println!(
        "ratio gpupass/floor: median {:.2}x, min {:.2}x; --check/floor median {:.2}x (interleaved, n={runs} each)",
        med(&g) / med(&f),
        g[0] / f[0],
        med(&gc) / med(&f)
    );
    if let Some(bb) = &bin_b {
        stats(&format!("build B ({}) boot", bb.display()), &b);
        println!(
            "ratio build B/floor: median {:.2}x; this build / build B: {:.2}x",
            med(&b) / med(&f),
            med(&g) / med(&b)
        );
    }
    let exits = Command::new(&gpupass)
        .arg("boot")
        .args(&target)
        .arg("--json")
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .map(|v| (v["exits"]["total"].as_u64(), v["exits"]["by_kind"].clone()));
    if let Some((total, kinds)) = exits {
        println!("gpupass boot VM exits: {total:?} {kinds}");
    }

    for bar in ["0", "2"] {
        let out = Command::new(&gpupass)
            .args(["boot", "--json", "--read-loop", "100000", "--read-bar", bar])
            .args(&target)
            .output()
            .expect("run gpupass");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let lw = &v["read_loop"];
        let exits = lw["exits"]["total"].as_u64().unwrap_or(u64::MAX);
        let ns = lw["nanos"].as_u64().unwrap_or(0);
        let mapped = v["slots"].as_array().is_some_and(|s| {
            s.iter()
                .any(|s| s["bar"].as_u64() == bar.parse().ok() && !s["gpa"].is_null())
        });
        println!(
            "100k reads of BAR{bar} ({}): {exits} VM exits during the loop, {:.1} ms ({:.0} ns/read)",
            if mapped { "KVM slot" } else { "trapped" },
            ns as f64 / 1e6,
            ns as f64 / 100_000.0
        );
    }
}
