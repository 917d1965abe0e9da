//! Requests to Swift: the token cache, one re-authentication on 401, bounded retries of
//! connection errors and 5xx, and bodies that can be sent again (a file is reopened and
//! streamed for each attempt).
//!
//! # Design
//! [`SwiftClient::request`] returns every answer that is not a 401 or a 5xx to the caller,
//! which decides what a 404 or a 409 means for its operation. A 401 drops the cached token
//! and authenticates again, once per attempt (Swift answers 401 to an expired token). After
//! [`RETRY`]'s attempts fail the error is [`ObjectError::Unavailable`] and names the URL, so
//! an operator sees which endpoint did not answer.
//!
//! # Limitations
//! A request is retried whole: a 1 GiB ISO whose upload fails near the end is sent again from
//! the start.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_LENGTH};
use reqwest::{Method, StatusCode};
use tokio::io::AsyncReadExt as _;
use tokio::sync::Mutex;

use super::auth::{authenticate, Session, SwiftAuth};
use crate::net::retry::RetryPolicy;
use crate::objects::ObjectError;

/// Retries of a request: 3 attempts in all, 0.25 s then 0.5 s apart.
pub const RETRY: RetryPolicy = RetryPolicy::new(3, Duration::from_millis(250));
/// Read size when streaming a file body.
const FILE_CHUNK: usize = 256 * 1024;

/// Why one attempt failed.
#[derive(Debug)]
pub enum Failure {
    /// Worth another try (connection refused or reset, timeout, 5xx).
    Transient(String),
    /// Another try would fail the same way.
    Final(ObjectError),
}

/// The error chain of a reqwest failure, for messages.
pub fn describe(err: &reqwest::Error) -> String {
    vmdeploy_shared::error::chain(err)
}

/// A body that can be produced again for each attempt.
#[derive(Debug, Clone)]
pub enum Payload {
    /// No body.
    Empty,
    /// Bytes in memory.
    Bytes(Bytes),
    /// A local file of this length, streamed.
    File(PathBuf, u64),
}

impl Payload {
    async fn body(&self) -> Result<Option<(reqwest::Body, u64)>, ObjectError> {
        Ok(Some(match self {
            Payload::Empty => return Ok(None),
            Payload::Bytes(b) => (reqwest::Body::from(b.clone()), b.len() as u64),
            Payload::File(path, len) => {
                let file = tokio::fs::File::open(path).await.map_err(|e| {
                    ObjectError::Io(std::io::Error::new(
                        e.kind(),
                        format!("opening {}: {e}", path.display()),
                    ))
                })?;
                let stream = futures_util::stream::unfold(Some(file), |file| async move {
                    let mut file = file?;
                    let mut buf = vec![0u8; FILE_CHUNK];
                    match file.read(&mut buf).await {
                        Ok(0) => None,
                        Ok(n) => {
                            buf.truncate(n);
                            Some((Ok(Bytes::from(buf)), Some(file)))
                        }
                        Err(e) => Some((Err(e), None)),
                    }
                });
                (reqwest::Body::wrap_stream(stream.boxed()), *len)
            }
        }))
    }
}

/// Where a request goes, relative to the storage URL.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// The account itself (its metadata).
    Account,
    /// `/<container>[/<object>]`, already percent-encoded.
    Path(&'a str),
}

/// A Swift client: HTTP, credentials and the cached session.
pub struct SwiftClient {
    http: reqwest::Client,
    auth: SwiftAuth,
    timeout: Duration,
    session: Mutex<Option<Session>>,
}

impl std::fmt::Debug for SwiftClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwiftClient")
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

impl SwiftClient {
    /// A client with `http` (TLS already set up) and `auth`.
    pub fn new(http: reqwest::Client, auth: SwiftAuth, timeout: Duration) -> SwiftClient {
        SwiftClient {
            http,
            auth,
            timeout,
            session: Mutex::new(None),
        }
    }

    /// The storage URL, authenticating when no session is cached.
    pub async fn storage_url(&self) -> Result<String, ObjectError> {
        self.retrying(|| async { self.session(false).await.map(|s| s.storage_url) })
            .await
    }

    async fn session(&self, renew: bool) -> Result<Session, Failure> {
        let mut cached = self.session.lock().await;
        if !renew {
            if let Some(session) = cached.as_ref() {
                return Ok(session.clone());
            }
        }
        *cached = None;
        let session = authenticate(&self.http, &self.auth, self.timeout).await?;
        tracing::debug!(storage_url = %session.storage_url, "authenticated to Swift");
        *cached = Some(session.clone());
        Ok(session)
    }

    async fn retrying<T, F, Fut>(&self, mut attempt: F) -> Result<T, ObjectError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        let outcome = RETRY
            .run(
                |failure| matches!(failure, Failure::Transient(_)),
                |r| {
                    if let Failure::Transient(message) = r.error {
                        tracing::debug!(%message, backoff = ?r.pause, "Swift request failed, retrying");
                    }
                },
                |_| attempt(),
            )
            .await;
        outcome.map_err(|e| {
            let attempts = e.attempts();
            match e.into_last() {
                Some(Failure::Final(e)) => e,
                Some(Failure::Transient(message)) => {
                    ObjectError::Unavailable(format!("{message} (after {attempts} attempts)"))
                }
                // RETRY has no deadline.
                None => ObjectError::Unavailable(format!("no answer (after {attempts} attempts)")),
            }
        })
    }

    /// Sends `method` to `target` with `headers` and `payload`, retrying as the module says.
    /// Returns any answer but 401 and 5xx.
    pub async fn request(
        &self,
        method: Method,
        target: Target<'_>,
        headers: &HeaderMap,
        payload: &Payload,
    ) -> Result<reqwest::Response, ObjectError> {
        self.retrying(|| self.attempt(method.clone(), target, headers, payload))
            .await
    }

    async fn attempt(
        &self,
        method: Method,
        target: Target<'_>,
        headers: &HeaderMap,
        payload: &Payload,
    ) -> Result<reqwest::Response, Failure> {
        let mut session = self.session(false).await?;
        let mut renewed = false;
        loop {
            let url = match target {
                Target::Account => session.storage_url.clone(),
                Target::Path(p) => format!("{}{p}", session.storage_url),
            };
            let mut request = self
                .http
                .request(method.clone(), &url)
                .headers(headers.clone())
                .header("X-Auth-Token", session.token.expose());
            match payload.body().await.map_err(Failure::Final)? {
                Some((body, len)) => {
                    // A stream has no length of its own; Swift takes one over chunked.
                    request = request
                        .header(CONTENT_LENGTH, HeaderValue::from(len))
                        .body(body);
                }
                None if method == Method::PUT || method == Method::POST => {
                    request = request.header(CONTENT_LENGTH, HeaderValue::from(0u64));
                }
                None => {}
            }
            let reply = request
                .send()
                .await
                .map_err(|e| Failure::Transient(format!("{method} {url}: {}", describe(&e))))?;
            let status = reply.status();
            if status == StatusCode::UNAUTHORIZED && !renewed {
                tracing::debug!(%url, "Swift refused the token, authenticating again");
                session = self.session(true).await?;
                renewed = true;
                continue;
            }
            if status == StatusCode::UNAUTHORIZED {
                return Err(Failure::Final(ObjectError::Auth(format!(
                    "{method} {url} answered {status} with a fresh token"
                ))));
            }
            if status.is_server_error() {
                return Err(Failure::Transient(format!(
                    "{method} {url} answered {status}"
                )));
            }
            return Ok(reply);
        }
    }
}
