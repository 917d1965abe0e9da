//! Configuration of an emulator process and of each emulated server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::backend::{Backend, InMemoryBackend};
use crate::profile::Profile;
use crate::state::{BootMode, License, SupportedBootModes};

/// The default product name: a Gen8, so proliantutils' `IloClient` stays on RIBCL for everything
/// (a name with "Gen9"/"Gen10" switches it to RIS/Redfish; docs/ilo-management.md §1.7).
pub const DEFAULT_PRODUCT: &str = "ProLiant DL380p Gen8";

/// Settings shared by every server of an emulator.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Login accepted by RIBCL and Redfish.
    pub username: String,
    /// Password accepted by RIBCL and Redfish.
    pub password: String,
    /// GET_PRODUCT_NAME.
    pub product: String,
    /// Installed licence.
    pub license: License,
    /// Boot mode of a fresh server.
    pub boot_mode: BootMode,
    /// Supported boot modes.
    pub supported_boot_modes: SupportedBootModes,
    /// Firmware identity, quirks and timings (`product` above overrides the identity's model).
    pub profile: Profile,
    /// Seconds the iLO's clock is ahead of (negative: behind) the host's, as its `Date`
    /// headers show (an iLO without NTP drifts).
    pub clock_skew_secs: i64,
    /// How each boot reads its virtual medium.
    pub boot_read: crate::media_fetch::BootRead,
}

impl ServerConfig {
    /// The defaults with `profile`, and the profile's model as the product name.
    pub fn with_profile(profile: Profile) -> Self {
        ServerConfig {
            product: profile.identity.product.into(),
            profile,
            ..ServerConfig::default()
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            username: "Administrator".into(),
            password: "password".into(),
            product: DEFAULT_PRODUCT.into(),
            license: License::Advanced,
            boot_mode: BootMode::Legacy,
            supported_boot_modes: SupportedBootModes::LegacyUefi,
            profile: Profile::lab(),
            clock_skew_secs: 0,
            boot_read: crate::media_fetch::BootRead::default(),
        }
    }
}

/// Where the TLS certificate comes from.
#[derive(Debug, Clone)]
pub enum TlsSource {
    /// PEM files.
    Pem {
        /// Certificate chain.
        cert: PathBuf,
        /// Private key.
        key: PathBuf,
    },
    /// A self-signed certificate (SAN = the listen IP) made at start; its PEM is written to
    /// `write_cert_to` when given.
    SelfSigned {
        /// Where to write the certificate PEM (for clients that verify).
        write_cert_to: Option<PathBuf>,
    },
}

/// Makes the backend of server `i`.
pub type BackendFactory = Arc<dyn Fn(usize) -> Arc<dyn Backend> + Send + Sync>;

/// An emulator: `servers` iLOs, server `i` on port `listen.port() + i` (or each on an ephemeral
/// port when the port is 0).
#[derive(Clone)]
pub struct EmulatorConfig {
    /// Address of server 0.
    pub listen: SocketAddr,
    /// Number of servers.
    pub servers: usize,
    /// Per-server settings.
    pub server: ServerConfig,
    /// TLS certificate.
    pub tls: TlsSource,
    /// Backend of each server.
    pub backend: BackendFactory,
}

impl std::fmt::Debug for EmulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatorConfig")
            .field("listen", &self.listen)
            .field("servers", &self.servers)
            .field("server", &self.server)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl EmulatorConfig {
    /// One in-memory server on an ephemeral loopback port with a self-signed certificate.
    pub fn loopback() -> Self {
        EmulatorConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            servers: 1,
            server: ServerConfig::default(),
            tls: TlsSource::SelfSigned {
                write_cert_to: None,
            },
            backend: Arc::new(|_| Arc::new(InMemoryBackend) as Arc<dyn Backend>),
        }
    }
}
