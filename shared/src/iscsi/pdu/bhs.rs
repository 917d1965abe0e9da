//! The typed basic header segment: one variant per opcode, dispatching to the header types of
//! `initiator.rs` and `target.rs`.

use super::codes::Opcode;
use super::fields::{Header, RawBhs, TaskTag, OFF_OPCODE};
use super::frame::put_segment_lengths;
use super::initiator::{
    DataOut, LoginRequest, LogoutRequest, NopOut, ScsiCommand, Snack, TaskMgmtRequest, TextRequest,
};
use super::target::{
    AsyncMessage, DataIn, LoginResponse, LogoutResponse, NopIn, R2t, Reject, ScsiResponse,
    TaskMgmtResponse, TextResponse,
};
use super::{PduError, BHS_LEN};

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

/// `$body` with `$h` bound to the header inside `$bhs`, whatever its opcode.
macro_rules! with_header {
    ($bhs:expr, $h:ident => $body:expr) => {
        match $bhs {
            Bhs::NopOut($h) => $body,
            Bhs::ScsiCommand($h) => $body,
            Bhs::TaskMgmtRequest($h) => $body,
            Bhs::LoginRequest($h) => $body,
            Bhs::TextRequest($h) => $body,
            Bhs::DataOut($h) => $body,
            Bhs::LogoutRequest($h) => $body,
            Bhs::Snack($h) => $body,
            Bhs::NopIn($h) => $body,
            Bhs::ScsiResponse($h) => $body,
            Bhs::TaskMgmtResponse($h) => $body,
            Bhs::LoginResponse($h) => $body,
            Bhs::TextResponse($h) => $body,
            Bhs::DataIn($h) => $body,
            Bhs::LogoutResponse($h) => $body,
            Bhs::R2t($h) => $body,
            Bhs::AsyncMessage($h) => $body,
            Bhs::Reject($h) => $body,
        }
    };
}

/// `From<Header> for Bhs`, and the opcode of each header type, so that [`Bhs::opcode`] and
/// [`Bhs::decode`] cannot disagree.
macro_rules! header_variants {
    ($($name:ident),*) => {
        $(impl From<$name> for Bhs {
            fn from(value: $name) -> Bhs {
                Bhs::$name(value)
            }
        })*

        /// Reads the header of `opcode` from `b`.
        fn read_header(opcode: Opcode, b: &RawBhs) -> Result<Bhs, PduError> {
            match opcode {
                $(Opcode::$name => $name::read(b).map(Bhs::$name),)*
            }
        }
    };
}
header_variants!(
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

/// The opcode of one header type (for [`with_header`]).
fn opcode_of<H: Header>(_: &H) -> Opcode {
    H::OPCODE
}

impl Bhs {
    /// The opcode of this header.
    pub fn opcode(&self) -> Opcode {
        with_header!(self, h => opcode_of(h))
    }

    /// The Initiator Task Tag ([`super::RESERVED_TAG`] for Async Message and Reject).
    pub fn itt(&self) -> u32 {
        with_header!(self, h => h.itt())
    }

    /// The 48 header bytes, with TotalAHSLength `ahs_words` (4-byte words) and DataSegmentLength
    /// `data_len`. The caller guarantees `data_len <= MAX_DATA_SEGMENT_LEN`.
    pub fn encode(&self, ahs_words: u8, data_len: usize) -> [u8; BHS_LEN] {
        let mut b = [0u8; BHS_LEN];
        b[OFF_OPCODE] = self.opcode() as u8;
        put_segment_lengths(&mut b, ahs_words, data_len);
        with_header!(self, h => h.write(&mut b));
        b
    }

    /// Decodes a raw header. The lengths it carries are read with
    /// [`super::frame::segment_lengths`].
    pub fn decode(b: &[u8; BHS_LEN]) -> Result<Bhs, PduError> {
        read_header(Opcode::from_byte(b[OFF_OPCODE])?, b)
    }
}

#[cfg(test)]
mod tests {
    use super::super::codes::*;
    use super::super::test_support::login_request;
    use super::super::RESERVED_TAG;
    use super::*;

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
}
