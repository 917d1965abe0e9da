//! What `serve` runs with after checking: [`Settings`] and its parts, and the [`Fallback`]s it
//! reports. [`Settings::resolve`], which builds it, is in `resolve.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::{netboot, AuthStrategy, StateDirSource, StoreKind, SwiftSection, TlsFiles, VerifyCa};
use crate::logging::LogFormat;

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
    /// The most records one list page holds.
    pub max_limit: usize,
    /// SIGTERM grace period.
    pub shutdown_grace: Duration,
    /// The API's connection limits and body deadline.
    pub api_limits: crate::service::listen::Limits,
    /// Failed call-back checks allowed per address and per node.
    pub callback_failures: crate::net::failed_checks::FailureLimits,
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
    /// The PostgreSQL server, when `store` is `Postgresql`.
    pub postgres: Option<crate::store::postgres::PostgresConfig>,
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
    /// `conductor.sync_power_state_workers`.
    pub sync_power_state_workers: usize,
    /// `conductor.conductor_group`.
    pub conductor_group: String,
    /// `conductor.heartbeat_interval`.
    pub heartbeat_interval: Duration,
    /// `conductor.heartbeat_timeout`.
    pub heartbeat_timeout: Duration,
    /// `conductor.internal_url` (`None`: from the API's first address once bound).
    pub internal_url: Option<String>,
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

impl Settings {
    /// Whether the API speaks TLS.
    pub fn api_tls(&self) -> bool {
        self.tls != ApiTls::Off
    }
}
