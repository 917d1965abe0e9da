//! Whole-disk images: the image is the disk, written to the whole LUN from block 0.

use anyhow::{bail, Context};

use super::{Written, WRITE_DEPTH};
use crate::image_cache::CachedImage;
use crate::initiator::{self, Session};

/// Writes `image` onto the session's LUN and reads back the disk identifier (the MBR disk
/// signature, `0x%08x`, as IPA's `get_partition_uuids` reports it for whole-disk images).
pub async fn write(session: &Session, image: &CachedImage) -> anyhow::Result<Written> {
    let disk = session.size_bytes();
    if image.size > disk {
        bail!(
            "the image is {} bytes, larger than the node's disk ({disk} bytes)",
            image.size
        );
    }
    initiator::write_file(session, &image.path, WRITE_DEPTH)
        .await
        .context("writing the image over iSCSI")?;
    let first = session
        .read(0, 1)
        .await
        .context("reading the written disk's first block back")?;
    let signature = first
        .get(440..444)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
        .context("the LUN's first block is shorter than an MBR")?;
    Ok(Written {
        root_uuid_or_disk_id: format!("0x{signature:08x}"),
        is_whole_disk: true,
    })
}
