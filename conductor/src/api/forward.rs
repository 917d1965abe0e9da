//! The API's half of several conductors: a request that acts on a node is carried out by the
//! node's conductor (`crate::cluster`), so any other conductor passes it on.
//!
//! # Design
//! A middleware in front of the routes picks the requests that act on one node (the
//! `/v1/nodes/{node}/…` actions, the ramdisk's heartbeat and `pass_deploy_info`); plain reads
//! and writes of the database (`GET`, `PATCH` and `DELETE` of the node, its states and ports,
//! lists, `lookup`) are answered by whichever conductor gets them. For a picked request it reads
//! the node, asks the [`crate::cluster::ClusterView`] for the owner and either serves it here or
//! forwards it ([`crate::cluster::forward`]) and passes the owner's answer back. A request that
//! arrives stamped by another conductor is served here whatever this conductor's view says, so
//! a request makes at most one hop.
//!
//! A node whose `conductor_group` no live conductor serves cannot be acted on (503, as Ironic's
//! "no conductor for group" refusal), and an owner that does not answer is 503 too: the client,
//! or the ramdisk's next heartbeat, retries, and within `conductor.heartbeat_timeout` the node
//! has a live owner again.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode};

use super::{ApiError, ApiState, ClientAddr, State};
use crate::cluster::forward::{Stamp, FORWARDED_HEADER};
use crate::cluster::Owner;
use crate::store::{NodeIdent, StoreError};

/// The node a request acts on, when it is one to carry out at the node's conductor.
pub(super) fn acted_on(method: &Method, path: &str) -> Option<String> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let unversioned = match segments.as_slice() {
        ["v1", rest @ ..] => rest,
        rest => rest,
    };
    let read = method == Method::GET || method == Method::HEAD;
    match unversioned {
        ["heartbeat", node] if method == Method::POST => Some(node),
        ["nodes", "detail", ..] => None,
        // Reads and plain writes of the database: any conductor answers them. A PATCH or a
        // DELETE touches no BMC and no conductor's files, and must work for a node whose group
        // has no live conductor (to move it to another group, or remove it).
        ["nodes", _] if read || method == Method::PATCH || method == Method::DELETE => None,
        ["nodes", _, "states"] | ["nodes", _, "ports", ..] if read => None,
        ["nodes", node, ..] if !node.is_empty() => Some(node),
        _ => None,
    }
    .filter(|node| !node.is_empty())
    .map(|node| (*node).to_string())
}

/// The middleware (module docs).
pub(super) async fn to_owner(
    axum::extract::State(state): State,
    req: Request,
    next: Next,
) -> Response {
    let Some(ident) = acted_on(req.method(), req.uri().path()) else {
        return next.run(req).await;
    };
    let manager = &state.manager;
    if let Some(stamp) = req.headers().get(FORWARDED_HEADER) {
        return serve_forwarded(&state, stamp.clone(), req, next).await;
    }
    let view = manager.cluster().view();
    let node = match manager.store().node(&NodeIdent::parse(&ident)).await {
        Ok(node) => node,
        // The handler says it as it always does (404, 503).
        Err(StoreError::NotFound { .. }) => return next.run(req).await,
        Err(err) => return ApiError::from(err).into_response(),
    };
    let (owner, url) = match view.owner(&node.conductor_group, node.uuid) {
        Owner::Me => return next.run(req).await,
        Owner::Nobody => {
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "no live conductor serves conductor group \"{}\" of node {}: start one \
                     with conductor.conductor_group = \"{}\", or change the node's \
                     conductor_group",
                    node.conductor_group, node.uuid, node.conductor_group
                ),
            )
            .into_response()
        }
        Owner::Other {
            hostname,
            url: None,
        } => {
            // It registered no internal URL: the reservation in the database still keeps one
            // task per node, so serving here is safe, only not where the node's duties run.
            tracing::warn!(node = %node.uuid, owner = %hostname,
                "the node's conductor registered no internal URL (conductor.internal_url): serving here");
            return next.run(req).await;
        }
        Owner::Other {
            hostname,
            url: Some(url),
        } => (hostname, url),
    };
    let key = match manager.cluster_key().await {
        Ok(key) => key,
        Err(err) => return ApiError::from(err).into_response(),
    };
    let Some(forwarder) = manager.forwarder() else {
        return next.run(req).await;
    };
    let client = req.extensions().get::<ClientAddr>().map(|c| c.0);
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, state.options.max_body).await {
        Ok(body) => body,
        Err(_) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request body is larger than {} bytes (api.max_body)",
                    state.options.max_body
                ),
            )
            .into_response()
        }
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
    tracing::debug!(node = %node.uuid, owner = %owner, method = %parts.method, path = %parts.uri.path(),
        "forwarding to the node's conductor");
    match forwarder
        .forward(
            &owner,
            &url,
            &key,
            client,
            parts.method.clone(),
            &path_and_query,
            &parts.headers,
            body,
        )
        .await
    {
        Ok(answer) => {
            let mut response = Response::new(Body::from(answer.body));
            *response.status_mut() = answer.status;
            *response.headers_mut() = answer.headers;
            response
        }
        Err(err) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{err}; retry: the node is re-mapped once that conductor's heartbeat is older than conductor.heartbeat_timeout"),
        )
        .into_response(),
    }
}

/// A request another conductor passed on: verified, then served here with the client's address.
async fn serve_forwarded(
    state: &Arc<ApiState>,
    stamp: http::HeaderValue,
    mut req: Request,
    next: Next,
) -> Response {
    let key = match state.manager.cluster_key().await {
        Ok(key) => key,
        Err(err) => return ApiError::from(err).into_response(),
    };
    let path_and_query = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string());
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let verified = stamp
        .to_str()
        .ok()
        .ok_or(crate::cluster::forward::StampError::Malformed)
        .and_then(|value| Stamp::verify(value, &key, req.method(), &path_and_query, now));
    match verified {
        Ok(stamp) => {
            match stamp.client {
                Some(addr) => {
                    req.extensions_mut().insert(ClientAddr(addr));
                }
                None => {
                    req.extensions_mut().remove::<ClientAddr>();
                }
            }
            tracing::debug!(from = %stamp.by, "serving a request another conductor forwarded");
            next.run(req).await
        }
        Err(err) => ApiError::new(StatusCode::FORBIDDEN, err.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_requests_go_to_the_nodes_conductor() {
        let cases: &[(Method, &str, Option<&str>)] = &[
            (Method::PUT, "/v1/nodes/n1/states/power", Some("n1")),
            (Method::PUT, "/v1/nodes/n1/states/provision", Some("n1")),
            (Method::PUT, "/nodes/n1/states/provision", Some("n1")),
            (Method::PATCH, "/v1/nodes/n1", None),
            (Method::DELETE, "/v1/nodes/n1", None),
            (Method::GET, "/v1/nodes/n1/validate", Some("n1")),
            (
                Method::GET,
                "/v1/nodes/n1/management/boot_device",
                Some("n1"),
            ),
            (Method::PUT, "/v1/nodes/n1/maintenance", Some("n1")),
            (
                Method::POST,
                "/v1/nodes/n1/vendor_passthru/pass_deploy_info",
                Some("n1"),
            ),
            (Method::POST, "/v1/heartbeat/n1", Some("n1")),
            (Method::GET, "/v1/nodes/n1", None),
            (Method::GET, "/v1/nodes/n1/states", None),
            (Method::GET, "/v1/nodes/n1/ports", None),
            (Method::GET, "/v1/nodes/n1/ports/detail", None),
            (Method::GET, "/v1/nodes/detail", None),
            (Method::GET, "/v1/nodes", None),
            (Method::POST, "/v1/nodes", None),
            (Method::GET, "/v1/lookup", None),
            (Method::GET, "/v1/heartbeat/n1", None),
            (Method::POST, "/v1/heartbeat/", None),
            (Method::PUT, "/v1/nodes//states/power", None),
            (Method::GET, "/v1/conductors", None),
        ];
        for (method, path, want) in cases {
            assert_eq!(acted_on(method, path).as_deref(), *want, "{method} {path}");
        }
    }
}
