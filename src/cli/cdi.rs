//! `gpupass cdi generate`: CDI specs for podman, containerd, CRI-O and Docker
//! ([`crate::output::cdi`] renders them, [`crate::containers::cdi`] writes and refreshes them
//! through the change engine; this module parses, watches uevents and reports).

use super::ctx::Ctx;
use super::error::{Error, Exit, Result};
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

pub(crate) fn run(ctx: &Ctx, args: Args, out: &mut dyn Write) -> Result<Exit> {
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
    let w = crate::containers::cdi::write(ops, &opts, watch, dry_run)?;
    if dry_run {
        if ctx.json {
            super::ctx::write_json(out, &w.plan.to_json())?;
        } else {
            out.write_all(w.plan.render().as_bytes())?;
            writeln!(out, "dry run: nothing was changed")?;
        }
        return Ok(Exit::SUCCESS);
    }
    let path = w.path;
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
            match crate::containers::cdi::refresh(ops) {
                Ok(()) => writeln!(out, "refreshed {} after {}", path.display(), ev.line())?,
                Err(e) => messages::warn(format_args!(
                    "refresh after {} failed: {}",
                    ev.line(),
                    crate::model::ErrorChain(&e)
                )),
            }
            out.flush()?;
        }
    }
    Ok(Exit::SUCCESS)
}
