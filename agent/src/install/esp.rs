//! The EFI system partition, made and filled in place with `fatfs` through a [`ByteWindow`]
//! (the deploy ramdisk has no `mkfs.vfat`, and needs none).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;

use anyhow::Context;
use vmdeploy_shared::fs_id::{self, FsKind};
use vmdeploy_shared::partition::local_boot::{
    self, ESP_BOOT_DIR, ESP_GRUBENV_FILE, ESP_GRUB_CFG_FILE, ESP_LOADER_FILE,
};
use vmdeploy_shared::partition::EFI_LABEL;

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

/// Puts `loader` at `\EFI\BOOT\BOOTX64.EFI` of the FAT file system at `offset` (`len` bytes) of
/// `dev`, with the environment block and the readable `grub.cfg` for `root_uuid`
/// ([`local_boot`]). Files already there are replaced.
pub fn install_loader<F: Read + Write + Seek>(
    dev: F,
    offset: u64,
    len: u64,
    loader: &[u8],
    root_uuid: &str,
) -> anyhow::Result<()> {
    let grubenv = local_boot::grubenv(root_uuid)?;
    let grub_cfg = local_boot::grub_cfg(root_uuid)?;
    let mut window = ByteWindow::new(dev, offset, len);
    {
        let fs = fatfs::FileSystem::new(
            &mut window,
            fatfs::FsOptions::new().update_accessed_date(false),
        )
        .context("opening the EFI system partition's FAT file system")?;
        let mut dir = fs.root_dir();
        for name in ESP_BOOT_DIR {
            dir = dir
                .create_dir(name)
                .with_context(|| format!("creating the directory {name} in the ESP"))?;
        }
        for (name, bytes) in [
            (ESP_LOADER_FILE, loader),
            (ESP_GRUBENV_FILE, grubenv.as_slice()),
            (ESP_GRUB_CFG_FILE, grub_cfg.as_bytes()),
        ] {
            let mut file = dir
                .create_file(name)
                .with_context(|| format!("creating \\EFI\\BOOT\\{name}"))?;
            file.truncate()
                .and_then(|()| file.write_all(bytes))
                .and_then(|()| file.flush())
                .with_context(|| {
                    format!(
                        "writing \\EFI\\BOOT\\{name} ({} bytes) into the ESP",
                        bytes.len()
                    )
                })?;
        }
        drop(dir);
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

    #[test]
    fn a_formatted_window_is_fat_with_the_volume_id_and_holds_the_loader() {
        let mut disk = Cursor::new(vec![0x5Au8; 40 << 20]);
        let uuid = format(&mut disk, MIB, 32 * MIB, 0x1234_ABCD).expect("format");
        assert_eq!(uuid, "1234-ABCD");
        assert!(disk.get_ref()[..MIB as usize].iter().all(|&b| b == 0x5A));
        assert!(disk.get_ref()[33 * MIB as usize..]
            .iter()
            .all(|&b| b == 0x5A));

        install_loader(&mut disk, MIB, 32 * MIB, b"MZ loader", "ab-12").expect("install");
        // Twice: the files are replaced, not duplicated.
        install_loader(&mut disk, MIB, 32 * MIB, b"MZ grub", "7e57-0001").expect("again");
        let mut window = ByteWindow::new(&mut disk, MIB, 32 * MIB);
        let fs = fatfs::FileSystem::new(&mut window, fatfs::FsOptions::new()).expect("FAT");
        let read = |path: &str| {
            let mut out = Vec::new();
            fs.root_dir()
                .open_file(path)
                .expect(path)
                .read_to_end(&mut out)
                .expect(path);
            out
        };
        assert_eq!(read("EFI/BOOT/BOOTX64.EFI"), b"MZ grub");
        let env = read("EFI/BOOT/grubenv");
        assert_eq!(env.len(), 1024);
        assert!(String::from_utf8_lossy(&env).contains("vmdeploy_root_uuid=7e57-0001\n"));
        assert!(
            String::from_utf8_lossy(&read("EFI/BOOT/grub.cfg")).contains("root=UUID=7e57-0001 ")
        );
    }

    #[test]
    fn a_bad_root_uuid_writes_nothing() {
        let mut disk = Cursor::new(vec![0u8; 40 << 20]);
        format(&mut disk, MIB, 32 * MIB, 7).expect("format");
        let before = disk.get_ref().clone();
        let err = install_loader(&mut disk, MIB, 32 * MIB, b"MZ", "x\nboot").expect_err("bad");
        assert!(err.to_string().contains("root_uuid"), "{err}");
        assert!(disk.get_ref() == &before);
        assert_eq!(
            uuid_of(Cursor::new(vec![0u8; 8192]), 0).expect("read"),
            None
        );
    }
}
