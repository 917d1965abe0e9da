//! Local boot of a partition image under UEFI: the contract between the GRUB EFI binary
//! image-build puts in the deploy initramfs and the agent's `image.install_bootloader`, which
//! copies it into the EFI system partition and writes what it reads.
//!
//! # Design
//! The binary goes to the firmware's removable-media path, `\EFI\BOOT\BOOTX64.EFI`, so no NVRAM
//! boot entry is needed. It is built (`grub-mkimage -O x86_64-efi -p /EFI/BOOT`) with
//! [`GRUB_EMBEDDED_CONFIG`] and only [`GRUB_EFI_MODULES`]: no `normal` module, whose weight
//! (~80 KB compressed, with `configfile`) the deploy ISO's 12 MiB budget does not have room
//! for. Without `normal`, GRUB runs the embedded config with its small built-in parser (no
//! `if`, no `configfile`), so the per-deploy value, the root file system's UUID, reaches it as
//! a variable in a GRUB environment block, `\EFI\BOOT\grubenv` ([`grubenv`]), read with
//! `load_env`. The agent also writes `\EFI\BOOT\grub.cfg` ([`grub_cfg`]) with the same steps
//! spelled out, for a full GRUB put in place of ours and for a person reading the ESP; our
//! binary does not read it.
//!
//! The instance boots `/boot/vmlinuz` with `/boot/initrd.img` from the root file system, with
//! `root=UUID=<root uuid> console=ttyS0,115200`.
//!
//! # Limitations
//! - The root file system must be ext2/3/4 (the only file system module in the binary) and hold
//!   `/boot/vmlinuz` and `/boot/initrd.img` (Debian and Ubuntu keep these links); the image's own
//!   `grub.cfg` and kernel command line are not used.
//! - x86_64 UEFI only; BIOS local boot of a partition image is not built.

use thiserror::Error;

/// Where the GRUB EFI binary is in the deploy initramfs (and so in the running agent's root).
pub const GRUB_EFI_INITRAMFS_PATH: &str = "/usr/lib/vmdeploy/grub-x86_64.efi";

/// GRUB's prefix: the directory of the ESP the binary is in (`grub-mkimage -p`).
pub const GRUB_EFI_PREFIX: &str = "/EFI/BOOT";

/// The GRUB modules of the binary: GPT and MBR tables, FAT (the ESP, where grubenv is), ext2
/// (the root), search by UUID, `load_env` and the Linux loader; nothing else fits the deploy
/// ISO's budget (the binary is ~260 KB, ~65 KB compressed in the initramfs). No `serial` or
/// `terminal`: GRUB writes to the firmware's console, which the firmware redirects to the
/// serial port where it is set to (OVMF always). No `efi_gop`: GRUB says "no suitable video
/// mode found" and boots on (Linux then has no EFI frame buffer; the console is the serial
/// port).
pub const GRUB_EFI_MODULES: &[&str] = &[
    "part_gpt",
    "part_msdos",
    "fat",
    "ext2",
    "search",
    "loadenv",
    "linux",
];

/// The environment variable [`grubenv`] sets to the root file system's UUID.
pub const ROOT_UUID_VAR: &str = "vmdeploy_root_uuid";

/// The config embedded in the binary (`grub-mkimage -c`): read the ESP's grubenv, find the
/// root by its UUID, boot its kernel.
pub const GRUB_EMBEDDED_CONFIG: &str = "load_env -f ${prefix}/grubenv\n\
     search --no-floppy --fs-uuid --set=root ${vmdeploy_root_uuid}\n\
     linux /boot/vmlinuz root=UUID=${vmdeploy_root_uuid} console=ttyS0,115200\n\
     initrd /boot/initrd.img\n\
     boot\n";

/// The files the agent writes in the ESP, as FAT paths from its root.
pub const ESP_BOOT_DIR: [&str; 2] = ["EFI", "BOOT"];
/// The binary's file name in [`ESP_BOOT_DIR`] (the x86_64 removable-media name).
pub const ESP_LOADER_FILE: &str = "BOOTX64.EFI";
/// The environment block's file name in [`ESP_BOOT_DIR`].
pub const ESP_GRUBENV_FILE: &str = "grubenv";
/// The readable configuration's file name in [`ESP_BOOT_DIR`].
pub const ESP_GRUB_CFG_FILE: &str = "grub.cfg";

/// A GRUB environment block is exactly this long (grub-editenv's `DEFAULT_ENVBLK_SIZE`).
pub const GRUBENV_LEN: usize = 1024;
const GRUBENV_HEADER: &str = "# GRUB Environment Block\n";

/// A root UUID that cannot go into GRUB's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "root_uuid {0:?} is not a file system UUID (letters, digits and '-', at most 64): it would \
     be pasted into GRUB's configuration"
)]
pub struct BadRootUuid(pub String);

/// `uuid` if it is safe to paste into GRUB's configuration: it arrives from the network.
fn checked(uuid: &str) -> Result<&str, BadRootUuid> {
    let ok = !uuid.is_empty()
        && uuid.len() <= 64
        && uuid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(uuid)
    } else {
        Err(BadRootUuid(uuid.chars().take(80).collect()))
    }
}

/// The environment block for `root_uuid`: the header, `vmdeploy_root_uuid=<uuid>`, padded
/// with `#` to [`GRUBENV_LEN`] bytes, as grub-editenv writes one.
pub fn grubenv(root_uuid: &str) -> Result<Vec<u8>, BadRootUuid> {
    let uuid = checked(root_uuid)?;
    let mut block = format!("{GRUBENV_HEADER}{ROOT_UUID_VAR}={uuid}\n").into_bytes();
    block.resize(GRUBENV_LEN, b'#');
    Ok(block)
}

/// The readable `grub.cfg` for `root_uuid`: the steps of [`GRUB_EMBEDDED_CONFIG`] with the UUID
/// written in.
pub fn grub_cfg(root_uuid: &str) -> Result<String, BadRootUuid> {
    let uuid = checked(root_uuid)?;
    Ok(format!(
        "# Written by the vmdeploy agent (image.install_bootloader). The GRUB next to this file\n\
         # reads grubenv, not this file; a full GRUB put in its place reads this.\n\
         serial --unit=0 --speed=115200\n\
         terminal_input serial console\n\
         terminal_output serial console\n\
         search --no-floppy --fs-uuid --set=root {uuid}\n\
         linux /boot/vmlinuz root=UUID={uuid} console=ttyS0,115200\n\
         initrd /boot/initrd.img\n\
         boot\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_block_is_grub_editenvs_format() {
        let block = grubenv("7e57da7a-0000-4000-8000-000000000001").expect("valid");
        assert_eq!(block.len(), 1024);
        let text = std::str::from_utf8(&block).expect("ascii");
        assert!(text.starts_with(
            "# GRUB Environment Block\nvmdeploy_root_uuid=7e57da7a-0000-4000-8000-000000000001\n#"
        ));
        assert!(text.ends_with("####"));
        // The variable the block sets is the one the embedded config reads.
        assert!(GRUB_EMBEDDED_CONFIG.contains(&format!("${{{ROOT_UUID_VAR}}}")));
        assert!(GRUB_EMBEDDED_CONFIG.contains("load_env -f ${prefix}/grubenv"));
        // A vfat volume id (blkid's form) is a valid UUID too.
        assert!(grubenv("ABCD-1234").is_ok());
    }

    #[test]
    fn the_readable_config_boots_the_root_by_uuid() {
        let cfg = grub_cfg("7e57da7a-0000-4000-8000-000000000001").expect("valid");
        assert!(cfg.contains(
            "search --no-floppy --fs-uuid --set=root 7e57da7a-0000-4000-8000-000000000001\n"
        ));
        assert!(cfg.contains(
            "linux /boot/vmlinuz root=UUID=7e57da7a-0000-4000-8000-000000000001 console=ttyS0,115200\n"
        ));
        assert!(cfg.contains("initrd /boot/initrd.img\n"));
        assert!(cfg.ends_with("boot\n"));
    }

    #[test]
    fn a_uuid_that_could_inject_commands_is_refused() {
        for bad in ["", "x\nboot", "a b", "$(x)", "u;reboot", &"a".repeat(65)] {
            assert!(grubenv(bad).is_err(), "{bad:?}");
            assert!(grub_cfg(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_module_the_config_needs_is_listed() {
        for m in ["fat", "ext2", "part_gpt", "search", "loadenv", "linux"] {
            assert!(GRUB_EFI_MODULES.contains(&m), "{m}");
        }
        // The rescue parser runs the embedded config: no command of a module left out.
        assert!(!GRUB_EFI_MODULES.contains(&"normal"));
        for line in GRUB_EMBEDDED_CONFIG.lines() {
            let cmd = line.split_whitespace().next().unwrap_or_default();
            assert!(
                ["load_env", "search", "linux", "initrd", "boot"].contains(&cmd),
                "{line}"
            );
        }
    }
}
