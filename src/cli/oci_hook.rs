//! `gpupass oci-hook`: the OCI runtime hook ([`crate::containers::oci_hook`]). The state comes
//! on stdin; every line on stderr starts `gpupass oci-hook:`, since a runtime's log shows the
//! hook's words among others; the exit status is the hook's (2 for malformed input, else 1).

use super::ctx::Ctx;
use super::error::{Error, Exit, Result};
use crate::containers::oci_hook;
use crate::messages;
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(ctx: &Ctx, _args: Args, _out: &mut dyn Write) -> Result<Exit> {
    let ops = ctx.live("oci-hook")?;
    let rep = oci_hook::bounded_stdin()
        .and_then(|s| oci_hook::run(ops, &s))
        .map_err(|e| Error::with_status(e.exit_code() as u8, e).prefixed("gpupass oci-hook"))?;
    for n in rep.notes {
        messages::line(format_args!("gpupass oci-hook: note: {n}"));
    }
    Ok(Exit::SUCCESS)
}
