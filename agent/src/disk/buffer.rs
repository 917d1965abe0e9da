//! [`AlignedBuf`], the one I/O buffer type of the disk layer (`O_DIRECT` needs page-aligned
//! memory), and [`BufferPool`], which recycles the large ones of the iSCSI target.

use std::alloc::{self, Layout};
use std::sync::Mutex;

use super::MEM_ALIGN;

/// A zero-initialised heap buffer aligned to [`MEM_ALIGN`], as `O_DIRECT` needs: `len` bytes
/// filled (what `Deref` shows) of `capacity` allocated.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only read the bytes (Deref to [u8]); mutation needs `&mut`, like Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout(cap: usize) -> Layout {
        Layout::from_size_align(cap.max(1), MEM_ALIGN)
            .expect("a page alignment and an I/O-sized length form a valid layout")
    }

    fn alloc(cap: usize, len: usize) -> AlignedBuf {
        let layout = Self::layout(cap);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len, cap }
    }

    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        Self::alloc(len, len)
    }

    /// An empty buffer with room for `cap` bytes (zeroed).
    pub fn with_capacity(cap: usize) -> AlignedBuf {
        Self::alloc(cap, 0)
    }

    /// Bytes filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the allocation holds (the most the length can be set to).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Room left after the filled bytes.
    pub fn remaining(&self) -> usize {
        self.cap - self.len
    }

    /// Shortens the filled length (the allocation stays).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Empties it.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Sets the filled length to `len`, which must fit the allocation; `false` (and no change)
    /// when it does not. Every byte of the allocation is initialised (zeroed at allocation, then
    /// only ever written), so any length within it is sound.
    pub fn set_len_within(&mut self, len: usize) -> bool {
        if len > self.cap {
            return false;
        }
        self.len = len;
        true
    }

    /// Appends as much of `data` as fits; returns how much.
    pub fn extend_from(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.remaining());
        let len = self.len;
        self.full_mut()[len..len + n].copy_from_slice(&data[..n]);
        self.len += n;
        n
    }

    /// The whole allocation, filled or not (for reading into the room after the filled bytes).
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

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc` with the same layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({}/{})", self.len, self.cap)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_is_aligned_zeroed_and_bounded() {
        let b = AlignedBuf::zeroed(10_000);
        assert_eq!(b.as_ptr() as usize % MEM_ALIGN, 0);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!((b.len(), b.capacity()), (10_000, 10_000));

        let mut b = AlignedBuf::with_capacity(10_000);
        assert_eq!(b.as_ptr() as usize % MEM_ALIGN, 0);
        assert!(b.is_empty());
        assert_eq!(b.extend_from(&[1u8; 6000]), 6000);
        assert_eq!(b.extend_from(&[2u8; 6000]), 4000);
        assert_eq!(b.remaining(), 0);
        assert_eq!(b.len(), 10_000);
        assert_eq!((b[5999], b[6000]), (1, 2));
        assert!(!b.set_len_within(10_001), "beyond the allocation");
        assert_eq!(b.len(), 10_000);
        b.truncate(3);
        assert_eq!(&b[..], &[1, 1, 1]);
        b.clear();
        assert!(b.is_empty());
        assert_eq!(AlignedBuf::zeroed(0).len(), 0);
    }

    #[test]
    fn pool_reuses_buffers_that_fit_and_drops_small_ones() {
        let pool = BufferPool::new();
        let mut a = pool.take(1 << 20);
        assert_eq!(a.len(), 1 << 20);
        assert_eq!(a.as_ptr() as usize % MEM_ALIGN, 0);
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
}
