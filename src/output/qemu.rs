//! QEMU command-line arguments for passthrough on a q35 machine.
//!
//! Each guest slot gets its own `pcie-root-port` on `pcie.0` (a PCIe device behind a root
//! port is what a physical GPU sees, and drivers look at the link), and the VFIO devices sit
//! on slot 0 of that port's bus. Pure: works from the [`Selection`] only.
//!
//! QEMU facts encoded here (`-device vfio-pci,help`, `-device pcie-root-port,help`, QEMU 7.2):
//! - `vfio-pci,host=DDDD:BB:DD.F` opens a PCI function through `/dev/vfio/<group>`; with
//!   `iommufd=ID` (QEMU 8.2+) through its cdev `/dev/vfio/devices/vfioN` and the
//!   `-object iommufd,id=ID` (`/dev/iommu`) instead;
//!   `vfio-pci,sysfsdev=PATH` opens an mdev by its sysfs directory.
//! - Pre-opened file descriptors (docs/iommufd.md, `gpupass launch`): `-object
//!   iommufd,id=ID,fd=N` uses an inherited `/dev/iommu`, and `vfio-pci,fd=M,iommufd=ID` an
//!   inherited cdev instead of `host=` (QEMU accepts `fd=` only with `iommufd=`).
//! - `addr=SS.F` places a device at slot SS function F of its bus; function 0 of a slot with
//!   siblings needs `multifunction=on`, and a slot without function 0 is invisible to guests.
//! - `pcie-root-port` needs a unique `chassis` (with the default `slot=0`); eight ports can
//!   share one `pcie.0` slot as functions 0-7. q35 keeps slot 0x1f for the ICH9 LPC/SATA/SMBus.
//! - `rombar=0` hides the expansion ROM BAR; `romfile=PATH` substitutes a ROM image;
//!   `display=on` exposes a vGPU's display to QEMU's console.
//! - In an option value a literal `,` is written `,,`.
//! - `x-nv-gpudirect-clique=N` (0-15) on an NVIDIA vfio-pci device tells the guest driver which
//!   GPUs may do GPUDirect P2P with each other (those of one clique).
//! - `-cpu MODEL,host-phys-bits=on` gives the guest the host CPU's physical address bits (KVM;
//!   QEMU 2.7+), `host-phys-bits-limit=N` at most N of them (QEMU 3.0+); the last `-cpu` of a
//!   command line is the one QEMU takes, whole.
//! - `-global q35-pcihost.pci-hole64-size=SIZE` sizes q35's 64-bit PCI window (default 32G);
//!   `-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=MIB` gives OVMF the same aperture (SeaBIOS
//!   ignores the file). See [`crate::output::layout`].

use crate::output::layout::{GuestNuma, HugePages};
pub use crate::output::plan::GuestCpu;
use crate::output::plan::VmPlan;
use crate::output::selection::{Selection, Target};

/// Why arguments could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QemuError {
    #[error("{ports} guest slots need root ports up to pcie.0 slot {last:#04x}, past the last free q35 slot 0x1e; start lower with --first-slot or pass fewer devices")]
    TooManySlots { ports: usize, last: usize },
    #[error("{what} needs the guest's memory: pass --memory SIZE")]
    NeedsMemory { what: &'static str },
    #[error("--first-slot {slot:#04x} is not a usable pcie.0 slot: use 0x01-0x1e (q35 keeps 0x00 for the host bridge and 0x1f for the LPC/SATA/SMBus functions)")]
    BadFirstSlot { slot: u8 },
    #[error("--backend iommufd: the QEMU {version} ({source_}) cannot open VFIO devices through iommufd: -object iommufd and vfio-pci's iommufd= need QEMU {needed}; name the QEMU the VM runs with --qemu BINARY or --qemu-version (8.2 or newer), or use --backend legacy or auto")]
    IommufdTooOld {
        version: QemuVersion,
        /// Where the version came from (`from --qemu-version`, `/usr/bin/qemu-system-x86_64
        /// --version`).
        source_: String,
        needed: QemuVersion,
    },
}

/// A QEMU release, as `--qemu-version X.Y[.Z]` names it or `qemu-system-x86_64 --version`
/// prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct QemuVersion {
    pub major: u32,
    pub minor: u32,
}

impl QemuVersion {
    /// `-object iommufd` and `vfio-pci,iommufd=` (QEMU 8.2.0's changelog: "VFIO: iommufd
    /// backend").
    pub const IOMMUFD: QemuVersion = QemuVersion { major: 8, minor: 2 };

    /// The version in `qemu-system-x86_64 --version`'s first line: `QEMU emulator version
    /// 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)`.
    pub(crate) fn from_version_output(text: &str) -> Option<QemuVersion> {
        let line = text.lines().next()?;
        let rest = line.trim().strip_prefix("QEMU emulator version ")?;
        rest.split_whitespace().next()?.parse().ok()
    }
}

impl std::fmt::Display for QemuVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Text that is not a QEMU version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid QEMU version {text:?}: expected MAJOR.MINOR[.MICRO] like 8.2 or 10.0.2")]
pub struct QemuVersionError {
    pub text: String,
}

impl std::str::FromStr for QemuVersion {
    type Err = QemuVersionError;
    /// `8.2`, `10.0.2`, and a release candidate's `8.1.90` (8.2.0-rc0 counts as 8.1).
    fn from_str(s: &str) -> Result<Self, QemuVersionError> {
        let bad = || QemuVersionError { text: s.to_string() };
        let parts: Vec<&str> = s.trim().split('.').collect();
        if !(2..=3).contains(&parts.len())
            || parts
                .iter()
                .any(|p| p.is_empty() || p.len() > 6 || !p.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(bad());
        }
        let (major, minor): (u32, u32) = (
            parts[0].parse().map_err(|_| bad())?,
            parts[1].parse().map_err(|_| bad())?,
        );
        if major == 0 {
            return Err(bad());
        }
        Ok(QemuVersion { major, minor })
    }
}

/// Options for `gpupass qemu-args`.
#[derive(Debug, Clone)]
pub(crate) struct QemuOptions {
    /// `rombar=1|0` on the functions the user named.
    pub rom_bar: Option<bool>,
    /// `romfile=PATH` on the functions the user named.
    pub rom_file: Option<String>,
    /// `display=on` on display-capable mdevs.
    pub display: bool,
    /// First `pcie.0` slot for the root ports (default 0x10, clear of the slots QEMU's
    /// default devices take).
    pub first_slot: u8,
    /// Open the PCI functions through iommufd (`-object iommufd,id=iommufd0` and `iommufd=`
    /// on each `vfio-pci,host=`), not the legacy group and container (docs/iommufd.md).
    pub iommufd: bool,
    /// With `iommufd`: file descriptors the QEMU process inherits (`gpupass launch`).
    pub fds: Option<PassedFds>,
    /// `-cpu MODEL,host-phys-bits=on[,host-phys-bits-limit=N]` when the plan sets the guest's
    /// address bits; `None`: never a `-cpu` (the caller's own).
    pub cpu: Option<String>,
    /// `-m`, `-smp` and the memory backends from the plan's RAM and vCPUs; `false`: the caller
    /// sets them (`gpupass launch`: the VMM's own `-m`).
    pub guest_memory: bool,
}

/// The first bus number of expander `i` (`pxb-pcie,bus_nr=`): 0x80, 0x90, ... so each gets 16
/// buses for its root ports and `pcie.0` keeps 0x00-0x7f.
pub(crate) fn pxb_bus_nr(i: usize) -> usize {
    0x80 + 0x10 * i
}

/// Descriptors opened by a privileged parent for QEMU to inherit: `/dev/iommu` and one cdev
/// per PCI function.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PassedFds {
    pub iommufd: i32,
    pub devices: Vec<(crate::model::PciAddress, i32)>,
}

/// The id of the one iommufd object the arguments create.
pub(crate) const IOMMUFD_ID: &str = "iommufd0";

impl Default for QemuOptions {
    fn default() -> Self {
        QemuOptions {
            rom_bar: None,
            rom_file: None,
            display: false,
            first_slot: 0x10,
            iommufd: false,
            fds: None,
            cpu: None,
            guest_memory: true,
        }
    }
}

/// The path of an mdev **as QEMU on the host sees it**: `/sys/bus/mdev/devices/<uuid>`.
///
/// This is deliberately not built from `HostRoot`: it is not a path gpupass reads, it is an
/// argument for a QEMU process that runs on the real host, where sysfs is at `/sys` — even
/// when gpupass rendered from a snapshot (`--root`) or a saved inventory (`--from-json`).
pub(crate) fn mdev_sysfsdev_for_qemu(uuid: &str) -> String {
    format!("/sys/bus/mdev/devices/{uuid}")
}

/// Escape a value for a QEMU `-device` option list (`,` → `,,`).
pub(crate) fn escape_value(v: &str) -> String {
    v.replace(',', ",,")
}

/// What the arguments take from the plan.
struct FromPlan<'a> {
    hole64: Option<crate::output::layout::Mmio64>,
    cliques: &'a [(crate::model::PciAddress, u8)],
    memory_kib: Option<u64>,
    vcpus: Option<u32>,
    hugepages: HugePages,
    numa: &'a GuestNuma,
    cpu: Option<GuestCpu>,
}

/// The argument vector for `sel` under `plan` (the window, the guest's address bits, NUMA,
/// memory, hugepages, cliques): `["-device", "pcie-root-port,...", "-device", "vfio-pci,...",
/// ...]`.
pub(crate) fn args(sel: &Selection, opts: &QemuOptions, plan: &VmPlan) -> Result<Vec<String>, QemuError> {
    let lay = FromPlan {
        hole64: plan.mmio,
        cliques: &plan.cliques,
        memory_kib: plan.memory_kib.filter(|_| opts.guest_memory),
        vcpus: plan.vcpus.filter(|_| opts.guest_memory),
        hugepages: plan.hugepages,
        numa: &plan.numa,
        cpu: opts
            .cpu
            .clone()
            .filter(|_| plan.sets_address_bits())
            .map(|model| GuestCpu {
                model,
                limit: plan.phys_limit,
            }),
    };
    if !(0x01..=0x1e).contains(&opts.first_slot) {
        return Err(QemuError::BadFirstSlot {
            slot: opts.first_slot,
        });
    }
    let expanders = match &lay.numa {
        GuestNuma::Expanders(x) => Some(x),
        _ => None,
    };
    // Which targets sit behind an expander (the rest get root ports on pcie.0).
    let node_of = |k: usize| expanders.and_then(|x| x.target_node.get(k).copied().flatten());
    let on_root: Vec<usize> = (0..sel.targets.len()).filter(|k| node_of(*k).is_none()).collect();
    let ports = on_root.len();
    let pxbs = expanders.map_or(0, |x| x.nodes.len());
    let root_slots = ports.div_ceil(8);
    if ports + pxbs > 0 {
        let last = opts.first_slot as usize + root_slots + pxbs - 1;
        if last > 0x1e {
            return Err(QemuError::TooManySlots {
                ports: sel.targets.len(),
                last,
            });
        }
    }
    if lay.hugepages != HugePages::Off && lay.memory_kib.is_none() {
        return Err(QemuError::NeedsMemory { what: "--hugepages" });
    }
    let mut out = Vec::new();
    let mut pair = |a: &str, v: String| {
        out.push(a.to_string());
        out.push(v);
    };
    if let Some(kib) = lay.memory_kib {
        pair("-m", format!("{}M", kib >> 10));
    }
    if let Some(n) = lay.vcpus {
        pair("-smp", n.to_string());
    }
    // Memory backends: one per guest node, or one for the whole guest when it is bound to a
    // node or on hugepages.
    let backend = |id: &str, kib: u64, node: Option<i32>| {
        let mut b = match lay.hugepages.kib() {
            Some(page) => format!(
                "memory-backend-memfd,id={id},size={}M,hugetlb=on,hugetlbsize={},prealloc=on",
                kib >> 10,
                crate::output::layout::size_suffix(page << 10)
            ),
            None => format!("memory-backend-ram,id={id},size={}M", kib >> 10),
        };
        if let Some(n) = node {
            b.push_str(&format!(",host-nodes={n},policy=bind"));
        }
        b
    };
    match (&lay.numa, lay.memory_kib) {
        (GuestNuma::Expanders(x), _) if !x.cells.is_empty() => {
            for (i, c) in x.cells.iter().enumerate() {
                let id = format!("gpupass-mem{i}");
                pair("-object", backend(&id, c.memory_kib, Some(c.host_node)));
                pair(
                    "-numa",
                    format!("node,nodeid={i},cpus={},memdev={id}", c.vcpu_list()),
                );
            }
        }
        (GuestNuma::Pinned { node, .. }, Some(kib)) => {
            pair("-object", backend("gpupass-mem0", kib, Some(*node)));
            pair("-machine", "memory-backend=gpupass-mem0".to_string());
        }
        (_, Some(kib)) if lay.hugepages != HugePages::Off => {
            pair("-object", backend("gpupass-mem0", kib, None));
            pair("-machine", "memory-backend=gpupass-mem0".to_string());
        }
        _ => {}
    }
    if let Some(c) = &lay.cpu {
        out.push("-cpu".to_string());
        out.push(c.value());
    }
    if let Some(h) = &lay.hole64 {
        out.push("-global".to_string());
        out.push(format!(
            "q35-pcihost.pci-hole64-size={}",
            crate::output::layout::size_suffix(h.window)
        ));
        out.push("-fw_cfg".to_string());
        out.push(format!("name=opt/ovmf/X-PciMmio64Mb,string={}", h.window >> 20));
    }
    let iommufd = if opts.iommufd && sel.slots().next().is_some() {
        out.push("-object".to_string());
        out.push(match &opts.fds {
            Some(f) => format!("iommufd,id={IOMMUFD_ID},fd={}", f.iommufd),
            None => format!("iommufd,id={IOMMUFD_ID}"),
        });
        format!(",iommufd={IOMMUFD_ID}")
    } else {
        String::new()
    };
    let mut dev = |v: String| {
        out.push("-device".to_string());
        out.push(v);
    };
    for (j, k) in on_root.iter().enumerate() {
        let slot = opts.first_slot as usize + j / 8;
        let func = j % 8;
        // Function 0 of a pcie.0 slot that holds more root ports must say multifunction.
        let more_in_slot = func == 0 && j + 1 < ports && (j + 1) / 8 == j / 8;
        dev(format!(
            "pcie-root-port,id=rp{n},chassis={n},bus=pcie.0,addr={slot:#04x}.{func}{mf}",
            n = k + 1,
            mf = if more_in_slot { ",multifunction=on" } else { "" }
        ));
    }
    if let Some(x) = expanders {
        for i in 0..x.nodes.len() {
            let slot = opts.first_slot as usize + root_slots + i;
            // A guest node per expander when the guest has nodes (they carry its memory).
            let node = if x.cells.is_empty() {
                String::new()
            } else {
                format!(",numa_node={i}")
            };
            dev(format!(
                "pxb-pcie,id=gpupass-pxb{i},bus_nr={},bus=pcie.0,addr={slot:#04x}.0{node}",
                pxb_bus_nr(i)
            ));
        }
        let mut used = vec![0usize; x.nodes.len()];
        for k in 0..sel.targets.len() {
            if let Some(i) = node_of(k) {
                dev(format!(
                    "pcie-root-port,id=rp{n},chassis={n},bus=gpupass-pxb{i},addr={:#04x}.0",
                    used[i],
                    n = k + 1
                ));
                used[i] += 1;
            }
        }
    }
    let rom = |requested: bool| {
        let mut s = String::new();
        if requested {
            if let Some(b) = opts.rom_bar {
                s.push_str(if b { ",rombar=1" } else { ",rombar=0" });
            }
            if let Some(f) = &opts.rom_file {
                s.push_str(",romfile=");
                s.push_str(&escape_value(f));
            }
        }
        s
    };
    let mut n = 0;
    for (k, t) in sel.targets.iter().enumerate() {
        let bus = format!("rp{}", k + 1);
        match t {
            Target::Slot(g) => {
                for f in &g.functions {
                    n += 1;
                    let mf = if g.is_multifunction() && f.guest_function == 0 {
                        ",multifunction=on"
                    } else {
                        ""
                    };
                    let fd = opts.fds.as_ref().filter(|_| opts.iommufd).and_then(|p| {
                        p.devices
                            .iter()
                            .find(|(a, _)| *a == f.device.address)
                            .map(|(_, fd)| *fd)
                    });
                    let open = match fd {
                        Some(fd) => format!("fd={fd}"),
                        None => format!("host={}", f.device.address),
                    };
                    let clique = lay
                        .cliques
                        .iter()
                        .find(|(a, _)| *a == f.device.address)
                        .map(|(_, c)| format!(",x-nv-gpudirect-clique={c}"))
                        .unwrap_or_default();
                    dev(format!(
                        "vfio-pci,{open},id=hostdev{n},bus={bus},addr=0x0.{}{mf}{}{clique}{iommufd}",
                        f.guest_function,
                        rom(f.requested)
                    ));
                }
            }
            Target::Mdev(m) => {
                n += 1;
                let display = if opts.display && m.display_capable() {
                    ",display=on"
                } else {
                    ""
                };
                dev(format!(
                    "vfio-pci,sysfsdev={},id=hostdev{n},bus={bus},addr=0x0.0{display}",
                    escape_value(&mdev_sysfsdev_for_qemu(&m.instance.uuid))
                ));
            }
        }
    }
    Ok(out)
}

/// Quote one argument for a POSIX shell when it needs it.
pub(crate) fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-+=.,:/@%".contains(&b));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Text form: one `-device VALUE` per line, values shell-quoted where needed.
pub(crate) fn text(args: &[String]) -> String {
    let mut s = String::new();
    for pair in args.chunks(2) {
        let line: Vec<String> = pair.iter().map(|a| shell_quote(a)).collect();
        s.push_str(&line.join(" "));
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_and_escaping() {
        assert_eq!(escape_value("/a,b/rom"), "/a,,b/rom");
        assert_eq!(
            shell_quote("vfio-pci,host=0000:01:00.0"),
            "vfio-pci,host=0000:01:00.0"
        );
        assert_eq!(shell_quote("a b'c"), r"'a b'\''c'");
        assert_eq!(mdev_sysfsdev_for_qemu("x"), "/sys/bus/mdev/devices/x");
    }

    #[test]
    fn root_ports_pack_eight_per_slot() {
        let sel = Selection {
            targets: Vec::new(),
            notes: Vec::new(),
        };
        let plan = VmPlan::default();
        assert!(args(&sel, &QemuOptions::default(), &plan).unwrap().is_empty());
        let bad = QemuOptions {
            first_slot: 0x1f,
            ..QemuOptions::default()
        };
        assert_eq!(
            args(&sel, &bad, &plan),
            Err(QemuError::BadFirstSlot { slot: 0x1f })
        );
    }

    #[test]
    fn qemu_versions() {
        let v = |t: &str| t.parse::<QemuVersion>();
        assert_eq!(v("8.2"), Ok(QemuVersion { major: 8, minor: 2 }));
        assert_eq!(v("10.0.2"), Ok(QemuVersion { major: 10, minor: 0 }));
        for bad in ["", "8", "8.", "x.2", "8.2.1.1", "0.9", "8.2-rc1", " 8 . 2"] {
            assert!(v(bad).is_err(), "{bad}");
        }
        assert!(QemuVersion { major: 8, minor: 1 } < QemuVersion::IOMMUFD);
        assert!(QemuVersion { major: 10, minor: 0 } > QemuVersion::IOMMUFD);
        assert_eq!(
            QemuVersion::from_version_output(
                "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)\nCopyright (c) 2003-2025 Fabrice Bellard and the QEMU Project developers\n"
            ),
            Some(QemuVersion { major: 10, minor: 0 })
        );
        assert_eq!(
            QemuVersion::from_version_output("QEMU emulator version 7.2.15\n"),
            Some(QemuVersion { major: 7, minor: 2 })
        );
        assert_eq!(QemuVersion::from_version_output("cloud-hypervisor v44.0\n"), None);
        assert_eq!(QemuVersion::from_version_output(""), None);
    }
}
