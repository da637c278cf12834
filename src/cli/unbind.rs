//! `gpupass unbind`: give functions on VFIO back to the drivers they had before.

use super::bind::{announce, print_applied};
use super::ctx::Ctx;
use super::error::{Exit, Result};
use crate::bind::apply;
use crate::bind::UnbindRequest;
use crate::containers::cdi::Refresh;
use crate::model::PciAddress;
use clap::Args;
use std::io::Write;

#[derive(Debug, Args)]
pub struct UnbindArgs {
    /// PCI addresses: every function of each one's IOMMU group on a VFIO driver goes back
    #[arg(required_unless_present_any = ["group", "all"])]
    pub addresses: Vec<PciAddress>,
    /// Every function of IOMMU group N on a VFIO driver
    #[arg(long, value_name = "N")]
    pub group: Option<u32>,
    /// Every function gpupass bound (from its journal)
    #[arg(long, conflicts_with_all = ["addresses", "group"])]
    pub all: bool,
    /// Only the named functions, not their group companions
    #[arg(long)]
    pub only: bool,
    /// Print the exact ordered sysfs writes and checks; change nothing
    #[arg(long)]
    pub dry_run: bool,
}

pub(crate) fn run(ctx: &Ctx, args: UnbindArgs, out: &mut dyn Write) -> Result<Exit> {
    let ops = ctx.live("unbind")?;
    let req = UnbindRequest {
        addresses: args.addresses,
        group: args.group,
        all: args.all,
        only: args.only,
    };
    let a = apply::unbind_then(ops, &req, false, args.dry_run, &announce, &mut Refresh)?;
    print_applied(out, &a, args.dry_run, ctx.json)?;
    if args.dry_run && !a.plan.blocking(false).is_empty() {
        return Ok(Exit::FAILURE);
    }
    Ok(Exit::SUCCESS)
}
