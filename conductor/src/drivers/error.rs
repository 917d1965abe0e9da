//! The drivers' one error type, [`DriverError`], and what a caller may do about it
//! ([`DriverErrorKind`]).

use std::fmt;

use serde::Serialize;

/// What a caller may do about a failed BMC operation; [`DriverError::kind`] gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverErrorKind {
    /// Trying again later may succeed: the connection failed, the BMC is busy, answered 5xx, or
    /// did not answer in time.
    Transient,
    /// The credentials were refused, or the BMC's certificate is not trusted: fix driver_info.
    Auth,
    /// This BMC does not implement the operation (for boot mode: assume legacy BIOS, as Ironic).
    Unsupported,
    /// The operation needs a licence the BMC lacks (virtual media needs iLO Advanced).
    NotLicensed,
    /// The BMC's answer could not be understood.
    BadReply,
    /// The request itself is wrong (address, CA file, a value the BMC refuses as invalid).
    InvalidRequest,
    /// The BMC refused the operation for another reason; its message says which.
    Failed,
}

impl fmt::Display for DriverErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DriverErrorKind::Transient => "transient",
            DriverErrorKind::Auth => "auth",
            DriverErrorKind::Unsupported => "unsupported",
            DriverErrorKind::NotLicensed => "not licensed",
            DriverErrorKind::BadReply => "bad reply",
            DriverErrorKind::InvalidRequest => "invalid request",
            DriverErrorKind::Failed => "failed",
        })
    }
}

/// A failed BMC operation. Variants say what happened in protocol-neutral terms; protocol names
/// and codes appear only in the messages, for the operator. Callers branch on [`Self::kind`].
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The BMC rejected the credentials.
    #[error("login failed: {message}")]
    LoginFailed {
        /// The BMC's message.
        message: String,
    },
    /// The BMC does not implement this operation.
    #[error("not supported by this BMC: {operation}: {message}")]
    NotSupported {
        /// What was tried.
        operation: String,
        /// The BMC's message.
        message: String,
    },
    /// The BMC refused the operation for want of a licence.
    #[error("not licensed on this BMC: {operation}: {message}")]
    NotLicensed {
        /// What was tried.
        operation: String,
        /// The BMC's message, or the licences it has.
        message: String,
    },
    /// The BMC is busy with another client; retried, and reported when it stays busy.
    #[error("BMC busy: {message}")]
    Busy {
        /// The BMC's message.
        message: String,
    },
    /// The BMC refused the operation with an error of its own.
    #[error("{}", bmc_message(*code, message))]
    Bmc {
        /// The BMC's error code, when its protocol has one.
        code: Option<u32>,
        /// The BMC's message, naming the protocol's code where it helps the operator.
        message: String,
    },
    /// The BMC answered with an HTTP error status.
    #[error("{request}: HTTP {status}: {message}")]
    HttpStatus {
        /// The status.
        status: u16,
        /// What was asked (`POST https://host/path`).
        request: String,
        /// The BMC's message from the body, or the status text.
        message: String,
    },
    /// No complete answer within the client timeout.
    #[error("no answer from {url} within {seconds:.1} s")]
    Timeout {
        /// The URL asked.
        url: String,
        /// The limit.
        seconds: f64,
    },
    /// The connection failed (refused, reset, DNS).
    #[error("connection to {url} failed: {message}")]
    Connection {
        /// The URL asked.
        url: String,
        /// The cause.
        message: String,
    },
    /// The TLS handshake failed (certificate not trusted, wrong name): not retried.
    #[error("TLS with {url} failed: {message}")]
    Tls {
        /// The URL asked.
        url: String,
        /// The cause.
        message: String,
    },
    /// The answer could not be understood.
    #[error("malformed reply from {url}: {message}")]
    MalformedReply {
        /// The URL asked.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// The request itself is invalid (bad address, bad CA file, a value the BMC refuses).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

fn bmc_message(code: Option<u32>, message: &str) -> String {
    match code {
        Some(code) => format!("BMC error {code:#06x}: {message}"),
        None => format!("BMC error: {message}"),
    }
}

impl DriverError {
    /// What a caller may do about it.
    ///
    /// A timeout is [`DriverErrorKind::Transient`]: an iLO that is reachable but does not answer
    /// within `client_timeout` is most often loaded or resetting (an iLO reset takes about a
    /// minute), so a later try may well succeed, unlike a refused login or a missing licence.
    /// The outcome of a write that timed out is unknown, so callers re-read state before they
    /// repeat one; the transport does not retry it itself because the operation's deadline is
    /// spent ([`ilo::http::with_retries`](super::ilo::http::with_retries)).
    pub fn kind(&self) -> DriverErrorKind {
        match self {
            DriverError::Connection { .. } | DriverError::Busy { .. } => DriverErrorKind::Transient,
            DriverError::Timeout { .. } => DriverErrorKind::Transient,
            DriverError::HttpStatus { status, .. } => match status {
                500..=599 => DriverErrorKind::Transient,
                401 | 403 => DriverErrorKind::Auth,
                400 => DriverErrorKind::InvalidRequest,
                _ => DriverErrorKind::Failed,
            },
            // The server failed to prove who it is: only a change to ilo_verify_ca or the
            // iLO's certificate helps, as with refused credentials.
            DriverError::LoginFailed { .. } | DriverError::Tls { .. } => DriverErrorKind::Auth,
            DriverError::NotSupported { .. } => DriverErrorKind::Unsupported,
            DriverError::NotLicensed { .. } => DriverErrorKind::NotLicensed,
            DriverError::MalformedReply { .. } => DriverErrorKind::BadReply,
            DriverError::InvalidRequest(_) => DriverErrorKind::InvalidRequest,
            DriverError::Bmc { .. } => DriverErrorKind::Failed,
        }
    }

    /// Whether trying again soon may succeed ([`DriverErrorKind::Transient`]).
    pub fn is_transient(&self) -> bool {
        self.kind() == DriverErrorKind::Transient
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds() {
        let http = |status| DriverError::HttpStatus {
            status,
            request: "GET u".into(),
            message: "m".into(),
        };
        let cases = [
            (http(500), DriverErrorKind::Transient),
            (http(503), DriverErrorKind::Transient),
            (http(401), DriverErrorKind::Auth),
            (http(403), DriverErrorKind::Auth),
            (http(400), DriverErrorKind::InvalidRequest),
            (http(404), DriverErrorKind::Failed),
            (
                DriverError::Timeout {
                    url: "u".into(),
                    seconds: 1.0,
                },
                DriverErrorKind::Transient,
            ),
            (
                DriverError::Connection {
                    url: "u".into(),
                    message: "refused".into(),
                },
                DriverErrorKind::Transient,
            ),
            (
                DriverError::Busy {
                    message: "busy".into(),
                },
                DriverErrorKind::Transient,
            ),
            (
                DriverError::LoginFailed {
                    message: "x".into(),
                },
                DriverErrorKind::Auth,
            ),
            (
                DriverError::Tls {
                    url: "u".into(),
                    message: "untrusted".into(),
                },
                DriverErrorKind::Auth,
            ),
            (
                DriverError::NotSupported {
                    operation: "o".into(),
                    message: "m".into(),
                },
                DriverErrorKind::Unsupported,
            ),
            (
                DriverError::NotLicensed {
                    operation: "o".into(),
                    message: "m".into(),
                },
                DriverErrorKind::NotLicensed,
            ),
            (
                DriverError::MalformedReply {
                    url: "u".into(),
                    message: "m".into(),
                },
                DriverErrorKind::BadReply,
            ),
            (
                DriverError::InvalidRequest("x".into()),
                DriverErrorKind::InvalidRequest,
            ),
            (
                DriverError::Bmc {
                    code: Some(4),
                    message: "Password is too short.".into(),
                },
                DriverErrorKind::Failed,
            ),
        ];
        for (err, kind) in cases {
            assert_eq!(err.kind(), kind, "{err}");
            assert_eq!(
                err.is_transient(),
                kind == DriverErrorKind::Transient,
                "{err}"
            );
        }
    }

    #[test]
    fn error_variants_carry_no_protocol_words() {
        // The variants' own text (the part the code writes, not the BMC's message) stays
        // protocol neutral: callers and operators read "BMC", never RIBCL or Redfish.
        let e = DriverError::Bmc {
            code: Some(0x0004),
            message: "Password is too short.".into(),
        };
        assert_eq!(e.to_string(), "BMC error 0x0004: Password is too short.");
        let e = DriverError::Bmc {
            code: None,
            message: "m".into(),
        };
        assert_eq!(e.to_string(), "BMC error: m");
    }
}
