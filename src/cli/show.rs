//! `gpupass show ADDRESS`: one PCI function and its IOMMU group.

use super::ctx::{write_json, Ctx};
use super::error::{Exit, Result};
use crate::inventory::InventoryError;
use crate::model::{IommuGroup, PciAddress, PciDevice};
use crate::output::table;
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// PCI address: 0000:01:00.0 or 01:00.0
    pub address: PciAddress,
}

/// `show --json`: the device and its group, fields in schema order.
#[derive(serde::Serialize)]
struct ShowJson<'a> {
    device: &'a PciDevice,
    group: Option<&'a IommuGroup>,
}

pub(crate) fn run(ctx: &Ctx, args: Args, out: &mut dyn Write) -> Result<Exit> {
    let inv = ctx.inventory()?;
    let d = inv
        .device(&args.address)
        .ok_or(InventoryError::NoSuchDevice { addr: args.address })?;
    if ctx.json {
        let group = d.iommu_group.and_then(|n| inv.group(n));
        write_json(out, &ShowJson { device: d, group })?;
    } else {
        out.write_all(table::show(&inv, d).as_bytes())?;
    }
    Ok(Exit::SUCCESS)
}
