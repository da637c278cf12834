//! `gpupass recover`: restore (or `--continue`) a bind/unbind or an mdev change a crash
//! interrupted, from the journal ([`crate::bind::apply::recover`], [`crate::mdev::plan::recover`]).

use super::bind::after_change;
use super::ctx::{write_json, Ctx};
use super::error::{Exit, Result};
use crate::bind::apply;
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

pub fn run(ctx: &Ctx, args: RecoverArgs, out: &mut dyn Write) -> Result<Exit> {
    let ops = ctx.live("recover")?;
    let mut r = apply::recover(ops, args.cont, args.dry_run)?;
    if !args.dry_run && !r.changed.is_empty() {
        after_change(ops.root(), &r.changed);
    }
    // The unfinished mdev plans (the same journal and lock).
    let m = crate::mdev::plan::recover(ops, args.cont, args.dry_run)?;
    if m.changed && !args.dry_run {
        super::mdev::after_change(ops.root());
    }
    r.lines.extend(m.lines);
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
