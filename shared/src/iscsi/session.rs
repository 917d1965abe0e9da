//! What both ends hold once a login has reached the full feature phase (RFC 7143 §6): the kind
//! of session, the negotiated parameters and where the sequence numbers start.
//!
//! # Design
//! The agent's target and the conductor's initiator run the login from opposite ends but finish
//! with the same facts, so they share this one description: the initiator adds its socket halves
//! to it, the target its connection state. Right after the last Login Response the initiator's
//! next CmdSN is the target's ExpCmdSN, and the target's next StatSN the initiator's ExpStatSN,
//! which is why each is one field here.

use super::keys::{value, OperationalParams};
use super::Digests;

/// Kind of session (RFC 7143 §13.21, `SessionType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionKind {
    /// A normal session: SCSI commands to the target's LUNs.
    Normal,
    /// A discovery session: SendTargets only, no target name.
    Discovery,
}

impl SessionKind {
    /// The `SessionType` value that asks for this kind.
    pub fn session_type(self) -> &'static str {
        match self {
            SessionKind::Normal => value::NORMAL,
            SessionKind::Discovery => value::DISCOVERY,
        }
    }

    /// The kind a `SessionType` key asks for: no key is a normal session (the RFC's default);
    /// `None` for a value the RFC does not define.
    pub fn from_session_type(session_type: Option<&str>) -> Option<SessionKind> {
        match session_type {
            None | Some(value::NORMAL) => Some(SessionKind::Normal),
            Some(value::DISCOVERY) => Some(SessionKind::Discovery),
            Some(_) => None,
        }
    }
}

/// A finished login, as both ends see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedIn {
    /// The session's kind.
    pub kind: SessionKind,
    /// The operational parameters in force.
    pub params: OperationalParams,
    /// The initiator's name (`InitiatorName`).
    pub initiator_name: String,
    /// Initiator Session ID.
    pub isid: [u8; 6],
    /// TSIH the target gave the session (never 0).
    pub tsih: u16,
    /// The next CmdSN: the initiator's to send, the target's ExpCmdSN.
    pub cmd_sn: u32,
    /// MaxCmdSN of the last Login Response: the top of the initiator's command window.
    pub max_cmd_sn: u32,
    /// The next StatSN: the target's to send, the initiator's ExpStatSN.
    pub stat_sn: u32,
}

impl LoggedIn {
    /// The digests in use from now on.
    pub fn digests(&self) -> Digests {
        self.params.digests()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_type_round_trips_and_defaults_to_normal() {
        for kind in [SessionKind::Normal, SessionKind::Discovery] {
            assert_eq!(
                SessionKind::from_session_type(Some(kind.session_type())),
                Some(kind)
            );
        }
        assert_eq!(
            SessionKind::from_session_type(None),
            Some(SessionKind::Normal)
        );
        assert_eq!(SessionKind::from_session_type(Some("normal")), None);
        assert_eq!(SessionKind::Discovery.session_type(), "Discovery");
    }
}
