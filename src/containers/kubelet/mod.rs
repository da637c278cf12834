//! The kubelet-plugin kit: what gpupass's two kubelet plugins need from the kubelet's side of
//! the socket, apart from what each does with a call, as Kubernetes' own helper
//! (`k8s.io/dynamic-resource-allocation/kubeletplugin`) separates it from a DRA driver.
//!
//! Feature `deviceplugin` (the device plugin, a sibling module, uses these
//! without `dra`):
//! - [`socket`]: unix sockets and their permissions (a stale socket replaced, 0600), their
//!   directories, a gRPC channel to a socket, a file's identity.
//! - [`wake_on_uevents`]: kernel uevents as a wake-up for a plugin's poll loop.
//!
//! Feature `dra` (the DRA driver, a sibling module, implements [`plugin::DraDriver`]):
//! - [`proto`]: the kubelet's plugin registration, DRA v1/v1beta1 and DRA health v1 protos.
//! - [`authority`]: the registration socket's HTTP/2 `:authority` repair.
//! - [`claims`]: the kubelet's claim reference, where ResourceClaims are read, the fetch with
//!   its UID check.
//! - [`pool`]: a driver's devices as ResourceSlices within the API's limits.
//! - [`api`]: the API server through kube-rs: claims read, this node's ResourceSlices published.
//! - [`binding`]: binding conditions (KEP-5007): the watch of the claims allocated to this node,
//!   the driver's work before the Pod is bound, the outcome on the claim's device status.
//! - [`plugin`]: the driver trait and the server: registration, `DRAPlugin` v1 and v1beta1 (one
//!   conversion), `DRAResourceHealth` v1, calls serialized on one worker, claims fetched before
//!   the driver sees them, the pool published and health streamed after each change.

#[cfg(feature = "dra")]
pub mod api;
#[cfg(feature = "dra")]
pub mod authority;
#[cfg(feature = "dra")]
pub mod binding;
#[cfg(feature = "dra")]
pub mod claims;
#[cfg(feature = "dra")]
pub mod plugin;
#[cfg(feature = "dra")]
pub mod pool;
pub mod socket;

use tracing::warn;

/// Code generated from the kubelet's DRA protos (proto/KUBELET-DRA.md) by build.rs.
#[cfg(feature = "dra")]
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

/// A thread that calls `wake` on every relevant kernel uevent (a PCI function bound, unbound,
/// added or removed; a VFIO node; an mdev) until `wake` returns false, so a plugin's poll loop
/// re-reads the host at once; the poll stays as the fallback. Where uevents cannot be had (a
/// network namespace without them) one warning says the plugin polls only. For the live host:
/// a `--root` tree gets no events.
pub(crate) fn wake_on_uevents(mut wake: impl FnMut() -> bool + Send + 'static) {
    match crate::host::uevents::UeventSocket::open() {
        Ok(sock) => {
            std::thread::spawn(move || {
                while let Ok(ev) = sock.next(None) {
                    if ev.is_some() && !wake() {
                        break;
                    }
                }
            });
        }
        Err(e) => warn!("no kernel uevents ({e}); polling only"),
    }
}
