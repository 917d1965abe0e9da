//! Plain `http://` image source: a blocking HTTP/1.1 GET over a `TcpStream`, resumed with `Range`
//! after a dropped connection, whose body is read straight into the caller's buffer.
//!
//! # Design
//! The image stream's hot path is `recv` → SHA-256 → disk block. Through reqwest every byte was
//! copied three more times (hyper's read buffer, the channel reader, the copy buffer) and paid
//! page faults for hyper's fresh chunk allocations (bench/agent-stream.sh, perf). Here
//! [`PlainDownload::read`] is a `recv` into the buffer it is given, which [`ImageSink::fill_from`]
//! makes the aligned disk block itself, so a raw image is copied once, by the kernel.
//! `https://` stays on reqwest/rustls ([`super::http`]); this module never sees TLS.
//!
//! Resume follows [`super::http`] exactly (the same decisions on the same statuses and headers):
//! `Range: bytes=<received>-` with `If-Range: <ETag or Last-Modified>`, a `206` must start there,
//! a `200` is skipped up to that offset only without a validator, [`MAX_RETRIES`] attempts in a
//! row without progress. Timeouts: connect ([`HttpOptions::connect_timeout`]) and every read and
//! write of the socket ([`HttpOptions::read_timeout`]).
//!
//! Framing (RFC 9112 §6): `Transfer-Encoding: chunked` (§7.1), else `Content-Length`, else the
//! body ends when the server closes the connection. Redirects (RFC 9110 §15.4) are followed, up
//! to [`MAX_REDIRECTS`], to `http://` URLs only.
//!
//! # Limitations
//! One request per connection (`Connection: close`); no proxy; no `Content-Encoding` handling
//! (none is asked for: the digest covers the bytes as sent).
//!
//! [`ImageSink::fill_from`]: crate::disk::sink::ImageSink::fill_from

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::http::{content_range_start, HttpOptions, MAX_RETRIES};
use super::progress::Progress;

/// Redirects followed per request (reqwest's default policy allows 10 as well).
pub const MAX_REDIRECTS: usize = 10;

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
    fn content_length(&self) -> Result<Option<u64>, String> {
        match self.header("content-length") {
            None => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .map(Some)
                .map_err(|_| format!("invalid Content-Length {v:?}")),
        }
    }

    /// Whether the body is chunked (RFC 9112 §6.1: chunked must be the final coding).
    fn is_chunked(&self) -> bool {
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
struct Conn<R> {
    inner: R,
    buf: Vec<u8>,
    pos: usize,
}

impl<R: Read> Conn<R> {
    fn new(inner: R) -> Self {
        Conn {
            inner,
            buf: Vec::new(),
            pos: 0,
        }
    }

    /// Reads the response head; the bytes after it stay buffered.
    fn read_head(&mut self) -> io::Result<Vec<u8>> {
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
struct Body<R> {
    conn: Conn<R>,
    framing: Framing,
}

impl<R: Read> Body<R> {
    fn new(conn: Conn<R>, head: &ResponseHead) -> Result<Self, String> {
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
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
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

/// Why a request did not give a body to read.
enum Failure {
    /// Worth another attempt (connection problems, 5xx, 429).
    Retry(String),
    /// Not worth one.
    Fatal(String),
}

/// An `http://` download that reads its body straight into the caller's buffers and resumes
/// after dropped connections; see the module documentation.
#[derive(Debug)]
pub struct PlainDownload {
    url: reqwest::Url,
    redacted: String,
    connect_timeout: Duration,
    read_timeout: Duration,
    backoff: Duration,
    progress: Arc<Progress>,
    received: u64,
    total: Option<u64>,
    validator: Option<String>,
    failures: u32,
    last_error: String,
    /// `received` when the current body started (progress within an attempt resets the count).
    attempt_start: u64,
    body: Option<Body<TcpStream>>,
    /// Bytes of the current body to drop (a `200` answer to a range request).
    skip: u64,
    finished: bool,
    fatal: Option<String>,
}

impl PlainDownload {
    /// A download of `url` (must be `http://`); nothing is sent until the first read.
    pub fn new(url: reqwest::Url, opts: &HttpOptions, progress: Arc<Progress>) -> Self {
        let redacted = {
            // Temp URLs carry a signature in the query: keep it out of logs.
            let mut u = url.clone();
            u.set_query(None);
            u.to_string()
        };
        PlainDownload {
            url,
            redacted,
            connect_timeout: opts.connect_timeout,
            read_timeout: opts.read_timeout,
            backoff: opts.retry_backoff,
            progress,
            received: 0,
            total: None,
            validator: None,
            failures: 0,
            last_error: String::new(),
            attempt_start: 0,
            body: None,
            skip: 0,
            finished: false,
            fatal: None,
        }
    }

    /// Connects (following redirects), sends the GET and reads the response head.
    fn request(&self) -> Result<(ResponseHead, Conn<TcpStream>), Failure> {
        let mut url = self.url.clone();
        for _ in 0..=MAX_REDIRECTS {
            let (head, conn) = self.exchange(&url)?;
            if matches!(head.status, 301 | 302 | 303 | 307 | 308) {
                let location = head.header("location").ok_or_else(|| {
                    Failure::Fatal(format!("redirect {} without a Location", head.status))
                })?;
                let next = url.join(location).map_err(|e| {
                    Failure::Fatal(format!("redirect to an invalid URL {location:?}: {e}"))
                })?;
                if next.scheme() != "http" {
                    return Err(Failure::Fatal(format!(
                        "redirected to a {} URL; give that URL instead",
                        next.scheme()
                    )));
                }
                tracing::debug!(status = head.status, "following a redirect");
                url = next;
                continue;
            }
            return Ok((head, conn));
        }
        Err(Failure::Fatal(format!(
            "more than {MAX_REDIRECTS} redirects"
        )))
    }

    /// One request/response exchange on a new connection.
    fn exchange(&self, url: &reqwest::Url) -> Result<(ResponseHead, Conn<TcpStream>), Failure> {
        let host = url
            .host_str()
            .ok_or_else(|| Failure::Fatal("the URL has no host".to_owned()))?;
        let addrs = url
            .socket_addrs(|| Some(80))
            .map_err(|e| Failure::Retry(format!("resolving {host}: {e}")))?;
        let mut last = format!("{host} resolved to no address");
        let mut stream = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, self.connect_timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = format!("connecting to {addr}: {e}"),
            }
        }
        let mut stream = stream.ok_or(Failure::Retry(last))?;
        let io_err = |what: &str, e: io::Error| {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                Failure::Retry(format!(
                    "{what}: no answer within {} s",
                    self.read_timeout.as_secs()
                ))
            } else {
                Failure::Retry(format!("{what}: {e}"))
            }
        };
        stream
            .set_read_timeout(Some(self.read_timeout))
            .and_then(|()| stream.set_write_timeout(Some(self.read_timeout)))
            .map_err(|e| io_err("setting socket timeouts", e))?;

        let mut target = url.path().to_owned();
        if let Some(q) = url.query() {
            target.push('?');
            target.push_str(q);
        }
        let host_header = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_owned(),
        };
        let mut req = format!(
            "GET {target} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: vmdeploy-agent\r\nAccept: */*\r\nConnection: close\r\n"
        );
        if self.received > 0 {
            req.push_str(&format!("Range: bytes={}-\r\n", self.received));
            if let Some(v) = &self.validator {
                req.push_str(&format!("If-Range: {v}\r\n"));
            }
        }
        req.push_str("\r\n");
        stream
            .write_all(req.as_bytes())
            .map_err(|e| io_err("sending the request", e))?;

        let mut conn = Conn::new(stream);
        loop {
            let raw = conn
                .read_head()
                .map_err(|e| io_err("reading the response", e))?;
            let head = parse_head(&raw).map_err(Failure::Retry)?;
            // 1xx interim responses come before the real one (RFC 9110 §15.2).
            if (100..200).contains(&head.status) {
                continue;
            }
            return Ok((head, conn));
        }
    }

    /// Sends requests until one gives a body to read from `self.received` on, or fails.
    fn open(&mut self) -> Result<(), String> {
        let redacted = self.redacted.clone();
        loop {
            if self.failures > 0 {
                if self.failures > MAX_RETRIES {
                    return Err(format!(
                        "downloading {redacted} failed after {MAX_RETRIES} retries at byte {}: {}",
                        self.received, self.last_error
                    ));
                }
                let pause = self
                    .backoff
                    .saturating_mul(1 << (self.failures - 1).min(5))
                    .min(Duration::from_secs(10));
                tracing::warn!(url = %redacted, received = self.received, attempt = self.failures, error = %self.last_error, "download interrupted; resuming");
                std::thread::sleep(pause);
            }
            let (head, conn) = match self.request() {
                Ok(r) => r,
                Err(Failure::Retry(e)) => {
                    self.failures += 1;
                    self.last_error = e;
                    continue;
                }
                Err(Failure::Fatal(e)) => return Err(format!("GET {redacted}: {e}")),
            };
            let status = head.status;
            let retryable = status >= 500 || status == 429;
            let mut skip = 0;
            if self.received == 0 {
                if status != 200 {
                    if retryable {
                        self.failures += 1;
                        self.last_error = format!("server answered {status}");
                        continue;
                    }
                    return Err(format!("GET {redacted}: server answered {status}"));
                }
                // A chunked body's Content-Length, if any, means nothing (RFC 9112 §6.3).
                self.total = if head.is_chunked() {
                    None
                } else {
                    head.content_length()
                        .map_err(|e| format!("GET {redacted}: {e}"))?
                };
                if let Some(t) = self.total {
                    self.progress.download_total.store(t, Ordering::Relaxed);
                }
                // Only a value that is safe to send back in a header line.
                self.validator = head
                    .header("etag")
                    .or_else(|| head.header("last-modified"))
                    .filter(|v| v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)))
                    .map(str::to_owned);
            } else if status == 206 {
                let start = head.header("content-range").and_then(content_range_start);
                if start != Some(self.received) {
                    return Err(format!(
                        "GET {redacted}: resumed response starts at {start:?}, expected byte {}",
                        self.received
                    ));
                }
            } else if status == 200 {
                // The range was ignored, or If-Range found the object changed.
                if self.validator.is_some() {
                    return Err(format!(
                        "GET {redacted}: the image changed on the server while downloading"
                    ));
                }
                let len = head
                    .content_length()
                    .map_err(|e| format!("GET {redacted}: {e}"))?;
                if len.is_some() && len != self.total {
                    return Err(format!(
                        "GET {redacted}: the image size changed on the server while downloading"
                    ));
                }
                skip = self.received;
            } else if retryable {
                self.failures += 1;
                self.last_error = format!("server answered {status}");
                continue;
            } else {
                return Err(format!(
                    "GET {redacted} (resuming at byte {}): server answered {status}",
                    self.received
                ));
            }
            self.body = Some(Body::new(conn, &head).map_err(|e| format!("GET {redacted}: {e}"))?);
            self.skip = skip;
            self.attempt_start = self.received;
            return Ok(());
        }
    }

    /// The current body stopped early (`error`): plan a resume, or fail when none is possible.
    fn interrupted(&mut self, error: String) {
        self.body = None;
        self.last_error = error;
        if self.total.is_none() {
            // Without a length there is no way to know where a resumed body must end.
            self.fatal = Some(format!(
                "GET {}: connection lost at byte {} and the server gave no length to resume against: {}",
                self.redacted, self.received, self.last_error
            ));
        } else if self.received > self.attempt_start {
            self.failures = 1;
        } else {
            self.failures += 1;
        }
    }
}

impl Read for PlainDownload {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if let Some(e) = &self.fatal {
                return Err(io::Error::other(e.clone()));
            }
            if self.finished {
                return Ok(0);
            }
            if self.body.is_none() {
                if let Err(e) = self.open() {
                    self.fatal = Some(e);
                }
                continue;
            }
            let body = self.body.as_mut().expect("opened above");
            match body.read(buf) {
                Ok(0) => {
                    self.body = None;
                    match self.total {
                        Some(t) if self.received < t => {
                            let msg = format!("connection closed at byte {} of {t}", self.received);
                            self.interrupted(msg);
                        }
                        Some(t) if self.received > t => {
                            self.fatal = Some(format!(
                                "GET {}: received {} bytes, more than the announced {t}",
                                self.redacted, self.received
                            ));
                        }
                        _ => self.finished = true,
                    }
                }
                Ok(mut n) => {
                    if self.skip > 0 {
                        let drop_n = usize::try_from(self.skip).unwrap_or(usize::MAX).min(n);
                        buf.copy_within(drop_n..n, 0);
                        n -= drop_n;
                        self.skip -= drop_n as u64;
                        if n == 0 {
                            continue;
                        }
                    }
                    self.received += n as u64;
                    self.progress
                        .downloaded
                        .store(self.received, Ordering::Relaxed);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let msg = match e.kind() {
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                            "no data for {} s at byte {}",
                            self.read_timeout.as_secs(),
                            self.received
                        ),
                        io::ErrorKind::UnexpectedEof => match self.total {
                            Some(t) => {
                                format!("connection closed at byte {} of {t}", self.received)
                            }
                            None => e.to_string(),
                        },
                        _ => e.to_string(),
                    };
                    self.interrupted(msg);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
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

    fn chunked(body: &[u8], cuts: &[usize]) -> Vec<u8> {
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

    /// Serves one canned response per connection, in order, on 127.0.0.1; returns the URL base
    /// and the requests it saw.
    fn serve(responses: Vec<Vec<u8>>) -> (String, std::thread::JoinHandle<Vec<String>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for response in responses {
                let (mut s, _) = listener.accept().expect("accept");
                let mut conn = Conn::new(s.try_clone().expect("clone"));
                let head = conn.read_head().expect("request head");
                seen.push(String::from_utf8_lossy(&head).into_owned());
                s.write_all(&response).expect("respond");
            }
            seen
        });
        (base, thread)
    }

    fn download(url: &str) -> io::Result<Vec<u8>> {
        let opts = HttpOptions {
            retry_backoff: Duration::from_millis(1),
            read_timeout: Duration::from_secs(5),
            ..Default::default()
        };
        let url = reqwest::Url::parse(url).expect("valid URL");
        let mut d = PlainDownload::new(url, &opts, Arc::new(Progress::default()));
        let mut out = Vec::new();
        d.read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn redirect_then_chunked_body_over_tcp() {
        let body: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        let (base, server) = serve(vec![
            b"HTTP/1.1 302 Found\r\nLocation: /real?sig=x\r\nContent-Length: 0\r\n\r\n".to_vec(),
            chunked(&body, &[1000, 17, 40_000]),
        ]);
        let got = download(&format!("{base}/image?temp_url_sig=s")).expect("downloaded");
        assert_eq!(got, body);
        let seen = server.join().expect("server");
        assert!(
            seen[0].starts_with("GET /image?temp_url_sig=s HTTP/1.1\r\n"),
            "{}",
            seen[0]
        );
        assert!(
            seen[1].starts_with("GET /real?sig=x HTTP/1.1\r\n"),
            "{}",
            seen[1]
        );
        assert!(
            !seen[1].contains("Range"),
            "a fresh download asks for no range"
        );
    }

    #[test]
    fn dropped_body_resumes_with_range_and_if_range() {
        let body: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        let mut first = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nETag: \"e1\"\r\n\r\n",
            body.len()
        )
        .into_bytes();
        first.extend_from_slice(&body[..4321]);
        let mut second = format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 4321-{}/{}\r\nContent-Length: {}\r\n\r\n",
            body.len() - 1,
            body.len(),
            body.len() - 4321
        )
        .into_bytes();
        second.extend_from_slice(&body[4321..]);
        let (base, server) = serve(vec![first, second]);
        assert_eq!(download(&format!("{base}/img")).expect("resumed"), body);
        let seen = server.join().expect("server");
        assert!(seen[1].contains("Range: bytes=4321-\r\n"), "{}", seen[1]);
        assert!(seen[1].contains("If-Range: \"e1\"\r\n"), "{}", seen[1]);
    }

    #[test]
    fn client_errors_are_not_retried_and_redirects_to_https_refused() {
        let (base, server) = serve(vec![
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec()
        ]);
        let err = download(&format!("{base}/missing")).expect_err("404");
        assert!(err.to_string().contains("server answered 404"), "{err}");
        assert_eq!(server.join().expect("server").len(), 1);
        let (base, server) = serve(vec![
            b"HTTP/1.1 301 Moved\r\nLocation: https://127.0.0.1:1/x\r\n\r\n".to_vec(),
        ]);
        let err = download(&format!("{base}/x")).expect_err("https redirect");
        assert!(
            err.to_string().contains("redirected to a https URL"),
            "{err}"
        );
        server.join().expect("server");
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
