//! Containers: the CDI specs gpupass writes and refreshes after every change ([`cdi`]), the
//! OCI hook, the Kubernetes device plugin and DRA driver, and the kubelet-plugin kit both
//! plugins stand on ([`kubelet`]) (the CDI spec renderer is an
//! output, [`crate::output::cdi`]; the native NVIDIA driver's files are read with the
//! inventory, [`crate::inventory::native`]). Each is pure over the
//! inventory where it can be; the hook and the plugin are the long-running edges that act on
//! the host through [`crate::host::ops::HostOps`] or the kernel's own interfaces.

pub mod cdi;
#[cfg(feature = "deviceplugin")]
pub mod deviceplugin;
#[cfg(feature = "dra")]
pub mod dra;
#[cfg(feature = "deviceplugin")]
pub mod kubelet;
// Read by `gpupass boot --dra-metadata` only, which needs the VMM (feature `vmm`).
#[cfg_attr(not(feature = "vmm"), allow(dead_code))]
pub mod metadata;
pub mod oci_hook;
