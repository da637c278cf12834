//! `gpupass container list`: what a container needs from the host's native NVIDIA driver
//! ([`crate::inventory::native`]).

use super::ctx::{write_json, Ctx};
use super::error::{Exit, Result};
use crate::messages;
use crate::model::PciAddress;
use clap::Subcommand;
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: ContainerCommand,
}

#[derive(Debug, Subcommand)]
pub enum ContainerCommand {
    /// Device nodes, binaries, libraries and IPC sockets of the native NVIDIA driver, as
    /// found on the host (what `nvidia-container-cli list` prints)
    List {
        /// Only this GPU's device node (PCI address)
        #[arg(long, value_name = "ADDRESS")]
        device: Option<PciAddress>,
    },
}

pub(crate) fn run(ctx: &Ctx, args: Args, out: &mut dyn Write) -> Result<Exit> {
    let ContainerCommand::List { device } = args.cmd;
    let inv = ctx.inventory()?;
    let files = crate::inventory::native::discover(&ctx.host);
    for w in &files.warnings {
        messages::warn(w);
    }
    if ctx.json {
        write_json(
            out,
            &crate::inventory::native::list_json(&inv, &files, device.as_ref())?,
        )?;
    } else {
        out.write_all(crate::inventory::native::list_text(&inv, &files, device.as_ref())?.as_bytes())?;
    }
    Ok(Exit::SUCCESS)
}
