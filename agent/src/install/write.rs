//! [`write_partition_image`]: a partition image onto the install disk, laid out by the shared
//! [`PartitionJob`] (docs/architecture.md §5): root image, partition table, swap signature, config drive,
//! EFI system partition.
//!
//! # Order
//! Everything that can fail without touching the disk runs first (the plan; the caller has
//! decoded the config drive). Then the root image is streamed into the root partition through
//! the agent's verified chain ([`crate::stream::write_into_window`]): the root partition's
//! first MiB is held back until the digest matches. Only then the old tables are wiped and the
//! new one written, then the swap signature, the config drive and the ESP; so a failed or
//! unverified download never leaves a table pointing at it. On any failure after the first
//! write, the table regions (first MiB, and the 36 sectors at the end) are zeroed: the disk
//! does not boot a half-written instance.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use vmdeploy_shared::fs_id::{self, PROBE_LEN};
use vmdeploy_shared::io::hash::ExpectedDigest;
use vmdeploy_shared::partition::{
    self, DiskIds, Layout, PartitionJob, Role, SectorSize, SWAP_LABEL,
};

use super::{esp, PartitionRecord};
use crate::disk::{Disk, HEAD_LEN};
use crate::stream::progress::Progress;
use crate::stream::{write_into_window, Window, WriteOutcome};

/// Lays out `disk` for `job` and writes the image read from `source` into its root partition,
/// verifying `expected`; `configdrive` is the decoded config drive image, if the job has one.
/// What was written, for `get_partition_uuids` and `install_bootloader`.
pub fn write_partition_image(
    source: impl std::io::Read,
    disk: &Arc<Disk>,
    job: &PartitionJob,
    configdrive: Option<&[u8]>,
    expected: Option<&ExpectedDigest>,
    progress: &Progress,
) -> anyhow::Result<(PartitionRecord, WriteOutcome)> {
    if job.preserve_ephemeral || job.ephemeral_mib > 0 {
        bail!("internal error: an ephemeral partition reached the agent's partition writer");
    }
    let block_len = disk.block_len();
    let sector_size = SectorSize::try_from(block_len).with_context(|| {
        format!(
            "the disk's logical block size is {block_len} bytes: partition images need 512 or 4096"
        )
    })?;
    let disk_bytes = disk
        .capacity()
        .unwrap_or_else(|| disk.blocks() * u64::from(block_len));
    let layout = partition::plan(&job.request(
        disk_bytes,
        sector_size,
        0,
        configdrive.map_or(0, |c| c.len() as u64),
    ))
    .context("planning the partitions")?;
    tracing::info!(?layout, "partition layout planned");
    let root = *layout.root().context("the layout has no root partition")?;

    let written = write_image_and_table(source, disk, &layout, configdrive, expected, progress);
    match written {
        Ok(done) => Ok(done),
        Err(err) => {
            tracing::error!(disk = %disk.path().display(), "partition image write failed: {err:#}");
            match clear_tables(disk, &layout) {
                Ok(()) => Err(err.context(format!(
                    "writing the partition image failed (root partition {} at byte {}), so the \
                     disk's partition tables were zeroed",
                    root.number, root.offset
                ))),
                Err(zero) => Err(err.context(format!(
                    "writing the partition image failed, and zeroing the partition tables failed \
                     too ({zero:#}): the disk may hold a partial deploy"
                ))),
            }
        }
    }
}

fn write_image_and_table(
    source: impl std::io::Read,
    disk: &Arc<Disk>,
    layout: &Layout,
    configdrive: Option<&[u8]>,
    expected: Option<&ExpectedDigest>,
    progress: &Progress,
) -> anyhow::Result<(PartitionRecord, WriteOutcome)> {
    let root = *layout.root().context("the layout has no root partition")?;
    let outcome = write_into_window(
        source,
        disk,
        Window {
            offset: root.offset,
            len: root.len,
        },
        expected,
        progress,
    )
    .with_context(|| {
        format!(
            "writing the image into the root partition (partition {}, {} MiB at byte {})",
            root.number,
            root.len >> 20,
            root.offset
        )
    })?;
    let root_uuid = read_root_uuid(disk, root.offset, root.len)?;

    for (offset, len) in partition::wipe_regions(layout.disk_bytes, layout.sector_size) {
        disk.write_at(&vec![0u8; len as usize], offset)
            .with_context(|| format!("wiping the old tables ({len} bytes at byte {offset})"))?;
    }
    let ids = DiskIds::random(layout.partitions.len()).context("making disk identifiers")?;
    for table in partition::render(layout, &ids).context("building the partition table")? {
        disk.write_at(&table.bytes, table.offset).with_context(|| {
            format!(
                "writing the partition table ({} bytes at byte {})",
                table.bytes.len(),
                table.offset
            )
        })?;
    }
    // Random identifiers the table did not use: partition GUIDs are per number.
    let spare = |p: &partition::PlannedPartition| {
        ids.partition_guids
            .get(p.number as usize - 1)
            .map(|g| *g.as_bytes())
            .unwrap_or(*ids.disk_guid.as_bytes())
    };

    if let Some(swap) = layout.partition(Role::Swap) {
        let page = partition::swap_signature(swap.len, SWAP_LABEL, spare(swap))
            .context("building the swap signature")?;
        disk.write_at(&page, swap.offset)
            .context("writing the swap signature")?;
    }
    if let (Some(part), Some(data)) = (layout.partition(Role::ConfigDrive), configdrive) {
        disk.write_at(data, part.offset).with_context(|| {
            format!(
                "writing the config drive ({} bytes at byte {})",
                data.len(),
                part.offset
            )
        })?;
    }
    disk.sync().context("syncing the disk")?;

    let esp_uuid = match layout.partition(Role::Efi) {
        Some(efi) => {
            let guid = spare(efi);
            let volume_id = u32::from_le_bytes([guid[15], guid[14], guid[13], guid[12]]);
            let file = esp::open_buffered(disk.path())?;
            let uuid = esp::format(&file, efi.offset, efi.len, volume_id)?;
            file.sync_data()
                .context("syncing the EFI system partition")?;
            Some(uuid)
        }
        None => None,
    };
    disk.reread_partition_table();
    let record = PartitionRecord {
        disk: disk.path().to_owned(),
        layout: layout.clone(),
        root_uuid,
        esp_uuid,
    };
    tracing::info!(root_uuid = %record.root_uuid, esp_uuid = ?record.esp_uuid, "partition image written");
    Ok((record, outcome))
}

/// The root file system's UUID, read back from the disk (what blkid would say).
fn read_root_uuid(disk: &Disk, offset: u64, len: u64) -> anyhow::Result<String> {
    let mut head = vec![0u8; PROBE_LEN.min(len as usize)];
    disk.read_at(&mut head, offset)
        .with_context(|| format!("reading the root partition's first bytes at byte {offset}"))?;
    Ok(fs_id::root_fs_uuid(&head)?)
}

/// Zeroes the disk's first MiB and the wiped regions at its end.
fn clear_tables(disk: &Disk, layout: &Layout) -> anyhow::Result<()> {
    let head = (HEAD_LEN as u64).min(layout.disk_bytes) as usize;
    disk.write_at(&vec![0u8; head], 0)
        .context("zeroing the first MiB")?;
    for (offset, len) in partition::wipe_regions(layout.disk_bytes, layout.sector_size) {
        disk.write_at(&vec![0u8; len as usize], offset)
            .with_context(|| format!("zeroing {len} bytes at byte {offset}"))?;
    }
    disk.sync().context("syncing the disk")
}

/// The device node of partition `number` of `disk`: `/dev/sda` → `/dev/sda2`, `/dev/nvme0n1` →
/// `/dev/nvme0n1p2` (a disk name ending in a digit takes a `p`), as the kernel names them.
pub fn partition_device(disk: &Path, number: u32) -> String {
    let name = disk.display().to_string();
    if name.ends_with(|c: char| c.is_ascii_digit()) {
        format!("{name}p{number}")
    } else {
        format!("{name}{number}")
    }
}

/// [`write_partition_image`] of a root held in memory, with no config drive and no checksum:
/// the tests' way to lay out a disk.
#[cfg(test)]
pub(crate) fn write_from_memory(
    root: Vec<u8>,
    disk: &Arc<Disk>,
    job: &PartitionJob,
) -> anyhow::Result<(PartitionRecord, WriteOutcome)> {
    let source = std::io::Cursor::new(root);
    write_partition_image(source, disk, job, None, None, &Progress::default())
}

#[cfg(test)]
#[path = "write_tests.rs"]
mod tests;
