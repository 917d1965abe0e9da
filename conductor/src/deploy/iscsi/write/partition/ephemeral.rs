//! File systems the conductor makes for the node (the ephemeral partition, `ephemeral0`; the
//! EFI system partition): built with the system's `mkfs.<format>` in a local sparse file of
//! the partition's size, then only the ranges mkfs wrote go over iSCSI.
//!
//! # What a reader of the partition sees
//! The partition on the node still holds old data wherever nothing is written. A file system
//! made by mkfs does not read its free space, but mkfs *does* rely on zeroes it wrote cheaply:
//! on a file, e2fsprogs zeroes the journal with `fallocate` (a hole, or an unwritten extent),
//! and treats a discarded (hole-punched) file as zeroed, skipping the inode tables; mkfs.xfs
//! zeroes its log with `fallocate(ZERO_RANGE)` (an unwritten extent). Skipped, each of those
//! leaves old data where the file system expects zeroes (a journal or log that looks like it
//! needs recovery). So mkfs runs without discard (`-E nodiscard`, `-K`), e2fsprogs with
//! `UNIX_IO_NOZEROOUT` (zeroes written as data), and the ranges sent are the file's data ranges
//! plus its unwritten extents ([`written_ranges`]), which are sent as the zeroes they read as.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

pub use vmdeploy_shared::partition::{FsFormat, EFI_LABEL, EPHEMERAL_LABEL};

/// The Debian package that has `format`'s mkfs.
const fn package(format: FsFormat) -> &'static str {
    match format {
        FsFormat::Ext2 | FsFormat::Ext3 | FsFormat::Ext4 => "e2fsprogs",
        FsFormat::Xfs => "xfsprogs",
        FsFormat::Vfat => "dosfstools",
    }
}

/// The mkfs command for a `format` file system labelled `label` in `file` (see the module docs
/// for the options that keep mkfs from relying on zeroes it did not write).
fn mkfs_command(format: FsFormat, label: &str, file: &Path) -> Command {
    let mut cmd = Command::new(format!("mkfs.{}", format.name()));
    match format {
        FsFormat::Ext2 | FsFormat::Ext3 | FsFormat::Ext4 => {
            cmd.args(["-F", "-q", "-E", "nodiscard", "-L", label])
                .env("UNIX_IO_NOZEROOUT", "1");
        }
        FsFormat::Xfs => {
            cmd.args(["-q", "-f", "-K", "-L", label]);
        }
        FsFormat::Vfat => {
            cmd.args(["-n", label]);
        }
    }
    cmd.arg(file);
    cmd
}

/// A file system made in a local file, removed (with its directory) on drop.
#[derive(Debug)]
pub struct BuiltFs {
    dir: PathBuf,
    /// The file holding the file system (the partition's size).
    pub path: PathBuf,
    /// The byte ranges of `path` to write to the partition, in order.
    pub ranges: Vec<(u64, u64)>,
}

impl Drop for BuiltFs {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "removing a scratch file system");
        }
    }
}

/// Makes a `format` file system labelled `label` of `len` bytes in a new scratch directory under
/// `parent`, and lists the ranges to write ([`written_ranges`]). Blocking: runs mkfs.
pub fn build(parent: &Path, format: FsFormat, label: &str, len: u64) -> anyhow::Result<BuiltFs> {
    let mut suffix = [0u8; 8];
    getrandom::fill(&mut suffix).map_err(|e| anyhow::anyhow!("reading random bytes: {e}"))?;
    let dir = parent.join(format!(".mkfs-{}", hex::encode(suffix)));
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating a scratch directory {}", dir.display()))?;
    let mut built = BuiltFs {
        path: dir.join(format!("{label}.img")),
        dir,
        ranges: Vec::new(),
    };
    File::create(&built.path)
        .and_then(|f| f.set_len(len))
        .with_context(|| {
            format!(
                "creating a {len}-byte scratch file {}",
                built.path.display()
            )
        })?;
    let mut cmd = mkfs_command(format, label, &built.path);
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "mkfs.{} is not installed on the conductor (Debian package {}), which a {} file \
             system needs",
            format.name(),
            package(format),
            format.name()
        ),
        Err(e) => return Err(e).with_context(|| format!("running mkfs.{}", format.name())),
    };
    if !out.status.success() {
        bail!(
            "mkfs.{} of a {len}-byte {label} file system failed ({}): {}",
            format.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let file =
        File::open(&built.path).with_context(|| format!("opening {}", built.path.display()))?;
    built.ranges = written_ranges(&file)
        .with_context(|| format!("listing the written ranges of {}", built.path.display()))?;
    Ok(built)
}

/// The ranges of `file` that mkfs wrote: its data ranges (`SEEK_DATA`/`SEEK_HOLE`, the image
/// cache's [`crate::image_cache::sparse::data_ranges`]) merged with its unwritten extents
/// (`FIEMAP`: space `fallocate` zeroed, which `SEEK_DATA` reports as a hole).
pub fn written_ranges(file: &File) -> std::io::Result<Vec<(u64, u64)>> {
    let mut ranges = crate::image_cache::sparse::data_ranges(file)?;
    ranges.extend(unwritten_extents(file)?);
    Ok(merge(ranges))
}

/// Sorts and merges overlapping or touching ranges.
fn merge(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.retain(|r| r.1 > 0);
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, len) in ranges {
        match out.last_mut() {
            Some((s, l)) if *s + *l >= start => *l = (*l).max(start + len - *s),
            _ => out.push((start, len)),
        }
    }
    out
}

// linux/fiemap.h
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
const FIEMAP_FLAG_SYNC: u32 = 0x1;
const FIEMAP_EXTENT_LAST: u32 = 0x1;
const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
const FIEMAP_HEADER: usize = 32;
const FIEMAP_EXTENT: usize = 56;
const EXTENTS_PER_CALL: usize = 256;

/// The unwritten (allocated, reading as zero) extents of `file`, clamped to its size. A file
/// system without FIEMAP has none to report (tmpfs: no `ZERO_RANGE` either, so mkfs wrote its
/// zeroes as data).
fn unwritten_extents(file: &File) -> std::io::Result<Vec<(u64, u64)>> {
    use std::os::unix::io::AsRawFd as _;
    let size = file.metadata()?.len();
    let mut out = Vec::new();
    let mut start = 0u64;
    // u64 words keep the buffer aligned for the kernel's struct.
    let mut buf = vec![0u64; (FIEMAP_HEADER + EXTENTS_PER_CALL * FIEMAP_EXTENT) / 8];
    while start < size {
        buf.fill(0);
        buf[0] = start;
        buf[1] = u64::MAX - start;
        // fm_flags (low half of word 2), fm_extent_count (low half of word 3).
        buf[2] = u64::from(FIEMAP_FLAG_SYNC);
        buf[3] = EXTENTS_PER_CALL as u64;
        // SAFETY: FS_IOC_FIEMAP reads the header and writes at most fm_extent_count extents
        // into `buf`, which is sized for exactly that many; `file` stays open for the call.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, buf.as_mut_ptr()) };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EOPNOTSUPP | libc::ENOTTY) => Ok(out),
                _ => Err(err),
            };
        }
        let mapped = (buf[2] >> 32) as usize;
        if mapped == 0 {
            break;
        }
        let mut last = false;
        for i in 0..mapped.min(EXTENTS_PER_CALL) {
            let w = (FIEMAP_HEADER + i * FIEMAP_EXTENT) / 8;
            let (logical, length) = (buf[w], buf[w + 2]);
            let flags = (buf[w + 5] & 0xffff_ffff) as u32;
            if flags & FIEMAP_EXTENT_UNWRITTEN != 0 && logical < size {
                out.push((logical, length.min(size - logical)));
            }
            start = logical.saturating_add(length);
            last = flags & FIEMAP_EXTENT_LAST != 0;
        }
        if last {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_name() {
        for f in FsFormat::ALL {
            assert_eq!(FsFormat::parse(f.name()), Some(f));
            assert_eq!(FsFormat::parse(&f.name().to_uppercase()), Some(f));
        }
        assert_eq!(FsFormat::parse("fat32"), Some(FsFormat::Vfat));
        assert_eq!(FsFormat::parse("ntfs"), None);
        assert_eq!(FsFormat::parse(""), None);
    }

    #[test]
    fn merge_sorts_and_joins() {
        assert_eq!(
            merge(vec![(100, 10), (0, 10), (10, 5), (105, 20), (50, 0)]),
            vec![(0, 15), (100, 25)]
        );
    }

    #[test]
    fn unwritten_extents_are_written_ranges() {
        // A zeroed (fallocated) range reads as a hole to SEEK_DATA but must be written.
        // /var/tmp: a disk file system with FIEMAP (/tmp may be a tmpfs, which has none).
        let dir = tempfile::tempdir_in("/var/tmp").expect("temp dir");
        let path = dir.path().join("f");
        let file = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .expect("file");
        file.set_len(8 << 20).expect("size");
        use std::os::unix::fs::FileExt as _;
        file.write_all_at(&[1u8; 4096], 0).expect("data");
        use std::os::unix::io::AsRawFd as _;
        // SAFETY: fallocate on an open file; no memory is passed.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 1 << 20, 1 << 20) };
        assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
        let ranges = written_ranges(&file).expect("ranges");
        assert_eq!(ranges, vec![(0, 4096), (1 << 20, 1 << 20)]);
    }
}
