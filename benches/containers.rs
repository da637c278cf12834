//! Container-path benchmarks (not timed tests): `cargo bench --bench containers`.
//!
//! 1. CDI generation for a 4096-function synthetic host with 64 GPUs on the native driver:
//!    `gpupass cdi generate` wall time (scan + discovery + render), and the pure renderer alone.
//! 2. The OCI hook per container start: `gpupass oci-hook` (the real binary, state on stdin)
//!    giving one VFIO group to a process in its own mount namespace and devices cgroup, on the
//!    small vfio-numa host and on the 4096-function host (needs root and `unshare`).
//! 3. Device-plugin Allocate latency: 10,000 sequential Allocate calls over the unix socket to
//!    the plugin serving the vfio-numa host, p50/p99/max.

// The integration tests' helpers (tests/it/util); this bench uses few of them.
#[path = "../tests/it/util/mod.rs"]
#[allow(dead_code)]
mod util;

use gpupass::host::HostRoot;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use util::cgroup2_mount;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn bin() -> PathBuf {
    // GPUPASS_BENCH_BIN: measure another build (an older commit) with the same harness.
    std::env::var_os("GPUPASS_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gpupass")))
}

fn rebind(root: &Path, addr: &str, driver: &str) {
    gpupass::testkit::fixtures::point_driver(root, addr, driver).unwrap();
}

fn synthetic(root: &Path) -> Vec<String> {
    gpupass::testkit::fixtures::synthetic(root, 4096, 64).unwrap();
    let inv = gpupass::inventory::scan(&HostRoot::new(root)).unwrap();
    let gpus: Vec<String> = inv
        .devices
        .iter()
        .filter(|d| d.is_gpu())
        .map(|d| d.address.to_string())
        .collect();
    gpus
}

fn cdi_generation() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let gpus = synthetic(root);
    let h = gpupass::testkit::hostgen::HostBuilder::new(root).unwrap();
    for (i, a) in gpus.iter().enumerate() {
        h.nvidia_info(
            &a.parse().unwrap(),
            i as u32,
            "NVIDIA GeForce RTX 4090",
            &format!("GPU-{i:08}"),
        )
        .unwrap();
    }
    h.file("dev/nvidiactl", "").unwrap();
    h.file("dev/nvidia-uvm", "").unwrap();
    h.nvidia_driver_files("550.90.07", "usr/lib/x86_64-linux-gnu", true)
        .unwrap();
    let mut wall = Vec::new();
    let mut size = 0;
    for _ in 0..10 {
        let s = Instant::now();
        let o = Command::new(bin())
            .args(["--root", root.to_str().unwrap(), "cdi", "generate"])
            .stderr(Stdio::null())
            .output()
            .unwrap();
        wall.push(s.elapsed());
        assert!(o.status.success());
        size = o.stdout.len();
    }
    let host = HostRoot::new(root);
    let inv = gpupass::inventory::scan(&host).unwrap();
    let files = gpupass::inventory::native::discover(&host);
    let opts = gpupass::output::cdi::Options::default();
    let mut render = Vec::new();
    let mut devices = 0;
    for _ in 0..200 {
        let s = Instant::now();
        let r = gpupass::output::cdi::render(&inv, &files, &opts).unwrap();
        let text = gpupass::output::cdi::to_json(&r.spec);
        render.push(s.elapsed());
        devices = r.spec.devices.len();
        assert_eq!(text.len(), size);
    }
    println!(
        "cdi generate, 4096 functions / 64 native GPUs ({devices} CDI devices, {} KiB): \
         command median {} (p90 {}), render+serialize median {}",
        size / 1024,
        ms(pct(&mut wall, 0.5)),
        ms(pct(&mut wall, 0.9)),
        ms(pct(&mut render, 0.5))
    );
}

fn mknod(p: &Path, major: u32, minor: u32) {
    let _ = std::fs::remove_file(p);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    assert!(Command::new("mknod")
        .arg(p)
        .args(["c", &major.to_string(), &minor.to_string()])
        .status()
        .unwrap()
        .success());
}

/// The cgroup a benchmark container lives in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// cgroup v1 devices, as runc leaves it: `a` denied, then runc's default allow list.
    V1Runc,
    /// The unified hierarchy with a runtime-attached device program (BPF_F_ALLOW_MULTI) that
    /// allows runc's default list and denies the rest.
    V2Bpf,
}

/// runc's default device allow list, the fixed char devices (libcontainer/specconv
/// AllowedDevices): null, zero, full, random, urandom, tty, console, ptmx, tun. Its wildcard
/// rules (pts 136:*, mknod of any c/b) are left out of both shapes.
const RUNC_DEFAULT: &[(u32, u32)] = &[
    (1, 3),
    (1, 5),
    (1, 7),
    (1, 8),
    (1, 9),
    (5, 0),
    (5, 1),
    (5, 2),
    (10, 200),
];

/// The runtime's device program: allow RUNC_DEFAULT (rwm), deny everything else.
fn runtime_program() -> Vec<gpupass::containers::oci_hook::bpf::Insn> {
    use gpupass::containers::oci_hook::bpf::{self, Grant, Insn};
    let all = bpf::ACC_MKNOD | bpf::ACC_READ | bpf::ACC_WRITE;
    let grants: Vec<Grant> = RUNC_DEFAULT
        .iter()
        .map(|&(major, minor)| Grant {
            major,
            minor,
            access: all,
        })
        .collect();
    let mut p = bpf::prologue(&grants);
    p.extend([Insn::mov_imm(0, 0), Insn::exit()]);
    p
}

/// Put the cgroup back as the runtime left it (untimed, before every run).
fn reset_cgroup(shape: Shape, cg: &Path, runtime: &std::os::fd::OwnedFd) {
    use gpupass::containers::oci_hook::bpf;
    use std::os::fd::AsFd;
    match shape {
        Shape::V1Runc => {
            std::fs::write(cg.join("devices.deny"), "a").unwrap();
            for (ma, mi) in RUNC_DEFAULT {
                std::fs::write(cg.join("devices.allow"), format!("c {ma}:{mi} rwm")).unwrap();
            }
        }
        Shape::V2Bpf => {
            let dir = std::fs::File::open(cg).unwrap();
            let now = bpf::query(dir.as_fd(), false).unwrap().ids;
            match now.as_slice() {
                [] => bpf::attach(dir.as_fd(), runtime.as_fd(), bpf::BPF_F_ALLOW_MULTI, None).unwrap(),
                [id] => {
                    let cur = bpf::prog_fd(*id).unwrap();
                    if bpf::prog_insns(cur.as_fd()).unwrap().1.len() != runtime_program().len() {
                        bpf::attach(
                            dir.as_fd(),
                            runtime.as_fd(),
                            bpf::BPF_F_ALLOW_MULTI,
                            Some(cur.as_fd()),
                        )
                        .unwrap();
                    }
                }
                more => panic!("{} device programs on the bench cgroup", more.len()),
            }
        }
    }
}

/// Time the hook giving `request` to a process in its own mount namespace and a runc-shaped
/// device cgroup, each binary of `bins` in turn (interleaved run by run).
fn hook_runs(label: &str, root: &Path, request: &str, shape: Shape, bins: &[(String, PathBuf)]) {
    use std::os::fd::AsFd;
    let _ = std::fs::remove_dir_all(root.join("proc"));
    std::fs::create_dir_all(root.join("sys/fs")).unwrap();
    let _ = std::fs::remove_file(root.join("sys/fs/cgroup"));
    let _ = std::fs::remove_dir_all(root.join("sys/fs/cgroup"));
    let cg = match shape {
        Shape::V1Runc => {
            // The real /proc and cgroup tree: the hook reads the target's devices line.
            std::os::unix::fs::symlink("/proc", root.join("proc")).unwrap();
            std::os::unix::fs::symlink("/sys/fs/cgroup", root.join("sys/fs/cgroup")).unwrap();
            PathBuf::from(format!(
                "/sys/fs/cgroup/devices/gpupass-bench-{}",
                std::process::id()
            ))
        }
        Shape::V2Bpf => {
            let m = cgroup2_mount().expect("a cgroup2 mount");
            std::os::unix::fs::symlink(&m, root.join("sys/fs/cgroup")).unwrap();
            m.join(format!("gpupass-bench-{}", std::process::id()))
        }
    };
    std::fs::create_dir_all(&cg).unwrap();
    let runtime = gpupass::containers::oci_hook::bpf::load(&runtime_program(), "bench_runtime").unwrap();
    let work = tempfile::tempdir().unwrap();
    let b = work.path().join("bundle");
    std::fs::create_dir_all(b.join("rootfs/dev")).unwrap();
    // As runc does: the container's /dev is a tmpfs in its own mount namespace.
    let dev = b.join("rootfs/dev");
    let mut sleeper = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs tmpfs {} && exec sleep 600",
            dev.display()
        ))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let pid = sleeper.id();
    std::fs::write(cg.join("cgroup.procs"), pid.to_string()).unwrap();
    if shape == Shape::V2Bpf {
        // The hook's view of the target: its unified-hierarchy line and its mount namespace.
        let p = root.join(format!("proc/{pid}"));
        std::fs::create_dir_all(p.join("ns")).unwrap();
        let rel = cg.file_name().unwrap().to_str().unwrap();
        std::fs::write(p.join("cgroup"), format!("0::/{rel}\n")).unwrap();
        std::os::unix::fs::symlink(format!("/proc/{pid}/ns/mnt"), p.join("ns/mnt")).unwrap();
    }
    let clear = || {
        let st = Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-m", "sh", "-c"])
            .arg(format!("rm -rf {}/*", dev.display()))
            .status()
            .unwrap();
        assert!(st.success());
    };
    std::fs::write(
        b.join("config.json"),
        serde_json::json!({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
            "annotations": {"gpupass.dev/devices": request}})
        .to_string(),
    )
    .unwrap();
    let state = serde_json::json!({"ociVersion": "1.0.2-dev", "id": "bench", "status": "creating",
        "pid": pid, "bundle": b.to_str().unwrap()})
    .to_string();
    let mut runs: Vec<Vec<Duration>> = vec![Vec::new(); bins.len()];
    let mut wrote = vec![false; bins.len()];
    // GPUPASS_BENCH_HOOK_RUNS: timed runs per binary (after 20 warm-up runs).
    let timed: usize = std::env::var("GPUPASS_BENCH_HOOK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut last_err = String::new();
    for i in 0..20 + timed {
        for (k, (_, bin)) in bins.iter().enumerate() {
            clear();
            reset_cgroup(shape, &cg, &runtime);
            let s = Instant::now();
            let mut c = Command::new(bin)
                .args(["--root", root.to_str().unwrap(), "oci-hook"])
                .stdin(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            c.stdin.take().unwrap().write_all(state.as_bytes()).unwrap();
            let o = c.wait_with_output().unwrap();
            let d = s.elapsed();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            last_err = String::from_utf8_lossy(&o.stderr).into_owned();
            // Did this binary change the device filter (a rule written, a program swapped)?
            wrote[k] = match shape {
                Shape::V1Runc => {
                    std::fs::read_to_string(cg.join("devices.list"))
                        .unwrap()
                        .lines()
                        .count()
                        > RUNC_DEFAULT.len()
                }
                Shape::V2Bpf => {
                    let dir = std::fs::File::open(&cg).unwrap();
                    let ids = gpupass::containers::oci_hook::bpf::query(dir.as_fd(), false)
                        .unwrap()
                        .ids;
                    let cur = gpupass::containers::oci_hook::bpf::prog_fd(ids[0]).unwrap();
                    gpupass::containers::oci_hook::bpf::prog_insns(cur.as_fd())
                        .unwrap()
                        .1
                        .len()
                        != runtime_program().len()
                }
            };
            if i >= 20 {
                runs[k].push(d);
            }
        }
    }
    let inside = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-m", "ls"])
        .arg(dev.join("vfio"))
        .output()
        .unwrap();
    assert!(
        // The legacy set (/dev/vfio/N + /dev/vfio/vfio) or, where the host serves the group
        // through iommufd (`--backend auto`), the cdev directory /dev/vfio/devices.
        {
            let listed = String::from_utf8_lossy(&inside.stdout);
            listed.contains("vfio") || listed.contains("devices")
        },
        "nodes were made: ls {}/vfio in the target said {:?} {:?}; the hook's last stderr: {last_err}",
        dev.display(),
        String::from_utf8_lossy(&inside.stdout),
        String::from_utf8_lossy(&inside.stderr)
    );
    assert!(
        !dev.join("vfio").exists(),
        "nodes only in the target's mount namespace"
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    std::thread::sleep(Duration::from_millis(100));
    let _ = std::fs::remove_dir(&cg);
    let shape_name = match shape {
        Shape::V1Runc => "v1 devices, runc-shaped",
        Shape::V2Bpf => "v2 BPF filter, runc-shaped",
    };
    for (k, (name, _)) in bins.iter().enumerate() {
        println!(
            "oci-hook [{name}], {label}, {shape_name}: median {}, p99 {} per container start ({timed} runs, interleaved); filter changed: {}",
            ms(pct(&mut runs[k], 0.5)),
            ms(pct(&mut runs[k], 0.99)),
            if wrote[k] { "yes" } else { "no" }
        );
    }
}

/// The binaries to time: this build, and `GPUPASS_BENCH_BIN_B` (another build, e.g. an older
/// commit) interleaved with it run by run.
fn bins() -> Vec<(String, PathBuf)> {
    let mut v = vec![("this build".to_string(), bin())];
    if let Some(b) = std::env::var_os("GPUPASS_BENCH_BIN_B") {
        let name = std::env::var("GPUPASS_BENCH_BIN_B_NAME").unwrap_or_else(|_| "B".into());
        v.push((name, PathBuf::from(b)));
    }
    v
}

fn hook() {
    let is_root = rustix::process::geteuid().is_root();
    let has_unshare = Command::new("sh")
        .args([
            "-c",
            "command -v unshare >/dev/null && command -v nsenter >/dev/null",
        ])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        is_root && has_unshare,
        "the hook benchmark needs root, unshare and nsenter"
    );
    let mut shapes = Vec::new();
    if Path::new("/sys/fs/cgroup/devices/devices.allow").exists() {
        shapes.push(Shape::V1Runc);
    }
    if cgroup2_mount().is_some() {
        shapes.push(Shape::V2Bpf);
    }
    assert!(
        !shapes.is_empty(),
        "no cgroup v1 devices controller and no cgroup2 mount"
    );
    let bins = bins();
    for shape in shapes {
        // Small host.
        let t = tempfile::tempdir().unwrap();
        gpupass::testkit::fixtures::build("vfio-numa", t.path()).unwrap();
        mknod(&t.path().join("dev/vfio/vfio"), 10, 196);
        mknod(&t.path().join("dev/vfio/40"), 240, 40);
        mknod(&t.path().join("dev/iommu"), 10, 123);
        mknod(&t.path().join("dev/vfio/devices/vfio0"), 241, 0);
        hook_runs(
            "vfio-numa host (14 functions), 1 GPU",
            t.path(),
            "0000:17:00.0",
            shape,
            &bins,
        );
        // 4096 functions: the 10th GPU and its audio function moved to vfio-pci.
        let t = tempfile::tempdir().unwrap();
        let gpus = synthetic(t.path());
        let gpu = &gpus[10];
        let audio = format!("{}.1", &gpu[..gpu.len() - 2]);
        rebind(t.path(), gpu, "vfio-pci");
        rebind(t.path(), &audio, "vfio-pci");
        let inv = gpupass::inventory::scan(&HostRoot::new(t.path())).unwrap();
        let g = inv.device(&gpu.parse().unwrap()).unwrap().iommu_group.unwrap();
        mknod(&t.path().join("dev/vfio/vfio"), 10, 196);
        mknod(&t.path().join(format!("dev/vfio/{g}")), 240, g);
        hook_runs(
            "synthetic host (4096 functions), 1 GPU + audio",
            t.path(),
            gpu,
            shape,
            &bins,
        );
    }
}

fn allocate() {
    let t = tempfile::tempdir().unwrap();
    gpupass::testkit::fixtures::build("vfio-numa", t.path()).unwrap();
    let sockets = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cfg = gpupass::containers::deviceplugin::Config {
            host: HostRoot::new(t.path()),
            socket_dir: sockets.path().to_path_buf(),
            poll: Duration::from_millis(500),
            cdi: gpupass::containers::deviceplugin::CdiMode::Never,
            cdi_kind: gpupass::output::cdi::Kind::default(),
            backend: gpupass::inventory::backend::Policy::Auto,
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(gpupass::containers::deviceplugin::server::serve(cfg, async {
            let _ = stop_rx.await;
        }));
        let sock = sockets
            .path()
            .join(gpupass::containers::deviceplugin::server::socket_name(
                "nvidia.com/AD102GL_L40S",
            ));
        while !sock.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let ch = gpupass::containers::kubelet::socket::connect_unix(&sock)
            .await
            .unwrap();
        let mut c =
            gpupass::containers::deviceplugin::proto::device_plugin_client::DevicePluginClient::new(ch);
        let req = || gpupass::containers::deviceplugin::proto::AllocateRequest {
            container_requests: vec![
                gpupass::containers::deviceplugin::proto::ContainerAllocateRequest {
                    devices_ids: vec!["0000:17:00.0".into(), "0000:31:00.0".into()],
                },
            ],
        };
        for _ in 0..500 {
            c.allocate(req()).await.unwrap();
        }
        let mut lat = Vec::with_capacity(10_000);
        for _ in 0..10_000 {
            let s = Instant::now();
            let r = c.allocate(req()).await.unwrap().into_inner();
            lat.push(s.elapsed());
            assert_eq!(r.container_responses[0].devices.len(), 6);
        }
        println!(
            "device-plugin Allocate (2 GPUs, over the unix socket, 10,000 calls): p50 {}, p99 {}, max {}",
            ms(pct(&mut lat, 0.5)),
            ms(pct(&mut lat, 0.99)),
            ms(pct(&mut lat, 1.0))
        );
        // The pure reply computation alone, for comparison with the round trip.
        let host = HostRoot::new(t.path());
        let inv = gpupass::inventory::scan(&host).unwrap();
        let ids = vec!["0000:17:00.0".to_string(), "0000:31:00.0".to_string()];
        let mut pure = Vec::with_capacity(10_000);
        for _ in 0..10_000 {
            let s = Instant::now();
            let r = gpupass::containers::deviceplugin::allocate(
                &inv,
                "nvidia.com/AD102GL_L40S",
                &ids,
                None,
                gpupass::inventory::backend::Policy::Auto,
            )
            .unwrap();
            pure.push(s.elapsed());
            assert_eq!(r.devices.len(), 6);
        }
        println!(
            "device-plugin allocate() alone: p50 {}, p99 {}",
            ms(pct(&mut pure, 0.5)),
            ms(pct(&mut pure, 0.99))
        );
        let _ = stop_tx.send(());
        let _ = server.await;
    });
}

fn main() {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "cores {}, load average {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let only = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let want = |n: &str| only.as_deref().is_none_or(|o| o == n);
    if want("cdi") {
        cdi_generation();
    }
    if want("hook") {
        hook();
    }
    if want("allocate") {
        allocate();
    }
}
