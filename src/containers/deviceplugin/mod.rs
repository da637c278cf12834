//! Kubernetes device plugin (kubelet deviceplugin API v1beta1) for devices held by VFIO.
//!
//! One resource per device model (`nvidia.com/AD102GL_L40S`, named by [`crate::output::naming`], the
//! names KubeVirt's `permittedHostDevices` expects) and per mdev type; device IDs are PCI
//! addresses (mdev: UUIDs). This module is the pure part: which resources and devices a host
//! has and their health ([`resources`]), what a container gets for an allocation
//! ([`allocate`]) and which devices to prefer ([`preferred`]), all functions of the
//! [`Inventory`]. [`server`] holds the gRPC servers, the kubelet registration and the polling.

pub mod server;

/// Code generated from `proto/deviceplugin/v1beta1/api.proto` (messages, client and server
/// stubs of the `Registration` and `DevicePlugin` services).
#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("v1beta1");
}

use crate::host::HostRoot;
use crate::inventory::backend::{self, Policy};
use crate::model::{Inventory, NotReady, PciAddress, PciDevice};
use crate::output::cdi::Kind;
use crate::output::naming;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

/// API version string sent in `RegisterRequest`.
pub(crate) const API_VERSION: &str = "v1beta1";
/// The kubelet's registration socket, in the device-plugins directory.
pub(crate) const KUBELET_SOCKET: &str = "kubelet.sock";
pub(crate) const HEALTHY: &str = "Healthy";
pub(crate) const UNHEALTHY: &str = "Unhealthy";

/// When Allocate replies name CDI devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CdiMode {
    /// When a gpupass spec exists in /var/run/cdi or /etc/cdi (so the runtime can resolve them).
    Auto,
    Always,
    Never,
    /// Only the CDI device names: no device nodes or environment of the plugin's own, so the
    /// runtime (containerd, CRI-O) makes every edit from the spec; refused while no gpupass
    /// spec is in /var/run/cdi or /etc/cdi (`gpupass cdi generate --write`).
    Only,
}

/// An Allocate reply for `--cdi only`: the CDI names stay, the plugin's own device nodes and
/// environment go (the spec's container edits carry the same nodes and `PCI_RESOURCE_*`).
pub(crate) fn cdi_only(mut r: proto::ContainerAllocateResponse) -> proto::ContainerAllocateResponse {
    r.devices.clear();
    r.envs.clear();
    r.mounts.clear();
    r
}

/// Settings of `gpupass device-plugin`.
#[derive(Debug, Clone)]
pub struct Config {
    pub host: HostRoot,
    pub socket_dir: PathBuf,
    pub poll: Duration,
    pub cdi: CdiMode,
    pub cdi_kind: Kind,
    /// Which VFIO node set an allocation gets (docs/iommufd.md).
    pub backend: Policy,
}

/// Whether a resource holds PCI functions or mdevs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResourceKind {
    Pci,
    Mdev,
}

/// One device as announced to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PluginDevice {
    /// PCI address or mdev UUID.
    pub id: String,
    pub healthy: bool,
    pub numa: Option<i64>,
    /// Why it is unhealthy.
    pub reason: Option<String>,
}

/// A resource and its devices, in ID order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resource {
    pub name: String,
    pub kind: ResourceKind,
    pub devices: Vec<PluginDevice>,
}

impl Resource {
    pub(crate) fn to_proto(&self) -> Vec<proto::Device> {
        self.devices
            .iter()
            .map(|d| proto::Device {
                id: d.id.clone(),
                health: if d.healthy { HEALTHY } else { UNHEALTHY }.into(),
                topology: d.numa.map(|n| proto::TopologyInfo {
                    nodes: vec![proto::NumaNode { id: n }],
                }),
            })
            .collect()
    }
}

/// Every resource of the host: VFIO-bound functions (bridges excluded) by model, active mdevs
/// by type. Health: still bound to a VFIO driver, group viable, its device node present
/// (devices that vanish are handled by [`merge`]).
pub(crate) fn resources(inv: &Inventory) -> BTreeMap<String, Resource> {
    let mut out: BTreeMap<String, Resource> = BTreeMap::new();
    for d in &inv.devices {
        if d.is_bridge || d.check_vfio_driver().is_err() {
            continue;
        }
        let name = naming::pci_resource_name(d);
        // Why it is not usable now (the model's readiness rule), `None` when it is.
        let problem = inv.vfio_readiness(d).err().map(|e| e.to_string());
        out.entry(name.clone())
            .or_insert_with(|| Resource {
                name,
                kind: ResourceKind::Pci,
                devices: Vec::new(),
            })
            .devices
            .push(PluginDevice {
                id: d.address.to_string(),
                healthy: problem.is_none(),
                numa: d.numa_node.filter(|n| *n >= 0).map(i64::from),
                reason: problem,
            });
    }
    for m in &inv.mdevs {
        let name = naming::mdev_instance_resource_name(inv, m);
        let parent = m.parent.parse::<PciAddress>().ok().and_then(|a| inv.device(&a));
        let problem = match m.iommu_group {
            None => Some(NotReady::NoGroup.to_string()),
            Some(g) if !(inv.vfio_container_present && inv.group(g).is_some_and(|g| g.vfio_node_present)) => {
                Some(NotReady::NoNode { group: g }.to_string())
            }
            Some(_) => None,
        };
        out.entry(name.clone())
            .or_insert_with(|| Resource {
                name,
                kind: ResourceKind::Mdev,
                devices: Vec::new(),
            })
            .devices
            .push(PluginDevice {
                id: m.uuid.clone(),
                healthy: problem.is_none(),
                numa: parent
                    .and_then(|p| p.numa_node)
                    .filter(|n| *n >= 0)
                    .map(i64::from),
                reason: problem,
            });
    }
    for r in out.values_mut() {
        r.devices.sort_by(|a, b| a.id.cmp(&b.id));
    }
    out
}

/// The new state of a resource the kubelet already knows: devices that are gone (unbound from
/// VFIO, removed, hot-unplugged) stay listed as Unhealthy so the kubelet lowers the capacity.
pub(crate) fn merge(old: Option<&Resource>, now: Option<&Resource>) -> Option<Resource> {
    let mut r = match (old, now) {
        (None, None) => return None,
        (_, Some(n)) => n.clone(),
        (Some(o), None) => Resource {
            name: o.name.clone(),
            kind: o.kind,
            devices: Vec::new(),
        },
    };
    if let Some(o) = old {
        for d in &o.devices {
            if !r.devices.iter().any(|x| x.id == d.id) {
                r.devices.push(PluginDevice {
                    id: d.id.clone(),
                    healthy: false,
                    numa: d.numa,
                    reason: Some("no longer on VFIO or gone".into()),
                });
            }
        }
    }
    r.devices.sort_by(|a, b| a.id.cmp(&b.id));
    Some(r)
}

/// Why an Allocate or GetPreferredAllocation request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("device ID {id:?} is not a PCI address (expected 0000:01:00.0)")]
    Malformed { id: String },
    #[error("device {id} is not a device of resource {resource}")]
    Unknown { id: String, resource: String },
    #[error("device {id} cannot be allocated: {reason}")]
    NotReady { id: String, reason: String },
}

impl AllocError {
    pub(crate) fn to_status(&self) -> tonic::Status {
        match self {
            AllocError::Malformed { .. } => tonic::Status::invalid_argument(self.to_string()),
            AllocError::Unknown { .. } => tonic::Status::not_found(self.to_string()),
            AllocError::NotReady { .. } => tonic::Status::failed_precondition(self.to_string()),
        }
    }
}

fn spec(path: &str) -> proto::DeviceSpec {
    proto::DeviceSpec {
        container_path: path.into(),
        host_path: path.into(),
        permissions: "mrw".into(),
    }
}

/// The reply for one container: DeviceSpecs of one backend per allocated function, chosen by
/// `policy` (legacy: its group node and `/dev/vfio/vfio`; iommufd: its cdev and `/dev/iommu`;
/// never both, docs/iommufd.md; mdevs: legacy), `PCI_RESOURCE_<RES>` (or
/// `MDEV_PCI_RESOURCE_<RES>`) listing only the allocated IDs, in request order, and the CDI
/// device names when `cdi` is given (the names of a spec generated with `--backend auto`:
/// the plain name under `auto`, `legacy-`/`iommufd-` names for an explicit policy where both
/// backends serve the function).
pub fn allocate(
    inv: &Inventory,
    resource: &str,
    ids: &[String],
    cdi: Option<&Kind>,
    policy: Policy,
) -> Result<proto::ContainerAllocateResponse, AllocError> {
    let mut cdi_names = Vec::new();
    let mut devices: Vec<proto::DeviceSpec> = Vec::new();
    let mut add = |p: String| {
        if !devices.iter().any(|d| d.container_path == p) {
            devices.push(spec(&p));
        }
    };
    let mut is_mdev = false;
    for id in ids {
        if let Ok(addr) = id.parse::<PciAddress>() {
            let d = inv
                .device(&addr)
                .filter(|d| !d.is_bridge && naming::pci_resource_name(d) == resource)
                .ok_or_else(|| AllocError::Unknown {
                    id: id.clone(),
                    resource: resource.into(),
                })?;
            let g = inv.vfio_readiness(d).map_err(|e| AllocError::NotReady {
                id: id.clone(),
                reason: e.to_string(),
            })?;
            let b = backend::choose(policy, d).ok_or_else(|| AllocError::NotReady {
                id: id.clone(),
                reason: match policy {
                    Policy::Iommufd => format!("--backend iommufd: {}", backend::why_not_iommufd(inv, d)),
                    _ => NotReady::NoNode { group: g.number }.to_string(),
                },
            })?;
            // The group is the unit, as with the legacy group node: every VFIO member's cdev.
            let members: Vec<&PciDevice> = g
                .members
                .iter()
                .filter_map(|a| inv.device(a))
                .filter(|m| m.backends.contains(&b))
                .collect();
            for p in backend::nodes(b, g.number, &members) {
                add(p);
            }
            cdi_names.push(if policy != Policy::Auto && d.backends.len() > 1 {
                format!("{b}-{id}")
            } else {
                id.clone()
            });
        } else if let Some(m) = inv.mdev(id) {
            if naming::mdev_instance_resource_name(inv, m) != resource {
                return Err(AllocError::Unknown {
                    id: id.clone(),
                    resource: resource.into(),
                });
            }
            let g = m.iommu_group.ok_or_else(|| AllocError::NotReady {
                id: id.clone(),
                reason: NotReady::NoGroup.to_string(),
            })?;
            is_mdev = true;
            add("/dev/vfio/vfio".into());
            add(format!("/dev/vfio/{g}"));
            cdi_names.push(id.clone());
        } else if crate::model::is_uuid(id) {
            return Err(AllocError::Unknown {
                id: id.clone(),
                resource: resource.into(),
            });
        } else {
            return Err(AllocError::Malformed { id: id.clone() });
        }
    }
    let prefix = if is_mdev {
        "MDEV_PCI_RESOURCE"
    } else {
        "PCI_RESOURCE"
    };
    let mut envs = HashMap::new();
    if !ids.is_empty() {
        envs.insert(naming::resource_env_var(prefix, resource), ids.join(","));
    }
    let cdi_devices = match cdi {
        Some(k) => cdi_names
            .iter()
            .map(|id| proto::CdiDevice {
                name: format!("{k}={id}"),
            })
            .collect(),
        None => Vec::new(),
    };
    if let Err(e) = backend::check_one_backend(devices.iter().map(|d| d.container_path.as_str())) {
        return Err(AllocError::NotReady {
            id: ids.join(","),
            reason: e.to_string(),
        });
    }
    Ok(proto::ContainerAllocateResponse {
        envs,
        mounts: Vec::new(),
        devices,
        annotations: HashMap::new(),
        cdi_devices,
    })
}

/// GetPreferredAllocation for one container: all of `must_include`, then the rest from one
/// NUMA node when one node can supply it (the node of the must-include devices first, then the
/// lowest-numbered node that fits), else from the nodes with most devices first. IDs within a
/// node go in address order. Unknown IDs are an error.
pub(crate) fn preferred(
    resource: &Resource,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Result<Vec<String>, AllocError> {
    let numa_of = |id: &String| -> Result<Option<i64>, AllocError> {
        resource
            .devices
            .iter()
            .find(|d| &d.id == id)
            .map(|d| d.numa)
            .ok_or_else(|| AllocError::Unknown {
                id: id.clone(),
                resource: resource.name.clone(),
            })
    };
    let mut out: Vec<String> = Vec::new();
    for id in must_include {
        numa_of(id)?;
        if !out.contains(id) {
            out.push(id.clone());
        }
    }
    let mut by_node: BTreeMap<Option<i64>, Vec<String>> = BTreeMap::new();
    for id in available {
        let n = numa_of(id)?;
        if !out.contains(id) {
            by_node.entry(n).or_default().push(id.clone());
        }
    }
    for v in by_node.values_mut() {
        v.sort();
        v.dedup();
    }
    let need = size.saturating_sub(out.len());
    if need == 0 {
        return Ok(out);
    }
    let must_nodes: Vec<Option<i64>> = out.iter().filter_map(|id| numa_of(id).ok()).collect();
    let home = must_nodes
        .first()
        .copied()
        .filter(|h| must_nodes.iter().all(|n| n == h));
    let fits = |n: &Option<i64>| by_node.get(n).is_some_and(|v| v.len() >= need);
    let chosen = match home {
        Some(h) if fits(&h) => Some(h),
        _ if !must_nodes.is_empty() && home.is_none() => None,
        _ => by_node.keys().copied().find(|n| fits(n)),
    };
    match chosen {
        Some(n) => out.extend(by_node[&n].iter().take(need).cloned()),
        None => {
            let mut nodes: Vec<(Option<i64>, Vec<String>)> = by_node.into_iter().collect();
            nodes.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
            for (_, ids) in nodes {
                for id in ids {
                    if out.len() >= size {
                        break;
                    }
                    out.push(id);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every policy hands out one node set; an explicit one names the CDI device of that
    /// backend; iommufd where the kernel lacks it is refused with the reason.
    #[test]
    fn allocate_follows_the_backend_policy() {
        let dir = tempfile::tempdir().unwrap();
        crate::testkit::fixtures::build("vfio-numa", dir.path()).unwrap();
        let inv = crate::inventory::scan(&HostRoot::new(dir.path())).unwrap();
        let d = inv.device(&"0000:17:00.0".parse().unwrap()).unwrap();
        let res = naming::pci_resource_name(d);
        let kind = Kind::default();
        let ids = ["0000:17:00.0".to_string()];
        let paths = |p| -> (Vec<String>, Vec<String>) {
            let r = allocate(&inv, &res, &ids, Some(&kind), p).unwrap();
            (
                r.devices.iter().map(|d| d.container_path.clone()).collect(),
                r.cdi_devices.iter().map(|c| c.name.clone()).collect(),
            )
        };
        assert_eq!(
            paths(Policy::Legacy),
            (
                vec!["/dev/vfio/vfio".into(), "/dev/vfio/40".into()],
                vec!["gpupass.dev/pci=legacy-0000:17:00.0".into()]
            )
        );
        assert_eq!(
            paths(Policy::Iommufd).0,
            ["/dev/iommu", "/dev/vfio/devices/vfio0"]
        );
        assert_eq!(paths(Policy::Auto).1, ["gpupass.dev/pci=0000:17:00.0"]);
        let mut no_iommufd = inv.clone();
        no_iommufd.iommufd_present = false;
        crate::inventory::backend::fill_backends(&mut no_iommufd);
        assert_eq!(
            allocate(&no_iommufd, &res, &ids, None, Policy::Auto)
                .unwrap()
                .devices
                .len(),
            2
        );
        let e = allocate(&no_iommufd, &res, &ids, None, Policy::Iommufd)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--backend iommufd"), "{e}");
        // --cdi only: the CDI name alone, nothing the runtime would not take from the spec.
        let only = cdi_only(allocate(&inv, &res, &ids, Some(&kind), Policy::Legacy).unwrap());
        assert!(only.devices.is_empty() && only.envs.is_empty() && only.mounts.is_empty());
        assert_eq!(only.cdi_devices.len(), 1);
        assert_eq!(only.cdi_devices[0].name, "gpupass.dev/pci=legacy-0000:17:00.0");
    }

    fn res(devs: &[(&str, Option<i64>)]) -> Resource {
        Resource {
            name: "nvidia.com/X".into(),
            kind: ResourceKind::Pci,
            devices: devs
                .iter()
                .map(|(id, n)| PluginDevice {
                    id: id.to_string(),
                    healthy: true,
                    numa: *n,
                    reason: None,
                })
                .collect(),
        }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn preferred_keeps_one_numa_node() {
        let r = res(&[
            ("a", Some(0)),
            ("b", Some(1)),
            ("c", Some(0)),
            ("d", Some(1)),
            ("e", Some(1)),
        ]);
        let all = s(&["a", "b", "c", "d", "e"]);
        assert_eq!(preferred(&r, &all, &[], 2).unwrap(), s(&["a", "c"]));
        assert_eq!(preferred(&r, &all, &[], 3).unwrap(), s(&["b", "d", "e"]));
        assert_eq!(preferred(&r, &all, &s(&["d"]), 2).unwrap(), s(&["d", "b"]));
        // Node 0 has only a and c: 4 devices spill, the fuller node first.
        assert_eq!(preferred(&r, &all, &[], 4).unwrap(), s(&["b", "d", "e", "a"]));
        // Must-include on both nodes: no single node, fill by size.
        assert_eq!(
            preferred(&r, &all, &s(&["a", "b"]), 3).unwrap(),
            s(&["a", "b", "d"])
        );
        assert!(matches!(
            preferred(&r, &s(&["zz"]), &[], 1),
            Err(AllocError::Unknown { .. })
        ));
    }

    #[test]
    fn merge_keeps_vanished_devices_unhealthy() {
        let old = res(&[("a", Some(0)), ("b", Some(1))]);
        let now = res(&[("a", Some(0))]);
        let m = merge(Some(&old), Some(&now)).unwrap();
        assert_eq!(m.devices.len(), 2);
        assert!(m.devices[0].healthy && !m.devices[1].healthy);
        let gone = merge(Some(&old), None).unwrap();
        assert!(gone.devices.iter().all(|d| !d.healthy));
        assert!(merge(None, None).is_none());
    }
}
