//! Parameter data the target returns: READ CAPACITY, VPD pages, allocation-length truncation.

use super::{be32, be64, need, ScsiError};

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
