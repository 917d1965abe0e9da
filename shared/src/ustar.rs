//! A minimal POSIX ustar archive writer (POSIX.1-2001 `pax` spec, the ustar header): regular
//! files only, for small diagnostic bundles such as the agent's `log.collect_system_logs`.
//!
//! # Format
//! Each file is a 512-byte header, then its data padded with NULs to a multiple of 512 bytes;
//! the archive ends with two zero blocks. Header fields used: `name` (100 bytes), `mode`, `uid`,
//! `gid` (8-byte octal), `size`, `mtime` (12-byte octal), `chksum` (8 bytes: the byte sum of the
//! header with this field as spaces, written as 6 octal digits, NUL, space), `typeflag` `0`,
//! `magic` `ustar\0`, `version` `00`. Names longer than 100 bytes go into the `prefix` field
//! (155 bytes) split at a `/`.
//!
//! # Design
//! A streaming writer over any `Write` sink (a gzip encoder): only the header is built in
//! memory. Every entry is owned by root with mode 0644 and one mtime for the archive, so an
//! archive depends only on what was added. Names are stored relative.

use std::io::Write;

/// Size of a tar block.
pub const BLOCK: usize = 512;

/// Largest file size the 11 octal digits of `size` hold (8 GiB - 1).
pub const MAX_SIZE: u64 = 0o77_777_777_777;

/// Why an entry could not be written.
#[derive(Debug, thiserror::Error)]
pub enum TarError {
    /// The sink failed.
    #[error("writing the tar archive: {0}")]
    Io(#[from] std::io::Error),
    /// The name is empty, absolute after trimming, has a NUL byte or a `..` component, or does
    /// not fit the header.
    #[error("tar entry name {0:?} is not usable")]
    BadName(String),
    /// The data is larger than ustar's size field holds.
    #[error("tar entry {name:?} is {size} bytes, more than ustar holds")]
    TooLarge {
        /// The entry.
        name: String,
        /// Its size.
        size: u64,
    },
}

/// Writes a ustar archive to `W`.
pub struct TarWriter<W: Write> {
    sink: W,
    mtime: u64,
}

impl<W: Write> TarWriter<W> {
    /// A writer whose entries all carry `mtime` (seconds since the epoch).
    pub fn new(sink: W, mtime: u64) -> TarWriter<W> {
        TarWriter { sink, mtime }
    }

    /// Appends the regular file `name` (relative; a leading `/` is dropped) holding `data`.
    pub fn append_file(&mut self, name: &str, data: &[u8]) -> Result<(), TarError> {
        let header = header(name, data.len() as u64, self.mtime)?;
        self.sink.write_all(&header)?;
        self.sink.write_all(data)?;
        let pad = (BLOCK - data.len() % BLOCK) % BLOCK;
        self.sink.write_all(&[0u8; BLOCK][..pad])?;
        Ok(())
    }

    /// Writes the two end-of-archive blocks and returns the sink.
    pub fn finish(mut self) -> Result<W, TarError> {
        self.sink.write_all(&[0u8; 2 * BLOCK])?;
        self.sink.flush()?;
        Ok(self.sink)
    }
}

/// Writes `value` as zero-padded octal filling `field` but its last byte (a NUL).
fn octal(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    field[..digits].copy_from_slice(text.as_bytes());
    field[digits] = 0;
}

/// Splits `name` into ustar's (prefix, name) fields, or None when it cannot be stored.
fn split_name(name: &str) -> Option<(&str, &str)> {
    if name.len() <= 100 {
        return Some(("", name));
    }
    // The prefix takes everything before a `/` (at most 155 bytes), the name the rest.
    let cut = name
        .char_indices()
        .filter(|&(i, c)| c == '/' && i <= 155 && name.len() - i - 1 <= 100 && i > 0)
        .map(|(i, _)| i)
        .next()?;
    Some((&name[..cut], &name[cut + 1..]))
}

/// The 512-byte header of a regular file.
fn header(name: &str, size: u64, mtime: u64) -> Result<[u8; BLOCK], TarError> {
    let name = name.trim_start_matches('/');
    let bad = || TarError::BadName(name.chars().take(120).collect());
    if name.is_empty() || name.contains('\0') || name.split('/').any(|c| c == "..") {
        return Err(bad());
    }
    if size > MAX_SIZE {
        return Err(TarError::TooLarge {
            name: name.to_owned(),
            size,
        });
    }
    let (prefix, short) = split_name(name).ok_or_else(bad)?;
    let mut h = [0u8; BLOCK];
    h[..short.len()].copy_from_slice(short.as_bytes());
    octal(&mut h[100..108], 0o644);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], mtime.min(MAX_SIZE));
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    // The checksum is computed with its own field as eight spaces.
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    let text = format!("{sum:06o}");
    h[148..154].copy_from_slice(text.as_bytes());
    h[154] = 0;
    h[155] = b' ';
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads an octal header field the way tar(1) does: digits up to a NUL or space.
    fn read_octal(field: &[u8]) -> u64 {
        let text: String = field
            .iter()
            .take_while(|&&b| b != 0 && b != b' ')
            .map(|&b| b as char)
            .collect();
        u64::from_str_radix(text.trim(), 8).expect("octal")
    }

    /// An independent reader of what this module writes: (name, data) of each entry, checking
    /// the checksum, magic and end blocks.
    fn read_all(archive: &[u8]) -> Vec<(String, Vec<u8>)> {
        assert_eq!(archive.len() % BLOCK, 0, "whole blocks");
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            let h = &archive[at..at + BLOCK];
            if h.iter().all(|&b| b == 0) {
                assert!(
                    archive[at..].iter().all(|&b| b == 0),
                    "only zeros at the end"
                );
                assert!(archive.len() - at >= 2 * BLOCK, "two end blocks");
                return out;
            }
            let stored = read_octal(&h[148..156]);
            let sum: u64 = h
                .iter()
                .enumerate()
                .map(|(i, &b)| {
                    if (148..156).contains(&i) {
                        32
                    } else {
                        u64::from(b)
                    }
                })
                .sum();
            assert_eq!(stored, sum, "checksum");
            assert_eq!(&h[257..263], b"ustar\0");
            assert_eq!(h[156], b'0', "regular file");
            let cstr = |f: &[u8]| {
                String::from_utf8(f.iter().take_while(|&&b| b != 0).copied().collect())
                    .expect("utf-8")
            };
            let (prefix, name) = (cstr(&h[345..500]), cstr(&h[..100]));
            let full = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let size = read_octal(&h[124..136]) as usize;
            let data = archive[at + BLOCK..at + BLOCK + size].to_vec();
            out.push((full, data));
            at += BLOCK + size.div_ceil(BLOCK) * BLOCK;
        }
    }

    #[test]
    fn files_read_back_with_ustar_headers() {
        let mut w = TarWriter::new(Vec::new(), 1_700_000_000);
        w.append_file("/agent.log", b"line one\nline two\n")
            .expect("log");
        w.append_file("proc/partitions", &[]).expect("empty");
        w.append_file("big", &vec![7u8; 1500]).expect("big");
        let long = format!("{}/{}", "d".repeat(120), "f".repeat(90));
        w.append_file(&long, b"x").expect("long name");
        let archive = w.finish().expect("finish");
        let entries = read_all(&archive);
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["agent.log", "proc/partitions", "big", long.as_str()]
        );
        assert_eq!(entries[0].1, b"line one\nline two\n");
        assert!(entries[1].1.is_empty());
        assert_eq!(entries[2].1, vec![7u8; 1500]);
        // mode 0644, mtime as given (tar(1) shows both from these fields).
        assert_eq!(read_octal(&archive[100..108]), 0o644);
        assert_eq!(read_octal(&archive[136..148]), 1_700_000_000);
    }

    #[test]
    fn unusable_names_are_refused() {
        let mut w = TarWriter::new(Vec::new(), 0);
        for bad in ["", "/", "a/../b", "a\0b", &"x".repeat(300)] {
            assert!(
                matches!(w.append_file(bad, b""), Err(TarError::BadName(_))),
                "{bad:?}"
            );
        }
    }
}
