//! Plain `http://` image source: a blocking HTTP/1.1 GET over a `TcpStream`, resumed with `Range`
//! after a dropped connection, whose body is read straight into the caller's buffer.
//!
//! # Design
//! The image stream's hot path is `recv` → SHA-256 → disk block. Through reqwest every byte was
//! copied three more times (hyper's read buffer, the channel reader, the copy buffer) and paid
//! page faults for hyper's fresh chunk allocations (bench/agent-stream.sh, perf). Here
//! [`PlainDownload::read`] is a `recv` into the buffer it is given, which [`ImageSink::fill_from`]
//! makes the aligned disk block itself, so a raw image is copied once, by the kernel.
//! `https://` stays on reqwest/rustls ([`super::tls`]); this module never sees TLS.
//!
//! Resume decisions are [`super::resume`]'s, the same as the TLS client's. Timeouts: connect
//! ([`HttpOptions::connect_timeout`]) and every read and write of the socket
//! ([`HttpOptions::read_timeout`]). Framing is [`super::wire`]'s. Redirects (RFC 9110 §15.4) are
//! followed, up to [`MAX_REDIRECTS`], to `http://` URLs only ([`redirect_target`]).
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

use super::resume::{Answer, Ended, Next, Resume};
use super::wire::{parse_head, Body, Conn, ResponseHead};
use crate::http::HttpOptions;
use crate::stream::progress::Progress;

/// Redirects followed per request (reqwest's default policy allows 10 as well).
pub const MAX_REDIRECTS: usize = 10;

/// Why a request did not give a body to read.
enum Failure {
    /// Worth another attempt (connection problems, 5xx, 429).
    Retry(String),
    /// Not worth one.
    Fatal(String),
}

/// Where a response sends the client: `Ok(None)` when it is not a redirect, the next URL when it
/// is one to an `http://` URL, an error otherwise (no Location, a bad one, another scheme).
pub fn redirect_target(
    current: &reqwest::Url,
    status: u16,
    location: Option<&str>,
) -> Result<Option<reqwest::Url>, String> {
    if !matches!(status, 301 | 302 | 303 | 307 | 308) {
        return Ok(None);
    }
    let location = location.ok_or_else(|| format!("redirect {status} without a Location"))?;
    let next = current
        .join(location)
        .map_err(|e| format!("redirect to an invalid URL {location:?}: {e}"))?;
    if next.scheme() != "http" {
        return Err(format!(
            "redirected to a {} URL; give that URL instead",
            next.scheme()
        ));
    }
    Ok(Some(next))
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
    resume: Resume,
    body: Option<Body<TcpStream>>,
    /// Bytes of the current body to drop (a `200` answer to a range request).
    skip: u64,
    finished: bool,
    fatal: Option<String>,
}

impl PlainDownload {
    /// A download of `url` (must be `http://`), shown in logs as `redacted`; nothing is sent until
    /// the first read.
    pub fn new(
        url: reqwest::Url,
        redacted: String,
        opts: &HttpOptions,
        progress: Arc<Progress>,
    ) -> Self {
        PlainDownload {
            url,
            redacted,
            connect_timeout: opts.connect_timeout,
            read_timeout: opts.read_timeout,
            backoff: opts.retry_backoff,
            progress,
            resume: Resume::default(),
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
            match redirect_target(&url, head.status, head.header("location")) {
                Ok(None) => return Ok((head, conn)),
                Ok(Some(next)) => {
                    tracing::debug!(status = head.status, "following a redirect");
                    url = next;
                }
                Err(e) => return Err(Failure::Fatal(e)),
            }
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
        if let Some((range, if_range)) = self.resume.range() {
            req.push_str(&format!("Range: {range}\r\n"));
            if let Some(v) = if_range {
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

    /// Sends requests until one gives a body to read from `received` on, or fails.
    fn open(&mut self) -> Result<(), String> {
        let redacted = self.redacted.clone();
        loop {
            match self.resume.pause(self.backoff) {
                Err(e) => return Err(format!("downloading {redacted} {e}")),
                Ok(None) => {}
                Ok(Some(pause)) => {
                    tracing::warn!(url = %redacted, received = self.resume.received, attempt = self.resume.failures, error = %self.resume.last_error, "download interrupted; resuming");
                    std::thread::sleep(pause);
                }
            }
            let (head, conn) = match self.request() {
                Ok(r) => r,
                Err(Failure::Retry(e)) => {
                    self.resume.failed(e);
                    continue;
                }
                Err(Failure::Fatal(e)) => return Err(format!("GET {redacted}: {e}")),
            };
            // A chunked body's Content-Length, if any, means nothing (RFC 9112 §6.3).
            let content_length = if head.is_chunked() {
                None
            } else {
                head.content_length()
                    .map_err(|e| format!("GET {redacted}: {e}"))?
            };
            let next = self.resume.answer(&Answer {
                status: head.status,
                content_length,
                content_range: head.header("content-range"),
                etag: head.header("etag"),
                last_modified: head.header("last-modified"),
            });
            let skip = match next {
                Next::Read { skip } => skip,
                Next::Retry => continue,
                Next::Fail(e) => return Err(format!("GET {redacted}: {e}")),
            };
            if let Some(t) = self.resume.total {
                self.progress.download_total.store(t, Ordering::Relaxed);
            }
            self.body = Some(Body::new(conn, &head).map_err(|e| format!("GET {redacted}: {e}"))?);
            self.skip = skip;
            return Ok(());
        }
    }

    /// The current body ended (cleanly, or with `error`): finish, plan a resume, or fail.
    fn ended(&mut self, error: Option<String>) {
        self.body = None;
        match self.resume.ended(error) {
            Ended::Complete => self.finished = true,
            Ended::Resume(_) => {}
            Ended::Fail(e) => self.fatal = Some(format!("GET {}: {e}", self.redacted)),
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
            let Some(body) = self.body.as_mut() else {
                if let Err(e) = self.open() {
                    self.fatal = Some(e);
                }
                continue;
            };
            match body.read(buf) {
                Ok(0) => self.ended(None),
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
                    self.resume.received += n as u64;
                    self.progress
                        .downloaded
                        .store(self.resume.received, Ordering::Relaxed);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let received = self.resume.received;
                    let msg = match e.kind() {
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                            "no data for {} s at byte {received}",
                            self.read_timeout.as_secs(),
                        ),
                        io::ErrorKind::UnexpectedEof => match self.resume.total {
                            Some(t) => format!("connection closed at byte {received} of {t}"),
                            None => e.to_string(),
                        },
                        _ => e.to_string(),
                    };
                    self.ended(Some(msg));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::source::wire::tests::chunked;

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
        let mut d = PlainDownload::new(
            url,
            "test URL".to_owned(),
            &opts,
            Arc::new(Progress::default()),
        );
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

    #[test]
    fn redirects_are_followed_to_http_only() {
        let here = reqwest::Url::parse("http://h:81/a/b?x=1").expect("url");
        // (status, Location, where it leads or why not)
        type Case = (
            u16,
            Option<&'static str>,
            Result<Option<&'static str>, &'static str>,
        );
        let cases: &[Case] = &[
            (200, None, Ok(None)),
            (206, Some("/ignored"), Ok(None)),
            (404, None, Ok(None)),
            (302, Some("/real?sig=s"), Ok(Some("http://h:81/real?sig=s"))),
            (307, Some("c"), Ok(Some("http://h:81/a/c"))),
            (301, Some("http://other/x"), Ok(Some("http://other/x"))),
            (308, None, Err("redirect 308 without a Location")),
            (
                303,
                Some("https://h/x"),
                Err("redirected to a https URL; give that URL instead"),
            ),
        ];
        for &(status, location, ref want) in cases {
            let got = redirect_target(&here, status, location).map(|u| u.map(String::from));
            let want = want.map(|u| u.map(str::to_owned)).map_err(str::to_owned);
            assert_eq!(got, want, "{status} {location:?}");
        }
    }
}
