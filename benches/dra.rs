//! DRA ResourceSlice figures for the 4096-function generated host (docs/performance.md, "DRA"):
//!
//!   cargo bench --features dra --bench dra            # the pure part: scan + render
//!   benches/drapublish.sh [ROUNDS]                    # and publication to a real API server
//!
//! The host is the benches' generator at 4096 functions, 1000 of them GPUs with their audio
//! functions (as `tests/it/dra.rs` checks the API's limits on): 1000 devices, 8 slices of at
//! most 128. Without `GPUPASS_BENCH_KUBECONFIG` only the in-process part runs (scan, decide,
//! render). With it (benches/drapublish.sh starts etcd and kube-apiserver of the cluster build on
//! loopback and sets it, and `GPUPASS_BENCH_KUBECTL`), round by round and interleaved (the order
//! swapped every round): gpupass's own publisher (`Publisher::sync`, kube-rs: list, then one
//! create per slice) beside `kubectl create -f` of the same slices (`gpupass dra slices`'s
//! List, what a user without the plugin would run), then the same after one GPU's driver
//! changed (gpupass: list, then one replace per slice, the pool's generation bumped; kubectl:
//! `kubectl replace -f`). kubectl's figure includes its process start and its (cached)
//! discovery; gpupass's does not include a process start (the plugin is long-running).
use gpupass::containers::dra::slices::{self, SliceOptions};
use gpupass::containers::kubelet::api::{Kube, Publisher};
use gpupass::host::HostRoot;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const DRIVER: &str = "vfio.gpupass.dev";

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let r = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[r.clamp(1, v.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn line(label: &str, v: &mut [Duration]) -> Duration {
    let p50 = pct(v, 50.0);
    println!(
        "{label:<44} n {:>3}  p50 {:>10}  p99 {:>10}",
        v.len(),
        ms(p50),
        ms(pct(v, 99.0))
    );
    p50
}

fn rebind(root: &Path, addr: &str, driver: &str) {
    gpupass::testkit::fixtures::point_driver(root, addr, driver).unwrap();
}

fn kubectl(kubectl: &Path, kubeconfig: &Path, cache: &Path, args: &[&str]) -> Duration {
    let t = Instant::now();
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache)
        .args(args)
        .output()
        .expect("run kubectl");
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

fn list_file(dir: &Path, inv: &gpupass::model::Inventory, node: &str, generation: i64) -> PathBuf {
    let s = slices::render(
        inv,
        &SliceOptions {
            node: node.into(),
            driver: DRIVER.into(),
            generation,
        },
    );
    let p = dir.join(format!("{node}-{generation}.json"));
    std::fs::write(&p, serde_json::to_vec(&slices::to_list_json(&s)).unwrap()).unwrap();
    p
}

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("host");
    gpupass::testkit::fixtures::synthetic(&root, 4096, 1000).unwrap();
    let host = HostRoot::new(&root);
    let inv = gpupass::inventory::scan(&host).unwrap();
    let devices = slices::devices(&inv);
    let opts = SliceOptions {
        node: "bench".into(),
        driver: DRIVER.into(),
        generation: 1,
    };
    let n_slices = slices::render(&inv, &opts).len();
    println!(
        "4096-function host: {} functions, {} devices published in {n_slices} slices; {rounds} rounds",
        inv.devices.len(),
        devices.len()
    );
    assert_eq!(devices.len(), 1000, "the generator's 1000 GPU groups");

    let (mut scan, mut render) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t0 = Instant::now();
        let i = gpupass::inventory::scan(&host).unwrap();
        scan.push(t0.elapsed());
        let t0 = Instant::now();
        let s = slices::render(&i, &opts);
        render.push(t0.elapsed());
        assert_eq!(s.len(), n_slices);
    }
    line("scan of the host (inventory)", &mut scan);
    line("render: decide + attributes + slices", &mut render);

    let (Some(kc), Some(kctl)) = (
        std::env::var_os("GPUPASS_BENCH_KUBECONFIG").map(PathBuf::from),
        std::env::var_os("GPUPASS_BENCH_KUBECTL").map(PathBuf::from),
    ) else {
        println!("(no GPUPASS_BENCH_KUBECONFIG/GPUPASS_BENCH_KUBECTL: publication not measured; benches/drapublish.sh sets them)");
        return;
    };
    let cache = t.path().join("kubectl-cache");
    let api = Kube::connect(Some(&kc), Duration::from_secs(60)).expect("connect to the API server");
    // One GPU whose driver changes between the two publications of a round.
    let gpu = inv.devices.iter().find(|d| d.is_gpu()).expect("a GPU").clone();
    let was = gpu.driver.clone().unwrap_or_else(|| "none".into());
    let addr = gpu.address.to_string();
    let other = if was == "nouveau" { "nvidia" } else { "nouveau" };
    rebind(&root, &addr, other);
    let changed = gpupass::inventory::scan(&host).unwrap();
    rebind(&root, &addr, &was);
    assert_ne!(
        slices::devices(&changed),
        devices,
        "the driver change changes the published devices"
    );

    let count = |node: &str| -> usize {
        let out = Command::new(&kctl)
            .arg("--kubeconfig")
            .arg(&kc)
            .args(["get", "resourceslices", "-o", "name", "--field-selector"])
            .arg(format!("spec.nodeName={node}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    let (mut gp_create, mut gp_replace, mut kc_create, mut kc_replace) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let (gp, kn) = (format!("bench-gp-{r}"), format!("bench-kc-{r}"));
        for n in [&gp, &kn] {
            let p = t.path().join(format!("{n}.node.json"));
            std::fs::write(
                &p,
                format!(r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{n}"}}}}"#),
            )
            .unwrap();
            kubectl(&kctl, &kc, &cache, &["create", "-f", p.to_str().unwrap()]);
        }
        let first = list_file(t.path(), &inv, &kn, 1);
        let second = list_file(t.path(), &changed, &kn, 2);
        let publisher = Publisher::new(api.clone(), gp.clone(), DRIVER.into());
        let run_gp = |i: &gpupass::model::Inventory, into: &mut Vec<Duration>| {
            let t0 = Instant::now();
            publisher.sync(&slices::pool(i)).expect("publish");
            into.push(t0.elapsed());
        };
        let kc_first = |into: &mut Vec<Duration>| {
            into.push(kubectl(
                &kctl,
                &kc,
                &cache,
                &["create", "-f", first.to_str().unwrap()],
            ))
        };
        let kc_second = |into: &mut Vec<Duration>| {
            into.push(kubectl(
                &kctl,
                &kc,
                &cache,
                &["replace", "-f", second.to_str().unwrap()],
            ))
        };
        if r % 2 == 0 {
            run_gp(&inv, &mut gp_create);
            kc_first(&mut kc_create);
            run_gp(&changed, &mut gp_replace);
            kc_second(&mut kc_replace);
        } else {
            kc_first(&mut kc_create);
            run_gp(&inv, &mut gp_create);
            kc_second(&mut kc_replace);
            run_gp(&changed, &mut gp_replace);
        }
        assert_eq!(count(&gp), n_slices, "gpupass published every slice of {gp}");
        assert_eq!(count(&kn), n_slices, "kubectl created every slice of {kn}");
        for n in [&gp, &kn] {
            kubectl(
                &kctl,
                &kc,
                &cache,
                &[
                    "delete",
                    "resourceslices",
                    "--field-selector",
                    &format!("spec.nodeName={n}"),
                ],
            );
            kubectl(&kctl, &kc, &cache, &["delete", "node", n]);
        }
    }
    let a = line("gpupass publish (list + 8 creates, kube-rs)", &mut gp_create);
    let b = line("kubectl create -f (same 8 slices)", &mut kc_create);
    let c = line("gpupass republish (list + 8 replaces)", &mut gp_replace);
    let d = line("kubectl replace -f (same 8 slices)", &mut kc_replace);
    println!(
        "ratio gpupass / kubectl (p50): publish {:.2}x, republish {:.2}x",
        a.as_secs_f64() / b.as_secs_f64(),
        c.as_secs_f64() / d.as_secs_f64()
    );
}
