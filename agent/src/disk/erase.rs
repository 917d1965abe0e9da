//! `erase_devices_metadata`: make a disk look blank without writing all of it (Ironic's default
//! automated clean step; ironic-lib `destroy_disk_metadata` runs `wipefs --all` and zaps both
//! GPTs; docs/ironic-protocols.md §2.3 for the 36-sector wipe of the Kilo era).
//!
//! # Design
//! The partition table is read first, from the disk itself ([`partitions`]): the MBR (with the
//! chain of extended boot records) or the GPT (primary header, else the backup in the last
//! block), without checking CRCs, as a damaged table must still be erased (the sgdisk failure on
//! a CRC error that IPA bug 1737556 describes). Then, for each partition, the first and the last
//! [`PART_WIPE_LEN`] bytes are zeroed: every signature `blkid` probes for lies there (ext2/3/4
//! superblock at 1 KiB, XFS at 0, swap in the first page, LVM2 label in the first four sectors,
//! btrfs at 64 KiB, ISO 9660 at 32 KiB, md 1.1/1.2 at 0/4 KiB, md 0.90 and 1.0 in the last
//! 64 KiB-aligned block, ZFS labels in the first and last 512 KiB). Last, the disk's own first
//! and last [`DISK_WIPE_LEN`] (MBR, primary GPT and the boot loader's embedding area; backup
//! GPT and the metadata RAID/LVM keep at the end). Partitions go first so that a failure half
//! way leaves the table, and a second run finds the same partitions again.
//!
//! Writes go through [`Disk`]: aligned, whole blocks `O_DIRECT` from an aligned zero buffer;
//! then `fdatasync` and a partition table re-read. Nothing else of the disk is touched.
//!
//! # Limitations
//! Only the disk given (the install disk the root device hints pick), not every disk of the
//! node as IPA does. Partition ranges are clamped to the disk; an entry past its end is
//! skipped and reported.

use std::io;

use super::buffer::AlignedBuf;
use super::Disk;

/// Zeroed at each end of every partition.
pub const PART_WIPE_LEN: u64 = 1024 * 1024;
/// Zeroed at each end of the disk.
pub const DISK_WIPE_LEN: u64 = 1024 * 1024;

/// What [`erase_metadata`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EraseReport {
    /// The table it found: `mbr`, `gpt` or `none`.
    pub table: &'static str,
    /// The partitions whose ends were zeroed, as byte ranges `(start, len)`.
    pub partitions: Vec<(u64, u64)>,
    /// Entries that pointed outside the disk (not touched).
    pub skipped: usize,
    /// Bytes written.
    pub zeroed: u64,
}

/// Erases the metadata of `disk`; see the module documentation.
pub fn erase_metadata(disk: &Disk) -> io::Result<EraseReport> {
    let size = disk.geometry().size;
    let block = u64::from(disk.block_len());
    let table = partitions::read(disk, size, block)?;
    let zeros = AlignedBuf::zeroed(PART_WIPE_LEN.max(DISK_WIPE_LEN) as usize);
    let mut zeroed = 0u64;
    let mut wiped = Vec::new();
    let mut skipped = 0;
    for &(start, len) in &table.partitions {
        let Some(len) = size.checked_sub(start).map(|room| room.min(len)) else {
            skipped += 1;
            continue;
        };
        if len == 0 {
            skipped += 1;
            continue;
        }
        for (offset, n) in ends(start, len, PART_WIPE_LEN) {
            zero(disk, &zeros, offset, n)?;
            zeroed += n;
        }
        wiped.push((start, len));
    }
    for (offset, n) in ends(0, size, DISK_WIPE_LEN) {
        zero(disk, &zeros, offset, n)?;
        zeroed += n;
    }
    disk.sync()?;
    disk.reread_partition_table();
    Ok(EraseReport {
        table: table.kind,
        partitions: wiped,
        skipped,
        zeroed,
    })
}

/// The ranges to zero at both ends of `[start, start + len)`, `wipe` bytes each; one range when
/// they meet.
fn ends(start: u64, len: u64, wipe: u64) -> Vec<(u64, u64)> {
    if len <= 2 * wipe {
        return vec![(start, len)];
    }
    vec![(start, wipe), (start + len - wipe, wipe)]
}

/// Writes `len` zero bytes at `offset`, in pieces of the buffer's size.
fn zero(disk: &Disk, zeros: &AlignedBuf, offset: u64, len: u64) -> io::Result<()> {
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(zeros.len() as u64) as usize;
        disk.write_at(&zeros[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

/// Reading MBR and GPT partition tables, just enough to find where partitions lie.
pub mod partitions {
    use std::io;

    use super::super::buffer::AlignedBuf;
    use super::Disk;

    /// MBR: offset of the first of the four partition entries.
    const MBR_ENTRIES_OFFSET: usize = 446;
    /// MBR: length of one entry.
    const MBR_ENTRY_LEN: usize = 16;
    /// MBR entry: partition type byte.
    const MBR_TYPE_OFFSET: usize = 4;
    /// MBR entry: first LBA (u32 LE).
    const MBR_START_OFFSET: usize = 8;
    /// MBR entry: sector count (u32 LE).
    const MBR_SECTORS_OFFSET: usize = 12;
    /// MBR: boot signature offset (0x55 0xAA).
    const MBR_SIGNATURE_OFFSET: usize = 510;
    /// The protective MBR's partition type: a GPT follows.
    const TYPE_GPT_PROTECTIVE: u8 = 0xEE;
    /// Extended partition types (CHS, LBA, Linux): their boot records chain logical partitions.
    const TYPES_EXTENDED: [u8; 3] = [0x05, 0x0F, 0x85];
    /// Most logical partitions followed in an EBR chain (a loop in a corrupt chain ends here).
    const MAX_LOGICAL: usize = 128;

    /// GPT header signature.
    const GPT_SIGNATURE: &[u8; 8] = b"EFI PART";
    /// GPT header: first LBA of the entry array (u64 LE).
    const GPT_ENTRIES_LBA_OFFSET: usize = 72;
    /// GPT header: number of entries (u32 LE).
    const GPT_ENTRY_COUNT_OFFSET: usize = 80;
    /// GPT header: size of one entry (u32 LE).
    const GPT_ENTRY_SIZE_OFFSET: usize = 84;
    /// GPT entry: partition type GUID (all zero: unused).
    const GPT_ENTRY_TYPE_LEN: usize = 16;
    /// GPT entry: first LBA (u64 LE).
    const GPT_ENTRY_FIRST_OFFSET: usize = 32;
    /// GPT entry: last LBA, inclusive (u64 LE).
    const GPT_ENTRY_LAST_OFFSET: usize = 40;
    /// Largest entry array read (UEFI's default is 128 × 128 bytes = 16 KiB).
    const GPT_MAX_ARRAY: u64 = 1024 * 1024;

    /// A disk's partitions, as byte ranges.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Table {
        /// `mbr`, `gpt` or `none`.
        pub kind: &'static str,
        /// `(start, len)` in bytes.
        pub partitions: Vec<(u64, u64)>,
    }

    fn le32(b: &[u8], at: usize) -> u64 {
        u64::from(u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]))
    }

    fn le64(b: &[u8], at: usize) -> u64 {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(v)
    }

    /// The partitions of `disk` (`size` bytes, `block`-byte logical blocks).
    pub fn read(disk: &Disk, size: u64, block: u64) -> io::Result<Table> {
        let none = Table {
            kind: "none",
            partitions: Vec::new(),
        };
        let Some(mbr) = read_bytes(disk, size, 0, 512)? else {
            return Ok(none);
        };
        let has_mbr = mbr[MBR_SIGNATURE_OFFSET] == 0x55 && mbr[MBR_SIGNATURE_OFFSET + 1] == 0xAA;
        let protective = has_mbr
            && (0..4).any(|i| {
                mbr[MBR_ENTRIES_OFFSET + i * MBR_ENTRY_LEN + MBR_TYPE_OFFSET] == TYPE_GPT_PROTECTIVE
            });
        // A GPT is looked for even without a protective MBR (a zeroed first sector leaves the
        // GPT header in LBA 1 readable, and its partitions' signatures in place).
        if let Some(parts) = gpt(disk, size, block)? {
            return Ok(Table {
                kind: "gpt",
                partitions: parts,
            });
        }
        if has_mbr && !protective {
            return Ok(Table {
                kind: "mbr",
                partitions: mbr_partitions(disk, size, &mbr)?,
            });
        }
        Ok(none)
    }

    /// Reads `len` bytes at `offset`, or `None` past the end of the disk.
    fn read_bytes(
        disk: &Disk,
        size: u64,
        offset: u64,
        len: usize,
    ) -> io::Result<Option<AlignedBuf>> {
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Ok(None);
        }
        let mut buf = AlignedBuf::zeroed(len);
        disk.read_at(&mut buf, offset)?;
        Ok(Some(buf))
    }

    /// The used entries of an MBR (512-byte sectors, as MBR LBAs are), logical partitions of
    /// an extended one included; the extended container itself counts too (its first sector
    /// holds the chain).
    fn mbr_partitions(disk: &Disk, size: u64, mbr: &[u8]) -> io::Result<Vec<(u64, u64)>> {
        const SECTOR: u64 = 512;
        let mut out = Vec::new();
        for i in 0..4 {
            let e = MBR_ENTRIES_OFFSET + i * MBR_ENTRY_LEN;
            let kind = mbr[e + MBR_TYPE_OFFSET];
            let start = le32(mbr, e + MBR_START_OFFSET);
            let sectors = le32(mbr, e + MBR_SECTORS_OFFSET);
            if kind == 0 || sectors == 0 {
                continue;
            }
            out.push((start * SECTOR, sectors * SECTOR));
            if TYPES_EXTENDED.contains(&kind) {
                // Each EBR: entry 0 is the logical partition (relative to this EBR), entry 1
                // points at the next EBR (relative to the extended partition's start).
                let mut ebr_lba = start;
                for _ in 0..MAX_LOGICAL {
                    let Some(ebr) = read_bytes(disk, size, ebr_lba * SECTOR, 512)? else {
                        break;
                    };
                    if ebr[MBR_SIGNATURE_OFFSET] != 0x55 || ebr[MBR_SIGNATURE_OFFSET + 1] != 0xAA {
                        break;
                    }
                    let l = MBR_ENTRIES_OFFSET;
                    let l_start = le32(&ebr, l + MBR_START_OFFSET);
                    let l_sectors = le32(&ebr, l + MBR_SECTORS_OFFSET);
                    if ebr[l + MBR_TYPE_OFFSET] != 0 && l_sectors != 0 {
                        out.push(((ebr_lba + l_start) * SECTOR, l_sectors * SECTOR));
                    }
                    let n = MBR_ENTRIES_OFFSET + MBR_ENTRY_LEN;
                    let next = le32(&ebr, n + MBR_START_OFFSET);
                    if ebr[n + MBR_TYPE_OFFSET] == 0 || next == 0 {
                        break;
                    }
                    ebr_lba = start + next;
                }
            }
        }
        Ok(out)
    }

    /// The used entries of the GPT, from the primary header at LBA 1, else the backup in the
    /// last block; tried with the disk's block size, then 512 and 4096 (an image written for
    /// another sector size). `None` when no header is found.
    fn gpt(disk: &Disk, size: u64, block: u64) -> io::Result<Option<Vec<(u64, u64)>>> {
        let mut sizes = vec![block];
        for b in [512, 4096] {
            if !sizes.contains(&b) {
                sizes.push(b);
            }
        }
        for lb in sizes {
            let blocks = size / lb;
            if blocks < 2 {
                continue;
            }
            for header_lba in [1, blocks - 1] {
                let Some(h) = read_bytes(disk, size, header_lba * lb, lb as usize)? else {
                    continue;
                };
                if &h[..8] != GPT_SIGNATURE {
                    continue;
                }
                let entries_lba = le64(&h, GPT_ENTRIES_LBA_OFFSET);
                let count = le32(&h, GPT_ENTRY_COUNT_OFFSET);
                let entry_len = le32(&h, GPT_ENTRY_SIZE_OFFSET);
                if entry_len < 128 || count == 0 {
                    continue;
                }
                let array = (count * entry_len).min(GPT_MAX_ARRAY);
                // Whole blocks, so the read stays aligned.
                let array = array.div_ceil(lb) * lb;
                let Some(offset) = entries_lba.checked_mul(lb) else {
                    continue;
                };
                let Some(a) = read_bytes(disk, size, offset, array as usize)? else {
                    continue;
                };
                let mut out = Vec::new();
                for e in a.chunks_exact(entry_len as usize) {
                    if e[..GPT_ENTRY_TYPE_LEN].iter().all(|&b| b == 0) {
                        continue;
                    }
                    let first = le64(e, GPT_ENTRY_FIRST_OFFSET);
                    let last = le64(e, GPT_ENTRY_LAST_OFFSET);
                    if last < first {
                        continue;
                    }
                    let (Some(start), Some(len)) =
                        (first.checked_mul(lb), (last - first + 1).checked_mul(lb))
                    else {
                        continue;
                    };
                    out.push((start, len));
                }
                return Ok(Some(out));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    const MIB: u64 = 1024 * 1024;

    /// Runs a system tool; fails with a fix hint when it is missing.
    fn run(tool: &str, args: &[&str]) -> std::process::Output {
        Command::new(tool).args(args).output().unwrap_or_else(|e| {
            panic!("running {tool}: {e}; install it (apt-get install util-linux gdisk xfsprogs e2fsprogs)")
        })
    }

    fn ok(tool: &str, args: &[&str]) {
        let out = run(tool, args);
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// What `blkid -p` finds in `len` bytes at `offset` of `path` (empty: nothing).
    fn probe(path: &Path, offset: u64, len: Option<u64>) -> String {
        let (o, l) = (offset.to_string(), len.map(|l| l.to_string()));
        let mut args = vec!["-p", "-o", "export", "-O", &o];
        if let Some(l) = &l {
            args.extend(["-S", l]);
        }
        let p = path.to_str().expect("utf-8 path");
        args.push(p);
        let out = run("blkid", &args);
        // 2: nothing found; 0: found; anything else is a probing error.
        match out.status.code() {
            Some(0) => String::from_utf8_lossy(&out.stdout).into_owned(),
            Some(2) => String::new(),
            other => panic!(
                "blkid {args:?} exited {other:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }

    /// A file system made by the system's mkfs in a file of `len` bytes, copied into `disk` at
    /// `offset` (zero chunks skipped: the disk file stays sparse).
    fn mkfs_into(dir: &Path, disk: &Path, offset: u64, len: u64, mkfs: &[&str]) {
        let img = dir.join("fs.img");
        let f = std::fs::File::create(&img).expect("fs image");
        f.set_len(len).expect("sizing the fs image");
        drop(f);
        let (tool, args) = mkfs.split_first().expect("a command");
        let mut args = args.to_vec();
        let shown = img.to_str().expect("utf-8 path");
        args.push(shown);
        ok(tool, &args);
        let data = std::fs::read(&img).expect("reading the fs image");
        let out = std::fs::OpenOptions::new()
            .write(true)
            .open(disk)
            .expect("opening the disk file");
        use std::os::unix::fs::FileExt;
        for (i, chunk) in data.chunks(64 * 1024).enumerate() {
            if chunk.iter().any(|&b| b != 0) {
                out.write_all_at(chunk, offset + (i * 64 * 1024) as u64)
                    .expect("copying the fs");
            }
        }
        std::fs::remove_file(&img).expect("removing the fs image");
    }

    /// A sparse disk file of `len` bytes in a directory that accepts O_DIRECT (not tmpfs).
    fn disk_file(len: u64) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::Builder::new()
            .prefix("vmdeploy-erase-test")
            .tempdir_in("/var/tmp")
            .expect("scratch dir in /var/tmp");
        let path = dir.path().join("disk.img");
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(len))
            .expect("disk file");
        (dir, path)
    }

    /// The partitions of the tests: ext4, swap and XFS (mkfs.xfs wants at least 300 MB).
    const PARTS: [(u64, u64); 3] = [(MIB, 32 * MIB), (33 * MIB, 16 * MIB), (49 * MIB, 310 * MIB)];
    const DISK_LEN: u64 = 400 * MIB;

    /// Makes the three file systems, writes a pattern in the middle of the XFS partition, erases
    /// and checks: no signature on the disk or at any former partition, pattern intact.
    fn erase_and_check(dir: &Path, path: &Path, table: &str) {
        mkfs_into(
            dir,
            path,
            PARTS[0].0,
            PARTS[0].1,
            &["mkfs.ext4", "-q", "-F"],
        );
        mkfs_into(dir, path, PARTS[1].0, PARTS[1].1, &["mkswap"]);
        mkfs_into(dir, path, PARTS[2].0, PARTS[2].1, &["mkfs.xfs", "-q", "-f"]);
        for ((offset, len), want) in PARTS.into_iter().zip(["ext4", "swap", "xfs"]) {
            let found = probe(path, offset, Some(len));
            assert!(found.contains(&format!("TYPE={want}")), "before: {found}");
        }
        assert!(probe(path, 0, None).contains(&format!("PTTYPE={table}")));
        let middle = PARTS[2].0 + 150 * MIB;
        let pattern: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .expect("open");
            f.write_all_at(&pattern, middle).expect("pattern");
        }

        let disk = Disk::open(path).expect("opening the disk");
        assert!(disk.is_direct(), "/var/tmp accepts O_DIRECT");
        let report = erase_metadata(&disk).expect("erasing");
        let expected_table = if table == "dos" { "mbr" } else { "gpt" };
        assert_eq!(report.table, expected_table);
        assert_eq!(report.partitions, PARTS.to_vec());
        assert_eq!(report.skipped, 0);
        assert_eq!(report.zeroed, (3 * 2 + 2) * MIB);
        drop(disk);

        assert_eq!(probe(path, 0, None), "", "the disk is blank to blkid");
        for (offset, len) in PARTS {
            assert_eq!(probe(path, offset, Some(len)), "", "at {offset}");
        }
        let back = std::fs::read(path).expect("reading back");
        let m = middle as usize;
        assert_eq!(
            &back[m..m + MIB as usize],
            &pattern[..],
            "the middle is intact"
        );
        // The first and last MiB are zero; a byte of the XFS partition's body is not.
        assert!(back[..MIB as usize].iter().all(|&b| b == 0));
        assert!(back[(DISK_LEN - MIB) as usize..].iter().all(|&b| b == 0));
        // A second run finds no table and only clears the disk's ends again.
        let disk = Disk::open(path).expect("reopening");
        let again = erase_metadata(&disk).expect("erasing again");
        assert_eq!(again.table, "none");
        assert_eq!(again.zeroed, 2 * MIB);
    }

    #[test]
    fn mbr_disk_with_ext4_swap_and_xfs_is_left_blank() {
        let (dir, path) = disk_file(DISK_LEN);
        let layout = PARTS
            .iter()
            .map(|(s, l)| format!("start={}, size={}, type=83", s / 512, l / 512))
            .collect::<Vec<_>>()
            .join("\n");
        let mut child = Command::new("sfdisk")
            .args(["--quiet", path.to_str().expect("utf-8")])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("running sfdisk; install it (apt-get install fdisk)");
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(format!("label: dos\n{layout}\n").as_bytes())
            .expect("writing the layout");
        assert!(child.wait().expect("sfdisk").success());
        erase_and_check(dir.path(), &path, "dos");
    }

    #[test]
    fn gpt_disk_with_ext4_swap_and_xfs_is_left_blank() {
        let (dir, path) = disk_file(DISK_LEN);
        let p = path.to_str().expect("utf-8");
        let mut args = vec!["-o".to_owned()];
        for (i, (s, l)) in PARTS.iter().enumerate() {
            args.push(format!("-n={}:{}:{}", i + 1, s / 512, (s + l) / 512 - 1));
        }
        args.push(p.to_owned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok("sgdisk", &args);
        erase_and_check(dir.path(), &path, "gpt");
        // sgdisk finds neither header: it makes a new, empty table in memory.
        let out = run("sgdisk", &["-p", p]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("Creating new GPT entries"),
            "sgdisk -p after the erase: {text}"
        );
    }

    #[test]
    fn ranges_at_the_ends_meet_on_small_partitions() {
        assert_eq!(ends(0, 10 * MIB, MIB), vec![(0, MIB), (9 * MIB, MIB)]);
        assert_eq!(ends(4096, MIB + 512, MIB), vec![(4096, MIB + 512)]);
        assert_eq!(ends(0, 2 * MIB, MIB), vec![(0, 2 * MIB)]);
    }

    #[test]
    fn a_table_pointing_past_the_disk_is_clamped_and_no_table_is_fine() {
        let (_dir, path) = disk_file(8 * MIB);
        // MBR with one partition at 1 MiB that claims 1 TiB, and one starting past the end.
        let mut mbr = vec![0u8; 512];
        let e = 446;
        mbr[e + 4] = 0x83;
        mbr[e + 8..e + 12].copy_from_slice(&2048u32.to_le_bytes());
        mbr[e + 12..e + 16].copy_from_slice(&(1u32 << 31).to_le_bytes());
        let e = 446 + 16;
        mbr[e + 4] = 0x83;
        mbr[e + 8..e + 12].copy_from_slice(&(1u32 << 30).to_le_bytes());
        mbr[e + 12..e + 16].copy_from_slice(&2048u32.to_le_bytes());
        mbr[510] = 0x55;
        mbr[511] = 0xAA;
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .expect("open");
            f.write_all_at(&mbr, 0).expect("mbr");
            f.write_all_at(&[0xAB; 4096], 4 * MIB).expect("marker");
        }
        let disk = Disk::open(&path).expect("open");
        let report = erase_metadata(&disk).expect("erase");
        assert_eq!(report.table, "mbr");
        assert_eq!(report.partitions, vec![(MIB, 7 * MIB)]);
        assert_eq!(report.skipped, 1);
        let back = std::fs::read(&path).expect("read");
        // A 7 MiB partition: its first and last MiB zeroed, 4 MiB (in its middle) untouched.
        assert!(back[4 * MIB as usize..4 * MIB as usize + 4096]
            .iter()
            .all(|&b| b == 0xAB));
        let report = erase_metadata(&disk).expect("erase a blank disk");
        assert_eq!((report.table, report.zeroed), ("none", 2 * MIB));
    }
}
