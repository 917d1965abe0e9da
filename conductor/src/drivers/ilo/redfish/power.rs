//! Power over Redfish: `ComputerSystem.Reset` and `PowerState`, the HPE OEM power button for
//! press/hold (docs/ilo-management.md §3.3).

use serde_json::json;

use super::client::RedfishClient;
use super::codec::{action_target, join, power_state};
use crate::drivers::{DriverError, Power, PowerAction, PowerState};

/// HPE OEM power button action (`system.py` l.152, docs/ilo-management.md §3.3).
const HPE_POWER_BUTTON: &str = "#HpeComputerSystemExt.PowerButton";

impl RedfishClient {
    async fn reset(&self, reset_type: &str) -> Result<(), DriverError> {
        let system_uri = self.layout().await?.system.clone();
        let system = self.get(&system_uri).await?;
        let target = action_target(&system, "#ComputerSystem.Reset")
            .map(str::to_string)
            .unwrap_or_else(|| join(&system_uri, "Actions/ComputerSystem.Reset"));
        self.post(&target, &json!({ "ResetType": reset_type }))
            .await?;
        Ok(())
    }

    /// The HPE power button, when the system advertises it.
    async fn hpe_button(&self, push_type: &str) -> Result<bool, DriverError> {
        let system_uri = self.layout().await?.system.clone();
        let system = self.get(&system_uri).await?;
        let Some(target) = action_target(&system, HPE_POWER_BUTTON).map(str::to_string) else {
            return Ok(false);
        };
        self.post(&target, &json!({ "PushType": push_type }))
            .await?;
        Ok(true)
    }
}

impl Power for RedfishClient {
    async fn power_state(&self) -> Result<PowerState, DriverError> {
        let system_uri = self.layout().await?.system.clone();
        let system = self.get(&system_uri).await?;
        power_state(&system).map_err(|message| DriverError::MalformedReply {
            url: system_uri,
            message,
        })
    }

    async fn set_power(&self, action: PowerAction) -> Result<Option<String>, DriverError> {
        let state = self.power_state().await?;
        match action {
            // Like proliantutils: nothing to do when already there; say so as RIBCL would.
            PowerAction::On if state == PowerState::On => {
                Ok(Some("Host power is already ON.".into()))
            }
            PowerAction::Off | PowerAction::HoldButton if state == PowerState::Off => {
                Ok(Some("Host power is already OFF.".into()))
            }
            PowerAction::On => self.reset("On").await.map(|()| None),
            PowerAction::Off => self.reset("ForceOff").await.map(|()| None),
            PowerAction::Reset => self.reset("ForceRestart").await.map(|()| None),
            PowerAction::PressButton => match self.reset("PushPowerButton").await {
                Ok(()) => Ok(None),
                // sushy-tools answers 501, older iLO 5 firmware 400: use the OEM button.
                Err(DriverError::NotSupported { .. })
                | Err(DriverError::HttpStatus { status: 400, .. }) => {
                    if self.hpe_button("Press").await? {
                        Ok(None)
                    } else {
                        Err(DriverError::NotSupported {
                            operation: "press power button".into(),
                            message: "neither PushPowerButton nor the HPE power button".into(),
                        })
                    }
                }
                Err(e) => Err(e),
            },
            PowerAction::HoldButton => {
                if self.hpe_button("PressAndHold").await? {
                    Ok(None)
                } else {
                    // Holding the button is a forced off everywhere else.
                    self.reset("ForceOff").await.map(|()| None)
                }
            }
        }
    }
}
