//! The network boot service of `pxe_ilo` (DESIGN.md §3): off unless configured. It serves the
//! deploy kernel and ramdisk, and the instance's for a netboot instance, to a server whose iLO
//! has no Advanced licence and so cannot boot virtual media.
//!
//! # Parts
//! - a read-only TFTP server confined to its root (PXE ROMs, PXELINUX, GRUB);
//! - the per-node boot configuration files (PXELINUX, GRUB, iPXE) written at prepare time and
//!   removed at tear-down and on every failure;
//! - HTTP serving of the same root for iPXE.

pub mod tftp;
