//! The code tables of RFC 7143: opcodes, login stages and statuses, and the one-byte codes of
//! responses, task management, logout and reject. Values only; the headers that carry them are in
//! `initiator.rs` and `target.rs`.

use super::fields::OPCODE_MASK;
use super::PduError;

/// The iSCSI version this codec speaks (RFC 7143 §11.12.4: 0x00).
pub const ISCSI_VERSION: u8 = 0x00;

/// PDU opcodes (RFC 7143 §11.2.1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// NOP-Out (initiator ping or answer to a NOP-In).
    NopOut = 0x00,
    /// SCSI Command.
    ScsiCommand = 0x01,
    /// SCSI Task Management Function Request.
    TaskMgmtRequest = 0x02,
    /// Login Request.
    LoginRequest = 0x03,
    /// Text Request.
    TextRequest = 0x04,
    /// SCSI Data-Out.
    DataOut = 0x05,
    /// Logout Request.
    LogoutRequest = 0x06,
    /// SNACK Request.
    Snack = 0x10,
    /// NOP-In.
    NopIn = 0x20,
    /// SCSI Response.
    ScsiResponse = 0x21,
    /// SCSI Task Management Function Response.
    TaskMgmtResponse = 0x22,
    /// Login Response.
    LoginResponse = 0x23,
    /// Text Response.
    TextResponse = 0x24,
    /// SCSI Data-In.
    DataIn = 0x25,
    /// Logout Response.
    LogoutResponse = 0x26,
    /// Ready To Transfer.
    R2t = 0x31,
    /// Asynchronous Message.
    AsyncMessage = 0x32,
    /// Reject.
    Reject = 0x3f,
}

impl Opcode {
    /// The opcode of a raw opcode byte (the immediate bit and the reserved bit are ignored).
    pub fn from_byte(byte: u8) -> Result<Opcode, PduError> {
        Ok(match byte & OPCODE_MASK {
            0x00 => Opcode::NopOut,
            0x01 => Opcode::ScsiCommand,
            0x02 => Opcode::TaskMgmtRequest,
            0x03 => Opcode::LoginRequest,
            0x04 => Opcode::TextRequest,
            0x05 => Opcode::DataOut,
            0x06 => Opcode::LogoutRequest,
            0x10 => Opcode::Snack,
            0x20 => Opcode::NopIn,
            0x21 => Opcode::ScsiResponse,
            0x22 => Opcode::TaskMgmtResponse,
            0x23 => Opcode::LoginResponse,
            0x24 => Opcode::TextResponse,
            0x25 => Opcode::DataIn,
            0x26 => Opcode::LogoutResponse,
            0x31 => Opcode::R2t,
            0x32 => Opcode::AsyncMessage,
            0x3f => Opcode::Reject,
            other => return Err(PduError::UnknownOpcode(other)),
        })
    }
}

/// Login stages (RFC 7143 §11.12.3: CSG and NSG).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LoginStage {
    /// Security negotiation (authentication).
    Security = 0,
    /// Login operational negotiation.
    Operational = 1,
    /// Full feature phase.
    FullFeature = 3,
}

impl LoginStage {
    pub(super) fn from_bits(
        bits: u8,
        field: &'static str,
        opcode: Opcode,
    ) -> Result<LoginStage, PduError> {
        match bits & 0x03 {
            0 => Ok(LoginStage::Security),
            1 => Ok(LoginStage::Operational),
            3 => Ok(LoginStage::FullFeature),
            value => Err(PduError::InvalidField {
                opcode,
                field,
                value: u32::from(value),
            }),
        }
    }
}

/// Login response status (RFC 7143 §11.13.5): class in the high byte, detail in the low byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginStatus {
    /// Status-Class: 0 success, 1 redirection, 2 initiator error, 3 target error.
    pub class: u8,
    /// Status-Detail.
    pub detail: u8,
}

impl LoginStatus {
    /// Success.
    pub const SUCCESS: LoginStatus = LoginStatus::new(0x00, 0x00);
    /// The target moved temporarily (TargetAddress says where).
    pub const TARGET_MOVED_TEMPORARILY: LoginStatus = LoginStatus::new(0x01, 0x01);
    /// The target moved permanently.
    pub const TARGET_MOVED_PERMANENTLY: LoginStatus = LoginStatus::new(0x01, 0x02);
    /// Miscellaneous initiator error.
    pub const INITIATOR_ERROR: LoginStatus = LoginStatus::new(0x02, 0x00);
    /// Authentication failed.
    pub const AUTHENTICATION_FAILURE: LoginStatus = LoginStatus::new(0x02, 0x01);
    /// The initiator may not access this target.
    pub const AUTHORIZATION_FAILURE: LoginStatus = LoginStatus::new(0x02, 0x02);
    /// No target of that name.
    pub const NOT_FOUND: LoginStatus = LoginStatus::new(0x02, 0x03);
    /// The target was removed.
    pub const TARGET_REMOVED: LoginStatus = LoginStatus::new(0x02, 0x04);
    /// Unsupported iSCSI version.
    pub const UNSUPPORTED_VERSION: LoginStatus = LoginStatus::new(0x02, 0x05);
    /// Too many connections.
    pub const TOO_MANY_CONNECTIONS: LoginStatus = LoginStatus::new(0x02, 0x06);
    /// A required key is missing.
    pub const MISSING_PARAMETER: LoginStatus = LoginStatus::new(0x02, 0x07);
    /// The connection cannot join this session.
    pub const CANT_INCLUDE_IN_SESSION: LoginStatus = LoginStatus::new(0x02, 0x08);
    /// The session type is not supported.
    pub const SESSION_TYPE_NOT_SUPPORTED: LoginStatus = LoginStatus::new(0x02, 0x09);
    /// The session (TSIH) does not exist.
    pub const SESSION_DOES_NOT_EXIST: LoginStatus = LoginStatus::new(0x02, 0x0a);
    /// A request not allowed during login.
    pub const INVALID_DURING_LOGIN: LoginStatus = LoginStatus::new(0x02, 0x0b);
    /// Target error.
    pub const TARGET_ERROR: LoginStatus = LoginStatus::new(0x03, 0x00);
    /// Service unavailable.
    pub const SERVICE_UNAVAILABLE: LoginStatus = LoginStatus::new(0x03, 0x01);
    /// Out of resources.
    pub const OUT_OF_RESOURCES: LoginStatus = LoginStatus::new(0x03, 0x02);

    /// A status from its two bytes.
    pub const fn new(class: u8, detail: u8) -> LoginStatus {
        LoginStatus { class, detail }
    }

    /// Whether the status is Success.
    pub fn is_success(&self) -> bool {
        self.class == 0
    }

    /// The RFC's words for this status.
    pub fn description(&self) -> &'static str {
        match (self.class, self.detail) {
            (0, _) => "success",
            (1, 1) => "target moved temporarily",
            (1, 2) => "target moved permanently",
            (1, _) => "redirection",
            (2, 1) => "authentication failure",
            (2, 2) => "authorization failure",
            (2, 3) => "target not found",
            (2, 4) => "target removed",
            (2, 5) => "unsupported version",
            (2, 6) => "too many connections",
            (2, 7) => "missing parameter",
            (2, 8) => "can't include in session",
            (2, 9) => "session type not supported",
            (2, 10) => "session does not exist",
            (2, 11) => "invalid request during login",
            (2, _) => "initiator error",
            (3, 1) => "service unavailable",
            (3, 2) => "out of resources",
            (3, _) => "target error",
            _ => "unknown status",
        }
    }
}

impl std::fmt::Display for LoginStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (status {:#04x}{:02x})",
            self.description(),
            self.class,
            self.detail
        )
    }
}

/// SCSI Response `Response` codes (RFC 7143 §11.4.3).
pub mod response_code {
    /// Command completed at target (the SCSI status says how).
    pub const COMPLETED: u8 = 0x00;
    /// Target failure.
    pub const TARGET_FAILURE: u8 = 0x01;
}

/// SCSI status codes carried in SCSI Response and Data-In: SCSI's own table (SAM-5 §5.3), one
/// definition for the codec and the command layer.
pub use crate::iscsi::scsi::status as scsi_status;

/// Task management function codes (RFC 7143 §11.5.1).
pub mod tmf_function {
    /// ABORT TASK.
    pub const ABORT_TASK: u8 = 1;
    /// ABORT TASK SET.
    pub const ABORT_TASK_SET: u8 = 2;
    /// CLEAR ACA.
    pub const CLEAR_ACA: u8 = 3;
    /// CLEAR TASK SET.
    pub const CLEAR_TASK_SET: u8 = 4;
    /// LOGICAL UNIT RESET.
    pub const LOGICAL_UNIT_RESET: u8 = 5;
    /// TARGET WARM RESET.
    pub const TARGET_WARM_RESET: u8 = 6;
    /// TARGET COLD RESET.
    pub const TARGET_COLD_RESET: u8 = 7;
    /// TASK REASSIGN.
    pub const TASK_REASSIGN: u8 = 8;
}

/// Task management response codes (RFC 7143 §11.6.1).
pub mod tmf_response {
    /// Function complete.
    pub const COMPLETE: u8 = 0;
    /// Task does not exist.
    pub const NO_SUCH_TASK: u8 = 1;
    /// LUN does not exist.
    pub const NO_SUCH_LUN: u8 = 2;
    /// Task still allegiant.
    pub const TASK_ALLEGIANT: u8 = 3;
    /// Task allegiance reassignment not supported.
    pub const REASSIGN_NOT_SUPPORTED: u8 = 4;
    /// Task management function not supported.
    pub const NOT_SUPPORTED: u8 = 5;
    /// Function authorization failed.
    pub const AUTHORIZATION_FAILED: u8 = 6;
    /// Function rejected.
    pub const REJECTED: u8 = 255;
}

/// Logout reason codes (RFC 7143 §11.14.1).
pub mod logout_reason {
    /// Close the session.
    pub const CLOSE_SESSION: u8 = 0;
    /// Close this connection.
    pub const CLOSE_CONNECTION: u8 = 1;
    /// Remove the connection for recovery.
    pub const REMOVE_FOR_RECOVERY: u8 = 2;
}

/// Logout response codes (RFC 7143 §11.15.1).
pub mod logout_response {
    /// Connection or session closed successfully.
    pub const SUCCESS: u8 = 0;
    /// CID not found.
    pub const CID_NOT_FOUND: u8 = 1;
    /// Connection recovery is not supported.
    pub const RECOVERY_NOT_SUPPORTED: u8 = 2;
    /// Cleanup failed.
    pub const CLEANUP_FAILED: u8 = 3;
}

/// Reject reason codes (RFC 7143 §11.17.1).
pub mod reject_reason {
    /// Data (payload) digest error.
    pub const DATA_DIGEST_ERROR: u8 = 0x02;
    /// SNACK reject.
    pub const SNACK_REJECT: u8 = 0x03;
    /// Protocol error.
    pub const PROTOCOL_ERROR: u8 = 0x04;
    /// Command not supported.
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x05;
    /// Immediate command rejected: too many immediate commands.
    pub const IMMEDIATE_COMMAND_REJECT: u8 = 0x06;
    /// Task in progress.
    pub const TASK_IN_PROGRESS: u8 = 0x07;
    /// Invalid data ACK.
    pub const INVALID_DATA_ACK: u8 = 0x08;
    /// Invalid PDU field.
    pub const INVALID_PDU_FIELD: u8 = 0x09;
    /// Long operation reject: out of resources.
    pub const LONG_OP_REJECT: u8 = 0x0a;
    /// Deprecated (negotiation reset).
    pub const NEGOTIATION_RESET: u8 = 0x0b;
    /// Waiting for logout.
    pub const WAITING_FOR_LOGOUT: u8 = 0x0c;
}

/// Task attributes of a SCSI command (RFC 7143 §11.3.1, ATTR).
pub mod task_attr {
    /// Untagged.
    pub const UNTAGGED: u8 = 0;
    /// Simple.
    pub const SIMPLE: u8 = 1;
    /// Ordered.
    pub const ORDERED: u8 = 2;
    /// Head of queue.
    pub const HEAD_OF_QUEUE: u8 = 3;
    /// ACA.
    pub const ACA: u8 = 4;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_status_in_words() {
        assert_eq!(
            LoginStatus::AUTHENTICATION_FAILURE.to_string(),
            "authentication failure (status 0x0201)"
        );
        assert!(LoginStatus::SUCCESS.is_success());
        assert!(!LoginStatus::NOT_FOUND.is_success());
    }

    #[test]
    fn opcodes_ignore_the_immediate_bit() {
        assert_eq!(Opcode::from_byte(0x43), Ok(Opcode::LoginRequest));
        assert_eq!(Opcode::from_byte(0x3e), Err(PduError::UnknownOpcode(0x3e)));
    }
}
