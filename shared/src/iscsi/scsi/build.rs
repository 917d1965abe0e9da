//! CDB builders for the initiator side. Each returns the 16-byte iSCSI CDB field.

use super::codes::opcode::*;
use super::codes::SA_READ_CAPACITY_16;

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
