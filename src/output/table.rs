//! Human-readable renderers for the read commands. Pure: inventory in, text out.

use crate::inventory::readiness::{Readiness, Status};
use crate::model::{Bar, BarKind, Inventory, PciDevice};
use std::fmt::Write;

/// Left-aligned columns; the last column is not padded.
pub(crate) fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut widths = vec![0; n];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                let _ = write!(line, "{c:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(|x| x.to_string()).unwrap_or_else(|| "-".into())
}

/// `gpupass list`: one row per function.
pub fn list(inv: &Inventory, devices: &[&PciDevice]) -> String {
    let mut rows = vec![vec![
        "ADDRESS".to_string(),
        "IDS".into(),
        "CLASS".into(),
        "DRIVER".into(),
        "GROUP".into(),
        "NUMA".into(),
        "NAME".into(),
    ]];
    for d in devices {
        let mut name = d.display_name();
        if let Some(nv) = &d.nvidia {
            if let Some(m) = nv.minor {
                let _ = write!(name, " (/dev/nvidia{m})");
            }
        }
        rows.push(vec![
            d.address.to_string(),
            format!("{}:{}", d.vendor_id, d.device_id),
            d.class_name.clone().unwrap_or_else(|| d.class.to_string()),
            opt(&d.driver),
            opt(&d.iommu_group),
            opt(&d.numa_node),
            name,
        ]);
    }
    let mut s = columns(&rows);
    if devices.is_empty() {
        s.push_str(if inv.devices.is_empty() {
            "(no PCI devices)\n"
        } else {
            "(no GPUs or display devices; `gpupass list --all` shows every function)\n"
        });
    }
    s
}

pub(crate) fn size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    for (u, v) in UNITS {
        if bytes >= v && bytes % v == 0 {
            return format!("{}{u}", bytes / v);
        }
    }
    format!("{bytes}")
}

fn bar_line(b: &Bar) -> String {
    let kind = match b.kind {
        BarKind::Io => "I/O ports".to_string(),
        BarKind::Memory => format!(
            "memory {}-bit{}",
            if b.is_64bit { 64 } else { 32 },
            if b.prefetchable { ", prefetchable" } else { "" }
        ),
    };
    format!("{:#x} size {} ({kind})", b.start, size(b.size))
}

/// `gpupass show ADDRESS`.
pub(crate) fn show(inv: &Inventory, d: &PciDevice) -> String {
    let mut s = String::new();
    let mut kv = |k: &str, v: String| {
        let _ = writeln!(s, "{:<18}{v}", format!("{k}:"));
    };
    kv("Address", d.address.to_string());
    kv("Name", d.display_name());
    kv("Vendor", format!("{} {}", d.vendor_id, opt(&d.vendor_name)));
    kv("Device", format!("{} {}", d.device_id, opt(&d.device_name)));
    if let (Some(sv), Some(sd)) = (&d.subsystem_vendor_id, &d.subsystem_device_id) {
        kv("Subsystem", format!("{sv}:{sd} {}", opt(&d.subsystem_name)));
    }
    kv("Revision", opt(&d.revision));
    kv("Class", format!("{} {}", d.class, opt(&d.class_name)));
    kv("Driver", opt(&d.driver));
    if let Some(o) = &d.driver_override {
        kv("Driver override", o.clone());
    }
    if let Some(p) = &d.persistent_driver {
        kv("Persistent driver", format!("{p} (driverctl)"));
    }
    kv("IOMMU group", opt(&d.iommu_group));
    kv("NUMA node", opt(&d.numa_node));
    kv("Local CPUs", opt(&d.local_cpulist));
    if let Some(p) = &d.parent {
        kv("Upstream bridge", p.to_string());
    }
    kv("Bridge", if d.is_bridge { "yes".into() } else { "no".into() });
    if let Some(b) = d.boot_vga {
        kv("Boot VGA", if b { "yes".into() } else { "no".into() });
    }
    kv(
        "Reset methods",
        match &d.reset_methods {
            Some(v) if v.is_empty() => "none".into(),
            Some(v) => v.join(" "),
            None => "- (no reset_method file)".into(),
        },
    );
    if let Some(c) = &d.vfio_cdev {
        let node = match d.vfio_cdev_node_present {
            Some(false) => " (node missing)",
            _ => "",
        };
        let dev = d
            .vfio_cdev_dev
            .as_deref()
            .map(|m| format!(" {m}"))
            .unwrap_or_default();
        kv("VFIO cdev", format!("/dev/vfio/devices/{c}{dev}{node}"));
    }
    if d.driver.as_deref().is_some_and(crate::model::is_vfio_driver) {
        kv("Backends", backends(&d.backends));
    }
    for b in &d.bars {
        kv(&format!("BAR{}", b.index), bar_line(b));
    }
    if let Some(r) = &d.rom {
        kv("ROM", bar_line(r));
    }
    if let Some(sr) = &d.sriov {
        kv(
            "SR-IOV",
            format!("{} of {} VFs enabled", sr.num_vfs, sr.total_vfs),
        );
        for (i, vf) in sr.vfs.iter().enumerate() {
            kv(&format!("  VF{i}"), vf.to_string());
        }
    }
    if let Some(pf) = &d.physfn {
        kv("Physical function", pf.to_string());
    }
    if let Some(nv) = &d.nvidia {
        kv(
            "NVIDIA",
            format!(
                "minor {} (/dev/nvidia{}), {} {}",
                opt(&nv.minor),
                opt(&nv.minor),
                opt(&nv.model),
                opt(&nv.uuid)
            ),
        );
    }
    for t in &d.mdev_types {
        kv(
            "mdev type",
            format!(
                "{} \"{}\" available {} api {}",
                t.id,
                opt(&t.name),
                opt(&t.available_instances),
                opt(&t.device_api)
            ),
        );
    }
    for t in &d.vgpu_types {
        kv(
            "vGPU profile",
            format!("{} \"{}\" (nvidia vendor VFIO)", t.id, opt(&t.name)),
        );
    }
    if let Some(c) = &d.current_vgpu_type {
        kv("Active vGPU", c.clone());
    }
    if let Some(g) = d.iommu_group.and_then(|n| inv.group(n)) {
        let _ = writeln!(
            s,
            "\nIOMMU group {} ({}):",
            g.number,
            if g.viable {
                "viable for VFIO"
            } else {
                "not viable for VFIO"
            }
        );
        let mut rows = Vec::new();
        for m in &g.members {
            let md = inv.device(m);
            rows.push(vec![
                format!("  {m}"),
                md.map(|x| opt(&x.driver)).unwrap_or_else(|| "?".into()),
                md.map(|x| {
                    if x.is_bridge {
                        format!("{} (bridge)", x.display_name())
                    } else {
                        x.display_name()
                    }
                })
                .unwrap_or_default(),
            ]);
        }
        for u in &g.mdev_members {
            rows.push(vec![format!("  {u}"), "mdev".into(), String::new()]);
        }
        s.push_str(&columns(&rows));
    }
    s
}

/// `gpupass groups`.
pub fn groups(inv: &Inventory) -> String {
    let mut rows = vec![vec![
        "GROUP".to_string(),
        "VIABLE".into(),
        "MEMBER".into(),
        "DRIVER".into(),
        "BACKENDS".into(),
        "NAME".into(),
    ]];
    for g in &inv.groups {
        // (member, driver, name) rows; the group number and viability only on the first.
        let pci = g.members.iter().map(|m| {
            let d = inv.device(m);
            let name = d
                .map(|x| {
                    if x.is_bridge {
                        format!("{} (bridge)", x.display_name())
                    } else {
                        x.display_name()
                    }
                })
                .unwrap_or_default();
            let vfio = d.is_some_and(|x| x.driver.as_deref().is_some_and(crate::model::is_vfio_driver));
            (
                m.to_string(),
                d.map(|x| opt(&x.driver)).unwrap_or_else(|| "?".into()),
                if vfio {
                    backends(&d.map(|x| x.backends.clone()).unwrap_or_default())
                } else {
                    "-".into()
                },
                name,
            )
        });
        let mdevs = g
            .mdev_members
            .iter()
            .map(|u| (u.clone(), "mdev".to_string(), "-".to_string(), String::new()));
        for (i, (member, driver, backs, name)) in pci.chain(mdevs).enumerate() {
            let (num, viable) = if i == 0 {
                (
                    g.number.to_string(),
                    if g.viable { "yes" } else { "no" }.to_string(),
                )
            } else {
                (String::new(), String::new())
            };
            rows.push(vec![num, viable, member, driver, backs, name]);
        }
    }
    let mut s = columns(&rows);
    if inv.groups.is_empty() {
        s.push_str("(no IOMMU groups: the IOMMU is off; see `gpupass check`)\n");
    }
    s
}

/// `legacy,iommufd`, or `none` for a VFIO function no backend serves now.
fn backends(b: &[crate::model::Backend]) -> String {
    if b.is_empty() {
        "none".into()
    } else {
        b.iter().map(|x| x.as_str()).collect::<Vec<_>>().join(",")
    }
}

/// `gpupass check`.
pub(crate) fn check(r: &Readiness, color: bool) -> String {
    let mut s = String::new();
    for i in &r.items {
        let (tag, code) = match i.status {
            Status::Pass => ("PASS", "32"),
            Status::Warn => ("WARN", "33"),
            Status::Fail => ("FAIL", "31"),
        };
        let tag = if color {
            format!("\x1b[1;{code}m{tag}\x1b[0m")
        } else {
            tag.to_string()
        };
        let _ = writeln!(s, "{tag}  {:<24} {}", i.name, i.detail);
        if let Some(f) = &i.fix {
            let _ = writeln!(s, "      {:<24} fix: {f}", "");
        }
    }
    let _ = writeln!(
        s,
        "\n{}",
        if r.ready {
            "This host is ready for device passthrough."
        } else {
            "Passthrough cannot work on this host until the FAIL lines are fixed."
        }
    );
    s
}
