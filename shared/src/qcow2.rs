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
const L1_SIZE_OFFSET: usize = 36;
const L1_TABLE_OFFSET_OFFSET: usize = 40;

/// Header bytes [`check_l1_table`] reads: up to the end of `l1_table_offset`.
pub const L1_HEADER_LEN: usize = 48;

const CLUSTER_BITS_OFFSET: usize = 20;
/// Version 3: the header's own length; its extensions follow it.
const HEADER_LENGTH_OFFSET: usize = 100;
/// Header extension type of the feature name table: 48-byte entries.
const FEATURE_NAME_TABLE: u32 = 0x6803_f857;
const FEATURE_NAME_ENTRY_LEN: u32 = 48;

/// The most bytes [`check_layout`] needs: the first cluster at the largest cluster size the
/// specification allows (2 MiB), which is where the header and its extensions live.
pub const LAYOUT_HEAD_MAX: usize = 2 << 20;

/// Why the first bytes of an image are not a qcow2 header this project can deploy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Qcow2Error {
    /// The bytes do not start with [`MAGIC`].
    #[error("not a qcow2 image (no QFI\\xfb magic)")]
    NotQcow2,
    /// The magic is there but the image ends before the header does.
    #[error("qcow2 header cut short ({len} bytes)")]
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
    /// The header places the L1 table (wholly or partly) beyond the end of the file.
    #[error(
        "qcow2 L1 table ({entries} entries at offset {offset}) reaches past the image's end \
         ({image_len} bytes): the image is corrupt or cut short"
    )]
    L1TablePastEnd {
        /// `l1_size` from the header.
        entries: u32,
        /// `l1_table_offset` from the header.
        offset: u64,
        /// Length of the whole qcow2 file.
        image_len: u64,
    },
    /// A header extension the specification gives a fixed entry size to has a length that is
    /// not a whole number of entries.
    #[error("qcow2 header extension {kind:#x} is {len} bytes, not a multiple of {entry}: the image is corrupt")]
    BadExtension {
        /// Its type.
        kind: u32,
        /// Its length.
        len: u32,
        /// The size of one entry.
        entry: u32,
    },
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

/// Refuses an image whose header puts the L1 table past the end of the file (`image_len` bytes;
/// `head` holds at least its first [`L1_HEADER_LEN`] bytes).
///
/// A well-formed image always holds its whole L1 table. Checking before the converter opens the
/// image matters because the table is read in one piece: a forged `l1_size` of millions of
/// entries in a few-KiB file would otherwise cost a buffer of tens of MiB, zero-filled, per open.
pub fn check_l1_table(head: &[u8], image_len: u64) -> Result<(), Qcow2Error> {
    let header: &[u8; L1_HEADER_LEN] = head
        .get(..L1_HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(Qcow2Error::Truncated { len: head.len() })?;
    let mut entries = [0u8; 4];
    entries.copy_from_slice(&header[L1_SIZE_OFFSET..L1_SIZE_OFFSET + 4]);
    let entries = u32::from_be_bytes(entries);
    let mut offset = [0u8; 8];
    offset.copy_from_slice(&header[L1_TABLE_OFFSET_OFFSET..L1_TABLE_OFFSET_OFFSET + 8]);
    let offset = u64::from_be_bytes(offset);
    let end = offset.checked_add(u64::from(entries) * 8);
    match end {
        Some(end) if end <= image_len => Ok(()),
        _ => Err(Qcow2Error::L1TablePastEnd {
            entries,
            offset,
            image_len,
        }),
    }
}

/// The structural checks made before a converter opens the image: the L1 table lies within
/// the file ([`check_l1_table`]) and the header extensions are well formed. `head` holds the
/// first `min(image_len, LAYOUT_HEAD_MAX)` bytes of the file, `image_len` its length.
///
/// The extension check exists because a feature name table whose length is not a multiple of
/// its 48-byte entries makes imago 0.2 index past the end of its last entry and panic (found by
/// the `qcow2` fuzz target).
pub fn check_layout(head: &[u8], image_len: u64) -> Result<(), Qcow2Error> {
    check_l1_table(head, image_len)?;
    let header = Qcow2Header::parse(head)?;
    if header.version < 3 {
        return Ok(());
    }
    let word = |at: usize| -> Option<u32> {
        let bytes = head.get(at..at.checked_add(4)?)?;
        Some(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    };
    let cluster_len = word(CLUSTER_BITS_OFFSET)
        .and_then(|bits| 1usize.checked_shl(bits))
        .unwrap_or(usize::MAX)
        .min(LAYOUT_HEAD_MAX);
    // Extensions are 4-byte type, 4-byte length, data padded to 8 bytes; type 0 ends them. Bytes
    // past what `head` holds read as zeros (past the file's end, as imago reads them): the end.
    let mut at = word(HEADER_LENGTH_OFFSET).unwrap_or(0) as usize;
    while at.saturating_add(8) <= cluster_len {
        let (Some(kind), Some(len)) = (word(at), word(at + 4)) else {
            return Ok(());
        };
        if kind == 0 {
            return Ok(());
        }
        if kind == FEATURE_NAME_TABLE && len % FEATURE_NAME_ENTRY_LEN != 0 {
            return Err(Qcow2Error::BadExtension {
                kind,
                len,
                entry: FEATURE_NAME_ENTRY_LEN,
            });
        }
        at = at
            .saturating_add(8)
            .saturating_add((len as usize).next_multiple_of(8));
    }
    // Extensions running past the first cluster: imago refuses that itself.
    Ok(())
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

    /// The first [`L1_HEADER_LEN`] bytes of a v3 header with this L1 table.
    fn l1_header(entries: u32, offset: u64) -> Vec<u8> {
        let mut h = header(3, 0, 1 << 30);
        h.resize(L1_HEADER_LEN, 0);
        h[36..40].copy_from_slice(&entries.to_be_bytes());
        h[40..48].copy_from_slice(&offset.to_be_bytes());
        h
    }

    #[test]
    fn l1_table_must_lie_within_the_image() {
        // Offsets 36 (l1_size, u32) and 40 (l1_table_offset, u64) from the qcow2 spec's header.
        assert_eq!(
            check_l1_table(&l1_header(16, 196_608), 196_608 + 128),
            Ok(())
        );
        assert_eq!(check_l1_table(&l1_header(0, 0), 72), Ok(()), "no L1 table");
        let past = |entries, offset, image_len| Qcow2Error::L1TablePastEnd {
            entries,
            offset,
            image_len,
        };
        assert_eq!(
            check_l1_table(&l1_header(16, 196_608), 196_608 + 127),
            Err(past(16, 196_608, 196_735)),
            "one byte short"
        );
        assert_eq!(
            check_l1_table(&l1_header(u32::MAX, 65_536), 1 << 20),
            Err(past(u32::MAX, 65_536, 1 << 20)),
            "a forged l1_size"
        );
        assert_eq!(
            check_l1_table(&l1_header(1, u64::MAX - 3), u64::MAX),
            Err(past(1, u64::MAX - 3, u64::MAX)),
            "the end overflows"
        );
        assert_eq!(
            check_l1_table(&l1_header(1, 0)[..40], 1 << 20),
            Err(Qcow2Error::Truncated { len: 40 })
        );
        assert!(past(9, 1, 2).to_string().contains("past the image's end"));
    }

    /// A v3 header of 104 bytes (no L1 table) followed by `extensions` (type, data).
    fn with_extensions(extensions: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let mut h = l1_header(0, 0);
        h.resize(104, 0);
        h[20..24].copy_from_slice(&16u32.to_be_bytes()); // 64 KiB clusters
        h[100..104].copy_from_slice(&104u32.to_be_bytes());
        for (kind, data) in extensions {
            h.extend_from_slice(&kind.to_be_bytes());
            h.extend_from_slice(&(data.len() as u32).to_be_bytes());
            h.extend_from_slice(data);
            h.resize(h.len().next_multiple_of(8), 0);
        }
        h
    }

    #[test]
    fn a_feature_name_table_must_hold_whole_entries() {
        let table = FEATURE_NAME_TABLE;
        let good = with_extensions(&[(0xe279_2aca, b"raw".to_vec()), (table, vec![0; 96])]);
        let len = good.len() as u64;
        assert_eq!(check_layout(&good, len), Ok(()));
        // What the fuzzer found: a table of 49 bytes, one byte into a second entry.
        let bad = with_extensions(&[(0xe279_2aca, b"raw".to_vec()), (table, vec![0; 49])]);
        assert_eq!(
            check_layout(&bad, bad.len() as u64),
            Err(Qcow2Error::BadExtension {
                kind: table,
                len: 49,
                entry: 48
            })
        );
        // After the end marker nothing is read.
        let after_end = with_extensions(&[(0, vec![]), (table, vec![0; 49])]);
        assert_eq!(check_layout(&after_end, after_end.len() as u64), Ok(()));
        // Cut short inside the extensions: the rest reads as the end.
        assert_eq!(check_layout(&bad[..110], bad.len() as u64), Ok(()));
        // Version 2 has no extensions.
        let mut v2 = bad.clone();
        v2[4..8].copy_from_slice(&2u32.to_be_bytes());
        assert_eq!(check_layout(&v2, v2.len() as u64), Ok(()));
        assert!(check_layout(&bad, bad.len() as u64)
            .expect_err("bad")
            .to_string()
            .contains("not a multiple of 48"));
    }

    proptest! {
        #[test]
        fn layout_check_never_panics(tail in proptest::collection::vec(any::<u8>(), 0..400),
                                     image_len in any::<u64>()) {
            let mut head = with_extensions(&[]);
            head.extend_from_slice(&tail);
            let _ = check_layout(&head, image_len);
            let _ = check_layout(&tail, image_len);
        }

        #[test]
        fn l1_check_never_panics(head in proptest::collection::vec(any::<u8>(), 0..64),
                                 image_len in any::<u64>()) {
            if check_l1_table(&head, image_len).is_ok() {
                let entries = u64::from(u32::from_be_bytes([head[36], head[37], head[38], head[39]]));
                let mut offset = [0u8; 8];
                offset.copy_from_slice(&head[40..48]);
                prop_assert!(u64::from_be_bytes(offset) + entries * 8 <= image_len);
            }
        }

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
