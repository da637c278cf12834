//! The guest's 64-bit PCI MMIO window, sized from the BARs of the selected devices (pure: works
//! from the [`Selection`] only). docs/vm-outputs.md, "The 64-bit MMIO window".
//!
//! Facts used:
//! - A data-center GPU's BAR1 is 64-bit prefetchable and large (H100/H200: 128 GiB or more;
//!   an HGX board has eight). Guest firmware places 64-bit BARs in the 64-bit PCI window; a
//!   BAR that does not fit is left unassigned ("NVRM: This PCI I/O region assigned to your
//!   NVIDIA device is invalid").
//! - QEMU's q35 sizes that window from `q35-pcihost.pci-hole64-size` (default 32 GiB,
//!   `Q35_PCI_HOST_HOLE64_SIZE_DEFAULT`); libvirt writes it from `<pcihole64>` on the
//!   `pcie-root` controller. OVMF sizes its own aperture and takes an explicit one from the
//!   fw_cfg file `opt/ovmf/X-PciMmio64Mb` (MiB); libvirt passes fw_cfg files with
//!   `<sysinfo type='fwcfg'>`.
//! - The window lies above guest RAM, so the guest CPU's physical address width must reach
//!   its end: QEMU `host-phys-bits=on`, libvirt `<maxphysaddr mode='passthrough'/>`.
//! - Each BAR is naturally aligned (its size is a power of two) and so is each root port's
//!   prefetchable window; a window of twice the next power of two of the BARs' sum leaves room
//!   for that alignment and for the firmware's own 64-bit BARs.

use crate::model::BarKind;
use crate::output::selection::Selection;

/// QEMU's default q35 64-bit window (hw/pci-host/q35.c).
pub const QEMU_Q35_DEFAULT_HOLE64: u64 = 32 << 30;

/// `--pci-hole64`: how the 64-bit window is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hole64 {
    /// Sized from the devices' 64-bit BARs (the default).
    #[default]
    Auto,
    /// Not set: the VMM's and firmware's defaults.
    Off,
    /// This many bytes.
    Size(u64),
}

impl std::str::FromStr for Hole64 {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => return Ok(Hole64::Auto),
            "off" => return Ok(Hole64::Off),
            _ => {}
        }
        let bad = || {
            format!("invalid --pci-hole64 {s:?}: expected auto, off, or a power-of-two size like 64G or 2T")
        };
        let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(digits);
        let shift = match unit {
            "M" => 20,
            "G" => 30,
            "T" => 40,
            _ => return Err(bad()),
        };
        let n: u64 = num.parse().map_err(|_| bad())?;
        let v = n.checked_mul(1 << shift).ok_or_else(bad)?;
        if v < 1 << 30 || !v.is_power_of_two() {
            return Err(bad());
        }
        Ok(Hole64::Size(v))
    }
}

/// What the 64-bit BARs of a selection need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mmio64 {
    /// Sum of the 64-bit memory BARs of every selected PCI function.
    pub bars: u64,
    /// How many such BARs.
    pub count: usize,
    /// The window to set (bytes, a power of two, at least QEMU's default).
    pub window: u64,
}

/// The 64-bit memory BARs (0-5) of the selected PCI functions; mdevs have no host BARs to
/// size from.
pub fn bars64(sel: &Selection) -> (u64, usize) {
    sel.functions()
        .flat_map(|f| f.device.bars.iter())
        .filter(|b| b.index <= 5 && b.kind == BarKind::Memory && b.is_64bit && b.size > 0)
        .fold((0u64, 0usize), |(s, n), b| (s.saturating_add(b.size), n + 1))
}

/// The window for `sel` under `mode`; `None` when nothing is to be set (no 64-bit BARs under
/// `auto`, or `off`).
pub fn mmio64(sel: &Selection, mode: Hole64) -> Option<Mmio64> {
    let (bars, count) = bars64(sel);
    let window = match mode {
        Hole64::Off => return None,
        Hole64::Size(v) => v,
        Hole64::Auto if count == 0 => return None,
        Hole64::Auto => bars
            .checked_next_power_of_two()
            .and_then(|p| p.checked_mul(2))
            .unwrap_or(1 << 63)
            .max(QEMU_Q35_DEFAULT_HOLE64),
    };
    Some(Mmio64 { bars, count, window })
}

/// What VFIO pins: all guest RAM, once per IOMMU address space, plus 1 GiB for what QEMU maps
/// besides (the rule libvirt applies, `qemuDomainGetMemLockLimitBytes`): one address space
/// without a vIOMMU; with one, each VFIO device gets its own (`devices` of them).
pub fn memlock_bytes(ram: u64, viommu: bool, devices: usize) -> u64 {
    let spaces = if viommu { devices.max(1) as u64 } else { 1 };
    ram.saturating_mul(spaces).saturating_add(1 << 30)
}

/// GPUDirect P2P cliques (QEMU's `x-nv-gpudirect-clique=N` on an NVIDIA vfio-pci device,
/// 0-15): NVIDIA GPUs of the selection behind one PCIe switch (the same upstream port two
/// bridges above each GPU: GPU -> switch downstream port -> switch upstream port) share a
/// clique, numbered by first appearance; a switch with one selected GPU gets none. The guest
/// driver only enables P2P between GPUs of one clique.
pub fn p2p_cliques(sel: &Selection, inv: &crate::model::Inventory) -> Vec<(crate::model::PciAddress, u8)> {
    let switch_of = |f: &crate::output::selection::SelectedFunction| {
        let down = f.device.parent?;
        let up = inv.device(&down)?.parent?;
        // An upstream port has a parent bridge (a root port); a root port itself does not.
        inv.device(&up)?.parent?;
        Some(up)
    };
    let gpus: Vec<_> = sel
        .functions()
        .filter(|f| f.device.vendor_id == "10de" && f.device.base_class() == 0x03)
        .filter_map(|f| switch_of(f).map(|s| (f.device.address, s)))
        .collect();
    let mut switches: Vec<crate::model::PciAddress> = Vec::new();
    for (_, s) in &gpus {
        if !switches.contains(s) && gpus.iter().filter(|(_, t)| t == s).count() > 1 {
            switches.push(*s);
        }
    }
    gpus.iter()
        .filter_map(|(a, s)| {
            let i = switches.iter().position(|t| t == s)?;
            (i < 16).then_some((*a, i as u8))
        })
        .collect()
}

/// Where the selection's PCI functions sit on the host's NUMA nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NumaPlacement {
    /// No function reports a node (a single-node host, or mdevs only).
    Unknown,
    /// Every function that reports a node is on this one; its CPUs (`local_cpulist`).
    One { node: i32, cpus: Option<String> },
    /// The functions span these nodes.
    Spans(Vec<i32>),
}

/// The NUMA placement of `sel` (pure: the inventory's `numa_node` and `local_cpulist`).
pub fn numa(sel: &Selection) -> NumaPlacement {
    let mut nodes: Vec<i32> = sel
        .functions()
        .filter_map(|f| f.device.numa_node)
        .filter(|n| *n >= 0)
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    match nodes.as_slice() {
        [] => NumaPlacement::Unknown,
        [n] => NumaPlacement::One {
            node: *n,
            cpus: sel
                .functions()
                .find(|f| f.device.numa_node == Some(*n))
                .and_then(|f| f.device.local_cpulist.clone())
                .filter(|c| !c.trim().is_empty()),
        },
        _ => NumaPlacement::Spans(nodes),
    }
}

/// A power-of-two size for QEMU and notes: `64G`, `2T`, `512M`.
pub fn size_suffix(v: u64) -> String {
    if v >= 1 << 40 && v % (1 << 40) == 0 {
        format!("{}T", v >> 40)
    } else if v % (1 << 30) == 0 {
        format!("{}G", v >> 30)
    } else {
        format!("{}M", v >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!("auto".parse(), Ok(Hole64::Auto));
        assert_eq!("off".parse(), Ok(Hole64::Off));
        assert_eq!("64G".parse(), Ok(Hole64::Size(64 << 30)));
        assert_eq!("2T".parse(), Ok(Hole64::Size(2 << 40)));
        for bad in ["", "48G", "512M", "64", "64K", "G", "99999999999T"] {
            assert!(bad.parse::<Hole64>().is_err(), "{bad}");
        }
        assert_eq!(size_suffix(64 << 30), "64G");
        assert_eq!(size_suffix(4 << 40), "4T");
    }

    #[test]
    fn memlock() {
        assert_eq!(memlock_bytes(8 << 30, false, 4), 9 << 30);
        assert_eq!(memlock_bytes(8 << 30, true, 2), 17 << 30);
        assert_eq!(memlock_bytes(8 << 30, true, 0), 9 << 30);
    }
}
