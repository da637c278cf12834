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
pub(crate) const QEMU_Q35_DEFAULT_HOLE64: u64 = 32 << 30;

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

/// Text that is not a `--pci-hole64` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid --pci-hole64 {text:?}: expected auto, off, or a power-of-two size like 64G or 2T")]
pub struct Hole64Error {
    pub text: String,
}

impl std::str::FromStr for Hole64 {
    type Err = Hole64Error;
    fn from_str(s: &str) -> Result<Self, Hole64Error> {
        match s {
            "auto" => return Ok(Hole64::Auto),
            "off" => return Ok(Hole64::Off),
            _ => {}
        }
        let bad = || Hole64Error { text: s.to_string() };
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
pub(crate) fn bars64(sel: &Selection) -> (u64, usize) {
    sel.functions()
        .flat_map(|f| f.device.bars.iter())
        .filter(|b| b.index <= 5 && b.kind == BarKind::Memory && b.is_64bit && b.size > 0)
        .fold((0u64, 0usize), |(s, n), b| (s.saturating_add(b.size), n + 1))
}

/// The window for `sel` under `mode`; `None` when nothing is to be set (no 64-bit BARs under
/// `auto`, or `off`).
pub(crate) fn mmio64(sel: &Selection, mode: Hole64) -> Option<Mmio64> {
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

/// The guest firmware that places the 64-bit BARs (`xml domain --firmware`; `qemu-args` and
/// `launch` emit OVMF's fw_cfg aperture and are checked as OVMF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestFirmware {
    Ovmf,
    SeaBios,
}

impl GuestFirmware {
    pub fn name(self) -> &'static str {
        match self {
            GuestFirmware::Ovmf => "OVMF",
            GuestFirmware::SeaBios => "SeaBIOS",
        }
    }
}

const GIB: u64 = 1 << 30;

fn align_up(v: u64, a: u64) -> u64 {
    if a <= 1 {
        return v;
    }
    v.div_ceil(a).saturating_mul(a)
}

/// The exclusive end of guest RAM in q35's address map: QEMU keeps all of a guest below
/// 4 GiB when it has less than 2.75 GiB, else 2 GiB below 4 GiB and the rest from 4 GiB up;
/// the 64-bit window starts at or above 4 GiB either way. `None` (RAM not known): 4 GiB.
pub(crate) fn q35_ram_top(ram: Option<u64>) -> u64 {
    match ram {
        Some(r) if r >= 0xb000_0000 => (4 * GIB).saturating_add(r - 2 * GIB),
        _ => 4 * GIB,
    }
}

/// Where AMD's HyperTransport hole starts (1012 GiB; it ends at 1 TiB).
pub(crate) const AMD_HT_START: u64 = 0xfd_0000_0000;
/// Where QEMU puts an AMD guest's RAM above 4 GiB when the layout would reach the hole.
pub(crate) const AMD_ABOVE_1TB_START: u64 = 1 << 40;

/// The top of guest RAM as QEMU lays it out, and whether it moved the RAM above 4 GiB to
/// 1 TiB: for an AMD guest CPU (`-cpu host` on an AMD host) QEMU (hw/i386/pc.c,
/// `pc_memory_init`, machine types 7.1+) relocates that RAM to start at 1 TiB when the highest
/// address it would use, the 64-bit window's end (`pci-hole64-size` above the RAM, aligned to
/// 1 GiB), reaches the HyperTransport hole at 1012 GiB; its own start check then refuses the
/// layout with "phys-bits too low" when the moved window ends past the CPU's width.
pub(crate) fn qemu_ram_top(ram: Option<u64>, window: u64, amd: bool) -> (u64, bool) {
    let top = q35_ram_top(ram);
    if amd && align_up(top, GIB).saturating_add(window).saturating_sub(1) >= AMD_HT_START {
        (top - 4 * GIB + AMD_ABOVE_1TB_START, true)
    } else {
        (top, false)
    }
}

/// Where the firmware puts the 64-bit window: `[base, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub ram_top: u64,
    pub base: u64,
    pub end: u64,
    /// QEMU moved the RAM above 4 GiB to 1 TiB (an AMD guest CPU whose layout reached the
    /// HyperTransport hole): `ram_top` is above 1 TiB.
    pub relocated: bool,
}

impl Placement {
    /// The physical address bits the window's end needs: the least `b` with `end <= 2^b`.
    pub(crate) fn bits(&self) -> u32 {
        bits_for(self.end)
    }
}

/// The least `b` with `end <= 2^b`.
pub(crate) fn bits_for(end: u64) -> u32 {
    if end <= 1 {
        0
    } else {
        64 - (end - 1).leading_zeros()
    }
}

/// The window's place as the firmware computes it, over `ram` bytes of guest RAM.
/// - OVMF (OvmfPkg/Library/PlatformInitLib/MemDetect.c, `PlatformGetFirstNonAddress`): the
///   aperture starts at the top of RAM above 4 GiB, aligned to 1 GiB and then to the largest
///   power of two not above its size (`window`, from `X-PciMmio64Mb`); it ends at base + size.
///   OVMF's dynamic window (newer builds, a trusted CPU width) is taken only when that layout
///   fits, so the classic end decides whether the BARs can be placed.
/// - SeaBIOS (src/fw/pciinit.c, `pci_bios_map_devices`): it ignores the window size and packs
///   the 64-bit BARs from the top of RAM, the base aligned to the largest one (at least 1 GiB),
///   the end rounded up to 1 GiB; the guest also gets QEMU's own window (base the top of RAM
///   aligned to 1 GiB, size `window`) in its ACPI tables, so the later end of the two counts.
///   `slots` is each guest slot's 64-bit BARs: (sum, largest); each root port's window is the
///   sum rounded up to the largest.
///
/// `amd`: the guest CPU is AMD's, whose RAM QEMU may move to 1 TiB first ([`qemu_ram_top`]).
pub(crate) fn place(
    fw: GuestFirmware,
    ram: Option<u64>,
    window: u64,
    slots: &[(u64, u64)],
    amd: bool,
) -> Placement {
    let (ram_top, relocated) = qemu_ram_top(ram, window, amd);
    match fw {
        GuestFirmware::Ovmf => {
            let size = align_up(window, GIB);
            let pow = if size == 0 {
                1
            } else {
                1u64 << (63 - size.leading_zeros())
            };
            let base = align_up(align_up(ram_top, GIB), pow);
            Placement {
                ram_top,
                base,
                end: base.saturating_add(size),
                relocated,
            }
        }
        GuestFirmware::SeaBios => {
            let largest = slots.iter().map(|s| s.1).max().unwrap_or(0).max(GIB);
            let sum = slots
                .iter()
                .fold(0u64, |a, (s, m)| a.saturating_add(align_up(*s, (*m).max(1))));
            let base = align_up(ram_top, largest);
            let bars_end = align_up(base.saturating_add(sum), GIB);
            let qemu_base = align_up(ram_top, GIB);
            let qemu_end = qemu_base.saturating_add(window);
            Placement {
                ram_top,
                base: base.min(qemu_base),
                end: bars_end.max(qemu_end),
                relocated,
            }
        }
    }
}

/// The 64-bit BARs of each guest slot of `sel`: (sum, largest).
pub(crate) fn slot_bars(sel: &Selection) -> Vec<(u64, u64)> {
    sel.slots()
        .map(|g| {
            g.functions
                .iter()
                .flat_map(|f| f.device.bars.iter())
                .filter(|b| b.index <= 5 && b.kind == BarKind::Memory && b.is_64bit && b.size > 0)
                .fold((0u64, 0u64), |(s, m), b| {
                    (s.saturating_add(b.size), m.max(b.size))
                })
        })
        .filter(|(s, _)| *s > 0)
        .collect()
}

/// The most guest RAM with which the window still ends within `bits` (`None`: not even with
/// none).
pub(crate) fn max_ram(
    fw: GuestFirmware,
    bits: u32,
    window: u64,
    slots: &[(u64, u64)],
    amd: bool,
) -> Option<u64> {
    let fits =
        |r: u64| place(fw, Some(r), window, slots, amd).end <= 1u64.checked_shl(bits).unwrap_or(u64::MAX);
    if !fits(0) {
        return None;
    }
    // The end never falls as RAM grows: the last whole GiB that fits.
    let (mut lo, mut hi) = (0u64, 1u64 << 24);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if fits(mid * GIB) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo * GIB)
}

/// The largest power-of-two window (1 GiB or more) that ends within `bits` over `ram`.
pub(crate) fn max_window(
    fw: GuestFirmware,
    ram: Option<u64>,
    bits: u32,
    slots: &[(u64, u64)],
    amd: bool,
) -> Option<u64> {
    let limit = 1u64.checked_shl(bits).unwrap_or(u64::MAX);
    (30..63u32)
        .rev()
        .map(|k| 1u64 << k)
        .find(|w| place(fw, ram, *w, slots, amd).end <= limit)
}

/// A VM layout that cannot work on this host, with the numbers and the fix (exit status 1;
/// docs/errors.md E-OUT-15..20). Decided before anything is printed or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// E-OUT-15, E-OUT-19.
    #[error(transparent)]
    Window(#[from] WindowRefusal),
    /// E-OUT-16.
    #[error("--numa strict: the devices are on host NUMA nodes {nodes}, and one guest node cannot be local to all of them; pass the devices of one node, or --numa auto; nothing was written")]
    NumaStrict { nodes: String },
    /// E-OUT-20.
    #[error("the devices span host NUMA nodes {nodes}, so the guest gets one NUMA node per host node, each with at least one vCPU: --vcpus {vcpus} is fewer than {needed}; pass --vcpus {needed} or more, or --numa off; nothing was written")]
    TooFewVcpus { nodes: String, vcpus: u32, needed: u32 },
    /// E-OUT-18.
    #[error("--hugepages {pages}: guest memory of {mib} MiB is not a whole number of {pages} pages; pass a --memory that is a multiple of {page_mib} MiB; nothing was written")]
    HugepagesNotWhole {
        pages: &'static str,
        mib: u64,
        page_mib: u64,
    },
    /// E-OUT-17.
    #[error("--hugepages {pages}: the guest needs {need} free {pages} pages on {place} ({mib} MiB), which has {free} free of {total} reserved; reserve more (echo N > {path}, or hugepagesz={pages} hugepages=N on the kernel command line), pass less --memory, or --hugepages off; nothing was written")]
    HugepagesShort {
        pages: &'static str,
        need: u64,
        /// `host node N` or `this host`.
        place: String,
        mib: u64,
        free: u64,
        total: u64,
        /// The pool file to write (a real-host path for the user, not one gpupass opens).
        path: String,
    },
}

/// Where the width that decides comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WidthSource {
    /// The host CPU's physical address bits, which the guest gets (`host-phys-bits=on`,
    /// `<maxphysaddr mode='passthrough'/>`).
    Cpu,
    /// `--phys-bits N`: the guest's width, limited below the host CPU's.
    PhysBits,
    /// The narrowest IOMMU unit's input address width: QEMU maps every BAR into the IOMMU at
    /// its guest address for peer-to-peer DMA.
    Iommu,
}

/// The address widths the window's end must fit (`None`: not known, not checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Widths {
    /// The host CPU's physical address bits (`/proc/cpuinfo`, "address sizes").
    pub cpu: Option<u32>,
    /// The host IOMMU's input address width (`sys/class/iommu`).
    pub iommu: Option<u32>,
    /// `--phys-bits N`.
    pub phys_bits: Option<u32>,
    /// The guest CPU is AMD's (the host's vendor, which `host-phys-bits`/host-passthrough
    /// guests get): QEMU may move its RAM above 4 GiB to 1 TiB ([`qemu_ram_top`]), which moves
    /// the window too.
    pub amd: bool,
}

impl Widths {
    /// The guest CPU's width: the host CPU's, or less with `--phys-bits`.
    pub(crate) fn guest(&self) -> Option<(u32, WidthSource)> {
        match (self.cpu, self.phys_bits) {
            (Some(c), Some(p)) if p < c => Some((p, WidthSource::PhysBits)),
            (Some(c), _) => Some((c, WidthSource::Cpu)),
            (None, Some(p)) => Some((p, WidthSource::PhysBits)),
            (None, None) => None,
        }
    }

    /// The narrowest width the window must fit (the IOMMU's on a tie).
    pub(crate) fn narrowest(&self) -> Option<(u32, WidthSource)> {
        match (self.iommu, self.guest()) {
            (Some(i), Some(g)) if g.0 < i => Some(g),
            (Some(i), _) => Some((i, WidthSource::Iommu)),
            (None, g) => g,
        }
    }

    /// Why the guest's address bits are limited to `limit`, for the notes.
    pub(crate) fn limit_reason(&self, limit: u32) -> String {
        match (self.phys_bits, self.iommu) {
            (Some(p), _) if p == limit => "--phys-bits".to_string(),
            (_, Some(i)) if i == limit => format!(
                "this host's IOMMU translates {i} bits{}",
                self.cpu.map(|c| format!(", its CPU has {c}")).unwrap_or_default()
            ),
            _ => "--phys-bits".to_string(),
        }
    }
}

/// The limit on the guest CPU's physical address bits that the outputs set
/// (`host-phys-bits-limit=N`, `<maxphysaddr mode='passthrough' limit='N'/>`): `--phys-bits`,
/// and the IOMMU's width when it is narrower than the host CPU's (or the CPU's is unknown), the
/// smaller of the two. Without it OVMF, which sizes its own aperture from the CPU's width, may put
/// BARs at addresses the IOMMU cannot map for peer-to-peer DMA. `None`: the host CPU's width as
/// it is (`host-phys-bits=on` alone).
pub(crate) fn phys_bits_limit(w: &Widths) -> Option<u32> {
    let iommu = w.iommu.filter(|i| match w.cpu {
        Some(c) => *i < c,
        None => true,
    });
    match (w.phys_bits, iommu) {
        (Some(p), Some(i)) => Some(p.min(i)),
        (p, i) => p.or(i),
    }
}

/// The window as the firmware places it over the guest's RAM, and what still fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowFit {
    pub fw: GuestFirmware,
    /// Guest RAM in bytes; `None`: QEMU's default (`qemu-args` without `--memory`).
    pub ram: Option<u64>,
    pub mmio: Mmio64,
    pub place: Placement,
    pub widths: Widths,
    /// The narrowest width and its source (`None`: no width known, nothing checked).
    pub limit: Option<(u32, WidthSource)>,
    /// The most guest RAM with which this window still fits `limit`.
    pub max_ram: Option<u64>,
    /// The largest window that fits `limit` over this RAM.
    pub max_window: Option<u64>,
}

/// A window whose end, as the firmware places it, lies past the guest CPU's or the IOMMU's
/// address width (E-OUT-15, E-OUT-19): the firmware would leave BARs unassigned, or VFIO could
/// not map them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowRefusal {
    pub fit: Box<WindowFit>,
    /// The width the end passes.
    pub bits: u32,
    pub source: WidthSource,
}

impl WindowRefusal {
    /// The docs/errors.md row.
    #[cfg(test)]
    pub(crate) fn code(&self) -> &'static str {
        match self.source {
            WidthSource::Iommu => "E-OUT-19",
            WidthSource::Cpu | WidthSource::PhysBits => "E-OUT-15",
        }
    }
}

/// `2 GiB`, `2.50 GiB`, `512 MiB`.
fn amount(v: u64) -> String {
    if v >= GIB && v % GIB == 0 {
        format!("{} GiB", v >> 30)
    } else if v >= GIB {
        format!("{:.2} GiB", v as f64 / GIB as f64)
    } else {
        format!("{:.2} MiB", v as f64 / (1u64 << 20) as f64)
    }
}

impl std::fmt::Display for WindowRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fit = &self.fit;
        let m = &fit.mmio;
        let ram = match fit.ram {
            Some(r) => format!("{} of guest RAM", amount(r)),
            None => "QEMU's default guest RAM (no --memory)".to_string(),
        };
        let moved = if fit.place.relocated {
            format!(
                " (QEMU put the RAM above 4 GiB at 1T-{}: an AMD guest CPU whose layout reaches the HyperTransport hole at 1012G)",
                size_suffix(fit.place.ram_top)
            )
        } else {
            String::new()
        };
        let how = match fit.fw {
            GuestFirmware::Ovmf => format!("above guest RAM{moved}, aligned to its own size"),
            GuestFirmware::SeaBios => {
                format!("above guest RAM{moved}, the BARs packed from the largest one's alignment")
            }
        };
        write!(
            f,
            "a 64-bit PCI window of {} (for {} 64-bit BAR(s), {} in all) over {ram} ends at {}: {} places it {how}, at {}-{}, so it needs {} physical address bits, but ",
            size_suffix(m.window),
            m.count,
            amount(m.bars),
            size_suffix(fit.place.end),
            fit.fw.name(),
            size_suffix(fit.place.base),
            size_suffix(fit.place.end),
            fit.place.bits(),
        )?;
        let other = |w: Option<u32>, what: &str| w.map(|b| format!("; {what}: {b} bits")).unwrap_or_default();
        match self.source {
            WidthSource::Cpu => write!(
                f,
                "the guest gets this host CPU's {} (/proc/cpuinfo, address sizes{})",
                self.bits,
                other(fit.widths.iommu, "IOMMU")
            )?,
            WidthSource::PhysBits => write!(
                f,
                "the guest gets {} (--phys-bits; this host's CPU has {})",
                self.bits,
                fit.widths.cpu.map_or("an unknown width".to_string(), |c| c.to_string())
            )?,
            WidthSource::Iommu => write!(
                f,
                "this host's IOMMU translates {} (sys/class/iommu: the narrowest unit's address width{}), so VFIO could not map the BARs for peer-to-peer DMA",
                self.bits,
                other(fit.widths.guest().map(|g| g.0), "guest CPU")
            )?,
        }
        let mut fixes = Vec::new();
        match (fit.ram, fit.max_ram) {
            (Some(r), Some(mr)) if mr < r => {
                fixes.push(format!("less guest RAM (--memory {} or less)", size_suffix(mr)))
            }
            _ => {}
        }
        fixes.push("fewer devices".to_string());
        match fit.max_window {
            Some(w) if w < m.window => fixes.push(format!(
                "a smaller window with --pci-hole64 SIZE (at most {} over this RAM)",
                size_suffix(w)
            )),
            _ => {}
        }
        if self.source == WidthSource::PhysBits {
            fixes.push("a larger --phys-bits".to_string());
        }
        write!(f, "; pass {}; nothing was written", fixes.join(", or "))
    }
}

impl std::error::Error for WindowRefusal {}

/// Place `mmio` as `fw` does over `ram` bytes of guest RAM (`None`: QEMU's default) and check
/// its end against the narrowest of `widths`. `slots`: the selection's 64-bit BARs per guest
/// slot ([`slot_bars`], SeaBIOS packs them).
pub(crate) fn fit_window(
    fw: GuestFirmware,
    ram: Option<u64>,
    mmio: Mmio64,
    slots: &[(u64, u64)],
    widths: Widths,
) -> Result<WindowFit, WindowRefusal> {
    let place = place(fw, ram, mmio.window, slots, widths.amd);
    let limit = widths.narrowest();
    let fit = WindowFit {
        fw,
        ram,
        mmio,
        place,
        widths,
        limit,
        max_ram: limit.and_then(|(b, _)| max_ram(fw, b, mmio.window, slots, widths.amd)),
        max_window: limit.and_then(|(b, _)| max_window(fw, ram, b, slots, widths.amd)),
    };
    match limit {
        Some((bits, source)) if place.bits() > bits => Err(WindowRefusal {
            fit: Box::new(fit),
            bits,
            source,
        }),
        _ => Ok(fit),
    }
}

/// What VFIO pins: all guest RAM, once per IOMMU address space, plus 1 GiB for what QEMU maps
/// besides (the rule libvirt applies, `qemuDomainGetMemLockLimitBytes`): one address space
/// without a vIOMMU; with one, each VFIO device gets its own (`devices` of them).
pub(crate) fn memlock_bytes(ram: u64, viommu: bool, devices: usize) -> u64 {
    let spaces = if viommu { devices.max(1) as u64 } else { 1 };
    ram.saturating_mul(spaces).saturating_add(1 << 30)
}

/// GPUDirect P2P cliques (QEMU's `x-nv-gpudirect-clique=N` on an NVIDIA vfio-pci device,
/// 0-15): NVIDIA GPUs of the selection behind one PCIe switch (the same upstream port two
/// bridges above each GPU: GPU -> switch downstream port -> switch upstream port) share a
/// clique, numbered by first appearance; a switch with one selected GPU gets none. The guest
/// driver only enables P2P between GPUs of one clique.
pub(crate) fn p2p_cliques(
    sel: &Selection,
    inv: &crate::model::Inventory,
) -> Vec<(crate::model::PciAddress, u8)> {
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
pub(crate) enum NumaPlacement {
    /// No function reports a node (a single-node host, or mdevs only).
    Unknown,
    /// Every function that reports a node is on this one; its CPUs (`local_cpulist`).
    One { node: i32, cpus: Option<String> },
    /// The functions span these nodes.
    Spans(Vec<i32>),
}

/// The NUMA placement of `sel` (pure: the inventory's `numa_node` and `local_cpulist`).
pub(crate) fn numa(sel: &Selection) -> NumaPlacement {
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

/// Where the guest goes on the host's NUMA nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GuestNuma {
    /// No placement (`--numa off`, or no device reports a node).
    Free,
    /// Every device on one node: vCPUs on its CPUs (when known), memory bound to it.
    Pinned { node: i32, cpus: Option<String> },
    /// Devices on several nodes: a guest node and a `pxb-pcie` per host node.
    Expanders(Expanders),
}

impl GuestNuma {
    /// Where guest RAM comes from, for the hugepage check: (host node, KiB) per share.
    pub(crate) fn demand(&self, memory_kib: u64) -> Vec<(Option<i32>, u64)> {
        match self {
            GuestNuma::Pinned { node, .. } => vec![(Some(*node), memory_kib)],
            GuestNuma::Expanders(x) if !x.cells.is_empty() => x
                .cells
                .iter()
                .map(|c| (Some(c.host_node), c.memory_kib))
                .collect(),
            _ => vec![(None, memory_kib)],
        }
    }
}

/// `--hugepages`: the page size that backs guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum HugePages {
    /// Normal 4 KiB pages (the default).
    #[default]
    Off,
    /// 2 MiB pages.
    #[value(name = "2M")]
    Mib2,
    /// 1 GiB pages.
    #[value(name = "1G")]
    Gib1,
}

impl HugePages {
    /// The page size in KiB, `None` for `off`.
    pub(crate) fn kib(self) -> Option<u64> {
        match self {
            HugePages::Off => None,
            HugePages::Mib2 => Some(2048),
            HugePages::Gib1 => Some(1 << 20),
        }
    }
    /// `2M` / `1G`, as the option is written.
    pub(crate) fn label(self) -> &'static str {
        match self {
            HugePages::Off => "off",
            HugePages::Mib2 => "2M",
            HugePages::Gib1 => "1G",
        }
    }
}

/// One guest NUMA node mirroring a host node: its vCPUs, its share of RAM, and the host CPUs
/// and node they are bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cell {
    pub host_node: i32,
    /// The host node's CPUs (`cpulist` of the node, else a device's `local_cpulist`).
    pub host_cpus: Option<String>,
    /// First and last vCPU of the cell.
    pub vcpus: (u32, u32),
    pub memory_kib: u64,
}

impl Cell {
    /// `0-3`, or `4` for a single vCPU.
    pub(crate) fn vcpu_list(&self) -> String {
        if self.vcpus.0 == self.vcpus.1 {
            self.vcpus.0.to_string()
        } else {
            format!("{}-{}", self.vcpus.0, self.vcpus.1)
        }
    }
}

/// Devices on several host nodes: one guest NUMA node and one PCIe expander bus (`pxb-pcie`)
/// per host node, each device behind a root port on the bus of its node (KubeVirt VEP 115's
/// `PCINUMAAwareTopology`; NVIDIA's VM guide asks for NUMA-local GPUs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expanders {
    /// Host nodes in ascending order, one expander each.
    pub nodes: Vec<i32>,
    /// Guest cells, one per node, when the guest's vCPUs and RAM are known (`xml domain`;
    /// `qemu-args --memory --vcpus`); empty otherwise (the expanders then carry no node).
    pub cells: Vec<Cell>,
    /// Per selection target: the index into `nodes` of its expander, `None` for `pcie.0` (a
    /// device with no node).
    pub target_node: Vec<Option<usize>>,
}

/// The host node a target sits on: a PCI slot's first function's, an mdev's parent's.
pub(crate) fn target_node(t: &crate::output::selection::Target) -> Option<i32> {
    use crate::output::selection::Target;
    match t {
        Target::Slot(g) => g.functions.first().and_then(|f| f.device.numa_node),
        Target::Mdev(m) => m.parent.as_ref().and_then(|p| p.numa_node),
    }
    .filter(|n| *n >= 0)
}

/// The host CPUs of `node`: the node's `cpulist`, else the `local_cpulist` of a selected
/// function on it.
pub(crate) fn node_cpus(sel: &Selection, inv: &crate::model::Inventory, node: i32) -> Option<String> {
    inv.numa_nodes
        .iter()
        .find(|n| n.node == node)
        .and_then(|n| n.cpulist.clone())
        .or_else(|| {
            sel.functions()
                .find(|f| f.device.numa_node == Some(node))
                .and_then(|f| f.device.local_cpulist.clone())
        })
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
}

/// Lay out expanders for devices spanning `nodes`; with `guest` (vCPUs, RAM KiB, page KiB) also
/// the guest cells: vCPUs split as evenly as they go (the first cells get the remainder), RAM
/// in equal shares of whole pages (the last cell gets the rest). Errs when there are fewer
/// vCPUs than nodes.
pub(crate) fn expanders(
    sel: &Selection,
    inv: &crate::model::Inventory,
    nodes: &[i32],
    guest: Option<(u32, u64, u64)>,
) -> Result<Expanders, Refusal> {
    let target_node = sel
        .targets
        .iter()
        .map(|t| target_node(t).and_then(|n| nodes.iter().position(|m| *m == n)))
        .collect();
    let mut cells = Vec::new();
    if let Some((vcpus, memory_kib, page_kib)) = guest {
        let k = nodes.len() as u32;
        if vcpus < k {
            return Err(Refusal::TooFewVcpus {
                nodes: join_nodes(nodes),
                vcpus,
                needed: k,
            });
        }
        let page = page_kib.max(1024);
        let share = memory_kib / u64::from(k) / page * page;
        let (base, extra) = (vcpus / k, vcpus % k);
        let mut next = 0u32;
        for (i, n) in nodes.iter().enumerate() {
            let count = base + u32::from((i as u32) < extra);
            let memory = if i + 1 == nodes.len() {
                memory_kib - share * u64::from(k - 1)
            } else {
                share
            };
            cells.push(Cell {
                host_node: *n,
                host_cpus: node_cpus(sel, inv, *n),
                vcpus: (next, next + count - 1),
                memory_kib: memory,
            });
            next += count;
        }
    }
    Ok(Expanders {
        nodes: nodes.to_vec(),
        cells,
        target_node,
    })
}

/// `0, 1`.
pub(crate) fn join_nodes(nodes: &[i32]) -> String {
    nodes.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ")
}

/// `--hugepages`: refuse guest RAM that is not whole pages, or more pages than the host nodes
/// the guest is bound to have free (`free_hugepages`; the whole host when the guest is not
/// bound). `demand` is (host node or `None` for anywhere, KiB). The host's hugepage pools come
/// from the inventory; a host that reports none is not checked (`Ok(false)`).
pub(crate) fn check_hugepages(
    inv: &crate::model::Inventory,
    pages: HugePages,
    memory_kib: u64,
    demand: &[(Option<i32>, u64)],
) -> Result<bool, Refusal> {
    let Some(page) = pages.kib() else {
        return Ok(true);
    };
    if memory_kib % page != 0 {
        return Err(Refusal::HugepagesNotWhole {
            pages: pages.label(),
            mib: memory_kib >> 10,
            page_mib: page >> 10,
        });
    }
    if inv.numa_nodes.is_empty() {
        return Ok(false);
    }
    let pool = |n: &crate::model::NumaNode| {
        n.hugepages
            .iter()
            .find(|p| p.size_kib == page)
            .map_or((0, 0), |p| (p.free, p.total))
    };
    for (node, kib) in demand {
        let need = kib.div_ceil(page);
        let (free, total, place, path) = match node {
            Some(n) => {
                let (free, total) = inv.numa_nodes.iter().find(|x| x.node == *n).map_or((0, 0), pool);
                (
                    free,
                    total,
                    format!("host node {n}"),
                    format!("/sys/devices/system/node/node{n}/hugepages/hugepages-{page}kB/nr_hugepages"),
                )
            }
            None => {
                let (free, total) = inv
                    .numa_nodes
                    .iter()
                    .map(pool)
                    .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
                (
                    free,
                    total,
                    "this host".to_string(),
                    format!("/sys/kernel/mm/hugepages/hugepages-{page}kB/nr_hugepages"),
                )
            }
        };
        if need > free {
            return Err(Refusal::HugepagesShort {
                pages: pages.label(),
                need,
                place,
                mib: kib >> 10,
                free,
                total,
                path,
            });
        }
    }
    Ok(true)
}

/// A power-of-two size for QEMU and notes: `64G`, `2T`, `512M`.
pub(crate) fn size_suffix(v: u64) -> String {
    if v >= 1 << 40 && v % (1 << 40) == 0 {
        format!("{}T", v >> 40)
    } else if v % (1 << 30) == 0 {
        format!("{}G", v >> 30)
    } else {
        format!("{}M", v >> 20)
    }
}

#[cfg(test)]
mod tests;
