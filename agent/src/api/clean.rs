//! The `clean` extension: `get_clean_steps` lists what this agent can clean, and
//! `execute_clean_step` runs one step (ironic-python-agent `extensions/clean.py`; wire types in
//! `vmdeploy_shared::api::clean`).
//!
//! # Design
//! One step is offered: `erase_devices_metadata` at IPA's priority 99, which erases the
//! partition metadata of the install disk (the disk the root device hints pick, as the deploy
//! picks it) with [`crate::disk::erase`]. `erase_devices` (a full overwrite) is not offered: a
//! conductor that asks for it, or for any other step, gets a FAILED result with IPA's
//! `HardwareManagerMethodNotFound`, never a refused request, as IPA's dispatch does. A
//! `clean_version` that is not this agent's fails with IPA's `VersionMismatch` and the command
//! ends `CLEAN_VERSION_MISMATCH` (Ironic restarts cleaning on it); [`check_versions`] is that
//! check for the `deploy` extension too. The result echoes the step as the conductor sent it
//! (`args` and all), as IPA does.

use std::sync::Arc;

use serde_json::{json, Value};
use vmdeploy_shared::api::clean::{
    CleanStep, CleanStepsResult, ExecuteCleanStepParams, HardwareManagerVersion,
    ERASE_DEVICES_METADATA, ERASE_DEVICES_METADATA_PRIORITY, HARDWARE_MANAGER,
    HARDWARE_MANAGER_NAME, HARDWARE_MANAGER_VERSION,
};
use vmdeploy_shared::api::ipa::{CommandError, IpaErrorKind};

use super::server::{CommandFuture, StartError};
use super::standby::{require_disk, DiskChoice};
use crate::disk::erase::erase_metadata;
use crate::disk::Disk;

/// The `clean` extension.
pub struct Clean {
    /// The install disk.
    pub disk: DiskChoice,
}

/// This agent's hardware manager versions (`hardware_manager_version`).
pub fn hardware_manager_version() -> HardwareManagerVersion {
    HardwareManagerVersion::from([(
        HARDWARE_MANAGER_NAME.to_owned(),
        HARDWARE_MANAGER_VERSION.to_owned(),
    )])
}

/// IPA's `hardware.check_versions`: `provided` (the conductor's `clean_version` or
/// `deploy_version`, the `hardware_manager_version` it was given) must equal this agent's;
/// absent or `null` skips the check (a conductor's first run).
pub fn check_versions(provided: Option<&Value>) -> Result<(), CommandError> {
    let Some(provided) = provided.filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let ours = hardware_manager_version();
    let ours_json = json!(ours);
    if *provided == ours_json {
        return Ok(());
    }
    Err(CommandError::new(
        IpaErrorKind::CleanVersionMismatch,
        format!(
            "Hardware managers version mismatch, reload agent with correct version: Current \
             versions: {ours_json}, versions used by ironic: {provided}"
        ),
    ))
}

/// IPA's error for a step no hardware manager of this agent has.
pub fn unknown_step(step: &str) -> CommandError {
    CommandError::new(
        IpaErrorKind::HardwareManagerMethodNotFound,
        format!(
            "No HardwareManager found to handle method: Could not find method: {step} (this \
             agent offers {ERASE_DEVICES_METADATA} and, as a deploy step, write_image)"
        ),
    )
}

/// The steps this agent offers.
pub fn clean_steps() -> CleanStepsResult {
    CleanStepsResult {
        clean_steps: [(
            HARDWARE_MANAGER.to_owned(),
            vec![CleanStep::deploy(
                ERASE_DEVICES_METADATA,
                ERASE_DEVICES_METADATA_PRIORITY,
            )],
        )]
        .into(),
        hardware_manager_version: hardware_manager_version(),
    }
}

impl Clean {
    /// Starts `clean.<cmd>`.
    pub fn start(&self, cmd: &str, params: &Value) -> Result<CommandFuture, StartError> {
        match cmd {
            "get_clean_steps" => {
                let steps = serde_json::to_value(clean_steps())
                    .map_err(|e| StartError::InvalidParams(format!("listing steps: {e}")))?;
                Ok(Box::pin(async move { Ok(steps) }))
            }
            "execute_clean_step" => self.execute(params),
            other => Err(StartError::UnknownCommand(format!("clean.{other}"))),
        }
    }

    fn execute(&self, params: &Value) -> Result<CommandFuture, StartError> {
        let parsed: ExecuteCleanStepParams = serde_json::from_value(params.clone())
            .map_err(|e| StartError::InvalidParams(format!("execute_clean_step: {e}")))?;
        // Echoed back as sent: Ironic compares it with the step it asked for.
        let step = params.get("step").cloned().unwrap_or(Value::Null);
        let version = params.get("clean_version").cloned();
        let disk = Arc::clone(&self.disk);
        Ok(Box::pin(async move {
            check_versions(version.as_ref())?;
            let result = match parsed.step.step.as_str() {
                ERASE_DEVICES_METADATA => {
                    erase_devices_metadata(&disk, IpaErrorKind::Cleaning).await?
                }
                other => return Err(unknown_step(other)),
            };
            tracing::info!(step = %parsed.step.step, "clean step completed");
            Ok(json!({"clean_result": result, "clean_step": step}))
        }))
    }
}

/// Erases the install disk's partition metadata; the result says what was erased. A failure is
/// of kind `failure` (`CleaningError` for a clean step, `DeploymentError` for a deploy step).
pub async fn erase_devices_metadata(
    disk: &DiskChoice,
    failure: IpaErrorKind,
) -> Result<Value, CommandError> {
    let path = require_disk(disk)?;
    let shown = path.display().to_string();
    tracing::info!(disk = %shown, "erase_devices_metadata: erasing partition metadata");
    let outcome = tokio::task::spawn_blocking(move || {
        let disk = Disk::open(&path)?;
        erase_metadata(&disk)
    })
    .await;
    let failed = |what: String| {
        CommandError::new(
            failure,
            format!("Error performing {ERASE_DEVICES_METADATA}: {what}"),
        )
    };
    match outcome {
        Ok(Ok(report)) => {
            tracing::info!(disk = %shown, table = report.table, partitions = report.partitions.len(), "partition metadata erased");
            Ok(json!({
                "device": shown,
                "table": report.table,
                "partitions": report.partitions.len(),
                "skipped": report.skipped,
                "bytes_zeroed": report.zeroed,
            }))
        }
        Ok(Err(e)) => Err(failed(format!("erasing {shown}: {e}"))),
        Err(e) => Err(failed(format!("the eraser task died: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    async fn run(clean: &Clean, cmd: &str, params: Value) -> Result<Value, CommandError> {
        match clean.start(cmd, &params) {
            Ok(f) => f.await,
            Err(e) => panic!("{cmd} refused: {e}"),
        }
    }

    fn clean_on(disk: Result<PathBuf, String>) -> Clean {
        Clean {
            disk: Arc::new(disk),
        }
    }

    #[tokio::test]
    async fn get_clean_steps_answers_ipas_shape() {
        let clean = clean_on(Err("none".into()));
        let v = run(&clean, "get_clean_steps", json!({"node": {}, "ports": []}))
            .await
            .expect("steps");
        // Field names as IPA's GenericHardwareManager writes them.
        assert_eq!(
            v,
            json!({
                "clean_steps": {"GenericHardwareManager": [
                    {"step": "erase_devices_metadata", "priority": 99, "interface": "deploy",
                     "reboot_requested": false, "abortable": true}
                ]},
                "hardware_manager_version": {"generic_hardware_manager": "1.1"}
            })
        );
    }

    #[tokio::test]
    async fn execute_erases_the_install_disk() {
        let dir = tempfile::Builder::new()
            .prefix("vmdeploy-clean-test")
            .tempdir_in("/var/tmp")
            .expect("scratch");
        let path = dir.path().join("disk.img");
        let mut data = vec![0x5Au8; 4 << 20];
        data[510] = 0x55;
        data[511] = 0xAA;
        std::fs::write(&path, &data).expect("disk");
        let clean = clean_on(Ok(path.clone()));
        // As Ironic 39 sends it: its cached step plus `requires_ramdisk`, echoed back whole.
        let step = json!({"step": "erase_devices_metadata", "priority": 99, "interface": "deploy",
                          "reboot_requested": false, "abortable": true,
                          "requires_ramdisk": true});
        let v = run(
            &clean,
            "execute_clean_step",
            json!({"step": step, "node": {}, "ports": [],
                   "clean_version": {"generic_hardware_manager": "1.1"}}),
        )
        .await
        .expect("erased");
        assert_eq!(v["clean_step"], step);
        assert_eq!(v["clean_result"]["bytes_zeroed"], 2 << 20);
        let back = std::fs::read(&path).expect("read");
        let mib = 1 << 20;
        assert!(back[..mib].iter().all(|&b| b == 0), "first MiB zeroed");
        assert!(back[3 * mib..].iter().all(|&b| b == 0), "last MiB zeroed");
        assert!(
            back[mib..3 * mib].iter().all(|&b| b == 0x5A),
            "the rest kept"
        );
    }

    #[tokio::test]
    async fn unknown_steps_versions_and_disks_fail_without_panicking() {
        let clean = clean_on(Err("no disk matches the hints".into()));
        let err = run(
            &clean,
            "execute_clean_step",
            json!({"step": {"step": "erase_devices", "priority": 10, "interface": "deploy"},
                   "node": {}, "ports": []}),
        )
        .await
        .expect_err("not offered");
        // IPA's dispatch_to_managers error for a method no manager has.
        assert_eq!(err.kind, "HardwareManagerMethodNotFound");
        assert_eq!(err.code, 500);
        assert!(err.message.contains("erase_devices"), "{}", err.message);
        let err = run(
            &clean,
            "execute_clean_step",
            json!({"step": {"step": "erase_devices_metadata", "priority": 99,
                            "interface": "deploy"},
                   "node": {}, "ports": [], "clean_version": {"generic_hardware_manager": "9"}}),
        )
        .await
        .expect_err("other version");
        // IPA 13's errors.VersionMismatch, code 409.
        assert_eq!(err.kind, "VersionMismatch");
        assert_eq!(err.code, 409);
        assert!(
            err.message
                .starts_with("Hardware managers version mismatch"),
            "{}",
            err.message
        );
        let err = run(
            &clean,
            "execute_clean_step",
            json!({"step": {"step": "erase_devices_metadata", "priority": 99,
                            "interface": "deploy"}, "node": {}, "ports": []}),
        )
        .await
        .expect_err("no disk");
        assert_eq!(err.kind, "DeviceNotFound");
        assert!(matches!(
            clean.start("execute_clean_step", &json!({"node": {}})),
            Err(StartError::InvalidParams(_))
        ));
        assert!(matches!(
            clean.start("zap", &json!({})),
            Err(StartError::UnknownCommand(_))
        ));
    }
}
