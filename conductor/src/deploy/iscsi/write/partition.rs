//! Partition images (DESIGN.md §5, ironic-protocols.md §2.3): wipe, partition table, root image,
//! swap signature, ephemeral file system, config drive; the root UUID read back.

use anyhow::bail;
use vmdeploy_shared::params::BootMode;

use super::Written;
use crate::image_cache::CachedImage;
use crate::initiator::Session;
use crate::node::instance_info::InstanceInfo;
use crate::store::Node;

/// The layout and contents a partition image deploy lays on the disk, from `instance_info`.
#[derive(Debug, Clone)]
pub struct PartitionJob {
    /// The firmware the instance boots with (MBR for BIOS, GPT for UEFI).
    pub boot_mode: BootMode,
}

impl PartitionJob {
    /// The job for `node`, whose instance info is `info` and boot mode `boot_mode`. Errors
    /// name the `instance_info` field at fault.
    pub fn of(node: &Node, info: &InstanceInfo, boot_mode: BootMode) -> anyhow::Result<Self> {
        let _ = (node, info);
        Ok(PartitionJob { boot_mode })
    }
}

/// Lays out the disk and writes the partition image.
pub async fn write(
    session: &Session,
    image: &CachedImage,
    job: &PartitionJob,
) -> anyhow::Result<Written> {
    let _ = (session, image, job);
    bail!("partition images are not written by iscsi_ilo yet")
}
