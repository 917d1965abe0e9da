//! The conductor's configuration: the TOML file as written ([`ConfigFile`], serde,
//! `deny_unknown_fields`), and what `serve` runs with after checking it ([`Settings`]).
//!
//! # Design
//! Two steps, so that `serve --check-config` runs exactly what `serve` runs and binds nothing:
//! [`parse`] turns text into a [`ConfigFile`] (a syntax or type error names its key, found from
//! the error's position in the text), and [`Settings::resolve`] checks values and relations
//! (addresses, loopback without TLS, files that must exist) and fills every default, saying
//! which ones it used ([`Fallback`]), so the first log lines can tell the operator.
//!
//! Every key's dotted name is a constant in [`keys`], the one place messages and docs take them
//! from (STYLE.md §4, after linkerd2-proxy's env.rs); a unit test checks each constant against
//! the example file. The environment comes through the [`Env`] trait, with a map for tests
//! (STYLE.md §7).
//!
//! Durations are whole seconds. Sizes are bytes.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use vmdeploy_shared::secret::Secret;

use crate::logging::LogFormat;

pub mod netboot;

/// The dotted names of every configuration key.
pub mod keys {
    /// API listen addresses (`ip:port`, several allowed).
    pub const API_LISTEN: &str = "api.listen";
    /// API TLS: `"off"`, `"auto"` or `{ cert, key, ca }`.
    pub const API_TLS: &str = "api.tls";
    /// API TLS certificate chain (PEM), when `api.tls` is a table.
    pub const API_TLS_CERT: &str = "api.tls.cert";
    /// API TLS private key (PEM).
    pub const API_TLS_KEY: &str = "api.tls.key";
    /// CA the ramdisk trusts for the API (PEM; default: the last certificate of `cert`).
    pub const API_TLS_CA: &str = "api.tls.ca";
    /// The URL clients reach the API at.
    pub const API_PUBLIC_URL: &str = "api.public_url";
    /// The words that allow a non-loopback listen address without TLS.
    pub const API_INSECURE: &str = "api.insecure_listen_without_tls";
    /// Largest request body, bytes.
    pub const API_MAX_BODY: &str = "api.max_body";
    /// Seconds in-flight requests get after SIGTERM.
    pub const API_SHUTDOWN_GRACE: &str = "api.shutdown_grace";
    /// `noauth` or `http_basic`.
    pub const AUTH_STRATEGY: &str = "auth.strategy";
    /// The htpasswd file of `http_basic` (bcrypt hashes).
    pub const AUTH_HTPASSWD: &str = "auth.htpasswd";
    /// The state directory.
    pub const STATE_DIR: &str = "state.dir";
    /// The node store: `sqlite`.
    pub const STORE_KIND: &str = "store.kind";
    /// The object store: `builtin` or `swift`.
    pub const OBJECTS_KIND: &str = "objects.kind";
    /// Where the built-in store listens (`ip:port`, port 0 picks one).
    pub const BUILTIN_LISTEN: &str = "objects.builtin.listen";
    /// The URL BMCs and agents reach the built-in store at.
    pub const BUILTIN_PUBLIC_URL: &str = "objects.builtin.public_url";
    /// The built-in store's own certificate `{ cert, key }`.
    pub const BUILTIN_TLS: &str = "objects.builtin.tls";
    /// Swift: the auth endpoint (`.../auth/v1.0` or Keystone `.../v3`).
    pub const SWIFT_AUTH_URL: &str = "objects.swift.auth_url";
    /// Swift: auth version, `1` (tempauth) or `3` (Keystone).
    pub const SWIFT_AUTH_VERSION: &str = "objects.swift.auth_version";
    /// Swift: user (`account:user` for tempauth).
    pub const SWIFT_USER: &str = "objects.swift.user";
    /// Swift: key or password.
    pub const SWIFT_KEY: &str = "objects.swift.key";
    /// Swift, Keystone: project name.
    pub const SWIFT_PROJECT: &str = "objects.swift.project";
    /// Swift, Keystone: the user's domain.
    pub const SWIFT_USER_DOMAIN: &str = "objects.swift.user_domain";
    /// Swift, Keystone: the project's domain.
    pub const SWIFT_PROJECT_DOMAIN: &str = "objects.swift.project_domain";
    /// Swift, Keystone: region of the object-store endpoint.
    pub const SWIFT_REGION: &str = "objects.swift.region";
    /// Swift, Keystone: endpoint interface (`public`, `internal`, `admin`).
    pub const SWIFT_INTERFACE: &str = "objects.swift.interface";
    /// Swift: the account's temp-URL key (set on the account when missing).
    pub const SWIFT_TEMP_URL_KEY: &str = "objects.swift.temp_url_key";
    /// Swift: verify its certificate (`true`, `false`, or a CA file; default the system's
    /// roots).
    pub const SWIFT_VERIFY_CA: &str = "objects.swift.verify_ca";
    /// Swift: connect and read timeout, seconds.
    pub const SWIFT_TIMEOUT: &str = "objects.swift.timeout";
    /// iLO: default port of the iLO's HTTPS interface.
    pub const ILO_CLIENT_PORT: &str = "ilo.client_port";
    /// iLO: default timeout of one call, seconds.
    pub const ILO_CLIENT_TIMEOUT: &str = "ilo.client_timeout";
    /// iLO: verify the iLO's certificate (`true`, `false`, or a CA file).
    pub const ILO_VERIFY_CA: &str = "ilo.verify_ca";
    /// The API URL the ramdisk calls back.
    pub const DEPLOY_API_URL: &str = "deploy.api_url";
    /// Lifetime of floppies and their temp URLs, seconds.
    pub const DEPLOY_HELPER_TTL: &str = "deploy.deploy_helper_images_ttl";
    /// How long a node may wait for its ramdisk, seconds.
    pub const DEPLOY_CALLBACK_TIMEOUT: &str = "deploy.deploy_callback_timeout";
    /// Talk plain HTTP to an agent that offers no certificate.
    pub const DEPLOY_AGENT_PLAIN_HTTP: &str = "deploy.agent_allow_plain_http";
    /// Timeout of one call to an agent's command API, seconds.
    pub const DEPLOY_AGENT_CALL_TIMEOUT: &str = "deploy.agent_call_timeout";
    /// Seconds the host may take to power off after the agent's `standby.power_off`.
    pub const DEPLOY_AGENT_POWER_OFF_WAIT: &str = "deploy.agent_power_off_wait";
    /// Clean nodes through the agent on undeploy and provide.
    pub const DEPLOY_AUTOMATED_CLEAN: &str = "deploy.automated_clean";
    /// Seconds between power-state syncs.
    pub const DEPLOY_POWER_SYNC: &str = "deploy.power_sync_interval";
    /// Object-store container of floppies and deploy ISOs.
    pub const DEPLOY_CONTAINER: &str = "deploy.container";
    /// Name of this conductor (its reservations' prefix; default the host name).
    pub const DEPLOY_CONDUCTOR_NAME: &str = "deploy.conductor_name";
    /// Directory of the boot loaders instance boot ISOs are built with (written by
    /// `vmdeploy-image-build loaders -o DIR`; default `<state dir>/boot-loaders`).
    pub const DEPLOY_BOOT_LOADERS_DIR: &str = "deploy.boot_loaders_dir";
    /// Kernel arguments after `root=UUID=...` on built instance boot ISOs.
    pub const DEPLOY_BOOT_ISO_APPEND: &str = "deploy.boot_iso_append";
    /// Lifetime of the temp URL an instance's boot ISO is attached with, seconds.
    pub const DEPLOY_BOOT_ISO_TTL: &str = "deploy.boot_iso_ttl";
    /// The port the conductor logs in to the iSCSI ramdisk's target at (Ironic's
    /// `[iscsi] portal_port`, 3260).
    pub const DEPLOY_ISCSI_PORTAL_PORT: &str = "deploy.iscsi_portal_port";
    /// The port the conductor sends the iSCSI ramdisk its `done` to (10000).
    pub const DEPLOY_ISCSI_DONE_PORT: &str = "deploy.iscsi_done_port";
    /// CHAP user the iSCSI ramdisk's target requires (with `iscsi_chap_secret`).
    pub const DEPLOY_ISCSI_CHAP_USER: &str = "deploy.iscsi_chap_user";
    /// CHAP secret of `iscsi_chap_user` (at least 12 bytes, no white space).
    pub const DEPLOY_ISCSI_CHAP_SECRET: &str = "deploy.iscsi_chap_secret";
    /// Directory of the instance image cache (default `<state>/images`).
    pub const IMAGES_CACHE_DIR: &str = "images.cache_dir";
    /// Size limit of the instance image cache, bytes of raw images.
    pub const IMAGES_CACHE_LIMIT: &str = "images.cache_limit";
    /// Log format: `human` or `json`.
    pub const LOG_FORMAT: &str = "log.format";
    /// Log level or `tracing` filter directives (`RUST_LOG` wins).
    pub const LOG_LEVEL: &str = "log.level";

    /// Every key, for the docs test.
    pub const ALL: &[&str] = &[
        API_LISTEN,
        API_TLS,
        API_TLS_CERT,
        API_TLS_KEY,
        API_TLS_CA,
        API_PUBLIC_URL,
        API_INSECURE,
        API_MAX_BODY,
        API_SHUTDOWN_GRACE,
        AUTH_STRATEGY,
        AUTH_HTPASSWD,
        STATE_DIR,
        STORE_KIND,
        OBJECTS_KIND,
        BUILTIN_LISTEN,
        BUILTIN_PUBLIC_URL,
        BUILTIN_TLS,
        SWIFT_AUTH_URL,
        SWIFT_AUTH_VERSION,
        SWIFT_USER,
        SWIFT_KEY,
        SWIFT_PROJECT,
        SWIFT_USER_DOMAIN,
        SWIFT_PROJECT_DOMAIN,
        SWIFT_REGION,
        SWIFT_INTERFACE,
        SWIFT_TIMEOUT,
        SWIFT_TEMP_URL_KEY,
        SWIFT_VERIFY_CA,
        ILO_CLIENT_PORT,
        ILO_CLIENT_TIMEOUT,
        ILO_VERIFY_CA,
        DEPLOY_API_URL,
        DEPLOY_HELPER_TTL,
        DEPLOY_CALLBACK_TIMEOUT,
        DEPLOY_AGENT_PLAIN_HTTP,
        DEPLOY_AGENT_CALL_TIMEOUT,
        DEPLOY_AUTOMATED_CLEAN,
        DEPLOY_POWER_SYNC,
        DEPLOY_CONTAINER,
        DEPLOY_CONDUCTOR_NAME,
        DEPLOY_ISCSI_CHAP_USER,
        DEPLOY_ISCSI_CHAP_SECRET,
        DEPLOY_BOOT_LOADERS_DIR,
        DEPLOY_BOOT_ISO_APPEND,
        DEPLOY_BOOT_ISO_TTL,
        DEPLOY_ISCSI_PORTAL_PORT,
        DEPLOY_ISCSI_DONE_PORT,
        IMAGES_CACHE_DIR,
        IMAGES_CACHE_LIMIT,
        LOG_FORMAT,
        LOG_LEVEL,
    ];
}

/// The API's port when nothing says otherwise (Ironic's).
pub const DEFAULT_PORT: u16 = 6385;
/// The API's address when nothing says otherwise.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_PORT);
/// The built-in store's address when nothing says otherwise: loopback, a free port.
pub const DEFAULT_BUILTIN_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
/// Largest request body (issue 10: bodies over 1 MiB are refused).
pub const DEFAULT_MAX_BODY: u64 = 1024 * 1024;
/// Grace period of the SIGTERM drain.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// The SQLite file in the state directory.
pub const SQLITE_FILE: &str = "vmdeploy.sqlite";
/// The built-in store's directory in the state directory.
pub const OBJECTS_DIR: &str = "objects";
/// The instance image cache in the state directory (`images.cache_dir`'s default).
pub const IMAGES_DIR: &str = "images";
/// Generated certificates in the state directory.
pub const TLS_DIR: &str = "tls";
/// The boot loaders' directory in the state directory (`deploy.boot_loaders_dir`).
pub const BOOT_LOADERS_DIR: &str = "boot-loaders";
/// The state directory's name under `$XDG_STATE_HOME` and `~/.local/state`.
pub const STATE_SUBDIR: &str = "vmdeploy";

/// A configuration error: which key, and why. `serve` exits 64 on it.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ConfigError {
    /// The dotted key (`api.listen`), or `configuration` for the file as a whole.
    pub key: String,
    /// What is wrong, and where it helps, how to fix it.
    pub reason: String,
}

impl ConfigError {
    fn new(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The file as written.

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
    /// `listen`: `ip:port` strings; `None` = [`DEFAULT_LISTEN`].
    pub listen: Option<Vec<String>>,
    /// `tls`.
    pub tls: TlsSetting,
    /// `public_url`.
    pub public_url: Option<String>,
    /// `insecure_listen_without_tls`.
    pub insecure_listen_without_tls: bool,
    /// `max_body`, bytes.
    pub max_body: Option<u64>,
    /// `shutdown_grace`, seconds.
    pub shutdown_grace: Option<u64>,
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
    /// `kind`.
    pub kind: StoreKind,
}

/// The node store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// SQLite in the state directory.
    #[default]
    Sqlite,
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

// ---------------------------------------------------------------------------------------------
// The environment.

/// The process environment, or a map in tests.
pub trait Env {
    /// The value of a variable, `None` when unset or empty.
    fn var(&self, name: &str) -> Option<String>;
}

/// The real environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).filter(|v| !v.is_empty()).cloned()
    }
}

/// Where the state directory came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateDirSource {
    /// `--state-dir`.
    CommandLine,
    /// `[state] dir`.
    ConfigFile,
    /// `$STATE_DIRECTORY` (systemd's `StateDirectory=`).
    StateDirectory,
    /// `$XDG_STATE_HOME/vmdeploy`.
    XdgStateHome,
    /// `~/.local/state/vmdeploy`.
    Home,
}

impl std::fmt::Display for StateDirSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StateDirSource::CommandLine => "from --state-dir",
            StateDirSource::ConfigFile => "from state.dir",
            StateDirSource::StateDirectory => "from $STATE_DIRECTORY",
            StateDirSource::XdgStateHome => "from $XDG_STATE_HOME, $STATE_DIRECTORY unset",
            StateDirSource::Home => "~/.local/state, $STATE_DIRECTORY and $XDG_STATE_HOME unset",
        })
    }
}

/// The state directory: `--state-dir`, else `[state] dir`, else `$STATE_DIRECTORY` (its first
/// entry: systemd passes a colon-separated list), else `$XDG_STATE_HOME/vmdeploy` (only when
/// absolute, as the XDG spec asks), else `$HOME/.local/state/vmdeploy`.
pub fn resolve_state_dir(
    command_line: Option<&Path>,
    config: Option<&Path>,
    env: &dyn Env,
) -> Result<(PathBuf, StateDirSource), ConfigError> {
    if let Some(dir) = command_line {
        return Ok((dir.to_path_buf(), StateDirSource::CommandLine));
    }
    if let Some(dir) = config {
        return Ok((dir.to_path_buf(), StateDirSource::ConfigFile));
    }
    if let Some(list) = env.var("STATE_DIRECTORY") {
        if let Some(first) = list.split(':').find(|s| !s.is_empty()) {
            return Ok((PathBuf::from(first), StateDirSource::StateDirectory));
        }
    }
    if let Some(xdg) = env.var("XDG_STATE_HOME") {
        let xdg = PathBuf::from(xdg);
        if xdg.is_absolute() {
            return Ok((xdg.join(STATE_SUBDIR), StateDirSource::XdgStateHome));
        }
    }
    if let Some(home) = env.var("HOME") {
        return Ok((
            PathBuf::from(home).join(".local/state").join(STATE_SUBDIR),
            StateDirSource::Home,
        ));
    }
    Err(ConfigError::new(
        keys::STATE_DIR,
        "no state directory: none of --state-dir, state.dir, $STATE_DIRECTORY, \
         $XDG_STATE_HOME or $HOME is set",
    ))
}

// ---------------------------------------------------------------------------------------------
// What serve runs with.

/// A default `serve` fell back to, for the first log lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fallback {
    /// The key that was not set.
    pub key: &'static str,
    /// What was used instead, and why.
    pub value: String,
}

/// The API's TLS after checking.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiTls {
    /// Plain HTTP.
    Off,
    /// Generated in `<state>/tls`.
    Auto,
    /// The operator's files.
    Files(TlsFiles),
}

/// The object store after checking.
#[derive(Debug)]
pub enum ObjectsSettings {
    /// The built-in store.
    Builtin {
        /// Its directory.
        root: PathBuf,
        /// Where it listens.
        listen: SocketAddr,
        /// The URL BMCs reach it at (`None`: its bound address).
        public_url: Option<String>,
        /// Its own certificate, when configured.
        tls: Option<TlsFiles>,
    },
    /// Swift.
    Swift(SwiftSection),
}

/// iLO defaults for nodes whose `driver_info` does not set them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IloDefaults {
    /// `client_port` (443).
    pub client_port: u16,
    /// `client_timeout` (60 s).
    pub client_timeout: Duration,
    /// `verify_ca` (true).
    pub verify_ca: VerifyCa,
}

impl IloDefaults {
    /// The same defaults as the node-level parser takes them.
    pub fn for_nodes(&self) -> crate::node::driver_info::IloDefaults {
        use crate::drivers::ilo::TlsVerify;
        crate::node::driver_info::IloDefaults {
            port: self.client_port,
            timeout: self.client_timeout,
            verify: match &self.verify_ca {
                VerifyCa::Enabled(true) => TlsVerify::System,
                VerifyCa::Enabled(false) => TlsVerify::Insecure,
                VerifyCa::File(path) => TlsVerify::CaFile(path.clone()),
            },
        }
    }
}

/// Everything `serve` needs, checked, with defaults filled.
#[derive(Debug)]
pub struct Settings {
    /// The file it came from, if any.
    pub source: Option<PathBuf>,
    /// API listen addresses.
    pub listen: Vec<SocketAddr>,
    /// API TLS.
    pub tls: ApiTls,
    /// `api.public_url`.
    pub public_url: Option<String>,
    /// Largest request body.
    pub max_body: usize,
    /// SIGTERM grace period.
    pub shutdown_grace: Duration,
    /// Auth.
    pub auth: AuthStrategy,
    /// The htpasswd file of `http_basic`.
    pub htpasswd: Option<PathBuf>,
    /// The state directory and where it came from.
    pub state_dir: PathBuf,
    /// Where the state directory came from.
    pub state_dir_source: StateDirSource,
    /// The node store.
    pub store: StoreKind,
    /// The SQLite file.
    pub sqlite_path: PathBuf,
    /// The object store.
    pub objects: ObjectsSettings,
    /// iLO defaults.
    pub ilo: IloDefaults,
    /// `deploy.api_url` (`None`: derived from the bound API address at start).
    pub api_url: Option<String>,
    /// `deploy.deploy_helper_images_ttl`.
    pub deploy_helper_images_ttl: Duration,
    /// `deploy.deploy_callback_timeout`.
    pub deploy_callback_timeout: Duration,
    /// `deploy.agent_allow_plain_http`.
    pub agent_allow_plain_http: bool,
    /// `deploy.agent_call_timeout`.
    pub agent_call_timeout: Duration,
    /// `deploy.agent_power_off_wait`.
    pub agent_power_off_wait: Duration,
    /// `deploy.automated_clean`.
    pub automated_clean: bool,
    /// `deploy.power_sync_interval`.
    pub power_sync_interval: Duration,
    /// `deploy.container`.
    pub container: String,
    /// `deploy.conductor_name`.
    pub conductor_name: String,
    /// `deploy.boot_loaders_dir`: read only when a boot ISO is built, so it may be missing.
    pub boot_loaders_dir: PathBuf,
    /// `deploy.boot_iso_append` (trimmed; empty: none).
    pub boot_iso_append: String,
    /// `deploy.boot_iso_ttl`.
    pub boot_iso_ttl: Duration,
    /// `deploy.iscsi_portal_port`.
    pub iscsi_portal_port: u16,
    /// `deploy.iscsi_done_port`.
    pub iscsi_done_port: u16,
    /// `deploy.iscsi_chap_user` and `iscsi_chap_secret`.
    pub iscsi_chap: Option<crate::deploy::IscsiChap>,
    /// `images.cache_dir`.
    pub image_cache_dir: PathBuf,
    /// `images.cache_limit`, bytes.
    pub image_cache_limit: u64,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter.
    pub log_level: String,
    /// `[netboot]`; `None`: the network boot service is off.
    pub netboot: Option<netboot::NetbootSettings>,
    /// The defaults used, in the order they were decided.
    pub fallbacks: Vec<Fallback>,
}

/// iLO's HTTPS port.
pub const DEFAULT_ILO_PORT: u16 = 443;
/// One iLO call (Ironic's `ilo.client_timeout`).
pub const DEFAULT_ILO_TIMEOUT: Duration = Duration::from_secs(60);
/// Ironic's `deploy_callback_timeout`.
pub const DEFAULT_CALLBACK_TIMEOUT: Duration = Duration::from_secs(1800);
/// Ironic's `deploy_helper_images_ttl` (10 min).
pub const DEFAULT_HELPER_TTL: Duration = Duration::from_secs(600);
/// One agent command call.
pub const DEFAULT_AGENT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Ironic's `sync_power_state_interval`.
pub const DEFAULT_POWER_SYNC: Duration = Duration::from_secs(60);
/// The container of floppies and ISOs.
pub const DEFAULT_CONTAINER: &str = "vmdeploy";

fn parse_addr(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse::<SocketAddr>().map_err(|_| {
        ConfigError::new(
            key,
            format!(
                "{value:?} is not an ip:port address (e.g. \"127.0.0.1:6385\", \"[::1]:6385\")"
            ),
        )
    })
}

fn seconds(key: &str, value: Option<u64>, default: Duration) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(0) => Err(ConfigError::new(key, "must be at least 1 second")),
        Some(s) => Ok(Duration::from_secs(s)),
    }
}

fn port(key: &str, value: Option<u16>, default: u16) -> Result<u16, ConfigError> {
    match value {
        None => Ok(default),
        Some(0) => Err(ConfigError::new(key, "must be a port number, 1-65535")),
        Some(p) => Ok(p),
    }
}

fn check_url(key: &str, value: &str) -> Result<(), ConfigError> {
    let url = url::Url::parse(value)
        .map_err(|e| ConfigError::new(key, format!("{value:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ConfigError::new(
            key,
            format!("{value:?}: an http:// or https:// URL with a host is needed"),
        ));
    }
    Ok(())
}

fn check_file(key: &str, path: &Path) -> Result<(), ConfigError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(_) => Err(ConfigError::new(
            key,
            format!("{} is not a file", path.display()),
        )),
        Err(e) => Err(ConfigError::new(
            key,
            format!("cannot read {}: {e}", path.display()),
        )),
    }
}

/// The host name, for certificate names and the conductor's name (`/proc`, no libc call).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

impl Settings {
    /// Checks `file` (`None`: no configuration file) and fills the defaults. `source` is the
    /// file's path, `state_dir` the `--state-dir` option. Files named by the configuration must
    /// exist; their contents are loaded later ([`crate::service::tls`], [`crate::service::auth`]).
    pub fn resolve(
        file: ConfigFile,
        source: Option<&Path>,
        state_dir: Option<&Path>,
        env: &dyn Env,
    ) -> Result<Settings, ConfigError> {
        let mut fallbacks = Vec::new();
        let api = file.api;

        let listen = match &api.listen {
            None => {
                fallbacks.push(Fallback {
                    key: keys::API_LISTEN,
                    value: format!("{DEFAULT_LISTEN} (loopback only)"),
                });
                vec![DEFAULT_LISTEN]
            }
            Some(list) if list.is_empty() => {
                return Err(ConfigError::new(
                    keys::API_LISTEN,
                    "empty: give at least one ip:port",
                ))
            }
            Some(list) => list
                .iter()
                .map(|s| parse_addr(keys::API_LISTEN, s))
                .collect::<Result<Vec<_>, _>>()?,
        };

        let tls = match api.tls {
            TlsSetting::Off => {
                if api.listen.is_none() {
                    fallbacks.push(Fallback {
                        key: keys::API_TLS,
                        value: "off (plain HTTP on loopback)".into(),
                    });
                }
                ApiTls::Off
            }
            TlsSetting::Auto => ApiTls::Auto,
            TlsSetting::Files(files) => {
                check_file(keys::API_TLS_CERT, &files.cert)?;
                check_file(keys::API_TLS_KEY, &files.key)?;
                if let Some(ca) = &files.ca {
                    check_file(keys::API_TLS_CA, ca)?;
                }
                ApiTls::Files(files)
            }
        };

        if tls == ApiTls::Off && !api.insecure_listen_without_tls {
            if let Some(addr) = listen.iter().find(|a| !a.ip().is_loopback()) {
                return Err(ConfigError::new(
                    keys::API_LISTEN,
                    format!(
                        "{addr} is not a loopback address and TLS is off: set {} = \"auto\" (or a \
                         certificate), or {} = true to serve plain HTTP beyond this host",
                        keys::API_TLS,
                        keys::API_INSECURE
                    ),
                ));
            }
        }

        if let Some(url) = &api.public_url {
            check_url(keys::API_PUBLIC_URL, url)?;
        }

        let max_body = match api.max_body {
            None => DEFAULT_MAX_BODY,
            Some(0) => return Err(ConfigError::new(keys::API_MAX_BODY, "must be above 0")),
            Some(n) => n,
        };
        let max_body = usize::try_from(max_body)
            .map_err(|_| ConfigError::new(keys::API_MAX_BODY, "too large"))?;
        let shutdown_grace = match api.shutdown_grace {
            None => DEFAULT_SHUTDOWN_GRACE,
            Some(s) => Duration::from_secs(s),
        };

        let auth = file.auth.strategy;
        let htpasswd = match (auth, file.auth.htpasswd) {
            (AuthStrategy::HttpBasic, Some(path)) => {
                check_file(keys::AUTH_HTPASSWD, &path)?;
                Some(path)
            }
            (AuthStrategy::HttpBasic, None) => {
                return Err(ConfigError::new(
                    keys::AUTH_HTPASSWD,
                    "auth.strategy = \"http_basic\" needs an htpasswd file with bcrypt hashes \
                     (htpasswd -B -c FILE USER)",
                ))
            }
            (AuthStrategy::Noauth, path) => {
                if path.is_some() {
                    return Err(ConfigError::new(
                        keys::AUTH_HTPASSWD,
                        "set, but auth.strategy is \"noauth\": set auth.strategy = \"http_basic\" \
                         or remove it",
                    ));
                }
                fallbacks.push(Fallback {
                    key: keys::AUTH_STRATEGY,
                    value: "noauth (every caller may use the API)".into(),
                });
                None
            }
        };

        let (state_dir, state_dir_source) =
            resolve_state_dir(state_dir, file.state.dir.as_deref(), env)?;
        if !matches!(
            state_dir_source,
            StateDirSource::CommandLine | StateDirSource::ConfigFile
        ) {
            fallbacks.push(Fallback {
                key: keys::STATE_DIR,
                value: format!("{} ({state_dir_source})", state_dir.display()),
            });
        }
        if !state_dir.is_absolute() {
            return Err(ConfigError::new(
                keys::STATE_DIR,
                format!("{} is not an absolute path", state_dir.display()),
            ));
        }

        let store = file.store.kind;
        let sqlite_path = state_dir.join(SQLITE_FILE);
        fallbacks.push(Fallback {
            key: keys::STORE_KIND,
            value: format!("sqlite at {}", sqlite_path.display()),
        });

        let objects = match file.objects.kind {
            ObjectsKind::Builtin => {
                let builtin = file.objects.builtin;
                let listen = match &builtin.listen {
                    Some(s) => parse_addr(keys::BUILTIN_LISTEN, s)?,
                    None => {
                        fallbacks.push(Fallback {
                            key: keys::BUILTIN_LISTEN,
                            value: format!("{DEFAULT_BUILTIN_LISTEN} (loopback, a free port)"),
                        });
                        DEFAULT_BUILTIN_LISTEN
                    }
                };
                if let Some(url) = &builtin.public_url {
                    check_url(keys::BUILTIN_PUBLIC_URL, url)?;
                    if !url.starts_with("https://") {
                        return Err(ConfigError::new(
                            keys::BUILTIN_PUBLIC_URL,
                            "the built-in store serves HTTPS only (the floppy carries secrets)",
                        ));
                    }
                }
                if let Some(files) = &builtin.tls {
                    check_file(keys::BUILTIN_TLS, &files.cert)?;
                    check_file(keys::BUILTIN_TLS, &files.key)?;
                }
                fallbacks.push(Fallback {
                    key: keys::OBJECTS_KIND,
                    value: format!("builtin at {}", state_dir.join(OBJECTS_DIR).display()),
                });
                ObjectsSettings::Builtin {
                    root: state_dir.join(OBJECTS_DIR),
                    listen,
                    public_url: builtin.public_url,
                    tls: builtin.tls,
                }
            }
            ObjectsKind::Swift => {
                let swift = file.objects.swift.ok_or_else(|| {
                    ConfigError::new(
                        "objects.swift",
                        "objects.kind = \"swift\" needs an [objects.swift] table (auth_url, \
                         user, key)",
                    )
                })?;
                check_url(keys::SWIFT_AUTH_URL, &swift.auth_url)?;
                if !matches!(swift.auth_version, 1 | 3) {
                    return Err(ConfigError::new(
                        keys::SWIFT_AUTH_VERSION,
                        "1 (tempauth) or 3 (Keystone)",
                    ));
                }
                if swift.auth_version == 3 && swift.project.is_none() {
                    return Err(ConfigError::new(
                        keys::SWIFT_PROJECT,
                        "Keystone (auth_version = 3) needs a project",
                    ));
                }
                if let Some(VerifyCa::File(ca)) = &swift.verify_ca {
                    check_file(keys::SWIFT_VERIFY_CA, ca)?;
                }
                if swift.timeout == Some(0) {
                    return Err(ConfigError::new(
                        keys::SWIFT_TIMEOUT,
                        "must be at least 1 second",
                    ));
                }
                ObjectsSettings::Swift(swift)
            }
        };

        let ilo = IloDefaults {
            client_port: match file.ilo.client_port {
                Some(0) => return Err(ConfigError::new(keys::ILO_CLIENT_PORT, "must be above 0")),
                Some(p) => p,
                None => DEFAULT_ILO_PORT,
            },
            client_timeout: seconds(
                keys::ILO_CLIENT_TIMEOUT,
                file.ilo.client_timeout,
                DEFAULT_ILO_TIMEOUT,
            )?,
            verify_ca: match file.ilo.verify_ca {
                Some(VerifyCa::File(path)) => {
                    check_file(keys::ILO_VERIFY_CA, &path)?;
                    VerifyCa::File(path)
                }
                Some(v) => v,
                None => VerifyCa::Enabled(true),
            },
        };

        let deploy = file.deploy;
        if let Some(url) = &deploy.api_url {
            check_url(keys::DEPLOY_API_URL, url)?;
        }
        let conductor_name = match deploy.conductor_name {
            Some(n) if n.trim().is_empty() => {
                return Err(ConfigError::new(keys::DEPLOY_CONDUCTOR_NAME, "empty"))
            }
            Some(n) => n,
            None => host_name(),
        };

        let boot_loaders_dir = match deploy.boot_loaders_dir {
            Some(dir) if !dir.is_absolute() => {
                return Err(ConfigError::new(
                    keys::DEPLOY_BOOT_LOADERS_DIR,
                    format!("{} is not an absolute path", dir.display()),
                ))
            }
            Some(dir) => dir,
            None => state_dir.join(BOOT_LOADERS_DIR),
        };
        let boot_iso_append = deploy
            .boot_iso_append
            .as_deref()
            .map(str::trim)
            .unwrap_or_default()
            .to_string();
        if boot_iso_append.contains(['\n', '\r']) {
            return Err(ConfigError::new(
                keys::DEPLOY_BOOT_ISO_APPEND,
                "a kernel command line is one line",
            ));
        }
        let iscsi_chap = iscsi_chap(deploy.iscsi_chap_user, deploy.iscsi_chap_secret)?;
        let image_cache_dir = file
            .images
            .cache_dir
            .unwrap_or_else(|| state_dir.join(IMAGES_DIR));
        if !image_cache_dir.is_absolute() {
            return Err(ConfigError::new(
                keys::IMAGES_CACHE_DIR,
                format!("{} is not an absolute path", image_cache_dir.display()),
            ));
        }
        let image_cache_limit = match file.images.cache_limit {
            None => crate::image_cache::DEFAULT_LIMIT,
            Some(0) => {
                return Err(ConfigError::new(
                    keys::IMAGES_CACHE_LIMIT,
                    "must be above 0",
                ))
            }
            Some(n) => n,
        };

        let log_level = file.log.level.unwrap_or_else(|| "info".to_string());
        // A bare word must be a level: EnvFilter would take "verbose" as a target name and log
        // nothing at all.
        let bare_word_not_a_level = !log_level.contains(['=', ','])
            && !matches!(
                log_level.to_ascii_lowercase().as_str(),
                "off" | "error" | "warn" | "info" | "debug" | "trace"
            );
        if bare_word_not_a_level || tracing_subscriber::EnvFilter::try_new(&log_level).is_err() {
            return Err(ConfigError::new(
                keys::LOG_LEVEL,
                format!("{log_level:?} is not a level (error, warn, info, debug, trace) or filter"),
            ));
        }

        let netboot = netboot::resolve(file.netboot, &state_dir)?;
        Ok(Settings {
            source: source.map(Path::to_path_buf),
            listen,
            tls,
            public_url: api.public_url,
            max_body,
            shutdown_grace,
            auth,
            htpasswd,
            state_dir,
            state_dir_source,
            store,
            sqlite_path,
            objects,
            ilo,
            api_url: deploy.api_url,
            deploy_helper_images_ttl: seconds(
                keys::DEPLOY_HELPER_TTL,
                deploy.deploy_helper_images_ttl,
                DEFAULT_HELPER_TTL,
            )?,
            deploy_callback_timeout: seconds(
                keys::DEPLOY_CALLBACK_TIMEOUT,
                deploy.deploy_callback_timeout,
                DEFAULT_CALLBACK_TIMEOUT,
            )?,
            agent_allow_plain_http: deploy.agent_allow_plain_http,
            agent_call_timeout: seconds(
                keys::DEPLOY_AGENT_CALL_TIMEOUT,
                deploy.agent_call_timeout,
                DEFAULT_AGENT_CALL_TIMEOUT,
            )?,
            agent_power_off_wait: seconds(
                keys::DEPLOY_AGENT_POWER_OFF_WAIT,
                deploy.agent_power_off_wait,
                crate::deploy::agent::DEFAULT_AGENT_POWER_OFF_WAIT,
            )?,
            automated_clean: deploy.automated_clean,
            power_sync_interval: seconds(
                keys::DEPLOY_POWER_SYNC,
                deploy.power_sync_interval,
                DEFAULT_POWER_SYNC,
            )?,
            container: deploy
                .container
                .unwrap_or_else(|| DEFAULT_CONTAINER.to_string()),
            conductor_name,
            boot_loaders_dir,
            boot_iso_append,
            boot_iso_ttl: seconds(
                keys::DEPLOY_BOOT_ISO_TTL,
                deploy.boot_iso_ttl,
                crate::deploy::boot_iso::DEFAULT_TEMP_URL_TTL,
            )?,
            iscsi_portal_port: port(
                keys::DEPLOY_ISCSI_PORTAL_PORT,
                deploy.iscsi_portal_port,
                crate::deploy::ISCSI_PORT,
            )?,
            iscsi_done_port: port(
                keys::DEPLOY_ISCSI_DONE_PORT,
                deploy.iscsi_done_port,
                crate::deploy::DONE_PORT,
            )?,
            iscsi_chap,
            image_cache_dir,
            image_cache_limit,
            log_format: file.log.format,
            log_level,
            netboot,
            fallbacks,
        })
    }

    /// Whether the API speaks TLS.
    pub fn api_tls(&self) -> bool {
        self.tls != ApiTls::Off
    }
}

/// `deploy.iscsi_chap_user` and `iscsi_chap_secret`: both or neither. They go on the floppy,
/// whose values cannot hold white space (reference §1.4), and RFC 7143 §9.2.1 wants a CHAP
/// secret of at least 96 bits.
fn iscsi_chap(
    user: Option<String>,
    secret: Option<Secret>,
) -> Result<Option<crate::deploy::IscsiChap>, ConfigError> {
    let (user, secret) = match (user, secret) {
        (None, None) => return Ok(None),
        (Some(user), Some(secret)) => (user, secret),
        (Some(_), None) => {
            return Err(ConfigError::new(
                keys::DEPLOY_ISCSI_CHAP_SECRET,
                "missing: iscsi_chap_user needs a secret",
            ))
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                keys::DEPLOY_ISCSI_CHAP_USER,
                "missing: iscsi_chap_secret needs a user",
            ))
        }
    };
    if user.is_empty() || user.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ConfigError::new(
            keys::DEPLOY_ISCSI_CHAP_USER,
            "empty or contains white space (it goes on the ramdisk's floppy)",
        ));
    }
    let text = secret.expose();
    // The reasons never quote the secret.
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ConfigError::new(
            keys::DEPLOY_ISCSI_CHAP_SECRET,
            "contains white space (it goes on the ramdisk's floppy)",
        ));
    }
    if text.len() < 12 {
        return Err(ConfigError::new(
            keys::DEPLOY_ISCSI_CHAP_SECRET,
            format!(
                "{} bytes: a CHAP secret needs at least 12 (RFC 7143 §9.2.1)",
                text.len()
            ),
        ));
    }
    Ok(Some(crate::deploy::IscsiChap { user, secret }))
}

/// The API URL the ramdisk calls back when `deploy.api_url` is not set: `api.public_url`, else
/// the first bound address (an unspecified address `0.0.0.0` is replaced by the host name).
pub fn default_api_url(public_url: Option<&str>, bound: SocketAddr, tls: bool) -> String {
    if let Some(url) = public_url {
        return url.trim_end_matches('/').to_string();
    }
    let scheme = if tls { "https" } else { "http" };
    let host = match bound.ip() {
        IpAddr::V4(ip) if ip == Ipv4Addr::UNSPECIFIED => host_name(),
        IpAddr::V6(ip) if ip == Ipv6Addr::UNSPECIFIED => host_name(),
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    };
    format!("{scheme}://{host}:{}", bound.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn resolve(text: &str) -> Result<Settings, ConfigError> {
        let file = parse(text)?;
        Settings::resolve(file, None, None, &env(&[("HOME", "/home/op")]))
    }

    /// name, --state-dir, state.dir, environment, expected dir, expected source.
    type StateDirCase<'a> = (
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        &'a [(&'a str, &'a str)],
        &'a str,
        StateDirSource,
    );

    #[test]
    fn state_dir_order() {
        let cases: &[StateDirCase] = &[
            (
                "command line first",
                Some("/cli"),
                Some("/conf"),
                &[("STATE_DIRECTORY", "/sd"), ("HOME", "/h")],
                "/cli",
                StateDirSource::CommandLine,
            ),
            (
                "then the file",
                None,
                Some("/conf"),
                &[("STATE_DIRECTORY", "/sd")],
                "/conf",
                StateDirSource::ConfigFile,
            ),
            (
                "then systemd's, first of a list",
                None,
                None,
                &[("STATE_DIRECTORY", "/sd:/other"), ("XDG_STATE_HOME", "/x")],
                "/sd",
                StateDirSource::StateDirectory,
            ),
            (
                "then XDG",
                None,
                None,
                &[
                    ("STATE_DIRECTORY", ""),
                    ("XDG_STATE_HOME", "/x"),
                    ("HOME", "/h"),
                ],
                "/x/vmdeploy",
                StateDirSource::XdgStateHome,
            ),
            (
                "a relative XDG is ignored",
                None,
                None,
                &[("XDG_STATE_HOME", "rel"), ("HOME", "/h")],
                "/h/.local/state/vmdeploy",
                StateDirSource::Home,
            ),
            (
                "then home",
                None,
                None,
                &[("HOME", "/h")],
                "/h/.local/state/vmdeploy",
                StateDirSource::Home,
            ),
        ];
        for (name, cli, conf, vars, want, source) in cases {
            let got = resolve_state_dir(cli.map(Path::new), conf.map(Path::new), &env(vars))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(got, (PathBuf::from(want), *source), "{name}");
        }
        let err = resolve_state_dir(None, None, &env(&[])).expect_err("nothing set");
        assert_eq!(err.key, keys::STATE_DIR);
    }

    #[test]
    fn no_file_means_every_default() {
        let s = resolve("").expect("empty file");
        assert_eq!(s.listen, vec![DEFAULT_LISTEN]);
        assert_eq!(s.listen[0].to_string(), "127.0.0.1:6385");
        assert_eq!(s.tls, ApiTls::Off);
        assert_eq!(s.auth, AuthStrategy::Noauth);
        assert_eq!(s.max_body, 1024 * 1024);
        assert_eq!(s.shutdown_grace, Duration::from_secs(30));
        assert_eq!(s.state_dir, PathBuf::from("/home/op/.local/state/vmdeploy"));
        assert_eq!(s.sqlite_path, s.state_dir.join("vmdeploy.sqlite"));
        assert_eq!(s.deploy_callback_timeout, Duration::from_secs(1800));
        assert_eq!(s.deploy_helper_images_ttl, Duration::from_secs(600));
        assert_eq!(s.power_sync_interval, Duration::from_secs(60));
        assert!(!s.agent_allow_plain_http);
        assert!(!s.automated_clean);
        assert_eq!(s.ilo.client_port, 443);
        assert_eq!(s.ilo.verify_ca, VerifyCa::Enabled(true));
        assert_eq!(s.log_format, LogFormat::Human);
        assert_eq!(s.image_cache_dir, s.state_dir.join("images"));
        assert_eq!(s.image_cache_limit, 20 * 1024 * 1024 * 1024);
        match &s.objects {
            ObjectsSettings::Builtin { listen, root, .. } => {
                assert_eq!(*listen, DEFAULT_BUILTIN_LISTEN);
                assert_eq!(*root, s.state_dir.join("objects"));
            }
            other => panic!("builtin expected, got {other:?}"),
        }
        let fell_back: Vec<&str> = s.fallbacks.iter().map(|f| f.key).collect();
        for key in [
            keys::API_LISTEN,
            keys::API_TLS,
            keys::AUTH_STRATEGY,
            keys::STATE_DIR,
            keys::STORE_KIND,
            keys::OBJECTS_KIND,
            keys::BUILTIN_LISTEN,
        ] {
            assert!(fell_back.contains(&key), "{key} missing from {fell_back:?}");
        }
    }

    #[test]
    fn errors_name_the_key() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "unknown key",
                "[api]\nlisen = [\"127.0.0.1:1\"]\n",
                "api.lisen",
            ),
            ("unknown table", "[nope]\nx = 1\n", "nope"),
            ("bad type", "[api]\nmax_body = \"big\"\n", "api.max_body"),
            ("bad tls word", "[api]\ntls = \"on\"\n", "api.tls"),
            (
                "bad type inside a multi-line array",
                "[api]\nlisten = [\n  \"127.0.0.1:1\",\n  42,\n]\n",
                "api.listen",
            ),
            (
                "bad type in a sub-table",
                "[objects.builtin]\nlisten = 5\n",
                "objects.builtin.listen",
            ),
            (
                "unknown key in an inline table",
                "[api]\ntls = { cert = \"/c\", key = \"/k\", chain = \"/x\" }\n",
                "api.tls",
            ),
            (
                "bad address",
                "[api]\nlisten = [\"localhost\"]\n",
                "api.listen",
            ),
            (
                "non-loopback without TLS",
                "[api]\nlisten = [\"0.0.0.0:6385\"]\n",
                "api.listen",
            ),
            (
                "missing cert",
                "[api]\ntls = { cert = \"/nonexistent/c.pem\", key = \"/nonexistent/k.pem\" }\n",
                "api.tls.cert",
            ),
            (
                "basic without file",
                "[auth]\nstrategy = \"http_basic\"\n",
                "auth.htpasswd",
            ),
            (
                "bad strategy",
                "[auth]\nstrategy = \"keystone\"\n",
                "auth.strategy",
            ),
            (
                "zero timeout",
                "[deploy]\ndeploy_callback_timeout = 0\n",
                "deploy.deploy_callback_timeout",
            ),
            (
                "relative boot loaders dir",
                "[deploy]\nboot_loaders_dir = \"loaders\"\n",
                "deploy.boot_loaders_dir",
            ),
            (
                "zero image cache limit",
                "[images]\ncache_limit = 0\n",
                "images.cache_limit",
            ),
            (
                "relative image cache dir",
                "[images]\ncache_dir = \"images\"\n",
                "images.cache_dir",
            ),
            ("bad log level", "[log]\nlevel = \"loud\"\n", "log.level"),
            (
                "bad log filter",
                "[log]\nlevel = \"x=loudest\"\n",
                "log.level",
            ),
            (
                "swift without table",
                "[objects]\nkind = \"swift\"\n",
                "objects.swift",
            ),
            (
                "builtin over http",
                "[objects.builtin]\npublic_url = \"http://h:1\"\n",
                "objects.builtin.public_url",
            ),
        ];
        for (name, text, key) in cases {
            let err = resolve(text).expect_err(name);
            assert_eq!(err.key, *key, "{name}: {err}");
        }
        let err = resolve("# comment\n[api]\nlisen = 1\n").expect_err("unknown key");
        assert!(err.reason.ends_with("(line 3)"), "{err}");
        let err = resolve("[api]\nmax_body = \"x\"\n").expect_err("bad type");
        assert!(err.reason.ends_with("(line 2)"), "{err}");
    }

    #[test]
    fn the_words_allow_plain_http_beyond_loopback() {
        let s = resolve("[api]\nlisten = [\"0.0.0.0:6385\"]\ninsecure_listen_without_tls = true\n")
            .expect("allowed in so many words");
        assert_eq!(s.listen[0].to_string(), "0.0.0.0:6385");
        let s = resolve("[api]\nlisten = [\"0.0.0.0:6385\"]\ntls = \"auto\"\n").expect("auto TLS");
        assert_eq!(s.tls, ApiTls::Auto);
    }

    #[test]
    fn boot_loaders_dir_defaults_to_the_state_dir() {
        let s = resolve("").expect("defaults");
        assert_eq!(
            s.boot_loaders_dir,
            PathBuf::from("/home/op/.local/state/vmdeploy/boot-loaders")
        );
        let s = resolve("[deploy]\nboot_loaders_dir = \"/srv/loaders\"\n").expect("given");
        assert_eq!(s.boot_loaders_dir, PathBuf::from("/srv/loaders"));
    }

    #[test]
    fn boot_iso_settings_have_defaults_and_refuse_what_cannot_work() {
        let s = resolve("").expect("defaults");
        assert_eq!(s.boot_iso_append, "");
        assert_eq!(s.boot_iso_ttl, Duration::from_secs(86_400));
        let s =
            resolve("[deploy]\nboot_iso_append = \" console=ttyS0 nofb \"\nboot_iso_ttl = 900\n")
                .expect("given");
        assert_eq!(s.boot_iso_append, "console=ttyS0 nofb");
        assert_eq!(s.boot_iso_ttl, Duration::from_secs(900));
        assert_eq!((s.iscsi_portal_port, s.iscsi_done_port), (3260, 10000));
        let s = resolve("[deploy]\niscsi_portal_port = 13260\niscsi_done_port = 20000\n")
            .expect("ports");
        assert_eq!((s.iscsi_portal_port, s.iscsi_done_port), (13260, 20000));
        for bad in ["iscsi_portal_port = 0", "iscsi_done_port = 70000"] {
            let err = resolve(&format!("[deploy]\n{bad}\n")).expect_err(bad);
            assert!(err.to_string().contains("iscsi_"), "{bad}: {err}");
        }
        let err = resolve("[deploy]\nboot_iso_ttl = 0\n").expect_err("zero");
        assert!(err.to_string().contains(keys::DEPLOY_BOOT_ISO_TTL), "{err}");
        let err = resolve("[deploy]\nboot_iso_append = \"a\\nb\"\n").expect_err("two lines");
        assert!(
            err.to_string().contains(keys::DEPLOY_BOOT_ISO_APPEND),
            "{err}"
        );
    }

    #[test]
    fn iscsi_chap_is_both_keys_or_neither_and_its_secret_is_never_shown() {
        let s = resolve("").expect("defaults");
        assert!(s.iscsi_chap.is_none());
        let s = resolve(
            "[deploy]\niscsi_chap_user = \"deployer\"\niscsi_chap_secret = \"chap-secret-4567\"\n",
        )
        .expect("both given");
        let chap = s.iscsi_chap.as_ref().expect("CHAP configured");
        assert_eq!(chap.user, "deployer");
        assert_eq!(chap.secret.expose(), "chap-secret-4567");
        assert!(!format!("{s:?}").contains("chap-secret-4567"));
        for (text, key, words) in [
            (
                "[deploy]\niscsi_chap_user = \"deployer\"\n",
                keys::DEPLOY_ISCSI_CHAP_SECRET,
                "needs a secret",
            ),
            (
                "[deploy]\niscsi_chap_secret = \"chap-secret-4567\"\n",
                keys::DEPLOY_ISCSI_CHAP_USER,
                "needs a user",
            ),
            (
                "[deploy]\niscsi_chap_user = \"deployer\"\niscsi_chap_secret = \"short-5\"\n",
                keys::DEPLOY_ISCSI_CHAP_SECRET,
                "at least 12",
            ),
            (
                "[deploy]\niscsi_chap_user = \"deployer\"\niscsi_chap_secret = \"chap secret 4567\"\n",
                keys::DEPLOY_ISCSI_CHAP_SECRET,
                "white space",
            ),
            (
                "[deploy]\niscsi_chap_user = \"de ployer\"\niscsi_chap_secret = \"chap-secret-4567\"\n",
                keys::DEPLOY_ISCSI_CHAP_USER,
                "white space",
            ),
        ] {
            let err = resolve(text).expect_err(text);
            assert_eq!(err.key, key, "{text}");
            assert!(err.reason.contains(words), "{text}: {err}");
            assert!(!err.to_string().contains("secret 4567"), "{err}");
            assert!(!err.to_string().contains("short-5"), "{err}");
        }
    }

    #[test]
    fn the_example_file_parses_and_names_every_key() {
        let text = include_str!("../../vmdeploy-conductor.example.toml");
        parse(text).expect("the example parses");
        // Keys may appear commented out; each must be written as `name =` under its table.
        for key in keys::ALL {
            let (table, name) = key.rsplit_once('.').expect("dotted");
            let (table, name) = match table {
                // api.tls.cert etc. are inline-table members.
                "api.tls" => ("api", name),
                t => (t, name),
            };
            assert!(
                text.contains(&format!("[{table}]")),
                "table [{table}] of {key} missing from the example"
            );
            assert!(
                text.contains(&format!("{name} =")),
                "{key} missing from the example"
            );
        }
    }

    #[test]
    fn api_url_from_the_bound_address() {
        let bound: SocketAddr = "127.0.0.1:41000".parse().expect("addr");
        assert_eq!(
            default_api_url(None, bound, false),
            "http://127.0.0.1:41000"
        );
        assert_eq!(
            default_api_url(None, bound, true),
            "https://127.0.0.1:41000"
        );
        assert_eq!(
            default_api_url(Some("https://c.example:6385/"), bound, true),
            "https://c.example:6385"
        );
        let v6: SocketAddr = "[::1]:6385".parse().expect("addr");
        assert_eq!(default_api_url(None, v6, false), "http://[::1]:6385");
    }
}
