//! `gpupass persist`: keep a binding across reboots (driverctl overrides,
//! [`crate::bind::persist`]).

use super::bind::parse_driver;
use super::ctx::{write_json, Ctx};
use super::error::{Exit, Result};
use crate::bind::persist::plan_persist;
use crate::bind::{facts, BindError, BindRequest};
use crate::change::{journal, Session};
use crate::model::PciAddress;
use clap::Args;
use std::io::Write;

#[derive(Debug, Args)]
pub struct PersistArgs {
    /// PCI addresses (each one's group, as `bind` selects it)
    #[arg(required = true, num_args = 1..)]
    pub addresses: Vec<PciAddress>,
    /// Remove the driverctl overrides instead
    #[arg(long)]
    pub remove: bool,
    /// Only the named functions
    #[arg(long)]
    pub only: bool,
    /// VFIO driver to persist (default: as `bind` would choose)
    #[arg(long, value_name = "NAME", value_parser = parse_driver)]
    pub driver: Option<String>,
    /// Print what would be written; change nothing
    #[arg(long)]
    pub dry_run: bool,
}

/// `gpupass persist`: plan under the lock, then apply the file writes through the change
/// engine (journaled; `recover` restores them after a crash).
pub fn run(ctx: &Ctx, args: PersistArgs, out: &mut dyn Write) -> Result<Exit> {
    let ops = ctx.live("persist")?;
    let host = ops.root();
    let req = BindRequest {
        addresses: args.addresses,
        only: args.only,
        driver: args.driver,
    };
    let mut session = if args.dry_run {
        None
    } else {
        Some(Session::lock(ops, crate::change::journal::lock_timeout()).map_err(BindError::from)?)
    };
    let inv = crate::inventory::scan(host)?;
    let facts = facts::gather(host, &inv);
    let bound = match &session {
        Some(s) => s.replay().bound.clone(),
        None => journal::read(host).map_err(BindError::from)?.bound,
    };
    let p = plan_persist(&inv, &facts, &bound, &req, args.remove);
    if !p.refusals.is_empty() {
        let mut s = format!(
            "refusing to persist ({} problem{}):",
            p.refusals.len(),
            if p.refusals.len() == 1 { "" } else { "s" }
        );
        for r in &p.refusals {
            s.push_str(&format!("\n  {}: {}\n    fix: {}", r.address, r.reason, r.fix));
        }
        return Err(BindError::Refused(s).into());
    }
    let change = p.to_change(host);
    if let Some(s) = session.as_mut() {
        s.apply(&change).map_err(BindError::from)?;
    }
    if ctx.json {
        write_json(
            out,
            &serde_json::json!({
                "persist": p,
                "dry_run": args.dry_run,
                "plan": change,
                "writes": change.write_count(),
            }),
        )?;
    } else {
        out.write_all(p.render(args.dry_run).as_bytes())?;
        if args.dry_run {
            out.write_all(change.render().as_bytes())?;
            writeln!(out, "dry run: nothing was changed")?;
        }
    }
    Ok(Exit::SUCCESS)
}
