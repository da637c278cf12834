//! Inventory benchmark (not a timed test): `cargo bench --bench inventory`.
//!
//! Builds a synthetic host of 4096 PCI functions (64 GPUs with HDMI audio behind their own
//! root ports, NICs filling the rest) in the kernel's sysfs layout, then times, side by side in
//! one run on the same tree:
//!   gpupass --root T list --all --json
//!   lspci -nnk -A linux-sysfs -O sysfs.path=T/sys/bus/pci     (pciutils)
//! and prints medians and the ratio. lspci reads config space and names; gpupass also reports
//! IOMMU groups, NUMA, BARs, reset methods, SR-IOV and mdev, so it does strictly more work.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time(cmd: &mut dyn FnMut() -> Command, runs: usize) -> Vec<Duration> {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            let st = cmd()
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("spawn");
            let d = t.elapsed();
            assert!(st.success(), "benchmark command failed: {st}");
            d
        })
        .collect()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let total: usize = std::env::var("GPUPASS_BENCH_FUNCTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096);
    let runs: usize = std::env::var("GPUPASS_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("synthetic-{total}"));
    if !dir.join("sys/bus/pci/devices").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        gpupass::fixtures::synthetic(&dir, total, 64).expect("generate synthetic host");
    }
    let n = std::fs::read_dir(dir.join("sys/bus/pci/devices"))
        .unwrap()
        .count();
    let bin = env!("CARGO_BIN_EXE_gpupass");
    let root = dir.to_str().unwrap().to_string();
    let pci = Path::new(&root).join("sys/bus/pci");
    let pci = pci.to_str().unwrap().to_string();

    let have_lspci = Command::new("lspci")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok();
    if !have_lspci {
        println!("lspci not installed (apt-get install pciutils): no comparison");
    }
    let sysfs_path = format!("sysfs.path={pci}");
    let mut cmds: Vec<(&str, Vec<&str>, &str)> = vec![(
        "gpupass list --all --json",
        vec!["--root", &root, "list", "--all", "--json"],
        bin,
    )];
    if have_lspci {
        cmds.push((
            "lspci -nnk (linux-sysfs)",
            vec!["-nnk", "-A", "linux-sysfs", "-O", &sysfs_path],
            "lspci",
        ));
        cmds.push((
            "lspci -nnvk (linux-sysfs)",
            vec!["-nnvk", "-A", "linux-sysfs", "-O", &sysfs_path],
            "lspci",
        ));
    }
    // Interleave the commands run by run, so a change in machine load hits all of them alike.
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); cmds.len()];
    for (prog, args) in cmds.iter().map(|(_, a, p)| (p, a)) {
        let _ = Command::new(prog)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    for _ in 0..runs {
        for (i, (_, args, prog)) in cmds.iter().enumerate() {
            times[i].extend(time(
                &mut || {
                    let mut c = Command::new(prog);
                    c.args(args);
                    c
                },
                1,
            ));
        }
    }
    println!("synthetic host: {n} PCI functions, {runs} interleaved runs each");
    println!("| command | median | min |");
    println!("|---|---|---|");
    for (i, (name, _, _)) in cmds.iter().enumerate() {
        println!(
            "| {name} | {} | {} |",
            ms(median(times[i].clone())),
            ms(*times[i].iter().min().unwrap())
        );
    }
    if !have_lspci {
        return;
    }
    let (gm, lm, lvm) = (
        median(times[0].clone()),
        median(times[1].clone()),
        median(times[2].clone()),
    );
    println!(
        "ratio gpupass/lspci -nnk: {:.2} (goal <= 0.5); gpupass/lspci -nnvk: {:.2}",
        gm.as_secs_f64() / lm.as_secs_f64(),
        gm.as_secs_f64() / lvm.as_secs_f64()
    );
}
