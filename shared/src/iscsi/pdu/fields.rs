//! Where the fields sit in the 48-byte BHS (RFC 7143 §11), and the accessors both header files
//! use to read and write them.
//!
//! Words at the same offset mean the same thing in every PDU of one direction (CmdSN/ExpStatSN in
//! requests, StatSN/ExpCmdSN/MaxCmdSN in responses, RFC 7143 §11.2.1), which is why the names are
//! shared between opcodes.

use super::codes::{LoginStage, Opcode};
use super::{Lun, PduError};

/// Length of the basic header segment.
pub const BHS_LEN: usize = 48;
/// Length of the CDB field in the BHS; longer CDBs continue in an extended-CDB AHS.
pub const BHS_CDB_LEN: usize = 16;

/// A raw basic header segment.
pub(super) type RawBhs = [u8; BHS_LEN];

// Offsets shared by every PDU (RFC 7143 §11.2.1).
pub(super) const OFF_OPCODE: usize = 0;
pub(super) const OFF_FLAGS: usize = 1;
pub(super) const OFF_TOTAL_AHS_LEN: usize = 4;
pub(super) const OFF_DATA_SEGMENT_LEN: usize = 5;
pub(super) const OFF_LUN: usize = 8;
pub(super) const OFF_ITT: usize = 16;
pub(super) const OFF_TTT: usize = 20;
// Initiator → target sequence numbers.
pub(super) const OFF_CMDSN: usize = 24;
pub(super) const OFF_EXP_STATSN: usize = 28;
// Target → initiator sequence numbers.
pub(super) const OFF_STATSN: usize = 24;
pub(super) const OFF_EXP_CMDSN: usize = 28;
pub(super) const OFF_MAX_CMDSN: usize = 32;
// Bytes 2 and 3 of responses.
pub(super) const OFF_RESPONSE: usize = 2;
pub(super) const OFF_STATUS: usize = 3;
// SCSI Command (§11.3).
pub(super) const OFF_EXPECTED_DATA_LEN: usize = 20;
pub(super) const OFF_CDB: usize = 32;
// SCSI Response (§11.4), Data-In/Out (§11.7), R2T (§11.8).
pub(super) const OFF_SNACK_TAG: usize = 20;
pub(super) const OFF_DATASN: usize = 36;
pub(super) const OFF_BUFFER_OFFSET: usize = 40;
pub(super) const OFF_BIDI_RESIDUAL: usize = 40;
pub(super) const OFF_RESIDUAL: usize = 44;
pub(super) const OFF_DESIRED_LEN: usize = 44;
// Task Management (§11.5).
pub(super) const OFF_REFERENCED_TAG: usize = 20;
pub(super) const OFF_REF_CMDSN: usize = 32;
pub(super) const OFF_EXP_DATASN: usize = 36;
// Login (§11.12, §11.13).
pub(super) const OFF_VERSION_MAX: usize = 2;
pub(super) const OFF_VERSION_MIN: usize = 3;
pub(super) const OFF_ISID: usize = 8;
pub(super) const OFF_TSIH: usize = 14;
pub(super) const OFF_CID: usize = 20;
pub(super) const OFF_STATUS_CLASS: usize = 36;
pub(super) const OFF_STATUS_DETAIL: usize = 37;
// Logout response (§11.15).
pub(super) const OFF_TIME2WAIT: usize = 40;
pub(super) const OFF_TIME2RETAIN: usize = 42;
// Async Message (§11.9).
pub(super) const OFF_ASYNC_EVENT: usize = 36;
pub(super) const OFF_ASYNC_VCODE: usize = 37;
pub(super) const OFF_ASYNC_PARAM1: usize = 38;
pub(super) const OFF_ASYNC_PARAM2: usize = 40;
pub(super) const OFF_ASYNC_PARAM3: usize = 42;
// SNACK (§11.16).
pub(super) const OFF_BEGRUN: usize = 40;
pub(super) const OFF_RUN_LENGTH: usize = 44;

// Flag bits.
pub(super) const OPCODE_MASK: u8 = 0x3f;
pub(super) const FLAG_IMMEDIATE: u8 = 0x40;
pub(super) const FLAG_FINAL: u8 = 0x80;
pub(super) const FLAG_READ: u8 = 0x40;
pub(super) const FLAG_WRITE: u8 = 0x20;
pub(super) const TASK_ATTR_MASK: u8 = 0x07;
pub(super) const FLAG_CONTINUE: u8 = 0x40;
pub(super) const FLAG_TRANSIT: u8 = 0x80;
pub(super) const FLAG_ACK: u8 = 0x40;
pub(super) const FLAG_BIDI_OVERFLOW: u8 = 0x10;
pub(super) const FLAG_BIDI_UNDERFLOW: u8 = 0x08;
pub(super) const FLAG_OVERFLOW: u8 = 0x04;
pub(super) const FLAG_UNDERFLOW: u8 = 0x02;
pub(super) const FLAG_STATUS: u8 = 0x01;
pub(super) const LOW7_MASK: u8 = 0x7f;
pub(super) const SNACK_TYPE_MASK: u8 = 0x0f;

/// One opcode's header: where its fields sit in the BHS. The initiator's headers live in
/// `initiator.rs`, the target's in `target.rs`; [`super::Bhs`] dispatches to them.
pub(super) trait Header: Sized {
    /// The opcode this header is sent with.
    const OPCODE: Opcode;

    /// Writes the fields into `b`, whose opcode and length fields are already set (the I bit is
    /// the header's to set).
    fn write(&self, b: &mut RawBhs);

    /// Reads the fields of a header whose opcode is [`Header::OPCODE`].
    fn read(b: &RawBhs) -> Result<Self, PduError>;
}

/// The Initiator Task Tag of a header: the task a PDU belongs to.
pub(super) trait TaskTag {
    /// The ITT ([`super::RESERVED_TAG`] for PDUs that answer no task).
    fn itt(&self) -> u32;
}

/// [`TaskTag`] for headers with an `itt` field.
macro_rules! itt_field {
    ($($name:ident),*) => {
        $(impl TaskTag for $name {
            fn itt(&self) -> u32 {
                self.itt
            }
        })*
    };
}
pub(super) use itt_field;

pub(super) fn get_u16(b: &RawBhs, off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

pub(super) fn get_u32(b: &RawBhs, off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

pub(super) fn put_u16(b: &mut RawBhs, off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}

pub(super) fn put_u32(b: &mut RawBhs, off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

pub(super) fn get_lun(b: &RawBhs) -> Lun {
    let mut lun = [0u8; 8];
    lun.copy_from_slice(&b[OFF_LUN..OFF_LUN + 8]);
    Lun(lun)
}

pub(super) fn put_lun(b: &mut RawBhs, lun: Lun) {
    b[OFF_LUN..OFF_LUN + 8].copy_from_slice(&lun.0);
}

pub(super) fn get_isid(b: &RawBhs) -> [u8; 6] {
    let mut isid = [0u8; 6];
    isid.copy_from_slice(&b[OFF_ISID..OFF_ISID + 6]);
    isid
}

/// Whether the I bit is set in the opcode byte.
pub(super) fn immediate(b: &RawBhs) -> bool {
    b[OFF_OPCODE] & FLAG_IMMEDIATE != 0
}

/// Whether `bit` is set in the flags byte.
pub(super) fn flag(b: &RawBhs, bit: u8) -> bool {
    b[OFF_FLAGS] & bit != 0
}

/// `bit` when `set`, else 0: for or-ing flags together.
pub(super) fn bit(set: bool, bit: u8) -> u8 {
    if set {
        bit
    } else {
        0
    }
}

/// The flags byte of a Login Request or Response: T, C, CSG and NSG (RFC 7143 §11.12.1).
pub(super) fn login_flags(
    transit: bool,
    continue_: bool,
    current: LoginStage,
    next: LoginStage,
) -> u8 {
    bit(transit, FLAG_TRANSIT) | bit(continue_, FLAG_CONTINUE) | ((current as u8) << 2) | next as u8
}

/// CSG and NSG of a Login Request or Response; a stage of 2 is an error.
pub(super) fn login_stages(
    b: &RawBhs,
    opcode: Opcode,
) -> Result<(LoginStage, LoginStage), PduError> {
    let flags = b[OFF_FLAGS];
    Ok((
        LoginStage::from_bits(flags >> 2, "CSG", opcode)?,
        LoginStage::from_bits(flags, "NSG", opcode)?,
    ))
}
