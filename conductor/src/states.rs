//! Provision and power states as Ironic names them, and the provision state machine
//! (../shared/reference/ironic-protocols.md §5.3, DESIGN.md §8).
//!
//! # Design
//! Pure: no store, no I/O. [`next`] is the whole transition table; the API layer asks it
//! whether a verb is allowed (400 when not), the manager asks it for the state after each step of
//! a flow, so the two can never disagree.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A node's provision state, spelled as Ironic spells it on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProvisionState {
    /// New node, credentials not yet verified (API ≥ 1.11).
    #[serde(rename = "enroll")]
    Enroll,
    /// Checking the BMC credentials after `manage`.
    #[serde(rename = "verifying")]
    Verifying,
    /// Under operator control, not offered for deploys.
    #[serde(rename = "manageable")]
    Manageable,
    /// Ready to deploy.
    #[serde(rename = "available")]
    Available,
    /// A deploy task is running on the conductor.
    #[serde(rename = "deploying")]
    Deploying,
    /// Waiting for the ramdisk to call back (heartbeat or `pass_deploy_info`).
    #[serde(rename = "wait call-back")]
    WaitCallBack,
    /// The deploy failed; `last_error` says why.
    #[serde(rename = "deploy failed")]
    DeployFailed,
    /// Deployed.
    #[serde(rename = "active")]
    Active,
    /// Tearing a deployment down.
    #[serde(rename = "deleting")]
    Deleting,
    /// Cleaning (automated or after `provide`).
    #[serde(rename = "cleaning")]
    Cleaning,
    /// Cleaning waits for the ramdisk.
    #[serde(rename = "clean wait")]
    CleanWait,
    /// Cleaning failed; `last_error` says why.
    #[serde(rename = "clean failed")]
    CleanFailed,
    /// Tear-down failed.
    #[serde(rename = "error")]
    Error,
}

impl ProvisionState {
    /// Every state, for tables and tests.
    pub const ALL: [ProvisionState; 13] = [
        ProvisionState::Enroll,
        ProvisionState::Verifying,
        ProvisionState::Manageable,
        ProvisionState::Available,
        ProvisionState::Deploying,
        ProvisionState::WaitCallBack,
        ProvisionState::DeployFailed,
        ProvisionState::Active,
        ProvisionState::Deleting,
        ProvisionState::Cleaning,
        ProvisionState::CleanWait,
        ProvisionState::CleanFailed,
        ProvisionState::Error,
    ];

    /// Ironic's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ProvisionState::Enroll => "enroll",
            ProvisionState::Verifying => "verifying",
            ProvisionState::Manageable => "manageable",
            ProvisionState::Available => "available",
            ProvisionState::Deploying => "deploying",
            ProvisionState::WaitCallBack => "wait call-back",
            ProvisionState::DeployFailed => "deploy failed",
            ProvisionState::Active => "active",
            ProvisionState::Deleting => "deleting",
            ProvisionState::Cleaning => "cleaning",
            ProvisionState::CleanWait => "clean wait",
            ProvisionState::CleanFailed => "clean failed",
            ProvisionState::Error => "error",
        }
    }

    /// States in which no task runs: a node rests there until someone asks for more. A node
    /// found in any other state at start-up was left mid-task by a conductor that stopped.
    pub fn is_stable(self) -> bool {
        matches!(
            self,
            ProvisionState::Enroll
                | ProvisionState::Manageable
                | ProvisionState::Available
                | ProvisionState::Active
                | ProvisionState::DeployFailed
                | ProvisionState::CleanFailed
                | ProvisionState::Error
        )
    }

    /// States that wait for the ramdisk, with no conductor task running (the deploy callback
    /// timeout applies to them).
    pub fn is_waiting(self) -> bool {
        matches!(
            self,
            ProvisionState::WaitCallBack | ProvisionState::CleanWait
        )
    }
}

impl fmt::Display for ProvisionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ProvisionState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProvisionState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

/// A state name that is not one of Ironic's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown state {0:?}")]
pub struct UnknownState(pub String);

/// The `target` of `PUT /v1/nodes/{node}/states/provision`, as the API accepts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProvisionVerb {
    /// `manage`: enroll/available/clean failed → manageable.
    Manage,
    /// `provide`: manageable → cleaning → available.
    Provide,
    /// `active` or `deploy` (1.73): available/deploy failed → deploying.
    Deploy,
    /// `rebuild`: active/deploy failed → deploying.
    Rebuild,
    /// `deleted` or `undeploy` (1.73): tear a deployment down.
    Undeploy,
    /// `abort`: stop waiting for the ramdisk.
    Abort,
}

impl ProvisionVerb {
    /// Parses the API's `target`; `None` for a verb this conductor does not know.
    pub fn parse(target: &str) -> Option<ProvisionVerb> {
        Some(match target {
            "manage" => ProvisionVerb::Manage,
            "provide" => ProvisionVerb::Provide,
            "active" | "deploy" => ProvisionVerb::Deploy,
            "rebuild" => ProvisionVerb::Rebuild,
            "deleted" | "undeploy" => ProvisionVerb::Undeploy,
            "abort" => ProvisionVerb::Abort,
            _ => return None,
        })
    }
}

/// What moves a node from one provision state to the next: an API verb or a step of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// An operator's or scheduler's request.
    Verb(ProvisionVerb),
    /// The flow now waits for the ramdisk.
    Wait,
    /// The ramdisk called back; the flow continues.
    Resume,
    /// The current step finished.
    Done,
    /// The current step failed.
    Fail,
}

/// The state `event` leads to from `state`, or `None` when Ironic does not allow it there.
pub fn next(state: ProvisionState, event: Event) -> Option<ProvisionState> {
    use Event::*;
    use ProvisionState::*;
    use ProvisionVerb::*;
    Some(match (state, event) {
        (Enroll, Verb(Manage)) => Verifying,
        (Verifying, Done) => Manageable,
        (Verifying, Fail) => Enroll,
        (Available | CleanFailed, Verb(Manage)) => Manageable,
        (Manageable, Verb(Provide)) => Cleaning,
        (Available | DeployFailed, Verb(Deploy)) => Deploying,
        (Active | DeployFailed, Verb(Rebuild)) => Deploying,
        (Deploying, Wait) => WaitCallBack,
        (WaitCallBack, Resume) => Deploying,
        (Deploying, Done) => Active,
        (Deploying | WaitCallBack, Fail) => DeployFailed,
        (WaitCallBack, Verb(Abort)) => DeployFailed,
        (Active | WaitCallBack | DeployFailed | Error, Verb(Undeploy)) => Deleting,
        (Deleting, Done) => Cleaning,
        (Deleting, Fail) => Error,
        (Cleaning, Wait) => CleanWait,
        (CleanWait, Resume) => Cleaning,
        (Cleaning, Done) => Available,
        (Cleaning | CleanWait, Fail) => CleanFailed,
        (CleanWait, Verb(Abort)) => CleanFailed,
        _ => return None,
    })
}

/// Power state of a node as the API shows it (`power_state`, `target_power_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodePower {
    /// `power on`
    #[serde(rename = "power on")]
    On,
    /// `power off`
    #[serde(rename = "power off")]
    Off,
    /// `rebooting` (only a target)
    #[serde(rename = "rebooting")]
    Rebooting,
    /// `soft rebooting` (only a target)
    #[serde(rename = "soft rebooting")]
    SoftRebooting,
    /// `soft power off` (only a target)
    #[serde(rename = "soft power off")]
    SoftPowerOff,
}

impl NodePower {
    /// Ironic's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            NodePower::On => "power on",
            NodePower::Off => "power off",
            NodePower::Rebooting => "rebooting",
            NodePower::SoftRebooting => "soft rebooting",
            NodePower::SoftPowerOff => "soft power off",
        }
    }
}

impl fmt::Display for NodePower {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NodePower {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            NodePower::On,
            NodePower::Off,
            NodePower::Rebooting,
            NodePower::SoftRebooting,
            NodePower::SoftPowerOff,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
        .ok_or_else(|| UnknownState(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_serde_and_from_str() {
        for state in ProvisionState::ALL {
            let json = serde_json::to_string(&state).expect("serialises");
            assert_eq!(json, format!("\"{}\"", state.as_str()));
            assert_eq!(state.as_str().parse::<ProvisionState>(), Ok(state));
        }
        assert!("wait callback".parse::<ProvisionState>().is_err());
    }

    #[test]
    fn deploy_path_as_in_ironic() {
        use Event::*;
        use ProvisionState::*;
        let mut s = Available;
        for (event, want) in [
            (Verb(ProvisionVerb::Deploy), Deploying),
            (Wait, WaitCallBack),
            (Resume, Deploying),
            (Done, Active),
            (Verb(ProvisionVerb::Undeploy), Deleting),
            (Done, Cleaning),
            (Done, Available),
        ] {
            s = next(s, event).unwrap_or_else(|| panic!("{event:?} refused in {s}"));
            assert_eq!(s, want);
        }
        assert_eq!(next(Active, Verb(ProvisionVerb::Deploy)), None);
        assert_eq!(next(Enroll, Verb(ProvisionVerb::Provide)), None);
    }
}
