//! What the API's unit tests share: a router over a manager with a store, and a one-shot
//! request helper (tower's `ServiceExt::oneshot`) that returns status, headers and JSON.
//!
//! The store is an in-memory implementation of the [`Store`] trait that keeps the trait's
//! promises the API relies on (unique UUID/name/MAC, reservations, filters); it stands in until
//! the SQLite store of the same trait is merged into this branch.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use time::OffsetDateTime;
use tower::ServiceExt;
use uuid::Uuid;

use crate::deploy::{DeployConfig, DeployContext};
use crate::manager::{Manager, ManagerConfig};
use crate::objects::{ObjectBody, ObjectError, ObjectInfo, ObjectPath, ObjectStore, PutOptions};
use crate::store::{Node, NodeFilter, NodeIdent, Port, PortFilter, Store, StoreError};

#[derive(Default)]
struct Records {
    nodes: Vec<Node>,
    ports: Vec<Port>,
}

/// Nodes and ports in memory, in creation order.
#[derive(Default)]
pub(super) struct MemoryStore {
    records: Mutex<Records>,
}

impl MemoryStore {
    fn lock(&self) -> MutexGuard<'_, Records> {
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn node_not_found(ident: impl ToString) -> StoreError {
    StoreError::NotFound {
        kind: "node",
        ident: ident.to_string(),
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn create_node(&self, node: &Node) -> Result<(), StoreError> {
        let mut r = self.lock();
        if r.nodes.iter().any(|n| n.uuid == node.uuid) {
            return Err(StoreError::Duplicate {
                kind: "node",
                field: "uuid",
                value: node.uuid.to_string(),
            });
        }
        if let Some(name) = &node.name {
            if r.nodes.iter().any(|n| n.name.as_ref() == Some(name)) {
                return Err(StoreError::Duplicate {
                    kind: "node",
                    field: "name",
                    value: name.clone(),
                });
            }
        }
        r.nodes.push(node.clone());
        Ok(())
    }

    async fn node(&self, ident: &NodeIdent) -> Result<Node, StoreError> {
        self.lock()
            .nodes
            .iter()
            .find(|n| match ident {
                NodeIdent::Uuid(u) => n.uuid == *u,
                NodeIdent::Name(name) => n.name.as_ref() == Some(name),
            })
            .cloned()
            .ok_or_else(|| node_not_found(ident))
    }

    async fn list_nodes(&self, filter: &NodeFilter) -> Result<Vec<Node>, StoreError> {
        let r = self.lock();
        let mut out: Vec<Node> = r
            .nodes
            .iter()
            .filter(|n| {
                filter
                    .provision_state
                    .is_none_or(|s| n.provision_state == s)
            })
            .filter(|n| filter.driver.as_ref().is_none_or(|d| &n.driver == d))
            .filter(|n| filter.maintenance.is_none_or(|m| n.maintenance == m))
            .filter(|n| {
                filter
                    .instance_uuid
                    .as_ref()
                    .is_none_or(|i| n.instance_uuid.as_ref() == Some(i))
            })
            .filter(|n| {
                filter
                    .associated
                    .is_none_or(|a| n.instance_uuid.is_some() == a)
            })
            .filter(|n| {
                filter
                    .reserved_by
                    .as_ref()
                    .is_none_or(|h| n.reservation.as_ref() == Some(h))
            })
            .cloned()
            .collect();
        if let Some(marker) = filter.marker {
            let at = out
                .iter()
                .position(|n| n.uuid == marker)
                .map_or(0, |i| i + 1);
            out.drain(..at);
        }
        if let Some(limit) = filter.limit {
            out.truncate(limit);
        }
        Ok(out)
    }

    async fn update_node(&self, node: &Node) -> Result<(), StoreError> {
        let mut r = self.lock();
        if let Some(name) = &node.name {
            if r.nodes
                .iter()
                .any(|n| n.uuid != node.uuid && n.name.as_ref() == Some(name))
            {
                return Err(StoreError::Duplicate {
                    kind: "node",
                    field: "name",
                    value: name.clone(),
                });
            }
        }
        let slot = r
            .nodes
            .iter_mut()
            .find(|n| n.uuid == node.uuid)
            .ok_or_else(|| node_not_found(node.uuid))?;
        let (reservation, created_at) = (slot.reservation.clone(), slot.created_at);
        *slot = node.clone();
        slot.reservation = reservation;
        slot.created_at = created_at;
        slot.updated_at = Some(OffsetDateTime::now_utc());
        Ok(())
    }

    async fn delete_node(&self, uuid: Uuid) -> Result<(), StoreError> {
        let mut r = self.lock();
        let before = r.nodes.len();
        r.nodes.retain(|n| n.uuid != uuid);
        if r.nodes.len() == before {
            return Err(node_not_found(uuid));
        }
        r.ports.retain(|p| p.node_uuid != uuid);
        Ok(())
    }

    async fn reserve_node(&self, uuid: Uuid, holder: &str) -> Result<Node, StoreError> {
        let mut r = self.lock();
        let slot = r
            .nodes
            .iter_mut()
            .find(|n| n.uuid == uuid)
            .ok_or_else(|| node_not_found(uuid))?;
        if let Some(current) = &slot.reservation {
            return Err(StoreError::Locked {
                node: uuid,
                holder: current.clone(),
            });
        }
        slot.reservation = Some(holder.to_string());
        Ok(slot.clone())
    }

    async fn release_node(&self, uuid: Uuid, holder: &str) -> Result<(), StoreError> {
        let mut r = self.lock();
        if let Some(slot) = r.nodes.iter_mut().find(|n| n.uuid == uuid) {
            if slot.reservation.as_deref() == Some(holder) {
                slot.reservation = None;
            }
        }
        Ok(())
    }

    async fn release_all(&self, holder_prefix: &str) -> Result<Vec<Uuid>, StoreError> {
        let mut r = self.lock();
        let mut released = Vec::new();
        for n in r.nodes.iter_mut() {
            if n.reservation
                .as_deref()
                .is_some_and(|h| h.starts_with(holder_prefix))
            {
                n.reservation = None;
                released.push(n.uuid);
            }
        }
        Ok(released)
    }

    async fn create_port(&self, port: &Port) -> Result<(), StoreError> {
        let mut r = self.lock();
        if r.ports.iter().any(|p| p.uuid == port.uuid) {
            return Err(StoreError::Duplicate {
                kind: "port",
                field: "uuid",
                value: port.uuid.to_string(),
            });
        }
        if r.ports.iter().any(|p| p.address == port.address) {
            return Err(StoreError::Duplicate {
                kind: "port",
                field: "address",
                value: port.address.clone(),
            });
        }
        r.ports.push(port.clone());
        Ok(())
    }

    async fn port(&self, uuid: Uuid) -> Result<Port, StoreError> {
        self.lock()
            .ports
            .iter()
            .find(|p| p.uuid == uuid)
            .cloned()
            .ok_or(StoreError::NotFound {
                kind: "port",
                ident: uuid.to_string(),
            })
    }

    async fn list_ports(&self, filter: &PortFilter) -> Result<Vec<Port>, StoreError> {
        let r = self.lock();
        let mut out: Vec<Port> = r
            .ports
            .iter()
            .filter(|p| filter.node_uuid.is_none_or(|n| p.node_uuid == n))
            .filter(|p| {
                filter
                    .address
                    .as_ref()
                    .is_none_or(|a| p.address == a.to_ascii_lowercase())
            })
            .cloned()
            .collect();
        if let Some(limit) = filter.limit {
            out.truncate(limit);
        }
        Ok(out)
    }

    async fn update_port(&self, port: &Port) -> Result<(), StoreError> {
        let mut r = self.lock();
        if r.ports
            .iter()
            .any(|p| p.uuid != port.uuid && p.address == port.address)
        {
            return Err(StoreError::Duplicate {
                kind: "port",
                field: "address",
                value: port.address.clone(),
            });
        }
        let slot =
            r.ports
                .iter_mut()
                .find(|p| p.uuid == port.uuid)
                .ok_or(StoreError::NotFound {
                    kind: "port",
                    ident: port.uuid.to_string(),
                })?;
        let created_at = slot.created_at;
        *slot = port.clone();
        slot.created_at = created_at;
        slot.updated_at = Some(OffsetDateTime::now_utc());
        Ok(())
    }

    async fn delete_port(&self, uuid: Uuid) -> Result<(), StoreError> {
        let mut r = self.lock();
        let before = r.ports.len();
        r.ports.retain(|p| p.uuid != uuid);
        if r.ports.len() == before {
            return Err(StoreError::NotFound {
                kind: "port",
                ident: uuid.to_string(),
            });
        }
        Ok(())
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

/// The conductor name tests see in `reservation`, `conductor` and `hosts`.
pub(super) const CONDUCTOR: &str = "test-conductor";

/// A router over a fresh store; the store too, to arrange and inspect records.
pub(super) fn app() -> (axum::Router, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::default());
    let deploy = Arc::new(DeployContext {
        store: Arc::clone(&store) as Arc<dyn Store>,
        objects: Arc::new(NoObjects),
        config: DeployConfig {
            api_url: "http://127.0.0.1:6385".into(),
            api_ca_pem: None,
            container: "vmdeploy".into(),
            deploy_helper_images_ttl: Duration::from_secs(600),
            agent_allow_plain_http: true,
            agent_call_timeout: Duration::from_secs(5),
        },
    });
    let manager = Arc::new(Manager::new(
        deploy,
        ManagerConfig {
            deploy_callback_timeout: Duration::from_secs(1800),
            power_sync_interval: Duration::from_secs(60),
            automated_clean: false,
            conductor_name: CONDUCTOR.into(),
        },
    ));
    let router = super::router(
        manager,
        super::ApiOptions {
            public_url: Some("http://api.test:6385".into()),
        },
    );
    (router, store)
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
