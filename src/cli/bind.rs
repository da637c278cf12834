//! `gpupass bind`: move functions and their IOMMU-group companions to a VFIO driver
//! ([`crate::bind`] plans and applies; this module owns the arguments and the output). The
//! other commands of the family are `unbind`, `recover` and `persist`, each its own module.

use super::ctx::{write_json, Ctx};
use super::error::{Exit, Result};
use crate::bind::apply::{self, Applied};
use crate::bind::BindRequest;
use crate::containers::cdi::Refresh;
use crate::messages;
use crate::model::PciAddress;
use clap::Args;
use std::io::Write;

pub(crate) fn parse_driver(s: &str) -> std::result::Result<String, String> {
    if crate::bind::valid_driver_name(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "invalid driver name {s:?}: letters, digits, '_' and '-' only (like vfio-pci or mlx5_vfio_pci)"
        ))
    }
}

#[derive(Debug, Args)]
pub struct BindArgs {
    /// PCI addresses (0000:01:00.0 or 01:00.0); every endpoint function of each one's IOMMU
    /// group is bound (bridges are left alone)
    #[arg(required = true, num_args = 1..)]
    pub addresses: Vec<PciAddress>,
    /// Bind only the named functions (the group is then not viable; gpupass says which
    /// members block it)
    #[arg(long)]
    pub only: bool,
    /// VFIO driver to use instead of the automatic choice (a VFIO variant driver when the kernel
    /// offers one for the device, else vfio-pci)
    #[arg(long, value_name = "NAME", value_parser = parse_driver)]
    pub driver: Option<String>,
    /// Override refusals where that is sane (boot VGA with a console, mounted filesystems, up
    /// network interfaces, open DRM nodes, GPUs in use through NVIDIA's driver)
    #[arg(long)]
    pub force: bool,
    /// Print the exact ordered sysfs writes and checks; change nothing
    #[arg(long)]
    pub dry_run: bool,
}

pub(crate) fn print_applied(
    out: &mut dyn Write,
    a: &Applied,
    dry_run: bool,
    json: bool,
) -> std::io::Result<()> {
    for w in &a.warnings {
        messages::warn(w);
    }
    if json {
        let v = serde_json::json!({
            "plan": a.plan,
            "dry_run": dry_run,
            "applied": a.outcome.is_some(),
            "result": a.outcome.as_ref().map(|o| &o.lines),
        });
        return write_json(out, &v);
    }
    if dry_run {
        out.write_all(a.plan.render().as_bytes())?;
        if !a.plan.blocking(false).is_empty() {
            writeln!(out, "{}", a.plan.refusal_text(false))?;
        }
        writeln!(out, "dry run: nothing was changed")?;
        return Ok(());
    }
    // Warnings (--only viability, forced refusals) were said by `announce`, before the change.
    if a.outcome.is_none() {
        for w in &a.plan.warnings {
            messages::warn(w);
        }
    }
    for n in &a.plan.notes {
        writeln!(out, "{n}")?;
    }
    if let Some(o) = &a.outcome {
        for l in &o.lines {
            writeln!(out, "{l}")?;
        }
    }
    Ok(())
}

/// Said on stderr after the plan passed its refusals and before anything changes.
pub(crate) fn announce(plan: &crate::bind::Plan) {
    for w in &plan.warnings {
        messages::warn(w);
    }
}

pub(crate) fn run(ctx: &Ctx, args: BindArgs, out: &mut dyn Write) -> Result<Exit> {
    bind(ctx, args, ctx.json, out)
}

/// `bind` as a step of another command (`startup`): plain output whatever `--json` says.
pub(crate) fn run_plain(ctx: &Ctx, args: BindArgs, out: &mut dyn Write) -> Result<Exit> {
    bind(ctx, args, false, out)
}

fn bind(ctx: &Ctx, args: BindArgs, json: bool, out: &mut dyn Write) -> Result<Exit> {
    let ops = ctx.live("bind")?;
    let req = BindRequest {
        addresses: args.addresses,
        only: args.only,
        driver: args.driver,
    };
    // After the bind, in its session: the CDI specs gpupass wrote are refreshed (a failed
    // refresh is a warning).
    let a = apply::bind_then(ops, &req, args.force, args.dry_run, &announce, &mut Refresh)?;
    print_applied(out, &a, args.dry_run, json)?;
    if args.dry_run && !a.plan.blocking(args.force).is_empty() {
        return Ok(Exit::FAILURE);
    }
    if let (false, Some(outcome)) = (args.dry_run, &a.outcome) {
        if !json {
            for (g, b) in &outcome.viability {
                if b.is_empty() {
                    writeln!(out, "IOMMU group {g} is viable: /dev/vfio/{g}")?;
                } else {
                    writeln!(
                        out,
                        "IOMMU group {g} is not viable: {} on host drivers",
                        b.join(", ")
                    )?;
                }
            }
        }
    }
    Ok(Exit::SUCCESS)
}

/// Addresses in a message.
pub(crate) fn addrs(a: &[PciAddress]) -> String {
    a.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" ")
}
