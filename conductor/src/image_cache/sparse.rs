//! Sparse files: a writer that leaves all-zero blocks as holes, and the list of a file's data
//! extents (`lseek(SEEK_DATA/SEEK_HOLE)`), so the iSCSI writer can skip what reads back as zero.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

/// Block the writer judges as zero or not: 64 KiB, a multiple of every file system block size
/// we meet (4 KiB on ext4/xfs/tmpfs) and of qcow2's default cluster, so a skipped block is whole
/// file system blocks and really becomes a hole; small enough that a mostly-empty image keeps most
/// of its holes.
pub const SPARSE_BLOCK: usize = 64 * 1024;

/// Writes a stream into a new (empty) file, seeking over all-zero [`SPARSE_BLOCK`]s instead of
/// writing them, so they stay holes. Blocks are aligned to the file offset, not to the writes.
/// [`SparseWriter::finish`] writes the last partial block and sets the length (a trailing hole
/// still counts).
#[derive(Debug)]
pub struct SparseWriter {
    file: File,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    offset: u64,
}

impl SparseWriter {
    /// Wraps `file`, which must be empty (holes read as zero only where nothing was written).
    pub fn new(file: File) -> SparseWriter {
        SparseWriter {
            file,
            buf: Vec::with_capacity(SPARSE_BLOCK),
            offset: 0,
        }
    }

    /// Bytes accepted so far.
    pub fn len(&self) -> u64 {
        self.offset + self.buf.len() as u64
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn flush_block(&mut self) -> io::Result<()> {
        if self.buf.iter().any(|&b| b != 0) {
            self.file.write_all_at(&self.buf, self.offset)?;
        }
        self.offset += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Writes what is buffered, sets the file's length to everything accepted, and returns the
    /// file and that length.
    pub fn finish(mut self) -> io::Result<(File, u64)> {
        self.flush_block()?;
        // A trailing zero block was skipped: the length makes it a hole at the end.
        self.file.set_len(self.offset)?;
        Ok((self.file, self.offset))
    }
}

impl Write for SparseWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = SPARSE_BLOCK - self.buf.len();
        let n = room.min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == SPARSE_BLOCK {
            self.flush_block()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The data extents of `file` as `(offset, length)`, in order; holes are left out. A file system
/// without hole reporting returns the whole file as one extent (the kernel's generic
/// `SEEK_DATA`), which is still correct, only not sparse.
pub fn data_ranges(file: &File) -> io::Result<Vec<(u64, u64)>> {
    let size = file.metadata()?.len();
    let mut ranges = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let Some(start) = seek(file, pos, libc::SEEK_DATA)? else {
            break;
        };
        // There is always a hole at the end of the file (SEEK_HOLE never fails past data).
        let end = seek(file, start, libc::SEEK_HOLE)?
            .unwrap_or(size)
            .min(size);
        if end > start {
            ranges.push((start, end - start));
        }
        pos = end;
    }
    Ok(ranges)
}

/// `lseek(fd, pos, whence)`; `None` when `SEEK_DATA` finds no more data (ENXIO).
fn seek(file: &File, pos: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let offset = libc::off_t::try_from(pos)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset beyond off_t"))?;
    // SAFETY: lseek on a file descriptor `file` keeps open for the whole call; it reads or
    // writes no memory of ours. Moving the shared file offset is harmless: every other access
    // to these files is positional (pread/pwrite).
    let got = unsafe { libc::lseek(file.as_raw_fd(), offset, whence) };
    if got < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(err);
    }
    Ok(Some(
        u64::try_from(got).expect("lseek returned a non-negative offset"),
    ))
}

/// Bytes the file takes on disk (`st_blocks` × 512).
pub fn allocated_bytes(file: &File) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(file.metadata()?.blocks() * 512)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn write_through(chunks: &[&[u8]], step: usize) -> (tempfile::NamedTempFile, u64) {
        let tmp = tempfile::NamedTempFile::new().expect("temp file");
        let mut w = SparseWriter::new(tmp.reopen().expect("reopen"));
        for chunk in chunks {
            for piece in chunk.chunks(step.max(1)) {
                w.write_all(piece).expect("write");
            }
        }
        let (_, len) = w.finish().expect("finish");
        (tmp, len)
    }

    #[test]
    fn content_survives_at_awkward_write_sizes_and_zero_blocks_become_holes() {
        let data: Vec<u8> = (0..SPARSE_BLOCK * 2 + 1234)
            .map(|i| (i % 251) as u8 | 1)
            .collect();
        let zeros = vec![0u8; SPARSE_BLOCK * 16];
        for step in [1, 7, 4096, SPARSE_BLOCK, SPARSE_BLOCK + 3, 1 << 20] {
            let (tmp, len) = write_through(&[&data, &zeros, &data, &zeros[..100]], step);
            let mut back = Vec::new();
            tmp.reopen()
                .expect("reopen")
                .read_to_end(&mut back)
                .expect("read");
            let mut expected = data.clone();
            expected.extend_from_slice(&zeros);
            expected.extend_from_slice(&data);
            expected.extend_from_slice(&zeros[..100]);
            assert_eq!(len, expected.len() as u64, "step {step}");
            assert!(back == expected, "content differs at step {step}");
            let file = tmp.reopen().expect("reopen");
            // The zero run fills at least 14 whole blocks however the data fell: those are holes.
            let allocated = allocated_bytes(&file).expect("stat");
            assert!(
                allocated < len - (14 * SPARSE_BLOCK) as u64,
                "step {step}: {allocated} bytes allocated of {len}"
            );
            let ranges = data_ranges(&file).expect("ranges");
            assert!(ranges.len() >= 2, "step {step}: {ranges:?}");
            let covered: u64 = ranges.iter().map(|r| r.1).sum();
            assert!(covered < len - (14 * SPARSE_BLOCK) as u64, "{ranges:?}");
            // Every non-zero byte lies inside a reported range.
            for (i, b) in back.iter().enumerate() {
                if *b != 0 {
                    let i = i as u64;
                    assert!(
                        ranges.iter().any(|(s, l)| i >= *s && i < s + l),
                        "byte {i} outside {ranges:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn empty_and_all_zero_files_have_no_data() {
        let (tmp, len) = write_through(&[], 1);
        assert_eq!(len, 0);
        assert_eq!(
            data_ranges(&tmp.reopen().expect("reopen")).expect("ranges"),
            vec![]
        );
        let zeros = vec![0u8; SPARSE_BLOCK * 3 + 5];
        let (tmp, len) = write_through(&[&zeros], 4096);
        assert_eq!(len, zeros.len() as u64);
        let file = tmp.reopen().expect("reopen");
        assert_eq!(file.metadata().expect("stat").len(), len);
        assert_eq!(data_ranges(&file).expect("ranges"), vec![]);
    }
}
