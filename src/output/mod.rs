//! Renderers: pure functions from the inventory to what a user or a consumer reads.
pub mod cdi;
pub mod kubevirt;
pub mod layout;
pub mod libvirt;
pub mod naming;
pub mod plan;
pub mod qemu;
pub mod selection;
pub mod table;
