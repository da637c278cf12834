//! libvirt domain XML: `<hostdev>` elements and complete q35 domains for passthrough.
//!
//! Pure renderers over a [`Selection`]; every string goes through quick-xml's writer, which
//! escapes `<`, `>`, `&`, `'` and `"` in text and attributes, so a domain named `a<b&c` or a
//! disk path with quotes stays well-formed.
//!
//! libvirt facts encoded here (domaincommon.rng of libvirt 9.0, formatdomain docs):
//! - `<hostdev mode='subsystem' type='pci' managed='yes|no'>` with
//!   `<source><address domain= bus= slot= function=/></source>`; `managed='yes'` makes libvirt
//!   detach the function from its host driver at VM start and reattach it at stop.
//! - `<hostdev mode='subsystem' type='mdev' model='vfio-pci' [display='on']>` with
//!   `<source><address uuid=/></source>`; mdevs take no `managed`.
//! - `<rom bar='on|off' file=PATH/>` controls the expansion ROM the guest sees.
//! - A guest `<address type='pci' .../>` on a hostdev puts it at that guest bus/slot/function;
//!   the bus number is the `index` of a PCI controller. On q35 a `pcie-root-port` controller
//!   provides one bus with one slot (0); `multifunction='on'` on function 0 lets functions 1-7
//!   of the same slot exist.
//! - iommufd (docs/iommufd.md): libvirt 12.1 opens a PCI hostdev through its VFIO cdev and
//!   `/dev/iommu` with `<driver name='vfio' iommufd='yes'/>` (`hostdevDriver` in 12.9's
//!   basictypes.rng); 12.2 adds the domain-wide `<iommufd enabled='yes' [fdgroup=]/>` (a child
//!   of `<domain>`, 12.9's domaincommon.rng). mdev hostdevs take no `<driver>`: they stay on
//!   the group and container.

use crate::model::PciAddress;
use crate::output::layout::{GuestNuma, HugePages};
use crate::output::plan::VmPlan;
use crate::output::selection::{SelectedMdev, Selection, SlotGroup, Target};
use quick_xml::events::{BytesDecl, BytesText, Event};
use quick_xml::Writer;
use std::io;

/// Why XML could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum LibvirtError {
    #[error("writing XML failed")]
    Io(#[from] io::Error),
    #[error("--guest-address places one device or the functions of one slot, but {count} guest slots are selected ({list}); name fewer devices, or use `gpupass xml domain`, which places each behind its own pcie-root-port")]
    GuestAddressTooMany { count: usize, list: String },
    #[error("--guest-address {addr}: the functions of {host_slot} form one multifunction guest slot, which must start at function 0; use {base}")]
    GuestAddressNotFunction0 {
        addr: PciAddress,
        host_slot: String,
        base: String,
    },
    #[error("--display: none of the selected devices is a display-capable vGPU (an mdev of device_api vfio-pci on a display controller): {list}")]
    NoDisplayCapable { list: String },
    #[error("--backend iommufd: the target libvirt {target} ({source_}) cannot open hostdevs through iommufd: <driver iommufd='yes'/> on a hostdev needs libvirt {per_hostdev}, the domain-wide <iommufd enabled='yes'/> {domain_wide}; pass --libvirt-version with the version the VM will run on (12.1 or newer), or use --backend legacy or auto")]
    IommufdTooOld {
        target: LibvirtVersion,
        source_: String,
        per_hostdev: LibvirtVersion,
        domain_wide: LibvirtVersion,
    },
}

/// A libvirt release, as `--libvirt-version X.Y[.Z]` names the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LibvirtVersion {
    pub major: u32,
    pub minor: u32,
}

impl LibvirtVersion {
    /// `<driver iommufd='yes'/>` on a PCI hostdev (libvirt NEWS, 12.1.0).
    pub(crate) const HOSTDEV_IOMMUFD: LibvirtVersion = LibvirtVersion { major: 12, minor: 1 };
    /// The domain-wide `<iommufd enabled='yes'/>` (libvirt NEWS, 12.2.0).
    pub(crate) const DOMAIN_IOMMUFD: LibvirtVersion = LibvirtVersion { major: 12, minor: 2 };
    /// `limit` on `<maxphysaddr mode='passthrough'/>` (libvirt 9.3; 9.0's RNG has no such
    /// attribute, 12.9's has).
    pub(crate) const MAXPHYSADDR_LIMIT: LibvirtVersion = LibvirtVersion { major: 9, minor: 3 };
    /// The target when the installed libvirt cannot be read: Debian 12's.
    pub(crate) const FALLBACK: LibvirtVersion = LibvirtVersion { major: 9, minor: 0 };

    /// What this target can express with iommufd.
    pub(crate) fn iommufd(self) -> IommufdXml {
        IommufdXml {
            per_hostdev: self >= Self::HOSTDEV_IOMMUFD,
            domain_wide: self >= Self::DOMAIN_IOMMUFD,
        }
    }
}

impl std::fmt::Display for LibvirtVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Text that is not a libvirt version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid libvirt version {text:?}: expected MAJOR.MINOR[.MICRO] like 12.1 or 9.0.0")]
pub struct LibvirtVersionError {
    pub text: String,
}

impl std::str::FromStr for LibvirtVersion {
    type Err = LibvirtVersionError;
    /// `12.1`, `12.9.0`, or what `virsh --version` prints (`9.0.0`).
    fn from_str(s: &str) -> Result<Self, LibvirtVersionError> {
        let bad = || LibvirtVersionError { text: s.to_string() };
        let t = s.trim();
        let mut it = t.split('.');
        let num = |p: Option<&str>| -> Result<u32, LibvirtVersionError> {
            let p = p.ok_or_else(bad)?;
            if p.is_empty() || p.len() > 6 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            p.parse().map_err(|_| bad())
        };
        let major = num(it.next())?;
        let minor = num(it.next())?;
        if let Some(micro) = it.next() {
            num(Some(micro))?;
        }
        if it.next().is_some() || major == 0 {
            return Err(bad());
        }
        Ok(LibvirtVersion { major, minor })
    }
}

/// The iommufd elements a target libvirt accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct IommufdXml {
    /// `<driver name='vfio' iommufd='yes'/>` on each PCI hostdev (12.1+).
    pub per_hostdev: bool,
    /// `<iommufd enabled='yes'/>` in the domain (12.2+).
    pub domain_wide: bool,
}

/// Options of a `<hostdev>` element.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostdevOptions {
    /// `managed='yes'`: libvirt binds the functions to vfio-pci at VM start.
    pub managed: bool,
    /// `<rom bar='on|off'/>` on the functions the user named.
    pub rom_bar: Option<bool>,
    /// `<rom file=.../>` on the functions the user named.
    pub rom_file: Option<String>,
    /// `display='on'` on display-capable mdevs.
    pub display: bool,
    /// `iommufd='yes'` on each PCI hostdev's `<driver>` (libvirt 12.1+; docs/iommufd.md).
    pub iommufd: bool,
}

/// Guest PCI address of one hostdev.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GuestPci {
    domain: u32,
    bus: u8,
    slot: u8,
    function: u8,
    multifunction: bool,
}

/// One rendered device: a label (host address or mdev UUID) and its `<hostdev>` XML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostdevXml {
    pub label: String,
    pub xml: String,
}

type W = Writer<Vec<u8>>;

fn hex2(v: u8) -> String {
    format!("0x{v:02x}")
}

fn pci_address_attrs(a: &PciAddress) -> [(&'static str, String); 4] {
    [
        ("domain", format!("0x{:04x}", a.domain)),
        ("bus", hex2(a.bus)),
        ("slot", hex2(a.device)),
        ("function", format!("0x{:x}", a.function)),
    ]
}

fn write_guest_address(w: &mut W, g: &GuestPci) -> io::Result<()> {
    let mut e = w
        .create_element("address")
        .with_attribute(("type", "pci"))
        .with_attribute(("domain", format!("0x{:04x}", g.domain).as_str()))
        .with_attribute(("bus", hex2(g.bus).as_str()))
        .with_attribute(("slot", hex2(g.slot).as_str()))
        .with_attribute(("function", format!("0x{:x}", g.function).as_str()));
    if g.multifunction {
        e = e.with_attribute(("multifunction", "on"));
    }
    e.write_empty()?;
    Ok(())
}

fn write_pci_hostdev(
    w: &mut W,
    host: &PciAddress,
    requested: bool,
    opts: &HostdevOptions,
    guest: Option<GuestPci>,
    alias: Option<&str>,
) -> io::Result<()> {
    w.create_element("hostdev")
        .with_attribute(("mode", "subsystem"))
        .with_attribute(("type", "pci"))
        .with_attribute(("managed", if opts.managed { "yes" } else { "no" }))
        .write_inner_content(|w| {
            let mut d = w.create_element("driver").with_attribute(("name", "vfio"));
            if opts.iommufd {
                d = d.with_attribute(("iommufd", "yes"));
            }
            d.write_empty()?;
            w.create_element("source").write_inner_content(|w| {
                let attrs = pci_address_attrs(host);
                w.create_element("address")
                    .with_attributes(attrs.iter().map(|(k, v)| (*k, v.as_str())))
                    .write_empty()?;
                Ok(())
            })?;
            if requested && (opts.rom_bar.is_some() || opts.rom_file.is_some()) {
                let mut e = w.create_element("rom");
                if let Some(b) = opts.rom_bar {
                    e = e.with_attribute(("bar", if b { "on" } else { "off" }));
                }
                if let Some(f) = &opts.rom_file {
                    e = e.with_attribute(("file", f.as_str()));
                }
                e.write_empty()?;
            }
            if let Some(a) = alias {
                empty(w, "alias", &[("name", a)])?;
            }
            if let Some(g) = guest {
                write_guest_address(w, &g)?;
            }
            Ok(())
        })?;
    Ok(())
}

fn write_mdev_hostdev(
    w: &mut W,
    m: &SelectedMdev,
    opts: &HostdevOptions,
    guest: Option<GuestPci>,
) -> io::Result<()> {
    let mut e = w
        .create_element("hostdev")
        .with_attribute(("mode", "subsystem"))
        .with_attribute(("type", "mdev"))
        .with_attribute(("model", "vfio-pci"));
    if opts.display && m.display_capable() {
        e = e.with_attribute(("display", "on"));
    }
    e.write_inner_content(|w| {
        w.create_element("source").write_inner_content(|w| {
            w.create_element("address")
                .with_attribute(("uuid", m.instance.uuid.as_str()))
                .write_empty()?;
            Ok(())
        })?;
        if let Some(g) = guest {
            write_guest_address(w, &g)?;
        }
        Ok(())
    })?;
    Ok(())
}

fn new_writer() -> W {
    Writer::new_with_indent(Vec::new(), b' ', 2)
}

fn finish(w: W) -> String {
    let mut s = String::from_utf8_lossy(&w.into_inner()).into_owned();
    s.push('\n');
    s
}

/// Guest addresses for one slot group placed at guest `bus`/`slot`.
fn slot_guest_addresses(g: &SlotGroup, domain: u32, bus: u8, slot: u8) -> Vec<GuestPci> {
    g.functions
        .iter()
        .map(|f| GuestPci {
            domain,
            bus,
            slot,
            function: f.guest_function,
            multifunction: g.is_multifunction() && f.guest_function == 0,
        })
        .collect()
}

fn target_label(t: &Target) -> String {
    match t {
        Target::Slot(g) => g
            .functions
            .iter()
            .map(|f| f.device.address.to_string())
            .collect::<Vec<_>>()
            .join("+"),
        Target::Mdev(m) => m.instance.uuid.clone(),
    }
}

/// Check `--display` against the selection: it must hit at least one display-capable mdev.
/// Returns notes for the mdevs it does not apply to.
pub(crate) fn check_display(sel: &Selection, opts: &HostdevOptions) -> Result<Vec<String>, LibvirtError> {
    if !opts.display {
        return Ok(Vec::new());
    }
    let (capable, not): (Vec<&SelectedMdev>, Vec<&SelectedMdev>) =
        sel.mdevs().partition(|m| m.display_capable());
    if capable.is_empty() {
        let list = sel
            .targets
            .iter()
            .map(target_label)
            .collect::<Vec<_>>()
            .join(", ");
        return Err(LibvirtError::NoDisplayCapable { list });
    }
    Ok(not
        .iter()
        .map(|m| {
            format!(
                "--display does not apply to {} (type {}): not a vfio-pci vGPU on a display controller",
                m.instance.uuid,
                m.type_name().unwrap_or("unknown")
            )
        })
        .collect())
}

/// The `<hostdev>` elements for a selection, one per PCI function or mdev, in order.
///
/// With `guest` (only for a selection that fills one guest slot), the devices get that guest
/// address: a multifunction slot group starts at function 0 and its siblings share the slot.
/// Without it libvirt picks guest addresses (and may split a multifunction card across slots).
pub(crate) fn hostdevs(
    sel: &Selection,
    opts: &HostdevOptions,
    guest: Option<PciAddress>,
) -> Result<Vec<HostdevXml>, LibvirtError> {
    if let Some(ga) = guest {
        if sel.targets.len() > 1 {
            return Err(LibvirtError::GuestAddressTooMany {
                count: sel.targets.len(),
                list: sel
                    .targets
                    .iter()
                    .map(target_label)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        if let Some(Target::Slot(g)) = sel.targets.first() {
            if g.is_multifunction() && ga.function != 0 {
                let base = PciAddress { function: 0, ..ga };
                return Err(LibvirtError::GuestAddressNotFunction0 {
                    addr: ga,
                    host_slot: g.first().slot_string(),
                    base: base.to_string(),
                });
            }
        }
    }
    let mut out = Vec::new();
    for t in &sel.targets {
        match t {
            Target::Slot(g) => {
                let guests: Vec<Option<GuestPci>> = match guest {
                    Some(ga) if !g.is_multifunction() => vec![Some(GuestPci {
                        domain: ga.domain,
                        bus: ga.bus,
                        slot: ga.device,
                        function: ga.function,
                        multifunction: false,
                    })],
                    Some(ga) => slot_guest_addresses(g, ga.domain, ga.bus, ga.device)
                        .into_iter()
                        .map(Some)
                        .collect(),
                    None => vec![None; g.functions.len()],
                };
                for (f, ga) in g.functions.iter().zip(guests) {
                    let mut w = new_writer();
                    write_pci_hostdev(&mut w, &f.device.address, f.requested, opts, ga, None)?;
                    out.push(HostdevXml {
                        label: f.device.address.to_string(),
                        xml: finish(w),
                    });
                }
            }
            Target::Mdev(m) => {
                let ga = guest.map(|ga| GuestPci {
                    domain: ga.domain,
                    bus: ga.bus,
                    slot: ga.device,
                    function: ga.function,
                    multifunction: false,
                });
                let mut w = new_writer();
                write_mdev_hostdev(&mut w, m, opts, ga)?;
                out.push(HostdevXml {
                    label: m.instance.uuid.clone(),
                    xml: finish(w),
                });
            }
        }
    }
    Ok(out)
}

/// Guest firmware of a rendered domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Firmware {
    /// `<os firmware='efi'>`: OVMF, which sizes the 64-bit MMIO window for large GPU BARs
    /// and gives modern GPUs their UEFI GOP console.
    Efi,
    /// SeaBIOS: libvirt's default; large 64-bit BARs may not get addresses.
    Bios,
}

/// A complete domain for `gpupass xml domain`.
#[derive(Debug, Clone)]
pub(crate) struct DomainSpec {
    pub name: String,
    pub memory_kib: u64,
    pub vcpus: u32,
    /// Disk image path (virtio-blk `vda`); qcow2 when it ends in `.qcow2`, else raw.
    pub disk: Option<String>,
    pub firmware: Firmware,
    /// Emulated Intel IOMMU in the guest (nested VFIO / DPDK in the guest).
    pub viommu: bool,
    /// `<memoryBacking><locked/>`: lock all guest memory (libvirt then lifts RLIMIT_MEMLOCK).
    pub locked: bool,
    pub hostdev: HostdevOptions,
    /// The domain-wide `<iommufd enabled='yes'/>` (libvirt 12.2+; docs/iommufd.md).
    pub iommufd_domain: bool,
    /// The target libvirt has `limit` on `<maxphysaddr>` (9.3+): the plan's address-bit limit is
    /// written; else the plain element.
    pub maxphysaddr_limit: bool,
    /// `<memtune><hard_limit>` = what the plan says VFIO pins (libvirt also takes it as the
    /// memlock limit).
    pub memtune: bool,
}

/// What the domain takes from the plan ([`VmPlan`]): the 64-bit window (`<pcihole64>` on
/// `pcie-root`, and for OVMF the `opt/ovmf/X-PciMmio64Mb` fw_cfg file in `<qemu:commandline>`:
/// libvirt refuses `opt/ovmf/` names in `<sysinfo type='fwcfg'>`), `<maxphysaddr>`, `<memtune>`,
/// the NUMA placement (one node's CPUs and memory, or one guest cell and `pcie-expander-bus` per
/// host node), hugepages, and the P2P cliques (`<qemu:override>`).
struct FromPlan<'a> {
    hole64: Option<crate::output::layout::Mmio64>,
    maxphysaddr: Option<MaxPhysAddr>,
    memtune_kib: Option<u64>,
    numa: &'a GuestNuma,
    hugepages: HugePages,
    cliques: &'a [(PciAddress, u8)],
}

impl<'a> FromPlan<'a> {
    fn new(spec: &DomainSpec, plan: &'a VmPlan) -> Self {
        FromPlan {
            hole64: plan.mmio,
            maxphysaddr: plan.sets_address_bits().then(|| MaxPhysAddr {
                limit: plan.phys_limit.filter(|_| spec.maxphysaddr_limit),
            }),
            memtune_kib: plan.memlock_bytes.filter(|_| spec.memtune).map(|b| b >> 10),
            numa: &plan.numa,
            hugepages: plan.hugepages,
            cliques: &plan.cliques,
        }
    }

    /// The `pcie-expander-bus`es, one per host node, when the devices span several.
    fn expanders(&self) -> Option<&'a crate::output::layout::Expanders> {
        match self.numa {
            GuestNuma::Expanders(x) => Some(x),
            _ => None,
        }
    }

    /// The guest's NUMA cells (empty: one flat node).
    fn cells(&self) -> &'a [crate::output::layout::Cell] {
        self.expanders().map_or(&[], |x| x.cells.as_slice())
    }

    /// The controller index of target `i`'s root port: the expanders first (1..=k), then one
    /// root port per target.
    fn port_index(&self, i: usize) -> usize {
        self.expanders().map_or(0, |x| x.nodes.len()) + i + 1
    }
}

/// `<maxphysaddr mode='passthrough'/>`, with `limit` (libvirt 9.3+).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct MaxPhysAddr {
    pub limit: Option<u32>,
}

/// libvirt's QEMU namespace (`<qemu:override>`, `<qemu:commandline>`).
pub(crate) const QEMU_NS: &str = "http://libvirt.org/schemas/domain/qemu/1.0";

fn text_element(w: &mut W, name: &str, attrs: &[(&str, &str)], text: &str) -> io::Result<()> {
    w.create_element(name)
        .with_attributes(attrs.iter().copied())
        .write_text_content(BytesText::new(text))?;
    Ok(())
}

fn empty(w: &mut W, name: &str, attrs: &[(&str, &str)]) -> io::Result<()> {
    w.create_element(name)
        .with_attributes(attrs.iter().copied())
        .write_empty()?;
    Ok(())
}

/// A q35/KVM domain with one `pcie-root-port` per guest slot (controller index 1, 2, ...)
/// and each hostdev placed on its root port's bus, slot 0.
pub(crate) fn domain(sel: &Selection, spec: &DomainSpec, plan: &VmPlan) -> Result<String, LibvirtError> {
    let lay = FromPlan::new(spec, plan);
    let mut w = new_writer();
    w.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))?;
    // OVMF's aperture goes on QEMU's command line: libvirt's QEMU driver refuses `opt/ovmf/`
    // names in `<sysinfo type='fwcfg'>` ("That firmware name is reserved", libvirt 9.0).
    let fw_cfg = match (&lay.hole64, spec.firmware) {
        (Some(h), Firmware::Efi) => Some(format!("name=opt/ovmf/X-PciMmio64Mb,string={}", h.window >> 20)),
        _ => None,
    };
    let mut root = w.create_element("domain").with_attribute(("type", "kvm"));
    if !lay.cliques.is_empty() || fw_cfg.is_some() {
        root = root.with_attribute(("xmlns:qemu", QEMU_NS));
    }
    root.write_inner_content(|w| {
        text_element(w, "name", &[], &spec.name)?;
        write_memory(w, spec, &lay)?;
        write_placement(w, spec, &lay)?;
        if spec.iommufd_domain {
            empty(w, "iommufd", &[("enabled", "yes")])?;
        }
        write_os_features(w, spec)?;
        write_cpu(w, &lay)?;
        empty(w, "clock", &[("offset", "utc")])?;
        text_element(w, "on_poweroff", &[], "destroy")?;
        text_element(w, "on_reboot", &[], "restart")?;
        text_element(w, "on_crash", &[], "destroy")?;
        let mut aliases = Vec::new();
        w.create_element("devices").write_inner_content(|w| {
            aliases = write_devices(w, sel, spec, &lay)?;
            Ok(())
        })?;
        write_qemu_namespace(w, fw_cfg.as_deref(), &aliases)
    })?;
    Ok(finish(w))
}

/// `<memory>`, `<currentMemory>`, `<memoryBacking>` (hugepages, locked) and `<memtune>`.
fn write_memory(w: &mut W, spec: &DomainSpec, lay: &FromPlan) -> io::Result<()> {
    text_element(w, "memory", &[("unit", "KiB")], &spec.memory_kib.to_string())?;
    text_element(
        w,
        "currentMemory",
        &[("unit", "KiB")],
        &spec.memory_kib.to_string(),
    )?;
    if spec.locked || lay.hugepages.kib().is_some() {
        w.create_element("memoryBacking").write_inner_content(|w| {
            if let Some(kib) = lay.hugepages.kib() {
                w.create_element("hugepages").write_inner_content(|w| {
                    empty(w, "page", &[("size", &kib.to_string()), ("unit", "KiB")])
                })?;
            }
            if spec.locked {
                empty(w, "locked", &[])?;
            }
            Ok(())
        })?;
    }
    if let Some(kib) = lay.memtune_kib {
        w.create_element("memtune")
            .write_inner_content(|w| text_element(w, "hard_limit", &[("unit", "KiB")], &kib.to_string()))?;
    }
    Ok(())
}

/// The NUMA placement: `<vcpu>` (on one node's CPUs), `<cputune>` (each vCPU on its cell's
/// host node) and `<numatune>` (memory bound to the node, or each cell to its own).
fn write_placement(w: &mut W, spec: &DomainSpec, lay: &FromPlan) -> io::Result<()> {
    let cells = lay.cells();
    match lay.numa {
        GuestNuma::Pinned { cpus: Some(cpus), .. } => text_element(
            w,
            "vcpu",
            &[("placement", "static"), ("cpuset", cpus)],
            &spec.vcpus.to_string(),
        )?,
        _ => text_element(w, "vcpu", &[("placement", "static")], &spec.vcpus.to_string())?,
    }
    if cells.iter().any(|c| c.host_cpus.is_some()) {
        // Each vCPU on the CPUs of its cell's host node.
        w.create_element("cputune").write_inner_content(|w| {
            for c in cells {
                if let Some(cpus) = &c.host_cpus {
                    for v in c.vcpus.0..=c.vcpus.1 {
                        empty(w, "vcpupin", &[("vcpu", &v.to_string()), ("cpuset", cpus)])?;
                    }
                }
            }
            Ok(())
        })?;
    }
    match lay.numa {
        GuestNuma::Pinned { node, .. } => {
            w.create_element("numatune").write_inner_content(|w| {
                empty(w, "memory", &[("mode", "strict"), ("nodeset", &node.to_string())])
            })?;
        }
        GuestNuma::Expanders(x) if !cells.is_empty() => {
            let all = x
                .nodes
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(",");
            w.create_element("numatune").write_inner_content(|w| {
                empty(w, "memory", &[("mode", "strict"), ("nodeset", &all)])?;
                for (i, c) in cells.iter().enumerate() {
                    empty(
                        w,
                        "memnode",
                        &[
                            ("cellid", &i.to_string()),
                            ("mode", "strict"),
                            ("nodeset", &c.host_node.to_string()),
                        ],
                    )?;
                }
                Ok(())
            })?;
        }
        _ => {}
    }
    Ok(())
}

/// `<os>` (q35, OVMF when EFI) and `<features>` (the split I/O APIC with a vIOMMU).
fn write_os_features(w: &mut W, spec: &DomainSpec) -> io::Result<()> {
    let mut os = w.create_element("os");
    if spec.firmware == Firmware::Efi {
        os = os.with_attribute(("firmware", "efi"));
    }
    os.write_inner_content(|w| {
        text_element(w, "type", &[("arch", "x86_64"), ("machine", "q35")], "hvm")?;
        empty(w, "boot", &[("dev", "hd")])
    })?;
    w.create_element("features").write_inner_content(|w| {
        empty(w, "acpi", &[])?;
        empty(w, "apic", &[])?;
        if spec.viommu {
            // Interrupt remapping in the vIOMMU needs the split (QEMU) I/O APIC.
            empty(w, "ioapic", &[("driver", "qemu")])?;
        }
        Ok(())
    })?;
    Ok(())
}

/// `<cpu mode='host-passthrough'>` with `<maxphysaddr>` and the guest's NUMA cells.
fn write_cpu(w: &mut W, lay: &FromPlan) -> io::Result<()> {
    let cells = lay.cells();
    let cpu = w
        .create_element("cpu")
        .with_attribute(("mode", "host-passthrough"))
        .with_attribute(("check", "none"));
    if lay.maxphysaddr.is_none() && cells.is_empty() {
        cpu.write_empty()?;
        return Ok(());
    }
    cpu.write_inner_content(|w| {
        if let Some(m) = &lay.maxphysaddr {
            // The window lies above RAM: the guest's address width must reach its end,
            // and stay within the IOMMU's.
            let limit = m.limit.map(|n| n.to_string());
            match &limit {
                Some(n) => empty(
                    w,
                    "maxphysaddr",
                    &[("mode", "passthrough"), ("limit", n.as_str())],
                )?,
                None => empty(w, "maxphysaddr", &[("mode", "passthrough")])?,
            }
        }
        if !cells.is_empty() {
            w.create_element("numa").write_inner_content(|w| {
                for (i, c) in cells.iter().enumerate() {
                    empty(
                        w,
                        "cell",
                        &[
                            ("id", &i.to_string()),
                            ("cpus", &c.vcpu_list()),
                            ("memory", &c.memory_kib.to_string()),
                            ("unit", "KiB"),
                        ],
                    )?;
                }
                Ok(())
            })?;
        }
        Ok(())
    })?;
    Ok(())
}

/// The inside of `<devices>`; returns the aliases of the hostdevs in a P2P clique, with their
/// clique, for `<qemu:override>`.
fn write_devices(
    w: &mut W,
    sel: &Selection,
    spec: &DomainSpec,
    lay: &FromPlan,
) -> io::Result<Vec<(String, u8)>> {
    write_controllers(w, sel, lay)?;
    if let Some(path) = &spec.disk {
        let fmt = if path.ends_with(".qcow2") { "qcow2" } else { "raw" };
        w.create_element("disk")
            .with_attribute(("type", "file"))
            .with_attribute(("device", "disk"))
            .write_inner_content(|w| {
                empty(w, "driver", &[("name", "qemu"), ("type", fmt)])?;
                empty(w, "source", &[("file", path)])?;
                empty(w, "target", &[("dev", "vda"), ("bus", "virtio")])
            })?;
    }
    let aliases = write_domain_hostdevs(w, sel, spec, lay)?;
    if spec.hostdev.display && sel.mdevs().any(|m| m.display_capable()) {
        // display='on' needs a graphics device; the vGPU is the guest's display.
        w.create_element("graphics")
            .with_attribute(("type", "vnc"))
            .with_attribute(("autoport", "yes"))
            .write_inner_content(|w| empty(w, "listen", &[("type", "address"), ("address", "127.0.0.1")]))?;
        w.create_element("video")
            .write_inner_content(|w| empty(w, "model", &[("type", "none")]))?;
    }
    w.create_element("console")
        .with_attribute(("type", "pty"))
        .write_inner_content(|w| empty(w, "target", &[("type", "serial"), ("port", "0")]))?;
    // Guest RAM is pinned for VFIO DMA: a balloon cannot give any of it back.
    empty(w, "memballoon", &[("model", "none")])?;
    if spec.viommu {
        w.create_element("iommu")
            .with_attribute(("model", "intel"))
            .write_inner_content(|w| empty(w, "driver", &[("intremap", "on"), ("caching_mode", "on")]))?;
    }
    Ok(aliases)
}

/// The PCI controllers: `pcie-root` (with the 64-bit window), one `pcie-expander-bus` per host
/// node, and one `pcie-root-port` per target (behind its node's expander, or on `pcie-root`).
fn write_controllers(w: &mut W, sel: &Selection, lay: &FromPlan) -> io::Result<()> {
    let root = w
        .create_element("controller")
        .with_attribute(("type", "pci"))
        .with_attribute(("index", "0"))
        .with_attribute(("model", "pcie-root"));
    match &lay.hole64 {
        Some(h) => {
            root.write_inner_content(|w| {
                text_element(w, "pcihole64", &[("unit", "KiB")], &(h.window >> 10).to_string())
            })?;
        }
        None => {
            root.write_empty()?;
        }
    }
    let expanders = lay.expanders();
    if let Some(x) = expanders {
        // One pcie-expander-bus per host node; libvirt picks each one's busNr.
        for i in 0..x.nodes.len() {
            let c = w.create_element("controller").with_attributes([
                ("type", "pci"),
                ("index", (i + 1).to_string().as_str()),
                ("model", "pcie-expander-bus"),
            ]);
            if lay.cells().is_empty() {
                c.write_empty()?;
            } else {
                c.write_inner_content(|w| {
                    w.create_element("target")
                        .write_inner_content(|w| text_element(w, "node", &[], &i.to_string()))?;
                    Ok(())
                })?;
            }
        }
    }
    let mut on_pxb = vec![0usize; expanders.map_or(0, |x| x.nodes.len())];
    for i in 0..sel.targets.len() {
        let idx = lay.port_index(i).to_string();
        let attrs = [
            ("type", "pci"),
            ("index", idx.as_str()),
            ("model", "pcie-root-port"),
        ];
        match expanders.and_then(|x| x.target_node[i]) {
            Some(n) => {
                // Behind the expander of its node, one port per slot.
                let slot = on_pxb[n];
                on_pxb[n] += 1;
                w.create_element("controller")
                    .with_attributes(attrs)
                    .write_inner_content(|w| {
                        empty(
                            w,
                            "address",
                            &[
                                ("type", "pci"),
                                ("domain", "0x0000"),
                                ("bus", &format!("{:#04x}", n + 1)),
                                ("slot", &format!("{slot:#04x}")),
                                ("function", "0x0"),
                            ],
                        )
                    })?;
            }
            None => empty(w, "controller", &attrs)?,
        }
    }
    Ok(())
}

/// The hostdevs, each on its root port's bus, slot 0; returns the aliases given to the
/// functions in a P2P clique, with their clique.
fn write_domain_hostdevs(
    w: &mut W,
    sel: &Selection,
    spec: &DomainSpec,
    lay: &FromPlan,
) -> io::Result<Vec<(String, u8)>> {
    let mut aliases = Vec::new();
    let mut n = 0;
    for (i, t) in sel.targets.iter().enumerate() {
        // Root port i provides guest bus port_index(i); bus numbers past 0xff cannot exist.
        let bus =
            u8::try_from(lay.port_index(i)).map_err(|_| io::Error::other("more than 255 guest slots"))?;
        match t {
            Target::Slot(g) => {
                for (f, ga) in g.functions.iter().zip(slot_guest_addresses(g, 0, bus, 0)) {
                    n += 1;
                    let clique = lay.cliques.iter().find(|(a, _)| *a == f.device.address);
                    let alias = clique.map(|(_, c)| {
                        // User aliases start with "ua-"; QEMU's device id is the alias.
                        let a = format!("ua-gpupass-hostdev{n}");
                        aliases.push((a.clone(), *c));
                        a
                    });
                    write_pci_hostdev(
                        w,
                        &f.device.address,
                        f.requested,
                        &spec.hostdev,
                        Some(ga),
                        alias.as_deref(),
                    )?;
                }
            }
            Target::Mdev(m) => {
                let ga = GuestPci {
                    domain: 0,
                    bus,
                    slot: 0,
                    function: 0,
                    multifunction: false,
                };
                write_mdev_hostdev(w, m, &spec.hostdev, Some(ga))?;
            }
        }
    }
    Ok(aliases)
}

/// `<qemu:commandline>` (OVMF's aperture, `fw_cfg`) and `<qemu:override>` (the P2P clique of
/// each aliased hostdev: libvirt has no element for it).
fn write_qemu_namespace(w: &mut W, fw_cfg: Option<&str>, aliases: &[(String, u8)]) -> io::Result<()> {
    if let Some(v) = fw_cfg {
        w.create_element("qemu:commandline").write_inner_content(|w| {
            empty(w, "qemu:arg", &[("value", "-fw_cfg")])?;
            empty(w, "qemu:arg", &[("value", v)])
        })?;
    }
    if !aliases.is_empty() {
        // libvirt has no element for the clique: set the property on the QEMU device.
        w.create_element("qemu:override").write_inner_content(|w| {
            for (alias, clique) in aliases {
                w.create_element("qemu:device")
                    .with_attribute(("alias", alias.as_str()))
                    .write_inner_content(|w| {
                        w.create_element("qemu:frontend").write_inner_content(|w| {
                            empty(
                                w,
                                "qemu:property",
                                &[
                                    ("name", "x-nv-gpudirect-clique"),
                                    ("type", "unsigned"),
                                    ("value", &clique.to_string()),
                                ],
                            )
                        })?;
                        Ok(())
                    })?;
            }
            Ok(())
        })?;
    }
    Ok(())
}
