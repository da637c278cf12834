//! Kubernetes Dynamic Resource Allocation (`resource.k8s.io/v1`) for VFIO passthrough:
//! `gpupass dra-plugin` and `gpupass dra slices` (docs/dra.md).
//!
//! - [`slices`]: which IOMMU groups this node offers (one DRA device per group) and the
//!   ResourceSlices that publish them; pure over the [`Inventory`](crate::model::Inventory).
//! - [`slots`]: the mdev types this node offers, one DRA device per instance a type can still
//!   create, with a KEP-4815 counter set per parent; pure.
//! - [`claim`]: the trust checks on a ResourceClaim and the per-claim result (devices, CDI
//!   device IDs, the per-claim CDI spec, the KEP-5304 metadata files); pure.
//! - [`checkpoint`]: prepared claims by UID, with the boot id, in one root-only file.
//! - [`apply`]: the one adapter through which Prepare and Unprepare change the host (the
//!   journaled group bind of [`crate::bind`], the file writes).
//! - [`prepare`]: Prepare / Unprepare / health, composed from the above (what the gRPC
//!   handlers call).
//! - [`source`]: where a claim is read from ([`source::ClaimSource`]).
//! - [`authority`]: the registration socket's HTTP/2 `:authority` repair (the kubelet's plugin
//!   watcher sends the socket's path, which tonic's h2 refuses).
//! - [`api`]: the API server through kube-rs: claims, and this node's ResourceSlices published.
//! - [`probe`]: `gpupass dra probe`, whether a running plugin's sockets and worker answer (the
//!   Helm chart's liveness probe).
//! - [`server`]: the kubelet plugin registration, `DRAPlugin` v1 and v1beta1 and DRA health
//!   v1 over unix sockets (tonic).

pub mod api;
pub mod apply;
pub mod authority;
pub mod checkpoint;
pub mod claim;
pub mod prepare;
pub mod probe;
pub mod server;
pub mod slices;
pub mod slots;
pub mod source;

use crate::host::HostRoot;
use std::path::PathBuf;

/// Code generated from the kubelet's protos (proto/KUBELET-DRA.md) by build.rs.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    /// `pluginregistration` (the kubelet's plugin watcher; `Registration` service).
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
    /// `k8s.io.kubelet.pkg.apis.dra.v1` (`DRAPlugin` service).
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1` (`DRAPlugin` service, kubelets before 1.34).
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
    /// `v1` of dra-health (`DRAResourceHealth` service).
    pub mod health {
        tonic::include_proto!("v1");
    }
}

/// The DRA driver name this plugin registers and publishes under by default.
pub const DEFAULT_DRIVER: &str = "vfio.gpupass.dev";
/// The domain of gpupass's own device attributes (`gpupass.dev/iommuGroup`...).
pub const DOMAIN: &str = "gpupass.dev";
/// The domain of Kubernetes' standard device attributes.
pub const STANDARD_DOMAIN: &str = "resource.kubernetes.io";
/// The most devices one ResourceSlice may hold: `ResourceSliceMaxDevices` in k8s.io/api
/// v0.37.2 `resource/v1/types.go`; 64 when devices consume counters, as mdev slots do:
/// [`slots::MAX_COUNTING_DEVICES_PER_SLICE`]).
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// The registration type the kubelet's plugin watcher routes to its DRA manager.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The service versions this plugin serves (`PluginInfo.supported_versions`).
/// The health service is listed too: the kubelet opens the health stream only for a plugin
/// that names it (k8s.io/kubernetes v1.37.2 `pkg/kubelet/cm/dra/plugin`, `pickHealthService`).
pub const SUPPORTED_VERSIONS: [&str; 3] = ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth"];

/// `var/lib/kubelet/plugins_registry`: where the kubelet watches for registration sockets.
pub fn registry_dir(host: &HostRoot) -> PathBuf {
    host.path("var/lib/kubelet/plugins_registry")
}

/// `/var/lib/kubelet/plugins/<driver>` as the host names it: the plugin's data directory
/// (service socket, checkpoint, metadata files). Logical (before the root).
pub fn plugin_dir_logical(driver: &str) -> String {
    format!("/var/lib/kubelet/plugins/{driver}")
}

/// `proc/sys/kernel/random/boot_id`: tells a node reboot apart from a plugin restart.
pub fn boot_id(host: &HostRoot) -> std::io::Result<String> {
    crate::host::read_bounded(&host.path("proc/sys/kernel/random/boot_id"), 128).map(|s| s.trim().to_string())
}

/// `proc/sys/kernel/hostname`: the default node name.
pub fn hostname(host: &HostRoot) -> Option<String> {
    crate::host::read_bounded(&host.path("proc/sys/kernel/hostname"), 256)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}
