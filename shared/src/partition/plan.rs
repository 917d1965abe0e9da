//! [`plan`]: sizes in, partitions out.

use super::{
    Layout, LayoutRequest, PartitionError, PlannedPartition, Role, SectorSize, TableKind, MIB,
};

/// Bytes of the GPT partition entry array: 128 entries of 128 bytes (UEFI spec §5.3.1, the
/// `gpt` crate's minimum).
pub(super) const GPT_ENTRY_ARRAY_BYTES: u64 = 128 * 128;

/// The largest sector an MBR entry can reach: start and length are both 32-bit sector counts;
/// keeping every partition's end at or below 2^32 - 1 keeps both in range.
const MBR_MAX_END_SECTOR: u64 = u32::MAX as u64;

/// The bytes at the end of a GPT disk that hold the backup table: the entry array and the backup
/// header in the last sector.
pub(super) fn gpt_backup_bytes(sector_size: SectorSize) -> u64 {
    let ss = sector_size.bytes();
    GPT_ENTRY_ARRAY_BYTES.div_ceil(ss) * ss + ss
}

/// Lays out the partitions of `req` as Ironic's `work_on_disk` does
/// (`docs/ironic-protocols.md` §2.3): the first partition at 1 MiB, each a whole number of MiB,
/// contiguous, in the order EFI, ephemeral, swap, configdrive, root; root last. Partitions of
/// size 0 are left out and the numbers close up (no ephemeral: swap is 1).
///
/// The root partition is `root_mib`, or, for 0, the rest of the disk in whole MiB (up to the
/// backup GPT, or up to what an MBR can address). An image larger than an explicit root either
/// grows it (`grow_root_to_image`, Ironic's behaviour) or is an error.
pub fn plan(req: &LayoutRequest) -> Result<Layout, PartitionError> {
    let ss = req.sector_size.bytes();
    let disk_bytes = req.disk_bytes / ss * ss;
    // Where partitions may end: before the backup GPT, or (MBR) where entries can still reach.
    let disk_usable = match req.table {
        TableKind::Gpt => disk_bytes.saturating_sub(gpt_backup_bytes(req.sector_size)),
        TableKind::Mbr => disk_bytes,
    };
    let mbr_limit = match req.table {
        TableKind::Gpt => u64::MAX,
        TableKind::Mbr => MBR_MAX_END_SECTOR * ss,
    };

    let mut sized: Vec<(Role, u64)> = Vec::with_capacity(5);
    for (role, mib, what) in [
        (Role::Efi, req.efi_mib, "EFI system partition"),
        (Role::Ephemeral, req.ephemeral_mib, "ephemeral partition"),
        (Role::Swap, req.swap_mib, "swap partition"),
        (
            Role::ConfigDrive,
            req.configdrive_bytes.div_ceil(MIB),
            "config drive partition",
        ),
    ] {
        if mib > 0 {
            sized.push((role, mib_to_bytes(mib, what)?));
        }
    }
    let count = sized.len() + 1;
    if req.table == TableKind::Mbr && count > 4 {
        return Err(PartitionError::TooManyMbrPartitions(count));
    }

    let fixed_end = sized.iter().try_fold(MIB, |end, (_, len)| {
        end.checked_add(*len)
            .ok_or(PartitionError::Overflow("partitions' total"))
    })?;

    let image_bytes = req.image_bytes;
    let root_len = if req.root_mib == 0 {
        let rest = disk_usable.min(mbr_limit).saturating_sub(fixed_end) / MIB * MIB;
        if rest == 0 {
            return Err(PartitionError::DiskTooSmall {
                needed: fixed_end
                    .saturating_add(MIB.max(image_bytes.div_ceil(MIB).saturating_mul(MIB))),
                usable: disk_usable,
                disk: disk_bytes,
            });
        }
        if image_bytes > rest {
            return Err(PartitionError::ImageLargerThanRoot {
                image_bytes,
                root_bytes: rest,
            });
        }
        rest
    } else {
        let root = mib_to_bytes(req.root_mib, "root partition")?;
        if image_bytes <= root {
            root
        } else if req.grow_root_to_image {
            mib_to_bytes(image_bytes.div_ceil(MIB), "image")?
        } else {
            return Err(PartitionError::ImageLargerThanRoot {
                image_bytes,
                root_bytes: root,
            });
        }
    };
    sized.push((Role::Root, root_len));

    let mut partitions = Vec::with_capacity(sized.len());
    let mut offset = MIB;
    for (number, (role, len)) in (1u32..).zip(sized) {
        let end = offset
            .checked_add(len)
            .ok_or(PartitionError::Overflow("partitions' total"))?;
        if end > disk_usable {
            return Err(PartitionError::DiskTooSmall {
                needed: fixed_end.saturating_add(root_len),
                usable: disk_usable,
                disk: disk_bytes,
            });
        }
        if end > mbr_limit {
            return Err(PartitionError::BeyondMbrLimit {
                number,
                end_sector: end / ss,
            });
        }
        partitions.push(PlannedPartition {
            role,
            number,
            first_lba: offset / ss,
            sectors: len / ss,
            offset,
            len,
        });
        offset = end;
    }

    Ok(Layout {
        disk_bytes,
        sector_size: req.sector_size,
        table: req.table,
        partitions,
    })
}

fn mib_to_bytes(mib: u64, what: &'static str) -> Result<u64, PartitionError> {
    mib.checked_mul(MIB).ok_or(PartitionError::Overflow(what))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;
    const EFI_MIB: u64 = crate::partition::EFI_SYSTEM_PARTITION_MIB;

    fn request(table: TableKind) -> LayoutRequest {
        LayoutRequest {
            disk_bytes: 10 * GIB,
            sector_size: SectorSize::B512,
            table,
            efi_mib: 0,
            ephemeral_mib: 0,
            swap_mib: 0,
            configdrive_bytes: 0,
            root_mib: 0,
            image_bytes: 0,
            grow_root_to_image: true,
        }
    }

    fn roles(layout: &Layout) -> Vec<(Role, u32, u64, u64)> {
        layout
            .partitions
            .iter()
            .map(|p| (p.role, p.number, p.offset / MIB, p.len / MIB))
            .collect()
    }

    #[test]
    fn ironic_order_and_sizes_on_mbr() {
        let layout = plan(&LayoutRequest {
            ephemeral_mib: 100,
            swap_mib: 64,
            configdrive_bytes: 3 * MIB + 1,
            root_mib: 1024,
            image_bytes: 500 * MIB,
            ..request(TableKind::Mbr)
        })
        .expect("plan");
        assert_eq!(
            roles(&layout),
            vec![
                (Role::Ephemeral, 1, 1, 100),
                (Role::Swap, 2, 101, 64),
                (Role::ConfigDrive, 3, 165, 4),
                (Role::Root, 4, 169, 1024),
            ]
        );
        let root = layout.root().expect("root");
        assert_eq!(root.first_lba, 169 * 2048);
        assert_eq!(root.sectors, 1024 * 2048);
    }

    #[test]
    fn efi_first_on_gpt_and_numbers_close_up() {
        let layout = plan(&LayoutRequest {
            efi_mib: EFI_MIB,
            swap_mib: 16,
            ..request(TableKind::Gpt)
        })
        .expect("plan");
        assert_eq!(
            roles(&layout)[..2],
            [(Role::Efi, 1, 1, 200), (Role::Swap, 2, 201, 16)]
        );
        let root = layout.root().expect("root");
        assert_eq!(root.number, 3);
        // Rest of the disk in whole MiB, before the backup GPT (33 sectors): 10 GiB - 1 MiB.
        assert_eq!(root.end(), 10 * GIB - MIB);
    }

    #[test]
    fn rest_of_disk_on_mbr_ends_at_the_disk_end() {
        let layout = plan(&request(TableKind::Mbr)).expect("plan");
        assert_eq!(roles(&layout), vec![(Role::Root, 1, 1, 10 * 1024 - 1)]);
    }

    #[test]
    fn four_k_sectors() {
        let layout = plan(&LayoutRequest {
            sector_size: SectorSize::B4096,
            swap_mib: 8,
            ..request(TableKind::Gpt)
        })
        .expect("plan");
        assert_eq!(layout.partitions[0].first_lba, 256);
        assert_eq!(layout.partitions[0].sectors, 8 * 256);
        assert_eq!(layout.partitions[1].first_lba, 9 * 256);
    }

    #[test]
    fn image_grows_root_or_fails() {
        let grown = plan(&LayoutRequest {
            root_mib: 10,
            image_bytes: 20 * MIB + 1,
            ..request(TableKind::Mbr)
        })
        .expect("plan");
        assert_eq!(grown.root().expect("root").len, 21 * MIB);

        let err = plan(&LayoutRequest {
            root_mib: 10,
            image_bytes: 20 * MIB + 1,
            grow_root_to_image: false,
            ..request(TableKind::Mbr)
        })
        .expect_err("image too large");
        assert!(matches!(
            err,
            PartitionError::ImageLargerThanRoot { image_bytes, root_bytes }
                if image_bytes == 20 * MIB + 1 && root_bytes == 10 * MIB
        ));
        let text = err.to_string();
        assert!(text.contains("21 MiB") && text.contains("10 MiB"), "{text}");

        let err = plan(&LayoutRequest {
            image_bytes: 11 * GIB,
            ..request(TableKind::Gpt)
        })
        .expect_err("image larger than the disk");
        assert!(matches!(err, PartitionError::ImageLargerThanRoot { .. }));
    }

    #[test]
    fn errors() {
        type Check = fn(&PartitionError) -> bool;
        let cases: Vec<(&str, LayoutRequest, Check)> = vec![
            (
                "disk too small for explicit root",
                LayoutRequest {
                    root_mib: 10 * 1024,
                    ..request(TableKind::Mbr)
                },
                |e| matches!(e, PartitionError::DiskTooSmall { .. }),
            ),
            (
                "no room left for root",
                LayoutRequest {
                    disk_bytes: 2 * MIB,
                    swap_mib: 1,
                    ..request(TableKind::Mbr)
                },
                |e| matches!(e, PartitionError::DiskTooSmall { .. }),
            ),
            (
                "tiny gpt disk",
                LayoutRequest {
                    disk_bytes: 2 * MIB,
                    ..request(TableKind::Gpt)
                },
                |e| matches!(e, PartitionError::DiskTooSmall { .. }),
            ),
            (
                "empty disk",
                LayoutRequest {
                    disk_bytes: 0,
                    ..request(TableKind::Gpt)
                },
                |e| matches!(e, PartitionError::DiskTooSmall { .. }),
            ),
            (
                "five partitions on mbr",
                LayoutRequest {
                    efi_mib: 1,
                    ephemeral_mib: 1,
                    swap_mib: 1,
                    configdrive_bytes: 1,
                    ..request(TableKind::Mbr)
                },
                |e| matches!(e, PartitionError::TooManyMbrPartitions(5)),
            ),
            (
                "mib overflow",
                LayoutRequest {
                    swap_mib: u64::MAX,
                    ..request(TableKind::Gpt)
                },
                |e| matches!(e, PartitionError::Overflow(_)),
            ),
            (
                "sum overflow",
                LayoutRequest {
                    swap_mib: u64::MAX >> 20,
                    ephemeral_mib: u64::MAX >> 20,
                    ..request(TableKind::Gpt)
                },
                |e| matches!(e, PartitionError::Overflow(_)),
            ),
            (
                "mbr beyond 2 TiB",
                LayoutRequest {
                    disk_bytes: 4 << 40,
                    root_mib: 3 << 20,
                    ..request(TableKind::Mbr)
                },
                |e| matches!(e, PartitionError::BeyondMbrLimit { number: 1, .. }),
            ),
        ];
        for (name, req, check) in cases {
            let err = plan(&req).expect_err(name);
            assert!(check(&err), "{name}: {err}");
        }
    }

    #[test]
    fn mbr_rest_of_disk_stops_at_two_tib() {
        let layout = plan(&LayoutRequest {
            disk_bytes: 4 << 40,
            ..request(TableKind::Mbr)
        })
        .expect("plan");
        let root = layout.root().expect("root");
        assert!(root.first_lba + root.sectors <= u64::from(u32::MAX));
        assert_eq!(root.end() % MIB, 0);
    }

    #[test]
    fn sector_size_from_u32() {
        assert_eq!(SectorSize::try_from(4096).ok(), Some(SectorSize::B4096));
        assert!(matches!(
            SectorSize::try_from(520),
            Err(PartitionError::UnsupportedSectorSize(520))
        ));
    }

    fn any_request() -> impl Strategy<Value = LayoutRequest> {
        (
            (0u64..(64 * GIB), any::<bool>(), any::<bool>()),
            (0u64..300, 0u64..3000, 0u64..3000, 0u64..(100 * MIB)),
            (0u64..8000, 0u64..(8 * GIB), any::<bool>()),
        )
            .prop_map(
                |(
                    (disk_bytes, big_sectors, gpt),
                    (efi_mib, ephemeral_mib, swap_mib, configdrive_bytes),
                    (root_mib, image_bytes, grow_root_to_image),
                )| LayoutRequest {
                    disk_bytes,
                    sector_size: if big_sectors {
                        SectorSize::B4096
                    } else {
                        SectorSize::B512
                    },
                    table: if gpt { TableKind::Gpt } else { TableKind::Mbr },
                    efi_mib,
                    ephemeral_mib,
                    swap_mib,
                    configdrive_bytes,
                    root_mib,
                    image_bytes,
                    grow_root_to_image,
                },
            )
    }

    proptest! {
        #[test]
        fn planned_layouts_keep_their_invariants(req in any_request()) {
            let layout = match plan(&req) {
                Ok(layout) => layout,
                Err(PartitionError::DiskTooSmall { needed, usable, .. }) => {
                    prop_assert!(needed > usable);
                    return Ok(());
                }
                Err(PartitionError::ImageLargerThanRoot { image_bytes, root_bytes }) => {
                    prop_assert!(image_bytes > root_bytes);
                    return Ok(());
                }
                Err(PartitionError::TooManyMbrPartitions(n)) => {
                    prop_assert!(n > 4 && req.table == TableKind::Mbr);
                    return Ok(());
                }
                Err(e) => return Err(TestCaseError::fail(format!("unexpected error: {e}"))),
            };
            let ss = req.sector_size.bytes();
            let parts = &layout.partitions;
            prop_assert!(!parts.is_empty());
            prop_assert_eq!(parts[0].offset, MIB);
            let last = parts.last().expect("non-empty");
            prop_assert_eq!(last.role, Role::Root);
            prop_assert!(last.len >= req.image_bytes);
            let usable = match req.table {
                TableKind::Gpt => layout.disk_bytes - gpt_backup_bytes(req.sector_size),
                TableKind::Mbr => layout.disk_bytes,
            };
            prop_assert!(last.end() <= usable);
            if req.table == TableKind::Mbr {
                prop_assert!(parts.len() <= 4);
                prop_assert!(last.end() / ss <= u64::from(u32::MAX));
            }
            let order = [Role::Efi, Role::Ephemeral, Role::Swap, Role::ConfigDrive, Role::Root];
            let mut rank = 0;
            for (i, p) in parts.iter().enumerate() {
                prop_assert_eq!(p.number as usize, i + 1);
                prop_assert_eq!(p.offset % MIB, 0);
                prop_assert_eq!(p.len % MIB, 0);
                prop_assert!(p.len > 0);
                prop_assert_eq!(p.first_lba * ss, p.offset);
                prop_assert_eq!(p.sectors * ss, p.len);
                let r = order.iter().position(|o| *o == p.role).expect("known role");
                prop_assert!(i == 0 || r > rank);
                rank = r;
                if i > 0 {
                    prop_assert_eq!(parts[i - 1].end(), p.offset);
                }
            }
        }

    }
}
