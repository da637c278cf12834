//! `gpupass check`: host readiness for passthrough ([`crate::inventory::readiness`]). Exit
//! status 1 when passthrough cannot work.

use super::ctx::{write_json, Ctx};
use super::error::{Exit, Result};
use crate::output::table;
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(ctx: &Ctx, _args: Args, out: &mut dyn Write) -> Result<Exit> {
    // Reads the kernel's command line, modules and device nodes, which no saved inventory has.
    ctx.live("check")?;
    let inv = ctx.inventory()?;
    let r = crate::inventory::readiness::assess(&ctx.host, &inv);
    if ctx.json {
        write_json(out, &r)?;
    } else {
        out.write_all(table::check(&r, ctx.color).as_bytes())?;
    }
    Ok(Exit::failure_if(!r.ready))
}
