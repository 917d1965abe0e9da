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

/// Reads image URLs by range.
#[derive(Debug, Clone)]
pub struct MediaFetcher {
    client: reqwest::Client,
}

impl MediaFetcher {
    /// A fetcher. TLS certificates of image servers are not verified: iLO 4 does not verify
    /// virtual media HTTPS servers unless a certificate is configured.
    pub fn new() -> Result<Self, MediaFetchError> {
        // reqwest is built without a default rustls provider (workspace choice: ring); install it
        // process-wide unless someone already did.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(PROBE_TIMEOUT)
            .tls_danger_accept_invalid_certs(true)
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
