//! The target disk: one [`Disk`] type for the image sink and the iSCSI LUN (a direct handle and a
//! buffered one, geometry, one O_DIRECT fallback rule), its [`AlignedBuf`] buffers, the image
//! sink, and the choice of disk.
//!
//! # Design
//! - [`Disk`] ([`device`]): aligned requests go `O_DIRECT`, so a multi-GiB image does not pass
//!   through (and evict) the page cache and the agent's memory stays bounded; what direct I/O
//!   cannot take goes through the buffered handle (tmpfs, unaligned tails, tests).
//! - [`sink::ImageSink`] is the end of the stream chain: the source is read straight into aligned
//!   4 MiB blocks ([`sink::ImageSink::fill_from`]), which go over a bounded queue to three writer
//!   threads (and, for uncompressed images, to a hashing thread at the same time), so receiving,
//!   hashing and disk writes overlap on two cores; it holds the first MiB back until the caller
//!   has verified the checksum.
//! - [`select`] picks the disk from the root-device hints.
//!
//! # Limitations
//! Writes are positioned (`pwrite`), three in flight; the pool is 7 blocks (28 MiB).

pub mod buffer;
pub mod device;
pub mod erase;
pub mod select;
pub mod sink;

pub use buffer::{AlignedBuf, BufferPool};
pub use device::{Disk, Geometry};

/// Memory alignment of every buffer handed to an `O_DIRECT` request: 4096 covers every logical
/// block size Linux supports for O_DIRECT on block devices (512 or 4096) and page-aligned
/// filesystems.
pub const MEM_ALIGN: usize = 4096;

/// Bytes at the start of the disk held back until the image is verified: the MBR, the primary
/// GPT and the boot loader's embedding area all live in the first MiB, so a disk whose first MiB
/// is zero does not boot (docs/architecture.md §1, "first MiB written last").
pub const HEAD_LEN: usize = 1024 * 1024;
