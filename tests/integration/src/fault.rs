//! Ironic's fault body as the stand-ins answer it and as tests read it back
//! (docs/ironic-protocols.md §5.1): every 4xx and 5xx carries
//! `{"error_message": "<JSON text of {faultcode, faultstring, debuginfo}>"}`, the inner object
//! as a JSON *string* (what python-ironicclient and the ramdisks parse), `faultcode` `Client`
//! for a 4xx and `Server` for a 5xx, `debuginfo` `null`.
//!
//! Written out here rather than taken from the conductor's API, so that a stand-in built on it
//! and the real router can be compared (`tests/standin_parity.rs`) instead of agreeing by
//! construction.

use serde_json::{json, Value};

/// The fault body of `status` with `faultstring`.
pub fn body(status: u16, faultstring: &str) -> Value {
    let faultcode = if status >= 500 { "Server" } else { "Client" };
    let inner = json!({
        "faultcode": faultcode,
        "faultstring": faultstring,
        "debuginfo": null,
    });
    json!({ "error_message": inner.to_string() })
}

/// A fault body read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// `Client` or `Server`.
    pub faultcode: String,
    /// The words.
    pub faultstring: String,
}

/// Reads `body` as a fault; the error names what is not in the shape.
pub fn parse(body: &Value) -> Result<Fault, String> {
    let outer = body
        .as_object()
        .ok_or_else(|| format!("the body is not a JSON object: {body}"))?;
    let keys: Vec<&str> = outer.keys().map(String::as_str).collect();
    if keys != ["error_message"] {
        return Err(format!(
            "the body's keys are {keys:?}, not [\"error_message\"]"
        ));
    }
    let text = outer["error_message"]
        .as_str()
        .ok_or_else(|| format!("error_message is not a string: {body}"))?;
    let inner: Value = serde_json::from_str(text)
        .map_err(|e| format!("error_message is not JSON text ({e}): {text:?}"))?;
    let inner = inner
        .as_object()
        .ok_or_else(|| format!("error_message is not a JSON object: {text}"))?;
    let mut keys: Vec<&str> = inner.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != ["debuginfo", "faultcode", "faultstring"] {
        return Err(format!(
            "error_message's keys are {keys:?}, not debuginfo, faultcode, faultstring"
        ));
    }
    if !inner["debuginfo"].is_null() {
        return Err(format!("debuginfo is not null: {text}"));
    }
    let field = |k: &str| {
        inner[k]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("{k} is not a string: {text}"))
    };
    Ok(Fault {
        faultcode: field("faultcode")?,
        faultstring: field("faultstring")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_reads_back() {
        let fault = parse(&body(403, "no")).expect("the shape");
        assert_eq!(fault.faultcode, "Client");
        assert_eq!(fault.faultstring, "no");
        assert_eq!(
            parse(&body(503, "busy")).expect("shape").faultcode,
            "Server"
        );
        assert!(parse(&json!({"error_message": "plain words"})).is_err());
        assert!(parse(&json!({"error_message": "{\"faultstring\": \"x\"}"})).is_err());
    }
}
