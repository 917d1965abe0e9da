//! iSCSI codec (RFC 7143), shared by the agent's target and the conductor's initiator.
//!
//! Pure code: PDUs, login/text key negotiation, CHAP, digests, SCSI CDBs and sense data.
//! No sockets.
//!
//! # Overview
//! - [`pdu`]: [`Pdu`] = typed [`Bhs`] (one struct per opcode) + AHS + data segment ([`Bytes`]);
//!   [`Pdu::encode_parts`] for vectored writes, [`PduDecoder`] to frame PDUs out of a receive
//!   buffer, padding and CRC32C digests handled in both. Status and reason code tables
//!   ([`LoginStatus`], `scsi_status`, `reject_reason`, ...). Serial number comparisons.
//! - [`keys`]: `key=value` texts ([`TextKeys`]), numeric/boolean/binary values, the operational
//!   key negotiation for either role ([`Negotiation`], [`OperationalParams`]) and SendTargets
//!   answers.
//! - [`chap`]: CHAP-MD5 responses, challenges and the initiator's answer (one-way and mutual).
//! - [`digest`]: CRC32C as iSCSI sends it.
//! - [`session`]: what both ends hold after a login ([`LoggedIn`], [`SessionKind`]).
//! - iSCSI names (including Ironic's `iqn-<uuid>` form) are checked by [`crate::iqn`].
//!
//! A typical exchange on the initiator side:
//! ```
//! use vmdeploy_shared::iscsi::{Digests, Lun, Pdu, PduDecoder, ScsiCommand, ScsiResponse};
//! let cmd = ScsiCommand { final_: true, read: true, lun: Lun::from_number(1), itt: 1,
//!     expected_data_len: 32, ..Default::default() };
//! let wire = Pdu::new(cmd).encode(Digests::NONE).expect("small PDU");
//! // ... send `wire`, then feed received bytes to a decoder:
//! let reply = Pdu::new(ScsiResponse { itt: 1, ..Default::default() }).encode(Digests::NONE).unwrap();
//! let mut buf = bytes::BytesMut::from(&reply[..]);
//! let pdu = PduDecoder::new(Digests::NONE, 8192).decode(&mut buf).unwrap().unwrap();
//! assert_eq!(pdu.bhs.itt(), 1);
//! ```
//!
//! [`Bytes`]: bytes::Bytes

pub mod chap;
pub mod digest;
pub mod keys;
pub mod pdu;
pub mod scsi;
pub mod session;

pub use chap::{ChapChallenge, ChapCredentials, ChapError};
pub use digest::Digests;
pub use keys::{KeysError, Negotiation, OperationalParams, Role, TextKeys};
pub use pdu::{
    Ahs, AsyncMessage, Bhs, DataIn, DataOut, EncodedPdu, LoginRequest, LoginResponse, LoginStage,
    LoginStatus, LogoutRequest, LogoutResponse, Lun, NopIn, NopOut, Opcode, Pdu, PduDecoder,
    PduError, R2t, Reject, ScsiCommand, ScsiResponse, Snack, TaskMgmtRequest, TaskMgmtResponse,
    TextRequest, TextResponse, BHS_LEN, RESERVED_TAG,
};
pub use session::{LoggedIn, SessionKind};

/// The well-known iSCSI TCP port (RFC 7143 §13.2; docs/architecture.md §4).
pub const ISCSI_PORT: u16 = 3260;
