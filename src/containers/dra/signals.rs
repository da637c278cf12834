//! What the kernel says about a PCI function's condition, beyond which driver holds it: read
//! from sysfs on every health refresh, and judged against what the plugin saw before
//! ([`Tracker`]). docs/dra.md ("Health signals") has the table; [`super::prepare::health`]
//! adds the signals of the inventory itself (a function gone from the bus, a prepared member
//! off VFIO).
//!
//! | signal | read from | unhealthy while |
//! |---|---|---|
//! | power | `power_state` | `D3cold` (unless a host driver other than vfio-pci holds the function: its runtime power management), or `error` |
//! | config space | the first 2 bytes of `config`, only in `D0` (a read wakes a suspended function) | they read `ffff`: the function does not answer |
//! | AER | the `TOTAL_ERR_FATAL` / `TOTAL_ERR_NONFATAL` lines of `aer_dev_fatal` / `aer_dev_nonfatal` | a count rose within [`AER_HOLD`] (counts already non-zero when first read count as a rise then) |
//! | driver lost | the `driver` link | a member of an unprepared device had a driver when first seen and has none now (a failed probe, a crashed driver, a hand unbind); cleared when it has one again |

use crate::host::HostRoot;
use crate::model::PciAddress;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a device stays Unhealthy after its AER error counts last rose. The counts only ever
/// grow (until the function is removed), so "recovered" is "no new error for this long".
pub(crate) const AER_HOLD: Duration = Duration::from_secs(300);

/// Why a device is unhealthy: a short code (the device taint's value, a label value) and the
/// message the health stream carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub code: &'static str,
    pub message: String,
}

impl Problem {
    pub(crate) fn new(code: &'static str, message: impl Into<String>) -> Problem {
        Problem {
            code,
            message: message.into(),
        }
    }
}

/// One function's sysfs readings (absent files: `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Readings {
    pub power_state: Option<String>,
    /// The first two bytes of config space (the vendor ID), read only in D0.
    pub vendor: Option<u16>,
    pub aer_fatal: Option<u64>,
    pub aer_nonfatal: Option<u64>,
}

/// The `TOTAL_...` line of an `aer_dev_*` file (`NAME COUNT` lines).
fn aer_total(text: &str) -> Option<u64> {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| k.starts_with("TOTAL_ERR_"))
        .and_then(|(_, v)| v.trim().parse().ok())
}

/// Reads `a`'s signals under `host`.
pub(crate) fn read(host: &HostRoot, a: &PciAddress) -> Readings {
    let dir = host.path(&format!("sys/bus/pci/devices/{a}"));
    let text = |f: &str| crate::host::read_bounded(&dir.join(f), 4096).ok();
    let power_state = text("power_state").map(|s| s.trim().to_string());
    let vendor = if power_state.as_deref().is_none_or(|p| p == "D0") {
        use std::io::Read;
        let mut b = [0u8; 2];
        std::fs::File::open(dir.join("config"))
            .and_then(|mut f| f.read_exact(&mut b))
            .ok()
            .map(|_| u16::from_le_bytes(b))
    } else {
        None
    };
    Readings {
        power_state,
        vendor,
        aer_fatal: text("aer_dev_fatal").as_deref().and_then(aer_total),
        aer_nonfatal: text("aer_dev_nonfatal").as_deref().and_then(aer_total),
    }
}

/// What the plugin remembers between refreshes: each function's driver when first seen, and
/// its AER counts with when they last rose.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    first_driver: BTreeMap<PciAddress, Option<String>>,
    aer: BTreeMap<PciAddress, (u64, Instant)>,
}

impl Tracker {
    /// The problem of function `a` (driver `driver` now, readings `r`) at `now`; `prepared`:
    /// a claim holds it (gpupass moved its driver, so "driver lost" is not judged; the
    /// inventory's own check of a prepared member is [`super::prepare::health`]'s).
    pub(crate) fn judge(
        &mut self,
        a: &PciAddress,
        driver: Option<&str>,
        prepared: bool,
        r: &Readings,
        now: Instant,
    ) -> Option<Problem> {
        let total = r.aer_fatal.unwrap_or(0) + r.aer_nonfatal.unwrap_or(0);
        let aer_since = match self.aer.get(a) {
            Some(&(n, at)) if total <= n => Some(at).filter(|_| n > 0),
            _ if total == 0 => None,
            _ => Some(now),
        };
        if let Some(at) = aer_since {
            self.aer.insert(*a, (total, at));
        } else {
            self.aer.insert(*a, (total, now));
        }
        let first = self
            .first_driver
            .entry(*a)
            .or_insert_with(|| driver.map(str::to_string));
        if driver.is_some() {
            // A driver again (or another): that is what is judged from now on.
            *first = driver.map(str::to_string);
        }
        let first = first.clone();
        match r.power_state.as_deref() {
            Some("D3cold") if driver.is_none_or(|d| d == "vfio-pci") => {
                return Some(Problem::new(
                    "d3cold",
                    format!("{a} is in D3cold (powered off) with no host driver managing its power: it cannot be used until it is brought back to D0 (a reset or a rescan)"),
                ))
            }
            Some("error") => {
                return Some(Problem::new(
                    "power-error",
                    format!("{a}: the kernel cannot read its power state (power_state says error)"),
                ))
            }
            _ => {}
        }
        if r.vendor == Some(0xffff) {
            return Some(Problem::new(
                "no-config",
                format!(
                    "{a} does not answer: its config space reads all ones (it fell off the bus or is wedged)"
                ),
            ));
        }
        if let Some(at) = aer_since.filter(|at| now.saturating_duration_since(*at) < AER_HOLD) {
            return Some(Problem::new(
                "aer",
                format!(
                    "{a} reported PCIe AER errors ({} fatal, {} non-fatal uncorrectable since boot), the last seen {} s ago; healthy again {} s after the last one",
                    r.aer_fatal.unwrap_or(0),
                    r.aer_nonfatal.unwrap_or(0),
                    now.saturating_duration_since(at).as_secs(),
                    AER_HOLD.as_secs()
                ),
            ));
        }
        if !prepared && driver.is_none() {
            if let Some(d) = first {
                return Some(Problem::new(
                    "driver-lost",
                    format!("{a} lost its driver {d} behind gpupass's back (a failed probe, a crashed driver or a hand unbind): healthy again when a driver holds it"),
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests;
