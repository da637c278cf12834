//! `gpupass list`: GPUs and display devices, or every PCI function with `--all`.

use super::ctx::{write_json, Ctx};
use super::error::{Exit, Result};
use crate::output::table;
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Every PCI function, not only GPUs and display devices
    #[arg(long)]
    pub all: bool,
}

pub fn run(ctx: &Ctx, args: Args, out: &mut dyn Write) -> Result<Exit> {
    let mut inv = ctx.inventory()?;
    if ctx.json {
        // The listing is the inventory with the devices filtered: filter in place, no copy.
        if !args.all {
            inv.devices.retain(|d| d.is_gpu());
        }
        write_json(out, &inv)?;
    } else {
        let devices: Vec<_> = inv.devices.iter().filter(|d| args.all || d.is_gpu()).collect();
        out.write_all(table::list(&inv, &devices).as_bytes())?;
    }
    Ok(Exit::SUCCESS)
}
