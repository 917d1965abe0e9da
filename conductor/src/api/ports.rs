//! `/v1/ports` and `/v1/nodes/{node}/ports`: create, list, show, patch, delete (docs/ironic-protocols.md §5.2).
//! MACs are validated and stored lower case with colons; a port's node must exist (400).

use std::collections::HashMap;

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, Json};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::body::{self, JsonBody};
use super::error::ApiError;
use super::list::{self, Listing, Page};
use super::nodes;
use super::patch::{self, Rules};
use super::render::{self, Select};
use super::version::Ctx;
use super::State;
use crate::store::order::PORT_SORT_KEYS;
use crate::store::{NodeIdent, Port, PortFilter, StoreError};

/// The node a port refers to must exist: 400 (not 404: the port is what was asked for).
async fn check_node(state: &State, node: Uuid) -> Result<(), ApiError> {
    match state.manager.store().node(&NodeIdent::Uuid(node)).await {
        Ok(_) => Ok(()),
        Err(StoreError::NotFound { .. }) => Err(ApiError::bad_request(format!(
            "Invalid value for field \"node_uuid\": node {node} could not be found."
        ))),
        Err(e) => Err(e.into()),
    }
}

fn port_uuid(s: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(s).map_err(|_| {
        ApiError::bad_request(format!("Expected a UUID but received {:?}.", body::cut(s)))
    })
}

/// `POST /v1/ports`.
pub(super) async fn create(
    state: State,
    Extension(ctx): Extension<Ctx>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let obj = body::object(body, "a port")?;
    let mut known = vec!["uuid", "address", "node_uuid", "extra"];
    if ctx.at_least(19) {
        known.extend(["pxe_enabled", "local_link_connection"]);
    }
    body::refuse_unknown(&obj, &known, "port")?;
    if body::opt_object(&obj, "local_link_connection")?.is_some_and(|m| !m.is_empty()) {
        return Err(ApiError::bad_request(
            "Invalid value for field \"local_link_connection\": this conductor manages no \
             switches; leave it empty.",
        ));
    }
    let address = body::mac(&body::req_str(&obj, "address")?, "address")?;
    let node_uuid = body::opt_uuid(&obj, "node_uuid")?
        .ok_or_else(|| ApiError::bad_request("Mandatory field \"node_uuid\" is missing."))?;
    check_node(&state, node_uuid).await?;
    let port = Port {
        uuid: body::opt_uuid(&obj, "uuid")?.unwrap_or_else(Uuid::new_v4),
        address,
        node_uuid,
        pxe_enabled: body::opt_bool(&obj, "pxe_enabled")?.unwrap_or(true),
        extra: body::opt_object(&obj, "extra")?.unwrap_or_default(),
        created_at: crate::store::now(),
        updated_at: None,
    };
    let store = state.manager.store();
    store.create_port(&port).await?;
    let port = store.port(port.uuid).await?;
    let out = render::port(&port, &ctx, &Select::All);
    Ok(render::created(&ctx, &format!("ports/{}", port.uuid), out))
}

/// `GET /v1/ports`.
pub(super) async fn list(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let detail = list::detail(&query, &ctx)?;
    list_ports(state, ctx, query, None, detail, "ports").await
}

/// `GET /v1/ports/detail`.
pub(super) async fn list_detail(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    list_ports(state, ctx, query, None, true, "ports/detail").await
}

/// `GET /v1/nodes/{node}/ports`.
pub(super) async fn list_of_node(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let node = nodes::load(&state, &ctx, &node).await?;
    let detail = query
        .get("detail")
        .and_then(|v| body::parse_bool(v))
        .unwrap_or(false);
    let path = format!("nodes/{}/ports", node.uuid);
    list_ports(state, ctx, query, Some(node.uuid), detail, &path).await
}

/// `GET /v1/nodes/{node}/ports/detail`.
pub(super) async fn list_of_node_detail(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let node = nodes::load(&state, &ctx, &node).await?;
    let path = format!("nodes/{}/ports/detail", node.uuid);
    list_ports(state, ctx, query, Some(node.uuid), true, &path).await
}

async fn list_ports(
    state: State,
    ctx: Ctx,
    query: HashMap<String, String>,
    node: Option<Uuid>,
    detail: bool,
    path: &str,
) -> Result<Json<Value>, ApiError> {
    if detail && query.contains_key("fields") {
        return Err(ApiError::bad_request(
            "The \"fields\" and \"detail\" parameters are mutually exclusive.",
        ));
    }
    let names = render::port_field_names(&ctx);
    let default = if detail { Select::All } else { Select::Short };
    let select = list::fields(&query, default, &ctx, &names)?;
    let page = Page::parse(&query, PORT_SORT_KEYS, state.options.max_limit)?;
    let mut filter = PortFilter {
        node_uuid: node,
        order: page.order,
        limit: Some(page.limit),
        marker: page.marker,
        ..PortFilter::default()
    };
    // `?node=<uuid or name>` (1.5) and `?node_uuid=<uuid>`.
    if let Some(v) = query.get("node") {
        ctx.require(5, "The \"node\" filter")?;
        let node = nodes::load(&state, &ctx, v).await?;
        filter.node_uuid = Some(node.uuid);
    } else if let Some(v) = query.get("node_uuid") {
        filter.node_uuid = Some(body::parse_uuid(v, "node_uuid")?);
    }
    if let Some(v) = query.get("address") {
        filter.address = Some(body::mac(v, "address")?);
    }
    let ports = state
        .manager
        .store()
        .list_ports(&filter)
        .await
        .map_err(|e| page.store_error(e))?;
    Ok(page.respond(
        ports,
        Listing {
            collection: "ports",
            path,
            ctx: &ctx,
        },
        |port| port.uuid,
        |port| render::port(port, &ctx, &select),
    ))
}

/// `GET /v1/ports/{port}`.
pub(super) async fn show(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(port): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let names = render::port_field_names(&ctx);
    let select = list::fields(&query, Select::All, &ctx, &names)?;
    let port = state.manager.store().port(port_uuid(&port)?).await?;
    Ok(Json(render::port(&port, &ctx, &select)))
}

/// `PATCH /v1/ports/{port}`.
pub(super) async fn update(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(port): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let ops = patch::parse(body)?;
    let store = state.manager.store();
    let current = store.port(port_uuid(&port)?).await?;
    let mut writable = vec!["address", "node_uuid", "extra"];
    if ctx.at_least(19) {
        writable.push("pxe_enabled");
    }
    patch::check(
        &ops,
        &Rules {
            writable: &writable,
            read_only: &[
                "uuid",
                "id",
                "created_at",
                "updated_at",
                "links",
                "internal_info",
                "local_link_connection",
                "portgroup_uuid",
                "physical_network",
                "is_smartnic",
            ],
            mandatory: &["address", "node_uuid"],
            kind: "port",
        },
    )?;
    let mut document = render::port_document(&current, &ctx);
    patch::apply(&mut document, &ops)?;
    let empty = Map::new();
    let obj = document.as_object().unwrap_or(&empty);
    let mut updated = current.clone();
    updated.address = body::mac(&body::req_str(obj, "address")?, "address")?;
    updated.node_uuid = body::opt_uuid(obj, "node_uuid")?.ok_or_else(|| {
        ApiError::bad_request("Invalid value for field \"node_uuid\": a port needs a node.")
    })?;
    if updated.node_uuid != current.node_uuid {
        check_node(&state, updated.node_uuid).await?;
    }
    updated.extra = body::opt_object(obj, "extra")?.unwrap_or_default();
    if obj.contains_key("pxe_enabled") {
        updated.pxe_enabled = body::opt_bool(obj, "pxe_enabled")?.unwrap_or(true);
    }
    store.update_port(&updated).await?;
    let port = store.port(current.uuid).await?;
    Ok(Json(render::port(&port, &ctx, &Select::All)))
}

/// `DELETE /v1/ports/{port}`.
pub(super) async fn delete(state: State, Path(port): Path<String>) -> Result<StatusCode, ApiError> {
    state.manager.store().delete_port(port_uuid(&port)?).await?;
    Ok(StatusCode::NO_CONTENT)
}
