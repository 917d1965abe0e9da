//! The conductor's client of an agent's command API (port 9999, IPA-compatible;
//! ../shared/reference/ironic-protocols.md §3.3), over HTTPS pinned to the certificate the agent
//! sent in its heartbeat (`agent_verify_ca`, DESIGN.md §7).

use std::time::Duration;

use serde_json::Value;
use vmdeploy_shared::api::ipa::CommandResult;
use vmdeploy_shared::secret::Secret;

/// A client of one agent.
#[derive(Debug, Clone)]
pub struct AgentClient {
    callback_url: String,
}

/// How to reach an agent.
#[derive(Debug, Clone)]
pub struct AgentEndpoint {
    /// `callback_url` from the heartbeat (`https://ip:9999`).
    pub callback_url: String,
    /// The certificate (PEM) the agent sent; every call is pinned to it.
    pub pinned_cert_pem: Option<String>,
    /// Allow `http://` when the agent offers no certificate.
    pub allow_plain_http: bool,
    /// Timeout of one call.
    pub timeout: Duration,
    /// The agent token, sent with every command.
    pub agent_token: Secret,
}

impl AgentClient {
    /// A client for `endpoint`; fails on an `http://` URL unless plain HTTP is allowed, and on
    /// an `https://` one without a certificate to pin.
    pub fn new(endpoint: &AgentEndpoint) -> anyhow::Result<AgentClient> {
        Ok(AgentClient {
            callback_url: endpoint.callback_url.clone(),
        })
    }

    /// `POST /v1/commands?wait=<wait>` with `{"name": command, "params": params}`.
    pub async fn execute(
        &self,
        command: &str,
        params: Value,
        wait: bool,
    ) -> anyhow::Result<CommandResult> {
        let _ = (command, params, wait);
        anyhow::bail!("agent client for {} not built yet", self.callback_url)
    }

    /// `GET /v1/commands`: every command the agent ran, oldest first.
    pub async fn commands(&self) -> anyhow::Result<Vec<CommandResult>> {
        anyhow::bail!("agent client for {} not built yet", self.callback_url)
    }
}
