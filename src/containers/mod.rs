//! Containers: the OCI hook, the Kubernetes device plugin and the native NVIDIA driver's files
//! (the CDI spec renderer is an output: [`crate::output::cdi`]). Each is pure over the
//! inventory where it can be; the hook and the plugin are the long-running edges that act on
//! the host through [`crate::host::ops::HostOps`] or the kernel's own interfaces.

#[cfg(feature = "deviceplugin")]
pub mod deviceplugin;
pub mod native;
pub mod oci_hook;
