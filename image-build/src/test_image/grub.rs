//! GRUB for the test disk, BIOS and UEFI, made by `grub-mkimage` from Debian's grub-pc-bin and
//! grub-efi-amd64-bin, each carrying the whole boot configuration ([`config`]), and the BIOS
//! boot sector patched the way `grub-install`'s setup step patches it, without root or a
//! loop device.
//!
//! # BIOS boot chain (GRUB 2.06 include/grub/i386/pc/boot.h, util/setup.c)
//! ```text
//! MBR   boot.img's first 440 bytes; at 0x5c the LBA of core.img's first sector (u64 LE);
//!       at 0x66 the drive check jump, replaced by two NOPs for a hard disk (setup.c does, so
//!       BIOSes that pass a bad drive number in DL still read from 0x80)
//! core  core.img at LBA [CORE_LBA] (the BIOS boot partition): its first sector (diskboot.img)
//!       ends with a block list {start u64, len u16, segment u16} at 0x1f4; grub-mkimage fills
//!       len and segment and leaves start at 2, which we set to the sector after the first
//! ```

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context as _};

/// GRUB's i386-pc modules and images (package `grub-pc-bin`).
pub const BIOS_MODULE_DIR: &str = "/usr/lib/grub/i386-pc";

/// Where core.img starts: the first sector of the BIOS boot partition.
pub const CORE_LBA: u64 = super::disk::BIOS_BOOT_START / 512;

const KERNEL_SECTOR_OFFSET: usize = 0x5c;
const DRIVE_CHECK_OFFSET: usize = 0x66;
const BOOT_CODE_LEN: usize = 440;
const BLOCKLIST_START_OFFSET: usize = 0x1f4;
const BLOCKLIST_LEN_OFFSET: usize = 0x1fc;
/// The start grub-mkimage leaves in the block list (diskboot.S `blocklist_default_start`).
const DEFAULT_BLOCKLIST_START: u64 = 2;

/// Modules of the BIOS core.img: disk access, GPT, ext4, the commands of [`config`].
const BIOS_MODULES: &[&str] = &[
    "biosdisk", "part_gpt", "ext2", "search", "linux", "serial", "terminal", "echo",
];
/// Modules of the EFI binary (`efi_gop`: without a video driver GRUB prints "no suitable video
/// mode found"; see `vmdeploy_shared::iso::GRUB_EFI_MODULES`).
const EFI_MODULES: &[&str] = &[
    "part_gpt", "ext2", "search", "linux", "serial", "terminal", "echo", "efi_gop",
];

/// The configuration both GRUBs run at start: serial console, find the root by its UUID, boot
/// the kernel at once. `quiet`: the marker line should not drown in kernel messages.
pub fn config(root_uuid: &str) -> String {
    format!(
        "serial --unit=0 --speed=115200\n\
         terminal_input serial console\n\
         terminal_output serial console\n\
         search --no-floppy --fs-uuid --set=root {root_uuid}\n\
         linux /boot/vmlinuz root=UUID={root_uuid} console=ttyS0,115200 quiet\n\
         initrd /boot/initrd.img\n\
         boot\n"
    )
}

/// The BIOS boot code: the MBR's first 440 bytes and core.img, both patched for [`CORE_LBA`].
pub struct BiosBoot {
    /// Bytes 0..440 of the MBR.
    pub mbr_code: [u8; BOOT_CODE_LEN],
    /// core.img, to be written at [`CORE_LBA`].
    pub core_img: Vec<u8>,
}

/// Builds the BIOS boot code with `config` embedded.
pub fn bios(config: &str, scratch: &Path) -> anyhow::Result<BiosBoot> {
    let dir = Path::new(BIOS_MODULE_DIR);
    let boot_img_path = dir.join("boot.img");
    if !boot_img_path.is_file() {
        bail!(
            "{} is missing: install GRUB's BIOS images with `apt-get install grub-pc-bin`",
            boot_img_path.display()
        );
    }
    let boot_img = std::fs::read(&boot_img_path)
        .with_context(|| format!("reading {}", boot_img_path.display()))?;
    let core = mkimage("i386-pc", dir, BIOS_MODULES, config, scratch)?;
    patch_bios(&boot_img, core, CORE_LBA)
}

/// Patches boot.img and core.img for core.img at `core_lba`, as grub-setup would.
pub fn patch_bios(
    boot_img: &[u8],
    mut core_img: Vec<u8>,
    core_lba: u64,
) -> anyhow::Result<BiosBoot> {
    anyhow::ensure!(
        boot_img.len() == 512 && boot_img[510..] == [0x55, 0xaa],
        "GRUB's boot.img is not a 512-byte boot sector"
    );
    anyhow::ensure!(
        core_img.len() > 512,
        "core.img is {} bytes, less than its first sector and a kernel",
        core_img.len()
    );
    // grub-mkimage does not pad the last sector; the disk holds whole ones.
    core_img.resize(core_img.len().div_ceil(512) * 512, 0);
    let start = u64::from_le_bytes(
        core_img[BLOCKLIST_START_OFFSET..BLOCKLIST_START_OFFSET + 8]
            .try_into()
            .context("reading core.img's block list")?,
    );
    let len = u16::from_le_bytes([
        core_img[BLOCKLIST_LEN_OFFSET],
        core_img[BLOCKLIST_LEN_OFFSET + 1],
    ]);
    // A core.img whose block list is not what grub-mkimage writes is a GRUB we do not know.
    anyhow::ensure!(
        start == DEFAULT_BLOCKLIST_START && u64::from(len) == core_img.len() as u64 / 512 - 1,
        "core.img's block list is {{start {start}, len {len}}}, not grub-mkimage's {{2, {}}}",
        core_img.len() / 512 - 1
    );
    core_img[BLOCKLIST_START_OFFSET..BLOCKLIST_START_OFFSET + 8]
        .copy_from_slice(&(core_lba + 1).to_le_bytes());

    let mut mbr_code = [0u8; BOOT_CODE_LEN];
    mbr_code.copy_from_slice(&boot_img[..BOOT_CODE_LEN]);
    mbr_code[KERNEL_SECTOR_OFFSET..KERNEL_SECTOR_OFFSET + 8]
        .copy_from_slice(&core_lba.to_le_bytes());
    mbr_code[DRIVE_CHECK_OFFSET..DRIVE_CHECK_OFFSET + 2].copy_from_slice(&[0x90, 0x90]);
    Ok(BiosBoot { mbr_code, core_img })
}

/// `BOOTX64.EFI` with `config` embedded.
pub fn efi(config: &str, scratch: &Path) -> anyhow::Result<Vec<u8>> {
    let dir = Path::new(crate::loaders::GRUB_EFI_MODULE_DIR);
    if !dir.join("linux.mod").exists() {
        bail!(
            "GRUB's x86_64 EFI modules are missing from {}: install them with `apt-get install \
             grub-efi-amd64-bin`",
            dir.display()
        );
    }
    mkimage("x86_64-efi", dir, EFI_MODULES, config, scratch)
}

fn mkimage(
    format: &str,
    dir: &Path,
    modules: &[&str],
    config: &str,
    scratch: &Path,
) -> anyhow::Result<Vec<u8>> {
    let cfg = scratch.join(format!("grub-{format}.cfg"));
    std::fs::write(&cfg, config).with_context(|| format!("writing {}", cfg.display()))?;
    let out = scratch.join(format!("grub-{format}.img"));
    crate::tool::run(
        Command::new("grub-mkimage")
            .args(["-O", format, "-p", "/boot/grub"])
            .arg("-d")
            .arg(dir)
            .arg("-c")
            .arg(&cfg)
            .arg("-o")
            .arg(&out)
            .args(modules),
        "apt-get install grub-common",
    )
    .with_context(|| format!("running grub-mkimage -O {format}"))?;
    std::fs::read(&out).with_context(|| format!("reading {}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_boot_img() -> Vec<u8> {
        let mut b = vec![0xAB; 512];
        b[510] = 0x55;
        b[511] = 0xaa;
        b
    }

    fn fake_core(sectors: usize) -> Vec<u8> {
        let mut c = vec![0u8; sectors * 512];
        c[BLOCKLIST_START_OFFSET..BLOCKLIST_START_OFFSET + 8].copy_from_slice(&2u64.to_le_bytes());
        c[BLOCKLIST_LEN_OFFSET..BLOCKLIST_LEN_OFFSET + 2]
            .copy_from_slice(&((sectors - 1) as u16).to_le_bytes());
        c
    }

    #[test]
    fn the_sector_numbers_are_patched_where_grub_setup_puts_them() {
        let boot = patch_bios(&fake_boot_img(), fake_core(60), 2048).expect("patches");
        assert_eq!(&boot.mbr_code[0x5c..0x64], &2048u64.to_le_bytes());
        assert_eq!(&boot.mbr_code[0x66..0x68], &[0x90, 0x90]);
        assert_eq!(boot.mbr_code[0], 0xAB);
        assert_eq!(&boot.core_img[0x1f4..0x1fc], &2049u64.to_le_bytes());
        assert_eq!(&boot.core_img[0x1fc..0x1fe], &59u16.to_le_bytes());
    }

    #[test]
    fn an_unknown_core_layout_is_refused() {
        let mut core = fake_core(10);
        core[BLOCKLIST_START_OFFSET] = 7;
        assert!(patch_bios(&fake_boot_img(), core, 2048).is_err());
        assert!(patch_bios(&fake_boot_img(), vec![0; 512], 2048).is_err());
        assert!(patch_bios(&[0; 512], fake_core(10), 2048).is_err());
    }

    #[test]
    fn the_config_boots_the_root_by_uuid_without_a_menu() {
        let c = config("7e57d15c-0000-4000-8000-000000000003");
        assert!(c.contains("search --no-floppy --fs-uuid --set=root 7e57d15c-"));
        assert!(c.contains("root=UUID=7e57d15c-0000-4000-8000-000000000003 console=ttyS0"));
        assert!(c.ends_with("boot\n"));
        assert!(!c.contains("menuentry") && !c.contains("timeout"));
    }
}
