//! Partition tables from `vmdeploy_shared::partition` and file system ids from
//! `vmdeploy_shared::fs_id`, checked by the system's own tools on sparse files (no loop device):
//! `sfdisk --dump` / `--verify` for MBR and GPT, `sgdisk -v` / `-p` for GPT, `blkid -p` for the
//! swap signature (next to `mkswap`'s own), `mkfs.ext4` and `mkfs.vfat` file systems read back
//! by `probe` and compared with `blkid`.
//!
//! Needs the Debian packages fdisk (sfdisk), gdisk (sgdisk), util-linux (blkid, mkswap),
//! e2fsprogs (mkfs.ext4) and dosfstools (mkfs.vfat), all installed by scripts/setup.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use vmdeploy_integration_tests::tools::tool_ok;
use vmdeploy_shared::fs_id::{self, FsKind};
use vmdeploy_shared::partition::{
    plan, render, swap_signature, wipe_regions, DiskIds, Layout, LayoutRequest, Role, SectorSize,
    TableKind, EFI_SYSTEM_PARTITION_MIB, MIB, SWAP_LABEL,
};

const GIB: u64 = 1 << 30;
const SWAP_UUID: &str = "5e0b2f6c-1a33-4d2e-9f10-112233445566";

fn ids() -> DiskIds {
    DiskIds {
        mbr_signature: 0x1234_abcd,
        disk_guid: "01234567-89ab-4def-8123-456789abcdef"
            .parse()
            .expect("uuid"),
        partition_guids: (1..=5u128)
            .map(|n| uuid::Uuid::from_u128(0x0aaa_0000_0000_4000_8000_0000_0000_0000 + n))
            .collect(),
    }
}

/// A sparse file of `len` bytes in /var/tmp.
fn sparse(len: u64) -> tempfile::NamedTempFile {
    // End the name in a letter: tools call the partitions of `disk7` `disk7p1`, not `disk71`.
    let f = tempfile::Builder::new()
        .prefix("partition-layout-")
        .suffix(".img")
        .tempfile_in("/var/tmp")
        .expect("temp file");
    f.as_file().set_len(len).expect("sizing the sparse disk");
    f
}

/// Wipes, then writes the rendered table onto `disk`, as the conductor does on the LUN.
fn lay_out(disk: &File, layout: &Layout) {
    for (offset, len) in wipe_regions(layout.disk_bytes, layout.sector_size) {
        disk.write_all_at(&vec![0u8; len as usize], offset)
            .expect("wiping");
    }
    for w in render(layout, &ids()).expect("render") {
        disk.write_all_at(&w.bytes, w.offset)
            .expect("writing a table region");
    }
    disk.sync_all().expect("sync");
}

/// The partition lines of `sfdisk --dump`, by number: `start=…, size=…, type=…` as a map.
fn sfdisk_dump(
    path: &Path,
) -> (
    BTreeMap<String, String>,
    BTreeMap<u32, BTreeMap<String, String>>,
) {
    let path = path.to_str().expect("utf-8 temp path");
    let text = tool_ok("sfdisk", "fdisk", &["--dump", path]);
    let mut header = BTreeMap::new();
    let mut parts = BTreeMap::new();
    for line in text.lines() {
        if let Some((dev, fields)) = line.split_once(" : ") {
            let number: u32 = dev
                .trim()
                .strip_prefix(path)
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("partition line {line:?}"));
            let map = fields
                .split(", ")
                .map(|f| match f.split_once('=') {
                    Some((k, v)) => (k.trim().to_owned(), v.trim().trim_matches('"').to_owned()),
                    None => (f.trim().to_owned(), String::new()),
                })
                .collect();
            parts.insert(number, map);
        } else if let Some((k, v)) = line.split_once(": ") {
            header.insert(k.to_owned(), v.trim().to_owned());
        }
    }
    (header, parts)
}

fn request(table: TableKind) -> LayoutRequest {
    LayoutRequest {
        disk_bytes: 3 * GIB + 12_345 * 512,
        sector_size: SectorSize::B512,
        table,
        efi_mib: if table == TableKind::Gpt {
            EFI_SYSTEM_PARTITION_MIB
        } else {
            0
        },
        ephemeral_mib: 100,
        swap_mib: 64,
        configdrive_bytes: 2 * MIB + 7,
        root_mib: 0,
        image_bytes: 1536 * MIB,
        grow_root_to_image: true,
    }
}

#[test]
fn mbr_table_reads_back_with_sfdisk() {
    let layout = plan(&request(TableKind::Mbr)).expect("plan");
    let disk = sparse(layout.disk_bytes);
    lay_out(disk.as_file(), &layout);

    let verify = tool_ok(
        "sfdisk",
        "fdisk",
        &["--verify", disk.path().to_str().expect("path")],
    );
    assert!(verify.contains("No errors detected"), "{verify}");

    let (header, parts) = sfdisk_dump(disk.path());
    assert_eq!(header.get("label").map(String::as_str), Some("dos"));
    assert_eq!(
        header.get("label-id").map(String::as_str),
        Some("0x1234abcd")
    );
    let want: BTreeMap<u32, BTreeMap<String, String>> = layout
        .partitions
        .iter()
        .map(|p| {
            let mut m = BTreeMap::new();
            m.insert("start".to_owned(), p.first_lba.to_string());
            m.insert("size".to_owned(), p.sectors.to_string());
            let t = if p.role == Role::Swap { "82" } else { "83" };
            m.insert("type".to_owned(), t.to_owned());
            if p.role == Role::Root {
                m.insert("bootable".to_owned(), String::new());
            }
            (p.number, m)
        })
        .collect();
    assert_eq!(parts, want);
    // ephemeral, swap, configdrive (3 MiB for 2 MiB + 7 bytes), then root up to the last whole
    // MiB of the disk (3 GiB + 12345 sectors: 3078 whole MiB).
    let sizes: Vec<u64> = layout.partitions.iter().map(|p| p.len / MIB).collect();
    assert_eq!(sizes, vec![100, 64, 3, 3078 - 1 - 100 - 64 - 3]);
}

#[test]
fn gpt_table_passes_sgdisk_and_sfdisk() {
    let layout = plan(&request(TableKind::Gpt)).expect("plan");
    let disk = sparse(layout.disk_bytes);
    lay_out(disk.as_file(), &layout);
    let path = disk.path().to_str().expect("path");

    let verify = tool_ok("sgdisk", "gdisk", &["-v", path]);
    assert!(verify.contains("No problems found"), "{verify}");

    // sgdisk -p: "Number  Start (sector)  End (sector)  Size  Code  Name" rows.
    let print = tool_ok("sgdisk", "gdisk", &["-p", path]);
    assert!(
        print.contains("Disk identifier (GUID): 01234567-89AB-4DEF-8123-456789ABCDEF"),
        "{print}"
    );
    let rows: Vec<(u32, u64, u64, String, String)> = print
        .lines()
        .skip_while(|l| !l.starts_with("Number"))
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 7).then(|| {
                (
                    f[0].parse().expect("number"),
                    f[1].parse().expect("start"),
                    f[2].parse().expect("end"),
                    f[5].to_owned(),
                    f[6].to_owned(),
                )
            })
        })
        .collect();
    let want: Vec<_> = layout
        .partitions
        .iter()
        .map(|p| {
            let code = match p.role {
                Role::Efi => "EF00",
                Role::Swap => "8200",
                _ => "8300",
            };
            (
                p.number,
                p.first_lba,
                p.first_lba + p.sectors - 1,
                code.to_owned(),
                p.role.name().to_owned(),
            )
        })
        .collect();
    assert_eq!(rows, want, "{print}");

    let (header, parts) = sfdisk_dump(disk.path());
    assert_eq!(header.get("label").map(String::as_str), Some("gpt"));
    assert_eq!(
        header.get("label-id").map(String::as_str),
        Some("01234567-89AB-4DEF-8123-456789ABCDEF")
    );
    let sectors = layout.disk_bytes / 512;
    assert_eq!(header.get("first-lba"), Some(&"34".to_owned()));
    assert_eq!(header.get("last-lba"), Some(&(sectors - 34).to_string()));
    for p in &layout.partitions {
        let got = &parts[&p.number];
        assert_eq!(got["start"], p.first_lba.to_string());
        assert_eq!(got["size"], p.sectors.to_string());
        assert_eq!(
            got["uuid"],
            ids().partition_guids[p.number as usize - 1]
                .to_string()
                .to_uppercase()
        );
    }
    assert_eq!(parts.len(), 5);
}

#[test]
fn swap_signature_matches_mkswap_and_blkid() {
    let layout = plan(&request(TableKind::Gpt)).expect("plan");
    let disk = sparse(layout.disk_bytes);
    lay_out(disk.as_file(), &layout);
    let swap = *layout.partition(Role::Swap).expect("swap planned");
    let uuid: uuid::Uuid = SWAP_UUID.parse().expect("uuid");
    let page = swap_signature(swap.len, SWAP_LABEL, *uuid.as_bytes()).expect("signature");
    disk.as_file()
        .write_all_at(&page, swap.offset)
        .expect("writing the swap signature");
    disk.as_file().sync_all().expect("sync");

    // blkid's low-level probe on the swap partition, by offset and size within the disk file.
    let export = tool_ok(
        "blkid",
        "util-linux",
        &[
            "-p",
            "-o",
            "export",
            "-O",
            &swap.offset.to_string(),
            "-S",
            &swap.len.to_string(),
            disk.path().to_str().expect("path"),
        ],
    );
    for want in [
        "TYPE=swap",
        "LABEL=swap1",
        &format!("UUID={SWAP_UUID}"),
        "VERSION=1",
    ] {
        assert!(export.lines().any(|l| l == want), "{want} in {export}");
    }

    // mkswap's own header for the same size, label and UUID is the same page.
    let reference = sparse(swap.len);
    let path = reference.path().to_str().expect("path");
    tool_ok(
        "mkswap",
        "util-linux",
        &["-L", SWAP_LABEL, "-U", SWAP_UUID, path],
    );
    let mut theirs = vec![0u8; page.len()];
    reference
        .as_file()
        .read_exact_at(&mut theirs, 0)
        .expect("reading mkswap's page");
    assert_eq!(page, theirs, "our swap header differs from mkswap's");

    let id = fs_id::probe(&theirs).expect("mkswap's header recognised");
    assert_eq!(id.kind, FsKind::Swap);
    assert_eq!(id.uuid.as_deref(), Some(SWAP_UUID));
    assert_eq!(id.label.as_deref(), Some("swap1"));
}

/// `blkid -p -o value -s <tag>` of a file.
fn blkid_tag(path: &Path, tag: &str) -> String {
    tool_ok(
        "blkid",
        "util-linux",
        &["-p", "-o", "value", "-s", tag, path.to_str().expect("path")],
    )
    .trim()
    .to_owned()
}

fn first_bytes(path: &Path) -> Vec<u8> {
    let file = File::open(path).expect("opening the file system image");
    let mut buf = vec![0u8; fs_id::PROBE_LEN];
    file.read_exact_at(&mut buf, 0)
        .expect("reading the first bytes");
    buf
}

#[test]
fn fs_id_agrees_with_blkid_on_ext4_and_vfat() {
    let uuid = "9c1f3a55-0d2b-4e6f-a7b8-c9d0e1f2a3b4";
    let ext4 = sparse(64 * MIB);
    tool_ok(
        "mkfs.ext4",
        "e2fsprogs",
        &[
            "-q",
            "-F",
            "-U",
            uuid,
            "-L",
            "x",
            ext4.path().to_str().expect("path"),
        ],
    );
    let id = fs_id::probe(&first_bytes(ext4.path())).expect("ext4 recognised");
    assert_eq!(id.kind, FsKind::Ext4);
    assert_eq!(id.uuid.as_deref(), Some(uuid));
    assert_eq!(blkid_tag(ext4.path(), "UUID"), uuid);
    assert_eq!(id.label.as_deref(), Some("x"));
    assert_eq!(blkid_tag(ext4.path(), "TYPE"), id.kind.as_str());

    let ext2 = sparse(16 * MIB);
    tool_ok(
        "mkfs.ext2",
        "e2fsprogs",
        &[
            "-q",
            "-F",
            "-L",
            "ephemeral0",
            ext2.path().to_str().expect("path"),
        ],
    );
    let id = fs_id::probe(&first_bytes(ext2.path())).expect("ext2 recognised");
    assert_eq!(id.kind.as_str(), blkid_tag(ext2.path(), "TYPE"));
    assert_eq!(id.uuid, Some(blkid_tag(ext2.path(), "UUID")));
    assert_eq!(id.label.as_deref(), Some("ephemeral0"));

    let vfat = sparse(64 * MIB);
    tool_ok(
        "mkfs.vfat",
        "dosfstools",
        &[
            "-i",
            "1234ABCD",
            "-n",
            "EFI-PART",
            vfat.path().to_str().expect("path"),
        ],
    );
    let id = fs_id::probe(&first_bytes(vfat.path())).expect("vfat recognised");
    assert_eq!(id.kind, FsKind::Vfat);
    assert_eq!(id.uuid.as_deref(), Some("1234-ABCD"));
    assert_eq!(blkid_tag(vfat.path(), "UUID"), "1234-ABCD");
    assert_eq!(id.label, Some(blkid_tag(vfat.path(), "LABEL")));
    assert_eq!(blkid_tag(vfat.path(), "TYPE"), "vfat");

    // FAT32 keeps its serial and label further into the boot sector.
    let fat32 = sparse(64 * MIB);
    tool_ok(
        "mkfs.vfat",
        "dosfstools",
        &[
            "-F",
            "32",
            "-i",
            "0badcafe",
            "-n",
            "EFI32",
            fat32.path().to_str().expect("path"),
        ],
    );
    let id = fs_id::probe(&first_bytes(fat32.path())).expect("FAT32 recognised");
    assert_eq!(id.kind, FsKind::Vfat);
    assert_eq!(id.uuid.as_deref(), Some("0BAD-CAFE"));
    assert_eq!(blkid_tag(fat32.path(), "UUID"), "0BAD-CAFE");
    assert_eq!(id.label.as_deref(), Some("EFI32"));
    assert_eq!(blkid_tag(fat32.path(), "LABEL"), "EFI32");
}

/// 4Kn disks: sfdisk and sgdisk assume 512-byte sectors on a file, fdisk takes `-b 4096`.
#[test]
fn four_k_sector_tables_read_back_with_fdisk() {
    for table in [TableKind::Gpt, TableKind::Mbr] {
        let layout = plan(&LayoutRequest {
            sector_size: SectorSize::B4096,
            efi_mib: 0,
            ..request(table)
        })
        .expect("plan");
        let disk = sparse(layout.disk_bytes);
        lay_out(disk.as_file(), &layout);
        let path = disk.path().to_str().expect("path");
        let text = tool_ok(
            "fdisk",
            "fdisk",
            &["-b", "4096", "-l", "-o", "Device,Start,End,Type", path],
        );
        let label = if table == TableKind::Gpt {
            "gpt"
        } else {
            "dos"
        };
        assert!(
            text.contains(&format!("Disklabel type: {label}")),
            "{table:?}: {text}"
        );
        assert!(
            !text.contains("corrupt")
                && !text.contains("mismatch")
                && !text.contains("does not start on physical sector"),
            "{table:?}: {text}"
        );
        let rows: Vec<(String, u64, u64)> = text
            .lines()
            .filter(|l| l.starts_with(path))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                // MBR rows carry a `*` boot column when the partition is active.
                let f: Vec<&str> = f.into_iter().filter(|x| *x != "*").collect();
                (
                    f[0].strip_prefix(path).expect("device").to_owned(),
                    f[1].parse().expect("start"),
                    f[2].parse().expect("end"),
                )
            })
            .collect();
        let want: Vec<(String, u64, u64)> = layout
            .partitions
            .iter()
            .map(|p| {
                (
                    p.number.to_string(),
                    p.first_lba,
                    p.first_lba + p.sectors - 1,
                )
            })
            .collect();
        assert_eq!(rows, want, "{table:?}: {text}");
        assert_eq!(rows.len(), 4);
    }
}
