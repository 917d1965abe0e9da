//! The whole-disk image: GPT with a protective MBR carrying GRUB's BIOS boot code, assembled in
//! memory (35 MiB) and written sparse; the EFI system partition; the qcow2 copy.
//!
//! # Layout (512-byte sectors)
//! ```text
//! LBA 0           protective MBR, GRUB boot.img code in bytes 0..440
//! LBA 1..33       primary GPT header and entries
//! 1 MiB   1 MiB   p1 BIOS boot (EF02)     GRUB core.img
//! 2 MiB   8 MiB   p2 EFI system           FAT (mkfs.vfat), \EFI\BOOT\BOOTX64.EFI (and, for
//!                                         Secure Boot, grubx64.efi and \EFI\debian\grub.cfg)
//! 10 MiB 24 MiB   p3 Linux file system    ext4, the root
//! last MiB        backup GPT
//! ```

use std::collections::BTreeMap;
use std::io::Cursor;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::process::Command;

use anyhow::Context as _;

use super::grub::{BiosBoot, CORE_LBA};

const MIB: u64 = 1 << 20;
const SECTOR: u64 = 512;
/// p1, the BIOS boot partition.
pub const BIOS_BOOT_START: u64 = MIB;
const BIOS_BOOT_BYTES: u64 = MIB;
/// p2, the EFI system partition.
const ESP_START: u64 = 2 * MIB;
/// Room for shim (1.0 MB) and Debian's signed GRUB (4.2 MB) of a Secure Boot chain.
const ESP_BYTES: u64 = 8 * MIB;
/// p3, the root file system.
const ROOT_START: u64 = 10 * MIB;
/// Size of the root file system and partition: the kernel (8 MB) and the ramdisk (~2 MB) with
/// room for the journal.
pub const ROOT_BYTES: u64 = 24 * MIB;
/// The whole disk: the partitions and a MiB for the backup GPT.
pub const DISK_BYTES: u64 = ROOT_START + ROOT_BYTES + MIB;

/// Fixed GPT identifiers (reproducible builds): the disk, then p1..p3.
const DISK_GUID: &str = "7e57d15c-0000-4000-8000-0000000000d0";
const PARTITION_GUIDS: [&str; 3] = [
    "7e57d15c-0000-4000-8000-0000000000a1",
    "7e57d15c-0000-4000-8000-0000000000a2",
    "7e57d15c-0000-4000-8000-0000000000a3",
];
/// The ESP's FAT volume id (mkfs.vfat would take the clock).
const ESP_VOLUME_ID: &str = "7E57EF15";

/// One file for the ESP: its FAT path (`EFI/BOOT/BOOTX64.EFI`) and its bytes.
pub type EspFile<'a> = (&'a str, &'a [u8]);

/// Makes the ESP image (FAT, `ESP_BYTES`) holding `files`, their directories made first.
pub fn make_esp(files: &[EspFile<'_>], scratch: &Path, epoch: u64) -> anyhow::Result<Vec<u8>> {
    let image = scratch.join("esp.img");
    let _ = std::fs::remove_file(&image);
    let epoch_s = epoch.to_string();
    // --invariant: mkfs.vfat stamps the volume label entry with the clock otherwise
    // (dosfstools 4.2); -i still sets our volume id.
    crate::tool::run(
        Command::new("mkfs.vfat")
            .args([
                "--invariant",
                "-C",
                "-i",
                ESP_VOLUME_ID,
                "-n",
                "VMDTEST-ESP",
            ])
            .arg(&image)
            .arg((ESP_BYTES / 1024).to_string()),
        "apt-get install dosfstools",
    )?;
    // mtools stamps new directories with SOURCE_DATE_EPOCH, and `mcopy -m` keeps each file's
    // modification time (set to the epoch here).
    let mut dirs = std::collections::BTreeSet::new();
    for (path, _) in files {
        let mut at = String::new();
        for part in path
            .split('/')
            .rev()
            .skip(1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            dirs.insert(format!("::/{at}"));
        }
    }
    if !dirs.is_empty() {
        crate::tool::run(
            Command::new("mmd")
                .env("SOURCE_DATE_EPOCH", &epoch_s)
                .env("MTOOLS_SKIP_CHECK", "1")
                .arg("-i")
                .arg(&image)
                .args(&dirs),
            "apt-get install mtools",
        )?;
    }
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(epoch);
    for (i, (path, data)) in files.iter().enumerate() {
        let staged = scratch.join(format!("esp-file-{i}"));
        std::fs::write(&staged, data).with_context(|| format!("writing {}", staged.display()))?;
        std::fs::File::options()
            .write(true)
            .open(&staged)
            .and_then(|f| f.set_modified(time))
            .with_context(|| format!("setting the time of {}", staged.display()))?;
        crate::tool::run(
            Command::new("mcopy")
                .env("SOURCE_DATE_EPOCH", &epoch_s)
                .env("MTOOLS_SKIP_CHECK", "1")
                .arg("-m")
                .arg("-i")
                .arg(&image)
                .arg(&staged)
                .arg(format!("::/{path}")),
            "apt-get install mtools",
        )?;
    }
    let bytes = std::fs::read(&image).with_context(|| format!("reading {}", image.display()))?;
    anyhow::ensure!(
        bytes.len() as u64 == ESP_BYTES,
        "mkfs.vfat made {} bytes, not {ESP_BYTES}",
        bytes.len()
    );
    Ok(bytes)
}

/// Writes the disk image to `out` (sparse).
pub fn assemble(bios: &BiosBoot, esp: &[u8], root_fs: &Path, out: &Path) -> anyhow::Result<()> {
    let root = std::fs::read(root_fs).with_context(|| format!("reading {}", root_fs.display()))?;
    let disk = layout(bios, esp, &root)?;
    write_sparse(out, &disk)
}

/// The disk's bytes.
pub fn layout(bios: &BiosBoot, esp: &[u8], root: &[u8]) -> anyhow::Result<Vec<u8>> {
    anyhow::ensure!(
        bios.core_img.len() as u64 <= BIOS_BOOT_BYTES,
        "core.img ({} bytes) does not fit the BIOS boot partition",
        bios.core_img.len()
    );
    anyhow::ensure!(esp.len() as u64 <= ESP_BYTES, "the ESP image is too large");
    anyhow::ensure!(
        root.len() as u64 <= ROOT_BYTES,
        "the root image is too large"
    );
    let mut disk = Cursor::new(vec![0u8; DISK_BYTES as usize]);

    let guid = |s: &str| uuid::Uuid::parse_str(s).context("parsing a fixed GUID");
    let mut table = gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(gpt::disk::LogicalBlockSize::Lb512)
        .create_from_device(&mut disk, Some(guid(DISK_GUID)?))
        .context("creating the GPT")?;
    let parts = [
        (
            gpt::partition_types::BIOS,
            BIOS_BOOT_START,
            BIOS_BOOT_BYTES,
            "bios-boot",
        ),
        (gpt::partition_types::EFI, ESP_START, ESP_BYTES, "efi"),
        (
            gpt::partition_types::LINUX_FS,
            ROOT_START,
            ROOT_BYTES,
            "root",
        ),
    ];
    let mut entries = BTreeMap::new();
    for (i, (part_type_guid, start, len, name)) in parts.into_iter().enumerate() {
        entries.insert(
            i as u32 + 1,
            gpt::partition::Partition {
                part_type_guid,
                part_guid: guid(PARTITION_GUIDS[i])?,
                first_lba: start / SECTOR,
                last_lba: (start + len) / SECTOR - 1,
                flags: 0,
                name: name.to_owned(),
            },
        );
    }
    table
        .update_partitions(entries)
        .context("adding the partitions")?;
    table.write().context("writing the GPT")?;
    let mut mbr = gpt::mbr::ProtectiveMBR::with_lb_size(
        u32::try_from(DISK_BYTES / SECTOR - 1).unwrap_or(u32::MAX),
    );
    mbr.set_bootcode(bios.mbr_code);
    mbr.overwrite_lba0(&mut disk)
        .context("writing the protective MBR")?;

    let mut disk = disk.into_inner();
    let mut put = |at: u64, bytes: &[u8]| {
        disk[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
    };
    put(CORE_LBA * SECTOR, &bios.core_img);
    put(ESP_START, esp);
    put(ROOT_START, root);
    Ok(disk)
}

/// Writes `bytes` to a new file at `out`, leaving 4 KiB blocks of zeros as holes.
pub fn write_sparse(out: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    const BLOCK: usize = 4096;
    let _ = std::fs::remove_file(out);
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    file.set_len(bytes.len() as u64)
        .with_context(|| format!("sizing {}", out.display()))?;
    let mut at = 0;
    while at < bytes.len() {
        let end = (at + BLOCK).min(bytes.len());
        if bytes[at..end].iter().any(|&b| b != 0) {
            // Extend the run over the following non-zero blocks: fewer, larger writes.
            let mut run_end = end;
            while run_end < bytes.len() {
                let next = (run_end + BLOCK).min(bytes.len());
                if bytes[run_end..next].iter().all(|&b| b == 0) {
                    break;
                }
                run_end = next;
            }
            file.write_all_at(&bytes[at..run_end], at as u64)
                .with_context(|| format!("writing {}", out.display()))?;
            at = run_end;
        } else {
            at = end;
        }
    }
    file.sync_all()
        .with_context(|| format!("syncing {}", out.display()))
}

/// `qemu-img convert -O qcow2` (uncompressed: the agent streams qcow2 clusters as they are).
pub fn to_qcow2(raw: &Path, out: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(out);
    crate::tool::run(
        Command::new("qemu-img")
            .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
            .arg(raw)
            .arg(out),
        "apt-get install qemu-utils",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_three_partitions_and_the_mbr_the_boot_code() {
        let bios = BiosBoot {
            mbr_code: [0x33; 440],
            core_img: vec![0x44; 64 * 512],
        };
        let disk = layout(&bios, &[0x55; 1024], &[0x66; 4096]).expect("layout");
        assert_eq!(disk.len() as u64, DISK_BYTES);
        assert_eq!(&disk[..440], &[0x33; 440][..]);
        assert_eq!(disk[450], 0xEE, "protective partition type");
        assert_eq!(&disk[510..512], &[0x55, 0xAA]);
        assert_eq!(&disk[512..520], b"EFI PART");
        assert_eq!(disk[MIB as usize], 0x44);
        assert_eq!(disk[ESP_START as usize], 0x55);
        assert_eq!(disk[ROOT_START as usize + 4095], 0x66);
        let table = gpt::GptConfig::new()
            .writable(false)
            .open_from_device(Cursor::new(disk))
            .expect("reads back");
        let p = table.partitions();
        assert_eq!(p.len(), 3);
        assert_eq!(p[&1].part_type_guid, gpt::partition_types::BIOS);
        assert_eq!(p[&2].part_type_guid, gpt::partition_types::EFI);
        assert_eq!(p[&3].first_lba, ROOT_START / SECTOR);
    }

    #[test]
    fn zero_blocks_become_holes() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sparse");
        let mut bytes = vec![0u8; 4 << 20];
        bytes[10] = 1;
        bytes[(3 << 20) + 5] = 2;
        write_sparse(&path, &bytes).expect("writes");
        assert_eq!(std::fs::read(&path).expect("read"), bytes);
        let meta = std::fs::metadata(&path).expect("meta");
        assert!(meta.blocks() * 512 < 1 << 20, "{} blocks", meta.blocks());
    }
}
