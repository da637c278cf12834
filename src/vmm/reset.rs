//! Device reset around a `gpupass boot` run: `VFIO_DEVICE_RESET` before the firmware starts and
//! after it ends, where VFIO says the device can be reset (`VFIO_DEVICE_FLAGS_RESET`), with the
//! method the kernel uses named from the function's sysfs `reset_method` (read by the inventory
//! through the [`crate::host::HostRoot`]).
//!
//! vfio-pci answers `VFIO_DEVICE_RESET` with `pci_try_reset_function`, which tries the methods
//! of `reset_method` in its order (`flr`, `pm`, `bus`, ...) and stops at the first that works;
//! without any method vfio-pci leaves `VFIO_DEVICE_FLAGS_RESET` clear and refuses the ioctl. An
//! mdev is reset by its parent driver (mbochs: its own `VFIO_DEVICE_RESET` handler).

use serde::Serialize;
use std::time::Instant;

/// One `VFIO_DEVICE_RESET`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ResetAttempt {
    pub ok: bool,
    /// The ioctl's error (`EINVAL`, `EBUSY`, ...), when it failed.
    pub error: Option<String>,
    /// How long the ioctl took.
    pub micros: u64,
}

/// What gpupass did about resetting the device, for the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ResetReport {
    /// `VFIO_DEVICE_FLAGS_RESET` from `VFIO_DEVICE_GET_INFO`.
    pub vfio_reset_flag: bool,
    /// The function's `reset_method` in the kernel's order; `None` when sysfs has none (no
    /// method, or a kernel before 5.15) and for mdevs.
    pub reset_methods: Option<Vec<String>>,
    /// The method the kernel tries first: the first of `reset_methods`, `mdev parent driver`
    /// for an mdev whose driver sets the flag (mbochs does not), `None` when there is none.
    pub method: Option<String>,
    /// Before the firmware starts (after the device is opened, before RAM is DMA-mapped).
    pub before: Option<ResetAttempt>,
    /// After the firmware ended and the BAR slots and mappings are gone.
    pub after: Option<ResetAttempt>,
}

impl ResetReport {
    pub(crate) fn new(vfio_reset_flag: bool, reset_methods: Option<Vec<String>>, mdev: bool) -> ResetReport {
        let reset_methods = reset_methods.filter(|m| !m.is_empty());
        let method = if mdev {
            vfio_reset_flag.then(|| "mdev parent driver".to_string())
        } else {
            reset_methods.as_ref().and_then(|m| m.first().cloned())
        };
        ResetReport {
            vfio_reset_flag,
            reset_methods,
            method,
            before: None,
            after: None,
        }
    }

    /// Whether gpupass resets the device (VFIO says it can).
    pub(crate) fn wanted(&self) -> bool {
        self.vfio_reset_flag
    }

    /// Every attempted reset worked and at least one was made.
    pub(crate) fn passed(&self) -> bool {
        let tried: Vec<&ResetAttempt> = self.before.iter().chain(self.after.iter()).collect();
        !tried.is_empty() && tried.iter().all(|a| a.ok)
    }

    /// One summary line (without the `gpupass: ` prefix).
    pub(crate) fn summary(&self) -> String {
        let methods = match &self.reset_methods {
            Some(m) => format!("sysfs reset_method: {}", m.join(" ")),
            None => "no sysfs reset_method".to_string(),
        };
        if !self.vfio_reset_flag {
            return format!(
                "reset: none: the device has no reset method ({methods}; VFIO_DEVICE_FLAGS_RESET not set), not reset"
            );
        }
        let one = |what: &str, a: &Option<ResetAttempt>| match a {
            Some(a) if a.ok => format!("{what} ok in {:.2} ms", a.micros as f64 / 1000.0),
            Some(a) => format!(
                "{what} FAILED ({}) after {:.2} ms",
                a.error.as_deref().unwrap_or("?"),
                a.micros as f64 / 1000.0
            ),
            None => format!("{what} not done"),
        };
        format!(
            "reset: VFIO_DEVICE_RESET ({}; {methods}): {}, {}",
            match &self.method {
                Some(m) => format!("kernel method {m}"),
                None => "kernel method unknown".to_string(),
            },
            one("before the run", &self.before),
            one("after", &self.after)
        )
    }
}

/// Time one reset.
pub(crate) fn attempt(reset: impl FnOnce() -> std::io::Result<()>) -> ResetAttempt {
    let t = Instant::now();
    let r = reset();
    ResetAttempt {
        ok: r.is_ok(),
        error: r.err().map(|e| e.to_string()),
        micros: t.elapsed().as_micros() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_name_the_kernels_first_choice() {
        let r = ResetReport::new(true, Some(vec!["flr".into(), "bus".into()]), false);
        assert_eq!(r.method.as_deref(), Some("flr"));
        assert!(r.wanted());
        assert!(!r.passed(), "nothing tried yet");
        let r = ResetReport::new(false, Some(vec![]), false);
        assert_eq!((r.method, r.reset_methods), (None, None));
        let r = ResetReport::new(true, None, true);
        assert_eq!(r.method.as_deref(), Some("mdev parent driver"));
        assert_eq!(
            ResetReport::new(false, None, true).method,
            None,
            "mbochs: no reset flag"
        );
    }

    #[test]
    fn attempts_carry_result_and_time_into_the_summary() {
        let mut r = ResetReport::new(true, Some(vec!["bus".into()]), false);
        r.before = Some(attempt(|| Ok(())));
        r.after = Some(attempt(|| Err(std::io::Error::from_raw_os_error(libc::EBUSY))));
        assert!(r.before.as_ref().unwrap().ok);
        assert!(!r.passed());
        let s = r.summary();
        assert!(s.contains("kernel method bus; sysfs reset_method: bus"), "{s}");
        assert!(
            s.contains("before the run ok in") && s.contains("after FAILED ("),
            "{s}"
        );
        r.after = Some(attempt(|| Ok(())));
        assert!(r.passed());
        let none = ResetReport::new(false, None, false).summary();
        assert!(
            none.contains("no sysfs reset_method; VFIO_DEVICE_FLAGS_RESET not set"),
            "{none}"
        );
    }
}
