//! HTTP(S) image source: one GET, resumed with `Range` after a dropped connection, fed to the
//! synchronous chain through a bounded channel.
//!
//! # Design
//! The download runs on its own thread with a current-thread tokio runtime (reqwest is async);
//! chunks go through a channel of [`CHANNEL_CHUNKS`] entries to [`ChannelReader`], a plain
//! `Read`, so the chain stays std::io (STYLE.md §2) and a slow disk holds the network back
//! instead of growing memory.
//!
//! Resume: after an error mid-body (or a body shorter than its Content-Length) the next request
//! asks for `Range: bytes=<received>-` with `If-Range: <ETag or Last-Modified>`; a `206` must
//! start exactly there, a `200` (server ignored the range or the object changed) is skipped up to
//! that offset only when no validator changed, else the stream fails. Bounded: [`MAX_RETRIES`]
//! consecutive attempts without progress.
//!
//! Plain `http://` URLs do not come here: [`spawn_download`] reads them with the copy-free
//! blocking client in [`super::plain`], which makes the same resume decisions.
//!
//! # Limitations
//! HTTP/1.1 only; no proxy; no redirects across schemes beyond reqwest's default policy.

use std::io::{self, Read};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use reqwest::header::{CONTENT_RANGE, ETAG, IF_RANGE, LAST_MODIFIED, RANGE};
use reqwest::StatusCode;
use tokio::sync::mpsc;

use super::progress::Progress;

/// Chunks queued between the network and the chain. hyper hands out chunks of up to ~400 KiB
/// (its largest read buffer), so 16 entries bound this queue to about 6 MiB while still letting
/// the network run ahead of a disk write (DESIGN.md §10 memory aim).
pub const CHANNEL_CHUNKS: usize = 16;

/// Attempts in a row that may fail without receiving a byte before the download gives up.
pub const MAX_RETRIES: u32 = 5;

/// How the download connects and waits.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// The only CA to trust for `https://` URLs (PEM); `None` uses the platform verifier.
    pub ca_pem: Option<Vec<u8>>,
    /// TCP + TLS connect timeout.
    pub connect_timeout: Duration,
    /// Longest wait for the next bytes of a response.
    pub read_timeout: Duration,
    /// Pause before the first retry; doubles each time (capped at 10 s).
    pub retry_backoff: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            ca_pem: None,
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            retry_backoff: Duration::from_millis(500),
        }
    }
}

/// Builds the HTTP client: rustls with ring, trusting only `ca_pem` when given
/// (../shared/reference/crates.md: the ramdisk has no CA bundle; pin the conductor's CA).
pub fn build_client(opts: &HttpOptions) -> anyhow::Result<reqwest::Client> {
    // Fails only when a provider is already installed, which is what we want anyway.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let base = || {
        reqwest::Client::builder()
            .connect_timeout(opts.connect_timeout)
            .read_timeout(opts.read_timeout)
            .no_proxy()
            .http1_only()
    };
    if let Some(pem) = &opts.ca_pem {
        let certs =
            reqwest::Certificate::from_pem_bundle(pem).context("parsing the CA certificates")?;
        if certs.is_empty() {
            anyhow::bail!("the CA file holds no PEM certificate");
        }
        return base()
            .tls_certs_only(certs)
            .build()
            .context("building the HTTP client");
    }
    // The ramdisk has no system CA store, and reqwest refuses to build a client without one:
    // fall back to an empty trust store, so plain http works and https needs the given CA.
    match base().build() {
        Ok(client) => Ok(client),
        Err(e) => {
            tracing::info!(
                "no system CA certificates ({e}): https URLs need a CA from the parameters"
            );
            base()
                .tls_certs_only(std::iter::empty::<reqwest::Certificate>())
                .build()
                .context("building the HTTP client")
        }
    }
}

/// A `Read` over chunks sent by the download thread; an `Err` chunk ends the stream with it.
#[derive(Debug)]
pub struct ChannelReader {
    rx: mpsc::Receiver<io::Result<bytes::Bytes>>,
    cur: bytes::Bytes,
    done: bool,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            if self.done {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.cur = chunk,
                Some(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                None => {
                    self.done = true;
                    return Ok(0);
                }
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        bytes::Buf::advance(&mut self.cur, n);
        Ok(n)
    }
}

impl Drop for ChannelReader {
    fn drop(&mut self) {
        // Closing the receiver makes the download thread's next send fail, so it stops by
        // itself; it is not joined, because it may be waiting up to the read timeout for a
        // stalled server and the caller must not.
        self.rx.close();
        if let Some(t) = self.thread.take() {
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// The body of an image download, whichever way it is fetched.
#[derive(Debug)]
pub enum ImageSource {
    /// `http://`: blocking reads straight from the socket into the caller's buffer.
    Plain(Box<super::plain::PlainDownload>),
    /// `https://`: reqwest/rustls on a download thread, chunks through a channel.
    Tls(ChannelReader),
}

impl Read for ImageSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ImageSource::Plain(p) => p.read(buf),
            ImageSource::Tls(c) => c.read(buf),
        }
    }
}

/// Starts downloading `url`; the returned reader yields the body. `http://` is read on the
/// caller's thread without copies ([`super::plain`]); `https://` runs reqwest on a background
/// thread.
pub fn spawn_download(
    url: &str,
    opts: &HttpOptions,
    progress: Arc<Progress>,
) -> anyhow::Result<ImageSource> {
    let url = reqwest::Url::parse(url).with_context(|| format!("parsing the image URL {url}"))?;
    match url.scheme() {
        "http" => Ok(ImageSource::Plain(Box::new(
            super::plain::PlainDownload::new(url, opts, progress),
        ))),
        "https" => spawn_tls_download(url, opts, progress).map(ImageSource::Tls),
        other => bail!("unsupported image URL scheme {other:?} (http or https)"),
    }
}

/// Starts an `https://` download on a background thread with its own tokio runtime.
fn spawn_tls_download(
    url: reqwest::Url,
    opts: &HttpOptions,
    progress: Arc<Progress>,
) -> anyhow::Result<ChannelReader> {
    let client = build_client(opts)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the download runtime")?;
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    let backoff = opts.retry_backoff;
    let thread = std::thread::Builder::new()
        .name("download".into())
        .spawn(move || {
            runtime.block_on(async move {
                if let Err(err) = download(&client, url, backoff, &tx, &progress).await {
                    let _ = tx.send(Err(io::Error::other(format!("{err:#}")))).await;
                }
            })
        })
        .context("starting the download thread")?;
    Ok(ChannelReader {
        rx,
        cur: bytes::Bytes::new(),
        done: false,
        thread: Some(thread),
    })
}

/// An error and its sources, joined with `: ` (reqwest's own message omits the cause, e.g. the
/// certificate problem behind "error sending request").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let msg = s.to_string();
        if !out.ends_with(&msg) {
            out.push_str(": ");
            out.push_str(&msg);
        }
        cur = s.source();
    }
    out
}

/// Whether a rustls error is anywhere in the chain (directly or inside an `io::Error`).
fn is_tls_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
            {
                return true;
            }
        }
        // hyper-util boxes connect errors in types of its own; rustls' messages are stable.
        let msg = err.to_string();
        if msg.contains("invalid peer certificate") || msg.starts_with("received fatal alert") {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The first byte offset of a `Content-Range: bytes START-END/TOTAL` header.
pub(crate) fn content_range_start(value: &str) -> Option<u64> {
    let rest = value.trim().strip_prefix("bytes ")?;
    let (start, _) = rest.split_once('-')?;
    start.trim().parse().ok()
}

async fn download(
    client: &reqwest::Client,
    url: reqwest::Url,
    backoff: Duration,
    tx: &mpsc::Sender<io::Result<bytes::Bytes>>,
    progress: &Progress,
) -> anyhow::Result<()> {
    let mut received: u64 = 0;
    let mut total: Option<u64> = None;
    let mut validator: Option<String> = None;
    let mut failures: u32 = 0;
    let mut last_error = String::new();
    let redacted = {
        // Temp URLs carry a signature in the query: keep it out of logs.
        let mut u = url.clone();
        u.set_query(None);
        u.to_string()
    };
    loop {
        if failures > 0 {
            if failures > MAX_RETRIES {
                bail!(
                    "downloading {redacted} failed after {MAX_RETRIES} retries at byte {received}: {last_error}"
                );
            }
            let pause = backoff
                .saturating_mul(1 << (failures - 1).min(5))
                .min(Duration::from_secs(10));
            tracing::warn!(url = %redacted, received, attempt = failures, error = %last_error, "download interrupted; resuming");
            tokio::time::sleep(pause).await;
        }
        let mut req = client.get(url.clone());
        if received > 0 {
            req = req.header(RANGE, format!("bytes={received}-"));
            if let Some(v) = &validator {
                req = req.header(IF_RANGE, v);
            }
        }
        let mut resp = match req.send().await {
            Ok(r) => r,
            Err(e) if is_tls_error(&e) => {
                // A certificate the pinned CA does not vouch for will not get better by retrying.
                bail!("GET {redacted}: TLS failed: {}", error_chain(&e));
            }
            Err(e) => {
                failures += 1;
                last_error = error_chain(&e);
                continue;
            }
        };
        let status = resp.status();
        let mut skip: u64 = 0;
        if received == 0 {
            if status != StatusCode::OK {
                if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
                    failures += 1;
                    last_error = format!("server answered {status}");
                    continue;
                }
                bail!("GET {redacted}: server answered {status}");
            }
            total = resp.content_length();
            if let Some(t) = total {
                progress.download_total.store(t, Ordering::Relaxed);
            }
            validator = resp
                .headers()
                .get(ETAG)
                .or_else(|| resp.headers().get(LAST_MODIFIED))
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
        } else if status == StatusCode::PARTIAL_CONTENT {
            let start = resp
                .headers()
                .get(CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(content_range_start);
            if start != Some(received) {
                bail!("GET {redacted}: resumed response starts at {start:?}, expected byte {received}");
            }
        } else if status == StatusCode::OK {
            // The range was ignored, or If-Range found the object changed. Without a validator
            // we cannot tell; with one, reqwest sent If-Range and a 200 means "changed".
            if validator.is_some() {
                bail!("GET {redacted}: the image changed on the server while downloading");
            }
            if resp.content_length().is_some() && resp.content_length() != total {
                bail!("GET {redacted}: the image size changed on the server while downloading");
            }
            skip = received;
        } else if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            failures += 1;
            last_error = format!("server answered {status}");
            continue;
        } else {
            bail!("GET {redacted} (resuming at byte {received}): server answered {status}");
        }

        let before = received;
        let outcome = loop {
            match resp.chunk().await {
                Ok(Some(mut chunk)) => {
                    if skip > 0 {
                        let drop_n = skip.min(chunk.len() as u64);
                        bytes::Buf::advance(&mut chunk, drop_n as usize);
                        skip -= drop_n;
                        if chunk.is_empty() {
                            continue;
                        }
                    }
                    received += chunk.len() as u64;
                    progress.downloaded.store(received, Ordering::Relaxed);
                    if tx.send(Ok(chunk)).await.is_err() {
                        // The reader is gone: the pipeline failed or finished early.
                        return Ok(());
                    }
                }
                Ok(None) => break None,
                Err(e) => break Some(error_chain(&e)),
            }
        };
        match (outcome, total) {
            (None, Some(t)) if received < t => {
                last_error = format!("connection closed at byte {received} of {t}");
            }
            (None, Some(t)) if received > t => {
                bail!("GET {redacted}: received {received} bytes, more than the announced {t}");
            }
            (None, _) => return Ok(()),
            (Some(e), _) => last_error = e,
        }
        if total.is_none() {
            // Without a length there is no way to know where a resumed body must end.
            bail!("GET {redacted}: connection lost at byte {received} and the server gave no length to resume against: {last_error}");
        }
        if received > before {
            failures = 1;
        } else {
            failures += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_start_parses() {
        assert_eq!(content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(content_range_start("bytes */200"), None);
        assert_eq!(content_range_start("items 1-2/3"), None);
    }
}
