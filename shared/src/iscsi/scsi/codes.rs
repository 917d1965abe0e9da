//! Code tables: operation codes, service actions, status codes, sense keys and ASC/ASCQ pairs
//! (SPC-4, SBC-3, SAM-5).

/// SCSI operation codes (first CDB byte) this module knows.
pub mod opcode {
    /// TEST UNIT READY (SPC-4 §6.47).
    pub const TEST_UNIT_READY: u8 = 0x00;
    /// REQUEST SENSE (SPC-4 §6.39).
    pub const REQUEST_SENSE: u8 = 0x03;
    /// READ (6) (SBC-3 §5.15).
    pub const READ_6: u8 = 0x08;
    /// WRITE (6) (SBC-3 §5.38).
    pub const WRITE_6: u8 = 0x0a;
    /// INQUIRY (SPC-4 §6.6).
    pub const INQUIRY: u8 = 0x12;
    /// RESERVE (6) (SPC-2 §7.21).
    pub const RESERVE_6: u8 = 0x16;
    /// RELEASE (6) (SPC-2 §7.17).
    pub const RELEASE_6: u8 = 0x17;
    /// MODE SENSE (6) (SPC-4 §6.11).
    pub const MODE_SENSE_6: u8 = 0x1a;
    /// READ CAPACITY (10) (SBC-3 §5.19).
    pub const READ_CAPACITY_10: u8 = 0x25;
    /// READ (10).
    pub const READ_10: u8 = 0x28;
    /// WRITE (10).
    pub const WRITE_10: u8 = 0x2a;
    /// WRITE AND VERIFY (10) (SBC-3 §5.41).
    pub const WRITE_AND_VERIFY_10: u8 = 0x2e;
    /// VERIFY (10).
    pub const VERIFY_10: u8 = 0x2f;
    /// PRE-FETCH (10) (SBC-3 §5.9).
    pub const PRE_FETCH_10: u8 = 0x34;
    /// SYNCHRONIZE CACHE (10).
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    /// WRITE SAME (10).
    pub const WRITE_SAME_10: u8 = 0x41;
    /// UNMAP.
    pub const UNMAP: u8 = 0x42;
    /// MODE SENSE (10).
    pub const MODE_SENSE_10: u8 = 0x5a;
    /// PERSISTENT RESERVE IN (SPC-4 §6.13).
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5e;
    /// PERSISTENT RESERVE OUT (SPC-4 §6.14).
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5f;
    /// READ (16).
    pub const READ_16: u8 = 0x88;
    /// COMPARE AND WRITE (SBC-3 §5.2).
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    /// WRITE (16).
    pub const WRITE_16: u8 = 0x8a;
    /// ORWRITE (16) (SBC-3 §5.8).
    pub const ORWRITE_16: u8 = 0x8b;
    /// WRITE AND VERIFY (16).
    pub const WRITE_AND_VERIFY_16: u8 = 0x8e;
    /// VERIFY (16).
    pub const VERIFY_16: u8 = 0x8f;
    /// PRE-FETCH (16).
    pub const PRE_FETCH_16: u8 = 0x90;
    /// SYNCHRONIZE CACHE (16).
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    /// WRITE SAME (16).
    pub const WRITE_SAME_16: u8 = 0x93;
    /// SERVICE ACTION IN (16); service action 0x10 is READ CAPACITY (16).
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    /// REPORT LUNS (SPC-4 §6.33).
    pub const REPORT_LUNS: u8 = 0xa0;
    /// MAINTENANCE IN; service action 0x0c is REPORT SUPPORTED OPERATION CODES.
    pub const MAINTENANCE_IN: u8 = 0xa3;
    /// READ (12).
    pub const READ_12: u8 = 0xa8;
    /// WRITE (12).
    pub const WRITE_12: u8 = 0xaa;
    /// WRITE AND VERIFY (12).
    pub const WRITE_AND_VERIFY_12: u8 = 0xae;
    /// VERIFY (12).
    pub const VERIFY_12: u8 = 0xaf;
}

/// READ CAPACITY (16) service action of SERVICE ACTION IN (16).
pub const SA_READ_CAPACITY_16: u8 = 0x10;
/// GET LBA STATUS service action of SERVICE ACTION IN (16) (SBC-3 §5.16).
pub const SA_GET_LBA_STATUS: u8 = 0x12;
/// REPORT SUPPORTED OPERATION CODES service action of MAINTENANCE IN (SPC-4 §6.35).
pub const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0c;

/// PERSISTENT RESERVE IN service actions (SPC-4 table 166).
pub mod pr_in {
    /// READ KEYS.
    pub const READ_KEYS: u8 = 0x00;
    /// READ RESERVATION.
    pub const READ_RESERVATION: u8 = 0x01;
    /// REPORT CAPABILITIES.
    pub const REPORT_CAPABILITIES: u8 = 0x02;
    /// READ FULL STATUS.
    pub const READ_FULL_STATUS: u8 = 0x03;
}

/// PERSISTENT RESERVE OUT service actions (SPC-4 table 176).
pub mod pr_out {
    /// REGISTER.
    pub const REGISTER: u8 = 0x00;
    /// RESERVE.
    pub const RESERVE: u8 = 0x01;
    /// RELEASE.
    pub const RELEASE: u8 = 0x02;
    /// CLEAR.
    pub const CLEAR: u8 = 0x03;
    /// PREEMPT.
    pub const PREEMPT: u8 = 0x04;
    /// PREEMPT AND ABORT.
    pub const PREEMPT_AND_ABORT: u8 = 0x05;
    /// REGISTER AND IGNORE EXISTING KEY.
    pub const REGISTER_AND_IGNORE: u8 = 0x06;
    /// REGISTER AND MOVE.
    pub const REGISTER_AND_MOVE: u8 = 0x07;
}

/// Persistent reservation types (SPC-4 table 169).
pub mod pr_type {
    /// Write Exclusive.
    pub const WRITE_EXCLUSIVE: u8 = 0x1;
    /// Exclusive Access.
    pub const EXCLUSIVE_ACCESS: u8 = 0x3;
    /// Write Exclusive - Registrants Only.
    pub const WRITE_EXCLUSIVE_RO: u8 = 0x5;
    /// Exclusive Access - Registrants Only.
    pub const EXCLUSIVE_ACCESS_RO: u8 = 0x6;
    /// Write Exclusive - All Registrants.
    pub const WRITE_EXCLUSIVE_AR: u8 = 0x7;
    /// Exclusive Access - All Registrants.
    pub const EXCLUSIVE_ACCESS_AR: u8 = 0x8;

    /// Whether `t` is a type this target supports (all six of SPC-4).
    pub fn is_valid(t: u8) -> bool {
        matches!(t, 0x1 | 0x3 | 0x5..=0x8)
    }
}

/// SCSI status codes (SAM-5 §5.3).
pub mod status {
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
}

/// Sense keys (SPC-4 table 54).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SenseKey {
    /// NO SENSE.
    NoSense = 0x0,
    /// RECOVERED ERROR.
    RecoveredError = 0x1,
    /// NOT READY.
    NotReady = 0x2,
    /// MEDIUM ERROR.
    MediumError = 0x3,
    /// HARDWARE ERROR.
    HardwareError = 0x4,
    /// ILLEGAL REQUEST.
    IllegalRequest = 0x5,
    /// UNIT ATTENTION.
    UnitAttention = 0x6,
    /// DATA PROTECT.
    DataProtect = 0x7,
    /// ABORTED COMMAND.
    AbortedCommand = 0xb,
    /// MISCOMPARE.
    Miscompare = 0xe,
}

impl SenseKey {
    /// The key for a 4-bit wire value; reserved values map to `None`.
    pub fn from_u8(value: u8) -> Option<Self> {
        Some(match value & 0x0f {
            0x0 => Self::NoSense,
            0x1 => Self::RecoveredError,
            0x2 => Self::NotReady,
            0x3 => Self::MediumError,
            0x4 => Self::HardwareError,
            0x5 => Self::IllegalRequest,
            0x6 => Self::UnitAttention,
            0x7 => Self::DataProtect,
            0xb => Self::AbortedCommand,
            0xe => Self::Miscompare,
            _ => return None,
        })
    }
}

/// Additional sense code and qualifier pairs (SPC-4 table D.1) that the target uses.
pub mod asc {
    /// NO ADDITIONAL SENSE INFORMATION.
    pub const NO_ADDITIONAL_SENSE: (u8, u8) = (0x00, 0x00);
    /// WRITE ERROR.
    pub const WRITE_ERROR: (u8, u8) = (0x0c, 0x00);
    /// INVALID FIELD IN COMMAND INFORMATION UNIT.
    pub const INVALID_FIELD_IN_INFORMATION_UNIT: (u8, u8) = (0x0e, 0x03);
    /// UNRECOVERED READ ERROR.
    pub const UNRECOVERED_READ_ERROR: (u8, u8) = (0x11, 0x00);
    /// PARAMETER LIST LENGTH ERROR.
    pub const PARAMETER_LIST_LENGTH_ERROR: (u8, u8) = (0x1a, 0x00);
    /// MISCOMPARE DURING VERIFY OPERATION.
    pub const MISCOMPARE_DURING_VERIFY: (u8, u8) = (0x1d, 0x00);
    /// INVALID COMMAND OPERATION CODE.
    pub const INVALID_COMMAND_OPERATION_CODE: (u8, u8) = (0x20, 0x00);
    /// LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub const LBA_OUT_OF_RANGE: (u8, u8) = (0x21, 0x00);
    /// INVALID FIELD IN CDB.
    pub const INVALID_FIELD_IN_CDB: (u8, u8) = (0x24, 0x00);
    /// LOGICAL UNIT NOT SUPPORTED.
    pub const LOGICAL_UNIT_NOT_SUPPORTED: (u8, u8) = (0x25, 0x00);
    /// INVALID FIELD IN PARAMETER LIST.
    pub const INVALID_FIELD_IN_PARAMETER_LIST: (u8, u8) = (0x26, 0x00);
    /// INVALID RELEASE OF PERSISTENT RESERVATION.
    pub const INVALID_RELEASE_OF_PERSISTENT_RESERVATION: (u8, u8) = (0x26, 0x04);
    /// SAVING PARAMETERS NOT SUPPORTED.
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: (u8, u8) = (0x39, 0x00);
    /// INTERNAL TARGET FAILURE.
    pub const INTERNAL_TARGET_FAILURE: (u8, u8) = (0x44, 0x00);
}
