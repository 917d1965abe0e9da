//! Redfish transport: session login with Basic fallback, JSON requests, the 308 re-issue, and
//! discovery of the system, manager and chassis (docs/ilo-management.md §3.1, §3.2).
//!
//! # Design
//! The first request logs in: POST `{"UserName","Password"}` to the root's `Links.Sessions`
//! and send `X-Auth-Token` from then on; a service without sessions (4xx other than 401/403,
//! e.g. sushy-tools' 404) gets HTTP Basic on every request, as sushy does. A 401 on a session
//! logs in again once. A client given the conductor's session cache
//! (`IloConfig::redfish_sessions`, [`super::sessions`]) takes the session of its BMC and user
//! from there, and puts the one it opens there: one session per BMC for every task, logged out
//! by the cache when idle and at shutdown, not by the client. Redirects are not followed by
//! reqwest: iLO 5 before 1.40 answers 308 for a URI without its trailing slash, and the request
//! is re-issued once, same method and body, to the `Location` on the same origin (HPEConnector
//! does the same).
//! Every URI comes from an `@odata.id` or action `target`; fixed paths are only fallbacks.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, LOCATION};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::codec::{join, link, link_at, members, vmedia_kind, PathStep};
use super::error::status_error;
use super::refusals::{refusal_for, Answer, SETTLING};
use super::sessions::{session_url, Opened, RedfishSessions, SessionToken};
use crate::drivers::ilo::http::{
    build_client, map_reqwest_error, read_body, with_retries_if, RetryPolicy,
};
use crate::drivers::ilo::IloConfig;
use crate::drivers::{DriverError, Secret, VmediaDevice};
use crate::net::retry::RetryError;
use vmdeploy_shared::error::Chain;

/// Failures the transport retries at once: a refusal to wait out ([`SETTLING`]) is left to the
/// outer loop.
fn is_transport_failure(err: &DriverError) -> bool {
    err.is_transient() && !matches!(err, DriverError::Busy { .. })
}

/// The service root (DSP0266 §6.3).
pub const SERVICE_ROOT: &str = "/redfish/v1/";

/// How requests authenticate.
#[derive(Debug, Clone, Default)]
enum Auth {
    /// Not logged in yet.
    #[default]
    None,
    /// A session: token and the session URI to DELETE at logout.
    Session { token: Secret, uri: Option<String> },
    /// HTTP Basic on every request.
    Basic,
}

/// URIs of the resources this driver uses, found once per client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The ComputerSystem.
    pub system: String,
    /// The Manager (the BMC itself).
    pub manager: Option<String>,
    /// The Chassis (thermal and power).
    pub chassis: Option<String>,
}

/// A successful reply.
#[derive(Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: bytes::Bytes,
}

impl Reply {
    /// The body as JSON; an empty body (204) is `null`.
    pub fn json(&self, url: &str) -> Result<Value, DriverError> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&self.body).map_err(|e| DriverError::MalformedReply {
            url: url.to_string(),
            message: format!("not JSON: {e}"),
        })
    }
}

/// A Redfish client for one BMC.
#[derive(Debug, Clone)]
pub struct RedfishClient {
    http: reqwest::Client,
    base: String,
    username: String,
    password: Secret,
    timeout: Duration,
    retry: RetryPolicy,
    auth: Arc<tokio::sync::Mutex<Auth>>,
    layout: Arc<tokio::sync::OnceCell<Layout>>,
    /// The system asked for by path (`redfish_system_id`), else the collection's first.
    system: Option<String>,
    /// The conductor's session cache; `None`: this client's own session, logged out by
    /// [`RedfishClient::logout`].
    sessions: Option<RedfishSessions>,
}

impl RedfishClient {
    /// A client for the BMC in `config`; nothing is sent yet.
    pub fn new(config: &IloConfig) -> Result<Self, DriverError> {
        Ok(Self {
            http: build_client(&config.tls, config.timeout)?,
            base: config.base_url()?,
            username: config.username.clone(),
            password: config.password.clone(),
            timeout: config.timeout,
            retry: config.retry,
            auth: Arc::default(),
            layout: Arc::default(),
            system: config.redfish_system.clone(),
            sessions: config.redfish_sessions.clone(),
        })
    }

    /// `https://host:port` of the service.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn url_for(&self, path: &str) -> Result<String, DriverError> {
        if path.starts_with("https://") || path.starts_with("http://") {
            let base = url::Url::parse(&self.base)
                .map_err(|e| DriverError::InvalidRequest(e.to_string()))?;
            let other = url::Url::parse(path).map_err(|e| DriverError::MalformedReply {
                url: self.base.clone(),
                message: format!("bad URI {path:?}: {e}"),
            })?;
            if other.origin() != base.origin() {
                return Err(DriverError::MalformedReply {
                    url: self.base.clone(),
                    message: format!("URI {path:?} leaves the service"),
                });
            }
            Ok(other.to_string())
        } else if path.starts_with('/') {
            Ok(format!("{}{path}", self.base))
        } else {
            Err(DriverError::MalformedReply {
                url: self.base.clone(),
                message: format!("relative URI {path:?}"),
            })
        }
    }

    /// GET a resource as JSON.
    pub async fn get(&self, path: &str) -> Result<Value, DriverError> {
        let reply = self.request(Method::GET, path, None).await?;
        reply.json(path)
    }

    /// PATCH a resource.
    pub async fn patch(&self, path: &str, body: &Value) -> Result<(), DriverError> {
        self.request(Method::PATCH, path, Some(body)).await?;
        Ok(())
    }

    /// POST to a collection or action.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Reply, DriverError> {
        self.request(Method::POST, path, Some(body)).await
    }

    /// One request with login, the 308 re-issue, error mapping and retries within the timeout.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Reply, DriverError> {
        let url = self.url_for(path)?;
        tracing::debug!(%method, %url, "Redfish request");
        // Two loops: the transport's retries inside, and outside them the longer wait of a
        // refusal the iLO lifts by itself (refusals::SETTLING: POST, a power change settling).
        let settled = SETTLING
            .with_deadline(self.timeout)
            .run(
                |err: &DriverError| matches!(err, DriverError::Busy { .. }),
                |r| {
                    tracing::info!(%url, attempt = r.failed, pause_ms = r.pause.as_millis() as u64, error = %r.error, "iLO refused for now, waiting");
                },
                |_| {
                    with_retries_if(&url, self.timeout, self.retry, is_transport_failure, || {
                        self.attempt(method.clone(), url.clone(), path, body)
                    })
                },
            )
            .await;
        settled.map_err(|e| match e {
            RetryError::Permanent { error, .. } | RetryError::Exhausted { last: error, .. } => {
                error
            }
            RetryError::DeadlineExceeded { .. } => DriverError::Timeout {
                url: url.clone(),
                seconds: self.timeout.as_secs_f64(),
            },
        })
    }

    async fn attempt(
        &self,
        method: Method,
        url: String,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Reply, DriverError> {
        let mut auth = self.current_auth().await?;
        let mut response = self.send(&method, &url, body, &auth).await?;
        if response.status() == StatusCode::UNAUTHORIZED && matches!(auth, Auth::Session { .. }) {
            // The session expired or was deleted: log in again, once.
            tracing::info!(%url, "Redfish session rejected, logging in again");
            self.forget_session(&auth).await;
            auth = self.current_auth().await?;
            response = self.send(&method, &url, body, &auth).await?;
        }
        if matches!(
            response.status(),
            StatusCode::MOVED_PERMANENTLY
                | StatusCode::FOUND
                | StatusCode::TEMPORARY_REDIRECT
                | StatusCode::PERMANENT_REDIRECT
        ) {
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| DriverError::MalformedReply {
                    url: url.clone(),
                    message: format!("{} without a Location", response.status()),
                })?;
            let target = url::Url::parse(&url)
                .and_then(|u| u.join(location))
                .map_err(|e| DriverError::MalformedReply {
                    url: url.clone(),
                    message: format!("bad Location {location:?}: {e}"),
                })?;
            let target = self.url_for(target.as_str())?;
            tracing::debug!(from = %url, to = %target, "Redfish redirect, re-issuing once");
            response = self.send(&method, &target, body, &auth).await?;
        }
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = read_body(&url, self.timeout, response).await?;
        if !status.is_success() {
            return Err(status_error(method.as_str(), path, status.as_u16(), &bytes));
        }
        Ok(Reply {
            status,
            headers,
            body: bytes,
        })
    }

    async fn send(
        &self,
        method: &Method,
        url: &str,
        body: Option<&Value>,
        auth: &Auth,
    ) -> Result<reqwest::Response, DriverError> {
        let mut request = self
            .http
            .request(method.clone(), url)
            .header(reqwest::header::ACCEPT, "application/json")
            .header("OData-Version", "4.0");
        request = match auth {
            Auth::Session { token, .. } => request.header("X-Auth-Token", token.expose()),
            Auth::Basic => request.basic_auth(&self.username, Some(self.password.expose())),
            Auth::None => request,
        };
        if let Some(body) = body {
            request = request.json(body);
        }
        request
            .send()
            .await
            .map_err(|e| map_reqwest_error(url, self.timeout, &e))
    }

    async fn current_auth(&self) -> Result<Auth, DriverError> {
        let mut guard = self.auth.lock().await;
        let Some(sessions) = &self.sessions else {
            if matches!(*guard, Auth::None) {
                *guard = self.login().await?;
            }
            return Ok(guard.clone());
        };
        if matches!(*guard, Auth::Basic) {
            return Ok(Auth::Basic);
        }
        // The cached session, else one login per BMC at a time (a task that waited for
        // another's login takes its session).
        let entry = sessions.entry(&self.base, &self.username);
        let password = sessions.password_hash(&self.password);
        let SessionToken { token, uri } = match sessions.current(&entry, password) {
            Some(found) => found,
            None => {
                let _login = entry.lock_login().await;
                match sessions.current(&entry, password) {
                    Some(found) => found,
                    None => {
                        let auth = self.login().await?;
                        if let Auth::Session { token, uri } = &auth {
                            sessions.store(
                                &entry,
                                &self.base,
                                password,
                                Opened {
                                    token: token.clone(),
                                    uri: uri.clone(),
                                    http: self.http.clone(),
                                    timeout: self.timeout,
                                },
                            );
                        }
                        *guard = auth.clone();
                        return Ok(auth);
                    }
                }
            }
        };
        let known =
            matches!(&*guard, Auth::Session { token: t, .. } if t.expose() == token.expose());
        if !known {
            sessions.count_reuse(&self.base);
        }
        *guard = Auth::Session { token, uri };
        Ok(guard.clone())
    }

    /// Forgets a session the BMC refused: this client's, and the cache's if it is still the
    /// cached one (another task may have replaced it already).
    async fn forget_session(&self, refused: &Auth) {
        let mut guard = self.auth.lock().await;
        *guard = Auth::None;
        if let (Some(sessions), Auth::Session { token, .. }) = (&self.sessions, refused) {
            let entry = sessions.entry(&self.base, &self.username);
            sessions.forget(&entry, &self.base, token);
        }
    }

    async fn login(&self) -> Result<Auth, DriverError> {
        // The service root is readable without credentials (docs/ilo-management.md §3.1).
        let root_url = self.url_for(SERVICE_ROOT)?;
        let root = self
            .send(&Method::GET, &root_url, None, &Auth::None)
            .await?;
        let status = root.status();
        let bytes = read_body(&root_url, self.timeout, root).await?;
        if !status.is_success() {
            return Err(status_error("GET", SERVICE_ROOT, status.as_u16(), &bytes));
        }
        let root: Value =
            serde_json::from_slice(&bytes).map_err(|e| DriverError::MalformedReply {
                url: root_url.clone(),
                message: format!("service root is not JSON: {e}"),
            })?;
        let sessions = link_at(&root, &[PathStep::Key("Links"), PathStep::Key("Sessions")])
            .map(str::to_string);
        let Some(sessions) = sessions else {
            tracing::debug!(base = %self.base, "no Redfish SessionService: using Basic auth");
            return Ok(Auth::Basic);
        };
        let url = self.url_for(&sessions)?;
        let body = json!({"UserName": self.username, "Password": self.password.expose()});
        let response = self
            .send(&Method::POST, &url, Some(&body), &Auth::None)
            .await?;
        let status = response.status();
        match status.as_u16() {
            200..=299 => {
                let headers = response.headers().clone();
                let token = headers
                    .get("X-Auth-Token")
                    .and_then(|t| t.to_str().ok())
                    .ok_or_else(|| DriverError::MalformedReply {
                        url: url.clone(),
                        message: "session created without an X-Auth-Token".to_string(),
                    })?
                    .to_string();
                let body = read_body(&url, self.timeout, response)
                    .await
                    .unwrap_or_default();
                let uri = headers
                    .get(LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .map(str::to_string)
                    .or_else(|| {
                        serde_json::from_slice::<Value>(&body)
                            .ok()
                            .and_then(|v| v.get("@odata.id")?.as_str().map(str::to_string))
                    });
                tracing::debug!(base = %self.base, "Redfish session opened");
                Ok(Auth::Session {
                    token: Secret::new(token),
                    uri,
                })
            }
            400..=499 | 501 => {
                let bytes = read_body(&url, self.timeout, response)
                    .await
                    .unwrap_or_default();
                let ids = super::error::message_ids(&bytes);
                if let Some((rule, id)) = refusal_for(&ids) {
                    if rule.answer == Answer::UseBasicAuth {
                        // Whatever the status (401/403 included): this is not a bad password.
                        tracing::warn!(base = %self.base, %status, message_id = id,
                            "the iLO's session table is full (sessions leaked by another client?): \
                             using Basic auth, whose sessions the iLO closes itself");
                        return Ok(Auth::Basic);
                    }
                }
                if matches!(status.as_u16(), 401 | 403) {
                    return Err(DriverError::LoginFailed {
                        message: super::error::error_message(&bytes),
                    });
                }
                tracing::debug!(base = %self.base, %status, "Redfish session refused: using Basic auth");
                Ok(Auth::Basic)
            }
            _ => {
                let bytes = read_body(&url, self.timeout, response)
                    .await
                    .unwrap_or_default();
                Err(status_error("POST", &sessions, status.as_u16(), &bytes))
            }
        }
    }

    /// Deletes the session, if this client opened one (iLOs have few session slots). A
    /// session from the conductor's cache stays there for other tasks: the cache logs it out.
    pub async fn logout(&self) {
        let auth = std::mem::take(&mut *self.auth.lock().await);
        if self.sessions.is_some() {
            return;
        }
        if let Auth::Session {
            token,
            uri: Some(uri),
        } = &auth
        {
            let Some(url) = session_url(&self.base, uri) else {
                return;
            };
            let result = self
                .send(
                    &Method::DELETE,
                    &url,
                    None,
                    &Auth::Session {
                        token: token.clone(),
                        uri: None,
                    },
                )
                .await;
            if let Err(e) = result {
                tracing::warn!(error = %Chain(&e), "closing the Redfish session failed");
            }
        }
    }

    /// The system, manager and chassis URIs (the first member of each collection, or the
    /// system's own links).
    pub async fn layout(&self) -> Result<&Layout, DriverError> {
        self.layout
            .get_or_try_init(|| async {
                let root = self.get(SERVICE_ROOT).await?;
                let first = |collection: Value, what: &str| {
                    members(&collection).into_iter().next().ok_or_else(|| {
                        DriverError::MalformedReply {
                            url: self.base.clone(),
                            message: format!("the {what} collection is empty"),
                        }
                    })
                };
                let systems = link(&root, "Systems").unwrap_or("/redfish/v1/Systems/");
                let (system_uri, system) = match &self.system {
                    Some(path) => (path.clone(), self.chosen_system(systems, path).await?),
                    None => {
                        let uri = first(self.get(systems).await?, "Systems")?;
                        let system = self.get(&uri).await?;
                        (uri, system)
                    }
                };
                let manager = match link_at(
                    &system,
                    &[
                        PathStep::Key("Links"),
                        PathStep::Key("ManagedBy"),
                        PathStep::Index(0),
                    ],
                ) {
                    Some(m) => Some(m.to_string()),
                    None => match link(&root, "Managers") {
                        Some(m) => first(self.get(m).await?, "Managers").ok(),
                        None => None,
                    },
                };
                let chassis = match link_at(
                    &system,
                    &[
                        PathStep::Key("Links"),
                        PathStep::Key("Chassis"),
                        PathStep::Index(0),
                    ],
                ) {
                    Some(c) => Some(c.to_string()),
                    None => match link(&root, "Chassis") {
                        Some(c) => first(self.get(c).await?, "Chassis").ok(),
                        None => None,
                    },
                };
                Ok(Layout {
                    system: system_uri,
                    manager,
                    chassis,
                })
            })
            .await
    }

    /// The system the node names (`redfish_system_id`). A path the BMC does not know is
    /// refused with the paths it does know, so the operator can pick the right one.
    async fn chosen_system(&self, systems: &str, path: &str) -> Result<Value, DriverError> {
        match self.get(path).await {
            Ok(system) => Ok(system),
            Err(DriverError::HttpStatus { status: 404, .. }) => {
                let known = match self.get(systems).await {
                    Ok(collection) => members(&collection).join(", "),
                    Err(e) => format!("(the Systems collection could not be read: {e})"),
                };
                Err(DriverError::InvalidRequest(format!(
                    "the BMC has no system {path}; its systems: {known}"
                )))
            }
            Err(e) => Err(e),
        }
    }

    /// The VirtualMedia member serving `device`: (URI, resource). The collection is the
    /// manager's (iLO, docs/ilo-management.md §3.3) or the system's (sushy-tools puts it there).
    pub async fn vmedia_member(
        &self,
        device: VmediaDevice,
    ) -> Result<(String, Value), DriverError> {
        let layout = self.layout().await?;
        let mut collection_uri = None;
        if let Some(manager) = &layout.manager {
            collection_uri = link(&self.get(manager).await?, "VirtualMedia").map(str::to_string);
        }
        if collection_uri.is_none() {
            collection_uri =
                link(&self.get(&layout.system).await?, "VirtualMedia").map(str::to_string);
        }
        let collection_uri = collection_uri.ok_or_else(|| DriverError::NotSupported {
            operation: "virtual media".to_string(),
            message: "neither the manager nor the system links a VirtualMedia collection"
                .to_string(),
        })?;
        for member in members(&self.get(&collection_uri).await?) {
            let resource = self.get(&member).await?;
            if vmedia_kind(&resource) == Some(device) {
                return Ok((member, resource));
            }
        }
        Err(DriverError::NotSupported {
            operation: format!("virtual media {device}"),
            message: format!("no member of {collection_uri} serves {device}"),
        })
    }

    /// A fallback URI below `base` when a resource does not advertise one.
    pub fn below(base: &str, tail: &str) -> String {
        join(base, tail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drivers::ilo::redfish::sessions::DEFAULT_IDLE;
    use crate::drivers::ilo::test_server::{Reply, Request, TestServer};
    use crate::drivers::ilo::{Protocol, TlsVerify};
    use crate::drivers::{Power, PowerState};

    fn config(server: &TestServer) -> IloConfig {
        let mut c = IloConfig::new(server.address.clone(), "admin", Secret::new("secret"));
        c.tls = TlsVerify::CaFile(server.cert_path.clone());
        c.timeout = Duration::from_secs(5);
        c.protocol = Protocol::Redfish;
        c.retry = RetryPolicy::new(2, Duration::from_millis(10));
        c
    }

    fn json_reply(status: u16, body: Value, extra: Vec<(String, String)>) -> Reply {
        Reply::Plain {
            status,
            headers: extra,
            body: body.to_string(),
        }
    }

    /// An iLO-5-like service: sessions, trailing-slash URIs, 308 for URIs without the slash.
    fn ilo5(req: &Request) -> Reply {
        let authed = req.header("x-auth-token") == Some("tok123");
        match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/redfish/v1/") => json_reply(
                200,
                json!({"Systems": {"@odata.id": "/redfish/v1/Systems/"},
                       "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions/"}}}),
                vec![],
            ),
            ("POST", "/redfish/v1/SessionService/Sessions/") => {
                let body: Value = serde_json::from_str(&req.body).unwrap_or_default();
                if body["UserName"] == "admin" && body["Password"] == "secret" {
                    json_reply(
                        201,
                        json!({"@odata.id": "/redfish/v1/SessionService/Sessions/admin1/"}),
                        vec![
                            ("X-Auth-Token".into(), "tok123".into()),
                            (
                                "Location".into(),
                                "/redfish/v1/SessionService/Sessions/admin1/".into(),
                            ),
                        ],
                    )
                } else {
                    json_reply(
                        401,
                        json!({"error": {"@Message.ExtendedInfo": [{"MessageId": "Base.1.4.NoValidSession"}]}}),
                        vec![],
                    )
                }
            }
            _ if !authed => json_reply(401, json!({}), vec![]),
            ("GET", "/redfish/v1/Systems/") => json_reply(
                200,
                json!({"Members": [{"@odata.id": "/redfish/v1/Systems/1"}]}),
                vec![],
            ),
            // iLO 5 before 1.40: 308 to the URI with its trailing slash (docs/ilo-management.md §3.2).
            (_, "/redfish/v1/Systems/1") => json_reply(
                308,
                json!({}),
                vec![("Location".into(), "/redfish/v1/Systems/1/".into())],
            ),
            ("GET", "/redfish/v1/Systems/1/") => {
                json_reply(200, json!({"PowerState": "Off", "Links": {}}), vec![])
            }
            ("DELETE", "/redfish/v1/SessionService/Sessions/admin1/") => {
                json_reply(200, json!({}), vec![])
            }
            _ => json_reply(404, json!({"error": {"message": "not here"}}), vec![]),
        }
    }

    #[tokio::test]
    async fn session_login_308_and_logout() {
        let server = TestServer::start(ilo5).await;
        let client = RedfishClient::new(&config(&server)).expect("client");
        assert_eq!(client.power_state().await.expect("state"), PowerState::Off);
        client.logout().await;
        let requests = server.requests();
        let lines: Vec<String> = requests
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect();
        assert_eq!(
            lines,
            vec![
                "GET /redfish/v1/",
                "POST /redfish/v1/SessionService/Sessions/",
                "GET /redfish/v1/",
                "GET /redfish/v1/Systems/",
                "GET /redfish/v1/Systems/1",
                "GET /redfish/v1/Systems/1/",
                "GET /redfish/v1/Systems/1",
                "GET /redfish/v1/Systems/1/",
                "DELETE /redfish/v1/SessionService/Sessions/admin1/",
            ]
        );
        assert!(requests[2..]
            .iter()
            .all(|r| r.header("x-auth-token") == Some("tok123")));
        assert!(requests.iter().all(|r| r.header("authorization").is_none()));
    }

    #[tokio::test]
    async fn expired_session_logs_in_again_once() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let logins = std::sync::Arc::new(AtomicU32::new(0));
        let counted = logins.clone();
        let server = TestServer::start(move |req| {
            if req.method == "POST" && req.path == "/redfish/v1/SessionService/Sessions/" {
                // The first session is "expired" by the time it is used: its token is stale.
                let n = counted.fetch_add(1, Ordering::SeqCst);
                let token = if n == 0 { "stale" } else { "tok123" };
                return json_reply(201, json!({}), vec![("X-Auth-Token".into(), token.into())]);
            }
            ilo5(req)
        })
        .await;
        let client = RedfishClient::new(&config(&server)).expect("client");
        assert_eq!(client.power_state().await.expect("state"), PowerState::Off);
        assert_eq!(logins.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn wrong_password_is_login_failed() {
        let server = TestServer::start(ilo5).await;
        let mut c = config(&server);
        c.password = Secret::new("wrong");
        let err = RedfishClient::new(&c)
            .expect("client")
            .power_state()
            .await
            .expect_err("login fails");
        assert!(matches!(err, DriverError::LoginFailed { .. }), "{err}");
    }

    #[tokio::test]
    async fn basic_auth_when_sessions_are_missing() {
        let server = TestServer::start(|req| {
            // "admin:secret"
            let basic = req.header("authorization") == Some("Basic YWRtaW46c2VjcmV0");
            match req.path.as_str() {
                "/redfish/v1/" => json_reply(
                    200,
                    json!({"Systems": {"@odata.id": "/redfish/v1/Systems"},
                       "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}}}),
                    vec![],
                ),
                "/redfish/v1/SessionService/Sessions" => json_reply(404, json!({}), vec![]),
                _ if !basic => json_reply(401, json!({}), vec![]),
                "/redfish/v1/Systems" => json_reply(
                    200,
                    json!({"Members": [{"@odata.id": "/redfish/v1/Systems/abc"}]}),
                    vec![],
                ),
                "/redfish/v1/Systems/abc" => {
                    json_reply(200, json!({"PowerState": "On"}), vec![])
                }
                _ => json_reply(404, json!({}), vec![]),
            }
        })
        .await;
        let client = RedfishClient::new(&config(&server)).expect("client");
        assert_eq!(client.power_state().await.expect("state"), PowerState::On);
    }

    /// A BMC with two systems: `redfish_system_id` picks one, the first member is the
    /// default, and an unknown path is refused with the paths there are.
    #[tokio::test]
    async fn the_system_is_the_one_the_node_names() {
        let server = TestServer::start(|req| match req.path.as_str() {
            "/redfish/v1/" => json_reply(
                200,
                json!({"Systems": {"@odata.id": "/redfish/v1/Systems/"}}),
                vec![],
            ),
            "/redfish/v1/Systems/" => json_reply(
                200,
                json!({"Members": [{"@odata.id": "/redfish/v1/Systems/blade1/"},
                                   {"@odata.id": "/redfish/v1/Systems/blade2/"}]}),
                vec![],
            ),
            "/redfish/v1/Systems/blade1/" => json_reply(200, json!({"PowerState": "Off"}), vec![]),
            "/redfish/v1/Systems/blade2/" => json_reply(200, json!({"PowerState": "On"}), vec![]),
            _ => json_reply(
                404,
                json!({"error": {"message": "no such resource"}}),
                vec![],
            ),
        })
        .await;
        let state = |system: Option<&str>| {
            let mut c = config(&server);
            c.redfish_system = system.map(str::to_string);
            async move { RedfishClient::new(&c).expect("client").power_state().await }
        };
        assert_eq!(state(None).await.expect("first"), PowerState::Off);
        assert_eq!(
            state(Some("/redfish/v1/Systems/blade2/"))
                .await
                .expect("named"),
            PowerState::On
        );
        let err = state(Some("/redfish/v1/Systems/blade3/"))
            .await
            .expect_err("unknown system");
        let text = err.to_string();
        assert!(matches!(err, DriverError::InvalidRequest(_)), "{text}");
        assert!(
            text.contains("/redfish/v1/Systems/blade3/")
                && text.contains("/redfish/v1/Systems/blade1/, /redfish/v1/Systems/blade2/"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn non_json_and_redirect_off_site_are_typed() {
        let server = TestServer::start(|req| match req.path.as_str() {
            "/redfish/v1/" => Reply::ok("<html>not redfish</html>"),
            _ => Reply::status(404, ""),
        })
        .await;
        let err = RedfishClient::new(&config(&server))
            .expect("client")
            .power_state()
            .await
            .expect_err("not JSON");
        assert!(matches!(err, DriverError::MalformedReply { .. }), "{err}");

        let server = TestServer::start(|req| match req.path.as_str() {
            "/redfish/v1/" => json_reply(200, json!({}), vec![]),
            _ => Reply::Plain {
                status: 308,
                headers: vec![("Location".into(), "https://evil.example/redfish/v1/".into())],
                body: String::new(),
            },
        })
        .await;
        let err = RedfishClient::new(&config(&server))
            .expect("client")
            .get("/redfish/v1/Systems")
            .await
            .expect_err("off-site redirect");
        assert!(err.to_string().contains("leaves the service"), "{err}");
    }

    /// A BMC with a session table like an iLO's: logins with any of `passwords` make a session
    /// (refused with 403 and `SessionLimitExceeded` when `cap` sessions are open), DELETE ends
    /// one, and resources answer to a live token or to Basic auth with the first password
    /// (whose per-request session the iLO closes itself).
    #[derive(Clone, Default)]
    struct SessionTable {
        state: std::sync::Arc<std::sync::Mutex<Sessions>>,
    }

    #[derive(Default)]
    struct Sessions {
        passwords: Vec<&'static str>,
        cap: usize,
        /// (token, password it was made with)
        live: Vec<(String, String)>,
        made: usize,
        most: usize,
        logins: usize,
        logouts: usize,
        /// Requests authenticated by Basic.
        basic: usize,
    }

    impl SessionTable {
        fn new(passwords: &[&'static str], cap: usize) -> Self {
            let table = SessionTable::default();
            {
                let mut s = table.lock();
                s.passwords = passwords.to_vec();
                s.cap = cap;
            }
            table
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
            self.state.lock().expect("not poisoned")
        }

        fn live(&self) -> Vec<String> {
            self.lock().live.iter().map(|(t, _)| t.clone()).collect()
        }

        /// Ends a session as the iLO's idle timeout or a reset would.
        fn expire(&self, token: &str) {
            self.lock().live.retain(|(t, _)| t != token);
        }

        fn reply(&self, req: &Request) -> Reply {
            let mut s = self.lock();
            let token = req.header("x-auth-token").map(str::to_string);
            let basic = s.passwords.first().is_some_and(|p| {
                use base64::Engine as _;
                let expected =
                    base64::engine::general_purpose::STANDARD.encode(format!("admin:{p}"));
                req.header("authorization") == Some(format!("Basic {expected}").as_str())
            });
            if basic {
                s.basic += 1;
            }
            let live = basic
                || token
                    .as_deref()
                    .is_some_and(|t| s.live.iter().any(|(l, _)| l == t));
            match (req.method.as_str(), req.path.as_str()) {
                ("GET", "/redfish/v1/") => json_reply(
                    200,
                    json!({"Systems": {"@odata.id": "/redfish/v1/Systems/"},
                           "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions/"}}}),
                    vec![],
                ),
                ("POST", "/redfish/v1/SessionService/Sessions/") => {
                    let body: Value = serde_json::from_str(&req.body).unwrap_or_default();
                    let password = body["Password"].as_str().unwrap_or_default().to_string();
                    if body["UserName"] != "admin" || !s.passwords.contains(&password.as_str()) {
                        return json_reply(401, json!({}), vec![]);
                    }
                    if s.live.len() >= s.cap {
                        return json_reply(
                            403,
                            json!({"error": {"@Message.ExtendedInfo": [{"MessageId": "Base.1.4.SessionLimitExceeded"}]}}),
                            vec![],
                        );
                    }
                    s.made += 1;
                    s.logins += 1;
                    let token = format!("tok{}", s.made);
                    let uri =
                        format!("https://bmc.example/redfish/v1/SessionService/Sessions/{token}/");
                    s.live.push((token.clone(), password));
                    s.most = s.most.max(s.live.len());
                    json_reply(
                        201,
                        json!({}),
                        vec![("X-Auth-Token".into(), token), ("Location".into(), uri)],
                    )
                }
                _ if !live => json_reply(401, json!({}), vec![]),
                ("DELETE", path) => {
                    let token = token.unwrap_or_default();
                    if path == format!("/redfish/v1/SessionService/Sessions/{token}/") {
                        s.live.retain(|(t, _)| *t != token);
                        s.logouts += 1;
                        json_reply(200, json!({}), vec![])
                    } else {
                        json_reply(404, json!({}), vec![])
                    }
                }
                ("GET", "/redfish/v1/Systems/") => json_reply(
                    200,
                    json!({"Members": [{"@odata.id": "/redfish/v1/Systems/1/"}]}),
                    vec![],
                ),
                ("GET", "/redfish/v1/Systems/1/") => {
                    json_reply(200, json!({"PowerState": "On"}), vec![])
                }
                _ => json_reply(404, json!({}), vec![]),
            }
        }

        async fn start(&self) -> TestServer {
            let table = self.clone();
            TestServer::start(move |req| table.reply(req)).await
        }
    }

    fn cached(server: &TestServer, sessions: &RedfishSessions, password: &str) -> RedfishClient {
        let mut c = config(server);
        c.password = Secret::new(password);
        c.redfish_sessions = Some(sessions.clone());
        RedfishClient::new(&c).expect("client")
    }

    /// Waits up to 5 s for `done`.
    async fn eventually(what: &str, done: impl Fn() -> bool) {
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(std::time::Instant::now() < until, "{what}: not in 5 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Ten tasks' clients of one BMC (one `Bmc` each) log in once between them, and a
    /// client's logout leaves the shared session to the cache.
    #[tokio::test]
    async fn clients_of_one_bmc_share_one_session() {
        let table = SessionTable::new(&["secret"], 30);
        let server = table.start().await;
        let sessions = RedfishSessions::new(DEFAULT_IDLE);
        for _ in 0..10 {
            let client = cached(&server, &sessions, "secret");
            assert_eq!(client.power_state().await.expect("state"), PowerState::On);
            client.logout().await;
        }
        assert_eq!(sessions.logins(), 1);
        assert_eq!(sessions.reuses(), 9);
        assert_eq!(table.lock().logins, 1);
        assert_eq!(table.live(), vec!["tok1"]);
        let posts = server
            .requests()
            .iter()
            .filter(|r| r.method == "POST")
            .count();
        assert_eq!(posts, 1);
        assert!(server.requests().iter().all(|r| r.method != "DELETE"));
    }

    /// Tasks for one BMC starting at the same moment wait for one login and share it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_starting_together_make_one_session() {
        let table = SessionTable::new(&["secret"], 30);
        let server = table.start().await;
        let sessions = RedfishSessions::new(DEFAULT_IDLE);
        let reads = (0..8).map(|_| {
            let client = cached(&server, &sessions, "secret");
            async move { client.power_state().await }
        });
        for read in futures_util::future::join_all(reads).await {
            assert_eq!(read.expect("state"), PowerState::On);
        }
        assert_eq!(sessions.logins(), 1);
        assert_eq!(table.lock().most, 1);
    }

    /// A client with another password does not get the session made with the old one: it
    /// logs in, and the old session is logged out.
    #[tokio::test]
    async fn a_changed_password_makes_a_new_session() {
        let table = SessionTable::new(&["secret", "secret2"], 30);
        let server = table.start().await;
        let sessions = RedfishSessions::new(DEFAULT_IDLE);
        cached(&server, &sessions, "secret")
            .power_state()
            .await
            .expect("state");
        cached(&server, &sessions, "secret2")
            .power_state()
            .await
            .expect("state");
        assert_eq!(sessions.logins(), 2);
        eventually("the old session logged out", || table.live() == ["tok2"]).await;
        assert_eq!(table.lock().live[0].1, "secret2");
        // The new password's session is the one reused now.
        cached(&server, &sessions, "secret2")
            .power_state()
            .await
            .expect("state");
        assert_eq!(sessions.logins(), 2);
        assert_eq!(table.lock().logins, 2);
    }

    /// A cached session the BMC ended (idle timeout, reset) is refused with 401: the client
    /// drops it and logs in once, and the next task takes the new session.
    #[tokio::test]
    async fn a_refused_cached_session_logs_in_again_once() {
        let table = SessionTable::new(&["secret"], 30);
        let server = table.start().await;
        let sessions = RedfishSessions::new(DEFAULT_IDLE);
        let first = cached(&server, &sessions, "secret");
        first.power_state().await.expect("state");
        table.expire("tok1");
        // A client that already used the session, and a new one.
        first.power_state().await.expect("state after expiry");
        cached(&server, &sessions, "secret")
            .power_state()
            .await
            .expect("state");
        assert_eq!(sessions.logins(), 2);
        assert_eq!(table.lock().logins, 2);
        assert_eq!(table.live(), vec!["tok2"]);
        assert_eq!(
            sessions.token(&first.base, "admin").as_deref(),
            Some("tok2")
        );
    }

    /// A session unused for the idle time is logged out by the sweep; the next task logs in
    /// again.
    #[tokio::test]
    async fn the_sweep_logs_out_idle_sessions() {
        let table = SessionTable::new(&["secret"], 30);
        let server = table.start().await;
        let sessions = RedfishSessions::new(Duration::from_millis(200));
        cached(&server, &sessions, "secret")
            .power_state()
            .await
            .expect("state");
        assert_eq!(table.live(), vec!["tok1"]);
        eventually("the idle session logged out", || table.live().is_empty()).await;
        assert_eq!(table.lock().logouts, 1);
        eventually("the logout counted", || sessions.logouts() == 1).await;
        assert!(sessions.is_empty());
        let deletes: Vec<String> = server
            .requests()
            .iter()
            .filter(|r| r.method == "DELETE")
            .map(|r| r.path.clone())
            .collect();
        // The absolute Location (another host name) is DELETEd on the configured service.
        assert_eq!(deletes, vec!["/redfish/v1/SessionService/Sessions/tok1/"]);

        cached(&server, &sessions, "secret")
            .power_state()
            .await
            .expect("state");
        assert_eq!(sessions.logins(), 2);
    }

    /// A session in use is not swept.
    #[tokio::test]
    async fn a_session_in_use_is_kept() {
        let table = SessionTable::new(&["secret"], 30);
        let server = table.start().await;
        let sessions = RedfishSessions::new(Duration::from_millis(600));
        let client = cached(&server, &sessions, "secret");
        for _ in 0..10 {
            client.power_state().await.expect("state");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(sessions.logins(), 1);
        assert_eq!(table.lock().logouts, 0);
    }

    /// Shutdown logs out every cached session, of every BMC.
    #[tokio::test]
    async fn close_all_logs_out_every_session() {
        let tables = [
            SessionTable::new(&["secret"], 30),
            SessionTable::new(&["secret"], 30),
        ];
        let servers = [tables[0].start().await, tables[1].start().await];
        let sessions = RedfishSessions::new(DEFAULT_IDLE);
        for server in &servers {
            cached(server, &sessions, "secret")
                .power_state()
                .await
                .expect("state");
        }
        assert_eq!(sessions.len(), 2);
        sessions.close_all().await;
        for table in &tables {
            assert!(table.live().is_empty());
            assert_eq!(table.lock().logouts, 1);
        }
        assert_eq!(sessions.logouts(), 2);
        assert!(sessions.is_empty());
    }

    /// A logout that fails (the BMC gone) is logged, not returned, and does not hold up
    /// shutdown beyond its bound.
    #[tokio::test]
    async fn a_failed_logout_fails_nothing() {
        let table = SessionTable::new(&["secret"], 30);
        let server = table.start().await;
        let sessions = RedfishSessions::new(DEFAULT_IDLE);
        cached(&server, &sessions, "secret")
            .power_state()
            .await
            .expect("state");
        drop(server);
        sessions.close_all().await;
        assert_eq!(sessions.logouts(), 0);
        assert!(sessions.is_empty());
    }

    /// Twenty tasks one after the other stay within an iLO's session cap; the same tasks each
    /// with its own session (as before the cache) run the BMC out of sessions.
    #[tokio::test]
    async fn twenty_tasks_stay_within_the_session_cap() {
        let table = SessionTable::new(&["secret"], 3);
        let server = table.start().await;
        let sessions = RedfishSessions::new(DEFAULT_IDLE);
        for task in 0..20 {
            let client = cached(&server, &sessions, "secret");
            client
                .power_state()
                .await
                .unwrap_or_else(|e| panic!("task {task}: {e}"));
        }
        assert_eq!(table.lock().most, 1);
        assert_eq!(table.lock().basic, 0);
        assert_eq!(sessions.logins(), 1);

        // Each task with its own session, never closed (as before the cache): the table fills
        // at the third; SessionLimitExceeded (a 403) is not a bad password, so the rest go on
        // with Basic auth.
        let uncached = SessionTable::new(&["secret"], 3);
        let server = uncached.start().await;
        for task in 0..20 {
            RedfishClient::new(&config(&server))
                .expect("client")
                .power_state()
                .await
                .unwrap_or_else(|e| panic!("uncached task {task}: {e}"));
        }
        let s = uncached.lock();
        assert_eq!((s.most, s.logins), (3, 3));
        assert!(s.basic >= 17, "{} Basic requests", s.basic);
    }

    /// A wrong password is still a login failure, not a full table.
    #[tokio::test]
    async fn a_full_session_table_is_not_taken_for_a_bad_password() {
        let table = SessionTable::new(&["secret"], 0);
        let server = table.start().await;
        let mut cfg = config(&server);
        cfg.password = Secret::new("wrong");
        let err = RedfishClient::new(&cfg)
            .expect("client")
            .power_state()
            .await
            .expect_err("wrong password");
        assert!(matches!(err, DriverError::LoginFailed { .. }), "{err}");
    }

    /// A service without sessions gets Basic on every request and nothing is cached.
    #[tokio::test]
    async fn basic_auth_services_cache_nothing() {
        let server = TestServer::start(|req| match req.path.as_str() {
            "/redfish/v1/" => json_reply(
                200,
                json!({"Systems": {"@odata.id": "/redfish/v1/Systems"},
                       "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}}}),
                vec![],
            ),
            "/redfish/v1/SessionService/Sessions" => json_reply(404, json!({}), vec![]),
            _ if req.header("authorization") != Some("Basic YWRtaW46c2VjcmV0") => {
                json_reply(401, json!({}), vec![])
            }
            "/redfish/v1/Systems" => json_reply(
                200,
                json!({"Members": [{"@odata.id": "/redfish/v1/Systems/abc"}]}),
                vec![],
            ),
            "/redfish/v1/Systems/abc" => json_reply(200, json!({"PowerState": "On"}), vec![]),
            _ => json_reply(404, json!({}), vec![]),
        })
        .await;
        let sessions = RedfishSessions::new(DEFAULT_IDLE);
        for _ in 0..2 {
            let client = cached(&server, &sessions, "secret");
            assert_eq!(client.power_state().await.expect("state"), PowerState::On);
        }
        assert!(sessions.is_empty());
        assert_eq!(sessions.logins(), 0);
        sessions.close_all().await;
        assert!(server.requests().iter().all(|r| r.method != "DELETE"));
    }
}
