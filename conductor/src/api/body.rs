//! Request bodies: the JSON extractor (size limit, malformed JSON → 400 in Ironic's fault body)
//! and typed reads of one field that name the field when its type is wrong.
//!
//! # Design
//! Bodies are read as a `serde_json` object and taken apart field by field rather than through
//! `#[derive(Deserialize)]`: serde's messages point at a line and column, Ironic's (and ours)
//! name the field, and unknown fields are refused with their names.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde_json::{Map, Value};

use super::error::ApiError;
use super::ApiState;

/// A JSON request body (any JSON value; handlers say which shape they need).
pub(super) struct JsonBody(pub Value);

impl FromRequest<Arc<ApiState>> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<ApiState>) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            // 413 from the body limit, 408 for a body past its deadline (the service's
            // `TimedBody`), 400 for a body that broke off.
            let status = rejection.status();
            if crate::net::timed_body::is_body_timeout(&rejection) {
                ApiError::new(
                    http::StatusCode::REQUEST_TIMEOUT,
                    "The request body did not arrive in time (api.body_timeout).".to_string(),
                )
            } else if status == http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    status,
                    format!(
                        "The request body is larger than {} bytes.",
                        state.options.max_body
                    ),
                )
            } else {
                ApiError::new(
                    status,
                    format!("Reading the request body: {}", rejection.body_text()),
                )
            }
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(JsonBody(Value::Null));
        }
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request(format!("The request body is not valid JSON: {e}")))
    }
}

/// The body as a JSON object, or 400 naming `what`.
pub(super) fn object(body: Value, what: &str) -> Result<Map<String, Value>, ApiError> {
    match body {
        Value::Object(map) => Ok(map),
        Value::Null => Err(ApiError::bad_request(format!(
            "The request body of {what} is missing: a JSON object is expected."
        ))),
        other => Err(ApiError::bad_request(format!(
            "The request body of {what} must be a JSON object, not {}.",
            type_name(&other)
        ))),
    }
}

/// The body as a JSON object; an empty body is an empty object.
pub(super) fn object_or_empty(body: Value, what: &str) -> Result<Map<String, Value>, ApiError> {
    match body {
        Value::Null => Ok(Map::new()),
        other => object(other, what),
    }
}

/// Refuses any key of `obj` not in `known`, naming them.
pub(super) fn refuse_unknown(
    obj: &Map<String, Value>,
    known: &[&str],
    what: &str,
) -> Result<(), ApiError> {
    let unknown: Vec<&str> = obj
        .keys()
        .map(String::as_str)
        .filter(|k| !known.contains(k))
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "Unknown attribute(s) for {what}: {}.",
            unknown.join(", ")
        )))
    }
}

/// JSON's name of a value's type, for messages.
pub(super) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn wrong(field: &str, want: &str, got: &Value) -> ApiError {
    ApiError::bad_request(format!(
        "Invalid value for field \"{field}\": expected {want}, got {}.",
        type_name(got)
    ))
}

/// A string field; `None` when absent or null.
pub(super) fn opt_str(obj: &Map<String, Value>, field: &str) -> Result<Option<String>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(wrong(field, "a string", other)),
    }
}

/// A required string field.
pub(super) fn req_str(obj: &Map<String, Value>, field: &str) -> Result<String, ApiError> {
    opt_str(obj, field)?
        .ok_or_else(|| ApiError::bad_request(format!("Mandatory field \"{field}\" is missing.")))
}

/// A boolean field; Ironic also takes the strings `true`/`false` (query-style clients).
pub(super) fn opt_bool(obj: &Map<String, Value>, field: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(Value::String(s)) => parse_bool(s)
            .map(Some)
            .ok_or_else(|| wrong(field, "a boolean", &Value::String(s.clone()))),
        Some(other) => Err(wrong(field, "a boolean", other)),
    }
}

/// An object field; `None` when absent or null.
pub(super) fn opt_object(
    obj: &Map<String, Value>,
    field: &str,
) -> Result<Option<Map<String, Value>>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m.clone())),
        Some(other) => Err(wrong(field, "an object", other)),
    }
}

/// A UUID field; `None` when absent or null.
pub(super) fn opt_uuid(
    obj: &Map<String, Value>,
    field: &str,
) -> Result<Option<uuid::Uuid>, ApiError> {
    match opt_str(obj, field)? {
        None => Ok(None),
        Some(s) => parse_uuid(&s, field).map(Some),
    }
}

/// `s` as a UUID, or 400 naming `field`.
pub(super) fn parse_uuid(s: &str, field: &str) -> Result<uuid::Uuid, ApiError> {
    uuid::Uuid::parse_str(s).map_err(|_| {
        ApiError::bad_request(format!(
            "Invalid value for field \"{field}\": expected a UUID, got {:?}.",
            cut(s)
        ))
    })
}

/// `true`/`false` as Ironic's `strutils.bool_from_string` reads them strictly.
pub(super) fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" | "y" | "t" => Some(true),
        "false" | "0" | "no" | "off" | "n" | "f" => Some(false),
        _ => None,
    }
}

/// At most 64 characters of outside input, for messages.
pub(super) fn cut(s: &str) -> String {
    s.chars().take(64).collect()
}

/// A MAC address in Ironic's canonical form (lower case, colons), or 400.
pub(super) fn mac(s: &str, field: &str) -> Result<String, ApiError> {
    let bad = || {
        ApiError::bad_request(format!(
            "Invalid value for field \"{field}\": expected a MAC address but received {:?}.",
            cut(s)
        ))
    };
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6
        || parts
            .iter()
            .any(|p| p.len() != 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(bad());
    }
    Ok(parts.join(":").to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn macs_are_validated_and_lower_cased() {
        let good = [
            ("AA:BB:CC:DD:EE:FF", "aa:bb:cc:dd:ee:ff"),
            ("52-54-00-12-34-56", "52:54:00:12:34:56"),
            ("52:54:00:12:34:5a", "52:54:00:12:34:5a"),
        ];
        for (input, want) in good {
            assert_eq!(mac(input, "address").as_deref(), Ok(want));
        }
        for bad in [
            "",
            "aa:bb:cc:dd:ee",
            "aa:bb:cc:dd:ee:ff:00",
            "gg:bb:cc:dd:ee:ff",
            "aabbccddeeff",
            "a:bb:cc:dd:ee:fff",
        ] {
            let e = mac(bad, "address").expect_err(bad);
            assert!(e.message.contains("\"address\""), "{e}");
        }
    }

    #[test]
    fn typed_reads_name_the_field() {
        let obj = json!({"driver": 3, "maintenance": "yes", "extra": [], "uuid": "nope"});
        let obj = obj.as_object().expect("object");
        assert!(opt_str(obj, "driver")
            .expect_err("number")
            .message
            .contains("\"driver\""));
        assert_eq!(opt_bool(obj, "maintenance"), Ok(Some(true)));
        assert!(opt_object(obj, "extra")
            .expect_err("list")
            .message
            .contains("\"extra\""));
        assert!(opt_uuid(obj, "uuid")
            .expect_err("bad")
            .message
            .contains("\"uuid\""));
        assert!(req_str(obj, "name")
            .expect_err("missing")
            .message
            .contains("\"name\""));
        let e = refuse_unknown(obj, &["driver", "uuid"], "node").expect_err("unknown");
        assert!(
            e.message.contains("maintenance") && e.message.contains("extra"),
            "{e}"
        );
    }
}
