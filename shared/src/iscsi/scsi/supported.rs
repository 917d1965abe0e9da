//! REPORT SUPPORTED OPERATION CODES (SPC-4 §6.35): the table of commands the target decodes, with
//! the CDB usage data of each (a mask of the CDB bits the device server looks at), and the two
//! parameter data formats built from it.
//!
//! The table must list exactly what [`super::ScsiCommand::parse`] accepts; a unit test holds the
//! two together.

use super::codes::opcode::*;
use super::codes::SA_REPORT_SUPPORTED_OPCODES;
use super::codes::{pr_in, pr_out, SA_GET_LBA_STATUS, SA_READ_CAPACITY_16};
use super::Sense;

/// One supported command: opcode, service action (for opcodes that have them) and CDB usage data.
#[derive(Clone, Copy, Debug)]
pub struct SupportedCommand {
    /// Operation code.
    pub opcode: u8,
    /// Service action, for opcodes whose CDB carries one.
    pub service_action: Option<u16>,
    /// CDB USAGE DATA: byte 0 is the opcode, then a one bit for each CDB bit that is used.
    pub usage: &'static [u8],
}

const fn cmd(opcode: u8, usage: &'static [u8]) -> SupportedCommand {
    SupportedCommand {
        opcode,
        service_action: None,
        usage,
    }
}

const fn sa(opcode: u8, service_action: u16, usage: &'static [u8]) -> SupportedCommand {
    SupportedCommand {
        opcode,
        service_action: Some(service_action),
        usage,
    }
}

// Byte 1 of the block commands: DPO (0x10) and FUA (0x08) are accepted (DPOFUA=1 in MODE SENSE);
// the protection fields are not (no protection information), so their bits are clear.
const RW10: [u8; 2] = [0x18, 0];
/// Every command the target decodes, in opcode order.
pub const SUPPORTED_COMMANDS: &[SupportedCommand] = &[
    cmd(TEST_UNIT_READY, &[TEST_UNIT_READY, 0, 0, 0, 0, 0]),
    cmd(REQUEST_SENSE, &[REQUEST_SENSE, 0x01, 0, 0, 0xff, 0]),
    cmd(READ_6, &[READ_6, 0x1f, 0xff, 0xff, 0xff, 0]),
    cmd(WRITE_6, &[WRITE_6, 0x1f, 0xff, 0xff, 0xff, 0]),
    cmd(INQUIRY, &[INQUIRY, 0x01, 0xff, 0xff, 0xff, 0]),
    cmd(RESERVE_6, &[RESERVE_6, 0, 0, 0, 0, 0]),
    cmd(RELEASE_6, &[RELEASE_6, 0, 0, 0, 0, 0]),
    cmd(MODE_SENSE_6, &[MODE_SENSE_6, 0x08, 0xff, 0xff, 0xff, 0]),
    cmd(
        READ_CAPACITY_10,
        &[READ_CAPACITY_10, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x01, 0],
    ),
    cmd(
        READ_10,
        &[
            READ_10, RW10[0], 0xff, 0xff, 0xff, 0xff, RW10[1], 0xff, 0xff, 0,
        ],
    ),
    cmd(
        WRITE_10,
        &[
            WRITE_10, RW10[0], 0xff, 0xff, 0xff, 0xff, RW10[1], 0xff, 0xff, 0,
        ],
    ),
    cmd(
        WRITE_AND_VERIFY_10,
        &[
            WRITE_AND_VERIFY_10,
            0x12,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0xff,
            0xff,
            0,
        ],
    ),
    cmd(
        VERIFY_10,
        &[VERIFY_10, 0x16, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0],
    ),
    cmd(
        PRE_FETCH_10,
        &[PRE_FETCH_10, 0x02, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0],
    ),
    cmd(
        SYNCHRONIZE_CACHE_10,
        &[
            SYNCHRONIZE_CACHE_10,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0xff,
            0xff,
            0,
        ],
    ),
    cmd(
        WRITE_SAME_10,
        &[
            WRITE_SAME_10,
            0x08,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0xff,
            0xff,
            0,
        ],
    ),
    cmd(UNMAP, &[UNMAP, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0]),
    cmd(
        MODE_SENSE_10,
        &[MODE_SENSE_10, 0x08, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0],
    ),
    sa(PERSISTENT_RESERVE_IN, pr_in::READ_KEYS as u16, PR_IN_USAGE),
    sa(
        PERSISTENT_RESERVE_IN,
        pr_in::READ_RESERVATION as u16,
        PR_IN_USAGE,
    ),
    sa(
        PERSISTENT_RESERVE_IN,
        pr_in::REPORT_CAPABILITIES as u16,
        PR_IN_USAGE,
    ),
    sa(
        PERSISTENT_RESERVE_IN,
        pr_in::READ_FULL_STATUS as u16,
        PR_IN_USAGE,
    ),
    sa(
        PERSISTENT_RESERVE_OUT,
        pr_out::REGISTER as u16,
        PR_OUT_USAGE,
    ),
    sa(PERSISTENT_RESERVE_OUT, pr_out::RESERVE as u16, PR_OUT_USAGE),
    sa(PERSISTENT_RESERVE_OUT, pr_out::RELEASE as u16, PR_OUT_USAGE),
    sa(PERSISTENT_RESERVE_OUT, pr_out::CLEAR as u16, PR_OUT_USAGE),
    sa(PERSISTENT_RESERVE_OUT, pr_out::PREEMPT as u16, PR_OUT_USAGE),
    sa(
        PERSISTENT_RESERVE_OUT,
        pr_out::PREEMPT_AND_ABORT as u16,
        PR_OUT_USAGE,
    ),
    sa(
        PERSISTENT_RESERVE_OUT,
        pr_out::REGISTER_AND_IGNORE as u16,
        PR_OUT_USAGE,
    ),
    cmd(READ_16, &rw16(READ_16, 0x18)),
    cmd(
        COMPARE_AND_WRITE,
        &[
            COMPARE_AND_WRITE,
            0x18,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
            0,
            0xff,
            0,
            0,
        ],
    ),
    cmd(WRITE_16, &rw16(WRITE_16, 0x18)),
    cmd(ORWRITE_16, &rw16(ORWRITE_16, 0x18)),
    cmd(WRITE_AND_VERIFY_16, &rw16(WRITE_AND_VERIFY_16, 0x12)),
    cmd(VERIFY_16, &rw16(VERIFY_16, 0x16)),
    cmd(PRE_FETCH_16, &rw16(PRE_FETCH_16, 0x02)),
    cmd(SYNCHRONIZE_CACHE_16, &rw16(SYNCHRONIZE_CACHE_16, 0)),
    cmd(WRITE_SAME_16, &rw16(WRITE_SAME_16, 0x09)),
    sa(
        SERVICE_ACTION_IN_16,
        SA_READ_CAPACITY_16 as u16,
        &[
            SERVICE_ACTION_IN_16,
            0x1f,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    ),
    sa(
        SERVICE_ACTION_IN_16,
        SA_GET_LBA_STATUS as u16,
        &rw16(SERVICE_ACTION_IN_16, 0x1f),
    ),
    cmd(
        REPORT_LUNS,
        &[REPORT_LUNS, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
    ),
    sa(
        MAINTENANCE_IN,
        SA_REPORT_SUPPORTED_OPCODES as u16,
        &[
            MAINTENANCE_IN,
            0x1f,
            0x87,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    ),
    cmd(READ_12, &rw12(READ_12, 0x18)),
    cmd(WRITE_12, &rw12(WRITE_12, 0x18)),
    cmd(WRITE_AND_VERIFY_12, &rw12(WRITE_AND_VERIFY_12, 0x12)),
    cmd(VERIFY_12, &rw12(VERIFY_12, 0x16)),
];

const PR_IN_USAGE: &[u8] = &[PERSISTENT_RESERVE_IN, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0];
const PR_OUT_USAGE: &[u8] = &[
    PERSISTENT_RESERVE_OUT,
    0x1f,
    0xff,
    0,
    0,
    0xff,
    0xff,
    0xff,
    0xff,
    0,
];

/// Usage data of a 16-byte CDB with an 8-byte LBA and a 4-byte length.
const fn rw16(op: u8, byte1: u8) -> [u8; 16] {
    [
        op, byte1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0,
    ]
}

/// Usage data of a 12-byte CDB with a 4-byte LBA and a 4-byte length.
const fn rw12(op: u8, byte1: u8) -> [u8; 12] {
    [
        op, byte1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0,
    ]
}

/// Command timeouts descriptor (SPC-4 §6.35.4): length 0x0a, no timeouts given (0 = not known).
const TIMEOUTS_DESCRIPTOR: [u8; 12] = [0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// Whether `opcode` carries a service action in its CDB.
fn has_service_actions(opcode: u8) -> bool {
    SUPPORTED_COMMANDS
        .iter()
        .any(|c| c.opcode == opcode && c.service_action.is_some())
}

/// Parameter data for REPORTING OPTIONS 000b: every command (SPC-4 §6.35.2).
pub fn all_commands(timeouts: bool) -> Vec<u8> {
    let per = if timeouts { 20 } else { 8 };
    let mut body = Vec::with_capacity(SUPPORTED_COMMANDS.len() * per);
    for c in SUPPORTED_COMMANDS {
        body.push(c.opcode);
        body.push(0);
        body.extend_from_slice(&c.service_action.unwrap_or(0).to_be_bytes());
        body.push(0);
        body.push(u8::from(timeouts) << 1 | u8::from(c.service_action.is_some()));
        body.extend_from_slice(&(c.usage.len() as u16).to_be_bytes());
        if timeouts {
            body.extend_from_slice(&TIMEOUTS_DESCRIPTOR);
        }
    }
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend(body);
    out
}

/// Parameter data for REPORTING OPTIONS 001b-011b: one command (SPC-4 §6.35.3). Options 1 names
/// an opcode without service actions, 2 one with, 3 either; asking with the wrong one is an
/// INVALID FIELD IN CDB. An opcode that is not supported is answered with SUPPORT 001b.
pub fn one_command(
    options: u8,
    opcode: u8,
    service_action: u16,
    timeouts: bool,
) -> Result<Vec<u8>, Sense> {
    let with_sa = has_service_actions(opcode);
    match options {
        1 if with_sa => return Err(Sense::invalid_field_in_cdb(2, Some(2))),
        2 if !with_sa && SUPPORTED_COMMANDS.iter().any(|c| c.opcode == opcode) => {
            return Err(Sense::invalid_field_in_cdb(2, Some(2)))
        }
        _ => {}
    }
    let found = SUPPORTED_COMMANDS
        .iter()
        .find(|c| c.opcode == opcode && (!with_sa || c.service_action == Some(service_action)));
    let mut out = vec![0u8, u8::from(timeouts) << 7];
    match found {
        Some(c) => {
            out[1] |= 0x03; // supported, in conformance with a standard
            out.extend_from_slice(&(c.usage.len() as u16).to_be_bytes());
            out.extend_from_slice(c.usage);
        }
        None => {
            out[1] |= 0x01; // not supported
            out.extend_from_slice(&0u16.to_be_bytes());
        }
    }
    if timeouts {
        out.extend_from_slice(&TIMEOUTS_DESCRIPTOR);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iscsi::scsi::{asc, ScsiCommand};

    /// A CDB that sets the opcode, the service action and every used field to a harmless value.
    fn minimal_cdb(c: &SupportedCommand) -> [u8; 16] {
        let mut cdb = [0u8; 16];
        cdb[0] = c.opcode;
        if let Some(sa) = c.service_action {
            cdb[1] = sa as u8;
        }
        cdb
    }

    #[test]
    fn every_listed_command_parses() {
        for c in SUPPORTED_COMMANDS {
            assert_eq!(c.usage[0], c.opcode);
            let parsed = ScsiCommand::parse(&minimal_cdb(c));
            assert!(
                parsed.is_ok(),
                "opcode {:#04x} sa {:?} is listed but parse says {parsed:?}",
                c.opcode,
                c.service_action
            );
        }
    }

    #[test]
    fn every_other_opcode_is_invalid() {
        for op in 0..=255u8 {
            if SUPPORTED_COMMANDS.iter().any(|c| c.opcode == op) {
                continue;
            }
            let mut cdb = [0u8; 16];
            cdb[0] = op;
            let sense = ScsiCommand::parse(&cdb).expect_err("unlisted opcode");
            assert_eq!(
                (sense.asc, sense.ascq),
                asc::INVALID_COMMAND_OPERATION_CODE,
                "opcode {op:#04x} parses but is not listed"
            );
        }
    }

    #[test]
    fn all_commands_layout() {
        let d = all_commands(false);
        let len = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
        assert_eq!(len, 8 * SUPPORTED_COMMANDS.len());
        assert_eq!(d.len(), 4 + len);
        // WRITE (10) descriptor: no service action, CDB length 10.
        let i = SUPPORTED_COMMANDS
            .iter()
            .position(|c| c.opcode == WRITE_10)
            .expect("WRITE (10) listed");
        let desc = &d[4 + 8 * i..12 + 8 * i];
        assert_eq!(desc[0], WRITE_10);
        assert_eq!(desc[5], 0);
        assert_eq!(u16::from_be_bytes([desc[6], desc[7]]), 10);
        let t = all_commands(true);
        assert_eq!(t.len(), 4 + 20 * SUPPORTED_COMMANDS.len());
        assert_eq!(t[4 + 5] & 0x02, 0x02, "CTDP set with RCTD");
    }

    #[test]
    fn one_command_checks_the_option_against_service_actions() {
        let w = one_command(1, WRITE_10, 0, false).expect("WRITE (10)");
        assert_eq!(w[1] & 0x07, 3);
        assert_eq!(w[4], WRITE_10);
        assert_eq!(w[5] & 0x18, 0x18, "DPO and FUA in the usage data");
        assert!(one_command(2, WRITE_10, 0, false).is_err());
        assert!(one_command(1, PERSISTENT_RESERVE_IN, 0, false).is_err());
        let pr = one_command(2, PERSISTENT_RESERVE_IN, 2, true).expect("PR IN");
        assert_eq!(pr[1], 0x80 | 0x03);
        assert_eq!(pr.len(), 4 + 10 + 12);
        let none = one_command(1, 0xd5, 0, false).expect("unsupported opcode");
        assert_eq!((none[1] & 0x07, none.len()), (1, 4));
    }
}
