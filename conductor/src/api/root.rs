//! The discovery documents `GET /` and `GET /v1` (docs/ironic-protocols.md §5.1, modern shape): keystoneauth,
//! openstacksdk and the ramdisk read `default_version.version` for the newest microversion.

use axum::{Extension, Json};
use serde_json::{json, Value};

use super::version::{Ctx, MAX_VERSION, MIN_VERSION};

fn version_doc(ctx: &Ctx) -> Value {
    json!({
        "id": "v1",
        "links": [{"href": ctx.url("/v1/"), "rel": "self"}],
        "status": "CURRENT",
        "min_version": MIN_VERSION.to_string(),
        "version": MAX_VERSION.to_string(),
    })
}

fn link(ctx: &Ctx, resource: &str) -> Value {
    json!([
        {"href": ctx.url(&format!("/v1/{resource}/")), "rel": "self"},
        {"href": ctx.url(&format!("/{resource}/")), "rel": "bookmark"},
    ])
}

/// `GET /`.
pub(super) async fn root(Extension(ctx): Extension<Ctx>) -> Json<Value> {
    let version = version_doc(&ctx);
    Json(json!({
        "name": "OpenStack Ironic API",
        "description": "Ironic is an OpenStack project which aims to provision baremetal \
                        machines. This is vmdeploy's implementation of its v1 subset.",
        "versions": [version.clone()],
        "default_version": version,
    }))
}

/// `GET /v1`.
pub(super) async fn v1(Extension(ctx): Extension<Ctx>) -> Json<Value> {
    Json(json!({
        "id": "v1",
        "links": [{"href": ctx.url("/v1/"), "rel": "self"}],
        "media_types": {
            "base": "application/json",
            "type": "application/vnd.openstack.ironic.v1+json",
        },
        "version": version_doc(&ctx),
        "nodes": link(&ctx, "nodes"),
        "ports": link(&ctx, "ports"),
        "drivers": link(&ctx, "drivers"),
        "lookup": link(&ctx, "lookup"),
        "heartbeat": link(&ctx, "heartbeat"),
    }))
}
