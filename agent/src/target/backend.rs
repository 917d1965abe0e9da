//! The block device behind LUN 1: a disk, a loop device or a plain file.
//!
//! Data goes through an `O_DIRECT` descriptor with page-aligned buffers, so a deploy does not fill
//! the ramdisk's page cache and `SYNCHRONIZE CACHE` (fdatasync) has little left to flush. Where the
//! filesystem refuses `O_DIRECT` (tmpfs gives EINVAL at open) or refuses one request, the same
//! request goes through a buffered descriptor instead, and that is logged once.

use std::alloc::{self, Layout};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use anyhow::Context as _;

/// Alignment of every I/O buffer: a page satisfies `O_DIRECT` on any logical block size ≤ 4 KiB.
pub const BUFFER_ALIGN: usize = 4096;

/// Logical block length reported for regular files (what tgtd and Linux loop devices use).
const FILE_BLOCK_LEN: u32 = 512;

/// A zero-initialised heap buffer aligned to [`BUFFER_ALIGN`], as `O_DIRECT` needs.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        let layout = Layout::from_size_align(len.max(1), BUFFER_ALIGN)
            .expect("a page alignment and an I/O-sized length form a valid layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Self { ptr, len, layout }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Shortens the visible length (the allocation stays).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Bytes the allocation holds (the most `len` can be set to by [`Self::set_len_within`]).
    pub fn capacity(&self) -> usize {
        self.layout.size()
    }

    /// Sets the visible length to `len`, which must fit the allocation; `false` (and no change)
    /// when it does not. Every byte of the allocation is initialised (zeroed at allocation, then
    /// only ever written), so any length within it is sound.
    pub fn set_len_within(&mut self, len: usize) -> bool {
        if len > self.capacity() {
            return false;
        }
        self.len = len;
        true
    }
}

/// Recycles the large write buffers of the target's commands.
///
/// A fresh 1 MiB `AlignedBuf` per WRITE cost the allocator an mmap, 256 page faults, a 1 MiB
/// memset and an munmap: perf showed page faults under that memset at 13 % of the target's time
/// (bench/iscsi-write.sh). A reused buffer holds the data of an earlier command; callers that
/// hand one out must overwrite (or zero) every byte they use.
#[derive(Debug, Default)]
pub struct BufferPool {
    free: Mutex<Vec<AlignedBuf>>,
}

impl BufferPool {
    /// Buffers smaller than this come straight from the allocator, which handles them well.
    pub const MIN_POOLED: usize = 64 * 1024;
    /// Idle bytes kept at most (16 commands of 1 MiB in flight need 16 MiB).
    const MAX_IDLE_BYTES: usize = 32 << 20;

    /// A pool with nothing in it.
    pub fn new() -> Self {
        Self::default()
    }

    /// A buffer of `len` bytes with unspecified (earlier commands') contents. Uses the smallest
    /// idle buffer that holds `len` and is at most twice as big, else allocates a zeroed one.
    pub fn take(&self, len: usize) -> AlignedBuf {
        if len >= Self::MIN_POOLED {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= len && b.capacity() / 2 <= len)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i);
            if let Some(i) = best {
                let mut buf = free.swap_remove(i);
                let fits = buf.set_len_within(len);
                debug_assert!(fits, "the buffer was chosen for its capacity");
                return buf;
            }
        }
        AlignedBuf::zeroed(len)
    }

    /// Gives a buffer back for reuse; dropped instead when small or when the pool is full.
    pub fn give(&self, buf: AlignedBuf) {
        if buf.capacity() < Self::MIN_POOLED {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let idle: usize = free.iter().map(AlignedBuf::capacity).sum();
        if idle + buf.capacity() <= Self::MAX_IDLE_BYTES {
            free.push(buf);
        }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr points to an allocation of at least len initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this very layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// Block device ioctls (linux/fs.h).
mod ioctl {
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t): device size in bytes.
    nix::ioctl_read!(blk_get_size64, 0x12, 114, u64);
    // BLKSSZGET = _IO(0x12, 104) with an int result: logical sector size.
    nix::ioctl_read_bad!(blk_ssz_get, nix::request_code_none!(0x12, 104), libc::c_int);
    // BLKPBSZGET = _IO(0x12, 123) with an unsigned int result: physical sector size.
    nix::ioctl_read_bad!(
        blk_pbsz_get,
        nix::request_code_none!(0x12, 123),
        libc::c_uint
    );
}

/// The opened backing store of the LUN.
#[derive(Debug)]
pub struct BlockBackend {
    path: PathBuf,
    /// `O_DIRECT` descriptor, when the filesystem accepts it.
    direct: Option<File>,
    /// Buffered descriptor: the fallback, and the one fdatasync and hole punching use.
    buffered: File,
    /// Set once a direct request failed with EINVAL and was retried buffered (logged once).
    fell_back: AtomicBool,
    block_len: u32,
    physical_exponent: u8,
    blocks: u64,
}

impl BlockBackend {
    /// Opens `path` read-write, with `O_DIRECT` unless `buffered_only` or the filesystem refuses it.
    pub fn open(path: &Path, buffered_only: bool) -> anyhow::Result<Self> {
        let buffered = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        let direct = if buffered_only {
            None
        } else {
            match OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(f) => Some(f),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::warn!(path = %path.display(), "O_DIRECT refused (EINVAL); using buffered I/O");
                    None
                }
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("opening {} with O_DIRECT", path.display()))
                }
            }
        };
        let meta = buffered
            .metadata()
            .with_context(|| format!("reading metadata of {}", path.display()))?;
        let fd = buffered.as_raw_fd();
        let (size, block_len, physical) = if meta.file_type().is_block_device() {
            let mut size = 0u64;
            let mut ssz: libc::c_int = 0;
            let mut pbsz: libc::c_uint = 0;
            // SAFETY: fd is an open block device and each pointer is a valid out-parameter.
            unsafe {
                ioctl::blk_get_size64(fd, &mut size)
                    .with_context(|| format!("BLKGETSIZE64 on {}", path.display()))?;
                ioctl::blk_ssz_get(fd, &mut ssz)
                    .with_context(|| format!("BLKSSZGET on {}", path.display()))?;
                if ioctl::blk_pbsz_get(fd, &mut pbsz).is_err() {
                    pbsz = 0;
                }
            }
            let ssz = u32::try_from(ssz)
                .ok()
                .filter(|s| s.is_power_of_two() && *s >= 512)
                .with_context(|| format!("{} reports a bad sector size {ssz}", path.display()))?;
            (size, ssz, pbsz.max(ssz))
        } else {
            // A file has no physical block size of its own; reporting 512 keeps GET LBA STATUS
            // extents on logical blocks (libiscsi GetLBAStatus.UnmapSingle expects that).
            (meta.len(), FILE_BLOCK_LEN, FILE_BLOCK_LEN)
        };
        let blocks = size / u64::from(block_len);
        anyhow::ensure!(blocks > 0, "{} is smaller than one block", path.display());
        let physical_exponent = (physical / block_len).max(1).trailing_zeros() as u8;
        tracing::info!(
            path = %path.display(),
            blocks,
            block_len,
            direct = direct.is_some(),
            "backing store opened"
        );
        Ok(Self {
            path: path.to_owned(),
            direct,
            buffered,
            fell_back: AtomicBool::new(false),
            block_len,
            physical_exponent,
            blocks,
        })
    }

    /// Logical block length in bytes.
    pub fn block_len(&self) -> u32 {
        self.block_len
    }

    /// log2(physical / logical block length).
    pub fn physical_exponent(&self) -> u8 {
        self.physical_exponent
    }

    /// Number of logical blocks.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Whether I/O goes through `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    fn note_fallback(&self, err: &io::Error) {
        if !self.fell_back.swap(true, Ordering::Relaxed) {
            tracing::warn!(path = %self.path.display(), error = %err, "O_DIRECT request refused; retrying buffered (further fallbacks not logged)");
        }
    }

    /// Reads exactly `buf.len()` bytes at `offset`.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if let Some(direct) = &self.direct {
            match direct.read_exact_at(buf, offset) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.note_fallback(&e),
                other => return other,
            }
        }
        self.buffered.read_exact_at(buf, offset)
    }

    /// Writes all of `buf` at `offset`.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if let Some(direct) = &self.direct {
            match direct.write_all_at(buf, offset) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.note_fallback(&e),
                other => return other,
            }
        }
        self.buffered.write_all_at(buf, offset)
    }

    /// Flushes written data to stable storage (`SYNCHRONIZE CACHE`, FUA, the final stop).
    pub fn sync(&self) -> io::Result<()> {
        self.buffered.sync_data()
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
        self.write_pattern(offset, len, &vec![0u8; self.block_len as usize])
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

    #[test]
    fn aligned_buf_is_aligned_and_zeroed() {
        let b = AlignedBuf::zeroed(10_000);
        assert_eq!(b.as_ptr() as usize % BUFFER_ALIGN, 0);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(b.len(), 10_000);
    }

    #[test]
    fn pool_reuses_buffers_that_fit_and_drops_small_ones() {
        let pool = BufferPool::new();
        let mut a = pool.take(1 << 20);
        assert_eq!(a.len(), 1 << 20);
        assert_eq!(a.as_ptr() as usize % BUFFER_ALIGN, 0);
        a.fill(0x5a);
        let first = a.as_ptr();
        pool.give(a);
        // A smaller request within half the capacity reuses it, with the requested length.
        let b = pool.take(768 * 1024);
        assert_eq!(b.as_ptr(), first);
        assert_eq!(b.len(), 768 * 1024);
        assert!(
            b.iter().all(|&x| x == 0x5a),
            "contents are the earlier command's"
        );
        pool.give(b);
        // Too small a request for that buffer, or a larger one, gets a fresh zeroed buffer.
        let c = pool.take(128 * 1024);
        assert_ne!(c.as_ptr(), first);
        assert!(c.iter().all(|&x| x == 0));
        let d = pool.take(2 << 20);
        assert_eq!(d.len(), 2 << 20);
        assert!(d.iter().all(|&x| x == 0));
        // Small buffers are not kept.
        pool.give(AlignedBuf::zeroed(4096));
        assert_eq!(pool.take(4096).len(), 4096);
        // The idle total is capped.
        for _ in 0..40 {
            pool.give(AlignedBuf::zeroed(1 << 20));
        }
        let idle: usize = pool
            .free
            .lock()
            .expect("not poisoned")
            .iter()
            .map(AlignedBuf::capacity)
            .sum();
        assert!(idle <= BufferPool::MAX_IDLE_BYTES);
    }

    #[test]
    fn file_backend_reads_back_writes_and_discards() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lun.img");
        std::fs::write(&path, vec![0u8; 1 << 20]).expect("create backing file");
        let b = BlockBackend::open(&path, false).expect("open backend");
        assert_eq!(b.blocks(), 2048);
        let mut data = AlignedBuf::zeroed(4096);
        data.fill(0xab);
        b.write_at(&data, 8192).expect("write");
        b.sync().expect("sync");
        let mut back = AlignedBuf::zeroed(4096);
        b.read_at(&mut back, 8192).expect("read");
        assert_eq!(&back[..], &data[..]);
        b.discard(8192, 4096).expect("discard");
        b.read_at(&mut back, 8192).expect("read after discard");
        assert!(back.iter().all(|&x| x == 0));
        b.write_pattern(0, 2048, &[7u8; 512]).expect("pattern");
        b.read_at(&mut back, 0).expect("read pattern");
        assert!(back[..2048].iter().all(|&x| x == 7));
        assert!(back[2048..].iter().all(|&x| x == 0));
    }
}
