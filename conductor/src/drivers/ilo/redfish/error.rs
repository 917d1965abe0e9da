//! Redfish error replies mapped to [`DriverError`] (DSP0266 §9.6 error responses: an `error`
//! object with `message` and `@Message.ExtendedInfo`).

use serde_json::Value;

use super::refusals::{message_suffix, refusal_for, Answer};
use crate::drivers::DriverError;

/// The most specific message in an error body: each `@Message.ExtendedInfo` entry (but
/// `Success`) as its `Message`, or, as iLO 5 and 6 send them (ids only, no text), as what the
/// id means with its `MessageArgs`; else `error.message`; else the body's start.
pub fn error_message(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let from_json = parsed.as_ref().and_then(|v| {
        let error = v.get("error")?;
        let infos: Vec<String> = error
            .get("@Message.ExtendedInfo")
            .and_then(Value::as_array)
            .map(|infos| infos.iter().filter_map(info_text).collect())
            .unwrap_or_default();
        if infos.is_empty() {
            error
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
        } else {
            Some(infos.join("; "))
        }
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

/// One ExtendedInfo entry as text; `None` for `Success` and an entry with neither text nor id.
fn info_text(info: &Value) -> Option<String> {
    let id = info
        .get("MessageId")
        .or_else(|| info.get("MessageID"))
        .and_then(Value::as_str);
    if id.is_some_and(|id| message_suffix(id) == "Success") {
        return None;
    }
    if let Some(text) = info.get("Message").and_then(Value::as_str) {
        return Some(text.to_string());
    }
    let id = id?;
    let args: Vec<String> = info
        .get("MessageArgs")
        .and_then(Value::as_array)
        .map(|args| {
            args.iter()
                .map(|a| match a {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    let args = if args.is_empty() {
        String::new()
    } else {
        format!(" [{}]", args.join(", "))
    };
    Some(match meaning(message_suffix(id)) {
        Some(meaning) => format!("{meaning} ({id}{args})"),
        None => format!("{id}{args}"),
    })
}

/// What the message ids a deploy meets mean, in our words: iLO 5 and 6 send only the id and
/// its arguments, the text being in registries a client would have to fetch (docs/ilo-quirks.md
/// §10).
fn meaning(suffix: &str) -> Option<&'static str> {
    Some(match suffix {
        "PropertyNotWritableOrUnknown" | "PropertyNotWritable" | "PropertyUnknown" => {
            "the iLO does not take this property"
        }
        "PropertyValueNotInList" => "the iLO does not take this value",
        "PropertyValueTypeError" | "PropertyValueFormatError" => {
            "the value has the wrong type or format"
        }
        "PropertyMissing" | "ActionParameterMissing" => "a required property is missing",
        "UnsupportedOperation" => "this firmware does not support the operation",
        "ActionNotSupported" => "the resource has no such action",
        "ResourceMissingAtURI" => "no such resource",
        "MalformedJSON" => "the body is not valid JSON",
        "InvalidOperationForSystemState" => {
            "the host is changing power state (or already in the state asked)"
        }
        "UnableToModifyDuringSystemPOST" => "the host is in POST",
        "ResetInProgress" => "the iLO is restarting",
        "LicenseKeyRequired" => "the iLO licence does not include this (iLO Advanced needed)",
        "SessionLimitExceeded" => "the iLO's session table is full",
        "NoValidSession" => "not logged in, or the session expired",
        "InsufficientPrivilege" => "the iLO user lacks the privilege",
        "MaxVirtualMediaConnectionEstablished" | "NoScriptedVirtualMediaConnectionAvailable" => {
            "virtual media is in use by another connection"
        }
        "VirtualMediaIsDisabled" => "virtual media is disabled on this iLO",
        "UnableToModifyAfterVirtualMediaInsert" => "the medium is inserted: eject it first",
        "UnsupportedOperationInLegacyBootMode" => "not possible in legacy BIOS boot mode",
        "SystemResetRequired" => "applies at the next reboot",
        _ => return None,
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

    /// iLO 5/6 bodies carry ids and arguments but no text: the message says what they mean,
    /// keeps the id for a search, and skips the Success entry.
    #[test]
    fn id_only_messages_are_described() {
        let body = br#"{"error":{"code":"iLO.0.10.ExtendedInfo","message":"See @Message.ExtendedInfo for more information.","@Message.ExtendedInfo":[{"MessageId":"Base.1.18.Success"},{"MessageArgs":["HttpBootUri"],"MessageId":"iLO.2.34.PropertyNotWritableOrUnknown"}]}}"#;
        assert_eq!(
            error_message(body),
            "the iLO does not take this property (iLO.2.34.PropertyNotWritableOrUnknown [HttpBootUri])"
        );
        let unknown = br#"{"error":{"@Message.ExtendedInfo":[{"MessageId":"iLO.2.15.SomethingNew","MessageArgs":[3,"x"]}]}}"#;
        assert_eq!(error_message(unknown), "iLO.2.15.SomethingNew [3, x]");
        let legacy =
            br#"{"error":{"@Message.ExtendedInfo":[{"MessageID":"Base.0.10.PropertyUnknown"}]}}"#;
        assert!(error_message(legacy).starts_with("the iLO does not take this property"));
        let only_success = br#"{"error":{"message":"fallback","@Message.ExtendedInfo":[{"MessageId":"Base.1.4.Success"}]}}"#;
        assert_eq!(error_message(only_success), "fallback");
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
