//! `gpupass dra-plugin` (the kubelet DRA plugin, [`crate::containers::dra`]) and `gpupass dra
//! slices` (what this node publishes, and why each group is or is not published).

use super::ctx::{write_json, Ctx};
use super::error::{Error, Exit, Result};
use crate::containers::dra::{self, claim::Identity, prepare::Driver, prepare::PrepareError, slices, slots};
use crate::containers::kubelet::{api, binding, claims, plugin};
use crate::inventory::backend::Policy;
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The DRA driver name (DeviceClass selectors match it; a DNS subdomain)
    #[arg(long, default_value = dra::DEFAULT_DRIVER, value_parser = parse_driver)]
    pub driver: String,
    /// This node's name as Kubernetes knows it (the pool's name) [default: the hostname]
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node: Option<String>,
    /// The kubelet's plugin registration directory [default: ROOT/var/lib/kubelet/plugins_registry]
    #[arg(long, value_name = "DIR")]
    pub registry_dir: Option<PathBuf>,
    /// The plugin's directory (service socket, checkpoint, metadata files)
    /// [default: ROOT/var/lib/kubelet/plugins/DRIVER]
    #[arg(long, value_name = "DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// VFIO backend of a claim that does not choose one in its opaque config: auto
    /// (prefer-iommufd), legacy, iommufd (require-iommufd). docs/iommufd.md
    #[arg(long, value_enum, default_value_t = Policy::Auto)]
    pub backend: Policy,
    /// How often to re-read the host for device health, in milliseconds
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=10_000))]
    pub poll_ms: u64,
    /// Read ResourceClaims from this directory (<DIR>/<namespace>/<name>.json) instead of the
    /// API server (tests, nodes without one)
    #[arg(long, value_name = "DIR")]
    pub claims_dir: Option<PathBuf>,
    /// kubeconfig of the API server the plugin reads claims from and publishes this node's
    /// ResourceSlices to [default: KUBECONFIG, ~/.kube/config, or the Pod's service account]
    #[arg(long, value_name = "PATH", conflicts_with = "claims_dir")]
    pub kubeconfig: Option<PathBuf>,
    /// The longest one API server call may take, in seconds
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=120))]
    pub api_timeout_s: u64,
    /// Binding conditions (KEP-5007): publish groups that need a driver switch with them and
    /// bind such a group before its Pod is bound (docs/dra.md). auto: where the API server
    /// keeps them (a dry-run create says); on: always; off: never (Prepare binds, as before)
    #[arg(long, value_enum, default_value_t = BindingConditions::Auto)]
    pub binding_conditions: BindingConditions,
}

/// `--binding-conditions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BindingConditions {
    Auto,
    On,
    Off,
}

/// A DRA driver name: a DNS subdomain of at most 63 characters (`DriverNameMaxLength`).
fn parse_driver(s: &str) -> std::result::Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.split('.').all(|l| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "invalid DRA driver name {s:?}: a DNS subdomain of at most 63 characters (like {})",
            dra::DEFAULT_DRIVER
        ))
    }
}

fn node_name(ctx: &Ctx, given: Option<String>) -> Result<String> {
    given
        .or_else(|| dra::hostname(&ctx.host))
        .filter(|n| claims::valid_name(n))
        .ok_or_else(|| {
            Error::usage(anyhow::anyhow!(
                "cannot tell this node's name (proc/sys/kernel/hostname is unreadable or not a Kubernetes name); give --node NAME"
            ))
        })
}

pub(crate) fn run(ctx: &Ctx, args: Args, _out: &mut dyn Write) -> Result<Exit> {
    let ops = ctx.live("dra-plugin")?;
    let node = node_name(ctx, args.node)?;
    let boot_id = dra::boot_id(&ctx.host).map_err(|e| {
        Error::host(PrepareError::BootId {
            path: ctx.host.path("proc/sys/kernel/random/boot_id"),
            source: e,
        })
    })?;
    // The host first: a wrong --root must not leave sockets or directories behind.
    crate::inventory::scan(&ctx.host)?;
    // Claims from a directory (no API server, no slices published), or from the API server,
    // which also gets this node's ResourceSlices.
    let mut watch: Option<binding::Watch> = None;
    let (src, publisher): (Box<dyn claims::ClaimSource>, Option<api::Publisher>) = match args.claims_dir {
        Some(dir) => {
            if args.binding_conditions == BindingConditions::On {
                return Err(Error::usage(anyhow::anyhow!(
                    "--binding-conditions on needs the API server (claim status is written there); drop --claims-dir or use --binding-conditions off"
                )));
            }
            (Box::new(claims::Dir { dir }), None)
        }
        None => {
            let kube = api::Kube::connect(
                args.kubeconfig.as_deref(),
                std::time::Duration::from_secs(args.api_timeout_s),
            )
            .map_err(Error::usage)?;
            let w = binding::Watch {
                kube: kube.clone(),
                driver: args.driver.clone(),
                pool: node.clone(),
                conditions: dra::slices::conditions(),
            };
            let on = match args.binding_conditions {
                BindingConditions::Off => false,
                BindingConditions::On => true,
                BindingConditions::Auto => match binding::probe(&kube, &args.driver, &node, &w.conditions) {
                    Ok(kept) => {
                        tracing::info!(
                            "binding conditions: {} (the API server {} them on a dry-run ResourceSlice)",
                            if kept { "on" } else { "off" },
                            if kept { "keeps" } else { "drops" }
                        );
                        kept
                    }
                    Err(e) => {
                        tracing::warn!(
                            "binding conditions: off (cannot ask the API server whether it keeps them: {e}); --binding-conditions on forces them"
                        );
                        false
                    }
                },
            };
            if on {
                watch = Some(w);
            }
            (
                Box::new(api::Claims(kube.clone())),
                Some(api::Publisher::new(kube, node.clone(), args.driver.clone())),
            )
        }
    };
    let me = Identity {
        driver: args.driver.clone(),
        pool: node.clone(),
        node,
    };
    let mut engine = Driver::new(ops, me, args.backend, boot_id).map_err(Error::host)?;
    engine.binding_conditions = watch.is_some();
    let cfg = plugin::Config {
        pool: engine.me.pool.clone(),
        poll: std::time::Duration::from_millis(args.poll_ms),
        uevents: engine.ops.root().root() == std::path::Path::new("/"),
        ..sockets(ctx, &args.driver, args.registry_dir, args.plugin_dir)
    };
    plugin::run_with(
        engine,
        &cfg,
        src,
        publisher.map(|p| Box::new(p) as Box<dyn plugin::Publish>),
        watch,
        shutdown(),
    )
    .map_err(Error::host)?;
    Ok(Exit::SUCCESS)
}

/// SIGINT or SIGTERM.
async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum DraCommand {
    /// This node's ResourceSlices (a `kind: List` for kubectl apply), or with --explain why
    /// each IOMMU group is or is not published
    Slices(SlicesArgs),
    /// Whether the running `gpupass dra-plugin` of DRIVER answers: GetInfo on its registration
    /// socket (type, name, endpoint as the kubelet sees them), then a NodePrepareResources
    /// with no claims on its service socket (its worker takes calls; nothing changes). Exit 0
    /// when both answer, 1 otherwise (a liveness probe, deploy/helm/gpupass)
    Probe(ProbeArgs),
}

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// The DRA driver name the plugin serves
    #[arg(long, default_value = dra::DEFAULT_DRIVER, value_parser = parse_driver)]
    pub driver: String,
    /// The kubelet's plugin registration directory [default: ROOT/var/lib/kubelet/plugins_registry]
    #[arg(long, value_name = "DIR")]
    pub registry_dir: Option<PathBuf>,
    /// The plugin's directory [default: ROOT/var/lib/kubelet/plugins/DRIVER]
    #[arg(long, value_name = "DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// The longest each of the two calls may take, in seconds
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=120))]
    pub timeout_s: u64,
}

#[derive(Debug, clap::Args)]
pub struct SlicesArgs {
    /// The node (and pool) name [default: the hostname]
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node: Option<String>,
    /// The DRA driver name
    #[arg(long, default_value = dra::DEFAULT_DRIVER, value_parser = parse_driver)]
    pub driver: String,
    /// The pool's generation
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i64).range(0..))]
    pub generation: i64,
    /// Say, for each IOMMU group, the device it is published as or why it is not, and for each
    /// mdev type, how many slots it is published with or why none (a table; with --json, an
    /// array of the groups, then the types)
    #[arg(long)]
    pub explain: bool,
}

pub(crate) fn run_dra(ctx: &Ctx, cmd: DraCommand, out: &mut dyn Write) -> Result<Exit> {
    match cmd {
        DraCommand::Slices(a) => run_slices(ctx, a, out),
        DraCommand::Probe(a) => run_probe(ctx, a, out),
    }
}

/// Where the plugin of `driver` listens: the two directories given, else the kubelet's under
/// the root. The pool, poll and uevents are the server's to set.
fn sockets(
    ctx: &Ctx,
    driver: &str,
    registry_dir: Option<PathBuf>,
    plugin_dir: Option<PathBuf>,
) -> plugin::Config {
    plugin::Config {
        driver: driver.to_string(),
        pool: String::new(),
        registry_dir: registry_dir.unwrap_or_else(|| plugin::registry_dir(&ctx.host)),
        plugin_dir: plugin_dir.unwrap_or_else(|| ctx.host.path(&plugin::plugin_dir_logical(driver))),
        poll: std::time::Duration::from_millis(500),
        uevents: false,
        health_every: crate::containers::kubelet::plugin::HEALTH_EVERY,
    }
}

fn run_probe(ctx: &Ctx, args: ProbeArgs, out: &mut dyn Write) -> Result<Exit> {
    // The probe is a client of the two sockets: only where they are matters.
    let cfg = sockets(ctx, &args.driver, args.registry_dir, args.plugin_dir);
    let line =
        dra::probe::probe(&cfg, std::time::Duration::from_secs(args.timeout_s)).map_err(Error::host)?;
    writeln!(out, "{line}")?;
    Ok(Exit::SUCCESS)
}

fn run_slices(ctx: &Ctx, args: SlicesArgs, out: &mut dyn Write) -> Result<Exit> {
    let inv = ctx.inventory()?;
    if args.explain {
        let d = slices::decide(&inv);
        let (_, types) = slots::decide(&inv);
        if ctx.json {
            let mut all: Vec<serde_json::Value> = d.iter().map(|g| serde_json::json!(g)).collect();
            all.extend(types.iter().map(|t| serde_json::json!(t)));
            write_json(out, &all)?;
        } else {
            writeln!(out, "GROUP  DEVICE             MEMBERS")?;
            for g in &d {
                let members: Vec<String> = g.members.iter().map(|a| a.to_string()).collect();
                let group = g.group.map_or("-".to_string(), |n| n.to_string());
                let device = g.device.as_deref().unwrap_or("-");
                let line = format!("{group:<6} {device:<18} {}", members.join(","));
                writeln!(out, "{}", line.trim_end())?;
                if let Some(r) = &g.reason {
                    writeln!(out, "       not published: {r}")?;
                }
            }
            if !types.is_empty() {
                writeln!(out, "MDEV PARENT        TYPE               SLOTS")?;
                for ty in &types {
                    writeln!(out, "{:<18} {:<18} {}", ty.parent, ty.mdev_type, ty.slots)?;
                    if let Some(r) = &ty.reason {
                        let what = if ty.slots == 0 { "not published" } else { "note" };
                        writeln!(out, "       {what}: {r}")?;
                    }
                }
            }
        }
        return Ok(Exit::SUCCESS);
    }
    let node = node_name(ctx, args.node)?;
    let opts = slices::SliceOptions {
        node,
        driver: args.driver,
        generation: args.generation,
    };
    write_json(out, &slices::to_list_json(&slices::render(&inv, &opts)))?;
    Ok(Exit::SUCCESS)
}
