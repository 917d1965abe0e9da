//! What went wrong on a node's BMC, in words an operator can act on: each message names the BMC
//! and the step, and its hint names the node's own `driver_info` keys (`redfish_password` for a
//! `redfish` node, `ilo_password` for an iLO one).

use crate::drivers::{DriverError, DriverErrorKind, PowerState};
use crate::node::driver_info::{BmcKeys, DriverInfoError};

/// Why a BMC operation failed.
///
/// # Design
/// The driver error is kept (callers branch on it: an unsupported boot-mode command means a
/// legacy-BIOS machine) but is not the `source`: the message already holds its text with the
/// hint after it, and a cause chain would print it twice.
#[derive(Debug, thiserror::Error)]
pub enum BmcError {
    /// `driver_info` does not say how to reach the BMC (the operator's to fix: 400 in the API).
    #[error("driver_info is incomplete or invalid: {error}")]
    Settings {
        /// The field at fault.
        error: DriverInfoError,
    },
    /// The BMC failed or refused a step.
    #[error("{bmc} {address}: {step}: {description}")]
    Driver {
        /// What the BMC is called (`iLO`, `Redfish BMC`).
        bmc: &'static str,
        /// Its address.
        address: String,
        /// The step, as a gerund (`reading the power state`).
        step: String,
        /// The driver error with the operator's hint ([`describe`]).
        description: String,
        /// The driver error itself (boxed: the error is returned on every BMC call).
        error: Box<DriverError>,
    },
    /// The host did not reach a power state in time.
    #[error(
        "{bmc} {address}: the host still reports power {now} after {seconds} s (wanted {want})"
    )]
    PowerTimeout {
        /// What the BMC is called.
        bmc: &'static str,
        /// Its address.
        address: String,
        /// The state last read.
        now: PowerState,
        /// The state waited for.
        want: PowerState,
        /// How long it was waited for.
        seconds: u64,
    },
}

impl BmcError {
    /// The driver error behind a failed step, for callers that branch on it.
    pub fn driver_error(&self) -> Option<&DriverError> {
        match self {
            BmcError::Driver { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// A driver error in words an operator can act on: the error, then what to check, naming the
/// `driver_info` keys the node's settings came from.
pub fn describe(err: &DriverError, keys: &BmcKeys) -> String {
    let address = match keys.port {
        Some(port) => format!("{} and {port}", keys.address),
        None => keys.address.to_string(),
    };
    match (err.kind(), err) {
        (_, DriverError::LoginFailed { .. }) => format!(
            "{err}; check {} and {} in the node's driver_info",
            keys.username, keys.password
        ),
        (_, DriverError::Connection { .. } | DriverError::Timeout { .. }) => format!(
            "{err}; check {address} in driver_info and that the {} is reachable from the conductor",
            keys.bmc
        ),
        (_, DriverError::Tls { .. }) => format!(
            "{err}; set {} in driver_info to the {}'s CA file (or false to skip the check)",
            keys.verify_ca, keys.bmc
        ),
        (DriverErrorKind::NotLicensed, _) => {
            format!("{err}; install an iLO Advanced licence on the node's iLO")
        }
        // The Redfish client's refusal of a system path the BMC does not have.
        (_, DriverError::InvalidRequest(message)) if message.contains("has no system") => {
            match keys.system_id {
                Some(system) => format!("{err}; set {system} in driver_info to one of them"),
                None => err.to_string(),
            }
        }
        _ => err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every hint names the keys of the node's own driver, never the other driver's.
    #[test]
    fn hints_name_the_nodes_own_keys() {
        let errors = [
            DriverError::LoginFailed {
                message: "bad login".into(),
            },
            DriverError::Connection {
                url: "https://10.0.0.9:443".into(),
                message: "refused".into(),
            },
            DriverError::Tls {
                url: "https://10.0.0.9:443".into(),
                message: "unknown issuer".into(),
            },
        ];
        let want = [
            (
                "ilo_username and ilo_password",
                "redfish_username and redfish_password",
            ),
            ("ilo_address and client_port", "redfish_address in"),
            ("ilo_verify_ca", "redfish_verify_ca"),
        ];
        for (err, (ilo, redfish)) in errors.iter().zip(want) {
            let for_ilo = describe(err, &BmcKeys::ILO);
            assert!(for_ilo.contains(ilo), "{for_ilo}");
            assert!(!for_ilo.contains("redfish_"), "{for_ilo}");
            let for_redfish = describe(err, &BmcKeys::REDFISH);
            assert!(for_redfish.contains(redfish), "{for_redfish}");
            assert!(!for_redfish.contains("ilo_"), "{for_redfish}");
            assert!(!for_redfish.contains("client_port"), "{for_redfish}");
        }
        let unknown = DriverError::InvalidRequest(
            "the BMC has no system /redfish/v1/Systems/9; its systems: /redfish/v1/Systems/1"
                .into(),
        );
        assert!(describe(&unknown, &BmcKeys::REDFISH)
            .ends_with("set redfish_system_id in driver_info to one of them"));
    }
}
