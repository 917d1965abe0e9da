//! Partition images (docs/architecture.md §5, docs/ironic-protocols.md §2.3): wipe, partition table, root image,
//! swap signature, ephemeral file system, config drive; the root UUID read back. The job and its
//! layout are `vmdeploy_shared::partition`'s ([`PartitionJob`]), which the agent's partition
//! write uses too; this module parses `instance_info` into it ([`job_from_info`]) and writes
//! over iSCSI.
//!
//! # Flow ([`write`])
//! Everything that can fail without touching the disk runs first: the config drive is fetched
//! and decoded, the layout planned (an image larger than `root_gb` is refused here: unlike
//! Ironic we do not grow the root partition past what the flavor asked for), and the ephemeral
//! file system made locally. Then, over the session: the 36-sector wipes at both ends and the
//! rendered table (or, with `preserve_ephemeral`, a check that the table on the disk is the
//! planned one), the root image into the root partition, the swap signature, the ephemeral file
//! system's written ranges ([`ephemeral`]), the config drive; and the root partition's first
//! bytes read back for its UUID.
//!
//! # Holes
//! The root image is written whole, holes included: the partition holds the previous
//! deployment's data (only the table regions are wiped, as Ironic does), and a file system
//! image relies on reading zeroes in its holes (an ext4 image made on a file marks its inode
//! tables as zeroed without writing them). The reads of the holes come from the page cache or
//! the file system's zero pages, so they cost no disk time.

use anyhow::{bail, Context};
use vmdeploy_shared::fs_id::{self, PROBE_LEN};
use vmdeploy_shared::params::{BootMode, BootOption};
pub use vmdeploy_shared::partition::PartitionJob;
use vmdeploy_shared::partition::{
    self, DiskIds, JobError, JobSpec, Layout, Role, SectorSize, TableKind, MIB, SWAP_LABEL,
};

use super::{Written, WRITE_DEPTH};
use crate::image_cache::CachedImage;
use crate::initiator::{self, Session};
use crate::node::instance_info::InstanceInfo;
use crate::store::Node;

pub mod configdrive;
pub mod ephemeral;
pub mod existing;

pub use ephemeral::FsFormat;

/// The job for `node`, whose instance info is `info` and boot mode `boot_mode`. Errors name
/// the `instance_info` field at fault.
pub fn job_of(
    node: &Node,
    info: &InstanceInfo,
    boot_mode: BootMode,
) -> anyhow::Result<PartitionJob> {
    let whole_disk = info.is_whole_disk(&node.driver_internal_info);
    if whole_disk {
        bail!(
            "node {}: the image is a whole-disk image, not a partition image",
            node.uuid
        );
    }
    let local = super::super::boot_option(info, false)? == BootOption::Local;
    job_from_info(info, boot_mode, local)
}

/// [`job_of`] without the node: `local_boot` is `boot_option=local`. The fields are parsed
/// here (GiB to MiB, `capabilities.disk_label`), the rules shared with the agent applied by
/// [`PartitionJob::new`].
pub fn job_from_info(
    info: &InstanceInfo,
    boot_mode: BootMode,
    local_boot: bool,
) -> anyhow::Result<PartitionJob> {
    let root_gb =
        match info.root_gb {
            None | Some(0) => {
                bail!(
            "instance_info.root_gb is {}: a partition image needs the root partition's size \
             in GiB (at least 1)",
            if info.root_gb.is_none() { "missing" } else { "0" }
        )
            }
            Some(gb) => gb,
        };
    let gib_to_mib = |gb: u64, field: &str| {
        gb.checked_mul(1024)
            .with_context(|| format!("instance_info.{field} ({gb} GiB) is too large"))
    };
    let root_mib = gib_to_mib(root_gb, "root_gb")?;
    let ephemeral_mib = gib_to_mib(info.ephemeral_gb, "ephemeral_gb")?;
    let ephemeral_format = match info.ephemeral_format.as_deref() {
        None => FsFormat::Ext4,
        Some(name) => FsFormat::parse(name).with_context(|| {
            format!(
                "instance_info.ephemeral_format is {name:?}: expected one of {}",
                FsFormat::names()
            )
        })?,
    };
    let disk_label = match info.capabilities.get("disk_label") {
        None => None,
        Some(l) => Some(TableKind::from_disk_label(l).with_context(|| {
            format!("instance_info.capabilities.disk_label is {l:?}: expected msdos or gpt")
        })?),
    };
    let configdrive = match &info.configdrive {
        None => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(_) => bail!(
            "instance_info.configdrive is a JSON object: iscsi_ilo writes a ready config \
             drive image (base64 of gzip, or a URL), it does not build one"
        ),
    };
    PartitionJob::new(JobSpec {
        boot_mode,
        local_boot,
        root_mib,
        swap_mib: info.swap_mb,
        ephemeral_mib,
        ephemeral_format,
        preserve_ephemeral: info.preserve_ephemeral,
        disk_label,
        configdrive,
    })
    .map_err(|e| match e {
        JobError::PreserveWithoutEphemeral => anyhow::anyhow!(
            "instance_info.preserve_ephemeral is true but ephemeral_gb is 0: there is no \
             ephemeral partition to preserve"
        ),
        other => anyhow::anyhow!("instance_info.{other}"),
    })
}

/// Refuses an image larger than its root partition, before anything is read from it or
/// written (the flow asks first, so this error wins over any later check of the image).
pub fn check_fits(image: &CachedImage, job: &PartitionJob) -> anyhow::Result<()> {
    let root_bytes = job.root_mib.saturating_mul(MIB);
    if image.size > root_bytes {
        bail!(
            "the image is {} bytes ({} MiB), larger than the root partition of {} bytes \
             (instance_info.root_gb = {} GiB): nothing was written",
            image.size,
            image.size.div_ceil(MIB),
            root_bytes,
            job.root_mib / 1024
        );
    }
    Ok(())
}

/// Lays out the disk and writes the partition image.
pub async fn write(
    session: &Session,
    image: &CachedImage,
    job: &PartitionJob,
) -> anyhow::Result<Written> {
    check_fits(image, job)?;
    let configdrive = match &job.configdrive {
        Some(value) => Some(
            configdrive::load(value)
                .await
                .context("instance_info.configdrive")?,
        ),
        None => None,
    };
    let block_len = session.block_len();
    let sector_size = u32::try_from(block_len)
        .ok()
        .and_then(|b| SectorSize::try_from(b).ok())
        .with_context(|| {
            format!("the LUN's block size is {block_len} bytes: partition images need 512 or 4096")
        })?;
    let layout = partition::plan(&job.request(
        session.size_bytes(),
        sector_size,
        image.size,
        configdrive.as_ref().map_or(0, |c| c.len() as u64),
    ))
    .context("planning the partitions")?;

    // File systems made locally before the disk is touched: a missing mkfs stops the deploy
    // with the disk as it was. The scratch files go next to the cached image (a disk file
    // system with room, sparse files and FIEMAP); what a crash leaves there is removed when the
    // cache is opened (it keeps only its own entries).
    let scratch = image
        .path
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    let mut made = Vec::new();
    for (role, format, label) in [
        (Role::Efi, FsFormat::Vfat, ephemeral::EFI_LABEL),
        (
            Role::Ephemeral,
            job.ephemeral_format,
            ephemeral::EPHEMERAL_LABEL,
        ),
    ] {
        let Some(part) = layout.partition(role) else {
            continue;
        };
        if role == Role::Ephemeral && job.preserve_ephemeral {
            continue;
        }
        let (dir, len) = (scratch.clone(), part.len);
        let built = tokio::task::spawn_blocking(move || ephemeral::build(&dir, format, label, len))
            .await
            .context("the mkfs task ended abnormally")?
            .with_context(|| format!("making the {} file system", role.name()))?;
        made.push((*part, built));
    }

    if job.preserve_ephemeral {
        check_existing_table(session, &layout)
            .await
            .context("instance_info.preserve_ephemeral")?;
    } else {
        for (offset, len) in partition::wipe_regions(layout.disk_bytes, sector_size) {
            write_bytes(
                session,
                offset,
                &vec![0u8; len as usize],
                "wiping the old tables",
            )
            .await?;
        }
        let ids = DiskIds::random(layout.partitions.len()).context("making disk identifiers")?;
        for table in partition::render(&layout, &ids).context("building the partition table")? {
            write_bytes(
                session,
                table.offset,
                &table.bytes,
                "writing the partition table",
            )
            .await?;
        }
    }

    let root = *layout.root().context("the layout has no root partition")?;
    initiator::write_file_ranges(
        session,
        &image.path,
        root.offset,
        &[(0, image.size)],
        WRITE_DEPTH,
    )
    .await
    .with_context(|| {
        format!(
            "writing the image into the root partition (partition {} at byte {})",
            root.number, root.offset
        )
    })?;

    if let Some(swap) = layout.partition(Role::Swap) {
        let uuid = uuid::Uuid::new_v4();
        let page = partition::swap_signature(swap.len, SWAP_LABEL, *uuid.as_bytes())
            .context("building the swap signature")?;
        write_bytes(session, swap.offset, &page, "writing the swap signature").await?;
    }
    for (part, built) in &made {
        initiator::write_file_ranges(
            session,
            &built.path,
            part.offset,
            &built.ranges,
            WRITE_DEPTH,
        )
        .await
        .with_context(|| {
            format!(
                "writing the {} file system (partition {})",
                part.role.name(),
                part.number
            )
        })?;
    }
    drop(made);
    if let (Some(part), Some(data)) = (layout.partition(Role::ConfigDrive), &configdrive) {
        write_bytes(session, part.offset, data, "writing the config drive").await?;
    }

    let root_uuid = read_root_uuid(session, &layout).await?;
    Ok(Written {
        root_uuid_or_disk_id: root_uuid,
        is_whole_disk: false,
    })
}

async fn write_bytes(
    session: &Session,
    offset: u64,
    data: &[u8],
    what: &'static str,
) -> anyhow::Result<()> {
    initiator::write_bytes_at(session, offset, data, WRITE_DEPTH)
        .await
        .with_context(|| format!("{what} ({} bytes at byte {offset})", data.len()))?;
    Ok(())
}

/// `len` bytes of the LUN from byte `offset` (a whole number of blocks), rounded up to blocks.
async fn read_at(session: &Session, offset: u64, len: usize) -> anyhow::Result<Vec<u8>> {
    let bl = session.block_len();
    let blocks = u32::try_from(len.div_ceil(bl)).context("read length")?;
    session
        .read(offset / bl as u64, blocks)
        .await
        .with_context(|| format!("reading {len} bytes at byte {offset} back over iSCSI"))
}

/// The root partition's file-system UUID, read back from the disk.
async fn read_root_uuid(session: &Session, layout: &Layout) -> anyhow::Result<String> {
    let root = layout.root().context("the layout has no root partition")?;
    let head = read_at(session, root.offset, PROBE_LEN.min(root.len as usize)).await?;
    Ok(fs_id::root_fs_uuid(&head)?)
}

/// With `preserve_ephemeral`: the table on the disk must be `layout`'s.
async fn check_existing_table(session: &Session, layout: &Layout) -> anyhow::Result<()> {
    let ss = layout.sector_size.bytes() as usize;
    let head = read_at(session, 0, 2 * ss).await?;
    let lba1 = head
        .get(ss..2 * ss)
        .context("short read of the disk's first sectors")?;
    let (kind, found) = match existing::gpt_entry_location(lba1) {
        Some((lba, count, size)) => {
            let bytes = count as usize * size as usize;
            let entries = read_at(session, lba.saturating_mul(ss as u64), bytes).await?;
            (
                Some(TableKind::Gpt),
                existing::gpt_partitions(&entries, size),
            )
        }
        None => match existing::mbr_partitions(&head[..ss]) {
            Some(parts) => (
                Some(TableKind::Mbr),
                parts.into_iter().map(|(_, extent)| extent).collect(),
            ),
            None => (None, Vec::new()),
        },
    };
    existing::check_matches(layout, kind, &found).map_err(|why| {
        anyhow::anyhow!(
            "the ephemeral partition cannot be kept: {why}; deploy without preserve_ephemeral, \
             or with the sizes of the previous deploy"
        )
    })
}

#[cfg(test)]
mod tests;
