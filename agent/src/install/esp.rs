//! The EFI system partition, made and filled in place with `fatfs` through a [`ByteWindow`]
//! (the deploy ramdisk has no `mkfs.vfat`, and needs none).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;

use anyhow::Context;
use vmdeploy_shared::fs_id::{self, FsKind};
use vmdeploy_shared::partition::local_boot::{
    self, ESP_BOOT_DIR, ESP_GRUBENV_FILE, ESP_GRUB_CFG_FILE, ESP_LOADER_FILE, ESP_SIGNED_GRUB_FILE,
};
use vmdeploy_shared::partition::EFI_LABEL;

use super::signed_chain::SignedChain;
use super::window::ByteWindow;

/// The FAT volume label: Ironic's `efi-part`, space padded to 11 bytes.
fn volume_label() -> [u8; 11] {
    let mut label = [b' '; 11];
    label[..EFI_LABEL.len()].copy_from_slice(EFI_LABEL.as_bytes());
    label
}

/// Opens `disk` for the small, unaligned I/O of `fatfs` (through the page cache).
pub fn open_buffered(disk: &Path) -> anyhow::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(disk)
        .with_context(|| format!("opening {} for the EFI system partition", disk.display()))
}

/// Formats `len` bytes at `offset` of `dev` as FAT with `volume_id` and Ironic's label; the
/// file system's UUID as blkid prints it (`ABCD-1234`).
pub fn format<F: Read + Write + Seek>(
    dev: F,
    offset: u64,
    len: u64,
    volume_id: u32,
) -> anyhow::Result<String> {
    let mut window = ByteWindow::new(dev, offset, len);
    fatfs::format_volume(
        &mut window,
        fatfs::FormatVolumeOptions::new()
            .volume_id(volume_id)
            .volume_label(volume_label()),
    )
    .context("formatting the EFI system partition (FAT)")?;
    window
        .flush()
        .context("flushing the EFI system partition")?;
    uuid_of(window.into_inner(), offset)?.context("the new EFI system partition has no volume id")
}

/// The FAT volume id (blkid's UUID) of the file system at `offset` of `dev`, `None` when there is
/// no FAT there.
pub fn uuid_of<F: Read + Seek>(mut dev: F, offset: u64) -> anyhow::Result<Option<String>> {
    let mut head = vec![0u8; 4096];
    dev.seek(std::io::SeekFrom::Start(offset))
        .and_then(|_| dev.read_exact(&mut head))
        .with_context(|| format!("reading the boot sector at byte {offset}"))?;
    Ok(fs_id::probe(&head)
        .filter(|id| id.kind == FsKind::Vfat)
        .and_then(|id| id.uuid))
}

/// The boot loader [`install_loader`] puts in the ESP.
#[derive(Debug, Clone, Copy)]
pub enum EspBoot<'a> {
    /// Our GRUB (unsigned) as `\EFI\BOOT\BOOTX64.EFI`, reading `\EFI\BOOT\grubenv`.
    Ours {
        /// The GRUB EFI binary.
        grub: &'a [u8],
    },
    /// The image's signed chain, for UEFI Secure Boot: shim as `\EFI\BOOT\BOOTX64.EFI`, the
    /// signed GRUB beside it, the configuration where that GRUB reads it.
    Signed(&'a SignedChain),
}

/// One file for the ESP: its directory (FAT path components), name and bytes.
type EspFile<'a> = (Vec<&'a str>, &'a str, std::borrow::Cow<'a, [u8]>);

/// The files of `boot` for `root_uuid` ([`local_boot`]).
fn files<'a>(boot: &EspBoot<'a>, root_uuid: &str) -> anyhow::Result<Vec<EspFile<'a>>> {
    let boot_dir = ESP_BOOT_DIR.to_vec();
    let grub_cfg = local_boot::grub_cfg(root_uuid)?.into_bytes();
    Ok(match boot {
        EspBoot::Ours { grub } => vec![
            (boot_dir.clone(), ESP_LOADER_FILE, (*grub).into()),
            (
                boot_dir.clone(),
                ESP_GRUBENV_FILE,
                local_boot::grubenv(root_uuid)?.into(),
            ),
            (boot_dir, ESP_GRUB_CFG_FILE, grub_cfg.into()),
        ],
        EspBoot::Signed(chain) => {
            let mut files = vec![
                (
                    boot_dir.clone(),
                    ESP_LOADER_FILE,
                    chain.shim.as_slice().into(),
                ),
                (
                    boot_dir.clone(),
                    ESP_SIGNED_GRUB_FILE,
                    chain.grub.as_slice().into(),
                ),
                (boot_dir.clone(), ESP_GRUB_CFG_FILE, grub_cfg.clone().into()),
            ];
            if let Some(prefix) = &chain.prefix {
                let dir: Vec<&str> = prefix.split('/').filter(|c| !c.is_empty()).collect();
                let same = dir.len() == boot_dir.len()
                    && dir
                        .iter()
                        .zip(&boot_dir)
                        .all(|(a, b)| a.eq_ignore_ascii_case(b));
                if !same {
                    files.push((dir, ESP_GRUB_CFG_FILE, grub_cfg.into()));
                }
            }
            files
        }
    })
}

/// Puts `boot`'s files in the FAT file system at `offset` (`len` bytes) of `dev`, configured to
/// boot the root file system `root_uuid` ([`local_boot`]). Files already there are replaced.
pub fn install_loader<F: Read + Write + Seek>(
    dev: F,
    offset: u64,
    len: u64,
    boot: &EspBoot<'_>,
    root_uuid: &str,
) -> anyhow::Result<()> {
    let files = files(boot, root_uuid)?;
    let mut window = ByteWindow::new(dev, offset, len);
    {
        let fs = fatfs::FileSystem::new(
            &mut window,
            fatfs::FsOptions::new().update_accessed_date(false),
        )
        .context("opening the EFI system partition's FAT file system")?;
        for (dir_path, name, bytes) in &files {
            let shown = format!("\\{}\\{name}", dir_path.join("\\"));
            let mut dir = fs.root_dir();
            for component in dir_path {
                dir = dir
                    .create_dir(component)
                    .with_context(|| format!("creating the directory {component} of {shown}"))?;
            }
            let mut file = dir
                .create_file(name)
                .with_context(|| format!("creating {shown}"))?;
            file.truncate()
                .and_then(|()| file.write_all(bytes))
                .and_then(|()| file.flush())
                .with_context(|| format!("writing {shown} ({} bytes) into the ESP", bytes.len()))?;
        }
        fs.unmount().context("closing the ESP's file system")?;
    }
    window.flush().context("flushing the ESP")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    const MIB: u64 = 1 << 20;

    /// The file at `path` of the FAT file system at 1 MiB (32 MiB long) of `disk`.
    fn read_esp_file(disk: &mut Cursor<Vec<u8>>, path: &str) -> Vec<u8> {
        let mut window = ByteWindow::new(disk, MIB, 32 * MIB);
        let fs = fatfs::FileSystem::new(&mut window, fatfs::FsOptions::new()).expect("FAT");
        let mut out = Vec::new();
        fs.root_dir()
            .open_file(path)
            .expect(path)
            .read_to_end(&mut out)
            .expect(path);
        out
    }

    #[test]
    fn a_formatted_window_is_fat_with_the_volume_id_and_holds_the_loader() {
        let mut disk = Cursor::new(vec![0x5Au8; 40 << 20]);
        let uuid = format(&mut disk, MIB, 32 * MIB, 0x1234_ABCD).expect("format");
        assert_eq!(uuid, "1234-ABCD");
        assert!(disk.get_ref()[..MIB as usize].iter().all(|&b| b == 0x5A));
        assert!(disk.get_ref()[33 * MIB as usize..]
            .iter()
            .all(|&b| b == 0x5A));

        let ours = |grub: &'static [u8]| EspBoot::Ours { grub };
        install_loader(&mut disk, MIB, 32 * MIB, &ours(b"MZ loader"), "ab-12").expect("install");
        // Twice: the files are replaced, not duplicated.
        install_loader(&mut disk, MIB, 32 * MIB, &ours(b"MZ grub"), "7e57-0001").expect("again");
        let mut read = |path: &str| read_esp_file(&mut disk, path);
        assert_eq!(read("EFI/BOOT/BOOTX64.EFI"), b"MZ grub");
        let env = read("EFI/BOOT/grubenv");
        assert_eq!(env.len(), 1024);
        assert!(String::from_utf8_lossy(&env).contains("vmdeploy_root_uuid=7e57-0001\n"));
        assert!(
            String::from_utf8_lossy(&read("EFI/BOOT/grub.cfg")).contains("root=UUID=7e57-0001 ")
        );
    }

    #[test]
    fn a_signed_chain_puts_shim_first_and_the_config_where_its_grub_reads() {
        let mut disk = Cursor::new(vec![0u8; 40 << 20]);
        format(&mut disk, MIB, 32 * MIB, 9).expect("format");
        let chain = SignedChain {
            shim: b"MZ shim".to_vec(),
            grub: b"MZ signed grub".to_vec(),
            prefix: Some("/EFI/debian".into()),
            shim_path: "/usr/lib/shim/shimx64.efi.signed",
        };
        install_loader(
            &mut disk,
            MIB,
            32 * MIB,
            &EspBoot::Signed(&chain),
            "7e57-0002",
        )
        .expect("install");
        let mut read = |path: &str| read_esp_file(&mut disk, path);
        assert_eq!(read("EFI/BOOT/BOOTX64.EFI"), b"MZ shim");
        assert_eq!(read("EFI/BOOT/grubx64.efi"), b"MZ signed grub");
        let cfg = read("EFI/debian/grub.cfg");
        assert_eq!(cfg, read("EFI/BOOT/grub.cfg"));
        assert!(String::from_utf8_lossy(&cfg).contains("root=UUID=7e57-0002 "));
    }

    #[test]
    fn a_bad_root_uuid_writes_nothing() {
        let mut disk = Cursor::new(vec![0u8; 40 << 20]);
        format(&mut disk, MIB, 32 * MIB, 7).expect("format");
        let before = disk.get_ref().clone();
        let err = install_loader(
            &mut disk,
            MIB,
            32 * MIB,
            &EspBoot::Ours { grub: b"MZ" },
            "x\nboot",
        )
        .expect_err("bad");
        assert!(err.to_string().contains("root_uuid"), "{err}");
        assert!(disk.get_ref() == &before);
        assert_eq!(
            uuid_of(Cursor::new(vec![0u8; 8192]), 0).expect("read"),
            None
        );
    }
}
