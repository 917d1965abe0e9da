//! CDB decoding on the target side: [`ScsiCommand::parse`] turns the 16-byte iSCSI CDB field
//! into a command or the sense that rejects it. Reserved bits and unsupported fields are refused
//! here, before any data moves.

use super::codes::{
    opcode, pr_in, pr_out, SA_GET_LBA_STATUS, SA_READ_CAPACITY_16, SA_REPORT_SUPPORTED_OPCODES,
};
use super::{be16, be32, be64, Sense};

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
    /// WRITE AND VERIFY (10/12/16): write the data-out, then verify the medium.
    WriteAndVerify {
        /// Blocks to write.
        range: BlockRange,
        /// BYTCHK: compare the medium with the data-out after the write.
        byte_check: bool,
    },
    /// ORWRITE (16): each block becomes the bitwise OR of itself and the data-out.
    OrWrite(BlockRange),
    /// PRE-FETCH (10/16): a hint that `range` will be read.
    PreFetch {
        /// Blocks to fetch (0 blocks: to the end of the medium).
        range: BlockRange,
        /// IMMED: answer before the fetch is done.
        immediate: bool,
    },
    /// RESERVE (6): an SPC-2 reservation of the whole logical unit.
    Reserve6,
    /// RELEASE (6).
    Release6,
    /// PERSISTENT RESERVE IN.
    PersistentReserveIn {
        /// Service action ([`super::pr_in`]).
        service_action: u8,
        /// Allocation length.
        allocation_length: u32,
    },
    /// PERSISTENT RESERVE OUT.
    PersistentReserveOut {
        /// Service action ([`super::pr_out`]).
        service_action: u8,
        /// Scope (0: logical unit, the only one SPC-4 keeps).
        scope: u8,
        /// Reservation type ([`super::pr_type`]).
        pr_type: u8,
        /// Parameter list length.
        parameter_list_length: u32,
    },
    /// REPORT SUPPORTED OPERATION CODES.
    ReportSupportedOpcodes {
        /// RCTD: return command timeouts descriptors.
        timeouts: bool,
        /// REPORTING OPTIONS (0 all, 1 one opcode, 2 one opcode and service action, 3 either).
        options: u8,
        /// REQUESTED OPERATION CODE.
        opcode: u8,
        /// REQUESTED SERVICE ACTION.
        service_action: u16,
        /// Allocation length.
        allocation_length: u32,
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
            WRITE_AND_VERIFY_10 | WRITE_AND_VERIFY_12 | WRITE_AND_VERIFY_16 => {
                check_no_protect(c)?;
                // Byte 1: DPO (bit 4) is a cache hint and accepted; BYTCHK is bit 1 (SBC-3 §5.41;
                // SBC-4 widened it to bits 2-1, where 2 and 3 are not supported here).
                if c[1] & 0x0d != 0 {
                    let bit = if c[1] & 0x04 != 0 { 2 } else { 3 };
                    return Err(Sense::invalid_field_in_cdb(1, Some(bit)));
                }
                let (lba, blocks) = match c[0] {
                    WRITE_AND_VERIFY_10 => (u64::from(be32(&c[2..6])), u32::from(be16(&c[7..9]))),
                    WRITE_AND_VERIFY_12 => (u64::from(be32(&c[2..6])), be32(&c[6..10])),
                    _ => (be64(&c[2..10]), be32(&c[10..14])),
                };
                Self::WriteAndVerify {
                    // The data is on the medium before GOOD, as if FUA were set.
                    range: BlockRange {
                        lba,
                        blocks,
                        fua: true,
                    },
                    byte_check: c[1] & 0x02 != 0,
                }
            }
            ORWRITE_16 => {
                check_no_protect(c)?;
                if c[1] & 0x07 != 0 {
                    return Err(Sense::invalid_field_in_cdb(1, Some(2)));
                }
                Self::OrWrite(BlockRange {
                    lba: be64(&c[2..10]),
                    blocks: be32(&c[10..14]),
                    fua: c[1] & 0x08 != 0,
                })
            }
            PRE_FETCH_10 | PRE_FETCH_16 => {
                if c[1] & 0xfd != 0 {
                    return Err(Sense::invalid_field_in_cdb(1, None));
                }
                let (lba, blocks) = if c[0] == PRE_FETCH_10 {
                    (u64::from(be32(&c[2..6])), u32::from(be16(&c[7..9])))
                } else {
                    (be64(&c[2..10]), be32(&c[10..14]))
                };
                Self::PreFetch {
                    range: BlockRange {
                        lba,
                        blocks,
                        fua: false,
                    },
                    immediate: c[1] & 0x02 != 0,
                }
            }
            RESERVE_6 | RELEASE_6 => {
                // 3RDPTY and the extent bit are obsolete (SPC-2 §7.21): whole-unit reservations
                // for the sending initiator only.
                if c[1] & 0x1f != 0 {
                    return Err(Sense::invalid_field_in_cdb(1, None));
                }
                if c[0] == RESERVE_6 {
                    Self::Reserve6
                } else {
                    Self::Release6
                }
            }
            PERSISTENT_RESERVE_IN => {
                let service_action = c[1] & 0x1f;
                if service_action > pr_in::READ_FULL_STATUS {
                    return Err(Sense::invalid_field_in_cdb(1, Some(4)));
                }
                Self::PersistentReserveIn {
                    service_action,
                    allocation_length: u32::from(be16(&c[7..9])),
                }
            }
            PERSISTENT_RESERVE_OUT => {
                let service_action = c[1] & 0x1f;
                if service_action > pr_out::REGISTER_AND_MOVE {
                    return Err(Sense::invalid_field_in_cdb(1, Some(4)));
                }
                Self::PersistentReserveOut {
                    service_action,
                    scope: c[2] >> 4,
                    pr_type: c[2] & 0x0f,
                    parameter_list_length: be32(&c[5..9]),
                }
            }
            MAINTENANCE_IN => {
                if c[1] & 0x1f != SA_REPORT_SUPPORTED_OPCODES {
                    return Err(Sense::invalid_field_in_cdb(1, Some(4)));
                }
                let options = c[2] & 0x07;
                if options > 3 {
                    return Err(Sense::invalid_field_in_cdb(2, Some(2)));
                }
                Self::ReportSupportedOpcodes {
                    timeouts: c[2] & 0x80 != 0,
                    options,
                    opcode: c[3],
                    service_action: be16(&c[4..6]),
                    allocation_length: be32(&c[6..10]),
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

    /// The same write over `blocks` blocks, for the commands whose data-out is just the blocks
    /// to write (WRITE, WRITE AND VERIFY): how a target trims a write to an initiator's shorter
    /// expected length and reports the residual (FCP-4 §9.4.2). `None` for every other command.
    pub fn with_write_blocks(self, blocks: u32) -> Option<Self> {
        match self {
            Self::Write(r) => Some(Self::Write(BlockRange { blocks, ..r })),
            Self::WriteAndVerify { range, byte_check } => Some(Self::WriteAndVerify {
                range: BlockRange { blocks, ..range },
                byte_check,
            }),
            _ => None,
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iscsi::scsi::{asc, pr_out, SenseKey};
    use proptest::prelude::*;

    fn cdb(bytes: &[u8]) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[..bytes.len()].copy_from_slice(bytes);
        c
    }

    /// The sense must be ILLEGAL REQUEST / INVALID FIELD IN CDB pointing at `byte`.
    fn assert_invalid_field(result: Result<ScsiCommand, Sense>, byte: u16) {
        let sense = result.expect_err("a bad field");
        assert_eq!(sense.key, SenseKey::IllegalRequest);
        assert_eq!((sense.asc, sense.ascq), asc::INVALID_FIELD_IN_CDB);
        let fp = sense.field_pointer.expect("field pointer");
        assert!(fp.in_cdb);
        assert_eq!(fp.byte, byte);
    }

    #[test]
    fn write_and_verify_decodes_all_three_sizes() {
        let ten = cdb(&[opcode::WRITE_AND_VERIFY_10, 0x02, 0, 0, 1, 0, 0, 0, 8, 0]);
        let twelve = cdb(&[opcode::WRITE_AND_VERIFY_12, 0x00, 0, 0, 1, 0, 0, 0, 0, 8]);
        let mut sixteen = cdb(&[opcode::WRITE_AND_VERIFY_16, 0x10]);
        sixteen[9] = 1;
        sixteen[2] = 1; // LBA beyond 32 bits
        sixteen[13] = 8;
        let range = |lba| BlockRange {
            lba,
            blocks: 8,
            fua: true,
        };
        assert_eq!(
            ScsiCommand::parse(&ten),
            Ok(ScsiCommand::WriteAndVerify {
                range: range(256),
                byte_check: true
            })
        );
        assert_eq!(
            ScsiCommand::parse(&twelve),
            Ok(ScsiCommand::WriteAndVerify {
                range: range(256),
                byte_check: false
            })
        );
        assert_eq!(
            ScsiCommand::parse(&sixteen),
            Ok(ScsiCommand::WriteAndVerify {
                range: range((1 << 56) + 1),
                byte_check: false
            })
        );
    }

    #[test]
    fn write_and_verify_rejects_reserved_bits_and_protection() {
        for bits in [0x01, 0x04, 0x08] {
            let c = cdb(&[opcode::WRITE_AND_VERIFY_10, bits]);
            assert_invalid_field(ScsiCommand::parse(&c), 1);
        }
        let c = cdb(&[opcode::WRITE_AND_VERIFY_16, 0x20]);
        assert_invalid_field(ScsiCommand::parse(&c), 1);
    }

    #[test]
    fn orwrite_and_prefetch_decode_and_check_byte_1() {
        let mut c = cdb(&[opcode::ORWRITE_16, 0x08]);
        c[9] = 5;
        c[13] = 2;
        assert_eq!(
            ScsiCommand::parse(&c),
            Ok(ScsiCommand::OrWrite(BlockRange {
                lba: 5,
                blocks: 2,
                fua: true
            }))
        );
        c[1] = 0x04;
        assert_invalid_field(ScsiCommand::parse(&c), 1);

        let p = cdb(&[opcode::PRE_FETCH_10, 0x02, 0, 0, 0, 9, 3, 0, 4, 0]);
        assert_eq!(
            ScsiCommand::parse(&p),
            Ok(ScsiCommand::PreFetch {
                range: BlockRange {
                    lba: 9,
                    blocks: 4,
                    fua: false
                },
                immediate: true
            })
        );
        let p16 = cdb(&[opcode::PRE_FETCH_16, 0x80]);
        assert_invalid_field(ScsiCommand::parse(&p16), 1);
    }

    #[test]
    fn reserve_release_6_refuse_third_party_and_extents() {
        assert_eq!(
            ScsiCommand::parse(&cdb(&[opcode::RESERVE_6])),
            Ok(ScsiCommand::Reserve6)
        );
        assert_eq!(
            ScsiCommand::parse(&cdb(&[opcode::RELEASE_6])),
            Ok(ScsiCommand::Release6)
        );
        for bits in [0x01, 0x10] {
            assert_invalid_field(ScsiCommand::parse(&cdb(&[opcode::RESERVE_6, bits])), 1);
            assert_invalid_field(ScsiCommand::parse(&cdb(&[opcode::RELEASE_6, bits])), 1);
        }
    }

    #[test]
    fn persistent_reserve_service_actions_in_range_only() {
        for sa in 0..=0x1f {
            let c = cdb(&[opcode::PERSISTENT_RESERVE_IN, sa, 0, 0, 0, 0, 0, 0x20, 0]);
            if sa <= 3 {
                assert_eq!(
                    ScsiCommand::parse(&c),
                    Ok(ScsiCommand::PersistentReserveIn {
                        service_action: sa,
                        allocation_length: 0x2000
                    })
                );
            } else {
                assert_invalid_field(ScsiCommand::parse(&c), 1);
            }
        }
        let c = cdb(&[
            opcode::PERSISTENT_RESERVE_OUT,
            pr_out::PREEMPT,
            0x03,
            0,
            0,
            0,
            0,
            0,
            24,
        ]);
        assert_eq!(
            ScsiCommand::parse(&c),
            Ok(ScsiCommand::PersistentReserveOut {
                service_action: pr_out::PREEMPT,
                scope: 0,
                pr_type: 3,
                parameter_list_length: 24
            })
        );
        let bad = cdb(&[opcode::PERSISTENT_RESERVE_OUT, 0x08]);
        assert_invalid_field(ScsiCommand::parse(&bad), 1);
    }

    #[test]
    fn report_supported_opcodes_checks_service_action_and_options() {
        let c = cdb(&[opcode::MAINTENANCE_IN, 0x0c, 0x82, 0x2a, 0, 0, 0, 0, 1, 0]);
        assert_eq!(
            ScsiCommand::parse(&c),
            Ok(ScsiCommand::ReportSupportedOpcodes {
                timeouts: true,
                options: 2,
                opcode: 0x2a,
                service_action: 0,
                allocation_length: 256
            })
        );
        assert_invalid_field(ScsiCommand::parse(&cdb(&[opcode::MAINTENANCE_IN, 0x0a])), 1);
        for options in 4..=7 {
            let c = cdb(&[opcode::MAINTENANCE_IN, 0x0c, options]);
            assert_invalid_field(ScsiCommand::parse(&c), 2);
        }
    }

    #[test]
    fn only_writes_can_be_trimmed() {
        let r = BlockRange {
            lba: 1,
            blocks: 8,
            fua: false,
        };
        assert_eq!(
            ScsiCommand::Write(r).with_write_blocks(2),
            Some(ScsiCommand::Write(BlockRange { blocks: 2, ..r }))
        );
        assert!(ScsiCommand::WriteAndVerify {
            range: r,
            byte_check: true
        }
        .with_write_blocks(0)
        .is_some());
        assert_eq!(ScsiCommand::OrWrite(r).with_write_blocks(2), None);
        assert_eq!(
            ScsiCommand::CompareAndWrite { range: r }.with_write_blocks(2),
            None
        );
    }

    /// The opcodes of the write path; the property below drives random CDBs through each.
    const NEW_OPCODES: &[u8] = &[
        opcode::WRITE_AND_VERIFY_10,
        opcode::WRITE_AND_VERIFY_12,
        opcode::WRITE_AND_VERIFY_16,
        opcode::ORWRITE_16,
        opcode::PRE_FETCH_10,
        opcode::PRE_FETCH_16,
        opcode::RESERVE_6,
        opcode::RELEASE_6,
        opcode::PERSISTENT_RESERVE_IN,
        opcode::PERSISTENT_RESERVE_OUT,
        opcode::MAINTENANCE_IN,
    ];

    proptest! {
        #[test]
        fn new_opcodes_decode_or_point_at_a_field_of_the_cdb(
            which in 0..NEW_OPCODES.len(),
            rest in proptest::array::uniform15(any::<u8>()),
        ) {
            let mut c = [0u8; 16];
            c[0] = NEW_OPCODES[which];
            c[1..].copy_from_slice(&rest);
            match ScsiCommand::parse(&c) {
                Ok(ScsiCommand::WriteAndVerify { range, .. } | ScsiCommand::OrWrite(range)
                    | ScsiCommand::PreFetch { range, .. }) => {
                    // The LBA and length are the CDB's own bytes, whatever the size.
                    let (lba, blocks) = match crate::iscsi::scsi::cdb_len(c[0]) {
                        10 => (u64::from(be32(&c[2..6])), u32::from(be16(&c[7..9]))),
                        12 => (u64::from(be32(&c[2..6])), be32(&c[6..10])),
                        _ => (be64(&c[2..10]), be32(&c[10..14])),
                    };
                    prop_assert_eq!((range.lba, range.blocks), (lba, blocks));
                }
                Ok(_) => {}
                Err(sense) => {
                    prop_assert_eq!(sense.key, SenseKey::IllegalRequest);
                    prop_assert_eq!((sense.asc, sense.ascq), asc::INVALID_FIELD_IN_CDB);
                    let fp = sense.field_pointer.expect("field pointer");
                    prop_assert!(fp.in_cdb && usize::from(fp.byte) < crate::iscsi::scsi::cdb_len(c[0]));
                }
            }
        }
    }
}
