//! The ramdisk's call-backs (docs/ironic-protocols.md §3.2, §2.3): `GET /v1/lookup`, `POST /v1/heartbeat/{node}`
//! and the iSCSI ramdisk's `POST [/v1]/nodes/{node}/vendor_passthru/pass_deploy_info` (also as
//! `.../vendor_passthru?method=pass_deploy_info`). They are public (`is_public`): the manager
//! checks the agent token or the deploy key.
//!
//! # Design
//! Heartbeat fields are gated by microversion as Ironic gates them (`agent_version` 1.36,
//! `agent_token` 1.62, `agent_verify_ca` 1.68, `agent_status*` 1.72): a field the negotiated
//! version does not know is a 400 naming it, which is how the agent learns to leave it out.
//!
//! Every call-back passes [`Caller`] before its body is read: an address that failed too many
//! checks lately gets 429 there. A failed check afterwards (a wrong or missing token or key,
//! 403; an unknown node or one without a secret, 404) is counted for the address and, for a
//! 403, for the node, whose wrong secrets get 429 once it is throttled
//! ([`crate::net::failed_checks`] says why the right one never does). The refusal is logged
//! here, with the client's address, until either is throttled; then the one `warn` of the
//! throttling stands for the rest.
//!
//! Both call-back bodies are read here, once, into their wire types in `vmdeploy_shared::api`
//! and checked there (`validate`); the manager and the flows get only the checked form, so a
//! body that does not parse is a 400 naming the field before any node is looked at.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::StatusCode;
use axum::{Extension, Json};
use http::request::Parts;
use serde_json::Value;
use vmdeploy_shared::api::ipa::{ApiVersion, Heartbeat, ValidHeartbeat};
use vmdeploy_shared::api::{PassDeployInfo, ValidPassDeployInfo};

use super::body::{self, cut, JsonBody};
use super::error::ApiError;
use super::version::Ctx;
use super::{ApiState, ClientAddr, State};
use crate::manager::{LookupReply, ManagerError};
use crate::net::failed_checks::Throttled;
use crate::store::StoreError;

/// Heartbeat fields and the version that added each.
const HEARTBEAT_FIELDS: &[(&str, u32)] = &[
    ("callback_url", 22),
    ("agent_version", ApiVersion::AGENT_VERSION.minor),
    ("agent_token", ApiVersion::AGENT_TOKEN.minor),
    ("agent_verify_ca", ApiVersion::AGENT_VERIFY_CA.minor),
    ("agent_status", ApiVersion::AGENT_STATUS.minor),
    ("agent_status_message", ApiVersion::AGENT_STATUS.minor),
];

/// Most MACs a lookup may carry (a server has a handful of NICs).
const MAX_LOOKUP_ADDRESSES: usize = 64;

/// The client of a call-back, admitted: its address is not throttled (429 otherwise, before
/// the body is read or a node looked at).
pub(super) struct Caller(Option<IpAddr>);

impl FromRequestParts<Arc<ApiState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        let client = parts.extensions.get::<ClientAddr>().map(|c| c.0);
        if let Some(ip) = client {
            state.failed_checks.check_client(ip).map_err(|t| {
                ApiError::too_many(
                    format!(
                        "Too many failed call-backs from this address; retry after {} s.",
                        t.retry_after_secs
                    ),
                    t.retry_after_secs,
                )
            })?;
        }
        Ok(Caller(client))
    }
}

/// A call-back's answer from the manager's: a failed check is counted (module docs), and a
/// wrong secret for a throttled node becomes 429.
fn judged<T>(
    state: &ApiState,
    caller: &Caller,
    call: &'static str,
    outcome: Result<T, ManagerError>,
) -> Result<T, ApiError> {
    let err = match outcome {
        Ok(value) => return Ok(value),
        Err(err) => err,
    };
    let node = match &err {
        ManagerError::CallbackRefused { node, .. } => Some(*node),
        ManagerError::Store(StoreError::NotFound { .. }) => None,
        _ => return Err(err.into()),
    };
    let client = caller.0;
    let counted = state.failed_checks.failed(client, node);
    let client_throttled = client.is_some_and(|ip| state.failed_checks.check_client(ip).is_err());
    if let Err(Throttled { retry_after_secs }) = counted {
        let node = node.map(|n| n.to_string()).unwrap_or_default();
        return Err(ApiError::too_many(
            format!(
                "Too many wrong agent tokens or deploy keys for node {node}; retry after \
                 {retry_after_secs} s."
            ),
            retry_after_secs,
        ));
    }
    if let (Some(node), false) = (node, client_throttled) {
        let client = client.map(|ip| ip.to_string()).unwrap_or_default();
        tracing::warn!(%node, %client, call, "call-back refused: invalid or missing agent token or deploy key");
    }
    Err(err.into())
}

/// `GET /v1/lookup?addresses=<mac>,<mac>[&node_uuid=<uuid>]`.
pub(super) async fn lookup(
    state: State,
    caller: Caller,
    Extension(ctx): Extension<Ctx>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    if !ctx.at_least(22) {
        return Err(ApiError::not_found(
            "The lookup resource needs API version 1.22 or later.",
        ));
    }
    let addresses: Vec<String> = match query.get("addresses") {
        None => Vec::new(),
        Some(list) => {
            let raw: Vec<&str> = list.split(',').filter(|a| !a.trim().is_empty()).collect();
            if raw.len() > MAX_LOOKUP_ADDRESSES {
                return Err(ApiError::bad_request(format!(
                    "Invalid value for parameter \"addresses\": at most {MAX_LOOKUP_ADDRESSES} \
                     addresses."
                )));
            }
            // Ironic drops what is not a MAC (loopback, InfiniBand GUIDs) and looks up the rest.
            raw.into_iter()
                .filter_map(|a| body::mac(a.trim(), "addresses").ok())
                .collect()
        }
    };
    let node_uuid = match query.get("node_uuid") {
        None => None,
        Some(v) => Some(body::parse_uuid(v, "node_uuid")?),
    };
    if addresses.is_empty() && node_uuid.is_none() {
        return Err(ApiError::bad_request(
            "Either \"node_uuid\" or valid \"addresses\" must be provided for a lookup.",
        ));
    }
    let reply = judged(
        &state,
        &caller,
        "lookup",
        state.manager.lookup(&addresses, node_uuid).await,
    )?;
    Ok(Json(lookup_body(reply)))
}

/// The lookup answer: the node with its secrets masked as everywhere, and `config` as the
/// manager made it: `config.agent_token` is the one disclosure of the token Ironic makes (a
/// pre-generated token already shows `******` there, docs/ironic-protocols.md §3.2).
fn lookup_body(reply: LookupReply) -> Value {
    let mut node = reply.node;
    super::mask::mask_secrets(&mut node);
    serde_json::json!({ "node": node, "config": reply.config })
}

/// Parses a heartbeat body at the negotiated version.
pub(super) fn parse_heartbeat(ctx: &Ctx, body: Value) -> Result<ValidHeartbeat, ApiError> {
    let obj = body::object(body, "a heartbeat")?;
    for key in obj.keys() {
        match HEARTBEAT_FIELDS.iter().find(|(name, _)| name == key) {
            None => {
                return Err(ApiError::bad_request(format!(
                    "Unknown attribute for heartbeat: {:?}.",
                    cut(key)
                )))
            }
            Some((name, since)) => ctx
                .require(*since, &format!("The heartbeat field \"{name}\""))
                .map_err(|e| ApiError::bad_request(e.message))?,
        }
    }
    vmdeploy_shared::api::from_value::<Heartbeat>(Value::Object(obj))
        .and_then(Heartbeat::validate)
        .map_err(|e| invalid_body("heartbeat", &e))
}

/// Parses a `pass_deploy_info` body (any version may send it: the Kilo ramdisk sends none).
pub(super) fn parse_pass_deploy_info(body: Value) -> Result<ValidPassDeployInfo, ApiError> {
    let obj = body::object(body, "pass_deploy_info")?;
    vmdeploy_shared::api::from_value::<PassDeployInfo>(Value::Object(obj))
        .and_then(|info| info.validate())
        .map_err(|e| invalid_body("pass_deploy_info", &e))
}

/// The 400 for a call-back body, in the shared check's words (which name the field).
fn invalid_body(call: &str, e: &vmdeploy_shared::api::ApiError) -> ApiError {
    ApiError::bad_request(format!("Invalid {call} body: {e}."))
}

/// `POST /v1/heartbeat/{node}`.
pub(super) async fn heartbeat(
    state: State,
    caller: Caller,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<StatusCode, ApiError> {
    if !ctx.at_least(22) {
        return Err(ApiError::not_found(
            "The heartbeat resource needs API version 1.22 or later.",
        ));
    }
    let ident = super::nodes::ident(&ctx, &node)?;
    let heartbeat = parse_heartbeat(&ctx, body)?;
    let outcome = state.manager.heartbeat(&ident, heartbeat).await;
    judged(&state, &caller, "heartbeat", outcome)?;
    Ok(StatusCode::ACCEPTED)
}

/// `POST [/v1]/nodes/{node}/vendor_passthru?method=<method>`.
pub(super) async fn vendor_passthru(
    state: State,
    caller: Caller,
    Extension(ctx): Extension<Ctx>,
    Path(node): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    JsonBody(body): JsonBody,
) -> Result<StatusCode, ApiError> {
    let method = query
        .get("method")
        .ok_or_else(|| ApiError::bad_request("Mandatory parameter \"method\" is missing."))?;
    passthru(state, caller, ctx, &node, method, body).await
}

/// `POST [/v1]/nodes/{node}/vendor_passthru/<method>`.
pub(super) async fn vendor_passthru_method(
    state: State,
    caller: Caller,
    Extension(ctx): Extension<Ctx>,
    Path((node, method)): Path<(String, String)>,
    JsonBody(body): JsonBody,
) -> Result<StatusCode, ApiError> {
    passthru(state, caller, ctx, &node, &method, body).await
}

async fn passthru(
    state: State,
    caller: Caller,
    ctx: Ctx,
    node: &str,
    method: &str,
    body: Value,
) -> Result<StatusCode, ApiError> {
    if method != "pass_deploy_info" {
        return Err(ApiError::bad_request(format!(
            "Unsupported vendor passthru method {:?} (this conductor serves pass_deploy_info).",
            cut(method)
        )));
    }
    // The Kilo ramdisk names its node by UUID; any version may call back.
    let ident = match uuid::Uuid::parse_str(node) {
        Ok(uuid) => crate::store::NodeIdent::Uuid(uuid),
        Err(_) => super::nodes::ident(&ctx, node)?,
    };
    let info = parse_pass_deploy_info(body)?;
    let outcome = state.manager.pass_deploy_info(&ident, info).await;
    judged(&state, &caller, "pass_deploy_info", outcome)?;
    Ok(StatusCode::ACCEPTED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::test_support::ctx;
    use serde_json::json;
    use vmdeploy_shared::secret::Secret;

    #[test]
    fn lookup_masks_the_node_but_hands_over_the_token() {
        let reply = LookupReply {
            node: json!({"uuid": "u", "driver_internal_info": {"agent_secret_token": "tok"},
                         "instance_info": {"configdrive": "cd", "image_source": "http://i"}}),
            config: json!({"heartbeat_timeout": 300, "agent_token": "tok"}),
        };
        let body = lookup_body(reply);
        assert_eq!(
            body["node"]["driver_internal_info"]["agent_secret_token"],
            "******"
        );
        assert_eq!(body["node"]["instance_info"]["configdrive"], "******");
        assert_eq!(body["node"]["instance_info"]["image_source"], "http://i");
        assert_eq!(body["config"]["agent_token"], "tok");
        assert_eq!(body["config"]["heartbeat_timeout"], 300);
    }

    #[test]
    fn heartbeat_fields_are_gated_by_version() {
        let full = json!({"callback_url": "https://10.0.0.5:9999", "agent_token": "t",
                          "agent_version": "10.0", "agent_verify_ca": "PEM",
                          "agent_status": "start", "agent_status_message": "written 1"});
        let hb = parse_heartbeat(&ctx(72), full.clone()).expect("1.72 takes every field");
        assert_eq!(hb.callback_url, "https://10.0.0.5:9999");
        assert_eq!(hb.agent_token, Some(Secret::new("t")));
        assert!(
            !format!("{hb:?}").contains("\"t\""),
            "the token is masked in Debug: {hb:?}"
        );
        assert_eq!(hb.agent_verify_ca.as_deref(), Some("PEM"));
        assert_eq!(hb.agent_status_message.as_deref(), Some("written 1"));
        let e = parse_heartbeat(&ctx(68), full).expect_err("1.68 has no agent_status");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("agent_status"), "{e}");
        let cases: Vec<(Value, &str)> = vec![
            (json!({}), "callback_url"),
            (json!({"callback_url": 5}), "callback_url"),
            (json!({"callback_url": "ftp://x"}), "callback_url"),
            (json!({"callback_url": "http://x", "bogus": 1}), "bogus"),
            (
                json!({"callback_url": "http://x", "agent_status": "done"}),
                "agent_status",
            ),
            (json!([1]), "JSON object"),
        ];
        for (body, words) in cases {
            let e = parse_heartbeat(&ctx(73), body.clone()).expect_err(&body.to_string());
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.message.contains(words), "{body}: {e}");
        }
    }
}
