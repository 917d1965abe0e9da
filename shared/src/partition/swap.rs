//! [`swap_signature`]: the header `mkswap -L swap1` writes.

use super::PartitionError;

/// The label Ironic gives the swap partition (`mkswap -L swap1`).
pub const SWAP_LABEL: &str = "swap1";

/// The page size of the swap header we write (x86-64): the header is the first page.
pub const SWAP_PAGE_SIZE: usize = 4096;

// `union swap_header` in linux/include/linux/swap.h: 1024 boot bytes, then `info`; the magic
// ends the first page.
const VERSION_OFFSET: usize = 1024;
const LAST_PAGE_OFFSET: usize = 1028;
const NR_BADPAGES_OFFSET: usize = 1032;
const UUID_OFFSET: usize = 1036;
const LABEL_OFFSET: usize = 1052;
const LABEL_LEN: usize = 16;
const MAGIC: &[u8; 10] = b"SWAPSPACE2";
const MAGIC_OFFSET: usize = SWAP_PAGE_SIZE - MAGIC.len();
/// mkswap refuses fewer than 10 pages (util-linux `MIN_GOODPAGES`).
const MIN_PAGES: u64 = 10;

/// The first page of a Linux swap area (version 1) of `partition_bytes` bytes, with `label` and
/// `uuid` (RFC 4122 byte order, as `uuid::Uuid::as_bytes` gives it), as `mkswap -L <label>
/// -U <uuid>` writes it: boot bytes zero, version 1, the last page, no bad pages, the UUID, the
/// label, `SWAPSPACE2` at the end of the page. Little-endian, for x86-64 kernels.
///
/// The caller writes it at the start of the swap partition; the rest of the partition needs no
/// initialisation (mkswap writes nothing else either).
pub fn swap_signature(
    partition_bytes: u64,
    label: &str,
    uuid: [u8; 16],
) -> Result<Vec<u8>, PartitionError> {
    if label.len() > LABEL_LEN || label.contains('\0') {
        return Err(PartitionError::BadSwapLabel(label.to_owned()));
    }
    let pages = partition_bytes / SWAP_PAGE_SIZE as u64;
    if pages < MIN_PAGES {
        return Err(PartitionError::SwapTooSmall(partition_bytes));
    }
    let last_page =
        u32::try_from(pages - 1).map_err(|_| PartitionError::SwapTooLarge(partition_bytes))?;

    let mut page = vec![0u8; SWAP_PAGE_SIZE];
    page[VERSION_OFFSET..VERSION_OFFSET + 4].copy_from_slice(&1u32.to_le_bytes());
    page[LAST_PAGE_OFFSET..LAST_PAGE_OFFSET + 4].copy_from_slice(&last_page.to_le_bytes());
    page[NR_BADPAGES_OFFSET..NR_BADPAGES_OFFSET + 4].copy_from_slice(&0u32.to_le_bytes());
    page[UUID_OFFSET..UUID_OFFSET + 16].copy_from_slice(&uuid);
    page[LABEL_OFFSET..LABEL_OFFSET + label.len()].copy_from_slice(label.as_bytes());
    page[MAGIC_OFFSET..].copy_from_slice(MAGIC);
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [
        0x5e, 0x0b, 0x2f, 0x6c, 0x1a, 0x33, 0x4d, 0x2e, 0x9f, 0x10, 0x11, 0x22, 0x33, 0x44, 0x55,
        0x66,
    ];

    #[test]
    fn header_fields() {
        let page = swap_signature(64 << 20, SWAP_LABEL, UUID).expect("signature");
        assert_eq!(page.len(), 4096);
        assert!(page[..1024].iter().all(|b| *b == 0));
        assert_eq!(&page[1024..1028], &1u32.to_le_bytes());
        assert_eq!(&page[1028..1032], &((64u32 << 8) - 1).to_le_bytes());
        assert_eq!(&page[1032..1036], &[0; 4]);
        assert_eq!(&page[1036..1052], &UUID);
        assert_eq!(&page[1052..1068], b"swap1\0\0\0\0\0\0\0\0\0\0\0");
        assert_eq!(&page[4086..], b"SWAPSPACE2");
        // The fs_id prober reads back what we wrote.
        let id = crate::fs_id::probe(&page).expect("swap recognised");
        assert_eq!(id.kind, crate::fs_id::FsKind::Swap);
        assert_eq!(
            id.uuid.as_deref(),
            Some("5e0b2f6c-1a33-4d2e-9f10-112233445566")
        );
        assert_eq!(id.label.as_deref(), Some("swap1"));
    }

    #[test]
    fn bad_inputs() {
        assert!(matches!(
            swap_signature(40959, "x", UUID),
            Err(PartitionError::SwapTooSmall(40959))
        ));
        assert!(swap_signature(40960, "x", UUID).is_ok());
        assert!(matches!(
            swap_signature(1 << 20, "seventeen-bytes-x", UUID),
            Err(PartitionError::BadSwapLabel(_))
        ));
        assert!(matches!(
            swap_signature(1 << 20, "a\0b", UUID),
            Err(PartitionError::BadSwapLabel(_))
        ));
        assert!(swap_signature(1 << 20, "sixteen-bytes-xx", UUID).is_ok());
        assert!(matches!(
            swap_signature(u64::MAX, "x", UUID),
            Err(PartitionError::SwapTooLarge(_))
        ));
    }
}
