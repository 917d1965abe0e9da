//! `/v1/nodes`: create, list (`fields`, `detail`, filters, pagination, sorting), show by UUID
//! or name, JSON Patch, delete (docs/ironic-protocols.md §5.2).
//!
//! # Design
//! Plain record reads and writes go to the store; delete goes through the manager (it refuses
//! while a task runs or the node is `active`). A patch holds the node's reservation while it
//! writes, so it never overwrites what a running task writes: a held node is 409 `NodeLocked`.

use std::collections::HashMap;

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, Json};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::body::{self, cut, JsonBody};
use super::error::ApiError;
use super::list::{self, Listing, Page};
use super::patch::{self, Rules};
use super::render::{self, Select};
use super::version::Ctx;
use super::{drivers, State};
use crate::node::hardware_type::{InterfaceError, NodeInterfaces};
use crate::states::ProvisionState;
use crate::store::order::NODE_SORT_KEYS;
use crate::store::{Node, NodeFilter, NodeIdent};

/// Node fields a patch may change (the rest of the document is the conductor's).
const WRITABLE: &[&str] = &[
    "name",
    "driver",
    "driver_info",
    "properties",
    "instance_info",
    "extra",
    "instance_uuid",
    "maintenance",
    "network_data",
    "boot_interface",
    "deploy_interface",
    "conductor_group",
];

/// The interface fields a node may choose (API ≥ 1.31), each checked against its driver.
const CHOSEN_INTERFACES: [&str; 2] = ["boot_interface", "deploy_interface"];

/// Longest logical name (Ironic's column is 255 characters).
const MAX_NAME: usize = 255;

/// The microversion that added `conductor_group` to nodes.
const CONDUCTOR_GROUP_VERSION: u32 = 46;

/// Longest conductor group (Ironic's column is 255 characters).
const MAX_CONDUCTOR_GROUP: usize = 255;

/// The node a path names: a UUID, or (from 1.5) a logical name; 400 for anything else.
pub(super) fn ident(ctx: &Ctx, s: &str) -> Result<NodeIdent, ApiError> {
    if let Ok(uuid) = Uuid::parse_str(s) {
        return Ok(NodeIdent::Uuid(uuid));
    }
    if ctx.at_least(5) && valid_name(s) {
        return Ok(NodeIdent::Name(s.to_string()));
    }
    if ctx.at_least(5) {
        Err(ApiError::bad_request(format!(
            "Expected a logical name or UUID but received {:?}.",
            cut(s)
        )))
    } else {
        Err(ApiError::bad_request(format!(
            "Expected a UUID but received {:?} (logical names need API version 1.5).",
            cut(s)
        )))
    }
}

/// A logical name: RFC 3986 unreserved characters, not a UUID (it would shadow one).
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
        && Uuid::parse_str(s).is_err()
}

fn check_name(name: &str) -> Result<(), ApiError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "Invalid value for field \"name\": {:?} is not a valid logical name (letters, \
             digits, - . _ ~; at most {MAX_NAME}; not a UUID).",
            cut(name)
        )))
    }
}

/// A conductor group as nodes keep it, from a request's value (`None`: absent or null, the
/// default group). Ironic's rule (`ironic.common.utils.validate_conductor_group`:
/// `^[a-zA-Z0-9_\-\.]*$`, at most its column's 255), lower-cased as Ironic does: groups are
/// case-insensitive, and a node's group is compared as text with its conductors'
/// (`conductor.conductor_group`, which the configuration checks by the same rule), so a value
/// no conductor could have is refused here rather than leave the node with nobody to run it.
fn conductor_group(value: Option<String>) -> Result<String, ApiError> {
    let group = value.unwrap_or_default();
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-._".contains(&b);
    if group.len() <= MAX_CONDUCTOR_GROUP && group.bytes().all(allowed) {
        Ok(group.to_ascii_lowercase())
    } else {
        Err(ApiError::bad_request(format!(
            "Invalid value for field \"conductor_group\": {:?} is not a conductor group \
             (letters, digits, '-', '.' and '_' only; at most {MAX_CONDUCTOR_GROUP} characters).",
            cut(&group)
        )))
    }
}

/// 406 when a request names `conductor_group` before the version that added it, as Ironic
/// refuses every field of a newer version (`reject_fields_in_newer_versions`).
fn require_conductor_group(ctx: &Ctx) -> Result<(), ApiError> {
    ctx.require(CONDUCTOR_GROUP_VERSION, "The \"conductor_group\" field")
}

fn check_instance_uuid(value: Option<String>) -> Result<Option<String>, ApiError> {
    match value {
        None => Ok(None),
        Some(s) => body::parse_uuid(&s, "instance_uuid").map(|u| Some(u.to_string())),
    }
}

/// Loads the node a path names (400/404).
pub(super) async fn load(state: &State, ctx: &Ctx, node: &str) -> Result<Node, ApiError> {
    let ident = ident(ctx, node)?;
    Ok(state.manager.store().node(&ident).await?)
}

/// The node's `conductor` field (1.49): the live conductor that owns it, as this conductor's
/// view of the ring has it; empty when no live conductor serves its group.
fn owner(view: &crate::cluster::ClusterView, node: &Node) -> String {
    view.owner_name(&node.conductor_group, node.uuid)
        .unwrap_or_default()
}

/// `POST /v1/nodes`.
pub(super) async fn create(
    state: State,
    Extension(ctx): Extension<Ctx>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let obj = body::object(body, "a node")?;
    let mut known = vec![
        "uuid",
        "driver",
        "driver_info",
        "properties",
        "instance_info",
        "extra",
        "instance_uuid",
        "chassis_uuid",
        "conductor_group",
    ];
    if ctx.at_least(5) {
        known.push("name");
    }
    if ctx.at_least(31) {
        known.extend(CHOSEN_INTERFACES);
    }
    if ctx.at_least(66) {
        known.push("network_data");
    }
    body::refuse_unknown(&obj, &known, "node")?;
    // Ironic takes the default group ("") at any version: it is every older node's group.
    if !ctx.at_least(CONDUCTOR_GROUP_VERSION)
        && obj
            .get("conductor_group")
            .is_some_and(|v| v.as_str() != Some(""))
    {
        require_conductor_group(&ctx)?;
    }
    if obj.get("chassis_uuid").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::bad_request(
            "Invalid value for field \"chassis_uuid\": this conductor has no chassis.",
        ));
    }
    let driver = body::req_str(&obj, "driver")?;
    drivers::check(&driver)?;
    let uuid = body::opt_uuid(&obj, "uuid")?.unwrap_or_else(Uuid::new_v4);
    // Nodes start in `enroll` from 1.11 (their credentials unchecked), `available` before.
    let initial = if ctx.at_least(11) {
        ProvisionState::Enroll
    } else {
        ProvisionState::Available
    };
    let mut node = Node::new(uuid, driver, initial);
    if let Some(name) = body::opt_str(&obj, "name")? {
        check_name(&name)?;
        node.name = Some(name);
    }
    node.driver_info = body::opt_object(&obj, "driver_info")?.unwrap_or_default();
    node.properties = body::opt_object(&obj, "properties")?.unwrap_or_default();
    node.instance_info = body::opt_object(&obj, "instance_info")?.unwrap_or_default();
    node.extra = body::opt_object(&obj, "extra")?.unwrap_or_default();
    node.network_data = body::opt_object(&obj, "network_data")?.unwrap_or_default();
    node.instance_uuid = check_instance_uuid(body::opt_str(&obj, "instance_uuid")?)?;
    node.boot_interface = body::opt_str(&obj, "boot_interface")?;
    node.deploy_interface = body::opt_str(&obj, "deploy_interface")?;
    node.conductor_group = conductor_group(body::opt_str(&obj, "conductor_group")?)?;
    check_interfaces(&node)?;
    let store = state.manager.store();
    store.create_node(&node).await?;
    let node = store.node(&NodeIdent::Uuid(uuid)).await?;
    let out = render::node(
        &node,
        &ctx,
        &owner(&state.manager.cluster().view(), &node),
        &Select::All,
    );
    Ok(render::created(&ctx, &format!("nodes/{uuid}"), out))
}

/// `GET /v1/nodes`.
pub(super) async fn list(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let detail = list::detail(&query, &ctx)?;
    if detail && query.contains_key("fields") {
        return Err(ApiError::bad_request(
            "The \"fields\" and \"detail\" parameters are mutually exclusive.",
        ));
    }
    list_nodes(state, ctx, query, detail, "nodes").await
}

/// `GET /v1/nodes/detail`.
pub(super) async fn list_detail(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    if query.contains_key("fields") {
        return Err(ApiError::bad_request(
            "The \"fields\" parameter is not allowed on /nodes/detail.",
        ));
    }
    list_nodes(state, ctx, query, true, "nodes/detail").await
}

async fn list_nodes(
    state: State,
    ctx: Ctx,
    query: HashMap<String, String>,
    detail: bool,
    path: &str,
) -> Result<Json<Value>, ApiError> {
    let names = render::node_field_names(&ctx);
    let default = if detail { Select::All } else { Select::Short };
    let select = list::fields(&query, default, &ctx, &names)?;
    let page = Page::parse(&query, NODE_SORT_KEYS, state.options.max_limit)?;
    let mut filter = NodeFilter {
        order: page.order,
        limit: Some(page.limit),
        marker: page.marker,
        ..NodeFilter::default()
    };
    if let Some(v) = query.get("provision_state") {
        ctx.require(9, "The \"provision_state\" filter")?;
        filter.provision_state = Some(v.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "Invalid value for parameter \"provision_state\": {:?} is not a provision state.",
                cut(v)
            ))
        })?);
    }
    if let Some(v) = query.get("driver") {
        ctx.require(16, "The \"driver\" filter")?;
        filter.driver = Some(v.clone());
    }
    for (param, slot) in [
        ("maintenance", &mut filter.maintenance),
        ("associated", &mut filter.associated),
    ] {
        if let Some(v) = query.get(param) {
            *slot = Some(body::parse_bool(v).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Invalid value for parameter \"{param}\": {:?} (expected a boolean).",
                    cut(v)
                ))
            })?);
        }
    }
    if let Some(v) = query.get("instance_uuid") {
        filter.instance_uuid = Some(body::parse_uuid(v, "instance_uuid")?.to_string());
    }
    if let Some(v) = query.get("conductor_group") {
        ctx.require(CONDUCTOR_GROUP_VERSION, "The \"conductor_group\" filter")?;
        // Not checked against the rule: a group no node can have lists no node. The store
        // compares it in lower case.
        filter.conductor_group = Some(v.clone());
    }
    let nodes = state
        .manager
        .store()
        .list_nodes(&filter)
        .await
        .map_err(|e| page.store_error(e))?;
    let view = state.manager.cluster().view();
    Ok(page.respond(
        nodes,
        Listing {
            collection: "nodes",
            path,
            ctx: &ctx,
        },
        |node| node.uuid,
        |node| render::node(node, &ctx, &owner(&view, node), &select),
    ))
}

/// `GET /v1/nodes/{node}`.
pub(super) async fn show(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let names = render::node_field_names(&ctx);
    let select = list::fields(&query, Select::All, &ctx, &names)?;
    let node = load(&state, &ctx, &node).await?;
    let owner = owner(&state.manager.cluster().view(), &node);
    Ok(Json(render::node(&node, &ctx, &owner, &select)))
}

/// Checks a node PATCH against the node's document as the API renders it: the fields it shows
/// are writable where [`WRITABLE`] says so and read-only otherwise, and `driver` must stay.
pub(super) fn check_node_patch(document: &Value, ops: &[patch::PatchOp]) -> Result<(), ApiError> {
    let present: Vec<&str> = document
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let writable: Vec<&str> = WRITABLE
        .iter()
        .copied()
        .filter(|f| present.contains(f))
        .collect();
    let read_only: Vec<&str> = present
        .iter()
        .copied()
        .filter(|f| !writable.contains(f))
        .chain(["id", "reservation"])
        .collect();
    patch::check(
        ops,
        &Rules {
            writable: &writable,
            read_only: &read_only,
            mandatory: &["driver"],
            kind: "node",
        },
    )
}

/// `PATCH /v1/nodes/{node}`.
pub(super) async fn update(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let ops = patch::parse(body)?;
    // Before 1.46 the field is not in the document, so the patch rules would call it unknown
    // (400); Ironic refuses it as a field of a newer version (406).
    if !ctx.at_least(CONDUCTOR_GROUP_VERSION) && ops.iter().any(|op| op.root() == "conductor_group")
    {
        require_conductor_group(&ctx)?;
    }
    let current = load(&state, &ctx, &node).await?;
    let view = state.manager.cluster().view();
    let document = render::node_document(&current, &ctx, &owner(&view, &current));
    check_node_patch(&document, &ops)?;
    // Hold the node while writing: a running task's own writes are never overwritten, and a
    // client learns it must retry (409 NodeLocked).
    let store = state.manager.store();
    let holder = format!("{}:api-patch", state.manager.config().conductor_name);
    let reserved = store.reserve_node(current.uuid, &holder).await?;
    let result = async {
        let mut document = render::node_document(&reserved, &ctx, &owner(&view, &reserved));
        patch::apply(&mut document, &ops)?;
        let touched: Vec<&str> = ops.iter().map(|op| op.root()).collect();
        let updated = node_from_document(reserved.clone(), &document, &touched)?;
        store.update_node(&updated).await?;
        Ok::<_, ApiError>(())
    }
    .await;
    let released = store.release_node(current.uuid, &holder).await;
    result?;
    released?;
    let node = store.node(&NodeIdent::Uuid(current.uuid)).await?;
    Ok(Json(render::node(
        &node,
        &ctx,
        &owner(&view, &node),
        &Select::All,
    )))
}

/// 400 unless the node's driver offers the interfaces it chose and a flow runs them together
/// (Ironic's `IncompatibleInterface` wording).
fn check_interfaces(node: &Node) -> Result<(), ApiError> {
    match NodeInterfaces::of(node) {
        // A driver this conductor does not serve is refused (or, on a stored node, kept) by
        // the driver check, not here.
        Ok(_) | Err(InterfaceError::UnknownDriver(_)) => Ok(()),
        Err(e) => Err(ApiError::bad_request(e.to_string())),
    }
}

/// Reads the writable fields back from a patched document, checking their types. `touched`
/// are the fields the patch names: an interface it leaves alone is kept, or reset to the new
/// driver's default when the driver changes (as Ironic resets them).
fn node_from_document(
    mut node: Node,
    document: &Value,
    touched: &[&str],
) -> Result<Node, ApiError> {
    let empty = Map::new();
    let obj = document.as_object().unwrap_or(&empty);
    if obj.contains_key("name") {
        node.name = body::opt_str(obj, "name")?;
        if let Some(name) = &node.name {
            check_name(name)?;
        }
    }
    let driver = body::opt_str(obj, "driver")?.ok_or_else(|| {
        ApiError::bad_request("Invalid value for field \"driver\": a node needs a driver.")
    })?;
    let driver_changed = driver != node.driver;
    if driver_changed {
        drivers::check(&driver)?;
        node.driver = driver;
    }
    for field in CHOSEN_INTERFACES {
        let chosen = if touched.contains(&field) {
            body::opt_str(obj, field)?
        } else if driver_changed {
            None
        } else {
            continue;
        };
        match field {
            "boot_interface" => node.boot_interface = chosen,
            _ => node.deploy_interface = chosen,
        }
    }
    check_interfaces(&node)?;
    // Only when the patch names it: a group stored by other means (the CLI, an older version)
    // does not make every later patch of the node fail.
    if touched.contains(&"conductor_group") {
        node.conductor_group = conductor_group(body::opt_str(obj, "conductor_group")?)?;
    }
    node.driver_info = body::opt_object(obj, "driver_info")?.unwrap_or_default();
    node.properties = body::opt_object(obj, "properties")?.unwrap_or_default();
    node.instance_info = body::opt_object(obj, "instance_info")?.unwrap_or_default();
    node.extra = body::opt_object(obj, "extra")?.unwrap_or_default();
    if obj.contains_key("network_data") {
        node.network_data = body::opt_object(obj, "network_data")?.unwrap_or_default();
    }
    node.instance_uuid = check_instance_uuid(body::opt_str(obj, "instance_uuid")?)?;
    let maintenance = body::opt_bool(obj, "maintenance")?.unwrap_or(false);
    if !maintenance {
        // Leaving maintenance forgets why it was entered (Ironic does the same).
        node.maintenance_reason = None;
    }
    node.maintenance = maintenance;
    Ok(node)
}

/// `DELETE /v1/nodes/{node}`.
pub(super) async fn delete(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
) -> Result<StatusCode, ApiError> {
    let node = load(&state, &ctx, &node).await?;
    state
        .manager
        .delete_node(&NodeIdent::Uuid(node.uuid))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
