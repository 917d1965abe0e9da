//! The `agent_ilo` deploy (docs/ironic-protocols.md §3.2–3.5, docs/architecture.md §1):
//! the ramdisk boots from virtual media, heartbeats, and streams the image to disk itself.
//!
//! # Design
//! [`AgentDeploy`] keeps its progress in `driver_internal_info`, so each heartbeat can be
//! handled by whichever task holds the node:
//! - `deploy`: validate, then the ramdisk booted by the boot interface (virtual media:
//!   [`BootInterface::prepare_ramdisk`]) → wait;
//! - a heartbeat records the agent's `callback_url` and pins its certificate
//!   (`agent_url`, `agent_verify_ca`); a changed URL or certificate is refused;
//! - the first heartbeat sends `standby.prepare_image` (not waiting) and marks it sent
//!   (`agent_deploy_step`);
//! - later heartbeats copy the write progress into `deploy_progress` and look at the agent's
//!   last `prepare_image`: running → wait, failed → the agent's own error text, succeeded →
//!   partition UUIDs, persistent boot from disk, media ejected, power off through the agent
//!   (then through the iLO if the host is still on), power on → done.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};
use vmdeploy_shared::api::ipa::{CommandStatus, ValidHeartbeat, WriteProgress};

use super::agent_session::client::AgentClient;
use super::agent_session::{
    agent_client, agent_failure, clear_agent_fields, power_off_through_agent, record_heartbeat,
    text, STEP_KEY,
};
use super::{Cleaning, DeployContext, DeployInterface, DeployStep};
use crate::bmc::Bmc;
use crate::boot::vmedia::VirtualMediaBoot;
use crate::boot::{BootInterface, Ramdisk, AGENT_TOKEN_KEY};
use crate::context::image;
use crate::store::Node;

/// `driver_internal_info`: `{"written", "total", "rate"}` of the image write.
pub const PROGRESS_KEY: &str = "deploy_progress";
/// `driver_internal_info`: what `standby.get_partition_uuids` reported.
pub const PARTITION_UUIDS_KEY: &str = "partition_uuids";

/// How long the temp URL of the instance image lives: the agent starts its download at once,
/// but resumes by range after a dropped connection, each resume checked against the expiry.
const IMAGE_URL_TTL: Duration = Duration::from_secs(3600);
/// The `agent` deploy interface (`agent_ilo` and its hardware-type aliases).
pub struct AgentDeploy {
    ctx: Arc<DeployContext>,
    boot: Arc<dyn BootInterface>,
    agent_power_off_wait: Duration,
}

impl AgentDeploy {
    /// Undoes the ramdisk's boot (media out, floppy deleted), keeping the token: the agent
    /// still needs it for `standby.power_off`.
    async fn eject_and_delete(&self, bmc: &Bmc, node: &mut Node) {
        let token = node.driver_internal_info.get(AGENT_TOKEN_KEY).cloned();
        self.boot.clean_up_ramdisk(Some(bmc), node).await;
        if let Some(token) = token {
            node.driver_internal_info
                .insert(AGENT_TOKEN_KEY.into(), token);
        }
    }

    /// The interface over `ctx`, booting from virtual media.
    pub fn new(ctx: Arc<DeployContext>) -> AgentDeploy {
        let boot = Arc::new(VirtualMediaBoot::new(ctx.clone()));
        AgentDeploy::with_boot(ctx, boot)
    }

    /// The interface over `ctx`, booting the agent through `boot`.
    pub fn with_boot(ctx: Arc<DeployContext>, boot: Arc<dyn BootInterface>) -> AgentDeploy {
        AgentDeploy {
            agent_power_off_wait: ctx.config.agent_power_off_wait,
            ctx,
            boot,
        }
    }

    /// Changes how long the host may take to power itself off after `standby.power_off`.
    pub fn with_agent_power_off_wait(mut self, wait: Duration) -> AgentDeploy {
        self.agent_power_off_wait = wait;
        self
    }

    /// A client of the node's agent, pinned to the certificate of its first heartbeat.
    fn client(&self, node: &Node) -> anyhow::Result<AgentClient> {
        agent_client(&self.ctx, node)
    }

    /// Sends `standby.prepare_image` with the node's image.
    async fn start_image_write(&self, node: &mut Node, client: &AgentClient) -> anyhow::Result<()> {
        let image = image::instance_image(&node.instance_info)?;
        let url = image::resolve(
            self.ctx.objects.as_ref(),
            &self.ctx.config.container,
            "instance_info/image_source",
            &image.source,
            IMAGE_URL_TTL,
        )
        .await?;
        let info = image::image_info(node.uuid, &image, &url);
        let result = client
            .execute(
                "standby.prepare_image",
                json!({ "image_info": info }),
                false,
            )
            .await
            .context("asking the agent to write the image (standby.prepare_image)")?;
        if result.command_status == CommandStatus::Failed {
            bail!(agent_failure("writing the image", &result));
        }
        node.driver_internal_info
            .insert(STEP_KEY.into(), json!("prepare_image"));
        tracing::info!(node = %node.uuid, image = %vmdeploy_shared::redact::Url(&image.source_text), "agent writing the image");
        Ok(())
    }

    /// After a successful write: partition UUIDs, boot from disk, media out, power cycle.
    async fn finish(&self, node: &mut Node, client: &AgentClient) -> anyhow::Result<()> {
        let uuids = client
            .execute("standby.get_partition_uuids", json!({}), true)
            .await
            .context("asking the agent for the partition UUIDs")?;
        match uuids.command_status {
            CommandStatus::Succeeded => {
                node.driver_internal_info.insert(
                    PARTITION_UUIDS_KEY.into(),
                    uuids.command_result.clone().unwrap_or(Value::Null),
                );
            }
            _ => bail!(agent_failure("reading the partition UUIDs", &uuids)),
        }
        let bmc = Bmc::connect(node, &self.ctx.config.ilo_defaults).await?;
        bmc.boot_from_disk().await?;
        // Media out before the power cycle, so the next boot cannot come from the ramdisk.
        self.eject_and_delete(&bmc, node).await;
        power_off_through_agent(&bmc, client, node, self.agent_power_off_wait).await?;
        bmc.power_on().await?;
        clear_agent_fields(&mut node.driver_internal_info);
        tracing::info!(node = %node.uuid, "deployed: booting from disk");
        Ok(())
    }
}

#[async_trait::async_trait]
impl DeployInterface for AgentDeploy {
    async fn validate(&self, node: &Node) -> anyhow::Result<()> {
        // Whole-disk images only: the agent driver writes no partition images.
        image::instance_image(&node.instance_info)?;
        super::validate_boot(&self.ctx, self.boot.as_ref(), node).await
    }

    async fn deploy(&self, node: &mut Node) -> anyhow::Result<DeployStep> {
        // Validation first: an unlicensed or unreachable iLO is refused before the node is
        // powered off.
        self.validate(node).await.context("validating the node")?;
        let info = &mut node.driver_internal_info;
        clear_agent_fields(info);
        info.remove(PROGRESS_KEY);
        info.remove(PARTITION_UUIDS_KEY);
        let bmc = Bmc::connect(node, &self.ctx.config.ilo_defaults).await?;
        self.boot
            .prepare_ramdisk(&bmc, node, Ramdisk::Agent)
            .await
            .context("booting the deploy ramdisk from virtual media")?;
        Ok(DeployStep::Wait)
    }

    async fn heartbeat(
        &self,
        node: &mut Node,
        heartbeat: &ValidHeartbeat,
    ) -> anyhow::Result<DeployStep> {
        record_heartbeat(&mut node.driver_internal_info, heartbeat)?;
        if let Some(message) = &heartbeat.agent_status_message {
            record_progress(node, message);
        }
        let client = self.client(node)?;
        if text(&node.driver_internal_info, STEP_KEY).is_none() {
            // The ramdisk runs: POST is over, so the BIOS has applied (or refused) the boot
            // mode set before the boot. An image written in the wrong mode would not boot.
            if let Some(expected) = crate::boot::recorded_boot_mode(node) {
                let bmc = Bmc::connect(node, &self.ctx.config.ilo_defaults).await?;
                bmc.confirm_boot_mode(expected).await?;
            }
            self.start_image_write(node, &client).await?;
            self.ctx
                .store
                .update_node(node)
                .await
                .context("saving the deploy step")?;
            return Ok(DeployStep::Wait);
        }
        let commands = client
            .commands()
            .await
            .context("reading the agent's commands")?;
        let Some(last) = commands
            .iter()
            .rev()
            .find(|c| c.command_name == "prepare_image")
        else {
            bail!("the agent has no record of writing the image: the deploy ramdisk restarted (the node was reset or rebooted?) and the image write is lost. Deploy the node again");
        };
        match last.command_status {
            CommandStatus::Running => Ok(DeployStep::Wait),
            CommandStatus::Succeeded => {
                self.finish(node, &client).await?;
                Ok(DeployStep::Done)
            }
            CommandStatus::Failed | CommandStatus::CleanVersionMismatch => {
                bail!(agent_failure("writing the image", last))
            }
        }
    }

    fn cleaning(&self) -> Option<Cleaning<'_>> {
        Some(Cleaning {
            ctx: &self.ctx,
            boot: self.boot.as_ref(),
        })
    }

    async fn tear_down(&self, node: &mut Node) -> anyhow::Result<()> {
        let bmc = Bmc::connect(node, &self.ctx.config.ilo_defaults).await?;
        bmc.power_off().await?;
        crate::boot::secure_boot::restore(&bmc, node).await?;
        self.boot.clean_up_ramdisk(Some(&bmc), node).await;
        clear_agent_fields(&mut node.driver_internal_info);
        Ok(())
    }

    async fn clean_up(&self, node: &mut Node) {
        let bmc = Bmc::connect_for_cleanup(node, &self.ctx.config.ilo_defaults).await;
        // A failed deploy leaves the node off (docs/architecture.md §8): the ramdisk must not go on.
        if let Some(bmc) = &bmc {
            if let Err(e) = bmc.power_off().await {
                tracing::warn!(node = %node.uuid, error = %format!("{e:#}"), "clean-up: powering off failed");
            }
        }
        self.boot.clean_up_ramdisk(bmc.as_ref(), node).await;
        clear_agent_fields(&mut node.driver_internal_info);
    }
}

/// Copies the write progress of a heartbeat's `agent_status_message` into `deploy_progress`;
/// other status texts are ignored.
fn record_progress(node: &mut Node, message: &str) {
    match progress_of(message) {
        Some(p) => {
            node.driver_internal_info.insert(PROGRESS_KEY.into(), p);
        }
        None => {
            tracing::debug!(node = %node.uuid, "heartbeat status message carries no write progress");
        }
    }
}

/// `{"written", "total", "rate"}` of an `image write:` status message.
fn progress_of(message: &str) -> Option<Value> {
    let p = WriteProgress::parse(message).ok()?;
    Some(json!({"written": p.written, "total": p.total, "rate": p.rate}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_read_from_the_status_message() {
        let message = WriteProgress {
            written: 1 << 30,
            total: Some(4 << 30),
            rate: 123_456_789,
        }
        .to_message();
        assert_eq!(
            progress_of(&message),
            Some(json!({"written": 1u64 << 30, "total": 4u64 << 30, "rate": 123_456_789}))
        );
        assert_eq!(
            progress_of("image write: written=5 total=unknown rate=1"),
            Some(json!({"written": 5, "total": null, "rate": 1}))
        );
        assert_eq!(progress_of("booting"), None);
        assert_eq!(progress_of("image write: written=x total=1 rate=1"), None);
    }
}
