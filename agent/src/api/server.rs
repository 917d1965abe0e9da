//! The agent's command API on port 9999 (IPA-compatible, ../shared/reference/ironic-protocols.md
//! §3.3): `GET /v1/commands`, `GET /v1/commands/{id}`, `POST /v1/commands?wait=..`, each with
//! `?agent_token=` checked in constant time (401 "Token invalid."); one command at a time (409
//! while one runs); unknown extension 404, unknown command or bad parameters 400. Served over
//! HTTPS with the agent's boot-time certificate ([`super::tls`]) unless auto-TLS is off.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::Value;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;

use vmdeploy_shared::api::ipa::{
    CommandError, CommandList, CommandRequest, CommandResult, CommandStatus, Fault, IpaErrorKind,
};
use vmdeploy_shared::secret::Secret;

/// Largest request body accepted (image_info with a configdrive URL is a few KiB; an inline
/// configdrive is up to 64 MiB in IPA, but vmdeploy passes configdrives by URL).
pub const MAX_BODY: usize = 1024 * 1024;

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

    /// Handles one request.
    pub async fn handle(self: Arc<Self>, req: Request<hyper::body::Incoming>) -> Resp {
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
        let wait = query.iter().any(|(k, v)| k == "wait" && v == "true");
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
            (Method::GET, id) => match self.find(id.trim_start_matches('/')) {
                Some(c) => json_response(StatusCode::OK, &c),
                None => kind_fault(IpaErrorKind::RequestedObjectNotFound, "no such command"),
            },
            (Method::POST, "") => {
                let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                    Ok(b) => b.to_bytes(),
                    Err(e) => {
                        return fault(StatusCode::BAD_REQUEST, format!("reading the body: {e}"))
                    }
                };
                self.post(&body, wait).await
            }
            _ => fault(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
        }
    }

    async fn post(self: Arc<Self>, body: &[u8], wait: bool) -> Resp {
        let request = match CommandRequest::from_json(body) {
            Ok(r) => r,
            Err(e) => return fault(StatusCode::BAD_REQUEST, e.to_string()),
        };
        let Some((extension, command)) = request.name.split_once('.') else {
            return fault(
                StatusCode::BAD_REQUEST,
                "command name must be <extension>.<command>",
            );
        };
        let id = new_id();
        let future = {
            let mut commands = self.commands.lock().expect("command list lock");
            if commands
                .back()
                .is_some_and(|c| c.command_status == CommandStatus::Running)
            {
                return kind_fault(
                    IpaErrorKind::AgentIsBusy,
                    "agent is busy: a command is running",
                );
            }
            let future = match self.executor.start(extension, command, &request.params) {
                Ok(f) => f,
                Err(e) => return kind_fault(e.kind(), e.to_string()),
            };
            commands.push_back(CommandResult {
                id: id.clone(),
                command_name: command.to_owned(),
                command_params: request.params.clone(),
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
                        c.command_status = CommandStatus::Failed;
                        c.command_error = Some(e);
                    }
                }
            }
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
/// HTTP.
pub async fn serve_with(
    listener: TcpListener,
    api: Arc<CommandApi>,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!("accepting a command API connection: {e}");
                        continue;
                    }
                };
                let api = Arc::clone(&api);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        None => serve_connection(stream, api, peer).await,
                        Some(acceptor) => {
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => serve_connection(tls, api, peer).await,
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

async fn serve_connection<S>(stream: S, api: Arc<CommandApi>, peer: std::net::SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let api = Arc::clone(&api);
        async move { Ok::<_, Infallible>(api.handle(req).await) }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
        .await
    {
        tracing::debug!(%peer, "command API connection: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `test.echo` returns its params after `test.gate` opens; `test.fail` fails.
    struct TestExec {
        gate: Arc<tokio::sync::Notify>,
    }

    impl Executor for TestExec {
        fn start(&self, ext: &str, cmd: &str, params: &Value) -> Result<CommandFuture, StartError> {
            if ext != "test" {
                return Err(StartError::UnknownExtension(ext.into()));
            }
            let params = params.clone();
            let gate = Arc::clone(&self.gate);
            match cmd {
                "echo" => Ok(Box::pin(async move {
                    gate.notified().await;
                    Ok(serde_json::json!({ "result": params }))
                })),
                "fail" => Ok(Box::pin(async move {
                    Err(CommandError::new(
                        IpaErrorKind::CommandExecution,
                        "it failed",
                    ))
                })),
                other => Err(StartError::UnknownCommand(other.into())),
            }
        }
    }

    async fn call(
        addr: std::net::SocketAddr,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> (u16, Value) {
        let client = crate::http::build_client(&Default::default()).expect("client");
        let url = format!("http://{addr}{path}");
        let req = match method {
            "POST" => client.post(&url).body(body.unwrap_or("").to_owned()),
            _ => client.get(&url),
        };
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let v = resp.json::<Value>().await.unwrap_or(Value::Null);
        (status, v)
    }

    #[tokio::test]
    async fn token_busy_and_command_results() {
        let gate = Arc::new(tokio::sync::Notify::new());
        let api = CommandApi::new(
            Some(Secret::new("s3cret-token")),
            Arc::new(TestExec {
                gate: Arc::clone(&gate),
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, api, async move {
            let _ = stop_rx.await;
        }));

        let (s, v) = call(addr, "GET", "/v1/commands", None).await;
        assert_eq!(s, 401);
        assert_eq!(v["faultstring"], "Token invalid.");
        let (s, _) = call(addr, "GET", "/v1/commands?agent_token=wrong", None).await;
        assert_eq!(s, 401);

        let q = "?agent_token=s3cret-token";
        let (s, v) = call(
            addr,
            "POST",
            &format!("/v1/commands/{q}"),
            Some(r#"{"name":"test.echo","params":{"a":1}}"#),
        )
        .await;
        assert_eq!(s, 200);
        assert_eq!(v["command_status"], "RUNNING");
        assert_eq!(v["command_name"], "echo");
        let id = v["id"].as_str().expect("id").to_owned();

        let (s, v) = call(
            addr,
            "POST",
            &format!("/v1/commands{q}"),
            Some(r#"{"name":"test.fail","params":{}}"#),
        )
        .await;
        assert_eq!(s, 409, "busy: {v}");

        gate.notify_one();
        let mut done = Value::Null;
        for _ in 0..100 {
            let (s, v) = call(addr, "GET", &format!("/v1/commands/{id}{q}"), None).await;
            assert_eq!(s, 200);
            if v["command_status"] != "RUNNING" {
                done = v;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(done["command_status"], "SUCCEEDED");
        assert_eq!(done["command_result"]["result"]["a"], 1);

        let (s, v) = call(
            addr,
            "POST",
            &format!("/v1/commands{q}&wait=true"),
            Some(r#"{"name":"test.fail","params":{}}"#),
        )
        .await;
        assert_eq!(s, 200);
        assert_eq!(v["command_status"], "FAILED");
        assert_eq!(v["command_error"]["message"], "it failed");
        assert_eq!(v["command_error"]["type"], "CommandExecutionError");

        let (s, _) = call(
            addr,
            "POST",
            &format!("/v1/commands{q}"),
            Some(r#"{"name":"nope.x"}"#),
        )
        .await;
        assert_eq!(s, 404);
        let (s, _) = call(
            addr,
            "POST",
            &format!("/v1/commands{q}"),
            Some(r#"{"name":"test.nope"}"#),
        )
        .await;
        assert_eq!(s, 400);
        let (s, _) = call(
            addr,
            "POST",
            &format!("/v1/commands{q}"),
            Some(r#"{"name":"nodot"}"#),
        )
        .await;
        assert_eq!(s, 400);
        let (s, _) = call(addr, "POST", &format!("/v1/commands{q}"), Some("not json")).await;
        assert_eq!(s, 400);

        let (s, v) = call(addr, "GET", &format!("/v1/commands{q}"), None).await;
        assert_eq!(s, 200);
        let list = v["commands"].as_array().expect("list");
        assert_eq!(list.len(), 2);
        assert_eq!(list[0]["id"], id.as_str());

        let _ = stop_tx.send(());
        server.await.expect("join").expect("serve");
    }

    #[tokio::test]
    async fn https_with_the_boot_certificate_and_only_it() {
        let gate = Arc::new(tokio::sync::Notify::new());
        let api = CommandApi::new(Some(Secret::new("tok")), Arc::new(TestExec { gate }));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let cert = crate::api::tls::generate(addr.ip()).expect("certificate");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_with(
            listener,
            api,
            Some(Arc::clone(&cert.server_config)),
            async move {
                let _ = stop_rx.await;
            },
        ));
        let client = |pem: &str| {
            crate::http::build_client(&crate::http::HttpOptions {
                ca_pem: Some(pem.as_bytes().to_vec()),
                ..Default::default()
            })
            .expect("client")
        };
        let url = format!("https://{addr}/v1/commands/?agent_token=tok");
        let resp = client(&cert.cert_pem)
            .get(&url)
            .send()
            .await
            .expect("pinned certificate accepted");
        assert_eq!(resp.status(), 200);
        let other = crate::api::tls::generate(addr.ip()).expect("another certificate");
        let err = client(&other.cert_pem)
            .get(&url)
            .send()
            .await
            .expect_err("another certificate for the same address is refused");
        assert!(
            crate::http::is_tls_error(&err),
            "{}",
            crate::http::error_chain(&err)
        );
        let err = crate::http::build_client(&Default::default())
            .expect("client")
            .get(format!("http://{addr}/v1/commands/?agent_token=tok"))
            .send()
            .await;
        assert!(
            err.as_ref().map_or(true, |r| r.status() != 200),
            "plain HTTP is not served on the TLS port: {err:?}"
        );
        let _ = stop_tx.send(());
        server.await.expect("join").expect("serve");
    }
}
