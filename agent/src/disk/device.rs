//! [`Disk`]: a disk, loop device or image file opened for positioned I/O, used by both the image
//! sink ([`super::sink`]) and the iSCSI LUN (`target::backend`).
//!
//! # Design
//! Two handles on the same file: a direct one (`O_DIRECT`), where the kernel accepts it, so a
//! multi-GiB image or a deploy over iSCSI neither fills the ramdisk's page cache nor evicts what
//! is in it; and a buffered one, always. One rule decides which carries a request: the leading
//! part that direct I/O can take (an aligned offset and buffer, whole blocks) goes direct, the
//! rest (an unaligned request, the image's last partial block) goes buffered, and a direct
//! request the kernel refuses (EINVAL) is redone buffered, logged once. No handle ever changes
//! its flags, so threads can share the disk freely. Both handles see the same data: the kernel
//! writes back and drops cached pages around every direct request.
//!
//! # Limitations
//! Geometry is read once, at open; a regular file reports 512-byte blocks.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::buffer::AlignedBuf;
use super::MEM_ALIGN;
use crate::sys;

/// Logical block length of a regular file (what tgtd and Linux loop devices use); also the
/// direct-I/O granularity tried on files (the kernel refuses, and the rule falls back, where the
/// filesystem needs more).
const FILE_BLOCK_LEN: u32 = 512;

/// The shape of a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Logical block length in bytes (a power of two, at least 512).
    pub block_len: u32,
    /// log2(physical / logical block length).
    pub physical_exponent: u8,
    /// Size in bytes at open.
    pub size: u64,
}

/// A disk opened read-write; see the module documentation.
#[derive(Debug)]
pub struct Disk {
    path: PathBuf,
    /// `O_DIRECT` handle, when the filesystem accepts it.
    direct: Option<File>,
    /// Buffered handle: the fallback, and the one sync and hole punching use.
    buffered: File,
    block_device: bool,
    geometry: Geometry,
    /// Set once a direct request was refused and redone buffered (logged once).
    fell_back: AtomicBool,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl Disk {
    /// Opens `path` read-write, with a direct handle where the kernel accepts `O_DIRECT`.
    pub fn open(path: &Path) -> io::Result<Disk> {
        Self::open_with(path, true)
    }

    /// Opens `path` read-write through the page cache only.
    pub fn open_buffered(path: &Path) -> io::Result<Disk> {
        Self::open_with(path, false)
    }

    fn open_with(path: &Path, try_direct: bool) -> io::Result<Disk> {
        let buffered = OpenOptions::new().read(true).write(true).open(path)?;
        let direct = if try_direct {
            match OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(f) => Some(f),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::info!(path = %path.display(), "O_DIRECT refused (EINVAL); using buffered I/O");
                    None
                }
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        Self::with_handles(path, buffered, direct)
    }

    fn with_handles(path: &Path, buffered: File, direct: Option<File>) -> io::Result<Disk> {
        let meta = buffered.metadata()?;
        let block_device = meta.file_type().is_block_device();
        let geometry = if block_device {
            let block_len = sys::logical_block_size(&buffered)?;
            if block_len < 512 {
                return Err(invalid(format!(
                    "{} reports a bad sector size {block_len}",
                    path.display()
                )));
            }
            // Not every device answers BLKPBSZGET; the logical size stands in then.
            let physical = sys::physical_block_size(&buffered)
                .unwrap_or(block_len)
                .max(block_len);
            Geometry {
                block_len,
                physical_exponent: (physical / block_len).trailing_zeros() as u8,
                size: sys::block_device_size(&buffered)?,
            }
        } else {
            Geometry {
                block_len: FILE_BLOCK_LEN,
                physical_exponent: 0,
                size: meta.len(),
            }
        };
        Ok(Disk {
            path: path.to_owned(),
            direct,
            buffered,
            block_device,
            geometry,
            fell_back: AtomicBool::new(false),
        })
    }

    /// A disk whose every write fails: a read-only handle (tests of the failure paths).
    #[cfg(test)]
    pub(crate) fn open_read_only(path: &Path) -> io::Result<Disk> {
        Self::with_handles(path, File::open(path)?, None)
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this is a block device (rather than a regular file).
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// Whether aligned requests bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Block sizes and size.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Logical block length in bytes.
    pub fn block_len(&self) -> u32 {
        self.geometry.block_len
    }

    /// log2(physical / logical block length).
    pub fn physical_exponent(&self) -> u8 {
        self.geometry.physical_exponent
    }

    /// Number of whole logical blocks.
    pub fn blocks(&self) -> u64 {
        self.geometry.size / u64::from(self.geometry.block_len)
    }

    /// Capacity in bytes of a block device; `None` for a regular file, which grows as written.
    pub fn capacity(&self) -> Option<u64> {
        self.block_device.then_some(self.geometry.size)
    }

    /// The direct handle and how many leading bytes of a request at `offset` of `len` bytes from
    /// memory at `ptr` it can take: whole blocks from an aligned offset and buffer.
    fn direct_part(&self, ptr: *const u8, len: usize, offset: u64) -> Option<(&File, usize)> {
        let direct = self.direct.as_ref()?;
        let block = self.geometry.block_len as usize;
        if !offset.is_multiple_of(block as u64) || !(ptr as usize).is_multiple_of(MEM_ALIGN) {
            return None;
        }
        let n = len / block * block;
        (n > 0).then_some((direct, n))
    }

    /// A direct request failed with `err`: whether to redo it buffered (EINVAL: the filesystem or
    /// device refuses this request direct), logged the first time.
    fn falls_back(&self, err: &io::Error) -> bool {
        if err.raw_os_error() != Some(libc::EINVAL) {
            return false;
        }
        if !self.fell_back.swap(true, Ordering::Relaxed) {
            tracing::warn!(path = %self.path.display(), error = %err, "O_DIRECT request refused; redone buffered (further fallbacks not logged)");
        }
        true
    }

    /// Reads exactly `buf.len()` bytes at `offset`.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        if let Some((direct, n)) = self.direct_part(buf.as_ptr(), buf.len(), offset) {
            match direct.read_exact_at(&mut buf[..n], offset) {
                Ok(()) => done = n,
                Err(e) if self.falls_back(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if done < buf.len() {
            self.buffered
                .read_exact_at(&mut buf[done..], offset + done as u64)?;
        }
        Ok(())
    }

    /// Writes all of `buf` at `offset`: whole aligned blocks direct, the rest buffered (what GNU
    /// dd does with the last short block under `oflag=direct`), so no byte past `buf` is touched.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        if let Some((direct, n)) = self.direct_part(buf.as_ptr(), buf.len(), offset) {
            match direct.write_all_at(&buf[..n], offset) {
                Ok(()) => done = n,
                Err(e) if self.falls_back(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if done < buf.len() {
            self.buffered
                .write_all_at(&buf[done..], offset + done as u64)?;
        }
        Ok(())
    }

    /// `fdatasync`: the data is on stable storage when this returns (`SYNCHRONIZE CACHE`, FUA,
    /// the end of an image).
    pub fn sync(&self) -> io::Result<()> {
        self.buffered.sync_data()
    }

    /// Asks the kernel to re-read the partition table of a block device; nothing for a file.
    /// A failure is logged, not returned: loop devices without partition scanning answer EINVAL,
    /// and the image is on the disk either way.
    pub fn reread_partition_table(&self) {
        if !self.block_device {
            return;
        }
        match sys::reread_partition_table(&self.buffered) {
            Ok(()) => tracing::info!(disk = %self.path.display(), "partition table re-read"),
            Err(err) => tracing::warn!(
                disk = %self.path.display(),
                %err,
                "re-reading the partition table failed (the image is written)"
            ),
        }
    }

    /// Deallocates a byte range so it reads back as zeros: a punched hole in a file, a zeroed
    /// (discarded) range on a block device; where neither works, zeros are written.
    pub fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let (Ok(off), Ok(l)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        // SAFETY: plain syscall on an open descriptor with integer arguments.
        let rc = unsafe {
            libc::fallocate(
                self.buffered.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                l,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        tracing::debug!(error = %err, "hole punching refused; writing zeros");
        self.write_pattern(offset, len, &vec![0u8; self.geometry.block_len as usize])
    }

    /// Whether the bytes at `offset` are allocated, and how far that state runs (at most to
    /// `end`), from SEEK_DATA/SEEK_HOLE. Where the filesystem or device cannot tell, everything
    /// is reported allocated.
    pub fn extent_at(&self, offset: u64, end: u64) -> (bool, u64) {
        let fd = self.buffered.as_raw_fd();
        let Ok(off) = libc::off_t::try_from(offset) else {
            return (true, end.saturating_sub(offset));
        };
        // SAFETY: lseek on an open descriptor; I/O here uses pread/pwrite, which ignore the
        // file position it moves.
        let data = unsafe { libc::lseek(fd, off, libc::SEEK_DATA) };
        if data < 0 {
            let err = io::Error::last_os_error();
            let hole = err.raw_os_error() == Some(libc::ENXIO);
            return (!hole, end.saturating_sub(offset));
        }
        let data = (data as u64).min(end);
        if data > offset {
            return (false, data - offset);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, off, libc::SEEK_HOLE) };
        let hole = if hole < 0 {
            end
        } else {
            (hole as u64).min(end)
        };
        (true, hole.saturating_sub(offset).max(1))
    }

    /// Writes `pattern` (one block) repeatedly over `len` bytes at `offset` (WRITE SAME).
    pub fn write_pattern(&self, offset: u64, len: u64, pattern: &[u8]) -> io::Result<()> {
        const CHUNK: usize = 1 << 20;
        if pattern.is_empty() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let chunk_len = (CHUNK / pattern.len()).max(1) * pattern.len();
        let chunk_len = chunk_len.min(usize::try_from(len).unwrap_or(usize::MAX));
        let mut buf = AlignedBuf::zeroed(chunk_len);
        for piece in buf.chunks_mut(pattern.len()) {
            piece.copy_from_slice(&pattern[..piece.len()]);
        }
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(chunk_len as u64) as usize;
            self.write_at(&buf[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
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

    fn disk_file(dir: &tempfile::TempDir, len: usize) -> PathBuf {
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![0xAAu8; len]).expect("making the disk file");
        path
    }

    #[test]
    fn direct_writes_with_any_tail_or_offset_touch_nothing_else() {
        let dir = scratch();
        let path = disk_file(&dir, 3 * 4096);
        let disk = Disk::open(&path).expect("opening");
        assert!(disk.is_direct(), "/var/tmp accepts O_DIRECT");
        assert_eq!(disk.capacity(), None, "a file grows");
        assert_eq!(disk.blocks(), 3 * 4096 / 512);
        for (offset, len) in [
            (0, 1),
            (0, 511),
            (0, 4096),
            (0, 4097),
            (0, 8191),
            (4096, 700),
            (100, 5000),
            (513, 1),
        ] {
            let mut buf = AlignedBuf::zeroed(8192);
            buf.fill(0x11);
            buf.truncate(len);
            disk.write_at(&buf, offset).expect("writing");
            disk.sync().expect("syncing");
            let back = std::fs::read(&path).expect("reading back");
            let (a, b) = (offset as usize, offset as usize + len);
            assert!(back[a..b].iter().all(|&x| x == 0x11), "{offset}+{len}");
            assert!(
                back[..a].iter().all(|&x| x == 0xAA),
                "{offset}+{len}: nothing before"
            );
            assert!(
                back[b..].iter().all(|&x| x == 0xAA),
                "{offset}+{len}: nothing after"
            );
            let mut read = AlignedBuf::zeroed(len);
            disk.read_at(&mut read, offset)
                .expect("reading through the disk");
            assert!(read.iter().all(|&x| x == 0x11), "{offset}+{len}: read back");
            std::fs::write(&path, vec![0xAAu8; 3 * 4096]).expect("resetting");
        }
        // An unaligned buffer goes buffered, whole.
        let data = vec![0x22u8; 4097];
        disk.write_at(&data[1..], 0).expect("unaligned memory");
        let back = std::fs::read(&path).expect("reading back");
        assert!(back[..4096].iter().all(|&x| x == 0x22));
        assert!(back[4096..].iter().all(|&x| x == 0xAA));
    }

    #[test]
    fn buffered_disk_any_offset_and_growth() {
        let dir = scratch();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, b"").expect("making the disk file");
        let disk = Disk::open_buffered(&path).expect("opening");
        assert!(!disk.is_direct());
        disk.write_at(b"abc", 5).expect("writing");
        assert_eq!(std::fs::read(&path).expect("reading"), b"\0\0\0\0\0abc");
        assert_eq!(disk.capacity(), None);
        disk.reread_partition_table();
    }

    #[test]
    fn a_refused_direct_request_is_redone_buffered() {
        let dir = scratch();
        let path = disk_file(&dir, 8192);
        let mut disk = Disk::open(&path).expect("opening");
        assert!(disk.is_direct());
        // Pretend 1-byte blocks, so that an unaligned request reaches the direct handle and the
        // kernel refuses it (EINVAL), as a filesystem with stricter alignment would.
        disk.geometry.block_len = 1;
        let mut buf = AlignedBuf::zeroed(4096);
        buf.fill(0x33);
        buf.truncate(3);
        disk.write_at(&buf, 1).expect("redone buffered");
        assert!(
            disk.fell_back.load(Ordering::Relaxed),
            "the fallback happened"
        );
        let mut back = AlignedBuf::zeroed(4096);
        back.truncate(5);
        disk.read_at(&mut back, 0)
            .expect("reading, redone buffered as well");
        assert_eq!(&back[..], &[0xAA, 0x33, 0x33, 0x33, 0xAA]);
    }

    #[test]
    fn without_a_direct_handle_everything_is_buffered() {
        let dir = scratch();
        let path = disk_file(&dir, 8192);
        let buffered = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("opening");
        // What `open` builds when O_DIRECT is refused at open (EINVAL).
        let disk = Disk::with_handles(&path, buffered, None).expect("disk");
        assert!(!disk.is_direct());
        let mut buf = AlignedBuf::zeroed(4096);
        buf.fill(0x44);
        disk.write_at(&buf, 4096).expect("writing");
        assert!(
            !disk.fell_back.load(Ordering::Relaxed),
            "nothing was refused"
        );
        let back = std::fs::read(&path).expect("reading back");
        assert!(back[4096..].iter().all(|&x| x == 0x44));
        assert!(back[..4096].iter().all(|&x| x == 0xAA));
    }

    #[test]
    fn a_read_only_disk_fails_writes() {
        let dir = scratch();
        let path = disk_file(&dir, 4096);
        let disk = Disk::open_read_only(&path).expect("opening");
        assert!(disk.write_at(&AlignedBuf::zeroed(4096), 0).is_err());
    }

    #[test]
    fn discard_and_pattern() {
        let dir = scratch();
        let path = dir.path().join("lun.img");
        std::fs::write(&path, vec![0u8; 1 << 20]).expect("create backing file");
        let d = Disk::open(&path).expect("open");
        assert_eq!(d.blocks(), 2048);
        let mut data = AlignedBuf::zeroed(4096);
        data.fill(0xab);
        d.write_at(&data, 8192).expect("write");
        d.sync().expect("sync");
        let mut back = AlignedBuf::zeroed(4096);
        d.read_at(&mut back, 8192).expect("read");
        assert_eq!(&back[..], &data[..]);
        d.discard(8192, 4096).expect("discard");
        d.read_at(&mut back, 8192).expect("read after discard");
        assert!(back.iter().all(|&x| x == 0));
        let (allocated, run) = d.extent_at(8192, 1 << 20);
        assert!(
            !allocated && run >= 4096,
            "a punched hole: {allocated} {run}"
        );
        d.write_pattern(0, 2048, &[7u8; 512]).expect("pattern");
        d.read_at(&mut back, 0).expect("read pattern");
        assert!(back[..2048].iter().all(|&x| x == 7));
        assert!(back[2048..].iter().all(|&x| x == 0));
    }
}
