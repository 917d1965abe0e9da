//! How long one PDU is on the wire (RFC 7143 §11.2): the lengths its BHS announces, the
//! receiver's limit on the data segment, padding to 4-byte words and the optional digests.
//!
//! # Design
//! This is the one place these rules live. [`super::PduDecoder`] frames PDUs out of a receive
//! buffer with [`FrameLayout`]; the agent's target, which reads a PDU in pieces so a Data-Out
//! payload lands straight in its aligned buffer, asks the same decoder for the same layout
//! (`PduDecoder::layout`).

use super::fields::{RawBhs, OFF_DATA_SEGMENT_LEN, OFF_TOTAL_AHS_LEN};
use super::{PduError, BHS_LEN};
use crate::iscsi::digest::{Digests, DIGEST_LEN};

/// Largest data segment the 24-bit DataSegmentLength field can describe.
pub const MAX_DATA_SEGMENT_LEN: usize = (1 << 24) - 1;
/// Largest total AHS length (TotalAHSLength counts 4-byte words in one byte).
pub const MAX_TOTAL_AHS_LEN: usize = 255 * 4;

/// DataSegmentLength and TotalAHSLength (in bytes) of a raw BHS.
pub fn segment_lengths(bhs: &[u8; BHS_LEN]) -> (usize, usize) {
    let ahs = usize::from(bhs[OFF_TOTAL_AHS_LEN]) * 4;
    let data = (usize::from(bhs[OFF_DATA_SEGMENT_LEN]) << 16)
        | (usize::from(bhs[OFF_DATA_SEGMENT_LEN + 1]) << 8)
        | usize::from(bhs[OFF_DATA_SEGMENT_LEN + 2]);
    (ahs, data)
}

/// `len` rounded up to a multiple of 4 (RFC 7143 §11.2.3: segments end on word boundaries).
pub fn padded_len(len: usize) -> usize {
    (len + 3) & !3
}

/// Writes DataSegmentLength and TotalAHSLength (in words) into a BHS. A length over
/// [`MAX_DATA_SEGMENT_LEN`] is the caller's error; it is cut to the field.
pub(super) fn put_segment_lengths(bhs: &mut RawBhs, ahs_words: u8, data_len: usize) {
    bhs[OFF_TOTAL_AHS_LEN] = ahs_words;
    let len = (data_len.min(MAX_DATA_SEGMENT_LEN) as u32).to_be_bytes();
    bhs[OFF_DATA_SEGMENT_LEN..OFF_DATA_SEGMENT_LEN + 3].copy_from_slice(&len[1..]);
}

/// The parts of one PDU on the wire, read from its BHS and checked against the receiver's limit:
/// BHS, AHS, header digest, then data, padding and data digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLayout {
    /// TotalAHSLength in bytes.
    pub ahs_len: usize,
    /// DataSegmentLength: the data without its padding.
    pub data_len: usize,
    /// The digests in use on the connection.
    pub digests: Digests,
}

impl FrameLayout {
    /// The layout the header `bhs` announces. A data segment over `max_data_segment_len` (this
    /// side's MaxRecvDataSegmentLength) is an error before anything else is read.
    pub fn of(
        bhs: &[u8; BHS_LEN],
        digests: Digests,
        max_data_segment_len: usize,
    ) -> Result<FrameLayout, PduError> {
        let (ahs_len, data_len) = segment_lengths(bhs);
        if data_len > max_data_segment_len {
            return Err(PduError::DataSegmentTooLong {
                len: data_len,
                limit: max_data_segment_len,
            });
        }
        Ok(FrameLayout {
            ahs_len,
            data_len,
            digests,
        })
    }

    /// Bytes of the header digest (0 or 4).
    pub fn header_digest_len(&self) -> usize {
        if self.digests.header {
            DIGEST_LEN
        } else {
            0
        }
    }

    /// Bytes of the data digest: a PDU without data has none (RFC 7143 §11.2.4).
    pub fn data_digest_len(&self) -> usize {
        if self.digests.data && self.data_len > 0 {
            DIGEST_LEN
        } else {
            0
        }
    }

    /// Padding after the data segment.
    pub fn padding(&self) -> usize {
        padded_len(self.data_len) - self.data_len
    }

    /// BHS, AHS and header digest: where the data segment starts.
    pub fn header_len(&self) -> usize {
        BHS_LEN + self.ahs_len + self.header_digest_len()
    }

    /// Everything after the header: data, padding and data digest.
    pub fn body_len(&self) -> usize {
        padded_len(self.data_len) + self.data_digest_len()
    }

    /// The whole PDU.
    pub fn total_len(&self) -> usize {
        self.header_len() + self.body_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(ahs_words: u8, data_len: usize) -> RawBhs {
        let mut b = [0u8; BHS_LEN];
        put_segment_lengths(&mut b, ahs_words, data_len);
        b
    }

    #[test]
    fn lengths_padding_and_digests() {
        let both = Digests {
            header: true,
            data: true,
        };
        // (AHS words, data length, digests) → (header, padding, body, total)
        let cases = [
            (0, 0, Digests::NONE, (48, 0, 0, 48)),
            (0, 0, both, (52, 0, 0, 52)),
            (0, 5, Digests::NONE, (48, 3, 8, 56)),
            (2, 5, both, (60, 3, 12, 72)),
            (0, 8192, both, (52, 0, 8196, 8248)),
        ];
        for (words, data, digests, (head, pad, body, total)) in cases {
            let layout = FrameLayout::of(&header(words, data), digests, 8192).expect("in limit");
            assert_eq!(
                segment_lengths(&header(words, data)),
                (words as usize * 4, data)
            );
            assert_eq!(
                (
                    layout.header_len(),
                    layout.padding(),
                    layout.body_len(),
                    layout.total_len()
                ),
                (head, pad, body, total),
                "{words} AHS words, {data} data bytes, {digests:?}"
            );
        }
    }

    #[test]
    fn limit_is_checked_from_the_header() {
        assert_eq!(
            FrameLayout::of(&header(0, 8193), Digests::NONE, 8192),
            Err(PduError::DataSegmentTooLong {
                len: 8193,
                limit: 8192
            })
        );
        let max = header(0, MAX_DATA_SEGMENT_LEN + 10);
        assert_eq!(
            segment_lengths(&max).1,
            MAX_DATA_SEGMENT_LEN,
            "cut to 24 bits"
        );
    }
}
