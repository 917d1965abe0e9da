//! SessionService: session login (the one call that authenticates by its body), the session
//! collection and logout.

use http::{header, Method, Request, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::{collection, error, json_reply, no_content, parse_json, unrouted};
use crate::http::Reply;
use crate::server::Server;

/// `POST /redfish/v1/SessionService/Sessions/`: checks the body's credentials and opens a session
/// (`X-Auth-Token` and `Location` in the reply).
pub(super) async fn login(server: &Server, req: Request<Incoming>, login_fault: bool) -> Reply {
    let body = match parse_json(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let user = body.get("UserName").and_then(Value::as_str).unwrap_or("");
    let password = body.get("Password").and_then(Value::as_str).unwrap_or("");
    if login_fault || !server.credentials_ok(user, password) {
        tracing::warn!(server = server.index, user, "Redfish session login failed");
        return error(
            StatusCode::UNAUTHORIZED,
            "Base.1.4.NoValidSession",
            "Login failed: invalid credentials.",
        );
    }
    let Some(token) = server.new_session() else {
        let cap = server.config.profile.timings.session_cap;
        tracing::warn!(
            server = server.index,
            user,
            cap,
            "Redfish session login refused: the session table is full"
        );
        return error(
            StatusCode::FORBIDDEN,
            &server.config.profile.identity.base_message("SessionLimitExceeded"),
            "The session establishment failed due to the number of simultaneous sessions exceeding the limit of the implementation.",
        );
    };
    let location = format!("/redfish/v1/SessionService/Sessions/{}/", &token[..16]);
    let mut r = json_reply(
        StatusCode::CREATED,
        &json!({"@odata.id": location, "Id": &token[..16], "Name": "User Session", "UserName": user}),
    );
    if let (Ok(t), Ok(l)) = (
        header::HeaderValue::from_str(&token),
        header::HeaderValue::from_str(&location),
    ) {
        r.headers_mut().insert("X-Auth-Token", t);
        r.headers_mut().insert(header::LOCATION, l);
    }
    r
}

/// `SessionService/...` once authenticated; `rest` is the path after `sessionservice`.
pub(super) fn handle(
    server: &Server,
    method: &Method,
    rest: &[&str],
    req: &Request<Incoming>,
    raw_path: &str,
) -> Reply {
    match (method, rest) {
        (&Method::GET, []) => json_reply(
            StatusCode::OK,
            &json!({"@odata.id": "/redfish/v1/SessionService/", "Id": "SessionService", "Name": "Session Service",
                "ServiceEnabled": true, "Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions/"}}),
        ),
        (&Method::GET, ["sessions"]) => {
            let members: Vec<String> = server
                .session_ids()
                .iter()
                .map(|id| format!("/redfish/v1/SessionService/Sessions/{id}/"))
                .collect();
            let members: Vec<&str> = members.iter().map(String::as_str).collect();
            json_reply(
                StatusCode::OK,
                &collection("/redfish/v1/SessionService/Sessions/", "Session", &members),
            )
        }
        (&Method::DELETE, ["sessions", id]) => {
            // The session named in the URI: the caller's own, or one another client left
            // open (an operator clearing leaked sessions).
            let ended = server.end_session_with_id(id);
            if !ended {
                if let Some(token) = req
                    .headers()
                    .get("X-Auth-Token")
                    .and_then(|v| v.to_str().ok())
                {
                    server.end_session(token);
                }
            }
            no_content()
        }
        _ => unrouted(method, raw_path),
    }
}
