//! `gpupass device-plugin`: the kubelet device plugin ([`crate::containers::deviceplugin`]).

use super::ctx::Ctx;
use super::error::{Exit, Result};
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory of kubelet.sock and the plugin sockets [default: ROOT/var/lib/kubelet/device-plugins]
    #[arg(long, value_name = "DIR")]
    pub socket_dir: Option<PathBuf>,
    /// How often to check device health and the kubelet socket, in milliseconds
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=10_000))]
    pub poll_ms: u64,
    /// Name CDI devices in Allocate replies: auto (when a gpupass spec exists in
    /// /var/run/cdi or /etc/cdi), always, never, only (the CDI names alone: the runtime makes
    /// every edit from the spec; refused while there is no spec)
    #[arg(long, value_enum, default_value_t = crate::containers::deviceplugin::CdiMode::Auto)]
    pub cdi: crate::containers::deviceplugin::CdiMode,
    /// CDI kind of those names
    #[arg(long, default_value = crate::output::cdi::DEFAULT_KIND)]
    pub cdi_kind: crate::output::cdi::Kind,
    /// VFIO node set of each allocated function: legacy (/dev/vfio/N + /dev/vfio/vfio),
    /// iommufd (/dev/vfio/devices/vfioN + /dev/iommu), auto (iommufd where the kernel serves
    /// the function through it, else legacy). docs/iommufd.md
    #[arg(long, value_enum, default_value_t = crate::inventory::backend::Policy::Auto)]
    pub backend: crate::inventory::backend::Policy,
}

pub(crate) fn run(ctx: &Ctx, args: Args, _out: &mut dyn Write) -> Result<Exit> {
    ctx.live("device-plugin")?;
    let cfg = crate::containers::deviceplugin::Config {
        host: ctx.host.clone(),
        socket_dir: args
            .socket_dir
            .unwrap_or_else(|| ctx.host.kubelet_device_plugins()),
        poll: std::time::Duration::from_millis(args.poll_ms),
        cdi: args.cdi,
        cdi_kind: args.cdi_kind,
        backend: args.backend,
    };
    crate::containers::deviceplugin::server::run(cfg)?;
    Ok(Exit::SUCCESS)
}
