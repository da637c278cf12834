//! Eight gpupass processes at once on one (fake-kernel) host: binding, unbinding and creating
//! and removing mdevs on overlapping IOMMU groups. Afterwards every group is wholly on one side
//! (all endpoints on VFIO or none), the journal has no unfinished transaction, the mdev
//! instances are consistent, and no process panicked or hung. The same on the real kernel is
//! lab/scenarios/concurrency.sh.

use crate::util::{driver, run_bounded, scratch_host};
use std::path::Path;

/// Functions the workers fight over, by group (qemu-lab: the capture of the lab's kernel).
const GROUPS: &[&[&str]] = &[
    &["0000:00:03.0"],
    &["0000:00:05.0", "0000:00:05.1"],
    &["0000:01:00.0"],
];
const WORKERS: usize = 8;
const ROUNDS: usize = 8;

fn gp(root: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut c = crate::util::fake_kernel(&[]);
    c.arg("--root").arg(root).args(args);
    c.env("GPUPASS_LOCK_TIMEOUT", "120");
    run_bounded(c, 180)
}

/// One worker's sequence: deterministic, different per worker, overlapping groups.
fn worker(root: &Path, w: usize) -> Vec<String> {
    let mut problems = Vec::new();
    let mut done = Vec::new();
    let mut made: Vec<String> = Vec::new();
    for round in 0..ROUNDS {
        let g = GROUPS[(w + round) % GROUPS.len()];
        let addr = g[0];
        let args: Vec<String> = match (w + round) % 4 {
            0 | 2 => vec!["bind".into(), addr.into()],
            1 => vec!["unbind".into(), addr.into()],
            _ => {
                if let Some(u) = made.pop() {
                    vec!["mdev".into(), "remove".into(), u]
                } else {
                    vec![
                        "mdev".into(),
                        "create".into(),
                        "-p".into(),
                        "mbochs".into(),
                        "-t".into(),
                        "mbochs-small".into(),
                    ]
                }
            }
        };
        let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let (code, out, err) = gp(root, &a);
        match code {
            Some(0) => {
                done.push(format!("ok {}", a[..2].join(" ")));
                if a[..2] == ["mdev", "create"] {
                    made.extend(
                        out.lines()
                            .map(|l| l.trim().to_string())
                            .filter(|l| !l.is_empty()),
                    );
                }
            }
            // A refusal is a legal outcome (e.g. no instances left); a panic or a crash is not.
            Some(1) if !err.contains("panicked") => {}
            other => problems.push(format!("worker {w} {a:?}: {other:?}\n{out}\n{err}")),
        }
    }
    for u in made {
        let (code, _, err) = gp(root, &["mdev", "remove", &u]);
        if code != Some(0) {
            problems.push(format!("worker {w}: removing its mdev {u}: {code:?} {err}"));
        }
    }
    problems.extend(done);
    problems
}

#[test]
fn eight_processes_leave_every_group_whole_and_the_journal_closed() {
    let t = scratch_host("qemu-lab");
    let root = t.path().to_path_buf();
    let mdevs_before = std::fs::read_dir(root.join("sys/bus/mdev/devices"))
        .map(|d| d.count())
        .unwrap_or(0);
    let problems: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..WORKERS)
            .map(|w| {
                let r = root.clone();
                s.spawn(move || worker(&r, w))
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let (done, problems): (Vec<String>, Vec<String>) =
        problems.into_iter().partition(|p| p.starts_with("ok "));
    assert!(problems.is_empty(), "{}", problems.join("\n---\n"));
    // The workers really did change the host (not 48 refusals).
    for what in ["ok bind", "ok unbind", "ok mdev create", "ok mdev remove"] {
        assert!(
            done.iter().any(|d| d.starts_with(what)),
            "no {what:?} succeeded: {done:?}"
        );
    }

    // Every group wholly on one side.
    for g in GROUPS {
        let on_vfio: Vec<bool> = g
            .iter()
            .map(|a| driver(&root, a).as_deref() == Some("vfio-pci"))
            .collect();
        assert!(
            on_vfio.iter().all(|v| *v) || on_vfio.iter().all(|v| !*v),
            "group {g:?} is split: {:?}",
            g.iter().map(|a| driver(&root, a)).collect::<Vec<_>>()
        );
    }
    // The journal has no unfinished transaction.
    let (code, out, err) = gp(&root, &["recover", "--dry-run"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("nothing to recover"), "{out}");
    // Every mdev a worker made was removed again, and the host reads consistently.
    let mdevs_after = std::fs::read_dir(root.join("sys/bus/mdev/devices"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(mdevs_after, mdevs_before, "mdev instances leaked");
    let (code, out, err) = gp(&root, &["mdev", "list", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    serde_json::from_str::<serde_json::Value>(&out).unwrap();
    let (code, _, err) = gp(&root, &["groups"]);
    assert_eq!(code, Some(0), "{err}");
    // And the groups can all be given back.
    for g in GROUPS {
        let (code, _, err) = gp(&root, &["unbind", g[0]]);
        assert_eq!(code, Some(0), "{err}");
        for a in *g {
            assert_ne!(driver(&root, a).as_deref(), Some("vfio-pci"), "{a}");
        }
    }
}
