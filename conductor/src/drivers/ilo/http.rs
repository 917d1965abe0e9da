//! HTTPS plumbing both iLO clients share: the TLS policy, the reqwest client, the deadline and
//! retry loop, and the mapping of transport failures to [`DriverError`].
//!
//! # Design
//! `client_timeout` (DESIGN.md §3) bounds a whole operation, retries included: an iLO that never
//! answers fails within it, and a retry is only started when its back-off still fits. Only
//! transient failures are retried (connection errors, HTTP 5xx, a busy iLO;
//! [`DriverError::is_transient`]); a timed-out attempt is not, although a caller may count a
//! timeout as transient, because the operation's deadline is spent and a write's outcome is
//! unknown.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use crate::drivers::DriverError;

pub use vmdeploy_shared::error::chain as error_chain;

/// How the BMC's certificate is checked (`ilo_verify_ca`, DESIGN.md §3 and §7).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TlsVerify {
    /// Verify against the system's trust store (the default).
    #[default]
    System,
    /// Verify against the CA certificates in this PEM file only.
    CaFile(PathBuf),
    /// Do not verify (`--insecure`, `ilo_verify_ca: false`). iLOs ship self-signed certificates,
    /// so operators need this; it is never the default.
    Insecure,
}

/// Retries of transient failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub attempts: u32,
    /// Back-off before the second attempt; doubled each time.
    pub initial_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 4,
            initial_backoff: Duration::from_millis(500),
        }
    }
}

/// Installs rustls' ring provider once per process: the workspace builds reqwest with
/// `rustls-no-provider` (root Cargo.toml). A second install fails harmlessly.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Builds the HTTP client for one BMC.
pub fn build_client(tls: &TlsVerify, timeout: Duration) -> Result<reqwest::Client, DriverError> {
    install_crypto_provider();
    let mut builder = reqwest::Client::builder()
        // Redfish redirects (iLO 5's 308 for a missing trailing slash) are followed by the
        // Redfish client itself, once, with the same method and body (reference §3.2).
        .redirect(reqwest::redirect::Policy::none())
        // BMCs sit on management networks; an HTTP(S)_PROXY meant for the internet must not
        // capture them.
        .no_proxy()
        .connect_timeout(timeout.min(Duration::from_secs(15)))
        .timeout(timeout)
        .pool_max_idle_per_host(2);
    match tls {
        TlsVerify::System => {}
        TlsVerify::CaFile(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                DriverError::InvalidRequest(format!("reading CA file {}: {e}", path.display()))
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                DriverError::InvalidRequest(format!("parsing CA file {}: {e}", path.display()))
            })?;
            if certs.is_empty() {
                return Err(DriverError::InvalidRequest(format!(
                    "CA file {} holds no PEM certificate",
                    path.display()
                )));
            }
            builder = builder.tls_certs_only(certs);
        }
        TlsVerify::Insecure => builder = builder.danger_accept_invalid_certs(true),
    }
    builder
        .build()
        .map_err(|e| DriverError::InvalidRequest(format!("building the HTTPS client: {e}")))
}

/// The TLS failure behind `err`, if the TLS layer refused the session (an unverified or
/// mismatched certificate, a handshake the peer or we aborted): retrying cannot help.
pub fn tls_failure<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    vmdeploy_shared::error::find_cause::<rustls::Error>(err)
}

/// Whether the peer closed the connection in the middle of a reply (hyper's incomplete
/// message, or TLS ended without close_notify).
fn is_cut_short(err: &reqwest::Error) -> bool {
    let chain = error_chain(err).to_ascii_lowercase();
    chain.contains("close_notify")
        || chain.contains("incomplete")
        || chain.contains("unexpected eof")
        || chain.contains("end of file before message length reached")
}

/// Maps a reqwest failure to the driver error a caller can act on.
pub fn map_reqwest_error(url: &str, timeout: Duration, err: &reqwest::Error) -> DriverError {
    if err.is_timeout() {
        DriverError::Timeout {
            url: url.to_string(),
            seconds: timeout.as_secs_f64(),
        }
    } else if tls_failure(err).is_some() {
        DriverError::Tls {
            url: url.to_string(),
            message: error_chain(err),
        }
    } else if is_cut_short(err) {
        // A reply cut off mid-way (the emulator's `truncated` fault; a BMC resetting mid-reply).
        DriverError::MalformedReply {
            url: url.to_string(),
            message: "reply truncated: the connection closed before the reply was complete"
                .to_string(),
        }
    } else if err.is_body() || err.is_decode() {
        DriverError::MalformedReply {
            url: url.to_string(),
            message: format!("reply body incomplete: {}", error_chain(err)),
        }
    } else {
        DriverError::Connection {
            url: url.to_string(),
            message: error_chain(err),
        }
    }
}

/// Largest reply body read from a BMC. RIBCL embedded health, the biggest reply, is tens of KiB
/// on real iLOs (reference §1.2 captures); a BMC sending more is broken or hostile.
pub const MAX_REPLY_BYTES: usize = 8 * 1024 * 1024;

/// Reads a reply body, at most [`MAX_REPLY_BYTES`].
pub async fn read_body(
    url: &str,
    timeout: Duration,
    mut response: reqwest::Response,
) -> Result<bytes::Bytes, DriverError> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| map_reqwest_error(url, timeout, &e))?
    {
        if body.len() + chunk.len() > MAX_REPLY_BYTES {
            return Err(DriverError::MalformedReply {
                url: url.to_string(),
                message: format!("reply larger than {MAX_REPLY_BYTES} bytes"),
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(bytes::Bytes::from(body))
}

/// Runs `attempt` until it succeeds, fails for good, or the deadline `timeout` from now passes.
pub async fn with_retries<T, F, Fut>(
    url: &str,
    timeout: Duration,
    retry: RetryPolicy,
    mut attempt: F,
) -> Result<T, DriverError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DriverError>>,
{
    let deadline = Instant::now() + timeout;
    let mut backoff = retry.initial_backoff;
    let mut tries = 1;
    loop {
        let outcome = match tokio::time::timeout_at(deadline, attempt()).await {
            Ok(outcome) => outcome,
            Err(_) => {
                return Err(DriverError::Timeout {
                    url: url.to_string(),
                    seconds: timeout.as_secs_f64(),
                })
            }
        };
        match outcome {
            Ok(value) => return Ok(value),
            Err(err)
                if err.is_transient()
                    && !matches!(err, DriverError::Timeout { .. })
                    && tries < retry.attempts
                    && Instant::now() + backoff < deadline =>
            {
                tracing::warn!(%url, attempt = tries, error = %err, "transient BMC failure, retrying");
                tokio::time::sleep(backoff).await;
                backoff = backoff.saturating_mul(2);
                tries += 1;
            }
            Err(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn retries_transient_then_succeeds() {
        let calls = AtomicU32::new(0);
        let policy = RetryPolicy {
            attempts: 3,
            initial_backoff: Duration::from_millis(1),
        };
        let r = with_retries("u", Duration::from_secs(5), policy, || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(DriverError::HttpStatus {
                    status: 503,
                    request: "GET u".into(),
                    message: "Service Unavailable".into(),
                })
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(r.expect("third attempt succeeds"), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn permanent_errors_are_not_retried() {
        let calls = AtomicU32::new(0);
        let r: Result<(), _> = with_retries(
            "u",
            Duration::from_secs(5),
            RetryPolicy::default(),
            || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(DriverError::LoginFailed {
                    message: "Login failed.".into(),
                })
            },
        )
        .await;
        assert!(matches!(r, Err(DriverError::LoginFailed { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn deadline_bounds_a_hanging_attempt() {
        let start = std::time::Instant::now();
        let r: Result<(), _> = with_retries(
            "u",
            Duration::from_millis(200),
            RetryPolicy::default(),
            || async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(())
            },
        )
        .await;
        assert!(matches!(r, Err(DriverError::Timeout { .. })));
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn tls_failures_are_found_by_type_not_by_text() {
        let cert = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        // As rustls reaches reqwest: inside an io::Error, itself inside another error.
        let wrapped = std::io::Error::new(std::io::ErrorKind::InvalidData, cert.clone());
        assert_eq!(tls_failure(&wrapped), Some(&cert));
        let outer = std::io::Error::other(wrapped);
        assert_eq!(tls_failure(&outer), Some(&cert));
        let handshake = rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure);
        assert_eq!(tls_failure(&handshake), Some(&handshake));
        // Words alone are not a TLS failure.
        let text = std::io::Error::other("certificate handshake failed");
        assert_eq!(tls_failure(&text), None);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(tls_failure(&refused), None);
    }

    #[tokio::test]
    async fn missing_ca_file_is_a_clear_error() {
        let err = build_client(
            &TlsVerify::CaFile("/nonexistent/ca.pem".into()),
            Duration::from_secs(1),
        )
        .expect_err("no such file");
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }
}
