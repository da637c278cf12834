//! Kubernetes resource names for PCI devices and mediated-device types.
//!
//! One place for the naming so that the KubeVirt `permittedHostDevices` snippet
//! (`gpupass kubevirt`) and gpupass's device plugin announce *the same* names: KubeVirt only
//! matches a VM's `deviceName` against what a device plugin registered with the kubelet.
//!
//! The convention is the one of NVIDIA's kubevirt-gpu-device-plugin, which is what KubeVirt
//! users already have in their manifests:
//! - PCI device: `<vendor domain>/<NAME>` where NAME is the pci.ids device name upper-cased,
//!   `/` and `.` and whitespace runs turned into `_`, and every other character that is not
//!   `[A-Za-z0-9_]` dropped: `AD102 [GeForce RTX 4090]` → `AD102_GEFORCE_RTX_4090`.
//!   Without a pci.ids name, NAME is the device id (`2684`), as that plugin falls back.
//! - mdev type: `<vendor domain of the parent>/<type name>` with whitespace runs and `-` turned
//!   into `_`, case kept: `GRID T4-1Q` → `nvidia.com/GRID_T4_1Q`. (NVIDIA's plugin keeps the
//!   `-`; gpupass does not, see below.)
//! - env var (KubeVirt `util.ResourceNameToEnvVar`): `PREFIX_` + the resource name upper-cased
//!   with `/` and `.` turned into `_`: `PCI_RESOURCE_NVIDIA_COM_AD102_GEFORCE_RTX_4090`.
//!
//! Every resource name is chosen so that this transformation gives a POSIX environment name
//! (`[A-Z0-9_]`, not starting with a digit): no `-` anywhere (`pci1af4.gpupass.io`, not
//! `pci-1af4...`; `GRID_T4_1Q`). A name with `-` reaches the container (`env` shows it), but
//! busybox `sh` and dash drop it from the environment they pass on, and most entrypoints are
//! shell scripts; the variable gpupass sets stays the one KubeVirt looks up for the resource.
//!
//! Kubernetes requires the part after `/` to be a qualified name (at most 63 characters,
//! `[A-Za-z0-9]` at both ends, `[-A-Za-z0-9_.]` inside). The NVIDIA convention yields that for
//! every real pci.ids name; for odd names gpupass additionally trims separators at the ends and
//! truncates to 63 characters (and falls back to the device id when nothing is left), so the
//! kubelet never rejects a registration.

use crate::model::{Inventory, MdevInstance, PciAddress, PciDevice};

/// Longest name part Kubernetes accepts in a qualified name.
pub(crate) const MAX_NAME_PART: usize = 63;

/// DNS domain used as the resource prefix for a PCI vendor id (4 hex digits, any case):
/// `nvidia.com` (10de), `amd.com` (1002), `intel.com` (8086), the domains those vendors' own
/// plugins register under; any other vendor gets `pci-<vendor id>.gpupass.io` (a DNS subdomain
/// of gpupass's own, so it can never collide with a vendor plugin's resource; no `-`, so the
/// environment name made from it is a POSIX name).
pub(crate) fn vendor_domain(vendor_id: &str) -> String {
    match vendor_id.trim_start_matches("0x").to_ascii_lowercase().as_str() {
        "10de" => "nvidia.com".into(),
        "1002" => "amd.com".into(),
        "8086" => "intel.com".into(),
        other => format!("pci{other}.gpupass.io"),
    }
}

/// Make `s` a valid Kubernetes qualified-name part: trim non-alphanumerics at both ends,
/// at most [`MAX_NAME_PART`] characters. Returns `None` when nothing is left.
fn qualified_part(s: &str) -> Option<String> {
    let mut t: String = s
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .chars()
        .take(MAX_NAME_PART)
        .collect();
    while t.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        t.pop();
    }
    (!t.is_empty()).then_some(t)
}

/// The NAME part for a PCI device: pci.ids device name in the NVIDIA plugin's convention, or
/// the lower-case device id when there is no name (or nothing usable is left of it).
pub(crate) fn pci_device_name_part(device_name: Option<&str>, device_id: &str) -> String {
    let from_name = device_name.and_then(|n| {
        let mut out = String::with_capacity(n.len());
        let mut in_space = false;
        for c in n.trim().chars() {
            if c.is_whitespace() {
                if !in_space {
                    out.push('_');
                }
                in_space = true;
                continue;
            }
            in_space = false;
            match c {
                '/' | '.' | '_' => out.push('_'),
                c if c.is_ascii_alphanumeric() => out.push(c.to_ascii_uppercase()),
                _ => {} // brackets, parentheses, commas, non-ASCII: dropped
            }
        }
        qualified_part(&out)
    });
    from_name.unwrap_or_else(|| device_id.trim_start_matches("0x").to_ascii_lowercase())
}

/// `nvidia.com/AD102_GEFORCE_RTX_4090` for a PCI function (by vendor id and pci.ids name).
pub(crate) fn pci_resource_name(dev: &PciDevice) -> String {
    format!(
        "{}/{}",
        vendor_domain(&dev.vendor_id),
        pci_device_name_part(dev.device_name.as_deref(), &dev.device_id)
    )
}

/// `nvidia.com/GRID_T4_1Q` for an mdev type: the type's `name` (its directory id when it has
/// no name) with whitespace runs and `-` as `_`, under the parent's vendor domain.
pub(crate) fn mdev_resource_name(parent_vendor_id: &str, type_name: &str) -> String {
    let joined = type_name.split_whitespace().collect::<Vec<_>>().join("_");
    let cleaned: String = joined
        .chars()
        .map(|c| if c == '-' { '_' } else { c })
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'))
        .collect();
    let part = qualified_part(&cleaned).unwrap_or_else(|| "mdev".into());
    format!("{}/{part}", vendor_domain(parent_vendor_id))
}

/// The resource name of an mdev instance: its type's name (the type id when the parent does not
/// list it) under its parent's vendor domain (`0000` when the parent is unknown).
pub(crate) fn mdev_instance_resource_name(inv: &Inventory, m: &MdevInstance) -> String {
    let parent = m.parent.parse::<PciAddress>().ok().and_then(|a| inv.device(&a));
    let type_name = parent
        .and_then(|p| {
            p.mdev_types
                .iter()
                .find(|t| Some(&t.id) == m.type_id.as_ref())
                .and_then(|t| t.name.clone())
        })
        .or_else(|| m.type_id.clone())
        .unwrap_or_else(|| "mdev".into());
    let vendor = parent.map(|p| p.vendor_id.as_str()).unwrap_or("0000");
    mdev_resource_name(vendor, &type_name)
}

/// KubeVirt's environment variable for a resource: `PCI_RESOURCE` + `nvidia.com/X` →
/// `PCI_RESOURCE_NVIDIA_COM_X` (prefixes KubeVirt uses: `PCI_RESOURCE`, `MDEV_PCI_RESOURCE`).
pub(crate) fn resource_env_var(prefix: &str, resource_name: &str) -> String {
    let v = resource_name.to_uppercase().replace(['/', '.'], "_");
    let name = format!("{prefix}_{v}");
    debug_assert!(is_posix_env_name(&name), "{name} is not a POSIX environment name");
    name
}

/// `[A-Z0-9_]+`, not starting with a digit: a name every shell passes on.
pub fn is_posix_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_names_follow_the_nvidia_plugin() {
        for (name, id, want) in [
            ("AD102 [GeForce RTX 4090]", "2684", "AD102_GEFORCE_RTX_4090"),
            ("TU104GL [Tesla T4]", "1eb8", "TU104GL_TESLA_T4"),
            ("GH100 [H200 SXM 141GB]", "2335", "GH100_H200_SXM_141GB"),
            ("GA100 [A100 SXM4 40GB]", "20b0", "GA100_A100_SXM4_40GB"),
            (
                "AD102 High Definition Audio Controller",
                "22ba",
                "AD102_HIGH_DEFINITION_AUDIO_CONTROLLER",
            ),
            (
                "Navi 31 [Radeon RX 7900 XT/7900 XTX/7900M]",
                "744c",
                "NAVI_31_RADEON_RX_7900_XT_7900_XTX_7900M",
            ),
            ("GK104GL [GRID K2]", "11bf", "GK104GL_GRID_K2"),
            ("Device 1.2  x", "0001", "DEVICE_1_2_X"),
        ] {
            assert_eq!(pci_device_name_part(Some(name), id), want, "{name}");
        }
    }

    #[test]
    fn odd_names_stay_valid_qualified_names() {
        assert_eq!(pci_device_name_part(None, "2684"), "2684");
        assert_eq!(pci_device_name_part(Some("[]"), "ABCD"), "abcd");
        assert_eq!(pci_device_name_part(Some("Über GPU /"), "1"), "BER_GPU");
        let long = "X".repeat(100);
        assert_eq!(pci_device_name_part(Some(&long), "1").len(), MAX_NAME_PART);
        let p = pci_device_name_part(Some(&format!("{} _x", "A".repeat(62))), "1");
        assert!(p.len() <= MAX_NAME_PART && p.ends_with('A'), "{p}");
    }

    #[test]
    fn vendor_domains() {
        assert_eq!(vendor_domain("10de"), "nvidia.com");
        assert_eq!(vendor_domain("10DE"), "nvidia.com");
        assert_eq!(vendor_domain("1002"), "amd.com");
        assert_eq!(vendor_domain("8086"), "intel.com");
        assert_eq!(vendor_domain("1AF4"), "pci1af4.gpupass.io");
    }

    #[test]
    fn mdev_names_and_env_vars() {
        assert_eq!(mdev_resource_name("10de", "GRID T4-1Q"), "nvidia.com/GRID_T4_1Q");
        assert_eq!(
            mdev_resource_name("8086", "i915-GVTg_V5_4"),
            "intel.com/i915_GVTg_V5_4"
        );
        assert_eq!(mdev_resource_name("1b36", "mtty-2"), "pci1b36.gpupass.io/mtty_2");
        assert_eq!(
            resource_env_var("PCI_RESOURCE", "nvidia.com/AD102_GEFORCE_RTX_4090"),
            "PCI_RESOURCE_NVIDIA_COM_AD102_GEFORCE_RTX_4090"
        );
        assert_eq!(
            resource_env_var("MDEV_PCI_RESOURCE", "nvidia.com/GRID_T4_1Q"),
            "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4_1Q"
        );
        assert!(is_posix_env_name("PCI_RESOURCE_PCI1234_GPUPASS_IO_1111"));
        for bad in ["PCI_RESOURCE_PCI-1234_GPUPASS_IO_1111", "1X", "", "a_b", "X.Y"] {
            assert!(!is_posix_env_name(bad), "{bad}");
        }
    }

    /// Every resource name gpupass can make gives a POSIX environment name.
    #[test]
    fn every_env_name_is_posix() {
        for vendor in ["10de", "1002", "8086", "1af4", "1234", "abcd"] {
            for name in [Some("GRID T4-1Q"), Some("a-b.c/d"), Some("--"), None] {
                let pci = format!("{}/{}", vendor_domain(vendor), pci_device_name_part(name, "1eb8"));
                let mdev = mdev_resource_name(vendor, name.unwrap_or("nvidia-222"));
                for (prefix, res) in [("PCI_RESOURCE", &pci), ("MDEV_PCI_RESOURCE", &mdev)] {
                    let v = resource_env_var(prefix, res);
                    assert!(is_posix_env_name(&v), "{res} -> {v}");
                }
            }
        }
    }
}
