//! The `iscsi_ilo` deploy (DESIGN.md §1; ../shared/reference/ironic-protocols.md §2): the
//! ramdisk exposes the node's disk over iSCSI and the conductor writes the image itself.
//!
//! # Flow
//! - `deploy`: the checks of every virtual-media deploy, then the deploy ramdisk boots with a
//!   floppy holding a one-use deploy key and `iscsi_target_iqn` ([`super::vmedia::prepare`]
//!   with [`Ramdisk::Iscsi`]) → `wait call-back`.
//! - `pass_deploy_info` (the manager has checked and burnt the key): media out and the floppy
//!   deleted; the image from the conductor's cache ([`crate::image_cache`]: one download per
//!   image, checksum verified, qcow2 made raw); a login to `address:3260` with the built-in
//!   initiator; the image written to the whole LUN and the disk identifier read back; log
//!   out; `done` to the ramdisk's port 10000; the disk as the persistent boot device and a
//!   power cycle → `active`.
//!
//! # Limitations
//! Whole-disk images only so far: a partition image (with `kernel` and `ramdisk`) is refused
//! by `validate`, before anything is touched. The layout, the boot ISO shared by image and
//! netboot come with the rest of issue 12 (`vmdeploy_shared::partition`,
//! [`super::boot_iso`]). The image is written whole; its holes are not skipped yet.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use vmdeploy_shared::api::ValidPassDeployInfo;
use vmdeploy_shared::io::hash::ExpectedDigest;
use vmdeploy_shared::params::BootOption;

use super::bmc::Bmc;
use super::vmedia::{self, Ramdisk};
use super::{image, DeployContext, DeployInterface, DeployStep};
use crate::image_cache::ImageSource;
use crate::initiator::{self, Session, SessionConfig};
use crate::manager::HeartbeatRequest;
use crate::node::instance_info::InstanceInfo;
use crate::store::Node;

/// Driver names deployed by [`IscsiDeploy`].
pub const ISCSI_DRIVERS: [&str; 1] = ["iscsi_ilo"];
/// The LUN the ramdisk serves the disk as (Ironic's deploy ramdisk: LUN 1).
const DISK_LUN: u16 = 1;
/// WRITEs in flight while the image goes over.
const WRITE_DEPTH: usize = 8;
/// `driver_internal_info` key of the written disk's identifier (Ironic's name).
pub const ROOT_UUID_KEY: &str = "root_uuid_or_disk_id";
/// How often `done` is tried before the deploy fails (the ramdisk may be a moment late to
/// listen, as Ironic's 3 s sleep before it allows for).
const DONE_ATTEMPTS: u32 = 5;
/// The wait between two `done` attempts.
const DONE_RETRY: Duration = Duration::from_secs(1);
/// Time allowed to connect to the ramdisk and send `done`.
const DONE_TIMEOUT: Duration = Duration::from_secs(10);

/// The `iscsi_ilo` deploy interface.
pub struct IscsiDeploy {
    ctx: Arc<DeployContext>,
}

impl IscsiDeploy {
    /// The flow over `ctx`.
    pub fn new(ctx: Arc<DeployContext>) -> IscsiDeploy {
        IscsiDeploy { ctx }
    }

    /// The instance image, fetched into the cache (or found there).
    async fn cached_image(&self, node: &Node) -> anyhow::Result<crate::image_cache::CachedImage> {
        let images = self.ctx.images.as_ref().context(
            "this conductor has no instance image cache (images.cache_dir), which iscsi_ilo needs",
        )?;
        let image = image::instance_image(&node.instance_info)?;
        let url = match &image.source {
            // A file on the conductor is read where it is: no trip through the object store.
            image::ImageRef::File(path) => format!("file://{}", path.display()),
            other => {
                image::resolve(
                    self.ctx.objects.as_ref(),
                    &self.ctx.config.container,
                    "instance_info/image_source",
                    other,
                    self.ctx.config.deploy_helper_images_ttl,
                )
                .await?
            }
        };
        let digest = ExpectedDigest::new(
            image.digest.algo.parse().with_context(|| {
                format!("instance_info: checksum algorithm {:?}", image.digest.algo)
            })?,
            &image.digest.value,
        )
        .context("instance_info: the image checksum")?;
        let source = ImageSource::new(&image.source_text, url, Some(digest));
        images
            .get(&source)
            .await
            .with_context(|| format!("fetching the instance image {}", image.source_text))
    }
}

/// Writes `path` onto the session's LUN and reads back the disk identifier (the MBR disk
/// signature, `0x%08x`, as IPA's `get_partition_uuids` reports it for whole-disk images).
async fn write_whole_disk(
    session: &Session,
    path: &std::path::Path,
    size: u64,
) -> anyhow::Result<String> {
    let disk = session.size_bytes();
    if size > disk {
        bail!("the image is {size} bytes, larger than the node's disk ({disk} bytes)");
    }
    initiator::write_file(session, path, WRITE_DEPTH)
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
    Ok(format!("0x{signature:08x}"))
}

/// Tells the ramdisk to go on: a TCP connection to its port 10000 carrying `done`
/// (ironic-protocols.md §2.4), tried a few times.
pub async fn notify_done(address: IpAddr, port: u16) -> anyhow::Result<()> {
    let target = SocketAddr::new(address, port);
    let mut last = None;
    for attempt in 1..=DONE_ATTEMPTS {
        let sent = tokio::time::timeout(DONE_TIMEOUT, async {
            let mut stream = tokio::net::TcpStream::connect(target).await?;
            stream.write_all(b"done").await?;
            stream.shutdown().await
        })
        .await;
        match sent {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => last = Some(e.to_string()),
            Err(_) => last = Some(format!("no answer within {DONE_TIMEOUT:?}")),
        }
        tracing::warn!(%target, attempt, error = last.as_deref().unwrap_or(""), "telling the ramdisk done failed");
        if attempt < DONE_ATTEMPTS {
            tokio::time::sleep(DONE_RETRY).await;
        }
    }
    bail!(
        "the ramdisk at {target} did not take \"done\" after {DONE_ATTEMPTS} attempts: {}",
        last.unwrap_or_default()
    )
}

#[async_trait::async_trait]
impl DeployInterface for IscsiDeploy {
    async fn validate(&self, node: &Node) -> anyhow::Result<()> {
        let info = InstanceInfo::of(node).context("instance_info")?;
        if !info.is_whole_disk(&node.driver_internal_info) {
            bail!(
                "iscsi_ilo deploys whole-disk images on this conductor so far; node {} has a \
                 partition image (instance_info kernel/ramdisk): use agent_ilo for it",
                node.uuid
            );
        }
        vmedia::validate_node(&self.ctx, node).await
    }

    async fn deploy(&self, node: &mut Node) -> anyhow::Result<DeployStep> {
        self.validate(node).await.context("validating the node")?;
        node.driver_internal_info.remove(ROOT_UUID_KEY);
        let bmc = Bmc::connect(node, &self.ctx.config.ilo_defaults).await?;
        vmedia::prepare(
            &self.ctx,
            &bmc,
            node,
            Ramdisk::Iscsi {
                boot_option: BootOption::Local,
                chap: None,
            },
        )
        .await
        .context("booting the deploy ramdisk from virtual media")?;
        Ok(DeployStep::Wait)
    }

    async fn heartbeat(
        &self,
        node: &mut Node,
        _heartbeat: &HeartbeatRequest,
    ) -> anyhow::Result<DeployStep> {
        // The iSCSI ramdisk calls back with pass_deploy_info; a heartbeat changes nothing.
        tracing::debug!(node = %node.uuid, "heartbeat ignored: the iSCSI ramdisk reports through pass_deploy_info");
        Ok(DeployStep::Wait)
    }

    fn takes_pass_deploy_info(&self) -> bool {
        true
    }

    async fn pass_deploy_info(
        &self,
        node: &mut Node,
        info: &ValidPassDeployInfo,
    ) -> anyhow::Result<DeployStep> {
        let bmc = Bmc::connect(node, &self.ctx.config.ilo_defaults).await?;
        // The ramdisk has read its floppy and booted: media out, floppy object gone.
        vmedia::cleanup(&self.ctx, Some(&bmc), node).await;
        let image = self.cached_image(node).await?;
        let portal = SocketAddr::new(info.address, self.ctx.config.iscsi_port).to_string();
        let session = Session::open(&SessionConfig::new(&portal, &info.iqn, DISK_LUN))
            .await
            .with_context(|| format!("logging in to {} at {portal}", info.iqn))?;
        let written = write_whole_disk(&session, &image.path, image.size).await;
        if let Err(e) = session.logout().await {
            tracing::warn!(node = %node.uuid, error = %e, "iSCSI logout failed");
        }
        let disk_id = written?;
        tracing::info!(node = %node.uuid, bytes = image.size, disk_id, "image written over iSCSI");
        node.driver_internal_info
            .insert(ROOT_UUID_KEY.into(), json!(disk_id));
        node.driver_internal_info
            .insert("is_whole_disk_image".into(), json!(true));
        drop(image);
        notify_done(info.address, self.ctx.config.done_port).await?;
        bmc.boot_from_disk().await?;
        bmc.power_off().await?;
        bmc.power_on().await?;
        tracing::info!(node = %node.uuid, "deployed: booting from disk");
        Ok(DeployStep::Done)
    }

    async fn tear_down(&self, node: &mut Node) -> anyhow::Result<()> {
        let bmc = Bmc::connect(node, &self.ctx.config.ilo_defaults).await?;
        bmc.power_off().await?;
        vmedia::cleanup(&self.ctx, Some(&bmc), node).await;
        node.driver_internal_info.remove(ROOT_UUID_KEY);
        Ok(())
    }

    async fn clean_up(&self, node: &mut Node) {
        let bmc = match Bmc::connect(node, &self.ctx.config.ilo_defaults).await {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::warn!(node = %node.uuid, error = %format!("{e:#}"), "clean-up: cannot reach the BMC");
                None
            }
        };
        vmedia::cleanup(&self.ctx, bmc.as_ref(), node).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn done_reaches_a_listener_and_a_closed_port_fails_with_the_address() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let got = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut buf = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut buf)
                .await
                .expect("read");
            buf
        });
        notify_done(IpAddr::from([127, 0, 0, 1]), port)
            .await
            .expect("done sent");
        assert_eq!(got.await.expect("listener task"), b"done");

        // A port nobody listens on: every attempt is refused.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let err = notify_done(IpAddr::from([127, 0, 0, 1]), closed)
            .await
            .expect_err("nobody listens");
        assert!(
            format!("{err:#}").contains(&format!("127.0.0.1:{closed}")),
            "{err:#}"
        );
    }
}
