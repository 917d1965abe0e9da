//! JSON bodies of the IPA-compatible agent protocol (`agent_ilo`,
//! docs/ironic-protocols.md §3.2–3.4): the agent's lookup and heartbeat calls
//! to the conductor, the conductor's calls to the agent's `/v1/commands`, and the progress text
//! vmdeploy puts in heartbeats.
//!
//! Types only; the agent (`agent/src/api`) and the conductor move them. Everything parsed here
//! comes from the network, so every parser returns [`IpaError`] and never panics.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::ApiError;
use crate::secret::{serialize_exposed_option, Secret};

/// What is wrong with a protocol body.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum IpaError {
    /// The body is not the JSON expected.
    #[error("malformed JSON body: {0}")]
    Json(String),
    /// An API microversion is not `MAJOR.MINOR`.
    #[error("invalid API version {0:?} (expected MAJOR.MINOR)")]
    Version(String),
    /// A progress message is not in the vmdeploy form.
    #[error("not a vmdeploy progress message: {0}")]
    Progress(String),
}

fn from_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, IpaError> {
    serde_json::from_slice(body).map_err(|e| IpaError::Json(e.to_string()))
}

fn cut(s: &str) -> String {
    s.chars().take(64).collect()
}

/// An Ironic API microversion (`X-OpenStack-Ironic-API-Version: 1.72`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiVersion {
    /// Major version (always 1 for Ironic's v1 API).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl ApiVersion {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> ApiVersion {
        ApiVersion { major, minor }
    }

    /// Heartbeats may carry `agent_version` (Ironic API 1.36).
    pub const AGENT_VERSION: ApiVersion = ApiVersion::new(1, 36);
    /// Heartbeats carry `agent_token` (1.62).
    pub const AGENT_TOKEN: ApiVersion = ApiVersion::new(1, 62);
    /// Heartbeats may carry `agent_verify_ca` (1.68).
    pub const AGENT_VERIFY_CA: ApiVersion = ApiVersion::new(1, 68);
    /// Heartbeats may carry `agent_status` and `agent_status_message` (1.72); older conductors
    /// reject those fields with 400 ("not recognised").
    pub const AGENT_STATUS: ApiVersion = ApiVersion::new(1, 72);

    /// Parses `MAJOR.MINOR`.
    pub fn parse(s: &str) -> Result<ApiVersion, IpaError> {
        let bad = || IpaError::Version(cut(s));
        let (major, minor) = s.trim().split_once('.').ok_or_else(bad)?;
        let num = |p: &str| {
            if p.is_empty() || p.len() > 9 || !p.bytes().all(|b| b.is_ascii_digit()) {
                Err(bad())
            } else {
                p.parse::<u32>().map_err(|_| bad())
            }
        };
        Ok(ApiVersion::new(num(major)?, num(minor)?))
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// `GET /` of the Ironic API: only the part the agent reads, the newest microversion the server
/// speaks (IPA reads `default_version.version` the same way to pick its header).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct ApiRoot {
    /// The default (v1) API version description.
    pub default_version: ApiRootVersion,
}

/// `default_version` of [`ApiRoot`].
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct ApiRootVersion {
    /// `v1`.
    #[serde(default)]
    pub id: String,
    /// Newest microversion, e.g. `1.92`.
    pub version: String,
    /// Oldest microversion, e.g. `1.1`.
    #[serde(default)]
    pub min_version: Option<String>,
}

impl ApiRoot {
    /// Parses the JSON body of `GET /`.
    pub fn from_json(body: &[u8]) -> Result<ApiRoot, IpaError> {
        from_json(body)
    }

    /// The newest microversion the server speaks.
    pub fn max_version(&self) -> Result<ApiVersion, IpaError> {
        ApiVersion::parse(&self.default_version.version)
    }
}

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

impl LookupResponse {
    /// Parses the JSON body of a lookup answer.
    pub fn from_json(body: &[u8]) -> Result<LookupResponse, IpaError> {
        from_json(body)
    }

    /// Seconds the conductor waits for a heartbeat: `config.heartbeat_timeout`, else the old
    /// top-level field (IPA reads both the same way).
    pub fn heartbeat_timeout(&self) -> Option<u64> {
        self.config
            .as_ref()
            .and_then(|c| c.heartbeat_timeout)
            .or(self.heartbeat_timeout)
    }

    /// The token the lookup disclosed, when it is a real one: `******` means "already disclosed
    /// or pre-generated", and IPA ignores tokens shorter than 32 characters.
    pub fn disclosed_token(&self) -> Option<&Secret> {
        self.config
            .as_ref()
            .and_then(|c| c.agent_token.as_ref())
            .filter(|t| t.expose().len() >= MIN_TOKEN_LEN && t.expose() != MASKED_TOKEN)
    }
}

/// What a lookup answers instead of a token it already disclosed.
pub const MASKED_TOKEN: &str = "******";

/// Shortest agent token IPA accepts from a lookup.
pub const MIN_TOKEN_LEN: usize = 32;

/// The node part of a lookup answer.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct LookupNode {
    /// Node UUID.
    pub uuid: String,
    /// `properties`, where `root_device` hints live (`null` reads as empty).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub properties: serde_json::Map<String, Value>,
    /// Everything else the conductor sent.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<serde_json::Map<String, Value>, D::Error> {
    Ok(Option::<serde_json::Map<String, Value>>::deserialize(d)?.unwrap_or_default())
}

/// The config part of a lookup answer (the token goes on the wire as it is, and is masked in
/// `Debug`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct LookupConfig {
    /// Seconds the conductor waits between heartbeats before it gives up.
    #[serde(default)]
    pub heartbeat_timeout: Option<u64>,
    /// The agent token, or `******` when it was already disclosed / pre-generated.
    #[serde(default, serialize_with = "serialize_exposed_option")]
    pub agent_token: Option<Secret>,
    /// Whether every call must carry the token.
    #[serde(default)]
    pub agent_token_required: Option<bool>,
}

/// `POST /v1/heartbeat/{node}` body. Optional fields are sent only at the microversion that
/// knows them (Ironic rejects an unknown field with 400), see [`ApiVersion`]. The token goes on
/// the wire as it is, and is masked in `Debug`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Heartbeat {
    /// Where the conductor reaches the agent's command API (absent reads as empty, which
    /// [`Heartbeat::validate`] refuses by name).
    #[serde(default)]
    pub callback_url: String,
    /// The agent token (API >= 1.62).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_exposed_option"
    )]
    pub agent_token: Option<Secret>,
    /// Agent version (API >= 1.36; required by modern conductors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// The agent's self-signed certificate, PEM (API >= 1.68, Ironic's auto-TLS): the conductor
    /// pins it for every call to `callback_url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_verify_ca: Option<String>,
    /// Status word: Ironic accepts only `start`, `end` or `error` (API >= 1.72).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_status: Option<String>,
    /// Free status text (API >= 1.72); vmdeploy puts [`WriteProgress`] here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_status_message: Option<String>,
}

impl Heartbeat {
    /// Parses the JSON body of a heartbeat.
    pub fn from_json(body: &[u8]) -> Result<Heartbeat, IpaError> {
        from_json(body)
    }

    /// Checks the fields the conductor acts on: `callback_url` an `http(s)://host…` URL, and
    /// `agent_status` one of Ironic's three words. Which fields the negotiated microversion
    /// allows is the API's check, made before this one.
    pub fn validate(self) -> Result<ValidHeartbeat, ApiError> {
        let url = self.callback_url.trim();
        if url.is_empty() {
            return Err(ApiError::MissingField("callback_url"));
        }
        let lower = url.to_ascii_lowercase();
        let host = ["http://", "https://"]
            .iter()
            .find_map(|scheme| lower.strip_prefix(scheme))
            .map(|rest| rest.split(['/', '?', '#']).next().unwrap_or_default());
        match host {
            None => {
                return Err(ApiError::InvalidField {
                    field: "callback_url",
                    reason: format!("{:?} is not an http(s) URL", cut(url)),
                })
            }
            Some("") => {
                return Err(ApiError::InvalidField {
                    field: "callback_url",
                    reason: format!("{:?} names no host", cut(url)),
                })
            }
            Some(_) => {}
        }
        let agent_status = match self.agent_status.as_deref() {
            None => None,
            Some(word) => Some(
                AgentStatus::parse(word).ok_or_else(|| ApiError::InvalidField {
                    field: "agent_status",
                    reason: format!("{:?} is not start, end or error", cut(word)),
                })?,
            ),
        };
        Ok(ValidHeartbeat {
            callback_url: self.callback_url,
            agent_token: self.agent_token,
            agent_version: self.agent_version,
            agent_verify_ca: self.agent_verify_ca,
            agent_status,
            agent_status_message: self.agent_status_message,
        })
    }
}

/// A checked [`Heartbeat`]: what the conductor's API hands to the manager and the flows.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidHeartbeat {
    /// Where the agent's command API listens (`https://ip:9999`): an http(s) URL with a host.
    pub callback_url: String,
    /// The agent token from the floppy: masked in `Debug`, compared in constant time.
    pub agent_token: Option<Secret>,
    /// The agent's version string.
    pub agent_version: Option<String>,
    /// The agent's self-signed certificate (PEM) to pin for calls to it.
    pub agent_verify_ca: Option<String>,
    /// Where the agent is in its current command, when it says.
    pub agent_status: Option<AgentStatus>,
    /// Free status text; vmdeploy's agent puts [`WriteProgress`] here.
    pub agent_status_message: Option<String>,
}

/// A heartbeat's `agent_status` (Ironic accepts these three words only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentStatus {
    /// `start`.
    Start,
    /// `end`.
    End,
    /// `error`.
    Error,
}

impl AgentStatus {
    /// The word on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::End => "end",
            Self::Error => "error",
        }
    }

    /// The status a wire word names, if any (case matters, as for Ironic).
    pub fn parse(word: &str) -> Option<AgentStatus> {
        [Self::Start, Self::End, Self::Error]
            .into_iter()
            .find(|s| s.as_str() == word)
    }
}

/// Image write progress, as carried in a heartbeat's `agent_status_message`:
/// `image write: written=<bytes> total=<bytes|unknown> rate=<bytes/s>`.
///
/// A plain line so an operator reading `last_error`/logs of an upstream Ironic understands it,
/// with `key=value` fields so the vmdeploy conductor can parse it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteProgress {
    /// Bytes of the raw image written to the disk so far (never more than `total`).
    pub written: u64,
    /// Size of the raw image when known: the download's size for an uncompressed raw image,
    /// the virtual size for a qcow2 image (not the qcow2 file's size); a compressed raw image's
    /// size is known only when its stream has ended.
    pub total: Option<u64>,
    /// Average write rate so far, bytes per second.
    pub rate: u64,
}

const PROGRESS_PREFIX: &str = "image write:";

impl WriteProgress {
    /// The `agent_status_message` text.
    pub fn to_message(&self) -> String {
        let total = match self.total {
            Some(t) => t.to_string(),
            None => "unknown".to_owned(),
        };
        format!(
            "{PROGRESS_PREFIX} written={} total={total} rate={}",
            self.written, self.rate
        )
    }

    /// Parses a message made by [`WriteProgress::to_message`].
    pub fn parse(message: &str) -> Result<WriteProgress, IpaError> {
        let bad = |why: &str| IpaError::Progress(format!("{why} in {:?}", cut(message)));
        let rest = message
            .trim()
            .strip_prefix(PROGRESS_PREFIX)
            .ok_or_else(|| bad("no \"image write:\" prefix"))?;
        let (mut written, mut total, mut rate) = (None, None, None);
        for field in rest.split_whitespace() {
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| bad("a field without ="))?;
            let num = || {
                v.parse::<u64>()
                    .map_err(|_| bad("a field that is not a number"))
            };
            let slot_was_set = match k {
                "written" => written.replace(num()?).is_some(),
                "total" if v == "unknown" => total.replace(None).is_some(),
                "total" => total.replace(Some(num()?)).is_some(),
                "rate" => rate.replace(num()?).is_some(),
                _ => return Err(bad("an unknown field")),
            };
            if slot_was_set {
                return Err(bad("a repeated field"));
            }
        }
        Ok(WriteProgress {
            written: written.ok_or_else(|| bad("no written="))?,
            total: total.ok_or_else(|| bad("no total="))?,
            rate: rate.ok_or_else(|| bad("no rate="))?,
        })
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

impl CommandRequest {
    /// Parses the JSON body of a command request.
    pub fn from_json(body: &[u8]) -> Result<CommandRequest, IpaError> {
        from_json(body)
    }
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
    /// IPA's answer when clean step versions differ (never sent by vmdeploy; parsed so a
    /// conductor can read an upstream agent).
    CleanVersionMismatch,
}

/// IPA's error kinds: the `type` of a failed command's error (IPA's exception class names,
/// which conductors match on, so spelled exactly as IPA spells them) and the HTTP status of a
/// request the command API refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpaErrorKind {
    /// A command failed while running (`CommandExecutionError`).
    CommandExecution,
    /// No such command in the extension (`InvalidCommandError`, 400).
    InvalidCommand,
    /// The command's parameters are missing or wrong (`InvalidCommandParamsError`, 400).
    InvalidCommandParams,
    /// No such extension or command id (`RequestedObjectNotFoundError`, 404).
    RequestedObjectNotFound,
    /// A command is still running (`AgentIsBusy`, 409).
    AgentIsBusy,
    /// No disk to deploy onto (`DeviceNotFound`).
    DeviceNotFound,
    /// The image's digest does not match (`ImageChecksumError`).
    ImageChecksum,
    /// Downloading or writing the image failed (`ImageWriteError`).
    ImageWrite,
    /// The iSCSI target failed (`ISCSIError`).
    Iscsi,
    /// A clean step failed (`CleaningError`).
    Cleaning,
    /// The conductor's `clean_version` or `deploy_version` is not the agent's (IPA's
    /// `VersionMismatch`; the command's status is then `CLEAN_VERSION_MISMATCH`, for clean and
    /// deploy steps alike).
    CleanVersionMismatch,
    /// A deploy step failed (`DeploymentError`).
    Deployment,
    /// No hardware manager has the step or method asked for (`HardwareManagerMethodNotFound`):
    /// IPA's answer to an unknown clean or deploy step.
    HardwareManagerMethodNotFound,
}

impl IpaErrorKind {
    /// Every kind, for tables and parsing.
    pub const ALL: [IpaErrorKind; 13] = [
        Self::CommandExecution,
        Self::InvalidCommand,
        Self::InvalidCommandParams,
        Self::RequestedObjectNotFound,
        Self::AgentIsBusy,
        Self::DeviceNotFound,
        Self::ImageChecksum,
        Self::ImageWrite,
        Self::Iscsi,
        Self::Cleaning,
        Self::CleanVersionMismatch,
        Self::Deployment,
        Self::HardwareManagerMethodNotFound,
    ];

    /// The name IPA sends in `command_error.type`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::CommandExecution => "CommandExecutionError",
            Self::InvalidCommand => "InvalidCommandError",
            Self::InvalidCommandParams => "InvalidCommandParamsError",
            Self::RequestedObjectNotFound => "RequestedObjectNotFoundError",
            Self::AgentIsBusy => "AgentIsBusy",
            Self::DeviceNotFound => "DeviceNotFound",
            Self::ImageChecksum => "ImageChecksumError",
            Self::ImageWrite => "ImageWriteError",
            Self::Iscsi => "ISCSIError",
            Self::Cleaning => "CleaningError",
            Self::CleanVersionMismatch => "VersionMismatch",
            Self::Deployment => "DeploymentError",
            Self::HardwareManagerMethodNotFound => "HardwareManagerMethodNotFound",
        }
    }

    /// The kind IPA names `name`, if vmdeploy knows it (an upstream agent may send others).
    pub fn from_name(name: &str) -> Option<IpaErrorKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The HTTP status: of the refused request for the request kinds, else 500 (the `code` of
    /// every failed command, as vmdeploy has always sent it).
    pub const fn status(self) -> u16 {
        match self {
            Self::InvalidCommand | Self::InvalidCommandParams => 400,
            Self::RequestedObjectNotFound => 404,
            Self::AgentIsBusy | Self::CleanVersionMismatch => 409,
            Self::CommandExecution
            | Self::DeviceNotFound
            | Self::ImageChecksum
            | Self::ImageWrite
            | Self::Iscsi
            | Self::Cleaning
            | Self::Deployment
            | Self::HardwareManagerMethodNotFound => 500,
        }
    }
}

impl fmt::Display for IpaErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
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
    #[serde(default)]
    pub details: String,
}

impl CommandError {
    /// The error of a command that failed with `kind`: the one way a failure becomes a
    /// `command_error` (`type` from the kind, `code` its status, no details).
    pub fn new(kind: IpaErrorKind, message: impl Into<String>) -> CommandError {
        CommandError {
            kind: kind.name().to_owned(),
            code: kind.status(),
            message: message.into(),
            details: String::new(),
        }
    }

    /// The kind, when it is one vmdeploy knows.
    pub fn known_kind(&self) -> Option<IpaErrorKind> {
        IpaErrorKind::from_name(&self.kind)
    }
}

/// IPA's CommandResult.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct CommandResult {
    /// UUID of this command run.
    pub id: String,
    /// The command part of the name (`prepare_image`).
    pub command_name: String,
    /// Parameters it was called with. IPA does not send them (its CommandResult serialises id,
    /// name, status, error and result only), and neither does vmdeploy's agent: they hold the
    /// node as the conductor sees it and the configdrive. `null` is left out on the wire.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub command_params: Value,
    /// Status.
    pub command_status: CommandStatus,
    /// Error when failed.
    #[serde(default)]
    pub command_error: Option<CommandError>,
    /// Result when succeeded.
    #[serde(default)]
    pub command_result: Option<Value>,
}

impl CommandResult {
    /// Parses the JSON body of one command result.
    pub fn from_json(body: &[u8]) -> Result<CommandResult, IpaError> {
        from_json(body)
    }
}

/// `GET /v1/commands` answer.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct CommandList {
    /// Oldest first.
    pub commands: Vec<CommandResult>,
}

impl CommandList {
    /// Parses the JSON body of a command list.
    pub fn from_json(body: &[u8]) -> Result<CommandList, IpaError> {
        from_json(body)
    }
}

/// WSME-style error body.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Fault {
    /// `Client` or `Server`.
    pub faultcode: String,
    /// Message.
    pub faultstring: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(ApiVersion::parse("1.72"), Ok(ApiVersion::new(1, 72)));
        assert!(ApiVersion::parse("1.9").expect("valid") < ApiVersion::new(1, 10));
        for bad in ["", "1", "1.", ".2", "1.2.3", "a.b", "1.-2", "99999999999.1"] {
            assert!(ApiVersion::parse(bad).is_err(), "{bad:?}");
        }
        let root = ApiRoot::from_json(
            br#"{"name":"OpenStack Ironic API","default_version":{"id":"v1","version":"1.92","min_version":"1.1"}}"#,
        )
        .expect("root");
        assert_eq!(root.max_version(), Ok(ApiVersion::new(1, 92)));
    }

    #[test]
    fn lookup_answer_modern_and_old() {
        let modern = LookupResponse::from_json(
            br#"{"node":{"uuid":"u1","properties":{"root_device":{"name":"/dev/sda"}},"instance_info":{}},
                 "config":{"heartbeat_timeout":300,"agent_token":"******","agent_token_required":true}}"#,
        )
        .expect("modern");
        assert_eq!(modern.heartbeat_timeout(), Some(300));
        assert_eq!(modern.disclosed_token(), None, "masked token is no token");
        assert_eq!(modern.node.properties["root_device"]["name"], "/dev/sda");
        assert!(modern.node.other.contains_key("instance_info"));
        assert!(!format!("{modern:?}").contains("******\\\""));

        let tok = "t".repeat(43);
        let body = format!(r#"{{"node":{{"uuid":"u"}},"config":{{"agent_token":"{tok}"}}}}"#);
        let with_token = LookupResponse::from_json(body.as_bytes()).expect("token");
        assert_eq!(
            with_token.disclosed_token().map(|t| t.expose().as_str()),
            Some(tok.as_str())
        );
        assert!(
            !format!("{with_token:?}").contains(&tok),
            "token masked in Debug"
        );
        // The conductor's side: the lookup answer it sends carries the real token.
        let sent = serde_json::to_value(&with_token).expect("json");
        assert_eq!(sent["config"]["agent_token"], tok.as_str());

        let old = LookupResponse::from_json(br#"{"node":{"uuid":"u"},"heartbeat_timeout":60}"#)
            .expect("old");
        assert_eq!(old.heartbeat_timeout(), Some(60));
        assert!(LookupResponse::from_json(br#"{"config":{}}"#).is_err());
        let null_props =
            LookupResponse::from_json(br#"{"node":{"uuid":"u","properties":null}}"#).expect("null");
        assert!(null_props.node.properties.is_empty());
    }

    #[test]
    fn heartbeat_fields_are_named_as_ironic_names_them() {
        // The body of POST /v1/heartbeat/{node} (docs/ironic-protocols.md §3.2), every field
        // spelled out here so a renamed struct field cannot pass both ends.
        let wire = serde_json::json!({
            "callback_url": "https://10.0.0.5:9999",
            "agent_token": "tok-0123456789abcdef0123456789abcdef",
            "agent_version": "10.0.0",
            "agent_verify_ca": "PEM",
            "agent_status": "end",
            "agent_status_message": "image write: written=1 total=2 rate=3",
        });
        let hb: Heartbeat = crate::api::from_value(wire.clone()).expect("parse");
        assert_eq!(serde_json::to_value(&hb).expect("json"), wire);
        let valid = hb.validate().expect("valid");
        assert_eq!(valid.callback_url, "https://10.0.0.5:9999");
        assert_eq!(
            valid.agent_token.as_ref().map(|t| t.expose().as_str()),
            Some("tok-0123456789abcdef0123456789abcdef")
        );
        assert_eq!(valid.agent_version.as_deref(), Some("10.0.0"));
        assert_eq!(valid.agent_verify_ca.as_deref(), Some("PEM"));
        assert_eq!(valid.agent_status, Some(AgentStatus::End));
        assert_eq!(
            valid.agent_status_message.as_deref(),
            Some("image write: written=1 total=2 rate=3")
        );
        assert!(
            !format!("{valid:?}").contains("tok-0123"),
            "the token is masked in Debug"
        );
        let words: Vec<&str> = [AgentStatus::Start, AgentStatus::End, AgentStatus::Error]
            .map(AgentStatus::as_str)
            .to_vec();
        assert_eq!(words, ["start", "end", "error"]);
    }

    #[test]
    fn a_bad_heartbeat_is_refused_naming_its_field() {
        let cases = [
            (serde_json::json!({}), "callback_url"),
            (serde_json::json!({"callback_url": "  "}), "callback_url"),
            (
                serde_json::json!({"callback_url": "ftp://x"}),
                "callback_url",
            ),
            (
                serde_json::json!({"callback_url": "https://"}),
                "callback_url",
            ),
            (serde_json::json!({"callback_url": 5}), "callback_url"),
            (
                serde_json::json!({"callback_url": "http://x", "agent_token": 5}),
                "agent_token",
            ),
            (
                serde_json::json!({"callback_url": "http://x", "agent_status": "done"}),
                "agent_status",
            ),
            (
                serde_json::json!({"callback_url": "http://x", "agent_status": "START"}),
                "agent_status",
            ),
        ];
        for (body, field) in cases {
            let got =
                crate::api::from_value::<Heartbeat>(body.clone()).and_then(Heartbeat::validate);
            let err = got.expect_err(&body.to_string());
            assert!(
                err.to_string().contains(&format!("{field:?}")),
                "{body}: {err}"
            );
        }
        let ok = Heartbeat::validate(
            crate::api::from_value(serde_json::json!({"callback_url": "HTTP://10.0.0.5:9999/"}))
                .expect("parse"),
        );
        assert_eq!(ok.expect("valid").callback_url, "HTTP://10.0.0.5:9999/");
    }

    #[test]
    fn heartbeat_omits_absent_fields_and_masks_the_token() {
        let hb = Heartbeat {
            callback_url: "http://10.0.0.5:9999".into(),
            agent_token: Some(Secret::new("secret-token")),
            agent_version: Some("1.0".into()),
            agent_verify_ca: None,
            agent_status: None,
            agent_status_message: None,
        };
        let json = serde_json::to_value(&hb).expect("json");
        let keys: Vec<&str> = json
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["agent_token", "agent_version", "callback_url"]);
        assert_eq!(
            json["agent_token"], "secret-token",
            "the wire body has the real token"
        );
        assert!(!format!("{hb:?} {hb:#?}").contains("secret-token"));
        let back = Heartbeat::from_json(json.to_string().as_bytes()).expect("parse");
        assert_eq!(back, hb);

        // Ironic's auto-TLS field, spelled as in docs/ironic-protocols.md §3.2.
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let tls = Heartbeat {
            callback_url: "https://10.0.0.5:9999".into(),
            agent_verify_ca: Some(pem.into()),
            ..hb
        };
        let json = serde_json::to_value(&tls).expect("json");
        assert_eq!(json["agent_verify_ca"], pem);
        assert_eq!(
            Heartbeat::from_json(json.to_string().as_bytes()).expect("parse"),
            tls
        );
    }

    #[test]
    fn progress_message_round_trips() {
        let p = WriteProgress {
            written: 1 << 30,
            total: Some(4 << 30),
            rate: 123_456_789,
        };
        assert_eq!(
            p.to_message(),
            "image write: written=1073741824 total=4294967296 rate=123456789"
        );
        assert_eq!(WriteProgress::parse(&p.to_message()), Ok(p));
        let unknown = WriteProgress { total: None, ..p };
        assert_eq!(WriteProgress::parse(&unknown.to_message()), Ok(unknown));
        for bad in [
            "",
            "image write:",
            "image write: written=1 total=2",
            "image write: written=1 total=2 rate=x",
            "image write: written=1 written=1 total=2 rate=3",
            "image write: written=1 total=2 rate=3 extra=4",
            "written=1 total=2 rate=3",
        ] {
            assert!(WriteProgress::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn command_result_shape_is_ipas() {
        let r = CommandResult {
            id: "id1".into(),
            command_name: "prepare_image".into(),
            command_params: serde_json::json!({}),
            command_status: CommandStatus::Failed,
            command_error: Some(CommandError::new(IpaErrorKind::ImageChecksum, "m")),
            command_result: None,
        };
        let v = serde_json::to_value(&r).expect("json");
        assert_eq!(v["command_status"], "FAILED");
        assert_eq!(
            v["command_error"],
            serde_json::json!({"type": "ImageChecksumError", "code": 500, "message": "m", "details": ""})
        );
        assert!(v["command_result"].is_null());
        assert_eq!(
            CommandResult::from_json(v.to_string().as_bytes()),
            Ok(r.clone())
        );
        // IPA's CommandResult has no command_params: a null one is left out, and an answer
        // without it reads.
        let ipa = CommandResult {
            command_params: Value::Null,
            ..r.clone()
        };
        let v = serde_json::to_value(&ipa).expect("json");
        let mut keys: Vec<&str> = v
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "command_error",
                "command_name",
                "command_result",
                "command_status",
                "id"
            ]
        );
        assert_eq!(CommandResult::from_json(v.to_string().as_bytes()), Ok(ipa));
        let list = CommandList { commands: vec![r] };
        let text = serde_json::to_string(&list).expect("json");
        assert_eq!(CommandList::from_json(text.as_bytes()), Ok(list));
        assert!(CommandResult::from_json(
            br#"{"id":"x","command_name":"y","command_status":"DONE"}"#
        )
        .is_err());
    }

    #[test]
    fn error_kinds_are_spelled_as_ipa_spells_them() {
        // IPA's exception class names (ironic_python_agent/errors.py), written out here so a
        // typo in the enum cannot pass both ends.
        let ipa = [
            ("CommandExecutionError", 500),
            ("InvalidCommandError", 400),
            ("InvalidCommandParamsError", 400),
            ("RequestedObjectNotFoundError", 404),
            ("AgentIsBusy", 409),
            ("DeviceNotFound", 500),
            ("ImageChecksumError", 500),
            ("ImageWriteError", 500),
            ("ISCSIError", 500),
            ("CleaningError", 500),
            ("VersionMismatch", 409),
            ("DeploymentError", 500),
            ("HardwareManagerMethodNotFound", 500),
        ];
        let ours: Vec<(&str, u16)> = IpaErrorKind::ALL
            .iter()
            .map(|k| (k.name(), k.status()))
            .collect();
        assert_eq!(ours, ipa);
        for kind in IpaErrorKind::ALL {
            assert_eq!(IpaErrorKind::from_name(kind.name()), Some(kind));
            assert_eq!(CommandError::new(kind, "x").known_kind(), Some(kind));
        }
        assert_eq!(IpaErrorKind::from_name("SoftwareRAIDError"), None);
        assert_eq!(IpaErrorKind::from_name("imagewriteerror"), None);
    }

    fn arb_progress() -> impl Strategy<Value = WriteProgress> {
        (
            any::<u64>(),
            proptest::option::of(any::<u64>()),
            any::<u64>(),
        )
            .prop_map(|(written, total, rate)| WriteProgress {
                written,
                total,
                rate,
            })
    }

    proptest! {
        #[test]
        fn progress_round_trip(p in arb_progress()) {
            prop_assert_eq!(WriteProgress::parse(&p.to_message()), Ok(p));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = ApiRoot::from_json(&bytes).map(|r| r.max_version());
            let _ = LookupResponse::from_json(&bytes).map(|l| (l.heartbeat_timeout(), l.disclosed_token().map(|t| t.expose().len())));
            let _ = Heartbeat::from_json(&bytes).map(Heartbeat::validate);
            let _ = CommandRequest::from_json(&bytes);
            let _ = CommandResult::from_json(&bytes);
            let _ = CommandList::from_json(&bytes);
            let text = String::from_utf8_lossy(&bytes);
            let _ = WriteProgress::parse(&text);
            let _ = ApiVersion::parse(&text);
        }

        #[test]
        fn near_miss_progress_never_panics(s in "image write:( (written|total|rate|x)=[0-9a-z]{0,22}){0,5}") {
            let _ = WriteProgress::parse(&s);
        }

        #[test]
        fn heartbeat_round_trip(url in "\\PC{0,40}", tok in proptest::option::of("\\PC{0,50}"),
                                ver in proptest::option::of("[0-9.]{0,10}"),
                                ca in proptest::option::of("\\PC{0,80}"),
                                msg in proptest::option::of("\\PC{0,80}")) {
            let hb = Heartbeat { callback_url: url, agent_token: tok.map(Secret::new), agent_version: ver,
                                 agent_verify_ca: ca, agent_status: None, agent_status_message: msg };
            let text = serde_json::to_vec(&hb).expect("serialize");
            prop_assert_eq!(Heartbeat::from_json(&text), Ok(hb));
        }

        #[test]
        fn lookup_round_trip(uuid in "[a-f0-9-]{1,36}", timeout in proptest::option::of(any::<u64>()),
                             tok in proptest::option::of("\\PC{0,50}")) {
            let l = LookupResponse {
                node: LookupNode { uuid, properties: Default::default(), other: Default::default() },
                config: Some(LookupConfig { heartbeat_timeout: timeout, agent_token: tok.map(Secret::new), agent_token_required: Some(true) }),
                heartbeat_timeout: None,
            };
            let text = serde_json::to_vec(&l).expect("serialize");
            prop_assert_eq!(LookupResponse::from_json(&text), Ok(l));
        }
    }
}
