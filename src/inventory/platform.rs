//! The platform's widths and placement: NUMA nodes (CPUs, hugepage pools), the IOMMU units'
//! address width, the CPU's physical address bits.

use super::*;

/// The host's NUMA nodes with their CPUs and hugepage pools (`sys/devices/system/node/node<N>`),
/// by node number.
pub(crate) fn read_numa_nodes(host: &HostRoot) -> Vec<NumaNode> {
    let base = host.sys_numa_nodes();
    let mut nodes: Vec<NumaNode> = dir_names(&base)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| {
            let node: i32 = n.strip_prefix("node")?.parse().ok()?;
            let dir = base.join(n);
            let cpulist = read_attr(&dir.join("cpulist")).ok();
            let mut hugepages: Vec<HugePool> = dir_names(&dir.join("hugepages"))
                .unwrap_or_default()
                .iter()
                .filter_map(|h| {
                    let size_kib = h.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok()?;
                    let num = |f: &str| {
                        read_attr(&dir.join("hugepages").join(h).join(f))
                            .ok()?
                            .parse()
                            .ok()
                    };
                    Some(HugePool {
                        size_kib,
                        total: num("nr_hugepages")?,
                        free: num("free_hugepages")?,
                    })
                })
                .collect();
            hugepages.sort_by_key(|p| p.size_kib);
            Some(NumaNode {
                node,
                cpulist,
                hugepages,
            })
        })
        .collect();
    nodes.sort_by_key(|n| n.node);
    nodes
}

/// The narrowest input address width among the host's IOMMUs (`sys/class/iommu/<unit>`): Intel
/// VT-d's MGAW (capability register bits 21:16, plus one) and AMD-Vi's HATS (extended feature
/// register bits 11:10: 4, 5 or 6 page-table levels, 48, 57 or 64 bits).
pub(crate) fn read_iommu_addr_bits(host: &HostRoot) -> Option<u8> {
    let base = host.sys_class("iommu");
    dir_names(&base)
        .unwrap_or_default()
        .iter()
        .filter_map(|u| {
            let dir = base.join(u);
            if let Ok(cap) = read_attr(&dir.join("intel-iommu/cap")) {
                return intel_mgaw(&cap);
            }
            amd_hats(&read_attr(&dir.join("amd-iommu/features")).ok()?)
        })
        .min()
}

pub(super) fn intel_mgaw(cap: &str) -> Option<u8> {
    let v = u64::from_str_radix(cap.trim().trim_start_matches("0x"), 16).ok()?;
    Some(((v >> 16) & 0x3f) as u8 + 1)
}

/// `features` holds the extended feature register, on newer kernels followed by `:EFR2`.
pub(super) fn amd_hats(features: &str) -> Option<u8> {
    let efr = features.trim().split(':').next()?;
    let v = u64::from_str_radix(efr.trim_start_matches("0x"), 16).ok()?;
    match (v >> 10) & 3 {
        0 => Some(48),
        1 => Some(57),
        2 => Some(64),
        _ => None,
    }
}

/// The CPU's physical address width from `proc/cpuinfo` ("address sizes : 46 bits physical,
/// 48 bits virtual"), the first CPU's line.
pub(crate) fn read_cpu_phys_bits(host: &HostRoot) -> Option<u8> {
    let text = crate::host::read_bounded(&host.proc_cpuinfo(), 1 << 20).ok()?;
    parse_phys_bits(&text)
}

/// The CPU's vendor from `proc/cpuinfo` ("vendor_id : AuthenticAMD"), the first CPU's line.
pub(crate) fn read_cpu_vendor(host: &HostRoot) -> Option<String> {
    let text = crate::host::read_bounded(&host.proc_cpuinfo(), 1 << 20).ok()?;
    parse_vendor(&text)
}

pub(super) fn parse_vendor(cpuinfo: &str) -> Option<String> {
    let line = cpuinfo.lines().find(|l| l.starts_with("vendor_id"))?;
    let (_, v) = line.split_once(':')?;
    let v = v.trim();
    (!v.is_empty() && v.len() <= 16 && v.chars().all(|c| c.is_ascii_alphanumeric())).then(|| v.to_string())
}

pub(super) fn parse_phys_bits(cpuinfo: &str) -> Option<u8> {
    let line = cpuinfo.lines().find(|l| l.starts_with("address sizes"))?;
    let (_, v) = line.split_once(':')?;
    let bits = v.trim().split(" bits physical").next()?.trim();
    bits.parse().ok().filter(|b| (32..=64).contains(b))
}
