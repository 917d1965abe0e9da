//! The Swift object store: OpenStack Swift behind tempauth v1 or Keystone v3 (docs/architecture.md §6).
//!
//! # Design
//! [`SwiftStore`] maps the trait onto Swift's object API ([`client`] sends, [`auth`] gets the
//! token): a put that meets 404 creates the container (`PUT` container) and tries once more;
//! `delete_after` becomes `X-Delete-After` (Swift turns it into `X-Delete-At` and answers 404
//! once it has passed); metadata travels as `X-Object-Meta-*`. `set_metadata` is a `POST` to
//! the object, which replaces every `X-Object-Meta-*` header and also drops `X-Delete-At`
//! unless it is sent again (Swift's object server keeps only what the `POST` names), so the
//! deletion time read by a `HEAD` just before is sent back with it. Temp URLs are signed with
//! `vmdeploy_shared::tempurl` (HMAC-SHA256) over the storage URL's path, with the account's
//! `X-Account-Meta-Temp-URL-Key`: read once, and when the account has none, set to the
//! configured key or a generated 256-bit one (docs/ironic-protocols.md §4.1; Ironic reads
//! the account key the same way).
//!
//! # Limitations
//! Only the account key is used (not `Temp-URL-Key-2` or container keys). Setting the key
//! needs an account admin (tempauth `.admin`, Keystone's operator role).

pub mod auth;
pub mod client;

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::{Method, StatusCode};
use tokio::sync::Mutex;
use vmdeploy_shared::secret::Secret;
use vmdeploy_shared::tempurl::{self, TempUrlDigest, TempUrlKey};

pub use self::auth::SwiftAuth;
use self::client::{Payload, SwiftClient, Target};
use super::{ObjectBody, ObjectError, ObjectInfo, ObjectPath, ObjectStore, PutOptions};
use crate::net::https::{ClientSpec, TlsVerify, Trust};

/// Per-request timeout when none is configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The account metadata header holding the temp URL key.
const TEMP_URL_KEY_HEADER: &str = "x-account-meta-temp-url-key";
/// Prefix of object metadata headers.
const META_PREFIX: &str = "x-object-meta-";

/// How to reach Swift.
#[derive(Debug, Clone)]
pub struct SwiftConfig {
    /// Credentials and the auth endpoint.
    pub auth: SwiftAuth,
    /// The temp URL key to set when the account has none; `None` generates one.
    pub temp_url_key: Option<Secret>,
    /// How Swift's and Keystone's TLS certificates are checked (docs/architecture.md §7:
    /// against the system's roots unless configured otherwise).
    pub tls: TlsVerify,
    /// Connect timeout and the longest wait for any read (not for a whole upload).
    pub timeout: Duration,
}

impl SwiftConfig {
    /// A configuration with the defaults: TLS verified against the system's roots, a
    /// generated temp URL key when the account has none, [`DEFAULT_TIMEOUT`].
    pub fn new(auth: SwiftAuth) -> SwiftConfig {
        SwiftConfig {
            auth,
            temp_url_key: None,
            tls: TlsVerify::System,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// The Swift object store.
#[derive(Debug)]
pub struct SwiftStore {
    client: SwiftClient,
    configured_key: Option<Secret>,
    key: Mutex<Option<TempUrlKey>>,
}

fn build_http(config: &SwiftConfig) -> Result<reqwest::Client, ObjectError> {
    // A read timeout rather than a total one: an ISO upload may take longer than any sensible
    // request timeout, a stalled connection may not. No redirect is expected from Swift.
    ClientSpec::transfer(Trust::from(&config.tls), config.timeout, config.timeout)
        .no_redirects()
        .build()
        .map_err(|e| ObjectError::Other(format!("the Swift HTTPS client: {e}")))
}

fn header_value(value: &str, what: &str) -> Result<HeaderValue, ObjectError> {
    HeaderValue::from_str(value)
        .map_err(|_| ObjectError::Other(format!("{what} {value:?} cannot be sent in a header")))
}

/// Adds `metadata` to `headers` as `X-Object-Meta-<key>` (keys lower-cased).
fn insert_metadata(
    headers: &mut HeaderMap,
    metadata: &BTreeMap<String, String>,
) -> Result<(), ObjectError> {
    for (key, value) in metadata {
        let name = format!("{META_PREFIX}{}", key.to_ascii_lowercase());
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            ObjectError::Other(format!("metadata key {key:?} is not a valid header name"))
        })?;
        headers.insert(name, header_value(value, "metadata value")?);
    }
    Ok(())
}

/// A short excerpt of an error reply, for messages.
async fn excerpt(reply: reqwest::Response) -> String {
    let text = reply.text().await.unwrap_or_default();
    text.chars()
        .take(200)
        .collect::<String>()
        .trim()
        .to_string()
}

impl SwiftStore {
    /// A store for `config`; nothing is sent until the first call.
    pub fn new(config: SwiftConfig) -> Result<SwiftStore, ObjectError> {
        let http = build_http(&config)?;
        Ok(SwiftStore {
            client: SwiftClient::new(http, config.auth, config.timeout),
            configured_key: config.temp_url_key,
            key: Mutex::new(None),
        })
    }

    /// The account's temp URL key, set first when the account has none.
    async fn temp_url_key(&self) -> Result<TempUrlKey, ObjectError> {
        let mut cached = self.key.lock().await;
        if let Some(key) = cached.as_ref() {
            return Ok(key.clone());
        }
        let reply = self
            .client
            .request(
                Method::HEAD,
                Target::Account,
                &HeaderMap::new(),
                &Payload::Empty,
            )
            .await?;
        if !reply.status().is_success() {
            return Err(ObjectError::Other(format!(
                "reading the account's temp URL key: HEAD {} answered {}",
                reply.url(),
                reply.status()
            )));
        }
        let existing = reply
            .headers()
            .get(TEMP_URL_KEY_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_string);
        let key = match existing {
            Some(key) => {
                if self
                    .configured_key
                    .as_ref()
                    .is_some_and(|c| c.expose() != &key)
                {
                    tracing::warn!(
                        "the Swift account already has a temp URL key other than the configured \
                         one; signing with the account's"
                    );
                }
                key
            }
            None => {
                let key = match &self.configured_key {
                    Some(k) => k.expose().clone(),
                    None => {
                        let mut raw = [0u8; 32];
                        getrandom::fill(&mut raw).map_err(|e| {
                            ObjectError::Other(format!("generating a temp URL key: {e}"))
                        })?;
                        hex::encode(raw)
                    }
                };
                let mut headers = HeaderMap::new();
                headers.insert(
                    HeaderName::from_static(TEMP_URL_KEY_HEADER),
                    header_value(&key, "the temp URL key")?,
                );
                let reply = self
                    .client
                    .request(Method::POST, Target::Account, &headers, &Payload::Empty)
                    .await?;
                if !reply.status().is_success() {
                    let url = reply.url().to_string();
                    let status = reply.status();
                    return Err(ObjectError::Other(format!(
                        "setting the account's temp URL key: POST {url} answered {status}: {}",
                        excerpt(reply).await
                    )));
                }
                tracing::info!("set the Swift account's temp URL key (it had none)");
                key
            }
        };
        let key = TempUrlKey::new(key.into_bytes());
        *cached = Some(key.clone());
        Ok(key)
    }

    async fn create_container(&self, path: &ObjectPath) -> Result<(), ObjectError> {
        let container = &path.container;
        let reply = self
            .client
            .request(
                Method::PUT,
                Target::Path(&path.container_url_path()),
                &HeaderMap::new(),
                &Payload::Empty,
            )
            .await?;
        if reply.status().is_success() {
            tracing::info!(container, "created Swift container");
            Ok(())
        } else {
            let url = reply.url().to_string();
            let status = reply.status();
            Err(ObjectError::Other(format!(
                "creating the container: PUT {url} answered {status}: {}",
                excerpt(reply).await
            )))
        }
    }
}

#[async_trait::async_trait]
impl ObjectStore for SwiftStore {
    async fn put(
        &self,
        path: &ObjectPath,
        body: ObjectBody,
        options: &PutOptions,
    ) -> Result<(), ObjectError> {
        path.validate()?;
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        if let Some(ttl) = options.delete_after {
            // Whole seconds, rounded up: never delete before the time asked for.
            let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
            headers.insert("x-delete-after", HeaderValue::from(secs.max(1)));
        }
        insert_metadata(&mut headers, &options.metadata)?;
        let payload = match body {
            ObjectBody::Bytes(b) => Payload::Bytes(b),
            ObjectBody::File(file) => {
                let len = tokio::fs::metadata(&file)
                    .await
                    .map_err(|e| {
                        ObjectError::Io(std::io::Error::new(
                            e.kind(),
                            format!("reading {} to store it as {path}: {e}", file.display()),
                        ))
                    })?
                    .len();
                Payload::File(file, len)
            }
        };
        let target = path.url_path();
        let mut created = false;
        loop {
            let reply = self
                .client
                .request(Method::PUT, Target::Path(&target), &headers, &payload)
                .await?;
            match reply.status() {
                s if s.is_success() => return Ok(()),
                StatusCode::NOT_FOUND if !created => {
                    self.create_container(path).await?;
                    created = true;
                }
                status => {
                    let url = reply.url().to_string();
                    return Err(ObjectError::Other(format!(
                        "storing {path}: PUT {url} answered {status}: {}",
                        excerpt(reply).await
                    )));
                }
            }
        }
    }

    async fn delete(&self, path: &ObjectPath) -> Result<bool, ObjectError> {
        path.validate()?;
        let target = path.url_path();
        let reply = self
            .client
            .request(
                Method::DELETE,
                Target::Path(&target),
                &HeaderMap::new(),
                &Payload::Empty,
            )
            .await?;
        match reply.status() {
            s if s.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            status => {
                let url = reply.url().to_string();
                Err(ObjectError::Other(format!(
                    "deleting {path}: DELETE {url} answered {status}: {}",
                    excerpt(reply).await
                )))
            }
        }
    }

    async fn head(&self, path: &ObjectPath) -> Result<ObjectInfo, ObjectError> {
        path.validate()?;
        let target = path.url_path();
        let reply = self
            .client
            .request(
                Method::HEAD,
                Target::Path(&target),
                &HeaderMap::new(),
                &Payload::Empty,
            )
            .await?;
        let status = reply.status();
        if status == StatusCode::NOT_FOUND {
            return Err(ObjectError::NotFound(path.clone()));
        }
        if !status.is_success() {
            return Err(ObjectError::Other(format!(
                "reading {path}: HEAD {} answered {status}",
                reply.url()
            )));
        }
        let headers = reply.headers();
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let size = text("content-length")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| {
                ObjectError::Other(format!("HEAD of {path} gave no valid Content-Length"))
            })?;
        let delete_at = match text("x-delete-at") {
            Some(v) => {
                let secs: i64 = v.trim().parse().map_err(|_| {
                    ObjectError::Other(format!("HEAD of {path}: X-Delete-At {v:?} is not a time"))
                })?;
                Some(
                    time::OffsetDateTime::from_unix_timestamp(secs).map_err(|e| {
                        ObjectError::Other(format!("HEAD of {path}: X-Delete-At {v:?}: {e}"))
                    })?,
                )
            }
            None => None,
        };
        let metadata = headers
            .iter()
            .filter_map(|(name, value)| {
                let key = name.as_str().strip_prefix(META_PREFIX)?;
                Some((key.to_string(), value.to_str().ok()?.to_string()))
            })
            .collect();
        Ok(ObjectInfo {
            size,
            metadata,
            delete_at,
        })
    }

    async fn set_metadata(
        &self,
        path: &ObjectPath,
        metadata: &BTreeMap<String, String>,
    ) -> Result<(), ObjectError> {
        path.validate()?;
        let mut headers = HeaderMap::new();
        insert_metadata(&mut headers, metadata)?;
        // A POST without X-Delete-At clears it (see the module documentation): send it back.
        if let Some(at) = self.head(path).await?.delete_at {
            headers.insert("x-delete-at", HeaderValue::from(at.unix_timestamp()));
        }
        let target = path.url_path();
        let reply = self
            .client
            .request(
                Method::POST,
                Target::Path(&target),
                &headers,
                &Payload::Empty,
            )
            .await?;
        match reply.status() {
            s if s.is_success() => Ok(()),
            StatusCode::NOT_FOUND => Err(ObjectError::NotFound(path.clone())),
            status => {
                let url = reply.url().to_string();
                Err(ObjectError::Other(format!(
                    "replacing the metadata of {path}: POST {url} answered {status}: {}",
                    excerpt(reply).await
                )))
            }
        }
    }

    async fn temp_url(&self, path: &ObjectPath, ttl: Duration) -> Result<String, ObjectError> {
        path.validate()?;
        let key = self.temp_url_key().await?;
        let storage_url = self.client.storage_url().await?;
        let parsed = url::Url::parse(&storage_url).map_err(|e| {
            ObjectError::Other(format!(
                "Swift's storage URL {storage_url:?} does not parse: {e}"
            ))
        })?;
        // Swift checks the signature against the decoded path (WSGI PATH_INFO).
        let account_path =
            percent_encoding::percent_decode_str(parsed.path().trim_end_matches('/'))
                .decode_utf8()
                .map_err(|_| {
                    ObjectError::Other(format!("Swift's storage URL {storage_url:?} is not UTF-8"))
                })?
                .into_owned();
        let signed = format!("{account_path}/{}/{}", path.container, path.object);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let expires = now.saturating_add(ttl.as_secs().max(1));
        let query = tempurl::query(&key, TempUrlDigest::Sha256, "GET", expires, &signed)
            .map_err(|e| ObjectError::Other(format!("signing a temp URL for {path}: {e}")))?;
        Ok(format!("{storage_url}{}?{query}", path.url_path()))
    }

    fn kind(&self) -> &'static str {
        "swift"
    }
}
