//! `std::io` adapters both ends of an image stream use: each wraps one inner `Read` and adds one
//! concern (the coreos-installer adapter chain, ../../../shared/STYLE.md §2).
//!
//! # Design
//! - [`hash::HashReader`] digests the bytes exactly as they pass (the image *as downloaded*, which
//!   is what Ironic's `os_hash_value` / `image_checksum` cover), and [`hash::ExpectedDigest`] parses
//!   the `ALGO:HEX` (or bare hex) form and compares.
//! - [`peek::PeekReader`] lets a later stage sniff magic bytes without consuming them.
//! - [`limit::LimitReader`] fails, rather than truncating silently, once a stream passes its limit
//!   (an image larger than the disk must be an error, not a cut-off disk).
//!
//! # Limitations
//! Pure std::io: async callers run the chain on a blocking thread.

pub mod hash;
pub mod limit;
pub mod peek;

/// Default copy buffer size of the chain: 256 KiB, the size coreos-installer settled on for its
/// image copy; large enough that per-call overhead is negligible next to hashing and disk writes.
pub const BUFFER_SIZE: usize = 256 * 1024;
