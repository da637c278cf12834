//! The one place the DRA plugin changes the host: [`apply`]. Everything else in
//! `containers::dra` decides; this function does, through the existing journaled engine of
//! [`crate::bind`] (lock, journal, re-check, verify, rollback, `gpupass recover`) for drivers
//! and [`crate::host::write_atomic`] for files.
//!
//! It is kept to one function over one small enum on purpose: the bind/mdev engine is being
//! reshaped into one change engine (plans of typed steps under one lock and journal, with file
//! writes as journaled steps, docs/ARCHITECTURE.md "Changes are plans..."); switching the DRA
//! plugin to it means rewriting this file only.

use crate::bind::apply as bind_apply;
use crate::bind::{BindRequest, UnbindRequest};
use crate::host::ops::HostOps;
use crate::model::PciAddress;

/// A change the plugin asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<'a> {
    /// Move every listed function (a whole IOMMU group) to its VFIO driver: `gpupass bind`.
    Bind(&'a [PciAddress]),
    /// Give the listed functions back to the drivers gpupass took them from: `gpupass unbind
    /// --only` of exactly these (never a function gpupass did not move).
    Restore(&'a [PciAddress]),
    /// Create or replace a file (host path, before the root) atomically.
    Write { path: &'a str, contents: &'a str },
    /// Remove a file; already absent is fine. Empty parent directories up to `stop_at` go too.
    Remove { path: &'a str, stop_at: Option<&'a str> },
}

/// Why a change failed: the engine's own message (a refusal names the holder and the fix).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Bind(#[from] crate::bind::BindError),
    #[error("cannot write {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot remove {path}")]
    Remove {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Make one change. Returns the functions whose driver changed.
pub fn apply(ops: &dyn HostOps, change: &Change<'_>) -> Result<Vec<PciAddress>, ApplyError> {
    let host = ops.root().clone();
    match change {
        Change::Bind(addrs) => {
            let req = BindRequest {
                addresses: addrs.to_vec(),
                only: false,
                driver: None,
            };
            let a = bind_apply::bind(ops, &req, false, false, &|_| {})?;
            Ok(changed(&a))
        }
        Change::Restore(addrs) => {
            if addrs.is_empty() {
                return Ok(Vec::new());
            }
            let req = UnbindRequest {
                addresses: addrs.to_vec(),
                group: None,
                all: false,
                only: true,
            };
            let a = bind_apply::unbind(ops, &req, false, false, &|_| {})?;
            Ok(changed(&a))
        }
        Change::Write { path, contents } => {
            let p = host.path(path);
            crate::host::write_atomic(&p, contents.as_bytes()).map_err(|e| ApplyError::Write {
                path: path.to_string(),
                source: e,
            })?;
            Ok(Vec::new())
        }
        Change::Remove { path, stop_at } => {
            let p = host.path(path);
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(ApplyError::Remove {
                        path: path.to_string(),
                        source: e,
                    })
                }
            }
            if let Some(stop) = stop_at {
                let stop = host.path(stop);
                let mut dir = p.parent().map(std::path::Path::to_path_buf);
                while let Some(d) = dir {
                    if d == stop || !d.starts_with(&stop) || std::fs::remove_dir(&d).is_err() {
                        break;
                    }
                    dir = d.parent().map(std::path::Path::to_path_buf);
                }
            }
            Ok(Vec::new())
        }
    }
}

fn changed(a: &bind_apply::Applied) -> Vec<PciAddress> {
    if a.outcome.is_none() {
        return Vec::new();
    }
    a.plan.functions.iter().map(|f| f.address).collect()
}
