//! Redfish error replies mapped to [`DriverError`] (DSP0266 §9.6 error responses: an `error`
//! object with `message` and `@Message.ExtendedInfo`).

use serde_json::Value;

use super::refusals::{refusal_for, Answer};
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

/// The message ids of an error body: `error.@Message.ExtendedInfo[].MessageId`, and iLO 4's
/// legacy `Messages[].MessageID` (capital D) that comes with it without `OData-Version`.
pub fn message_ids(body: &[u8]) -> Vec<String> {
    let Ok(parsed) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    let extended = parsed
        .get("error")
        .and_then(|e| e.get("@Message.ExtendedInfo"))
        .and_then(Value::as_array);
    let legacy = parsed.get("Messages").and_then(Value::as_array);
    extended
        .into_iter()
        .chain(legacy)
        .flatten()
        .filter_map(|i| {
            i.get("MessageId")
                .or_else(|| i.get("MessageID"))
                .and_then(Value::as_str)
        })
        .map(str::to_string)
        .collect()
}

/// The driver error for an HTTP error status on `method path`.
pub fn status_error(method: &str, path: &str, status: u16, body: &[u8]) -> DriverError {
    let message = error_message(body);
    let ids = message_ids(body);
    if let Some((rule, id)) = refusal_for(&ids) {
        let message = format!("{message} (Redfish {id}, HTTP {status})");
        return match rule.answer {
            Answer::NotLicensed => DriverError::NotLicensed {
                operation: format!("{method} {path}"),
                message,
            },
            Answer::WaitAndRetry | Answer::UseBasicAuth => DriverError::Busy {
                message: format!("{method} {path}: {message}"),
            },
        };
    }
    match status {
        401 => DriverError::LoginFailed {
            message: format!("{method} {path}: {message}"),
        },
        // 405/501: the service lacks the resource or action (sushy-tools' fake BIOS gives 501).
        405 | 501 => DriverError::NotSupported {
            operation: format!("{method} {path}"),
            message,
        },
        _ => DriverError::HttpStatus {
            status,
            request: format!("Redfish {method} {path}"),
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
        let licence = br#"{"error":{"code":"iLO.0.10.ExtendedInfo","message":"See @Message.ExtendedInfo","@Message.ExtendedInfo":[{"MessageId":"iLO.2.23.LicenseKeyRequired"}]}}"#;
        let e = status_error("POST", "/x", 400, licence);
        assert_eq!(
            e.kind(),
            crate::drivers::DriverErrorKind::NotLicensed,
            "{e}"
        );
        assert!(e.to_string().contains("LicenseKeyRequired"), "{e}");
        let e = status_error("POST", "/x", 500, b"");
        assert!(e.is_transient());
        assert!(!status_error("POST", "/x", 400, b"").is_transient());
    }
}
