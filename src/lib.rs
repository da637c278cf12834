//! gpupass: move GPUs and other PCI devices from a Linux host into VMs and containers.
//!
//! # The kernel objects gpupass works with
//!
//! - **PCI functions** live under `/sys/bus/pci/devices/<domain:bus:device.function>`; each has
//!   a vendor/device ID, a class, BARs (`resource`), a bound `driver` and a `driver_override`.
//! - **IOMMU groups** (`/sys/kernel/iommu_groups/N`) are the smallest sets of devices the IOMMU
//!   can isolate from each other. VFIO hands a VM a whole group: the group is *viable* only
//!   when every member is driverless, bound to a VFIO driver or `pci-stub`, or is a bridge.
//!   A GPU and its HDMI audio function usually share one group, so both must move together.
//! - **Binding** moves a function between drivers: write the driver name to
//!   `driver_override`, unbind from the current driver, write the address to
//!   `/sys/bus/pci/drivers_probe`, then verify the `driver` link (the probe reports success
//!   even when nothing bound).
//! - **Mediated devices** (mdev) split one parent into instances: a parent under
//!   `/sys/class/mdev_bus` offers types; writing a UUID to a type's `create` makes an instance
//!   that VFIO opens by UUID.
//!
//! # Data flow
//!
//! `host` (one root for every path) → `inventory` (read-only model in `model`) → renderers
//! (`output`) and, for changes, plan → apply. See `docs/ARCHITECTURE.md`.

// `unsafe` only where allowed below, each block with its `// SAFETY:` comment (Cargo.toml
// [lints]: `unsafe_code` denied, `clippy::undocumented_unsafe_blocks`; docs/ARCHITECTURE.md,
// "Rules").

// What gpupass says on stderr: the one sink.
pub mod messages;

// Read: where the host is, what it holds.
pub mod host;
pub mod inventory;
pub mod model;

// Change: plan, then apply (through host::ops::HostOps only): `change` is the one engine
// (typed steps, lock, journal, rollback, recover); `bind` and `mdev` build plans for it.
pub mod bind;
pub mod change;
pub mod mdev;

// Render: pure over the inventory.
pub mod output;

// Containers: the OCI hook, the device plugin, the native driver's files.
pub mod containers;

// Commands: arguments, the one context, dispatch.
pub mod cli;

// The VMM (and its VFIO wrapper) stands apart: `gpupass boot`.
#[cfg(feature = "vmm")]
#[allow(unsafe_code)] // KVM memory slots, vCPU runs, VFIO maps
pub mod vmm;

// Test machinery, never in a default build.
#[cfg(feature = "testkit")]
pub mod testkit;

/// Minor page faults of this process so far (profiling aid for the phase events at `-vv`).
#[allow(unsafe_code)]
pub fn minor_faults() -> i64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the pointer, which points at a zeroed rusage.
    unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init().ru_minflt
    }
}
