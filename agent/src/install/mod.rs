//! Partition images in the agent: `standby.prepare_image` with `image_info.image_type =
//! partition` lays out the install disk with the same `vmdeploy_shared::partition` code the
//! conductor's `iscsi_ilo` flow uses (one implementation, two callers), streams the root image
//! into its partition, and `image.install_bootloader` makes it boot locally under UEFI.
//!
//! # Modules
//! - [`job`]: `image_info` → the shared [`PartitionJob`](vmdeploy_shared::partition::PartitionJob);
//! - [`write`]: the write itself, in an order that never leaves a table over an unverified image;
//! - [`esp`]: the EFI system partition, formatted and filled with `fatfs` (no mkfs in the
//!   ramdisk), through [`window::ByteWindow`];
//! - [`signed_chain`]: under UEFI Secure Boot, the image's own signed shim and GRUB, read from
//!   the root file system written.
//!
//! # Limitations
//! - No ephemeral partition (`ephemeral_mb > 0` is refused: making its file system needs an
//!   `mkfs` the deploy ramdisk does not carry), hence no `preserve_ephemeral`.
//! - The root image must be raw (compressed or not); qcow2 partition images are refused.
//! - BIOS local boot of a partition image is not built: `standby.prepare_image` refuses such a
//!   job before writing ([`job::BIOS_LOCAL_BOOT_UNSUPPORTED`]), and `image.install_bootloader`
//!   with `target_boot_mode=bios` says so too.

pub mod esp;
pub mod job;
pub mod signed_chain;
pub mod window;
pub mod write;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};
use vmdeploy_shared::partition::{Layout, Role, TableKind};

/// What the last partition image write laid on the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRecord {
    /// The install disk.
    pub disk: PathBuf,
    /// Its partitions.
    pub layout: Layout,
    /// The root file system's UUID.
    pub root_uuid: String,
    /// The EFI system partition's FAT volume id (`ABCD-1234`), when there is one.
    pub esp_uuid: Option<String>,
}

/// IPA's names of the partitions in `get_partition_uuids`' `partitions` map
/// (`ironic_python_agent.disk_utils.make_partitions`).
fn ipa_partition_name(role: Role) -> &'static str {
    match role {
        Role::Efi => "efi system partition",
        Role::Ephemeral => "ephemeral",
        Role::Swap => "swap",
        Role::ConfigDrive => "configdrive",
        Role::Root => "root",
    }
}

impl PartitionRecord {
    /// The `standby.get_partition_uuids` result IPA gives for a partition image
    /// (`partition_utils.work_on_disk`): `root uuid` and `efi system partition uuid` (file
    /// system UUIDs, the latter null without an ESP) and `partitions` (role → device node), plus
    /// `vmdeploy_table`, which Ironic ignores.
    pub fn to_ipa(&self) -> Value {
        let partitions: Map<String, Value> = self
            .layout
            .partitions
            .iter()
            .map(|p| {
                (
                    ipa_partition_name(p.role).to_owned(),
                    json!(write::partition_device(&self.disk, p.number)),
                )
            })
            .collect();
        json!({
            "root uuid": self.root_uuid,
            "efi system partition uuid": self.esp_uuid,
            "partitions": partitions,
            "vmdeploy_table": match self.layout.table {
                TableKind::Gpt => "gpt",
                TableKind::Mbr => "mbr",
            },
        })
    }
}

/// The last partition image write, shared by `standby` (which sets it, and clears it for a
/// whole-disk image) and `image` (which reads it).
pub type InstalledState = Arc<Mutex<Option<PartitionRecord>>>;
