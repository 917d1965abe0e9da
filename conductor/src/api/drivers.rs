//! `GET /v1/drivers`, `/v1/drivers/{name}` and `/v1/drivers/{name}/properties`: the drivers
//! that work here (docs/architecture.md §3): the classic `agent_ilo`, and the modern hardware types `ilo`
//! (`ilo-virtual-media` boot) and `redfish` (`redfish-virtual-media` boot) as its aliases.
//! `iscsi_ilo` is the classic iSCSI driver over virtual media, `pxe_ilo` the same iSCSI deploy
//! booted from the network (`pxe` boot: no virtual-media licence needed).

use std::collections::HashMap;

use axum::extract::{Path, Query};
use axum::Extension;
use axum::Json;
use serde_json::{json, Map, Value};

use super::body::parse_bool;
use super::error::ApiError;
use super::version::Ctx;
use super::State;

use crate::node::hardware_type::HARDWARE_TYPES as DRIVERS;
pub(super) use crate::node::hardware_type::{find, HardwareType as Driver};

/// 400 unless `name` is a driver served here (Ironic's `NoValidHost` wording).
pub(super) fn check(name: &str) -> Result<(), ApiError> {
    if find(name).is_some() {
        Ok(())
    } else {
        let known: Vec<&str> = DRIVERS.iter().map(|d| d.name).collect();
        Err(ApiError::bad_request(format!(
            "Invalid value for field \"driver\": no conductor service supports driver {:?} \
             (supported: {}).",
            super::body::cut(name),
            known.join(", ")
        )))
    }
}

/// `driver_info` keys of the iLO drivers and what they mean (docs/architecture.md §3).
const ILO_PROPERTIES: &[(&str, &str)] = &[
    ("ilo_address", "IP address or hostname of the iLO. Required."),
    ("ilo_username", "username for the iLO with administrator privileges. Required."),
    ("ilo_password", "password for ilo_username. Required."),
    ("ilo_deploy_iso", "image reference of the deploy ISO (http(s)://, file://, swift:// or a Glance UUID). Required."),
    ("client_port", "port to be used for iLO operations. Optional (default 443)."),
    ("client_timeout", "timeout (in seconds) for iLO operations. Optional (default 60)."),
    ("console_port", "node's UDP port to connect to. Only required for console access."),
    ("ilo_verify_ca", "CA bundle path, or false to skip TLS verification of the iLO. Optional (default true)."),
];

fn driver_json(driver: &Driver, ctx: &Ctx, host: &str, detail: bool) -> Value {
    let mut out = Map::new();
    out.insert("name".into(), json!(driver.name));
    out.insert("hosts".into(), json!([host]));
    if ctx.at_least(30) {
        out.insert("type".into(), json!(driver.kind));
        if detail {
            // Each interface type with the values a node of this driver may take, the default
            // first (the firmware interface came after 1.73: not shown).
            let interfaces: [(&str, &[&str]); 12] = [
                ("bios", &["no-bios"]),
                ("boot", driver.boot),
                ("console", &["no-console"]),
                ("deploy", driver.deploy),
                ("inspect", &["no-inspect"]),
                ("management", &[driver.management]),
                ("network", &["noop"]),
                ("power", &[driver.power]),
                ("raid", &["no-raid"]),
                ("rescue", &["no-rescue"]),
                ("storage", &["noop"]),
                ("vendor", &[driver.vendor]),
            ];
            for (kind, values) in interfaces {
                out.insert(format!("default_{kind}_interface"), json!(values[0]));
                out.insert(format!("enabled_{kind}_interfaces"), json!(values));
            }
        }
    }
    let id = driver.name;
    out.insert(
        "links".into(),
        json!([
            {"href": ctx.url(&format!("/v1/drivers/{id}")), "rel": "self"},
            {"href": ctx.url(&format!("/drivers/{id}")), "rel": "bookmark"},
        ]),
    );
    out.insert(
        "properties".into(),
        json!([
            {"href": ctx.url(&format!("/v1/drivers/{id}/properties")), "rel": "self"},
            {"href": ctx.url(&format!("/drivers/{id}/properties")), "rel": "bookmark"},
        ]),
    );
    Value::Object(out)
}

/// `GET /v1/drivers[?type=classic|dynamic][&detail=true]`.
pub(super) async fn list(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let kind = query.get("type").map(String::as_str);
    if let Some(kind) = kind {
        ctx.require(30, "The \"type\" parameter")?;
        if kind != "classic" && kind != "dynamic" {
            return Err(ApiError::bad_request(format!(
                "Invalid value for parameter \"type\": {:?} (expected classic or dynamic).",
                super::body::cut(kind)
            )));
        }
    }
    let detail = match query.get("detail") {
        None => false,
        Some(v) => {
            ctx.require(30, "The \"detail\" parameter")?;
            parse_bool(v).ok_or_else(|| {
                ApiError::bad_request("Invalid value for parameter \"detail\": expected a boolean.")
            })?
        }
    };
    let host = &state.manager.config().conductor_name;
    let drivers: Vec<Value> = DRIVERS
        .iter()
        .filter(|d| kind.is_none_or(|k| d.kind == k))
        .map(|d| driver_json(d, &ctx, host, detail))
        .collect();
    Ok(Json(json!({ "drivers": drivers })))
}

/// `GET /v1/drivers/{name}`.
pub(super) async fn show(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let driver = find(&name).ok_or_else(|| not_found(&name))?;
    let host = &state.manager.config().conductor_name;
    Ok(Json(driver_json(driver, &ctx, host, true)))
}

/// `GET /v1/drivers/{name}/properties`.
pub(super) async fn properties(Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    find(&name).ok_or_else(|| not_found(&name))?;
    let props: Map<String, Value> = ILO_PROPERTIES
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    Ok(Json(Value::Object(props)))
}

fn not_found(name: &str) -> ApiError {
    ApiError::not_found(format!(
        "Could not find the following driver(s) or hardware type(s): {}.",
        super::body::cut(name)
    ))
}
