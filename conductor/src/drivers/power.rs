//! Power control: the host's power state, the actions on it, and the [`Power`] interface.

use std::fmt;
use std::future::Future;

use serde::Serialize;

use super::DriverError;

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
    /// power-off (docs/ilo-management.md §1.8).
    HoldButton,
}

/// Power control (Ironic's power interface).
pub trait Power {
    /// The host's power state.
    fn power_state(&self) -> impl Future<Output = Result<PowerState, DriverError>> + Send;

    /// Carries out a power action; returns the BMC's informational message, if any
    /// (e.g. "Host power is already ON.").
    fn set_power(
        &self,
        action: PowerAction,
    ) -> impl Future<Output = Result<Option<String>, DriverError>> + Send;
}
