//! The test kit: machinery for tests and the QEMU lab, compiled only with the `testkit` cargo
//! feature. `cargo test` and `cargo bench` turn the feature on through the crate's self
//! dev-dependency (Cargo.toml); the lab's guest binary is built with `--features testkit`
//! (lab/lab.sh); `cargo build --release` has none of it (docs/testing.md, "The test kit").
//!
//! - [`FakeHost`], the fake kernel: a fixture tree that behaves like the kernel for the writes
//!   gpupass makes.
//! - [`Failpoints`], in front of any host: fail the N-th write, or abort the process right
//!   after it, for rollback and crash-recovery tests.
//! - [`host_ops`]: what the binary uses instead of the real host, from the environment:
//!   - `GPUPASS_FAKE_KERNEL=1`: the fake kernel, for a `--root` other than `/` only;
//!   - `GPUPASS_FAKE_BEFORE_APPLY=CMD`: the fake kernel runs `sh -c CMD` in the root between
//!     plan and apply;
//!   - `GPUPASS_FAIL_WRITE=N`: the N-th write (1-based) fails with EIO;
//!   - `GPUPASS_CRASH_AFTER_WRITE=N`: the process aborts right after the N-th successful
//!     write, as a power cut or `kill -9` would (on the real kernel too: the lab's crash
//!     tests).
//!   - `GPUPASS_PAUSE_BEFORE_APPLY=SECONDS`: a bind or unbind sleeps between its plan and its
//!     first write, holding the lock with nothing written (the lab's `clusterhelm` race of a
//!     host bind and a DRA Prepare).
//!
//! The fixture generators (`crate::testkit::hostgen`, `crate::testkit::fixtures`) are behind the same feature.

mod failpoints;
mod fake_kernel;
pub mod fixtures;
pub mod hostgen;

pub use failpoints::Failpoints;
pub use fake_kernel::FakeHost;

use crate::host::ops::{HostOps, RealHost};
use crate::host::HostRoot;
use std::path::Path;

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The host operations the binary uses in a test-kit build, from the environment (see the
/// module documentation). Without any of the variables: the real host, as in a release build.
pub fn host_ops(root: HostRoot) -> Box<dyn HostOps> {
    let fake = std::env::var("GPUPASS_FAKE_KERNEL").is_ok_and(|v| v == "1") && root.root() != Path::new("/");
    let fail_at = env_usize("GPUPASS_FAIL_WRITE");
    let crash_after = env_usize("GPUPASS_CRASH_AFTER_WRITE");
    let pause = std::env::var("GPUPASS_PAUSE_BEFORE_APPLY")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(|s| std::time::Duration::from_secs_f64(s.min(3600.0)));
    if fake {
        let host = FakeHost::new(root).before_apply(std::env::var("GPUPASS_FAKE_BEFORE_APPLY").ok());
        Box::new(
            Failpoints::new(host)
                .at(fail_at, crash_after)
                .pause_before_apply(pause),
        )
    } else {
        Box::new(
            Failpoints::new(RealHost::new(root))
                .at(fail_at, crash_after)
                .pause_before_apply(pause),
        )
    }
}
