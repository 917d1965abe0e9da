//! Hardware interfaces split as in Ironic: power, management (boot device, boot mode), and the
//! clients that carry them out.
//!
//! # Design
//! [`Power`] and [`Management`] are the interfaces the deploy flows call (DESIGN.md §2). Their
//! types say what a BMC can do, never how one protocol spells it: `BootDevice::Cdrom` is
//! `CDROM` in RIBCL and `Cd` in Redfish. Both iLO clients (RIBCL for iLO 4, Redfish for iLO 5/6
//! and other Redfish BMCs) implement them; [`ilo::IloClient`] picks one per node.
//!
//! Every failure is a [`DriverError`] whose variant says what a caller may branch on: a failed
//! login is not retried, an unsupported boot-mode command means "assume legacy BIOS" (Ironic's
//! behaviour, reference/ilo-management.md §1.8), a timeout or an HTTP 500 is reported as such.
//!
//! # Limitations
//! Sensors come from the BMC's own health data (RIBCL GET_EMBEDDED_HEALTH, Redfish Thermal/Power),
//! not IPMI as Ironic's iLO driver does (reference/ilo-management.md §1.6).

use std::fmt;
use std::future::Future;

use serde::Serialize;

pub mod ilo;

/// A password or other secret: shown as `******` by `Debug`, `Display` and `Serialize`, so it
/// never reaches a log line (DESIGN.md §7); `expose()` reads it for a login.
pub use vmdeploy_shared::secret::Secret;

/// Host power as the BMC reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerState {
    /// The host is powered on (or powering on).
    On,
    /// The host is powered off (or powering off).
    Off,
}

impl fmt::Display for PowerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PowerState::On => "on",
            PowerState::Off => "off",
        })
    }
}

/// A power operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerAction {
    /// Power on (RIBCL SET_HOST_POWER Yes, Redfish `On`).
    On,
    /// Power off now (RIBCL SET_HOST_POWER No, Redfish `ForceOff`).
    Off,
    /// Hard reset (RIBCL RESET_SERVER, Redfish `ForceRestart`).
    Reset,
    /// Press the power button briefly (RIBCL PRESS_PWR_BTN, Redfish `PushPowerButton`).
    PressButton,
    /// Hold the power button until the host is off (RIBCL HOLD_PWR_BTN TOGGLE=NO); Ironic's
    /// power-off (reference/ilo-management.md §1.8).
    HoldButton,
}

/// A boot device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BootDevice {
    /// CD/DVD, including the virtual CD.
    Cdrom,
    /// Local disk.
    Hdd,
    /// PXE / network.
    Network,
    /// Floppy (virtual floppy / USB key).
    Floppy,
    /// USB.
    Usb,
    /// A UEFI boot entry by id (`Boot000B`) with its description when the BMC gave one.
    Uefi {
        /// The `BootXXXX` id.
        id: String,
        /// What the firmware calls it.
        description: Option<String>,
    },
    /// Any other name the BMC uses (RBSU, EMB-MENU, BiosSetup, ...), kept verbatim.
    Other(String),
}

impl fmt::Display for BootDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootDevice::Cdrom => f.write_str("cdrom"),
            BootDevice::Hdd => f.write_str("hdd"),
            BootDevice::Network => f.write_str("network"),
            BootDevice::Floppy => f.write_str("floppy"),
            BootDevice::Usb => f.write_str("usb"),
            BootDevice::Uefi {
                id,
                description: Some(d),
            } => write!(f, "{id} ({d})"),
            BootDevice::Uefi { id, .. } => f.write_str(id),
            BootDevice::Other(name) => f.write_str(name),
        }
    }
}

/// Firmware boot mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BootMode {
    /// UEFI.
    Uefi,
    /// Legacy BIOS.
    Bios,
}

impl fmt::Display for BootMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BootMode::Uefi => "uefi",
            BootMode::Bios => "bios",
        })
    }
}

/// Boot modes the firmware supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SupportedBootModes {
    /// Legacy BIOS only.
    BiosOnly,
    /// UEFI only.
    UefiOnly,
    /// Both.
    BiosAndUefi,
}

/// A virtual media device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VmediaDevice {
    /// The virtual floppy / USB key (Ironic's parameters floppy).
    Floppy,
    /// The virtual CD/DVD.
    Cdrom,
}

impl fmt::Display for VmediaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VmediaDevice::Floppy => "floppy",
            VmediaDevice::Cdrom => "cdrom",
        })
    }
}

/// When virtual media is connected to the host (RIBCL VM_BOOT_OPTION; reference §1.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VmediaBootOption {
    /// Connect at every boot.
    BootAlways,
    /// Connect at the next boot only.
    BootOnce,
    /// Do not connect at boot.
    NoBoot,
    /// Connect now (and boot always).
    Connect,
    /// Disconnect now.
    Disconnect,
}

/// State of one virtual media device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmediaStatus {
    /// The device.
    pub device: VmediaDevice,
    /// Whether an image is inserted.
    pub inserted: bool,
    /// The image URL, when one is inserted.
    pub image_url: Option<String>,
    /// Whether the host sees it now (RIBCL VM_APPLET=CONNECTED, Redfish ConnectedVia=URI).
    pub connected: bool,
    /// When it is connected at boot, if the BMC says.
    pub boot_option: Option<VmediaBootOption>,
    /// Whether the host sees it read-only, if the BMC says.
    pub write_protected: Option<bool>,
}

/// One installed licence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Licence {
    /// e.g. `iLO 3 Advanced`, `iLO Advanced`.
    pub licence_type: String,
    /// The key, when the BMC shows it.
    pub key: Option<String>,
    /// Install date, as the BMC writes it.
    pub install_date: Option<String>,
    /// Licence class (`FQL`, `EVALUATION`, ...).
    pub class: Option<String>,
}

/// Licence tier as Ironic classifies it from the licence type (reference §1.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LicenceTier {
    /// Type ends in "Advanced": virtual media works.
    Advanced,
    /// Type ends in "Essentials".
    Essentials,
    /// Anything else.
    Standard,
}

impl Licence {
    /// Ironic's classification: by the end of the licence type.
    pub fn tier(&self) -> LicenceTier {
        let t = self.licence_type.trim().to_ascii_lowercase();
        if t.ends_with("advanced") {
            LicenceTier::Advanced
        } else if t.ends_with("essentials") {
            LicenceTier::Essentials
        } else {
            LicenceTier::Standard
        }
    }
}

/// A temperature sensor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Temperature {
    /// Sensor name.
    pub label: String,
    /// Where it is.
    pub location: Option<String>,
    /// Health status (`OK`, `Not Installed`, ...).
    pub status: Option<String>,
    /// Current reading in Celsius.
    pub celsius: Option<f64>,
    /// Caution threshold in Celsius.
    pub caution: Option<f64>,
    /// Critical threshold in Celsius.
    pub critical: Option<f64>,
}

/// A fan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fan {
    /// Fan name.
    pub label: String,
    /// Zone.
    pub zone: Option<String>,
    /// Health status.
    pub status: Option<String>,
    /// Speed in percent of maximum.
    pub speed_percent: Option<f64>,
}

/// A power supply.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PowerSupply {
    /// Supply name.
    pub label: String,
    /// Whether it is present, if the BMC says.
    pub present: Option<bool>,
    /// Health status.
    pub status: Option<String>,
    /// Capacity in watts.
    pub capacity_watts: Option<f64>,
}

/// Power consumption.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PowerReading {
    /// Present draw in watts.
    pub present_watts: Option<f64>,
    /// Average draw in watts.
    pub average_watts: Option<f64>,
    /// Maximum draw in watts.
    pub maximum_watts: Option<f64>,
    /// Minimum draw in watts.
    pub minimum_watts: Option<f64>,
}

/// The health data operators and the conductor look at.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Health {
    /// Temperature sensors.
    pub temperatures: Vec<Temperature>,
    /// Fans.
    pub fans: Vec<Fan>,
    /// Power supplies.
    pub power_supplies: Vec<PowerSupply>,
    /// Power readings.
    pub power: PowerReading,
}

/// What the BMC is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BmcInfo {
    /// Server model, e.g. `ProLiant DL380p Gen8`.
    pub product_name: String,
    /// BMC firmware version, e.g. `2.80`.
    pub firmware_version: Option<String>,
    /// BMC kind, e.g. `iLO4`.
    pub management_processor: Option<String>,
    /// Protocol this client speaks to it.
    pub protocol: String,
}

/// A failed BMC operation, protocol independent (the callers branch on it).
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The BMC rejected the credentials (RIBCL 0x005F/0x000A, Redfish 401).
    #[error("login failed: {message}")]
    LoginFailed {
        /// The BMC's message.
        message: String,
    },
    /// The BMC does not implement this operation (RIBCL "Feature not supported" or syntax error,
    /// Redfish 404/405/501 on the action).
    #[error("not supported by this BMC: {operation}: {message}")]
    NotSupported {
        /// What was tried.
        operation: String,
        /// The BMC's message.
        message: String,
    },
    /// RIBCL 0x0035: a virtual media option was rejected.
    #[error("invalid virtual media option: {message}")]
    InvalidVirtualMediaOption {
        /// The BMC's message.
        message: String,
    },
    /// The BMC is busy with another client; retried, and reported when it stays busy.
    #[error("BMC busy: {message}")]
    Busy {
        /// The BMC's message.
        message: String,
    },
    /// Any other error status from the iLO (RIBCL STATUS != 0).
    #[error("iLO error {status:#06x}: {message}")]
    Ilo {
        /// The RIBCL STATUS code.
        status: u32,
        /// The RIBCL MESSAGE.
        message: String,
    },
    /// The Redfish service answered with an error status.
    #[error("Redfish {method} {path}: HTTP {status}: {message}")]
    Redfish {
        /// HTTP method.
        method: String,
        /// Resource path.
        path: String,
        /// HTTP status.
        status: u16,
        /// Extended message from the body, or the status text.
        message: String,
    },
    /// The BMC answered with an HTTP error status outside the protocol's own error reporting.
    #[error("HTTP {status} from {url}")]
    HttpStatus {
        /// The status.
        status: u16,
        /// The URL asked.
        url: String,
    },
    /// No complete answer within the client timeout.
    #[error("no answer from {url} within {seconds:.1} s")]
    Timeout {
        /// The URL asked.
        url: String,
        /// The limit.
        seconds: f64,
    },
    /// The connection failed (refused, reset, TLS, DNS).
    #[error("connection to {url} failed: {message}")]
    Connection {
        /// The URL asked.
        url: String,
        /// The cause.
        message: String,
    },
    /// The TLS handshake failed (certificate not trusted, wrong name): not retried.
    #[error("TLS with {url} failed: {message}")]
    Tls {
        /// The URL asked.
        url: String,
        /// The cause.
        message: String,
    },
    /// The answer could not be understood.
    #[error("malformed reply from {url}: {message}")]
    MalformedReply {
        /// The URL asked.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// The request itself is invalid (bad address, bad CA file, value the protocol cannot carry).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl DriverError {
    /// Whether trying again soon may succeed (connection errors, HTTP 5xx, a busy BMC).
    pub fn is_transient(&self) -> bool {
        match self {
            DriverError::Connection { .. } | DriverError::Busy { .. } => true,
            DriverError::HttpStatus { status, .. } | DriverError::Redfish { status, .. } => {
                matches!(status, 500 | 502 | 503 | 504)
            }
            _ => false,
        }
    }
}

/// Power control (Ironic's power interface).
pub trait Power {
    /// The host's power state.
    fn power_state(&self) -> impl Future<Output = Result<PowerState, DriverError>> + Send;

    /// Carries out a power action; returns the BMC's informational message, if any
    /// (e.g. RIBCL "Host power is already ON.").
    fn set_power(
        &self,
        action: PowerAction,
    ) -> impl Future<Output = Result<Option<String>, DriverError>> + Send;
}

/// Boot device, boot mode, virtual media and inventory (Ironic's management interface, plus the
/// virtual media calls its iLO boot interface makes).
pub trait Management {
    /// The one-time boot device, `None` when none is set (RIBCL `Normal`).
    fn one_time_boot(&self)
        -> impl Future<Output = Result<Option<BootDevice>, DriverError>> + Send;

    /// Sets the device for the next boot only.
    fn set_one_time_boot(
        &self,
        device: &BootDevice,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// The persistent boot order, first device first.
    fn persistent_boot(&self) -> impl Future<Output = Result<Vec<BootDevice>, DriverError>> + Send;

    /// Makes `device` the first persistent boot device.
    fn set_persistent_boot(
        &self,
        device: &BootDevice,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// The boot mode in effect now.
    fn current_boot_mode(&self) -> impl Future<Output = Result<BootMode, DriverError>> + Send;

    /// The boot mode after the next reset.
    fn pending_boot_mode(&self) -> impl Future<Output = Result<BootMode, DriverError>> + Send;

    /// Sets the boot mode for the next reset.
    fn set_pending_boot_mode(
        &self,
        mode: BootMode,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// The boot modes the firmware supports.
    fn supported_boot_modes(
        &self,
    ) -> impl Future<Output = Result<SupportedBootModes, DriverError>> + Send;

    /// The state of a virtual media device.
    fn vmedia_status(
        &self,
        device: VmediaDevice,
    ) -> impl Future<Output = Result<VmediaStatus, DriverError>> + Send;

    /// Inserts an image (by URL the BMC fetches) into a virtual media device.
    fn insert_vmedia(
        &self,
        device: VmediaDevice,
        url: &str,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// Ejects a virtual media device (a no-op when it is empty).
    fn eject_vmedia(
        &self,
        device: VmediaDevice,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// Sets when the device is connected and whether it is read-only.
    fn set_vmedia_status(
        &self,
        device: VmediaDevice,
        boot_option: VmediaBootOption,
        write_protect: Option<bool>,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// Installed licences.
    fn licences(&self) -> impl Future<Output = Result<Vec<Licence>, DriverError>> + Send;

    /// Model, firmware and protocol.
    fn info(&self) -> impl Future<Output = Result<BmcInfo, DriverError>> + Send;

    /// Temperatures, fans, power supplies and power readings.
    fn health(&self) -> impl Future<Output = Result<Health, DriverError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s: Secret = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "******");
        assert_eq!(format!("{s}"), "******");
        assert_eq!(s.expose(), "hunter2");
        let config = ilo::IloConfig::new("10.0.0.9", "admin", Secret::new("hunter2"));
        let shown = format!("{config:?} {config:#?}");
        assert!(
            shown.contains("admin") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[test]
    fn licence_tiers_follow_ironic() {
        let l = |t: &str| Licence {
            licence_type: t.to_string(),
            key: None,
            install_date: None,
            class: None,
        };
        assert_eq!(l("iLO 3 Advanced").tier(), LicenceTier::Advanced);
        assert_eq!(l("iLO Essentials").tier(), LicenceTier::Essentials);
        assert_eq!(l("iLO Standard").tier(), LicenceTier::Standard);
    }

    #[test]
    fn transient_errors() {
        let e = DriverError::HttpStatus {
            status: 500,
            url: "u".into(),
        };
        assert!(e.is_transient());
        let e = DriverError::LoginFailed {
            message: "x".into(),
        };
        assert!(!e.is_transient());
    }
}
