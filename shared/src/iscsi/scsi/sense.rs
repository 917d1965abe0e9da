//! Sense data (SPC-4 §4.5) and how a failed command is answered: CHECK CONDITION with sense, or
//! a status without sense such as RESERVATION CONFLICT.

use super::codes::{asc, status, SenseKey};
use super::{need, ScsiError};

/// Length of fixed-format sense data as the target sends it (SPC-4 §4.5.3).
pub const FIXED_SENSE_LEN: usize = 18;

/// Where in the CDB or parameter list an ILLEGAL REQUEST points (SPC-4 §4.5.2.4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldPointer {
    /// `true`: the field is in the CDB; `false`: in the parameter data.
    pub in_cdb: bool,
    /// Byte offset of the field.
    pub byte: u16,
    /// Bit of the field, when it is not the whole byte.
    pub bit: Option<u8>,
}

/// Decoded sense data, fixed or descriptor format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sense {
    /// Sense key.
    pub key: SenseKey,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// The INFORMATION field (e.g. the first LBA that miscompared), when valid.
    pub information: Option<u64>,
    /// The sense-key specific field pointer, when set.
    pub field_pointer: Option<FieldPointer>,
}

impl Sense {
    /// Sense with a key and an ASC/ASCQ pair, nothing else.
    pub fn new(key: SenseKey, (asc, ascq): (u8, u8)) -> Self {
        Self {
            key,
            asc,
            ascq,
            information: None,
            field_pointer: None,
        }
    }

    /// ILLEGAL REQUEST with an ASC/ASCQ pair.
    pub fn illegal_request(code: (u8, u8)) -> Self {
        Self::new(SenseKey::IllegalRequest, code)
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN CDB pointing at `byte` (and `bit`).
    pub fn invalid_field_in_cdb(byte: u16, bit: Option<u8>) -> Self {
        Self {
            field_pointer: Some(FieldPointer {
                in_cdb: true,
                byte,
                bit,
            }),
            ..Self::illegal_request(asc::INVALID_FIELD_IN_CDB)
        }
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST pointing at `byte`.
    pub fn invalid_field_in_parameter_list(byte: u16) -> Self {
        Self {
            field_pointer: Some(FieldPointer {
                in_cdb: false,
                byte,
                bit: None,
            }),
            ..Self::illegal_request(asc::INVALID_FIELD_IN_PARAMETER_LIST)
        }
    }

    /// ILLEGAL REQUEST, INVALID COMMAND OPERATION CODE (byte 0 of the CDB).
    pub fn invalid_opcode() -> Self {
        Self {
            field_pointer: Some(FieldPointer {
                in_cdb: true,
                byte: 0,
                bit: None,
            }),
            ..Self::illegal_request(asc::INVALID_COMMAND_OPERATION_CODE)
        }
    }

    /// ILLEGAL REQUEST, LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub fn lba_out_of_range() -> Self {
        Self::illegal_request(asc::LBA_OUT_OF_RANGE)
    }

    /// Fixed-format sense data (response code 0x70, current error), 18 bytes (SPC-4 §4.5.3).
    pub fn to_fixed(&self) -> [u8; FIXED_SENSE_LEN] {
        let mut out = [0u8; FIXED_SENSE_LEN];
        out[0] = 0x70;
        out[2] = self.key as u8;
        if let Some(info) = self.information {
            // The fixed format holds 4 bytes of INFORMATION; VALID says they are meaningful.
            if let Ok(info) = u32::try_from(info) {
                out[0] |= 0x80;
                out[3..7].copy_from_slice(&info.to_be_bytes());
            }
        }
        out[7] = (FIXED_SENSE_LEN - 8) as u8;
        out[12] = self.asc;
        out[13] = self.ascq;
        if let Some(fp) = self.field_pointer {
            out[15] = 0x80 | if fp.in_cdb { 0x40 } else { 0 };
            if let Some(bit) = fp.bit {
                out[15] |= 0x08 | (bit & 0x07);
            }
            out[16..18].copy_from_slice(&fp.byte.to_be_bytes());
        }
        out
    }

    /// Parses fixed (0x70/0x71) or descriptor (0x72/0x73) format sense data.
    pub fn parse(data: &[u8]) -> Result<Self, ScsiError> {
        let first = *data.first().ok_or(ScsiError::Truncated {
            what: "sense data",
            need: 1,
            got: 0,
        })?;
        match first & 0x7f {
            0x70 | 0x71 => {
                need(data, 14, "fixed sense data")?;
                let key = SenseKey::from_u8(data[2]).ok_or(ScsiError::ReservedSenseKey(data[2]))?;
                let information = (first & 0x80 != 0)
                    .then(|| u64::from(u32::from_be_bytes([data[3], data[4], data[5], data[6]])));
                let field_pointer =
                    (data.len() >= 18 && data[15] & 0x80 != 0).then(|| FieldPointer {
                        in_cdb: data[15] & 0x40 != 0,
                        byte: u16::from_be_bytes([data[16], data[17]]),
                        bit: (data[15] & 0x08 != 0).then_some(data[15] & 0x07),
                    });
                Ok(Self {
                    key,
                    asc: data[12],
                    ascq: data[13],
                    information,
                    field_pointer,
                })
            }
            0x72 | 0x73 => {
                need(data, 8, "descriptor sense data")?;
                let key = SenseKey::from_u8(data[1]).ok_or(ScsiError::ReservedSenseKey(data[1]))?;
                let mut sense = Self::new(key, (data[2], data[3]));
                // Walk the descriptors (SPC-4 §4.5.2): 0x00 information, 0x02 sense-key specific.
                let end = (8 + usize::from(data[7])).min(data.len());
                let mut at = 8;
                while at + 2 <= end {
                    let kind = data[at];
                    let len = usize::from(data[at + 1]);
                    let body = &data[at + 2..(at + 2 + len).min(end)];
                    if kind == 0x00 && body.len() >= 10 {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(&body[2..10]);
                        sense.information = Some(u64::from_be_bytes(b));
                    } else if kind == 0x02 && body.len() >= 5 && body[2] & 0x80 != 0 {
                        sense.field_pointer = Some(FieldPointer {
                            in_cdb: body[2] & 0x40 != 0,
                            byte: u16::from_be_bytes([body[3], body[4]]),
                            bit: (body[2] & 0x08 != 0).then_some(body[2] & 0x07),
                        });
                    }
                    at += 2 + len;
                }
                Ok(sense)
            }
            other => Err(ScsiError::UnknownSenseFormat(other)),
        }
    }
}

/// How a command that did not end in GOOD is answered (SAM-5 §5.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// CHECK CONDITION with sense data.
    Check(Sense),
    /// RESERVATION CONFLICT: a reservation held through another I_T nexus forbids the command.
    /// No sense data goes with this status (SPC-4 §5.13.1).
    ReservationConflict,
}

impl Failure {
    /// The SCSI status byte.
    pub fn status(&self) -> u8 {
        match self {
            Failure::Check(_) => status::CHECK_CONDITION,
            Failure::ReservationConflict => status::RESERVATION_CONFLICT,
        }
    }

    /// The sense data, for CHECK CONDITION.
    pub fn sense(&self) -> Option<&Sense> {
        match self {
            Failure::Check(s) => Some(s),
            Failure::ReservationConflict => None,
        }
    }
}

impl From<Sense> for Failure {
    fn from(sense: Sense) -> Self {
        Failure::Check(sense)
    }
}
