//! Additional header segments (RFC 7143 §11.2.2): the extended CDB and the bidirectional read
//! length, between the BHS and the header digest.

use super::frame::{padded_len, MAX_TOTAL_AHS_LEN};
use super::PduError;

/// AHS types (RFC 7143 §11.2.2.1).
pub mod ahs_type {
    /// Extended CDB: the bytes of a CDB beyond the first 16.
    pub const EXTENDED_CDB: u8 = 1;
    /// Bidirectional Read Expected Data Transfer Length.
    pub const BIDI_READ_LENGTH: u8 = 2;
}

/// One additional header segment (RFC 7143 §11.2.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ahs {
    /// AHSType.
    pub ahs_type: u8,
    /// AHS-Specific bytes (AHSLength of them), starting with the byte after AHSType.
    pub specific: Vec<u8>,
}

impl Ahs {
    /// An extended-CDB AHS holding `cdb[16..]` (RFC 7143 §11.2.2.3: one reserved byte, then the
    /// rest of the CDB).
    pub fn extended_cdb(rest_of_cdb: &[u8]) -> Ahs {
        let mut specific = Vec::with_capacity(rest_of_cdb.len() + 1);
        specific.push(0);
        specific.extend_from_slice(rest_of_cdb);
        Ahs {
            ahs_type: ahs_type::EXTENDED_CDB,
            specific,
        }
    }

    /// A Bidirectional Read Expected Data Transfer Length AHS (RFC 7143 §11.2.2.4).
    pub fn bidi_read_length(len: u32) -> Ahs {
        let mut specific = vec![0u8];
        specific.extend_from_slice(&len.to_be_bytes());
        Ahs {
            ahs_type: ahs_type::BIDI_READ_LENGTH,
            specific,
        }
    }

    /// Bytes this AHS takes on the wire, padding included.
    pub fn wire_len(&self) -> usize {
        padded_len(3 + self.specific.len())
    }
}

/// TotalAHSLength of `list` in 4-byte words; an error when the one-byte field (or an AHSLength)
/// cannot describe it.
pub(super) fn total_ahs_words(list: &[Ahs]) -> Result<u8, PduError> {
    let len: usize = list.iter().map(Ahs::wire_len).sum();
    if len > MAX_TOTAL_AHS_LEN || list.iter().any(|a| a.specific.len() > 0xffff) {
        return Err(PduError::Ahs("longer than TotalAHSLength can describe"));
    }
    Ok((len / 4) as u8)
}

/// Appends `list` in wire form: AHSLength, AHSType, the specific bytes, padding.
pub(super) fn write_ahs(list: &[Ahs], out: &mut Vec<u8>) {
    for ahs in list {
        let start = out.len();
        out.extend_from_slice(&(ahs.specific.len() as u16).to_be_bytes());
        out.push(ahs.ahs_type);
        out.extend_from_slice(&ahs.specific);
        out.resize(start + ahs.wire_len(), 0);
    }
}

/// Parses the AHS area (TotalAHSLength bytes) into its segments.
pub(super) fn parse_ahs(mut area: &[u8]) -> Result<Vec<Ahs>, PduError> {
    let mut list = Vec::new();
    while !area.is_empty() {
        if area.len() < 4 {
            return Err(PduError::Ahs("AHS header cut short"));
        }
        let len = usize::from(u16::from_be_bytes([area[0], area[1]]));
        let wire = padded_len(3 + len);
        if wire > area.len() {
            return Err(PduError::Ahs("AHSLength runs past TotalAHSLength"));
        }
        list.push(Ahs {
            ahs_type: area[2],
            specific: area[3..3 + len].to_vec(),
        });
        area = &area[wire..];
    }
    Ok(list)
}
