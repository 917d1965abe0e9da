//! The deploy interfaces (docs/architecture.md §1, §2, §3): how the image gets onto the
//! disk once a boot interface (`crate::boot`) has booted the ramdisk.
//!
//! - [`agent`]: the agent ramdisk heartbeats and streams the image itself;
//! - [`iscsi`]: the iSCSI ramdisk exposes the disk and the conductor writes it;
//! - [`clean`]: automated cleaning, on top of either: it boots the agent through the deploy's
//!   boot interface and runs the agent's clean steps;
//! - [`agent_session`]: what the agent deploy and cleaning share with a running agent: its
//!   heartbeats, its pinned URL and certificate, its command client.
//!
//! A driver is a composition ([`for_node`]): `agent_ilo` and `redfish` = virtual-media boot +
//! agent deploy, `iscsi_ilo` = virtual-media boot + iSCSI deploy, `pxe_ilo` = network boot +
//! iSCSI deploy. No deploy interface imports another; cleaning is reached through
//! [`DeployInterface::cleaning`].
//!
//! # Design
//! A flow works on a node the manager has reserved: it talks to the BMC, the object store and
//! the agent, and writes its progress into `driver_internal_info`. It never changes
//! `provision_state` itself: it returns, and the manager moves the node with
//! [`crate::states::next`] and records `last_error`.

use std::sync::Arc;

use anyhow::Context as _;

use crate::bmc::Bmc;
use crate::boot::pxe::PxeBoot;
use crate::boot::vmedia::VirtualMediaBoot;
use crate::boot::BootInterface;
use crate::context::image;
use crate::node::hardware_type::{BootMethod, DeployMethod, NodeInterfaces};
use crate::store::Node;
use vmdeploy_shared::api::ipa::ValidHeartbeat;

pub use crate::context::{DeployConfig, DeployContext, IscsiChap, DONE_PORT, ISCSI_PORT};

pub mod agent;
pub mod agent_session;
pub mod clean;
pub mod iscsi;

/// Where a flow stands after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeployStep {
    /// Waiting for the ramdisk (the manager moves the node to `wait call-back`, unreserved).
    Wait,
    /// Deployed (the manager moves the node to `active`).
    Done,
}

/// What automated cleaning runs on: the deploy's context and the boot interface that boots the
/// agent ramdisk.
pub struct Cleaning<'a> {
    /// The deploy's context.
    pub ctx: &'a DeployContext,
    /// Boots the agent for cleaning.
    pub boot: &'a dyn BootInterface,
}

/// One deploy interface (`agent`, `iscsi`). Errors are in operator words with
/// context (`anyhow`); the manager writes them to `last_error` and then calls
/// [`DeployInterface::clean_up`].
#[async_trait::async_trait]
pub trait DeployInterface: Send + Sync {
    /// Everything needed to deploy is there and works (credentials, licence, image fields).
    async fn validate(&self, node: &Node) -> anyhow::Result<()>;
    /// Starts a deploy of a reserved node: boots the ramdisk and returns [`DeployStep::Wait`].
    async fn deploy(&self, node: &mut Node) -> anyhow::Result<DeployStep>;
    /// A heartbeat of the node's agent while it is in `wait call-back`. The iSCSI flows'
    /// ramdisk calls back with `pass_deploy_info` instead: for them a heartbeat changes nothing.
    async fn heartbeat(
        &self,
        node: &mut Node,
        heartbeat: &ValidHeartbeat,
    ) -> anyhow::Result<DeployStep> {
        let _ = heartbeat;
        tracing::debug!(node = %node.uuid, driver = %node.driver, "heartbeat ignored: this ramdisk reports through pass_deploy_info");
        Ok(DeployStep::Wait)
    }
    /// Whether this flow's ramdisk calls back with `pass_deploy_info` (the iSCSI ramdisk)
    /// rather than heartbeats (the agent).
    fn takes_pass_deploy_info(&self) -> bool {
        false
    }
    /// The iSCSI ramdisk's `pass_deploy_info` while the node is in `wait call-back`: the
    /// manager has checked and burnt the deploy key, and reserved the node. A flow that takes
    /// it writes the image and returns [`DeployStep::Done`].
    async fn pass_deploy_info(
        &self,
        node: &mut Node,
        info: &vmdeploy_shared::api::ValidPassDeployInfo,
    ) -> anyhow::Result<DeployStep> {
        let _ = info;
        anyhow::bail!(
            "driver {} takes no pass_deploy_info: its ramdisk reports through heartbeats",
            node.driver
        )
    }
    /// Before the API powers on or reboots an `active` node: whatever the instance needs to
    /// boot (a netboot instance's boot ISO attached again: its temp URL has expired).
    async fn prepare_instance_boot(&self, node: &mut Node) -> anyhow::Result<()> {
        let _ = node;
        Ok(())
    }
    /// What automated cleaning runs on; `None` when this deploy's boot cannot boot the agent.
    fn cleaning(&self) -> Option<Cleaning<'_>> {
        None
    }
    /// Automated cleaning starts (`cleaning`, after undeploy or `provide`): boots the agent
    /// ramdisk with a fresh token; the manager then waits in `clean wait`.
    async fn prepare_cleaning(&self, node: &mut Node) -> anyhow::Result<()> {
        match self.cleaning() {
            Some(cleaning) => clean::prepare(cleaning.ctx, cleaning.boot, node).await,
            None => bail_no_cleaning(node),
        }
    }
    /// The agent's heartbeat in `clean wait`: runs the clean steps, then powers the node off
    /// and ejects the media. `Ok` means the node is clean.
    async fn clean_heartbeat(
        &self,
        node: &mut Node,
        heartbeat: &ValidHeartbeat,
    ) -> anyhow::Result<()> {
        match self.cleaning() {
            Some(cleaning) => {
                clean::heartbeat(
                    cleaning.ctx,
                    cleaning.boot,
                    node,
                    heartbeat,
                    &Default::default(),
                )
                .await
            }
            None => bail_no_cleaning(node),
        }
    }
    /// Undeploy: power off, eject, forget the instance's boot settings.
    async fn tear_down(&self, node: &mut Node) -> anyhow::Result<()>;
    /// After a failure or an abort: eject media, delete temporary objects, wipe the token.
    /// Never fails: what cannot be cleaned is logged.
    async fn clean_up(&self, node: &mut Node);
}

/// What a flow without automated cleaning answers.
fn bail_no_cleaning(node: &Node) -> anyhow::Result<()> {
    anyhow::bail!(
        "driver {} cannot clean through the agent; turn deploy.automated_clean off for it",
        node.driver
    )
}

/// The checks every deploy makes, after its own: the instance image's fields, the boot
/// interface's, the boot mode asked for, the BMC credentials and what the boot interface needs
/// of the BMC, and that the instance image can be reached.
async fn validate_boot(
    ctx: &DeployContext,
    boot: &dyn BootInterface,
    node: &Node,
) -> anyhow::Result<()> {
    let image = image::any_instance_image(&node.instance_info)?;
    boot.validate(node).await?;
    crate::node::capabilities::deploy_boot_mode(node)?;
    let secure_boot = crate::node::capabilities::secure_boot_wanted(node)?;
    let bmc = Bmc::connect_read_only(node, &ctx.config.ilo_defaults).await?;
    bmc.power_state()
        .await
        .context("checking the BMC credentials")?;
    if secure_boot {
        bmc.secure_boot_enabled()
            .await
            .context("the node asks for UEFI Secure Boot (capabilities secure_boot:true)")?;
    }
    boot.validate_bmc(&bmc, node).await?;
    image::check(
        ctx.objects.as_ref(),
        "instance_info/image_source",
        &image.source,
    )
    .await
}

/// The node's driver as a composition of its boot and deploy interfaces
/// (`crate::node::hardware_type`), or `None` when its driver is not served here or no deploy
/// interface runs over that boot.
pub fn for_node(node: &Node, context: Arc<DeployContext>) -> Option<Arc<dyn DeployInterface>> {
    let interfaces = NodeInterfaces::of(node).ok()?;
    let boot: Arc<dyn BootInterface> = match interfaces.boot_method() {
        BootMethod::VirtualMedia => Arc::new(VirtualMediaBoot::new(context.clone())),
        BootMethod::Network => Arc::new(PxeBoot::new(context.clone())),
    };
    let deploy: Arc<dyn DeployInterface> = match interfaces.deploy_method() {
        // The agent boots from virtual media only: no network-booted agent is served.
        DeployMethod::Agent if !boot.boots_agent() => return None,
        DeployMethod::Agent => Arc::new(agent::AgentDeploy::with_boot(context, boot)),
        DeployMethod::Iscsi => Arc::new(iscsi::IscsiDeploy::with_boot(context, boot)),
    };
    Some(deploy)
}
