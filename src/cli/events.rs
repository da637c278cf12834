//! `gpupass events`: kernel uevents for PCI functions and mdevs, one per line (or JSON).

use super::ctx::Ctx;
use super::error::{Exit, Result};
use anyhow::Context;
use std::io::Write;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Stop after this many events
    #[arg(long)]
    pub count: Option<usize>,
    /// Stop after this many seconds without exiting non-zero
    #[arg(long, value_name = "SECONDS", value_parser = parse_events_timeout)]
    pub timeout: Option<f64>,
}

/// `events --timeout`: finite seconds (an infinite or huge value would panic in `Duration`).
fn parse_events_timeout(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=31_536_000.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "invalid timeout {s:?}: expected seconds, from 0 to 31536000 (a year)"
        )),
    }
}

pub(crate) fn run(ctx: &Ctx, args: Args, out: &mut dyn Write) -> Result<Exit> {
    let sock = crate::host::uevents::UeventSocket::open()
        .context("cannot subscribe to kernel uevents (NETLINK_KOBJECT_UEVENT)")?;
    let deadline = args
        .timeout
        .map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
    let mut seen = 0usize;
    while args.count.is_none_or(|c| seen < c) {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let Some(ev) = sock.next(left)? else { break };
        if ctx.json {
            serde_json::to_writer(&mut *out, &ev)?;
            writeln!(out)?;
        } else {
            writeln!(out, "{}", ev.line())?;
        }
        out.flush()?;
        seen += 1;
    }
    Ok(Exit::SUCCESS)
}
