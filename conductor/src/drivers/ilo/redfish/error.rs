//! Redfish error replies mapped to [`DriverError`] (DSP0266 §9.6 error responses: an `error`
//! object with `message` and `@Message.ExtendedInfo`).

use serde_json::Value;

use crate::drivers::DriverError;

/// The most specific message in an error body: the first ExtendedInfo `Message`, else
/// `error.message`, else the body's start.
pub fn error_message(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let from_json = parsed.as_ref().and_then(|v| {
        let error = v.get("error")?;
        error
            .get("@Message.ExtendedInfo")
            .and_then(Value::as_array)
            .and_then(|infos| {
                infos.iter().find_map(|i| {
                    i.get("Message")
                        .and_then(Value::as_str)
                        .or_else(|| i.get("MessageId").and_then(Value::as_str))
                })
            })
            .or_else(|| error.get("message").and_then(Value::as_str))
            .map(str::to_string)
    });
    from_json.unwrap_or_else(|| {
        let end = body.len().min(120);
        let text = String::from_utf8_lossy(&body[..end]).trim().to_string();
        if text.is_empty() {
            "no details".to_string()
        } else {
            text
        }
    })
}

/// The driver error for an HTTP error status on `method path`.
pub fn status_error(method: &str, path: &str, status: u16, body: &[u8]) -> DriverError {
    let message = error_message(body);
    match status {
        401 => DriverError::LoginFailed {
            message: format!("{method} {path}: {message}"),
        },
        // 405/501: the service lacks the resource or action (sushy-tools' fake BIOS gives 501).
        405 | 501 => DriverError::NotSupported {
            operation: format!("{method} {path}"),
            message,
        },
        _ => DriverError::Redfish {
            method: method.to_string(),
            path: path.to_string(),
            status,
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_come_from_extended_info() {
        let body = br#"{"error":{"code":"iLO.0.10.ExtendedInfo","message":"See @Message.ExtendedInfo","@Message.ExtendedInfo":[{"MessageId":"Base.1.4.PropertyValueNotInList","Message":"The value Foo is not in the list"}]}}"#;
        assert_eq!(error_message(body), "The value Foo is not in the list");
        assert_eq!(error_message(br#"{"error":{"message":"nope"}}"#), "nope");
        assert_eq!(error_message(b"<html>Bad</html>"), "<html>Bad</html>");
        assert_eq!(error_message(b""), "no details");
    }

    #[test]
    fn statuses_map_to_kinds() {
        assert!(matches!(
            status_error("GET", "/x", 401, b""),
            DriverError::LoginFailed { .. }
        ));
        assert!(matches!(
            status_error("GET", "/x", 501, b""),
            DriverError::NotSupported { .. }
        ));
        let e = status_error("POST", "/x", 500, b"");
        assert!(e.is_transient());
        assert!(!status_error("POST", "/x", 400, b"").is_transient());
    }
}
