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
use time::OffsetDateTime;
use vmdeploy_shared::api::ipa::{CommandResult, CommandStatus, ValidHeartbeat, WriteProgress};
use vmdeploy_shared::secret::Secret;

use super::agent_session::client::{AgentClient, AgentEndpoint};
use super::{Cleaning, DeployContext, DeployInterface, DeployStep};
use crate::bmc::{Bmc, PowerState};
use crate::boot::vmedia::VirtualMediaBoot;
use crate::boot::{wipe_token, BootInterface, Ramdisk, AGENT_TOKEN_KEY};
use crate::context::image;
use crate::store::{JsonObject, Node};

/// `driver_internal_info`: where the agent's command API listens.
pub const AGENT_URL_KEY: &str = "agent_url";
/// `driver_internal_info`: the agent's certificate (PEM), pinned at the first heartbeat.
pub const AGENT_CA_KEY: &str = "agent_verify_ca";
/// `driver_internal_info`: the agent's version from its heartbeat.
pub const AGENT_VERSION_KEY: &str = "agent_version";
/// `driver_internal_info`: Unix time of the last heartbeat.
pub const LAST_HEARTBEAT_KEY: &str = "agent_last_heartbeat";
/// `driver_internal_info`: the deploy step sent to the agent (`prepare_image`).
pub const STEP_KEY: &str = "agent_deploy_step";
/// `driver_internal_info`: `{"written", "total", "rate"}` of the image write.
pub const PROGRESS_KEY: &str = "deploy_progress";
/// `driver_internal_info`: what `standby.get_partition_uuids` reported.
pub const PARTITION_UUIDS_KEY: &str = "partition_uuids";

/// How long the temp URL of the instance image lives: the agent starts its download at once,
/// but resumes by range after a dropped connection, each resume checked against the expiry.
const IMAGE_URL_TTL: Duration = Duration::from_secs(3600);
/// How long the host may take to go down after `standby.power_off` before the iLO powers it
/// off (Ironic: 6 polls × 5 s).
pub const DEFAULT_AGENT_POWER_OFF_WAIT: Duration = Duration::from_secs(30);

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

/// A client of `node`'s agent from what its heartbeats recorded (`agent_url`, the pinned
/// certificate) and the token of this boot.
pub(super) fn agent_client(ctx: &DeployContext, node: &Node) -> anyhow::Result<AgentClient> {
    let info = &node.driver_internal_info;
    let callback_url = text(info, AGENT_URL_KEY)
        .context("no agent_url recorded: the agent has not heartbeated")?;
    let token = text(info, AGENT_TOKEN_KEY).context(
        "no agent token recorded for this boot of the ramdisk (it was wiped or never made)",
    )?;
    AgentClient::new(&AgentEndpoint {
        callback_url: callback_url.to_owned(),
        pinned_cert_pem: text(info, AGENT_CA_KEY).map(str::to_owned),
        allow_plain_http: ctx.config.agent_allow_plain_http,
        timeout: ctx.config.agent_call_timeout,
        agent_token: Secret::new(token),
    })
    .with_context(|| format!("setting up the client of the agent at {callback_url}"))
}

/// Powers the node off the way a finished ramdisk goes down: the agent's `standby.power_off`
/// (it syncs first), then the iLO if the host is still on after `wait`.
pub(super) async fn power_off_through_agent(
    bmc: &Bmc,
    client: &AgentClient,
    node: &Node,
    wait: Duration,
) -> anyhow::Result<()> {
    match client.execute("standby.power_off", json!({}), true).await {
        Ok(r) if r.command_status == CommandStatus::Failed => {
            tracing::warn!(node = %node.uuid, error = %agent_failure("powering off", &r), "the agent did not power off; the iLO will");
        }
        Ok(_) => {}
        // The agent may go down before its answer leaves: the iLO tells what happened.
        Err(e) => {
            tracing::warn!(node = %node.uuid, error = %format!("{e:#}"), "standby.power_off got no answer");
        }
    }
    if !bmc.wait_for(PowerState::Off, wait).await? {
        tracing::info!(node = %node.uuid, "host still on after the agent's power-off: powering off through the iLO");
        bmc.power_off().await?;
    }
    Ok(())
}

/// A string field of a JSON object.
pub(super) fn text<'a>(info: &'a JsonObject, key: &str) -> Option<&'a str> {
    info.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Records the agent's URL and certificate at the first heartbeat; refuses a later heartbeat
/// that changes either (Ironic refuses a changed `callback_url`; a changed certificate would
/// undo the pinning).
pub(super) fn record_heartbeat(info: &mut JsonObject, hb: &ValidHeartbeat) -> anyhow::Result<()> {
    let url = hb.callback_url.trim().trim_end_matches('/');
    let parsed = url::Url::parse(url)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some());
    if parsed.is_none() {
        bail!("heartbeat callback_url {url:?} is not an http(s) URL");
    }
    match text(info, AGENT_URL_KEY) {
        Some(known) if known != url => {
            bail!("heartbeat callback_url changed from {known} to {url}: refused")
        }
        Some(_) => {}
        None => {
            info.insert(AGENT_URL_KEY.into(), json!(url));
        }
    }
    if let Some(pem) = hb
        .agent_verify_ca
        .as_deref()
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        match text(info, AGENT_CA_KEY) {
            Some(known) if known.trim() != pem => {
                // Only a ramdisk holding this deploy's token gets here, so a new certificate
                // means the node started its ramdisk again (reset, power cycle, a crash): the
                // write the first agent did is lost. The new agent is not trusted (the pin
                // stays), and waiting for the callback timeout would gain nothing.
                bail!(
                    "the deploy ramdisk restarted (a new agent certificate, agent_verify_ca, since \
                     its first heartbeat): the node was reset or rebooted during the deploy and \
                     the image write is lost; the new agent is refused. Deploy the node again"
                )
            }
            Some(_) => {}
            None => {
                info.insert(AGENT_CA_KEY.into(), json!(pem));
            }
        }
    }
    if let Some(version) = &hb.agent_version {
        info.insert(AGENT_VERSION_KEY.into(), json!(version));
    }
    info.insert(
        LAST_HEARTBEAT_KEY.into(),
        json!(OffsetDateTime::now_utc().unix_timestamp()),
    );
    Ok(())
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

/// The agent's own error text of a failed command, with what the conductor asked for. Temp
/// URL signatures the agent may quote (a failed download names its URL) are masked: the text
/// goes to `last_error` and the logs.
pub(super) fn agent_failure(what: &str, result: &CommandResult) -> String {
    let text = match &result.command_error {
        Some(e) if e.details.is_empty() => {
            format!("{what} failed on the node: {} ({})", e.message, e.kind)
        }
        Some(e) => format!(
            "{what} failed on the node: {} ({}; {})",
            e.message, e.kind, e.details
        ),
        None => format!(
            "{what} failed on the node: the agent reported {:?} without an error",
            result.command_status
        ),
    };
    vmdeploy_shared::redact::signatures(&text).into_owned()
}

/// Forgets the agent: its URL, certificate, token and the deploy step.
pub(super) fn clear_agent_fields(info: &mut JsonObject) {
    wipe_token(info);
    for key in [
        AGENT_URL_KEY,
        AGENT_CA_KEY,
        STEP_KEY,
        AGENT_VERSION_KEY,
        LAST_HEARTBEAT_KEY,
    ] {
        info.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdeploy_shared::api::ipa::{CommandError, IpaErrorKind};

    fn hb(url: &str, ca: Option<&str>) -> ValidHeartbeat {
        ValidHeartbeat {
            callback_url: url.into(),
            agent_token: None,
            agent_version: Some("1.0".into()),
            agent_verify_ca: ca.map(str::to_owned),
            agent_status: None,
            agent_status_message: None,
        }
    }

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

    #[test]
    fn callback_url_and_certificate_are_pinned_at_the_first_heartbeat() {
        let mut info = JsonObject::new();
        record_heartbeat(&mut info, &hb("https://10.0.0.5:9999/", Some("PEM-A"))).expect("first");
        assert_eq!(info[AGENT_URL_KEY], json!("https://10.0.0.5:9999"));
        assert_eq!(info[AGENT_CA_KEY], json!("PEM-A"));
        record_heartbeat(&mut info, &hb("https://10.0.0.5:9999", Some("PEM-A"))).expect("same");
        record_heartbeat(&mut info, &hb("https://10.0.0.5:9999", None)).expect("no cert again");
        let err = record_heartbeat(&mut info, &hb("https://10.0.0.6:9999", Some("PEM-A")))
            .expect_err("moved");
        assert!(err.to_string().contains("callback_url changed"), "{err}");
        let err = record_heartbeat(&mut info, &hb("https://10.0.0.5:9999", Some("PEM-B")))
            .expect_err("new cert");
        let text = err.to_string();
        assert!(
            text.contains("agent_verify_ca")
                && text.contains("restarted")
                && text.contains("Deploy the node again"),
            "{text}"
        );
        assert!(record_heartbeat(&mut JsonObject::new(), &hb("ftp://x", None)).is_err());
        clear_agent_fields(&mut info);
        assert!(!info.contains_key(AGENT_URL_KEY) && !info.contains_key(AGENT_CA_KEY));
    }

    #[test]
    fn agent_failures_carry_the_agents_text() {
        let result = CommandResult {
            id: "1".into(),
            command_name: "prepare_image".into(),
            command_params: Value::Null,
            command_status: CommandStatus::Failed,
            command_error: Some(CommandError::new(
                IpaErrorKind::ImageChecksum,
                "sha256 mismatch: expected aa, got bb",
            )),
            command_result: None,
        };
        let text = agent_failure("writing the image", &result);
        assert!(
            text.contains("sha256 mismatch: expected aa, got bb"),
            "{text}"
        );
        assert!(text.contains("ImageChecksumError"), "{text}");
    }
}
