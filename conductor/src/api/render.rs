//! Nodes and ports as JSON, per microversion: each field appears from the version Ironic added
//! it (the table in [`node_fields`]), `fields=` selects among them, lists without `detail` show
//! Ironic's short set, and every body goes through [`super::mask::mask_secrets`] last.
//!
//! # Design
//! A field this conductor has nothing behind (chassis, traits, ...) is rendered
//! with the value Ironic shows for "not set", so a client sees the shape of the version it
//! negotiated; interfaces (`crate::node::hardware_type`) and the conductor group are the node's
//! own.

use axum::http::{header::LOCATION, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::error::ApiError;
use super::mask::mask_secrets;
use super::version::Ctx;
use crate::node::hardware_type::NodeInterfaces;
use crate::states::ProvisionState;
use crate::store::{Node, Port};

/// Fields of a node list without `detail` (Ironic's `_DEFAULT_RETURN_FIELDS`).
const NODE_SHORT: &[&str] = &[
    "uuid",
    "name",
    "instance_uuid",
    "power_state",
    "provision_state",
    "maintenance",
    "links",
];

/// Fields of a port list without `detail`.
const PORT_SHORT: &[&str] = &["uuid", "address", "links"];

/// A timestamp as Ironic writes it (ISO 8601 with offset).
pub(super) fn timestamp(t: Option<OffsetDateTime>) -> Value {
    t.and_then(|t| t.format(&Rfc3339).ok())
        .map(Value::String)
        .unwrap_or(Value::Null)
}

fn links(ctx: &Ctx, kind: &str, id: &str) -> Value {
    json!([
        {"href": ctx.url(&format!("/v1/{kind}/{id}")), "rel": "self"},
        {"href": ctx.url(&format!("/{kind}/{id}")), "rel": "bookmark"},
    ])
}

/// Every node field at `ctx.version`, with its value, in Ironic's order of introduction.
fn node_fields(node: &Node, ctx: &Ctx, conductor: &str) -> Vec<(&'static str, Value)> {
    let id = node.uuid.to_string();
    let iface = NodeInterfaces::shown(node);
    // 1.1 showed `available` as NOSTATE (null); 1.2 renamed it (docs/ironic-protocols.md §5.1).
    let provision_state = if !ctx.at_least(2) && node.provision_state == ProvisionState::Available {
        Value::Null
    } else {
        json!(node.provision_state.as_str())
    };
    let mut fields: Vec<(u32, &'static str, Value)> = vec![
        (1, "uuid", json!(id)),
        (1, "chassis_uuid", Value::Null),
        (1, "console_enabled", json!(node.console_enabled)),
        (1, "created_at", timestamp(Some(node.created_at))),
        (1, "driver", json!(node.driver)),
        (1, "driver_info", Value::Object(node.driver_info.clone())),
        (1, "extra", Value::Object(node.extra.clone())),
        (
            1,
            "instance_info",
            Value::Object(node.instance_info.clone()),
        ),
        (1, "instance_uuid", json!(node.instance_uuid)),
        (1, "last_error", json!(node.last_error)),
        (1, "maintenance", json!(node.maintenance)),
        (1, "maintenance_reason", json!(node.maintenance_reason)),
        (
            1,
            "power_state",
            json!(node.power_state.map(|p| p.as_str())),
        ),
        (1, "properties", Value::Object(node.properties.clone())),
        (1, "provision_state", provision_state),
        (
            1,
            "provision_updated_at",
            timestamp(node.provision_updated_at),
        ),
        (1, "reservation", json!(node.reservation)),
        (
            1,
            "target_power_state",
            json!(node.target_power_state.map(|p| p.as_str())),
        ),
        (
            1,
            "target_provision_state",
            json!(node.target_provision_state.map(|s| s.as_str())),
        ),
        (1, "updated_at", timestamp(node.updated_at)),
        (1, "links", links(ctx, "nodes", &id)),
        (1, "ports", links(ctx, "nodes", &format!("{id}/ports"))),
        (
            3,
            "driver_internal_info",
            Value::Object(node.driver_internal_info.clone()),
        ),
        (5, "name", json!(node.name)),
        (6, "inspection_finished_at", Value::Null),
        (6, "inspection_started_at", Value::Null),
        (
            7,
            "clean_step",
            crate::deploy::clean::current_step(&node.driver_internal_info),
        ),
        (12, "raid_config", json!({})),
        (12, "target_raid_config", json!({})),
        (20, "network_interface", json!("noop")),
        (21, "resource_class", Value::Null),
        (31, "boot_interface", json!(iface.boot)),
        (31, "console_interface", json!("no-console")),
        (31, "deploy_interface", json!(iface.deploy)),
        (31, "inspect_interface", json!("no-inspect")),
        (
            31,
            "management_interface",
            json!(iface.hardware_type.management),
        ),
        (31, "power_interface", json!(iface.hardware_type.power)),
        (31, "raid_interface", json!("no-raid")),
        (31, "vendor_interface", json!(iface.hardware_type.vendor)),
        (33, "storage_interface", json!("noop")),
        (37, "traits", json!([])),
        (38, "rescue_interface", json!("no-rescue")),
        (40, "bios_interface", json!("no-bios")),
        (42, "fault", Value::Null),
        (44, "deploy_step", json!({})),
        (46, "conductor_group", json!(node.conductor_group)),
        (47, "automated_clean", Value::Null),
        (48, "protected", json!(false)),
        (48, "protected_reason", Value::Null),
        // Ironic's null when no live conductor serves the node's group.
        (
            49,
            "conductor",
            Some(conductor)
                .filter(|c| !c.is_empty())
                .map_or(Value::Null, |c| json!(c)),
        ),
        (50, "owner", Value::Null),
        (51, "description", Value::Null),
        (52, "allocation_uuid", Value::Null),
        (61, "retired", json!(false)),
        (61, "retired_reason", Value::Null),
        (65, "lessee", Value::Null),
        (66, "network_data", Value::Object(node.network_data.clone())),
    ];
    fields.retain(|(since, _, _)| ctx.at_least(*since));
    fields
        .into_iter()
        .map(|(_, name, value)| (name, value))
        .collect()
}

/// Which fields of a node or port to show.
#[derive(Debug, Clone)]
pub(super) enum Select {
    /// All of them (show, detail list).
    All,
    /// The short set of a list.
    Short,
    /// `fields=a,b,c`.
    Only(Vec<String>),
}

impl Select {
    /// From a `fields` query value (`None`: `default`), checked against `valid` (400 naming the
    /// unknown ones). `fields` needs 1.8.
    pub fn parse(
        fields: Option<&str>,
        default: Select,
        ctx: &Ctx,
        valid: &[&str],
    ) -> Result<Select, ApiError> {
        let Some(fields) = fields else {
            return Ok(default);
        };
        ctx.require(8, "The \"fields\" parameter")?;
        let wanted: Vec<String> = fields
            .split(',')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(String::from)
            .collect();
        let invalid: Vec<&str> = wanted
            .iter()
            .map(String::as_str)
            .filter(|f| !valid.contains(f))
            .collect();
        if !invalid.is_empty() {
            return Err(ApiError::bad_request(format!(
                "Field(s) \"{}\" are not valid",
                invalid.join(", ")
            )));
        }
        Ok(Select::Only(wanted))
    }

    fn keeps(&self, field: &str, short: &[&str]) -> bool {
        match self {
            Select::All => true,
            Select::Short => short.contains(&field),
            Select::Only(fields) => fields.iter().any(|f| f == field),
        }
    }
}

/// Names of the node fields at `ctx.version` (for `fields=` checks).
pub(super) fn node_field_names(ctx: &Ctx) -> Vec<&'static str> {
    let probe = Node::new(uuid::Uuid::nil(), "", ProvisionState::Enroll);
    node_fields(&probe, ctx, "")
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// A node as the API shows it, secrets masked.
pub(super) fn node(node: &Node, ctx: &Ctx, conductor: &str, select: &Select) -> Value {
    let mut out = Map::new();
    for (name, value) in node_fields(node, ctx, conductor) {
        if select.keeps(name, NODE_SHORT) {
            out.insert(name.to_string(), value);
        }
    }
    let mut out = Value::Object(out);
    mask_secrets(&mut out);
    out
}

/// The node's fields as a patch works on them: unmasked, writable and read-only alike.
pub(super) fn node_document(node: &Node, ctx: &Ctx, conductor: &str) -> Value {
    Value::Object(
        node_fields(node, ctx, conductor)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

fn port_fields(port: &Port, ctx: &Ctx) -> Vec<(&'static str, Value)> {
    let id = port.uuid.to_string();
    let mut fields: Vec<(u32, &'static str, Value)> = vec![
        (1, "uuid", json!(id)),
        (1, "address", json!(port.address)),
        (1, "node_uuid", json!(port.node_uuid.to_string())),
        (1, "extra", Value::Object(port.extra.clone())),
        (1, "created_at", timestamp(Some(port.created_at))),
        (1, "updated_at", timestamp(port.updated_at)),
        (1, "links", links(ctx, "ports", &id)),
        (18, "internal_info", json!({})),
        (19, "local_link_connection", json!({})),
        (19, "pxe_enabled", json!(port.pxe_enabled)),
        (24, "portgroup_uuid", Value::Null),
        (34, "physical_network", Value::Null),
        (53, "is_smartnic", json!(false)),
    ];
    fields.retain(|(since, _, _)| ctx.at_least(*since));
    fields
        .into_iter()
        .map(|(_, name, value)| (name, value))
        .collect()
}

/// Names of the port fields at `ctx.version`.
pub(super) fn port_field_names(ctx: &Ctx) -> Vec<&'static str> {
    let probe = Port {
        uuid: uuid::Uuid::nil(),
        address: String::new(),
        node_uuid: uuid::Uuid::nil(),
        pxe_enabled: true,
        extra: Map::new(),
        created_at: OffsetDateTime::UNIX_EPOCH,
        updated_at: None,
    };
    port_fields(&probe, ctx)
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// A port as the API shows it, secrets masked.
pub(super) fn port(port: &Port, ctx: &Ctx, select: &Select) -> Value {
    let mut out = Map::new();
    for (name, value) in port_fields(port, ctx) {
        if select.keeps(name, PORT_SHORT) {
            out.insert(name.to_string(), value);
        }
    }
    let mut out = Value::Object(out);
    mask_secrets(&mut out);
    out
}

/// The port's fields as a patch works on them.
pub(super) fn port_document(port: &Port, ctx: &Ctx) -> Value {
    Value::Object(
        port_fields(port, ctx)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

/// A `201 Created` with `doc` and, when it makes a valid header, `Location: <base>/v1/<path>`.
pub(super) fn created(ctx: &Ctx, path: &str, doc: Value) -> Response {
    let mut response = (StatusCode::CREATED, Json(doc)).into_response();
    if let Ok(location) = HeaderValue::from_str(&ctx.url(&format!("/v1/{path}"))) {
        response.headers_mut().insert(LOCATION, location);
    }
    response
}

/// `next` link of a paginated list, when the page was full.
/// It repeats the query's other parameters (`carried`: filters, sort, fields), so the next page
/// continues the same list.
pub(super) fn next_link(
    ctx: &Ctx,
    path: &str,
    limit: usize,
    count: usize,
    last: Option<String>,
    carried: &[(String, String)],
) -> Option<String> {
    use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
    // Everything but RFC 3986's unreserved characters.
    const QUERY: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    match last {
        Some(last) if limit > 0 && count >= limit => {
            let mut query = format!("limit={limit}");
            for (key, value) in carried {
                query.push_str(&format!(
                    "&{}={}",
                    utf8_percent_encode(key, QUERY),
                    utf8_percent_encode(value, QUERY)
                ));
            }
            query.push_str(&format!("&marker={last}"));
            Some(ctx.url(&format!("/v1/{path}?{query}")))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::NodePower;
    use vmdeploy_shared::api::ipa::ApiVersion;

    fn ctx(minor: u32) -> Ctx {
        Ctx {
            version: ApiVersion::new(1, minor),
            base_url: "http://h:6385".into(),
        }
    }

    fn sample() -> Node {
        let mut node = Node::new(uuid::Uuid::nil(), "agent_ilo", ProvisionState::Available);
        node.name = Some("n1".into());
        node.power_state = Some(NodePower::Off);
        node.driver_info
            .insert("ilo_password".into(), json!("secret"));
        node.driver_internal_info
            .insert("agent_secret_token".into(), json!("tok"));
        node
    }

    #[test]
    fn fields_appear_at_their_version() {
        let node = sample();
        let at = |minor| node_json_keys(&node, &ctx(minor));
        assert!(!at(1).contains(&"name".to_string()));
        assert!(!at(1).contains(&"driver_internal_info".to_string()));
        assert!(at(3).contains(&"driver_internal_info".to_string()));
        assert!(at(5).contains(&"name".to_string()));
        assert!(!at(30).contains(&"deploy_interface".to_string()));
        assert!(at(31).contains(&"deploy_interface".to_string()));
        assert!(!at(45).contains(&"conductor_group".to_string()));
        assert!(at(46).contains(&"conductor_group".to_string()));
        assert!(!at(65).contains(&"network_data".to_string()));
        assert!(at(73).contains(&"network_data".to_string()));
        // 1.1 shows `available` as null (NOSTATE).
        assert!(super::node(&node, &ctx(1), "c", &Select::All)["provision_state"].is_null());
        assert_eq!(
            super::node(&node, &ctx(2), "c", &Select::All)["provision_state"],
            "available"
        );
    }

    fn node_json_keys(node: &Node, ctx: &Ctx) -> Vec<String> {
        super::node(node, ctx, "c", &Select::All)
            .as_object()
            .expect("object")
            .keys()
            .cloned()
            .collect()
    }

    #[test]
    fn secrets_never_leave_and_selection_works() {
        let node = sample();
        let full = super::node(&node, &ctx(73), "c", &Select::All);
        assert_eq!(full["driver_info"]["ilo_password"], "******");
        assert_eq!(full["driver_internal_info"]["agent_secret_token"], "******");
        assert_eq!(full["power_state"], "power off");
        assert_eq!(
            full["links"][0]["href"],
            format!("http://h:6385/v1/nodes/{}", node.uuid)
        );
        let short = super::node(&node, &ctx(73), "c", &Select::Short);
        let mut keys: Vec<&String> = short.as_object().expect("object").keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "instance_uuid",
                "links",
                "maintenance",
                "name",
                "power_state",
                "provision_state",
                "uuid"
            ]
        );
        let names = node_field_names(&ctx(73));
        let only = Select::parse(Some("uuid,driver_info"), Select::All, &ctx(73), &names)
            .expect("valid fields");
        let picked = super::node(&node, &ctx(73), "c", &only);
        assert_eq!(picked.as_object().map(|o| o.len()), Some(2));
        assert_eq!(picked["driver_info"]["ilo_password"], "******");
        let e = Select::parse(Some("uuid,bogus"), Select::All, &ctx(73), &names)
            .expect_err("bogus field");
        assert!(e.message.contains("bogus"), "{e}");
        let e = Select::parse(Some("uuid"), Select::All, &ctx(7), &names).expect_err("1.7");
        assert_eq!(e.status, http::StatusCode::NOT_ACCEPTABLE);
    }
}
