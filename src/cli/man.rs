//! `gpupass man`: the man page (roff) generated from the command definitions.

use super::ctx::Ctx;
use super::error::{Exit, Result};
use super::Cli;
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_ctx: &Ctx, _args: Args, out: &mut dyn Write) -> Result<Exit> {
    use clap::CommandFactory;
    clap_mangen::Man::new(Cli::command()).render(out)?;
    Ok(Exit::SUCCESS)
}
