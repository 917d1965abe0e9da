//! [`write_partition_image`] on file-backed disks: the table read back with `gpt` / `mbrman`,
//! the root image at the root partition's offset, the ESP a FAT volume, the record Ironic reads.

use std::io::{Cursor, Read, Seek, SeekFrom};

use serde_json::json;
use vmdeploy_shared::io::hash::{digest_reader, ExpectedDigest, HashAlgo, HashError};
use vmdeploy_shared::partition::TableKind;

use super::*;
use crate::install::job::job_from_image_info;
use crate::install::window::ByteWindow;

const MIB: u64 = 1 << 20;
const ROOT_UUID: &str = "7e57da7a-0000-4000-8000-000000000001";

/// A stand-in ext4 root image of `len` bytes: a patterned body with an ext superblock (magic
/// and [`ROOT_UUID`]) where blkid looks.
fn root_image(len: usize) -> Vec<u8> {
    let mut img: Vec<u8> = (0..len).map(|i| (i % 251) as u8 | 1).collect();
    img[1024..2048].fill(0);
    img[1024 + 56..1024 + 58].copy_from_slice(&0xEF53u16.to_le_bytes());
    let uuid: Vec<u8> = ROOT_UUID
        .replace('-', "")
        .as_bytes()
        .chunks(2)
        .map(|h| u8::from_str_radix(std::str::from_utf8(h).expect("hex"), 16).expect("hex"))
        .collect();
    img[1024 + 104..1024 + 120].copy_from_slice(&uuid);
    img
}

fn sha256(data: &[u8]) -> ExpectedDigest {
    let hex = digest_reader(HashAlgo::Sha256, data).expect("in memory");
    ExpectedDigest::new(HashAlgo::Sha256, &hex).expect("valid")
}

/// A sparse disk file of `len` bytes filled with nothing (reads as zeroes) but a marker in its
/// first sector, as if an old table were there.
fn disk_file(len: u64) -> (tempfile::TempDir, Arc<Disk>) {
    let dir = tempfile::Builder::new()
        .prefix("vmdeploy-install-test")
        .tempdir_in("/var/tmp")
        .expect("scratch dir");
    let path = dir.path().join("disk.img");
    let f = std::fs::File::create(&path).expect("disk file");
    f.set_len(len).expect("size");
    std::os::unix::fs::FileExt::write_all_at(&f, b"OLD TABLE", 0).expect("marker");
    let disk = Arc::new(Disk::open(&path).expect("open"));
    (dir, disk)
}

fn image_info(extra: serde_json::Value) -> serde_json::Value {
    let mut v = json!({
        "image_type": "partition", "root_mb": 64, "swap_mb": 0, "ephemeral_mb": 0,
        "preserve_ephemeral": false, "deploy_boot_mode": "uefi", "boot_option": "local",
    });
    if let (Some(m), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
        m.extend(e);
    }
    v
}

fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(path).expect("open");
    f.seek(SeekFrom::Start(offset)).expect("seek");
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).expect("read");
    buf
}

#[test]
fn uefi_local_boot_gpt_with_esp_swap_and_config_drive() {
    let image = root_image(3 * MIB as usize + 4321);
    let mut iso = vec![0u8; 40_000];
    iso[16 * 2048 + 1..16 * 2048 + 6].copy_from_slice(b"CD001");
    let job = job_from_image_info(&image_info(json!({"swap_mb": 16})), None).expect("job");
    let (_dir, disk) = disk_file(512 * MIB);
    let (record, outcome) = write_partition_image(
        Cursor::new(image.clone()),
        &disk,
        &job,
        Some(&iso),
        Some(&sha256(&image)),
        &Progress::default(),
    )
    .expect("written");
    assert_eq!(outcome.image_len, image.len() as u64);
    assert_eq!(record.root_uuid, ROOT_UUID);

    // The table, as the gpt crate reads it: ESP, swap, configdrive, root, from 1 MiB.
    let table = gpt::GptConfig::new()
        .writable(false)
        .logical_block_size(gpt::disk::LogicalBlockSize::Lb512)
        .open(disk.path())
        .expect("a GPT");
    let parts: Vec<_> = table.partitions().values().cloned().collect();
    assert_eq!(parts.len(), 4);
    assert_eq!(parts[0].part_type_guid, gpt::partition_types::EFI);
    assert_eq!(parts[0].first_lba, MIB / 512);
    assert_eq!(parts[0].last_lba + 1, 201 * MIB / 512);
    assert_eq!(parts[1].part_type_guid, gpt::partition_types::LINUX_SWAP);
    assert_eq!(parts[3].name, "root");
    let root = record.layout.root().expect("root");
    assert_eq!(parts[3].first_lba * 512, root.offset);
    assert_eq!(root.len, 64 * MIB);

    // The root image where the table says, the config drive and the swap signature in theirs.
    assert_eq!(read_at(disk.path(), root.offset, image.len()), image);
    let cd = record
        .layout
        .partition(Role::ConfigDrive)
        .expect("configdrive");
    assert_eq!(read_at(disk.path(), cd.offset, iso.len()), iso);
    let swap = record.layout.partition(Role::Swap).expect("swap");
    assert_eq!(read_at(disk.path(), swap.offset + 4086, 10), b"SWAPSPACE2");

    // The ESP is a FAT volume fatfs opens, with the volume id reported.
    let efi = record.layout.partition(Role::Efi).expect("esp");
    let f = std::fs::File::open(disk.path()).expect("open");
    let esp_uuid = esp::uuid_of(&f, efi.offset).expect("read").expect("FAT");
    assert_eq!(record.esp_uuid.as_deref(), Some(esp_uuid.as_str()));
    let mut window = ByteWindow::new(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(disk.path())
            .expect("open"),
        efi.offset,
        efi.len,
    );
    let fs = fatfs::FileSystem::new(&mut window, fatfs::FsOptions::new()).expect("a FAT volume");
    assert_eq!(fs.root_dir().iter().count(), 0, "a fresh ESP is empty");
    drop(fs);

    // What get_partition_uuids answers, with IPA's keys.
    let v = record.to_ipa();
    assert_eq!(v["root uuid"], ROOT_UUID);
    assert_eq!(v["efi system partition uuid"], esp_uuid.as_str());
    let dev = disk.path().display().to_string();
    assert_eq!(v["partitions"]["efi system partition"], format!("{dev}1"));
    assert_eq!(v["partitions"]["swap"], format!("{dev}2"));
    assert_eq!(v["partitions"]["configdrive"], format!("{dev}3"));
    assert_eq!(v["partitions"]["root"], format!("{dev}4"));
}

#[test]
fn bios_gets_an_mbr_and_no_esp() {
    let image = root_image(2 * MIB as usize);
    let job =
        job_from_image_info(&image_info(json!({"deploy_boot_mode": "bios"})), None).expect("job");
    assert_eq!(job.table, TableKind::Mbr);
    let (_dir, disk) = disk_file(128 * MIB);
    let (record, _) = write_from_memory(image.clone(), &disk, &job).expect("written");
    let mut f = std::fs::File::open(disk.path()).expect("open");
    let mbr = mbrman::MBR::read_from(&mut f, 512).expect("an MBR");
    let used: Vec<_> = mbr.iter().filter(|(_, p)| p.is_used()).collect();
    assert_eq!(used.len(), 1);
    assert_eq!(used[0].1.starting_lba, 2048);
    assert_eq!(read_at(disk.path(), MIB, image.len()), image);
    assert_eq!(record.esp_uuid, None);
    assert_eq!(record.to_ipa()["efi system partition uuid"], json!(null));
}

#[test]
fn a_checksum_mismatch_leaves_no_table() {
    let image = root_image(2 * MIB as usize);
    let job = job_from_image_info(&image_info(json!({})), None).expect("job");
    let (_dir, disk) = disk_file(512 * MIB);
    let mut other = image.clone();
    other[MIB as usize + 3] ^= 0x40;
    let err = write_partition_image(
        Cursor::new(other),
        &disk,
        &job,
        None,
        Some(&sha256(&image)),
        &Progress::default(),
    )
    .expect_err("mismatch");
    assert!(err.chain().any(|c| c.is::<HashError>()), "{err:#}");
    assert!(
        format!("{err:#}").contains("partition tables were zeroed"),
        "{err:#}"
    );
    assert!(read_at(disk.path(), 0, MIB as usize)
        .iter()
        .all(|&b| b == 0));
    // The root partition's first MiB (the superblock) was held back, never written.
    assert!(read_at(disk.path(), 201 * MIB, MIB as usize)
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn an_image_larger_than_the_root_partition_is_refused() {
    let job = job_from_image_info(&image_info(json!({"root_mb": 2})), None).expect("job");
    let (_dir, disk) = disk_file(512 * MIB);
    let err =
        write_from_memory(root_image(2 * MIB as usize + 1), &disk, &job).expect_err("too large");
    assert!(
        format!("{err:#}").contains("larger than the limit"),
        "{err:#}"
    );
    // Nothing after the root partition was touched.
    let root_end = 201 * MIB + 2 * MIB;
    assert!(read_at(disk.path(), root_end, MIB as usize)
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn a_root_without_a_file_system_is_an_error() {
    let job =
        job_from_image_info(&image_info(json!({"deploy_boot_mode": "bios"})), None).expect("job");
    let (_dir, disk) = disk_file(128 * MIB);
    let err = write_from_memory(vec![7u8; 100_000], &disk, &job).expect_err("no fs");
    assert!(
        format!("{err:#}").contains("is the image a partition image"),
        "{err:#}"
    );
}

#[test]
fn partition_device_names() {
    assert_eq!(partition_device(Path::new("/dev/sda"), 2), "/dev/sda2");
    assert_eq!(
        partition_device(Path::new("/dev/nvme0n1"), 1),
        "/dev/nvme0n1p1"
    );
    assert_eq!(
        partition_device(Path::new("/dev/mmcblk0"), 3),
        "/dev/mmcblk0p3"
    );
}
