//! `gpupass persist`: keep a binding across reboots (driverctl overrides,
//! [`crate::bind::persist`]).

use super::bind::parse_driver;
use super::ctx::{write_json, Ctx};
use super::error::{Exit, Result};
use crate::bind::persist::{persist, Persisted};
use crate::bind::BindRequest;
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

/// `gpupass persist`: planned under the lock and applied through the change engine
/// ([`crate::bind::persist::persist`]); this prints it.
pub(crate) fn run(ctx: &Ctx, args: PersistArgs, out: &mut dyn Write) -> Result<Exit> {
    let ops = ctx.live("persist")?;
    let req = BindRequest {
        addresses: args.addresses,
        only: args.only,
        driver: args.driver,
    };
    let Persisted {
        persist: p,
        plan: change,
    } = persist(ops, &req, args.remove, args.dry_run)?;
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
