//! [`PartitionJob`]: what a partition image deploy lays on the disk, whoever writes it. The
//! conductor's `iscsi_ilo` flow builds it from `instance_info`, the agent from the `image_info`
//! of `standby.prepare_image`; both then ask it for the same [`LayoutRequest`].
//!
//! # Design
//! Each caller parses its own wire fields (their names, units and error messages differ:
//! `root_gb` against `root_mb`, `capabilities.disk_label` against `disk_label`) into a
//! [`JobSpec`] of typed values; [`PartitionJob::new`] applies the rules Ironic applies to both
//! (`docs/ironic-protocols.md` §2.3): the table follows the boot mode unless a disk label is given,
//! the EFI system partition exists only for UEFI with local boot, a preserved ephemeral
//! partition must exist. Errors are [`JobError`]s whose text begins with the field at fault, so
//! a caller prefixes its own document (`instance_info.`, `image_info.`).

use crate::params::BootMode;

use super::{LayoutRequest, SectorSize, TableKind, EFI_SYSTEM_PARTITION_MIB};

/// The label Ironic gives the ephemeral file system.
pub const EPHEMERAL_LABEL: &str = "ephemeral0";
/// The label Ironic gives the EFI system partition's file system (`mkfs -t vfat -n efi-part`).
pub const EFI_LABEL: &str = "efi-part";

/// A file system a partition image deploy may make (`ephemeral_format`, and vfat for the ESP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsFormat {
    /// ext2.
    Ext2,
    /// ext3.
    Ext3,
    /// ext4 (Ironic's default `ephemeral_format`).
    Ext4,
    /// XFS.
    Xfs,
    /// FAT (`mkfs.vfat`).
    Vfat,
}

impl FsFormat {
    /// Every format, in the order errors list them.
    pub const ALL: [FsFormat; 5] = [
        FsFormat::Ext2,
        FsFormat::Ext3,
        FsFormat::Ext4,
        FsFormat::Xfs,
        FsFormat::Vfat,
    ];

    /// The name as `ephemeral_format` and blkid's `TYPE` spell it.
    pub const fn name(self) -> &'static str {
        match self {
            FsFormat::Ext2 => "ext2",
            FsFormat::Ext3 => "ext3",
            FsFormat::Ext4 => "ext4",
            FsFormat::Xfs => "xfs",
            FsFormat::Vfat => "vfat",
        }
    }

    /// The format named `name` (case-insensitive; `fat`/`fat32` are vfat).
    pub fn parse(name: &str) -> Option<FsFormat> {
        let lower = name.trim().to_ascii_lowercase();
        match lower.as_str() {
            "fat" | "fat32" => Some(FsFormat::Vfat),
            _ => FsFormat::ALL.into_iter().find(|f| f.name() == lower),
        }
    }

    /// The accepted names, comma separated (for error messages).
    pub fn names() -> String {
        FsFormat::ALL.map(FsFormat::name).join(", ")
    }
}

impl TableKind {
    /// The table of Ironic's `disk_label` (`msdos` or `gpt`, any case).
    pub fn from_disk_label(label: &str) -> Option<TableKind> {
        if label.eq_ignore_ascii_case("gpt") {
            Some(TableKind::Gpt)
        } else if label.eq_ignore_ascii_case("msdos") {
            Some(TableKind::Mbr)
        } else {
            None
        }
    }
}

/// The typed inputs of a job, parsed by the caller from its own wire fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// The firmware the instance boots with.
    pub boot_mode: BootMode,
    /// `boot_option=local`: the instance boots from the disk (needs an ESP under UEFI).
    pub local_boot: bool,
    /// Root partition in MiB (at least 1).
    pub root_mib: u64,
    /// Swap partition in MiB, 0 for none.
    pub swap_mib: u64,
    /// Ephemeral partition in MiB, 0 for none.
    pub ephemeral_mib: u64,
    /// The ephemeral file system (Ironic's default ext4 when not given).
    pub ephemeral_format: FsFormat,
    /// Keep the ephemeral partition.
    pub preserve_ephemeral: bool,
    /// The table the deploy asked for (`disk_label`), if it did.
    pub disk_label: Option<TableKind>,
    /// The config drive as sent: base64 (of gzip) text or an http(s) URL.
    pub configdrive: Option<String>,
}

/// A rule of [`PartitionJob::new`] the inputs break. The text starts with the field's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// The root partition has no size.
    #[error("root size is 0: a partition image needs a root partition")]
    NoRoot,
    /// `preserve_ephemeral` without an ephemeral partition.
    #[error(
        "preserve_ephemeral is true but the ephemeral size is 0: there is no ephemeral partition \
         to preserve"
    )]
    PreserveWithoutEphemeral,
}

/// The layout and contents a partition image deploy lays on the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionJob {
    /// The firmware the instance boots with.
    pub boot_mode: BootMode,
    /// MBR or GPT: MBR for BIOS, GPT for UEFI, unless `disk_label` says.
    pub table: TableKind,
    /// Root partition in MiB.
    pub root_mib: u64,
    /// Swap partition in MiB, 0 for none.
    pub swap_mib: u64,
    /// Ephemeral partition in MiB, 0 for none.
    pub ephemeral_mib: u64,
    /// The ephemeral file system.
    pub ephemeral_format: FsFormat,
    /// Keep the ephemeral partition: no wipe, no new table (the disk's must match), no mkfs.
    pub preserve_ephemeral: bool,
    /// The config drive: base64 (of gzip) text or an http(s) URL.
    pub configdrive: Option<String>,
    /// An EFI system partition first (UEFI with local boot only, as Ironic).
    pub efi_system_partition: bool,
}

impl PartitionJob {
    /// The job of `spec`, with Ironic's rules applied.
    pub fn new(spec: JobSpec) -> Result<PartitionJob, JobError> {
        if spec.root_mib == 0 {
            return Err(JobError::NoRoot);
        }
        if spec.preserve_ephemeral && spec.ephemeral_mib == 0 {
            return Err(JobError::PreserveWithoutEphemeral);
        }
        let table = spec.disk_label.unwrap_or(match spec.boot_mode {
            BootMode::Uefi => TableKind::Gpt,
            BootMode::Bios => TableKind::Mbr,
        });
        Ok(PartitionJob {
            boot_mode: spec.boot_mode,
            table,
            root_mib: spec.root_mib,
            swap_mib: spec.swap_mib,
            ephemeral_mib: spec.ephemeral_mib,
            ephemeral_format: spec.ephemeral_format,
            preserve_ephemeral: spec.preserve_ephemeral,
            configdrive: spec.configdrive,
            efi_system_partition: spec.boot_mode == BootMode::Uefi && spec.local_boot,
        })
    }

    /// The layout request for a disk of `disk_bytes` with `sector_size` sectors, an image of
    /// `image_bytes` (0 when not known yet: the writer then bounds the stream by the root
    /// partition) and a config drive of `configdrive_bytes`. An image larger than the root
    /// partition is an error, not a larger partition.
    pub fn request(
        &self,
        disk_bytes: u64,
        sector_size: SectorSize,
        image_bytes: u64,
        configdrive_bytes: u64,
    ) -> LayoutRequest {
        LayoutRequest {
            disk_bytes,
            sector_size,
            table: self.table,
            efi_mib: if self.efi_system_partition {
                EFI_SYSTEM_PARTITION_MIB
            } else {
                0
            },
            ephemeral_mib: self.ephemeral_mib,
            swap_mib: self.swap_mib,
            configdrive_bytes,
            root_mib: self.root_mib,
            image_bytes,
            grow_root_to_image: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::{plan, Role};

    fn spec() -> JobSpec {
        JobSpec {
            boot_mode: BootMode::Bios,
            local_boot: true,
            root_mib: 1024,
            swap_mib: 0,
            ephemeral_mib: 0,
            ephemeral_format: FsFormat::Ext4,
            preserve_ephemeral: false,
            disk_label: None,
            configdrive: None,
        }
    }

    #[test]
    fn the_table_follows_the_boot_mode_unless_a_label_is_given() {
        let job = |boot_mode, disk_label| {
            PartitionJob::new(JobSpec {
                boot_mode,
                disk_label,
                ..spec()
            })
            .expect("valid")
            .table
        };
        assert_eq!(job(BootMode::Bios, None), TableKind::Mbr);
        assert_eq!(job(BootMode::Uefi, None), TableKind::Gpt);
        assert_eq!(job(BootMode::Bios, Some(TableKind::Gpt)), TableKind::Gpt);
        assert_eq!(job(BootMode::Uefi, Some(TableKind::Mbr)), TableKind::Mbr);
        assert_eq!(TableKind::from_disk_label("GPT"), Some(TableKind::Gpt));
        assert_eq!(TableKind::from_disk_label("msdos"), Some(TableKind::Mbr));
        assert_eq!(TableKind::from_disk_label("dos"), None);
    }

    #[test]
    fn an_esp_only_for_uefi_local_boot_and_it_comes_first() {
        let esp = |boot_mode, local_boot| {
            PartitionJob::new(JobSpec {
                boot_mode,
                local_boot,
                ..spec()
            })
            .expect("valid")
        };
        assert!(!esp(BootMode::Uefi, false).efi_system_partition);
        assert!(!esp(BootMode::Bios, true).efi_system_partition);
        let job = esp(BootMode::Uefi, true);
        assert!(job.efi_system_partition);
        let req = job.request(8 << 30, SectorSize::B512, 0, 0);
        assert_eq!(req.efi_mib, EFI_SYSTEM_PARTITION_MIB);
        assert!(!req.grow_root_to_image);
        let layout = plan(&req).expect("plan");
        let roles: Vec<Role> = layout.partitions.iter().map(|p| p.role).collect();
        assert_eq!(roles, [Role::Efi, Role::Root]);
        assert_eq!(layout.partitions[0].offset, 1 << 20);
        assert_eq!(layout.partitions[0].len, 200 << 20);
    }

    #[test]
    fn rules_that_cross_fields() {
        let err = PartitionJob::new(JobSpec {
            root_mib: 0,
            ..spec()
        })
        .expect_err("no root");
        assert_eq!(err, JobError::NoRoot);
        let err = PartitionJob::new(JobSpec {
            preserve_ephemeral: true,
            ..spec()
        })
        .expect_err("nothing to preserve");
        assert!(err.to_string().starts_with("preserve_ephemeral"), "{err}");
    }

    #[test]
    fn format_names() {
        for f in FsFormat::ALL {
            assert_eq!(FsFormat::parse(f.name()), Some(f));
            assert_eq!(FsFormat::parse(&f.name().to_uppercase()), Some(f));
        }
        assert_eq!(FsFormat::parse("fat32"), Some(FsFormat::Vfat));
        assert_eq!(FsFormat::parse("ntfs"), None);
        assert_eq!(FsFormat::names(), "ext2, ext3, ext4, xfs, vfat");
    }
}
