//! Kubernetes Dynamic Resource Allocation (`resource.k8s.io/v1`) for VFIO passthrough:
//! `gpupass dra-plugin` and `gpupass dra slices` (docs/dra.md).
//!
//! - [`attrs`]: the attribute vocabulary of both kinds of device (value limits, the standard
//!   `resource.kubernetes.io` attributes of a PCI function); pure.
//! - [`slices`]: which IOMMU groups this node offers (one DRA device per group), the node's
//!   pool (groups and [`slots`]) and its ResourceSlices; pure over the
//!   [`Inventory`](crate::model::Inventory).
//! - [`slots`]: the mdev types this node offers, one DRA device per instance a type can still
//!   create, with a KEP-4815 counter set per parent; pure.
//! - [`claim`]: the trust checks on a ResourceClaim and the per-claim result (devices, CDI
//!   device IDs, the per-claim CDI spec, the KEP-5304 metadata files); pure.
//! - [`checkpoint`]: prepared claims by UID, with the boot id, in one root-only file.
//! - [`apply`]: the one adapter through which Prepare and Unprepare change the host (the
//!   journaled group bind of [`crate::bind`], the file writes).
//! - [`binding`]: binding conditions (KEP-5007): which devices carry them (a group not on
//!   vfio-pci yet), the journaled group bind before the Pod is bound, its failure reasons, and
//!   the undo for a claim that never reached Prepare.
//! - [`prepare`]: gpupass's DRA driver ([`prepare::Driver`]): Prepare / Unprepare / health and
//!   the resources it offers, composed from the above; the kubelet-plugin kit
//!   ([`crate::containers::kubelet`]: registration, sockets, the DRAPlugin services, claim
//!   fetching, publishing, serialization) serves it as a
//!   [`DraDriver`](crate::containers::kubelet::plugin::DraDriver).
//! - [`signals`]: the kernel's signals of a function's condition (power state, config space,
//!   AER counts, a lost driver) read from sysfs, which make a device unhealthy (and tainted).
//! - [`probe`]: `gpupass dra probe`, whether a running plugin's sockets and worker answer (the
//!   Helm chart's liveness probe).

pub mod apply;
pub mod attrs;
pub mod binding;
pub mod checkpoint;
pub mod claim;
pub mod prepare;
pub mod probe;
pub mod signals;
pub mod slices;
pub mod slots;
#[cfg(test)]
mod tests;

use crate::host::HostRoot;

/// The DRA driver name this plugin registers and publishes under by default.
pub(crate) const DEFAULT_DRIVER: &str = "vfio.gpupass.dev";
/// The domain of gpupass's own device attributes (`gpupass.dev/iommuGroup`...).
pub(crate) const DOMAIN: &str = "gpupass.dev";
/// The domain of Kubernetes' standard device attributes.
pub(crate) const STANDARD_DOMAIN: &str = "resource.kubernetes.io";
/// `proc/sys/kernel/random/boot_id`: tells a node reboot apart from a plugin restart.
pub(crate) fn boot_id(host: &HostRoot) -> std::io::Result<String> {
    crate::host::read_bounded(&host.path("proc/sys/kernel/random/boot_id"), 128).map(|s| s.trim().to_string())
}

/// `proc/sys/kernel/hostname`: the default node name.
pub(crate) fn hostname(host: &HostRoot) -> Option<String> {
    crate::host::read_bounded(&host.path("proc/sys/kernel/hostname"), 256)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// What the tests of the pure modules share.
#[cfg(test)]
pub(crate) mod testing {
    use crate::host::HostRoot;
    use crate::model::Inventory;
    use crate::testkit::hostgen::{DevSpec, HostBuilder};

    /// The inventory of a fixture host `build` makes (and the directory holding it).
    pub(crate) fn scan(build: impl FnOnce(&mut HostBuilder)) -> (tempfile::TempDir, Inventory) {
        let t = tempfile::tempdir().unwrap();
        let mut h = HostBuilder::new(t.path()).unwrap();
        build(&mut h);
        let inv = crate::inventory::scan(&HostRoot::new(t.path())).unwrap();
        (t, inv)
    }

    /// A GPU that is both a passthrough group and a vGPU parent (types `nvidia-63` x2,
    /// `nvidia-64` x1), and the mtty sample parent with a CCW-like type that is refused.
    pub(crate) fn vgpu_host(h: &mut HostBuilder) {
        let gpu: crate::model::PciAddress = "0000:01:00.0".parse().unwrap();
        h.add(
            &DevSpec::new("01:00.0", 0x10de, 0x1eb8, 0x030200)
                .group(1)
                .driver("nvidia"),
        )
        .unwrap();
        h.mdev_type(
            &gpu,
            "nvidia-63",
            "GRID T4-1B",
            "num_heads=4, framebuffer=1024M",
            2,
            "vfio-pci",
        )
        .unwrap();
        h.mdev_type(
            &gpu,
            "nvidia-64",
            "GRID T4-2B",
            "num_heads=4, framebuffer=2048M",
            1,
            "vfio-pci",
        )
        .unwrap();
        h.virtual_mdev_parent(
            "mtty",
            "mtty",
            &[
                ("mtty-1", "Single port serial", None, 3, "vfio-pci"),
                ("Odd_Type", "ccw", None, 1, "vfio-ccw"),
                ("mtty-full", "none left", None, 0, "vfio-pci"),
            ],
        )
        .unwrap();
    }
}
