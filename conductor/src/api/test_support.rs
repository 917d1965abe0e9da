//! What the API's unit tests share: a router over a manager with a store, and a one-shot
//! request helper (tower's `ServiceExt::oneshot`) that returns status, headers and JSON.
//!
//! The store is the real [`SqliteStore`], in a temporary directory per test.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use vmdeploy_shared::api::ipa::ApiVersion;

use super::version::Ctx;
use crate::deploy::{DeployConfig, DeployContext};
use crate::manager::{Manager, ManagerConfig};
use crate::objects::{ObjectBody, ObjectError, ObjectInfo, ObjectPath, ObjectStore, PutOptions};
use crate::store::sqlite::SqliteStore;
use crate::store::Store;

/// The real SQLite store in a temporary directory that lives as long as the value.
pub(super) struct TestStore {
    store: Arc<SqliteStore>,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for TestStore {
    type Target = SqliteStore;

    fn deref(&self) -> &SqliteStore {
        &self.store
    }
}

/// An object store the API never touches (the flows do): every call fails.
struct NoObjects;

#[async_trait::async_trait]
impl ObjectStore for NoObjects {
    async fn put(&self, _: &ObjectPath, _: ObjectBody, _: &PutOptions) -> Result<(), ObjectError> {
        Err(ObjectError::Unavailable(
            "no object store in API tests".into(),
        ))
    }
    async fn delete(&self, _: &ObjectPath) -> Result<bool, ObjectError> {
        Err(ObjectError::Unavailable(
            "no object store in API tests".into(),
        ))
    }
    async fn head(&self, path: &ObjectPath) -> Result<ObjectInfo, ObjectError> {
        Err(ObjectError::NotFound(path.clone()))
    }
    async fn temp_url(&self, _: &ObjectPath, _: Duration) -> Result<String, ObjectError> {
        Err(ObjectError::Unavailable(
            "no object store in API tests".into(),
        ))
    }
    fn kind(&self) -> &'static str {
        "none"
    }
}

/// A request context at microversion `1.<minor>`.
pub(super) fn ctx(minor: u32) -> Ctx {
    Ctx {
        version: ApiVersion::new(1, minor),
        base_url: "http://h".into(),
    }
}

/// The conductor name tests see in `reservation`, `conductor` and `hosts`.
pub(super) const CONDUCTOR: &str = "test-conductor";

/// A router over a fresh store; the store too, to arrange and inspect records.
pub(super) fn app() -> (axum::Router, TestStore) {
    app_with(super::ApiOptions::default())
}

/// [`app`] with `options` (its `public_url` is the tests' own).
pub(super) fn app_with(options: super::ApiOptions) -> (axum::Router, TestStore) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("vmdeploy.sqlite")).expect("opening the store");
    let deploy = Arc::new(DeployContext {
        store: Arc::clone(&store) as Arc<dyn Store>,
        objects: Arc::new(NoObjects),
        config: DeployConfig::for_tests(),
        images: None,
        boot_isos: None,
        netboot: None,
    });
    let manager = Arc::new(Manager::new(
        deploy,
        ManagerConfig {
            deploy_callback_timeout: Duration::from_secs(1800),
            power_sync_interval: Duration::from_secs(60),
            automated_clean: false,
            conductor_name: CONDUCTOR.into(),
            sync_power_state_workers: crate::manager::DEFAULT_SYNC_POWER_STATE_WORKERS,
            conductor_group: String::new(),
            heartbeat_interval: crate::manager::DEFAULT_HEARTBEAT_INTERVAL,
            heartbeat_timeout: crate::manager::DEFAULT_HEARTBEAT_TIMEOUT,
        },
    ));
    let router = super::router(
        manager,
        super::ApiOptions {
            public_url: Some("http://api.test:6385".into()),
            ..options
        },
    );
    (router, TestStore { store, _dir: dir })
}

/// What a request got back.
#[derive(Debug)]
pub(super) struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// The body as JSON (`Null` when empty).
    pub json: Value,
}

impl Reply {
    /// The `faultstring` of a fault body; panics (a test failure) when the body is not one.
    pub fn fault(&self) -> String {
        let inner = self.json["error_message"]
            .as_str()
            .unwrap_or_else(|| panic!("no error_message string in {}", self.json));
        let inner: Value = serde_json::from_str(inner)
            .unwrap_or_else(|e| panic!("error_message is not JSON ({e}): {inner}"));
        assert!(inner["debuginfo"].is_null(), "{inner}");
        assert!(inner["faultcode"].is_string(), "{inner}");
        inner["faultstring"]
            .as_str()
            .unwrap_or_else(|| panic!("no faultstring in {inner}"))
            .to_string()
    }

    /// A response header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// One request through the router at `version` (`None`: no header).
pub(super) async fn call_raw(
    router: &axum::Router,
    method: Method,
    path: &str,
    version: Option<&str>,
    body: Option<Vec<u8>>,
) -> Reply {
    call_as(router, None, method, path, version, body).await
}

/// One request at the newest version with a JSON body, from `client` as the listener would
/// say ([`super::ClientAddr`]).
pub(super) async fn call_from(
    router: &axum::Router,
    client: std::net::IpAddr,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Reply {
    let body = body.map(|b| b.to_string().into_bytes());
    call_as(router, Some(client), method, path, Some("latest"), body).await
}

async fn call_as(
    router: &axum::Router,
    client: Option<std::net::IpAddr>,
    method: Method,
    path: &str,
    version: Option<&str>,
    body: Option<Vec<u8>>,
) -> Reply {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "api.test:6385");
    if let Some(v) = version {
        req = req.header("X-OpenStack-Ironic-API-Version", v);
    }
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    if let Some(client) = client {
        req = req.extension(super::ClientAddr(client));
    }
    let req = req
        .body(body.map(Body::from).unwrap_or_else(Body::empty))
        .expect("request builds");
    let response = router
        .clone()
        .oneshot(req)
        .await
        .expect("the router's error type is Infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body reads")
        .to_bytes();
    let json = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "{status}: body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&bytes)
            )
        })
    };
    Reply {
        status,
        headers,
        json,
    }
}

/// One request at the newest version with a JSON body.
pub(super) async fn call(
    router: &axum::Router,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Reply {
    call_raw(
        router,
        method,
        path,
        Some("latest"),
        body.map(|b| b.to_string().into_bytes()),
    )
    .await
}
