//! The VFIO backends and the one policy every consumer follows (docs/iommufd.md).
//!
//! A VFIO function reaches a VMM or a container through one of two node sets, never both:
//! - **legacy**: the group `/dev/vfio/<group>` and the container `/dev/vfio/vfio`;
//! - **iommufd**: the device cdev `/dev/vfio/devices/vfioN` and `/dev/iommu` (Linux 6.6+ with
//!   `CONFIG_VFIO_DEVICE_CDEV` and `CONFIG_IOMMUFD`).
//!
//! Handing out both for one device is what Kata and AMD's DRA driver refuse (two handles on one
//! device), so every consumer (`boot`, `qemu-args`, `xml`, `cdi generate`, `kubevirt`, the OCI
//! hook, the device plugin) takes the same `--backend legacy|iommufd|auto` and resolves it here.
//! `auto` picks iommufd where the kernel serves the device through it, else legacy, so on
//! kernels without the cdev it is exactly the legacy behaviour of earlier versions.
//!
//! Kernel facts used:
//! - `sys/bus/pci/devices/<BDF>/vfio-dev/vfioN/dev` (major:minor) exists while a VFIO driver
//!   holds a function on a kernel with the cdev; udev makes `/dev/vfio/devices/vfioN`.
//! - iommufd registers the misc device `iommu` (`sys/class/misc/iommu`, `proc/misc`); as a
//!   module it also shows as `sys/module/iommufd`.
//! - `/dev/vfio/vfio` is VFIO's own container with `CONFIG_VFIO_CONTAINER` (its type1 IOMMU
//!   driver is `vfio_iommu_type1`), or iommufd's emulation of it with
//!   `CONFIG_IOMMUFD_VFIO_CONTAINER` (which needs `VFIO_CONTAINER` off).

use crate::host::{read_bounded, HostRoot};
use crate::model::{
    is_vfio_driver, Backend, Inventory, IommuGroup, IommufdFacts, PciAddress, PciDevice, VfioContainer,
};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The kernel release that brought the VFIO device cdev.
pub(crate) const CDEV_SINCE: (u32, u32) = (6, 6);

/// What the kernel needs for iommufd, as errors and `check` say it.
pub(crate) const IOMMUFD_NEEDS: &str = "iommufd needs Linux 6.6 or newer built with CONFIG_IOMMUFD and \
CONFIG_VFIO_DEVICE_CDEV, /dev/iommu (modprobe iommufd), and the function on vfio-pci";

/// `--backend`: which node set a consumer gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// The group and container (`/dev/vfio/<group>` + `/dev/vfio/vfio`).
    Legacy,
    /// The device cdev and iommufd (`/dev/vfio/devices/vfioN` + `/dev/iommu`); an error where
    /// the kernel lacks them.
    Iommufd,
    /// iommufd where the kernel serves the device through it, else legacy.
    #[default]
    Auto,
}

impl Policy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Policy::Legacy => "legacy",
            Policy::Iommufd => "iommufd",
            Policy::Auto => "auto",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Text that is not a [`Policy`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend {text:?}: expected legacy, iommufd or auto")]
pub struct PolicyError {
    pub text: String,
}

impl FromStr for Policy {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, PolicyError> {
        match s.trim() {
            "legacy" => Ok(Policy::Legacy),
            "iommufd" => Ok(Policy::Iommufd),
            "auto" => Ok(Policy::Auto),
            _ => Err(PolicyError { text: s.to_string() }),
        }
    }
}

/// Why the host's kernel cannot serve iommufd at all ([`iommufd_ready`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IommufdNotReady {
    /// The scan's own reason (`Inventory::iommufd`).
    #[error("{0}")]
    Unusable(String),
    #[error("/dev/iommu does not exist")]
    NoIommuNode,
    #[error("no function has a VFIO device cdev")]
    NoCdev,
}

/// Two VFIO backends' nodes in one node set ([`check_one_backend`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("mixed VFIO backends: {first} ({first_backend}) and {other} ({other_backend}) in one node set")]
pub(crate) struct MixedBackends {
    pub first: String,
    pub first_backend: Backend,
    pub other: String,
    pub other_backend: Backend,
}

/// A backend that cannot serve what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error("--backend iommufd: {what} cannot use iommufd: {reason}; {IOMMUFD_NEEDS}; use --backend legacy or auto")]
    IommufdUnavailable { what: String, reason: String },
    #[error("--backend iommufd: {what} is not supported: {reason}; use --backend legacy or auto")]
    IommufdUnsupported { what: String, reason: String },
}

/// `major.minor` of a kernel release string (`6.1.0-27-amd64` -> (6, 1)).
pub(crate) fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// A `CONFIG_X` setting in a kernel config: `Some(true)` for `=y`/`=m`, `Some(false)` for
/// `# CONFIG_X is not set`, `None` when the config does not mention it.
pub(crate) fn config_value(config: &str, name: &str) -> Option<bool> {
    let set = format!("{name}=");
    let unset = format!("# {name} is not set");
    for l in config.lines() {
        if let Some(v) = l.strip_prefix(&set) {
            return Some(matches!(v.trim(), "y" | "m"));
        }
        if l.trim() == unset {
            return Some(false);
        }
    }
    None
}

/// The running kernel's config, and where it was read. `/proc/config.gz` is compressed and
/// gpupass carries no inflater: it reads `/boot/config-<release>`, which Debian, Ubuntu and
/// Fedora ship, and says when only the compressed one exists.
fn read_config(host: &HostRoot, release: Option<&str>) -> (Option<String>, Option<String>) {
    let Some(rel) = release else {
        return (None, None);
    };
    let [boot, proc_gz] = host.kernel_configs(rel);
    if let Ok(t) = read_bounded(&boot, 8 * 1024 * 1024) {
        return (Some(t), Some(format!("/boot/config-{rel}")));
    }
    if proc_gz.exists() {
        return (None, Some("/proc/config.gz (compressed; not read)".into()));
    }
    (None, None)
}

/// Read the iommufd facts of the host and fill `inv.iommufd` and every device's `backends`.
pub(crate) fn annotate(host: &HostRoot, inv: &mut Inventory) {
    let misc = read_bounded(&host.path("proc/misc"), 64 * 1024).unwrap_or_default();
    let misc_has = |n: &str| misc.lines().any(|l| l.split_whitespace().nth(1) == Some(n));
    let loaded =
        host.sys_module("iommufd").exists() || host.sys_class_misc("iommu").exists() || misc_has("iommu");
    let (config, config_src) = read_config(host, inv.kernel.as_deref());
    let cfg = |n: &str| config.as_deref().and_then(|c| config_value(c, n));
    let vfio_container = if !inv.vfio_container_present {
        VfioContainer::Absent
    } else if cfg("CONFIG_IOMMUFD_VFIO_CONTAINER") == Some(true) {
        VfioContainer::IommufdEmulation
    } else if cfg("CONFIG_VFIO_CONTAINER") == Some(true) || host.sys_module("vfio_iommu_type1").exists() {
        VfioContainer::Legacy
    } else if cfg("CONFIG_VFIO_CONTAINER") == Some(false) && loaded {
        VfioContainer::IommufdEmulation
    } else {
        VfioContainer::Unknown
    };
    let cdev_seen = inv.devices.iter().any(|d| d.vfio_cdev.is_some());
    let version = inv.kernel.as_deref().and_then(kernel_version);
    let kernel_cdev = if cdev_seen {
        Some(true)
    } else if version.is_some_and(|v| v < CDEV_SINCE) {
        Some(false)
    } else {
        match (cfg("CONFIG_VFIO_DEVICE_CDEV"), cfg("CONFIG_IOMMUFD")) {
            (Some(false), _) | (_, Some(false)) => Some(false),
            (Some(true), _) => Some(true),
            _ => None,
        }
    };
    let reason = if let (Some(v), false) = (version, cdev_seen) {
        (v < CDEV_SINCE).then(|| {
            format!(
                "kernel {}.{} predates the VFIO device cdev (6.6): the legacy backend serves every device here",
                v.0, v.1
            )
        })
    } else {
        None
    }
    .or_else(|| match cfg("CONFIG_IOMMUFD") {
        Some(false) if !loaded => Some(format!(
            "the kernel is built without CONFIG_IOMMUFD ({})",
            config_src.as_deref().unwrap_or("kernel config")
        )),
        _ => None,
    })
    .or_else(|| match cfg("CONFIG_VFIO_DEVICE_CDEV") {
        Some(false) if !cdev_seen => Some(format!(
            "the kernel is built without CONFIG_VFIO_DEVICE_CDEV ({})",
            config_src.as_deref().unwrap_or("kernel config")
        )),
        _ => None,
    })
    .or_else(|| (!loaded && !inv.iommufd_present).then(|| "the iommufd module is not loaded (modprobe iommufd)".to_string()))
    .or_else(|| (!inv.iommufd_present).then(|| "/dev/iommu does not exist".to_string()))
    .or_else(|| {
        (kernel_cdev == Some(false)).then(|| "the kernel has no VFIO device cdev".to_string())
    });
    inv.iommufd = Some(IommufdFacts {
        dev_iommu: inv.iommufd_present,
        loaded,
        kernel_cdev,
        config: config_src,
        vfio_container,
        usable: reason.is_none(),
        reason,
    });
    fill_backends(inv);
}

/// The members of group `g` bound to a VFIO driver (the ones a consumer can be handed).
pub(crate) fn vfio_members<'a>(inv: &'a Inventory, g: &IommuGroup) -> Vec<&'a PciDevice> {
    g.members
        .iter()
        .filter_map(|a| inv.device(a))
        .filter(|d| d.driver.as_deref().is_some_and(is_vfio_driver))
        .collect()
}

/// Fill every device's and group's `backends` from the inventory alone (also for inventories
/// saved by versions that did not record them).
pub(crate) fn fill_backends(inv: &mut Inventory) {
    let backends: Vec<Vec<Backend>> = inv.devices.iter().map(|d| servable(inv, d)).collect();
    for (d, b) in inv.devices.iter_mut().zip(backends) {
        d.backends = b;
    }
    // Members by address, once: `Inventory::device` is a linear search, and a large host has a
    // group per function.
    let by_addr: std::collections::HashMap<_, &PciDevice> =
        inv.devices.iter().rev().map(|d| (d.address, d)).collect();
    let per_group: Vec<Vec<Backend>> = inv
        .groups
        .iter()
        .map(|g| {
            let vfio: Vec<&PciDevice> = g
                .members
                .iter()
                .filter_map(|a| by_addr.get(a).copied())
                .filter(|d| d.driver.as_deref().is_some_and(is_vfio_driver))
                .collect();
            [Backend::Legacy, Backend::Iommufd]
                .into_iter()
                .filter(|b| !vfio.is_empty() && vfio.iter().all(|d| d.backends.contains(b)))
                .collect()
        })
        .collect();
    for (g, b) in inv.groups.iter_mut().zip(per_group) {
        g.backends = b;
    }
}

/// Whether the host's kernel can serve iommufd at all (not per device), and why not.
pub(crate) fn iommufd_ready(inv: &Inventory) -> Result<(), IommufdNotReady> {
    match &inv.iommufd {
        Some(f) if f.usable => Ok(()),
        Some(f) => Err(IommufdNotReady::Unusable(
            f.reason.clone().unwrap_or_else(|| "iommufd is not usable".into()),
        )),
        // An inventory saved by an older gpupass: judge by the nodes it recorded.
        None if inv.iommufd_present && inv.devices.iter().any(|d| d.vfio_cdev.is_some()) => Ok(()),
        None if !inv.iommufd_present => Err(IommufdNotReady::NoIommuNode),
        None => Err(IommufdNotReady::NoCdev),
    }
}

/// The backends that can serve `d` now: on a VFIO driver, in a viable group, with that
/// backend's nodes present. Pure: reads only the inventory.
pub(crate) fn servable(inv: &Inventory, d: &PciDevice) -> Vec<Backend> {
    let mut out = Vec::new();
    if !d.driver.as_deref().is_some_and(is_vfio_driver) {
        return out;
    }
    let Some(g) = d.iommu_group.and_then(|n| inv.group(n)) else {
        return out;
    };
    if !g.viable {
        return out;
    }
    if inv.vfio_container_present && g.vfio_node_present {
        out.push(Backend::Legacy);
    }
    let kernel_ok = inv.iommufd.as_ref().is_none_or(|f| f.usable);
    if kernel_ok && inv.iommufd_present && d.vfio_cdev.is_some() && d.vfio_cdev_node_present != Some(false) {
        out.push(Backend::Iommufd);
    }
    out
}

/// Why `d` cannot use iommufd now (for errors and warnings).
pub(crate) fn why_not_iommufd(inv: &Inventory, d: &PciDevice) -> String {
    if let Err(r) = iommufd_ready(inv) {
        return r.to_string();
    }
    if !d.driver.as_deref().is_some_and(is_vfio_driver) {
        return format!(
            "{} is on {}, not a VFIO driver (its cdev appears when vfio-pci holds it)",
            d.address,
            d.driver.as_deref().unwrap_or("no driver")
        );
    }
    match (&d.vfio_cdev, d.vfio_cdev_node_present) {
        (None, _) => format!("{} has no vfio-dev/vfioN in sysfs", d.address),
        (Some(c), Some(false)) => format!("/dev/vfio/devices/{c} does not exist (udev?)"),
        _ => format!("the IOMMU group of {} is not viable", d.address),
    }
}

/// The node set of one backend for the functions `devs` of group `group`, in order:
/// legacy `/dev/vfio/vfio` + `/dev/vfio/<group>`, iommufd `/dev/iommu` + each cdev.
pub(crate) fn nodes(backend: Backend, group: u32, devs: &[&PciDevice]) -> Vec<String> {
    node_paths(backend, group, devs.iter().filter_map(|d| d.vfio_cdev.as_deref()))
}

/// [`nodes`] from the cdev names (`vfioN`) themselves (an mdev's cdev has no [`PciDevice`]).
pub(crate) fn node_paths<'a>(
    backend: Backend,
    group: u32,
    cdevs: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    match backend {
        Backend::Legacy => vec!["/dev/vfio/vfio".into(), format!("/dev/vfio/{group}")],
        Backend::Iommufd => {
            let mut v = vec!["/dev/iommu".to_string()];
            v.extend(cdevs.into_iter().map(|c| format!("/dev/vfio/devices/{c}")));
            v
        }
    }
}

/// Which backend a node path belongs to, if any.
pub(crate) fn node_backend(path: &str) -> Option<Backend> {
    let p = path.trim_end_matches('/');
    if p == "/dev/iommu" || p.starts_with("/dev/vfio/devices/") {
        Some(Backend::Iommufd)
    } else if p == "/dev/vfio/vfio"
        || p.strip_prefix("/dev/vfio/")
            .is_some_and(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()))
    {
        Some(Backend::Legacy)
    } else {
        None
    }
}

/// The one rule every node set gpupass hands out keeps: VFIO nodes of one backend only.
pub(crate) fn check_one_backend<'a>(
    paths: impl IntoIterator<Item = &'a str>,
) -> Result<Option<Backend>, MixedBackends> {
    let mut seen: Option<(Backend, &str)> = None;
    for p in paths {
        if let Some(b) = node_backend(p) {
            match seen {
                Some((s, first)) if s != b => {
                    return Err(MixedBackends {
                        first: first.to_string(),
                        first_backend: s,
                        other: p.to_string(),
                        other_backend: b,
                    })
                }
                None => seen = Some((b, p)),
                _ => {}
            }
        }
    }
    Ok(seen.map(|(b, _)| b))
}

/// Resolve the policy for one function that will be handed over now (CDI, hook, device
/// plugin): `Ok(None)` when no backend can serve it (the caller says why in its own terms).
pub(crate) fn choose(policy: Policy, d: &PciDevice) -> Option<Backend> {
    let has = |b| d.backends.contains(&b);
    match policy {
        Policy::Legacy => has(Backend::Legacy).then_some(Backend::Legacy),
        Policy::Iommufd => has(Backend::Iommufd).then_some(Backend::Iommufd),
        Policy::Auto => {
            if has(Backend::Iommufd) {
                Some(Backend::Iommufd)
            } else if has(Backend::Legacy) {
                Some(Backend::Legacy)
            } else {
                None
            }
        }
    }
}

/// Resolve the policy for a VM output (`qemu-args`, `xml`, `kubevirt`): the kernel decides,
/// and a function already on VFIO must have its cdev. `extra` is a further reason iommufd
/// cannot be used (e.g. the target libvirt is too old): an error for `iommufd`, legacy for
/// `auto`.
pub(crate) fn resolve_vm(
    policy: Policy,
    inv: &Inventory,
    addrs: &[PciAddress],
    extra: Option<String>,
) -> Result<Backend, BackendError> {
    let problem = iommufd_ready(inv)
        .err()
        .map(|e| e.to_string())
        .or(extra)
        .or_else(|| {
            addrs.iter().filter_map(|a| inv.device(a)).find_map(|d| {
                (d.driver.as_deref().is_some_and(is_vfio_driver) && !d.backends.contains(&Backend::Iommufd))
                    .then(|| why_not_iommufd(inv, d))
            })
        });
    match (policy, problem) {
        (Policy::Legacy, _) => Ok(Backend::Legacy),
        (Policy::Auto, Some(_)) => Ok(Backend::Legacy),
        (Policy::Auto, None) | (Policy::Iommufd, None) => Ok(Backend::Iommufd),
        (Policy::Iommufd, Some(reason)) => Err(BackendError::IommufdUnavailable {
            what: if addrs.is_empty() {
                "this host".into()
            } else {
                addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ")
            },
            reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions() {
        assert_eq!(kernel_version("6.1.0-27-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("6.12.95"), Some((6, 12)));
        assert_eq!(kernel_version("5.15.0-1-generic"), Some((5, 15)));
        assert_eq!(kernel_version("garbage"), None);
        assert!(kernel_version("6.1.0").unwrap() < CDEV_SINCE);
        assert!(kernel_version("6.12.0").unwrap() >= CDEV_SINCE);
    }

    #[test]
    fn config_values() {
        let c = "CONFIG_IOMMUFD=y\n# CONFIG_IOMMUFD_VFIO_CONTAINER is not set\nCONFIG_VFIO=m\n";
        assert_eq!(config_value(c, "CONFIG_IOMMUFD"), Some(true));
        assert_eq!(config_value(c, "CONFIG_VFIO"), Some(true));
        assert_eq!(config_value(c, "CONFIG_IOMMUFD_VFIO_CONTAINER"), Some(false));
        assert_eq!(config_value(c, "CONFIG_VFIO_DEVICE_CDEV"), None);
    }

    #[test]
    fn a_mixed_node_set_is_refused() {
        assert_eq!(
            check_one_backend(["/dev/vfio/vfio", "/dev/vfio/40"]),
            Ok(Some(Backend::Legacy))
        );
        assert_eq!(
            check_one_backend(["/dev/iommu", "/dev/vfio/devices/vfio0", "/dev/nvidia0"]),
            Ok(Some(Backend::Iommufd))
        );
        let e = check_one_backend(["/dev/vfio/vfio", "/dev/vfio/40", "/dev/iommu"]).unwrap_err();
        assert!(e.to_string().contains("mixed VFIO backends"), "{e}");
        assert!(check_one_backend(["/dev/vfio/devices/vfio1", "/dev/vfio/7"]).is_err());
        assert_eq!(check_one_backend(["/dev/nvidiactl"]), Ok(None));
    }

    /// The kernel config decides what serves /dev/vfio/vfio and names what the kernel lacks.
    #[test]
    fn kernel_config_gives_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        crate::testkit::fixtures::build("workstation", dir.path()).unwrap();
        let host = HostRoot::new(dir.path());
        let boot = dir.path().join("boot");
        std::fs::create_dir_all(&boot).unwrap();
        let cfg = boot.join("config-6.8.0-45-generic");
        std::fs::write(&cfg, "CONFIG_IOMMUFD=y\n# CONFIG_VFIO_DEVICE_CDEV is not set\n# CONFIG_VFIO_CONTAINER is not set\nCONFIG_IOMMUFD_VFIO_CONTAINER=y\n").unwrap();
        std::fs::create_dir_all(dir.path().join("sys/module/iommufd")).unwrap();
        let inv = crate::inventory::scan(&host).unwrap();
        let f = inv.iommufd.clone().unwrap();
        assert_eq!(f.vfio_container, VfioContainer::IommufdEmulation);
        assert_eq!(f.kernel_cdev, Some(false));
        assert!(!f.usable);
        let r = f.reason.unwrap();
        assert!(r.contains("without CONFIG_VFIO_DEVICE_CDEV"), "{r}");
        assert!(r.contains("/boot/config-6.8.0-45-generic"), "{r}");
        let e = resolve_vm(Policy::Iommufd, &inv, &[], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("CONFIG_VFIO_DEVICE_CDEV") && e.contains("6.6"), "{e}");
        assert_eq!(resolve_vm(Policy::Auto, &inv, &[], None), Ok(Backend::Legacy));
    }

    #[test]
    fn policies_parse() {
        assert_eq!("auto".parse::<Policy>(), Ok(Policy::Auto));
        assert_eq!("iommufd".parse::<Policy>(), Ok(Policy::Iommufd));
        assert!("both".parse::<Policy>().is_err());
        assert_eq!(Policy::default(), Policy::Auto);
    }
}
