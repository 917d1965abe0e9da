//! Fetching an image into a local file: an async side reads the source (`http(s)://` with
//! timeouts and bounded retries, or `file://`) and hands chunks over a bounded channel to a
//! blocking side that digests them and writes them sparse ([`write_download`]).
//!
//! # Design
//! The split keeps hashing and file writes off the runtime's threads (docs/style.md §2: std::io on a
//! blocking thread) with no extra crate; the channel's bound is the back-pressure. A broken
//! download is retried from the start: the async side sends [`Msg::Restart`], and the writer
//! truncates its file and starts a fresh digest, so the digest always covers exactly the bytes of
//! one complete response. (The agent resumes with `Range`; the conductor fetches over a LAN or a
//! local file, where a restart costs little and is simpler to get right.)
//!
//! # Limitations
//! No resume; redirects are followed (reqwest's default, at most 10), as an image server behind
//! a redirect is common and the digest is what guarantees the content.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use vmdeploy_shared::io::hash::{HashAlgo, Hasher};

use super::format::{self, ImageFormat, HEADER_LEN};
use super::sparse::SparseWriter;
use super::ImageCacheError;
use crate::net::https::{ClientSpec, PemCertificates, Trust};
use crate::net::retry::RetryPolicy;

/// Chunks in flight between the reader and the writer: with hyper's chunks of up to ~400 KiB a
/// few MiB at most, enough to keep both sides busy.
pub const CHANNEL_DEPTH: usize = 16;

/// Read size for `file://` sources (shared::io's `BUFFER_SIZE`, coreos-installer's choice).
const FILE_CHUNK: usize = vmdeploy_shared::io::BUFFER_SIZE;

/// What the writer is told.
#[derive(Debug)]
pub enum Msg {
    /// The next bytes of the image.
    Data(Bytes),
    /// The download starts over: drop what was written.
    Restart,
}

/// How `http(s)://` images are fetched.
#[derive(Debug, Clone)]
pub struct FetchPolicy {
    /// Attempts per download, counting the first (connection failures, broken bodies, 502,
    /// 503 and 504 are retried; other statuses are not).
    pub attempts: u32,
    /// Connecting to the image server.
    pub connect_timeout: Duration,
    /// Longest wait for the next bytes: a stalled server fails, a slow but moving download of a
    /// large image does not (a total timeout could not tell them apart).
    pub read_timeout: Duration,
    /// Wait before the second attempt, doubled before each later one.
    pub retry_delay: Duration,
    /// Extra CA certificates (PEM) to trust besides the system's, e.g. the built-in object
    /// store's generated CA, whose temp URLs `swift://` references resolve to.
    pub extra_ca_pem: Option<String>,
}

impl Default for FetchPolicy {
    fn default() -> FetchPolicy {
        FetchPolicy {
            attempts: 3,
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            retry_delay: Duration::from_secs(2),
            extra_ca_pem: None,
        }
    }
}

impl FetchPolicy {
    /// The retries of one download: `attempts`, `retry_delay` doubled, no overall deadline
    /// (a large image on a slow link may take long; the read timeout catches a stall).
    pub fn retry(&self) -> RetryPolicy {
        RetryPolicy::new(self.attempts, self.retry_delay)
    }
}

/// The HTTP client of the cache: a transfer client trusting the system's roots and
/// [`FetchPolicy::extra_ca_pem`].
pub fn build_client(policy: &FetchPolicy) -> Result<reqwest::Client, ImageCacheError> {
    let trust = match &policy.extra_ca_pem {
        Some(pem) => Trust::SystemAnd(PemCertificates::new(
            "the image cache's extra CA certificates",
            pem.clone(),
        )),
        None => Trust::System,
    };
    ClientSpec::transfer(trust, policy.connect_timeout, policy.read_timeout)
        .build()
        .map_err(|e| {
            ImageCacheError::io(
                "building the image cache's HTTP client",
                std::io::Error::other(e),
            )
        })
}

/// How the reading side ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Fed {
    /// The whole image was sent.
    Complete,
    /// The writer stopped taking bytes: its own error says why.
    WriterGone,
}

/// Reads the image at `url` and sends it to `tx`.
pub async fn feed(
    client: &reqwest::Client,
    policy: &FetchPolicy,
    url: &str,
    tx: &mpsc::Sender<Msg>,
) -> Result<Fed, ImageCacheError> {
    let parsed = url::Url::parse(url).map_err(|_| ImageCacheError::UnsupportedUrl {
        url: url.to_owned(),
    })?;
    match parsed.scheme() {
        "http" | "https" => feed_http(client, policy, url, tx).await,
        "file" => {
            let path = parsed
                .to_file_path()
                .map_err(|()| ImageCacheError::UnsupportedUrl {
                    url: url.to_owned(),
                })?;
            feed_file(url, &path, tx).await
        }
        _ => Err(ImageCacheError::UnsupportedUrl {
            url: url.to_owned(),
        }),
    }
}

async fn feed_file(url: &str, path: &Path, tx: &mpsc::Sender<Msg>) -> Result<Fed, ImageCacheError> {
    let mut file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ImageCacheError::NotFound {
                url: url.to_owned(),
            })
        }
        Err(e) => {
            return Err(ImageCacheError::io(
                format!("opening {}", path.display()),
                e,
            ))
        }
    };
    loop {
        let mut buf = Vec::with_capacity(FILE_CHUNK);
        let n = (&mut file)
            .take(FILE_CHUNK as u64)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| ImageCacheError::io(format!("reading {}", path.display()), e))?;
        if n == 0 {
            return Ok(Fed::Complete);
        }
        if tx.send(Msg::Data(Bytes::from(buf))).await.is_err() {
            return Ok(Fed::WriterGone);
        }
    }
}

/// One attempt's failure: retried or not.
enum Attempt {
    Retry(String),
    Fail(ImageCacheError),
}

async fn feed_http(
    client: &reqwest::Client,
    policy: &FetchPolicy,
    url: &str,
    tx: &mpsc::Sender<Msg>,
) -> Result<Fed, ImageCacheError> {
    let retry = policy.retry();
    let outcome = retry
        .run(
            |failure| matches!(failure, Attempt::Retry(_)),
            |r| {
                if let Attempt::Retry(reason) = r.error {
                    let shown = super::error::shown_url(url);
                    tracing::warn!(url = %shown, attempt = r.failed + 1, %reason, "retrying the image download");
                }
            },
            |n| async move {
                // Every later attempt starts the image over.
                if n > 1 && tx.send(Msg::Restart).await.is_err() {
                    return Ok(Fed::WriterGone);
                }
                http_attempt(client, url, tx).await
            },
        )
        .await;
    outcome.map_err(|e| {
        let attempts = e.attempts();
        match e.into_last() {
            Some(Attempt::Fail(e)) => e,
            Some(Attempt::Retry(reason)) => ImageCacheError::Fetch {
                url: url.to_owned(),
                attempts,
                reason,
            },
            // The policy has no deadline.
            None => ImageCacheError::Fetch {
                url: url.to_owned(),
                attempts,
                reason: "no answer".to_owned(),
            },
        }
    })
}

async fn http_attempt(
    client: &reqwest::Client,
    url: &str,
    tx: &mpsc::Sender<Msg>,
) -> Result<Fed, Attempt> {
    let mut response = client
        .get(url)
        .send()
        .await
        .map_err(|e| Attempt::Retry(error_chain(&e.without_url())))?;
    let status = response.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Err(Attempt::Fail(ImageCacheError::NotFound {
            url: url.to_owned(),
        }));
    }
    if matches!(status.as_u16(), 502..=504) {
        return Err(Attempt::Retry(format!("HTTP status {status}")));
    }
    if !status.is_success() {
        return Err(Attempt::Fail(ImageCacheError::Http {
            url: url.to_owned(),
            status: status.as_u16(),
        }));
    }
    loop {
        // hyper reports a body cut short of its Content-Length (or a chunked body without its
        // last chunk) as an error, so a dropped connection never looks like a complete image.
        match response.chunk().await {
            Ok(Some(bytes)) => {
                if tx.send(Msg::Data(bytes)).await.is_err() {
                    return Ok(Fed::WriterGone);
                }
            }
            Ok(None) => return Ok(Fed::Complete),
            Err(e) => return Err(Attempt::Retry(error_chain(&e.without_url()))),
        }
    }
}

/// reqwest's message and its causes ("error sending request" alone says little).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// What [`write_download`] produced.
#[derive(Debug)]
pub struct Downloaded {
    /// Bytes downloaded.
    pub len: u64,
    /// Digest of the download, lowercase hex.
    pub digest_hex: String,
    /// The format, from the first bytes.
    pub format: ImageFormat,
}

/// Receives the image from `rx` into the new file `path` (sparse), digesting it with `algo`.
/// Fails early, before the download ends, when the download passes `limit` bytes, when a qcow2's
/// virtual size does, or when the first bytes show a format the cache cannot hold (unless
/// `as_is`: a kernel or a ramdisk, kept as it came). Blocking.
pub fn write_download(
    mut rx: mpsc::Receiver<Msg>,
    path: &Path,
    algo: HashAlgo,
    limit: u64,
    url: &str,
    as_is: bool,
) -> Result<Downloaded, ImageCacheError> {
    let check_head = |url: &str, head: &[u8], limit: u64| {
        if as_is {
            Ok(ImageFormat::Raw)
        } else {
            check_head(url, head, limit)
        }
    };
    let create = || {
        File::create(path)
            .map(SparseWriter::new)
            .map_err(|e| ImageCacheError::io(format!("creating {}", path.display()), e))
    };
    let mut writer = create()?;
    let mut hasher = Hasher::new(algo);
    let mut head: Vec<u8> = Vec::with_capacity(HEADER_LEN);
    let mut format: Option<ImageFormat> = None;
    while let Some(msg) = rx.blocking_recv() {
        let data = match msg {
            Msg::Data(data) => data,
            Msg::Restart => {
                writer = create()?;
                hasher = Hasher::new(algo);
                head.clear();
                format = None;
                continue;
            }
        };
        hasher.update(&data);
        if format.is_none() {
            let want = HEADER_LEN - head.len();
            head.extend_from_slice(&data[..want.min(data.len())]);
            if head.len() == HEADER_LEN {
                format = Some(check_head(url, &head, limit)?);
            }
        }
        writer
            .write_all(&data)
            .map_err(|e| ImageCacheError::io(format!("writing {}", path.display()), e))?;
        if writer.len() > limit {
            return Err(ImageCacheError::TooLarge {
                url: url.to_owned(),
                size: writer.len(),
                limit,
            });
        }
    }
    let format = match format {
        Some(f) => f,
        // Shorter than a header: judge what there is.
        None => check_head(url, &head, limit)?,
    };
    let (file, len) = writer
        .finish()
        .map_err(|e| ImageCacheError::io(format!("finishing {}", path.display()), e))?;
    file.sync_all()
        .map_err(|e| ImageCacheError::io(format!("syncing {}", path.display()), e))?;
    Ok(Downloaded {
        len,
        digest_hex: hasher.finalize_hex(),
        format,
    })
}

fn check_head(url: &str, head: &[u8], limit: u64) -> Result<ImageFormat, ImageCacheError> {
    let (format, virtual_size) = format::detect(url, head)?;
    if let Some(size) = virtual_size.filter(|&s| s > limit) {
        return Err(ImageCacheError::TooLarge {
            url: url.to_owned(),
            size,
            limit,
        });
    }
    Ok(format)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Extra CA text holding no certificate used to be accepted and trust nothing extra, so a
    /// `swift://` temp URL on the built-in store failed later with an unknown issuer.
    #[test]
    fn extra_ca_text_without_a_certificate_is_refused() {
        let policy = FetchPolicy {
            extra_ca_pem: Some("not a certificate".to_owned()),
            ..FetchPolicy::default()
        };
        let err = build_client(&policy).expect_err("nothing to trust");
        let text = format!("{err:#}");
        assert!(
            text.contains("extra CA certificates holds no PEM certificate"),
            "{text}"
        );
        let none = FetchPolicy::default();
        build_client(&none).expect("the system's roots alone");
    }
}
