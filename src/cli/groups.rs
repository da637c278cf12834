//! `gpupass groups`: IOMMU groups, their members, and whether each is viable now.

use super::ctx::{write_json, Ctx};
use super::error::{Exit, Result};
use crate::model::IommuGroup;
use crate::output::table;
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {}

/// `groups --json`.
#[derive(serde::Serialize)]
struct GroupsJson<'a> {
    groups: &'a [IommuGroup],
}

pub fn run(ctx: &Ctx, _args: Args, out: &mut dyn Write) -> Result<Exit> {
    let inv = ctx.inventory()?;
    if ctx.json {
        write_json(out, &GroupsJson { groups: &inv.groups })?;
    } else {
        out.write_all(table::groups(&inv).as_bytes())?;
    }
    Ok(Exit::SUCCESS)
}
