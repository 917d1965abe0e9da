//! The conductor's client of an agent's command API (port 9999, IPA-compatible;
//! docs/ironic-protocols.md §3.3), over HTTPS pinned to the certificate the agent
//! sent in its heartbeat (`agent_verify_ca`, docs/architecture.md §7).
//!
//! # Design
//! One reqwest client per agent (a management client of `crate::net::https`), trusting only
//! the pinned certificate ([`Trust::Pinned`]: no system roots, so no public CA can vouch for
//! an impostor); the name in `callback_url` (an IP address) must be in the certificate's
//! subject alternative names. A plain `http://` URL is refused unless the configuration
//! allows it, and an `https://` one without a certificate to pin is refused always. Every call
//! carries the agent token as the `agent_token` query parameter, as Ironic's agent client does
//! (the agent answers 401 "Token invalid." otherwise), follows no redirect, and is bounded by
//! the endpoint's timeout.
//!
//! A connection that could not be opened (refused, unreachable; not a TLS refusal) is retried
//! a bounded number of times with a doubling pause: the request never left, so even a `POST`
//! cannot run twice. Anything after the request was sent is not retried.
//!
//! Errors are [`AgentClientError`] inside `anyhow` (downcast to branch: a busy agent, a refused
//! token, a TLS failure); each names the agent, the command and, for a refused call, the status
//! and the agent's own text. The token never appears in an error or log line: URLs are taken
//! out of reqwest's errors.

use std::time::Duration;

use serde_json::{json, Value};
use vmdeploy_shared::api::ipa::{CommandList, CommandResult, CommandStatus, Fault};
use vmdeploy_shared::secret::Secret;

use crate::net::https::{ClientSpec, PemCertificates, Trust};
use crate::net::retry::{RetryError, RetryPolicy};

/// Retries of a call whose connection cannot be opened: 3 attempts in all, 0.5 s then 1 s
/// apart.
pub const CONNECT_RETRY: RetryPolicy = RetryPolicy::new(3, Duration::from_millis(500));

/// Idle connections kept per agent: calls to one agent are sequential.
const MAX_IDLE_PER_AGENT: usize = 1;

/// Largest answer read from an agent: a command list holds at most 64 results of a few KiB.
pub const MAX_REPLY_BYTES: usize = 4 * 1024 * 1024;

/// How much of a refused call's body goes into the error.
const BODY_EXCERPT: usize = 500;

/// What went wrong talking to an agent. `agent` is its `callback_url`, `command` the command
/// name (`standby.prepare_image`) or the request (`GET /v1/commands/`).
#[derive(Debug, thiserror::Error)]
pub enum AgentClientError {
    /// The endpoint cannot be used as given (scheme, certificate, URL).
    #[error("agent {agent}: {reason}")]
    Endpoint {
        /// The agent.
        agent: String,
        /// Why.
        reason: String,
    },
    /// The TLS handshake failed: the agent did not present the pinned certificate.
    #[error("agent {agent}: {command}: TLS handshake failed (the agent's certificate is not the one pinned from its heartbeat): {message}")]
    Tls {
        /// The agent.
        agent: String,
        /// The command or request.
        command: String,
        /// The TLS error chain.
        message: String,
    },
    /// No connection (after the retries), or it broke.
    #[error("agent {agent}: {command}: {message}")]
    Connection {
        /// The agent.
        agent: String,
        /// The command or request.
        command: String,
        /// The error chain.
        message: String,
    },
    /// No answer within the timeout.
    #[error("agent {agent}: {command}: no answer within {seconds} s")]
    Timeout {
        /// The agent.
        agent: String,
        /// The command or request.
        command: String,
        /// The timeout.
        seconds: f64,
    },
    /// The agent refused the call (401 token, 404 unknown, 409 busy, ...).
    #[error("agent {agent}: {command}: refused with HTTP {status}: {body}")]
    Refused {
        /// The agent.
        agent: String,
        /// The command or request.
        command: String,
        /// HTTP status.
        status: u16,
        /// The agent's fault text (or the start of the body).
        body: String,
    },
    /// The answer is not what IPA sends.
    #[error("agent {agent}: {command}: unreadable answer: {message}")]
    BadReply {
        /// The agent.
        agent: String,
        /// The command or request.
        command: String,
        /// What is wrong.
        message: String,
    },
    /// The command ran and failed; the agent's own error.
    #[error("agent {agent}: {command} failed: {kind}: {message}")]
    CommandFailed {
        /// The agent.
        agent: String,
        /// The command.
        command: String,
        /// IPA's error type (`ImageChecksumError`).
        kind: String,
        /// The agent's message.
        message: String,
    },
}

impl AgentClientError {
    /// The HTTP status of a refused call.
    pub fn status(&self) -> Option<u16> {
        match self {
            AgentClientError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The agent runs another command (409 `AgentIsBusy`): try again later.
    pub fn is_busy(&self) -> bool {
        self.status() == Some(409)
    }

    /// The agent refused the token (401, or 403 from an agent that says so).
    pub fn is_auth(&self) -> bool {
        matches!(self.status(), Some(401 | 403))
    }
}

/// A client of one agent.
#[derive(Debug, Clone)]
pub struct AgentClient {
    callback_url: String,
    base: reqwest::Url,
    http: reqwest::Client,
    token: Secret,
    timeout: Duration,
    connect_retry: RetryPolicy,
}

/// How to reach an agent.
#[derive(Debug, Clone)]
pub struct AgentEndpoint {
    /// `callback_url` from the heartbeat (`https://ip:9999`).
    pub callback_url: String,
    /// The certificate (PEM) the agent sent; every call is pinned to it.
    pub pinned_cert_pem: Option<String>,
    /// Allow `http://` when the agent offers no certificate.
    pub allow_plain_http: bool,
    /// Timeout of one call.
    pub timeout: Duration,
    /// The agent token, sent with every command.
    pub agent_token: Secret,
}

impl AgentClient {
    /// A client for `endpoint`; fails on an `http://` URL unless plain HTTP is allowed, and on
    /// an `https://` one without a certificate to pin.
    pub fn new(endpoint: &AgentEndpoint) -> anyhow::Result<AgentClient> {
        let agent = endpoint.callback_url.trim_end_matches('/').to_owned();
        let refuse = |reason: String| AgentClientError::Endpoint {
            agent: agent.clone(),
            reason,
        };
        let base = reqwest::Url::parse(&agent)
            .map_err(|e| refuse(format!("callback_url is not a URL: {e}")))?;
        if base.host_str().is_none() {
            return Err(refuse("callback_url has no host".into()).into());
        }
        if base.query().is_some() || base.fragment().is_some() || base.path() != "/" {
            return Err(refuse("callback_url must be scheme://host:port only".into()).into());
        }
        // An agent never redirects (following one would carry the token elsewhere), and it
        // sits on the provisioning network, never behind an internet proxy: a management
        // client.
        let trust = match base.scheme() {
            "https" => {
                let Some(pem) = endpoint.pinned_cert_pem.as_deref() else {
                    return Err(refuse(
                        "callback_url is https but the heartbeats carried no certificate \
                         (agent_verify_ca) to pin"
                            .into(),
                    )
                    .into());
                };
                Trust::Pinned(PemCertificates::new("agent_verify_ca", pem))
            }
            "http" if endpoint.allow_plain_http => {
                tracing::warn!(agent = %agent, "talking plain HTTP to the agent (allowed by the configuration)");
                Trust::PlainHttp
            }
            "http" => {
                return Err(refuse(
                    "callback_url is plain http and the configuration does not allow plain HTTP \
                     to agents (the agent runs with auto-TLS off?)"
                        .into(),
                )
                .into())
            }
            other => {
                return Err(refuse(format!(
                    "callback_url scheme {other:?} is neither https nor http"
                ))
                .into())
            }
        };
        let http = ClientSpec::management(trust, endpoint.timeout)
            .max_idle_per_host(MAX_IDLE_PER_AGENT)
            .build()
            .map_err(|e| refuse(e.to_string()))?;
        Ok(AgentClient {
            callback_url: agent,
            base,
            http,
            token: endpoint.agent_token.clone(),
            timeout: endpoint.timeout,
            connect_retry: CONNECT_RETRY,
        })
    }

    /// The same client with another retry policy for connections that cannot be opened
    /// (`attempts` in all, at least 1; the pause before the second, doubled after).
    pub fn with_connect_retries(mut self, attempts: u32, backoff: Duration) -> AgentClient {
        self.connect_retry = RetryPolicy::new(attempts, backoff);
        self
    }

    /// The agent's `callback_url`.
    pub fn callback_url(&self) -> &str {
        &self.callback_url
    }

    /// `POST /v1/commands?wait=<wait>` with `{"name": command, "params": params}`.
    pub async fn execute(
        &self,
        command: &str,
        params: Value,
        wait: bool,
    ) -> anyhow::Result<CommandResult> {
        if !command.contains('.') {
            return Err(AgentClientError::Endpoint {
                agent: self.callback_url.clone(),
                reason: format!("command {command:?} is not <extension>.<command>"),
            }
            .into());
        }
        let url = self.url(
            "/v1/commands/",
            &[("wait", if wait { "true" } else { "false" })],
        );
        let body = json!({"name": command, "params": params});
        let reply = self
            .call(command, || self.http.post(url.clone()).json(&body))
            .await?;
        let result = CommandResult::from_json(&reply).map_err(|e| self.bad(command, e))?;
        tracing::debug!(agent = %self.callback_url, command, status = ?result.command_status, id = %result.id, "agent command sent");
        Ok(result)
    }

    /// `GET /v1/commands`: every command the agent ran, oldest first.
    pub async fn commands(&self) -> anyhow::Result<Vec<CommandResult>> {
        let what = "GET /v1/commands/";
        let url = self.url("/v1/commands/", &[]);
        let reply = self.call(what, || self.http.get(url.clone())).await?;
        let list = CommandList::from_json(&reply).map_err(|e| self.bad(what, e))?;
        Ok(list.commands)
    }

    /// `GET /v1/commands/{id}`: one command's result.
    pub async fn command_status(&self, id: &str) -> anyhow::Result<CommandResult> {
        let what = format!("GET /v1/commands/{id}");
        let mut url = self.url("/v1/commands/", &[]);
        url.path_segments_mut()
            .map_err(|()| self.bad(&what, "the callback URL cannot take a path"))?
            .pop_if_empty()
            .push(id);
        let reply = self.call(&what, || self.http.get(url.clone())).await?;
        CommandResult::from_json(&reply).map_err(|e| self.bad(&what, e).into())
    }

    /// `standby.prepare_image` with `image_info` (§3.4), not waiting: the write runs on, and its
    /// end shows in [`AgentClient::commands`] (Ironic polls the same way). The answer is the
    /// RUNNING (or already failed) command.
    pub async fn prepare_image(&self, image_info: Value) -> anyhow::Result<CommandResult> {
        self.execute(
            "standby.prepare_image",
            json!({ "image_info": image_info }),
            false,
        )
        .await
    }

    /// `standby.get_partition_uuids`, waited for: its result (`root uuid`, ...), or the agent's
    /// error when the command failed.
    pub async fn get_partition_uuids(&self) -> anyhow::Result<Value> {
        let done = self
            .execute("standby.get_partition_uuids", json!({}), true)
            .await?;
        Ok(self
            .succeeded("standby.get_partition_uuids", done)?
            .command_result
            .unwrap_or(Value::Null))
    }

    /// `standby.power_off`, waited for: the agent syncs and powers the node off shortly after
    /// answering.
    pub async fn power_off(&self) -> anyhow::Result<CommandResult> {
        let done = self.execute("standby.power_off", json!({}), true).await?;
        Ok(self.succeeded("standby.power_off", done)?)
    }

    /// `result` when it succeeded, else its error as [`AgentClientError::CommandFailed`].
    fn succeeded(
        &self,
        command: &str,
        result: CommandResult,
    ) -> Result<CommandResult, AgentClientError> {
        match result.command_status {
            CommandStatus::Succeeded => Ok(result),
            status => {
                let (kind, message) = match &result.command_error {
                    Some(e) => (e.kind.clone(), e.message.clone()),
                    None => (format!("{status:?}"), "no error given".to_owned()),
                };
                Err(AgentClientError::CommandFailed {
                    agent: self.callback_url.clone(),
                    command: command.to_owned(),
                    kind,
                    message,
                })
            }
        }
    }

    /// `base` + `path` with `query` and the token.
    fn url(&self, path: &str, query: &[(&str, &str)]) -> reqwest::Url {
        let mut url = self.base.clone();
        url.set_path(path);
        {
            let mut pairs = url.query_pairs_mut();
            for (k, v) in query {
                pairs.append_pair(k, v);
            }
            pairs.append_pair("agent_token", self.token.expose());
        }
        url
    }

    fn bad(&self, command: &str, e: impl std::fmt::Display) -> AgentClientError {
        AgentClientError::BadReply {
            agent: self.callback_url.clone(),
            command: command.to_owned(),
            message: e.to_string(),
        }
    }

    /// Sends the request `make` builds (again on a connection that could not be opened), and
    /// returns the body of a 200 answer.
    async fn call(
        &self,
        command: &str,
        make: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<bytes::Bytes, AgentClientError> {
        // Only a connection that could not be opened is retried: the request never left.
        let response = self
            .connect_retry
            .run(
                |e: &reqwest::Error| {
                    e.is_connect()
                        && matches!(
                            self.transport_error(command, e),
                            AgentClientError::Connection { .. }
                        )
                },
                |r| {
                    let error = self.transport_error(command, r.error);
                    tracing::warn!(agent = %self.callback_url, command, attempt = r.failed, %error, "cannot connect to the agent, retrying");
                },
                |_| async { make().send().await.map_err(|e| e.without_url()) },
            )
            .await
            .map_err(|e| match e {
                RetryError::Permanent { error, .. } | RetryError::Exhausted { last: error, .. } => {
                    self.transport_error(command, &error)
                }
                // CONNECT_RETRY has no deadline; each call is bounded by the client's timeout.
                RetryError::DeadlineExceeded { .. } => AgentClientError::Timeout {
                    agent: self.callback_url.clone(),
                    command: command.to_owned(),
                    seconds: self.timeout.as_secs_f64(),
                },
            })?;
        let status = response.status();
        let body = self.read_body(command, response).await?;
        if status == reqwest::StatusCode::OK {
            return Ok(body);
        }
        // IPA's WSME fault: {"faultcode": "Client", "faultstring": "Token invalid."}.
        let text = match serde_json::from_slice::<Fault>(&body) {
            Ok(f) => f.faultstring,
            Err(_) => String::from_utf8_lossy(&body)
                .chars()
                .take(BODY_EXCERPT)
                .collect(),
        };
        Err(AgentClientError::Refused {
            agent: self.callback_url.clone(),
            command: command.to_owned(),
            status: status.as_u16(),
            body: text,
        })
    }

    async fn read_body(
        &self,
        command: &str,
        mut response: reqwest::Response,
    ) -> Result<bytes::Bytes, AgentClientError> {
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| self.transport_error(command, &e.without_url()))?
        {
            if body.len() + chunk.len() > MAX_REPLY_BYTES {
                return Err(self.bad(command, format!("larger than {MAX_REPLY_BYTES} bytes")));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(bytes::Bytes::from(body))
    }

    fn transport_error(&self, command: &str, e: &reqwest::Error) -> AgentClientError {
        let agent = self.callback_url.clone();
        let command = command.to_owned();
        let message = vmdeploy_shared::error::chain(e);
        if vmdeploy_shared::error::find_cause::<rustls::Error>(e).is_some() {
            AgentClientError::Tls {
                agent,
                command,
                message,
            }
        } else if e.is_timeout() {
            AgentClientError::Timeout {
                agent,
                command,
                seconds: self.timeout.as_secs_f64(),
            }
        } else {
            AgentClientError::Connection {
                agent,
                command,
                message,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    use http_body_util::{BodyExt, Full};
    use hyper::{Request, Response};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

    const TOKEN: &str = "agent-token-0123456789abcdefghijklmnopqrstu";

    /// A self-signed certificate for 127.0.0.1, as the agent makes at boot.
    fn cert() -> (String, Arc<rustls::ServerConfig>) {
        crate::net::https::install_crypto_provider();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("certificate");
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .expect("server config");
        (cert.pem(), Arc::new(config))
    }

    /// One request as the fake agent saw it.
    #[derive(Debug, Clone)]
    struct Seen {
        method: String,
        path: String,
        query: String,
        body: Value,
    }

    /// A fake agent: records requests and answers `status` with `body`; TLS when `tls` is given.
    struct FakeAgent {
        addr: SocketAddr,
        seen: Arc<Mutex<Vec<Seen>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for FakeAgent {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    async fn fake_agent(
        listener: Option<tokio::net::TcpListener>,
        tls: Option<Arc<rustls::ServerConfig>>,
        status: u16,
        body: Value,
    ) -> FakeAgent {
        let listener = match listener {
            Some(l) => l,
            None => tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind"),
        };
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let record = Arc::clone(&record);
                let body = body.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let svc =
                        hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                            let record = Arc::clone(&record);
                            let body = body.clone();
                            async move {
                                let method = req.method().to_string();
                                let path = req.uri().path().to_owned();
                                let query = req.uri().query().unwrap_or("").to_owned();
                                let bytes = req.into_body().collect().await?.to_bytes();
                                let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                                record.lock().expect("lock").push(Seen {
                                    method,
                                    path,
                                    query,
                                    body: json,
                                });
                                let resp = Response::builder()
                                    .status(status)
                                    .header("content-type", "application/json")
                                    .body(Full::new(bytes::Bytes::from(body.to_string())))
                                    .expect("response");
                                Ok::<_, hyper::Error>(resp)
                            }
                        });
                    let http = hyper::server::conn::http1::Builder::new();
                    match tls {
                        Some(config) => {
                            let acceptor = tokio_rustls::TlsAcceptor::from(config);
                            if let Ok(s) = acceptor.accept(stream).await {
                                let _ = http
                                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                                    .await;
                            }
                        }
                        None => {
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                                .await;
                        }
                    }
                });
            }
        });
        FakeAgent { addr, seen, task }
    }

    fn result(status: &str) -> Value {
        json!({"id": "c1", "command_name": "prepare_image", "command_params": {},
               "command_status": status, "command_error": null, "command_result": null})
    }

    fn endpoint(url: String, pem: Option<&str>) -> AgentEndpoint {
        AgentEndpoint {
            callback_url: url,
            pinned_cert_pem: pem.map(str::to_owned),
            allow_plain_http: false,
            timeout: Duration::from_secs(5),
            agent_token: Secret::new(TOKEN),
        }
    }

    fn query_has(q: &str, key: &str, value: &str) -> bool {
        q.split('&').any(|kv| kv == format!("{key}={value}"))
    }

    #[tokio::test]
    async fn pinned_certificate_commands_and_token() {
        let (pem, config) = cert();
        let agent = fake_agent(None, Some(config), 200, result("RUNNING")).await;
        let url = format!("https://{}", agent.addr);
        let client = AgentClient::new(&endpoint(url.clone(), Some(&pem))).expect("client");
        let info = json!({"id": "img", "urls": ["https://store/x"], "os_hash_algo": "sha256"});
        let r = client.prepare_image(info.clone()).await.expect("pinned");
        assert_eq!(r.command_status, CommandStatus::Running);
        assert_eq!(r.id, "c1");
        let r = client
            .execute("standby.sync", json!({"a": 1}), true)
            .await
            .expect("execute");
        assert_eq!(r.command_name, "prepare_image");
        let seen = agent.seen.lock().expect("lock").clone();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].method, "POST");
        assert_eq!(seen[0].path, "/v1/commands/");
        assert!(query_has(&seen[0].query, "wait", "false"), "{seen:?}");
        assert!(query_has(&seen[0].query, "agent_token", TOKEN), "{seen:?}");
        assert_eq!(
            seen[0].body,
            json!({"name": "standby.prepare_image", "params": {"image_info": info}})
        );
        assert!(query_has(&seen[1].query, "wait", "true"), "{seen:?}");
        assert_eq!(seen[1].body["name"], "standby.sync");
        assert!(client.execute("nodot", json!({}), true).await.is_err());
    }

    #[tokio::test]
    async fn another_certificate_for_the_same_address_is_refused() {
        let (pem, _) = cert();
        let (_, impostor) = cert();
        let agent = fake_agent(None, Some(impostor), 200, result("RUNNING")).await;
        let url = format!("https://{}", agent.addr);
        let client = AgentClient::new(&endpoint(url.clone(), Some(&pem))).expect("client");
        let err = client.commands().await.expect_err("impostor refused");
        let typed = err.downcast_ref::<AgentClientError>().expect("typed");
        assert!(matches!(typed, AgentClientError::Tls { .. }), "{err:#}");
        let text = format!("{err:#}");
        assert!(text.contains(&url), "names the agent: {text}");
        assert!(text.contains("GET /v1/commands/"), "names the call: {text}");
        assert!(!text.contains(TOKEN), "no token in errors: {text}");
        assert!(agent.seen.lock().expect("lock").is_empty(), "nothing sent");
    }

    #[tokio::test]
    async fn plain_http_only_when_allowed_and_https_only_pinned() {
        let agent = fake_agent(None, None, 200, json!({"commands": [result("SUCCEEDED")]})).await;
        let url = format!("http://{}", agent.addr);
        let err = AgentClient::new(&endpoint(url.clone(), None)).expect_err("http refused");
        assert!(format!("{err:#}").contains("plain http"), "{err:#}");
        let allowed = AgentEndpoint {
            allow_plain_http: true,
            ..endpoint(url, None)
        };
        let list = AgentClient::new(&allowed)
            .expect("allowed")
            .commands()
            .await
            .expect("plain list");
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].command_status, CommandStatus::Succeeded);

        let https = format!("https://{}", agent.addr);
        let err = AgentClient::new(&endpoint(https.clone(), None)).expect_err("no pin");
        assert!(format!("{err:#}").contains("agent_verify_ca"), "{err:#}");
        let err = AgentClient::new(&endpoint(https.clone(), Some("not a pem"))).expect_err("bad");
        assert!(format!("{err:#}").contains(&https), "{err:#}");
        for bad in [
            "ftp://127.0.0.1:1",
            "https://127.0.0.1:1/v1?x=1",
            "nonsense",
        ] {
            assert!(
                AgentClient::new(&endpoint(bad.into(), Some("x"))).is_err(),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn refusals_carry_status_and_the_agents_text() {
        let (pem, config) = cert();
        let agent = fake_agent(
            None,
            Some(config),
            401,
            json!({"faultcode": "Client", "faultstring": "Token invalid."}),
        )
        .await;
        let url = format!("https://{}", agent.addr);
        let client = AgentClient::new(&endpoint(url.clone(), Some(&pem))).expect("client");
        let err = client.power_off().await.expect_err("401");
        let typed = err.downcast_ref::<AgentClientError>().expect("typed");
        assert!(typed.is_auth() && !typed.is_busy(), "{typed:?}");
        assert_eq!(typed.status(), Some(401));
        let text = format!("{err:#}");
        for part in [url.as_str(), "standby.power_off", "401", "Token invalid."] {
            assert!(text.contains(part), "{part} in {text}");
        }
        assert!(!text.contains(TOKEN), "{text}");
    }

    #[tokio::test]
    async fn a_failed_command_gives_the_agents_error() {
        let (pem, config) = cert();
        let failed = json!({"id": "c2", "command_name": "get_partition_uuids", "command_params": {},
            "command_status": "FAILED", "command_result": null,
            "command_error": {"type": "DeviceNotFound", "code": 500, "message": "no disk", "details": ""}});
        let agent = fake_agent(None, Some(config), 200, failed).await;
        let client = AgentClient::new(&endpoint(format!("https://{}", agent.addr), Some(&pem)))
            .expect("client");
        let err = client.get_partition_uuids().await.expect_err("failed");
        let text = format!("{err:#}");
        assert!(
            text.contains("DeviceNotFound") && text.contains("no disk"),
            "{text}"
        );
        let status = client.command_status("c2").await.expect("status");
        assert_eq!(status.command_status, CommandStatus::Failed);
        let seen = agent.seen.lock().expect("lock").clone();
        assert_eq!(seen.last().expect("seen").path, "/v1/commands/c2");
        assert_eq!(seen.last().expect("seen").method, "GET");
    }

    #[tokio::test]
    async fn garbage_answers_are_bad_replies() {
        let (pem, config) = cert();
        let agent = fake_agent(None, Some(config), 200, json!({"nope": 1})).await;
        let client = AgentClient::new(&endpoint(format!("https://{}", agent.addr), Some(&pem)))
            .expect("client");
        let err = client.commands().await.expect_err("not a list");
        assert!(matches!(
            err.downcast_ref::<AgentClientError>(),
            Some(AgentClientError::BadReply { .. })
        ));
    }

    #[tokio::test]
    async fn an_agent_not_yet_listening_is_retried_a_bounded_number_of_times() {
        let (pem, config) = cert();
        // Reserve a port, free it, and start listening there only after the first attempt.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let url = format!("https://127.0.0.1:{port}");
        let client = AgentClient::new(&endpoint(url.clone(), Some(&pem)))
            .expect("client")
            .with_connect_retries(4, Duration::from_millis(200));
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let l = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .expect("bind late");
            fake_agent(Some(l), Some(config), 200, json!({"commands": []})).await
        });
        let list = client.commands().await.expect("retried until listening");
        assert!(list.is_empty());
        drop(late.await.expect("join"));

        // Nobody at all: a connection error after the bounded attempts (200 + 400 ms pauses).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let url = format!("https://127.0.0.1:{port}");
        let client = AgentClient::new(&endpoint(url.clone(), Some(&pem)))
            .expect("client")
            .with_connect_retries(3, Duration::from_millis(200));
        let started = std::time::Instant::now();
        let err = client.commands().await.expect_err("nobody listens");
        assert!(started.elapsed() >= Duration::from_millis(600));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(matches!(
            err.downcast_ref::<AgentClientError>(),
            Some(AgentClientError::Connection { .. })
        ));
        assert!(format!("{err:#}").contains(&url), "{err:#}");
    }

    #[tokio::test]
    async fn a_silent_agent_times_out() {
        let (pem, _) = cert();
        // Accepts connections (the kernel's backlog) but never answers the handshake.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let ep = AgentEndpoint {
            timeout: Duration::from_millis(500),
            ..endpoint(format!("https://{addr}"), Some(&pem))
        };
        let err = AgentClient::new(&ep)
            .expect("client")
            .commands()
            .await
            .expect_err("silent");
        assert!(
            matches!(
                err.downcast_ref::<AgentClientError>(),
                Some(AgentClientError::Timeout { .. })
            ),
            "{err:#}"
        );
        drop(listener);
    }
}
