//! The VM outputs' plan (docs/vm-outputs.md): a typed request ([`VmRequest`]: memory, vCPUs,
//! firmware, window, address bits, NUMA, hugepages, QEMU's `-cpu`) turned into a [`VmPlan`] by
//! one pure function over the inventory and the selection ([`plan`]): the 64-bit window and
//! where the firmware puts it, the guest's address-bit limit and the CPU that carries it, the
//! NUMA placement, the hugepage check, the P2P cliques, what VFIO pins, and the notes to print,
//! as data. A layout that cannot work is a typed [`Refusal`], decided before anything is printed
//! or written. The commands (`cli/vmout`) build the request from their options, print the notes
//! and hand the plan to the renderers (`output::libvirt`, `output::qemu`).

use crate::model::{Inventory, PciAddress};
use crate::output::layout::{
    self, GuestFirmware, GuestNuma, Hole64, HugePages, Mmio64, NumaPlacement, Widths, WindowFit,
};
use crate::output::selection::Selection;

pub use crate::output::layout::Refusal;

/// `--numa`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NumaMode {
    /// Place by the devices' nodes: one node pinned, several mirrored by expanders.
    Auto,
    /// As `Auto`, and devices on several nodes are refused (E-OUT-16).
    Strict,
    /// No placement.
    Off,
}

/// Who renders the plan: the notes differ (libvirt owns the process and its limits; QEMU's
/// arguments do not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renderer {
    Libvirt,
    Qemu,
}

/// What a VM-output command asks for, beside the devices (the [`Selection`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VmRequest {
    pub renderer: Renderer,
    /// Guest RAM in KiB; `None`: the VMM's default (`qemu-args` without `--memory`).
    pub memory_kib: Option<u64>,
    pub vcpus: Option<u32>,
    pub firmware: GuestFirmware,
    pub hole64: Hole64,
    /// `--phys-bits`.
    pub phys_bits: Option<u32>,
    pub numa: NumaMode,
    pub hugepages: HugePages,
    /// An emulated IOMMU in the guest (each VFIO device pins RAM in its own address space).
    pub viommu: bool,
    /// `<memtune><hard_limit>` is set to what VFIO pins (libvirt).
    pub memtune: bool,
    /// QEMU: the `-cpu` model and flags the guest gets when the plan sets its address bits
    /// (`none`: the caller's own `-cpu`, to which a note says what to add); `None`: no `-cpu`
    /// (libvirt, whose `<cpu>` the domain writes).
    pub cpu: Option<String>,
}

/// The guest CPU `qemu-args` sets: the user's model and flags (`host` by default) with the host
/// CPU's physical address bits, at most `limit` ([`crate::output::layout::phys_bits_limit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestCpu {
    pub model: String,
    pub limit: Option<u32>,
}

impl GuestCpu {
    /// The `-cpu` value.
    pub(crate) fn value(&self) -> String {
        let mut v = format!("{},host-phys-bits=on", self.model);
        if let Some(n) = self.limit {
            v.push_str(&format!(",host-phys-bits-limit={n}"));
        }
        v
    }
}

/// What the plan decided, to be said on stderr (`note: ...`), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Note {
    /// libvirt: what the VM locks, and whether `<memtune>` is set to it.
    Memlock { bytes: u64, viommu: bool, memtune: bool },
    /// The window's size and where the firmware puts it.
    Window(WindowFit),
    /// The NUMA placement.
    Numa {
        numa: GuestNuma,
        renderer: Renderer,
        /// `--memory` was given (QEMU binds memory only through a backend).
        memory_bound: bool,
    },
    /// What backs guest RAM, and whether the free pages were checked.
    Hugepages { pages: HugePages, checked: bool },
    /// How many GPUs share a P2P clique.
    Cliques { gpus: usize, renderer: Renderer },
    /// QEMU: its memlock limit must cover guest RAM.
    QemuMemlock,
    /// QEMU: what `-cpu` gives the guest, and how to keep it with a `-cpu` of one's own.
    Cpu { cpu: GuestCpu, widths: Widths },
}

/// The plan the renderers take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VmPlan {
    /// The 64-bit window to set (`None`: none, `--pci-hole64 off` or no 64-bit BARs).
    pub mmio: Option<Mmio64>,
    /// Where the firmware places it, checked against `widths`.
    pub fit: Option<WindowFit>,
    /// This host's address widths and `--phys-bits`.
    pub widths: Widths,
    /// The limit on the guest's physical address bits ([`layout::phys_bits_limit`]).
    pub phys_limit: Option<u32>,
    pub numa: GuestNuma,
    pub memory_kib: Option<u64>,
    pub vcpus: Option<u32>,
    pub hugepages: HugePages,
    /// GPUDirect P2P cliques.
    pub cliques: Vec<(PciAddress, u8)>,
    /// What VFIO pins, in bytes (libvirt; `None` for QEMU, whose RAM may be unknown).
    pub memlock_bytes: Option<u64>,
    /// QEMU: the guest CPU when the plan sets its address bits ([`VmRequest::cpu`]).
    pub cpu: Option<GuestCpu>,
    pub notes: Vec<Note>,
}

impl Default for VmPlan {
    /// Nothing planned: no window, no placement, no memory (a renderer's arguments for the
    /// devices alone).
    fn default() -> Self {
        VmPlan {
            mmio: None,
            fit: None,
            widths: Widths::default(),
            phys_limit: None,
            numa: GuestNuma::Free,
            memory_kib: None,
            vcpus: None,
            hugepages: HugePages::Off,
            cliques: Vec::new(),
            memlock_bytes: None,
            cpu: None,
            notes: Vec::new(),
        }
    }
}

impl VmPlan {
    /// The guest's address bits are to be set: a window lies above RAM, or they are limited.
    pub(crate) fn sets_address_bits(&self) -> bool {
        self.mmio.is_some() || self.phys_limit.is_some()
    }
}

/// The NUMA placement for `mode`: one node's CPUs and memory, expanders mirroring several
/// nodes, or nothing. `guest`: (vCPUs, RAM KiB, page KiB) when known.
pub(crate) fn numa_plan(
    sel: &Selection,
    inv: &Inventory,
    mode: NumaMode,
    guest: Option<(u32, u64, u64)>,
) -> Result<GuestNuma, Refusal> {
    if mode == NumaMode::Off {
        return Ok(GuestNuma::Free);
    }
    match layout::numa(sel) {
        NumaPlacement::One { node, cpus } => {
            let cpus = cpus.or_else(|| layout::node_cpus(sel, inv, node));
            Ok(GuestNuma::Pinned { node, cpus })
        }
        NumaPlacement::Unknown => Ok(GuestNuma::Free),
        NumaPlacement::Spans(nodes) => {
            if mode == NumaMode::Strict {
                return Err(Refusal::NumaStrict {
                    nodes: layout::join_nodes(&nodes),
                });
            }
            Ok(GuestNuma::Expanders(layout::expanders(sel, inv, &nodes, guest)?))
        }
    }
}

/// The plan for `sel` on `inv` as `req` asks (pure: the inventory and the selection only).
pub(crate) fn plan(inv: &Inventory, sel: &Selection, req: &VmRequest) -> Result<VmPlan, Refusal> {
    let widths = Widths {
        cpu: inv.cpu_phys_bits.map(u32::from),
        iommu: inv.iommu_addr_bits.map(u32::from),
        phys_bits: req.phys_bits,
        // The guest gets the host's CPU vendor (`-cpu host`, host-passthrough).
        amd: inv.cpu_vendor.as_deref() == Some("AuthenticAMD"),
    };
    let mmio = layout::mmio64(sel, req.hole64);
    let fit = match mmio {
        Some(m) => Some(layout::fit_window(
            req.firmware,
            req.memory_kib.map(|k| k << 10),
            m,
            &layout::slot_bars(sel),
            widths,
        )?),
        None => None,
    };
    let guest = match (req.vcpus, req.memory_kib) {
        (Some(v), Some(m)) => Some((v, m, req.hugepages.kib().unwrap_or(0))),
        _ => None,
    };
    let numa = numa_plan(sel, inv, req.numa, guest)?;
    let checked = match req.memory_kib {
        Some(m) => layout::check_hugepages(inv, req.hugepages, m, &numa.demand(m))?,
        None => true,
    };
    let cliques = layout::p2p_cliques(sel, inv);
    let memlock_bytes = match (req.renderer, req.memory_kib) {
        (Renderer::Libvirt, Some(m)) => Some(layout::memlock_bytes(
            m << 10,
            req.viommu,
            sel.functions().count() + sel.mdevs().count(),
        )),
        _ => None,
    };
    let phys_limit = layout::phys_bits_limit(&widths);
    let cpu = req
        .cpu
        .clone()
        .filter(|_| mmio.is_some() || phys_limit.is_some())
        .map(|model| GuestCpu {
            model,
            limit: phys_limit,
        });
    let mut notes = Vec::new();
    if let Some(bytes) = memlock_bytes {
        notes.push(Note::Memlock {
            bytes,
            viommu: req.viommu,
            memtune: req.memtune,
        });
    }
    if let Some(f) = fit {
        notes.push(Note::Window(f));
    }
    notes.push(Note::Numa {
        numa: numa.clone(),
        renderer: req.renderer,
        memory_bound: req.memory_kib.is_some(),
    });
    notes.push(Note::Hugepages {
        pages: req.hugepages,
        checked,
    });
    notes.push(Note::Cliques {
        gpus: cliques.len(),
        renderer: req.renderer,
    });
    if req.renderer == Renderer::Qemu && !sel.targets.is_empty() {
        notes.push(Note::QemuMemlock);
    }
    if let Some(cpu) = &cpu {
        notes.push(Note::Cpu {
            cpu: cpu.clone(),
            widths,
        });
    }
    notes.retain(|n| !n.is_silent());
    Ok(VmPlan {
        mmio,
        fit,
        widths,
        phys_limit,
        numa,
        memory_kib: req.memory_kib,
        vcpus: req.vcpus,
        hugepages: req.hugepages,
        cliques,
        memlock_bytes,
        cpu,
        notes,
    })
}

impl Note {
    /// Notes with nothing to say (no placement, normal pages, no clique).
    fn is_silent(&self) -> bool {
        match self {
            Note::Numa { numa, .. } => *numa == GuestNuma::Free,
            Note::Hugepages { pages, .. } => pages.kib().is_none(),
            Note::Cliques { gpus, .. } => *gpus == 0,
            _ => false,
        }
    }
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::output::layout::{join_nodes, size_suffix, WidthSource};
        match self {
            Note::Memlock {
                bytes,
                viommu,
                memtune,
            } => write!(
                f,
                "VFIO pins all guest RAM: this VM locks up to {} MiB ({}){}",
                bytes >> 20,
                if *viommu {
                    "RAM per VFIO device behind the vIOMMU + 1 GiB"
                } else {
                    "RAM + 1 GiB"
                },
                if *memtune {
                    "; <memtune><hard_limit> is set to it, which is also the domain's memory cgroup limit (--memtune off leaves both to libvirt)"
                } else {
                    ""
                }
            ),
            Note::Window(fit) => {
                let h = &fit.mmio;
                let widths = match fit.limit {
                    None => "the host's address widths are unknown, so it was not checked against them"
                        .to_string(),
                    Some((bits, source)) => {
                        let what = match source {
                            WidthSource::Cpu => "the guest CPU's, the host's",
                            WidthSource::PhysBits => "the guest CPU's, --phys-bits",
                            WidthSource::Iommu => "the IOMMU's",
                        };
                        let ram = match (fit.ram, fit.max_ram) {
                            (_, None) => String::new(),
                            (Some(_), Some(m)) => format!(
                                "; it stays within them with up to {} of guest RAM",
                                size_suffix(m)
                            ),
                            (None, Some(m)) => format!(
                                "; that is for QEMU's default RAM: with --memory the window moves up, and it stays within them with up to {}",
                                size_suffix(m)
                            ),
                        };
                        format!("within {bits} address bits ({what}){ram}")
                    }
                };
                write!(
                    f,
                    "64-bit PCI window {} for {} 64-bit BAR(s) of {} in all (docs/vm-outputs.md; --pci-hole64 off|SIZE to change it); {} places it at {}-{}, {widths}",
                    size_suffix(h.window),
                    h.count,
                    if h.bars >= 1 << 30 {
                        format!("{:.2} GiB", h.bars as f64 / (1u64 << 30) as f64)
                    } else {
                        format!("{:.2} MiB", h.bars as f64 / (1u64 << 20) as f64)
                    },
                    fit.fw.name(),
                    size_suffix(fit.place.base),
                    size_suffix(fit.place.end),
                )
            }
            Note::Numa {
                numa,
                renderer,
                memory_bound,
            } => {
                let qemu = *renderer == Renderer::Qemu;
                match numa {
                    GuestNuma::Free => Ok(()),
                    GuestNuma::Pinned { node, .. } if qemu && *memory_bound => write!(
                        f,
                        "the devices are on host NUMA node {node}: guest RAM is bound to it (memory backend host-nodes={node}); pin QEMU's threads to its CPUs with `numactl --cpunodebind={node}`"
                    ),
                    GuestNuma::Pinned { node, cpus } if qemu => write!(
                        f,
                        "the devices are on host NUMA node {node}: run QEMU under `numactl --cpunodebind={node} --membind={node}`{} (--memory binds guest RAM to the node with a memory backend; --numa off to leave placement alone)",
                        match cpus {
                            Some(c) => format!(" (its CPUs: {c})"),
                            None => String::new(),
                        }
                    ),
                    GuestNuma::Pinned { node, cpus } => write!(
                        f,
                        "the devices are on host NUMA node {node}: vCPUs on its CPUs ({}), guest memory bound to it (--numa off to leave placement to libvirt)",
                        cpus.as_deref().unwrap_or("local_cpulist unknown: not pinned")
                    ),
                    GuestNuma::Expanders(x) if x.cells.is_empty() => write!(
                        f,
                        "the devices span host NUMA nodes {}: one pxb-pcie expander bus per node with the devices behind root ports on their node's bus; pass --memory and --vcpus to also give the guest one NUMA node per host node (numa_node= on each expander, memory bound to its host node)",
                        join_nodes(&x.nodes)
                    ),
                    GuestNuma::Expanders(x) => {
                        let cells: Vec<String> = x
                            .cells
                            .iter()
                            .enumerate()
                            .map(|(i, c)| {
                                format!(
                                    "guest node {i} = host node {} (vCPUs {}, {} MiB)",
                                    c.host_node,
                                    c.vcpu_list(),
                                    c.memory_kib >> 10
                                )
                            })
                            .collect();
                        write!(
                            f,
                            "the devices span host NUMA nodes {}: the guest gets one NUMA node per host node ({}), each with a pxb-pcie expander bus whose root ports hold that node's devices, so the guest driver sees each device local to its vCPUs and memory (KubeVirt VEP 115; --numa off for one flat node)",
                            join_nodes(&x.nodes),
                            cells.join("; ")
                        )
                    }
                }
            }
            Note::Hugepages { pages, checked } => write!(
                f,
                "guest RAM on {} hugepages{}",
                pages.label(),
                if *checked {
                    ", enough free on the nodes it is bound to"
                } else {
                    "; the inventory has no hugepage pools (sys/devices/system/node), so whether enough are free was not checked"
                }
            ),
            Note::Cliques { gpus, renderer } => write!(
                f,
                "GPUDirect P2P: {gpus} GPU(s) behind a shared PCIe switch get x-nv-gpudirect-clique (one clique per switch){}",
                if *renderer == Renderer::Qemu {
                    ""
                } else {
                    "; libvirt has no element for it: <qemu:override> sets the property on each hostdev's QEMU device (libvirt 8.2+)"
                }
            ),
            Note::QemuMemlock => write!(
                f,
                "VFIO pins all guest RAM: QEMU's RLIMIT_MEMLOCK must cover guest RAM + 1 GiB (ulimit -l, or LimitMEMLOCK= in its unit) unless it runs as root"
            ),
            Note::Cpu { cpu, widths } => {
                let props = match cpu.limit {
                    Some(n) => format!("host-phys-bits=on,host-phys-bits-limit={n}"),
                    None => "host-phys-bits=on".to_string(),
                };
                let why = match cpu.limit {
                    Some(n) => format!(
                        "the host CPU's physical address bits, at most {n} ({})",
                        widths.limit_reason(n)
                    ),
                    None => "the host CPU's physical address bits".to_string(),
                };
                if cpu.model == "none" {
                    write!(
                        f,
                        "--cpu none: add {props} to your -cpu, so the guest gets {why} and the firmware can place the 64-bit window above RAM"
                    )
                } else {
                    write!(
                        f,
                        "-cpu {}: the guest gets {why}, so the firmware can place the 64-bit window above RAM; QEMU takes only the last -cpu, so pass your own model and flags as --cpu MODEL,FLAGS (or --cpu none and add {props} to yours)",
                        cpu.value()
                    )
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
