//! `gpupass mdev ...`: clap arguments, one domain call per subcommand ([`crate::mdev::apply`]
//! for the changes, [`crate::mdev::types`] and [`crate::mdev::list`] for the reads), the output.

use super::ctx::Ctx;
use super::error::{Exit, Result};
use crate::containers::cdi::Refresh;
use crate::mdev::apply::{self, Done};
use crate::mdev::types::{self, ParentKind};
use crate::mdev::{list, InstanceRef, MdevError, MdevUuid, OpenNodes};
use crate::messages;
use clap::Subcommand;
use serde_json::json;
use std::io::Write;
use std::str::FromStr;

/// One `--attr NAME=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr(pub String, pub String);

impl FromStr for Attr {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))?;
        if k.is_empty() || k.contains('/') || k == "." || k == ".." || k.contains('\0') {
            return Err(format!("{k:?} is not an attribute name"));
        }
        Ok(Attr(k.to_string(), v.to_string()))
    }
}

#[derive(Debug, Subcommand)]
pub enum MdevCommand {
    /// Types each parent offers: id, name, description, available instances, device API
    Types {
        /// Only this parent (name such as mbochs, or PCI address such as 01:00.0)
        #[arg(long, short = 'p')]
        parent: Option<String>,
    },
    /// Active instances (UUID or vGPU VF, parent, type, IOMMU group, /dev/vfio/N, in use), or
    /// with --defined the persistent definitions
    List {
        /// Persistent definitions (etc/mdevctl.d) instead of active instances
        #[arg(long, short = 'd')]
        defined: bool,
    },
    /// Create instances now (not persistent; see `define`); prints the UUIDs (or, for NVIDIA
    /// vendor-VFIO vGPU, the VF addresses)
    Create {
        /// Parent: name (mbochs) or PCI address (0000:01:00.0 or 01:00.0)
        #[arg(long, short = 'p')]
        parent: String,
        /// Type id (nvidia-222, mbochs-small; for NVIDIA vGPU the id 1044 or the name)
        #[arg(long = "type", short = 't')]
        ty: String,
        /// UUID of the instance (default: a random one)
        #[arg(long, short = 'u')]
        uuid: Option<MdevUuid>,
        /// How many instances
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
        count: u32,
        /// Attribute to write after creating, in order (repeatable)
        #[arg(long = "attr", value_name = "NAME=VALUE")]
        attrs: Vec<Attr>,
        /// Print the exact ordered writes and checks; change nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Remove an active instance (UUID, or the PCI address of an NVIDIA vGPU VF); refuses while
    /// a process holds it open
    Remove {
        instance: InstanceRef,
        /// Print the exact ordered writes and checks; change nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Define a persistent instance in mdevctl's format (etc/mdevctl.d/PARENT/UUID); with
    /// only --uuid, copies an active instance's parent and type
    Define {
        #[arg(long, short = 'p')]
        parent: Option<String>,
        #[arg(long = "type", short = 't')]
        ty: Option<String>,
        /// UUID (default: a random one)
        #[arg(long, short = 'u')]
        uuid: Option<MdevUuid>,
        /// Start it automatically when the parent appears (mdevctl's udev rule, or
        /// `gpupass mdev start --auto-all` from a boot unit)
        #[arg(long, short = 'a', conflicts_with = "manual")]
        auto: bool,
        /// Start it only on request (the default)
        #[arg(long)]
        manual: bool,
        /// Attribute to write after creating, in order (repeatable)
        #[arg(long = "attr", value_name = "NAME=VALUE")]
        attrs: Vec<Attr>,
        /// Define even though the parent is not present now (or lacks the type)
        #[arg(long)]
        force: bool,
        /// Print the exact file write; change nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete a persistent definition (an active instance keeps running)
    Undefine {
        uuid: MdevUuid,
        #[arg(long, short = 'p')]
        parent: Option<String>,
        /// Print the exact file removal; change nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Start a defined instance (or every `auto` one whose parent is present, with --auto-all)
    Start {
        #[arg(required_unless_present = "auto_all", conflicts_with = "auto_all")]
        uuid: Option<MdevUuid>,
        #[arg(long, short = 'p')]
        parent: Option<String>,
        /// Start every definition with start=auto whose parent is present and that is not
        /// running (for a boot unit)
        #[arg(long)]
        auto_all: bool,
        /// Print the exact ordered writes and checks; change nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Stop (remove) an active instance; its definition stays
    Stop {
        uuid: MdevUuid,
        /// Print the exact ordered writes and checks; change nothing
        #[arg(long)]
        dry_run: bool,
    },
}

fn json_out(out: &mut dyn Write, v: &serde_json::Value) -> std::result::Result<(), MdevError> {
    serde_json::to_writer_pretty(&mut *out, v).map_err(std::io::Error::other)?;
    writeln!(out)?;
    Ok(())
}

/// `--dry-run`: the plan (JSON with `--json`), and that nothing changed.
fn print_plan(
    out: &mut dyn Write,
    json: bool,
    plan: &crate::mdev::plan::MdevPlan,
) -> std::result::Result<(), MdevError> {
    if json {
        json_out(out, &plan.to_json())?;
    } else {
        out.write_all(plan.render().as_bytes())?;
        writeln!(out, "dry run: nothing was changed")?;
    }
    Ok(())
}

impl MdevCommand {
    /// A change that is not a dry run: it takes the lock and reads the journal under it.
    pub(crate) fn takes_lock(&self) -> bool {
        match self {
            MdevCommand::Types { .. } | MdevCommand::List { .. } => false,
            MdevCommand::Create { dry_run, .. }
            | MdevCommand::Remove { dry_run, .. }
            | MdevCommand::Define { dry_run, .. }
            | MdevCommand::Undefine { dry_run, .. }
            | MdevCommand::Start { dry_run, .. }
            | MdevCommand::Stop { dry_run, .. } => !dry_run,
        }
    }

    /// The subcommand as the user typed it, for messages (`mdev create`).
    fn name(&self) -> &'static str {
        match self {
            MdevCommand::Types { .. } => "mdev types",
            MdevCommand::List { .. } => "mdev list",
            MdevCommand::Create { .. } => "mdev create",
            MdevCommand::Remove { .. } => "mdev remove",
            MdevCommand::Define { .. } => "mdev define",
            MdevCommand::Undefine { .. } => "mdev undefine",
            MdevCommand::Start { .. } => "mdev start",
            MdevCommand::Stop { .. } => "mdev stop",
        }
    }
}

/// Run one `gpupass mdev` subcommand. The read subcommands work from `--from-json` too; the
/// others change the host and pass the live-host guard first.
pub(crate) fn run(ctx: &Ctx, cmd: MdevCommand, out: &mut dyn Write) -> Result<Exit> {
    exec(ctx, cmd, ctx.json, out)
}

/// A subcommand as a step of another command (`startup`): plain output whatever `--json` says.
pub(crate) fn run_plain(ctx: &Ctx, cmd: MdevCommand, out: &mut dyn Write) -> Result<Exit> {
    exec(ctx, cmd, false, out)
}

/// What a changing subcommand did, printed: its plan on a dry run.
fn dry<T>(out: &mut dyn Write, json: bool, done: Done<T>) -> std::result::Result<Option<T>, MdevError> {
    match done {
        Done::DryRun(plan) => {
            print_plan(out, json, &plan)?;
            Ok(None)
        }
        Done::Applied(t) => Ok(Some(t)),
    }
}

fn exec(ctx: &Ctx, cmd: MdevCommand, json: bool, out: &mut dyn Write) -> Result<Exit> {
    let host = &ctx.host;
    let live = ctx.from_json.is_none();
    let name = cmd.name();
    // The changes (`crate::mdev::apply`) take the one lock and read the host under it; after
    // a change of the active instances the CDI specs gpupass wrote are refreshed in the same
    // session (a failed refresh is a warning).
    match cmd {
        MdevCommand::Types { parent } => {
            let inv = ctx.inventory()?;
            let parents = types::parents(&inv);
            let shown = match parent {
                Some(p) => vec![types::resolve(&inv, &parents, &p)?],
                None => parents,
            };
            if json {
                json_out(out, &json!({ "parents": shown }))?;
            } else {
                out.write_all(types::render(&shown).as_bytes())?;
            }
            Ok(Exit::SUCCESS)
        }
        MdevCommand::List { defined } => {
            let inv = ctx.inventory()?;
            let parents = types::parents(&inv);
            let defs = if live { apply::read_defs(host) } else { Vec::new() };
            if defined {
                let rows = list::defined(&inv, &parents, &defs);
                if json {
                    json_out(out, &json!({ "defined": rows }))?;
                } else {
                    out.write_all(list::render_defined(&rows).as_bytes())?;
                }
            } else {
                let open = if live {
                    OpenNodes::scan(host)
                } else {
                    OpenNodes::default()
                };
                let facts = list::HostFacts {
                    root: host,
                    open: &open,
                    defs: &defs,
                };
                let rows = list::active(&inv, &facts);
                if json {
                    json_out(out, &json!({ "active": rows }))?;
                } else {
                    out.write_all(list::render_active(&rows, open.unreadable).as_bytes())?;
                }
            }
            Ok(Exit::SUCCESS)
        }
        MdevCommand::Create {
            parent,
            ty,
            uuid,
            count,
            attrs,
            dry_run,
        } => {
            let req = apply::CreateRequest {
                parent,
                ty,
                uuid,
                count,
                attrs: attrs.into_iter().map(|a| (a.0, a.1)).collect(),
            };
            let done = apply::create(ctx.live(name)?, &req, dry_run, &mut Refresh)?;
            let Some(c) = dry(out, json, done)? else {
                return Ok(Exit::SUCCESS);
            };
            if json {
                json_out(
                    out,
                    &json!({ "created": c.made, "parent": c.parent.name, "type": c.type_id, "kind": c.parent.kind }),
                )?;
            } else {
                for m in &c.made {
                    writeln!(out, "{m}")?;
                }
                if c.parent.kind == ParentKind::NvidiaVgpu {
                    messages::note(format_args!(
                        "NVIDIA vendor-VFIO vGPU: each line is an SR-IOV VF now carrying type {}; give the VF to a VM as a PCI device",
                        c.type_id
                    ));
                }
            }
            Ok(Exit::SUCCESS)
        }
        MdevCommand::Remove { instance, dry_run } => {
            let done = apply::remove(ctx.live(name)?, &instance, dry_run, &mut Refresh)?;
            let Some(r) = dry(out, json, done)? else {
                return Ok(Exit::SUCCESS);
            };
            if json {
                json_out(out, &json!({ "removed": r.name, "parent": r.parent }))?;
            } else {
                writeln!(out, "removed {} from {}", r.name, r.parent)?;
            }
            Ok(Exit::SUCCESS)
        }
        MdevCommand::Define {
            parent,
            ty,
            uuid,
            auto,
            manual: _,
            attrs,
            force,
            dry_run,
        } => {
            let req = apply::DefineRequest {
                parent,
                ty,
                uuid,
                auto,
                attrs: attrs.into_iter().map(|a| (a.0, a.1)).collect(),
                force,
            };
            let done = apply::define(ctx.live(name)?, req, dry_run)?;
            let Some(d) = dry(out, json, done)? else {
                return Ok(Exit::SUCCESS);
            };
            if json {
                json_out(out, &json!({ "defined": d }))?;
            } else {
                writeln!(out, "{}", d.uuid)?;
            }
            Ok(Exit::SUCCESS)
        }
        MdevCommand::Undefine {
            uuid,
            parent,
            dry_run,
        } => {
            let done = apply::undefine(ctx.live(name)?, &uuid, parent.as_deref(), dry_run)?;
            let Some(d) = dry(out, json, done)? else {
                return Ok(Exit::SUCCESS);
            };
            if json {
                json_out(out, &json!({ "undefined": d }))?;
            } else {
                writeln!(out, "undefined {} (parent {})", d.uuid, d.parent)?;
            }
            Ok(Exit::SUCCESS)
        }
        MdevCommand::Start {
            uuid,
            parent,
            auto_all,
            dry_run,
        } => {
            let s = apply::start(
                ctx.live(name)?,
                uuid.as_ref(),
                parent.as_deref(),
                auto_all,
                dry_run,
                &mut Refresh,
            )?;
            if dry_run {
                // One plan per definition: each is applied (and fails) on its own.
                if json {
                    let writes: usize = s.plans.iter().map(|p| p.write_count()).sum();
                    json_out(
                        out,
                        &json!({ "plan": s.plans.first(), "plans": s.plans, "writes": writes, "dry_run": true }),
                    )?;
                } else {
                    for p in &s.plans {
                        out.write_all(p.render().as_bytes())?;
                    }
                    for (d, e) in &s.failed {
                        writeln!(out, "FAILED {} ({} on {}): {e}", d.uuid, d.mdev_type, d.parent)?;
                    }
                    writeln!(out, "dry run: nothing was changed")?;
                }
                return Ok(Exit::failure_if(!s.failed.is_empty()));
            }
            if json {
                let f: Vec<_> = s
                    .failed
                    .iter()
                    .map(|(d, e)| json!({ "uuid": d.uuid, "parent": d.parent, "error": e }))
                    .collect();
                json_out(out, &json!({ "started": s.started, "failed": f }))?;
            } else {
                for d in &s.started {
                    writeln!(out, "started {} ({} on {})", d.uuid, d.mdev_type, d.parent)?;
                }
                for (d, e) in &s.failed {
                    writeln!(out, "FAILED {} ({} on {}): {e}", d.uuid, d.mdev_type, d.parent)?;
                }
                if auto_all && s.tried == 0 {
                    writeln!(
                        out,
                        "nothing to start (no auto definitions with a present parent that are not running)"
                    )?;
                }
            }
            Ok(Exit::failure_if(!s.failed.is_empty()))
        }
        MdevCommand::Stop { uuid, dry_run } => {
            let done = apply::stop(ctx.live(name)?, &uuid, dry_run, &mut Refresh)?;
            let Some(parent) = dry(out, json, done)? else {
                return Ok(Exit::SUCCESS);
            };
            if json {
                json_out(out, &json!({ "stopped": uuid.to_string(), "parent": parent }))?;
            } else {
                writeln!(out, "stopped {uuid} (parent {parent})")?;
            }
            Ok(Exit::SUCCESS)
        }
    }
}
