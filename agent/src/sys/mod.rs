//! Every raw `ioctl` the agent makes, behind thin safe wrappers (the coreos-installer
//! `blockdev.rs` layout, docs/style.md §1): block devices ([`block`]) and network interfaces
//! ([`net`]). The raw declarations and the `unsafe` stay here; callers get `io::Result`s.

pub mod block;
pub mod net;

pub use block::{
    block_device_size, logical_block_size, physical_block_size, reread_partition_table,
};
