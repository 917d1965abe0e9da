//! HTTP/1.1 response framing for the plain `http://` client (RFC 9112): the response head, and a
//! body read straight into the caller's buffer, framed by `Transfer-Encoding: chunked` (§7.1),
//! else `Content-Length`, else the connection's end (§6.3).
//!
//! # Design
//! [`Conn`] is a connection's byte stream with whatever was read past the head still buffered;
//! [`Body`] reads one body from it into the buffer it is given, so the image's bytes go from the
//! kernel's `recv` straight into the disk block ([`super::plain`]).
//!
//! # Limitations
//! Responses only (the request line is written by the caller); no obsolete line folding.

use std::io::{self, Read};

/// Largest response head accepted.
pub const MAX_HEAD_LEN: usize = 64 * 1024;

/// Longest chunk-size or trailer line accepted in a chunked body.
const MAX_LINE_LEN: usize = 4096;

/// A parsed response head: status code and headers (names lower-cased, values trimmed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code.
    pub status: u16,
    /// Header fields in order.
    pub headers: Vec<(String, String)>,
}

impl ResponseHead {
    /// The first value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// `Content-Length`, when present and valid.
    pub fn content_length(&self) -> Result<Option<u64>, String> {
        match self.header("content-length") {
            None => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .map(Some)
                .map_err(|_| format!("invalid Content-Length {v:?}")),
        }
    }

    /// Whether the body is chunked (RFC 9112 §6.1: chunked must be the final coding).
    pub fn is_chunked(&self) -> bool {
        self.headers
            .iter()
            .filter(|(n, _)| n == "transfer-encoding")
            .flat_map(|(_, v)| v.split(','))
            .last()
            .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"))
    }
}

/// Where the response head ends: the index just past its empty line (CRLF CRLF, or LF LF as
/// RFC 9112 §2.2 lets recipients accept).
pub fn head_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(off) = buf[i..].iter().position(|&b| b == b'\n') {
        let nl = i + off;
        let rest = &buf[nl + 1..];
        if rest.starts_with(b"\n") {
            return Some(nl + 2);
        }
        if rest.starts_with(b"\r\n") {
            return Some(nl + 3);
        }
        i = nl + 1;
    }
    None
}

/// Parses a response head (status line and header lines, up to and including the empty line).
pub fn parse_head(bytes: &[u8]) -> Result<ResponseHead, String> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1.x response: {status_line:?}"));
    }
    let code = parts.next().unwrap_or_default();
    let status = match code.parse::<u16>() {
        Ok(s) if code.len() == 3 && (100..=599).contains(&s) => s,
        _ => return Err(format!("invalid status line {status_line:?}")),
    };
    let mut headers = Vec::new();
    for line in lines {
        if line.is_empty() {
            break;
        }
        if line.starts_with([' ', '\t']) {
            return Err("obsolete header line folding in the response".to_owned());
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("invalid header line {line:?}"))?;
        if name.is_empty() || name.contains([' ', '\t']) {
            return Err(format!("invalid header name {name:?}"));
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    Ok(ResponseHead { status, headers })
}

/// A connection's byte stream: bytes already buffered (past the head, or read while looking for
/// a chunk-size line) first, then straight from the inner reader.
#[derive(Debug)]
pub struct Conn<R> {
    inner: R,
    buf: Vec<u8>,
    pos: usize,
}

impl<R: Read> Conn<R> {
    pub fn new(inner: R) -> Self {
        Conn {
            inner,
            buf: Vec::new(),
            pos: 0,
        }
    }

    /// Reads the response head; the bytes after it stay buffered.
    pub fn read_head(&mut self) -> io::Result<Vec<u8>> {
        let mut chunk = [0u8; 8192];
        loop {
            if let Some(end) = head_end(&self.buf[self.pos..]) {
                let head = self.buf[self.pos..self.pos + end].to_vec();
                self.pos += end;
                return Ok(head);
            }
            if self.buf.len() - self.pos >= MAX_HEAD_LEN {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("response head larger than {MAX_HEAD_LEN} bytes"),
                ));
            }
            let n = match self.inner.read(&mut chunk) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed before the response head ended",
                    ))
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// One line without its line ending (for chunk sizes and trailers).
    fn read_line(&mut self) -> io::Result<String> {
        let mut line = Vec::new();
        loop {
            if self.pos == self.buf.len() {
                self.buf.clear();
                self.pos = 0;
                self.buf.resize(8192, 0);
                let n = loop {
                    match self.inner.read(&mut self.buf) {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        other => break other,
                    }
                };
                let n = n.inspect_err(|_| self.buf.clear())?;
                self.buf.truncate(n);
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed inside a chunked body",
                    ));
                }
            }
            let avail = &self.buf[self.pos..];
            match avail.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    line.extend_from_slice(&avail[..i]);
                    self.pos += i + 1;
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                    return String::from_utf8(line).map_err(|_| {
                        io::Error::new(io::ErrorKind::InvalidData, "non-UTF-8 chunk line")
                    });
                }
                None => {
                    line.extend_from_slice(avail);
                    self.pos = self.buf.len();
                }
            }
            if line.len() > MAX_LINE_LEN {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "chunk line too long",
                ));
            }
        }
    }
}

impl<R: Read> Read for Conn<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos < self.buf.len() {
            let n = out.len().min(self.buf.len() - self.pos);
            out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
            self.pos += n;
            return Ok(n);
        }
        self.inner.read(out)
    }
}

/// How the body of a response ends (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// `Content-Length`: this many bytes left.
    Length(u64),
    /// Chunked: in the data of a chunk with this many bytes left (0: a size line is next).
    Chunked { left: u64, started: bool },
    /// The last chunk and trailers were read.
    ChunkedDone,
    /// Until the server closes the connection.
    UntilClose,
}

/// The body of one response.
#[derive(Debug)]
pub struct Body<R> {
    conn: Conn<R>,
    framing: Framing,
}

impl<R: Read> Body<R> {
    pub fn new(conn: Conn<R>, head: &ResponseHead) -> Result<Self, String> {
        let framing = if head.is_chunked() {
            Framing::Chunked {
                left: 0,
                started: false,
            }
        } else {
            match head.content_length()? {
                Some(n) => Framing::Length(n),
                None => Framing::UntilClose,
            }
        };
        Ok(Body { conn, framing })
    }

    /// Body bytes; `Ok(0)` at its proper end, an error when the connection ends early.
    pub fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.framing {
                Framing::Length(0) | Framing::ChunkedDone => return Ok(0),
                Framing::Length(left) => {
                    let want = out.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    let n = self.conn.read(&mut out[..want])?;
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "connection closed before the end of the body",
                        ));
                    }
                    self.framing = Framing::Length(left - n as u64);
                    return Ok(n);
                }
                Framing::UntilClose => return self.conn.read(out),
                Framing::Chunked { left: 0, started } => {
                    if started {
                        // The CRLF that ends the previous chunk's data (RFC 9112 §7.1).
                        let end = self.conn.read_line()?;
                        if !end.is_empty() {
                            return Err(bad_chunk("no line end after chunk data"));
                        }
                    }
                    let line = self.conn.read_line()?;
                    let size = line.split(';').next().unwrap_or_default().trim();
                    let size = u64::from_str_radix(size, 16)
                        .ok()
                        .filter(|_| !size.is_empty() && size.len() <= 16)
                        .ok_or_else(|| bad_chunk("invalid chunk size"))?;
                    if size == 0 {
                        // Trailer section, up to its empty line.
                        while !self.conn.read_line()?.is_empty() {}
                        self.framing = Framing::ChunkedDone;
                    } else {
                        self.framing = Framing::Chunked {
                            left: size,
                            started: true,
                        };
                    }
                }
                Framing::Chunked { left, started } => {
                    let want = out.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    let n = self.conn.read(&mut out[..want])?;
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "connection closed inside a chunked body",
                        ));
                    }
                    self.framing = Framing::Chunked {
                        left: left - n as u64,
                        started,
                    };
                    return Ok(n);
                }
            }
        }
    }
}

fn bad_chunk(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed chunked body: {what}"),
    )
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Hands out its data in the given read sizes (cycled), like `recv` on a socket.
    struct Pieces {
        data: Vec<u8>,
        pos: usize,
        sizes: Vec<usize>,
        next: usize,
    }
    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let want = self.sizes[self.next % self.sizes.len()].max(1);
            self.next += 1;
            let n = want.min(buf.len()).min(self.data.len() - self.pos);
            buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    fn read_body(wire: Vec<u8>, sizes: Vec<usize>, out_len: usize) -> io::Result<Vec<u8>> {
        let mut conn = Conn::new(Pieces {
            data: wire,
            pos: 0,
            sizes,
            next: 0,
        });
        let head = parse_head(&conn.read_head()?).map_err(io::Error::other)?;
        let mut body = Body::new(conn, &head).map_err(io::Error::other)?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; out_len];
        loop {
            let n = body.read(&mut buf)?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    pub(in crate::stream::source) fn chunked(body: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        let mut rest = body;
        let mut i = 0;
        while !rest.is_empty() {
            let n = cuts[i % cuts.len()].clamp(1, rest.len());
            i += 1;
            wire.extend_from_slice(format!("{n:x};ext=1\r\n").as_bytes());
            wire.extend_from_slice(&rest[..n]);
            wire.extend_from_slice(b"\r\n");
            rest = &rest[n..];
        }
        wire.extend_from_slice(b"0\r\nX-Trailer: a\r\n\r\n");
        wire
    }

    #[test]
    fn head_parses_status_and_headers() {
        let raw = b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 5-9/10\r\nETag:  \"v1\" \r\n\r\nBODY";
        let end = head_end(raw).expect("complete head");
        assert_eq!(&raw[end..], b"BODY");
        let head = parse_head(&raw[..end]).expect("valid");
        assert_eq!(head.status, 206);
        assert_eq!(head.header("etag"), Some("\"v1\""));
        assert_eq!(head.header("content-range"), Some("bytes 5-9/10"));
        assert_eq!(head_end(b"HTTP/1.1 200 OK\n\nx"), Some(17));
        assert_eq!(head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n"), None);
        assert!(parse_head(b"HTTP/2 200\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 2000 OK\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\n folded\r\n\r\n").is_err());
    }

    #[test]
    fn length_framing_stops_at_content_length_and_reports_short_bodies() {
        let wire = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA".to_vec();
        assert_eq!(read_body(wire, vec![3], 64).expect("body"), b"hello");
        let short = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhello".to_vec();
        let err = read_body(short, vec![64], 64).expect_err("short body");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        let close = b"HTTP/1.1 200 OK\r\n\r\nuntil close".to_vec();
        assert_eq!(read_body(close, vec![4], 3).expect("body"), b"until close");
    }

    #[test]
    fn malformed_chunks_are_errors() {
        for wire in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n11111111111111111\r\n",
        ] {
            assert!(read_body(wire.to_vec(), vec![7], 16).is_err(), "{wire:?}");
        }
    }

    proptest! {
        #[test]
        fn chunked_bodies_decode_whatever_the_chunk_and_read_sizes(
            body in proptest::collection::vec(any::<u8>(), 0..3000),
            cuts in proptest::collection::vec(1usize..700, 1..6),
            sizes in proptest::collection::vec(1usize..900, 1..6),
            out_len in 1usize..2000,
        ) {
            let wire = chunked(&body, &cuts);
            prop_assert_eq!(read_body(wire, sizes, out_len).expect("valid chunked body"), body);
        }

        #[test]
        fn length_bodies_decode_whatever_the_read_sizes(
            body in proptest::collection::vec(any::<u8>(), 0..3000),
            sizes in proptest::collection::vec(1usize..900, 1..6),
            out_len in 1usize..2000,
        ) {
            let mut wire = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
            wire.extend_from_slice(&body);
            prop_assert_eq!(read_body(wire, sizes, out_len).expect("valid body"), body);
        }

        #[test]
        fn head_parsing_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Some(end) = head_end(&raw) {
                let _ = parse_head(&raw[..end]);
            }
            let _ = parse_head(&raw);
        }
    }
}
