//! `gpupass completions SHELL`: a completion script generated from the command definitions.

use super::ctx::Ctx;
use super::error::{Exit, Result};
use super::Cli;
use std::io::Write;

/// Shells `gpupass completions` writes scripts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    pub shell: Shell,
}

pub fn run(_ctx: &Ctx, args: Args, out: &mut dyn Write) -> Result<Exit> {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let sh = match args.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(sh, &mut cmd, "gpupass", out);
    Ok(Exit::SUCCESS)
}
