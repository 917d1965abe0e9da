//! The headers a target sends (RFC 7143 §11.4–§11.19, responses), each with where its fields sit
//! in the BHS. Every one of them carries StatSN, ExpCmdSN and MaxCmdSN at the same offsets
//! ([`stamp_sequence_numbers`]).

use super::codes::{LoginStage, LoginStatus, Opcode};
use super::fields::*;
use super::{Lun, PduError, RESERVED_TAG};

/// Writes StatSN, ExpCmdSN and MaxCmdSN into an encoded target-to-initiator header: a target
/// that encodes a response ahead of time stamps them when the PDU goes out (RFC 7143 §11.2.1:
/// the same bytes 24..36 in every response).
pub fn stamp_sequence_numbers(
    bhs: &mut [u8; BHS_LEN],
    stat_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
) {
    put_u32(bhs, OFF_STATSN, stat_sn);
    put_u32(bhs, OFF_EXP_CMDSN, exp_cmd_sn);
    put_u32(bhs, OFF_MAX_CMDSN, max_cmd_sn);
}

/// Writes the StatSN, ExpCmdSN and MaxCmdSN fields.
fn put_sequence(b: &mut RawBhs, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) {
    stamp_sequence_numbers(b, stat_sn, exp_cmd_sn, max_cmd_sn);
}

/// Reads StatSN, ExpCmdSN and MaxCmdSN.
fn get_sequence(b: &RawBhs) -> (u32, u32, u32) {
    (
        get_u32(b, OFF_STATSN),
        get_u32(b, OFF_EXP_CMDSN),
        get_u32(b, OFF_MAX_CMDSN),
    )
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

impl Header for NopIn {
    const OPCODE: Opcode = Opcode::NopIn;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_FLAGS] = FLAG_FINAL;
        put_lun(b, self.lun);
        put_u32(b, OFF_ITT, self.itt);
        put_u32(b, OFF_TTT, self.ttt);
        put_sequence(b, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        let (stat_sn, exp_cmd_sn, max_cmd_sn) = get_sequence(b);
        Ok(NopIn {
            lun: get_lun(b),
            itt: get_u32(b, OFF_ITT),
            ttt: get_u32(b, OFF_TTT),
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
        })
    }
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
    /// Response ([`response_code`](super::response_code)).
    pub response: u8,
    /// SCSI status ([`scsi_status`](super::scsi_status)).
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

impl Header for ScsiResponse {
    const OPCODE: Opcode = Opcode::ScsiResponse;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_FLAGS] = FLAG_FINAL
            | bit(self.bidi_overflow, FLAG_BIDI_OVERFLOW)
            | bit(self.bidi_underflow, FLAG_BIDI_UNDERFLOW)
            | bit(self.overflow, FLAG_OVERFLOW)
            | bit(self.underflow, FLAG_UNDERFLOW);
        b[OFF_RESPONSE] = self.response;
        b[OFF_STATUS] = self.status;
        put_u32(b, OFF_ITT, self.itt);
        put_u32(b, OFF_SNACK_TAG, self.snack_tag);
        put_sequence(b, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        put_u32(b, OFF_DATASN, self.exp_data_sn);
        put_u32(b, OFF_BIDI_RESIDUAL, self.bidi_residual_count);
        put_u32(b, OFF_RESIDUAL, self.residual_count);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        let (stat_sn, exp_cmd_sn, max_cmd_sn) = get_sequence(b);
        Ok(ScsiResponse {
            bidi_overflow: flag(b, FLAG_BIDI_OVERFLOW),
            bidi_underflow: flag(b, FLAG_BIDI_UNDERFLOW),
            overflow: flag(b, FLAG_OVERFLOW),
            underflow: flag(b, FLAG_UNDERFLOW),
            response: b[OFF_RESPONSE],
            status: b[OFF_STATUS],
            itt: get_u32(b, OFF_ITT),
            snack_tag: get_u32(b, OFF_SNACK_TAG),
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
            exp_data_sn: get_u32(b, OFF_DATASN),
            bidi_residual_count: get_u32(b, OFF_BIDI_RESIDUAL),
            residual_count: get_u32(b, OFF_RESIDUAL),
        })
    }
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

/// SCSI Task Management Function Response (RFC 7143 §11.6).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskMgmtResponse {
    /// Response ([`tmf_response`](super::tmf_response)).
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

impl Header for TaskMgmtResponse {
    const OPCODE: Opcode = Opcode::TaskMgmtResponse;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_FLAGS] = FLAG_FINAL;
        b[OFF_RESPONSE] = self.response;
        put_u32(b, OFF_ITT, self.itt);
        put_sequence(b, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        let (stat_sn, exp_cmd_sn, max_cmd_sn) = get_sequence(b);
        Ok(TaskMgmtResponse {
            response: b[OFF_RESPONSE],
            itt: get_u32(b, OFF_ITT),
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
        })
    }
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

impl Header for LoginResponse {
    const OPCODE: Opcode = Opcode::LoginResponse;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_FLAGS] = login_flags(
            self.transit,
            self.continue_,
            self.current_stage,
            self.next_stage,
        );
        b[OFF_VERSION_MAX] = self.version_max;
        b[OFF_VERSION_MIN] = self.version_active;
        b[OFF_ISID..OFF_ISID + 6].copy_from_slice(&self.isid);
        put_u16(b, OFF_TSIH, self.tsih);
        put_u32(b, OFF_ITT, self.itt);
        put_sequence(b, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        b[OFF_STATUS_CLASS] = self.status.class;
        b[OFF_STATUS_DETAIL] = self.status.detail;
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        let (current_stage, next_stage) = login_stages(b, Self::OPCODE)?;
        let (stat_sn, exp_cmd_sn, max_cmd_sn) = get_sequence(b);
        Ok(LoginResponse {
            transit: flag(b, FLAG_TRANSIT),
            continue_: flag(b, FLAG_CONTINUE),
            current_stage,
            next_stage,
            version_max: b[OFF_VERSION_MAX],
            version_active: b[OFF_VERSION_MIN],
            isid: get_isid(b),
            tsih: get_u16(b, OFF_TSIH),
            itt: get_u32(b, OFF_ITT),
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
            status: LoginStatus::new(b[OFF_STATUS_CLASS], b[OFF_STATUS_DETAIL]),
        })
    }
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

impl Header for TextResponse {
    const OPCODE: Opcode = Opcode::TextResponse;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_FLAGS] = bit(self.final_, FLAG_FINAL) | bit(self.continue_, FLAG_CONTINUE);
        put_lun(b, self.lun);
        put_u32(b, OFF_ITT, self.itt);
        put_u32(b, OFF_TTT, self.ttt);
        put_sequence(b, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        let (stat_sn, exp_cmd_sn, max_cmd_sn) = get_sequence(b);
        Ok(TextResponse {
            final_: flag(b, FLAG_FINAL),
            continue_: flag(b, FLAG_CONTINUE),
            lun: get_lun(b),
            itt: get_u32(b, OFF_ITT),
            ttt: get_u32(b, OFF_TTT),
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
        })
    }
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

impl Header for DataIn {
    const OPCODE: Opcode = Opcode::DataIn;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_FLAGS] = bit(self.final_, FLAG_FINAL)
            | bit(self.acknowledge, FLAG_ACK)
            | bit(self.overflow, FLAG_OVERFLOW)
            | bit(self.underflow, FLAG_UNDERFLOW)
            | bit(self.has_status, FLAG_STATUS);
        b[OFF_STATUS] = self.status;
        put_lun(b, self.lun);
        put_u32(b, OFF_ITT, self.itt);
        put_u32(b, OFF_TTT, self.ttt);
        put_sequence(b, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        put_u32(b, OFF_DATASN, self.data_sn);
        put_u32(b, OFF_BUFFER_OFFSET, self.buffer_offset);
        put_u32(b, OFF_RESIDUAL, self.residual_count);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        let (stat_sn, exp_cmd_sn, max_cmd_sn) = get_sequence(b);
        Ok(DataIn {
            final_: flag(b, FLAG_FINAL),
            acknowledge: flag(b, FLAG_ACK),
            overflow: flag(b, FLAG_OVERFLOW),
            underflow: flag(b, FLAG_UNDERFLOW),
            has_status: flag(b, FLAG_STATUS),
            status: b[OFF_STATUS],
            lun: get_lun(b),
            itt: get_u32(b, OFF_ITT),
            ttt: get_u32(b, OFF_TTT),
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
            data_sn: get_u32(b, OFF_DATASN),
            buffer_offset: get_u32(b, OFF_BUFFER_OFFSET),
            residual_count: get_u32(b, OFF_RESIDUAL),
        })
    }
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

impl Header for R2t {
    const OPCODE: Opcode = Opcode::R2t;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_FLAGS] = FLAG_FINAL;
        put_lun(b, self.lun);
        put_u32(b, OFF_ITT, self.itt);
        put_u32(b, OFF_TTT, self.ttt);
        put_sequence(b, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        put_u32(b, OFF_DATASN, self.r2t_sn);
        put_u32(b, OFF_BUFFER_OFFSET, self.buffer_offset);
        put_u32(b, OFF_DESIRED_LEN, self.desired_len);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        let (stat_sn, exp_cmd_sn, max_cmd_sn) = get_sequence(b);
        Ok(R2t {
            lun: get_lun(b),
            itt: get_u32(b, OFF_ITT),
            ttt: get_u32(b, OFF_TTT),
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
            r2t_sn: get_u32(b, OFF_DATASN),
            buffer_offset: get_u32(b, OFF_BUFFER_OFFSET),
            desired_len: get_u32(b, OFF_DESIRED_LEN),
        })
    }
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

impl Header for AsyncMessage {
    const OPCODE: Opcode = Opcode::AsyncMessage;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_FLAGS] = FLAG_FINAL;
        put_lun(b, self.lun);
        put_u32(b, OFF_ITT, RESERVED_TAG);
        put_sequence(b, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        b[OFF_ASYNC_EVENT] = self.event;
        b[OFF_ASYNC_VCODE] = self.vcode;
        put_u16(b, OFF_ASYNC_PARAM1, self.param1);
        put_u16(b, OFF_ASYNC_PARAM2, self.param2);
        put_u16(b, OFF_ASYNC_PARAM3, self.param3);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        let (stat_sn, exp_cmd_sn, max_cmd_sn) = get_sequence(b);
        Ok(AsyncMessage {
            lun: get_lun(b),
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
            event: b[OFF_ASYNC_EVENT],
            vcode: b[OFF_ASYNC_VCODE],
            param1: get_u16(b, OFF_ASYNC_PARAM1),
            param2: get_u16(b, OFF_ASYNC_PARAM2),
            param3: get_u16(b, OFF_ASYNC_PARAM3),
        })
    }
}

/// Logout Response (RFC 7143 §11.15).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogoutResponse {
    /// Response ([`logout_response`](super::logout_response)).
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

impl Header for LogoutResponse {
    const OPCODE: Opcode = Opcode::LogoutResponse;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_FLAGS] = FLAG_FINAL;
        b[OFF_RESPONSE] = self.response;
        put_u32(b, OFF_ITT, self.itt);
        put_sequence(b, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        put_u16(b, OFF_TIME2WAIT, self.time2wait);
        put_u16(b, OFF_TIME2RETAIN, self.time2retain);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        let (stat_sn, exp_cmd_sn, max_cmd_sn) = get_sequence(b);
        Ok(LogoutResponse {
            response: b[OFF_RESPONSE],
            itt: get_u32(b, OFF_ITT),
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
            time2wait: get_u16(b, OFF_TIME2WAIT),
            time2retain: get_u16(b, OFF_TIME2RETAIN),
        })
    }
}

/// Reject (RFC 7143 §11.17). The data segment is the rejected PDU's header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reject {
    /// Reason ([`reject_reason`](super::reject_reason)).
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

impl Header for Reject {
    const OPCODE: Opcode = Opcode::Reject;

    fn write(&self, b: &mut RawBhs) {
        b[OFF_FLAGS] = FLAG_FINAL;
        b[OFF_RESPONSE] = self.reason;
        put_u32(b, OFF_ITT, RESERVED_TAG);
        put_sequence(b, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        put_u32(b, OFF_DATASN, self.data_sn);
    }

    fn read(b: &RawBhs) -> Result<Self, PduError> {
        let (stat_sn, exp_cmd_sn, max_cmd_sn) = get_sequence(b);
        Ok(Reject {
            reason: b[OFF_RESPONSE],
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
            data_sn: get_u32(b, OFF_DATASN),
        })
    }
}

itt_field!(
    NopIn,
    ScsiResponse,
    TaskMgmtResponse,
    LoginResponse,
    TextResponse,
    DataIn,
    LogoutResponse,
    R2t
);

/// An Async Message answers no task.
impl TaskTag for AsyncMessage {
    fn itt(&self) -> u32 {
        RESERVED_TAG
    }
}

/// A Reject's own ITT is reserved; the rejected header in its data segment names the task.
impl TaskTag for Reject {
    fn itt(&self) -> u32 {
        RESERVED_TAG
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sense_segments() {
        assert_eq!(
            sense_from_segment(&sense_segment(&[0x70, 0, 5])),
            &[0x70, 0, 5]
        );
        assert_eq!(sense_from_segment(&[0, 9, 1]), &[1]);
        assert_eq!(sense_from_segment(&[]), &[] as &[u8]);
    }

    #[test]
    fn sequence_numbers_are_stamped_where_every_response_reads_them() {
        let mut raw = super::super::Bhs::from(R2t {
            ttt: 9,
            ..Default::default()
        })
        .encode(0, 0);
        stamp_sequence_numbers(&mut raw, 7, 8, 71);
        let back = R2t::read(&raw).expect("decodes");
        assert_eq!((back.stat_sn, back.exp_cmd_sn, back.max_cmd_sn), (7, 8, 71));
        assert_eq!(back.ttt, 9, "other fields untouched");
    }
}
