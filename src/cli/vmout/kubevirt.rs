//! `gpupass kubevirt`: the KubeVirt configuration (`permittedHostDevices`) for the devices.

use super::{json_out, select, VmOutError};
use crate::cli::ctx::Ctx;
use crate::cli::error::{Error, Exit};
use crate::messages;
use crate::model::Inventory;
use crate::output::kubevirt;
use crate::output::selection::{Consumer, DeviceArg};
use clap::Args;
use std::io::Write;

#[derive(Debug, Args)]
pub struct KubevirtArgs {
    /// PCI addresses (0000:01:00.0, 01:00.0) or mdev UUIDs
    #[arg(required = true, value_name = "ADDRESS|UUID")]
    pub devices: Vec<DeviceArg>,
    /// Only the devices named, not the other endpoints of their IOMMU groups
    #[arg(long)]
    pub only: bool,
    /// Mark the resources as provided by an external device plugin (gpupass's or NVIDIA's
    /// kubevirt-gpu-device-plugin) instead of KubeVirt's own
    #[arg(long)]
    pub external_provider: bool,
    /// VFIO backend of the PCI functions: legacy (group + container), iommufd (KubeVirt
    /// 1.9's IOMMUFD feature gate; needs --external-provider: gpupass device-plugin --backend
    /// iommufd hands out the cdev), auto (iommufd where the kernel has it and the resources
    /// come from an external provider, else legacy). docs/iommufd.md
    #[arg(long, value_enum, default_value_t = crate::inventory::backend::Policy::Auto)]
    pub backend: crate::inventory::backend::Policy,
}

/// `gpupass kubevirt`: the request from the options, the plan, its notes, the renderer.
fn kubevirt(inv: &Inventory, a: &KubevirtArgs, json: bool, out: &mut dyn Write) -> Result<Exit, VmOutError> {
    let req = kubevirt::KubevirtRequest {
        backend: a.backend,
        external_provider: a.external_provider,
    };
    let refused = |e: kubevirt::KubevirtRefusal| match e {
        kubevirt::KubevirtRefusal::IommufdNeedsExternal => VmOutError::Usage(e.to_string()),
        kubevirt::KubevirtRefusal::Backend(b) => VmOutError::Backend(b),
    };
    kubevirt::check(inv, req).map_err(refused)?;
    let sel = select(inv, &a.devices, a.only, Consumer::Kubevirt)?;
    let plan = kubevirt::plan(inv, &sel, req).map_err(refused)?;
    for n in &plan.notes {
        messages::note(format_args!("{n}"));
    }
    if json {
        json_out(out, &kubevirt::json_patch(&plan))?;
    } else {
        out.write_all(kubevirt::yaml(&plan).as_bytes())?;
    }
    Ok(Exit::SUCCESS)
}

/// `gpupass kubevirt`.
pub fn run_kubevirt(ctx: &Ctx, a: KubevirtArgs, out: &mut dyn Write) -> Result<Exit, Error> {
    Ok(kubevirt(&ctx.inventory()?, &a, ctx.json, out)?)
}
