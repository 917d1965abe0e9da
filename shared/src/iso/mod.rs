//! Bootable ISO images: one ISO 9660 + El Torito image with a BIOS entry and a UEFI entry, the
//! kernel and initramfs stored once (DESIGN §9–11, `../shared/reference/qemu-and-boot.md` §6).
//!
//! Used by `vmdeploy-image-build deploy-iso` / `boot-iso` and, at run time, by the conductor for
//! the instance boot ISOs of `iscsi_ilo` netboot. Pure code: the boot loader binaries come in as
//! bytes ([`BootLoaders`]); finding them on a system is the caller's business.
//!
//! # Layout (SKELETON: the ISO helper fills this in)
//! ```text
//! /boot/vmlinuz  /boot/initrd        stored once, read by both loaders
//! BIOS entry: isolinux (or GRUB's El Torito image), config with the command line
//! UEFI entry: a FAT EFI system image with EFI/BOOT/BOOTX64.EFI (GRUB) and its config
//! volume id VMEDIA_BOOT_ISO; the same inputs give the same bytes
//! ```

use std::io::{Seek, Write};

/// The volume id of every boot ISO we write.
pub const BOOT_VOLUME_ID: &str = "VMEDIA_BOOT_ISO";

/// The boot loader binaries an ISO needs.
#[derive(Debug, Clone)]
pub struct BootLoaders {
    /// `isolinux.bin` (BIOS El Torito, no emulation, boot-info-table patched in).
    pub isolinux_bin: Vec<u8>,
    /// `ldlinux.c32`, which isolinux.bin loads.
    pub ldlinux_c32: Vec<u8>,
    /// GRUB's x86_64 EFI binary, stored as `EFI/BOOT/BOOTX64.EFI` in the EFI system image.
    pub grub_efi: Vec<u8>,
}

/// What goes on a boot ISO.
#[derive(Debug, Clone, Copy)]
pub struct BootIsoSpec<'a> {
    /// The kernel (bzImage).
    pub kernel: &'a [u8],
    /// The initramfs, as the kernel will read it (compressed or not).
    pub initramfs: &'a [u8],
    /// The kernel command line both menus pass, after `console=tty0 console=ttyS0,115200`.
    pub cmdline: &'a str,
    /// The loaders.
    pub loaders: &'a BootLoaders,
}

/// Why an ISO could not be written.
#[derive(Debug, thiserror::Error)]
pub enum IsoError {
    /// Writing the output failed.
    #[error("writing the ISO: {0}")]
    Io(#[from] std::io::Error),
    /// An input is not usable (too large, a command line with a newline, ...).
    #[error("invalid ISO input: {0}")]
    Invalid(String),
}

/// Writes the boot ISO to `out` and returns it.
pub fn write_boot_iso<W: Write + Seek>(spec: &BootIsoSpec<'_>, out: W) -> Result<W, IsoError> {
    let _ = spec;
    let _ = out;
    Err(IsoError::Invalid(
        "the ISO writer is not built yet (skeleton)".into(),
    ))
}
