//! The Ironic-compatible REST API (v1 subset; docs/ironic-protocols.md §5).
//!
//! # Design
//! One file per resource parses a request and calls [`crate::manager::Manager`] (or the store,
//! for plain reads and writes); `error` maps every failure to Ironic's status code and fault body
//! in one place; `version` negotiates the microversion. The API never calls a BMC client itself.
//!
//! Every response passes two layers: `version::negotiate` (the microversion headers, 406 outside
//! the range) and `error::fault_bodies` (any 4xx/5xx that does not carry Ironic's fault body yet,
//! e.g. axum's own 404 and 405, gets one), so a client never sees an error it cannot parse.
//! Request bodies are capped at [`ApiOptions::max_body`] (`api.max_body`; 413 above). With
//! several conductors, `forward` passes a node's actions on to the node's conductor.
//!
//! The ramdisk's call-backs count their failed checks per client address and per node
//! ([`crate::net::failed_checks`]; 429 past [`ApiOptions::callback_failures`]); the address is
//! the [`ClientAddr`] the listener puts in every request.
//!
//! # Limitations
//! Chassis, portgroups, VIFs, allocations, volumes, BIOS, traits and inspection are not served
//! (404): nothing in this conductor backs them. Authentication is the service's (`is_public`
//! tells it which routes skip it).

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put};
use axum::Router;
use tower::ServiceExt as _;

use crate::manager::Manager;
use crate::net::failed_checks::{FailedChecks, FailureLimits};

mod body;
mod conductors;
mod drivers;
mod error;
mod forward;
mod list;
mod mask;
mod node_states;
mod nodes;
mod patch;
mod ports;
mod ramdisk;
mod render;
mod root;
mod version;

#[cfg(test)]
mod router_tests;
#[cfg(test)]
mod test_support;

pub use error::ApiError;
pub use mask::mask_secrets;

/// The request-body readers behind the routes, for the fuzz targets in `fuzz/` (client bodies
/// are untrusted bytes); not an API.
#[doc(hidden)]
pub mod fuzzing {
    use serde_json::Value;

    use super::error::ApiError;
    use super::patch;

    /// A node's PATCH as `nodes::update` runs it on the node's document: parse, check against
    /// the node's rules, apply.
    pub fn patch_node(document: &mut Value, body: Value) -> Result<(), ApiError> {
        let ops = patch::parse(body)?;
        super::nodes::check_node_patch(document, &ops)?;
        patch::apply(document, &ops)
    }

    /// The `pass_deploy_info` call-back body's check.
    pub fn pass_deploy_info(body: Value) -> Result<(), ApiError> {
        super::ramdisk::parse_pass_deploy_info(body).map(|_| ())
    }
}
pub use version::{MAX_VERSION, MIN_VERSION};

/// Largest request body accepted unless configured (`api.max_body`; Ironic's own limit is
/// about the same; a node with a config drive inline is the largest body a client sends).
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// The most records a list page holds unless configured (`api.max_limit`; Ironic's default).
pub const DEFAULT_MAX_LIMIT: usize = 1000;

/// What the router needs beyond the manager.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// The URL clients reach this API at (links in documents), e.g. `https://10.0.0.1:6385`;
    /// `None`: taken from each request's `Host`.
    pub public_url: Option<String>,
    /// Largest request body, bytes (`api.max_body`): 413 above.
    pub max_body: usize,
    /// The most records one list page holds (`api.max_limit`, Ironic's `[api] max_limit`): a
    /// larger `limit` is cut to it, and a list without one is paged by it.
    pub max_limit: usize,
    /// Failed call-back checks allowed per client address and per node
    /// (`api.callback_failures_per_client`, `api.callback_failures_per_node`): 429 past them.
    pub callback_failures: FailureLimits,
}

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            public_url: None,
            max_body: DEFAULT_MAX_BODY,
            max_limit: DEFAULT_MAX_LIMIT,
            callback_failures: FailureLimits::default(),
        }
    }
}

/// The address of the client that sent a request, put in the request's extensions by the
/// listener (`crate::service::listen`). A request without one (served in-process, as in
/// tests) is counted per node only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

/// What every handler shares.
struct ApiState {
    manager: Arc<Manager>,
    options: ApiOptions,
    /// The call-backs' failed checks, per address and per node.
    failed_checks: FailedChecks,
}

type State = axum::extract::State<Arc<ApiState>>;

/// The API's routes (every `/v1` resource and the root document), ready to serve.
pub fn router(manager: Arc<Manager>, options: ApiOptions) -> axum::Router {
    let max_body = options.max_body;
    let failed_checks = FailedChecks::new(options.callback_failures);
    let state = Arc::new(ApiState {
        manager,
        options,
        failed_checks,
    });
    // Ironic routes unversioned paths (`/nodes/...`) to v1 as well: old ramdisks post
    // `pass_deploy_info` without the prefix (docs/ironic-protocols.md §5.1).
    let routes = Router::new()
        .route("/", get(root::root))
        .route("/v1", get(root::v1))
        .nest("/v1", resources())
        .merge(resources())
        .fallback(error::not_found)
        .with_state(Arc::clone(&state))
        // Inside the version layer: the owner of a forwarded request negotiates it itself.
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            forward::to_owner,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state,
            version::negotiate,
        ))
        .layer(axum::middleware::from_fn(operator_reads))
        .layer(axum::middleware::map_response_with_state(
            max_body,
            error::fault_bodies,
        ))
        .layer(DefaultBodyLimit::max(max_body));
    // python-ironicclient lists with a trailing slash (`GET /v1/ports/?detail=True`, `GET
    // /v1/drivers/?detail=True`), as Ironic's pecan routes allow: the path is normalised before
    // routing, so every route answers with and without it.
    Router::new().fallback_service(routes.map_request(strip_trailing_slash))
}

/// Marks a `GET` (but the ramdisk's lookup) as an operator's read, which the store serves from
/// connections of its own ([`crate::store::as_operator_read`]).
async fn operator_reads(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let lookup = req
        .uri()
        .path()
        .trim_start_matches("/v1")
        .starts_with("/lookup");
    if req.method() == http::Method::GET && !lookup {
        crate::store::as_operator_read(next.run(req)).await
    } else {
        next.run(req).await
    }
}

/// `/v1/ports/?x` → `/v1/ports?x` (the root `/` stays).
fn strip_trailing_slash(mut req: axum::extract::Request) -> axum::extract::Request {
    let path = req.uri().path();
    if path.len() > 1 && path.ends_with('/') {
        let trimmed = path.trim_end_matches('/');
        let trimmed = if trimmed.is_empty() { "/" } else { trimmed };
        let path_and_query = match req.uri().query() {
            Some(q) => format!("{trimmed}?{q}"),
            None => trimmed.to_string(),
        };
        let mut parts = req.uri().clone().into_parts();
        if let Ok(pq) = path_and_query.parse() {
            parts.path_and_query = Some(pq);
            if let Ok(uri) = http::Uri::from_parts(parts) {
                *req.uri_mut() = uri;
            }
        }
    }
    req
}

/// The `/v1` resources, without the prefix.
fn resources() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/nodes", get(nodes::list).post(nodes::create))
        .route("/nodes/detail", get(nodes::list_detail))
        .route(
            "/nodes/{node}",
            get(nodes::show).patch(nodes::update).delete(nodes::delete),
        )
        .route("/nodes/{node}/ports", get(ports::list_of_node))
        .route(
            "/nodes/{node}/ports/detail",
            get(ports::list_of_node_detail),
        )
        .route("/nodes/{node}/validate", get(node_states::validate))
        .route("/nodes/{node}/states", get(node_states::states))
        .route("/nodes/{node}/states/power", put(node_states::power))
        .route(
            "/nodes/{node}/states/provision",
            put(node_states::provision),
        )
        .route(
            "/nodes/{node}/maintenance",
            put(node_states::maintenance_on).delete(node_states::maintenance_off),
        )
        .route(
            "/nodes/{node}/management/boot_device",
            put(node_states::set_boot_device).get(node_states::boot_device),
        )
        .route(
            "/nodes/{node}/management/boot_device/supported",
            get(node_states::supported_boot_devices),
        )
        .route(
            "/nodes/{node}/vendor_passthru",
            post(ramdisk::vendor_passthru),
        )
        .route(
            "/nodes/{node}/vendor_passthru/{method}",
            post(ramdisk::vendor_passthru_method),
        )
        .route("/ports", get(ports::list).post(ports::create))
        .route("/ports/detail", get(ports::list_detail))
        .route(
            "/ports/{port}",
            get(ports::show).patch(ports::update).delete(ports::delete),
        )
        .route("/conductors", get(conductors::list))
        .route("/conductors/{hostname}", get(conductors::show))
        .route("/drivers", get(drivers::list))
        .route("/drivers/{name}", get(drivers::show))
        .route("/drivers/{name}/properties", get(drivers::properties))
        .route("/lookup", get(ramdisk::lookup))
        .route("/heartbeat/{node}", post(ramdisk::heartbeat))
}

/// Whether a request may skip authentication: the root documents and the ramdisk's call-backs
/// (`/v1/lookup`, `/v1/heartbeat/{node}`, `.../vendor_passthru/pass_deploy_info`), which are
/// checked by agent token or deploy key instead.
///
/// `path` may carry the query string (`uri.path_and_query()`): `POST .../vendor_passthru
/// ?method=pass_deploy_info` is public only with it.
pub fn is_public(method: &http::Method, path: &str) -> bool {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let path = path.strip_suffix('/').unwrap_or(path);
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let read = method == http::Method::GET || method == http::Method::HEAD;
    let post = method == http::Method::POST;
    // The same call-backs are served with and without the `/v1` prefix.
    let unversioned = match segments.as_slice() {
        ["v1", rest @ ..] => rest,
        rest => rest,
    };
    match segments.as_slice() {
        [] | [""] | ["v1"] => return read,
        ["v1", "lookup"] => return read,
        ["v1", "heartbeat", node] => return post && !node.is_empty(),
        _ => {}
    }
    match unversioned {
        ["nodes", node, "vendor_passthru", "pass_deploy_info"] => post && !node.is_empty(),
        ["nodes", node, "vendor_passthru"] => {
            post && !node.is_empty() && query.split('&').any(|p| p == "method=pass_deploy_info")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn public_routes_are_the_documents_and_the_ramdisk_call_backs() {
        let cases: &[(Method, &str, bool)] = &[
            (Method::GET, "/", true),
            (Method::GET, "/v1", true),
            (Method::GET, "/v1/", true),
            (Method::HEAD, "/v1", true),
            (Method::GET, "/v1/lookup", true),
            (Method::GET, "/v1/lookup?addresses=aa:bb:cc:dd:ee:ff", true),
            (
                Method::POST,
                "/v1/heartbeat/3a4a1c2e-1111-2222-3333-444455556666",
                true,
            ),
            (
                Method::POST,
                "/v1/nodes/n1/vendor_passthru/pass_deploy_info",
                true,
            ),
            (
                Method::POST,
                "/nodes/n1/vendor_passthru/pass_deploy_info",
                true,
            ),
            (
                Method::POST,
                "/v1/nodes/n1/vendor_passthru?method=pass_deploy_info",
                true,
            ),
            (
                Method::POST,
                "/nodes/n1/vendor_passthru?method=pass_deploy_info",
                true,
            ),
            // Everything else needs credentials.
            (
                Method::POST,
                "/v1/nodes/n1/vendor_passthru?method=other",
                false,
            ),
            (Method::POST, "/v1/nodes/n1/vendor_passthru", false),
            (Method::POST, "/v1/nodes/n1/vendor_passthru/other", false),
            (Method::POST, "/", false),
            (Method::GET, "/v1/nodes", false),
            (Method::POST, "/v1/nodes", false),
            (Method::GET, "/v1/heartbeat/n1", false),
            (Method::POST, "/v1/heartbeat/", false),
            (Method::POST, "/v1/lookup", false),
            (Method::GET, "/v1/nodes/n1/states", false),
            (Method::DELETE, "/v1/nodes/n1", false),
            (Method::GET, "/lookup", false),
        ];
        for (method, path, want) in cases {
            assert_eq!(is_public(method, path), *want, "{method} {path}");
        }
    }
}
