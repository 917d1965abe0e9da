//! [`wipe_regions`]: what Ironic zeroes before it partitions.

use super::SectorSize;

/// Bytes Ironic zeroes at each end of the disk before partitioning: `dd bs=512 count=36` at the
/// start and at `blockdev --getsz` - 36 (`destroy_disk_metadata`, `docs/ironic-protocols.md` §2.3).
/// 36 sectors of 512 bytes cover the MBR, the primary GPT header and its 128-entry array at the
/// start, and the backup array and header at the end.
pub const WIPE_BYTES: u64 = 36 * 512;

/// The two `(offset, length)` byte ranges to zero before partitioning: [`WIPE_BYTES`] at the start
/// and at the end of the disk, each aligned out to whole logical sectors (on a 4Kn disk that is
/// 5 sectors, which is exactly its backup GPT), clamped to the disk on tiny disks (the two ranges
/// may then overlap). A trailing partial sector is not part of the disk.
pub fn wipe_regions(disk_bytes: u64, sector_size: SectorSize) -> [(u64, u64); 2] {
    let ss = sector_size.bytes();
    let disk = disk_bytes / ss * ss;
    let len = (WIPE_BYTES.div_ceil(ss) * ss).min(disk);
    [(0, len), (disk - len, len)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn named_cases() {
        let cases = [
            (
                "512 disk",
                1 << 30,
                SectorSize::B512,
                [(0, 18432), ((1 << 30) - 18432, 18432)],
            ),
            (
                "4Kn disk",
                1 << 30,
                SectorSize::B4096,
                [(0, 20480), ((1 << 30) - 20480, 20480)],
            ),
            (
                "partial sector",
                10_000_100,
                SectorSize::B512,
                [(0, 18432), (9_981_440, 18432)],
            ),
            ("tiny", 4096, SectorSize::B512, [(0, 4096), (0, 4096)]),
            ("below a sector", 100, SectorSize::B4096, [(0, 0), (0, 0)]),
        ];
        for (name, disk, ss, want) in cases {
            assert_eq!(wipe_regions(disk, ss), want, "{name}");
        }
    }

    proptest! {
        #[test]
        fn regions_are_whole_sectors_inside_the_disk(disk in any::<u64>(), big in any::<bool>()) {
            let ss = if big { SectorSize::B4096 } else { SectorSize::B512 };
            for (offset, len) in wipe_regions(disk, ss) {
                prop_assert_eq!(offset % ss.bytes(), 0);
                prop_assert_eq!(len % ss.bytes(), 0);
                prop_assert!(offset + len <= disk);
                prop_assert!(len >= WIPE_BYTES.min(disk / ss.bytes() * ss.bytes()));
            }
        }
    }
}
