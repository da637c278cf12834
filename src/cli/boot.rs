//! `gpupass boot`: run the VMM ([`crate::vmm`]) and render its result.
//!
//! Without `--json` the guest's serial console is streamed to stdout as it is written and a
//! summary goes to stderr; with `--json` stdout carries only the [`BootReport`]. The exit
//! status is the firmware's (port 0x501). With `--check` stdout carries one verdict line per
//! capability instead (or, with `--json`, the [`vmm::verdict::CheckReport`]).

use super::ctx::Ctx;
use super::error::{Exit, Result};
use crate::containers::metadata::{self, Bootable};
use crate::inventory::backend::Policy;
use crate::model::{Backend, PciAddress};
use crate::vmm::vfio::VfioTarget;
use crate::vmm::{self, BootOptions, BootReport, Target};
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["device", "mdev", "emulated", "dra_metadata"])))]
pub struct Args {
    /// PCI function bound to vfio-pci (`gpupass bind` it first)
    #[arg(long, value_name = "ADDRESS")]
    pub device: Option<PciAddress>,
    /// Mediated device UUID
    #[arg(long, value_name = "UUID", value_parser = parse_uuid_arg)]
    pub mdev: Option<String>,
    /// A small display device emulated inside gpupass (no VFIO needed)
    #[arg(long)]
    pub emulated: bool,
    /// In a Pod: the device of the Pod's DRA claim, read from its KEP-5304 metadata file
    /// (`resource.kubernetes.io/pciBusID`, or `mdevUUID`), with the VFIO backend the claim was
    /// prepared for (`gpupass.dev/backend`) unless --backend says otherwise. PATH is a file or a
    /// directory holding exactly one such device (default: the kubelet's mount point,
    /// /var/run/kubernetes.io/dra-device-attributes)
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = crate::containers::metadata::CONTAINER_DIR)]
    pub dra_metadata: Option<PathBuf>,
    /// Guest RAM (1M..3G, e.g. 64M)
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = crate::vmm::memory::parse_memory_size)]
    pub memory: u64,
    /// Guest firmware flat binary (default: the built-in one, see docs/vmm.md)
    #[arg(long, value_name = "FILE")]
    pub firmware: Option<PathBuf>,
    /// Seconds before the VM is stopped
    #[arg(long, value_name = "S", default_value = "10", value_parser = parse_timeout)]
    pub timeout: std::time::Duration,
    /// After enumeration, the firmware reads a BAR this many times (exit counting)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub read_loop: u32,
    /// BAR the read loop reads (default: BAR2 of a Bochs display, else the first memory BAR)
    #[arg(long, value_name = "BAR", value_parser = clap::value_parser!(u8).range(0..=5))]
    pub read_bar: Option<u8>,
    /// VFIO backend: the group + container (legacy), the device cdev + /dev/iommu
    /// (iommufd), or iommufd where the kernel serves the device through it (auto; an mdev
    /// stays legacy under auto) [default: auto; with --dra-metadata, the claim's backend]
    #[arg(long, value_enum)]
    pub backend: Option<crate::inventory::backend::Policy>,
    /// After the interrupt tests, time this many MSI round trips (raise, deliver, EOI)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub irq_loop: u32,
    /// How MSI reaches the vCPU: the kernel's irqfd, or gpupass injecting each message from
    /// userspace with KVM_SIGNAL_MSI (the comparison of the interrupt benchmark)
    #[arg(long, value_enum, default_value_t = crate::vmm::irq::IrqPath::Irqfd)]
    pub irq_path: crate::vmm::irq::IrqPath,
    /// Self-test: one verdict line per capability a guest driver needs (config, bars, dma,
    /// isolation, msi-x, msi, intx, reset), each pass, fail, absent (the device does not have
    /// it, by its config space) or untested (it has it, gpupass cannot test it on this
    /// device: DMA without an engine gpupass drives, an interrupt only the host raised) with
    /// the reason; exit status 0 only when none fails (docs/vmm.md, "boot --check")
    #[arg(long)]
    pub check: bool,
    /// With --check: exit status 1 also when something the device has went untested
    #[arg(long, requires = "check")]
    pub strict: bool,
}

/// The target and backend policy of `--dra-metadata PATH`: the claim's device, and the backend
/// its metadata names unless `--backend` was given. Says on stderr what it found and where.
fn from_metadata(path: &std::path::Path, backend: Option<Policy>) -> Result<(Target, Option<Policy>)> {
    let d = metadata::find(path).map_err(super::error::Error::host)?;
    let target = match &d.target {
        Some(Bootable::Pci(a)) => VfioTarget::Pci(*a),
        Some(Bootable::Mdev(u)) => VfioTarget::Mdev(u.clone()),
        None => {
            return Err(super::error::Error::host(anyhow::anyhow!(
                "{}: not a PCI function or an mdev",
                d.describe()
            )))
        }
    };
    let (policy, why) = match (backend, d.backend) {
        (Some(p), _) => (Some(p), "--backend".to_string()),
        (None, Some(Backend::Legacy)) => (
            Some(Policy::Legacy),
            "the claim's gpupass.dev/backend".to_string(),
        ),
        (None, Some(Backend::Iommufd)) => (
            Some(Policy::Iommufd),
            "the claim's gpupass.dev/backend".to_string(),
        ),
        (None, None) => (
            None,
            "the default (the metadata names no gpupass.dev/backend)".to_string(),
        ),
    };
    crate::messages::text(&format!(
        "gpupass: --dra-metadata: {} from {}; backend {} by {why}\n",
        d.describe(),
        d.file.display(),
        policy.unwrap_or(Policy::Auto)
    ));
    Ok((Target::Vfio(target), policy))
}

fn parse_uuid_arg(s: &str) -> std::result::Result<String, String> {
    crate::vmm::vfio::parse_uuid(s).map_err(|e| e.to_string())
}

fn parse_timeout(s: &str) -> std::result::Result<std::time::Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(std::time::Duration::from_secs_f64(v)),
        _ => Err(format!(
            "invalid timeout {s:?}: expected seconds, more than 0 and at most 86400"
        )),
    }
}

/// Boot and print; the exit status is the firmware's, or with `--check` the self-test's: 0 when
/// no verdict is `fail` (and, with `--strict`, none is `untested`), 1 otherwise
/// ([`vmm::verdict`]).
pub(crate) fn run(ctx: &Ctx, args: Args, out: &mut dyn Write) -> Result<Exit> {
    let (target, backend) = match (args.device, args.mdev, &args.dra_metadata) {
        (Some(a), _, _) => (Target::Vfio(VfioTarget::Pci(a)), args.backend),
        (None, Some(u), _) => (Target::Vfio(VfioTarget::Mdev(u)), args.backend),
        (None, None, Some(p)) => from_metadata(p, args.backend)?,
        (None, None, None) => (Target::Emulated, args.backend),
    };
    let backend = backend.unwrap_or(Policy::Auto);
    let inv = match target {
        Target::Emulated => None,
        Target::Vfio(_) => Some(ctx.inventory()?),
    };
    let opts = BootOptions {
        target,
        memory: args.memory,
        firmware: args.firmware,
        timeout: args.timeout,
        read_loop: args.read_loop,
        read_bar: args.read_bar,
        backend,
        irq_loop: args.irq_loop,
        irq_path: args.irq_path,
        interrupts: args.check || args.irq_loop > 0,
    };
    let (host, inv) = (&ctx.host, inv.as_ref());
    if args.check {
        let report = vmm::verdict::CheckReport::new(vmm::boot(host, inv, &opts, None)?, args.strict);
        if ctx.json {
            let _ = serde_json::to_writer_pretty(&mut *out, &report);
            let _ = writeln!(out);
        } else {
            let _ = write!(out, "{}", report.lines());
            let _ = out.flush();
        }
        crate::messages::text(&report.summary_lines());
        return Ok(Exit::failure_if(!report.ok));
    }
    let report = if ctx.json {
        vmm::boot(host, inv, &opts, None)?
    } else {
        vmm::boot(host, inv, &opts, Some(out))?
    };
    if ctx.json {
        let _ = serde_json::to_writer_pretty(&mut *out, &report);
        let _ = writeln!(out);
    } else {
        let _ = out.flush();
        crate::messages::text(&summary(&report));
    }
    Ok(Exit(report.status))
}

use crate::vmm::report::size;

/// The human summary printed after the console.
pub(crate) fn summary(r: &BootReport) -> String {
    let mut s = format!(
        "gpupass: {}: firmware exited with status {} after {:.2} ms (setup {:.2} ms)\n",
        r.device,
        r.status,
        r.timing.run_us as f64 / 1000.0,
        r.timing.setup_us as f64 / 1000.0
    );
    if let Some(b) = r.backend {
        s.push_str(&format!(
            "gpupass: VFIO backend {b}: {}\n",
            r.vfio_nodes.join(" + ")
        ));
    }
    match r.mmio64_window {
        Some(w) => s.push_str(&format!(
            "gpupass: guest physical address width {} bits (CPUID); 64-bit BARs go to {:#x}-{:#x}\n",
            r.guest_phys_bits, w.base, w.limit
        )),
        None => s.push_str(&format!(
            "gpupass: guest physical address width {} bits (CPUID): no room for BARs above 4 GiB\n",
            r.guest_phys_bits
        )),
    }
    if let Some(rr) = &r.reset {
        s.push_str(&format!("gpupass: {}\n", rr.summary()));
    }
    let kinds: Vec<String> = r.exits.by_kind.iter().map(|(k, v)| format!("{k} {v}")).collect();
    s.push_str(&format!(
        "gpupass: {} VM exits: {}\n",
        r.exits.total,
        kinds.join(", ")
    ));
    for sl in &r.slots {
        match sl.gpa {
            Some(g) => s.push_str(&format!(
                "gpupass: BAR{} +{:#x} ({}) mapped as KVM slot {} at {g:#x}: guest accesses do not exit\n",
                sl.bar,
                sl.offset,
                size(sl.size),
                sl.slot
            )),
            None => s.push_str(&format!(
                "gpupass: BAR{} +{:#x} ({}) not mapped (BAR not decoded)\n",
                sl.bar,
                sl.offset,
                size(sl.size)
            )),
        }
    }
    for t in &r.trapped {
        s.push_str(&format!("gpupass: BAR{} trapped: {}\n", t.bar, t.reason));
    }
    if let (Some(w), Some(l)) = (&r.read_loop, &r.firmware.read_loop) {
        let per = if l.count > 0 {
            w.exits.total as f64 / l.count as f64
        } else {
            0.0
        };
        s.push_str(&format!(
            "gpupass: read loop: {} reads of BAR{} in {:.2} ms, {} VM exits ({per:.2} per read)\n",
            l.count,
            l.bar.map_or("?".to_string(), |b| b.to_string()),
            w.nanos as f64 / 1e6,
            w.exits.total
        ));
    }
    if let Some(k) = r.read_loop.as_ref().and_then(|w| w.kvm.as_ref()) {
        let v = |n: &str| k.delta.get(n).copied().unwrap_or(0);
        s.push_str(&format!(
            "gpupass: read loop, as KVM counted it (KVM_GET_STATS_FD, the end mark included): {} exits, {} MMIO, {} I/O, {} host-interrupt\n",
            v("exits"),
            v("mmio_exits"),
            v("io_exits"),
            v("irq_exits")
        ));
    }
    if r.dma_map_skipped {
        s.push_str(&format!(
            "gpupass: guest RAM NOT DMA-mapped ({} set): the device cannot reach guest memory\n",
            vmm::dma::NO_DMA_MAP_ENV
        ));
    }
    if let Some(d) = &r.dma {
        s.push_str(&format!(
            "gpupass: DMA: {}: {}{}\n",
            d.result,
            d.reason,
            d.nanos.map_or(String::new(), |n| format!(
                ", {:.1} ms for both transfers",
                n as f64 / 1e6
            ))
        ));
    }
    if let Some(i) = &r.isolation {
        let kernel = match (&r.kernel_faults, &i.kernel_fault_at_iova) {
            (_, Some(l)) => format!("; the kernel logged: {l}"),
            (Some(k), None) if k.error.is_some() => {
                format!(
                    "; the kernel's fault log was not readable ({})",
                    k.error.as_deref().unwrap_or("")
                )
            }
            _ => "; the kernel logged no IOMMU fault for it".to_string(),
        };
        s.push_str(&format!(
            "gpupass: isolation: {}: {}{kernel}\n",
            i.result, i.reason
        ));
    }
    if !r.firmware.done {
        s.push_str("gpupass: warning: the firmware did not print `FW done`\n");
    }
    s
}
