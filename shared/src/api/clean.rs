//! The agent's `clean` extension on the wire: `clean.get_clean_steps` and
//! `clean.execute_clean_step` (ironic-python-agent `extensions/clean.py`, the steps of its
//! `GenericHardwareManager` in `hardware.py`; docs/ironic-protocols.md §3.3).
//!
//! # Design
//! Types only; the agent's extension (`agent/src/api/clean.rs`) and the conductor's cleaning
//! flow (`conductor/src/deploy/clean.rs`) both use them, so the two ends cannot drift apart. The
//! field names are IPA's, checked by the tests below against what IPA sends:
//! - `get_clean_steps` takes `{"node", "ports"}` and answers (synchronously) with
//!   `{"clean_steps": {"<hardware manager class>": [<step>, ...]}, "hardware_manager_version":
//!   {"<manager name>": "<version>"}}`;
//! - a step is `{"step", "priority", "interface", "reboot_requested", "abortable"}`;
//! - `execute_clean_step` takes `{"step": <step>, "node", "ports", "clean_version":
//!   <hardware_manager_version>}`, runs asynchronously, and its result is
//!   `{"clean_result": <what the step returned>, "clean_step": <step>}`. A different
//!   `clean_version` fails with `CleanVersionMismatch`; a failed step with `CleaningError`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The command that lists the agent's clean steps.
pub const GET_CLEAN_STEPS: &str = "clean.get_clean_steps";
/// The command that runs one clean step.
pub const EXECUTE_CLEAN_STEP: &str = "clean.execute_clean_step";
/// The `command_name` of [`EXECUTE_CLEAN_STEP`] in the agent's command list.
pub const EXECUTE_CLEAN_STEP_NAME: &str = "execute_clean_step";
/// Ironic's default automated clean step: erase partition tables and file-system signatures.
pub const ERASE_DEVICES_METADATA: &str = "erase_devices_metadata";
/// IPA's full-disk erase (shred or ATA secure erase); vmdeploy's agent does not offer it and
/// the conductor never enables it.
pub const ERASE_DEVICES: &str = "erase_devices";
/// IPA's priority of [`ERASE_DEVICES_METADATA`] (`GenericHardwareManager.get_clean_steps`).
pub const ERASE_DEVICES_METADATA_PRIORITY: i64 = 99;
/// The key of the agent's steps in `clean_steps` (IPA: the hardware manager's class name).
pub const HARDWARE_MANAGER: &str = "GenericHardwareManager";
/// The key of the agent's version in `hardware_manager_version` (IPA: the manager's
/// `HARDWARE_MANAGER_NAME`).
pub const HARDWARE_MANAGER_NAME: &str = "generic_hardware_manager";
/// vmdeploy's agent's version of its hardware manager (IPA's generic manager says `1.1`; a
/// change of what a step does moves it on).
pub const HARDWARE_MANAGER_VERSION: &str = "1.1";

/// One clean step as the agent lists it and the conductor asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanStep {
    /// The step's name (`erase_devices_metadata`).
    pub step: String,
    /// 0: not run by automated cleaning; higher runs first.
    pub priority: i64,
    /// The driver interface it belongs to (`deploy`, `raid`, `management`, ...).
    pub interface: String,
    /// Whether the node must reboot after the step.
    #[serde(default)]
    pub reboot_requested: bool,
    /// Whether the step may be aborted while it runs.
    #[serde(default)]
    pub abortable: bool,
}

impl CleanStep {
    /// The `deploy` interface step `name` at `priority`, no reboot, abortable (how IPA lists its
    /// erase steps).
    pub fn deploy(name: &str, priority: i64) -> CleanStep {
        CleanStep {
            step: name.to_owned(),
            priority,
            interface: "deploy".to_owned(),
            reboot_requested: false,
            abortable: true,
        }
    }
}

/// Versions of the agent's hardware managers, by manager name.
pub type HardwareManagerVersion = BTreeMap<String, String>;

/// The `params` of `clean.get_clean_steps`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GetCleanStepsParams {
    /// The node as the conductor shows it to the agent.
    #[serde(default)]
    pub node: Value,
    /// The node's ports.
    #[serde(default)]
    pub ports: Value,
}

/// The `command_result` of `clean.get_clean_steps`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CleanStepsResult {
    /// Steps by hardware manager.
    pub clean_steps: BTreeMap<String, Vec<CleanStep>>,
    /// The managers' versions; sent back as `clean_version` with every step.
    #[serde(default)]
    pub hardware_manager_version: HardwareManagerVersion,
}

/// The `params` of `clean.execute_clean_step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecuteCleanStepParams {
    /// The step to run.
    pub step: CleanStep,
    /// The node as the conductor shows it to the agent.
    #[serde(default)]
    pub node: Value,
    /// The node's ports.
    #[serde(default)]
    pub ports: Value,
    /// `hardware_manager_version` from `get_clean_steps`; `None` skips the check.
    #[serde(default)]
    pub clean_version: Option<HardwareManagerVersion>,
}

/// The `command_result` of a finished `clean.execute_clean_step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecuteCleanStepResult {
    /// What the step returned (`null` for the erase steps).
    #[serde(default)]
    pub clean_result: Value,
    /// The step that ran.
    pub clean_step: CleanStep,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `get_clean_steps`' answer as IPA sends it, field for field (IPA
    /// `extensions/clean.py:get_clean_steps` returns `{'clean_steps': <steps by manager>,
    /// 'hardware_manager_version': <versions>}`; `hardware.py:GenericHardwareManager.
    /// get_clean_steps` lists `{'step', 'priority', 'interface', 'reboot_requested',
    /// 'abortable'}`, `erase_devices` at 10 and `erase_devices_metadata` at 99).
    #[test]
    fn get_clean_steps_answer_reads_ipas_shape() {
        let ipa = json!({
            "clean_steps": {"GenericHardwareManager": [
                {"step": "erase_devices", "priority": 10, "interface": "deploy",
                 "reboot_requested": false, "abortable": true},
                {"step": "erase_devices_metadata", "priority": 99, "interface": "deploy",
                 "reboot_requested": false, "abortable": true},
                {"step": "delete_configuration", "priority": 0, "interface": "raid",
                 "reboot_requested": false, "abortable": true}
            ]},
            "hardware_manager_version": {"generic_hardware_manager": "1.1"}
        });
        let parsed: CleanStepsResult = serde_json::from_value(ipa.clone()).expect("IPA's shape");
        let steps = &parsed.clean_steps[HARDWARE_MANAGER];
        assert_eq!(steps.len(), 3);
        assert_eq!(
            steps[1],
            CleanStep::deploy(ERASE_DEVICES_METADATA, ERASE_DEVICES_METADATA_PRIORITY)
        );
        assert_eq!(steps[2].interface, "raid");
        assert_eq!(
            parsed.hardware_manager_version[HARDWARE_MANAGER_NAME],
            HARDWARE_MANAGER_VERSION
        );
        // And written back with the same names.
        assert_eq!(serde_json::to_value(&parsed).expect("serialises"), ipa);
    }

    /// `execute_clean_step`'s parameters as Ironic's agent client sends them
    /// (`agent_client.execute_clean_step`: `{'step', 'node', 'ports', 'clean_version'}`) and
    /// its result as IPA returns it (`{'clean_result', 'clean_step'}`).
    #[test]
    fn execute_clean_step_params_and_result_use_ipas_names() {
        let params = ExecuteCleanStepParams {
            step: CleanStep::deploy(ERASE_DEVICES_METADATA, 99),
            node: json!({"uuid": "u"}),
            ports: json!([]),
            clean_version: Some(HardwareManagerVersion::from([(
                HARDWARE_MANAGER_NAME.to_owned(),
                "1.1".to_owned(),
            )])),
        };
        assert_eq!(
            serde_json::to_value(&params).expect("serialises"),
            json!({
                "step": {"step": "erase_devices_metadata", "priority": 99, "interface": "deploy",
                         "reboot_requested": false, "abortable": true},
                "node": {"uuid": "u"},
                "ports": [],
                "clean_version": {"generic_hardware_manager": "1.1"}
            })
        );
        // An older conductor sends the step without the optional flags and no version.
        let minimal: ExecuteCleanStepParams = serde_json::from_value(json!({
            "step": {"step": "erase_devices_metadata", "priority": 99, "interface": "deploy"},
            "node": {}, "ports": []
        }))
        .expect("minimal");
        assert_eq!(minimal.clean_version, None);
        assert!(!minimal.step.abortable);
        let result: ExecuteCleanStepResult = serde_json::from_value(json!({
            "clean_result": null,
            "clean_step": {"step": "erase_devices_metadata", "priority": 99,
                           "interface": "deploy", "reboot_requested": false,
                           "abortable": true}
        }))
        .expect("IPA's result");
        assert_eq!(result.clean_step.step, ERASE_DEVICES_METADATA);
        assert!(serde_json::from_value::<ExecuteCleanStepParams>(json!({"node": {}})).is_err());
    }
}
