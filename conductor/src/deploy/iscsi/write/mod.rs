//! Writing the instance image onto the node's disk over an iSCSI session: the whole disk for a
//! whole-disk image ([`whole_disk`]), a partition table and partitions for a partition image
//! ([`partition`]). The session is open and logged in; the caller logs out.

use crate::image_cache::CachedImage;
use crate::initiator::Session;

pub mod partition;
pub mod whole_disk;

pub use partition::PartitionJob;

/// WRITEs in flight while the image goes over.
pub(crate) const WRITE_DEPTH: usize = 8;

/// What goes on the disk.
#[derive(Debug, Clone)]
pub enum DiskJob {
    /// The image is the whole disk.
    WholeDisk,
    /// A partition image with its layout (from `instance_info`).
    Partition(PartitionJob),
}

/// What was written, as the flow records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The root partition's file-system UUID (partition images) or the disk identifier
    /// (whole-disk images): `driver_internal_info.root_uuid_or_disk_id`.
    pub root_uuid_or_disk_id: String,
    /// Whether the image was a whole-disk image.
    pub is_whole_disk: bool,
}

/// Writes `image` onto the session's LUN as `job` says.
pub async fn write_image(
    session: &Session,
    image: &CachedImage,
    job: &DiskJob,
) -> anyhow::Result<Written> {
    match job {
        DiskJob::WholeDisk => whole_disk::write(session, image).await,
        DiskJob::Partition(job) => partition::write(session, image, job).await,
    }
}
