//! `gpupass mdev ...`: clap arguments and the dispatch of each subcommand.

use super::ctx::Ctx;
use super::error::{Exit, Result};
use crate::host::ops::HostOps;
use crate::host::HostRoot;
use crate::mdev::defs::{self, Definition, StartMode};
use crate::mdev::types::{self, ParentKind};
use crate::mdev::{list, ops, InstanceRef, MdevError, MdevUuid, OpenNodes};
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

fn read_defs(host: &HostRoot) -> Vec<Definition> {
    let (d, warnings) = defs::read_all(host);
    for w in warnings {
        messages::warn(w);
    }
    d
}

fn resolve_type<'a>(
    parent: &'a types::Parent,
    ty: &str,
) -> std::result::Result<&'a types::TypeInfo, MdevError> {
    parent.find_type(ty).ok_or_else(|| {
        // NVIDIA vGPU catalogs shrink with capacity: an empty one means "used up".
        if parent.kind == ParentKind::NvidiaVgpu && parent.types.is_empty() {
            MdevError::NoAvailable {
                parent: parent.name.clone(),
                ty: ty.to_string(),
                available: 0,
                wanted: 1,
            }
        } else {
            MdevError::UnknownType {
                parent: parent.name.clone(),
                ty: ty.to_string(),
                valid: parent.type_ids(),
            }
        }
    })
}

impl MdevCommand {
    /// Whether the subcommand only prints its plan (`--dry-run`).
    fn dry_run(&self) -> bool {
        match self {
            MdevCommand::Types { .. } | MdevCommand::List { .. } => false,
            MdevCommand::Create { dry_run, .. }
            | MdevCommand::Remove { dry_run, .. }
            | MdevCommand::Define { dry_run, .. }
            | MdevCommand::Undefine { dry_run, .. }
            | MdevCommand::Start { dry_run, .. }
            | MdevCommand::Stop { dry_run, .. } => *dry_run,
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

/// After every change to the set of active instances (create, remove, start, stop), once per
/// command: CDI specs list mdev instances and their VFIO nodes, so the specs gpupass wrote are
/// regenerated (`cli::cdi::refresh`: a plan of file writes applied by the change engine, no
/// step when no gpupass spec exists). The change itself succeeded, so a failed refresh is a
/// warning.
pub fn after_change(ops: &dyn HostOps) {
    if let Err(e) = super::cdi::refresh(ops) {
        messages::warn(format_args!(
            "mdev instances changed but the CDI spec could not be refreshed: {e}; run `gpupass cdi generate --write`"
        ));
    }
}

/// The session a change took in [`exec`].
fn locked<'s, 'a>(session: &'s mut Option<crate::change::Session<'a>>) -> &'s mut crate::change::Session<'a> {
    session
        .as_mut()
        .expect("a change that is not a dry run holds the lock")
}

/// Run one `gpupass mdev` subcommand. The read subcommands work from `--from-json` too; the
/// others change the host and pass the live-host guard first.
pub fn run(ctx: &Ctx, cmd: MdevCommand, out: &mut dyn Write) -> Result<Exit> {
    exec(ctx, cmd, ctx.json, out)
}

/// A subcommand as a step of another command (`startup`): plain output whatever `--json` says.
pub fn run_plain(ctx: &Ctx, cmd: MdevCommand, out: &mut dyn Write) -> Result<Exit> {
    exec(ctx, cmd, false, out)
}

fn exec(ctx: &Ctx, cmd: MdevCommand, json: bool, out: &mut dyn Write) -> Result<Exit> {
    let host = &ctx.host;
    let live = ctx.from_json.is_none();
    let mutating = !matches!(cmd, MdevCommand::Types { .. } | MdevCommand::List { .. });
    let name = cmd.name();
    if mutating {
        ctx.live(name)?;
    }
    // A change takes the one lock before it reads anything: the parent's available instances,
    // the active instances, the definitions and the open files it plans from cannot change
    // under it (two `define`s of one UUID, or two creates on the last free instance, are
    // serialized, and the second is planned from what the first left). Released before the
    // CDI refresh, which is a plan of its own. A dry run reads without it.
    let mut session = if mutating && !cmd.dry_run() {
        Some(crate::change::Session::lock(
            ctx.live(name)?,
            crate::change::journal::lock_timeout(),
        )?)
    } else {
        None
    };
    // A change reads only what mdev plans and checks look at; `types` and `list` read all.
    let inv = if mutating {
        use crate::inventory::MdevScope;
        let scope = match &cmd {
            MdevCommand::Create { parent, .. } => MdevScope::Parent(parent),
            MdevCommand::Define { parent: Some(p), .. } => MdevScope::Parent(p),
            MdevCommand::Remove {
                instance: InstanceRef::Uuid(_),
                ..
            }
            | MdevCommand::Stop { .. }
            | MdevCommand::Undefine { .. } => MdevScope::Instances,
            _ => MdevScope::All,
        };
        ctx.mdev_inventory(name, scope)?
    } else {
        ctx.inventory()?
    };
    tracing::debug!(
        devices = inv.devices.len(),
        mdevs = inv.mdevs.len(),
        "inventory read"
    );
    let parents = types::parents(&inv);
    match cmd {
        MdevCommand::Types { parent } => {
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
            let defs = if live { read_defs(host) } else { Vec::new() };
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
            if uuid.is_some() && count > 1 {
                return Err(MdevError::Usage(
                    "--uuid names one instance; drop it to create --count N".into(),
                )
                .into());
            }
            let p = types::resolve(&inv, &parents, &parent)?;
            if p.kind == ParentKind::NvidiaVgpu && (uuid.is_some() || !attrs.is_empty()) {
                return Err(MdevError::Usage(format!(
                    "{} is an NVIDIA vendor-VFIO vGPU parent: its instances are SR-IOV VFs named by PCI address and take no --uuid or --attr",
                    p.name
                )).into());
            }
            let t = resolve_type(&p, &ty)?;
            let attrs: Vec<(String, String)> = attrs.into_iter().map(|a| (a.0, a.1)).collect();
            let (plan, made) = ops::plan_create(host, name, &inv, &p, t, uuid.as_slice(), count, &attrs)?;
            if dry_run {
                print_plan(out, json, &plan)?;
                return Ok(Exit::SUCCESS);
            }
            crate::mdev::plan::execute_in(locked(&mut session), &plan)?;
            tracing::debug!("applied");
            drop(session.take());
            after_change(ctx.live(name)?);
            tracing::debug!("CDI refresh done");
            if json {
                json_out(
                    out,
                    &json!({ "created": made, "parent": p.name, "type": t.t.id, "kind": p.kind }),
                )?;
            } else {
                for m in &made {
                    writeln!(out, "{m}")?;
                }
                if p.kind == ParentKind::NvidiaVgpu {
                    messages::note(format_args!(
                        "NVIDIA vendor-VFIO vGPU: each line is an SR-IOV VF now carrying type {}; give the VF to a VM as a PCI device",
                        t.t.id
                    ));
                }
            }
            Ok(Exit::SUCCESS)
        }
        MdevCommand::Remove { instance, dry_run } => {
            let open = OpenNodes::scan(host);
            tracing::debug!(holders = open.holders.len(), "open files read");
            let (plan, parent) = match &instance {
                InstanceRef::Uuid(u) => ops::plan_remove_mdev(host, &inv, &open, u, name)?,
                InstanceRef::Vf(a) => ops::plan_remove_vgpu(host, &inv, &open, a)?,
            };
            if dry_run {
                print_plan(out, json, &plan)?;
                return Ok(Exit::SUCCESS);
            }
            crate::mdev::plan::execute_in(locked(&mut session), &plan)?;
            tracing::debug!("applied");
            drop(session.take());
            after_change(ctx.live(name)?);
            tracing::debug!("CDI refresh done");
            let name = match &instance {
                InstanceRef::Uuid(u) => u.to_string(),
                InstanceRef::Vf(a) => a.to_string(),
            };
            if json {
                json_out(out, &json!({ "removed": name, "parent": parent }))?;
            } else {
                writeln!(out, "removed {name} from {parent}")?;
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
            let defs = read_defs(host);
            let uuid = match uuid {
                Some(u) => u,
                None => MdevUuid::random()?,
            };
            if let Some(d) = defs.iter().find(|d| d.uuid == uuid.as_str()) {
                return Err(MdevError::AlreadyDefined {
                    uuid: uuid.to_string(),
                    parent: d.parent.clone(),
                    path: host.display(&defs::path_of(host, &d.parent, &d.uuid)),
                }
                .into());
            }
            // With only --uuid: take parent and type from the running instance.
            let (parent, ty) = match (parent, ty) {
                (Some(p), Some(t)) => (p, t),
                (None, None) => {
                    let m = inv.mdev(uuid.as_str()).ok_or_else(|| {
                        MdevError::Usage(format!(
                            "define needs --parent and --type (or --uuid of an active mdev; {uuid} is not active)"
                        ))
                    })?;
                    (m.parent.clone(), m.type_id.clone().unwrap_or_default())
                }
                _ => return Err(MdevError::Usage("define needs both --parent and --type".into()).into()),
            };
            let parent_name = match types::resolve(&inv, &parents, &parent) {
                Ok(p) => {
                    if p.kind == ParentKind::NvidiaVgpu {
                        return Err(MdevError::Usage(format!(
                            "{} is an NVIDIA vendor-VFIO vGPU parent; mdevctl-format definitions describe mdev devices only (create the vGPU with `gpupass mdev create`)",
                            p.name
                        )).into());
                    }
                    if !force {
                        resolve_type(&p, &ty)?;
                    }
                    p.name
                }
                // A parent that appears later: keep the name as given, in full PCI form.
                Err(MdevError::UnknownParent { .. }) if force => parent
                    .parse::<crate::model::PciAddress>()
                    .map(|a| a.to_string())
                    .unwrap_or(parent),
                Err(MdevError::UnknownParent {
                    input,
                    suggestion,
                    known,
                    ..
                }) => {
                    return Err(MdevError::UnknownParent {
                        input,
                        suggestion,
                        known,
                        hint: Some(" (add --force to define it for a parent that appears later)"),
                    }
                    .into())
                }
                Err(e) => return Err(e.into()),
            };
            if parent_name.contains('/') || parent_name.starts_with('.') || parent_name == "scripts.d" {
                return Err(MdevError::Usage(format!("{parent_name:?} is not a parent name")).into());
            }
            let d = Definition {
                uuid: uuid.to_string(),
                parent: parent_name,
                mdev_type: ty,
                start: if auto { StartMode::Auto } else { StartMode::Manual },
                attrs: attrs.into_iter().map(|a| (a.0, a.1)).collect(),
            };
            let plan = crate::mdev::plan::MdevPlan::of(defs::define_part(host, &d));
            if dry_run {
                print_plan(out, json, &plan)?;
                return Ok(Exit::SUCCESS);
            }
            crate::mdev::plan::execute_in(locked(&mut session), &plan)?;
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
            let defs = read_defs(host);
            let d = defs::find(&defs, &uuid, parent.as_deref())?.clone();
            let plan = crate::mdev::plan::MdevPlan::of(defs::undefine_part(host, &d));
            if dry_run {
                print_plan(out, json, &plan)?;
                return Ok(Exit::SUCCESS);
            }
            crate::mdev::plan::execute_in(locked(&mut session), &plan)?;
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
            let defs = read_defs(host);
            let todo: Vec<Definition> = if auto_all {
                defs.iter()
                    .filter(|d| d.start == StartMode::Auto)
                    .filter(|d| parents.iter().any(|p| p.name == d.parent))
                    .filter(|d| inv.mdev(&d.uuid).is_none())
                    .cloned()
                    .collect()
            } else {
                let u = uuid.ok_or_else(|| MdevError::Usage("start needs a UUID or --auto-all".into()))?;
                let d = defs::find(&defs, &u, parent.as_deref())?.clone();
                if let Some(m) = inv.mdev(&d.uuid) {
                    return Err(MdevError::AlreadyActive {
                        uuid: d.uuid.clone(),
                        parent: m.parent.clone(),
                    }
                    .into());
                }
                vec![d]
            };
            let mut started = Vec::new();
            let mut failed = Vec::new();
            let mut plans = Vec::new();
            for d in &todo {
                let r = (|| {
                    let p = types::resolve(&inv, &parents, &d.parent).map_err(|_| MdevError::ParentGone {
                        parent: d.parent.clone(),
                        uuid: d.uuid.clone(),
                    })?;
                    let t = resolve_type(&p, &d.mdev_type)?;
                    let u: MdevUuid = d.uuid.parse().map_err(MdevError::Usage)?;
                    let (plan, _) = ops::plan_create(host, name, &inv, &p, t, &[u], 1, &d.attrs)?;
                    if dry_run {
                        plans.push(plan);
                        return Ok(());
                    }
                    crate::mdev::plan::execute_in(locked(&mut session), &plan)
                })();
                match r {
                    Ok(_) => started.push(d.clone()),
                    Err(e) if !auto_all => return Err(e.into()),
                    Err(e) => failed.push((d.clone(), crate::model::ErrorChain(&e).to_string())),
                }
            }
            if dry_run {
                // One plan per definition: each is applied (and fails) on its own.
                if json {
                    let writes: usize = plans.iter().map(|p| p.write_count()).sum();
                    json_out(
                        out,
                        &json!({ "plan": plans.first(), "plans": plans, "writes": writes, "dry_run": true }),
                    )?;
                } else {
                    for p in &plans {
                        out.write_all(p.render().as_bytes())?;
                    }
                    for (d, e) in &failed {
                        writeln!(out, "FAILED {} ({} on {}): {e}", d.uuid, d.mdev_type, d.parent)?;
                    }
                    writeln!(out, "dry run: nothing was changed")?;
                }
                return Ok(Exit::failure_if(!failed.is_empty()));
            }
            if !started.is_empty() {
                drop(session.take());
                after_change(ctx.live(name)?);
            }
            if json {
                let f: Vec<_> = failed
                    .iter()
                    .map(|(d, e)| json!({ "uuid": d.uuid, "parent": d.parent, "error": e }))
                    .collect();
                json_out(out, &json!({ "started": started, "failed": f }))?;
            } else {
                for d in &started {
                    writeln!(out, "started {} ({} on {})", d.uuid, d.mdev_type, d.parent)?;
                }
                for (d, e) in &failed {
                    writeln!(out, "FAILED {} ({} on {}): {e}", d.uuid, d.mdev_type, d.parent)?;
                }
                if auto_all && todo.is_empty() {
                    writeln!(
                        out,
                        "nothing to start (no auto definitions with a present parent that are not running)"
                    )?;
                }
            }
            Ok(Exit::failure_if(!failed.is_empty()))
        }
        MdevCommand::Stop { uuid, dry_run } => {
            let open = OpenNodes::scan(host);
            let (plan, parent) = ops::plan_remove_mdev(host, &inv, &open, &uuid, name)?;
            if dry_run {
                print_plan(out, json, &plan)?;
                return Ok(Exit::SUCCESS);
            }
            crate::mdev::plan::execute_in(locked(&mut session), &plan)?;
            tracing::debug!("applied");
            drop(session.take());
            after_change(ctx.live(name)?);
            tracing::debug!("CDI refresh done");
            if json {
                json_out(out, &json!({ "stopped": uuid.to_string(), "parent": parent }))?;
            } else {
                writeln!(out, "stopped {uuid} (parent {parent})")?;
            }
            Ok(Exit::SUCCESS)
        }
    }
}
