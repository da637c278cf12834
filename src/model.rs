//! The data model: plain serde types that *are* the JSON schema (`docs/json.md`).
//!
//! Nothing here touches the host. The inventory fills these types from sysfs; every renderer
//! (tables, libvirt XML, QEMU arguments, CDI, device-plugin responses) reads them, so an
//! inventory saved as JSON on one host renders identically on another.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Version of the JSON document layout. Bumped only on incompatible changes; new optional
/// fields do not bump it.
pub(crate) const SCHEMA_VERSION: u32 = 1;

/// A PCI function address: `domain:bus:device.function`, printed as `0000:01:00.0`.
///
/// The kernel prints the domain with `%04x`, so VMD domains (`10000:00:00.0`) have five digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

/// Why an address string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid PCI address {input:?}: {reason}; expected DDDD:BB:DD.F like 0000:01:00.0, or BB:DD.F like 01:00.0")]
pub struct AddressError {
    pub input: String,
    pub reason: &'static str,
}

impl PciAddress {
    pub const fn new(domain: u32, bus: u8, device: u8, function: u8) -> Self {
        PciAddress {
            domain,
            bus,
            device,
            function,
        }
    }

    /// The same slot (domain, bus, device): functions of one multifunction card.
    pub(crate) fn same_slot(&self, other: &PciAddress) -> bool {
        self.domain == other.domain && self.bus == other.bus && self.device == other.device
    }

    /// `0000:01:00` — the slot without the function.
    pub(crate) fn slot_string(&self) -> String {
        format!("{:04x}:{:02x}:{:02x}", self.domain, self.bus, self.device)
    }
}

impl PciAddress {
    /// The address as the kernel prints it (`%04x:%02x:%02x.%x`), into `buf`: what
    /// `Display` and `Serialize` write, without the formatting machinery (a scan prints
    /// thousands).
    fn write_to<'b>(&self, buf: &'b mut [u8; 20]) -> &'b str {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut n = 0;
        let mut hex = |v: u32, min: usize, sep: Option<u8>| {
            let digits = (32 - v.leading_zeros() as usize).div_ceil(4).max(min);
            for i in (0..digits).rev() {
                buf[n] = DIGITS[((v >> (4 * i)) & 0xf) as usize];
                n += 1;
            }
            if let Some(c) = sep {
                buf[n] = c;
                n += 1;
            }
        };
        hex(self.domain, 4, Some(b':'));
        hex(self.bus.into(), 2, Some(b':'));
        hex(self.device.into(), 2, Some(b'.'));
        hex(self.function.into(), 1, None);
        // At most 8 + 1 + 2 + 1 + 2 + 1 + 2 = 17 bytes.
        std::str::from_utf8(&buf[..n]).unwrap_or_default()
    }
}

impl PciAddress {
    /// `DDDD:BB:DD.F` exactly as sysfs names functions (four-digit domain), parsed without
    /// allocating; `None` for every other spelling, which [`FromStr`] then parses or rejects.
    fn parse_kernel_form(b: &[u8]) -> Option<PciAddress> {
        if b.len() != 12 || b[4] != b':' || b[7] != b':' || b[10] != b'.' {
            return None;
        }
        let hex = |r: std::ops::Range<usize>| {
            b[r].iter()
                .try_fold(0u32, |v, c| Some(v << 4 | (*c as char).to_digit(16)?))
        };
        let (domain, bus, dev, func) = (hex(0..4)?, hex(5..7)?, hex(8..10)?, hex(11..12)?);
        (dev <= 0x1f && func <= 7).then(|| PciAddress::new(domain, bus as u8, dev as u8, func as u8))
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.write_to(&mut [0; 20]))
    }
}

fn hex_field(s: &str, max_len: usize, input: &str, what: &'static str) -> Result<u32, AddressError> {
    let err = |reason| AddressError {
        input: input.to_string(),
        reason,
    };
    if s.is_empty() {
        return Err(err(what));
    }
    if s.len() > max_len || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(err(what));
    }
    u32::from_str_radix(s, 16).map_err(|_| err(what))
}

impl FromStr for PciAddress {
    type Err = AddressError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        if let Some(a) = PciAddress::parse_kernel_form(input.as_bytes()) {
            return Ok(a);
        }
        let err = |reason| AddressError {
            input: input.to_string(),
            reason,
        };
        let s = input.trim();
        if s.is_empty() {
            return Err(err("it is empty"));
        }
        if s.contains('/') || s.contains('\\') {
            return Err(err("it contains a path separator"));
        }
        let (head, func) = s
            .rsplit_once('.')
            .ok_or_else(|| err("the function number after '.' is missing"))?;
        let parts: Vec<&str> = head.split(':').collect();
        let (domain, bus, dev) = match parts.as_slice() {
            [b, d] => (0, *b, *d),
            [dom, b, d] => (
                hex_field(dom, 8, input, "the domain is not 1-8 hex digits")?,
                *b,
                *d,
            ),
            _ => return Err(err("it has the wrong number of ':'-separated fields")),
        };
        let bus = hex_field(bus, 2, input, "the bus is not 1-2 hex digits")?;
        let dev = hex_field(dev, 2, input, "the device is not 1-2 hex digits")?;
        if dev > 0x1f {
            return Err(err("the device number is above 1f"));
        }
        if func.len() != 1 {
            return Err(err("the function is not a single digit 0-7"));
        }
        let func = hex_field(func, 1, input, "the function is not a single digit 0-7")?;
        if func > 7 {
            return Err(err("the function is not a single digit 0-7"));
        }
        Ok(PciAddress::new(domain, bus as u8, dev as u8, func as u8))
    }
}

impl Serialize for PciAddress {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.write_to(&mut [0; 20]))
    }
}

impl<'de> Deserialize<'de> for PciAddress {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Whether a BAR decodes memory or I/O port space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BarKind {
    Memory,
    Io,
}

/// One base address register (or the expansion ROM), from a line of sysfs `resource`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bar {
    /// Line number in `resource`: 0-5 standard BARs, 6 the ROM, 7-12 SR-IOV VF BARs.
    pub index: u32,
    pub kind: BarKind,
    /// Host physical start address.
    pub start: u64,
    /// Size in bytes.
    pub size: u64,
    pub is_64bit: bool,
    pub prefetchable: bool,
}

/// Whether `s` is an mdev UUID: 8-4-4-4-12 hex digits (either case), the form the kernel names
/// mdev instances in. The one UUID rule every command uses (arguments, sysfs names, device IDs).
pub(crate) fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// `s` as the canonical (lower-case) mdev UUID when [`is_uuid`] holds: the one spelling every
/// consumer stores and compares (the kernel's, and mdevctl's).
pub(crate) fn canonical_uuid(s: &str) -> Option<String> {
    is_uuid(s).then(|| s.to_ascii_lowercase())
}

/// One host NUMA node: its CPUs and hugepage pools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    pub node: i32,
    /// `cpulist` (`0-47,96-143`); `None` when unreadable.
    pub cpulist: Option<String>,
    /// One entry per page size the kernel offers (`hugepages/hugepages-<K>kB`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hugepages: Vec<HugePool>,
}

/// A node's pool of hugepages of one size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HugePool {
    pub size_kib: u64,
    /// `nr_hugepages`: pages reserved.
    pub total: u64,
    /// `free_hugepages`: reserved and not in use.
    pub free: u64,
}

/// SR-IOV state of a physical function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Sriov {
    pub total_vfs: u32,
    pub num_vfs: u32,
    /// Addresses of the enabled virtual functions (`virtfnN` links).
    pub vfs: Vec<PciAddress>,
    /// VF BARs (per-VF size), from `resource` lines 7-12.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vf_bars: Vec<Bar>,
}

/// A mediated device type offered by a parent (`mdev_supported_types/<id>`), or an NVIDIA
/// vendor-VFIO vGPU profile (`nvidia/creatable_vgpu_types`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdevType {
    /// Directory name, e.g. `mbochs-small` or `nvidia-1043`.
    pub id: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub available_instances: Option<u32>,
    pub device_api: Option<String>,
}

/// Facts from `/proc/driver/nvidia/gpus/<address>/information` (native NVIDIA driver).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvidiaInfo {
    /// "Device Minor:": the N of `/dev/nvidiaN`. Never the enumeration index.
    pub minor: Option<u32>,
    pub model: Option<String>,
    pub uuid: Option<String>,
}

/// A number kept as the `N` lower-case hex digits sysfs and lspci show it with, no `0x`:
/// a PCI vendor, device or subsystem ID ([`PciId`], `10de`), a class code ([`ClassCode`],
/// `030000`), a revision ([`Revision`], `a1`). It is serialised as that string (the JSON is
/// what it was when these fields were strings), reads as a `&str` (`as_str`, `Deref`) and as
/// its value (`value`), and needs no allocation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HexId<const N: usize> {
    digits: [u8; N],
}

/// A PCI vendor, device or subsystem ID: four hex digits.
pub(crate) type PciId = HexId<4>;
/// A PCI class code (base class, subclass, programming interface): six hex digits.
pub(crate) type ClassCode = HexId<6>;
/// A PCI revision ID: two hex digits.
pub(crate) type Revision = HexId<2>;

impl<const N: usize> HexId<N> {
    /// `v` in `N` hex digits; `None` when it does not fit.
    pub fn new(v: u32) -> Option<Self> {
        (N >= 8 || v >> (4 * N) == 0).then(|| Self::low_digits(v))
    }

    /// The low `N` hex digits of `v`.
    fn low_digits(v: u32) -> Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut digits = [0u8; N];
        for (i, c) in digits.iter_mut().rev().enumerate() {
            *c = DIGITS[((v >> (4 * i)) & 0xf) as usize];
        }
        HexId { digits }
    }

    pub fn value(&self) -> u32 {
        self.digits
            .iter()
            .fold(0, |v, c| (v << 4) | (*c as char).to_digit(16).unwrap_or(0))
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever stored (`new`, `from_str`).
        std::str::from_utf8(&self.digits).unwrap_or_default()
    }
}

impl PciId {
    pub(crate) fn from_u16(v: u16) -> Self {
        Self::low_digits(v.into())
    }
}

impl ClassCode {
    /// The class code in the low 24 bits of `v`.
    pub(crate) fn from_bits(v: u32) -> Self {
        Self::low_digits(v & 0xff_ffff)
    }
}

impl Revision {
    pub(crate) fn from_u8(v: u8) -> Self {
        Self::low_digits(v.into())
    }
}

/// Text that is not a [`HexId`]: not exactly `digits` hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not {digits} hex digits")]
pub struct HexIdError {
    pub text: String,
    pub digits: usize,
}

impl<const N: usize> FromStr for HexId<N> {
    type Err = HexIdError;

    /// Exactly `N` hex digits (upper-case ones are stored lower-case).
    fn from_str(s: &str) -> Result<Self, HexIdError> {
        let b = s.as_bytes();
        if b.len() != N || !b.iter().all(u8::is_ascii_hexdigit) {
            return Err(HexIdError {
                text: s.to_string(),
                digits: N,
            });
        }
        let mut digits = [0u8; N];
        for (d, c) in digits.iter_mut().zip(b) {
            *d = c.to_ascii_lowercase();
        }
        Ok(HexId { digits })
    }
}

impl<const N: usize> std::ops::Deref for HexId<N> {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl<const N: usize> fmt::Display for HexId<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl<const N: usize> fmt::Debug for HexId<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl<const N: usize> PartialEq<str> for HexId<N> {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl<const N: usize> PartialEq<&str> for HexId<N> {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl<const N: usize> Serialize for HexId<N> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de, const N: usize> Deserialize<'de> for HexId<N> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One PCI function and everything the kernel says about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PciDevice {
    pub address: PciAddress,
    /// Four lower-case hex digits, no `0x` (`10de`).
    pub vendor_id: PciId,
    pub device_id: PciId,
    pub subsystem_vendor_id: Option<PciId>,
    pub subsystem_device_id: Option<PciId>,
    /// Two hex digits.
    pub revision: Option<Revision>,
    /// Six hex digits: base class, subclass, programming interface (`030000`).
    pub class: ClassCode,
    /// pci.ids name of the class/subclass ("VGA compatible controller").
    pub class_name: Option<String>,
    pub vendor_name: Option<String>,
    pub device_name: Option<String>,
    pub subsystem_name: Option<String>,
    pub iommu_group: Option<u32>,
    /// Bound driver name, `null` when none.
    pub driver: Option<String>,
    /// `driver_override`, `null` when unset (the kernel prints `(null)`).
    pub driver_override: Option<String>,
    /// NUMA node; `null` when the platform has none (the kernel prints -1).
    pub numa_node: Option<i32>,
    pub local_cpulist: Option<String>,
    pub bars: Vec<Bar>,
    pub rom: Option<Bar>,
    pub boot_vga: Option<bool>,
    /// `reset_method` (kernel 5.15+), in the kernel's order; `null` when the file is absent.
    pub reset_methods: Option<Vec<String>>,
    pub is_bridge: bool,
    /// The upstream bridge (root port, switch port), `null` on a root bus.
    pub parent: Option<PciAddress>,
    pub modalias: Option<String>,
    pub sriov: Option<Sriov>,
    /// For a virtual function: its physical function.
    pub physfn: Option<PciAddress>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mdev_types: Vec<MdevType>,
    /// NVIDIA vendor-VFIO vGPU profiles this VF can take (`nvidia/creatable_vgpu_types`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vgpu_types: Vec<MdevType>,
    /// The active NVIDIA vendor-VFIO vGPU profile id (`nvidia/current_vgpu_type`), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_vgpu_type: Option<String>,
    pub nvidia: Option<NvidiaInfo>,
    /// The VFIO character device (`vfio-dev/vfioN`) when the kernel has the VFIO cdev.
    pub vfio_cdev: Option<String>,
    /// That cdev's `major:minor` (`vfio-dev/vfioN/dev`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio_cdev_dev: Option<String>,
    /// Whether `/dev/vfio/devices/vfioN` exists; `null` when the function has no cdev.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio_cdev_node_present: Option<bool>,
    /// The backends that can hand this function to a VMM or container now (docs/iommufd.md):
    /// `legacy` (group + container nodes), `iommufd` (cdev + `/dev/iommu`). Empty when neither.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<Backend>,
    /// Driver pinned by driverctl (`/etc/driverctl.d/pci-<address>`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_driver: Option<String>,
}

impl PciDevice {
    pub(crate) fn class_code(&self) -> u32 {
        self.class.value()
    }

    pub(crate) fn base_class(&self) -> u8 {
        (self.class_code() >> 16) as u8
    }

    pub fn subclass(&self) -> u8 {
        (self.class_code() >> 8) as u8
    }

    /// Display controllers (class 03) and processing accelerators (class 12).
    pub fn is_gpu(&self) -> bool {
        matches!(self.base_class(), 0x03 | 0x12)
    }

    /// A short human name: the pci.ids device name, else `vendor:device`.
    pub(crate) fn display_name(&self) -> String {
        match (&self.vendor_name, &self.device_name) {
            (Some(v), Some(d)) => format!("{v} {d}"),
            (Some(v), None) => format!("{v} device {}", self.device_id),
            _ => format!("[{}:{}]", self.vendor_id, self.device_id),
        }
    }
}

/// How a VFIO device reaches its user (docs/iommufd.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The group and container: `/dev/vfio/<group>` + `/dev/vfio/vfio` (type1 IOMMU).
    Legacy,
    /// The device cdev and iommufd: `/dev/vfio/devices/vfioN` + `/dev/iommu` (Linux 6.6+).
    Iommufd,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Legacy => "legacy",
            Backend::Iommufd => "iommufd",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What serves `/dev/vfio/vfio`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VfioContainer {
    /// VFIO's own container (`CONFIG_VFIO_CONTAINER`, type1 IOMMU driver).
    Legacy,
    /// iommufd's emulation of it (`CONFIG_IOMMUFD_VFIO_CONTAINER`).
    IommufdEmulation,
    /// `/dev/vfio/vfio` does not exist.
    Absent,
    /// It exists, but neither the kernel config nor the modules tell which.
    Unknown,
}

/// What the host offers for the iommufd backend, and why it is not usable when it is not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IommufdFacts {
    /// `/dev/iommu` exists.
    pub dev_iommu: bool,
    /// iommufd is in the kernel now: `sys/module/iommufd`, `sys/class/misc/iommu` or an
    /// `iommu` line in `proc/misc`.
    pub loaded: bool,
    /// Whether the kernel has the VFIO device cdev (6.6+ with `CONFIG_VFIO_DEVICE_CDEV`);
    /// `null` when neither its config nor its devices tell.
    pub kernel_cdev: Option<bool>,
    /// Where the kernel config was read (`/proc/config.gz`, `/boot/config-<release>`).
    pub config: Option<String>,
    pub vfio_container: VfioContainer,
    /// The iommufd backend can serve VFIO-bound functions now.
    pub usable: bool,
    /// Why not, when not usable.
    pub reason: Option<String>,
}

/// Whether a driver name is a VFIO driver (vfio-pci or a variant such as `mlx5_vfio_pci`).
pub(crate) fn is_vfio_driver(driver: &str) -> bool {
    // `-` and `_` are the same character in a module name; compared without building the
    // normalised name (this runs for every function and group member of a scan).
    let same = |a: &[u8], b: &[u8]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x == y || (matches!(x, b'-' | b'_') && matches!(y, b'-' | b'_')))
    };
    let d = driver.as_bytes();
    same(d, b"vfio_pci")
        || d.len() >= 9 && same(&d[d.len() - 9..], b"_vfio_pci")
        || d.len() >= 5 && same(&d[..5], b"vfio_")
}

/// Whether a bound driver keeps a group viable for VFIO (kernel `vfio_dev_driver_allowed`).
pub(crate) fn driver_allows_vfio(driver: Option<&str>) -> bool {
    match driver {
        None => true,
        Some(d) => is_vfio_driver(d) || d == "pci-stub" || d == "pci_stub",
    }
}

/// A member of an IOMMU group that keeps it from being viable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocker {
    pub address: PciAddress,
    pub driver: String,
}

impl fmt::Display for Blocker {
    /// `0000:01:00.1 (snd_hda_intel)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.address, self.driver)
    }
}

/// Why a PCI function cannot be handed to a VFIO user now: the checks of
/// [`Inventory::vfio_readiness`], in the order they run. This is the one statement of the rule
/// (VFIO opens a function through its whole group: a VFIO driver on the function, an IOMMU
/// group, every member on a VFIO driver, pci-stub or none, the device nodes present); each
/// consumer words it for its user (`vfio_dev`, `oci_hook`, the device plugin,
/// `output::selection`). The Display is the short reason the device plugin reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Not bound to a VFIO driver; `None` when bound to no driver at all.
    NotOnVfio { driver: Option<String> },
    /// The function has no IOMMU group.
    NoGroup,
    /// Members of the group are on host drivers.
    NotViable { group: u32, blockers: Vec<Blocker> },
    /// No backend's device nodes are present for it (`/dev/vfio/<group>` missing).
    NoNode { group: u32 },
}

impl NotReady {
    /// The blocking members as `0000:01:00.1 (snd_hda_intel), ...` (empty for other reasons).
    pub(crate) fn blocker_list(&self) -> String {
        match self {
            NotReady::NotViable { blockers, .. } => blockers
                .iter()
                .map(Blocker::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            _ => String::new(),
        }
    }
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::NotOnVfio { driver } => {
                write!(
                    f,
                    "bound to {}, not vfio-pci",
                    driver.as_deref().unwrap_or("no driver")
                )
            }
            NotReady::NoGroup => f.write_str("no IOMMU group"),
            NotReady::NotViable { group, .. } => write!(f, "group {group} is not viable"),
            NotReady::NoNode { group } => write!(f, "/dev/vfio/{group} is missing"),
        }
    }
}

impl PciDevice {
    /// The first readiness check: bound to a VFIO driver.
    pub(crate) fn check_vfio_driver(&self) -> Result<(), NotReady> {
        if self.driver.as_deref().is_some_and(is_vfio_driver) {
            Ok(())
        } else {
            Err(NotReady::NotOnVfio {
                driver: self.driver.clone(),
            })
        }
    }
}

/// An IOMMU group: the unit of isolation, and so the unit VFIO hands to a VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IommuGroup {
    pub number: u32,
    /// PCI functions in the group, in address order.
    pub members: Vec<PciAddress>,
    /// Mediated devices (by UUID) that the kernel put in this group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mdev_members: Vec<String>,
    /// Every member is driverless, on a VFIO driver or pci-stub, or a bridge: VFIO can open it.
    pub viable: bool,
    /// Members that make it not viable, with their drivers.
    pub blockers: Vec<Blocker>,
    /// `/dev/vfio/<number>`, present when a VFIO driver holds the group.
    pub vfio_node: String,
    pub vfio_node_present: bool,
    /// Backends that serve every VFIO-bound member now (docs/iommufd.md); empty when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<Backend>,
}

impl IommuGroup {
    /// The viability check: VFIO opens a group only when no member is on a host driver.
    pub(crate) fn check_viable(&self) -> Result<(), NotReady> {
        if self.viable {
            Ok(())
        } else {
            Err(NotReady::NotViable {
                group: self.number,
                blockers: self.blockers.clone(),
            })
        }
    }
}

/// An active mediated device instance (`/sys/bus/mdev/devices/<uuid>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdevInstance {
    pub uuid: String,
    /// The parent device name (a PCI address for PCI parents).
    pub parent: String,
    pub type_id: Option<String>,
    pub iommu_group: Option<u32>,
    pub driver: Option<String>,
    /// Its VFIO device cdev (`vfio-dev/vfioN` with a `dev` attribute: 6.6+), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio_cdev: Option<String>,
}

/// An mdev parent that is not a PCI function (listed under `sys/class/mdev_bus` but living
/// elsewhere, e.g. the kernel's sample drivers under `sys/devices/virtual/mbochs/mbochs`, or
/// s390 CCW/AP devices). PCI parents carry their types in [`PciDevice::mdev_types`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdevParent {
    /// The name under `sys/class/mdev_bus` (`mbochs`), which is also the parent name mdevctl
    /// and `/sys/bus/mdev/devices/<uuid>` use.
    pub name: String,
    /// Where the device lives, as the user knows it (`/sys/devices/virtual/mbochs/mbochs`).
    pub sysfs_path: Option<String>,
    pub mdev_types: Vec<MdevType>,
}

/// The whole host, as read at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub schema_version: u32,
    /// Kernel release (`proc/sys/kernel/osrelease`), when readable.
    pub kernel: Option<String>,
    /// PCI functions, GPUs first, then by address.
    pub devices: Vec<PciDevice>,
    pub groups: Vec<IommuGroup>,
    #[serde(default)]
    pub mdevs: Vec<MdevInstance>,
    /// mdev parents that are not PCI functions (virtual devices); empty on most hosts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mdev_parents: Vec<MdevParent>,
    /// Whether `/dev/vfio/vfio` (legacy container) exists.
    #[serde(default)]
    pub vfio_container_present: bool,
    /// Whether `/dev/iommu` (iommufd) exists.
    #[serde(default)]
    pub iommufd_present: bool,
    /// iommufd readiness (docs/iommufd.md); absent in inventories saved by older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommufd: Option<IommufdFacts>,
    /// The host CPU's physical address width in bits (`proc/cpuinfo`, "address sizes"): how far
    /// a guest's physical address space can reach with `host-phys-bits` (docs/vm-outputs.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_phys_bits: Option<u8>,
    /// The host CPU's vendor (`proc/cpuinfo`, "vendor_id": `AuthenticAMD`, `GenuineIntel`),
    /// which a guest with the host's CPU model gets: QEMU lays out an AMD guest's RAM
    /// differently once it reaches the HyperTransport hole (docs/vm-outputs.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_vendor: Option<String>,
    /// The host's NUMA nodes (`sys/devices/system/node/node<N>`): CPUs and hugepage pools, for
    /// guest placement and `--hugepages` (docs/vm-outputs.md); empty where sysfs has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa_nodes: Vec<NumaNode>,
    /// The narrowest input address width of the host's IOMMUs in bits (Intel: the MGAW field of
    /// `sys/class/iommu/dmar*/intel-iommu/cap`; AMD: the HATS field of
    /// `sys/class/iommu/ivhd*/amd-iommu/features`): the highest IOVA VFIO can map for the
    /// guest's RAM and, for peer-to-peer, its BARs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_addr_bits: Option<u8>,
    /// Things that could not be read; the fields concerned are `null`.
    #[serde(default)]
    pub warnings: Vec<String>,
}

impl Inventory {
    pub fn device(&self, addr: &PciAddress) -> Option<&PciDevice> {
        self.devices.iter().find(|d| &d.address == addr)
    }

    pub fn group(&self, number: u32) -> Option<&IommuGroup> {
        self.groups.iter().find(|g| g.number == number)
    }

    /// The group VFIO will open for `d`, when `d` passes the first three readiness checks
    /// ([`NotReady`]): a VFIO driver, an IOMMU group, a viable group. For consumers that check
    /// the device nodes themselves, per backend.
    pub(crate) fn vfio_group(&self, d: &PciDevice) -> Result<&IommuGroup, NotReady> {
        d.check_vfio_driver()?;
        let g = d
            .iommu_group
            .and_then(|n| self.group(n))
            .ok_or(NotReady::NoGroup)?;
        g.check_viable()?;
        Ok(g)
    }

    /// Whether `d` can be handed to a VFIO user now, as this inventory saw it: the checks of
    /// [`Inventory::vfio_group`], then a backend's device nodes present (`d.backends`).
    pub fn vfio_readiness(&self, d: &PciDevice) -> Result<&IommuGroup, NotReady> {
        let g = self.vfio_group(d)?;
        if d.backends.is_empty() {
            return Err(NotReady::NoNode { group: g.number });
        }
        Ok(g)
    }

    pub fn mdev(&self, uuid: &str) -> Option<&MdevInstance> {
        self.mdevs.iter().find(|m| m.uuid.eq_ignore_ascii_case(uuid))
    }
}

/// An error and its causes, joined with ": " (`outer: cause: cause`), as `main` prints an error
/// (anyhow's `{:#}`): for the places that print or embed an error themselves (a warning that
/// goes on, one error carried inside another).
pub(crate) struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
