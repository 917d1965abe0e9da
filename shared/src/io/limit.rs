//! A reader that fails once its stream passes a size limit.

use std::io::{self, Read};

/// Passes at most `limit` bytes; when the inner stream has more, the read that would pass the
/// limit fails with [`io::ErrorKind::FileTooLarge`]-like `Other` error naming the limit, instead of
/// truncating silently (an image larger than its disk must not be cut off quietly).
#[derive(Debug)]
pub struct LimitReader<R> {
    inner: R,
    limit: u64,
    count: u64,
}

impl<R: Read> LimitReader<R> {
    /// Wraps `inner`, allowing `limit` bytes.
    pub fn new(inner: R, limit: u64) -> Self {
        LimitReader {
            inner,
            limit,
            count: 0,
        }
    }

    /// Bytes passed so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The inner reader.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

impl<R: Read> Read for LimitReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let room = self.limit - self.count;
        if room == 0 {
            // At the limit: the stream must end here. Probe with one byte.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(io::Error::other(format!(
                    "stream is larger than the limit of {} bytes",
                    self.limit
                ))),
            };
        }
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.count += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all_in(data: &[u8], limit: u64, chunk: usize) -> io::Result<Vec<u8>> {
        let mut r = LimitReader::new(data, limit);
        let mut out = Vec::new();
        let mut buf = vec![0u8; chunk];
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    #[test]
    fn below_at_and_above_the_limit() {
        let data = [7u8; 10];
        for chunk in [1, 3, 10, 64] {
            assert_eq!(read_all_in(&data, 11, chunk).expect("below"), data);
            assert_eq!(read_all_in(&data, 10, chunk).expect("at"), data);
            let err = read_all_in(&data, 9, chunk).expect_err("above");
            assert!(err.to_string().contains("limit of 9 bytes"), "{err}");
        }
        assert!(read_all_in(&data, 0, 4).is_err());
        assert_eq!(read_all_in(&[], 0, 4).expect("empty at zero"), b"");
    }
}
