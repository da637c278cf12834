//! The claim side of Prepare, pure: what a ResourceClaim must look like before the plugin does
//! anything for it ([`check`]), and what a prepared claim hands the kubelet and the container
//! ([`result`]): the devices, their CDI device IDs, the per-claim CDI spec with one VFIO
//! backend for the whole claim, and the KEP-5304 metadata files KubeVirt reads.
//!
//! The plugin runs as root on every node, so it believes nothing it did not check: the claim's
//! UID must be the one the kubelet named, the allocation must be for this driver, this node's
//! pool and this node, every device must be one this node offers, admin access (sharing a
//! device with its user) is refused, and the opaque configuration must be exactly ours (an
//! unknown field or value is an error, never a default).

use super::slices::{self, Publishable};
use super::slots::MdevSlot;
use super::DOMAIN;
use crate::inventory::backend::{self, Policy};
use crate::model::{is_vfio_driver, Backend, Inventory, PciAddress};
use crate::output::cdi;
use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, ResourceClaim};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The `apiVersion` of gpupass's opaque device configuration.
pub(crate) const CONFIG_API_VERSION: &str = "gpupass.dev/v1alpha1";
/// Its `kind`.
pub(crate) const CONFIG_KIND: &str = "VfioConfig";
/// The metadata API versions written, newest first (a reader takes the first it knows;
/// KubeVirt knows v1alpha1, Kubernetes' own helpers v1beta1).
pub(crate) const METADATA_VERSIONS: [&str; 2] = [
    "metadata.resource.k8s.io/v1beta1",
    "metadata.resource.k8s.io/v1alpha1",
];
/// Where containers find the metadata files (KEP-5304).
pub(crate) const METADATA_CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// The annotation a claim made from a Pod's claim template carries: the Pod's claim name.
pub(crate) const POD_CLAIM_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// The claim as the kubelet names it (the kit's: [`crate::containers::kubelet::claims`]).
pub use crate::containers::kubelet::claims::ClaimRef;

/// Who this plugin is: checked against every allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub driver: String,
    pub node: String,
    /// The pool the node's devices are published in (the node name).
    pub pool: String,
}

/// `backendPolicy` of the opaque configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendPolicy {
    Legacy,
    PreferIommufd,
    RequireIommufd,
}

impl BackendPolicy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BackendPolicy::Legacy => "legacy",
            BackendPolicy::PreferIommufd => "prefer-iommufd",
            BackendPolicy::RequireIommufd => "require-iommufd",
        }
    }

    /// The plugin's `--backend` as a claim policy (auto prefers iommufd).
    pub(crate) fn from_policy(p: Policy) -> Self {
        match p {
            Policy::Legacy => BackendPolicy::Legacy,
            Policy::Auto => BackendPolicy::PreferIommufd,
            Policy::Iommufd => BackendPolicy::RequireIommufd,
        }
    }
}

/// gpupass's opaque device configuration (`parameters` of an opaque config for our driver).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct VfioConfig {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_policy: Option<BackendPolicy>,
    /// `true`: the claim's containers also get the node's `/dev/kvm` (a VM launcher in the
    /// Pod, as KubeVirt's virt-launcher gets it from its device plugin), so the Pod needs no
    /// privilege for it (docs/dra.md, "A VM in a Pod").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvm: Option<bool>,
}

/// Why a claim is refused. Each message is what the Pod's events show: what is wrong and how
/// to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error("claim {namespace}/{name}: the API server has UID {found}, the kubelet asked for {asked} (the claim was deleted and recreated); the kubelet retries with the current claim")]
    UidMismatch {
        namespace: String,
        name: String,
        asked: String,
        found: String,
    },
    #[error("claim {claim} is not allocated (no status.allocation); the scheduler allocates it before the kubelet prepares it")]
    NotAllocated { claim: String },
    #[error("claim {claim} is being deleted; nothing is prepared for it")]
    Deleting { claim: String },
    #[error("claim {claim} is allocated to node(s) {found}, not to this node {node}; the kubelet of that node prepares it")]
    WrongNode {
        claim: String,
        node: String,
        found: String,
    },
    #[error("claim {claim}: result for request {request} names pool {pool}, but this node's pool is {ours}")]
    ForeignPool {
        claim: String,
        request: String,
        pool: String,
        ours: String,
    },
    #[error("claim {claim}: device {device} (request {request}) is not a device this node offers; its IOMMU group changed or it was never published here (gpupass dra slices --explain)")]
    UnknownDevice {
        claim: String,
        request: String,
        device: String,
    },
    #[error("claim {claim}: device {device} is allocated twice in one claim")]
    Duplicate { claim: String, device: String },
    #[error("claim {claim}: request {request} asks for admin access to {device}; a passed-through device has exactly one user, so gpupass refuses admin access")]
    AdminAccess {
        claim: String,
        request: String,
        device: String,
    },
    #[error("claim {claim}: opaque configuration for {driver}: {problem}; expected {{\"apiVersion\": \"{CONFIG_API_VERSION}\", \"kind\": \"{CONFIG_KIND}\", \"backendPolicy\": \"legacy\" | \"prefer-iommufd\" | \"require-iommufd\", \"kvm\": true | false}} (each field but apiVersion and kind optional)")]
    Config {
        claim: String,
        driver: String,
        problem: String,
    },
    #[error("claim {claim}: its requests ask for different backend policies ({policies}); one claim gets one VFIO backend, so give every request of the claim the same backendPolicy")]
    MixedPolicies { claim: String, policies: String },
    #[error("claim {claim}: {what} {value:?} is not a Kubernetes name (it becomes part of a file name); refusing it")]
    BadName {
        claim: String,
        what: &'static str,
        value: String,
    },
    #[error("claim {claim} asks for /dev/kvm (opaque config kvm: true), but this node has no /dev/kvm ({reason}); load kvm-intel or kvm-amd (nested=1 inside a VM), or drop kvm from the claim's config")]
    NoKvm { claim: String, reason: String },
    #[error("claim {claim}: no device of it is allocated from driver {driver}")]
    NoDevices { claim: String, driver: String },
    #[error("claim {claim}: require-iommufd, but {address} cannot use iommufd: {reason}; use prefer-iommufd or legacy")]
    IommufdRequired {
        claim: String,
        /// The function (`0000:01:00.0`) or mediated device (`mdev <uuid>`).
        address: String,
        reason: String,
    },
    #[error("claim {claim}: {address} is not usable through VFIO after the bind ({reason}); gpupass dra slices --explain shows the group")]
    NotServable {
        claim: String,
        address: String,
        reason: String,
    },
}

/// One allocated device of ours, checked: a whole IOMMU group (`members` bound to vfio-pci),
/// or an mdev slot (`mdev`: an instance created for the claim; no member, no lead).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    /// The group of a group device (an mdev's group exists only once it is created).
    pub group: u32,
    /// The function whose `pciBusID` a group device carries.
    #[serde(default)]
    pub lead: Option<PciAddress>,
    pub members: Vec<PciAddress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mdev: Option<ClaimMdev>,
}

/// The mediated device an mdev slot of a claim becomes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimMdev {
    /// The parent (`mtty`, `0000:01:00.0`) and type (`mtty-2`).
    pub parent: String,
    pub mdev_type: String,
    /// The instance's UUID: chosen by the plugin and saved in the checkpoint before the
    /// instance is created (empty until then), kept across retries.
    pub uuid: String,
}

impl ClaimDevice {
    /// `0000:01:00.0` for a group, `mdev <uuid>` for a mediated device: what a message names.
    pub(crate) fn label(&self) -> String {
        match (&self.mdev, self.lead) {
            (Some(m), _) => format!("mdev {} ({} on {})", m.uuid, m.mdev_type, m.parent),
            (None, Some(a)) => a.to_string(),
            (None, None) => self.device.clone(),
        }
    }
}

/// What this node offers: the groups and the mdev slots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Offered {
    pub groups: Vec<Publishable>,
    pub slots: Vec<MdevSlot>,
}

impl Offered {
    /// The offer of `inv` ([`slices::publishable`], [`super::slots::offered`]).
    pub(crate) fn of(inv: &Inventory) -> Self {
        Offered {
            groups: slices::publishable(inv),
            slots: super::slots::offered(inv),
        }
    }
}

/// A claim that passed [`check`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checked {
    pub claim: ClaimRef,
    /// `resource.kubernetes.io/pod-claim-name`, for a claim made from a template.
    pub pod_claim_name: Option<String>,
    pub devices: Vec<ClaimDevice>,
    pub policy: BackendPolicy,
    /// The node's `/dev/kvm` goes to the claim's containers too (opaque config `kvm: true`).
    #[serde(default)]
    pub kvm: bool,
}

fn claim_label(r: &ClaimRef) -> String {
    format!("{}/{} ({})", r.namespace, r.name, r.uid)
}

/// The node names an allocation's node selector allows (`metadata.name In [...]` match fields,
/// or a `kubernetes.io/hostname` label expression).
fn selector_nodes(claim: &ResourceClaim) -> Option<Vec<String>> {
    let sel = claim
        .status
        .as_ref()?
        .allocation
        .as_ref()?
        .node_selector
        .as_ref()?;
    let mut out = Vec::new();
    for t in &sel.node_selector_terms {
        for f in t.match_fields.iter().flatten() {
            if f.key == "metadata.name" && f.operator == "In" {
                out.extend(f.values.iter().flatten().cloned());
            }
        }
        for e in t.match_expressions.iter().flatten() {
            if e.key == "kubernetes.io/hostname" && e.operator == "In" {
                out.extend(e.values.iter().flatten().cloned());
            }
        }
    }
    Some(out)
}

/// Parse one opaque configuration for our driver.
fn parse_config(claim: &str, driver: &str, raw: &serde_json::Value) -> Result<VfioConfig, ClaimError> {
    let err = |problem: String| ClaimError::Config {
        claim: claim.to_string(),
        driver: driver.to_string(),
        problem,
    };
    let c: VfioConfig = serde_json::from_value(raw.clone()).map_err(|e| err(e.to_string()))?;
    if c.api_version != CONFIG_API_VERSION {
        return Err(err(format!("unknown apiVersion {:?}", c.api_version)));
    }
    if c.kind != CONFIG_KIND {
        return Err(err(format!("unknown kind {:?}", c.kind)));
    }
    Ok(c)
}

/// Whether a config entry's `requests` covers `request` (empty: every request; `req` covers
/// its subrequests `req/sub`).
fn covers(cfg: &DeviceAllocationConfiguration, request: &str) -> bool {
    match cfg.requests.as_deref() {
        None | Some([]) => true,
        Some(rs) => rs
            .iter()
            .any(|r| r == request || request.split_once('/').is_some_and(|(base, _)| base == r)),
    }
}

/// Check a claim read from the API server against what the kubelet asked, who we are and what
/// this node offers; `default` is the plugin's `--backend`.
pub(crate) fn check(
    asked: &ClaimRef,
    claim: &ResourceClaim,
    me: &Identity,
    offered: &Offered,
    default: Policy,
) -> Result<Checked, ClaimError> {
    let label = claim_label(asked);
    // The UID and the request names become parts of file names (CDI specs, metadata files).
    let safe = |v: &str| {
        !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if !safe(&asked.uid) {
        return Err(ClaimError::BadName {
            claim: label,
            what: "UID",
            value: asked.uid.clone(),
        });
    }
    let found_uid = claim.metadata.uid.clone().unwrap_or_default();
    if found_uid != asked.uid
        || claim.metadata.name.as_deref() != Some(asked.name.as_str())
        || claim.metadata.namespace.as_deref() != Some(asked.namespace.as_str())
    {
        return Err(ClaimError::UidMismatch {
            namespace: claim.metadata.namespace.clone().unwrap_or_default(),
            name: claim.metadata.name.clone().unwrap_or_default(),
            asked: asked.uid.clone(),
            found: found_uid,
        });
    }
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(ClaimError::Deleting { claim: label });
    }
    let Some(alloc) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(ClaimError::NotAllocated { claim: label });
    };
    match selector_nodes(claim) {
        Some(nodes) if nodes.iter().any(|n| n == &me.node) => {}
        other => {
            let found = match other {
                None => "(no node selector: not a node-local allocation)".to_string(),
                Some(v) if v.is_empty() => "(a node selector naming no node)".to_string(),
                Some(v) => v.join(", "),
            };
            return Err(ClaimError::WrongNode {
                claim: label,
                node: me.node.clone(),
                found,
            });
        }
    }
    let results = alloc
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut devices: Vec<ClaimDevice> = Vec::new();
    for r in results.iter().filter(|r| r.driver == me.driver) {
        let (base, sub) = r.request.split_once('/').unwrap_or((r.request.as_str(), "x"));
        if !safe(base) || !safe(sub) {
            return Err(ClaimError::BadName {
                claim: label,
                what: "request name",
                value: r.request.clone(),
            });
        }
        if r.pool != me.pool {
            return Err(ClaimError::ForeignPool {
                claim: label,
                request: r.request.clone(),
                pool: r.pool.clone(),
                ours: me.pool.clone(),
            });
        }
        if r.admin_access == Some(true) {
            return Err(ClaimError::AdminAccess {
                claim: label,
                request: r.request.clone(),
                device: r.device.clone(),
            });
        }
        let found = if let Some(p) = offered.groups.iter().find(|p| p.name == r.device) {
            ClaimDevice {
                request: r.request.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
                group: p.group,
                lead: Some(p.lead),
                members: p.members.clone(),
                mdev: None,
            }
        } else if let Some(s) = offered.slots.iter().find(|s| s.name == r.device) {
            ClaimDevice {
                request: r.request.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
                group: 0,
                lead: None,
                members: Vec::new(),
                mdev: Some(ClaimMdev {
                    parent: s.parent.clone(),
                    mdev_type: s.mdev_type.clone(),
                    uuid: String::new(),
                }),
            }
        } else {
            return Err(ClaimError::UnknownDevice {
                claim: label,
                request: r.request.clone(),
                device: r.device.clone(),
            });
        };
        if devices.iter().any(|d| d.device == r.device) {
            return Err(ClaimError::Duplicate {
                claim: label,
                device: r.device.clone(),
            });
        }
        devices.push(found);
    }
    if devices.is_empty() {
        return Err(ClaimError::NoDevices {
            claim: label,
            driver: me.driver.clone(),
        });
    }
    // Opaque configs for our driver: every one must parse, whichever request it names; the
    // class's first, then the claim's, later entries overriding earlier ones per request.
    let configs = alloc
        .devices
        .as_ref()
        .and_then(|d| d.config.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut parsed: Vec<(&DeviceAllocationConfiguration, VfioConfig)> = Vec::new();
    for source in ["FromClass", "FromClaim"] {
        for c in configs.iter().filter(|c| c.source == source) {
            let Some(o) = c.opaque.as_ref().filter(|o| o.driver == me.driver) else {
                continue;
            };
            parsed.push((c, parse_config(&label, &me.driver, &o.parameters.0)?));
        }
    }
    if let Some(c) = configs
        .iter()
        .find(|c| c.source != "FromClass" && c.source != "FromClaim")
        .filter(|c| c.opaque.as_ref().is_some_and(|o| o.driver == me.driver))
    {
        return Err(ClaimError::Config {
            claim: label,
            driver: me.driver.clone(),
            problem: format!("unknown config source {:?}", c.source),
        });
    }
    let fallback = BackendPolicy::from_policy(default);
    let mut per_request: BTreeMap<&str, BackendPolicy> = BTreeMap::new();
    for d in &devices {
        let p = parsed
            .iter()
            .rev()
            .find(|(c, v)| covers(c, &d.request) && v.backend_policy.is_some())
            .and_then(|(_, v)| v.backend_policy)
            .unwrap_or(fallback);
        per_request.insert(&d.request, p);
    }
    let mut distinct: Vec<BackendPolicy> = per_request.values().copied().collect();
    distinct.sort_by_key(|p| p.as_str());
    distinct.dedup();
    if distinct.len() > 1 {
        let policies = per_request
            .iter()
            .map(|(r, p)| format!("{r}: {}", p.as_str()))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(ClaimError::MixedPolicies {
            claim: label,
            policies,
        });
    }
    // kvm: the last config that says it, of any request of ours (the CDI edit is per claim).
    let kvm = parsed
        .iter()
        .rev()
        .filter(|(c, _)| devices.iter().any(|d| covers(c, &d.request)))
        .find_map(|(_, v)| v.kvm)
        .unwrap_or(false);
    let pod_claim_name = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_CLAIM_ANNOTATION))
        .cloned();
    Ok(Checked {
        claim: asked.clone(),
        pod_claim_name,
        devices,
        policy: distinct[0],
        kvm,
    })
}

/// A file a prepared claim writes, at its host path (before the root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileWrite {
    pub path: String,
    pub contents: String,
}

/// One device as NodePrepareResources returns it (the kit's).
pub use crate::containers::kubelet::plugin::PreparedDevice;

/// What a prepared claim is: the reply and the files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepared {
    pub backend: Backend,
    pub devices: Vec<PreparedDevice>,
    pub files: Vec<FileWrite>,
}

/// CDI kind of the per-claim VFIO spec.
pub(crate) fn claim_kind(driver: &str) -> String {
    format!("{driver}/claim")
}

/// CDI kind of the metadata specs (as Kubernetes' DRA framework names them).
pub(crate) fn metadata_kind(driver: &str) -> String {
    format!("{driver}/metadata")
}

/// `/var/run/cdi/<driver>_claim_<uid>.json` (never `gpupass*.json`, which `cdi generate`
/// owns and refreshes).
pub(crate) fn claim_spec_path(driver: &str, uid: &str) -> String {
    format!("/var/run/cdi/{driver}_claim_{uid}.json")
}

/// `/var/run/cdi/<driver>_metadata_<uid>_<request>.json`.
pub(crate) fn metadata_spec_path(driver: &str, uid: &str, request: &str) -> String {
    format!("/var/run/cdi/{driver}_metadata_{uid}_{request}.json")
}

/// The host's metadata file of one request:
/// `/var/lib/kubelet/plugins/<driver>/dra-device-metadata/<ns>_<claim>/<request>/metadata.json`.
pub(crate) fn metadata_host_path(driver: &str, c: &ClaimRef, request: &str) -> String {
    format!(
        "{}/dra-device-metadata/{}_{}/{request}/metadata.json",
        crate::containers::kubelet::plugin::plugin_dir_logical(driver),
        c.namespace,
        c.name
    )
}

/// Where the container sees it: `.../resourceclaims/<claim>/<request>/<driver>-metadata.json`,
/// or `.../resourceclaimtemplates/<podClaimName>/...` for a claim from a template.
pub(crate) fn metadata_container_path(driver: &str, checked: &Checked, request: &str) -> String {
    match checked.pod_claim_name.as_deref().filter(|n| !n.is_empty()) {
        Some(p) => {
            format!("{METADATA_CONTAINER_DIR}/resourceclaimtemplates/{p}/{request}/{driver}-metadata.json")
        }
        None => format!(
            "{METADATA_CONTAINER_DIR}/resourceclaims/{}/{request}/{driver}-metadata.json",
            checked.claim.name
        ),
    }
}

/// Before anything is written: a `require-iommufd` claim on a node whose kernel cannot serve
/// iommufd at all (no `/dev/iommu`, no VFIO device cdev: 6.1, or a kernel built without them)
/// is refused now, with the kernel's reason. What depends on the bind itself (a function's
/// cdev, its group's viability) is judged after it, by [`choose_backend`].
pub(crate) fn precheck_backend(inv: &Inventory, checked: &Checked) -> Result<(), ClaimError> {
    if checked.policy != BackendPolicy::RequireIommufd {
        return Ok(());
    }
    match (backend::iommufd_ready(inv), checked.devices.first()) {
        (Err(why), Some(d)) => Err(ClaimError::IommufdRequired {
            claim: claim_label(&checked.claim),
            address: d.label(),
            reason: why.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Before anything is written: a claim that asks for `/dev/kvm` on a node without it is
/// refused now (the CDI edit would name a node that is not there, and the container would not
/// start).
pub(crate) fn precheck_kvm(host: &crate::host::HostRoot, checked: &Checked) -> Result<(), ClaimError> {
    if !checked.kvm {
        return Ok(());
    }
    let path = host.dev_kvm();
    match std::fs::metadata(&path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type()) => Ok(()),
        Ok(_) => Err(ClaimError::NoKvm {
            claim: claim_label(&checked.claim),
            reason: format!("{} is not a character device", host.display(&path)),
        }),
        Err(e) => Err(ClaimError::NoKvm {
            claim: claim_label(&checked.claim),
            reason: format!("{}: {e}", host.display(&path)),
        }),
    }
}

/// The node KVM is used through.
pub(crate) const KVM_NODE: &str = "/dev/kvm";

/// What one VFIO unit of a claim (a bound function, or a created mediated device) can use.
struct Unit {
    label: String,
    legacy: bool,
    /// `Err(why)` when it cannot use iommufd.
    iommufd: Result<(), String>,
}

/// The VFIO units of a checked claim in the host as the bind and the mdev creation left it:
/// every member function of each group device, the instance of each mdev slot.
fn units(inv: &Inventory, checked: &Checked) -> Result<Vec<Unit>, ClaimError> {
    let label = claim_label(&checked.claim);
    let servable = |address: String, reason: String| ClaimError::NotServable {
        claim: label.clone(),
        address,
        reason,
    };
    let mut out = Vec::new();
    for dev in &checked.devices {
        if let Some(m) = &dev.mdev {
            let Some(i) = inv.mdev(&m.uuid) else {
                return Err(servable(dev.label(), "the mediated device is gone".into()));
            };
            let Some(g) = i.iommu_group else {
                return Err(servable(
                    dev.label(),
                    "it has no IOMMU group (its vendor driver did not register it with VFIO)".into(),
                ));
            };
            let node = inv.groups.iter().any(|x| x.number == g && x.vfio_node_present);
            let iommufd = match (backend::iommufd_ready(inv), &i.vfio_cdev) {
                (Err(r), _) => Err(r.to_string()),
                (Ok(()), None) => Err(format!("mdev {} has no vfio-dev/vfioN in sysfs", m.uuid)),
                (Ok(()), Some(_)) => Ok(()),
            };
            out.push(Unit {
                label: dev.label(),
                legacy: inv.vfio_container_present && node,
                iommufd,
            });
            continue;
        }
        for a in &dev.members {
            let Some(d) = inv.device(a) else {
                return Err(servable(a.to_string(), "the function is gone".into()));
            };
            if let Err(e) = inv.vfio_group(d) {
                return Err(servable(a.to_string(), e.to_string()));
            }
            out.push(Unit {
                label: a.to_string(),
                legacy: d.backends.contains(&Backend::Legacy),
                iommufd: if d.backends.contains(&Backend::Iommufd) {
                    Ok(())
                } else {
                    Err(backend::why_not_iommufd(inv, d))
                },
            });
        }
    }
    Ok(out)
}

/// The backend of the whole claim, from the inventory read after the bind (and the creation
/// of its mediated devices).
pub fn choose_backend(inv: &Inventory, checked: &Checked) -> Result<Backend, ClaimError> {
    let label = claim_label(&checked.claim);
    let units = units(inv, checked)?;
    let without_iommufd = units.iter().find(|u| u.iommufd.is_err());
    match checked.policy {
        BackendPolicy::RequireIommufd => match without_iommufd {
            None => Ok(Backend::Iommufd),
            Some(u) => Err(ClaimError::IommufdRequired {
                claim: label,
                address: u.label.clone(),
                reason: u.iommufd.clone().err().unwrap_or_default(),
            }),
        },
        BackendPolicy::PreferIommufd if without_iommufd.is_none() => Ok(Backend::Iommufd),
        BackendPolicy::PreferIommufd | BackendPolicy::Legacy => match units.iter().find(|u| !u.legacy) {
            None => Ok(Backend::Legacy),
            Some(u) => Err(ClaimError::NotServable {
                claim: label,
                address: u.label.clone(),
                reason: "its group's /dev/vfio node or /dev/vfio/vfio is missing (legacy backend)".into(),
            }),
        },
    }
}

/// One metadata document (`DeviceMetadata`) of `version` for one request.
fn metadata_doc(
    version: &str,
    driver: &str,
    checked: &Checked,
    request: &str,
    devs: &[(&ClaimDevice, BTreeMap<String, serde_json::Value>)],
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "kind": "DeviceMetadata",
        "apiVersion": version,
        "metadata": {
            "name": checked.claim.name,
            "namespace": checked.claim.namespace,
            "uid": checked.claim.uid,
            "generation": 1,
        },
        "requests": [{
            "name": request,
            "devices": devs.iter().map(|(d, attrs)| serde_json::json!({
                "driver": driver,
                "pool": d.pool,
                "name": d.device,
                "attributes": attrs,
            })).collect::<Vec<_>>(),
        }],
    });
    if let Some(p) = &checked.pod_claim_name {
        v["podClaimName"] = serde_json::Value::String(p.clone());
    }
    v
}

/// The per-claim result: pure over the inventory read after the bind, the checked claim and
/// the backend [`choose_backend`] picked.
pub fn result(inv: &Inventory, driver: &str, checked: &Checked, backend: Backend) -> Prepared {
    let uid = &checked.claim.uid;
    let claim_kind = claim_kind(driver);
    let mut cdi_devices = Vec::new();
    let mut devices = Vec::new();
    for d in &checked.devices {
        let (nodes, env_value) = match &d.mdev {
            Some(m) => {
                let i = inv.mdev(&m.uuid);
                let group = i.and_then(|i| i.iommu_group).unwrap_or_default();
                let cdev = i.and_then(|i| i.vfio_cdev.as_deref());
                (backend::node_paths(backend, group, cdev), m.uuid.clone())
            }
            None => {
                let vfio: Vec<&crate::model::PciDevice> = d
                    .members
                    .iter()
                    .filter_map(|a| inv.device(a))
                    .filter(|f| f.driver.as_deref().is_some_and(is_vfio_driver))
                    .collect();
                let members: Vec<String> = d.members.iter().map(|a| a.to_string()).collect();
                (backend::nodes(backend, d.group, &vfio), members.join(","))
            }
        };
        let name = format!("{uid}-{}", d.device);
        cdi_devices.push(cdi::Device {
            name: name.clone(),
            container_edits: cdi::ContainerEdits {
                env: vec![format!(
                    "GPUPASS_DRA_{}={env_value}",
                    d.device.to_ascii_uppercase().replace('-', "_"),
                )],
                device_nodes: nodes
                    .into_iter()
                    .map(|path| cdi::DeviceNode {
                        path,
                        host_path: None,
                    })
                    .collect(),
                mounts: Vec::new(),
            },
        });
        devices.push(PreparedDevice {
            request: d.request.clone(),
            pool: d.pool.clone(),
            device: d.device.clone(),
            cdi_device_ids: vec![format!("{claim_kind}={name}")],
        });
    }
    // `/dev/kvm` once for the claim (spec-level edits are applied once per spec).
    let mut spec_edits = cdi::ContainerEdits::default();
    if checked.kvm {
        spec_edits.device_nodes.push(cdi::DeviceNode {
            path: KVM_NODE.to_string(),
            host_path: None,
        });
    }
    let mut spec = cdi::Spec {
        cdi_version: String::new(),
        kind: claim_kind,
        devices: cdi_devices,
        container_edits: spec_edits,
    };
    spec.cdi_version = cdi::min_version(&spec).0.to_string();
    let mut files = vec![FileWrite {
        path: claim_spec_path(driver, uid),
        contents: cdi::to_json(&spec),
    }];

    // KEP-5304: one metadata file per request, and a CDI device that mounts it, injected with
    // the request's first device.
    let mut requests: Vec<&str> = checked.devices.iter().map(|d| d.request.as_str()).collect();
    requests.dedup();
    let mut seen = std::collections::BTreeSet::new();
    requests.retain(|r| seen.insert(*r));
    for request in requests {
        let base = request.split_once('/').map_or(request, |(b, _)| b);
        let devs: Vec<(&ClaimDevice, BTreeMap<String, serde_json::Value>)> = checked
            .devices
            .iter()
            .filter(|d| d.request == request)
            .map(|d| (d, metadata_attributes(inv, d, backend)))
            .collect();
        let mut stream = String::new();
        for v in METADATA_VERSIONS {
            stream.push_str(
                &serde_json::to_string(&metadata_doc(v, driver, checked, request, &devs)).expect("json"),
            );
            stream.push('\n');
        }
        let host_path = metadata_host_path(driver, &checked.claim, base);
        let mdev_name = format!("{uid}_{base}");
        let mut mspec = cdi::Spec {
            cdi_version: String::new(),
            kind: metadata_kind(driver),
            devices: vec![cdi::Device {
                name: mdev_name.clone(),
                container_edits: cdi::ContainerEdits {
                    env: Vec::new(),
                    device_nodes: Vec::new(),
                    mounts: vec![cdi::Mount {
                        host_path: host_path.clone(),
                        container_path: metadata_container_path(driver, checked, base),
                        options: vec!["ro".into(), "bind".into()],
                        mount_type: None,
                    }],
                },
            }],
            container_edits: cdi::ContainerEdits::default(),
        };
        mspec.cdi_version = cdi::min_version(&mspec).0.to_string();
        files.push(FileWrite {
            path: host_path,
            contents: stream,
        });
        files.push(FileWrite {
            path: metadata_spec_path(driver, uid, base),
            contents: cdi::to_json(&mspec),
        });
        if let Some(first) = devices.iter_mut().find(|d| d.request == request) {
            first
                .cdi_device_ids
                .push(format!("{}={mdev_name}", metadata_kind(driver)));
        }
    }
    Prepared {
        backend,
        devices,
        files,
    }
}

/// The documents of a KEP-5304 metadata stream (`DeviceMetadata` objects, one per line);
/// `None` when `text` is not one.
fn metadata_stream(text: &str) -> Option<Vec<serde_json::Value>> {
    let docs: Vec<serde_json::Value> = serde_json::Deserializer::from_str(text)
        .into_iter::<serde_json::Value>()
        .collect::<Result<_, _>>()
        .ok()?;
    (!docs.is_empty() && docs.iter().all(|d| d["kind"] == "DeviceMetadata")).then_some(docs)
}

/// `docs` with `metadata.generation` set to `g`, written as [`result`] writes them.
fn with_generation(mut docs: Vec<serde_json::Value>, g: i64) -> String {
    let mut out = String::new();
    for d in &mut docs {
        d["metadata"]["generation"] = serde_json::json!(g);
        out.push_str(&serde_json::to_string(d).expect("json"));
        out.push('\n');
    }
    out
}

/// KEP-5304: a metadata file's `metadata.generation` increases on every rewrite, so a reader
/// that polls the file can tell a new version (Kubernetes' own writer does the same:
/// k8s.io/dynamic-resource-allocation v0.37.2 `kubeletplugin/metadata.go`). `new` is the
/// content [`result`] made (generation 1), `old` what the file holds now: a file that already
/// says the same at its generation is kept as it is (no write); a different one is rewritten at
/// its generation + 1; an absent file, or one that is not a metadata stream, gets `new`. Any
/// other file (a CDI spec) is `new` unchanged.
pub(crate) fn next_metadata(old: Option<&str>, new: &str) -> String {
    let (Some(old_docs), Some(new_docs)) = (old.and_then(metadata_stream), metadata_stream(new)) else {
        return new.to_string();
    };
    let Some(g) = old_docs[0]["metadata"]["generation"].as_i64().filter(|g| *g >= 1) else {
        return new.to_string();
    };
    let same = with_generation(new_docs.clone(), g);
    if Some(same.as_str()) == old {
        return same;
    }
    with_generation(new_docs, g.saturating_add(1))
}

/// The attributes a metadata file carries for one device. A group: the standard `pciBusID`
/// and `pcieRoot` (KubeVirt hands the `pciBusID` function to the VM), the group, its members
/// and the backend the claim got. A mediated device: `mdevUUID` (what KubeVirt hands to the
/// VM), its type, parent and group, the backend, and the parent's `pcieRoot` when the parent
/// is a PCI function.
fn metadata_attributes(
    inv: &Inventory,
    d: &ClaimDevice,
    backend: Backend,
) -> BTreeMap<String, serde_json::Value> {
    let std = super::STANDARD_DOMAIN;
    let mut a = BTreeMap::from([(
        format!("{DOMAIN}/backend"),
        serde_json::json!({"string": backend.as_str()}),
    )]);
    if let Some(m) = &d.mdev {
        a.insert("mdevUUID".into(), serde_json::json!({"string": m.uuid}));
        a.insert(
            format!("{DOMAIN}/mdevType"),
            serde_json::json!({"string": m.mdev_type}),
        );
        a.insert(
            format!("{DOMAIN}/mdevParent"),
            serde_json::json!({"string": m.parent}),
        );
        if let Some(g) = inv.mdev(&m.uuid).and_then(|i| i.iommu_group) {
            a.insert(format!("{DOMAIN}/iommuGroup"), serde_json::json!({"int": g}));
        }
        if let Ok(p) = m.parent.parse::<PciAddress>() {
            a.insert(
                format!("{std}/pcieRoot"),
                serde_json::json!({"string": super::attrs::pcie_root(inv, &p)}),
            );
        }
        return a;
    }
    if let Some(lead) = d.lead {
        a.insert(
            format!("{std}/pciBusID"),
            serde_json::json!({"string": lead.to_string()}),
        );
        a.insert(
            format!("{std}/pcieRoot"),
            serde_json::json!({"string": super::attrs::pcie_root(inv, &lead)}),
        );
    }
    a.insert(
        format!("{DOMAIN}/iommuGroup"),
        serde_json::json!({"int": d.group}),
    );
    a.insert(
        format!("{DOMAIN}/members"),
        serde_json::json!({"string": d.members.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",")}),
    );
    a
}

#[cfg(test)]
mod tests;
