//! The Ironic-compatible REST API (v1 subset; ../shared/reference/ironic-protocols.md §5).
//!
//! # Design
//! One file per resource parses a request and calls [`crate::manager::Manager`] (or the store,
//! for plain reads and writes); `error` maps every failure to Ironic's status code and fault body
//! in one place; `version` negotiates the microversion. The API never calls a BMC client itself.

use std::sync::Arc;

use crate::manager::Manager;

/// What the router needs beyond the manager.
#[derive(Debug, Clone, Default)]
pub struct ApiOptions {
    /// The URL clients reach this API at (links in documents), e.g. `https://10.0.0.1:6385`;
    /// `None`: taken from each request's `Host`.
    pub public_url: Option<String>,
}

/// The API's routes (every `/v1` resource and the root document), ready to serve.
pub fn router(manager: Arc<Manager>, options: ApiOptions) -> axum::Router {
    let _ = (manager, options);
    axum::Router::new()
}

/// Whether a request may skip authentication: the root documents and the ramdisk's call-backs
/// (`/v1/lookup`, `/v1/heartbeat/{node}`, `.../vendor_passthru/pass_deploy_info`), which are
/// checked by agent token or deploy key instead.
pub fn is_public(method: &http::Method, path: &str) -> bool {
    let _ = (method, path);
    false
}
