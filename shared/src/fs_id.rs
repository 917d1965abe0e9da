//! File system identity: the type, UUID and label of a file system, read from its first bytes as
//! `blkid -p` reports them.
//!
//! # Design
//! The conductor reads the root partition's UUID back after writing a partition image (Ironic
//! runs `blkid -s UUID -o value` on it, `docs/ironic-protocols.md` §2.3) and puts
//! it on the boot ISO's command line (`root=UUID=...`). It has the bytes, not a device, so
//! [`probe`] works on a slice: the caller reads the first [`PROBE_LEN`] bytes of the partition.
//!
//! The bytes come from a disk image a user supplied: every read is bounds-checked ([`field`])
//! and nothing here can panic, whatever the input (a property test throws arbitrary bytes at
//! it).
//!
//! # Limitations
//! ext2/3/4, XFS, vfat (FAT12/16/32), Linux swap (v1, 4 KiB pages and larger) and btrfs only.
//! The vfat label is the boot sector's (blkid prefers the root directory's volume entry;
//! `mkfs.vfat -n` writes both alike). ext3 vs ext4 follows blkid's rule in outline (any
//! feature ext3 lacks makes it ext4), not its every corner.

/// How many bytes from the start of a file system [`probe`] needs to see everything it knows
/// (the btrfs superblock sits at 64 KiB).
pub const PROBE_LEN: usize = BTRFS_SB_OFFSET + 4096;

/// The kinds of file system [`probe`] recognises, named as blkid's `TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FsKind {
    /// ext2.
    Ext2,
    /// ext3 (ext2 with a journal).
    Ext3,
    /// ext4.
    Ext4,
    /// XFS.
    Xfs,
    /// FAT12/16/32.
    Vfat,
    /// Linux swap area (version 1).
    Swap,
    /// btrfs.
    Btrfs,
}

impl FsKind {
    /// blkid's `TYPE` value.
    pub const fn as_str(self) -> &'static str {
        match self {
            FsKind::Ext2 => "ext2",
            FsKind::Ext3 => "ext3",
            FsKind::Ext4 => "ext4",
            FsKind::Xfs => "xfs",
            FsKind::Vfat => "vfat",
            FsKind::Swap => "swap",
            FsKind::Btrfs => "btrfs",
        }
    }
}

/// What [`probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsId {
    /// The file system type.
    pub kind: FsKind,
    /// The UUID as blkid prints it (`5e0b2f6c-...` lower case; vfat `ABCD-1234`), `None` when
    /// the file system has none (an all-zero UUID, which blkid does not print).
    pub uuid: Option<String>,
    /// The label, `None` when empty.
    pub label: Option<String>,
}

// ext2/3/4: the superblock at 1024 (linux/fs/ext4/ext4.h `struct ext4_super_block`).
const EXT_SB: usize = 1024;
const EXT_MAGIC_OFFSET: usize = EXT_SB + 56;
const EXT_MAGIC: [u8; 2] = 0xEF53u16.to_le_bytes();
const EXT_FEATURE_COMPAT: usize = EXT_SB + 92;
const EXT_FEATURE_INCOMPAT: usize = EXT_SB + 96;
const EXT_FEATURE_RO_COMPAT: usize = EXT_SB + 100;
const EXT_UUID: usize = EXT_SB + 104;
const EXT_LABEL: usize = EXT_SB + 120;
const EXT_LABEL_LEN: usize = 16;
const EXT_COMPAT_HAS_JOURNAL: u32 = 0x4;
const EXT_INCOMPAT_JOURNAL_DEV: u32 = 0x8;
/// Incompatible features ext3 has too: filetype, recover, meta_bg.
const EXT3_INCOMPAT: u32 = 0x2 | 0x4 | 0x10;
/// Read-only features ext3 has too: sparse_super, large_file, btree_dir.
const EXT3_RO_COMPAT: u32 = 0x1 | 0x2 | 0x4;

// XFS: the superblock at 0 (xfs_format.h `struct xfs_sb`), big-endian.
const XFS_MAGIC: &[u8; 4] = b"XFSB";
const XFS_UUID: usize = 32;
const XFS_LABEL: usize = 108;
const XFS_LABEL_LEN: usize = 12;

// Linux swap: `union swap_header`, the magic ends the first page.
const SWAP_MAGIC: &[u8; 10] = b"SWAPSPACE2";
const SWAP_UUID: usize = 1036;
const SWAP_LABEL: usize = 1052;
const SWAP_LABEL_LEN: usize = 16;
const SWAP_PAGE_SIZES: [usize; 4] = [4096, 8192, 16384, 65536];

// FAT: the volume serial follows the extended BPB signature.
const FAT16_EBPB_SIGNATURE: usize = 0x26;
const FAT32_EBPB_SIGNATURE: usize = 0x42;
const FAT_SECTORS_PER_FAT_16: usize = 0x16;

// btrfs: the superblock at 64 KiB (ctree.h `struct btrfs_super_block`).
const BTRFS_SB_OFFSET: usize = 0x10000;
const BTRFS_FSID: usize = BTRFS_SB_OFFSET + 0x20;
const BTRFS_MAGIC_OFFSET: usize = BTRFS_SB_OFFSET + 0x40;
const BTRFS_MAGIC: &[u8; 8] = b"_BHRfS_M";
const BTRFS_LABEL: usize = BTRFS_SB_OFFSET + 0x12b;
const BTRFS_LABEL_LEN: usize = 256;

/// The file system whose first bytes are `bytes` (at least [`PROBE_LEN`] for btrfs; 4 KiB is
/// enough for the others), or `None` if none is recognised. Never panics.
pub fn probe(bytes: &[u8]) -> Option<FsId> {
    probe_swap(bytes)
        .or_else(|| probe_xfs(bytes))
        .or_else(|| probe_btrfs(bytes))
        .or_else(|| probe_ext(bytes))
        .or_else(|| probe_vfat(bytes))
}

/// Why a partition's first bytes give no root file-system UUID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RootFsError {
    /// No file system recognised; the first bytes in hex.
    #[error(
        "the root partition holds no recognised file system (ext2/3/4, xfs, vfat, btrfs); its \
         first bytes are {0}: is the image a partition image?"
    )]
    Unrecognised(String),
    /// A swap signature.
    #[error("the root partition holds a swap area, not a file system: the image is not a root file system")]
    Swap,
    /// A file system without a UUID.
    #[error(
        "the root partition's {0} file system has no UUID, which booting it needs (root=UUID=...)"
    )]
    NoUuid(&'static str),
}

/// The UUID of the root file system whose first bytes are `head` (a partition image just
/// written, read back): what both the conductor (`iscsi_ilo`) and the agent record and boot by.
pub fn root_fs_uuid(head: &[u8]) -> Result<String, RootFsError> {
    let id = probe(head).ok_or_else(|| {
        RootFsError::Unrecognised(head.iter().take(16).map(|b| format!("{b:02x}")).collect())
    })?;
    if id.kind == FsKind::Swap {
        return Err(RootFsError::Swap);
    }
    id.uuid.ok_or(RootFsError::NoUuid(id.kind.as_str()))
}

/// `bytes[offset..offset + len]`, or `None` past the end.
fn field(bytes: &[u8], offset: usize, len: usize) -> Option<&[u8]> {
    bytes.get(offset..offset.checked_add(len)?)
}

fn array<const N: usize>(bytes: &[u8], offset: usize) -> Option<[u8; N]> {
    field(bytes, offset, N)?.try_into().ok()
}

fn le_u32(bytes: &[u8], offset: usize) -> Option<u32> {
    array(bytes, offset).map(u32::from_le_bytes)
}

/// A 16-byte UUID as blkid prints it (RFC 4122 order, lower-case hex), `None` if all zero.
fn uuid_text(raw: [u8; 16]) -> Option<String> {
    if raw == [0; 16] {
        return None;
    }
    let hex = hex::encode(raw);
    Some(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

/// A NUL-padded label, `None` if empty.
fn label_text(raw: &[u8]) -> Option<String> {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    let label = String::from_utf8_lossy(&raw[..end]).into_owned();
    (!label.is_empty()).then_some(label)
}

fn probe_swap(bytes: &[u8]) -> Option<FsId> {
    SWAP_PAGE_SIZES.iter().find_map(|page| {
        let magic = field(bytes, page.checked_sub(SWAP_MAGIC.len())?, SWAP_MAGIC.len())?;
        (magic == SWAP_MAGIC).then_some(())?;
        Some(FsId {
            kind: FsKind::Swap,
            uuid: uuid_text(array(bytes, SWAP_UUID)?),
            label: label_text(field(bytes, SWAP_LABEL, SWAP_LABEL_LEN)?),
        })
    })
}

fn probe_xfs(bytes: &[u8]) -> Option<FsId> {
    (field(bytes, 0, 4)? == XFS_MAGIC).then_some(())?;
    Some(FsId {
        kind: FsKind::Xfs,
        uuid: uuid_text(array(bytes, XFS_UUID)?),
        label: label_text(field(bytes, XFS_LABEL, XFS_LABEL_LEN)?),
    })
}

fn probe_btrfs(bytes: &[u8]) -> Option<FsId> {
    (field(bytes, BTRFS_MAGIC_OFFSET, BTRFS_MAGIC.len())? == BTRFS_MAGIC).then_some(())?;
    Some(FsId {
        kind: FsKind::Btrfs,
        uuid: uuid_text(array(bytes, BTRFS_FSID)?),
        label: label_text(field(bytes, BTRFS_LABEL, BTRFS_LABEL_LEN)?),
    })
}

fn probe_ext(bytes: &[u8]) -> Option<FsId> {
    (field(bytes, EXT_MAGIC_OFFSET, 2)? == EXT_MAGIC).then_some(())?;
    let compat = le_u32(bytes, EXT_FEATURE_COMPAT)?;
    let incompat = le_u32(bytes, EXT_FEATURE_INCOMPAT)?;
    let ro_compat = le_u32(bytes, EXT_FEATURE_RO_COMPAT)?;
    if incompat & EXT_INCOMPAT_JOURNAL_DEV != 0 {
        // An external journal device (blkid: jbd), not a file system to mount.
        return None;
    }
    let kind = if incompat & !EXT3_INCOMPAT != 0 || ro_compat & !EXT3_RO_COMPAT != 0 {
        FsKind::Ext4
    } else if compat & EXT_COMPAT_HAS_JOURNAL != 0 {
        FsKind::Ext3
    } else {
        FsKind::Ext2
    };
    Some(FsId {
        kind,
        uuid: uuid_text(array(bytes, EXT_UUID)?),
        label: label_text(field(bytes, EXT_LABEL, EXT_LABEL_LEN)?),
    })
}

fn probe_vfat(bytes: &[u8]) -> Option<FsId> {
    let sector = field(bytes, 0, 512)?;
    // fat_label validates the BIOS parameter block (an MBR does not pass for FAT).
    let label = crate::fat::fat_label(sector).ok()?;
    let sectors_per_fat_16 = field(sector, FAT_SECTORS_PER_FAT_16, 2)?;
    let signature_offset = if sectors_per_fat_16 == [0, 0] {
        FAT32_EBPB_SIGNATURE
    } else {
        FAT16_EBPB_SIGNATURE
    };
    // Signatures 0x28 and 0x29 carry a serial (0x29 a label too); older boot sectors have none.
    let uuid = match *field(sector, signature_offset, 1)? {
        [0x28 | 0x29] => {
            let serial = le_u32(sector, signature_offset + 1)?;
            Some(format!("{:04X}-{:04X}", serial >> 16, serial & 0xFFFF))
        }
        _ => None,
    };
    Some(FsId {
        kind: FsKind::Vfat,
        uuid,
        label,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UUID: [u8; 16] = [
        0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0x4d, 0xef, 0x81, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd,
        0xef,
    ];
    const UUID_TEXT: &str = "01234567-89ab-4def-8123-456789abcdef";

    fn ext(compat: u32, incompat: u32, ro_compat: u32) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        b[EXT_MAGIC_OFFSET..EXT_MAGIC_OFFSET + 2].copy_from_slice(&EXT_MAGIC);
        b[EXT_FEATURE_COMPAT..EXT_FEATURE_COMPAT + 4].copy_from_slice(&compat.to_le_bytes());
        b[EXT_FEATURE_INCOMPAT..EXT_FEATURE_INCOMPAT + 4].copy_from_slice(&incompat.to_le_bytes());
        b[EXT_FEATURE_RO_COMPAT..EXT_FEATURE_RO_COMPAT + 4]
            .copy_from_slice(&ro_compat.to_le_bytes());
        b[EXT_UUID..EXT_UUID + 16].copy_from_slice(&UUID);
        b[EXT_LABEL..EXT_LABEL + 4].copy_from_slice(b"root");
        b
    }

    #[test]
    fn ext_kinds() {
        let cases = [
            ("ext2", ext(0, 0x2, 0x3), Some(FsKind::Ext2)),
            ("ext3", ext(0x4, 0x2, 0x3), Some(FsKind::Ext3)),
            // extents | 64bit | flex_bg, metadata_csum: mke2fs's ext4 defaults
            ("ext4", ext(0x3c, 0x2c2, 0x46b), Some(FsKind::Ext4)),
            ("journal device", ext(0, 0x8, 0), None),
        ];
        for (name, bytes, kind) in cases {
            let id = probe(&bytes);
            assert_eq!(id.as_ref().map(|i| i.kind), kind, "{name}");
            if let Some(id) = id {
                assert_eq!(id.uuid.as_deref(), Some(UUID_TEXT), "{name}");
                assert_eq!(id.label.as_deref(), Some("root"), "{name}");
            }
        }
    }

    #[test]
    fn xfs_and_btrfs() {
        let mut xfs = vec![0u8; 512];
        xfs[..4].copy_from_slice(b"XFSB");
        xfs[XFS_UUID..XFS_UUID + 16].copy_from_slice(&UUID);
        xfs[XFS_LABEL..XFS_LABEL + 12].copy_from_slice(b"twelve-chars");
        assert_eq!(
            probe(&xfs),
            Some(FsId {
                kind: FsKind::Xfs,
                uuid: Some(UUID_TEXT.into()),
                label: Some("twelve-chars".into())
            })
        );

        let mut btrfs = vec![0u8; PROBE_LEN];
        btrfs[BTRFS_MAGIC_OFFSET..BTRFS_MAGIC_OFFSET + 8].copy_from_slice(BTRFS_MAGIC);
        btrfs[BTRFS_FSID..BTRFS_FSID + 16].copy_from_slice(&UUID);
        assert_eq!(
            probe(&btrfs),
            Some(FsId {
                kind: FsKind::Btrfs,
                uuid: Some(UUID_TEXT.into()),
                label: None
            })
        );
        // Cut short: no superblock, nothing found.
        assert_eq!(probe(&btrfs[..BTRFS_MAGIC_OFFSET + 4]), None);
    }

    #[test]
    fn vfat_serial_and_label() {
        let floppy = crate::fat::build_floppy("ir-vfd-dev", &[]).expect("floppy");
        let id = probe(&floppy).expect("vfat");
        assert_eq!(id.kind, FsKind::Vfat);
        assert_eq!(id.label.as_deref(), Some("ir-vfd-dev"));
        let serial = u32::from_le_bytes([floppy[0x27], floppy[0x28], floppy[0x29], floppy[0x2a]]);
        assert_eq!(
            id.uuid,
            Some(format!("{:04X}-{:04X}", serial >> 16, serial & 0xffff))
        );
    }

    #[test]
    fn nothing_in_zeros_or_short_input() {
        assert_eq!(probe(&[]), None);
        assert_eq!(probe(&[0u8; PROBE_LEN]), None);
        let mut zero_uuid = ext(0, 0, 0);
        zero_uuid[EXT_UUID..EXT_UUID + 16].fill(0);
        assert_eq!(probe(&zero_uuid).and_then(|i| i.uuid), None);
        // Magic present, superblock cut short before its UUID.
        assert_eq!(probe(&ext(0, 0, 0)[..EXT_MAGIC_OFFSET + 2]), None);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..8192)) {
            let id = probe(&bytes);
            if let Some(FsId { uuid: Some(uuid), .. }) = id {
                prop_assert!(uuid.len() == 36 || uuid.len() == 9, "{}", uuid);
            }
        }

        #[test]
        fn arbitrary_superblocks_never_panic(
            magic in 0usize..5,
            body in proptest::collection::vec(any::<u8>(), 0..PROBE_LEN + 16),
            cut in 0usize..PROBE_LEN + 16,
        ) {
            // Plant a real magic in random bytes so the parsers get past it, then cut anywhere.
            let mut bytes = body;
            let (offset, magic): (usize, &[u8]) = match magic {
                0 => (EXT_MAGIC_OFFSET, &EXT_MAGIC),
                1 => (0, XFS_MAGIC),
                2 => (4086, SWAP_MAGIC),
                3 => (BTRFS_MAGIC_OFFSET, BTRFS_MAGIC),
                _ => (510, &[0x55, 0xAA]),
            };
            if bytes.len() >= offset + magic.len() {
                bytes[offset..offset + magic.len()].copy_from_slice(magic);
            }
            let cut = cut.min(bytes.len());
            let id = probe(&bytes[..cut]);
            if let Some(id) = id {
                prop_assert!(id.label.as_ref().is_none_or(|l| !l.is_empty()));
            }
        }
    }
}
