//! Provision and power states as Ironic names them, and the provision state machine
//! (docs/ironic-protocols.md §5.3, docs/architecture.md §8).
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
    /// `rebuild`: active/deploy failed/error → deploying.
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
        // Ironic also rebuilds a node in `error` (ironic/common/states.py: "An errored instance
        // can be rebuilt"), which docs/ironic-protocols.md §5.3 leaves out.
        (Active | DeployFailed | Error, Verb(Rebuild)) => Deploying,
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

    /// Every event `next` knows, for the exhaustive table below.
    const EVENTS: [Event; 10] = [
        Event::Verb(ProvisionVerb::Manage),
        Event::Verb(ProvisionVerb::Provide),
        Event::Verb(ProvisionVerb::Deploy),
        Event::Verb(ProvisionVerb::Rebuild),
        Event::Verb(ProvisionVerb::Undeploy),
        Event::Verb(ProvisionVerb::Abort),
        Event::Wait,
        Event::Resume,
        Event::Done,
        Event::Fail,
    ];

    /// The transitions of docs/ironic-protocols.md §5.3, one row each, in the
    /// order that section lists them; the modern states (`enroll`, `verifying`, `clean wait`)
    /// and `abort` as Ironic's state machine has them.
    fn allowed() -> Vec<(ProvisionState, Event, ProvisionState)> {
        use Event::*;
        use ProvisionState::*;
        use ProvisionVerb::*;
        vec![
            // available -deploy-> deploying -wait-> wait call-back -resume-> deploying
            // -done-> active
            (Available, Verb(Deploy), Deploying),
            (Deploying, Wait, WaitCallBack),
            (WaitCallBack, Resume, Deploying),
            (Deploying, Done, Active),
            // deploying|wait call-back -fail-> deploy failed
            (Deploying, Fail, DeployFailed),
            (WaitCallBack, Fail, DeployFailed),
            // deploy failed -deploy|rebuild-> deploying; active -rebuild-> deploying
            (DeployFailed, Verb(Deploy), Deploying),
            (DeployFailed, Verb(Rebuild), Deploying),
            (Active, Verb(Rebuild), Deploying),
            // not in §5.3 but in Ironic's states.py since Kilo: error -rebuild-> deploying
            (Error, Verb(Rebuild), Deploying),
            // active|wait call-back|deploy failed|error -delete-> deleting
            (Active, Verb(Undeploy), Deleting),
            (WaitCallBack, Verb(Undeploy), Deleting),
            (DeployFailed, Verb(Undeploy), Deleting),
            (Error, Verb(Undeploy), Deleting),
            // deleting -clean-> cleaning -done-> available; deleting -error-> error
            (Deleting, Done, Cleaning),
            (Cleaning, Done, Available),
            (Deleting, Fail, Error),
            // cleaning -fail-> clean failed -manage-> manageable; manageable -provide-> cleaning
            (Cleaning, Fail, CleanFailed),
            (CleanFailed, Verb(Manage), Manageable),
            (Manageable, Verb(Provide), Cleaning),
            // available -manage-> manageable
            (Available, Verb(Manage), Manageable),
            // modern: enroll -manage-> verifying -> manageable (back to enroll when it fails)
            (Enroll, Verb(Manage), Verifying),
            (Verifying, Done, Manageable),
            (Verifying, Fail, Enroll),
            // modern: cleaning through the ramdisk waits in clean wait, like deploys
            (Cleaning, Wait, CleanWait),
            (CleanWait, Resume, Cleaning),
            (CleanWait, Fail, CleanFailed),
            // modern: abort stops waiting for the ramdisk
            (WaitCallBack, Verb(Abort), DeployFailed),
            (CleanWait, Verb(Abort), CleanFailed),
        ]
    }

    #[test]
    fn next_is_exactly_the_table_of_ironic_protocols_5_3() {
        let allowed = allowed();
        let mut seen = std::collections::HashSet::new();
        for &(from, event, to) in &allowed {
            assert!(
                seen.insert((from, event)),
                "row {from} {event:?} listed twice"
            );
            assert_eq!(next(from, event), Some(to), "{from} --{event:?}-->");
        }
        // Everything not in the table is refused: 13 states x 10 events, every pair checked.
        let mut refused = 0;
        for state in ProvisionState::ALL {
            for event in EVENTS {
                if !seen.contains(&(state, event)) {
                    assert_eq!(
                        next(state, event),
                        None,
                        "{state} --{event:?}--> must be refused"
                    );
                    refused += 1;
                }
            }
        }
        assert_eq!(
            refused + allowed.len(),
            ProvisionState::ALL.len() * EVENTS.len()
        );
    }

    #[test]
    fn no_verb_is_accepted_while_a_task_runs() {
        // deploying, deleting, cleaning and verifying belong to a running conductor task: the
        // API must answer every verb with 400 there (abort only stops a *wait*).
        for state in [
            ProvisionState::Deploying,
            ProvisionState::Deleting,
            ProvisionState::Cleaning,
            ProvisionState::Verifying,
        ] {
            assert!(!state.is_stable() && !state.is_waiting());
            for event in EVENTS {
                if let Event::Verb(verb) = event {
                    assert_eq!(next(state, event), None, "{verb:?} in {state}");
                }
            }
        }
    }

    #[test]
    fn flow_events_never_leave_a_stable_state() {
        // Done/Fail/Wait/Resume come from a running task; a node at rest has none.
        for state in ProvisionState::ALL.into_iter().filter(|s| s.is_stable()) {
            for event in [Event::Wait, Event::Resume, Event::Done, Event::Fail] {
                assert_eq!(next(state, event), None, "{event:?} in {state}");
            }
        }
    }

    #[test]
    fn every_state_is_reachable_from_enroll() {
        let mut reached = std::collections::HashSet::from([ProvisionState::Enroll]);
        let mut frontier = vec![ProvisionState::Enroll];
        while let Some(state) = frontier.pop() {
            for event in EVENTS {
                if let Some(to) = next(state, event) {
                    if reached.insert(to) {
                        frontier.push(to);
                    }
                }
            }
        }
        for state in ProvisionState::ALL {
            assert!(reached.contains(&state), "{state} unreachable");
        }
    }

    #[test]
    fn verbs_parse_as_the_api_spells_them() {
        for (target, verb) in [
            ("manage", Some(ProvisionVerb::Manage)),
            ("provide", Some(ProvisionVerb::Provide)),
            ("active", Some(ProvisionVerb::Deploy)),
            ("deploy", Some(ProvisionVerb::Deploy)),
            ("rebuild", Some(ProvisionVerb::Rebuild)),
            ("deleted", Some(ProvisionVerb::Undeploy)),
            ("undeploy", Some(ProvisionVerb::Undeploy)),
            ("abort", Some(ProvisionVerb::Abort)),
            ("inspect", None),
            ("Active", None),
            ("", None),
        ] {
            assert_eq!(ProvisionVerb::parse(target), verb, "{target:?}");
        }
    }

    #[test]
    fn power_names_round_trip() {
        for power in [
            NodePower::On,
            NodePower::Off,
            NodePower::Rebooting,
            NodePower::SoftRebooting,
            NodePower::SoftPowerOff,
        ] {
            let json = serde_json::to_string(&power).expect("serialises");
            assert_eq!(json, format!("\"{}\"", power.as_str()));
            assert_eq!(power.as_str().parse::<NodePower>(), Ok(power));
        }
        assert!("on".parse::<NodePower>().is_err());
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

    #[test]
    fn automated_cleaning_path_as_in_ironic() {
        use Event::*;
        use ProvisionState::*;
        // undeploy: deleting -> cleaning -wait-> clean wait -resume-> cleaning -done-> available
        let mut s = Active;
        for (event, want) in [
            (Verb(ProvisionVerb::Undeploy), Deleting),
            (Done, Cleaning),
            (Wait, CleanWait),
            (Resume, Cleaning),
            (Done, Available),
        ] {
            s = next(s, event).unwrap_or_else(|| panic!("{event:?} refused in {s}"));
            assert_eq!(s, want);
        }
        // a failure in cleaning or its wait -> clean failed -manage-> manageable -provide->
        // cleaning again; provide is refused in clean failed itself.
        assert_eq!(next(Cleaning, Fail), Some(CleanFailed));
        assert_eq!(next(CleanWait, Fail), Some(CleanFailed));
        assert_eq!(next(CleanFailed, Verb(ProvisionVerb::Provide)), None);
        assert_eq!(next(CleanFailed, Verb(ProvisionVerb::Deploy)), None);
        assert_eq!(
            next(CleanFailed, Verb(ProvisionVerb::Manage)),
            Some(Manageable)
        );
        assert_eq!(
            next(Manageable, Verb(ProvisionVerb::Provide)),
            Some(Cleaning)
        );
        assert!(CleanWait.is_waiting() && !Cleaning.is_waiting());
        assert!(CleanFailed.is_stable());
    }
}
