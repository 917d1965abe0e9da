//! The file as written: its tables ([`ConfigFile`] and one `*Section` per table), their serde
//! with `deny_unknown_fields`, and [`parse`], whose errors name the key they are at.

use std::path::PathBuf;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use vmdeploy_shared::secret::Secret;

use super::{netboot, ConfigError};
use crate::logging::LogFormat;

/// The whole file. Every table and key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConfigFile {
    /// `[api]`
    pub api: ApiSection,
    /// `[auth]`
    pub auth: AuthSection,
    /// `[state]`
    pub state: StateSection,
    /// `[store]`
    pub store: StoreSection,
    /// `[database]`
    pub database: DatabaseSection,
    /// `[conductor]`
    pub conductor: ConductorSection,
    /// `[objects]`
    pub objects: ObjectsSection,
    /// `[ilo]`
    pub ilo: IloSection,
    /// `[deploy]`
    pub deploy: DeploySection,
    /// `[images]`
    pub images: ImagesSection,
    /// `[log]`
    pub log: LogSection,
    /// `[netboot]`
    pub netboot: netboot::NetbootSection,
}

/// `[api]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiSection {
    /// `listen`: `ip:port` strings; `None` = [`DEFAULT_LISTEN`](super::DEFAULT_LISTEN).
    pub listen: Option<Vec<String>>,
    /// `tls`.
    pub tls: TlsSetting,
    /// `public_url`.
    pub public_url: Option<String>,
    /// `insecure_listen_without_tls`.
    pub insecure_listen_without_tls: bool,
    /// `max_body`, bytes.
    pub max_body: Option<u64>,
    /// `max_limit`, records.
    pub max_limit: Option<u64>,
    /// `shutdown_grace`, seconds.
    pub shutdown_grace: Option<u64>,
    /// `body_timeout`, seconds.
    pub body_timeout: Option<u64>,
    /// `max_connections`.
    pub max_connections: Option<u64>,
    /// `max_connections_per_client`.
    pub max_connections_per_client: Option<u64>,
    /// `callback_failures_per_client`, a minute.
    pub callback_failures_per_client: Option<u64>,
    /// `callback_failures_per_node`, a minute.
    pub callback_failures_per_node: Option<u64>,
}

/// `api.tls`: off, auto (generated CA and certificate), or files.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum TlsSetting {
    /// Plain HTTP (loopback only, unless `insecure_listen_without_tls`).
    #[default]
    Off,
    /// A CA and a server certificate generated in the state directory.
    Auto,
    /// The operator's certificate and key.
    Files(TlsFiles),
}

/// A certificate chain and its key, as PEM files.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA clients should trust (for the ramdisk's floppy); default the chain's last
    /// certificate.
    #[serde(default)]
    pub ca: Option<PathBuf>,
}

impl<'de> Deserialize<'de> for TlsSetting {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TlsVisitor;
        impl<'de> Visitor<'de> for TlsVisitor {
            type Value = TlsSetting;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"off\", \"auto\" or a table { cert = \"...\", key = \"...\" }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<TlsSetting, E> {
                match v {
                    "off" => Ok(TlsSetting::Off),
                    "auto" => Ok(TlsSetting::Auto),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<TlsSetting, A::Error> {
                TlsFiles::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(TlsSetting::Files)
            }
        }
        deserializer.deserialize_any(TlsVisitor)
    }
}

/// `[auth]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSection {
    /// `strategy`.
    pub strategy: AuthStrategy,
    /// `htpasswd`.
    pub htpasswd: Option<PathBuf>,
}

/// How API callers authenticate (Ironic's `auth_strategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthStrategy {
    /// Everyone may call.
    #[default]
    Noauth,
    /// HTTP basic against an htpasswd file with bcrypt hashes.
    HttpBasic,
}

/// `[state]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateSection {
    /// `dir`.
    pub dir: Option<PathBuf>,
}

/// `[store]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSection {
    /// `kind` (`None`: follows `database.url`).
    pub kind: Option<StoreKind>,
}

/// The node store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// SQLite in the state directory.
    #[default]
    Sqlite,
    /// PostgreSQL at `database.url`, which several conductors may share.
    Postgresql,
}

/// `[conductor]`: this conductor among others (Ironic's `[conductor]` names).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConductorSection {
    /// `sync_power_state_workers`.
    pub sync_power_state_workers: Option<u64>,
    /// `conductor_group`.
    pub conductor_group: Option<String>,
    /// `heartbeat_interval`, seconds.
    pub heartbeat_interval: Option<u64>,
    /// `heartbeat_timeout`, seconds.
    pub heartbeat_timeout: Option<u64>,
    /// `internal_url`: where the other conductors reach this one's API.
    pub internal_url: Option<String>,
}

/// `[database]`: the PostgreSQL server.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSection {
    /// `url` (may carry a password: kept as a secret).
    pub url: Option<Secret>,
    /// `password_file`.
    pub password_file: Option<PathBuf>,
    /// `ca_file`.
    pub ca_file: Option<PathBuf>,
    /// `max_connections`.
    pub max_connections: Option<u64>,
}

/// `[objects]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ObjectsSection {
    /// `kind`.
    pub kind: ObjectsKind,
    /// `[objects.builtin]`
    pub builtin: BuiltinSection,
    /// `[objects.swift]`
    pub swift: Option<SwiftSection>,
}

/// The object store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectsKind {
    /// Files in the state directory, served over HTTPS by the conductor.
    #[default]
    Builtin,
    /// OpenStack Swift.
    Swift,
}

/// `[objects.builtin]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BuiltinSection {
    /// `listen`.
    pub listen: Option<String>,
    /// `public_url`.
    pub public_url: Option<String>,
    /// `tls`: its own certificate; default the API's files, else a generated one.
    pub tls: Option<TlsFiles>,
}

/// `[objects.swift]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwiftSection {
    /// `auth_url`.
    pub auth_url: String,
    /// `auth_version`: 1 or 3.
    #[serde(default = "default_swift_auth_version")]
    pub auth_version: u8,
    /// `user`.
    pub user: String,
    /// `key`.
    pub key: Secret,
    /// `project`.
    #[serde(default)]
    pub project: Option<String>,
    /// `user_domain`.
    #[serde(default)]
    pub user_domain: Option<String>,
    /// `project_domain`.
    #[serde(default)]
    pub project_domain: Option<String>,
    /// `region`.
    #[serde(default)]
    pub region: Option<String>,
    /// `interface` (Keystone catalog; default `public`).
    #[serde(default)]
    pub interface: Option<String>,
    /// `temp_url_key`.
    #[serde(default)]
    pub temp_url_key: Option<Secret>,
    /// `verify_ca`: `true` (default), `false`, or a CA file.
    #[serde(default)]
    pub verify_ca: Option<VerifyCa>,
    /// `timeout`, seconds.
    #[serde(default)]
    pub timeout: Option<u64>,
}

fn default_swift_auth_version() -> u8 {
    3
}

/// `[ilo]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IloSection {
    /// `client_port`.
    pub client_port: Option<u16>,
    /// `client_timeout`, seconds.
    pub client_timeout: Option<u64>,
    /// `verify_ca`.
    pub verify_ca: Option<VerifyCa>,
}

/// `true`, `false`, or a CA file (Ironic's `ilo_verify_ca`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum VerifyCa {
    /// Verify against the system roots (`true`) or not at all (`false`).
    Enabled(bool),
    /// Verify against this CA file.
    File(PathBuf),
}

/// `[deploy]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeploySection {
    /// `api_url`.
    pub api_url: Option<String>,
    /// `deploy_helper_images_ttl`, seconds.
    pub deploy_helper_images_ttl: Option<u64>,
    /// `deploy_callback_timeout`, seconds.
    pub deploy_callback_timeout: Option<u64>,
    /// `agent_allow_plain_http`.
    pub agent_allow_plain_http: bool,
    /// `agent_call_timeout`, seconds.
    pub agent_call_timeout: Option<u64>,
    /// `agent_power_off_wait`, seconds.
    pub agent_power_off_wait: Option<u64>,
    /// `automated_clean`.
    pub automated_clean: bool,
    /// `power_sync_interval`, seconds.
    pub power_sync_interval: Option<u64>,
    /// `container`.
    pub container: Option<String>,
    /// `conductor_name`.
    pub conductor_name: Option<String>,
    /// `boot_loaders_dir`.
    pub boot_loaders_dir: Option<PathBuf>,
    /// `boot_iso_append`.
    pub boot_iso_append: Option<String>,
    /// `boot_iso_ttl`, seconds.
    pub boot_iso_ttl: Option<u64>,
    /// `iscsi_portal_port`.
    pub iscsi_portal_port: Option<u16>,
    /// `iscsi_done_port`.
    pub iscsi_done_port: Option<u16>,
    /// `iscsi_chap_user`.
    pub iscsi_chap_user: Option<String>,
    /// `iscsi_chap_secret`.
    pub iscsi_chap_secret: Option<Secret>,
}

/// `[images]`: the instance image cache (iscsi_ilo).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImagesSection {
    /// `cache_dir`.
    pub cache_dir: Option<PathBuf>,
    /// `cache_limit`, bytes.
    pub cache_limit: Option<u64>,
}

/// `[log]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// `format`.
    pub format: LogFormat,
    /// `level`.
    pub level: Option<String>,
}

/// Parses the text of a configuration file. A syntax or type error names the key it is at.
pub fn parse(text: &str) -> Result<ConfigFile, ConfigError> {
    toml::from_str(text).map_err(|err| {
        let key = err
            .span()
            .and_then(|span| key_at(text, span.start))
            .unwrap_or_else(|| "configuration".to_string());
        // toml's message carries the line, a caret and the reason; keep only the reason line.
        let reason = err.message().trim().to_string();
        let line = err
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        let reason = match line {
            Some(line) => format!("{reason} (line {line})"),
            None => reason,
        };
        ConfigError::new(key, reason)
    })
}

/// The dotted key whose line holds byte `pos`: the nearest `key =` at or above it, under the
/// nearest `[table]` header above that.
fn key_at(text: &str, pos: usize) -> Option<String> {
    let pos = pos.min(text.len());
    let upto = &text[..pos];
    let line_start = upto.rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[pos..].find('\n').map_or(text.len(), |i| pos + i);
    let mut lines: Vec<&str> = text[..line_start].lines().collect();
    lines.push(&text[line_start..line_end]);
    let mut key: Option<String> = None;
    for line in lines.iter().rev() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            let table = trimmed
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            return Some(match key {
                Some(k) => format!("{table}.{k}"),
                None => table,
            });
        }
        if key.is_none() {
            if let Some((k, _)) = trimmed.split_once('=') {
                let k = k.trim().trim_matches('"');
                if !k.is_empty() && !k.starts_with('#') {
                    key = Some(k.to_string());
                }
            }
        }
    }
    key
}
