//! iSCSI PDUs (RFC 7143 §11): the 48-byte basic header segment (BHS), additional header segments
//! (AHS), the padded data segment and the optional CRC32C digests.
//!
//! # Design
//! A [`Pdu`] is a typed header ([`Bhs`], one variant per opcode), its AHS list and its data
//! segment as [`Bytes`], so a 256 KiB Data-Out can point into the caller's image buffer and a
//! decoded Data-In can point into the receive buffer without a copy. Encoding produces an
//! [`EncodedPdu`] in three parts (header, data, padding + digest) for vectored writes;
//! [`PduDecoder`] frames PDUs out of a growing receive buffer and checks digests.
//!
//! Field offsets are the named `OFF_*` constants below; words at the same offset mean the same
//! thing in every PDU of one direction (CmdSN/ExpStatSN in requests, StatSN/ExpCmdSN/MaxCmdSN in
//! responses, RFC 7143 §11.2.1), which is why the names are shared.
//!
//! # Limitations
//! Reserved bits are written as zero and ignored when read (RFC 7143 §11.2: "reserved fields
//! ... MUST be ignored by the receiver"). Unknown opcodes are an error, as is a login stage of 2.
//! Markers (RFC 3720 Appendix A) are not supported; RFC 7143 removed them.

use bytes::{Buf, Bytes, BytesMut};
use thiserror::Error;

use super::digest::{crc32c, crc32c_append, digest_bytes, Digests, DIGEST_LEN};

/// Length of the basic header segment.
pub const BHS_LEN: usize = 48;
/// Largest data segment the 24-bit DataSegmentLength field can describe.
pub const MAX_DATA_SEGMENT_LEN: usize = (1 << 24) - 1;
/// Largest total AHS length (TotalAHSLength counts 4-byte words in one byte).
pub const MAX_TOTAL_AHS_LEN: usize = 255 * 4;
/// Initiator Task Tag value reserved for PDUs that answer no task (RFC 7143 §11.9, §11.17).
pub const RESERVED_TAG: u32 = 0xffff_ffff;

// Offsets shared by every PDU (RFC 7143 §11.2.1).
const OFF_OPCODE: usize = 0;
const OFF_FLAGS: usize = 1;
const OFF_TOTAL_AHS_LEN: usize = 4;
const OFF_DATA_SEGMENT_LEN: usize = 5;
const OFF_LUN: usize = 8;
const OFF_ITT: usize = 16;
const OFF_TTT: usize = 20;
// Initiator → target sequence numbers.
const OFF_CMDSN: usize = 24;
const OFF_EXP_STATSN: usize = 28;
// Target → initiator sequence numbers.
const OFF_STATSN: usize = 24;
const OFF_EXP_CMDSN: usize = 28;
const OFF_MAX_CMDSN: usize = 32;
// Bytes 2 and 3 of responses.
const OFF_RESPONSE: usize = 2;
const OFF_STATUS: usize = 3;
// SCSI Command (§11.3).
const OFF_EXPECTED_DATA_LEN: usize = 20;
const OFF_CDB: usize = 32;
/// Length of the CDB field in the BHS; longer CDBs continue in an extended-CDB AHS.
pub const BHS_CDB_LEN: usize = 16;
// SCSI Response (§11.4), Data-In/Out (§11.7), R2T (§11.8).
const OFF_SNACK_TAG: usize = 20;
const OFF_DATASN: usize = 36;
const OFF_BUFFER_OFFSET: usize = 40;
const OFF_BIDI_RESIDUAL: usize = 40;
const OFF_RESIDUAL: usize = 44;
const OFF_DESIRED_LEN: usize = 44;
// Task Management (§11.5).
const OFF_REFERENCED_TAG: usize = 20;
const OFF_REF_CMDSN: usize = 32;
const OFF_EXP_DATASN: usize = 36;
// Login (§11.12, §11.13).
const OFF_VERSION_MAX: usize = 2;
const OFF_VERSION_MIN: usize = 3;
const OFF_ISID: usize = 8;
const OFF_TSIH: usize = 14;
const OFF_CID: usize = 20;
const OFF_STATUS_CLASS: usize = 36;
const OFF_STATUS_DETAIL: usize = 37;
// Logout response (§11.15).
const OFF_TIME2WAIT: usize = 40;
const OFF_TIME2RETAIN: usize = 42;
// Async Message (§11.9).
const OFF_ASYNC_EVENT: usize = 36;
const OFF_ASYNC_VCODE: usize = 37;
const OFF_ASYNC_PARAM1: usize = 38;
const OFF_ASYNC_PARAM2: usize = 40;
const OFF_ASYNC_PARAM3: usize = 42;
// SNACK (§11.16).
const OFF_BEGRUN: usize = 40;
const OFF_RUN_LENGTH: usize = 44;

// Flag bits.
const OPCODE_MASK: u8 = 0x3f;
const FLAG_IMMEDIATE: u8 = 0x40;
const FLAG_FINAL: u8 = 0x80;
const FLAG_READ: u8 = 0x40;
const FLAG_WRITE: u8 = 0x20;
const TASK_ATTR_MASK: u8 = 0x07;
const FLAG_CONTINUE: u8 = 0x40;
const FLAG_TRANSIT: u8 = 0x80;
const FLAG_ACK: u8 = 0x40;
const FLAG_BIDI_OVERFLOW: u8 = 0x10;
const FLAG_BIDI_UNDERFLOW: u8 = 0x08;
const FLAG_OVERFLOW: u8 = 0x04;
const FLAG_UNDERFLOW: u8 = 0x02;
const FLAG_STATUS: u8 = 0x01;
const LOW7_MASK: u8 = 0x7f;
const SNACK_TYPE_MASK: u8 = 0x0f;

/// The iSCSI version this codec speaks (RFC 7143 §11.12.4: 0x00).
pub const ISCSI_VERSION: u8 = 0x00;

/// Errors decoding or encoding a PDU.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PduError {
    /// The opcode is not one RFC 7143 defines.
    #[error("unknown iSCSI opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// A field holds a value the RFC does not allow.
    #[error("invalid {field} in {opcode:?} PDU: {value:#x}")]
    InvalidField {
        /// The PDU kind.
        opcode: Opcode,
        /// The field's name.
        field: &'static str,
        /// The value found.
        value: u32,
    },
    /// The data segment is longer than this side accepts (MaxRecvDataSegmentLength).
    #[error("data segment of {len} bytes is over the limit of {limit}")]
    DataSegmentTooLong {
        /// DataSegmentLength of the PDU.
        len: usize,
        /// The receiver's limit.
        limit: usize,
    },
    /// The AHS area is malformed.
    #[error("malformed AHS: {0}")]
    Ahs(&'static str),
    /// The header digest does not match: the stream can no longer be framed.
    #[error("header digest mismatch (received {received:#010x}, computed {computed:#010x})")]
    HeaderDigest {
        /// Digest on the wire.
        received: u32,
        /// Digest of the bytes received.
        computed: u32,
    },
    /// The data digest does not match. The PDU has been consumed; `bhs` is its header, which a
    /// target returns in a Reject (reason [`reject_reason::DATA_DIGEST_ERROR`]).
    #[error("data digest mismatch")]
    DataDigest {
        /// The header of the PDU whose data was damaged.
        bhs: Box<[u8; BHS_LEN]>,
    },
    /// The buffer ends before the PDU does.
    #[error("truncated PDU: {needed} bytes needed, {available} available")]
    Truncated {
        /// Bytes the whole PDU needs.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
}

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

/// A logical unit number in SAM-2 form, as the 8 bytes carried in the BHS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Lun(pub [u8; 8]);

impl Lun {
    /// The 8-byte form of LUN `n`: peripheral addressing below 256, flat space addressing up to
    /// 16383 (SAM-2 §4.9.6, the forms Linux's `int_to_scsilun` produces).
    pub fn from_number(n: u16) -> Lun {
        let mut bytes = [0u8; 8];
        if n < 256 {
            bytes[1] = n as u8;
        } else {
            let n = n & 0x3fff;
            bytes[0] = 0x40 | (n >> 8) as u8;
            bytes[1] = (n & 0xff) as u8;
        }
        Lun(bytes)
    }

    /// The LUN number of a single-level peripheral or flat-space address; `None` for other forms.
    pub fn number(&self) -> Option<u16> {
        if self.0[2..].iter().any(|&b| b != 0) {
            return None;
        }
        match self.0[0] >> 6 {
            0b00 if self.0[0] == 0 => Some(u16::from(self.0[1])),
            0b01 => Some((u16::from(self.0[0] & 0x3f) << 8) | u16::from(self.0[1])),
            _ => None,
        }
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
    fn from_bits(bits: u8, field: &'static str, opcode: Opcode) -> Result<LoginStage, PduError> {
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

/// SCSI status codes carried in SCSI Response and Data-In (SAM-5 §5.3).
pub mod scsi_status {
    /// GOOD.
    pub const GOOD: u8 = 0x00;
    /// CHECK CONDITION: sense data follows.
    pub const CHECK_CONDITION: u8 = 0x02;
    /// CONDITION MET.
    pub const CONDITION_MET: u8 = 0x04;
    /// BUSY.
    pub const BUSY: u8 = 0x08;
    /// RESERVATION CONFLICT.
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    /// TASK SET FULL.
    pub const TASK_SET_FULL: u8 = 0x28;
    /// ACA ACTIVE.
    pub const ACA_ACTIVE: u8 = 0x30;
    /// TASK ABORTED.
    pub const TASK_ABORTED: u8 = 0x40;
}

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

/// NOP-Out (RFC 7143 §11.18).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NopOut {
    /// Immediate delivery (I bit).
    pub immediate: bool,
    /// LUN (meaningful only when answering a NOP-In that carried one).
    pub lun: Lun,
    /// Initiator Task Tag; [`RESERVED_TAG`] when answering a NOP-In.
    pub itt: u32,
    /// Target Transfer Tag copied from the NOP-In this answers, else [`RESERVED_TAG`].
    pub ttt: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

/// SCSI Command (RFC 7143 §11.3).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScsiCommand {
    /// Immediate delivery (I bit).
    pub immediate: bool,
    /// F bit: no unsolicited Data-Out follows this PDU.
    pub final_: bool,
    /// R bit: data is expected from the target.
    pub read: bool,
    /// W bit: data is expected from the initiator.
    pub write: bool,
    /// Task attribute ([`task_attr`]).
    pub task_attr: u8,
    /// Logical unit.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Expected Data Transfer Length.
    pub expected_data_len: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// The first 16 bytes of the CDB (shorter CDBs are padded with zeroes).
    pub cdb: [u8; BHS_CDB_LEN],
}

/// SCSI Task Management Function Request (RFC 7143 §11.5).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskMgmtRequest {
    /// Immediate delivery (I bit).
    pub immediate: bool,
    /// Function ([`tmf_function`]).
    pub function: u8,
    /// Logical unit.
    pub lun: Lun,
    /// Initiator Task Tag of this request.
    pub itt: u32,
    /// Tag of the task to abort (ABORT TASK), else [`RESERVED_TAG`].
    pub referenced_tag: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// RefCmdSN: CmdSN of the referenced task.
    pub ref_cmd_sn: u32,
    /// ExpDataSN (task reassign).
    pub exp_data_sn: u32,
}

/// Login Request (RFC 7143 §11.12). Always immediate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginRequest {
    /// T bit: the initiator is ready to move to `next_stage`.
    pub transit: bool,
    /// C bit: the key=value text continues in the next PDU.
    pub continue_: bool,
    /// Current stage (CSG).
    pub current_stage: LoginStage,
    /// Next stage (NSG), meaningful when `transit` is set.
    pub next_stage: LoginStage,
    /// Version-max.
    pub version_max: u8,
    /// Version-min.
    pub version_min: u8,
    /// Initiator Session ID.
    pub isid: [u8; 6],
    /// Target Session Identifying Handle (0 for a new session).
    pub tsih: u16,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Connection ID.
    pub cid: u16,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

/// Text Request (RFC 7143 §11.10).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TextRequest {
    /// Immediate delivery (I bit).
    pub immediate: bool,
    /// F bit: the last PDU of the request.
    pub final_: bool,
    /// C bit: the text continues in the next PDU.
    pub continue_: bool,
    /// LUN (reserved unless a key needs it).
    pub lun: Lun,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Target Transfer Tag: [`RESERVED_TAG`] to start, else the target's value to continue.
    pub ttt: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

/// SCSI Data-Out (RFC 7143 §11.7).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DataOut {
    /// F bit: the last PDU of this burst (unsolicited burst or R2T).
    pub final_: bool,
    /// Logical unit.
    pub lun: Lun,
    /// Initiator Task Tag of the command.
    pub itt: u32,
    /// Target Transfer Tag from the R2T, or [`RESERVED_TAG`] for unsolicited data.
    pub ttt: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// DataSN within this burst.
    pub data_sn: u32,
    /// Offset of this data within the command's buffer.
    pub buffer_offset: u32,
}

/// Logout Request (RFC 7143 §11.14).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogoutRequest {
    /// Immediate delivery (I bit).
    pub immediate: bool,
    /// Reason ([`logout_reason`]).
    pub reason: u8,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Connection ID to close (reasons 1 and 2).
    pub cid: u16,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

/// SNACK Request (RFC 7143 §11.16); only used with ErrorRecoveryLevel > 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snack {
    /// SNACK type (0 Data/R2T, 1 Status, 2 DataACK, 3 R-Data).
    pub snack_type: u8,
    /// Logical unit.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Target Transfer Tag or SNACK tag.
    pub ttt: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// First missed DataSN, R2TSN or StatSN.
    pub beg_run: u32,
    /// Number of missed PDUs (0: all from beg_run).
    pub run_length: u32,
}

/// NOP-In (RFC 7143 §11.19).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NopIn {
    /// LUN (with a TTT, the LUN the initiator must echo).
    pub lun: Lun,
    /// Initiator Task Tag of the NOP-Out this answers, else [`RESERVED_TAG`].
    pub itt: u32,
    /// Target Transfer Tag: not [`RESERVED_TAG`] when the target wants an answer.
    pub ttt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// SCSI Response (RFC 7143 §11.4).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScsiResponse {
    /// o bit: bidirectional read residual overflow.
    pub bidi_overflow: bool,
    /// u bit: bidirectional read residual underflow.
    pub bidi_underflow: bool,
    /// O bit: residual overflow.
    pub overflow: bool,
    /// U bit: residual underflow.
    pub underflow: bool,
    /// Response ([`response_code`]).
    pub response: u8,
    /// SCSI status ([`scsi_status`]).
    pub status: u8,
    /// Initiator Task Tag.
    pub itt: u32,
    /// SNACK tag.
    pub snack_tag: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// ExpDataSN: number of Data-In PDUs the target sent for this task.
    pub exp_data_sn: u32,
    /// Bidirectional read residual count.
    pub bidi_residual_count: u32,
    /// Residual count.
    pub residual_count: u32,
}

/// SCSI Task Management Function Response (RFC 7143 §11.6).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskMgmtResponse {
    /// Response ([`tmf_response`]).
    pub response: u8,
    /// Initiator Task Tag of the request.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// Login Response (RFC 7143 §11.13).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginResponse {
    /// T bit: the target agrees to move to `next_stage`.
    pub transit: bool,
    /// C bit: the text continues in the next PDU.
    pub continue_: bool,
    /// Current stage (CSG).
    pub current_stage: LoginStage,
    /// Next stage (NSG).
    pub next_stage: LoginStage,
    /// Version-max.
    pub version_max: u8,
    /// Version-active.
    pub version_active: u8,
    /// ISID echoed.
    pub isid: [u8; 6],
    /// TSIH (set by the target on the final response of a leading login).
    pub tsih: u16,
    /// Initiator Task Tag.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Status-Class and Status-Detail.
    pub status: LoginStatus,
}

/// Text Response (RFC 7143 §11.11).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TextResponse {
    /// F bit: the last PDU of the response.
    pub final_: bool,
    /// C bit: the text continues in the next PDU.
    pub continue_: bool,
    /// LUN.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Target Transfer Tag: not [`RESERVED_TAG`] when more is to come.
    pub ttt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// SCSI Data-In (RFC 7143 §11.7).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DataIn {
    /// F bit: the last PDU of the sequence.
    pub final_: bool,
    /// A bit: the target asks for a DataACK SNACK (ERL > 0 only).
    pub acknowledge: bool,
    /// O bit (valid with S): residual overflow.
    pub overflow: bool,
    /// U bit (valid with S): residual underflow.
    pub underflow: bool,
    /// S bit: this PDU carries the command's status; no SCSI Response follows.
    pub has_status: bool,
    /// SCSI status (valid with S).
    pub status: u8,
    /// Logical unit (with the A bit), else reserved.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Target Transfer Tag (with the A bit), else [`RESERVED_TAG`].
    pub ttt: u32,
    /// StatSN (valid with S).
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// DataSN.
    pub data_sn: u32,
    /// Offset of this data within the command's buffer.
    pub buffer_offset: u32,
    /// Residual count (valid with S).
    pub residual_count: u32,
}

/// Ready To Transfer (RFC 7143 §11.8).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct R2t {
    /// Logical unit.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Target Transfer Tag, echoed in the Data-Out PDUs that answer.
    pub ttt: u32,
    /// StatSN (the next StatSN; not advanced by an R2T).
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// R2TSN.
    pub r2t_sn: u32,
    /// Offset of the requested data.
    pub buffer_offset: u32,
    /// Desired Data Transfer Length.
    pub desired_len: u32,
}

/// Asynchronous Message (RFC 7143 §11.9).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AsyncMessage {
    /// Logical unit (for SCSI async events).
    pub lun: Lun,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// AsyncEvent (0 SCSI event, 1 logout request, 2 drop connection, 3 drop session,
    /// 4 renegotiate, 255 vendor).
    pub event: u8,
    /// AsyncVCode.
    pub vcode: u8,
    /// Parameter1.
    pub param1: u16,
    /// Parameter2.
    pub param2: u16,
    /// Parameter3.
    pub param3: u16,
}

/// Logout Response (RFC 7143 §11.15).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogoutResponse {
    /// Response ([`logout_response`]).
    pub response: u8,
    /// Initiator Task Tag.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Time2Wait.
    pub time2wait: u16,
    /// Time2Retain.
    pub time2retain: u16,
}

/// Reject (RFC 7143 §11.17). The data segment is the rejected PDU's header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reject {
    /// Reason ([`reject_reason`]).
    pub reason: u8,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// DataSN/R2TSN (for SNACK rejects).
    pub data_sn: u32,
}

/// A typed basic header segment: one variant per opcode.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // each variant is documented by its struct
pub enum Bhs {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmtRequest(TaskMgmtRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    Snack(Snack),
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskMgmtResponse(TaskMgmtResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    R2t(R2t),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
}

macro_rules! impl_from_for_bhs {
    ($($name:ident),*) => {
        $(impl From<$name> for Bhs {
            fn from(value: $name) -> Bhs {
                Bhs::$name(value)
            }
        })*
    };
}
impl_from_for_bhs!(
    NopOut,
    ScsiCommand,
    TaskMgmtRequest,
    LoginRequest,
    TextRequest,
    DataOut,
    LogoutRequest,
    Snack,
    NopIn,
    ScsiResponse,
    TaskMgmtResponse,
    LoginResponse,
    TextResponse,
    DataIn,
    LogoutResponse,
    R2t,
    AsyncMessage,
    Reject
);

fn get_u16(b: &[u8; BHS_LEN], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

fn get_u32(b: &[u8; BHS_LEN], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn put_u16(b: &mut [u8; BHS_LEN], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}

fn put_u32(b: &mut [u8; BHS_LEN], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

fn get_lun(b: &[u8; BHS_LEN]) -> Lun {
    let mut lun = [0u8; 8];
    lun.copy_from_slice(&b[OFF_LUN..OFF_LUN + 8]);
    Lun(lun)
}

fn put_lun(b: &mut [u8; BHS_LEN], lun: Lun) {
    b[OFF_LUN..OFF_LUN + 8].copy_from_slice(&lun.0);
}

fn flag(b: &[u8; BHS_LEN], bit: u8) -> bool {
    b[OFF_FLAGS] & bit != 0
}

fn bit(set: bool, bit: u8) -> u8 {
    if set {
        bit
    } else {
        0
    }
}

/// DataSegmentLength and TotalAHSLength (in bytes) of a raw BHS.
pub fn segment_lengths(bhs: &[u8; BHS_LEN]) -> (usize, usize) {
    let ahs = usize::from(bhs[OFF_TOTAL_AHS_LEN]) * 4;
    let data = (usize::from(bhs[OFF_DATA_SEGMENT_LEN]) << 16)
        | (usize::from(bhs[OFF_DATA_SEGMENT_LEN + 1]) << 8)
        | usize::from(bhs[OFF_DATA_SEGMENT_LEN + 2]);
    (ahs, data)
}

/// `len` rounded up to a multiple of 4 (RFC 7143 §11.2.3: segments end on word boundaries).
pub fn padded_len(len: usize) -> usize {
    (len + 3) & !3
}

impl Bhs {
    /// The opcode of this header.
    pub fn opcode(&self) -> Opcode {
        match self {
            Bhs::NopOut(_) => Opcode::NopOut,
            Bhs::ScsiCommand(_) => Opcode::ScsiCommand,
            Bhs::TaskMgmtRequest(_) => Opcode::TaskMgmtRequest,
            Bhs::LoginRequest(_) => Opcode::LoginRequest,
            Bhs::TextRequest(_) => Opcode::TextRequest,
            Bhs::DataOut(_) => Opcode::DataOut,
            Bhs::LogoutRequest(_) => Opcode::LogoutRequest,
            Bhs::Snack(_) => Opcode::Snack,
            Bhs::NopIn(_) => Opcode::NopIn,
            Bhs::ScsiResponse(_) => Opcode::ScsiResponse,
            Bhs::TaskMgmtResponse(_) => Opcode::TaskMgmtResponse,
            Bhs::LoginResponse(_) => Opcode::LoginResponse,
            Bhs::TextResponse(_) => Opcode::TextResponse,
            Bhs::DataIn(_) => Opcode::DataIn,
            Bhs::LogoutResponse(_) => Opcode::LogoutResponse,
            Bhs::R2t(_) => Opcode::R2t,
            Bhs::AsyncMessage(_) => Opcode::AsyncMessage,
            Bhs::Reject(_) => Opcode::Reject,
        }
    }

    /// The Initiator Task Tag ([`RESERVED_TAG`] for Async Message and Reject).
    pub fn itt(&self) -> u32 {
        match self {
            Bhs::NopOut(h) => h.itt,
            Bhs::ScsiCommand(h) => h.itt,
            Bhs::TaskMgmtRequest(h) => h.itt,
            Bhs::LoginRequest(h) => h.itt,
            Bhs::TextRequest(h) => h.itt,
            Bhs::DataOut(h) => h.itt,
            Bhs::LogoutRequest(h) => h.itt,
            Bhs::Snack(h) => h.itt,
            Bhs::NopIn(h) => h.itt,
            Bhs::ScsiResponse(h) => h.itt,
            Bhs::TaskMgmtResponse(h) => h.itt,
            Bhs::LoginResponse(h) => h.itt,
            Bhs::TextResponse(h) => h.itt,
            Bhs::DataIn(h) => h.itt,
            Bhs::LogoutResponse(h) => h.itt,
            Bhs::R2t(h) => h.itt,
            Bhs::AsyncMessage(_) | Bhs::Reject(_) => RESERVED_TAG,
        }
    }

    /// The 48 header bytes, with TotalAHSLength `ahs_words` (4-byte words) and DataSegmentLength
    /// `data_len`. The caller guarantees `data_len <= MAX_DATA_SEGMENT_LEN`.
    pub fn encode(&self, ahs_words: u8, data_len: usize) -> [u8; BHS_LEN] {
        let mut b = [0u8; BHS_LEN];
        b[OFF_OPCODE] = self.opcode() as u8;
        b[OFF_TOTAL_AHS_LEN] = ahs_words;
        let len = (data_len.min(MAX_DATA_SEGMENT_LEN) as u32).to_be_bytes();
        b[OFF_DATA_SEGMENT_LEN..OFF_DATA_SEGMENT_LEN + 3].copy_from_slice(&len[1..]);
        match self {
            Bhs::NopOut(h) => {
                b[OFF_OPCODE] |= bit(h.immediate, FLAG_IMMEDIATE);
                b[OFF_FLAGS] = FLAG_FINAL;
                put_lun(&mut b, h.lun);
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_TTT, h.ttt);
                put_u32(&mut b, OFF_CMDSN, h.cmd_sn);
                put_u32(&mut b, OFF_EXP_STATSN, h.exp_stat_sn);
            }
            Bhs::ScsiCommand(h) => {
                b[OFF_OPCODE] |= bit(h.immediate, FLAG_IMMEDIATE);
                b[OFF_FLAGS] = bit(h.final_, FLAG_FINAL)
                    | bit(h.read, FLAG_READ)
                    | bit(h.write, FLAG_WRITE)
                    | (h.task_attr & TASK_ATTR_MASK);
                put_lun(&mut b, h.lun);
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_EXPECTED_DATA_LEN, h.expected_data_len);
                put_u32(&mut b, OFF_CMDSN, h.cmd_sn);
                put_u32(&mut b, OFF_EXP_STATSN, h.exp_stat_sn);
                b[OFF_CDB..OFF_CDB + BHS_CDB_LEN].copy_from_slice(&h.cdb);
            }
            Bhs::TaskMgmtRequest(h) => {
                b[OFF_OPCODE] |= bit(h.immediate, FLAG_IMMEDIATE);
                b[OFF_FLAGS] = FLAG_FINAL | (h.function & LOW7_MASK);
                put_lun(&mut b, h.lun);
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_REFERENCED_TAG, h.referenced_tag);
                put_u32(&mut b, OFF_CMDSN, h.cmd_sn);
                put_u32(&mut b, OFF_EXP_STATSN, h.exp_stat_sn);
                put_u32(&mut b, OFF_REF_CMDSN, h.ref_cmd_sn);
                put_u32(&mut b, OFF_EXP_DATASN, h.exp_data_sn);
            }
            Bhs::LoginRequest(h) => {
                // RFC 7143 §11.12: the I bit is always 1 in a Login Request.
                b[OFF_OPCODE] |= FLAG_IMMEDIATE;
                b[OFF_FLAGS] = bit(h.transit, FLAG_TRANSIT)
                    | bit(h.continue_, FLAG_CONTINUE)
                    | ((h.current_stage as u8) << 2)
                    | h.next_stage as u8;
                b[OFF_VERSION_MAX] = h.version_max;
                b[OFF_VERSION_MIN] = h.version_min;
                b[OFF_ISID..OFF_ISID + 6].copy_from_slice(&h.isid);
                put_u16(&mut b, OFF_TSIH, h.tsih);
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u16(&mut b, OFF_CID, h.cid);
                put_u32(&mut b, OFF_CMDSN, h.cmd_sn);
                put_u32(&mut b, OFF_EXP_STATSN, h.exp_stat_sn);
            }
            Bhs::TextRequest(h) => {
                b[OFF_OPCODE] |= bit(h.immediate, FLAG_IMMEDIATE);
                b[OFF_FLAGS] = bit(h.final_, FLAG_FINAL) | bit(h.continue_, FLAG_CONTINUE);
                put_lun(&mut b, h.lun);
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_TTT, h.ttt);
                put_u32(&mut b, OFF_CMDSN, h.cmd_sn);
                put_u32(&mut b, OFF_EXP_STATSN, h.exp_stat_sn);
            }
            Bhs::DataOut(h) => {
                b[OFF_FLAGS] = bit(h.final_, FLAG_FINAL);
                put_lun(&mut b, h.lun);
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_TTT, h.ttt);
                put_u32(&mut b, OFF_EXP_STATSN, h.exp_stat_sn);
                put_u32(&mut b, OFF_DATASN, h.data_sn);
                put_u32(&mut b, OFF_BUFFER_OFFSET, h.buffer_offset);
            }
            Bhs::LogoutRequest(h) => {
                b[OFF_OPCODE] |= bit(h.immediate, FLAG_IMMEDIATE);
                b[OFF_FLAGS] = FLAG_FINAL | (h.reason & LOW7_MASK);
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u16(&mut b, OFF_CID, h.cid);
                put_u32(&mut b, OFF_CMDSN, h.cmd_sn);
                put_u32(&mut b, OFF_EXP_STATSN, h.exp_stat_sn);
            }
            Bhs::Snack(h) => {
                b[OFF_FLAGS] = FLAG_FINAL | (h.snack_type & SNACK_TYPE_MASK);
                put_lun(&mut b, h.lun);
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_TTT, h.ttt);
                put_u32(&mut b, OFF_EXP_STATSN, h.exp_stat_sn);
                put_u32(&mut b, OFF_BEGRUN, h.beg_run);
                put_u32(&mut b, OFF_RUN_LENGTH, h.run_length);
            }
            Bhs::NopIn(h) => {
                b[OFF_FLAGS] = FLAG_FINAL;
                put_lun(&mut b, h.lun);
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_TTT, h.ttt);
                put_u32(&mut b, OFF_STATSN, h.stat_sn);
                put_u32(&mut b, OFF_EXP_CMDSN, h.exp_cmd_sn);
                put_u32(&mut b, OFF_MAX_CMDSN, h.max_cmd_sn);
            }
            Bhs::ScsiResponse(h) => {
                b[OFF_FLAGS] = FLAG_FINAL
                    | bit(h.bidi_overflow, FLAG_BIDI_OVERFLOW)
                    | bit(h.bidi_underflow, FLAG_BIDI_UNDERFLOW)
                    | bit(h.overflow, FLAG_OVERFLOW)
                    | bit(h.underflow, FLAG_UNDERFLOW);
                b[OFF_RESPONSE] = h.response;
                b[OFF_STATUS] = h.status;
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_SNACK_TAG, h.snack_tag);
                put_u32(&mut b, OFF_STATSN, h.stat_sn);
                put_u32(&mut b, OFF_EXP_CMDSN, h.exp_cmd_sn);
                put_u32(&mut b, OFF_MAX_CMDSN, h.max_cmd_sn);
                put_u32(&mut b, OFF_DATASN, h.exp_data_sn);
                put_u32(&mut b, OFF_BIDI_RESIDUAL, h.bidi_residual_count);
                put_u32(&mut b, OFF_RESIDUAL, h.residual_count);
            }
            Bhs::TaskMgmtResponse(h) => {
                b[OFF_FLAGS] = FLAG_FINAL;
                b[OFF_RESPONSE] = h.response;
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_STATSN, h.stat_sn);
                put_u32(&mut b, OFF_EXP_CMDSN, h.exp_cmd_sn);
                put_u32(&mut b, OFF_MAX_CMDSN, h.max_cmd_sn);
            }
            Bhs::LoginResponse(h) => {
                b[OFF_FLAGS] = bit(h.transit, FLAG_TRANSIT)
                    | bit(h.continue_, FLAG_CONTINUE)
                    | ((h.current_stage as u8) << 2)
                    | h.next_stage as u8;
                b[OFF_VERSION_MAX] = h.version_max;
                b[OFF_VERSION_MIN] = h.version_active;
                b[OFF_ISID..OFF_ISID + 6].copy_from_slice(&h.isid);
                put_u16(&mut b, OFF_TSIH, h.tsih);
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_STATSN, h.stat_sn);
                put_u32(&mut b, OFF_EXP_CMDSN, h.exp_cmd_sn);
                put_u32(&mut b, OFF_MAX_CMDSN, h.max_cmd_sn);
                b[OFF_STATUS_CLASS] = h.status.class;
                b[OFF_STATUS_DETAIL] = h.status.detail;
            }
            Bhs::TextResponse(h) => {
                b[OFF_FLAGS] = bit(h.final_, FLAG_FINAL) | bit(h.continue_, FLAG_CONTINUE);
                put_lun(&mut b, h.lun);
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_TTT, h.ttt);
                put_u32(&mut b, OFF_STATSN, h.stat_sn);
                put_u32(&mut b, OFF_EXP_CMDSN, h.exp_cmd_sn);
                put_u32(&mut b, OFF_MAX_CMDSN, h.max_cmd_sn);
            }
            Bhs::DataIn(h) => {
                b[OFF_FLAGS] = bit(h.final_, FLAG_FINAL)
                    | bit(h.acknowledge, FLAG_ACK)
                    | bit(h.overflow, FLAG_OVERFLOW)
                    | bit(h.underflow, FLAG_UNDERFLOW)
                    | bit(h.has_status, FLAG_STATUS);
                b[OFF_STATUS] = h.status;
                put_lun(&mut b, h.lun);
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_TTT, h.ttt);
                put_u32(&mut b, OFF_STATSN, h.stat_sn);
                put_u32(&mut b, OFF_EXP_CMDSN, h.exp_cmd_sn);
                put_u32(&mut b, OFF_MAX_CMDSN, h.max_cmd_sn);
                put_u32(&mut b, OFF_DATASN, h.data_sn);
                put_u32(&mut b, OFF_BUFFER_OFFSET, h.buffer_offset);
                put_u32(&mut b, OFF_RESIDUAL, h.residual_count);
            }
            Bhs::LogoutResponse(h) => {
                b[OFF_FLAGS] = FLAG_FINAL;
                b[OFF_RESPONSE] = h.response;
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_STATSN, h.stat_sn);
                put_u32(&mut b, OFF_EXP_CMDSN, h.exp_cmd_sn);
                put_u32(&mut b, OFF_MAX_CMDSN, h.max_cmd_sn);
                put_u16(&mut b, OFF_TIME2WAIT, h.time2wait);
                put_u16(&mut b, OFF_TIME2RETAIN, h.time2retain);
            }
            Bhs::R2t(h) => {
                b[OFF_FLAGS] = FLAG_FINAL;
                put_lun(&mut b, h.lun);
                put_u32(&mut b, OFF_ITT, h.itt);
                put_u32(&mut b, OFF_TTT, h.ttt);
                put_u32(&mut b, OFF_STATSN, h.stat_sn);
                put_u32(&mut b, OFF_EXP_CMDSN, h.exp_cmd_sn);
                put_u32(&mut b, OFF_MAX_CMDSN, h.max_cmd_sn);
                put_u32(&mut b, OFF_DATASN, h.r2t_sn);
                put_u32(&mut b, OFF_BUFFER_OFFSET, h.buffer_offset);
                put_u32(&mut b, OFF_DESIRED_LEN, h.desired_len);
            }
            Bhs::AsyncMessage(h) => {
                b[OFF_FLAGS] = FLAG_FINAL;
                put_lun(&mut b, h.lun);
                put_u32(&mut b, OFF_ITT, RESERVED_TAG);
                put_u32(&mut b, OFF_STATSN, h.stat_sn);
                put_u32(&mut b, OFF_EXP_CMDSN, h.exp_cmd_sn);
                put_u32(&mut b, OFF_MAX_CMDSN, h.max_cmd_sn);
                b[OFF_ASYNC_EVENT] = h.event;
                b[OFF_ASYNC_VCODE] = h.vcode;
                put_u16(&mut b, OFF_ASYNC_PARAM1, h.param1);
                put_u16(&mut b, OFF_ASYNC_PARAM2, h.param2);
                put_u16(&mut b, OFF_ASYNC_PARAM3, h.param3);
            }
            Bhs::Reject(h) => {
                b[OFF_FLAGS] = FLAG_FINAL;
                b[OFF_RESPONSE] = h.reason;
                put_u32(&mut b, OFF_ITT, RESERVED_TAG);
                put_u32(&mut b, OFF_STATSN, h.stat_sn);
                put_u32(&mut b, OFF_EXP_CMDSN, h.exp_cmd_sn);
                put_u32(&mut b, OFF_MAX_CMDSN, h.max_cmd_sn);
                put_u32(&mut b, OFF_DATASN, h.data_sn);
            }
        }
        b
    }

    /// Decodes a raw header. The lengths it carries are read with [`segment_lengths`].
    pub fn decode(b: &[u8; BHS_LEN]) -> Result<Bhs, PduError> {
        let opcode = Opcode::from_byte(b[OFF_OPCODE])?;
        let immediate = b[OFF_OPCODE] & FLAG_IMMEDIATE != 0;
        let flags = b[OFF_FLAGS];
        Ok(match opcode {
            Opcode::NopOut => Bhs::NopOut(NopOut {
                immediate,
                lun: get_lun(b),
                itt: get_u32(b, OFF_ITT),
                ttt: get_u32(b, OFF_TTT),
                cmd_sn: get_u32(b, OFF_CMDSN),
                exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
            }),
            Opcode::ScsiCommand => {
                let mut cdb = [0u8; BHS_CDB_LEN];
                cdb.copy_from_slice(&b[OFF_CDB..OFF_CDB + BHS_CDB_LEN]);
                Bhs::ScsiCommand(ScsiCommand {
                    immediate,
                    final_: flag(b, FLAG_FINAL),
                    read: flag(b, FLAG_READ),
                    write: flag(b, FLAG_WRITE),
                    task_attr: flags & TASK_ATTR_MASK,
                    lun: get_lun(b),
                    itt: get_u32(b, OFF_ITT),
                    expected_data_len: get_u32(b, OFF_EXPECTED_DATA_LEN),
                    cmd_sn: get_u32(b, OFF_CMDSN),
                    exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
                    cdb,
                })
            }
            Opcode::TaskMgmtRequest => Bhs::TaskMgmtRequest(TaskMgmtRequest {
                immediate,
                function: flags & LOW7_MASK,
                lun: get_lun(b),
                itt: get_u32(b, OFF_ITT),
                referenced_tag: get_u32(b, OFF_REFERENCED_TAG),
                cmd_sn: get_u32(b, OFF_CMDSN),
                exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
                ref_cmd_sn: get_u32(b, OFF_REF_CMDSN),
                exp_data_sn: get_u32(b, OFF_EXP_DATASN),
            }),
            Opcode::LoginRequest => {
                let mut isid = [0u8; 6];
                isid.copy_from_slice(&b[OFF_ISID..OFF_ISID + 6]);
                Bhs::LoginRequest(LoginRequest {
                    transit: flag(b, FLAG_TRANSIT),
                    continue_: flag(b, FLAG_CONTINUE),
                    current_stage: LoginStage::from_bits(flags >> 2, "CSG", opcode)?,
                    next_stage: LoginStage::from_bits(flags, "NSG", opcode)?,
                    version_max: b[OFF_VERSION_MAX],
                    version_min: b[OFF_VERSION_MIN],
                    isid,
                    tsih: get_u16(b, OFF_TSIH),
                    itt: get_u32(b, OFF_ITT),
                    cid: get_u16(b, OFF_CID),
                    cmd_sn: get_u32(b, OFF_CMDSN),
                    exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
                })
            }
            Opcode::TextRequest => Bhs::TextRequest(TextRequest {
                immediate,
                final_: flag(b, FLAG_FINAL),
                continue_: flag(b, FLAG_CONTINUE),
                lun: get_lun(b),
                itt: get_u32(b, OFF_ITT),
                ttt: get_u32(b, OFF_TTT),
                cmd_sn: get_u32(b, OFF_CMDSN),
                exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
            }),
            Opcode::DataOut => Bhs::DataOut(DataOut {
                final_: flag(b, FLAG_FINAL),
                lun: get_lun(b),
                itt: get_u32(b, OFF_ITT),
                ttt: get_u32(b, OFF_TTT),
                exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
                data_sn: get_u32(b, OFF_DATASN),
                buffer_offset: get_u32(b, OFF_BUFFER_OFFSET),
            }),
            Opcode::LogoutRequest => Bhs::LogoutRequest(LogoutRequest {
                immediate,
                reason: flags & LOW7_MASK,
                itt: get_u32(b, OFF_ITT),
                cid: get_u16(b, OFF_CID),
                cmd_sn: get_u32(b, OFF_CMDSN),
                exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
            }),
            Opcode::Snack => Bhs::Snack(Snack {
                snack_type: flags & SNACK_TYPE_MASK,
                lun: get_lun(b),
                itt: get_u32(b, OFF_ITT),
                ttt: get_u32(b, OFF_TTT),
                exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
                beg_run: get_u32(b, OFF_BEGRUN),
                run_length: get_u32(b, OFF_RUN_LENGTH),
            }),
            Opcode::NopIn => Bhs::NopIn(NopIn {
                lun: get_lun(b),
                itt: get_u32(b, OFF_ITT),
                ttt: get_u32(b, OFF_TTT),
                stat_sn: get_u32(b, OFF_STATSN),
                exp_cmd_sn: get_u32(b, OFF_EXP_CMDSN),
                max_cmd_sn: get_u32(b, OFF_MAX_CMDSN),
            }),
            Opcode::ScsiResponse => Bhs::ScsiResponse(ScsiResponse {
                bidi_overflow: flag(b, FLAG_BIDI_OVERFLOW),
                bidi_underflow: flag(b, FLAG_BIDI_UNDERFLOW),
                overflow: flag(b, FLAG_OVERFLOW),
                underflow: flag(b, FLAG_UNDERFLOW),
                response: b[OFF_RESPONSE],
                status: b[OFF_STATUS],
                itt: get_u32(b, OFF_ITT),
                snack_tag: get_u32(b, OFF_SNACK_TAG),
                stat_sn: get_u32(b, OFF_STATSN),
                exp_cmd_sn: get_u32(b, OFF_EXP_CMDSN),
                max_cmd_sn: get_u32(b, OFF_MAX_CMDSN),
                exp_data_sn: get_u32(b, OFF_DATASN),
                bidi_residual_count: get_u32(b, OFF_BIDI_RESIDUAL),
                residual_count: get_u32(b, OFF_RESIDUAL),
            }),
            Opcode::TaskMgmtResponse => Bhs::TaskMgmtResponse(TaskMgmtResponse {
                response: b[OFF_RESPONSE],
                itt: get_u32(b, OFF_ITT),
                stat_sn: get_u32(b, OFF_STATSN),
                exp_cmd_sn: get_u32(b, OFF_EXP_CMDSN),
                max_cmd_sn: get_u32(b, OFF_MAX_CMDSN),
            }),
            Opcode::LoginResponse => {
                let mut isid = [0u8; 6];
                isid.copy_from_slice(&b[OFF_ISID..OFF_ISID + 6]);
                Bhs::LoginResponse(LoginResponse {
                    transit: flag(b, FLAG_TRANSIT),
                    continue_: flag(b, FLAG_CONTINUE),
                    current_stage: LoginStage::from_bits(flags >> 2, "CSG", opcode)?,
                    next_stage: LoginStage::from_bits(flags, "NSG", opcode)?,
                    version_max: b[OFF_VERSION_MAX],
                    version_active: b[OFF_VERSION_MIN],
                    isid,
                    tsih: get_u16(b, OFF_TSIH),
                    itt: get_u32(b, OFF_ITT),
                    stat_sn: get_u32(b, OFF_STATSN),
                    exp_cmd_sn: get_u32(b, OFF_EXP_CMDSN),
                    max_cmd_sn: get_u32(b, OFF_MAX_CMDSN),
                    status: LoginStatus::new(b[OFF_STATUS_CLASS], b[OFF_STATUS_DETAIL]),
                })
            }
            Opcode::TextResponse => Bhs::TextResponse(TextResponse {
                final_: flag(b, FLAG_FINAL),
                continue_: flag(b, FLAG_CONTINUE),
                lun: get_lun(b),
                itt: get_u32(b, OFF_ITT),
                ttt: get_u32(b, OFF_TTT),
                stat_sn: get_u32(b, OFF_STATSN),
                exp_cmd_sn: get_u32(b, OFF_EXP_CMDSN),
                max_cmd_sn: get_u32(b, OFF_MAX_CMDSN),
            }),
            Opcode::DataIn => Bhs::DataIn(DataIn {
                final_: flag(b, FLAG_FINAL),
                acknowledge: flag(b, FLAG_ACK),
                overflow: flag(b, FLAG_OVERFLOW),
                underflow: flag(b, FLAG_UNDERFLOW),
                has_status: flag(b, FLAG_STATUS),
                status: b[OFF_STATUS],
                lun: get_lun(b),
                itt: get_u32(b, OFF_ITT),
                ttt: get_u32(b, OFF_TTT),
                stat_sn: get_u32(b, OFF_STATSN),
                exp_cmd_sn: get_u32(b, OFF_EXP_CMDSN),
                max_cmd_sn: get_u32(b, OFF_MAX_CMDSN),
                data_sn: get_u32(b, OFF_DATASN),
                buffer_offset: get_u32(b, OFF_BUFFER_OFFSET),
                residual_count: get_u32(b, OFF_RESIDUAL),
            }),
            Opcode::LogoutResponse => Bhs::LogoutResponse(LogoutResponse {
                response: b[OFF_RESPONSE],
                itt: get_u32(b, OFF_ITT),
                stat_sn: get_u32(b, OFF_STATSN),
                exp_cmd_sn: get_u32(b, OFF_EXP_CMDSN),
                max_cmd_sn: get_u32(b, OFF_MAX_CMDSN),
                time2wait: get_u16(b, OFF_TIME2WAIT),
                time2retain: get_u16(b, OFF_TIME2RETAIN),
            }),
            Opcode::R2t => Bhs::R2t(R2t {
                lun: get_lun(b),
                itt: get_u32(b, OFF_ITT),
                ttt: get_u32(b, OFF_TTT),
                stat_sn: get_u32(b, OFF_STATSN),
                exp_cmd_sn: get_u32(b, OFF_EXP_CMDSN),
                max_cmd_sn: get_u32(b, OFF_MAX_CMDSN),
                r2t_sn: get_u32(b, OFF_DATASN),
                buffer_offset: get_u32(b, OFF_BUFFER_OFFSET),
                desired_len: get_u32(b, OFF_DESIRED_LEN),
            }),
            Opcode::AsyncMessage => Bhs::AsyncMessage(AsyncMessage {
                lun: get_lun(b),
                stat_sn: get_u32(b, OFF_STATSN),
                exp_cmd_sn: get_u32(b, OFF_EXP_CMDSN),
                max_cmd_sn: get_u32(b, OFF_MAX_CMDSN),
                event: b[OFF_ASYNC_EVENT],
                vcode: b[OFF_ASYNC_VCODE],
                param1: get_u16(b, OFF_ASYNC_PARAM1),
                param2: get_u16(b, OFF_ASYNC_PARAM2),
                param3: get_u16(b, OFF_ASYNC_PARAM3),
            }),
            Opcode::Reject => Bhs::Reject(Reject {
                reason: b[OFF_RESPONSE],
                stat_sn: get_u32(b, OFF_STATSN),
                exp_cmd_sn: get_u32(b, OFF_EXP_CMDSN),
                max_cmd_sn: get_u32(b, OFF_MAX_CMDSN),
                data_sn: get_u32(b, OFF_DATASN),
            }),
        })
    }
}

/// AHS types (RFC 7143 §11.2.2.1).
pub mod ahs_type {
    /// Extended CDB: the bytes of a CDB beyond the first 16.
    pub const EXTENDED_CDB: u8 = 1;
    /// Bidirectional Read Expected Data Transfer Length.
    pub const BIDI_READ_LENGTH: u8 = 2;
}

/// One additional header segment (RFC 7143 §11.2.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ahs {
    /// AHSType.
    pub ahs_type: u8,
    /// AHS-Specific bytes (AHSLength of them), starting with the byte after AHSType.
    pub specific: Vec<u8>,
}

impl Ahs {
    /// An extended-CDB AHS holding `cdb[16..]` (RFC 7143 §11.2.2.3: one reserved byte, then the
    /// rest of the CDB).
    pub fn extended_cdb(rest_of_cdb: &[u8]) -> Ahs {
        let mut specific = Vec::with_capacity(rest_of_cdb.len() + 1);
        specific.push(0);
        specific.extend_from_slice(rest_of_cdb);
        Ahs {
            ahs_type: ahs_type::EXTENDED_CDB,
            specific,
        }
    }

    /// A Bidirectional Read Expected Data Transfer Length AHS (RFC 7143 §11.2.2.4).
    pub fn bidi_read_length(len: u32) -> Ahs {
        let mut specific = vec![0u8];
        specific.extend_from_slice(&len.to_be_bytes());
        Ahs {
            ahs_type: ahs_type::BIDI_READ_LENGTH,
            specific,
        }
    }

    /// Bytes this AHS takes on the wire, padding included.
    pub fn wire_len(&self) -> usize {
        padded_len(3 + self.specific.len())
    }
}

/// A whole PDU: typed header, AHS list and data segment (unpadded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pdu {
    /// The basic header segment.
    pub bhs: Bhs,
    /// Additional header segments.
    pub ahs: Vec<Ahs>,
    /// The data segment, without padding.
    pub data: Bytes,
}

/// An encoded PDU in three parts, ready for a vectored write: `head` is the BHS, the AHS and the
/// header digest; `data` the data segment; `tail` its padding and data digest.
#[derive(Clone, Debug)]
pub struct EncodedPdu {
    /// BHS + AHS + header digest.
    pub head: Vec<u8>,
    /// The data segment as given (no copy).
    pub data: Bytes,
    tail: [u8; 3 + DIGEST_LEN],
    tail_len: usize,
}

impl EncodedPdu {
    /// Padding and data digest.
    pub fn tail(&self) -> &[u8] {
        &self.tail[..self.tail_len]
    }

    /// Total bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.data.len() + self.tail_len
    }

    /// Whether the PDU is empty (never: a BHS is always there).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The wire bytes in one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        out.extend_from_slice(&self.head);
        out.extend_from_slice(&self.data);
        out.extend_from_slice(self.tail());
        out
    }
}

impl Pdu {
    /// A PDU with no AHS and no data.
    pub fn new(bhs: impl Into<Bhs>) -> Pdu {
        Pdu {
            bhs: bhs.into(),
            ahs: Vec::new(),
            data: Bytes::new(),
        }
    }

    /// A PDU with a data segment.
    pub fn with_data(bhs: impl Into<Bhs>, data: impl Into<Bytes>) -> Pdu {
        Pdu {
            bhs: bhs.into(),
            ahs: Vec::new(),
            data: data.into(),
        }
    }

    /// Encodes into head, data and tail parts.
    pub fn encode_parts(&self, digests: Digests) -> Result<EncodedPdu, PduError> {
        if self.data.len() > MAX_DATA_SEGMENT_LEN {
            return Err(PduError::DataSegmentTooLong {
                len: self.data.len(),
                limit: MAX_DATA_SEGMENT_LEN,
            });
        }
        let ahs_len: usize = self.ahs.iter().map(Ahs::wire_len).sum();
        if ahs_len > MAX_TOTAL_AHS_LEN || self.ahs.iter().any(|a| a.specific.len() > 0xffff) {
            return Err(PduError::Ahs("longer than TotalAHSLength can describe"));
        }
        let mut head = Vec::with_capacity(BHS_LEN + ahs_len + DIGEST_LEN);
        head.extend_from_slice(&self.bhs.encode((ahs_len / 4) as u8, self.data.len()));
        for ahs in &self.ahs {
            let start = head.len();
            head.extend_from_slice(&(ahs.specific.len() as u16).to_be_bytes());
            head.push(ahs.ahs_type);
            head.extend_from_slice(&ahs.specific);
            head.resize(start + ahs.wire_len(), 0);
        }
        if digests.header {
            let crc = crc32c(&head);
            head.extend_from_slice(&digest_bytes(crc));
        }
        let mut tail = [0u8; 3 + DIGEST_LEN];
        let pad = padded_len(self.data.len()) - self.data.len();
        let mut tail_len = pad;
        if digests.data && !self.data.is_empty() {
            let crc = crc32c_append(crc32c(&self.data), &tail[..pad]);
            tail[pad..pad + DIGEST_LEN].copy_from_slice(&digest_bytes(crc));
            tail_len += DIGEST_LEN;
        }
        Ok(EncodedPdu {
            head,
            data: self.data.clone(),
            tail,
            tail_len,
        })
    }

    /// Encodes into one buffer.
    pub fn encode(&self, digests: Digests) -> Result<Vec<u8>, PduError> {
        Ok(self.encode_parts(digests)?.to_vec())
    }

    /// Decodes one PDU from the start of `buf`, returning it and the bytes it took. A data
    /// segment over `max_data_segment_len` is an error before anything else is read.
    pub fn decode(
        buf: &[u8],
        digests: Digests,
        max_data_segment_len: usize,
    ) -> Result<(Pdu, usize), PduError> {
        let decoder = PduDecoder {
            digests,
            max_data_segment_len,
        };
        let mut bytes = BytesMut::from(buf);
        let total = decoder.frame_len(&bytes)?;
        match total {
            Some(total) if total <= bytes.len() => {}
            Some(total) => {
                return Err(PduError::Truncated {
                    needed: total,
                    available: buf.len(),
                })
            }
            None => {
                return Err(PduError::Truncated {
                    needed: BHS_LEN,
                    available: buf.len(),
                })
            }
        }
        let before = bytes.len();
        let pdu = decoder
            .decode(&mut bytes)?
            .expect("the whole frame is in the buffer: checked above");
        Ok((pdu, before - bytes.len()))
    }
}

/// Frames PDUs out of a receive buffer.
#[derive(Clone, Copy, Debug)]
pub struct PduDecoder {
    /// Digests in use on this connection.
    pub digests: Digests,
    /// Longest data segment accepted (this side's MaxRecvDataSegmentLength; during login
    /// 8192, RFC 7143 §13.12).
    pub max_data_segment_len: usize,
}

impl PduDecoder {
    /// A decoder with the given digests and data segment limit.
    pub fn new(digests: Digests, max_data_segment_len: usize) -> PduDecoder {
        PduDecoder {
            digests,
            max_data_segment_len,
        }
    }

    /// Total wire length of the PDU starting at `buf`, or `None` when fewer than 48 bytes are
    /// there. Errors when the header announces more data than allowed.
    pub fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, PduError> {
        let Some(bhs) = buf.get(..BHS_LEN) else {
            return Ok(None);
        };
        let bhs: &[u8; BHS_LEN] = bhs.try_into().expect("slice of BHS_LEN bytes");
        let (ahs_len, data_len) = segment_lengths(bhs);
        if data_len > self.max_data_segment_len {
            return Err(PduError::DataSegmentTooLong {
                len: data_len,
                limit: self.max_data_segment_len,
            });
        }
        let mut total = BHS_LEN + ahs_len + padded_len(data_len);
        if self.digests.header {
            total += DIGEST_LEN;
        }
        if self.digests.data && data_len > 0 {
            total += DIGEST_LEN;
        }
        Ok(Some(total))
    }

    /// Takes one PDU off the front of `buf` when it is all there; `Ok(None)` when more bytes are
    /// needed (nothing is consumed then). The data segment shares `buf`'s allocation.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Pdu>, PduError> {
        let Some(total) = self.frame_len(buf)? else {
            return Ok(None);
        };
        if buf.len() < total {
            return Ok(None);
        }
        let mut frame = buf.split_to(total);
        let mut bhs_bytes = [0u8; BHS_LEN];
        bhs_bytes.copy_from_slice(&frame[..BHS_LEN]);
        let (ahs_len, data_len) = segment_lengths(&bhs_bytes);
        if self.digests.header {
            let header_end = BHS_LEN + ahs_len;
            let computed = crc32c(&frame[..header_end]);
            let mut wire = [0u8; DIGEST_LEN];
            wire.copy_from_slice(&frame[header_end..header_end + DIGEST_LEN]);
            let received = u32::from_le_bytes(wire);
            if computed != received {
                return Err(PduError::HeaderDigest { received, computed });
            }
        }
        let bhs = Bhs::decode(&bhs_bytes)?;
        let ahs = parse_ahs(&frame[BHS_LEN..BHS_LEN + ahs_len])?;
        frame.advance(BHS_LEN + ahs_len + if self.digests.header { DIGEST_LEN } else { 0 });
        if self.digests.data && data_len > 0 {
            let padded = padded_len(data_len);
            let computed = crc32c(&frame[..padded]);
            let mut wire = [0u8; DIGEST_LEN];
            wire.copy_from_slice(&frame[padded..padded + DIGEST_LEN]);
            if computed != u32::from_le_bytes(wire) {
                return Err(PduError::DataDigest {
                    bhs: Box::new(bhs_bytes),
                });
            }
        }
        frame.truncate(data_len);
        Ok(Some(Pdu {
            bhs,
            ahs,
            data: frame.freeze(),
        }))
    }
}

fn parse_ahs(mut area: &[u8]) -> Result<Vec<Ahs>, PduError> {
    let mut list = Vec::new();
    while !area.is_empty() {
        if area.len() < 4 {
            return Err(PduError::Ahs("AHS header cut short"));
        }
        let len = usize::from(u16::from_be_bytes([area[0], area[1]]));
        let wire = padded_len(3 + len);
        if wire > area.len() {
            return Err(PduError::Ahs("AHSLength runs past TotalAHSLength"));
        }
        list.push(Ahs {
            ahs_type: area[2],
            specific: area[3..3 + len].to_vec(),
        });
        area = &area[wire..];
    }
    Ok(list)
}

/// The data segment of a SCSI Response carrying sense data: SenseLength (2 bytes) then the sense
/// bytes (RFC 7143 §11.4.7.2).
pub fn sense_segment(sense: &[u8]) -> Vec<u8> {
    let len = sense.len().min(usize::from(u16::MAX));
    let mut out = Vec::with_capacity(2 + len);
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(&sense[..len]);
    out
}

/// The sense bytes in a SCSI Response's data segment; empty when there is none. A SenseLength
/// beyond the segment is cut to what is there.
pub fn sense_from_segment(data: &[u8]) -> &[u8] {
    if data.len() < 2 {
        return &[];
    }
    let len = usize::from(u16::from_be_bytes([data[0], data[1]]));
    &data[2..data.len().min(2 + len)]
}

/// `a < b` in serial number arithmetic (RFC 1982, as RFC 7143 §4.2.2.1 requires for CmdSN and
/// StatSN comparisons).
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && (b.wrapping_sub(a) as i32) > 0
}

/// `a <= b` in serial number arithmetic.
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login_request() -> LoginRequest {
        LoginRequest {
            transit: true,
            continue_: false,
            current_stage: LoginStage::Operational,
            next_stage: LoginStage::FullFeature,
            version_max: 0,
            version_min: 0,
            isid: [0x80, 0x12, 0x34, 0x56, 0x78, 0x9a],
            tsih: 0,
            itt: 7,
            cid: 1,
            cmd_sn: 42,
            exp_stat_sn: 3,
        }
    }

    #[test]
    fn login_request_layout() {
        let pdu = Pdu::with_data(login_request(), &b"InitiatorName=iqn.x\0"[..]);
        let wire = pdu.encode(Digests::NONE).expect("encodes");
        assert_eq!(wire.len(), 48 + 20);
        assert_eq!(wire[0], 0x43, "opcode 0x03 with the I bit");
        assert_eq!(wire[1], 0x80 | (1 << 2) | 3, "T, CSG=1, NSG=3");
        assert_eq!(&wire[5..8], &[0, 0, 20]);
        assert_eq!(&wire[8..14], &[0x80, 0x12, 0x34, 0x56, 0x78, 0x9a]);
        assert_eq!(&wire[16..20], &7u32.to_be_bytes());
        assert_eq!(&wire[20..22], &1u16.to_be_bytes());
        assert_eq!(&wire[24..28], &42u32.to_be_bytes());
        let (back, used) = Pdu::decode(&wire, Digests::NONE, 8192).expect("decodes");
        assert_eq!(used, wire.len());
        assert_eq!(back, pdu);
    }

    #[test]
    fn scsi_command_with_extended_cdb_and_padding() {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x2a;
        let cmd = ScsiCommand {
            final_: false,
            write: true,
            task_attr: task_attr::SIMPLE,
            lun: Lun::from_number(1),
            itt: 9,
            expected_data_len: 4096,
            cmd_sn: 5,
            exp_stat_sn: 6,
            cdb,
            ..Default::default()
        };
        let mut pdu = Pdu::with_data(cmd, vec![0xabu8; 5]);
        pdu.ahs.push(Ahs::extended_cdb(&[1, 2, 3, 4]));
        for digests in [
            Digests::NONE,
            Digests {
                header: true,
                data: true,
            },
        ] {
            let parts = pdu.encode_parts(digests).expect("encodes");
            let wire = parts.to_vec();
            let extra = if digests.header { 8 } else { 0 };
            // BHS + AHS (3 + 5 bytes, padded to 8) + data 5 padded to 8 (+ digests).
            assert_eq!(wire.len(), 48 + 8 + 8 + extra);
            assert_eq!(wire[4], 2, "TotalAHSLength in words");
            assert_eq!(wire[1], 0x20 | 1, "W and SIMPLE, no F");
            assert_eq!(&wire[8..10], &[0, 1], "LUN 1");
            let (back, used) = Pdu::decode(&wire, digests, 8192).expect("decodes");
            assert_eq!(used, wire.len());
            assert_eq!(back, pdu);
        }
    }

    #[test]
    fn data_digest_detects_damage_and_consumes_frame() {
        let digests = Digests {
            header: true,
            data: true,
        };
        let pdu = Pdu::with_data(
            DataOut {
                final_: true,
                itt: 1,
                ttt: RESERVED_TAG,
                ..Default::default()
            },
            vec![7u8; 100],
        );
        let mut wire = pdu.encode(digests).expect("encodes");
        wire[60] ^= 1;
        let mut buf = BytesMut::from(&wire[..]);
        buf.extend_from_slice(&wire); // a second copy follows
        let decoder = PduDecoder::new(digests, 8192);
        assert!(matches!(
            decoder.decode(&mut buf),
            Err(PduError::DataDigest { .. })
        ));
        assert_eq!(buf.len(), wire.len(), "the damaged PDU was consumed");
        let mut header_damaged = pdu.encode(digests).expect("encodes");
        header_damaged[20] ^= 1;
        assert!(matches!(
            Pdu::decode(&header_damaged, digests, 8192),
            Err(PduError::HeaderDigest { .. })
        ));
    }

    #[test]
    fn decoder_waits_for_whole_frame() {
        let pdu = Pdu::with_data(
            NopIn {
                itt: 3,
                ttt: RESERVED_TAG,
                ..Default::default()
            },
            &b"ping"[..],
        );
        let wire = pdu.encode(Digests::NONE).expect("encodes");
        let decoder = PduDecoder::new(Digests::NONE, 8192);
        let mut buf = BytesMut::new();
        for (i, byte) in wire.iter().enumerate() {
            assert_eq!(
                decoder.decode(&mut buf).expect("no error"),
                None,
                "byte {i}"
            );
            buf.extend_from_slice(&[*byte]);
        }
        assert_eq!(decoder.decode(&mut buf).expect("decodes"), Some(pdu));
        assert!(buf.is_empty());
    }

    #[test]
    fn limits_and_bad_fields() {
        let mut wire = Pdu::with_data(NopIn::default(), vec![0u8; 9000])
            .encode(Digests::NONE)
            .expect("encodes");
        assert_eq!(
            Pdu::decode(&wire, Digests::NONE, 8192),
            Err(PduError::DataSegmentTooLong {
                len: 9000,
                limit: 8192
            })
        );
        wire[0] = 0x3e;
        assert_eq!(
            Pdu::decode(&wire, Digests::NONE, 1 << 20),
            Err(PduError::UnknownOpcode(0x3e))
        );
        let mut login = Pdu::new(login_request()).encode(Digests::NONE).expect("ok");
        login[1] = 0x80 | (2 << 2) | 3;
        assert!(matches!(
            Pdu::decode(&login, Digests::NONE, 8192),
            Err(PduError::InvalidField { field: "CSG", .. })
        ));
        let mut bad_ahs = Pdu::new(ScsiCommand::default())
            .encode(Digests::NONE)
            .expect("ok");
        bad_ahs[4] = 1;
        bad_ahs.extend_from_slice(&[0, 9, 1, 0]);
        assert!(matches!(
            Pdu::decode(&bad_ahs, Digests::NONE, 8192),
            Err(PduError::Ahs(_))
        ));
    }

    #[test]
    fn every_opcode_round_trips() {
        let all: Vec<Bhs> = vec![
            NopOut {
                immediate: true,
                itt: 1,
                ttt: RESERVED_TAG,
                ..Default::default()
            }
            .into(),
            ScsiCommand {
                read: true,
                final_: true,
                expected_data_len: 512,
                ..Default::default()
            }
            .into(),
            TaskMgmtRequest {
                function: tmf_function::ABORT_TASK,
                referenced_tag: 5,
                ..Default::default()
            }
            .into(),
            login_request().into(),
            TextRequest {
                final_: true,
                ttt: RESERVED_TAG,
                ..Default::default()
            }
            .into(),
            DataOut {
                final_: true,
                buffer_offset: 8192,
                data_sn: 2,
                ..Default::default()
            }
            .into(),
            LogoutRequest {
                immediate: true,
                reason: logout_reason::CLOSE_SESSION,
                ..Default::default()
            }
            .into(),
            Snack {
                snack_type: 1,
                beg_run: 4,
                ..Default::default()
            }
            .into(),
            NopIn {
                ttt: 77,
                ..Default::default()
            }
            .into(),
            ScsiResponse {
                underflow: true,
                residual_count: 100,
                status: scsi_status::CHECK_CONDITION,
                ..Default::default()
            }
            .into(),
            TaskMgmtResponse {
                response: tmf_response::NO_SUCH_TASK,
                ..Default::default()
            }
            .into(),
            LoginResponse {
                transit: false,
                continue_: true,
                current_stage: LoginStage::Security,
                next_stage: LoginStage::Operational,
                version_max: 0,
                version_active: 0,
                isid: [1, 2, 3, 4, 5, 6],
                tsih: 9,
                itt: 1,
                stat_sn: 2,
                exp_cmd_sn: 3,
                max_cmd_sn: 4,
                status: LoginStatus::AUTHENTICATION_FAILURE,
            }
            .into(),
            TextResponse {
                final_: true,
                ttt: RESERVED_TAG,
                ..Default::default()
            }
            .into(),
            DataIn {
                final_: true,
                has_status: true,
                underflow: true,
                residual_count: 3,
                ..Default::default()
            }
            .into(),
            LogoutResponse {
                time2wait: 2,
                time2retain: 20,
                ..Default::default()
            }
            .into(),
            R2t {
                ttt: 0x10,
                desired_len: 1 << 20,
                buffer_offset: 262144,
                r2t_sn: 1,
                ..Default::default()
            }
            .into(),
            AsyncMessage {
                event: 1,
                param3: 5,
                ..Default::default()
            }
            .into(),
            Reject {
                reason: reject_reason::PROTOCOL_ERROR,
                ..Default::default()
            }
            .into(),
        ];
        for bhs in all {
            let wire = bhs.encode(0, 0);
            assert_eq!(Opcode::from_byte(wire[0]), Ok(bhs.opcode()));
            assert_eq!(Bhs::decode(&wire), Ok(bhs.clone()), "{:?}", bhs.opcode());
        }
    }

    #[test]
    fn luns_and_serial_numbers() {
        assert_eq!(Lun::from_number(1).0, [0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Lun::from_number(300).0, [0x41, 0x2c, 0, 0, 0, 0, 0, 0]);
        for n in [0u16, 1, 255, 256, 16383] {
            assert_eq!(Lun::from_number(n).number(), Some(n));
        }
        assert_eq!(Lun([0x80, 0, 0, 0, 0, 0, 0, 0]).number(), None);
        assert!(sn_lt(1, 2));
        assert!(sn_lt(u32::MAX, 0), "wraps");
        assert!(!sn_lt(2, 1));
        assert!(sn_le(5, 5));
        assert_eq!(
            sense_from_segment(&sense_segment(&[0x70, 0, 5])),
            &[0x70, 0, 5]
        );
        assert_eq!(sense_from_segment(&[0, 9, 1]), &[1]);
        assert_eq!(sense_from_segment(&[]), &[] as &[u8]);
        assert_eq!(
            LoginStatus::AUTHENTICATION_FAILURE.to_string(),
            "authentication failure (status 0x0201)"
        );
    }
}
