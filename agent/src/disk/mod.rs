//! The target disk: opening it for O_DIRECT (or buffered) writes, the aligned write pipeline, and
//! the first-MiB-last rule.
//!
//! # Design
//! - [`DiskWriter`] is the strategy enum (STYLE.md §2): [`DirectWriter`] writes with `O_DIRECT`
//!   from aligned buffers, so a multi-GiB image does not pass through (and evict) the page cache and
//!   the agent's memory stays bounded; [`BufferedWriter`] is for regular files on filesystems
//!   where `O_DIRECT` gives `EINVAL` (tmpfs) and for tests.
//! - [`sink::ImageSink`] is the end of the stream chain: the source is read straight into aligned
//!   4 MiB blocks ([`sink::ImageSink::fill_from`]), which go over a bounded queue to two writer
//!   threads (and, for uncompressed images, to a hashing thread at the same time), so receiving,
//!   hashing and disk writes overlap on two cores; it holds the first MiB back until the caller
//!   has verified the checksum.
//!
//! # Limitations
//! Writes are positioned (`pwrite`), two in flight; the pool is 4 blocks (16 MiB).

pub mod select;
pub mod sink;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::sys;

/// Memory alignment of every buffer handed to an `O_DIRECT` write: 4096 covers every logical
/// block size Linux supports for O_DIRECT on block devices (512 or 4096) and page-aligned
/// filesystems.
pub const MEM_ALIGN: usize = 4096;

/// Bytes at the start of the disk held back until the image is verified: the MBR, the primary
/// GPT and the boot loader's embedding area all live in the first MiB, so a disk whose first MiB
/// is zero does not boot (DESIGN.md §1, "first MiB written last").
pub const HEAD_LEN: usize = 1024 * 1024;

/// A disk (block device or image file) opened for writing, in one of two strategies.
#[derive(Debug)]
pub enum DiskWriter {
    /// `O_DIRECT` writes of aligned blocks.
    Direct(DirectWriter),
    /// Ordinary page-cache writes (files on tmpfs, tests).
    Buffered(BufferedWriter),
}

/// A file descriptor opened with `O_DIRECT`, and its alignment.
#[derive(Debug)]
pub struct DirectWriter {
    file: File,
    path: PathBuf,
    /// Offsets and lengths of direct writes must be multiples of this.
    block_size: usize,
    block_device: bool,
}

/// A file descriptor opened without `O_DIRECT`.
#[derive(Debug)]
pub struct BufferedWriter {
    file: File,
    path: PathBuf,
    block_device: bool,
}

impl DiskWriter {
    /// Opens `path` read-write, with `O_DIRECT` where the kernel accepts it.
    pub fn open(path: &Path) -> io::Result<DiskWriter> {
        let direct = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path);
        match direct {
            Ok(file) => {
                let block_device = is_block_device(&file)?;
                let block_size = if block_device {
                    sys::logical_block_size(&file)? as usize
                } else {
                    MEM_ALIGN
                };
                Ok(DiskWriter::Direct(DirectWriter {
                    file,
                    path: path.to_owned(),
                    block_size: block_size.max(512),
                    block_device,
                }))
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Self::open_buffered(path),
            Err(e) => Err(e),
        }
    }

    /// Opens `path` read-write through the page cache.
    pub fn open_buffered(path: &Path) -> io::Result<DiskWriter> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let block_device = is_block_device(&file)?;
        Ok(DiskWriter::Buffered(BufferedWriter {
            file,
            path: path.to_owned(),
            block_device,
        }))
    }

    fn file(&self) -> &File {
        match self {
            DiskWriter::Direct(d) => &d.file,
            DiskWriter::Buffered(b) => &b.file,
        }
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        match self {
            DiskWriter::Direct(d) => &d.path,
            DiskWriter::Buffered(b) => &b.path,
        }
    }

    /// Whether this is a block device (rather than a regular file).
    pub fn is_block_device(&self) -> bool {
        match self {
            DiskWriter::Direct(d) => d.block_device,
            DiskWriter::Buffered(b) => b.block_device,
        }
    }

    /// Whether writes bypass the page cache.
    pub fn is_direct(&self) -> bool {
        matches!(self, DiskWriter::Direct(_))
    }

    /// Alignment of direct writes (1 for buffered).
    pub fn block_size(&self) -> usize {
        match self {
            DiskWriter::Direct(d) => d.block_size,
            DiskWriter::Buffered(_) => 1,
        }
    }

    /// Capacity in bytes of a block device; `None` for a regular file, which grows as written.
    pub fn capacity(&self) -> io::Result<Option<u64>> {
        if self.is_block_device() {
            sys::block_device_size(self.file()).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Writes all of `buf` at `offset`. For [`DiskWriter::Direct`], `buf` must sit in memory
    /// aligned to [`MEM_ALIGN`] and `offset` must be block-aligned; a length that is not a
    /// whole number of blocks is written in two steps: the aligned part directly, the final
    /// partial block through the page cache (what GNU dd does for its last short block with
    /// `oflag=direct`), so no byte past the image is touched.
    pub fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self {
            DiskWriter::Buffered(b) => b.file.write_all_at(buf, offset),
            DiskWriter::Direct(d) => {
                let bs = d.block_size;
                if !offset.is_multiple_of(bs as u64)
                    || !(buf.as_ptr() as usize).is_multiple_of(MEM_ALIGN)
                {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("unaligned direct write at offset {offset}"),
                    ));
                }
                let aligned = buf.len() / bs * bs;
                if aligned > 0 {
                    d.file.write_all_at(&buf[..aligned], offset)?;
                }
                if aligned < buf.len() {
                    d.write_tail_buffered(&buf[aligned..], offset + aligned as u64)?;
                }
                Ok(())
            }
        }
    }

    /// Reads into `buf` at `offset` (buffered reads; used for the qcow2 spool area).
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self {
            DiskWriter::Buffered(b) => b.file.read_exact_at(buf, offset),
            DiskWriter::Direct(d) => {
                // A separate buffered descriptor: O_DIRECT reads would need aligned buffers.
                let f = File::open(&d.path)?;
                f.read_exact_at(buf, offset)
            }
        }
    }

    /// `fdatasync`: the data is on stable storage when this returns.
    pub fn sync_data(&self) -> io::Result<()> {
        self.file().sync_data()
    }

    /// Asks the kernel to re-read the partition table of a block device; nothing for a file.
    /// A failure is logged, not returned: loop devices without partition scanning answer EINVAL,
    /// and the image is on the disk either way.
    pub fn reread_partition_table(&self) {
        if !self.is_block_device() {
            return;
        }
        match sys::reread_partition_table(self.file()) {
            Ok(()) => tracing::info!(disk = %self.path().display(), "partition table re-read"),
            Err(err) => tracing::warn!(
                disk = %self.path().display(),
                %err,
                "re-reading the partition table failed (the image is written)"
            ),
        }
    }
}

impl DirectWriter {
    fn write_tail_buffered(&self, tail: &[u8], offset: u64) -> io::Result<()> {
        let fd = self.file.as_raw_fd();
        // SAFETY: F_GETFL/F_SETFL on an fd we own; no memory is passed.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_DIRECT) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let result = self.file.write_all_at(tail, offset);
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
            return Err(io::Error::last_os_error());
        }
        result
    }
}

fn is_block_device(file: &File) -> io::Result<bool> {
    Ok(file.metadata()?.file_type().is_block_device())
}

/// A heap buffer aligned to [`MEM_ALIGN`], as `O_DIRECT` requires.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    cap: usize,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only read the bytes (Deref to [u8]); mutation needs `&mut`, like Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout(cap: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(cap.max(MEM_ALIGN), MEM_ALIGN)
            .expect("buffer sizes are small multiples of the page size")
    }

    /// A zero-filled buffer of `cap` bytes with length 0.
    pub fn new(cap: usize) -> AlignedBuf {
        let layout = Self::layout(cap);
        // SAFETY: layout has non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, cap, len: 0 }
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Bytes filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Room left.
    pub fn remaining(&self) -> usize {
        self.cap - self.len
    }

    /// Appends as much of `data` as fits; returns how much.
    pub fn extend_from(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.remaining());
        let len = self.len;
        self.full_mut()[len..len + n].copy_from_slice(&data[..n]);
        self.len += n;
        n
    }

    /// Sets the filled length (the bytes are whatever the buffer holds).
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "length within capacity");
        self.len = len;
    }

    /// Empties it.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The whole capacity, filled or not.
    pub fn full_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for cap bytes, initialised (alloc_zeroed), uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid and initialised for len <= cap bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with the same layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({}/{})", self.len, self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory on a filesystem that supports O_DIRECT (not tmpfs).
    fn scratch() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("vmdeploy-disk-test")
            .tempdir_in("/var/tmp")
            .expect("creating a scratch dir in /var/tmp")
    }

    #[test]
    fn direct_write_with_unaligned_tail_touches_nothing_past_it() {
        let dir = scratch();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![0xAAu8; 3 * 4096]).expect("making the disk file");
        let disk = DiskWriter::open(&path).expect("opening");
        assert!(disk.is_direct(), "ext4 accepts O_DIRECT");
        for len in [1usize, 511, 4096, 4097, 8191] {
            let mut buf = AlignedBuf::new(8192);
            buf.full_mut().fill(0x11);
            buf.set_len(len);
            disk.write_all_at(&buf, 0).expect("writing");
            disk.sync_data().expect("syncing");
            let back = std::fs::read(&path).expect("reading back");
            assert!(back[..len].iter().all(|&b| b == 0x11), "len {len}");
            assert!(
                back[len..].iter().all(|&b| b == 0xAA),
                "len {len}: nothing past the tail"
            );
            std::fs::write(&path, vec![0xAAu8; 3 * 4096]).expect("resetting");
        }
        // Unaligned offsets are refused, not silently bounced through the page cache.
        let buf = AlignedBuf::new(4096);
        assert!(disk.write_all_at(&buf, 100).is_err());
    }

    #[test]
    fn buffered_writer_any_offset() {
        let dir = scratch();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, b"").expect("making the disk file");
        let disk = DiskWriter::open_buffered(&path).expect("opening");
        disk.write_all_at(b"abc", 5).expect("writing");
        assert_eq!(std::fs::read(&path).expect("reading"), b"\0\0\0\0\0abc");
        assert_eq!(disk.capacity().expect("capacity"), None);
        disk.reread_partition_table();
    }

    #[test]
    fn aligned_buf_is_aligned_and_bounded() {
        let mut b = AlignedBuf::new(10_000);
        assert_eq!(b.as_ptr() as usize % MEM_ALIGN, 0);
        assert_eq!(b.extend_from(&[1u8; 6000]), 6000);
        assert_eq!(b.extend_from(&[2u8; 6000]), 4000);
        assert_eq!(b.remaining(), 0);
        assert_eq!(b.len(), 10_000);
        assert_eq!(b[5999], 1);
        assert_eq!(b[6000], 2);
    }
}
