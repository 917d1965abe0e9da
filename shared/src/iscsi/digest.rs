//! Header and data digests: CRC32C (RFC 7143 §13.1, RFC 3720 Appendix B.4).
//!
//! # Design
//! The CRC32C of the bytes it covers is sent in little-endian byte order: RFC 3720 B.4 gives the
//! digest of 32 zero bytes as the wire bytes `aa 36 91 8a` (value `0x8a9136aa`). The header digest
//! covers the BHS and every AHS; the data digest covers the data segment *including* its padding.

/// Length of a CRC32C digest on the wire.
pub const DIGEST_LEN: usize = 4;

/// Which digests a connection uses, as negotiated by `HeaderDigest` and `DataDigest`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    /// A CRC32C follows the BHS and AHS of every PDU.
    pub header: bool,
    /// A CRC32C follows the (padded) data segment of every PDU that has one.
    pub data: bool,
}

impl Digests {
    /// No digests: the state during login and whenever `None` was negotiated.
    pub const NONE: Digests = Digests {
        header: false,
        data: false,
    };
}

/// CRC32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Continues a CRC32C over more bytes (for a data segment followed by its padding).
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

/// The wire form of a digest value.
pub fn digest_bytes(crc: u32) -> [u8; DIGEST_LEN] {
    crc.to_le_bytes()
}

/// Reads a digest value from its wire form.
pub fn digest_from_bytes(bytes: [u8; DIGEST_LEN]) -> u32 {
    u32::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3720_b4_vectors() {
        // RFC 3720 Appendix B.4: 32 bytes of zeroes, of 0xff, ascending and descending.
        assert_eq!(digest_bytes(crc32c(&[0u8; 32])), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(
            digest_bytes(crc32c(&[0xffu8; 32])),
            [0x43, 0xab, 0xa8, 0x62]
        );
        let ascending: Vec<u8> = (0u8..32).collect();
        assert_eq!(digest_bytes(crc32c(&ascending)), [0x4e, 0x79, 0xdd, 0x46]);
        let descending: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(digest_bytes(crc32c(&descending)), [0x5c, 0xdb, 0x3f, 0x11]);
    }

    #[test]
    fn append_equals_whole() {
        let data = b"hello iscsi world";
        assert_eq!(crc32c_append(crc32c(&data[..5]), &data[5..]), crc32c(data));
        assert_eq!(digest_from_bytes(digest_bytes(0x1234_5678)), 0x1234_5678);
    }
}
