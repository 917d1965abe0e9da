//! The HTTP client of both ends of an import: the source Ironic and the vmdeploy conductor
//! speak the same API (microversion header, fault bodies, `next` links), so one client serves
//! both.
//!
//! # Design
//! The client is a management client of the shared builder (`crate::net::https`): every request
//! bounded as a whole, no redirect followed (a redirect could carry the token elsewhere), no
//! proxy from the environment. The microversion is agreed once, at [`ApiClient::connect`], from
//! the API root's `default_version` (its maximum): 1.73, or the server's maximum when that is
//! lower but still shows the nodes' interfaces (1.31). A `409 Conflict` (the node is locked by
//! a task, as vmdeploy's power sync locks each node for its BMC read) is tried again 5 times
//! 2 s apart, as python-ironicclient does. A `next` link is followed as given when it points at
//! the URL the operator gave; one that names another host (an Ironic whose `public_endpoint` is
//! not set answers with its own address) is taken from its `/v1/` on, below the given URL.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use url::Url;
use vmdeploy_shared::secret::Secret;

use crate::net::{ClientSpec, Trust};

/// The microversion header.
pub const VERSION_HEADER: &str = "X-OpenStack-Ironic-API-Version";

/// How a client proves who it is.
#[derive(Debug, Clone, Default)]
pub enum Auth {
    /// `noauth`.
    #[default]
    None,
    /// A Keystone token (`X-Auth-Token`).
    Token(Secret),
    /// HTTP basic (`http_basic`).
    Basic {
        /// The user.
        user: String,
        /// The password.
        password: Secret,
    },
}

/// A failed call: the transport, or the answer's status with the server's own message.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No answer (refused, timed out, reset).
    #[error("{method} {url}: {source}")]
    Transport {
        /// The method.
        method: Method,
        /// The URL.
        url: String,
        /// reqwest's error (without the URL, given above).
        source: reqwest::Error,
    },
    /// An answer other than 2xx.
    #[error("{method} {url}: {status}: {message}")]
    Status {
        /// The method.
        method: Method,
        /// The URL.
        url: String,
        /// The status.
        status: StatusCode,
        /// The fault's `faultstring`, or the start of the body.
        message: String,
    },
    /// A 2xx answer whose body is not JSON.
    #[error("{method} {url}: the answer is not JSON: {source}")]
    NotJson {
        /// The method.
        method: Method,
        /// The URL.
        url: String,
        /// The parser's error.
        source: serde_json::Error,
    },
}

impl CallError {
    /// The status of an answer, `None` when there was none.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            CallError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Most pages a list may have: a loop of `next` links ends here at the latest.
const MAX_PAGES: usize = 100_000;

/// How often a `409 Conflict` is tried again, and how long apart.
const CONFLICT_RETRIES: u32 = 5;
const CONFLICT_WAIT: Duration = Duration::from_secs(2);

/// A client of one Ironic-compatible API.
#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: Url,
    auth: Auth,
    version: String,
}

/// Which certificates an `https://` endpoint may present: the system's, or a CA file's.
pub fn trust_for(url: &Url, ca_file: Option<&PathBuf>) -> Trust {
    match (url.scheme(), ca_file) {
        ("http", _) => Trust::PlainHttp,
        (_, Some(path)) => Trust::CaFile(path.clone()),
        (_, None) => Trust::System,
    }
}

impl ApiClient {
    /// A client of the API at `base` (from [`super::source::base_url`]); asks the root for the
    /// microversions it serves and agrees on one.
    pub async fn connect(
        base: Url,
        auth: Auth,
        ca_file: Option<&PathBuf>,
        timeout: Duration,
    ) -> anyhow::Result<ApiClient> {
        let http = ClientSpec::management(trust_for(&base, ca_file), timeout)
            .build()
            .context("building the HTTP client")?;
        let mut client = ApiClient {
            http,
            base,
            auth,
            version: super::source::IRONIC_VERSION.to_string(),
        };
        let root = client.get("/").await?;
        client.version = agree_version(&root)?;
        Ok(client)
    }

    /// The base URL.
    pub fn base(&self) -> &Url {
        &self.base
    }

    /// The microversion every call carries.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// `base` + `path` (`path` starts with `/`).
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base.as_str().trim_end_matches('/'))
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<Value, CallError> {
        self.call(Method::GET, &self.url(path), None).await
    }

    /// `method path` with a JSON body; a 2xx answer's JSON (`null` when it has none).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, CallError> {
        self.call(method, &self.url(path), body).await
    }

    async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<Value, CallError> {
        let mut conflicts = 0;
        loop {
            let mut request = self
                .http
                .request(method.clone(), url)
                .header(VERSION_HEADER, &self.version)
                .header(reqwest::header::ACCEPT, "application/json");
            request = match &self.auth {
                Auth::None => request,
                Auth::Token(token) => request.header("X-Auth-Token", token.expose()),
                Auth::Basic { user, password } => request.basic_auth(user, Some(password.expose())),
            };
            if let Some(body) = body {
                request = request.json(body);
            }
            let transport = |source: reqwest::Error| CallError::Transport {
                method: method.clone(),
                url: url.to_string(),
                source: source.without_url(),
            };
            let response = request.send().await.map_err(transport)?;
            let status = response.status();
            let text = response.text().await.map_err(transport)?;
            if status == StatusCode::CONFLICT && conflicts < CONFLICT_RETRIES {
                conflicts += 1;
                tokio::time::sleep(CONFLICT_WAIT).await;
                continue;
            }
            if !status.is_success() {
                return Err(CallError::Status {
                    method,
                    url: url.to_string(),
                    status,
                    message: fault_message(&text),
                });
            }
            if text.trim().is_empty() {
                return Ok(Value::Null);
            }
            return serde_json::from_str(&text).map_err(|source| CallError::NotJson {
                method,
                url: url.to_string(),
                source,
            });
        }
    }

    /// Every record of a collection (`key`: `nodes`, `ports`), following `next` links.
    pub async fn list(&self, path: &str, key: &str) -> anyhow::Result<Vec<Value>> {
        let mut url = self.url(path);
        let mut seen = HashSet::new();
        let mut records = Vec::new();
        loop {
            if !seen.insert(url.clone()) {
                bail!("GET {url}: the `next` links run in a loop");
            }
            if seen.len() > MAX_PAGES {
                bail!("GET {url}: more than {MAX_PAGES} pages");
            }
            let page = self.call(Method::GET, &url, None).await?;
            match page.get(key) {
                Some(Value::Array(items)) => records.extend(items.iter().cloned()),
                _ => bail!("GET {url}: the answer has no {key:?} list"),
            }
            match page.get("next") {
                Some(Value::String(next)) if !next.trim().is_empty() => {
                    url = follow(&self.base, next.trim())?;
                }
                _ => return Ok(records),
            }
        }
    }
}

/// The microversion to use with a server whose root document is `root`: ours (1.73), or the
/// server's maximum when lower; refused below 1.31.
fn agree_version(root: &Value) -> anyhow::Result<String> {
    let ours = super::source::IRONIC_VERSION;
    let Some(max) = root
        .pointer("/default_version/version")
        .and_then(Value::as_str)
        .and_then(minor)
    else {
        // A root that does not say: ask for ours and let each call answer.
        return Ok(ours.to_string());
    };
    let wanted = minor(ours).unwrap_or(super::source::IRONIC_MIN_VERSION);
    if max >= wanted {
        return Ok(ours.to_string());
    }
    if max < super::source::IRONIC_MIN_VERSION {
        bail!(
            "the API serves microversions up to 1.{max}; an import needs 1.{} (the nodes' \
             interfaces): export the nodes with `baremetal node list --long --limit 0 -f json` and use \
             --from-json",
            super::source::IRONIC_MIN_VERSION
        );
    }
    Ok(format!("1.{max}"))
}

/// The minor number of `1.N`.
fn minor(version: &str) -> Option<u32> {
    version.strip_prefix("1.")?.parse().ok()
}

/// The URL a `next` link leads to (see the module's Design).
fn follow(base: &Url, next: &str) -> anyhow::Result<String> {
    let url = base
        .join(next)
        .with_context(|| format!("the `next` link {next:?} is not a URL"))?;
    if url.origin() == base.origin() {
        return Ok(url.to_string());
    }
    let Some(at) = url.path().find("/v1/") else {
        bail!("the `next` link {next:?} leads away from {base}");
    };
    let mut rebased = format!(
        "{}{}",
        base.as_str().trim_end_matches('/'),
        &url.path()[at..]
    );
    if let Some(query) = url.query() {
        rebased.push('?');
        rebased.push_str(query);
    }
    Ok(rebased)
}

/// Longest message kept from a body that is not an Ironic fault.
const MAX_MESSAGE: usize = 300;

/// The message of an error answer: Ironic's fault body is `{"error_message": "<JSON with a
/// faultstring>"}` (the inner document a string); anything else is cut short.
pub fn fault_message(body: &str) -> String {
    let inner = match serde_json::from_str::<Value>(body) {
        Ok(Value::Object(outer)) => match outer.get("error_message") {
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(doc) => doc,
                Err(_) => return cut(s),
            },
            Some(doc @ Value::Object(_)) => doc.clone(),
            _ => Value::Object(outer),
        },
        _ => return cut(body),
    };
    match inner.get("faultstring") {
        Some(Value::String(s)) => cut(s),
        _ => cut(&inner.to_string()),
    }
}

fn cut(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() <= MAX_MESSAGE {
        return s.to_string();
    }
    let mut out: String = s.chars().take(MAX_MESSAGE).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn url(s: &str) -> Url {
        Url::parse(s).expect("a URL")
    }

    #[test]
    fn next_links_on_the_same_host_are_followed_as_given() {
        let base = url("http://127.0.0.1:6385/");
        let next = "http://127.0.0.1:6385/v1/nodes/detail?limit=2&marker=abc";
        assert_eq!(follow(&base, next).expect("same origin"), next);
        // Relative links resolve against the base.
        assert_eq!(
            follow(&base, "/v1/ports?marker=x").expect("relative"),
            "http://127.0.0.1:6385/v1/ports?marker=x"
        );
    }

    #[test]
    fn next_links_naming_another_host_are_rebased() {
        let base = url("https://cloud.example/baremetal");
        let next = "http://10.0.0.5:6385/v1/nodes/detail?marker=abc";
        assert_eq!(
            follow(&base, next).expect("rebased"),
            "https://cloud.example/baremetal/v1/nodes/detail?marker=abc"
        );
        assert!(follow(&base, "http://evil.example/other").is_err());
    }

    #[test]
    fn microversions_are_agreed_from_the_root() {
        let root = |v: &str| json!({"default_version": {"version": v, "min_version": "1.1"}});
        assert_eq!(agree_version(&root("1.99")).expect("newer"), "1.73");
        assert_eq!(agree_version(&root("1.73")).expect("same"), "1.73");
        assert_eq!(agree_version(&root("1.58")).expect("older"), "1.58");
        let err = agree_version(&root("1.22")).expect_err("too old");
        assert!(err.to_string().contains("--from-json"), "{err}");
        // A root that says nothing, or nonsense: ours.
        for odd in [
            json!({}),
            json!(null),
            json!({"default_version": {"version": 7}}),
        ] {
            assert_eq!(agree_version(&odd).expect("ours"), "1.73", "{odd}");
        }
    }

    #[test]
    fn fault_messages() {
        let ironic = json!({"error_message": json!({
            "faultstring": "Node x could not be found.", "debuginfo": null
        }).to_string()});
        assert_eq!(
            fault_message(&ironic.to_string()),
            "Node x could not be found."
        );
        let object = json!({"error_message": {"faultstring": "nested"}});
        assert_eq!(fault_message(&object.to_string()), "nested");
        assert_eq!(fault_message(r#"{"error_message": "plain"}"#), "plain");
        assert_eq!(fault_message("<html>oops</html>"), "<html>oops</html>");
        let long = "x".repeat(1000);
        assert_eq!(fault_message(&long).chars().count(), MAX_MESSAGE + 1);
        assert_eq!(fault_message(""), "");
    }

    #[test]
    fn plain_http_needs_no_trust_store() {
        assert_eq!(trust_for(&url("http://h:1/"), None), Trust::PlainHttp);
        assert_eq!(trust_for(&url("https://h/"), None), Trust::System);
        let ca = PathBuf::from("/etc/ca.pem");
        assert_eq!(
            trust_for(&url("https://h/"), Some(&ca)),
            Trust::CaFile(ca.clone())
        );
    }
}
