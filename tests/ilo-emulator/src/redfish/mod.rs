//! Redfish, iLO 5 style, on the same port as RIBCL (docs/ilo-management.md §3).
//!
//! # Design
//! Fixed ids (System `1`, Manager `1`, Chassis `1`), collection `@odata.id` values with a trailing
//! slash (proliantutils builds member paths with `urljoin`, §3.2), paths matched
//! case-insensitively and with or without the trailing slash (iLO 5 serves
//! `/redfish/v1/systems/1/bios/settings/` in lower case). Authentication: sessions
//! (`POST /redfish/v1/SessionService/Sessions/`, `X-Auth-Token`) or Basic; only the service root
//! is open (§3.1).
//!
//! Operations map onto the same state machine as RIBCL:
//! - `ComputerSystem.Reset` On/ForceOn → power on; ForceOff/GracefulShutdown → off;
//!   ForceRestart/GracefulRestart → reset; PowerCycle → off then on; PushPowerButton → press;
//! - `Boot.BootSourceOverrideTarget` (iLO 5's twelve targets, [`crate::boot_target`]) +
//!   `Enabled` Once → the one-time boot; Continuous → the persistent order's head (a firmware
//!   application such as BiosSetup lasts one boot); Disabled → clears;
//!   `BootSourceOverrideMode` → pending boot mode;
//! - BIOS `Attributes.BootMode` (current) and the settings object (pending); the HPE
//!   `bios/boot` resource (UEFI BootSources and PersistentBootConfigOrder);
//! - VirtualMedia 1 (Floppy/USBStick) and 2 (CD/DVD): standard InsertMedia/EjectMedia and the
//!   HPE OEM InsertVirtualMedia/EjectVirtualMedia; PATCH `Oem.Hpe.BootOnNextServerReset` →
//!   BOOT_ONCE. A Redfish insert connects the medium at once (ConnectedVia `URI`).
//!
//! One file per resource: [`sessions`], [`systems`], [`bios`], [`managers`], [`virtual_media`],
//! [`chassis`]; this file holds the router and the reply helpers they share.
//!
//! # Limitations
//! No ETags, no `$expand`, no task monitors, no event service.

mod bios;
mod chassis;
mod managers;
mod sessions;
mod systems;
mod virtual_media;

use base64::Engine;
use http::{header, Method, Request, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use crate::fault::{FaultKind, FaultSpec};
use crate::http::{read_body, simple, Reply};
use crate::profile::Quirk;
use crate::server::{OpError, Server};
use crate::state::StateError;

const ROOT: &str = "/redfish/v1/";
const SYSTEM: &str = "/redfish/v1/Systems/1/";
const MANAGER: &str = "/redfish/v1/Managers/1/";
const BIOS_SETTINGS: &str = "/redfish/v1/systems/1/bios/settings/";
const BIOS_BOOT: &str = "/redfish/v1/systems/1/bios/boot/";

pub(super) fn json_reply(status: StatusCode, value: &Value) -> Reply {
    let mut r = simple(status, "application/json; charset=utf-8", value.to_string());
    r.headers_mut()
        .insert("OData-Version", header::HeaderValue::from_static("4.0"));
    r
}

pub(super) fn no_content() -> Reply {
    json_reply(
        StatusCode::OK,
        &json!({"error": {"code": "iLO.0.10.ExtendedInfo", "message": "See @Message.ExtendedInfo for more information.",
            "@Message.ExtendedInfo": [{"MessageId": "Base.1.4.Success"}]}}),
    )
}

tokio::task_local! {
    /// Whether the request being answered gets errors as ids only ([`Quirk::ErrorIdsOnly`]):
    /// set once per request in [`handle`], read where an error body is made, so that no handler
    /// has to pass the profile down.
    static ERROR_IDS_ONLY: bool;
}

/// `error.message` when the text is left out, as iLO 5/6 word it.
const SEE_EXTENDED_INFO: &str = "See @Message.ExtendedInfo for more information.";

/// A Redfish error body (sushy reads `error.code`, `error.message`, `@Message.ExtendedInfo`).
pub(super) fn error(status: StatusCode, message_id: &str, message: &str) -> Reply {
    error_with_args(status, message_id, message, &[])
}

/// A Redfish error whose message takes arguments (iLO sends them as `MessageArgs`). With
/// [`Quirk::ErrorIdsOnly`] the body carries the id and arguments but no text.
pub(super) fn error_with_args(
    status: StatusCode,
    message_id: &str,
    message: &str,
    args: &[&str],
) -> Reply {
    let ids_only = ERROR_IDS_ONLY.try_with(|on| *on).unwrap_or(false);
    let mut info = json!({"MessageId": message_id});
    if !args.is_empty() {
        info["MessageArgs"] = json!(args);
    }
    if !ids_only {
        info["Message"] = json!(message);
    }
    json_reply(
        status,
        &json!({"error": {
            "code": "iLO.0.10.ExtendedInfo",
            "message": if ids_only { SEE_EXTENDED_INFO } else { message },
            "@Message.ExtendedInfo": [info],
        }}),
    )
}

pub(super) fn not_found(path: &str) -> Reply {
    error(
        StatusCode::NOT_FOUND,
        "Base.1.4.ResourceMissingAtURI",
        &format!("The resource at the URI {path} was not found."),
    )
}

pub(super) fn op_error(e: OpError) -> Reply {
    match e {
        OpError::LicenseRequired => error(
            StatusCode::BAD_REQUEST,
            "iLO.2.14.LicenseKeyRequired",
            "A license key is required for this operation (iLO Advanced).",
        ),
        OpError::Fetch(f) => error(
            StatusCode::BAD_REQUEST,
            "iLO.2.14.UnableToConnectToURL",
            &format!("Unable to connect to the image URL: {f}"),
        ),
        OpError::State(StateError::PoweredOff) => error(
            StatusCode::BAD_REQUEST,
            "iLO.2.14.InvalidOperationForSystemState",
            "The operation is not allowed while the server is powered off.",
        ),
        OpError::State(StateError::NoImage) => error(
            StatusCode::BAD_REQUEST,
            "iLO.2.14.NoVirtualMediaInserted",
            "No virtual media is inserted.",
        ),
        OpError::State(StateError::BootModeNotSupported(m)) => error(
            StatusCode::BAD_REQUEST,
            "Base.1.4.PropertyValueNotInList",
            &format!("Boot mode {} is not supported.", m.ribcl()),
        ),
        OpError::Backend(b) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Base.1.4.InternalError",
            &b.to_string(),
        ),
    }
}

/// Normalised path: lower case, no trailing slash.
fn norm(path: &str) -> String {
    path.trim_end_matches('/').to_ascii_lowercase()
}

fn authorized(server: &Server, req: &Request<Incoming>) -> bool {
    let headers = req.headers();
    if let Some(token) = headers.get("X-Auth-Token").and_then(|v| v.to_str().ok()) {
        return server.session_ok(token);
    }
    let Some(basic) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
    else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(basic.trim()) else {
        return false;
    };
    let text = String::from_utf8_lossy(&decoded);
    match text.split_once(':') {
        Some((u, p)) => server.credentials_ok(u, p),
        None => false,
    }
}

pub(super) fn collection(id: &str, name: &str, members: &[&str]) -> Value {
    json!({
        "@odata.id": id,
        "@odata.type": format!("#{name}Collection.{name}Collection"),
        "Name": format!("{name} Collection"),
        "Members@odata.count": members.len(),
        "Members": members.iter().map(|m| json!({"@odata.id": m})).collect::<Vec<_>>(),
    })
}

fn service_root(server: &Server) -> Value {
    json!({
        "@odata.context": "/redfish/v1/$metadata#ServiceRoot.ServiceRoot",
        "@odata.id": ROOT,
        "@odata.type": "#ServiceRoot.v1_5_1.ServiceRoot",
        "Id": "RootService",
        "Name": "HPE RESTful Root Service",
        "RedfishVersion": "1.6.0",
        "UUID": server.uuid,
        "Product": server.config.product,
        "Vendor": "HPE",
        "Systems": {"@odata.id": "/redfish/v1/Systems/"},
        "Managers": {"@odata.id": "/redfish/v1/Managers/"},
        "Chassis": {"@odata.id": "/redfish/v1/Chassis/"},
        "SessionService": {"@odata.id": "/redfish/v1/SessionService/"},
        "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions/"}},
        "Oem": {"Hpe": {"Manager": [{
            "ManagerType": server.config.profile.identity.generation.model(),
            "ManagerFirmwareVersion": server.config.profile.identity.firmware,
        }]}},
    })
}

pub(super) async fn parse_json(req: Request<Incoming>) -> Result<Value, Reply> {
    let body = read_body(req.into_body()).await?;
    if body.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(&body).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            "Base.1.4.MalformedJSON",
            &format!("The request body is not valid JSON: {e}"),
        )
    })
}

/// What a path no resource handles gets: 404 for a GET, else 405.
pub(super) fn unrouted(method: &Method, raw_path: &str) -> Reply {
    if method == Method::GET {
        not_found(raw_path)
    } else {
        error(
            StatusCode::METHOD_NOT_ALLOWED,
            "Base.1.4.OperationNotAllowed",
            &format!("{method} is not allowed on {raw_path}."),
        )
    }
}

/// Whether the request carries a body (a length above zero, or chunks).
fn has_body(req: &Request<Incoming>) -> bool {
    let headers = req.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0)
}

/// Whether `Content-Type` says JSON (`application/json`, any parameters).
fn json_content_type(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

/// Handles a `/redfish/...` request: the open service root, injected faults, session login,
/// authentication, then the resource's handler.
pub async fn handle(server: &Server, req: Request<Incoming>, fault: Option<&FaultSpec>) -> Reply {
    ERROR_IDS_ONLY
        .scope(
            server.quirk(Quirk::ErrorIdsOnly),
            handle_request(server, req, fault),
        )
        .await
}

async fn handle_request(
    server: &Server,
    req: Request<Incoming>,
    fault: Option<&FaultSpec>,
) -> Reply {
    let method = req.method().clone();
    let raw_path = req.uri().path().to_owned();
    let path = norm(&raw_path);
    if path == "/redfish" {
        return json_reply(StatusCode::OK, &json!({"v1": ROOT}));
    }
    if server.quirk(Quirk::TrailingSlash308) && !raw_path.ends_with('/') {
        // iLO 5 before 1.40 serves only the slash form (docs/ilo-quirks.md §1).
        let location = match req.uri().query() {
            Some(q) => format!("{raw_path}/?{q}"),
            None => format!("{raw_path}/"),
        };
        let mut r = simple(StatusCode::PERMANENT_REDIRECT, "text/html", "");
        if let Ok(v) = header::HeaderValue::from_str(&location) {
            r.headers_mut().insert(header::LOCATION, v);
        }
        return r;
    }
    if path == "/redfish/v1" {
        return json_reply(StatusCode::OK, &service_root(server));
    }
    if let Some(f) = fault {
        match f.kind {
            FaultKind::Busy => {
                let mut r = error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Base.1.4.ServiceTemporarilyUnavailable",
                    f.message
                        .as_deref()
                        .unwrap_or("The service is temporarily unavailable. Retry later."),
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
                return r;
            }
            FaultKind::RibclError => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "Base.1.4.GeneralError",
                    f.message
                        .as_deref()
                        .unwrap_or("Internal error (injected fault)."),
                )
            }
            _ => {}
        }
    }
    if server.quirk(Quirk::ContentTypeRequired) && has_body(&req) && !json_content_type(&req) {
        // iLO 4 Gen9 refuses a body it is not told is JSON (docs/ilo-quirks.md §1).
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &server
                .config
                .profile
                .identity
                .base_message("UnsupportedMediaType"),
            "The request body must be sent with Content-Type: application/json.",
        );
    }
    let login_fault = fault.is_some_and(|f| f.kind == FaultKind::LoginFail);
    // Session creation is the one call that authenticates by body.
    if path == "/redfish/v1/sessionservice/sessions" && method == Method::POST {
        return sessions::login(server, req, login_fault).await;
    }
    if login_fault || !authorized(server, &req) {
        return error(
            StatusCode::UNAUTHORIZED,
            "Base.1.4.NoValidSession",
            "No valid session or credentials were provided.",
        );
    }
    let segments: Vec<&str> = path.trim_start_matches("/redfish/v1/").split('/').collect();
    tracing::info!(server = server.index, %method, path = %raw_path, "Redfish request");
    match segments.as_slice() {
        ["sessionservice", rest @ ..] => sessions::handle(server, &method, rest, &req, &raw_path),
        ["systems", "1", "bios", rest @ ..] => {
            bios::handle(server, &method, rest, req, &raw_path).await
        }
        ["systems", rest @ ..] => systems::handle(server, &method, rest, req, &raw_path).await,
        ["managers", "1", "virtualmedia", rest @ ..] => {
            virtual_media::handle(server, &method, rest, req, &raw_path).await
        }
        ["managers", rest @ ..] => managers::handle(server, &method, rest, &raw_path).await,
        ["chassis", rest @ ..] => chassis::handle(server, &method, rest, &raw_path).await,
        _ => unrouted(&method, &raw_path),
    }
}
