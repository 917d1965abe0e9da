//! Reading a virtual media image URL the way iLO does: by HTTP range requests.
//!
//! iLO does not download an image; it reads the sectors the host asks for with `Range` requests
//! (docs/architecture.md §4 "iLO and QEMU read virtual media by range"). On INSERT_VIRTUAL_MEDIA the emulator
//! reads the first sectors once, so a URL that does not answer fails the insert the way a bad URL
//! fails on iLO (the exact iLO message is not known; see README "Fidelity").

use std::time::Duration;
use vmdeploy_shared::redact::Url;

/// How much the probe reads: the first four 512-byte sectors.
const PROBE_BYTES: u64 = 2048;
/// Time allowed for the probe, connect included.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Why an image URL could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MediaFetchError {
    /// Not an http(s) URL.
    #[error("invalid image URL {0:?}")]
    InvalidUrl(String),
    /// Connection, TLS or timeout failure.
    #[error("unable to reach {url}: {reason}")]
    Unreachable {
        /// The URL.
        url: String,
        /// Transport error.
        reason: String,
    },
    /// The server answered with an error status.
    #[error("{url} answered HTTP {status}")]
    HttpStatus {
        /// The URL.
        url: String,
        /// HTTP status.
        status: u16,
    },
    /// The image is empty.
    #[error("{0} is an empty image")]
    Empty(String),
}

/// How the emulated firmware reads the boot medium at each boot from it: the first
/// `boot_bytes` of the image, in `range_bytes` requests, `concurrency` at once, each answered
/// `latency` later than the server answers it (a BMC's own per-request cost; Tinkerbell counted
/// about 3000 `206` requests per ISO boot, docs/ilo-quirks.md §5). `boot_bytes` 0: only the
/// first sectors, as at insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootRead {
    /// Bytes read from the start of the image at each boot (at most the image).
    pub boot_bytes: u64,
    /// Bytes per range request.
    pub range_bytes: u64,
    /// Added to each request.
    pub latency: Duration,
    /// Requests at once.
    pub concurrency: usize,
}

impl Default for BootRead {
    fn default() -> Self {
        BootRead {
            boot_bytes: 0,
            range_bytes: 256 * 1024,
            latency: Duration::ZERO,
            concurrency: 4,
        }
    }
}

/// What a boot's read of its medium took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BootReadStats {
    /// Range requests made.
    pub ranges: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Milliseconds from the first request to the last byte.
    pub millis: u64,
}

/// Reads image URLs by range.
#[derive(Debug, Clone)]
pub struct MediaFetcher {
    client: reqwest::Client,
}

impl MediaFetcher {
    /// A fetcher. TLS certificates of image servers are not verified: iLO 4 does not verify
    /// virtual media HTTPS servers unless a certificate is configured.
    pub fn new() -> Result<Self, MediaFetchError> {
        MediaFetcher::from(None)
    }

    /// A fetcher whose connections leave from `source`: each emulated iLO reads its media from
    /// its own address, as real BMCs do, so that an image server's per-client limits see many
    /// clients, not one.
    pub fn from(source: Option<std::net::IpAddr>) -> Result<Self, MediaFetchError> {
        // reqwest is built without a default rustls provider (workspace choice: ring); install it
        // process-wide unless someone already did.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(PROBE_TIMEOUT)
            .tls_danger_accept_invalid_certs(true)
            .local_address(source)
            .build()
            .map_err(|e| MediaFetchError::Unreachable {
                url: String::new(),
                reason: e.to_string(),
            })?;
        Ok(MediaFetcher { client })
    }

    /// Reads the first sectors of `url`; returns the image size when the server tells it.
    pub async fn probe(&self, url: &str) -> Result<Option<u64>, MediaFetchError> {
        let parsed =
            url::Url::parse(url).map_err(|_| MediaFetchError::InvalidUrl(url.to_owned()))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
            return Err(MediaFetchError::InvalidUrl(url.to_owned()));
        }
        let unreachable = |e: reqwest::Error| MediaFetchError::Unreachable {
            url: url.to_owned(),
            reason: e.to_string(),
        };
        let mut response = self
            .client
            .get(parsed)
            .header(
                reqwest::header::RANGE,
                format!("bytes=0-{}", PROBE_BYTES - 1),
            )
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status().as_u16();
        let size = match status {
            206 => response
                .headers()
                .get(reqwest::header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(content_range_total),
            200 => response.content_length(),
            416 => return Err(MediaFetchError::Empty(url.to_owned())),
            _ => {
                return Err(MediaFetchError::HttpStatus {
                    url: url.to_owned(),
                    status,
                })
            }
        };
        // Read at most the probe's worth; a server that ignored the range is cut off here.
        let mut read = 0u64;
        while read < PROBE_BYTES {
            match response.chunk().await.map_err(unreachable)? {
                Some(chunk) => read += chunk.len() as u64,
                None => break,
            }
        }
        if read == 0 || size == Some(0) {
            return Err(MediaFetchError::Empty(url.to_owned()));
        }
        tracing::debug!(url = %Url(url), status, read, ?size, "virtual media range read");
        Ok(size)
    }
}

impl MediaFetcher {
    /// Reads the boot medium at `url` as [`BootRead`] says: the first sectors (the probe),
    /// then, when `read.boot_bytes` is set, the ranges up to it.
    pub async fn read_for_boot(
        &self,
        url: &str,
        read: &BootRead,
    ) -> Result<BootReadStats, MediaFetchError> {
        let started = std::time::Instant::now();
        let size = self.probe(url).await?;
        let end = match size {
            Some(size) => read.boot_bytes.min(size),
            None => read.boot_bytes,
        };
        let step = read.range_bytes.max(512);
        let starts: Vec<u64> = (0..end.div_ceil(step)).map(|i| i * step).collect();
        let ranges = starts.len() as u64;
        let fetch = |start: u64| async move {
            if !read.latency.is_zero() {
                tokio::time::sleep(read.latency).await;
            }
            let last = (start + step).min(end) - 1;
            self.range(url, start, last).await
        };
        use futures_util::stream::{self, StreamExt, TryStreamExt};
        let bytes: u64 = stream::iter(starts)
            .map(fetch)
            .buffer_unordered(read.concurrency.max(1))
            .try_fold(0u64, |sum, n| async move { Ok(sum + n) })
            .await?;
        Ok(BootReadStats {
            ranges: ranges + 1,
            bytes: bytes + PROBE_BYTES.min(size.unwrap_or(PROBE_BYTES)),
            millis: started.elapsed().as_millis() as u64,
        })
    }

    /// One `Range: bytes=first-last` read; the bytes received.
    async fn range(&self, url: &str, first: u64, last: u64) -> Result<u64, MediaFetchError> {
        let unreachable = |e: reqwest::Error| MediaFetchError::Unreachable {
            url: url.to_owned(),
            reason: e.to_string(),
        };
        let mut response = self
            .client
            .get(url)
            .header(reqwest::header::RANGE, format!("bytes={first}-{last}"))
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status().as_u16();
        if status != 206 && status != 200 {
            return Err(MediaFetchError::HttpStatus {
                url: url.to_owned(),
                status,
            });
        }
        // A server that ignored the range is cut off at the range's length.
        let want = last - first + 1;
        let mut read = 0u64;
        while read < want {
            match response.chunk().await.map_err(unreachable)? {
                Some(chunk) => read += chunk.len() as u64,
                None => break,
            }
        }
        Ok(read.min(want))
    }
}

/// The total of a `Content-Range: bytes a-b/total` header (RFC 9110 §14.4).
fn content_range_total(value: &str) -> Option<u64> {
    let rest = value.trim().strip_prefix("bytes ")?;
    let (_, total) = rest.split_once('/')?;
    total.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_totals() {
        assert_eq!(content_range_total("bytes 0-2047/1048576"), Some(1_048_576));
        assert_eq!(content_range_total("bytes 0-2047/*"), None);
        assert_eq!(content_range_total("items 0-1/2"), None);
    }

    #[tokio::test]
    async fn bad_urls_fail() {
        let f = MediaFetcher::new().expect("client builds");
        assert!(matches!(
            f.probe("ftp://x/y").await,
            Err(MediaFetchError::InvalidUrl(_))
        ));
        assert!(matches!(
            f.probe("not a url").await,
            Err(MediaFetchError::InvalidUrl(_))
        ));
        // A closed loopback port: connection refused.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        assert!(matches!(
            f.probe(&format!("http://127.0.0.1:{port}/a.iso")).await,
            Err(MediaFetchError::Unreachable { .. })
        ));
    }
}
