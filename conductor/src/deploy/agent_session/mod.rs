//! What the agent deploy and cleaning share: the agent's session with the conductor.
//!
//! A ramdisk that heartbeats is pinned at its first heartbeat (its `callback_url` and
//! certificate), reached through its command API with the token of this boot, and forgotten
//! when the flow ends. The agent deploy ([`super::agent`]) and cleaning ([`super::clean`]) both
//! drive the agent this way, so neither imports the other.

use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};
use time::OffsetDateTime;
use vmdeploy_shared::api::ipa::{CommandResult, CommandStatus, ValidHeartbeat};
use vmdeploy_shared::secret::Secret;

use crate::bmc::{Bmc, PowerState};
use crate::boot::{wipe_token, AGENT_TOKEN_KEY};
use crate::context::DeployContext;
use crate::store::{JsonObject, Node};
use client::{AgentClient, AgentEndpoint};

pub mod client;

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
/// How long the host may take to go down after `standby.power_off` before the iLO powers it
/// off (Ironic: 6 polls × 5 s).
pub const DEFAULT_AGENT_POWER_OFF_WAIT: Duration = Duration::from_secs(30);

/// A client of `node`'s agent from what its heartbeats recorded (`agent_url`, the pinned
/// certificate) and the token of this boot.
pub(crate) fn agent_client(ctx: &DeployContext, node: &Node) -> anyhow::Result<AgentClient> {
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
pub(crate) async fn power_off_through_agent(
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
pub(crate) fn text<'a>(info: &'a JsonObject, key: &str) -> Option<&'a str> {
    info.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Records the agent's URL and certificate at the first heartbeat; refuses a later heartbeat
/// that changes either (Ironic refuses a changed `callback_url`; a changed certificate would
/// undo the pinning).
pub(crate) fn record_heartbeat(info: &mut JsonObject, hb: &ValidHeartbeat) -> anyhow::Result<()> {
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

/// The agent's own error text of a failed command, with what the conductor asked for. Temp
/// URL signatures the agent may quote (a failed download names its URL) are masked: the text
/// goes to `last_error` and the logs.
pub(crate) fn agent_failure(what: &str, result: &CommandResult) -> String {
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
pub(crate) fn clear_agent_fields(info: &mut JsonObject) {
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
