//! The `iscsi` deploy interface (docs/architecture.md §1; docs/ironic-protocols.md §2): the
//! ramdisk exposes the node's disk over iSCSI and the conductor writes the image itself. One
//! implementation over a boot interface ([`BootInterface`]): `iscsi_ilo` boots from virtual
//! media, `pxe_ilo` from the network.
//!
//! # Flow
//! - `deploy`: the boot interface's checks and the instance image's, then the deploy ramdisk
//!   boots with a one-use deploy key and `iscsi_target_iqn`
//!   ([`BootInterface::prepare_ramdisk`] with [`Ramdisk::Iscsi`]) → `wait call-back`.
//! - `pass_deploy_info` (the manager has checked and burnt the key): the ramdisk's boot
//!   undone; the image from the conductor's cache ([`crate::image_cache`]: one download per
//!   image, checksum verified, qcow2 made raw); for a netboot instance its boot made ready
//!   before anything is written ([`BootInterface::prepare_instance`]); a login to
//!   `address:3260` with the built-in initiator; a whole-disk image written to the whole LUN
//!   and the disk identifier read back, or a partition image's table, root, swap, ephemeral
//!   and config drive written and the root file system's UUID read back ([`write`]); log out;
//!   `done` to the ramdisk's port 10000; then the disk as the persistent boot device (local
//!   boot), or the instance's boot (netboot, [`BootInterface::boot_instance`]), and a power
//!   cycle → `active`. An API power-on or reboot of a netboot node renews its boot first
//!   ([`DeployInterface::prepare_instance_boot`]).
//!
//! # Parts
//! - [`write`]: the image onto the LUN: whole disk, or partition table and partitions;
//! - [`done`]: the `done` the ramdisk waits for.
//!
//! # Limitations
//! A partition image with `boot_option=local` needs a boot loader installed inside the
//! instance's file system (Ironic does it through the agent's `image.install_bootloader`);
//! neither our iSCSI ramdisk nor our agent does, so `validate` refuses the combination and
//! says what works: netboot, or a whole-disk image.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{bail, Context};
use serde_json::json;
use vmdeploy_shared::api::ValidPassDeployInfo;
use vmdeploy_shared::params::{BootMode, BootOption};

use super::{Cleaning, DeployContext, DeployInterface, DeployStep};
use crate::bmc::Bmc;
use crate::boot::vmedia::VirtualMediaBoot;
use crate::boot::{BootInterface, Ramdisk, BOOT_MODE_KEY};
use crate::context::image;
use crate::image_cache::ImageSource;
use crate::initiator::{Session, SessionConfig};
use crate::node::instance_info::InstanceInfo;
use crate::store::Node;

/// The LUN the ramdisk serves the disk as (Ironic's deploy ramdisk: LUN 1).
const DISK_LUN: u16 = 1;
/// `driver_internal_info` key of the written disk's identifier (Ironic's name).
pub const ROOT_UUID_KEY: &str = "root_uuid_or_disk_id";
/// `driver_internal_info` key of where the instance boots from (`local` or `netboot`),
/// settled at deploy time.
pub const BOOT_OPTION_KEY: &str = "iscsi_boot_option";

pub mod done;
pub mod write;

pub use done::notify_done;

/// A write ready to start: what goes on the disk, and the image from the cache.
struct PlannedWrite {
    job: write::DiskJob,
    image: crate::image_cache::CachedImage,
}

impl PlannedWrite {
    /// The UUID of the root file system a partition image holds, read from the cached image
    /// before anything is written (the writer reads the same bytes back from the disk
    /// afterwards); `None` for a whole-disk image.
    async fn root_fs_uuid(&self) -> anyhow::Result<Option<String>> {
        use tokio::io::AsyncReadExt as _;
        if !matches!(self.job, write::DiskJob::Partition(_)) {
            return Ok(None);
        }
        let path = &self.image.path;
        let file = tokio::fs::File::open(path)
            .await
            .with_context(|| format!("opening the cached image {}", path.display()))?;
        let mut head = Vec::with_capacity(vmdeploy_shared::fs_id::PROBE_LEN);
        file.take(vmdeploy_shared::fs_id::PROBE_LEN as u64)
            .read_to_end(&mut head)
            .await
            .with_context(|| format!("reading the cached image {}", path.display()))?;
        let uuid = vmdeploy_shared::fs_id::root_fs_uuid(&head)
            .context("the partition image's root file system")?;
        Ok(Some(uuid))
    }
}

/// Everything of the write that can fail without touching the disk: the job from
/// `instance_info` and the image fetched into the cache (checksum verified, made raw).
async fn plan_write(ctx: &DeployContext, node: &Node) -> anyhow::Result<PlannedWrite> {
    let instance = InstanceInfo::of(node).context("instance_info")?;
    let whole_disk = instance.is_whole_disk(&node.driver_internal_info);
    let job = if whole_disk {
        write::DiskJob::WholeDisk
    } else {
        write::DiskJob::Partition(write::partition::job_of(
            node,
            &instance,
            deployed_boot_mode(node)?,
        )?)
    };
    let image = cached_image(ctx, node).await?;
    if let write::DiskJob::Partition(partition) = &job {
        write::partition::check_fits(&image, partition)?;
    }
    Ok(PlannedWrite { job, image })
}

/// The planned image onto the ramdisk's LUN (whole disk, or partition table and partitions),
/// the written disk's identifier recorded in `driver_internal_info`, a logout, and `done` to
/// the ramdisk.
async fn write_planned(
    ctx: &DeployContext,
    node: &mut Node,
    info: &ValidPassDeployInfo,
    planned: PlannedWrite,
) -> anyhow::Result<write::Written> {
    let PlannedWrite { job, image } = planned;
    let portal = SocketAddr::new(info.address, ctx.config.iscsi_port).to_string();
    let mut login = SessionConfig::new(&portal, &info.iqn, DISK_LUN);
    // The ramdisk's target requires the CHAP credentials it was given.
    login.chap = ctx.config.iscsi_chap.as_ref().map(|c| {
        vmdeploy_shared::iscsi::chap::ChapCredentials::new(
            c.user.clone(),
            c.secret.expose().as_bytes(),
        )
    });
    let session = Session::open(&login)
        .await
        .with_context(|| format!("logging in to {} at {portal}", info.iqn))?;
    let written = write::write_image(&session, &image, &job).await;
    if let Err(e) = session.logout().await {
        tracing::warn!(node = %node.uuid, error = %e, "iSCSI logout failed");
    }
    let written = written?;
    tracing::info!(
        node = %node.uuid,
        bytes = image.size,
        root_uuid_or_disk_id = written.root_uuid_or_disk_id,
        "image written over iSCSI"
    );
    node.driver_internal_info
        .insert(ROOT_UUID_KEY.into(), json!(written.root_uuid_or_disk_id));
    node.driver_internal_info
        .insert("is_whole_disk_image".into(), json!(written.is_whole_disk));
    drop(image);
    notify_done(info.address, ctx.config.done_port, &ctx.config.done).await?;
    Ok(written)
}

/// The `iscsi` deploy interface over a boot interface: `iscsi_ilo` with virtual media,
/// `pxe_ilo` with the network boot.
pub struct IscsiDeploy {
    ctx: Arc<DeployContext>,
    boot: Arc<dyn BootInterface>,
}

impl IscsiDeploy {
    /// The interface over `ctx`, booting from virtual media (`iscsi_ilo`).
    pub fn new(ctx: Arc<DeployContext>) -> IscsiDeploy {
        let boot = Arc::new(VirtualMediaBoot::new(ctx.clone()));
        IscsiDeploy::with_boot(ctx, boot)
    }

    /// The interface over `ctx`, booting through `boot`.
    pub fn with_boot(ctx: Arc<DeployContext>, boot: Arc<dyn BootInterface>) -> IscsiDeploy {
        IscsiDeploy { ctx, boot }
    }
}

/// The instance image, fetched into the cache (or found there).
async fn cached_image(
    ctx: &DeployContext,
    node: &Node,
) -> anyhow::Result<crate::image_cache::CachedImage> {
    let images = ctx.images.as_ref().context(
        "this conductor has no instance image cache (images.cache_dir), which iscsi_ilo needs",
    )?;
    let image = image::any_instance_image(&node.instance_info)?;
    let url = match &image.source {
        // A file on the conductor is read where it is: no trip through the object store.
        file @ image::ImageRef::File(_) => file.to_string(),
        other => {
            image::resolve(
                ctx.objects.as_ref(),
                &ctx.config.container,
                "instance_info/image_source",
                other,
                ctx.config.deploy_helper_images_ttl,
            )
            .await?
        }
    };
    let source = ImageSource::new(&image.source_text, url, Some(image.digest));
    images
        .get(&source)
        .await
        .with_context(|| format!("fetching the instance image {}", image.source_text))
}

/// Where the instance boots from: a whole-disk image always from its disk; a partition image
/// as `instance_info.capabilities.boot_option` says, netboot when it is silent (the boot ISO
/// on the virtual CD, as the seeds' `iscsi_ilo` did).
pub fn boot_option(info: &InstanceInfo, whole_disk: bool) -> anyhow::Result<BootOption> {
    if whole_disk {
        return Ok(BootOption::Local);
    }
    match info.capabilities.get("boot_option") {
        None => Ok(BootOption::Netboot),
        Some(v) if v.eq_ignore_ascii_case("netboot") => Ok(BootOption::Netboot),
        Some(v) if v.eq_ignore_ascii_case("local") => Ok(BootOption::Local),
        Some(other) => {
            bail!("instance_info.capabilities.boot_option is {other:?}: expected local or netboot")
        }
    }
}

/// The boot mode the ramdisk was booted in (recorded by [`BootInterface::prepare_ramdisk`]).
fn deployed_boot_mode(node: &Node) -> anyhow::Result<BootMode> {
    match node
        .driver_internal_info
        .get(BOOT_MODE_KEY)
        .and_then(|v| v.as_str())
    {
        Some(m) if m.eq_ignore_ascii_case("uefi") => Ok(BootMode::Uefi),
        Some(m) if m.eq_ignore_ascii_case("bios") => Ok(BootMode::Bios),
        other => bail!(
            "driver_internal_info.{} is {other:?}: the deploy did not record the boot mode",
            BOOT_MODE_KEY
        ),
    }
}

/// The boot option recorded at deploy time.
fn recorded_boot_option(node: &Node) -> Option<BootOption> {
    match node.driver_internal_info.get(BOOT_OPTION_KEY)?.as_str()? {
        "netboot" => Some(BootOption::Netboot),
        "local" => Some(BootOption::Local),
        _ => None,
    }
}

/// Where the instance boots from as settled at deploy time (or, for a node deployed before it
/// was recorded, as its fields say).
fn settled_boot_option(node: &Node) -> anyhow::Result<BootOption> {
    if let Some(option) = recorded_boot_option(node) {
        return Ok(option);
    }
    let instance = InstanceInfo::of(node).context("instance_info")?;
    boot_option(
        &instance,
        instance.is_whole_disk(&node.driver_internal_info),
    )
}

/// Where the instance will boot from, refusing what the iSCSI deploy cannot do: a partition
/// image booting locally (see the module's limitations); records it for the call-back.
fn plan_boot_option(node: &mut Node) -> anyhow::Result<BootOption> {
    let info = InstanceInfo::of(node).context("instance_info")?;
    let whole_disk = info.is_whole_disk(&node.driver_internal_info);
    let option = checked_boot_option(node, &info, whole_disk)?;
    node.driver_internal_info.remove(ROOT_UUID_KEY);
    node.driver_internal_info.insert(
        BOOT_OPTION_KEY.into(),
        json!(match option {
            BootOption::Local => "local",
            BootOption::Netboot => "netboot",
        }),
    );
    Ok(option)
}

/// [`boot_option`], refusing a partition image with local boot.
fn checked_boot_option(
    node: &Node,
    info: &InstanceInfo,
    whole_disk: bool,
) -> anyhow::Result<BootOption> {
    let option = boot_option(info, whole_disk)?;
    if !whole_disk && option == BootOption::Local {
        bail!(
            "node {}: a partition image with boot_option=local needs a boot loader installed \
             inside the written file system (Ironic's install_bootloader), which this \
             conductor does not do: deploy it with boot_option=netboot (the default), or \
             deploy a whole-disk image",
            node.uuid
        );
    }
    Ok(option)
}

#[async_trait::async_trait]
impl DeployInterface for IscsiDeploy {
    async fn validate(&self, node: &Node) -> anyhow::Result<()> {
        let info = InstanceInfo::of(node).context("instance_info")?;
        let whole_disk = info.is_whole_disk(&node.driver_internal_info);
        let option = checked_boot_option(node, &info, whole_disk)?;
        if option == BootOption::Netboot {
            self.boot.validate_instance(node).await?;
        }
        super::validate_boot(&self.ctx, self.boot.as_ref(), node).await
    }

    async fn deploy(&self, node: &mut Node) -> anyhow::Result<DeployStep> {
        self.validate(node).await.context("validating the node")?;
        let option = plan_boot_option(node)?;
        let bmc = Bmc::connect(node, &self.ctx.config.ilo_defaults).await?;
        self.boot
            .prepare_ramdisk(
                &bmc,
                node,
                Ramdisk::Iscsi {
                    boot_option: option,
                    chap: self
                        .ctx
                        .config
                        .iscsi_chap
                        .as_ref()
                        .map(|c| (c.user.as_str(), &c.secret)),
                },
            )
            .await
            .context("booting the deploy ramdisk")?;
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
        // The ramdisk has read its parameters and booted: its boot media or files go.
        self.boot.clean_up_ramdisk(Some(&bmc), node).await;
        let option = settled_boot_option(node)?;
        let planned = plan_write(&self.ctx, node).await?;
        // The instance's boot is ready before the first byte goes to the disk: a kernel that
        // cannot boot, or a boot ISO that cannot be built or stored, fails the deploy with the
        // disk as it was. The deploy's clean-up undoes it when a later step fails.
        let expected_root = if option == BootOption::Netboot {
            let root_uuid = planned.root_fs_uuid().await?.context(
                "netboot needs a partition image: a whole-disk image boots from its disk",
            )?;
            self.boot
                .prepare_instance(node, &root_uuid)
                .await
                .context("preparing the instance's boot (nothing written yet)")?;
            Some(root_uuid)
        } else {
            None
        };
        let written = write_planned(&self.ctx, node, info, planned).await?;
        match option {
            BootOption::Local => bmc.boot_from_disk().await?,
            BootOption::Netboot => {
                if expected_root.as_deref() != Some(written.root_uuid_or_disk_id.as_str()) {
                    bail!(
                        "the root file system read back has UUID {}, not {:?} as the image \
                         said: the instance's boot would not find it",
                        written.root_uuid_or_disk_id,
                        expected_root
                    );
                }
                self.boot.boot_instance(&bmc, node).await?
            }
        }
        bmc.power_off().await?;
        bmc.power_on().await?;
        tracing::info!(node = %node.uuid, boot_option = ?option, "deployed: the instance is booting");
        Ok(DeployStep::Done)
    }

    async fn prepare_instance_boot(&self, node: &mut Node) -> anyhow::Result<()> {
        if recorded_boot_option(node) != Some(BootOption::Netboot) {
            return Ok(());
        }
        let bmc = Bmc::connect(node, &self.ctx.config.ilo_defaults).await?;
        self.boot.reboot_instance(&bmc, node).await
    }

    // Cleaning boots the agent: the deploy ISO's agent serves the `clean` extension.
    fn cleaning(&self) -> Option<Cleaning<'_>> {
        self.boot.boots_agent().then(|| Cleaning {
            ctx: &self.ctx,
            boot: self.boot.as_ref(),
        })
    }

    async fn tear_down(&self, node: &mut Node) -> anyhow::Result<()> {
        let bmc = Bmc::connect(node, &self.ctx.config.ilo_defaults).await?;
        bmc.power_off().await?;
        crate::boot::secure_boot::restore(&bmc, node).await?;
        self.boot.clean_up_ramdisk(Some(&bmc), node).await;
        self.boot.clean_up_instance(node).await;
        node.driver_internal_info.remove(ROOT_UUID_KEY);
        node.driver_internal_info.remove(BOOT_OPTION_KEY);
        Ok(())
    }

    async fn clean_up(&self, node: &mut Node) {
        let bmc = Bmc::connect_for_cleanup(node, &self.ctx.config.ilo_defaults).await;
        self.boot.clean_up_ramdisk(bmc.as_ref(), node).await;
        self.boot.clean_up_instance(node).await;
    }
}
