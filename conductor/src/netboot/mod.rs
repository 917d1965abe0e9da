//! The network boot service of `pxe_ilo` (docs/architecture.md §3): off unless configured. It serves the
//! deploy kernel and ramdisk, and the instance's for a netboot instance, to a server whose iLO
//! has no Advanced licence and so cannot boot virtual media.
//!
//! # Parts
//! - a read-only TFTP server confined to its root (PXE ROMs, PXELINUX, GRUB): [`tftp`];
//! - the per-node boot configuration files (PXELINUX, GRUB, iPXE) written at prepare time and
//!   removed at tear-down and on every failure;
//! - HTTP serving of the same root for iPXE.
//!
//! # Design
//! Nothing here knows a node's state: the network boot interface ([`crate::boot::pxe`]) decides what
//! a node boots and calls [`files::BootRoot`]; the servers only read the root.

pub mod config;
pub mod files;
pub mod http;
pub mod path;
pub mod tftp;

/// The netboot settings (the `[netboot]` table) and the boot root they name.
#[derive(Debug, Clone)]
pub struct Netboot {
    /// The directory TFTP and HTTP serve, with the per-node files.
    pub root: files::BootRoot,
    /// The deploy kernel when a node's `driver_info.pxe_deploy_kernel` is silent.
    pub deploy_kernel: Option<String>,
    /// The deploy ramdisk when `driver_info.pxe_deploy_ramdisk` is silent.
    pub deploy_ramdisk: Option<String>,
    /// Words added to every deploy ramdisk's command line (Ironic's `pxe_append_params`).
    pub append_params: String,
    /// Words added to a netboot instance's command line after `root=UUID=…`.
    pub instance_append_params: String,
}
