//! Changing the host: the one small trait every write goes through.
//!
//! [`RealHost`] writes sysfs files and runs `modprobe`. The command context (`cli::ctx`)
//! chooses the host operations once per process (the real host, or in a `testkit` build the
//! test kit's) and passes them to every command that changes the host; this module does not
//! know the test kit.
//!
//! The test machinery (the test kit) is compiled only with the `testkit` cargo
//! feature (on for `cargo test` and the QEMU lab's guest binary, never for `cargo build
//! --release`): the fake kernel over a fixture tree, and the write failpoints for crash tests.
//! A build without it changes nothing but the real host and ignores the test kit's
//! environment variables (it says so once on stderr when one is set).

use super::HostRoot;
use serde::{Deserialize, Serialize};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// How many directories a file's removal also removes once they are empty: 0 none, 1 its own
/// directory (mdevctl's `<parent>/`), 2 that one's parent too (a DRA claim's
/// `<ns>_<claim>/<request>/`). Journals written before levels existed hold `true` (1) or
/// nothing (0); both still read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Prune(pub u8);

impl Prune {
    pub(crate) fn is_none(&self) -> bool {
        self.0 == 0
    }
}

impl From<bool> for Prune {
    fn from(b: bool) -> Self {
        Prune(u8::from(b))
    }
}

impl From<u8> for Prune {
    fn from(n: u8) -> Self {
        Prune(n)
    }
}

impl<'de> Deserialize<'de> for Prune {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(bool),
            Levels(u8),
        }
        Ok(match Raw::deserialize(d)? {
            Raw::Flag(b) => Prune::from(b),
            Raw::Levels(n) => Prune(n),
        })
    }
}

/// Every change to the host goes through this trait.
pub trait HostOps: Send + Sync {
    fn root(&self) -> &HostRoot;
    /// Write `value` to an existing sysfs attribute (no create, no truncate semantics beyond
    /// what sysfs does).
    fn write(&self, path: &Path, value: &str) -> io::Result<()>;
    /// Load a kernel module (`modprobe NAME`).
    fn load_module(&self, name: &str) -> io::Result<()>;
    /// Writes done so far (path, value), for dry-run output and tests.
    fn writes(&self) -> Vec<(PathBuf, String)>;

    /// Called after a bind/unbind plan is made and before it is applied. Nothing on a real
    /// host; the test kit's fake kernel can run a shell command there so tests can change the
    /// host in that window (a device hot-plugged into the group).
    fn before_apply(&self) {}

    /// Create or replace a configuration file (not sysfs: `etc/mdevctl.d/...`) atomically: the
    /// content goes to a temporary file in the same directory, which is then renamed over
    /// `path`, so a crash leaves the old or the new file, never half of one. Directories are
    /// created as needed; the file gets mode 0644 like mdevctl's.
    fn write_file(&self, path: &Path, contents: &str) -> io::Result<()> {
        crate::host::write_atomic(path, contents.as_bytes())
    }

    /// Remove a configuration file; a missing file is not an error. Then up to `prune`
    /// directories above it, each once it is empty (the first that is not ends it).
    fn remove_file(&self, path: &Path, prune: Prune) -> io::Result<()> {
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut dir = path.parent();
        for _ in 0..prune.0 {
            match dir {
                // Fails (and is kept) when not empty.
                Some(d) if fs::remove_dir(d).is_ok() => dir = d.parent(),
                _ => break,
            }
        }
        Ok(())
    }
}

/// The running kernel.
#[derive(Debug)]
pub(crate) struct RealHost {
    root: HostRoot,
    log: Mutex<Vec<(PathBuf, String)>>,
}

impl RealHost {
    pub(crate) fn new(root: HostRoot) -> Self {
        RealHost {
            root,
            log: Mutex::new(Vec::new()),
        }
    }
}

impl HostOps for RealHost {
    fn root(&self) -> &HostRoot {
        &self.root
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        // `n`: this write's number among the ones done so far (1-based), for the log.
        let n = self.log.lock().unwrap_or_else(|e| e.into_inner()).len() + 1;
        tracing::debug!(path = %path.display(), value = %value.escape_debug(), n, "sysfs write");
        // sysfs takes one write(2) per attribute: open without truncation semantics mattering.
        let mut f = fs::OpenOptions::new().write(true).open(path)?;
        io::Write::write_all(&mut f, value.as_bytes())?;
        drop(f);
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((path.to_path_buf(), value.to_string()));
        Ok(())
    }

    fn load_module(&self, name: &str) -> io::Result<()> {
        if self.root.sys_module(&name.replace('-', "_")).exists() {
            return Ok(());
        }
        tracing::info!(module = name, "modprobe");
        let st = std::process::Command::new("modprobe").arg(name).status()?;
        if st.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("modprobe {name} failed ({st})")))
        }
    }

    fn writes(&self) -> Vec<(PathBuf, String)> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
