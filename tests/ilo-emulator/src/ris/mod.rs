//! iLO 4's HP RESTful API ("RIS", `/rest/v1`), as an iLO 4 on a Gen9 with firmware 2.x serves
//! it beside RIBCL (docs/ilo-quirks.md §0). proliantutils drives every "Gen9" model through it.
//!
//! # Design
//! The same server state as RIBCL and Redfish ([`crate::server::Server`]): a power change or an
//! insert made here shows in the other two, and the other way round. What differs from
//! Redfish is the wire: `Type` instead of `@odata.type`, `links.*.href` instead of
//! `@odata.id`, `AvailableActions` and POSTs to the resource itself (`{"Action": "Reset"}`)
//! instead of action URIs, `Oem.Hp` instead of `Oem.Hpe`, flat BIOS attributes, and virtual
//! media changed by PATCHing `Image` only (docs/ilo-quirks.md §2–§5, §7).
//!
//! - Paths are matched case-insensitively (the capture links `/rest/v1/systems/1/bios` in lower
//!   case); a path with a trailing slash answers 301 to the path without it, which clients
//!   follow (docs/ilo-quirks.md §1) [guess as to which paths a real iLO redirects].
//! - Authentication: Basic (proliantutils sends it on every request, scheme in upper case) or the
//!   `X-Auth-Token` of a session (`POST /rest/v1/Sessions`, or one opened over Redfish); only the
//!   service root is open.
//! - A body on POST/PATCH/PUT without `Content-Type: application/json` answers 415 with the
//!   `content-type-required` quirk. Bodies of GET/DELETE are ignored: proliantutils sends the
//!   text `null` on every GET, and a real iLO answers them.
//! - Errors (and the success body of a change) come in iLO 4's two forms: without an
//!   `OData-Version` request header the legacy `ExtendedError` (`Messages[].MessageID`, capital
//!   D) together with the Redfish `error` object; with it, the `error` object alone
//!   (docs/ilo-quirks.md §10).
//!
//! One file per resource: [`systems`] (ComputerSystem, power, boot override, Secure Boot),
//! [`bios`] (current and pending BIOS settings, the UEFI boot order), [`managers`] (the iLO,
//! its licence), [`virtual_media`], [`sessions`]; each keeps its wire shapes (pure functions of
//! the state) apart from the handlers that change state. This file holds the router, the
//! request checks and the reply helpers.
//!
//! # Limitations
//! No ETags, no paging, no storage/PCI/network adapter resources, no firmware update, no
//! BIOS password (`X-HPRESTFULAPI-AuthToken` is not checked).

mod bios;
mod managers;
mod sessions;
mod systems;
mod virtual_media;

use base64::Engine;
use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use crate::fault::{FaultKind, FaultSpec};
use crate::http::{read_body, simple, Reply};
use crate::profile::{Generation, Quirk};
use crate::server::{OpError, Server};
use crate::state::StateError;

/// The prefix every RIS path starts with.
pub const PREFIX: &str = "/rest/v1";

/// Whether `path` is a RIS path (`/rest/v1` or below it).
pub fn is_ris_path(path: &str) -> bool {
    path == PREFIX || path.starts_with("/rest/v1/")
}

/// One RIS request, read in full: the handlers and the tests work on this rather than on a
/// hyper body.
#[derive(Debug, Clone)]
pub struct RisRequest {
    /// Method.
    pub method: Method,
    /// Path as sent.
    pub path: String,
    /// Query string, if any.
    pub query: Option<String>,
    /// Headers.
    pub headers: HeaderMap,
    /// Body bytes (empty when none).
    pub body: Bytes,
}

/// Why a request body is refused: a Base registry message name and its arguments.
pub(super) type Refusal = (&'static str, Vec<String>);

/// What a handler is given: the server, the request, and the parts of it every reply needs.
pub(super) struct Call<'a> {
    server: &'a Server,
    req: &'a RisRequest,
    /// The request carried `OData-Version`: errors in the Redfish form only.
    odata: bool,
}

impl Call<'_> {
    fn identity(&self) -> &crate::profile::Identity {
        &self.server.config.profile.identity
    }

    /// A Base registry id of this firmware (`Base.0.10.<name>` on iLO 4).
    pub(super) fn base_id(&self, name: &str) -> String {
        self.identity().base_message(name)
    }

    /// An iLO registry id of this firmware (`iLO.0.10.<name>` on iLO 4).
    pub(super) fn ilo_id(&self, name: &str) -> String {
        self.identity().ilo_message(name)
    }

    /// An extended-info reply: `ids` with their arguments, in the form the request asked for.
    pub(super) fn extended(&self, status: StatusCode, ids: &[(String, Vec<String>)]) -> Reply {
        json_reply(status, &extended_body(ids, self.odata), None)
    }

    /// An error with one message id and its arguments.
    pub(super) fn error(&self, status: StatusCode, id: &str, args: &[&str]) -> Reply {
        let args = args.iter().map(|a| (*a).to_owned()).collect();
        self.extended(status, &[(id.to_owned(), args)])
    }

    /// The success of a change: 200 with `Base.0.10.Success`.
    pub(super) fn success(&self) -> Reply {
        self.extended(StatusCode::OK, &[(self.base_id("Success"), Vec::new())])
    }

    /// 404 for a resource this iLO does not have.
    pub(super) fn not_found(&self) -> Reply {
        let path = self.req.path.clone();
        self.error(
            StatusCode::NOT_FOUND,
            &self.base_id("ResourceMissingAtURI"),
            &[&path],
        )
    }

    /// 405 for a method the resource does not allow, with its `Allow` header.
    pub(super) fn not_allowed(&self, allow: &'static str) -> Reply {
        let mut r = self.error(
            StatusCode::METHOD_NOT_ALLOWED,
            &self.base_id("OperationNotAllowed"),
            &[],
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static(allow));
        r
    }

    /// The request body as a JSON object; `None` when it is not one (answer
    /// [`Call::malformed`]).
    pub(super) fn json_body(&self) -> Option<serde_json::Map<String, Value>> {
        match serde_json::from_slice::<Value>(&self.req.body) {
            Ok(Value::Object(map)) => Some(map),
            _ => None,
        }
    }

    /// 400 `MalformedJSON`: the body is not a JSON object.
    pub(super) fn malformed(&self) -> Reply {
        self.error(StatusCode::BAD_REQUEST, &self.base_id("MalformedJSON"), &[])
    }

    /// The reply to an operation the state machine refused.
    pub(super) fn op_error(&self, e: OpError) -> Reply {
        match e {
            OpError::LicenseRequired => self.error(
                StatusCode::BAD_REQUEST,
                &self.ilo_id("LicenseKeyRequired"),
                &[],
            ),
            OpError::Fetch(f) => {
                let text = f.to_string();
                self.error(
                    StatusCode::BAD_REQUEST,
                    &self.ilo_id("UnableToConnectToURL"),
                    &[&text],
                )
            }
            OpError::State(StateError::PoweredOff) => self.error(
                StatusCode::BAD_REQUEST,
                &self.ilo_id("InvalidOperationForSystemState"),
                &[],
            ),
            OpError::State(StateError::NoImage) => self.error(
                StatusCode::BAD_REQUEST,
                &self.ilo_id("NoVirtualMediaInserted"),
                &[],
            ),
            OpError::State(StateError::BootModeNotSupported(m)) => self.error(
                StatusCode::BAD_REQUEST,
                &self.base_id("PropertyValueNotInList"),
                &[m.ribcl(), "BootMode"],
            ),
            OpError::Backend(b) => {
                let text = b.to_string();
                self.error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &self.base_id("InternalError"),
                    &[&text],
                )
            }
        }
    }
}

/// The body of an extended-info reply. Without `OData-Version` iLO 4 sends the legacy form
/// and the Redfish `error` object side by side; with it, the `error` object alone
/// (docs/ilo-quirks.md §10).
pub(super) fn extended_body(ids: &[(String, Vec<String>)], odata: bool) -> Value {
    let info_key = if odata { "MessageId" } else { "MessageID" };
    let info: Vec<Value> = ids
        .iter()
        .map(|(id, args)| {
            let mut m = serde_json::Map::new();
            m.insert(info_key.into(), json!(id));
            if !args.is_empty() {
                m.insert("MessageArgs".into(), json!(args));
            }
            Value::Object(m)
        })
        .collect();
    let error = json!({
        "code": "iLO.0.10.ExtendedInfo",
        "message": "See @Message.ExtendedInfo for more information.",
        "@Message.ExtendedInfo": info,
    });
    if odata {
        return json!({ "error": error });
    }
    let legacy: Vec<Value> = ids
        .iter()
        .map(|(id, args)| json!({"MessageID": id, "MessageArgs": args}))
        .collect();
    json!({
        "Type": "ExtendedError.1.0.0",
        "Name": "Extended Error Information",
        "Messages": legacy,
        "error": error,
    })
}

/// A JSON reply framed as iLO 4's REST service frames it (Content-Length, `application/json`,
/// the HP service headers; the sample headers in proliantutils' RIS tests), with `Allow` when
/// given.
pub(super) fn json_reply(status: StatusCode, value: &Value, allow: Option<&'static str>) -> Reply {
    let mut r = simple(status, "application/json", value.to_string());
    let h = r.headers_mut();
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    h.insert(
        header::SERVER,
        header::HeaderValue::from_static("HP-iLO-Server/1.30"),
    );
    h.insert(
        "X_HP-CHRP-Service-Version",
        header::HeaderValue::from_static("1.0.3"),
    );
    if let Some(a) = allow {
        h.insert(header::ALLOW, header::HeaderValue::from_static(a));
    }
    r
}

/// A RIS collection: members as `links.Member` hrefs (how iLO 4 lists PATCHable members;
/// proliantutils walks them).
pub(super) fn collection(
    self_href: &str,
    name: &str,
    member_type: &str,
    members: &[&str],
) -> Value {
    json!({
        "Type": "Collection.1.0.0",
        "Name": name,
        "MemberType": member_type,
        "Total": members.len(),
        "links": {
            "self": {"href": self_href},
            "Member": members.iter().map(|m| json!({"href": m})).collect::<Vec<_>>(),
        },
    })
}

/// `GET /rest/v1`: the service root (open, as on Redfish).
fn service_root(server: &Server) -> Value {
    let identity = &server.config.profile.identity;
    json!({
        "Type": "ServiceRoot.1.0.0",
        "Name": "HP RESTful Root Service",
        "ServiceVersion": "1.0.0",
        "Time": httpdate::fmt_http_date(std::time::SystemTime::now()),
        "UUID": server.uuid,
        "Oem": {"Hp": {
            "Type": "HpiLOServiceExt.0.0.1",
            "Manager": [{
                "ManagerType": identity.generation.model(),
                "ManagerFirmwareVersion": identity.firmware,
            }],
        }},
        "links": {
            "self": {"href": PREFIX},
            "Systems": {"href": "/rest/v1/Systems"},
            "Managers": {"href": "/rest/v1/Managers"},
            "Sessions": {"href": "/rest/v1/SessionService/Sessions"},
            "SessionService": {"href": "/rest/v1/SessionService"},
        },
    })
}

/// Where iLO 5 and 6 send a RIS path: the Redfish path with a trailing slash, 308
/// (docs/ilo-quirks.md §0: "every `/rest/v1/x` → 308 to `/redfish/v1/x/`").
pub fn redirect_to_redfish(path: &str, query: Option<&str>) -> Reply {
    let rest = path.strip_prefix(PREFIX).unwrap_or("");
    let rest = rest.trim_end_matches('/');
    let mut location = format!("/redfish/v1{rest}/");
    if let Some(q) = query {
        location.push('?');
        location.push_str(q);
    }
    let mut r = simple(StatusCode::PERMANENT_REDIRECT, "text/html", "");
    if let Ok(v) = header::HeaderValue::from_str(&location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// Whether RIS answers on this server: the `ris` quirk on a generation that has RIS. iLO 5 and
/// 6 redirect instead ([`redirect_to_redfish`]).
pub fn redirects_to_redfish(server: &Server) -> bool {
    matches!(
        server.config.profile.identity.generation,
        Generation::Ilo5 | Generation::Ilo6
    )
}

fn authorized(server: &Server, headers: &HeaderMap) -> bool {
    if let Some(token) = headers.get("X-Auth-Token").and_then(|v| v.to_str().ok()) {
        return server.session_ok(token);
    }
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    // proliantutils writes the scheme as "BASIC"; schemes are case-insensitive (RFC 7235).
    let Some((scheme, encoded)) = value.trim().split_once(' ') else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        return false;
    }
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    let text = String::from_utf8_lossy(&decoded);
    match text.split_once(':') {
        Some((u, p)) => server.credentials_ok(u, p),
        None => false,
    }
}

/// Whether `Content-Type` says JSON (`application/json`, any parameters).
fn json_content_type(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

/// The 301 to the same path without its trailing slash, absolute as iLO 4 writes `Location`
/// [guess], on the host the client used.
fn slash_redirect(server: &Server, req: &RisRequest) -> Reply {
    let host = req
        .headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_else(|| server.address.to_string());
    let mut location = format!("https://{host}{}", req.path.trim_end_matches('/'));
    if let Some(q) = &req.query {
        location.push('?');
        location.push_str(q);
    }
    let mut r = simple(StatusCode::MOVED_PERMANENTLY, "text/html", "");
    if let Ok(v) = header::HeaderValue::from_str(&location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// Handles a `/rest/v1/...` request on a server with the `ris` quirk: reads the body, then
/// [`respond`].
pub async fn handle(server: &Server, req: Request<Incoming>, fault: Option<&FaultSpec>) -> Reply {
    let (parts, body) = req.into_parts();
    let body = match read_body(body).await {
        Ok(b) => b,
        Err(reply) => return reply,
    };
    let req = RisRequest {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        headers: parts.headers,
        body,
    };
    respond(server, &req, fault).await
}

/// Answers one RIS request: redirects, injected faults, the body and authentication checks,
/// then the resource's handler.
pub async fn respond(server: &Server, req: &RisRequest, fault: Option<&FaultSpec>) -> Reply {
    let call = Call {
        server,
        req,
        odata: req.headers.contains_key("OData-Version"),
    };
    if req.path.len() > PREFIX.len() + 1 && req.path.ends_with('/') {
        return slash_redirect(server, req);
    }
    let path = req.path.trim_end_matches('/').to_ascii_lowercase();
    let rest = path.strip_prefix(PREFIX).unwrap_or("");
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let method = &req.method;
    if segments.is_empty() && matches!(*method, Method::GET | Method::HEAD) {
        return json_reply(StatusCode::OK, &service_root(server), Some("GET, HEAD"));
    }
    if let Some(f) = fault {
        match f.kind {
            FaultKind::WrongRoot => return json_reply(StatusCode::OK, &json!([]), None),
            FaultKind::Busy => {
                let mut r = call.error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &call.base_id("ServiceTemporarilyUnavailable"),
                    &[],
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
                return r;
            }
            FaultKind::RibclError => {
                return call.error(
                    StatusCode::BAD_REQUEST,
                    &call.base_id("GeneralError"),
                    &[f.message.as_deref().unwrap_or("injected fault")],
                )
            }
            _ => {}
        }
    }
    let changes = matches!(*method, Method::POST | Method::PATCH | Method::PUT);
    if changes
        && !req.body.is_empty()
        && server.quirk(Quirk::ContentTypeRequired)
        && !json_content_type(&req.headers)
    {
        // iLO 4 Gen9 refuses a body it is not told is JSON (docs/ilo-quirks.md §1).
        return call.error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &call.base_id("UnsupportedMediaType"),
            &[],
        );
    }
    let login_fault = fault.is_some_and(|f| f.kind == FaultKind::LoginFail);
    // Session creation is the one call that authenticates by its body.
    if segments.as_slice() == ["sessions"] && *method == Method::POST {
        return sessions::login(&call, login_fault);
    }
    if login_fault || !authorized(server, &req.headers) {
        return call.error(
            StatusCode::UNAUTHORIZED,
            &call.base_id("NoValidSession"),
            &[],
        );
    }
    tracing::info!(server = server.index, %method, path = %req.path, "RIS request");
    match segments.as_slice() {
        [] => call.not_allowed("GET, HEAD"),
        ["sessions" | "sessionservice", rest @ ..] => sessions::handle(&call, rest),
        ["systems", "1", "bios", rest @ ..] => bios::handle(&call, rest).await,
        ["systems", rest @ ..] => systems::handle(&call, rest).await,
        ["managers", "1", "virtualmedia", rest @ ..] => virtual_media::handle(&call, rest).await,
        ["managers", rest @ ..] => managers::handle(&call, rest).await,
        _ => call.not_found(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use http_body_util::BodyExt;
    use proptest::prelude::*;

    use super::*;
    use crate::backend::InMemoryBackend;
    use crate::config::ServerConfig;
    use crate::media_fetch::MediaFetcher;
    use crate::profile::Profile;

    /// A server of the Gen9 profile.
    pub(crate) fn gen9() -> Server {
        let profile = Profile::named("ilo4-gen9-2.7x").expect("the profile");
        Server::new(
            0,
            std::net::SocketAddr::from(([127, 0, 0, 1], 1)),
            Arc::new(ServerConfig::with_profile(profile)),
            Arc::new(InMemoryBackend),
            MediaFetcher::new().expect("client"),
            Arc::default(),
        )
    }

    pub(crate) fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// A request with Basic auth (as proliantutils sends it) and, with a body, JSON.
    pub(crate) fn request(method: Method, path: &str, body: Option<Value>) -> RisRequest {
        let mut headers = HeaderMap::new();
        let auth = base64::engine::general_purpose::STANDARD.encode("Administrator:password");
        headers.insert(
            header::AUTHORIZATION,
            header::HeaderValue::from_str(&format!("BASIC {auth}")).expect("header"),
        );
        let body = match body {
            Some(b) => {
                headers.insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static("application/json"),
                );
                Bytes::from(b.to_string())
            }
            None => Bytes::new(),
        };
        RisRequest {
            method,
            path: path.to_owned(),
            query: None,
            headers,
            body,
        }
    }

    /// Status and body (JSON, or `Null` when the body is not JSON).
    pub(crate) async fn call(server: &Server, req: &RisRequest) -> (StatusCode, Value) {
        let reply = respond(server, req, None).await;
        let status = reply.status();
        let bytes = reply
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// The message ids of an extended-info body, from the legacy list.
    pub(crate) fn ids(body: &Value) -> Vec<String> {
        body.get("Messages")
            .and_then(Value::as_array)
            .map(|m| {
                m.iter()
                    .filter_map(|x| x.get("MessageID").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn errors_take_the_dual_form_without_odata_version_and_the_redfish_form_with_it() {
        let rt = runtime();
        let s = gen9();
        let mut req = request(Method::PATCH, "/rest/v1/Systems/1", None);
        req.body = Bytes::from_static(b"{not json");
        req.headers.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        let (status, body) = rt.block_on(call(&s, &req));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["Type"], "ExtendedError.1.0.0");
        assert_eq!(ids(&body), ["Base.0.10.MalformedJSON"]);
        assert_eq!(
            body.pointer("/error/@Message.ExtendedInfo/0/MessageID"),
            Some(&json!("Base.0.10.MalformedJSON"))
        );
        req.headers
            .insert("OData-Version", header::HeaderValue::from_static("4.0"));
        let (_, body) = rt.block_on(call(&s, &req));
        assert!(body.get("Messages").is_none(), "{body}");
        assert_eq!(
            body.pointer("/error/@Message.ExtendedInfo/0/MessageId"),
            Some(&json!("Base.0.10.MalformedJSON"))
        );
    }

    #[test]
    fn authentication_basic_in_any_case_or_a_session_token() {
        let rt = runtime();
        let s = gen9();
        let mut req = request(Method::GET, "/rest/v1/Systems/1", None);
        assert_eq!(rt.block_on(call(&s, &req)).0, StatusCode::OK);
        req.headers.remove(header::AUTHORIZATION);
        let (status, body) = rt.block_on(call(&s, &req));
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(ids(&body), ["Base.0.10.NoValidSession"]);
        // The service root is open.
        let root = RisRequest {
            path: "/rest/v1".into(),
            ..req.clone()
        };
        let (status, body) = rt.block_on(call(&s, &root));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["links"]["Systems"]["href"], "/rest/v1/Systems");
        // A session's token.
        let token = s.new_session().expect("a session");
        req.headers.insert(
            "X-Auth-Token",
            header::HeaderValue::from_str(&token).expect("header"),
        );
        assert_eq!(rt.block_on(call(&s, &req)).0, StatusCode::OK);
        // A wrong password.
        let mut bad = request(Method::GET, "/rest/v1/Systems/1", None);
        let auth = base64::engine::general_purpose::STANDARD.encode("Administrator:nope");
        bad.headers.insert(
            header::AUTHORIZATION,
            header::HeaderValue::from_str(&format!("Basic {auth}")).expect("header"),
        );
        assert_eq!(rt.block_on(call(&s, &bad)).0, StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn a_body_without_json_content_type_is_415_but_a_get_body_is_ignored() {
        let rt = runtime();
        let s = gen9();
        let mut req = request(
            Method::PATCH,
            "/rest/v1/Systems/1",
            Some(
                json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}}),
            ),
        );
        req.headers.remove(header::CONTENT_TYPE);
        let (status, body) = rt.block_on(call(&s, &req));
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(ids(&body), ["Base.0.10.UnsupportedMediaType"]);
        assert_eq!(rt.block_on(s.read(|st| st.one_time_boot)), None);
        // proliantutils' GETs carry the body `null` and no Content-Type.
        let mut get = request(Method::GET, "/rest/v1/Systems/1", None);
        get.body = Bytes::from_static(b"null");
        assert_eq!(rt.block_on(call(&s, &get)).0, StatusCode::OK);
    }

    #[test]
    fn a_trailing_slash_is_301_to_the_path_without_it() {
        let rt = runtime();
        let s = gen9();
        let mut req = request(Method::GET, "/rest/v1/Systems/1/", None);
        req.headers
            .insert(header::HOST, header::HeaderValue::from_static("ilo:443"));
        let reply = rt.block_on(respond(&s, &req, None));
        assert_eq!(reply.status(), StatusCode::MOVED_PERMANENTLY);
        assert_eq!(
            reply.headers().get(header::LOCATION).map(|v| v.as_bytes()),
            Some(&b"https://ilo:443/rest/v1/Systems/1"[..])
        );
    }

    #[test]
    fn ilo5_redirects_every_ris_path_to_redfish_with_a_slash() {
        for (path, query, location) in [
            ("/rest/v1", None, "/redfish/v1/"),
            ("/rest/v1/Systems/1", None, "/redfish/v1/Systems/1/"),
            (
                "/rest/v1/Systems/1/",
                Some("a=b"),
                "/redfish/v1/Systems/1/?a=b",
            ),
        ] {
            let r = redirect_to_redfish(path, query);
            assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
            assert_eq!(
                r.headers().get(header::LOCATION).map(|v| v.as_bytes()),
                Some(location.as_bytes())
            );
        }
    }

    #[test]
    fn unknown_resources_are_404_and_wrong_methods_405() {
        let rt = runtime();
        let s = gen9();
        let (status, body) = rt.block_on(call(&s, &request(Method::GET, "/rest/v1/Nothing", None)));
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(ids(&body), ["Base.0.10.ResourceMissingAtURI"]);
        let (status, _) = rt.block_on(call(
            &s,
            &request(Method::DELETE, "/rest/v1/Systems/1", None),
        ));
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    }

    /// Over HTTPS through the router: RIS only with the quirk (404 without, as before it
    /// existed), a 308 to Redfish on iLO 5, and one state for RIS and RIBCL.
    #[tokio::test]
    async fn the_router_serves_ris_on_the_gen9_only_over_the_shared_state() {
        use crate::{Emulator, EmulatorConfig};
        async fn start(profile: Profile) -> Emulator {
            let config = EmulatorConfig {
                server: ServerConfig::with_profile(profile),
                ..EmulatorConfig::loopback()
            };
            Emulator::start(config).await.expect("the emulator starts")
        }
        fn client(e: &Emulator) -> reqwest::Client {
            let cert = reqwest::Certificate::from_pem(e.cert_pem().as_bytes()).expect("pem");
            reqwest::Client::builder()
                .tls_certs_only([cert])
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .build()
                .expect("client")
        }
        let ribcl_power = |command: &str| {
            format!("<RIBCL VERSION=\"2.0\"><LOGIN USER_LOGIN=\"Administrator\" PASSWORD=\"password\"><SERVER_INFO MODE=\"write\">{command}</SERVER_INFO></LOGIN></RIBCL>\r\n")
        };
        let gen9 = Profile::named("ilo4-gen9-2.7x").expect("profile");
        for profile in [Profile::lab(), gen9.clone().with(Quirk::Ris, false)] {
            let e = start(profile).await;
            let r = client(&e)
                .get(format!("https://{}/rest/v1/Systems/1", e.addresses()[0]))
                .basic_auth("Administrator", Some("password"))
                .send()
                .await
                .expect("an answer");
            assert_eq!(r.status(), StatusCode::NOT_FOUND);
            e.shutdown().await;
        }
        let e = start(Profile::named("ilo5-2.7x").expect("profile")).await;
        let r = client(&e)
            .get(format!("https://{}/rest/v1/Systems/1", e.addresses()[0]))
            .send()
            .await
            .expect("an answer");
        assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(
            r.headers().get(header::LOCATION).map(|v| v.as_bytes()),
            Some(&b"/redfish/v1/Systems/1/"[..])
        );
        e.shutdown().await;

        let e = start(gen9).await;
        let c = client(&e);
        let addr = e.addresses()[0];
        let r = c
            .post(format!("https://{addr}/rest/v1/Systems/1"))
            .basic_auth("Administrator", Some("password"))
            .json(&json!({"Action": "Reset", "ResetType": "On"}))
            .send()
            .await
            .expect("an answer");
        assert_eq!(r.status(), StatusCode::OK);
        assert!(
            r.headers().get(header::CONTENT_LENGTH).is_some(),
            "iLO 4 does not chunk"
        );
        let text = c
            .post(format!("https://{addr}/ribcl"))
            .body(ribcl_power("<GET_HOST_POWER_STATUS/>"))
            .send()
            .await
            .expect("an answer")
            .text()
            .await
            .expect("text");
        assert!(text.contains("HOST_POWER=\"ON\""), "{text}");
        c.post(format!("https://{addr}/ribcl"))
            .body(ribcl_power("<SET_HOST_POWER HOST_POWER=\"No\"/>"))
            .send()
            .await
            .expect("an answer");
        let v: Value = c
            .get(format!("https://{addr}/rest/v1/Systems/1"))
            .basic_auth("Administrator", Some("password"))
            .send()
            .await
            .expect("an answer")
            .json()
            .await
            .expect("JSON");
        assert_eq!(v["Power"], "Off");
        e.shutdown().await;
    }

    const PATHS: [&str; 14] = [
        "/rest/v1",
        "/rest/v1/Systems",
        "/rest/v1/Systems/1",
        "/rest/v1/Systems/1/SecureBoot",
        "/rest/v1/systems/1/bios",
        "/rest/v1/systems/1/bios/Settings",
        "/rest/v1/systems/1/bios/Boot",
        "/rest/v1/Managers",
        "/rest/v1/Managers/1",
        "/rest/v1/Managers/1/VirtualMedia",
        "/rest/v1/Managers/1/VirtualMedia/2",
        "/rest/v1/Managers/1/LicenseService",
        "/rest/v1/Sessions",
        "/rest/v1/SessionService/Sessions/x",
    ];

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            prop::sample::select(vec![
                "On",
                "ForceOff",
                "ForceRestart",
                "Nmi",
                "PushPowerButton",
                "Press",
                "PressAndHold",
                "/Oem/Hp",
                "Reset",
                "PowerButton",
                "Cd",
                "Pxe",
                "Hdd",
                "UefiTarget",
                "Once",
                "Continuous",
                "Disabled",
                "Uefi",
                "LegacyBios",
                "http://127.0.0.1:1/x.iso",
                "",
                "Boot0009",
            ])
            .prop_map(|s| json!(s)),
            ".{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            let keys = prop::sample::select(vec![
                "Action",
                "ResetType",
                "PushType",
                "Target",
                "Boot",
                "BootSourceOverrideTarget",
                "BootSourceOverrideEnabled",
                "BootSourceOverrideMode",
                "UefiTargetBootSourceOverride",
                "BootMode",
                "UefiOptimizedBoot",
                "CustomPostMessage",
                "Image",
                "Oem",
                "Hp",
                "BootOnNextServerReset",
                "Inserted",
                "WriteProtected",
                "SecureBootEnable",
                "ResetAllKeys",
                "LicenseKey",
                "UserName",
                "Password",
                "x",
            ]);
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::btree_map(keys, inner, 0..4).prop_map(|m| {
                    Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn arbitrary_paths_and_bodies_never_panic(
            method in prop::sample::select(vec![Method::GET, Method::POST, Method::PATCH, Method::PUT, Method::DELETE, Method::HEAD]),
            path in prop_oneof![
                prop::sample::select(PATHS.to_vec()).prop_map(str::to_owned),
                "/rest/v1[/A-Za-z0-9%.]{0,30}",
            ],
            body in prop_oneof![json_value().prop_map(|v| v.to_string()), ".{0,40}"],
            odata in any::<bool>(),
        ) {
            let rt = runtime();
            let s = gen9();
            let mut req = request(method, &path, None);
            req.body = Bytes::from(body);
            req.headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
            if odata {
                req.headers.insert("OData-Version", header::HeaderValue::from_static("4.0"));
            }
            let reply = rt.block_on(respond(&s, &req, None));
            let status = reply.status();
            prop_assert!(status.as_u16() < 500 || status == StatusCode::INTERNAL_SERVER_ERROR, "{status}");
        }
    }
}
