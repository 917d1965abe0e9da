//! [`ByteWindow`]: one byte range of a disk as a file of its own, for `fatfs` to format and fill
//! the EFI system partition in place.

use std::io::{self, Read, Seek, SeekFrom, Write};

/// `Read + Write + Seek` over bytes `offset..offset + len` of `inner`: positions are relative to
/// `offset`, reads stop at the end, and a write past the end fails rather than spill into the
/// next partition.
///
/// The inner handle must accept unaligned I/O (a buffered file, not `O_DIRECT`): `fatfs` reads
/// and writes single sectors and directory entries.
#[derive(Debug)]
pub struct ByteWindow<F> {
    inner: F,
    offset: u64,
    len: u64,
    pos: u64,
}

impl<F: Read + Write + Seek> ByteWindow<F> {
    /// The window of `len` bytes at `offset` of `inner`.
    pub fn new(inner: F, offset: u64, len: u64) -> ByteWindow<F> {
        ByteWindow {
            inner,
            offset,
            len,
            pos: 0,
        }
    }

    /// The inner handle.
    pub fn into_inner(self) -> F {
        self.inner
    }

    /// Bytes from the position to the end.
    fn left(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn seek_inner(&mut self) -> io::Result<()> {
        self.inner.seek(SeekFrom::Start(self.offset + self.pos))?;
        Ok(())
    }
}

impl<F: Read + Write + Seek> Read for ByteWindow<F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf
            .len()
            .min(usize::try_from(self.left()).unwrap_or(usize::MAX));
        if n == 0 {
            return Ok(0);
        }
        self.seek_inner()?;
        let got = self.inner.read(&mut buf[..n])?;
        self.pos += got as u64;
        Ok(got)
    }
}

impl<F: Read + Write + Seek> Write for ByteWindow<F> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = buf
            .len()
            .min(usize::try_from(self.left()).unwrap_or(usize::MAX));
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!(
                    "write past the end of the {}-byte window at byte {}",
                    self.len, self.offset
                ),
            ));
        }
        self.seek_inner()?;
        let put = self.inner.write(&buf[..n])?;
        self.pos += put as u64;
        Ok(put)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<F: Read + Write + Seek> Seek for ByteWindow<F> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        match target {
            Some(p) => {
                self.pos = p;
                Ok(p)
            }
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start of the window",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[test]
    fn reads_and_writes_stay_inside() {
        let mut w = ByteWindow::new(Cursor::new(vec![0xAAu8; 100]), 10, 20);
        w.write_all(&[1u8; 20]).expect("fits");
        assert!(w.write(&[2]).is_err(), "past the end");
        w.seek(SeekFrom::End(-5)).expect("seek");
        let mut tail = Vec::new();
        w.read_to_end(&mut tail).expect("read");
        assert_eq!(tail, [1u8; 5]);
        assert!(w.seek(SeekFrom::Current(-100)).is_err());
        let disk = w.into_inner().into_inner();
        assert!(disk[..10].iter().all(|&b| b == 0xAA));
        assert!(disk[10..30].iter().all(|&b| b == 1));
        assert!(disk[30..].iter().all(|&b| b == 0xAA));
    }

    #[test]
    fn a_long_write_is_cut_at_the_end() {
        let mut w = ByteWindow::new(Cursor::new(vec![0u8; 16]), 4, 8);
        w.seek(SeekFrom::Start(6)).expect("seek");
        assert_eq!(w.write(&[9u8; 10]).expect("partial"), 2);
        let disk = w.into_inner().into_inner();
        assert_eq!(&disk[10..12], &[9, 9]);
        assert_eq!(disk[12], 0);
    }
}
