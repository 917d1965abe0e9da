//! The qcow2 header fields a deploy needs before converting an image: its version, whether it
//! depends on a backing file, and its virtual (guest-visible) size.
//!
//! # Design
//! One pure reader for the agent (which spools a qcow2 behind its virtual size on the target
//! disk) and the conductor's image cache (which converts a qcow2 to raw before serving it). Both
//! read only the first [`HEADER_LEN`] bytes a peek gives them; the conversion itself is imago's
//! (docs/crates.md). Offsets are those of the qcow2 specification (QEMU's `docs/interop/qcow2.txt`,
//! "Header"), all big-endian.
//!
//! # Limitations
//! Versions 2 and 3 only. A backing file is refused here, since a deploy image must be
//! self-contained; other version-3 fields (feature bits, external data files) are left to imago.

/// qcow2 magic: `QFI\xfb` at offset 0.
pub const MAGIC: [u8; 4] = [b'Q', b'F', b'I', 0xfb];

/// Header bytes [`Qcow2Header::parse`] reads.
pub const HEADER_LEN: usize = 32;

const VERSION_OFFSET: usize = 4;
const BACKING_FILE_OFFSET_OFFSET: usize = 8;
const SIZE_OFFSET: usize = 24;

/// Why the first bytes of an image are not a qcow2 header this project can deploy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Qcow2Error {
    /// The bytes do not start with [`MAGIC`].
    #[error("not a qcow2 image (no QFI\\xfb magic)")]
    NotQcow2,
    /// The magic is there but the image ends before the header does.
    #[error("qcow2 header cut short ({len} of {HEADER_LEN} bytes)")]
    Truncated {
        /// Bytes there were.
        len: usize,
    },
    /// A version other than 2 or 3.
    #[error("qcow2 version {0} is not supported (only 2 and 3)")]
    UnsupportedVersion(u32),
    /// The image names a backing file, so it is not self-contained.
    #[error(
        "qcow2 image with a backing file cannot be deployed (flatten it with \
         `qemu-img convert -O qcow2`)"
    )]
    BackingFile,
}

/// The header fields a deploy needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qcow2Header {
    /// Format version: 2 or 3.
    pub version: u32,
    /// Guest-visible size in bytes: the size of the raw image the conversion produces.
    pub virtual_size: u64,
}

/// Whether `head` (the first bytes of an image) starts with the qcow2 magic.
pub fn is_qcow2(head: &[u8]) -> bool {
    head.starts_with(&MAGIC)
}

impl Qcow2Header {
    /// Reads the header at the start of `head`; bytes past [`HEADER_LEN`] are ignored.
    pub fn parse(head: &[u8]) -> Result<Qcow2Header, Qcow2Error> {
        if !is_qcow2(head) {
            return Err(Qcow2Error::NotQcow2);
        }
        let header: &[u8; HEADER_LEN] = head
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or(Qcow2Error::Truncated { len: head.len() })?;
        let version = be_u32(header, VERSION_OFFSET);
        if !(2..=3).contains(&version) {
            return Err(Qcow2Error::UnsupportedVersion(version));
        }
        if be_u64(header, BACKING_FILE_OFFSET_OFFSET) != 0 {
            return Err(Qcow2Error::BackingFile);
        }
        Ok(Qcow2Header {
            version,
            virtual_size: be_u64(header, SIZE_OFFSET),
        })
    }

    /// The [`HEADER_LEN`] bytes of a header with these fields and no backing file (tests build
    /// images with it; a real image also needs its tables).
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..MAGIC.len()].copy_from_slice(&MAGIC);
        h[VERSION_OFFSET..VERSION_OFFSET + 4].copy_from_slice(&self.version.to_be_bytes());
        h[SIZE_OFFSET..SIZE_OFFSET + 8].copy_from_slice(&self.virtual_size.to_be_bytes());
        h
    }
}

fn be_u32(h: &[u8; HEADER_LEN], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&h[at..at + 4]);
    u32::from_be_bytes(b)
}

fn be_u64(h: &[u8; HEADER_LEN], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[at..at + 8]);
    u64::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(version: u32, backing: u64, size: u64) -> Vec<u8> {
        let mut h = Qcow2Header {
            version,
            virtual_size: size,
        }
        .to_bytes()
        .to_vec();
        h[BACKING_FILE_OFFSET_OFFSET..BACKING_FILE_OFFSET_OFFSET + 8]
            .copy_from_slice(&backing.to_be_bytes());
        h
    }

    #[test]
    fn versions_backing_files_and_short_headers() {
        for version in [2, 3] {
            assert_eq!(
                Qcow2Header::parse(&header(version, 0, 1 << 30)),
                Ok(Qcow2Header {
                    version,
                    virtual_size: 1 << 30
                })
            );
        }
        let mut long = header(3, 0, 512);
        long.extend_from_slice(&[0xAB; 100]);
        assert_eq!(
            Qcow2Header::parse(&long).map(|h| h.virtual_size),
            Ok(512),
            "bytes past the header are ignored"
        );
        let cases: &[(&str, Vec<u8>, Qcow2Error)] = &[
            ("v1", header(1, 0, 1), Qcow2Error::UnsupportedVersion(1)),
            ("v4", header(4, 0, 1), Qcow2Error::UnsupportedVersion(4)),
            ("backing", header(3, 4096, 1), Qcow2Error::BackingFile),
            (
                "short",
                header(3, 0, 1)[..20].to_vec(),
                Qcow2Error::Truncated { len: 20 },
            ),
            (
                "magic only",
                MAGIC.to_vec(),
                Qcow2Error::Truncated { len: 4 },
            ),
            ("raw", vec![0u8; 64], Qcow2Error::NotQcow2),
            ("empty", vec![], Qcow2Error::NotQcow2),
            ("half magic", MAGIC[..2].to_vec(), Qcow2Error::NotQcow2),
        ];
        for (name, head, want) in cases {
            assert_eq!(Qcow2Header::parse(head).as_ref(), Err(want), "{name}");
        }
        assert!(Qcow2Error::BackingFile.to_string().contains("backing file"));
        assert!(Qcow2Error::UnsupportedVersion(4)
            .to_string()
            .contains("qcow2 version 4"));
        assert!(Qcow2Error::Truncated { len: 3 }
            .to_string()
            .contains("cut short"));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(head in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Qcow2Header::parse(&head);
        }

        #[test]
        fn arbitrary_bytes_behind_the_magic_never_panic(
            tail in proptest::collection::vec(any::<u8>(), 0..64)
        ) {
            let mut head = MAGIC.to_vec();
            head.extend_from_slice(&tail);
            match Qcow2Header::parse(&head) {
                Ok(h) => prop_assert!((2..=3).contains(&h.version)),
                Err(Qcow2Error::NotQcow2) => prop_assert!(false, "the magic is there"),
                Err(Qcow2Error::Truncated { len }) => prop_assert!(len < HEADER_LEN),
                Err(_) => {}
            }
        }

        #[test]
        fn to_bytes_round_trips(version in 2u32..=3, virtual_size in any::<u64>()) {
            let h = Qcow2Header { version, virtual_size };
            prop_assert_eq!(Qcow2Header::parse(&h.to_bytes()), Ok(h));
        }
    }
}
