//! JSON bodies of the IPA-compatible agent protocol (../shared/reference/ironic-protocols.md
//! §3.2–3.4). Kept here until they move to `vmdeploy_shared::api`, where the conductor can use
//! the same types.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `GET /v1/lookup` answer (modern form; `config` absent from old conductors).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct LookupResponse {
    /// The node the agent runs on.
    pub node: LookupNode,
    /// Agent configuration.
    #[serde(default)]
    pub config: Option<LookupConfig>,
    /// Old conductors put the heartbeat timeout at the top level.
    #[serde(default)]
    pub heartbeat_timeout: Option<u64>,
}

/// The node part of a lookup answer.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct LookupNode {
    /// Node UUID.
    pub uuid: String,
    /// Everything else the conductor sent.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

/// The config part of a lookup answer.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
pub struct LookupConfig {
    /// Seconds the conductor waits between heartbeats before it gives up.
    #[serde(default)]
    pub heartbeat_timeout: Option<u64>,
    /// The agent token, or `******` when it was already disclosed / pre-generated.
    #[serde(default)]
    pub agent_token: Option<String>,
    /// Whether every call must carry the token.
    #[serde(default)]
    pub agent_token_required: Option<bool>,
}

impl std::fmt::Debug for LookupConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LookupConfig")
            .field("heartbeat_timeout", &self.heartbeat_timeout)
            .field("agent_token", &self.agent_token.as_ref().map(|_| "******"))
            .field("agent_token_required", &self.agent_token_required)
            .finish()
    }
}

/// `POST /v1/heartbeat/{node}` body.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
pub struct Heartbeat {
    /// Where the conductor reaches the agent's command API.
    pub callback_url: String,
    /// The agent token.
    pub agent_token: String,
    /// Agent version (required by modern conductors).
    pub agent_version: String,
    /// Status word (`start`, `end`, ...), when any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_status: Option<String>,
    /// Status message, e.g. image write progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_status_message: Option<String>,
}

impl std::fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heartbeat")
            .field("callback_url", &self.callback_url)
            .field("agent_token", &"******")
            .field("agent_version", &self.agent_version)
            .field("agent_status", &self.agent_status)
            .field("agent_status_message", &self.agent_status_message)
            .finish()
    }
}

/// `POST /v1/commands` body.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct CommandRequest {
    /// `<extension>.<command>`.
    pub name: String,
    /// Command parameters.
    #[serde(default)]
    pub params: Value,
}

/// Status of a command.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CommandStatus {
    /// Still running.
    Running,
    /// Finished successfully.
    Succeeded,
    /// Finished with an error.
    Failed,
}

/// The error of a failed command.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct CommandError {
    /// Error class name.
    #[serde(rename = "type")]
    pub kind: String,
    /// HTTP-like code.
    pub code: u16,
    /// Human-readable message.
    pub message: String,
    /// More detail.
    pub details: String,
}

/// IPA's CommandResult.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct CommandResult {
    /// UUID of this command run.
    pub id: String,
    /// The command part of the name (`prepare_image`).
    pub command_name: String,
    /// Parameters it was called with.
    pub command_params: Value,
    /// Status.
    pub command_status: CommandStatus,
    /// Error when failed.
    pub command_error: Option<CommandError>,
    /// Result when succeeded.
    pub command_result: Option<Value>,
}

/// `GET /v1/commands` answer.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct CommandList {
    /// Oldest first.
    pub commands: Vec<CommandResult>,
}

/// WSME-style error body.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Fault {
    /// `Client` or `Server`.
    pub faultcode: String,
    /// Message.
    pub faultstring: String,
}
