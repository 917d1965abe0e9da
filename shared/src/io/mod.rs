//! `std::io` adapters both ends of an image stream use: each wraps one inner `Read` and adds one
//! concern (the coreos-installer adapter chain, docs/style.md §2).
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

/// Reads `reader` to EOF and returns how many bytes there were and whether any was non-zero.
///
/// Used after a decoder stops: the rest of the download must still pass through the digest
/// (coreos-installer CVE-2021-20319), and non-zero trailing bytes mean a damaged image.
pub fn drain_to_eof<R: std::io::Read + ?Sized>(reader: &mut R) -> std::io::Result<(u64, bool)> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    let mut nonzero = false;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok((total, nonzero)),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        total += n as u64;
        nonzero |= buf[..n].iter().any(|&b| b != 0);
    }
}
