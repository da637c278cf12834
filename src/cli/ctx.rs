//! The command context: built once per process at the edge and handed to every command.
//!
//! This is where the host operations are chosen ([`host_ops_for_process`]): the real kernel,
//! or in a `testkit` build what the test kit's environment asks for (the fake kernel, the
//! failpoints). `host` knows nothing of the test kit; the choice is made here, above both.
//! Command modules take [`Ctx`], [`write_json`] and the error types from here and from
//! [`super::error`]; nothing in `cli/` but the dispatcher (`cli/mod.rs`) points at
//! `cli/mod.rs`'s clap tree (`completions` and `man` render it).

use super::error::{Error, Result};
use crate::host::ops::HostOps;
use crate::host::HostRoot;
use crate::inventory;
use crate::messages;
use crate::model::Inventory;
use std::io::Write;
use std::path::PathBuf;

/// Shared state of one invocation, built once from the global options and handed to every
/// command.
pub struct Ctx {
    /// Colour on stdout (from --color and whether stdout is a terminal).
    pub color: bool,
    pub host: HostRoot,
    /// Every change to the host goes through these, built once here for the whole invocation
    /// (the real kernel; in a `testkit` build, what the test kit's environment asks for).
    /// Commands get them through [`Ctx::live`], the one live-host guard.
    ops: Box<dyn HostOps>,
    pub from_json: Option<PathBuf>,
    pub json: bool,
}

impl Ctx {
    /// The context of this process: `host` with the host operations of [`host_ops_for_process`].
    pub(crate) fn new(host: HostRoot, color: bool, from_json: Option<PathBuf>, json: bool) -> Self {
        Ctx {
            color,
            ops: host_ops_for_process(host.clone()),
            host,
            from_json,
            json,
        }
    }

    /// The inventory: from the saved JSON if given, else read from the host. Its warnings
    /// (garbled attributes) are said once, here.
    pub(crate) fn inventory(&self) -> Result<Inventory> {
        let inv = match &self.from_json {
            Some(p) => inventory::load_json(p)?,
            None => inventory::scan(&self.host)?,
        };
        for w in &inv.warnings {
            messages::warn(w);
        }
        Ok(inv)
    }

    /// The one live-host guard: a command that reads the live host beyond the inventory, or
    /// changes it, calls this first and gets the host operations; under `--from-json` it is a
    /// usage error naming the command (`command` as the user typed it: `bind`, `mdev create`).
    pub(crate) fn live(&self, command: &str) -> Result<&dyn HostOps> {
        if self.from_json.is_some() {
            return Err(Error::usage(anyhow::anyhow!(
                "`gpupass {command}` works on the live host; it cannot run from --from-json (drop it)"
            )));
        }
        Ok(self.ops.as_ref())
    }
}

/// Pretty JSON and a newline: every `--json` output.
pub fn write_json<T: serde::Serialize>(out: &mut dyn Write, v: &T) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, v)?;
    writeln!(out)
}

/// The host operations of this process, chosen once here at the edge and passed to every
/// command that changes the host. With the `testkit` feature the test kit picks them from the
/// environment (fake kernel, failpoints); without it they are always the real host.
pub(crate) fn host_ops_for_process(root: HostRoot) -> Box<dyn HostOps> {
    #[cfg(feature = "testkit")]
    {
        crate::testkit::host_ops(root)
    }
    #[cfg(not(feature = "testkit"))]
    {
        warn_test_env();
        Box::new(crate::host::ops::RealHost::new(root))
    }
}

/// A build without the test kit acts on none of its variables; it says so once, when one is
/// set, so that a crash test pointed at this binary cannot pass by doing nothing. The
/// variables are found by their reserved prefixes: this build does not carry their names.
#[cfg(not(feature = "testkit"))]
fn warn_test_env() {
    const RESERVED: [&str; 3] = ["GPUPASS_FAKE_", "GPUPASS_FAIL_", "GPUPASS_CRASH_"];
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let set: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| RESERVED.iter().any(|p| k.starts_with(p)))
            .collect();
        if !set.is_empty() {
            messages::line(format_args!(
                "gpupass: warning: ignoring {}: this build has no test kit (cargo feature testkit)",
                set.join(", ")
            ));
        }
    });
}
