//! The command-line face of bind/unbind/recover/persist: clap arguments and output. `cli.rs`
//! only dispatches here.

use crate::bind::apply::{self, Applied};
use crate::bind::persist::{apply_persist, plan_persist};
use crate::bind::{facts, journal, BindError, BindRequest, UnbindRequest};
use crate::host::ops::HostOps;
use crate::host::HostRoot;
use crate::model::PciAddress;
use clap::Args;
use std::io::Write;

fn parse_driver(s: &str) -> Result<String, String> {
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

#[derive(Debug, Args)]
pub struct RecoverArgs {
    /// Finish the interrupted plan instead of restoring the state before it
    #[arg(long = "continue")]
    pub cont: bool,
    /// Say what would be done; change nothing
    #[arg(long)]
    pub dry_run: bool,
}

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

fn print_applied(out: &mut dyn Write, a: &Applied, dry_run: bool, json: bool) -> Result<(), BindError> {
    for w in &a.warnings {
        eprintln!("warning: {w}");
    }
    if json {
        let v = serde_json::json!({
            "plan": a.plan,
            "dry_run": dry_run,
            "applied": a.outcome.is_some(),
            "result": a.outcome.as_ref().map(|o| &o.lines),
        });
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::other)?;
        writeln!(out)?;
        return Ok(());
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
            eprintln!("warning: {w}");
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
fn announce(plan: &crate::bind::Plan) {
    for w in &plan.warnings {
        eprintln!("warning: {w}");
    }
}

/// `gpupass bind`.
pub fn run_bind(
    ops: &dyn HostOps,
    args: BindArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<i32, BindError> {
    let req = BindRequest {
        addresses: args.addresses,
        only: args.only,
        driver: args.driver,
    };
    let a = apply::bind(ops, &req, args.force, args.dry_run, &announce)?;
    print_applied(out, &a, args.dry_run, json)?;
    if args.dry_run && !a.plan.blocking(args.force).is_empty() {
        return Ok(1);
    }
    if let (false, Some(outcome)) = (args.dry_run, &a.outcome) {
        if !json {
            for g in &a.plan.groups {
                let b = if outcome.verified_viable.contains(g) {
                    Vec::new()
                } else {
                    apply::group_blockers(ops.root(), *g)
                };
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
    Ok(0)
}

/// `gpupass unbind`.
pub fn run_unbind(
    ops: &dyn HostOps,
    args: UnbindArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<i32, BindError> {
    let req = UnbindRequest {
        addresses: args.addresses,
        group: args.group,
        all: args.all,
        only: args.only,
    };
    let a = apply::unbind(ops, &req, false, args.dry_run, &announce)?;
    print_applied(out, &a, args.dry_run, json)?;
    if args.dry_run && !a.plan.blocking(false).is_empty() {
        return Ok(1);
    }
    Ok(0)
}

/// `gpupass recover`.
pub fn run_recover(
    ops: &dyn HostOps,
    args: RecoverArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<i32, BindError> {
    let lines = apply::recover(ops, args.cont, args.dry_run)?;
    if json {
        serde_json::to_writer_pretty(&mut *out, &serde_json::json!({ "result": lines }))
            .map_err(std::io::Error::other)?;
        writeln!(out)?;
    } else {
        for l in lines {
            writeln!(out, "{l}")?;
        }
        if args.dry_run {
            writeln!(out, "dry run: nothing was changed")?;
        }
    }
    Ok(0)
}

/// `gpupass persist`.
pub fn run_persist(
    host: &HostRoot,
    args: PersistArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<i32, BindError> {
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
        return Err(BindError::Refused(s));
    }
    if !args.dry_run {
        apply_persist(host, &p)?;
    }
    if json {
        serde_json::to_writer_pretty(
            &mut *out,
            &serde_json::json!({ "persist": p, "dry_run": args.dry_run }),
        )
        .map_err(std::io::Error::other)?;
        writeln!(out)?;
    } else {
        out.write_all(p.render(args.dry_run).as_bytes())?;
    }
    Ok(0)
}

/// Addresses in a message.
pub fn addrs(a: &[PciAddress]) -> String {
    a.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" ")
}

/// Warn on stderr about an unfinished plan (every command but the changing ones, which check
/// it themselves under the lock).
pub fn warn_unfinished(host: &HostRoot) {
    journal::warn_unfinished(host);
}
