//! `gpupass snapshot OUT`: copy the host subset gpupass reads ([`crate::inventory::snapshot`]).

use super::ctx::Ctx;
use super::error::{Error, Exit, Result};
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// New or empty directory
    pub out: PathBuf,
}

pub fn run(ctx: &Ctx, args: Args, out: &mut dyn Write) -> Result<Exit> {
    let dir = args.out;
    let rep = crate::inventory::snapshot::snapshot(&ctx.host, &dir)
        .map_err(|e| Error::from(e).context(format!("snapshot of {} failed", ctx.host.root().display())))?;
    writeln!(
        out,
        "wrote {} files for {} PCI functions to {} (replay with: gpupass --root {} list --all)",
        rep.files,
        rep.devices,
        dir.display(),
        dir.display()
    )?;
    Ok(Exit::SUCCESS)
}
