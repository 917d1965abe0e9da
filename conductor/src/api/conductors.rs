//! `GET /v1/conductors` and `GET /v1/conductors/{hostname}` (API 1.49): the conductors that
//! share the database, from their registrations (`manager::conductors`), each `alive` while its
//! last heartbeat is younger than `conductor.heartbeat_timeout`.

use std::collections::HashMap;

use axum::extract::{Path, Query};
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::body::{cut, parse_bool};
use super::error::ApiError;
use super::render::timestamp;
use super::version::Ctx;
use super::State;
use crate::store::ConductorRecord;

/// The API version that added conductors.
const SINCE: u32 = 49;

fn conductor_json(c: &ConductorRecord, ctx: &Ctx, alive: bool, detail: bool) -> Value {
    let mut out = json!({
        "hostname": c.hostname,
        "conductor_group": c.conductor_group,
        "alive": alive,
        "links": [
            {"href": ctx.url(&format!("/v1/conductors/{}", c.hostname)), "rel": "self"},
            {"href": ctx.url(&format!("/conductors/{}", c.hostname)), "rel": "bookmark"},
        ],
    });
    if detail {
        out["drivers"] = json!(c.drivers);
        out["created_at"] = timestamp(Some(c.created_at));
        out["updated_at"] = timestamp(Some(c.updated_at));
    }
    out
}

fn alive(state: &State, c: &ConductorRecord) -> bool {
    is_alive(
        c.updated_at,
        state.manager.config().heartbeat_timeout,
        crate::store::now(),
    )
}

/// Whether a heartbeat at `last` is younger than `timeout` at `now`.
fn is_alive(
    last: time::OffsetDateTime,
    timeout: std::time::Duration,
    now: time::OffsetDateTime,
) -> bool {
    now - last <= time::Duration::try_from(timeout).unwrap_or(time::Duration::MAX)
}

/// Below 1.49 the resource does not exist (Ironic's 404).
fn require(ctx: &Ctx, path: &str) -> Result<(), ApiError> {
    if ctx.at_least(SINCE) {
        Ok(())
    } else {
        Err(ApiError::not_found(format!(
            "The resource {path} could not be found."
        )))
    }
}

/// `GET /v1/conductors[?detail=true]`.
pub(super) async fn list(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    require(&ctx, "/v1/conductors")?;
    let detail = match query.get("detail") {
        None => false,
        Some(v) => parse_bool(v).ok_or_else(|| {
            ApiError::bad_request(format!(
                "Invalid value for parameter \"detail\": {:?} (expected a boolean).",
                cut(v)
            ))
        })?,
    };
    let conductors = state.manager.store().list_conductors().await?;
    let out: Vec<Value> = conductors
        .iter()
        .map(|c| conductor_json(c, &ctx, alive(&state, c), detail))
        .collect();
    Ok(Json(json!({ "conductors": out })))
}

/// `GET /v1/conductors/{hostname}`.
pub(super) async fn show(
    state: State,
    Extension(ctx): Extension<Ctx>,
    Path(hostname): Path<String>,
) -> Result<Json<Value>, ApiError> {
    require(&ctx, &format!("/v1/conductors/{}", cut(&hostname)))?;
    let conductors = state.manager.store().list_conductors().await?;
    let found = conductors
        .iter()
        .find(|c| c.hostname == hostname)
        .ok_or_else(|| {
            ApiError::not_found(format!("Conductor {} could not be found.", cut(&hostname)))
        })?;
    Ok(Json(conductor_json(
        found,
        &ctx,
        alive(&state, found),
        true,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conductor_is_alive_until_its_heartbeat_is_older_than_the_timeout() {
        let now = crate::store::now();
        let timeout = std::time::Duration::from_secs(60);
        assert!(is_alive(now, timeout, now));
        assert!(is_alive(now - time::Duration::seconds(60), timeout, now));
        assert!(!is_alive(now - time::Duration::seconds(61), timeout, now));
        // A clock a little behind another conductor's: a heartbeat from the future is alive.
        assert!(is_alive(now + time::Duration::seconds(5), timeout, now));
    }
}
