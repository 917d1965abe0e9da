//! RIBCL failures: what can be wrong with a reply body, and how a RESPONSE STATUS/MESSAGE maps
//! to a [`DriverError`] (docs/ilo-management.md §1.3, §1.4).

use crate::drivers::DriverError;

/// Why a RIBCL reply body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RibclParseError {
    /// The body was empty.
    #[error("empty reply body")]
    Empty,
    /// The body is not XML at all (no markup, or text outside any element).
    #[error("reply is not XML (starts {snippet:?})")]
    NotXml {
        /// The first bytes of the body, lossily decoded.
        snippet: String,
    },
    /// The body ended inside an element.
    #[error("reply truncated: the body ended inside <{open}>")]
    Truncated {
        /// The innermost element still open.
        open: String,
    },
    /// A document's root element is not RIBCL.
    #[error("reply has a <{root}> document where <RIBCL> was expected")]
    WrongRoot {
        /// The root element found.
        root: String,
    },
    /// The XML is ill-formed.
    #[error("ill-formed XML at byte {position}: {message}")]
    Malformed {
        /// Byte offset of the error.
        position: u64,
        /// quick-xml's description.
        message: String,
    },
    /// Well-formed RIBCL, but no RESPONSE element anywhere: every real reply has one per stage.
    #[error("reply has no RESPONSE element")]
    NoResponse,
    /// A RESPONSE has no STATUS: the outcome is unknown, so it is not taken for success.
    #[error("RESPONSE without STATUS (MESSAGE {message:?})")]
    MissingStatus {
        /// The RESPONSE's MESSAGE, if any.
        message: String,
    },
    /// A RESPONSE STATUS is not a hex number.
    #[error("RESPONSE STATUS {0:?} is not a hex number")]
    BadStatus(String),
    /// The reply lacks the payload the command returns.
    #[error("reply to {command} lacks {what}")]
    MissingPayload {
        /// The command sent.
        command: String,
        /// The element or attribute missing.
        what: String,
    },
    /// A payload value is not one the protocol defines.
    #[error("reply to {command} has unexpected {what} {value:?}")]
    UnexpectedValue {
        /// The command sent.
        command: String,
        /// The element or attribute.
        what: String,
        /// The value found.
        value: String,
    },
}

/// Messages iLO uses for rejected credentials (proliantutils exception.py, docs/ilo-management.md §1.3).
const LOGIN_FAILED_MESSAGES: [&str; 3] = [
    "user login name was not found",
    "login failed",
    "login credentials rejected",
];

/// STATUS codes for rejected credentials: 0x005F `Login failed.`, 0x000A user not found.
const LOGIN_FAILED_STATUSES: [u32; 2] = [0x005F, 0x000A];

/// 0x003C `Feature not supported - <COMMAND>` (docs/ilo-management.md §1.4).
const FEATURE_NOT_SUPPORTED: u32 = 0x003C;

/// 0x0035 `An invalid Virtual Media option has been given`.
const INVALID_VM_OPTION: u32 = 0x0035;

/// 0x002E: a licence key error (python-hpilo `hpilo.py`, `IloLicenseKeyError`; docs/ilo-management.md §1.4).
const LICENCE_ERROR: u32 = 0x002E;

/// Whether a message says the operation needs a licence. iLO writes "license" (US spelling);
/// the emulator and HPE's guides say e.g. "requires an iLO Advanced license".
fn mentions_licence(lower: &str) -> bool {
    lower.contains("license") || lower.contains("licence")
}

/// Maps a non-zero RESPONSE to the error a caller branches on. `command` is the command sent.
pub fn classify_status(status: u32, message: &str, command: &str) -> DriverError {
    let lower = message.trim().trim_end_matches('.').to_ascii_lowercase();
    if LOGIN_FAILED_STATUSES.contains(&status) || LOGIN_FAILED_MESSAGES.contains(&lower.as_str()) {
        DriverError::LoginFailed {
            message: message.trim().to_string(),
        }
    } else if status == LICENCE_ERROR || mentions_licence(&lower) {
        // Before "feature not supported": an unlicensed feature is reported with that status
        // and a message naming the licence, and the caller must tell it from a missing one.
        DriverError::NotLicensed {
            operation: command.to_string(),
            message: format!("{} (RIBCL status {status:#06x})", message.trim()),
        }
    } else if status == FEATURE_NOT_SUPPORTED
        || lower.contains("feature not supported")
        || lower.contains("syntax error")
    {
        // A command an older iLO does not know is a syntax error to it (docs/ilo-management.md §1.3).
        DriverError::NotSupported {
            operation: command.to_string(),
            message: message.trim().to_string(),
        }
    } else if status == INVALID_VM_OPTION {
        DriverError::InvalidRequest(format!(
            "{command}: {} (RIBCL status {status:#06x})",
            message.trim()
        ))
    } else if lower.contains("busy") || lower.contains("try again") || lower.contains("retry later")
    {
        // No source pins a code for "busy" (docs/ilo-management.md §1.4, §6): the text decides, and the
        // transport retries it.
        DriverError::Busy {
            message: message.trim().to_string(),
        }
    } else {
        DriverError::Bmc {
            code: Some(status),
            message: format!("{command}: {}", message.trim()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_typed_errors() {
        let cases: &[(u32, &str, &str)] = &[
            (0x005F, "Login failed.", "login"),
            (0x000A, "User login name was not found", "login"),
            (0x0001, "Login credentials rejected.", "login"),
            (
                0x003C,
                "Feature not supported - GET_PENDING_BOOT_MODE",
                "unsupported",
            ),
            (
                0x0001,
                "Syntax error: Line #0: syntax error near \"GET_VM_STATUS\"",
                "unsupported",
            ),
            (
                0x0035,
                "An invalid Virtual Media option has been given",
                "vm",
            ),
            (0x0088, "iLO is busy, try again later.", "busy"),
            (0x002E, "License key error.", "licence"),
            (
                0x003C,
                "Feature not supported - this feature requires an iLO Advanced license.",
                "licence",
            ),
            (0x0004, "Password is too short.", "ilo"),
        ];
        for (status, message, want) in cases {
            let got = classify_status(*status, message, "CMD");
            let kind = match got {
                DriverError::LoginFailed { .. } => "login",
                DriverError::NotSupported { .. } => "unsupported",
                DriverError::InvalidRequest(_) => "vm",
                DriverError::Busy { .. } => "busy",
                DriverError::NotLicensed { .. } => "licence",
                DriverError::Bmc { .. } => "ilo",
                _ => "other",
            };
            assert_eq!(kind, *want, "{status:#x} {message}");
        }
    }

    #[test]
    fn generic_error_keeps_code_and_message() {
        let e = classify_status(0x0004, "Password is too short.", "MOD_USER");
        assert_eq!(
            e.to_string(),
            "BMC error 0x0004: MOD_USER: Password is too short."
        );
        assert!(matches!(e, DriverError::Bmc { code: Some(4), .. }));
    }
}
