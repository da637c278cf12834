//! `gpupass recover`: restore (or `--continue`) every change a crash interrupted (bind,
//! unbind, mdev, persist, CDI specs...), from the one journal ([`crate::change::recover`]).

use super::ctx::{write_json, Ctx};
use super::error::{Exit, Result};
use crate::change;
use crate::containers::cdi::Refresh;
use clap::Args;
use std::io::Write;

#[derive(Debug, Args)]
pub struct RecoverArgs {
    /// Finish the interrupted plan instead of restoring the state before it
    #[arg(long = "continue")]
    pub cont: bool,
    /// Say what would be done; change nothing
    #[arg(long)]
    pub dry_run: bool,
}

pub(crate) fn run(ctx: &Ctx, args: RecoverArgs, out: &mut dyn Write) -> Result<Exit> {
    let ops = ctx.live("recover")?;
    // What it changed, the CDI specs follow in the same session.
    let r = change::recover_then(ops, args.cont, args.dry_run, &mut Refresh)?;
    if ctx.json {
        write_json(out, &serde_json::json!({ "result": r.lines }))?;
    } else {
        for l in r.lines {
            writeln!(out, "{l}")?;
        }
        if args.dry_run {
            writeln!(out, "dry run: nothing was changed")?;
        }
    }
    Ok(Exit::SUCCESS)
}
