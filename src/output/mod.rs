//! Renderers: pure functions from the inventory to what a user or a consumer reads.
pub mod table;
