//! A node's `driver_info` for the iLO drivers (docs/architecture.md §3) and for Ironic's `redfish` hardware
//! type (its `redfish_*` keys), read and checked once, above the BMC clients: `crate::bmc`
//! builds its [`IloClient`] from the [`IloConfig`] read here, and the clients never see JSON.
//!
//! # Design
//! Ironic stores `driver_info` loosely typed: numbers often arrive as strings (`"443"`), and
//! `ilo_verify_ca` is a boolean, a boolean spelled as a string, or a CA bundle path. Each field
//! is read by its own small function, and every error names the field and says what was
//! expected, so an operator can fix the node with one `baremetal node set`. Fields other
//! drivers own (`ipmi_*`, `deploy_kernel`, ...) are left alone. Defaults the node leaves out
//! come from the conductor's configuration ([`IloDefaults`]).
//!
//! [`IloClient`]: crate::drivers::ilo::IloClient

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::drivers::ilo::{IloConfig, Protocol, TlsVerify, DEFAULT_PORT, DEFAULT_TIMEOUT_SECS};
use crate::drivers::{DriverError, Secret};
use crate::node::image_ref::ImageRef;

/// `driver_info` keys (docs/architecture.md §3; `ilo_protocol` is this project's own).
pub mod keys {
    /// iLO address: `HOST`, `HOST:PORT`, `[v6]:PORT`, or `https://` with one of those.
    pub const ADDRESS: &str = "ilo_address";
    /// Login name.
    pub const USERNAME: &str = "ilo_username";
    /// Password.
    pub const PASSWORD: &str = "ilo_password";
    /// HTTPS port of the iLO.
    pub const CLIENT_PORT: &str = "client_port";
    /// Seconds an iLO operation may take, retries included.
    pub const CLIENT_TIMEOUT: &str = "client_timeout";
    /// `true`, `false`, or the path of a CA bundle.
    pub const VERIFY_CA: &str = "ilo_verify_ca";
    /// The deploy ISO's image reference.
    pub const DEPLOY_ISO: &str = "ilo_deploy_iso";
    /// The node's serial console port.
    pub const CONSOLE_PORT: &str = "console_port";
    /// `ribcl`, `redfish` or `auto`.
    pub const PROTOCOL: &str = "ilo_protocol";
}

/// `driver_info` keys of Ironic's `redfish` hardware type, taken unchanged from Ironic.
pub mod redfish_keys {
    /// The BMC's URL: `https://HOST[:PORT]`, or `HOST[:PORT]` (https is assumed).
    pub const ADDRESS: &str = "redfish_address";
    /// Login name.
    pub const USERNAME: &str = "redfish_username";
    /// Password.
    pub const PASSWORD: &str = "redfish_password";
    /// `true`, `false`, or the path of a CA bundle.
    pub const VERIFY_CA: &str = "redfish_verify_ca";
    /// The path of the ComputerSystem to drive (`/redfish/v1/Systems/1`); optional when the
    /// BMC has one system.
    pub const SYSTEM_ID: &str = "redfish_system_id";
}

/// The `driver_info` keys a node's BMC settings were read from, for messages that tell the
/// operator which key to fix: an iLO node's `ilo_*` keys or a `redfish` node's `redfish_*` ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BmcKeys {
    /// What the BMC is called in messages (`iLO`, `Redfish BMC`).
    pub bmc: &'static str,
    /// The address key.
    pub address: &'static str,
    /// The key of the port, when the address does not carry it.
    pub port: Option<&'static str>,
    /// The login name key.
    pub username: &'static str,
    /// The password key.
    pub password: &'static str,
    /// The certificate-check key.
    pub verify_ca: &'static str,
    /// The key naming the Redfish system, where there is one.
    pub system_id: Option<&'static str>,
}

impl BmcKeys {
    /// The iLO drivers' keys.
    pub const ILO: BmcKeys = BmcKeys {
        bmc: "iLO",
        address: keys::ADDRESS,
        port: Some(keys::CLIENT_PORT),
        username: keys::USERNAME,
        password: keys::PASSWORD,
        verify_ca: keys::VERIFY_CA,
        system_id: None,
    };
    /// The `redfish` hardware type's keys.
    pub const REDFISH: BmcKeys = BmcKeys {
        bmc: "Redfish BMC",
        address: redfish_keys::ADDRESS,
        port: None,
        username: redfish_keys::USERNAME,
        password: redfish_keys::PASSWORD,
        verify_ca: redfish_keys::VERIFY_CA,
        system_id: Some(redfish_keys::SYSTEM_ID),
    };
}

/// A node's BMC settings, read from the keys of its driver: what [`IloClient::connect`] takes
/// and the keys they came from.
///
/// [`IloClient::connect`]: crate::drivers::ilo::IloClient::connect
#[derive(Debug, Clone)]
pub struct BmcDriverInfo {
    /// How to reach and log in to the BMC.
    pub config: IloConfig,
    /// The keys it was read from.
    pub keys: BmcKeys,
}

impl BmcDriverInfo {
    /// Reads the BMC settings of a node of `driver`. A `redfish` node is read from Ironic's
    /// `redfish_*` keys and spoken to over Redfish; one enrolled with `ilo_*` keys instead
    /// (before this conductor read Ironic's) is read from those, over Redfish unless
    /// `ilo_protocol` says otherwise. Every other driver is an iLO one: `ilo_*` keys.
    pub fn parse(
        driver: &str,
        driver_info: &Map<String, Value>,
        defaults: &IloDefaults,
    ) -> Result<Self, DriverInfoError> {
        let has = |key: &str| driver_info.get(key).is_some_and(|v| !v.is_null());
        if driver != "redfish" {
            return Ok(Self {
                config: IloDriverInfo::parse(driver_info, defaults)?.config,
                keys: BmcKeys::ILO,
            });
        }
        if has(keys::ADDRESS) && !has(redfish_keys::ADDRESS) {
            let mut config = IloDriverInfo::parse(driver_info, defaults)?.config;
            if !has(keys::PROTOCOL) {
                config.protocol = Protocol::Redfish;
            }
            return Ok(Self {
                config,
                keys: BmcKeys::ILO,
            });
        }
        Ok(Self {
            config: redfish_config(driver_info, defaults)?,
            keys: BmcKeys::REDFISH,
        })
    }
}

/// The client settings of a `redfish` node from Ironic's `redfish_*` keys. The port is the
/// address's own or https's (443): a URL names its port, so `client_port` is not read.
fn redfish_config(
    driver_info: &Map<String, Value>,
    defaults: &IloDefaults,
) -> Result<IloConfig, DriverInfoError> {
    let get = |key: &str| driver_info.get(key).filter(|v| !v.is_null());
    let address = address(
        redfish_keys::ADDRESS,
        get(redfish_keys::ADDRESS).ok_or(DriverInfoError::Missing {
            field: redfish_keys::ADDRESS,
        })?,
    )?;
    let username = text(redfish_keys::USERNAME, get(redfish_keys::USERNAME))?;
    let password = Secret::new(text(redfish_keys::PASSWORD, get(redfish_keys::PASSWORD))?);
    let mut config = IloConfig::new(address, username, password);
    config.protocol = Protocol::Redfish;
    config.timeout = match get(keys::CLIENT_TIMEOUT) {
        Some(v) => timeout(keys::CLIENT_TIMEOUT, v)?,
        None => defaults.timeout,
    };
    config.tls = match get(redfish_keys::VERIFY_CA) {
        Some(v) => verify_ca(redfish_keys::VERIFY_CA, v)?,
        None => defaults.verify.clone(),
    };
    config.redfish_system = get(redfish_keys::SYSTEM_ID)
        .map(|v| system_id(redfish_keys::SYSTEM_ID, v))
        .transpose()?;
    config.base_url().map_err(|e| match e {
        DriverError::InvalidRequest(reason) => invalid(redfish_keys::ADDRESS, reason),
        other => invalid(redfish_keys::ADDRESS, other.to_string()),
    })?;
    Ok(config)
}

/// A Redfish system's path (`/redfish/v1/Systems/1`), as Ironic's `redfish_system_id` holds it.
fn system_id(field: &'static str, value: &Value) -> Result<String, DriverInfoError> {
    let path = text(field, Some(value))?.trim().to_string();
    if !path.starts_with('/') || path.contains("://") || path.contains(char::is_whitespace) {
        return Err(invalid(
            field,
            format!("{path:?} is not a system's path: expected one like /redfish/v1/Systems/1"),
        ));
    }
    Ok(path)
}

/// The conductor's defaults for what a node leaves out (its `[ilo]` configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IloDefaults {
    /// `client_port` when the node has none.
    pub port: u16,
    /// `client_timeout` when the node has none.
    pub timeout: Duration,
    /// `ilo_verify_ca` when the node has none.
    pub verify: TlsVerify,
}

impl Default for IloDefaults {
    /// docs/architecture.md §3: port 443, 60 s, certificates checked against the system's trust store.
    fn default() -> Self {
        Self {
            port: DEFAULT_PORT,
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
            verify: TlsVerify::System,
        }
    }
}

/// What is wrong with a node's `driver_info`; each names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverInfoError {
    /// A required field is absent (or null).
    #[error("driver_info.{field} is required")]
    Missing {
        /// The key.
        field: &'static str,
    },
    /// A field has a value that cannot be used.
    #[error("driver_info.{field}: {reason}")]
    Invalid {
        /// The key.
        field: &'static str,
        /// What is wrong and what is expected.
        reason: String,
    },
}

impl DriverInfoError {
    /// The field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            DriverInfoError::Missing { field } | DriverInfoError::Invalid { field, .. } => field,
        }
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> DriverInfoError {
    DriverInfoError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// A node's iLO `driver_info`, checked. `Debug` masks the password.
#[derive(Debug, Clone)]
pub struct IloDriverInfo {
    /// How to reach and log in to the iLO; what `IloClient::connect` takes.
    pub config: IloConfig,
    /// The deploy ISO, if set.
    pub deploy_iso: Option<ImageRef>,
    /// The serial console port, if set.
    pub console_port: Option<u16>,
}

impl IloDriverInfo {
    /// Reads and checks `driver_info`; fields it leaves out take `defaults`.
    pub fn parse(
        driver_info: &Map<String, Value>,
        defaults: &IloDefaults,
    ) -> Result<Self, DriverInfoError> {
        let get = |key: &str| driver_info.get(key).filter(|v| !v.is_null());
        let client_port = match get(keys::CLIENT_PORT) {
            Some(v) => port(keys::CLIENT_PORT, v)?,
            None => defaults.port,
        };
        let address = address(
            keys::ADDRESS,
            get(keys::ADDRESS).ok_or(DriverInfoError::Missing {
                field: keys::ADDRESS,
            })?,
        )?;
        let username = text(keys::USERNAME, get(keys::USERNAME))?;
        let password = Secret::new(text(keys::PASSWORD, get(keys::PASSWORD))?);
        let mut config = IloConfig::new(address, username, password);
        config.port = client_port;
        config.timeout = match get(keys::CLIENT_TIMEOUT) {
            Some(v) => timeout(keys::CLIENT_TIMEOUT, v)?,
            None => defaults.timeout,
        };
        config.tls = match get(keys::VERIFY_CA) {
            Some(v) => verify_ca(keys::VERIFY_CA, v)?,
            None => defaults.verify.clone(),
        };
        if let Some(v) = get(keys::PROTOCOL) {
            config.protocol = protocol(keys::PROTOCOL, v)?;
        }
        // The address check of both clients, run here once so that a bad address is refused
        // at enrolment with the field's name rather than at the first power call.
        config.base_url().map_err(|e| match e {
            DriverError::InvalidRequest(reason) => invalid(keys::ADDRESS, reason),
            other => invalid(keys::ADDRESS, other.to_string()),
        })?;
        let deploy_iso = get(keys::DEPLOY_ISO)
            .map(|v| image_reference(keys::DEPLOY_ISO, v))
            .transpose()?;
        let console_port = get(keys::CONSOLE_PORT)
            .map(|v| port(keys::CONSOLE_PORT, v))
            .transpose()?;
        Ok(Self {
            config,
            deploy_iso,
            console_port,
        })
    }
}

/// A required non-empty string.
fn text(field: &'static str, value: Option<&Value>) -> Result<String, DriverInfoError> {
    match value {
        None => Err(DriverInfoError::Missing { field }),
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
        Some(Value::String(_)) => Err(invalid(field, "is empty")),
        Some(other) => Err(invalid(
            field,
            format!(
                "expected a string, got {}",
                vmdeploy_shared::json::kind(other)
            ),
        )),
    }
}

/// A whole number, given as a JSON number or a string holding one (Ironic stores strings).
fn whole_number(field: &'static str, value: &Value, what: &str) -> Result<u64, DriverInfoError> {
    let parsed = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    parsed.ok_or_else(|| invalid(field, format!("{value} is not {what}")))
}

fn port(field: &'static str, value: &Value) -> Result<u16, DriverInfoError> {
    let what = "a port number (1-65535)";
    let n = whole_number(field, value, what)?;
    u16::try_from(n)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| invalid(field, format!("{value} is not {what}")))
}

/// Longest `client_timeout` accepted: a day. Larger values are typos (milliseconds for seconds)
/// that would leave a task hanging instead of failing.
const MAX_TIMEOUT_SECS: u64 = 86_400;

fn timeout(field: &'static str, value: &Value) -> Result<Duration, DriverInfoError> {
    let what = format!("a whole number of seconds (1-{MAX_TIMEOUT_SECS})");
    let secs = whole_number(field, value, &what)?;
    if secs == 0 || secs > MAX_TIMEOUT_SECS {
        return Err(invalid(field, format!("{value} is not {what}")));
    }
    Ok(Duration::from_secs(secs))
}

/// `true`/`false` (JSON or string, any case) or a CA bundle path. The file is read when the
/// client is built, where an unreadable one is reported with its path.
fn verify_ca(field: &'static str, value: &Value) -> Result<TlsVerify, DriverInfoError> {
    match value {
        Value::Bool(true) => Ok(TlsVerify::System),
        Value::Bool(false) => Ok(TlsVerify::Insecure),
        Value::String(s) => {
            let s = s.trim();
            if s.eq_ignore_ascii_case("true") {
                Ok(TlsVerify::System)
            } else if s.eq_ignore_ascii_case("false") {
                Ok(TlsVerify::Insecure)
            } else if s.is_empty() {
                Err(invalid(
                    field,
                    "is empty: expected true, false or a CA file path",
                ))
            } else {
                Ok(TlsVerify::CaFile(PathBuf::from(s)))
            }
        }
        other => Err(invalid(
            field,
            format!(
                "expected true, false or a CA file path, got {}",
                vmdeploy_shared::json::kind(other)
            ),
        )),
    }
}

fn protocol(field: &'static str, value: &Value) -> Result<Protocol, DriverInfoError> {
    match value {
        Value::String(s) => s.parse().map_err(|_| {
            invalid(
                field,
                format!("unknown protocol {s:?}: expected ribcl, redfish or auto"),
            )
        }),
        other => Err(invalid(
            field,
            format!(
                "expected ribcl, redfish or auto, got {}",
                vmdeploy_shared::json::kind(other)
            ),
        )),
    }
}

/// The iLO address without a scheme. Operators paste `https://ilo.example/` from a browser; the
/// iLO only speaks HTTPS, so that scheme is dropped and any other one refused.
fn address(field: &'static str, value: &Value) -> Result<String, DriverInfoError> {
    let raw = text(field, Some(value))?;
    let trimmed = raw.trim();
    let Some((scheme, rest)) = trimmed.split_once("://") else {
        return Ok(trimmed.to_string());
    };
    if !scheme.eq_ignore_ascii_case("https") {
        return Err(invalid(
            field,
            format!("scheme {scheme:?} is not supported: the BMC is reached over https (give HOST or HOST:PORT)"),
        ));
    }
    let host = rest.strip_suffix('/').unwrap_or(rest);
    if host.is_empty() {
        return Err(invalid(field, "has no host"));
    }
    Ok(host.to_string())
}

/// An image reference ([`ImageRef`]'s forms).
fn image_reference(field: &'static str, value: &Value) -> Result<ImageRef, DriverInfoError> {
    ImageRef::parse(&text(field, Some(value))?).map_err(|e| invalid(field, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn base() -> Map<String, Value> {
        match json!({
            "ilo_address": "10.1.2.3", "ilo_username": "Administrator", "ilo_password": "s3cret",
        }) {
            Value::Object(m) => m,
            _ => unreachable!("a JSON object literal"),
        }
    }

    fn with(key: &str, value: Value) -> Map<String, Value> {
        let mut m = base();
        m.insert(key.to_string(), value);
        m
    }

    fn without(key: &str) -> Map<String, Value> {
        let mut m = base();
        m.remove(key);
        m
    }

    fn parse(m: &Map<String, Value>) -> Result<IloDriverInfo, DriverInfoError> {
        IloDriverInfo::parse(m, &IloDefaults::default())
    }

    #[test]
    fn minimal_info_takes_the_defaults() {
        let info = parse(&base()).expect("valid");
        assert_eq!(info.config.address, "10.1.2.3");
        assert_eq!(info.config.username, "Administrator");
        assert_eq!(info.config.password.expose(), "s3cret");
        assert_eq!(info.config.port, 443);
        assert_eq!(info.config.timeout, Duration::from_secs(60));
        assert_eq!(info.config.tls, TlsVerify::System);
        assert_eq!(info.config.protocol, Protocol::Auto);
        assert_eq!(info.deploy_iso, None);
        assert_eq!(info.console_port, None);
        assert_eq!(
            info.config.base_url().expect("checked"),
            "https://10.1.2.3:443"
        );

        let defaults = IloDefaults {
            port: 8443,
            timeout: Duration::from_secs(5),
            verify: TlsVerify::Insecure,
        };
        let info = IloDriverInfo::parse(&base(), &defaults).expect("valid");
        assert_eq!(info.config.port, 8443);
        assert_eq!(info.config.timeout, Duration::from_secs(5));
        assert_eq!(info.config.tls, TlsVerify::Insecure);
        // The node's own value wins over the default.
        let info = IloDriverInfo::parse(&with("client_port", json!(443)), &defaults).expect("ok");
        assert_eq!(info.config.port, 443);
    }

    #[test]
    fn password_never_prints() {
        let info = parse(&base()).expect("valid");
        let shown = format!("{info:?} {info:#?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("******"), "{shown}");
        // Nor does a wrong-typed password reach an error message.
        let err = parse(&with("ilo_password", json!(["s3cret"]))).expect_err("array");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn required_fields() {
        for key in ["ilo_address", "ilo_username", "ilo_password"] {
            assert_eq!(
                parse(&without(key)).expect_err(key),
                DriverInfoError::Missing {
                    field: key_static(key)
                },
            );
            let null = parse(&with(key, Value::Null)).expect_err(key);
            assert!(matches!(null, DriverInfoError::Missing { .. }), "{null}");
            for bad in [json!(""), json!("   "), json!(5), json!(true), json!({})] {
                let err = parse(&with(key, bad.clone())).expect_err(key);
                assert_eq!(err.field(), key, "{bad}: {err}");
                assert!(
                    err.to_string().starts_with(&format!("driver_info.{key}")),
                    "{err}"
                );
            }
        }
    }

    fn key_static(key: &str) -> &'static str {
        [keys::ADDRESS, keys::USERNAME, keys::PASSWORD]
            .into_iter()
            .find(|k| *k == key)
            .expect("a required key")
    }

    /// (value, expected outcome) per field: `Ok(rendered)` or `Err(())`.
    #[test]
    fn addresses() {
        let cases: &[(Value, Result<&str, ()>)] = &[
            (json!("10.0.0.5"), Ok("https://10.0.0.5:443")),
            (json!(" 10.0.0.5 "), Ok("https://10.0.0.5:443")),
            (json!("10.0.0.5:8443"), Ok("https://10.0.0.5:8443")),
            (json!("ilo.example"), Ok("https://ilo.example:443")),
            (json!("fe80::1"), Ok("https://[fe80::1]:443")),
            (json!("[fe80::1]:8443"), Ok("https://[fe80::1]:8443")),
            (json!("https://ilo.example"), Ok("https://ilo.example:443")),
            (
                json!("HTTPS://ilo.example:8443/"),
                Ok("https://ilo.example:8443"),
            ),
            (json!("http://ilo.example"), Err(())),
            (json!("ftp://ilo.example"), Err(())),
            (json!("https://"), Err(())),
            (json!("https://ilo.example/redfish/v1"), Err(())),
            (json!("ilo.example/x"), Err(())),
            (json!("admin@ilo.example"), Err(())),
            (json!("host:notaport"), Err(())),
            (json!("host:70000"), Err(())),
            (json!(""), Err(())),
            (json!(17), Err(())),
        ];
        for (value, want) in cases {
            let got = parse(&with("ilo_address", value.clone()));
            match (want, got) {
                (Ok(url), Ok(info)) => {
                    assert_eq!(info.config.base_url().expect("checked"), *url, "{value}")
                }
                (Err(()), Err(err)) => {
                    assert_eq!(err.field(), "ilo_address", "{value}: {err}");
                    assert!(!err.to_string().contains("invalid request"), "{err}");
                }
                (want, got) => panic!("{value}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn ports() {
        for key in ["client_port", "console_port"] {
            let cases: &[(Value, Option<u16>)] = &[
                (json!(443), Some(443)),
                (json!("8443"), Some(8443)),
                (json!(" 623 "), Some(623)),
                (json!(65535), Some(65535)),
                (json!(0), None),
                (json!("0"), None),
                (json!(65536), None),
                (json!(-1), None),
                (json!(443.5), None),
                (json!("443x"), None),
                (json!(""), None),
                (json!(true), None),
                (json!([443]), None),
            ];
            for (value, want) in cases {
                let got = parse(&with(key, value.clone()));
                match (want, got) {
                    (Some(p), Ok(info)) => {
                        let port = if key == "client_port" {
                            info.config.port
                        } else {
                            info.console_port.expect("set")
                        };
                        assert_eq!(port, *p, "{key} {value}");
                    }
                    (None, Err(err)) => {
                        assert_eq!(err.field(), key, "{value}: {err}");
                        assert!(err.to_string().contains("port"), "{err}");
                    }
                    (want, got) => panic!("{key} {value}: want {want:?}, got {got:?}"),
                }
            }
        }
    }

    #[test]
    fn timeouts() {
        let cases: &[(Value, Option<u64>)] = &[
            (json!(30), Some(30)),
            (json!("30"), Some(30)),
            (json!(86_400), Some(86_400)),
            (json!(0), None),
            (json!(86_401), None),
            (json!(-5), None),
            (json!(1.5), None),
            (json!("soon"), None),
            (json!(false), None),
        ];
        for (value, want) in cases {
            let got = parse(&with("client_timeout", value.clone()));
            match (want, got) {
                (Some(s), Ok(info)) => {
                    assert_eq!(info.config.timeout, Duration::from_secs(*s), "{value}")
                }
                (None, Err(err)) => assert_eq!(err.field(), "client_timeout", "{value}: {err}"),
                (want, got) => panic!("{value}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn verify_ca_values() {
        let cases: &[(Value, Option<TlsVerify>)] = &[
            (json!(true), Some(TlsVerify::System)),
            (json!(false), Some(TlsVerify::Insecure)),
            (json!("true"), Some(TlsVerify::System)),
            (json!("False"), Some(TlsVerify::Insecure)),
            (json!(" TRUE "), Some(TlsVerify::System)),
            (
                json!("/etc/vmdeploy/ilo-ca.pem"),
                Some(TlsVerify::CaFile("/etc/vmdeploy/ilo-ca.pem".into())),
            ),
            (json!(""), None),
            (json!(1), None),
            (json!(["/etc/ca.pem"]), None),
        ];
        for (value, want) in cases {
            let got = parse(&with("ilo_verify_ca", value.clone()));
            match (want, got) {
                (Some(tls), Ok(info)) => assert_eq!(info.config.tls, *tls, "{value}"),
                (None, Err(err)) => assert_eq!(err.field(), "ilo_verify_ca", "{value}: {err}"),
                (want, got) => panic!("{value}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn protocols() {
        let cases: &[(Value, Option<Protocol>)] = &[
            (json!("ribcl"), Some(Protocol::Ribcl)),
            (json!("Redfish"), Some(Protocol::Redfish)),
            (json!("auto"), Some(Protocol::Auto)),
            (json!("ipmi"), None),
            (json!(1), None),
        ];
        for (value, want) in cases {
            let got = parse(&with("ilo_protocol", value.clone()));
            match (want, got) {
                (Some(p), Ok(info)) => assert_eq!(info.config.protocol, *p, "{value}"),
                (None, Err(err)) => assert_eq!(err.field(), "ilo_protocol", "{value}: {err}"),
                (want, got) => panic!("{value}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn deploy_isos() {
        let good = [
            "http://images.example/deploy.iso",
            "https://images.example/deploy.iso",
            "file:///var/lib/vmdeploy/deploy.iso",
            "swift://vmdeploy/deploy.iso",
            "0b0b8d3e-8b4b-4b8e-9d43-3d2c1c8f8a11",
        ];
        for reference in good {
            let info = parse(&with("ilo_deploy_iso", json!(reference))).expect(reference);
            let shown = info.deploy_iso.as_ref().map(ImageRef::to_string);
            assert_eq!(shown.as_deref(), Some(reference));
        }
        let bad = [
            json!("ftp://images.example/deploy.iso"),
            json!("deploy.iso"),
            json!("http://"),
            json!(""),
            json!(42),
        ];
        for value in bad {
            let err = parse(&with("ilo_deploy_iso", value.clone())).expect_err("bad");
            assert_eq!(err.field(), "ilo_deploy_iso", "{value}: {err}");
        }
    }

    #[test]
    fn other_drivers_fields_are_left_alone() {
        let mut m = base();
        m.insert("ipmi_address".into(), json!({"odd": [1, 2]}));
        m.insert("deploy_kernel".into(), json!(null));
        assert!(parse(&m).is_ok());
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|f| json!(f)),
            any::<u64>().prop_map(|n| json!(n)),
            ".{0,24}".prop_map(Value::String),
            "[0-9 ]{0,6}".prop_map(Value::String),
            prop_oneof![
                Just("true"),
                Just("FALSE"),
                Just("https://"),
                Just("[::1]:"),
                Just("swift://"),
                Just("10.0.0.1:0"),
            ]
            .prop_map(|s| Value::String(s.to_string())),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(".{0,8}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn arb_driver_info() -> impl Strategy<Value = Map<String, Value>> {
        let key = prop_oneof![
            Just(keys::ADDRESS.to_string()),
            Just(keys::USERNAME.to_string()),
            Just(keys::PASSWORD.to_string()),
            Just(keys::CLIENT_PORT.to_string()),
            Just(keys::CLIENT_TIMEOUT.to_string()),
            Just(keys::VERIFY_CA.to_string()),
            Just(keys::DEPLOY_ISO.to_string()),
            Just(keys::CONSOLE_PORT.to_string()),
            Just(keys::PROTOCOL.to_string()),
            ".{0,12}",
        ];
        proptest::collection::btree_map(key, arb_json(), 0..10)
            .prop_map(|m| m.into_iter().collect())
    }

    proptest! {
        #[test]
        fn arbitrary_objects_never_panic(info in arb_driver_info()) {
            match IloDriverInfo::parse(&info, &IloDefaults::default()) {
                // Whatever was accepted gives a client config that works.
                Ok(parsed) => prop_assert!(parsed.config.base_url().is_ok()),
                // Whatever was refused names one of the keys it reads.
                Err(err) => prop_assert!(err.field().starts_with("ilo_")
                    || err.field().ends_with("_port")
                    || err.field() == keys::CLIENT_TIMEOUT),
            }
        }
    }
}
