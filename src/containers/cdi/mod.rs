//! The CDI specs gpupass writes into `var/run/cdi` as changes of the one engine: `cdi generate
//! --write` ([`write`]) and the refresh that keeps them true after every change of drivers or
//! mdev instances ([`refresh_in`], [`Refresh`]). The spec itself is rendered by the pure
//! [`crate::output::cdi`]; this module plans its files (content before read from the host, a
//! file already as wanted adds no step) and hands them to the engine, so they are journaled
//! and `gpupass recover` restores them.
//!
//! The refresh after a change runs in the change's own session, with its lock still held
//! ([`Followup`]): it is planned from the host as the change's writes left it (the DRA
//! plugin hands over the view it scanned after them, [`refresh_in`]'s `view`) and applied
//! as a transaction of its own, after the change committed: a spec that cannot be written is
//! a warning, the change stands.

use crate::change::engine::{Cause, Failure, Followup};
use crate::change::{self, ChangeError, Part, Plan, Session};
use crate::host::ops::HostOps;
use crate::host::HostRoot;
use crate::inventory::native::DriverFiles;
use crate::messages;
use crate::model::{ErrorChain, Inventory};
use crate::output::cdi;
use std::path::PathBuf;

/// Why a CDI spec could not be planned or written: the renderer's, the reader's or the
/// engine's own message (E-CDI-*; a spec file the engine could not write is E-CDI-06,
/// [`cdi::CdiError::Write`]).
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error(transparent)]
    Spec(#[from] cdi::CdiError),
    #[error(transparent)]
    Change(#[from] ChangeError),
}

impl SpecError {
    /// A usage error (exit status 2): a `--cdi-version` too low for the spec.
    pub(crate) fn is_usage(&self) -> bool {
        matches!(self, SpecError::Spec(e) if e.is_usage())
    }
}

/// The engine's error, a spec file it could not write in `cdi generate --write`'s words
/// (E-CDI-06).
fn write_error(e: ChangeError) -> SpecError {
    match e {
        ChangeError::Failed(f) => match f.cause {
            Cause::WriteFile { path, source } | Cause::RemoveFile { path, source } => cdi::CdiError::Write {
                path: path.into(),
                source,
            }
            .into(),
            cause => ChangeError::Failed(Box::new(Failure { cause, ..*f })).into(),
        },
        e => e.into(),
    }
}

/// The part of a plan that writes the spec of `opts` into `var/run/cdi` (and the record of
/// its options beside gpupass's state, for the refresh): each a file object, so the engine
/// writes it atomically, journals it and `recover` restores it. With `empty_ok`, a spec with
/// nothing to describe is removed and its record marked emptied, so the next refresh that
/// has a device writes it. Files already as wanted add no step.
pub(crate) fn spec_part(
    host: &HostRoot,
    inv: &Inventory,
    files: &DriverFiles,
    opts: &cdi::Options,
    empty_ok: bool,
) -> Result<(Part, Vec<String>), cdi::CdiError> {
    let name = cdi::spec_file_name(&opts.kind);
    let spec = change::logical(host, &host.cdi_dynamic_dir().join(&name));
    let rec = change::logical(host, &cdi::options_file(host, &name));
    let mut part = Part::new("cdi", format!("cdi spec {spec}"));
    let record = |emptied| {
        cdi::Recorded {
            options: opts.clone(),
            emptied,
        }
        .to_json()
    };
    match cdi::render(inv, files, opts) {
        Ok(r) => {
            part.file(host, &spec, Some(cdi::to_json(&r.spec)), false);
            part.file(host, &rec, Some(record(false)), false);
            Ok((part, r.warnings))
        }
        Err(cdi::CdiError::Empty) if empty_ok => {
            part.file(host, &spec, None, false);
            part.file(host, &rec, Some(record(true)), false);
            Ok((part, Vec::new()))
        }
        Err(e) => Err(e),
    }
}

/// What `cdi generate --write` planned (and, unless a dry run, applied).
#[derive(Debug)]
pub(crate) struct Written {
    pub plan: Plan,
    /// The spec's path under the root.
    pub path: PathBuf,
}

/// `cdi generate --write`: the spec of `opts` planned under the engine's lock from a scan of
/// the host and applied (with `dry_run`, planned without the lock and not applied); the
/// renderer's warnings are said before anything is written. With
/// `keep_empty` (`--watch`), a host with nothing to describe yet records the options (and
/// removes a stale spec), so the first refresh that has a device writes it. The lock is
/// released on return (`--watch` refreshes with [`refresh`], each time under it again).
pub(crate) fn write(
    ops: &dyn HostOps,
    opts: &cdi::Options,
    keep_empty: bool,
    dry_run: bool,
) -> Result<Written, SpecError> {
    let session = if dry_run {
        None
    } else {
        Some(Session::lock(ops, change::journal::lock_timeout())?)
    };
    let host = ops.root();
    let inv = crate::inventory::scan(host).map_err(cdi::CdiError::from)?;
    let files = crate::inventory::native::discover(host);
    let path = host.cdi_dynamic_dir().join(cdi::spec_file_name(&opts.kind));
    let (part, warnings) = match spec_part(host, &inv, &files, opts, false) {
        Err(cdi::CdiError::Empty) if keep_empty => spec_part(host, &inv, &files, opts, true)?,
        r => r?,
    };
    for w in warnings {
        messages::warn(w);
    }
    let plan = Plan::of(part);
    if let Some(mut session) = session {
        session.apply(&plan).map_err(write_error)?;
    }
    Ok(Written { plan, path })
}

/// The plan that regenerates every gpupass spec in `var/run/cdi` (or one gpupass removed
/// when nothing was left to describe) from the host as it is now, or from `view` (the
/// inventory a caller scanned after its writes): empty, without a scan, when gpupass never
/// wrote one. With it, the inventory it read (when it had to: a spec to plan and no `view`).
pub(crate) fn refresh_plan(
    host: &HostRoot,
    view: Option<&Inventory>,
) -> Result<(Plan, Option<Inventory>), cdi::CdiError> {
    let dir = host.cdi_dynamic_dir();
    let mut todo: Vec<cdi::Options> = Vec::new();
    let names = crate::host::dir_names(&dir).map_err(|e| cdi::CdiError::Read {
        path: host.display(&dir).into(),
        reason: e.to_string(),
    })?;
    for n in names
        .iter()
        .filter(|n| n.starts_with("gpupass") && n.ends_with(".json"))
    {
        let opts = match read_recorded(host, n) {
            Some(r) => r.options,
            None => {
                // A spec without its record: keep its kind and version.
                let p = dir.join(n);
                let bad = |reason: String| cdi::CdiError::Read {
                    path: host.display(&p).into(),
                    reason,
                };
                let text = crate::host::read_bounded(&p, 64 << 20).map_err(|e| bad(e.to_string()))?;
                let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
                let kind = v["kind"]
                    .as_str()
                    .and_then(|k| k.parse().ok())
                    .unwrap_or_default();
                cdi::Options {
                    kind,
                    ..cdi::Options::default()
                }
            }
        };
        todo.push(opts);
    }
    let odir = host.gpupass_run_dir().join("cdi");
    for n in crate::host::dir_names(&odir).unwrap_or_default() {
        let Some(spec_name) = n.strip_suffix(".options.json") else {
            continue;
        };
        if names.iter().any(|t| t == spec_name) {
            continue;
        }
        if let Some(r) = read_recorded(host, spec_name).filter(|r| r.emptied) {
            todo.push(r.options);
        }
    }
    let mut plan = Plan::default();
    if todo.is_empty() {
        return Ok((plan, None));
    }
    let mut scanned = None;
    let inv: &Inventory = match view {
        Some(v) => v,
        None => scanned.insert(crate::inventory::scan(host)?),
    };
    let files = crate::inventory::native::discover(host);
    for opts in todo {
        let (part, _) = spec_part(host, inv, &files, &opts, true)?;
        plan.push(part);
    }
    Ok((plan, scanned))
}

fn read_recorded(host: &HostRoot, spec_name: &str) -> Option<cdi::Recorded> {
    let p = cdi::options_file(host, spec_name);
    let t = crate::host::read_bounded(&p, 1 << 20).ok()?;
    serde_json::from_str(&t).ok()
}

/// Whether gpupass wrote a spec here (or recorded one it removed): two directory listings.
/// A host where it never did pays only these, no lock and no scan.
fn written(host: &HostRoot) -> bool {
    let spec = |n: &String| n.starts_with("gpupass") && n.ends_with(".json");
    crate::host::dir_names(&host.cdi_dynamic_dir())
        .map(|n| n.iter().any(spec))
        .unwrap_or(false)
        || crate::host::dir_names(&host.gpupass_run_dir().join("cdi"))
            .map(|n| n.iter().any(|n| n.ends_with(".options.json")))
            .unwrap_or(false)
}

/// Regenerate the gpupass specs in `session` (its lock held: after a change, in the change's
/// session), planned from `view` when the caller has the host as its writes left it, else
/// from a scan, and applied as a transaction of its own (a spec already right writes
/// nothing; a host without a gpupass spec pays two directory listings). Returns that scan
/// when it made one, for a caller that hands the host on (the DRA driver: to its health and
/// publication), so the host is read once after a change.
pub(crate) fn refresh_in(
    session: &mut Session<'_>,
    view: Option<&Inventory>,
) -> Result<Option<Inventory>, SpecError> {
    let host = session.ops().root().clone();
    if !written(&host) {
        return Ok(None);
    }
    let (plan, scanned) = refresh_plan(&host, view)?;
    session.apply(&plan).map_err(write_error)?;
    Ok(scanned)
}

/// Regenerate the gpupass specs on their own (`cdi generate --watch` after a uevent):
/// [`refresh_in`] under the lock, waited for as the commands wait
/// ([`journal::lock_timeout`](change::journal::lock_timeout)); no lock when gpupass never
/// wrote a spec.
pub fn refresh(ops: &dyn HostOps) -> Result<(), SpecError> {
    if !written(ops.root()) {
        return Ok(());
    }
    let mut s = Session::lock(ops, change::journal::lock_timeout())?;
    refresh_in(&mut s, None).map(drop)
}

/// The refresh as the follow-up of a command's change ([`Followup`]): `gpupass bind`,
/// `unbind`, `recover` and the mdev changes refresh the specs in their own session before
/// they release the lock. The change has already succeeded then, so a failed refresh is a
/// warning naming what changed and the command that writes the spec again.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Refresh;

impl Followup for Refresh {
    fn follow(&mut self, session: &mut Session<'_>, changed: &str) {
        if let Err(e) = refresh_in(session, None) {
            messages::warn(format_args!(
                "{changed} changed but the CDI spec could not be refreshed: {}; run `gpupass cdi generate --write`",
                ErrorChain(&e)
            ));
        }
    }
}

#[cfg(test)]
mod tests;
