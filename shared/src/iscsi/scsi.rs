//! SCSI commands carried by iSCSI: operation codes, CDB parsing (target side) and building
//! (initiator side), sense data, and the VPD/capacity payloads both ends exchange.
//!
//! References: SPC-4 (INQUIRY, MODE SENSE, REPORT LUNS, REQUEST SENSE, sense data §4.5),
//! SBC-3 (READ/WRITE/VERIFY/WRITE SAME/UNMAP/SYNCHRONIZE CACHE, READ CAPACITY, VPD pages B0-B2).
//! Pure code: no I/O.

use thiserror::Error;

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
    /// MODE SENSE (6) (SPC-4 §6.11).
    pub const MODE_SENSE_6: u8 = 0x1a;
    /// READ CAPACITY (10) (SBC-3 §5.19).
    pub const READ_CAPACITY_10: u8 = 0x25;
    /// READ (10).
    pub const READ_10: u8 = 0x28;
    /// WRITE (10).
    pub const WRITE_10: u8 = 0x2a;
    /// VERIFY (10).
    pub const VERIFY_10: u8 = 0x2f;
    /// SYNCHRONIZE CACHE (10).
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    /// WRITE SAME (10).
    pub const WRITE_SAME_10: u8 = 0x41;
    /// UNMAP.
    pub const UNMAP: u8 = 0x42;
    /// MODE SENSE (10).
    pub const MODE_SENSE_10: u8 = 0x5a;
    /// READ (16).
    pub const READ_16: u8 = 0x88;
    /// COMPARE AND WRITE (SBC-3 §5.2).
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    /// WRITE (16).
    pub const WRITE_16: u8 = 0x8a;
    /// VERIFY (16).
    pub const VERIFY_16: u8 = 0x8f;
    /// SYNCHRONIZE CACHE (16).
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    /// WRITE SAME (16).
    pub const WRITE_SAME_16: u8 = 0x93;
    /// SERVICE ACTION IN (16); service action 0x10 is READ CAPACITY (16).
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    /// REPORT LUNS (SPC-4 §6.33).
    pub const REPORT_LUNS: u8 = 0xa0;
    /// READ (12).
    pub const READ_12: u8 = 0xa8;
    /// WRITE (12).
    pub const WRITE_12: u8 = 0xaa;
    /// VERIFY (12).
    pub const VERIFY_12: u8 = 0xaf;
}

/// READ CAPACITY (16) service action of SERVICE ACTION IN (16).
pub const SA_READ_CAPACITY_16: u8 = 0x10;
/// GET LBA STATUS service action of SERVICE ACTION IN (16) (SBC-3 §5.16).
pub const SA_GET_LBA_STATUS: u8 = 0x12;

/// SCSI status codes (SAM-5 §5.3).
pub mod status {
    /// GOOD.
    pub const GOOD: u8 = 0x00;
    /// CHECK CONDITION: sense data follows.
    pub const CHECK_CONDITION: u8 = 0x02;
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
    /// SAVING PARAMETERS NOT SUPPORTED.
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: (u8, u8) = (0x39, 0x00);
    /// INTERNAL TARGET FAILURE.
    pub const INTERNAL_TARGET_FAILURE: (u8, u8) = (0x44, 0x00);
}

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

/// Errors decoding SCSI payloads received from a peer.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ScsiError {
    /// A payload was shorter than its format needs.
    #[error("{what} truncated: need {need} bytes, got {got}")]
    Truncated {
        /// What was being decoded.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        got: usize,
    },
    /// The sense data response code is neither fixed nor descriptor format.
    #[error("unknown sense data response code {0:#04x}")]
    UnknownSenseFormat(u8),
    /// The sense key is a reserved value.
    #[error("reserved sense key {0:#x}")]
    ReservedSenseKey(u8),
    /// A CDB longer than 16 bytes was asked for (extended CDBs are not supported).
    #[error("CDB of {0} bytes does not fit the 16-byte iSCSI CDB field")]
    CdbTooLong(usize),
}

fn need(data: &[u8], len: usize, what: &'static str) -> Result<(), ScsiError> {
    if data.len() < len {
        return Err(ScsiError::Truncated {
            what,
            need: len,
            got: data.len(),
        });
    }
    Ok(())
}

/// A CDB as the target decoded it. Fields not listed are checked during parsing (reserved bits,
/// protection fields) and rejected with INVALID FIELD IN CDB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScsiCommand {
    /// TEST UNIT READY.
    TestUnitReady,
    /// REQUEST SENSE.
    RequestSense {
        /// DESC bit: descriptor format asked for.
        descriptor: bool,
        /// Allocation length.
        allocation_length: u32,
    },
    /// INQUIRY.
    Inquiry {
        /// EVPD bit: a VPD page is asked for.
        evpd: bool,
        /// VPD page code (0 when `evpd` is false).
        page_code: u8,
        /// Allocation length.
        allocation_length: u32,
    },
    /// MODE SENSE (6) or (10).
    ModeSense {
        /// The 10-byte form (8-byte header) rather than the 6-byte form (4-byte header).
        ten: bool,
        /// DBD: no block descriptors.
        disable_block_descriptors: bool,
        /// Page control (0 current, 1 changeable, 2 default, 3 saved).
        page_control: u8,
        /// Page code (0x3f = all pages).
        page_code: u8,
        /// Subpage code (0xff = all subpages).
        subpage_code: u8,
        /// Allocation length.
        allocation_length: u32,
    },
    /// READ CAPACITY (10).
    ReadCapacity10,
    /// READ CAPACITY (16).
    ReadCapacity16 {
        /// Allocation length.
        allocation_length: u32,
    },
    /// GET LBA STATUS: provisioning status of the extent starting at `lba`.
    GetLbaStatus {
        /// Starting LBA.
        lba: u64,
        /// Allocation length.
        allocation_length: u32,
    },
    /// REPORT LUNS.
    ReportLuns {
        /// SELECT REPORT.
        select_report: u8,
        /// Allocation length.
        allocation_length: u32,
    },
    /// READ (6/10/12/16).
    Read(BlockRange),
    /// WRITE (6/10/12/16).
    Write(BlockRange),
    /// VERIFY (10/12/16).
    Verify {
        /// Blocks to verify.
        range: BlockRange,
        /// BYTCHK: 0 medium check only, 1 compare with data-out, 3 compare with one block.
        byte_check: u8,
    },
    /// WRITE SAME (10/16).
    WriteSame {
        /// Blocks to write.
        range: BlockRange,
        /// UNMAP bit: the blocks may be deallocated instead.
        unmap: bool,
        /// NDOB (16 only): no data-out buffer, write zeros.
        no_data_out: bool,
    },
    /// UNMAP with its parameter list length.
    Unmap {
        /// Parameter list length.
        parameter_list_length: u32,
    },
    /// COMPARE AND WRITE: compare `range` with the first half of the data-out, write the second
    /// half when equal.
    CompareAndWrite {
        /// Blocks compared and written (NUMBER OF LOGICAL BLOCKS, byte 13).
        range: BlockRange,
    },
    /// SYNCHRONIZE CACHE (10/16).
    SynchronizeCache {
        /// Blocks to flush (0 blocks: to the end of the medium).
        range: BlockRange,
    },
}

/// A logical block range from a CDB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRange {
    /// First logical block.
    pub lba: u64,
    /// Number of blocks.
    pub blocks: u32,
    /// FUA bit (write through / read from medium).
    pub fua: bool,
}

impl BlockRange {
    /// Whether the range lies within a medium of `total_blocks` blocks (SBC-3 §4.5: also for
    /// zero-length transfers, the LBA must be within the medium).
    pub fn fits(&self, total_blocks: u64) -> bool {
        self.lba
            .checked_add(u64::from(self.blocks))
            .is_some_and(|end| end <= total_blocks && (self.lba < total_blocks || self.blocks == 0))
            && self.lba <= total_blocks
    }
}

/// Length in bytes of the CDB that starts with `op` (SAM-5 §5.2: the group code in the top bits).
pub fn cdb_len(op: u8) -> usize {
    match op >> 5 {
        0 => 6,
        1 | 2 => 10,
        4 => 16,
        5 => 12,
        _ => 16,
    }
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// Rejects protection information fields (RDPROTECT/WRPROTECT/VRPROTECT in byte 1, bits 7-5):
/// the LUN has no protection information (SBC-3 §4.22).
fn check_no_protect(cdb: &[u8]) -> Result<(), Sense> {
    if cdb[1] & 0xe0 != 0 {
        return Err(Sense::invalid_field_in_cdb(1, Some(7)));
    }
    Ok(())
}

impl ScsiCommand {
    /// Decodes a CDB (the 16-byte iSCSI CDB field; only the first `cdb_len` bytes matter).
    /// An unsupported command gives INVALID COMMAND OPERATION CODE, a bad field INVALID FIELD IN CDB.
    pub fn parse(cdb: &[u8; 16]) -> Result<Self, Sense> {
        use opcode::*;
        let c = cdb;
        Ok(match c[0] {
            TEST_UNIT_READY => Self::TestUnitReady,
            REQUEST_SENSE => Self::RequestSense {
                descriptor: c[1] & 0x01 != 0,
                allocation_length: u32::from(c[4]),
            },
            INQUIRY => {
                let evpd = c[1] & 0x01 != 0;
                if c[1] & 0x02 != 0 {
                    // CMDDT is obsolete (SPC-4 §6.6.1).
                    return Err(Sense::invalid_field_in_cdb(1, Some(1)));
                }
                if !evpd && c[2] != 0 {
                    return Err(Sense::invalid_field_in_cdb(2, None));
                }
                Self::Inquiry {
                    evpd,
                    page_code: c[2],
                    allocation_length: u32::from(be16(&c[3..5])),
                }
            }
            MODE_SENSE_6 | MODE_SENSE_10 => {
                let ten = c[0] == MODE_SENSE_10;
                Self::ModeSense {
                    ten,
                    disable_block_descriptors: c[1] & 0x08 != 0,
                    page_control: c[2] >> 6,
                    page_code: c[2] & 0x3f,
                    subpage_code: c[3],
                    allocation_length: if ten {
                        u32::from(be16(&c[7..9]))
                    } else {
                        u32::from(c[4])
                    },
                }
            }
            READ_CAPACITY_10 => {
                // PMI is obsolete; an LBA without PMI is an error (SBC-3 §5.19).
                if c[8] & 0x01 == 0 && be32(&c[2..6]) != 0 {
                    return Err(Sense::invalid_field_in_cdb(2, None));
                }
                Self::ReadCapacity10
            }
            SERVICE_ACTION_IN_16 => match c[1] & 0x1f {
                SA_READ_CAPACITY_16 => Self::ReadCapacity16 {
                    allocation_length: be32(&c[10..14]),
                },
                SA_GET_LBA_STATUS => Self::GetLbaStatus {
                    lba: be64(&c[2..10]),
                    allocation_length: be32(&c[10..14]),
                },
                _ => return Err(Sense::invalid_field_in_cdb(1, Some(4))),
            },
            REPORT_LUNS => Self::ReportLuns {
                select_report: c[2],
                allocation_length: be32(&c[6..10]),
            },
            READ_6 | WRITE_6 => {
                let lba = u64::from(u32::from_be_bytes([0, c[1] & 0x1f, c[2], c[3]]));
                // A transfer length of 0 means 256 blocks in the 6-byte forms (SBC-3 §5.15).
                let blocks = if c[4] == 0 { 256 } else { u32::from(c[4]) };
                let range = BlockRange {
                    lba,
                    blocks,
                    fua: false,
                };
                if c[0] == READ_6 {
                    Self::Read(range)
                } else {
                    Self::Write(range)
                }
            }
            READ_10 | WRITE_10 | VERIFY_10 => {
                check_no_protect(c)?;
                let range = BlockRange {
                    lba: u64::from(be32(&c[2..6])),
                    blocks: u32::from(be16(&c[7..9])),
                    fua: c[1] & 0x08 != 0,
                };
                Self::rw(c, range)?
            }
            READ_12 | WRITE_12 | VERIFY_12 => {
                check_no_protect(c)?;
                let range = BlockRange {
                    lba: u64::from(be32(&c[2..6])),
                    blocks: be32(&c[6..10]),
                    fua: c[1] & 0x08 != 0,
                };
                Self::rw(c, range)?
            }
            READ_16 | WRITE_16 | VERIFY_16 => {
                check_no_protect(c)?;
                let range = BlockRange {
                    lba: be64(&c[2..10]),
                    blocks: be32(&c[10..14]),
                    fua: c[1] & 0x08 != 0,
                };
                Self::rw(c, range)?
            }
            WRITE_SAME_10 | WRITE_SAME_16 => {
                check_no_protect(c)?;
                let sixteen = c[0] == WRITE_SAME_16;
                if c[1] & 0x02 != 0 && !sixteen {
                    return Err(Sense::invalid_field_in_cdb(1, Some(1)));
                }
                if c[1] & 0x10 != 0 {
                    // ANCHOR is not supported (no anchored state, SBC-3 §4.7.3.4).
                    return Err(Sense::invalid_field_in_cdb(1, Some(4)));
                }
                let range = if sixteen {
                    BlockRange {
                        lba: be64(&c[2..10]),
                        blocks: be32(&c[10..14]),
                        fua: false,
                    }
                } else {
                    BlockRange {
                        lba: u64::from(be32(&c[2..6])),
                        blocks: u32::from(be16(&c[7..9])),
                        fua: false,
                    }
                };
                Self::WriteSame {
                    range,
                    unmap: c[1] & 0x08 != 0,
                    no_data_out: sixteen && c[1] & 0x01 != 0,
                }
            }
            UNMAP => {
                if c[1] & 0x01 != 0 {
                    // ANCHOR.
                    return Err(Sense::invalid_field_in_cdb(1, Some(0)));
                }
                Self::Unmap {
                    parameter_list_length: u32::from(be16(&c[7..9])),
                }
            }
            COMPARE_AND_WRITE => {
                check_no_protect(c)?;
                Self::CompareAndWrite {
                    range: BlockRange {
                        lba: be64(&c[2..10]),
                        blocks: u32::from(c[13]),
                        fua: c[1] & 0x08 != 0,
                    },
                }
            }
            SYNCHRONIZE_CACHE_10 => Self::SynchronizeCache {
                range: BlockRange {
                    lba: u64::from(be32(&c[2..6])),
                    blocks: u32::from(be16(&c[7..9])),
                    fua: false,
                },
            },
            SYNCHRONIZE_CACHE_16 => Self::SynchronizeCache {
                range: BlockRange {
                    lba: be64(&c[2..10]),
                    blocks: be32(&c[10..14]),
                    fua: false,
                },
            },
            _ => return Err(Sense::invalid_opcode()),
        })
    }

    fn rw(c: &[u8; 16], range: BlockRange) -> Result<Self, Sense> {
        use opcode::*;
        Ok(match c[0] {
            READ_10 | READ_12 | READ_16 => Self::Read(range),
            WRITE_10 | WRITE_12 | WRITE_16 => Self::Write(range),
            _ => {
                let byte_check = (c[1] >> 1) & 0x03;
                if byte_check == 2 {
                    return Err(Sense::invalid_field_in_cdb(1, Some(2)));
                }
                Self::Verify { range, byte_check }
            }
        })
    }
}

/// CDB builders for the initiator side. Each returns the 16-byte iSCSI CDB field.
pub mod build {
    use super::opcode::*;
    use super::SA_READ_CAPACITY_16;

    /// TEST UNIT READY.
    pub fn test_unit_ready() -> [u8; 16] {
        [0u8; 16]
    }

    /// INQUIRY (standard data when `page` is `None`).
    pub fn inquiry(page: Option<u8>, allocation_length: u16) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = INQUIRY;
        if let Some(page) = page {
            c[1] = 0x01;
            c[2] = page;
        }
        c[3..5].copy_from_slice(&allocation_length.to_be_bytes());
        c
    }

    /// READ CAPACITY (16).
    pub fn read_capacity_16(allocation_length: u32) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = SERVICE_ACTION_IN_16;
        c[1] = SA_READ_CAPACITY_16;
        c[10..14].copy_from_slice(&allocation_length.to_be_bytes());
        c
    }

    /// READ (16).
    pub fn read_16(lba: u64, blocks: u32) -> [u8; 16] {
        rw16(READ_16, lba, blocks, false)
    }

    /// WRITE (16), with FUA when `fua`.
    pub fn write_16(lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
        rw16(WRITE_16, lba, blocks, fua)
    }

    /// SYNCHRONIZE CACHE (16) of the whole medium.
    pub fn synchronize_cache_16() -> [u8; 16] {
        rw16(SYNCHRONIZE_CACHE_16, 0, 0, false)
    }

    /// REPORT LUNS (select report 0).
    pub fn report_luns(allocation_length: u32) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = REPORT_LUNS;
        c[6..10].copy_from_slice(&allocation_length.to_be_bytes());
        c
    }

    fn rw16(op: u8, lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = op;
        if fua {
            c[1] = 0x08;
        }
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[10..14].copy_from_slice(&blocks.to_be_bytes());
        c
    }
}

/// Capacity of a logical unit as READ CAPACITY (16) describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Number of logical blocks.
    pub blocks: u64,
    /// Logical block length in bytes.
    pub block_len: u32,
    /// log2(physical blocks per logical block).
    pub physical_exponent: u8,
    /// LBPME: logical block provisioning (UNMAP) enabled.
    pub thin: bool,
    /// LBPRZ: unmapped blocks read as zeros.
    pub unmapped_reads_zero: bool,
}

impl Capacity {
    /// READ CAPACITY (10) parameter data (SBC-3 §5.19.2): 0xFFFFFFFF when too large.
    pub fn to_read_capacity_10(&self) -> [u8; 8] {
        let mut out = [0u8; 8];
        let last = self.blocks.saturating_sub(1);
        let last = u32::try_from(last).unwrap_or(u32::MAX);
        out[0..4].copy_from_slice(&last.to_be_bytes());
        out[4..8].copy_from_slice(&self.block_len.to_be_bytes());
        out
    }

    /// READ CAPACITY (16) parameter data, 32 bytes (SBC-3 §5.20.2).
    pub fn to_read_capacity_16(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[0..8].copy_from_slice(&self.blocks.saturating_sub(1).to_be_bytes());
        out[8..12].copy_from_slice(&self.block_len.to_be_bytes());
        out[13] = self.physical_exponent & 0x0f;
        if self.thin {
            out[14] |= 0x80;
        }
        if self.unmapped_reads_zero {
            out[14] |= 0x40;
        }
        out
    }

    /// Parses READ CAPACITY (16) parameter data.
    pub fn parse_read_capacity_16(data: &[u8]) -> Result<Self, ScsiError> {
        need(data, 32, "READ CAPACITY (16) data")?;
        Ok(Self {
            blocks: be64(&data[0..8]).saturating_add(1),
            block_len: be32(&data[8..12]),
            physical_exponent: data[13] & 0x0f,
            thin: data[14] & 0x80 != 0,
            unmapped_reads_zero: data[14] & 0x40 != 0,
        })
    }
}

/// VPD page codes (SPC-4 §7.8, SBC-3 §6.6).
pub mod vpd {
    /// Supported VPD pages.
    pub const SUPPORTED_PAGES: u8 = 0x00;
    /// Unit serial number.
    pub const UNIT_SERIAL_NUMBER: u8 = 0x80;
    /// Device identification.
    pub const DEVICE_IDENTIFICATION: u8 = 0x83;
    /// Block limits (SBC).
    pub const BLOCK_LIMITS: u8 = 0xb0;
    /// Block device characteristics (SBC).
    pub const BLOCK_DEVICE_CHARACTERISTICS: u8 = 0xb1;
    /// Logical block provisioning (SBC).
    pub const LOGICAL_BLOCK_PROVISIONING: u8 = 0xb2;
}

/// Wraps a VPD page body in its 4-byte header (peripheral type 0: direct access block device).
pub fn vpd_page(page_code: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + body.len());
    out.push(0x00);
    out.push(page_code);
    let len = u16::try_from(body.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body[..usize::from(len)]);
    out
}

/// One designation descriptor of the device identification page (SPC-4 §7.8.6.1).
pub fn designation_descriptor(
    protocol: Option<u8>,
    code_set: u8,
    association: u8,
    designator_type: u8,
    designator: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + designator.len());
    let piv = protocol.is_some();
    out.push((protocol.unwrap_or(0) << 4) | (code_set & 0x0f));
    out.push(if piv { 0x80 } else { 0 } | ((association & 0x03) << 4) | (designator_type & 0x0f));
    out.push(0);
    out.push(u8::try_from(designator.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(&designator[..usize::from(out[3])]);
    out
}

/// Truncates `data` to an allocation length (SPC-4 §4.2.5.6).
pub fn truncate_to(mut data: Vec<u8>, allocation_length: u32) -> Vec<u8> {
    let limit = usize::try_from(allocation_length).unwrap_or(usize::MAX);
    data.truncate(limit);
    data
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn read16_round_trips() {
        let c = build::read_16(0x1_0000_0001, 77);
        assert_eq!(
            ScsiCommand::parse(&c),
            Ok(ScsiCommand::Read(BlockRange {
                lba: 0x1_0000_0001,
                blocks: 77,
                fua: false
            }))
        );
    }

    #[test]
    fn read6_zero_means_256() {
        let mut c = [0u8; 16];
        c[0] = opcode::READ_6;
        c[3] = 5;
        let cmd = ScsiCommand::parse(&c).expect("valid read6");
        assert_eq!(
            cmd,
            ScsiCommand::Read(BlockRange {
                lba: 5,
                blocks: 256,
                fua: false
            })
        );
    }

    #[test]
    fn rdprotect_is_rejected() {
        let mut c = build::read_16(0, 1);
        c[1] |= 0x20;
        let sense = ScsiCommand::parse(&c).expect_err("rdprotect set");
        assert_eq!((sense.asc, sense.ascq), asc::INVALID_FIELD_IN_CDB);
    }

    #[test]
    fn unknown_opcode_gives_invalid_opcode() {
        let mut c = [0u8; 16];
        c[0] = 0xd5;
        let sense = ScsiCommand::parse(&c).expect_err("unknown opcode");
        assert_eq!(sense.key, SenseKey::IllegalRequest);
        assert_eq!((sense.asc, sense.ascq), asc::INVALID_COMMAND_OPERATION_CODE);
    }

    #[test]
    fn fixed_sense_round_trips() {
        let s = Sense::invalid_field_in_cdb(2, Some(3));
        let parsed = Sense::parse(&s.to_fixed()).expect("own sense parses");
        assert_eq!(parsed, s);
    }

    #[test]
    fn capacity_round_trips() {
        let cap = Capacity {
            blocks: 2_097_152,
            block_len: 512,
            physical_exponent: 3,
            thin: true,
            unmapped_reads_zero: true,
        };
        assert_eq!(
            Capacity::parse_read_capacity_16(&cap.to_read_capacity_16()),
            Ok(cap)
        );
        assert_eq!(
            &cap.to_read_capacity_10()[0..4],
            &2_097_151u32.to_be_bytes()
        );
    }

    #[test]
    fn block_range_fits() {
        let r = |lba, blocks| BlockRange {
            lba,
            blocks,
            fua: false,
        };
        assert!(r(0, 10).fits(10));
        assert!(!r(1, 10).fits(10));
        assert!(r(10, 0).fits(10));
        assert!(!r(11, 0).fits(10));
        assert!(!r(u64::MAX, 2).fits(10));
    }

    proptest! {
        #[test]
        fn parse_never_panics(cdb in proptest::array::uniform16(any::<u8>())) {
            let _ = ScsiCommand::parse(&cdb);
        }

        #[test]
        fn sense_parse_never_panics(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Sense::parse(&data);
        }

        #[test]
        fn capacity_parse_never_panics(data in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = Capacity::parse_read_capacity_16(&data);
        }
    }
}
