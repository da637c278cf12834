//! Failpoints in front of any host: the N-th write fails, or the process aborts right after
//! it. The writes counted are a plan's writes, the unit of its write count (`--dry-run
//! --json`'s `writes`) and of the journal's `step`s: sysfs writes (`write`) and file writes
//! and removals (`write_file`, `remove_file`); module loads pass straight through.

use crate::host::ops::HostOps;
use crate::host::HostRoot;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// `H` with failpoints.
#[derive(Debug)]
pub struct Failpoints<H> {
    inner: H,
    count: AtomicUsize,
    fail_at: Option<usize>,
    crash_after: Option<usize>,
    panic_after: Option<usize>,
    pause_before_apply: Option<Duration>,
}

impl<H: HostOps> Failpoints<H> {
    /// `inner` with no failpoint set.
    pub fn new(inner: H) -> Self {
        Failpoints {
            inner,
            count: AtomicUsize::new(0),
            fail_at: None,
            crash_after: None,
            panic_after: None,
            pause_before_apply: None,
        }
    }

    /// Fail the N-th write (1-based) with EIO; abort the process right after the M-th.
    pub fn at(mut self, fail_at: Option<usize>, crash_after: Option<usize>) -> Self {
        self.fail_at = fail_at;
        self.crash_after = crash_after;
        self
    }

    /// Sleep `pause` between a bind's or unbind's plan and its first write, with the lock held
    /// and nothing written yet (`GPUPASS_PAUSE_BEFORE_APPLY`): the window in which another
    /// gpupass (the DRA plugin's Prepare, the lab's race) meets the lock.
    pub fn pause_before_apply(mut self, pause: Option<Duration>) -> Self {
        self.pause_before_apply = pause;
        self
    }

    /// Fail the N-th write (1-based) with EIO.
    pub fn fail_at(mut self, n: usize) -> Self {
        self.fail_at = Some(n);
        self
    }

    /// Die right after the N-th write (1-based) by panicking: the in-process twin of
    /// `crash_after` for unit tests (`std::panic::catch_unwind`), which the test process
    /// survives. As the process's death would, the unwinding closes the lock's file; nothing
    /// after the write runs (no journal record, no rollback).
    pub fn panic_after(mut self, n: usize) -> Self {
        self.panic_after = Some(n);
        self
    }

    /// One counted write: fail it when it is the N-th, abort right after it when it is the
    /// M-th.
    fn counted(&self, write: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail_at == Some(n) {
            return Err(io::Error::other(format!(
                "injected failure at write {n} (GPUPASS_FAIL_WRITE)"
            )));
        }
        write()?;
        if self.crash_after == Some(n) {
            eprintln!("gpupass: GPUPASS_CRASH_AFTER_WRITE={n}: aborting now");
            std::process::abort();
        }
        if self.panic_after == Some(n) {
            panic!("crash after write {n}");
        }
        Ok(())
    }

    /// The host behind the failpoints.
    /// How many writes were counted so far.
    pub fn writes(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    pub fn inner(&self) -> &H {
        &self.inner
    }
}

impl<H: HostOps> HostOps for Failpoints<H> {
    fn root(&self) -> &HostRoot {
        self.inner.root()
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        self.counted(|| self.inner.write(path, value))
    }

    fn load_module(&self, name: &str) -> io::Result<()> {
        self.inner.load_module(name)
    }

    fn writes(&self) -> Vec<(PathBuf, String)> {
        self.inner.writes()
    }

    fn before_apply(&self) {
        if let Some(p) = self.pause_before_apply {
            eprintln!(
                "gpupass: GPUPASS_PAUSE_BEFORE_APPLY={}: holding the lock for {} s before the first write (pid {})",
                p.as_secs_f64(),
                p.as_secs_f64(),
                std::process::id()
            );
            std::thread::sleep(p);
            eprintln!("gpupass: GPUPASS_PAUSE_BEFORE_APPLY: applying now");
        }
        self.inner.before_apply()
    }

    fn write_file(&self, path: &Path, contents: &str) -> io::Result<()> {
        self.counted(|| self.inner.write_file(path, contents))
    }

    fn remove_file(&self, path: &Path, prune_dir: crate::change::Prune) -> io::Result<()> {
        self.counted(|| self.inner.remove_file(path, prune_dir))
    }
}
