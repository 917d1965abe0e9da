//! The headers an initiator sends (RFC 7143 §11.3–§11.18, requests), each with where its fields
//! sit in the BHS.

use super::codes::{LoginStage, Opcode};
use super::fields::*;
use super::{Lun, PduError};

/// NOP-Out (RFC 7143 §11.18).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NopOut {
    /// Immediate delivery (I bit).
    pub immediate: bool,
    /// LUN (meaningful only when answering a NOP-In that carried one).
    pub lun: Lun,
    /// Initiator Task Tag; [`RESERVED_TAG`](super::RESERVED_TAG) when answering a NOP-In.
    pub itt: u32,
    /// Target Transfer Tag copied from the NOP-In this answers, else [`RESERVED_TAG`](super::RESERVED_TAG).
    pub ttt: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

impl Header for NopOut {
    const OPCODE: Opcode = Opcode::NopOut;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_OPCODE] |= bit(self.immediate, FLAG_IMMEDIATE);
        b[OFF_FLAGS] = FLAG_FINAL;
        put_lun(b, self.lun);
        put_u32(b, OFF_ITT, self.itt);
        put_u32(b, OFF_TTT, self.ttt);
        put_u32(b, OFF_CMDSN, self.cmd_sn);
        put_u32(b, OFF_EXP_STATSN, self.exp_stat_sn);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        Ok(NopOut {
            immediate: immediate(b),
            lun: get_lun(b),
            itt: get_u32(b, OFF_ITT),
            ttt: get_u32(b, OFF_TTT),
            cmd_sn: get_u32(b, OFF_CMDSN),
            exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
        })
    }
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
    /// Task attribute ([`task_attr`](super::task_attr)).
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

impl Header for ScsiCommand {
    const OPCODE: Opcode = Opcode::ScsiCommand;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_OPCODE] |= bit(self.immediate, FLAG_IMMEDIATE);
        b[OFF_FLAGS] = bit(self.final_, FLAG_FINAL)
            | bit(self.read, FLAG_READ)
            | bit(self.write, FLAG_WRITE)
            | (self.task_attr & TASK_ATTR_MASK);
        put_lun(b, self.lun);
        put_u32(b, OFF_ITT, self.itt);
        put_u32(b, OFF_EXPECTED_DATA_LEN, self.expected_data_len);
        put_u32(b, OFF_CMDSN, self.cmd_sn);
        put_u32(b, OFF_EXP_STATSN, self.exp_stat_sn);
        b[OFF_CDB..OFF_CDB + BHS_CDB_LEN].copy_from_slice(&self.cdb);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        let mut cdb = [0u8; BHS_CDB_LEN];
        cdb.copy_from_slice(&b[OFF_CDB..OFF_CDB + BHS_CDB_LEN]);
        Ok(ScsiCommand {
            immediate: immediate(b),
            final_: flag(b, FLAG_FINAL),
            read: flag(b, FLAG_READ),
            write: flag(b, FLAG_WRITE),
            task_attr: b[OFF_FLAGS] & TASK_ATTR_MASK,
            lun: get_lun(b),
            itt: get_u32(b, OFF_ITT),
            expected_data_len: get_u32(b, OFF_EXPECTED_DATA_LEN),
            cmd_sn: get_u32(b, OFF_CMDSN),
            exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
            cdb,
        })
    }
}

/// SCSI Task Management Function Request (RFC 7143 §11.5).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskMgmtRequest {
    /// Immediate delivery (I bit).
    pub immediate: bool,
    /// Function ([`tmf_function`](super::tmf_function)).
    pub function: u8,
    /// Logical unit.
    pub lun: Lun,
    /// Initiator Task Tag of this request.
    pub itt: u32,
    /// Tag of the task to abort (ABORT TASK), else [`RESERVED_TAG`](super::RESERVED_TAG).
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

impl Header for TaskMgmtRequest {
    const OPCODE: Opcode = Opcode::TaskMgmtRequest;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_OPCODE] |= bit(self.immediate, FLAG_IMMEDIATE);
        b[OFF_FLAGS] = FLAG_FINAL | (self.function & LOW7_MASK);
        put_lun(b, self.lun);
        put_u32(b, OFF_ITT, self.itt);
        put_u32(b, OFF_REFERENCED_TAG, self.referenced_tag);
        put_u32(b, OFF_CMDSN, self.cmd_sn);
        put_u32(b, OFF_EXP_STATSN, self.exp_stat_sn);
        put_u32(b, OFF_REF_CMDSN, self.ref_cmd_sn);
        put_u32(b, OFF_EXP_DATASN, self.exp_data_sn);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        Ok(TaskMgmtRequest {
            immediate: immediate(b),
            function: b[OFF_FLAGS] & LOW7_MASK,
            lun: get_lun(b),
            itt: get_u32(b, OFF_ITT),
            referenced_tag: get_u32(b, OFF_REFERENCED_TAG),
            cmd_sn: get_u32(b, OFF_CMDSN),
            exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
            ref_cmd_sn: get_u32(b, OFF_REF_CMDSN),
            exp_data_sn: get_u32(b, OFF_EXP_DATASN),
        })
    }
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

impl Header for LoginRequest {
    const OPCODE: Opcode = Opcode::LoginRequest;

    fn write(&self, b: &mut RawBhs) {
        // RFC 7143 §11.12: the I bit is always 1 in a Login Request.
        b[OFF_OPCODE] |= FLAG_IMMEDIATE;
        b[OFF_FLAGS] = login_flags(
            self.transit,
            self.continue_,
            self.current_stage,
            self.next_stage,
        );
        b[OFF_VERSION_MAX] = self.version_max;
        b[OFF_VERSION_MIN] = self.version_min;
        b[OFF_ISID..OFF_ISID + 6].copy_from_slice(&self.isid);
        put_u16(b, OFF_TSIH, self.tsih);
        put_u32(b, OFF_ITT, self.itt);
        put_u16(b, OFF_CID, self.cid);
        put_u32(b, OFF_CMDSN, self.cmd_sn);
        put_u32(b, OFF_EXP_STATSN, self.exp_stat_sn);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        let (current_stage, next_stage) = login_stages(b, Self::OPCODE)?;
        Ok(LoginRequest {
            transit: flag(b, FLAG_TRANSIT),
            continue_: flag(b, FLAG_CONTINUE),
            current_stage,
            next_stage,
            version_max: b[OFF_VERSION_MAX],
            version_min: b[OFF_VERSION_MIN],
            isid: get_isid(b),
            tsih: get_u16(b, OFF_TSIH),
            itt: get_u32(b, OFF_ITT),
            cid: get_u16(b, OFF_CID),
            cmd_sn: get_u32(b, OFF_CMDSN),
            exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
        })
    }
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
    /// Target Transfer Tag: [`RESERVED_TAG`](super::RESERVED_TAG) to start, else the target's value to continue.
    pub ttt: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

impl Header for TextRequest {
    const OPCODE: Opcode = Opcode::TextRequest;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_OPCODE] |= bit(self.immediate, FLAG_IMMEDIATE);
        b[OFF_FLAGS] = bit(self.final_, FLAG_FINAL) | bit(self.continue_, FLAG_CONTINUE);
        put_lun(b, self.lun);
        put_u32(b, OFF_ITT, self.itt);
        put_u32(b, OFF_TTT, self.ttt);
        put_u32(b, OFF_CMDSN, self.cmd_sn);
        put_u32(b, OFF_EXP_STATSN, self.exp_stat_sn);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        Ok(TextRequest {
            immediate: immediate(b),
            final_: flag(b, FLAG_FINAL),
            continue_: flag(b, FLAG_CONTINUE),
            lun: get_lun(b),
            itt: get_u32(b, OFF_ITT),
            ttt: get_u32(b, OFF_TTT),
            cmd_sn: get_u32(b, OFF_CMDSN),
            exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
        })
    }
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
    /// Target Transfer Tag from the R2T, or [`RESERVED_TAG`](super::RESERVED_TAG) for unsolicited data.
    pub ttt: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// DataSN within this burst.
    pub data_sn: u32,
    /// Offset of this data within the command's buffer.
    pub buffer_offset: u32,
}

impl Header for DataOut {
    const OPCODE: Opcode = Opcode::DataOut;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_FLAGS] = bit(self.final_, FLAG_FINAL);
        put_lun(b, self.lun);
        put_u32(b, OFF_ITT, self.itt);
        put_u32(b, OFF_TTT, self.ttt);
        put_u32(b, OFF_EXP_STATSN, self.exp_stat_sn);
        put_u32(b, OFF_DATASN, self.data_sn);
        put_u32(b, OFF_BUFFER_OFFSET, self.buffer_offset);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        Ok(DataOut {
            final_: flag(b, FLAG_FINAL),
            lun: get_lun(b),
            itt: get_u32(b, OFF_ITT),
            ttt: get_u32(b, OFF_TTT),
            exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
            data_sn: get_u32(b, OFF_DATASN),
            buffer_offset: get_u32(b, OFF_BUFFER_OFFSET),
        })
    }
}

/// Logout Request (RFC 7143 §11.14).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogoutRequest {
    /// Immediate delivery (I bit).
    pub immediate: bool,
    /// Reason ([`logout_reason`](super::logout_reason)).
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

impl Header for LogoutRequest {
    const OPCODE: Opcode = Opcode::LogoutRequest;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_OPCODE] |= bit(self.immediate, FLAG_IMMEDIATE);
        b[OFF_FLAGS] = FLAG_FINAL | (self.reason & LOW7_MASK);
        put_u32(b, OFF_ITT, self.itt);
        put_u16(b, OFF_CID, self.cid);
        put_u32(b, OFF_CMDSN, self.cmd_sn);
        put_u32(b, OFF_EXP_STATSN, self.exp_stat_sn);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        Ok(LogoutRequest {
            immediate: immediate(b),
            reason: b[OFF_FLAGS] & LOW7_MASK,
            itt: get_u32(b, OFF_ITT),
            cid: get_u16(b, OFF_CID),
            cmd_sn: get_u32(b, OFF_CMDSN),
            exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
        })
    }
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

impl Header for Snack {
    const OPCODE: Opcode = Opcode::Snack;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_FLAGS] = FLAG_FINAL | (self.snack_type & SNACK_TYPE_MASK);
        put_lun(b, self.lun);
        put_u32(b, OFF_ITT, self.itt);
        put_u32(b, OFF_TTT, self.ttt);
        put_u32(b, OFF_EXP_STATSN, self.exp_stat_sn);
        put_u32(b, OFF_BEGRUN, self.beg_run);
        put_u32(b, OFF_RUN_LENGTH, self.run_length);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        Ok(Snack {
            snack_type: b[OFF_FLAGS] & SNACK_TYPE_MASK,
            lun: get_lun(b),
            itt: get_u32(b, OFF_ITT),
            ttt: get_u32(b, OFF_TTT),
            exp_stat_sn: get_u32(b, OFF_EXP_STATSN),
            beg_run: get_u32(b, OFF_BEGRUN),
            run_length: get_u32(b, OFF_RUN_LENGTH),
        })
    }
}

itt_field!(
    NopOut,
    ScsiCommand,
    TaskMgmtRequest,
    LoginRequest,
    TextRequest,
    DataOut,
    LogoutRequest,
    Snack
);
