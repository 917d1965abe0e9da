//! The partition table already on the disk, for `preserve_ephemeral`: Ironic then leaves the
//! table alone and assumes it has the partitions it would make (`work_on_disk` with
//! `commit=False`). We check that assumption instead of trusting it: the existing table must
//! be of the planned kind with the planned partitions, sector for sector, or the deploy stops
//! before anything is written (writing a root image over what is really the ephemeral
//! partition would destroy the data the user asked to keep).
//!
//! Only the fields the check needs are read (MBR entries; GPT header and entries), each
//! bounds-checked: the bytes come from the node's disk.

use vmdeploy_shared::partition::{Layout, TableKind};

/// One partition found on the disk: first sector and length in sectors.
pub type Extent = (u64, u64);

/// The MBR partitions in `sector0` (type ≠ 0), in entry order; `None` without the 0x55AA
/// signature.
pub fn mbr_partitions(sector0: &[u8]) -> Option<Vec<(u8, Extent)>> {
    if sector0.get(510..512)? != [0x55, 0xAA] {
        return None;
    }
    let mut out = Vec::new();
    for i in 0..4 {
        let e = sector0.get(446 + 16 * i..446 + 16 * (i + 1))?;
        let kind = e[4];
        if kind == 0 {
            continue;
        }
        let start = u32::from_le_bytes(e[8..12].try_into().ok()?);
        let len = u32::from_le_bytes(e[12..16].try_into().ok()?);
        out.push((kind, (u64::from(start), u64::from(len))));
    }
    Some(out)
}

/// Where the GPT header at LBA 1 says its entries are: `(first entry LBA, entries, entry
/// size)`; `None` when LBA 1 holds no GPT header.
pub fn gpt_entry_location(lba1: &[u8]) -> Option<(u64, u32, u32)> {
    if lba1.get(0..8)? != b"EFI PART" {
        return None;
    }
    let lba = u64::from_le_bytes(lba1.get(72..80)?.try_into().ok()?);
    let count = u32::from_le_bytes(lba1.get(80..84)?.try_into().ok()?);
    let size = u32::from_le_bytes(lba1.get(84..88)?.try_into().ok()?);
    if !(128..=4096).contains(&size) || count == 0 || count > 1024 {
        return None;
    }
    Some((lba, count, size))
}

/// The used GPT entries (type GUID not zero) in `entries`, in entry order (none for an entry
/// size below the standard 128 bytes).
pub fn gpt_partitions(entries: &[u8], entry_size: u32) -> Vec<Extent> {
    if entry_size < 128 {
        return Vec::new();
    }
    entries
        .chunks_exact(entry_size as usize)
        .filter(|e| e[..16].iter().any(|b| *b != 0))
        .filter_map(|e| {
            let first = u64::from_le_bytes(e.get(32..40)?.try_into().ok()?);
            let last = u64::from_le_bytes(e.get(40..48)?.try_into().ok()?);
            Some((first, last.checked_sub(first)?.checked_add(1)?))
        })
        .collect()
}

/// Whether `found` (the disk's table kind and partitions) is `layout`; an error says how it
/// differs.
pub fn check_matches(
    layout: &Layout,
    found_kind: Option<TableKind>,
    found: &[Extent],
) -> Result<(), String> {
    let want: Vec<Extent> = layout
        .partitions
        .iter()
        .map(|p| (p.first_lba, p.sectors))
        .collect();
    let kind = |k: Option<TableKind>| match k {
        Some(TableKind::Mbr) => "an MBR",
        Some(TableKind::Gpt) => "a GPT",
        None => "no partition table",
    };
    if found_kind != Some(layout.table) {
        return Err(format!(
            "the disk has {}, the layout needs {}",
            kind(found_kind),
            kind(Some(layout.table))
        ));
    }
    if found != want.as_slice() {
        let show = |v: &[Extent]| {
            v.iter()
                .map(|(s, l)| format!("{s}+{l}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(format!(
            "the disk's partitions (first sector+sectors) are [{}], the layout's are [{}]",
            show(found),
            show(&want)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use vmdeploy_shared::partition::{plan, render, DiskIds, LayoutRequest, SectorSize};

    use super::*;

    fn layout(table: TableKind) -> Layout {
        plan(&LayoutRequest {
            disk_bytes: 4 << 30,
            sector_size: SectorSize::B512,
            table,
            efi_mib: 0,
            ephemeral_mib: 1024,
            swap_mib: 64,
            configdrive_bytes: 100_000,
            root_mib: 1024,
            image_bytes: 1 << 20,
            grow_root_to_image: false,
        })
        .expect("plan")
    }

    fn ids() -> DiskIds {
        DiskIds::random(4).expect("ids")
    }

    #[test]
    fn a_rendered_mbr_reads_back_as_its_layout() {
        let l = layout(TableKind::Mbr);
        let writes = render(&l, &ids()).expect("render");
        let parts = mbr_partitions(&writes[0].bytes[..512]).expect("MBR");
        let extents: Vec<Extent> = parts.iter().map(|p| p.1).collect();
        assert_eq!(check_matches(&l, Some(TableKind::Mbr), &extents), Ok(()));
        let other = layout(TableKind::Gpt);
        let err = check_matches(&other, Some(TableKind::Mbr), &extents).expect_err("kind");
        assert!(err.contains("needs a GPT"), "{err}");
    }

    #[test]
    fn a_rendered_gpt_reads_back_as_its_layout() {
        let l = layout(TableKind::Gpt);
        let writes = render(&l, &ids()).expect("render");
        let head = &writes[0].bytes;
        let (lba, count, size) = gpt_entry_location(&head[512..1024]).expect("GPT header");
        let start = lba as usize * 512;
        let entries = &head[start..start + (count * size) as usize];
        let found = gpt_partitions(entries, size);
        assert_eq!(check_matches(&l, Some(TableKind::Gpt), &found), Ok(()));
        let mut moved = found.clone();
        moved[1].1 += 2048;
        let err = check_matches(&l, Some(TableKind::Gpt), &moved).expect_err("differs");
        assert!(err.contains("the layout's are"), "{err}");
    }

    proptest! {
        #[test]
        fn disk_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1100),
                                  size in 0u32..5000) {
            let _ = mbr_partitions(&bytes);
            let _ = gpt_entry_location(&bytes);
            if size > 0 {
                let _ = gpt_partitions(&bytes, size);
            }
        }
    }
}
