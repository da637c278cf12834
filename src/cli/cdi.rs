//! `gpupass cdi generate`: CDI specs for podman, containerd, CRI-O and Docker
//! ([`crate::output::cdi`] renders them; this module writes, watches and reports).

use super::ctx::Ctx;
use super::error::{Error, Exit, Result};
use crate::change::engine::{Cause, Failure};
use crate::change::{self, ChangeError, Part, Plan};
use crate::host::ops::HostOps;
use crate::host::HostRoot;
use crate::messages;
use crate::output::cdi;
use anyhow::Context;
use clap::Subcommand;
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: CdiCommand,
}

#[derive(Debug, Subcommand)]
pub enum CdiCommand {
    /// Write a CDI spec: one device per VFIO group and per VFIO-bound function, one per
    /// active mdev, one per GPU on the native NVIDIA driver
    Generate {
        /// Write the spec to FILE (atomically) instead of standard output
        #[arg(long, value_name = "FILE", conflicts_with = "write")]
        output: Option<PathBuf>,
        /// Write it to ROOT/var/run/cdi (atomically) and keep it fresh on bind/unbind/mdev changes
        #[arg(long)]
        write: bool,
        /// With --write: keep running and rewrite the spec on every kernel uevent for a PCI
        /// function, VFIO node or mdev (changes made by other tools too: driverctl, virsh)
        #[arg(long, requires = "write")]
        watch: bool,
        /// With --write: print the exact file writes; change nothing
        #[arg(long, requires = "write", conflicts_with = "watch")]
        dry_run: bool,
        /// Pin cdiVersion (default: the lowest version the spec's fields need)
        #[arg(long, value_name = "V")]
        cdi_version: Option<crate::output::cdi::CdiVersion>,
        /// CDI kind, vendor/class
        #[arg(long, value_name = "K", default_value = crate::output::cdi::DEFAULT_KIND)]
        kind: crate::output::cdi::Kind,
        /// The host's /dev as the container runtime sees it (adds hostPath to device nodes)
        #[arg(long, value_name = "DIR", default_value = "/dev")]
        dev_root: String,
        /// The host's / as the container runtime sees it, for the driver's files
        #[arg(long, value_name = "DIR", default_value = "/")]
        driver_root: String,
        /// VFIO node set of each device: legacy (/dev/vfio/N + /dev/vfio/vfio), iommufd
        /// (/dev/vfio/devices/vfioN + /dev/iommu), auto (iommufd where the kernel serves the
        /// device through it, else legacy; devices both serve also get legacy-NAME and
        /// iommufd-NAME). docs/iommufd.md
        #[arg(long, value_enum, default_value_t = crate::inventory::backend::Policy::Auto)]
        backend: crate::inventory::backend::Policy,
    },
}

pub fn run(ctx: &Ctx, args: Args, out: &mut dyn Write) -> Result<Exit> {
    let CdiCommand::Generate {
        output,
        write,
        watch,
        dry_run,
        cdi_version,
        kind,
        dev_root,
        driver_root,
        backend,
    } = args.cmd;
    let opts = cdi::Options {
        kind,
        version: cdi_version,
        dev_root,
        driver_root,
        backend,
    };
    if !write {
        let inv = ctx.inventory()?;
        let files = crate::inventory::native::discover(&ctx.host);
        let r = cdi::render(&inv, &files, &opts)?;
        for w in &r.warnings {
            messages::warn(w);
        }
        let text = cdi::to_json(&r.spec);
        match output {
            Some(p) => cdi::write_atomic(&p, text.as_bytes())
                .map_err(|e| Error::from(e).context(format!("cannot write {}", p.display())))?,
            None => out.write_all(text.as_bytes())?,
        }
        return Ok(Exit::SUCCESS);
    }
    // Writing changes the host: through the change engine, planned under its lock.
    let ops = ctx.live("cdi generate --write")?;
    let session = if dry_run {
        None
    } else {
        Some(change::Session::lock(ops, change::journal::lock_timeout())?)
    };
    let host = ops.root();
    let inv = crate::inventory::scan(host)?;
    let files = crate::inventory::native::discover(host);
    let path = host.cdi_dynamic_dir().join(cdi::spec_file_name(&opts.kind));
    // --watch on a host with nothing to describe yet records the options (and removes a stale
    // spec), so the first refresh that has a device writes it.
    let (part, warnings) = match spec_part(host, &inv, &files, &opts, false) {
        Err(cdi::CdiError::Empty) if watch => spec_part(host, &inv, &files, &opts, true)?,
        r => r?,
    };
    for w in warnings {
        messages::warn(w);
    }
    let plan = Plan::of(part);
    let Some(mut session) = session else {
        if ctx.json {
            super::ctx::write_json(out, &plan.to_json())?;
        } else {
            out.write_all(plan.render().as_bytes())?;
            writeln!(out, "dry run: nothing was changed")?;
        }
        return Ok(Exit::SUCCESS);
    };
    session.apply(&plan).map_err(write_error)?;
    // The lock is released before --watch waits for uevents (each refresh takes it again).
    drop(session);
    if path.exists() {
        writeln!(out, "wrote {}", path.display())?;
    } else {
        writeln!(
            out,
            "nothing to describe yet; {} appears when a device is bound to VFIO",
            path.display()
        )?;
    }
    if watch {
        out.flush()?;
        let sock = crate::host::uevents::UeventSocket::open()
            .context("cannot subscribe to kernel uevents for --watch")?;
        while let Some(ev) = sock.next(None)? {
            match refresh(ops) {
                Ok(()) => writeln!(out, "refreshed {} after {}", path.display(), ev.line())?,
                Err(e) => messages::warn(format_args!("refresh after {} failed: {}", ev.line(), e)),
            }
            out.flush()?;
        }
    }
    Ok(Exit::SUCCESS)
}

/// A spec file the engine could not write, in `cdi generate --write`'s words (E-CDI-06).
fn write_error(e: ChangeError) -> Error {
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
pub fn spec_part(
    host: &HostRoot,
    inv: &crate::model::Inventory,
    files: &crate::inventory::native::DriverFiles,
    opts: &cdi::Options,
    empty_ok: bool,
) -> std::result::Result<(Part, Vec<String>), cdi::CdiError> {
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

/// The plan that regenerates every gpupass spec in `var/run/cdi` (or one gpupass removed
/// when nothing was left to describe) from the host as it is now: empty, without a scan,
/// when gpupass never wrote one.
pub fn refresh_plan(host: &HostRoot) -> std::result::Result<Plan, cdi::CdiError> {
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
        return Ok(plan);
    }
    let inv = crate::inventory::scan(host)?;
    let files = crate::inventory::native::discover(host);
    for opts in todo {
        let (part, _) = spec_part(host, &inv, &files, &opts, true)?;
        plan.push(part);
    }
    Ok(plan)
}

fn read_recorded(host: &HostRoot, spec_name: &str) -> Option<cdi::Recorded> {
    let p = cdi::options_file(host, spec_name);
    let t = crate::host::read_bounded(&p, 1 << 20).ok()?;
    serde_json::from_str(&t).ok()
}

/// Regenerate the gpupass specs after a change (bind, unbind, mdev, recover) or a uevent:
/// [`refresh_plan`] made under the lock and applied by the change engine (a spec already
/// right writes nothing; a host without a gpupass spec pays one directory listing).
pub fn refresh(ops: &dyn HostOps) -> std::result::Result<(), Error> {
    refresh_within(ops, change::journal::lock_timeout())
}

/// [`refresh`], waiting at most `wait` for the lock (the DRA plugin: what is left of the
/// kubelet's deadline).
pub fn refresh_within(ops: &dyn HostOps, wait: std::time::Duration) -> std::result::Result<(), Error> {
    let host = ops.root();
    // The common case, a host where gpupass never wrote a spec: two directory listings, no
    // lock.
    let spec = |n: &String| n.starts_with("gpupass") && n.ends_with(".json");
    let written = crate::host::dir_names(&host.cdi_dynamic_dir())
        .map(|n| n.iter().any(spec))
        .unwrap_or(false)
        || crate::host::dir_names(&host.gpupass_run_dir().join("cdi"))
            .map(|n| n.iter().any(|n| n.ends_with(".options.json")))
            .unwrap_or(false);
    if !written {
        return Ok(());
    }
    let mut s = change::Session::lock(ops, wait)?;
    let plan = refresh_plan(ops.root())?;
    s.apply(&plan).map_err(write_error)?;
    Ok(())
}
