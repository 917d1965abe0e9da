//! Partition images: the disk layout the conductor lays on a node's disk before it writes a
//! partition image (docs/architecture.md §5, `docs/ironic-protocols.md` §2.3).
//!
//! # Design
//! Four pure steps, each testable without a disk:
//! - [`wipe_regions`]: the 36 sectors at both ends Ironic zeroes before partitioning (old MBR,
//!   primary and backup GPT), as byte ranges;
//! - [`plan`]: sizes in, partitions out: first at 1 MiB, contiguous, each a whole number of MiB,
//!   in Ironic's order `[EFI] → ephemeral → swap → configdrive → root` (root last, so cloud-init's
//!   growroot can extend it);
//! - [`render`]: the MBR (BIOS) or protective MBR + GPT (UEFI) built with `mbrman` / `gpt` in an
//!   in-memory copy of the disk's first MiB and (GPT) of its end, returned as a few whole,
//!   aligned [`TableWrite`]s. Both crates write small, unaligned pieces (`docs/crates.md`, mbrman made
//!   488 writes for one MBR), which a remote LUN or an O_DIRECT device would turn into
//!   read-modify-write cycles; the caller writes these regions as they are instead;
//! - [`swap_signature`]: the first page of a Linux swap area, as `mkswap -L swap1` writes it.
//!
//! What to lay out comes from a [`PartitionJob`] ([`job`]), which both writers build from
//! their own wire fields: the conductor's `iscsi_ilo` flow (over iSCSI) and the agent's
//! `standby.prepare_image` (on its own disk). One implementation, two callers; each opens its
//! disk and writes, nothing here does I/O. [`configdrive`] decodes the config drive both write,
//! [`local_boot`] is the contract between the deploy ramdisk's GRUB and the agent that installs
//! it for a partition image's local boot.
//!
//! # Limitations
//! - MBR layouts are primary partitions only (at most 4); extended/logical partitions are not
//!   built. An MBR partition cannot reach past 2^32 sectors (2 TiB with 512-byte sectors): a root
//!   that takes "the rest of the disk" stops there, explicit sizes beyond it are an error.
//! - Logical sectors of 512 or 4096 bytes only (what the `gpt` crate supports).
//! - The GPT has the usual 128 entries; partition names are the role names.

pub mod configdrive;
mod error;
pub mod job;
pub mod local_boot;
mod plan;
mod render;
mod swap;
mod wipe;

pub use error::PartitionError;
pub use job::{FsFormat, JobError, JobSpec, PartitionJob, EFI_LABEL, EPHEMERAL_LABEL};
pub use plan::plan;
pub use render::{render, DiskIds, TableWrite, HEAD_REGION_LEN};
pub use swap::{swap_signature, SWAP_LABEL, SWAP_PAGE_SIZE};
pub use wipe::{wipe_regions, WIPE_BYTES};

/// One MiB: the alignment and the size unit of every partition (Ironic's `parted -a optimal ...
/// unit MiB`).
pub const MIB: u64 = 1 << 20;

/// The EFI system partition's size in MiB (Ironic's `efi_system_partition_size`).
pub const EFI_SYSTEM_PARTITION_MIB: u64 = 200;

/// The logical sector size of the disk (SCSI READ CAPACITY(16), BLKSSZGET).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SectorSize {
    /// 512-byte logical sectors (and 512e disks).
    B512,
    /// 4096-byte logical sectors (4Kn disks).
    B4096,
}

impl SectorSize {
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        match self {
            SectorSize::B512 => 512,
            SectorSize::B4096 => 4096,
        }
    }
}

impl TryFrom<u32> for SectorSize {
    type Error = PartitionError;

    fn try_from(bytes: u32) -> Result<Self, PartitionError> {
        match bytes {
            512 => Ok(SectorSize::B512),
            4096 => Ok(SectorSize::B4096),
            other => Err(PartitionError::UnsupportedSectorSize(other)),
        }
    }
}

/// The kind of partition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TableKind {
    /// DOS/MBR table (`msdos` in parted): BIOS boot, Ironic's default.
    Mbr,
    /// GUID partition table behind a protective MBR: UEFI boot.
    Gpt,
}

/// What a partition is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// EFI system partition (FAT, UEFI boot).
    Efi,
    /// Ephemeral space, formatted `ephemeral_format` and labelled `ephemeral0`.
    Ephemeral,
    /// Swap, with a swap signature labelled `swap1`.
    Swap,
    /// The config drive (an ISO 9660 image, label `config-2`).
    ConfigDrive,
    /// The root partition: the image is written here.
    Root,
}

impl Role {
    /// A short lower-case name (also the GPT partition name).
    pub const fn name(self) -> &'static str {
        match self {
            Role::Efi => "efi",
            Role::Ephemeral => "ephemeral",
            Role::Swap => "swap",
            Role::ConfigDrive => "configdrive",
            Role::Root => "root",
        }
    }
}

/// What to lay out: the disk and the sizes Ironic derives from the node's flavor and the
/// instance (`root_gb`, `swap_mb`, `ephemeral_gb`, the config drive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutRequest {
    /// Disk size in bytes (a trailing partial sector is ignored).
    pub disk_bytes: u64,
    /// Logical sector size.
    pub sector_size: SectorSize,
    /// MBR (BIOS) or GPT (UEFI).
    pub table: TableKind,
    /// EFI system partition in MiB, 0 for none ([`EFI_SYSTEM_PARTITION_MIB`] for UEFI).
    pub efi_mib: u64,
    /// Ephemeral partition in MiB, 0 for none.
    pub ephemeral_mib: u64,
    /// Swap partition in MiB, 0 for none.
    pub swap_mib: u64,
    /// Config drive size in bytes (decoded and gunzipped), 0 for none. The partition is the size
    /// rounded up to whole MiB, as Ironic's `ceil(bytes / 2^20)`.
    pub configdrive_bytes: u64,
    /// Root partition in MiB; 0 takes the rest of the disk (in whole MiB).
    pub root_mib: u64,
    /// The root image's virtual (raw) size in bytes.
    pub image_bytes: u64,
    /// Ironic's `deploy_partition_image`: when the image is larger than `root_mib`, raise the
    /// root partition to the image size (rounded up to MiB). When false, that is an error
    /// ([`PartitionError::ImageLargerThanRoot`]).
    pub grow_root_to_image: bool,
}

/// One planned partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlannedPartition {
    /// What it is for.
    pub role: Role,
    /// Partition number (1-based, as in `/dev/sda1`).
    pub number: u32,
    /// First logical sector.
    pub first_lba: u64,
    /// Length in logical sectors.
    pub sectors: u64,
    /// Byte offset on the disk.
    pub offset: u64,
    /// Length in bytes (a whole number of MiB).
    pub len: u64,
}

impl PlannedPartition {
    /// The byte just past the partition.
    pub const fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// The result of [`plan`]: the disk and its partitions, in disk order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Disk size in whole sectors, in bytes.
    pub disk_bytes: u64,
    /// Logical sector size.
    pub sector_size: SectorSize,
    /// MBR or GPT.
    pub table: TableKind,
    /// The partitions, numbered 1.. in disk order; root is last.
    pub partitions: Vec<PlannedPartition>,
}

impl Layout {
    /// The partition with this role, if planned.
    pub fn partition(&self, role: Role) -> Option<&PlannedPartition> {
        self.partitions.iter().find(|p| p.role == role)
    }

    /// The root partition (always planned).
    pub fn root(&self) -> Option<&PlannedPartition> {
        self.partition(Role::Root)
    }

    /// The disk size in logical sectors.
    pub const fn disk_sectors(&self) -> u64 {
        self.disk_bytes / self.sector_size.bytes()
    }
}
