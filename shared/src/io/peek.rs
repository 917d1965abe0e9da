//! A buffered reader that can look ahead without consuming, for format sniffing.

use std::io::{self, BufRead, Read};

/// Smallest read that bypasses an empty buffer (capped at the buffer's capacity).
pub const BYPASS_MIN: usize = 8 * 1024;

/// Buffers its inner reader and lets callers [`peek`](PeekReader::peek) at the next bytes.
///
/// Also a [`BufRead`], so decoders that want one (flate2, lzma) can sit directly on top.
#[derive(Debug)]
pub struct PeekReader<R> {
    inner: R,
    buf: Box<[u8]>,
    pos: usize,
    filled: usize,
}

impl<R: Read> PeekReader<R> {
    /// Wraps `inner` with a buffer of `capacity` bytes (at least 64).
    pub fn with_capacity(capacity: usize, inner: R) -> Self {
        PeekReader {
            inner,
            buf: vec![0u8; capacity.max(64)].into_boxed_slice(),
            pos: 0,
            filled: 0,
        }
    }

    /// The next bytes, at most `n` (fewer only at end of stream); nothing is consumed.
    ///
    /// `n` is capped at the buffer capacity.
    pub fn peek(&mut self, n: usize) -> io::Result<&[u8]> {
        let n = n.min(self.buf.len());
        if self.filled - self.pos < n {
            // Move what is left to the front, then fill behind it.
            self.buf.copy_within(self.pos..self.filled, 0);
            self.filled -= self.pos;
            self.pos = 0;
            while self.filled < n {
                match self.inner.read(&mut self.buf[self.filled..]) {
                    Ok(0) => break,
                    Ok(k) => self.filled += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
        }
        let end = (self.pos + n).min(self.filled);
        Ok(&self.buf[self.pos..end])
    }

    /// The inner reader.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The inner reader; buffered bytes not yet consumed are returned with it.
    pub fn into_inner(self) -> (R, Vec<u8>) {
        let rest = self.buf[self.pos..self.filled].to_vec();
        (self.inner, rest)
    }
}

impl<R: Read> Read for PeekReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        // Reads with an empty buffer bypass the copy unless they are small enough that many of
        // them would cost more in calls than the copy does: the image stream reads straight into
        // its disk blocks, whose room left before a block boundary can be any size.
        if self.pos == self.filled && out.len() >= self.buf.len().min(BYPASS_MIN) {
            return self.inner.read(out);
        }
        let avail = self.fill_buf()?;
        let n = avail.len().min(out.len());
        out[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl<R: Read> BufRead for PeekReader<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.pos == self.filled {
            self.pos = 0;
            self.filled = 0;
            loop {
                match self.inner.read(&mut self.buf) {
                    Ok(k) => {
                        self.filled = k;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(&self.buf[self.pos..self.filled])
    }

    fn consume(&mut self, amt: usize) {
        self.pos = (self.pos + amt).min(self.filled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    struct OneByte<'a>(&'a [u8]);
    impl Read for OneByte<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() || buf.is_empty() {
                return Ok(0);
            }
            buf[0] = self.0[0];
            self.0 = &self.0[1..];
            Ok(1)
        }
    }

    #[test]
    fn peek_gathers_across_one_byte_reads_and_consumes_nothing() {
        let data: Vec<u8> = (0..=255).collect();
        let mut r = PeekReader::with_capacity(64, OneByte(&data));
        assert_eq!(r.peek(6).expect("peek"), &data[..6]);
        assert_eq!(r.peek(3).expect("peek"), &data[..3]);
        let mut first = [0u8; 2];
        r.read_exact(&mut first).expect("read");
        assert_eq!(first, [0, 1]);
        assert_eq!(r.peek(10).expect("peek"), &data[2..12]);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).expect("read rest");
        assert_eq!(rest, &data[2..]);
        assert_eq!(r.peek(4).expect("peek at eof"), b"");
    }

    #[test]
    fn peek_short_stream_returns_what_there_is() {
        let mut r = PeekReader::with_capacity(64, &b"ab"[..]);
        assert_eq!(r.peek(6).expect("peek"), b"ab");
        let (_, rest) = r.into_inner();
        assert_eq!(rest, b"ab");
    }

    proptest! {
        #[test]
        fn reads_return_the_stream_unchanged(
            data in proptest::collection::vec(any::<u8>(), 0..2000),
            peeks in proptest::collection::vec(0usize..100, 0..20),
            chunk in 1usize..300,
        ) {
            let mut r = PeekReader::with_capacity(64, &data[..]);
            let mut out = Vec::new();
            let mut buf = vec![0u8; chunk];
            let mut peeks = peeks.into_iter();
            loop {
                if let Some(p) = peeks.next() {
                    let pos = out.len();
                    let seen = r.peek(p).expect("slice").to_vec();
                    let want_len = p.min(64).min(data.len() - pos);
                    prop_assert_eq!(&seen[..], &data[pos..pos + want_len]);
                }
                let n = r.read(&mut buf).expect("slice");
                if n == 0 { break; }
                out.extend_from_slice(&buf[..n]);
            }
            prop_assert_eq!(out, data);
        }
    }
}
