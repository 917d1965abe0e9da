//! [`render`]: the partition table as a few whole, aligned regions of bytes.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read, Seek, SeekFrom, Write};

use super::plan::gpt_backup_bytes;
use super::{Layout, PartitionError, Role, SectorSize, TableKind, MIB};

/// The first region [`render`] returns: the disk's first MiB, which holds the MBR (or protective
/// MBR, primary GPT header and entry array) and nothing else, since partitions start at 1 MiB.
/// Writing it whole also clears what an old boot loader left in the gap.
pub const HEAD_REGION_LEN: u64 = MIB;

/// Region starts are aligned to this, so a remote LUN or an O_DIRECT device takes each region
/// as whole blocks (no read-modify-write).
const REGION_ALIGN: u64 = 4096;

/// The identifiers written into the table. The caller chooses them ([`DiskIds::random`] for a
/// deploy, fixed values in tests), so a render is deterministic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskIds {
    /// MBR disk signature (the 4 bytes at offset 440, little-endian: `sfdisk`'s `label-id`,
    /// Ironic's whole-disk "disk identifier"). MBR tables only.
    pub mbr_signature: u32,
    /// GPT disk GUID. GPT tables only.
    pub disk_guid: uuid::Uuid,
    /// GPT partition GUIDs: element `i` for partition number `i + 1`. GPT tables only.
    pub partition_guids: Vec<uuid::Uuid>,
}

impl DiskIds {
    /// Random identifiers for a table of up to `partitions` partitions: version 4 GUIDs and a
    /// non-zero MBR signature (zero reads as "no signature" to some systems).
    pub fn random(partitions: usize) -> Result<Self, PartitionError> {
        let mut signature = [0u8; 4];
        fill_random(&mut signature)?;
        let mbr_signature = match u32::from_le_bytes(signature) {
            0 => 1,
            s => s,
        };
        let disk_guid = random_uuid()?;
        let partition_guids = (0..partitions)
            .map(|_| random_uuid())
            .collect::<Result<_, _>>()?;
        Ok(DiskIds {
            mbr_signature,
            disk_guid,
            partition_guids,
        })
    }
}

fn fill_random(buf: &mut [u8]) -> Result<(), PartitionError> {
    getrandom::fill(buf).map_err(|e| PartitionError::Random(e.to_string()))
}

fn random_uuid() -> Result<uuid::Uuid, PartitionError> {
    let mut bytes = [0u8; 16];
    fill_random(&mut bytes)?;
    Ok(uuid::Builder::from_random_bytes(bytes).into_uuid())
}

/// One region to write onto the disk: `bytes` at byte `offset`. Offsets are 4 KiB-aligned and
/// lengths whole sectors; the last region of a GPT disk ends at the disk's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableWrite {
    /// Byte offset on the disk.
    pub offset: u64,
    /// The bytes (whole logical sectors).
    pub bytes: Vec<u8>,
}

/// Builds the partition table of `layout` in memory and returns the regions to write: for MBR
/// the first MiB; for GPT the first MiB (protective MBR, primary header and entries) and the
/// end of the disk from the 4 KiB boundary at or below the backup entry array (backup entries
/// and header). The tables are built by `mbrman` and `gpt` on an in-memory stand-in of the disk,
/// never on the device (`docs/crates.md`: both write many small unaligned pieces).
///
/// MBR: types 0xEF (EFI), 0x82 (swap), 0x83 (the others); the root partition is active (BIOS
/// boot). GPT: EFI System, Linux swap and Linux filesystem type GUIDs; partition names are the
/// role names.
pub fn render(layout: &Layout, ids: &DiskIds) -> Result<Vec<TableWrite>, PartitionError> {
    let ss = layout.sector_size.bytes();
    let disk_bytes = layout.disk_bytes / ss * ss;
    let tail_offset = match layout.table {
        TableKind::Gpt => {
            let backup_start = disk_bytes
                .checked_sub(gpt_backup_bytes(layout.sector_size))
                .ok_or_else(|| invalid("the disk has no room for a backup GPT"))?;
            backup_start / REGION_ALIGN * REGION_ALIGN
        }
        TableKind::Mbr => disk_bytes,
    };
    if tail_offset < HEAD_REGION_LEN {
        return Err(invalid(
            "the disk is smaller than its first MiB and the backup GPT",
        ));
    }
    check_partitions(layout, tail_offset)?;

    let mut regions = vec![(0, HEAD_REGION_LEN)];
    if layout.table == TableKind::Gpt {
        regions.push((tail_offset, disk_bytes - tail_offset));
    }
    let mut disk = WindowDisk::new(disk_bytes, &regions);
    match layout.table {
        TableKind::Mbr => write_mbr(layout, ids, &mut disk)?,
        TableKind::Gpt => disk = write_gpt(layout, ids, disk)?,
    }
    Ok(disk
        .windows
        .into_iter()
        .map(|(offset, bytes)| TableWrite { offset, bytes })
        .collect())
}

fn invalid(why: &str) -> PartitionError {
    PartitionError::InvalidLayout(why.to_owned())
}

/// A [`Layout`] has public fields: check what the table crates would otherwise assert on, or
/// write out of place.
fn check_partitions(layout: &Layout, end_limit: u64) -> Result<(), PartitionError> {
    let ss = layout.sector_size.bytes();
    if layout.partitions.is_empty() {
        return Err(invalid("no partitions"));
    }
    if layout.table == TableKind::Mbr && layout.partitions.len() > 4 {
        return Err(PartitionError::TooManyMbrPartitions(
            layout.partitions.len(),
        ));
    }
    let mut prev_end = HEAD_REGION_LEN / ss;
    for (i, p) in layout.partitions.iter().enumerate() {
        let end = p.first_lba.checked_add(p.sectors);
        let fits = p.number as usize == i + 1
            && p.sectors > 0
            && p.first_lba >= prev_end
            && end.is_some_and(|end| end.checked_mul(ss).is_some_and(|b| b <= end_limit));
        if !fits {
            return Err(PartitionError::InvalidLayout(format!(
                "partition {} (sectors {}+{}) is out of order, empty, or outside the disk's \
                 usable area",
                p.number, p.first_lba, p.sectors
            )));
        }
        prev_end = end.unwrap_or(u64::MAX);
        if layout.table == TableKind::Mbr && prev_end > u64::from(u32::MAX) {
            return Err(PartitionError::BeyondMbrLimit {
                number: p.number,
                end_sector: prev_end,
            });
        }
    }
    Ok(())
}

fn write_mbr(layout: &Layout, ids: &DiskIds, disk: &mut WindowDisk) -> Result<(), PartitionError> {
    let ss = u32::try_from(layout.sector_size.bytes()).map_err(|_| invalid("sector size"))?;
    let mut mbr = mbrman::MBR::new_from(disk, ss, ids.mbr_signature.to_le_bytes())
        .map_err(PartitionError::Mbr)?;
    for p in &layout.partitions {
        // check_partitions kept every end below 2^32 sectors.
        let start = u32::try_from(p.first_lba).map_err(|_| invalid("MBR start"))?;
        let sectors = u32::try_from(p.sectors).map_err(|_| invalid("MBR length"))?;
        let entry = mbr
            .header
            .get_mut(p.number as usize)
            .ok_or(PartitionError::TooManyMbrPartitions(p.number as usize))?;
        *entry = mbrman::MBRPartitionEntry {
            boot: if p.role == Role::Root {
                mbrman::BOOT_ACTIVE
            } else {
                mbrman::BOOT_INACTIVE
            },
            first_chs: chs(start),
            sys: match p.role {
                Role::Efi => 0xEF,
                Role::Swap => 0x82,
                Role::Ephemeral | Role::ConfigDrive | Role::Root => 0x83,
            },
            last_chs: chs(start + (sectors - 1)),
            starting_lba: start,
            sectors,
        };
    }
    mbr.write_into(disk).map_err(PartitionError::Mbr)
}

/// The CHS address of `lba` in the usual LBA-assist geometry (255 heads, 63 sectors per track),
/// or 1023/254/63 past what CHS can address, as fdisk and parted write it. Nothing reads it on a
/// machine that boots Linux, but some BIOSes check it.
fn chs(lba: u32) -> mbrman::CHS {
    const HEADS: u32 = 255;
    const SECTORS: u32 = 63;
    let cylinder = lba / (HEADS * SECTORS);
    if cylinder > 1023 {
        return mbrman::CHS::new(1023, 254, 63);
    }
    // cylinder <= 1023, head < 255 and sector <= 63 by the arithmetic above.
    mbrman::CHS::new(
        cylinder as u16,
        ((lba / SECTORS) % HEADS) as u8,
        (lba % SECTORS + 1) as u8,
    )
}

fn write_gpt(
    layout: &Layout,
    ids: &DiskIds,
    disk: WindowDisk,
) -> Result<WindowDisk, PartitionError> {
    let block_size = match layout.sector_size {
        SectorSize::B512 => gpt::disk::LogicalBlockSize::Lb512,
        SectorSize::B4096 => gpt::disk::LogicalBlockSize::Lb4096,
    };
    let mut table = gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(block_size)
        .create_from_device(disk, Some(ids.disk_guid))
        .map_err(PartitionError::Gpt)?;
    let mut entries = BTreeMap::new();
    for p in &layout.partitions {
        let part_guid = *ids
            .partition_guids
            .get(p.number as usize - 1)
            .ok_or(PartitionError::MissingPartitionGuid(p.number))?;
        let part_type_guid = match p.role {
            Role::Efi => gpt::partition_types::EFI,
            Role::Swap => gpt::partition_types::LINUX_SWAP,
            Role::Ephemeral | Role::ConfigDrive | Role::Root => gpt::partition_types::LINUX_FS,
        };
        entries.insert(
            p.number,
            gpt::partition::Partition {
                part_type_guid,
                part_guid,
                first_lba: p.first_lba,
                last_lba: p.first_lba + p.sectors - 1,
                flags: 0,
                name: p.role.name().to_owned(),
            },
        );
    }
    table
        .update_partitions(entries)
        .map_err(PartitionError::Gpt)?;
    let mut disk = table.write().map_err(PartitionError::Gpt)?;
    // The protective partition covers LBA 1 to the end, or 2^32 - 1 sectors on larger disks
    // (UEFI spec §5.2.3).
    let sectors = layout.disk_bytes / layout.sector_size.bytes();
    let protective = u32::try_from(sectors - 1).unwrap_or(u32::MAX);
    gpt::mbr::ProtectiveMBR::with_lb_size(protective)
        .overwrite_lba0(&mut disk)
        .map_err(PartitionError::ProtectiveMbr)?;
    Ok(disk)
}

/// An in-memory stand-in for a disk of `len` bytes of which only a few windows (the regions to
/// write) are held: reads elsewhere see zeros, writes elsewhere fail, so a table crate that
/// wrote outside the planned regions is caught rather than lost.
struct WindowDisk {
    len: u64,
    pos: u64,
    windows: Vec<(u64, Vec<u8>)>,
}

impl WindowDisk {
    fn new(len: u64, regions: &[(u64, u64)]) -> Self {
        let windows = regions
            .iter()
            .map(|&(offset, size)| (offset, vec![0u8; size as usize]))
            .collect();
        WindowDisk {
            len,
            pos: 0,
            windows,
        }
    }

    /// The window holding `pos`, and `pos`'s index in it.
    fn window_mut(&mut self, pos: u64) -> Option<(&mut Vec<u8>, usize)> {
        self.windows.iter_mut().find_map(|(offset, bytes)| {
            let rel = pos.checked_sub(*offset)?;
            (rel < bytes.len() as u64).then_some((bytes, rel as usize))
        })
    }
}

impl fmt::Debug for WindowDisk {
    // The windows are a MiB each: show where they are, not what they hold.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let windows: Vec<(u64, usize)> = self.windows.iter().map(|(o, b)| (*o, b.len())).collect();
        f.debug_struct("WindowDisk")
            .field("len", &self.len)
            .field("pos", &self.pos)
            .field("windows", &windows)
            .finish()
    }
}

impl Read for WindowDisk {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let pos = self.pos;
        if pos >= self.len || buf.is_empty() {
            return Ok(0);
        }
        let n = if let Some((bytes, rel)) = self.window_mut(pos) {
            let n = buf.len().min(bytes.len() - rel);
            buf[..n].copy_from_slice(&bytes[rel..rel + n]);
            n
        } else {
            // Zeros up to the next window or the end.
            let next = self
                .windows
                .iter()
                .map(|(o, _)| *o)
                .filter(|o| *o > pos)
                .min()
                .unwrap_or(self.len)
                .min(self.len);
            let n = buf
                .len()
                .min(usize::try_from(next - pos).unwrap_or(usize::MAX));
            buf[..n].fill(0);
            n
        };
        self.pos += n as u64;
        Ok(n)
    }
}

impl Write for WindowDisk {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let pos = self.pos;
        let Some((bytes, rel)) = self.window_mut(pos) else {
            return Err(io::Error::other(format!(
                "the table writes {} bytes at {pos}, outside the regions it was given",
                buf.len()
            )));
        };
        if buf.len() > bytes.len() - rel {
            return Err(io::Error::other(format!(
                "the table writes {} bytes at {pos}, past the end of its region",
                buf.len()
            )));
        }
        bytes[rel..rel + buf.len()].copy_from_slice(buf);
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for WindowDisk {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let new = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = new.ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "seek before the disk's start")
        })?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::{plan, LayoutRequest, EFI_SYSTEM_PARTITION_MIB};
    use proptest::prelude::*;
    use std::io::Cursor;

    fn ids() -> DiskIds {
        DiskIds {
            mbr_signature: 0x1234_abcd,
            disk_guid: uuid::Uuid::from_u128(0x0123_4567_89ab_4def_8123_4567_89ab_cdef),
            partition_guids: (1..=5u128)
                .map(|n| uuid::Uuid::from_u128(0xaaaa_0000_0000_4000_8000_0000_0000_0000 + n))
                .collect(),
        }
    }

    fn request(table: TableKind, sector_size: SectorSize) -> LayoutRequest {
        LayoutRequest {
            disk_bytes: 512 * MIB,
            sector_size,
            table,
            efi_mib: if table == TableKind::Gpt {
                EFI_SYSTEM_PARTITION_MIB
            } else {
                0
            },
            ephemeral_mib: 50,
            swap_mib: 20,
            configdrive_bytes: 64 * 1024,
            root_mib: 0,
            image_bytes: 100 * MIB,
            grow_root_to_image: true,
        }
    }

    /// The whole disk in memory with the writes applied.
    fn apply(layout: &Layout, writes: &[TableWrite]) -> Vec<u8> {
        let mut disk = vec![0u8; layout.disk_bytes as usize];
        for w in writes {
            let at = w.offset as usize;
            disk[at..at + w.bytes.len()].copy_from_slice(&w.bytes);
        }
        disk
    }

    #[test]
    fn mbr_reads_back() {
        let layout = plan(&request(TableKind::Mbr, SectorSize::B512)).expect("plan");
        let writes = render(&layout, &ids()).expect("render");
        assert_eq!(writes.len(), 1);
        assert_eq!((writes[0].offset, writes[0].bytes.len() as u64), (0, MIB));
        let disk = apply(&layout, &writes);
        assert_eq!(&disk[440..444], &0x1234_abcdu32.to_le_bytes());
        let mbr = mbrman::MBR::read_from(&mut Cursor::new(&disk), 512).expect("read MBR");
        let got: Vec<_> = mbr
            .iter()
            .filter(|(_, p)| p.is_used())
            .map(|(n, p)| (n, p.sys, p.boot, p.starting_lba, p.sectors))
            .collect();
        let want: Vec<_> = layout
            .partitions
            .iter()
            .map(|p| {
                let boot = if p.role == Role::Root { 0x80 } else { 0 };
                let sys = if p.role == Role::Swap { 0x82 } else { 0x83 };
                (
                    p.number as usize,
                    sys,
                    boot,
                    p.first_lba as u32,
                    p.sectors as u32,
                )
            })
            .collect();
        assert_eq!(got, want);
        assert_eq!(got.len(), 4);
    }

    #[test]
    fn gpt_reads_back_at_both_sector_sizes() {
        for (ss, lb) in [
            (SectorSize::B512, gpt::disk::LogicalBlockSize::Lb512),
            (SectorSize::B4096, gpt::disk::LogicalBlockSize::Lb4096),
        ] {
            let layout = plan(&request(TableKind::Gpt, ss)).expect("plan");
            let writes = render(&layout, &ids()).expect("render");
            assert_eq!(writes.len(), 2);
            for w in &writes {
                assert_eq!(w.offset % 4096, 0);
                assert_eq!(w.bytes.len() as u64 % ss.bytes(), 0);
            }
            let tail = &writes[1];
            assert_eq!(tail.offset + tail.bytes.len() as u64, layout.disk_bytes);
            let root = layout.root().expect("root");
            assert!(tail.offset >= root.end());

            let disk = apply(&layout, &writes);
            let table = gpt::GptConfig::new()
                .writable(false)
                .only_valid_headers(true)
                .logical_block_size(lb)
                .open_from_device(Cursor::new(disk))
                .expect("both GPT headers valid");
            assert_eq!(*table.guid(), ids().disk_guid);
            let got: Vec<_> = table
                .partitions()
                .iter()
                .filter(|(_, p)| p.is_used())
                .map(|(n, p)| {
                    (
                        *n,
                        p.part_guid,
                        p.part_type_guid.clone(),
                        p.first_lba,
                        p.last_lba,
                    )
                })
                .collect();
            let want: Vec<_> = layout
                .partitions
                .iter()
                .map(|p| {
                    let t = match p.role {
                        Role::Efi => gpt::partition_types::EFI,
                        Role::Swap => gpt::partition_types::LINUX_SWAP,
                        _ => gpt::partition_types::LINUX_FS,
                    };
                    let guid = ids().partition_guids[p.number as usize - 1];
                    (p.number, guid, t, p.first_lba, p.first_lba + p.sectors - 1)
                })
                .collect();
            assert_eq!(got, want, "{ss:?}");
            assert_eq!(got.len(), 5);
        }
    }

    #[test]
    fn bad_layouts_and_ids_are_errors() {
        let layout = plan(&request(TableKind::Gpt, SectorSize::B512)).expect("plan");
        let short = DiskIds {
            partition_guids: vec![uuid::Uuid::nil(); 2],
            ..ids()
        };
        assert!(matches!(
            render(&layout, &short),
            Err(PartitionError::MissingPartitionGuid(3))
        ));

        let mut zero_number = layout.clone();
        zero_number.partitions[0].number = 0;
        assert!(matches!(
            render(&zero_number, &ids()),
            Err(PartitionError::InvalidLayout(_))
        ));
        let mut over_backup = layout.clone();
        over_backup.partitions[4].sectors += 2048;
        assert!(matches!(
            render(&over_backup, &ids()),
            Err(PartitionError::InvalidLayout(_))
        ));
        let mut in_head = layout.clone();
        in_head.partitions[0].first_lba = 34;
        assert!(matches!(
            render(&in_head, &ids()),
            Err(PartitionError::InvalidLayout(_))
        ));
        let tiny = Layout {
            disk_bytes: 4096,
            ..layout
        };
        assert!(matches!(
            render(&tiny, &ids()),
            Err(PartitionError::InvalidLayout(_))
        ));
    }

    #[test]
    fn random_ids_differ() {
        let a = DiskIds::random(5).expect("random");
        let b = DiskIds::random(5).expect("random");
        assert_ne!(a, b);
        assert_eq!(a.partition_guids.len(), 5);
        assert_eq!(a.disk_guid.get_version_num(), 4);
        assert_ne!(a.mbr_signature, 0);
    }

    #[test]
    fn chs_matches_fdisk() {
        // fdisk's first partition at 2048: 0/32/33; past 8 GiB: 1023/254/63.
        assert_eq!(chs(2048), mbrman::CHS::new(0, 32, 33));
        assert_eq!(chs(u32::MAX), mbrman::CHS::new(1023, 254, 63));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn render_is_deterministic(
            gpt in any::<bool>(),
            big in any::<bool>(),
            disk_mib in 8u64..4096,
            swap in 0u64..4,
            root_mib in 0u64..4,
        ) {
            let table = if gpt { TableKind::Gpt } else { TableKind::Mbr };
            let ss = if big { SectorSize::B4096 } else { SectorSize::B512 };
            let req = LayoutRequest {
                disk_bytes: disk_mib * MIB + 4096 * u64::from(big) + 512,
                efi_mib: 0,
                ephemeral_mib: 0,
                swap_mib: swap,
                configdrive_bytes: 0,
                root_mib,
                image_bytes: 0,
                ..request(table, ss)
            };
            let layout = plan(&req).expect("small layouts fit");
            let a = render(&layout, &ids()).expect("render");
            let b = render(&layout, &ids()).expect("render");
            prop_assert_eq!(&a, &b);
            for w in &a {
                prop_assert_eq!(w.offset % 4096, 0);
                prop_assert!(w.offset + w.bytes.len() as u64 <= layout.disk_bytes);
            }
        }
    }
}
