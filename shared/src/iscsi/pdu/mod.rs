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
//! Where to look:
//! - this file: [`Pdu`], [`PduDecoder`], [`PduError`];
//! - `codes.rs`: opcodes, login stages and statuses, and the one-byte code tables;
//! - `initiator.rs` / `target.rs`: the header of each opcode, initiator-to-target and
//!   target-to-initiator, with where its fields sit (the offsets are named in `fields.rs`);
//! - `bhs.rs`: the [`Bhs`] enum over them; `ahs.rs`: AHS; `lun.rs`: LUN addressing;
//! - `frame.rs`: lengths, limits, padding and digests of a PDU on the wire ([`FrameLayout`]);
//! - `serial.rs`: serial number arithmetic for CmdSN and StatSN.
//!
//! # Limitations
//! Reserved bits are written as zero and ignored when read (RFC 7143 §11.2: "reserved fields
//! ... MUST be ignored by the receiver"). Unknown opcodes are an error, as is a login stage of 2.
//! Markers (RFC 3720 Appendix A) are not supported; RFC 7143 removed them.

mod ahs;
mod bhs;
mod codes;
mod fields;
mod frame;
mod initiator;
mod lun;
mod serial;
mod target;

use bytes::{Buf, Bytes, BytesMut};
use thiserror::Error;

use super::digest::{crc32c, crc32c_append, digest_bytes, Digests, DIGEST_LEN};

pub use ahs::{ahs_type, Ahs};
pub use bhs::Bhs;
pub use codes::{
    logout_reason, logout_response, reject_reason, response_code, scsi_status, task_attr,
    tmf_function, tmf_response, LoginStage, LoginStatus, Opcode, ISCSI_VERSION,
};
pub use fields::{BHS_CDB_LEN, BHS_LEN};
pub use frame::{
    padded_len, segment_lengths, FrameLayout, MAX_DATA_SEGMENT_LEN, MAX_TOTAL_AHS_LEN,
};
pub use initiator::{
    DataOut, LoginRequest, LogoutRequest, NopOut, ScsiCommand, Snack, TaskMgmtRequest, TextRequest,
};
pub use lun::Lun;
pub use serial::{sn_le, sn_lt};
pub use target::{
    sense_from_segment, sense_segment, stamp_sequence_numbers, AsyncMessage, DataIn, LoginResponse,
    LogoutResponse, NopIn, R2t, Reject, ScsiResponse, TaskMgmtResponse, TextResponse,
};

/// Initiator Task Tag value reserved for PDUs that answer no task (RFC 7143 §11.9, §11.17).
pub const RESERVED_TAG: u32 = 0xffff_ffff;

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
        let ahs_words = ahs::total_ahs_words(&self.ahs)?;
        let ahs_len = usize::from(ahs_words) * 4;
        let mut head = Vec::with_capacity(BHS_LEN + ahs_len + DIGEST_LEN);
        head.extend_from_slice(&self.bhs.encode(ahs_words, self.data.len()));
        ahs::write_ahs(&self.ahs, &mut head);
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

    /// The layout of the PDU whose header is `bhs`: the one check of lengths, limits, padding
    /// and digests, shared with the target's piecewise reader.
    pub fn layout(&self, bhs: &[u8; BHS_LEN]) -> Result<FrameLayout, PduError> {
        FrameLayout::of(bhs, self.digests, self.max_data_segment_len)
    }

    /// Total wire length of the PDU starting at `buf`, or `None` when fewer than 48 bytes are
    /// there. Errors when the header announces more data than allowed.
    pub fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, PduError> {
        let Some(bhs) = buf.first_chunk::<BHS_LEN>() else {
            return Ok(None);
        };
        Ok(Some(self.layout(bhs)?.total_len()))
    }

    /// Takes one PDU off the front of `buf` when it is all there; `Ok(None)` when more bytes are
    /// needed (nothing is consumed then). The data segment shares `buf`'s allocation.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Pdu>, PduError> {
        let Some(bhs_bytes) = buf.first_chunk::<BHS_LEN>().copied() else {
            return Ok(None);
        };
        let layout = self.layout(&bhs_bytes)?;
        if buf.len() < layout.total_len() {
            return Ok(None);
        }
        let mut frame = buf.split_to(layout.total_len());
        let ahs_end = BHS_LEN + layout.ahs_len;
        if layout.digests.header {
            let computed = crc32c(&frame[..ahs_end]);
            let received = wire_digest(&frame[ahs_end..]);
            if computed != received {
                return Err(PduError::HeaderDigest { received, computed });
            }
        }
        let bhs = Bhs::decode(&bhs_bytes)?;
        let ahs = ahs::parse_ahs(&frame[BHS_LEN..ahs_end])?;
        frame.advance(layout.header_len());
        if layout.data_digest_len() > 0 {
            let padded = layout.data_len + layout.padding();
            if crc32c(&frame[..padded]) != wire_digest(&frame[padded..]) {
                return Err(PduError::DataDigest {
                    bhs: Box::new(bhs_bytes),
                });
            }
        }
        let data_len = layout.data_len;
        frame.truncate(data_len);
        Ok(Some(Pdu {
            bhs,
            ahs,
            data: frame.freeze(),
        }))
    }
}

/// The digest value in the first [`DIGEST_LEN`] bytes of `bytes` (the caller's frame has them).
fn wire_digest(bytes: &[u8]) -> u32 {
    let mut wire = [0u8; DIGEST_LEN];
    wire.copy_from_slice(&bytes[..DIGEST_LEN]);
    crate::iscsi::digest::digest_from_bytes(wire)
}

#[cfg(test)]
pub(super) mod test_support {
    use super::*;

    /// A Login Request as an initiator sends it in the operational stage.
    pub fn login_request() -> LoginRequest {
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
}

#[cfg(test)]
mod tests {
    use super::test_support::login_request;
    use super::*;

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
}
