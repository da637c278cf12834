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

/// `gpupass kubevirt`.
fn kubevirt(inv: &Inventory, a: &KubevirtArgs, json: bool, out: &mut dyn Write) -> Result<Exit, VmOutError> {
    use crate::inventory::backend::Policy;
    if a.backend == Policy::Iommufd && !a.external_provider {
        return Err(VmOutError::Usage(
            "--backend iommufd needs --external-provider: KubeVirt's own PCI device plugin hands out the group node (legacy); iommufd needs a device plugin that hands out /dev/vfio/devices/vfioN and /dev/iommu (gpupass device-plugin --backend iommufd)".into(),
        ));
    }
    crate::inventory::backend::resolve_vm(a.backend, inv, &[], None)?;
    let sel = select(inv, &a.devices, a.only, Consumer::Kubevirt)?;
    let addrs: Vec<_> = sel.functions().map(|f| f.device.address).collect();
    // auto without an external provider: KubeVirt's own plugin gives the group, so legacy.
    let policy = if a.external_provider {
        a.backend
    } else {
        Policy::Legacy
    };
    let iommufd = !addrs.is_empty()
        && crate::inventory::backend::resolve_vm(policy, inv, &addrs, None)?
            == crate::model::Backend::Iommufd;
    if iommufd && sel.mdevs().next().is_some() {
        messages::note(format_args!(
            "mdevs stay on the legacy group and container; only the PCI functions use iommufd"
        ));
    }
    let p = kubevirt::permitted(&sel);
    if json {
        json_out(out, &kubevirt::json_patch(&p, a.external_provider, iommufd))?;
    } else {
        out.write_all(kubevirt::yaml(&p, a.external_provider, iommufd).as_bytes())?;
    }
    Ok(Exit::SUCCESS)
}

/// `gpupass kubevirt`.
pub fn run_kubevirt(ctx: &Ctx, a: KubevirtArgs, out: &mut dyn Write) -> Result<Exit, Error> {
    Ok(kubevirt(&ctx.inventory()?, &a, ctx.json, out)?)
}
