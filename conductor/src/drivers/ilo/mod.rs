//! iLO clients: RIBCL over HTTPS (iLO 4) and Redfish (iLO 5/6 and other Redfish BMCs), and the
//! choice between them for one node.
//!
//! # Design
//! [`IloClient`] is an enum of the two clients (docs/style.md §2: an enum when there are few
//! strategies) and implements [`Power`], [`Management`], [`VirtualMedia`] and [`Inventory`] by
//! delegation. It is built from an [`IloConfig`]: the node's `driver_info` is read and checked
//! above it, once (`crate::node::driver_info`). The protocol comes from `ilo_protocol`
//! (`ribcl`, `redfish` or `auto`). `auto` asks the BMC's unauthenticated endpoints which
//! generation it is and whether it speaks Redfish ([`detect`]): an iLO 4 is driven over RIBCL,
//! iLO 5 and later and other Redfish BMCs over Redfish. The model string does not decide.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::{
    BmcInfo, BootDevice, BootEntry, BootMode, DriverError, FirmwareLogEntry, Health, Inventory,
    Licence, Management, Power, PowerAction, PowerState, Secret, SupportedBootModes, VirtualMedia,
    VmediaBootOption, VmediaDevice, VmediaStatus,
};

pub mod cli;
pub mod detect;
pub mod http;
pub mod probe;
pub mod redfish;
pub mod ribcl;
#[cfg(test)]
pub(crate) mod test_server;

pub use http::{RetryPolicy, TlsVerify};

/// Which protocol to speak to a BMC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// RIBCL (iLO 2-4; iLO 5 while RIBCL is enabled).
    Ribcl,
    /// Redfish.
    Redfish,
    /// Ask the BMC ([`detect`]) and choose.
    #[default]
    Auto,
}

impl FromStr for Protocol {
    type Err = DriverError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ribcl" => Ok(Protocol::Ribcl),
            "redfish" => Ok(Protocol::Redfish),
            "auto" | "" => Ok(Protocol::Auto),
            other => Err(DriverError::InvalidRequest(format!(
                "unknown iLO protocol {other:?} (ribcl, redfish or auto)"
            ))),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Ribcl => "ribcl",
            Protocol::Redfish => "redfish",
            Protocol::Auto => "auto",
        })
    }
}

/// `client_port` default (docs/architecture.md §3).
pub const DEFAULT_PORT: u16 = 443;
/// `client_timeout` default, seconds (docs/architecture.md §3).
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;

/// How to reach and log in to one BMC. `Debug` masks the password.
#[derive(Debug, Clone)]
pub struct IloConfig {
    /// `HOST` or `HOST:PORT` (`[v6]:PORT` for IPv6).
    pub address: String,
    /// Port when `address` has none.
    pub port: u16,
    /// Login name.
    pub username: String,
    /// Password.
    pub password: Secret,
    /// Certificate checking.
    pub tls: TlsVerify,
    /// Bound on each operation, retries included (`client_timeout`).
    pub timeout: Duration,
    /// Protocol choice.
    pub protocol: Protocol,
    /// Retries of transient failures.
    pub retry: RetryPolicy,
    /// The Redfish ComputerSystem to drive, by path (`redfish_system_id`); `None`: the first
    /// member of the Systems collection.
    pub redfish_system: Option<String>,
    /// Where a Redfish client takes and keeps its session (the conductor's cache, one session
    /// per BMC and user); `None`: each client logs in for itself and out at
    /// [`redfish::RedfishClient::logout`] (the command-line tool).
    pub redfish_sessions: Option<redfish::RedfishSessions>,
}

impl IloConfig {
    /// A config with the defaults of docs/architecture.md §3.
    pub fn new(address: impl Into<String>, username: impl Into<String>, password: Secret) -> Self {
        Self {
            address: address.into(),
            port: DEFAULT_PORT,
            username: username.into(),
            password,
            tls: TlsVerify::System,
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
            protocol: Protocol::Auto,
            retry: http::DEFAULT_RETRY,
            redfish_system: None,
            redfish_sessions: None,
        }
    }

    /// `https://host:port`, checked.
    pub fn base_url(&self) -> Result<String, DriverError> {
        let address = self.address.trim();
        if address.is_empty() || address.contains('/') || address.contains('@') {
            return Err(DriverError::InvalidRequest(format!(
                "invalid iLO address {address:?}: expected HOST or HOST:PORT"
            )));
        }
        let has_port = match address.rsplit_once(':') {
            Some((host, port)) => {
                // A bare IPv6 address has colons but no port.
                (!host.contains(':') || host.ends_with(']')) && !port.is_empty()
            }
            None => false,
        };
        let candidate = if has_port {
            format!("https://{address}")
        } else if address.contains(':') && !address.starts_with('[') {
            format!("https://[{address}]:{}", self.port)
        } else {
            format!("https://{address}:{}", self.port)
        };
        let url = url::Url::parse(&candidate).map_err(|e| {
            DriverError::InvalidRequest(format!("invalid iLO address {address:?}: {e}"))
        })?;
        let host = url.host_str().ok_or_else(|| {
            DriverError::InvalidRequest(format!("invalid iLO address {address:?}: no host"))
        })?;
        let port = url.port_or_known_default().unwrap_or(self.port);
        Ok(format!("https://{host}:{port}"))
    }
}

/// The client for one node: RIBCL or Redfish.
#[derive(Debug, Clone)]
pub enum IloClient {
    /// RIBCL over HTTPS.
    Ribcl(ribcl::RibclClient),
    /// Redfish.
    Redfish(redfish::RedfishClient),
}

impl IloClient {
    /// Builds the client `config.protocol` names; for [`Protocol::Auto`] asks the iLO first.
    pub async fn connect(config: &IloConfig) -> Result<Self, DriverError> {
        match config.protocol {
            Protocol::Ribcl => Ok(IloClient::Ribcl(ribcl::RibclClient::new(config)?)),
            Protocol::Redfish => Ok(IloClient::Redfish(redfish::RedfishClient::new(config)?)),
            Protocol::Auto => {
                let detected = detect::detect(config).await?;
                match detect::choose(&detected) {
                    Protocol::Redfish => {
                        tracing::debug!(?detected, "using Redfish");
                        Ok(IloClient::Redfish(redfish::RedfishClient::new(config)?))
                    }
                    _ => {
                        tracing::debug!(?detected, "using RIBCL");
                        Ok(IloClient::Ribcl(ribcl::RibclClient::new(config)?))
                    }
                }
            }
        }
    }

    /// The protocol in use.
    pub fn protocol(&self) -> Protocol {
        match self {
            IloClient::Ribcl(_) => Protocol::Ribcl,
            IloClient::Redfish(_) => Protocol::Redfish,
        }
    }
}

macro_rules! delegate {
    ($self:ident, $method:ident ( $($arg:expr),* )) => {
        match $self {
            IloClient::Ribcl(c) => c.$method($($arg),*).await,
            IloClient::Redfish(c) => c.$method($($arg),*).await,
        }
    };
}

impl Power for IloClient {
    async fn power_state(&self) -> Result<PowerState, DriverError> {
        delegate!(self, power_state())
    }

    async fn set_power(&self, action: PowerAction) -> Result<Option<String>, DriverError> {
        delegate!(self, set_power(action))
    }
}

impl Management for IloClient {
    async fn one_time_boot(&self) -> Result<Option<BootDevice>, DriverError> {
        delegate!(self, one_time_boot())
    }

    async fn set_one_time_boot(&self, device: &BootDevice) -> Result<(), DriverError> {
        delegate!(self, set_one_time_boot(device))
    }

    async fn persistent_boot_entries(&self) -> Result<Vec<BootEntry>, DriverError> {
        delegate!(self, persistent_boot_entries())
    }

    async fn set_persistent_boot(&self, device: &BootDevice) -> Result<(), DriverError> {
        delegate!(self, set_persistent_boot(device))
    }

    async fn current_boot_mode(&self) -> Result<BootMode, DriverError> {
        delegate!(self, current_boot_mode())
    }

    async fn pending_boot_mode(&self) -> Result<BootMode, DriverError> {
        delegate!(self, pending_boot_mode())
    }

    async fn set_pending_boot_mode(&self, mode: BootMode) -> Result<(), DriverError> {
        delegate!(self, set_pending_boot_mode(mode))
    }

    async fn supported_boot_modes(&self) -> Result<SupportedBootModes, DriverError> {
        delegate!(self, supported_boot_modes())
    }

    async fn secure_boot_enabled(&self) -> Result<bool, DriverError> {
        delegate!(self, secure_boot_enabled())
    }

    async fn set_secure_boot(&self, enable: bool) -> Result<(), DriverError> {
        delegate!(self, set_secure_boot(enable))
    }

    async fn firmware_log(&self, limit: usize) -> Result<Vec<FirmwareLogEntry>, DriverError> {
        delegate!(self, firmware_log(limit))
    }
}

impl VirtualMedia for IloClient {
    async fn vmedia_status(&self, device: VmediaDevice) -> Result<VmediaStatus, DriverError> {
        delegate!(self, vmedia_status(device))
    }

    async fn insert_vmedia(&self, device: VmediaDevice, url: &str) -> Result<(), DriverError> {
        delegate!(self, insert_vmedia(device, url))
    }

    async fn eject_vmedia(&self, device: VmediaDevice) -> Result<(), DriverError> {
        delegate!(self, eject_vmedia(device))
    }

    async fn set_vmedia_status(
        &self,
        device: VmediaDevice,
        boot_option: VmediaBootOption,
        write_protect: Option<bool>,
    ) -> Result<(), DriverError> {
        delegate!(self, set_vmedia_status(device, boot_option, write_protect))
    }
}

impl Inventory for IloClient {
    async fn licences(&self) -> Result<Vec<Licence>, DriverError> {
        delegate!(self, licences())
    }

    async fn info(&self) -> Result<BmcInfo, DriverError> {
        delegate!(self, info())
    }

    async fn health(&self) -> Result<Health, DriverError> {
        delegate!(self, health())
    }
}

/// Leading number of a reading such as `"62 Watts"`, `"21"`, `"45%"`; `None` for `N/A`.
pub(crate) fn leading_number(text: &str) -> Option<f64> {
    let t = text.trim();
    let end = t
        .char_indices()
        .find(|(i, c)| !(c.is_ascii_digit() || *c == '.' || (*i == 0 && *c == '-')))
        .map(|(i, _)| i)
        .unwrap_or(t.len());
    t[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let cfg = |a: &str| IloConfig::new(a, "u", Secret::new("p"));
        assert_eq!(
            cfg("10.0.0.5").base_url().expect("ok"),
            "https://10.0.0.5:443"
        );
        assert_eq!(
            cfg("127.0.0.1:8443").base_url().expect("ok"),
            "https://127.0.0.1:8443"
        );
        assert_eq!(
            cfg("ilo.example:8443").base_url().expect("ok"),
            "https://ilo.example:8443"
        );
        assert_eq!(
            cfg("fe80::1").base_url().expect("ok"),
            "https://[fe80::1]:443"
        );
        assert_eq!(
            cfg("[fe80::1]:8443").base_url().expect("ok"),
            "https://[fe80::1]:8443"
        );
        for bad in ["", "http://x/", "a@b", "host:notaport"] {
            assert!(cfg(bad).base_url().is_err(), "{bad}");
        }
    }

    #[test]
    fn numbers_in_readings() {
        assert_eq!(leading_number("62 Watts"), Some(62.0));
        assert_eq!(leading_number("21"), Some(21.0));
        assert_eq!(leading_number("12.5%"), Some(12.5));
        assert_eq!(leading_number("N/A"), None);
        assert_eq!(leading_number(""), None);
    }
}
