//! SCSI commands carried by iSCSI: operation codes, CDB parsing (target side) and building
//! (initiator side), sense data, and the payloads both ends exchange.
//!
//! References: SPC-4 (INQUIRY, MODE SENSE, REPORT LUNS, REQUEST SENSE, PERSISTENT RESERVE,
//! REPORT SUPPORTED OPERATION CODES, sense data §4.5), SBC-3 (READ/WRITE/VERIFY/WRITE SAME/UNMAP/
//! SYNCHRONIZE CACHE, READ CAPACITY, VPD pages B0-B2). Pure code: no I/O.

use thiserror::Error;

pub mod build;
mod cdb;
mod codes;
mod data;
pub mod reservation;
mod sense;
pub mod supported;

pub use cdb::{BlockRange, ScsiCommand};
pub use codes::{
    asc, opcode, pr_in, pr_out, pr_type, status, SenseKey, SA_GET_LBA_STATUS, SA_READ_CAPACITY_16,
    SA_REPORT_SUPPORTED_OPCODES,
};
pub use data::{designation_descriptor, truncate_to, vpd, vpd_page, Capacity};
pub use sense::{Failure, FieldPointer, Sense, FIXED_SENSE_LEN};

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
