//! Inventory benchmark (not a timed test): `cargo bench --bench inventory [-- callgrind]`.
//!
//! Builds a synthetic host of 4096 PCI functions (64 GPUs with HDMI audio behind their own
//! root ports, NICs filling the rest) in the kernel's sysfs layout, then runs, interleaved round
//! by round on the same tree:
//!   gpupass --root T list --all --json
//!   lspci -nnk -A linux-sysfs -O sysfs.path=T/sys/bus/pci     (pciutils)
//!   lspci -nnk ... -O hwdb.disable=1                           (names from pci.ids only)
//!   lspci -nnvk -A linux-sysfs -O sysfs.path=T/sys/bus/pci
//! and prints, per command, the median wall time and the median CPU time (user + sys of the
//! child, from `wait4`'s rusage; all of gpupass's threads count), with their ratios to each
//! lspci. lspci reads config space and names; gpupass also reports IOMMU groups, NUMA,
//! BARs, reset methods, SR-IOV and mdev, so it does strictly more work.
//!
//! With `callgrind` as an argument (or `GPUPASS_BENCH_CALLGRIND=1`) and valgrind installed,
//! each command also runs once under `valgrind --tool=callgrind`, which counts the user-space
//! instructions it executes (deterministic, unlike times; kernel work is not counted). It is
//! off by default because it takes ~20 s.
//!
//! Environment: `GPUPASS_BENCH_FUNCTIONS` (4096), `GPUPASS_BENCH_RUNS` (20),
//! `GPUPASS_BENCH_BIN` (time another gpupass build instead of this one), `GPUPASS_BENCH_BIN_B`
//! (also time a second build, e.g. an older commit, in the same rounds; named by
//! `GPUPASS_BENCH_BIN_B_NAME`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One run of a command: wall time, and the child's user and system CPU time.
#[derive(Clone, Copy, Default)]
struct Sample {
    wall: Duration,
    user: Duration,
    sys: Duration,
}

fn timeval(t: libc::timeval) -> Duration {
    Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
}

/// Run `cmd` (output discarded) and reap it with `wait4`, which returns the rusage of that
/// child alone.
// The child is reaped by `wait4`, which clippy does not see; wait4(2) for the child's rusage
// has no safe std wrapper.
#[allow(clippy::zombie_processes, unsafe_code)]
fn run_once(cmd: &mut Command) -> Sample {
    let t = Instant::now();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not yet reaped (std reaps only in `wait`, never called
    // here); `status` and `ru` are valid for writes for the duration of the call.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let wall = t.elapsed();
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "benchmark command failed: wait status {status:#x}"
    );
    Sample {
        wall,
        user: timeval(ru.ru_utime),
        sys: timeval(ru.ru_stime),
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// User-space instructions of one run under callgrind (`Collected : N`), `None` when valgrind
/// fails.
fn callgrind(prog: &str, args: &[String]) -> Option<u64> {
    let out = Command::new("valgrind")
        .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
        .arg(prog)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .ok()?;
    let err = String::from_utf8_lossy(&out.stderr);
    err.lines()
        .find_map(|l| {
            l.split_once("Collected :")
                .map(|(_, n)| n.trim().replace(',', ""))
        })
        .and_then(|n| n.parse().ok())
}

fn have(prog: &str) -> bool {
    Command::new(prog)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

struct Contender {
    name: String,
    prog: String,
    args: Vec<String>,
}

fn main() {
    let env_num = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let total = env_num("GPUPASS_BENCH_FUNCTIONS", 4096);
    let runs = env_num("GPUPASS_BENCH_RUNS", 20).max(1);
    let with_callgrind = std::env::args().any(|a| a == "callgrind")
        || std::env::var("GPUPASS_BENCH_CALLGRIND").is_ok_and(|v| v == "1");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("synthetic-{total}"));
    if !dir.join("sys/bus/pci/devices").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        gpupass::testkit::fixtures::synthetic(&dir, total, 64).expect("generate synthetic host");
    }
    let n = std::fs::read_dir(dir.join("sys/bus/pci/devices"))
        .unwrap()
        .count();
    let bin = std::env::var("GPUPASS_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_gpupass").into());
    let root = dir.to_str().unwrap().to_string();
    let pci = Path::new(&root).join("sys/bus/pci");
    let sysfs_path = format!("sysfs.path={}", pci.to_str().unwrap());

    let gp_args: Vec<String> = ["--root", &root, "list", "--all", "--json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut cmds = vec![Contender {
        name: "gpupass list --all --json".into(),
        prog: bin,
        args: gp_args.clone(),
    }];
    if let Ok(b) = std::env::var("GPUPASS_BENCH_BIN_B") {
        let name = std::env::var("GPUPASS_BENCH_BIN_B_NAME").unwrap_or_else(|_| "B".into());
        cmds.push(Contender {
            name: format!("gpupass list --all --json ({name})"),
            prog: b,
            args: gp_args,
        });
    }
    let have_lspci = have("lspci");
    if !have_lspci {
        println!("lspci not installed (apt-get install pciutils): no comparison");
    }
    let lspci_at = cmds.len();
    if have_lspci {
        // pciutils looks names up in udev's hwdb too when udev is installed (every systemd
        // host); `hwdb.disable=1` leaves it to pci.ids alone, the cheaper case.
        for (flags, hwdb) in [("-nnk", true), ("-nnk", false), ("-nnvk", true)] {
            let mut args: Vec<String> = [flags, "-A", "linux-sysfs", "-O", &sysfs_path]
                .iter()
                .map(|s| s.to_string())
                .collect();
            if !hwdb {
                args.extend(["-O".to_string(), "hwdb.disable=1".to_string()]);
            }
            cmds.push(Contender {
                name: format!(
                    "lspci {flags} (linux-sysfs{})",
                    if hwdb { "" } else { ", hwdb.disable=1" }
                ),
                prog: "lspci".into(),
                args,
            });
        }
    }
    let command = |c: &Contender| {
        let mut cmd = Command::new(&c.prog);
        cmd.args(&c.args);
        cmd
    };
    // One untimed run each (page cache, dentries), then the rounds: every command once per
    // round, so a change in machine load hits all of them alike.
    for c in &cmds {
        run_once(&mut command(c));
    }
    let load_before = loadavg();
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); cmds.len()];
    for _ in 0..runs {
        for (i, c) in cmds.iter().enumerate() {
            samples[i].push(run_once(&mut command(c)));
        }
    }
    let load_after = loadavg();
    println!(
        "synthetic host: {n} PCI functions, {runs} interleaved rounds; load average {load_before} before, {load_after} after"
    );
    println!("| command | wall median | wall min | CPU (user+sys) median | user median | sys median |");
    println!("|---|---|---|---|---|---|");
    let stats: Vec<(Duration, Duration)> = samples
        .iter()
        .map(|s| {
            (
                median(s.iter().map(|x| x.wall).collect()),
                median(s.iter().map(|x| x.user + x.sys).collect()),
            )
        })
        .collect();
    for (i, c) in cmds.iter().enumerate() {
        let s = &samples[i];
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            c.name,
            ms(stats[i].0),
            ms(s.iter().map(|x| x.wall).min().unwrap()),
            ms(stats[i].1),
            ms(median(s.iter().map(|x| x.user).collect())),
            ms(median(s.iter().map(|x| x.sys).collect())),
        );
    }
    let mut instructions: Vec<Option<u64>> = vec![None; cmds.len()];
    if with_callgrind {
        if have("valgrind") {
            for (i, c) in cmds.iter().enumerate() {
                instructions[i] = callgrind(&c.prog, &c.args);
            }
            println!("\n| command | user-space instructions (callgrind, one run) |");
            println!("|---|---|");
            for (i, c) in cmds.iter().enumerate() {
                let v =
                    instructions[i].map_or("valgrind failed".into(), |v| format!("{:.1}M", v as f64 / 1e6));
                println!("| {} | {v} |", c.name);
            }
        } else {
            println!("valgrind not installed (apt-get install valgrind): no instruction counts");
        }
    }
    if !have_lspci {
        return;
    }
    println!();
    for (i, c) in cmds.iter().enumerate().take(lspci_at) {
        println!("{}:", c.name);
        let (w, cpu) = stats[i];
        for (j, l) in cmds.iter().enumerate().skip(lspci_at) {
            let (lw, lc) = stats[j];
            let mut line = format!(
                "  / {}: wall {:.2}, CPU {:.2}",
                l.name,
                w.as_secs_f64() / lw.as_secs_f64(),
                cpu.as_secs_f64() / lc.as_secs_f64().max(1e-9),
            );
            if let (Some(g), Some(l)) = (instructions[i], instructions[j]) {
                line += &format!(", instructions {:.2}", g as f64 / l as f64);
            }
            println!("{line}");
        }
    }
}
