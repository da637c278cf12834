//! KubeVirt `permittedHostDevices`: which host devices VMs may request, under which
//! Kubernetes resource names.
//!
//! KubeVirt facts encoded here (kubevirt.io/api core/v1 types, KubeVirt host-devices docs):
//! - `spec.configuration.permittedHostDevices.pciHostDevices[]` selects PCI functions by
//!   `pciVendorSelector: "VVVV:DDDD"` (upper-case hex) node-wide and names them
//!   `resourceName`; `externalResourceProvider: true` means another device plugin (NVIDIA's
//!   kubevirt-gpu-device-plugin, gpupass's own) announces the resource instead of KubeVirt's.
//! - `mediatedDevices[]` selects vGPUs by `mdevNameSelector` = the mdev type's `name`.
//! - A VM asks for them by `deviceName` (= resourceName) under
//!   `spec.domain.devices.gpus` (display devices, vGPUs) or `.hostDevices` (anything else).
//! - Resource names come from [`crate::output::naming`], shared with gpupass's device plugin.
//! - iommufd (KubeVirt 1.9, alpha; kubevirt/enhancements VEP 266, docs/iommufd.md): with the
//!   feature gate `IOMMUFD` in `spec.configuration.developerConfiguration.featureGates`,
//!   virt-launcher opens a host device through iommufd when its cdev
//!   `/dev/vfio/devices/vfioN` and `/dev/iommu` are in the pod, else through the group.
//!   KubeVirt's own PCI device plugin hands out the group node, so iommufd needs an external
//!   provider that hands out the cdev (gpupass `device-plugin --backend iommufd`).

use crate::inventory::backend::{self, BackendError, Policy};
use crate::model::{Backend, Inventory};
use crate::output::naming;
use crate::output::selection::Selection;
use serde_json::{json, Value};

/// What `gpupass kubevirt` asks for, beside the devices (the [`Selection`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KubevirtRequest {
    /// `--backend`.
    pub backend: Policy,
    /// `--external-provider`: another device plugin announces the resources.
    pub external_provider: bool,
}

/// What the renderers take: the permitted devices, who provides them, the backend, the notes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KubevirtPlan {
    pub permitted: Permitted,
    pub external: bool,
    /// The PCI functions use iommufd (the `IOMMUFD` gate is set).
    pub iommufd: bool,
    pub notes: Vec<KubevirtNote>,
}

/// What the plan decided, said on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KubevirtNote {
    /// iommufd for the PCI functions, while the mdevs stay on the group and container.
    MdevsStayLegacy,
}

impl std::fmt::Display for KubevirtNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KubevirtNote::MdevsStayLegacy => f.write_str(
                "mdevs stay on the legacy group and container; only the PCI functions use iommufd",
            ),
        }
    }
}

/// Why a KubeVirt configuration cannot work.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KubevirtRefusal {
    /// iommufd without an external provider (a usage error: exit status 2).
    #[error("--backend iommufd needs --external-provider: KubeVirt's own PCI device plugin hands out the group node (legacy); iommufd needs a device plugin that hands out /dev/vfio/devices/vfioN and /dev/iommu (gpupass device-plugin --backend iommufd)")]
    IommufdNeedsExternal,
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// The request alone, devices aside: iommufd needs an external provider, and the policy must
/// be possible on this kernel at all (the command checks it before it reads its arguments'
/// devices; [`plan`] checks it again).
pub(crate) fn check(inv: &Inventory, req: KubevirtRequest) -> Result<(), KubevirtRefusal> {
    if req.backend == Policy::Iommufd && !req.external_provider {
        return Err(KubevirtRefusal::IommufdNeedsExternal);
    }
    backend::resolve_vm(req.backend, inv, &[], None)?;
    Ok(())
}

/// The plan of `gpupass kubevirt`, pure over the inventory and the selection: the permitted
/// entries, and the backend. Without an external provider KubeVirt's own plugin hands out the
/// group, so `auto` is legacy there; `iommufd` then is refused.
pub(crate) fn plan(
    inv: &Inventory,
    sel: &Selection,
    req: KubevirtRequest,
) -> Result<KubevirtPlan, KubevirtRefusal> {
    check(inv, req)?;
    let addrs: Vec<_> = sel.functions().map(|f| f.device.address).collect();
    let policy = if req.external_provider {
        req.backend
    } else {
        Policy::Legacy
    };
    let iommufd = !addrs.is_empty() && backend::resolve_vm(policy, inv, &addrs, None)? == Backend::Iommufd;
    let mut notes = Vec::new();
    if iommufd && sel.mdevs().next().is_some() {
        notes.push(KubevirtNote::MdevsStayLegacy);
    }
    Ok(KubevirtPlan {
        permitted: permitted(sel),
        external: req.external_provider,
        iommufd,
        notes,
    })
}

/// One `pciHostDevices` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PciEntry {
    /// `10DE:2684`
    pub selector: String,
    pub resource_name: String,
    /// A display or 3D controller (goes under `gpus` in a VM), else `hostDevices`.
    pub gpu: bool,
    /// The selected host functions it covers (informational).
    pub addresses: Vec<String>,
}

/// One `mediatedDevices` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MdevEntry {
    /// The mdev type's `name`, e.g. `GRID T4-1B`.
    pub selector: String,
    pub resource_name: String,
    pub uuids: Vec<String>,
}

/// The permitted devices for a selection, one entry per distinct vendor:device or mdev type.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Permitted {
    pub pci: Vec<PciEntry>,
    pub mdev: Vec<MdevEntry>,
}

pub(crate) fn permitted(sel: &Selection) -> Permitted {
    let mut p = Permitted::default();
    for f in sel.functions() {
        let d = &f.device;
        let selector = format!("{}:{}", d.vendor_id.to_uppercase(), d.device_id.to_uppercase());
        match p.pci.iter_mut().find(|e| e.selector == selector) {
            Some(e) => e.addresses.push(d.address.to_string()),
            None => p.pci.push(PciEntry {
                selector,
                resource_name: naming::pci_resource_name(d),
                gpu: d.base_class() == 0x03,
                addresses: vec![d.address.to_string()],
            }),
        }
    }
    for m in sel.mdevs() {
        let name = m.type_name().unwrap_or("unknown").to_string();
        let vendor = m.parent.as_ref().map(|p| p.vendor_id.as_str()).unwrap_or("0000");
        match p.mdev.iter_mut().find(|e| e.selector == name) {
            Some(e) => e.uuids.push(m.instance.uuid.clone()),
            None => p.mdev.push(MdevEntry {
                resource_name: naming::mdev_resource_name(vendor, &name),
                selector: name,
                uuids: vec![m.instance.uuid.clone()],
            }),
        }
    }
    p
}

/// The `permittedHostDevices` object.
fn permitted_value(p: &Permitted, external: bool) -> Value {
    let mut obj = serde_json::Map::new();
    if !p.pci.is_empty() {
        let list: Vec<Value> = p
            .pci
            .iter()
            .map(|e| {
                let mut v = json!({ "pciVendorSelector": e.selector, "resourceName": e.resource_name });
                if external {
                    v["externalResourceProvider"] = json!(true);
                }
                v
            })
            .collect();
        obj.insert("pciHostDevices".into(), Value::Array(list));
    }
    if !p.mdev.is_empty() {
        let list: Vec<Value> = p
            .mdev
            .iter()
            .map(|e| {
                let mut v = json!({ "mdevNameSelector": e.selector, "resourceName": e.resource_name });
                if external {
                    v["externalResourceProvider"] = json!(true);
                }
                v
            })
            .collect();
        obj.insert("mediatedDevices".into(), Value::Array(list));
    }
    Value::Object(obj)
}

/// The feature gate KubeVirt 1.9 needs for iommufd host devices.
pub(crate) const IOMMUFD_GATE: &str = "IOMMUFD";

/// JSON form: a merge patch for the KubeVirt CR; with iommufd, the `IOMMUFD` gate too.
pub(crate) fn json_patch(plan: &KubevirtPlan) -> Value {
    let (p, external, iommufd) = (&plan.permitted, plan.external, plan.iommufd);
    let mut v =
        json!({ "spec": { "configuration": { "permittedHostDevices": permitted_value(p, external) } } });
    if iommufd {
        v["spec"]["configuration"]["developerConfiguration"] = json!({ "featureGates": [IOMMUFD_GATE] });
    }
    v
}

fn q(s: &str) -> String {
    // A JSON string is a valid YAML double-quoted scalar: every escape is handled.
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// YAML form: the same merge patch, with comments on how to apply it and use it in a VM.
pub(crate) fn yaml(plan: &KubevirtPlan) -> String {
    let (p, external, iommufd) = (&plan.permitted, plan.external, plan.iommufd);
    let mut y = String::new();
    y.push_str("# KubeVirt permittedHostDevices (gpupass kubevirt)\n");
    y.push_str("# apply: kubectl patch kubevirt kubevirt -n kubevirt --type merge --patch-file THIS_FILE\n");
    y.push_str("# (a merge patch replaces these lists: add the devices you already permit)\n");
    if iommufd {
        y.push_str(
            "# VFIO backend: iommufd (KubeVirt 1.9+, alpha gate IOMMUFD): the PCI resources must come\n",
        );
        y.push_str(
            "# from `gpupass device-plugin --backend iommufd` (each allocation: /dev/vfio/devices/vfioN\n",
        );
        y.push_str("# + /dev/iommu, never the group)\n");
        if !p.mdev.is_empty() {
            y.push_str("# mdevs stay on the group and container\n");
        }
    } else if external && !p.pci.is_empty() {
        y.push_str(
            "# VFIO backend: legacy: run `gpupass device-plugin --backend legacy` (group + container)\n",
        );
    }
    y.push_str("spec:\n  configuration:\n");
    if iommufd {
        y.push_str("    # a merge patch replaces this list: keep the gates you already enable\n");
        y.push_str(&format!(
            "    developerConfiguration:\n      featureGates:\n        - {}\n",
            q(IOMMUFD_GATE)
        ));
    }
    y.push_str("    permittedHostDevices:\n");
    if !p.pci.is_empty() {
        y.push_str("      pciHostDevices:\n");
        for e in &p.pci {
            y.push_str(&format!("        # {}\n", e.addresses.join(", ")));
            y.push_str(&format!("        - pciVendorSelector: {}\n", q(&e.selector)));
            y.push_str(&format!("          resourceName: {}\n", q(&e.resource_name)));
            if external {
                y.push_str("          externalResourceProvider: true\n");
            }
        }
    }
    if !p.mdev.is_empty() {
        y.push_str("      mediatedDevices:\n");
        for e in &p.mdev {
            y.push_str(&format!("        # {}\n", e.uuids.join(", ")));
            y.push_str(&format!("        - mdevNameSelector: {}\n", q(&e.selector)));
            y.push_str(&format!("          resourceName: {}\n", q(&e.resource_name)));
            if external {
                y.push_str("          externalResourceProvider: true\n");
            }
        }
    }
    // How a VM asks for them.
    let gpus: Vec<&str> = p
        .pci
        .iter()
        .filter(|e| e.gpu)
        .map(|e| e.resource_name.as_str())
        .chain(p.mdev.iter().map(|e| e.resource_name.as_str()))
        .collect();
    let others: Vec<&str> = p
        .pci
        .iter()
        .filter(|e| !e.gpu)
        .map(|e| e.resource_name.as_str())
        .collect();
    y.push_str("# in a VirtualMachine, spec.template.spec.domain.devices:\n");
    if !gpus.is_empty() {
        y.push_str("#   gpus:\n");
        for (i, r) in gpus.iter().enumerate() {
            y.push_str(&format!("#     - name: gpu{i}\n#       deviceName: {r}\n"));
        }
    }
    if !others.is_empty() {
        y.push_str("#   hostDevices:\n");
        for (i, r) in others.iter().enumerate() {
            y.push_str(&format!("#     - name: hostdev{i}\n#       deviceName: {r}\n"));
        }
    }
    y
}
