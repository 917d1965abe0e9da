//! The agent's command API on port 9999 (IPA-compatible, docs/ironic-protocols.md
//! §3.3): `GET /v1/commands`, `GET /v1/commands/{id}[?wait=true]`, `POST /v1/commands?wait=..`
//! (also without the `/v1` prefix, with or without a trailing slash, as IPA's routes), each with
//! `?agent_token=` checked in constant time (401 "Token invalid."); one command at a time (409
//! while one runs); unknown extension 404, unknown command or bad parameters 400. Served over
//! HTTPS with the agent's boot-time certificate ([`super::tls`]) unless auto-TLS is off.
//!
//! A command result carries IPA's five fields (`id`, `command_name`, `command_status`,
//! `command_error`, `command_result`): like IPA, the parameters are not echoed back (they hold
//! the node and the configdrive). `wait=true` (any case) holds the answer until the command has
//! finished, on `POST` and on `GET` of one command. A command that fails with
//! `IpaErrorKind::CleanVersionMismatch` ends `CLEAN_VERSION_MISMATCH`, as IPA's do: Ironic
//! restarts cleaning or deployment on that status and not on `FAILED`.
//!
//! # Limits ([`ServerLimits`]; fixed, the agent has no configuration file)
//! Anyone on the deploy network can reach port 9999, and the token is checked only once a
//! request's headers are in, so the listener bounds what an unauthenticated client can hold:
//! - connections: [`MAX_CONNECTIONS`] at once, [`MAX_CONNECTIONS_PER_CLIENT`] from one
//!   address ([`super::admission`]); more are closed at once, before a byte is read;
//! - headers: a request's headers must be in within [`HEADER_TIMEOUT`]. hyper starts that
//!   clock when it starts waiting for a request, on a new connection and after each answer on
//!   a kept-alive one, so it is also the idle keep-alive timeout;
//! - bodies: at most [`MAX_BODY`] bytes (413, before any is read when `Content-Length` says
//!   so), all in within [`BODY_TIMEOUT`] of the headers (408); either closes the connection.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;

use vmdeploy_shared::api::ipa::{
    CommandError, CommandList, CommandRequest, CommandResult, CommandStatus, Fault, IpaErrorKind,
};
use vmdeploy_shared::secret::Secret;

use super::admission::Admission;

/// Largest request body accepted. Ironic's `execute_deploy_step` for `write_image` carries an
/// inline configdrive (Ironic caps it at 64 MiB, base64) twice: in the step's `args` and in the
/// node's `instance_info`. The body is read only after the token check.
pub const MAX_BODY: usize = 160 * 1024 * 1024;

/// How long a request's headers may take, from when the listener starts waiting for them (a
/// new connection, or the end of the previous answer: the keep-alive idle timeout too). The
/// conductor sends a request at once and keeps at most one idle connection per agent, which
/// its pool drops when the agent closes it.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request's body may take once its headers are in: [`MAX_BODY`] at 10 MB/s, more
/// than the conductor's own call timeout (`deploy.agent_call_timeout`, 60 s) waits.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(120);
/// Connections at once: the conductor makes one call at a time per agent; the rest is room
/// for a second conductor, a `curl` by an operator, and retries.
pub const MAX_CONNECTIONS: usize = 128;
/// Connections at once from one address.
pub const MAX_CONNECTIONS_PER_CLIENT: usize = 16;

/// The listener's limits (module docs); [`Default`] is the constants', tests set small ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// [`HEADER_TIMEOUT`].
    pub header_timeout: Duration,
    /// [`BODY_TIMEOUT`].
    pub body_timeout: Duration,
    /// [`MAX_BODY`].
    pub max_body: usize,
    /// [`MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// [`MAX_CONNECTIONS_PER_CLIENT`].
    pub max_connections_per_client: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            header_timeout: HEADER_TIMEOUT,
            body_timeout: BODY_TIMEOUT,
            max_body: MAX_BODY,
            max_connections: MAX_CONNECTIONS,
            max_connections_per_client: MAX_CONNECTIONS_PER_CLIENT,
        }
    }
}

/// Finished commands kept for `GET /v1/commands`.
pub const HISTORY: usize = 64;

/// The running part of a command: its result, or an error message.
pub type CommandFuture = Pin<Box<dyn Future<Output = Result<Value, CommandError>> + Send>>;

/// Why a command could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No such extension (404).
    #[error("unknown extension {0:?}")]
    UnknownExtension(String),
    /// No such command in the extension (400).
    #[error("unknown command {0:?}")]
    UnknownCommand(String),
    /// Parameters missing or wrong (400).
    #[error("invalid parameters: {0}")]
    InvalidParams(String),
}

impl StartError {
    /// The IPA error kind, which gives the HTTP status.
    pub fn kind(&self) -> IpaErrorKind {
        match self {
            StartError::UnknownExtension(_) => IpaErrorKind::RequestedObjectNotFound,
            StartError::UnknownCommand(_) => IpaErrorKind::InvalidCommand,
            StartError::InvalidParams(_) => IpaErrorKind::InvalidCommandParams,
        }
    }
}

/// Runs commands by name.
pub trait Executor: Send + Sync + 'static {
    /// Validates `params` and returns the command's future (not yet polled).
    fn start(
        &self,
        extension: &str,
        command: &str,
        params: &Value,
    ) -> Result<CommandFuture, StartError>;
}

/// State of the command API.
pub struct CommandApi {
    token: Option<Secret>,
    executor: Arc<dyn Executor>,
    commands: Mutex<VecDeque<CommandResult>>,
    /// Woken whenever a command finishes (for `GET /v1/commands/{id}?wait=true`).
    finished: tokio::sync::Notify,
}

type Resp = Response<Full<Bytes>>;

fn json_response(status: StatusCode, body: &impl serde::Serialize) -> Resp {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .expect("static headers are valid")
}

/// The WSME fault body for a refused request of this kind.
fn kind_fault(kind: IpaErrorKind, msg: impl Into<String>) -> Resp {
    let status = StatusCode::from_u16(kind.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    fault(status, msg)
}

fn fault(status: StatusCode, msg: impl Into<String>) -> Resp {
    let faultcode = if status.is_server_error() {
        "Server"
    } else {
        "Client"
    };
    json_response(
        status,
        &Fault {
            faultcode: faultcode.into(),
            faultstring: msg.into(),
        },
    )
}

/// A random UUID (v4) from the kernel.
pub fn new_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            format!("{t:032x}")
        })
}

impl CommandApi {
    /// An API checking `token` (none: no check, for standalone use) and running `executor`.
    pub fn new(token: Option<Secret>, executor: Arc<dyn Executor>) -> Arc<CommandApi> {
        Arc::new(CommandApi {
            token,
            executor,
            commands: Mutex::new(VecDeque::new()),
            finished: tokio::sync::Notify::new(),
        })
    }

    fn token_ok(&self, query: &[(String, String)]) -> bool {
        let Some(want) = &self.token else {
            return true;
        };
        let given = query
            .iter()
            .find(|(k, _)| k == "agent_token")
            .map(|(_, v)| v.as_str())
            .unwrap_or("");
        bool::from(given.as_bytes().ct_eq(want.expose().as_bytes()))
    }

    fn find(&self, id: &str) -> Option<CommandResult> {
        let commands = self.commands.lock().expect("command list lock");
        commands.iter().find(|c| c.id == id).cloned()
    }

    /// The command `id` once it is no longer running (None when there is no such command).
    async fn wait_for(&self, id: &str) -> Option<CommandResult> {
        loop {
            // Registered before the check, so a completion between the two is not missed.
            let finished = self.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            let c = self.find(id)?;
            if c.command_status != CommandStatus::Running {
                return Some(c);
            }
            finished.await;
        }
    }

    /// Handles one request, its body read within `limits`.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<hyper::body::Incoming>,
        limits: &ServerLimits,
    ) -> Resp {
        let path = req.uri().path().trim_end_matches('/').to_owned();
        let query = parse_query(req.uri().query().unwrap_or(""));
        let path = path.strip_prefix("/v1").unwrap_or(&path).to_owned();
        let Some(rest) = path.strip_prefix("/commands") else {
            return if path.is_empty() && req.method() == Method::GET {
                json_response(
                    StatusCode::OK,
                    &serde_json::json!({"name": "vmdeploy-agent", "versions": [{"id": "v1"}]}),
                )
            } else {
                fault(StatusCode::NOT_FOUND, "not found")
            };
        };
        if !self.token_ok(&query) {
            return fault(StatusCode::UNAUTHORIZED, "Token invalid.");
        }
        // IPA joins the command when `wait` is `true` in any case; anything else is no wait.
        let wait = query
            .iter()
            .any(|(k, v)| k == "wait" && v.eq_ignore_ascii_case("true"));
        match (req.method().clone(), rest) {
            (Method::GET, "") => {
                let commands = self.commands.lock().expect("command list lock");
                json_response(
                    StatusCode::OK,
                    &CommandList {
                        commands: commands.iter().cloned().collect(),
                    },
                )
            }
            (Method::GET, id) => {
                let id = id.trim_start_matches('/');
                let found = if wait {
                    self.wait_for(id).await
                } else {
                    self.find(id)
                };
                match found {
                    Some(c) => json_response(StatusCode::OK, &c),
                    None => kind_fault(
                        IpaErrorKind::RequestedObjectNotFound,
                        format!("Command with id {id} not found."),
                    ),
                }
            }
            (Method::POST, "") => match read_body(req, limits).await {
                Ok(body) => self.post(&body, wait).await,
                Err(refused) => refused,
            },
            _ => fault(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
        }
    }

    async fn post(self: Arc<Self>, body: &[u8], wait: bool) -> Resp {
        let request = match CommandRequest::from_json(body) {
            Ok(r) => r,
            Err(e) => return fault(StatusCode::BAD_REQUEST, e.to_string()),
        };
        // IPA's run_command: `params` must be there and be an object ("Missing or invalid name
        // or params").
        if !request.params.is_object() {
            return fault(StatusCode::BAD_REQUEST, "Missing or invalid name or params");
        }
        let Some((extension, command)) = request.name.split_once('.') else {
            return fault(
                StatusCode::BAD_REQUEST,
                "command name must be <extension>.<command>",
            );
        };
        let id = new_id();
        let future = {
            let mut commands = self.commands.lock().expect("command list lock");
            if let Some(running) = commands
                .back()
                .filter(|c| c.command_status == CommandStatus::Running)
            {
                // IPA's AgentIsBusy text; Ironic matches 409 or "agent is busy".
                return kind_fault(
                    IpaErrorKind::AgentIsBusy,
                    format!("Agent is busy: executing command {}", running.command_name),
                );
            }
            let future = match self.executor.start(extension, command, &request.params) {
                Ok(f) => f,
                Err(e) => return kind_fault(e.kind(), e.to_string()),
            };
            commands.push_back(CommandResult {
                id: id.clone(),
                command_name: command.to_owned(),
                command_params: Value::Null,
                command_status: CommandStatus::Running,
                command_error: None,
                command_result: None,
            });
            while commands.len() > HISTORY {
                commands.pop_front();
            }
            future
        };
        let api = Arc::clone(&self);
        let run_id = id.clone();
        let name = command.to_owned();
        let task = tokio::spawn(async move {
            let outcome = future.await;
            let mut commands = api.commands.lock().expect("command list lock");
            if let Some(c) = commands.iter_mut().find(|c| c.id == run_id) {
                match outcome {
                    Ok(v) => {
                        tracing::info!(command = %name, "command succeeded");
                        c.command_status = CommandStatus::Succeeded;
                        c.command_result = Some(v);
                    }
                    Err(e) => {
                        tracing::error!(command = %name, error = %e.message, "command failed");
                        c.command_status =
                            if e.known_kind() == Some(IpaErrorKind::CleanVersionMismatch) {
                                CommandStatus::CleanVersionMismatch
                            } else {
                                CommandStatus::Failed
                            };
                        c.command_error = Some(e);
                    }
                }
            }
            drop(commands);
            api.finished.notify_waiters();
        });
        if wait {
            let _ = task.await;
        }
        match self.find(&id) {
            Some(c) => json_response(StatusCode::OK, &c),
            None => fault(StatusCode::INTERNAL_SERVER_ERROR, "command vanished"),
        }
    }
}

/// A request's body, at most `limits.max_body` bytes within `limits.body_timeout`; else the
/// answer (413, 408, 400), which closes the connection: the rest of the body is never read.
async fn read_body(
    req: Request<hyper::body::Incoming>,
    limits: &ServerLimits,
) -> Result<Bytes, Resp> {
    let close = |mut resp: Resp| {
        resp.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
        resp
    };
    let too_large = || {
        close(fault(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("The request body is larger than {} bytes.", limits.max_body),
        ))
    };
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        return Err(too_large());
    }
    let reading = Limited::new(req.into_body(), limits.max_body).collect();
    match tokio::time::timeout(limits.body_timeout, reading).await {
        Ok(Ok(body)) => Ok(body.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(close(fault(
            StatusCode::BAD_REQUEST,
            format!("reading the body: {e}"),
        ))),
        Err(_) => Err(close(fault(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "The request body did not arrive within {} s.",
                limits.body_timeout.as_secs()
            ),
        ))),
    }
}

fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let dec = |s: &str| {
                percent_encoding::percent_decode_str(&s.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (dec(k), dec(v))
        })
        .collect()
}

/// Longest wait for a client's TLS handshake: a peer that connects and says nothing must not
/// hold a task forever.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Serves `api` over plain HTTP on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    api: Arc<CommandApi>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, api, None, shutdown).await
}

/// Serves `api` on `listener` until `shutdown` resolves: over HTTPS when `tls` is given (the
/// handshake runs in the connection's own task, bounded by [`HANDSHAKE_TIMEOUT`]), else plain
/// HTTP; with the default [`ServerLimits`].
pub async fn serve_with(
    listener: TcpListener,
    api: Arc<CommandApi>,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_limited(listener, api, tls, ServerLimits::default(), shutdown).await
}

/// [`serve_with`] with `limits` (tests use small ones).
pub async fn serve_limited(
    listener: TcpListener,
    api: Arc<CommandApi>,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let admission = Admission::new(limits.max_connections, limits.max_connections_per_client);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!("accepting a command API connection: {e}");
                        // EMFILE and friends: pause rather than spin on the same error.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Refused: dropping the stream closes it before a byte is read.
                let Some(ticket) = admission.admit(peer.ip()) else {
                    continue;
                };
                let api = Arc::clone(&api);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // Held until the connection ends, however it ends.
                    let _ticket = ticket;
                    match acceptor {
                        None => serve_connection(stream, api, peer, limits).await,
                        Some(acceptor) => {
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT.min(limits.header_timeout), acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => serve_connection(tls, api, peer, limits).await,
                                // A conductor that does not trust the certificate aborts here.
                                Ok(Err(e)) => tracing::warn!(%peer, "command API TLS handshake failed: {e}"),
                                Err(_) => tracing::warn!(%peer, "command API TLS handshake timed out"),
                            }
                        }
                    }
                });
            }
            () = &mut shutdown => return Ok(()),
        }
    }
}

async fn serve_connection<S>(
    stream: S,
    api: Arc<CommandApi>,
    peer: std::net::SocketAddr,
    limits: ServerLimits,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let api = Arc::clone(&api);
        async move { Ok::<_, Infallible>(api.handle(req, &limits).await) }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(stream), svc)
        .await
    {
        tracing::debug!(%peer, "command API connection: {e}");
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
