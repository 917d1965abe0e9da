//! Sessions: `POST /rest/v1/Sessions` (the one call that authenticates by its body; iLO 4
//! answers with `X-Auth-Token` and `Location`) and the logout. The table is the server's, shared
//! with Redfish: a token from either works on both.

use http::{header, Method, StatusCode};
use serde_json::{json, Value};

use super::{json_reply, Call};
use crate::http::Reply;

/// `POST /rest/v1/Sessions` `{"UserName", "Password"}`.
pub(super) fn login(call: &Call<'_>, login_fault: bool) -> Reply {
    let Some(body) = call.json_body() else {
        return call.malformed();
    };
    let user = body.get("UserName").and_then(Value::as_str).unwrap_or("");
    let password = body.get("Password").and_then(Value::as_str).unwrap_or("");
    let server = call.server;
    if login_fault || !server.credentials_ok(user, password) {
        tracing::warn!(server = server.index, user, "RIS session login failed");
        return call.error(
            StatusCode::UNAUTHORIZED,
            &call.base_id("NoValidSession"),
            &[],
        );
    }
    let Some(token) = server.new_session() else {
        return call.error(
            StatusCode::FORBIDDEN,
            &call.base_id("SessionLimitExceeded"),
            &[],
        );
    };
    let id: String = token.chars().take(16).collect();
    let location = format!("/rest/v1/SessionService/Sessions/{id}");
    let mut r = json_reply(
        StatusCode::CREATED,
        &json!({"Type": "Session.1.0.0", "Name": "User Session", "UserName": user,
            "links": {"self": {"href": location}}}),
        None,
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

/// `Sessions` / `SessionService/...` once authenticated; `rest` is the path after them.
pub(super) fn handle(call: &Call<'_>, rest: &[&str]) -> Reply {
    match (&call.req.method, rest) {
        (&Method::GET | &Method::HEAD, []) => json_reply(
            StatusCode::OK,
            &json!({"Type": "SessionService.1.0.0", "Name": "Session Service", "ServiceEnabled": true,
                "links": {"self": {"href": "/rest/v1/SessionService"},
                    "Sessions": {"href": "/rest/v1/SessionService/Sessions"}}}),
            Some("GET, HEAD"),
        ),
        (&Method::DELETE, ["sessions", id]) | (&Method::DELETE, [id]) => {
            // The session named in the URI (ids are matched without case: paths are
            // lower-cased), or else the caller's own.
            if !call.server.end_session_with_id(id) {
                if let Some(token) = call
                    .req
                    .headers
                    .get("X-Auth-Token")
                    .and_then(|v| v.to_str().ok())
                {
                    call.server.end_session(token);
                }
            }
            call.success()
        }
        _ => call.not_found(),
    }
}

#[cfg(test)]
mod tests {
    use http::{header, Method, StatusCode};
    use serde_json::json;

    use super::super::respond;
    use super::super::tests::{call, gen9, request, runtime};

    #[test]
    fn a_session_login_gives_a_token_that_authenticates_and_logout_ends_it() {
        let rt = runtime();
        let s = gen9();
        let mut login = request(
            Method::POST,
            "/rest/v1/Sessions",
            Some(json!({"UserName": "Administrator", "Password": "password"})),
        );
        login.headers.remove(header::AUTHORIZATION);
        let reply = rt.block_on(respond(&s, &login, None));
        assert_eq!(reply.status(), StatusCode::CREATED);
        let token = reply
            .headers()
            .get("X-Auth-Token")
            .and_then(|v| v.to_str().ok())
            .expect("a token")
            .to_owned();
        let location = reply
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .expect("a location")
            .to_owned();
        assert!(s.session_ok(&token));
        let mut get = request(Method::GET, "/rest/v1/Systems/1", None);
        get.headers.remove(header::AUTHORIZATION);
        get.headers.insert(
            "X-Auth-Token",
            header::HeaderValue::from_str(&token).expect("h"),
        );
        assert_eq!(rt.block_on(call(&s, &get)).0, StatusCode::OK);
        let mut logout = get.clone();
        logout.method = Method::DELETE;
        logout.path = location;
        assert_eq!(rt.block_on(call(&s, &logout)).0, StatusCode::OK);
        assert!(!s.session_ok(&token));
        let mut bad = login.clone();
        bad.body = bytes::Bytes::from_static(br#"{"UserName": "Administrator", "Password": "x"}"#);
        assert_eq!(rt.block_on(call(&s, &bad)).0, StatusCode::UNAUTHORIZED);
    }
}
