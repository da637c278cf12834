//! `gpupass persist`: keep a binding across reboots (driverctl overrides,
//! [`crate::bind::persist`]).

use super::bind::parse_driver;
use super::ctx::{write_json, Ctx};
use super::error::{Exit, Result};
use crate::bind::persist::{apply_persist, plan_persist};
use crate::bind::{facts, journal, BindError, BindRequest};
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

/// `gpupass persist`.
pub fn run(ctx: &Ctx, args: PersistArgs, out: &mut dyn Write) -> Result<Exit> {
    let host = ctx.live("persist")?.root();
    let req = BindRequest {
        addresses: args.addresses,
        only: args.only,
        driver: args.driver,
    };
    let inv = crate::inventory::scan(host)?;
    let facts = facts::gather(host, &inv);
    let replay = journal::read(host)?;
    let p = plan_persist(&inv, &facts, &replay.bound, &req, args.remove);
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
    if !args.dry_run {
        apply_persist(host, &p)?;
    }
    if ctx.json {
        write_json(out, &serde_json::json!({ "persist": p, "dry_run": args.dry_run }))?;
    } else {
        out.write_all(p.render(args.dry_run).as_bytes())?;
    }
    Ok(Exit::SUCCESS)
}
