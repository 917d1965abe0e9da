//! `https://` image source: reqwest/rustls on a download thread of its own, the body handed to the
//! synchronous chain through a bounded channel.
//!
//! # Design
//! The download runs with a current-thread tokio runtime (reqwest is async); chunks go through a
//! channel of [`CHANNEL_CHUNKS`] entries to [`ChannelReader`], a plain `Read`, so the chain stays
//! std::io (docs/style.md §2) and a slow disk holds the network back instead of growing memory.
//! Resume decisions are [`super::resume`]'s, the same as the plain client's. A TLS failure (a
//! certificate the pinned CA does not vouch for) is not retried: it will not get better.
//!
//! # Limitations
//! HTTP/1.1 only; no proxy; redirects as reqwest's default policy follows them.

use std::io::{self, Read};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use reqwest::header::{CONTENT_RANGE, ETAG, IF_RANGE, LAST_MODIFIED, RANGE};
use tokio::sync::mpsc;

use super::resume::{Answer, Ended, Next, Resume};
use crate::http::{build_client, error_chain, is_tls_error, HttpOptions};
use crate::stream::progress::Progress;

/// Chunks queued between the network and the chain. hyper hands out chunks of up to ~400 KiB
/// (its largest read buffer), so 16 entries bound this queue to about 6 MiB while still letting
/// the network run ahead of a disk write (docs/architecture.md §10 memory aim).
pub const CHANNEL_CHUNKS: usize = 16;

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

/// Starts downloading `url` (`https://`; shown in logs as `redacted`) on a background thread with
/// its own tokio runtime; the returned reader yields the body.
pub fn spawn(
    url: reqwest::Url,
    redacted: String,
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
                let download = Download {
                    client: &client,
                    url,
                    redacted: &redacted,
                    tx: &tx,
                    progress: &progress,
                };
                if let Err(err) = download.run(backoff).await {
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

/// One download's fixed parts.
struct Download<'a> {
    client: &'a reqwest::Client,
    url: reqwest::Url,
    redacted: &'a str,
    tx: &'a mpsc::Sender<io::Result<bytes::Bytes>>,
    progress: &'a Progress,
}

impl Download<'_> {
    async fn run(&self, backoff: Duration) -> anyhow::Result<()> {
        let redacted = self.redacted;
        let mut resume = Resume::default();
        loop {
            match resume.pause(backoff) {
                Err(e) => bail!("downloading {redacted} {e}"),
                Ok(None) => {}
                Ok(Some(pause)) => {
                    tracing::warn!(url = %redacted, received = resume.received, attempt = resume.failures, error = %resume.last_error, "download interrupted; resuming");
                    tokio::time::sleep(pause).await;
                }
            }
            let mut req = self.client.get(self.url.clone());
            if let Some((range, if_range)) = resume.range() {
                req = req.header(RANGE, range);
                if let Some(v) = if_range {
                    req = req.header(IF_RANGE, v);
                }
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) if is_tls_error(&e) => {
                    bail!("GET {redacted}: TLS failed: {}", error_chain(&e));
                }
                Err(e) => {
                    resume.failed(error_chain(&e));
                    continue;
                }
            };
            let header = |name| resp.headers().get(name).and_then(|v| v.to_str().ok());
            let next = resume.answer(&Answer {
                status: resp.status().as_u16(),
                content_length: resp.content_length(),
                content_range: header(CONTENT_RANGE),
                etag: header(ETAG),
                last_modified: header(LAST_MODIFIED),
            });
            let skip = match next {
                Next::Read { skip } => skip,
                Next::Retry => continue,
                Next::Fail(e) => bail!("GET {redacted}: {e}"),
            };
            if let Some(t) = resume.total {
                self.progress.download_total.store(t, Ordering::Relaxed);
            }
            let error = match self.body(resp, skip, &mut resume).await {
                Some(Ok(())) => return Ok(()),
                Some(Err(e)) => Some(e),
                None => None,
            };
            match resume.ended(error) {
                Ended::Complete => return Ok(()),
                Ended::Resume(_) => {}
                Ended::Fail(e) => bail!("GET {redacted}: {e}"),
            }
        }
    }

    /// Sends the body on, dropping its first `skip` bytes. `None` when it ended, `Some(Err)` when
    /// it broke off, `Some(Ok)` when the reader went away (the pipeline failed or finished early).
    async fn body(
        &self,
        mut resp: reqwest::Response,
        mut skip: u64,
        resume: &mut Resume,
    ) -> Option<Result<(), String>> {
        loop {
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
                    resume.received += chunk.len() as u64;
                    self.progress
                        .downloaded
                        .store(resume.received, Ordering::Relaxed);
                    if self.tx.send(Ok(chunk)).await.is_err() {
                        return Some(Ok(()));
                    }
                }
                Ok(None) => return None,
                Err(e) => return Some(Err(error_chain(&e))),
            }
        }
    }
}
