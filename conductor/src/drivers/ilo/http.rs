//! HTTPS plumbing both iLO clients share: the BMC's client (made by [`crate::net::https`]), the
//! deadline and which failures are retried (run by [`crate::net::retry`]), and the mapping of
//! transport failures to [`DriverError`].
//!
//! # Design
//! `client_timeout` (docs/architecture.md §3) bounds a whole operation, retries included: an iLO that never
//! answers fails within it, and a retry is only started when its back-off still fits. Only
//! transient failures are retried (connection errors, HTTP 5xx, a busy iLO;
//! [`DriverError::is_transient`]); a timed-out attempt is not, although a caller may count a
//! timeout as transient, because the operation's deadline is spent and a write's outcome is
//! unknown.

use std::future::Future;
use std::time::Duration;

use crate::drivers::DriverError;
use crate::net::https::{ClientSpec, Trust};
use crate::net::retry::RetryError;

pub use crate::net::https::TlsVerify;
pub use crate::net::retry::RetryPolicy;
pub use vmdeploy_shared::error::chain as error_chain;

/// Retries of a BMC's transient failures unless the node says otherwise: 4 attempts, 0.5 s
/// then 1 s then 2 s apart (all within `client_timeout`, which [`with_retries`] adds as the
/// deadline).
pub const DEFAULT_RETRY: RetryPolicy = RetryPolicy::new(4, Duration::from_millis(500));

/// Idle connections kept per BMC: a BMC serves few sessions at once.
const MAX_IDLE_PER_BMC: usize = 2;

/// Builds the HTTP client for one BMC: a management client (no proxy: BMCs sit on management
/// networks; no redirect: Redfish redirects, iLO 5's 308 for a missing trailing slash, are
/// followed by the Redfish client itself, once, with the same method and body,
/// docs/ilo-management.md §3.2).
pub fn build_client(tls: &TlsVerify, timeout: Duration) -> Result<reqwest::Client, DriverError> {
    ClientSpec::management(Trust::from(tls), timeout)
        .max_idle_per_host(MAX_IDLE_PER_BMC)
        .build()
        .map_err(|e| DriverError::InvalidRequest(e.to_string()))
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
/// on real iLOs (docs/ilo-management.md §1.2 captures); a BMC sending more is broken or hostile.
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
/// Only transient failures are retried, and not a timed-out attempt (see the module's Design).
pub async fn with_retries<T, F, Fut>(
    url: &str,
    timeout: Duration,
    retry: RetryPolicy,
    attempt: F,
) -> Result<T, DriverError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DriverError>>,
{
    with_retries_if(url, timeout, retry, DriverError::is_transient, attempt).await
}

/// [`with_retries`] retrying only the failures `retry_on` names (never a timed-out attempt).
pub async fn with_retries_if<T, F, Fut>(
    url: &str,
    timeout: Duration,
    retry: RetryPolicy,
    retry_on: impl Fn(&DriverError) -> bool,
    mut attempt: F,
) -> Result<T, DriverError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DriverError>>,
{
    retry
        .with_deadline(timeout)
        .run(
            |err: &DriverError| retry_on(err) && !matches!(err, DriverError::Timeout { .. }),
            |r| {
                tracing::warn!(%url, attempt = r.failed, error = %r.error, "transient BMC failure, retrying");
            },
            |_| attempt(),
        )
        .await
        .map_err(|e| match e {
            RetryError::Permanent { error, .. } | RetryError::Exhausted { last: error, .. } => {
                error
            }
            RetryError::DeadlineExceeded { .. } => DriverError::Timeout {
                url: url.to_string(),
                seconds: timeout.as_secs_f64(),
            },
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn retries_transient_then_succeeds() {
        let calls = AtomicU32::new(0);
        let policy = RetryPolicy::new(3, Duration::from_millis(1));
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
        let r: Result<(), _> = with_retries("u", Duration::from_secs(5), DEFAULT_RETRY, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(DriverError::LoginFailed {
                message: "Login failed.".into(),
            })
        })
        .await;
        assert!(matches!(r, Err(DriverError::LoginFailed { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn deadline_bounds_a_hanging_attempt() {
        let start = std::time::Instant::now();
        let r: Result<(), _> =
            with_retries("u", Duration::from_millis(200), DEFAULT_RETRY, || async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(())
            })
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
