//! `standby.get_partition_uuids`: what the written disk's partition table says.
//!
//! # Design
//! IPA answers `{"root uuid": <disk identifier>}` for whole-disk images, the identifier being the
//! MBR disk signature (4 bytes at offset 440, little-endian) printed as `0x%08x`
//! (`ironic_lib.disk_utils.get_disk_identifier`); the conductor keeps it as
//! `root_uuid_or_disk_id`. vmdeploy answers the same key, and adds what it read from the table
//! (`gpt` crate for GPT, `mbrman` for MBR) under `vmdeploy_*` keys that Ironic ignores: the table
//! type, the GPT disk GUID, and each partition.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::Context;
use serde_json::{json, Map, Value};

/// The EFI System Partition type GUID (UEFI spec §5.3.3).
const ESP_TYPE: &str = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B";

/// Reads the partition table of `disk` into IPA's `get_partition_uuids` result.
pub fn read_partition_uuids(disk: &Path) -> anyhow::Result<Value> {
    let mut file = File::open(disk).with_context(|| format!("opening {}", disk.display()))?;
    let mut sector = [0u8; 512];
    file.read_exact(&mut sector)
        .with_context(|| format!("reading the first sector of {}", disk.display()))?;
    let signature = u32::from_le_bytes([sector[440], sector[441], sector[442], sector[443]]);
    let mut out = Map::new();
    out.insert("root uuid".into(), json!(format!("0x{signature:08x}")));

    let has_boot_signature = sector[510] == 0x55 && sector[511] == 0xAA;
    let protective = has_boot_signature && sector[446 + 4] == 0xEE;
    if protective {
        let (guid, parts, esp) = read_gpt(disk)?;
        out.insert("vmdeploy_table".into(), json!("gpt"));
        out.insert("vmdeploy_disk_guid".into(), json!(guid));
        if let Some(esp) = esp {
            out.insert("efi system partition uuid".into(), json!(esp));
        }
        out.insert("vmdeploy_partitions".into(), Value::Array(parts));
    } else if has_boot_signature {
        let mbr = read_mbr(&mut file, &sector)
            .with_context(|| format!("reading the MBR of {}", disk.display()))?;
        let parts = mbr
            .iter()
            .filter(|(_, p)| p.is_used())
            .map(|(n, p)| {
                json!({
                    "number": n,
                    "uuid": format!("{signature:08x}-{n:02x}"),
                    "type": format!("0x{:02x}", p.sys),
                    "first_lba": p.starting_lba,
                    "sectors": p.sectors,
                    "bootable": p.boot == mbrman::BOOT_ACTIVE,
                })
            })
            .collect();
        out.insert("vmdeploy_table".into(), json!("mbr"));
        out.insert("vmdeploy_partitions".into(), Value::Array(parts));
    } else {
        out.insert("vmdeploy_table".into(), json!("none"));
        out.insert("vmdeploy_partitions".into(), json!([]));
    }
    Ok(Value::Object(out))
}

/// The GPT's disk GUID, its partitions, and the ESP's partition GUID if there is one. Tries 512
/// then 4096-byte logical blocks (the GPT header sits in LBA 1).
fn read_gpt(disk: &Path) -> anyhow::Result<(String, Vec<Value>, Option<String>)> {
    let mut last_err = None;
    for lb in [
        gpt::disk::LogicalBlockSize::Lb512,
        gpt::disk::LogicalBlockSize::Lb4096,
    ] {
        let opened = File::open(disk)
            .with_context(|| format!("opening {}", disk.display()))
            .and_then(|f| {
                gpt::GptConfig::new()
                    .writable(false)
                    .logical_block_size(lb)
                    .open_from_device(f)
                    .map_err(anyhow::Error::from)
            });
        match opened {
            Ok(table) => {
                let mut esp = None;
                let parts = table
                    .partitions()
                    .iter()
                    .filter(|(_, p)| p.is_used())
                    .map(|(n, p)| {
                        let type_guid = p.part_type_guid.guid.to_string().to_uppercase();
                        if type_guid == ESP_TYPE && esp.is_none() {
                            esp = Some(p.part_guid.to_string());
                        }
                        json!({
                            "number": n,
                            "uuid": p.part_guid.to_string(),
                            "type": type_guid,
                            "first_lba": p.first_lba,
                            "last_lba": p.last_lba,
                            "name": p.name,
                        })
                    })
                    .collect();
                return Ok((table.guid().to_string(), parts, esp));
            }
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err
        .unwrap_or_else(|| anyhow::anyhow!("no block size tried"))
        .context(format!(
            "the protective MBR of {} announces a GPT that cannot be read",
            disk.display()
        )))
}

/// The byte ranges (offset, length) of the EFI system partitions in `disk`'s table: GPT entries
/// of the ESP type, or MBR entries of type 0xEF. `image.install_bootloader` looks for the ESP
/// Ironic names among these when the agent did not lay the disk out itself (a restart).
pub fn esp_extents(disk: &Path) -> anyhow::Result<Vec<(u64, u64)>> {
    partition_extents(disk, true)
}

/// The byte ranges (offset, length) of every partition in `disk`'s table, or of its EFI system
/// partitions only (`esp_only`).
pub fn partition_extents(disk: &Path, esp_only: bool) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut file = File::open(disk).with_context(|| format!("opening {}", disk.display()))?;
    let mut sector = [0u8; 512];
    file.read_exact(&mut sector)
        .with_context(|| format!("reading the first sector of {}", disk.display()))?;
    let has_boot_signature = sector[510] == 0x55 && sector[511] == 0xAA;
    if has_boot_signature && sector[446 + 4] == 0xEE {
        for lb in [
            gpt::disk::LogicalBlockSize::Lb512,
            gpt::disk::LogicalBlockSize::Lb4096,
        ] {
            let Ok(table) = gpt::GptConfig::new()
                .writable(false)
                .logical_block_size(lb)
                .open(disk)
            else {
                continue;
            };
            let bytes = u64::from(lb);
            return Ok(table
                .partitions()
                .values()
                .filter(|p| {
                    p.is_used()
                        && (!esp_only
                            || p.part_type_guid.guid.to_string().to_uppercase() == ESP_TYPE)
                })
                .map(|p| {
                    let sectors = p.last_lba.saturating_sub(p.first_lba) + 1;
                    (p.first_lba * bytes, sectors * bytes)
                })
                .collect());
        }
        anyhow::bail!(
            "the protective MBR of {} announces a GPT that cannot be read",
            disk.display()
        );
    }
    if !has_boot_signature {
        return Ok(Vec::new());
    }
    let mbr = read_mbr(&mut file, &sector)
        .with_context(|| format!("reading the MBR of {}", disk.display()))?;
    Ok(mbr
        .iter()
        .filter(|(_, p)| p.is_used() && (!esp_only || p.sys == 0xEF))
        .map(|(_, p)| (u64::from(p.starting_lba) * 512, u64::from(p.sectors) * 512))
        .collect())
}

/// The MBR of `file`, whose first sector is `sector`. A used primary entry starting at LBA 0
/// (inside the MBR itself) is refused before mbrman sees it: mbrman 0.6 panics on a table whose
/// used entries all start there (its alignment search unwraps an empty range), and the disk can
/// hold anything when the agent reads it back after a restart.
fn read_mbr(file: &mut File, sector: &[u8; 512]) -> anyhow::Result<mbrman::MBR> {
    for (index, entry) in sector[446..510].chunks_exact(16).enumerate() {
        let sys = entry[4];
        let start = u32::from_le_bytes([entry[8], entry[9], entry[10], entry[11]]);
        if sys != 0 && start == 0 {
            anyhow::bail!(
                "partition {} (type 0x{sys:02x}) starts at LBA 0, inside the MBR",
                index + 1
            );
        }
    }
    check_ebr_chain(file, sector)?;
    file.seek(SeekFrom::Start(0))
        .context("rewinding to the MBR")?;
    Ok(mbrman::MBR::read_from(file, 512)?)
}

/// Partition types that open an extended partition (mbrman's `is_extended`).
const EXTENDED_TYPES: [u8; 3] = [0x05, 0x0f, 0x85];

/// Walks the extended partition's chain of EBRs as mbrman 0.6 will, refusing a chain whose
/// sector numbers do not fit in 32 bits: mbrman adds them as `u32`, which overflows (a panic
/// with overflow checks, a wrapped LBA without) on a crafted or corrupt disk. Where mbrman
/// stops or fails on its own (no EBR, a bad signature, a link that goes backwards), this
/// stops too and leaves the error to it.
fn check_ebr_chain(file: &mut File, sector: &[u8; 512]) -> anyhow::Result<()> {
    let entry = |s: &[u8], i: usize| {
        let e = &s[446 + 16 * i..446 + 16 * (i + 1)];
        (e[4], u32::from_le_bytes([e[8], e[9], e[10], e[11]]))
    };
    let Some(extended_start) = (0..4)
        .map(|i| entry(sector, i))
        .find(|(sys, _)| EXTENDED_TYPES.contains(sys))
        .map(|(_, start)| start)
    else {
        return Ok(());
    };
    let overflow =
        || anyhow::anyhow!("the extended partition's chain of EBRs points past 2^32 sectors");
    let mut relative = 0u32;
    // Each link must go forward, so the chain ends within the disk; the cap keeps a
    // pathological one on a huge disk from taking long.
    for _ in 0..4096 {
        let absolute = extended_start.checked_add(relative).ok_or_else(overflow)?;
        let mut ebr = [0u8; 512];
        let read = file
            .seek(SeekFrom::Start(u64::from(absolute) * 512))
            .and_then(|_| file.read_exact(&mut ebr));
        if read.is_err() || ebr[510..512] != [0x55, 0xaa] {
            return Ok(());
        }
        let (_, logical_start) = entry(&ebr, 0);
        logical_start.checked_add(absolute).ok_or_else(overflow)?;
        let (_, next) = entry(&ebr, 1);
        if next == 0 || relative >= next {
            return Ok(());
        }
        relative = next;
    }
    anyhow::bail!("the extended partition holds more than 4096 EBRs")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn blank(len: u64) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().expect("temp file");
        f.as_file().set_len(len).expect("size");
        f
    }

    /// Writes `bytes` at the start of `f` (an MBR, an EBR after it).
    fn write_start(f: &tempfile::NamedTempFile, bytes: &[u8]) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(f.path())
            .and_then(|mut w| w.write_all(bytes))
            .expect("writing the table");
    }

    #[test]
    fn reads_a_gpt_built_on_a_file() {
        let f = blank(64 << 20);
        let mut table = gpt::GptConfig::new()
            .writable(true)
            .logical_block_size(gpt::disk::LogicalBlockSize::Lb512)
            .create_from_device(
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(f.path())
                    .expect("open"),
                None,
            )
            .expect("new GPT");
        let disk_guid = table.guid().to_string();
        let esp_id = table
            .add_partition("EFI", 8 << 20, gpt::partition_types::EFI, 0, None)
            .expect("ESP");
        let root_id = table
            .add_partition("root", 32 << 20, gpt::partition_types::LINUX_FS, 0, None)
            .expect("root");
        let esp_guid = table.partitions()[&esp_id].part_guid.to_string();
        let root_guid = table.partitions()[&root_id].part_guid.to_string();
        let mut dev = table.write().expect("write GPT");
        // A protective MBR with a disk signature, as partitioning tools write one.
        let mbr = gpt::mbr::ProtectiveMBR::with_lb_size(((64u64 << 20) / 512 - 1) as u32);
        mbr.update_conservative(&mut dev).expect("protective MBR");
        dev.seek(SeekFrom::Start(440)).expect("seek");
        dev.write_all(&0xdead_beefu32.to_le_bytes()).expect("sig");
        drop(dev);

        let v = read_partition_uuids(f.path()).expect("read");
        assert_eq!(v["root uuid"], "0xdeadbeef");
        assert_eq!(v["vmdeploy_table"], "gpt");
        assert_eq!(v["vmdeploy_disk_guid"], disk_guid.as_str());
        assert_eq!(v["efi system partition uuid"], esp_guid.as_str());
        let parts = v["vmdeploy_partitions"].as_array().expect("list");
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1]["uuid"], root_guid.as_str());
        assert_eq!(parts[1]["name"], "root");
        assert_eq!(parts[0]["type"], ESP_TYPE);
    }

    #[test]
    fn an_mbr_entry_at_lba_0_is_an_error_not_a_panic() {
        // Found by fuzz/fuzz_targets/partition_tables.rs: mbrman panicked on this table.
        let f = blank(1 << 20);
        let mut img = vec![0u8; 512];
        img[446 + 16 * 2 + 4] = 0x9c;
        img[510] = 0x55;
        img[511] = 0xAA;
        write_start(&f, &img);
        let err = read_partition_uuids(f.path()).expect_err("an entry inside the MBR");
        assert!(format!("{err:#}").contains("starts at LBA 0"), "{err:#}");
        assert!(esp_extents(f.path()).is_err());
    }

    #[test]
    fn an_ebr_chain_past_32_bit_sectors_is_an_error_not_a_panic() {
        // Found by fuzz/fuzz_targets/partition_tables.rs: mbrman adds EBR sector numbers as
        // u32, which overflowed (a panic with overflow checks on, a wrapped LBA without).
        let f = blank(1 << 20);
        let mut img = vec![0u8; 1024];
        // An extended partition from LBA 1; its EBR there holds a logical partition whose
        // start, relative to the EBR, is the largest u32.
        img[446 + 4] = 0x0f;
        img[446 + 8..446 + 12].copy_from_slice(&1u32.to_le_bytes());
        img[446 + 12..446 + 16].copy_from_slice(&100u32.to_le_bytes());
        img[510] = 0x55;
        img[511] = 0xAA;
        img[512 + 446 + 4] = 0x83;
        img[512 + 446 + 8..512 + 446 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        img[512 + 446 + 12..512 + 446 + 16].copy_from_slice(&8u32.to_le_bytes());
        img[1022] = 0x55;
        img[1023] = 0xAA;
        write_start(&f, &img);
        let err = read_partition_uuids(f.path()).expect_err("an EBR chain past 2^32 sectors");
        assert!(format!("{err:#}").contains("2^32 sectors"), "{err:#}");
        assert!(esp_extents(f.path()).is_err());
    }

    #[test]
    fn reads_an_mbr_and_a_blank_disk() {
        let f = blank(8 << 20);
        let mut img = vec![0u8; 512];
        img[440..444].copy_from_slice(&0x0102_0304u32.to_le_bytes());
        // One Linux partition from LBA 2048, 4096 sectors, active.
        let e = 446;
        img[e] = 0x80;
        img[e + 4] = 0x83;
        img[e + 8..e + 12].copy_from_slice(&2048u32.to_le_bytes());
        img[e + 12..e + 16].copy_from_slice(&4096u32.to_le_bytes());
        img[510] = 0x55;
        img[511] = 0xAA;
        write_start(&f, &img);
        let v = read_partition_uuids(f.path()).expect("read");
        assert_eq!(v["root uuid"], "0x01020304");
        assert_eq!(v["vmdeploy_table"], "mbr");
        let parts = v["vmdeploy_partitions"].as_array().expect("list");
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0]["type"], "0x83");
        assert_eq!(parts[0]["first_lba"], 2048);
        assert_eq!(parts[0]["bootable"], true);

        let b = blank(1 << 20);
        let v = read_partition_uuids(b.path()).expect("read blank");
        assert_eq!(v["root uuid"], "0x00000000");
        assert_eq!(v["vmdeploy_table"], "none");

        let tiny = blank(100);
        assert!(read_partition_uuids(tiny.path()).is_err());
    }
}
