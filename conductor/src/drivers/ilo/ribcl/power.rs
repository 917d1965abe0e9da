//! Power over RIBCL (docs/ilo-management.md §1.5): GET_HOST_POWER_STATUS, SET_HOST_POWER,
//! RESET_SERVER, PRESS_PWR_BTN, HOLD_PWR_BTN.

use super::client::RibclClient;
use super::codec::{RibclCommand, RibclReply, Wrapper, XmlElement};
use super::error::RibclParseError;
use crate::drivers::{DriverError, Power, PowerAction, PowerState};

/// The command for a power action.
pub fn power_command(action: PowerAction) -> RibclCommand {
    let element = match action {
        // `Yes`/`No`, as proliantutils sends (docs/ilo-management.md §1.5).
        PowerAction::On => XmlElement::new("SET_HOST_POWER").attr("HOST_POWER", "Yes"),
        PowerAction::Off => XmlElement::new("SET_HOST_POWER").attr("HOST_POWER", "No"),
        PowerAction::Reset => XmlElement::new("RESET_SERVER"),
        PowerAction::PressButton => XmlElement::new("PRESS_PWR_BTN"),
        // TOGGLE=NO: only ever powers off, never on.
        PowerAction::HoldButton => XmlElement::new("HOLD_PWR_BTN").attr("TOGGLE", "NO"),
    };
    RibclCommand::write(Wrapper::ServerInfo, element)
}

/// Reads `<GET_HOST_POWER HOST_POWER="ON"/>` (the reply element is not named like the command).
pub fn decode_power_state(reply: &RibclReply) -> Result<PowerState, RibclParseError> {
    const CMD: &str = "GET_HOST_POWER_STATUS";
    let value = reply
        .payload("GET_HOST_POWER")
        .and_then(|e| e.get("HOST_POWER"))
        .ok_or_else(|| RibclParseError::MissingPayload {
            command: CMD.into(),
            what: "GET_HOST_POWER HOST_POWER".into(),
        })?;
    match value.trim().to_ascii_uppercase().as_str() {
        "ON" => Ok(PowerState::On),
        "OFF" => Ok(PowerState::Off),
        _ => Err(RibclParseError::UnexpectedValue {
            command: CMD.into(),
            what: "HOST_POWER".into(),
            value: value.to_string(),
        }),
    }
}

impl RibclClient {
    pub(crate) fn malformed(&self, e: RibclParseError) -> DriverError {
        DriverError::MalformedReply {
            url: self.url().to_string(),
            message: e.to_string(),
        }
    }
}

impl Power for RibclClient {
    async fn power_state(&self) -> Result<PowerState, DriverError> {
        let reply = self
            .execute(&RibclCommand::read(
                Wrapper::ServerInfo,
                XmlElement::new("GET_HOST_POWER_STATUS"),
            ))
            .await?;
        decode_power_state(&reply).map_err(|e| self.malformed(e))
    }

    async fn set_power(&self, action: PowerAction) -> Result<Option<String>, DriverError> {
        let reply = self.execute(&power_command(action)).await?;
        let messages = reply.informational();
        Ok(if messages.is_empty() {
            None
        } else {
            Some(messages.join(" "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drivers::ilo::ribcl::codec::{parse_reply, samples::reply_with};

    #[test]
    fn power_commands() {
        let enc = |a| power_command(a).encode("u", "p");
        assert!(enc(PowerAction::On)
            .contains("<SERVER_INFO MODE=\"write\"><SET_HOST_POWER HOST_POWER=\"Yes\" />"));
        assert!(enc(PowerAction::Off).contains("HOST_POWER=\"No\""));
        assert!(enc(PowerAction::Reset).contains("<RESET_SERVER />"));
        assert!(enc(PowerAction::PressButton).contains("<PRESS_PWR_BTN />"));
        assert!(enc(PowerAction::HoldButton).contains("<HOLD_PWR_BTN TOGGLE=\"NO\" />"));
    }

    #[test]
    fn power_state_is_decoded() {
        let reply = parse_reply(reply_with("<GET_HOST_POWER HOST_POWER=\"OFF\"/>").as_bytes())
            .expect("valid");
        assert_eq!(decode_power_state(&reply), Ok(PowerState::Off));
        let reply = parse_reply(reply_with("<GET_HOST_POWER host_power=\"on\"/>").as_bytes())
            .expect("valid");
        assert_eq!(decode_power_state(&reply), Ok(PowerState::On));
        let reply = parse_reply(reply_with("<GET_HOST_POWER HOST_POWER=\"MAYBE\"/>").as_bytes())
            .expect("valid");
        assert!(decode_power_state(&reply).is_err());
        let reply = parse_reply(reply_with("").as_bytes()).expect("valid");
        assert!(matches!(
            decode_power_state(&reply),
            Err(RibclParseError::MissingPayload { .. })
        ));
    }
}
