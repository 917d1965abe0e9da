//! A node's states and management calls: `validate`, `states`, `states/power`,
//! `states/provision`, `maintenance`, `management/boot_device` (docs/ironic-protocols.md §5.2, docs/architecture.md §8).
//!
//! # Design
//! Each handler checks the body and the microversion (400/406 naming the field), asks
//! [`crate::states::next`] whether a provision verb is allowed (400 when not, as Ironic's
//! `InvalidStateRequested`), and hands the rest to the manager; asynchronous calls answer 202
//! with `Location: .../v1/nodes/{uuid}/states`.

use std::time::Duration;

use axum::extract::Path;
use axum::http::{header::LOCATION, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Map, Value};

use super::body::{self, cut, JsonBody};
use super::error::ApiError;
use super::nodes::load;
use super::render::timestamp;
use super::version::Ctx;
use super::State;
use crate::states::{self, Event, NodePower, ProvisionVerb};
use crate::store::{Node, NodeIdent};

/// Boot devices the iLO management interfaces set (Ironic's ilo `BOOT_DEVICE_MAPPING_TO_ILO`).
const BOOT_DEVICES: &[&str] = &["cdrom", "disk", "pxe"];

/// Ironic's provision verbs this conductor does not carry out (400, not "unknown").
const UNSUPPORTED_VERBS: &[&str] = &[
    "inspect", "clean", "adopt", "rescue", "unrescue", "unhold", "service",
];

fn accepted(ctx: &Ctx, node: &Node) -> Response {
    let mut response = StatusCode::ACCEPTED.into_response();
    if let Ok(location) =
        HeaderValue::from_str(&ctx.url(&format!("/v1/nodes/{}/states", node.uuid)))
    {
        response.headers_mut().insert(LOCATION, location);
    }
    response
}

/// `GET /v1/nodes/{node}/validate`.
pub(super) async fn validate(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let node = load(&state, &ctx, &node).await?;
    let lines = state.manager.validate(&NodeIdent::Uuid(node.uuid)).await?;
    let out: Map<String, Value> = lines
        .into_iter()
        .map(|(iface, line)| (iface, json!({"result": line.result, "reason": line.reason})))
        .collect();
    Ok(Json(Value::Object(out)))
}

/// `GET /v1/nodes/{node}/states`.
pub(super) async fn states(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let node = load(&state, &ctx, &node).await?;
    let provision_state =
        if !ctx.at_least(2) && node.provision_state == states::ProvisionState::Available {
            Value::Null
        } else {
            json!(node.provision_state.as_str())
        };
    let mut out = json!({
        "power_state": node.power_state.map(|p| p.as_str()),
        "target_power_state": node.target_power_state.map(|p| p.as_str()),
        "provision_state": provision_state,
        "target_provision_state": node.target_provision_state.map(|s| s.as_str()),
        "provision_updated_at": timestamp(node.provision_updated_at),
        "last_error": node.last_error,
        "console_enabled": node.console_enabled,
    });
    if ctx.at_least(12) {
        out["raid_config"] = json!({});
        out["target_raid_config"] = json!({});
    }
    Ok(Json(out))
}

/// `PUT /v1/nodes/{node}/states/power` `{"target": ..., ["timeout": seconds]}`.
pub(super) async fn power(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let obj = body::object(body, "a power state change")?;
    body::refuse_unknown(&obj, &["target", "timeout"], "power state change")?;
    let target = body::req_str(&obj, "target")?;
    let target: NodePower = target.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "Invalid value for field \"target\": {:?} is not a power state (power on, power \
             off, rebooting, soft power off, soft rebooting).",
            cut(&target)
        ))
    })?;
    // Soft power actions and timeouts came with 1.27.
    if matches!(target, NodePower::SoftPowerOff | NodePower::SoftRebooting) {
        ctx.require(27, &format!("Power target \"{target}\""))?;
    }
    let timeout = match obj.get("timeout") {
        None | Some(Value::Null) => None,
        Some(v) => {
            ctx.require(27, "The \"timeout\" field")?;
            let secs = v.as_u64().filter(|s| *s > 0).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Invalid value for field \"timeout\": {} (expected a positive integer of \
                     seconds).",
                    cut(&v.to_string())
                ))
            })?;
            Some(Duration::from_secs(secs))
        }
    };
    let node = load(&state, &ctx, &node).await?;
    state
        .manager
        .set_power_state(&NodeIdent::Uuid(node.uuid), target, timeout)
        .await?;
    Ok(accepted(&ctx, &node))
}

/// `PUT /v1/nodes/{node}/states/provision` `{"target": verb, ["configdrive": ...]}`.
pub(super) async fn provision(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let obj = body::object(body, "a provision state change")?;
    body::refuse_unknown(&obj, &["target", "configdrive"], "provision state change")?;
    let target = body::req_str(&obj, "target")?;
    let verb = parse_verb(&ctx, &target)?;
    let configdrive = match obj.get("configdrive") {
        None | Some(Value::Null) => None,
        Some(v) => {
            match verb {
                ProvisionVerb::Deploy => {}
                // A config drive with rebuild came with 1.35.
                ProvisionVerb::Rebuild => ctx.require(35, "A \"configdrive\" with rebuild")?,
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "Adding a config drive is only supported when setting provision state \
                         to active or rebuild, not {:?}.",
                        cut(&target)
                    )))
                }
            }
            match v {
                Value::String(_) => {}
                // A config drive built by the server from JSON came with 1.56.
                Value::Object(_) => ctx.require(56, "A \"configdrive\" given as an object")?,
                other => {
                    return Err(ApiError::bad_request(format!(
                        "Invalid value for field \"configdrive\": expected a string or an \
                         object, got {}.",
                        body::type_name(other)
                    )))
                }
            }
            Some(v.clone())
        }
    };
    let node = load(&state, &ctx, &node).await?;
    if states::next(node.provision_state, Event::Verb(verb)).is_none() {
        return Err(ApiError::bad_request(format!(
            "The requested action \"{target}\" can not be performed on node \"{}\" while it is \
             in state \"{}\".",
            node.uuid, node.provision_state
        )));
    }
    state
        .manager
        .set_provision_state(&NodeIdent::Uuid(node.uuid), verb, configdrive)
        .await?;
    Ok(accepted(&ctx, &node))
}

/// A provision `target` at the negotiated version: 406 for a verb newer than it, 400 for one
/// this conductor does not carry out or does not know.
fn parse_verb(ctx: &Ctx, target: &str) -> Result<ProvisionVerb, ApiError> {
    let Some(verb) = ProvisionVerb::parse(target) else {
        if UNSUPPORTED_VERBS.contains(&target) {
            return Err(ApiError::bad_request(format!(
                "The provision action \"{target}\" is not supported by this conductor."
            )));
        }
        return Err(ApiError::bad_request(format!(
            "Invalid value for field \"target\": {:?} is not a provision action.",
            cut(target)
        )));
    };
    let since = match (verb, target) {
        (ProvisionVerb::Manage | ProvisionVerb::Provide, _) => 4,
        (ProvisionVerb::Abort, _) => 13,
        (_, "deploy" | "undeploy") => 73,
        _ => 1,
    };
    ctx.require(since, &format!("The provision action \"{target}\""))?;
    Ok(verb)
}

/// `PUT /v1/nodes/{node}/maintenance` `{"reason": ...}` (body optional).
pub(super) async fn maintenance_on(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let obj = body::object_or_empty(body, "maintenance")?;
    body::refuse_unknown(&obj, &["reason"], "maintenance")?;
    let reason = body::opt_str(&obj, "reason")?;
    let node = load(&state, &ctx, &node).await?;
    state
        .manager
        .set_maintenance(&NodeIdent::Uuid(node.uuid), true, reason)
        .await?;
    Ok(accepted(&ctx, &node))
}

/// `DELETE /v1/nodes/{node}/maintenance`.
pub(super) async fn maintenance_off(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
) -> Result<Response, ApiError> {
    let node = load(&state, &ctx, &node).await?;
    state
        .manager
        .set_maintenance(&NodeIdent::Uuid(node.uuid), false, None)
        .await?;
    Ok(accepted(&ctx, &node))
}

/// `PUT /v1/nodes/{node}/management/boot_device` `{"boot_device": ..., "persistent": bool}`.
pub(super) async fn set_boot_device(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<StatusCode, ApiError> {
    let obj = body::object(body, "a boot device change")?;
    body::refuse_unknown(&obj, &["boot_device", "persistent"], "boot device change")?;
    let device = body::req_str(&obj, "boot_device")?;
    if !BOOT_DEVICES.contains(&device.as_str()) {
        return Err(ApiError::bad_request(format!(
            "Invalid value for field \"boot_device\": {:?} (supported: {}).",
            cut(&device),
            BOOT_DEVICES.join(", ")
        )));
    }
    let persistent = body::opt_bool(&obj, "persistent")?.unwrap_or(false);
    let node = load(&state, &ctx, &node).await?;
    state
        .manager
        .set_boot_device(&NodeIdent::Uuid(node.uuid), &device, persistent)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/nodes/{node}/management/boot_device`.
pub(super) async fn boot_device(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let node = load(&state, &ctx, &node).await?;
    let reading = state
        .manager
        .boot_device(&NodeIdent::Uuid(node.uuid))
        .await?;
    Ok(Json(json!({
        "boot_device": reading.boot_device,
        "persistent": reading.persistent,
    })))
}

/// `GET /v1/nodes/{node}/management/boot_device/supported`.
pub(super) async fn supported_boot_devices(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
) -> Result<Json<Value>, ApiError> {
    load(&state, &ctx, &node).await?;
    Ok(Json(json!({ "supported_boot_devices": BOOT_DEVICES })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::test_support::ctx;

    #[test]
    fn verbs_by_version() {
        let cases: &[(&str, u32, Result<ProvisionVerb, StatusCode>)] = &[
            ("active", 1, Ok(ProvisionVerb::Deploy)),
            ("deleted", 1, Ok(ProvisionVerb::Undeploy)),
            ("rebuild", 1, Ok(ProvisionVerb::Rebuild)),
            ("manage", 3, Err(StatusCode::NOT_ACCEPTABLE)),
            ("manage", 4, Ok(ProvisionVerb::Manage)),
            ("provide", 4, Ok(ProvisionVerb::Provide)),
            ("abort", 12, Err(StatusCode::NOT_ACCEPTABLE)),
            ("abort", 13, Ok(ProvisionVerb::Abort)),
            ("deploy", 72, Err(StatusCode::NOT_ACCEPTABLE)),
            ("deploy", 73, Ok(ProvisionVerb::Deploy)),
            ("undeploy", 73, Ok(ProvisionVerb::Undeploy)),
            ("inspect", 73, Err(StatusCode::BAD_REQUEST)),
            ("fly", 73, Err(StatusCode::BAD_REQUEST)),
        ];
        for (target, minor, want) in cases {
            let got = parse_verb(&ctx(*minor), target).map_err(|e| e.status);
            assert_eq!(&got, want, "{target} at 1.{minor}");
        }
    }
}
