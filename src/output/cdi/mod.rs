//! CDI (Container Device Interface) specs: what a container runtime must add to a container
//! for each device gpupass knows.
//!
//! [`render`] is a pure function of the [`Inventory`] and the driver files found on the host
//! ([`DriverFiles`]); it never reads the host. One spec of kind `gpupass.dev/pci` (changeable
//! with `--kind`) holds:
//!
//! - for every IOMMU group held by a VFIO driver: one device per VFIO-bound function, named by
//!   its PCI address (`gpupass.dev/pci=0000:17:00.0`), and one for the whole group
//!   (`gpupass.dev/pci=group-40`). Device nodes: one backend's set, never both (docs/iommufd.md,
//!   `--backend`): legacy `/dev/vfio/vfio` + `/dev/vfio/<group>`, iommufd `/dev/iommu` +
//!   `/dev/vfio/devices/vfioN`. Under `auto` the plain name carries iommufd where the kernel
//!   serves the device through it, else legacy; a device both serve also gets
//!   `legacy-<name>` and `iommufd-<name>`, so a consumer picks one.
//!   Env `PCI_RESOURCE_<RESOURCE>=<address>[,...]`, the variable KubeVirt reads;
//! - for every active mdev: a device named by its UUID with `/dev/vfio/vfio` +
//!   `/dev/vfio/<group>` and `MDEV_PCI_RESOURCE_<RESOURCE>=<uuid>`;
//! - for every GPU on the native NVIDIA driver: a device named by its PCI address with
//!   `/dev/nvidia<minor>` (the minor from `/proc/driver/nvidia`, never the enumeration index),
//!   the control nodes found, and the driver's libraries, binaries and IPC sockets as
//!   read-only bind mounts.
//!
//! `cdiVersion` is the lowest version whose loader accepts every field used (the rules of the
//! reference implementation's `MinimumRequiredVersion`): device names that start with a digit
//! or `hostPath` need 0.5.0, mount `type` 0.4.0, a `.` in the class or annotations 0.6.0.
//! Podman 4.3 accepts at most 0.5.0, so gpupass uses no newer field.

use crate::host::HostRoot;
use crate::inventory::backend::{self, BackendError, Policy};
use crate::inventory::native::DriverFiles;
use crate::model::{Backend, Inventory, PciDevice};
use crate::output::naming;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Kind used when `--kind` is not given.
pub(crate) const DEFAULT_KIND: &str = "gpupass.dev/pci";

/// Mount options for the driver's files: read-only bind mounts, no device files, no setuid.
const RO_BIND: &[&str] = &["ro", "nosuid", "nodev", "bind"];

/// Why a spec could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error(
        "nothing to describe: no IOMMU group is held by vfio-pci (with its /dev/vfio node), no \
mdev is active and no GPU is on the native nvidia driver; bind a device to vfio-pci first \
(`gpupass list` shows the drivers)"
    )]
    Empty,
    #[error(
        "--cdi-version {pinned} is too old for this spec: {reason} needs cdiVersion {needed} or \
newer; pin {needed} or drop --cdi-version"
    )]
    VersionTooLow {
        pinned: CdiVersion,
        needed: CdiVersion,
        reason: &'static str,
    },
    #[error("cannot write {}; is the directory writable (root)?", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {}: {reason}", .path.display())]
    Read { path: PathBuf, reason: String },
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("internal error: CDI device {device} would carry {reason}; please report it")]
    MixedBackends { device: String, reason: String },
}

impl CdiError {
    /// The command line asked for what cannot be (a pinned `--cdi-version` below what the
    /// spec's fields need): exit status 2.
    pub(crate) fn is_usage(&self) -> bool {
        matches!(self, CdiError::VersionTooLow { .. })
    }
}

/// A CDI spec version the reference loader knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CdiVersion(pub u32, pub u32, pub u32);

impl CdiVersion {
    /// Versions a CDI loader accepts (0.1.0 and 0.2.0 are no longer loadable).
    pub(crate) const KNOWN: &'static [CdiVersion] = &[
        CdiVersion(0, 3, 0),
        CdiVersion(0, 4, 0),
        CdiVersion(0, 5, 0),
        CdiVersion(0, 6, 0),
        CdiVersion(0, 7, 0),
        CdiVersion(0, 8, 0),
        CdiVersion(1, 0, 0),
        CdiVersion(1, 1, 0),
    ];
    pub(crate) const EARLIEST: CdiVersion = CdiVersion(0, 3, 0);
}

impl fmt::Display for CdiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// Text that is not a CDI version gpupass knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown CDI version {text:?}; known: {}", CdiVersion::KNOWN.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(", "))]
pub struct CdiVersionError {
    pub text: String,
}

impl FromStr for CdiVersion {
    type Err = CdiVersionError;
    fn from_str(s: &str) -> Result<Self, CdiVersionError> {
        let t = s.trim().trim_start_matches('v');
        let parts: Vec<u32> = t.split('.').map(|p| p.parse().unwrap_or(u32::MAX)).collect();
        let v = match parts.as_slice() {
            [a, b, c] => CdiVersion(*a, *b, *c),
            _ => CdiVersion(u32::MAX, 0, 0),
        };
        if CdiVersion::KNOWN.contains(&v) {
            Ok(v)
        } else {
            Err(CdiVersionError { text: s.to_string() })
        }
    }
}

impl Serialize for CdiVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CdiVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A CDI kind, `vendor/class`: each part starts with a letter, ends with a letter or digit
/// and holds only letters, digits, `_`, `-` and `.`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Kind {
    pub vendor: String,
    pub class: String,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.vendor, self.class)
    }
}

impl From<Kind> for String {
    fn from(k: Kind) -> String {
        k.to_string()
    }
}

impl TryFrom<String> for Kind {
    type Error = KindError;
    fn try_from(s: String) -> Result<Self, KindError> {
        s.parse()
    }
}

/// Text that is not a CDI kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid CDI kind {text:?}: expected vendor/class like {DEFAULT_KIND}, each part starting \
with a letter, ending with a letter or digit, with only letters, digits, '_', '-' and '.'"
)]
pub struct KindError {
    pub text: String,
}

fn valid_kind_part(p: &str) -> bool {
    let b = p.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphabetic()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'))
}

impl FromStr for Kind {
    type Err = KindError;
    fn from_str(s: &str) -> Result<Self, KindError> {
        let bad = || KindError { text: s.to_string() };
        let (v, c) = s.split_once('/').ok_or_else(bad)?;
        if !valid_kind_part(v) || !valid_kind_part(c) {
            return Err(bad());
        }
        Ok(Kind {
            vendor: v.into(),
            class: c.into(),
        })
    }
}

impl Default for Kind {
    fn default() -> Self {
        DEFAULT_KIND.parse().expect("default kind is valid")
    }
}

/// Whether a device name is valid for CDI: letters, digits, `_`, `-`, `.`, `:`, starting and
/// ending with a letter or digit.
pub fn valid_device_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b':'))
}

// ---- the spec document (field names as in the CDI JSON schema) ----

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    pub(crate) fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty() && self.mounts.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host when it differs (`--dev-root`); needs cdiVersion 0.5.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Needs cdiVersion 0.4.0; gpupass leaves it out (bind mounts need no type).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
}

/// How to render.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Options {
    pub kind: Kind,
    /// Pin `cdiVersion` (must be at least what the spec needs).
    pub version: Option<CdiVersion>,
    /// Where the host's `/dev` is, as the runtime sees it (`/dev` normally). Another value
    /// makes every device node carry a `hostPath` under it.
    pub dev_root: String,
    /// Where the host's `/` is for the driver's files (`/` normally).
    pub driver_root: String,
    /// Which VFIO node set the devices carry (docs/iommufd.md).
    #[serde(default)]
    pub backend: Policy,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            kind: Kind::default(),
            version: None,
            dev_root: "/dev".into(),
            driver_root: "/".into(),
            backend: Policy::Auto,
        }
    }
}

impl Options {
    fn node(&self, path: &str) -> DeviceNode {
        let dev_root = self.dev_root.trim_end_matches('/');
        let host_path = match path.strip_prefix("/dev") {
            Some(rest) if dev_root != "/dev" => Some(format!("{dev_root}{rest}")),
            _ => None,
        };
        DeviceNode {
            path: path.to_string(),
            host_path,
        }
    }

    fn bind(&self, path: &str) -> Mount {
        let root = self.driver_root.trim_end_matches('/');
        Mount {
            host_path: format!("{root}{path}"),
            container_path: path.to_string(),
            options: RO_BIND.iter().map(|s| s.to_string()).collect(),
            mount_type: None,
        }
    }
}

/// A rendered spec and what was left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub spec: Spec,
    pub warnings: Vec<String>,
}

/// The lowest `cdiVersion` the spec's fields need, and the field that needs it.
pub(crate) fn min_version(spec: &Spec) -> (CdiVersion, &'static str) {
    let mut v = (CdiVersion::EARLIEST, "nothing");
    let mut need = |nv: CdiVersion, why: &'static str| {
        if nv > v.0 {
            v = (nv, why);
        }
    };
    let edits = spec
        .devices
        .iter()
        .map(|d| &d.container_edits)
        .chain(std::iter::once(&spec.container_edits));
    for e in edits {
        if e.mounts.iter().any(|m| m.mount_type.is_some()) {
            need(CdiVersion(0, 4, 0), "a mount type");
        }
        if e.device_nodes.iter().any(|n| n.host_path.is_some()) {
            need(CdiVersion(0, 5, 0), "a device node hostPath (--dev-root)");
        }
    }
    if spec
        .devices
        .iter()
        .any(|d| !d.name.as_bytes().first().is_some_and(|c| c.is_ascii_alphabetic()))
    {
        need(
            CdiVersion(0, 5, 0),
            "a device name starting with a digit (a PCI address or UUID)",
        );
    }
    if let Some((_, class)) = spec.kind.split_once('/') {
        if class.contains('.') {
            need(CdiVersion(0, 6, 0), "a '.' in the kind's class");
        }
    }
    v
}

/// `PCI_RESOURCE_<RES>=a,b` entries for VFIO functions, grouped by resource, in order.
fn pci_env(devs: &[&PciDevice]) -> Vec<String> {
    let mut by_res: Vec<(String, Vec<String>)> = Vec::new();
    for d in devs {
        let var = naming::resource_env_var("PCI_RESOURCE", &naming::pci_resource_name(d));
        match by_res.iter_mut().find(|(r, _)| *r == var) {
            Some((_, a)) => a.push(d.address.to_string()),
            None => by_res.push((var, vec![d.address.to_string()])),
        }
    }
    by_res
        .into_iter()
        .map(|(var, a)| format!("{var}={}", a.join(",")))
        .collect()
}

/// The rule every spec keeps: each device carries the VFIO nodes of one backend only.
pub(crate) fn check_backends(devices: &[Device]) -> Result<(), CdiError> {
    for d in devices {
        backend::check_one_backend(d.container_edits.device_nodes.iter().map(|n| n.path.as_str())).map_err(
            |e| CdiError::MixedBackends {
                device: d.name.clone(),
                reason: e.to_string(),
            },
        )?;
    }
    Ok(())
}

/// One backend's device nodes for functions of a group.
fn nodes(opts: &Options, b: Backend, group: u32, devs: &[&PciDevice]) -> Vec<DeviceNode> {
    backend::nodes(b, group, devs)
        .iter()
        .map(|p| opts.node(p))
        .collect()
}

/// Under `auto`, a device (or group) both backends serve also gets one CDI device per backend,
/// named `legacy-<name>` and `iommufd-<name>`, so a consumer can pick one; the plain name
/// carries the `auto` choice. Explicit policies name no alternatives.
fn alternatives(policy: Policy, available: &[Backend]) -> Vec<Backend> {
    if policy == Policy::Auto && available.len() > 1 {
        available.to_vec()
    } else {
        Vec::new()
    }
}

/// Why a VFIO function of a viable group is left out under `policy`.
fn left_out(inv: &Inventory, policy: Policy, name: &str, d: &PciDevice, group: u32) -> String {
    let legacy_missing =
        format!("/dev/vfio/vfio or /dev/vfio/{group} is missing; is the vfio module loaded?");
    let reason = match policy {
        Policy::Legacy => legacy_missing,
        Policy::Iommufd => backend::why_not_iommufd(inv, d),
        Policy::Auto => format!(
            "neither /dev/vfio/vfio with /dev/vfio/{group} nor /dev/iommu with a VFIO cdev exists; is the vfio module loaded?"
        ),
    };
    format!("{name} left out (--backend {policy}): {reason}")
}

/// Render the spec. Pure: reads only `inv` and `files`.
pub fn render(inv: &Inventory, files: &DriverFiles, opts: &Options) -> Result<Rendered, CdiError> {
    let mut devices = Vec::new();
    let mut warnings = Vec::new();
    if opts.backend == Policy::Iommufd {
        if let Err(e) = backend::iommufd_ready(inv) {
            return Err(BackendError::IommufdUnavailable {
                what: "this host".into(),
                reason: e.to_string(),
            }
            .into());
        }
    }

    // VFIO groups.
    for g in &inv.groups {
        let vfio = backend::vfio_members(inv, g);
        if vfio.is_empty() {
            continue;
        }
        if !g.viable {
            let who: Vec<String> = g
                .blockers
                .iter()
                .map(|b| format!("{} ({})", b.address, b.driver))
                .collect();
            warnings.push(format!(
                "group {} left out: {} still on host drivers; bind the whole group to vfio-pci",
                g.number,
                who.join(", ")
            ));
            continue;
        }
        let usable: Vec<(&PciDevice, Backend)> = vfio
            .iter()
            .filter_map(|d| match backend::choose(opts.backend, d) {
                Some(b) => Some((*d, b)),
                None => {
                    warnings.push(left_out(inv, opts.backend, &d.address.to_string(), d, g.number));
                    None
                }
            })
            .collect();
        for (d, b) in &usable {
            let edits = |b: Backend| ContainerEdits {
                env: pci_env(&[d]),
                device_nodes: nodes(opts, b, g.number, &[d]),
                mounts: Vec::new(),
            };
            let name = d.address.to_string();
            devices.push(Device {
                name: name.clone(),
                container_edits: edits(*b),
            });
            for alt in alternatives(opts.backend, &d.backends) {
                devices.push(Device {
                    name: format!("{alt}-{name}"),
                    container_edits: edits(alt),
                });
            }
        }
        let group_choice = match opts.backend {
            Policy::Legacy => g.backends.contains(&Backend::Legacy).then_some(Backend::Legacy),
            Policy::Iommufd => g.backends.contains(&Backend::Iommufd).then_some(Backend::Iommufd),
            Policy::Auto => g.backends.iter().copied().max(),
        };
        let Some(gb) = group_choice else {
            if !usable.is_empty() {
                warnings.push(format!(
                    "group-{} left out: no {} node set serves every VFIO function of the group",
                    g.number, opts.backend
                ));
            }
            continue;
        };
        let edits = |b: Backend| ContainerEdits {
            env: pci_env(&vfio),
            device_nodes: nodes(opts, b, g.number, &vfio),
            mounts: Vec::new(),
        };
        devices.push(Device {
            name: format!("group-{}", g.number),
            container_edits: edits(gb),
        });
        for alt in alternatives(opts.backend, &g.backends) {
            devices.push(Device {
                name: format!("{alt}-group-{}", g.number),
                container_edits: edits(alt),
            });
        }
    }

    // Mediated devices.
    for m in &inv.mdevs {
        if opts.backend == Policy::Iommufd {
            warnings.push(format!(
                "mdev {} left out: --backend iommufd; gpupass hands mdevs out through their group (legacy or auto)",
                m.uuid
            ));
            continue;
        }
        let Some(gn) = m.iommu_group else {
            warnings.push(format!("mdev {} left out: it has no IOMMU group", m.uuid));
            continue;
        };
        let present = inv.group(gn).is_some_and(|g| g.vfio_node_present);
        if !inv.vfio_container_present || !present {
            warnings.push(format!(
                "mdev {} left out: /dev/vfio/vfio or /dev/vfio/{gn} is missing; is vfio_mdev loaded?",
                m.uuid
            ));
            continue;
        }
        if !valid_device_name(&m.uuid) {
            warnings.push(format!("mdev {:?} left out: not a valid CDI device name", m.uuid));
            continue;
        }
        let res = naming::mdev_instance_resource_name(inv, m);
        devices.push(Device {
            name: m.uuid.clone(),
            container_edits: ContainerEdits {
                env: vec![format!(
                    "{}={}",
                    naming::resource_env_var("MDEV_PCI_RESOURCE", &res),
                    m.uuid
                )],
                device_nodes: vec![opts.node("/dev/vfio/vfio"), opts.node(&format!("/dev/vfio/{gn}"))],
                mounts: Vec::new(),
            },
        });
    }

    // GPUs on the native NVIDIA driver.
    let mut native: Vec<&PciDevice> = inv
        .devices
        .iter()
        // SR-IOV VFs on the nvidia driver are vGPU vehicles for VMs, not GPUs a container uses.
        .filter(|d| d.is_gpu() && d.driver.as_deref() == Some("nvidia") && d.physfn.is_none())
        .collect();
    native.sort_by_key(|d| d.address);
    for d in native {
        let Some(minor) = d.nvidia.as_ref().and_then(|n| n.minor) else {
            warnings.push(format!(
                "{} left out: no Device Minor in /proc/driver/nvidia/gpus/{}/information",
                d.address, d.address
            ));
            continue;
        };
        let Some(node) = files.gpu_node(minor) else {
            warnings.push(format!(
                "{} left out: its node /dev/nvidia{minor} does not exist (run nvidia-modprobe -c {minor})",
                d.address
            ));
            continue;
        };
        let mut nodes = vec![opts.node(node)];
        nodes.extend(files.control_nodes().into_iter().map(|c| opts.node(c)));
        let mut mounts: Vec<Mount> = Vec::new();
        for p in files
            .libraries
            .iter()
            .map(|l| l.path.as_str())
            .chain(files.binaries.iter().map(|s| s.as_str()))
            .chain(files.ipcs.iter().map(|s| s.as_str()))
        {
            mounts.push(opts.bind(p));
        }
        devices.push(Device {
            name: d.address.to_string(),
            container_edits: ContainerEdits {
                env: Vec::new(),
                device_nodes: nodes,
                mounts,
            },
        });
    }

    check_backends(&devices)?;
    if devices.is_empty() {
        return Err(CdiError::Empty);
    }
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: opts.kind.to_string(),
        devices,
        container_edits: ContainerEdits::default(),
    };
    let (needed, reason) = min_version(&spec);
    let v = match opts.version {
        Some(p) if p < needed => {
            return Err(CdiError::VersionTooLow {
                pinned: p,
                needed,
                reason,
            })
        }
        Some(p) => p,
        None => needed,
    };
    spec.cdi_version = v.to_string();
    Ok(Rendered { spec, warnings })
}

/// The spec as the JSON gpupass writes (pretty, trailing newline).
pub fn to_json(spec: &Spec) -> String {
    let mut s = serde_json::to_string_pretty(spec).expect("a spec serializes");
    s.push('\n');
    s
}

// ---- writing into the CDI spec directory, and keeping it fresh ----

/// File name in `var/run/cdi` for a kind: `gpupass.json` for the default kind, else
/// `gpupass-<vendor>_<class>.json`.
pub(crate) fn spec_file_name(kind: &Kind) -> String {
    if kind.to_string() == DEFAULT_KIND {
        "gpupass.json".into()
    } else {
        format!("gpupass-{}_{}.json", kind.vendor, kind.class)
    }
}

/// How a written spec was generated, kept in `var/run/gpupass/cdi/<file>.options.json` so that
/// the refresh after a change (`containers::cdi::refresh_in`) regenerates it the same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Recorded {
    pub options: Options,
    /// The spec was removed because nothing was left to describe; refresh recreates it.
    #[serde(default)]
    pub emptied: bool,
}

impl Recorded {
    /// The record file's content.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("options serialize")
    }
}

/// Where the record of a spec's options lives.
pub(crate) fn options_file(host: &HostRoot, spec_name: &str) -> PathBuf {
    host.gpupass_run_dir()
        .join("cdi")
        .join(format!("{spec_name}.options.json"))
}

/// Write a file the user named (`--output`) atomically ([`crate::host::write_atomic`]; the
/// temporary name does not end in `.json`, so CDI watchers ignore it). Specs in the runtime's
/// directory are written by the change engine (`containers::cdi`).
pub(crate) use crate::host::write_atomic;

#[cfg(test)]
mod tests;
