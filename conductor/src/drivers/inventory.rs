//! What the BMC knows about itself: licences (and whether they allow virtual media), model,
//! health and sensors, and the [`Inventory`] interface.

use std::future::Future;

use serde::Serialize;

use super::DriverError;

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

/// Licence tier as Ironic classifies it from the licence type (docs/ilo-management.md §1.8).
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

/// Whether a node may boot from virtual media with these licences: Ironic's iLO driver counts a
/// licence whose type ends in "Advanced" as the advanced tier (ironic
/// `drivers/modules/ilo/common.py`, `get_ilo_license`), and its virtual-media drivers
/// (`iscsi_ilo`, `agent_ilo`) need that tier, where `pxe_ilo` does not (ironic
/// `doc/source/drivers/ilo.rst`). Checked at validate, before anything is powered off.
///
/// Ironic's rule is kept as is: a licence type it would not call advanced (e.g. a later tier
/// named otherwise) is refused here too, and the operator sees the type in the error.
pub fn virtual_media_licensed(licences: &[Licence]) -> bool {
    licences.iter().any(|l| l.tier() == LicenceTier::Advanced)
}

/// Licences, model and health (Ironic's inspection and sensor data, read from the BMC).
pub trait Inventory {
    /// Installed licences.
    fn licences(&self) -> impl Future<Output = Result<Vec<Licence>, DriverError>> + Send;

    /// Model, firmware and protocol.
    fn info(&self) -> impl Future<Output = Result<BmcInfo, DriverError>> + Send;

    /// Temperatures, fans, power supplies and power readings.
    fn health(&self) -> impl Future<Output = Result<Health, DriverError>> + Send;

    /// Refuses with [`DriverError::NotLicensed`] unless the licences allow virtual media
    /// ([`virtual_media_licensed`]); validate calls it before anything is powered off.
    fn check_virtual_media_licence(&self) -> impl Future<Output = Result<(), DriverError>> + Send
    where
        Self: Sync,
    {
        async move {
            let licences = self.licences().await?;
            if virtual_media_licensed(&licences) {
                return Ok(());
            }
            let types: Vec<&str> = licences.iter().map(|l| l.licence_type.as_str()).collect();
            Err(DriverError::NotLicensed {
                operation: "virtual media".to_string(),
                message: format!(
                    "virtual media needs an iLO Advanced licence; installed: {}",
                    if types.is_empty() {
                        "none".to_string()
                    } else {
                        types.join(", ")
                    }
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn licence_tiers_follow_ironic() {
        assert_eq!(licence("iLO 3 Advanced").tier(), LicenceTier::Advanced);
        assert_eq!(licence("iLO Essentials").tier(), LicenceTier::Essentials);
        assert_eq!(licence("iLO Standard").tier(), LicenceTier::Standard);
    }

    fn licence(t: &str) -> Licence {
        Licence {
            licence_type: t.to_string(),
            key: None,
            install_date: None,
            class: None,
        }
    }

    #[test]
    fn virtual_media_needs_an_advanced_licence() {
        assert!(virtual_media_licensed(&[licence("iLO Advanced")]));
        assert!(virtual_media_licensed(&[
            licence("iLO Standard"),
            licence("iLO 3 Advanced")
        ]));
        assert!(!virtual_media_licensed(&[licence("iLO Standard")]));
        assert!(!virtual_media_licensed(&[licence("iLO Essentials")]));
        assert!(!virtual_media_licensed(&[licence("iLO 3")]));
        assert!(!virtual_media_licensed(&[]));
    }
}
