//! The `deploy` extension: `get_deploy_steps` lists the deploy steps this agent runs, and
//! `execute_deploy_step` runs one (ironic-python-agent `extensions/deploy.py`, the steps of its
//! `GenericHardwareManager.get_deploy_steps` in `hardware.py`).
//!
//! # Design
//! Two steps are offered, both at priority 0 on the `deploy` interface, as IPA lists them:
//! - `write_image` (args `image_info`, `configdrive`): Ironic's own out-of-band `write_image`
//!   step (priority 80 on its side) calls this one with the image; it runs
//!   `standby.prepare_image` ([`super::standby::Standby::prepare_image`]), so whole-disk and
//!   partition images are written by the one code path the `standby` extension uses;
//! - `erase_devices_metadata`: the clean step's eraser ([`super::clean`]).
//!
//! Wire shapes, IPA's: `get_deploy_steps` answers `{"deploy_steps": {"<manager>": [{"step",
//! "priority", "interface", "reboot_requested"}]}, "hardware_manager_version": {...}}` with the
//! manager name and version of `clean.get_clean_steps` (`vmdeploy_shared::api::clean`).
//! `execute_deploy_step` takes `{"step", "node", "ports", "deploy_version", ...}`; the step's
//! arguments are the extra parameters overlaid with `step.args`; it runs asynchronously and
//! answers `{"deploy_result": <step result>, "deploy_step": <the step as sent>}`. A
//! `deploy_version` that is not this agent's fails with `VersionMismatch` (status
//! `CLEAN_VERSION_MISMATCH`, as IPA reports it for deploy steps too), an unknown step with
//! `HardwareManagerMethodNotFound`, a step without a `step` name with `CommandExecutionError`.

use std::sync::Arc;

use serde_json::{json, Map, Value};
use vmdeploy_shared::api::clean::{ERASE_DEVICES_METADATA, HARDWARE_MANAGER};
use vmdeploy_shared::api::ipa::{CommandError, IpaErrorKind};

use super::clean::{
    check_versions, erase_devices_metadata, hardware_manager_version, unknown_step,
};
use super::server::{CommandFuture, StartError};
use super::standby::{DiskChoice, Standby};

/// The deploy step that writes the instance image.
pub const WRITE_IMAGE: &str = "write_image";

/// Parameters of `execute_deploy_step` that are not the step's arguments.
const OWN_PARAMS: [&str; 4] = ["step", "node", "ports", "deploy_version"];

/// The `deploy` extension.
pub struct Deploy {
    /// Writes images (`write_image` is `standby.prepare_image`).
    pub standby: Arc<Standby>,
    /// The install disk, for `erase_devices_metadata`.
    pub disk: DiskChoice,
}

/// One deploy step as IPA lists it (deploy steps carry no `abortable`).
fn listed_step(name: &str) -> Value {
    json!({"step": name, "priority": 0, "interface": "deploy", "reboot_requested": false})
}

/// The `command_result` of `get_deploy_steps`.
pub fn deploy_steps() -> Value {
    json!({
        "deploy_steps": {
            HARDWARE_MANAGER: [listed_step(ERASE_DEVICES_METADATA), listed_step(WRITE_IMAGE)]
        },
        "hardware_manager_version": hardware_manager_version(),
    })
}

impl Deploy {
    /// Starts `deploy.<cmd>`.
    pub fn start(&self, cmd: &str, params: &Value) -> Result<CommandFuture, StartError> {
        match cmd {
            "get_deploy_steps" => {
                let steps = deploy_steps();
                Ok(Box::pin(async move { Ok(steps) }))
            }
            "execute_deploy_step" => self.execute(params),
            other => Err(StartError::UnknownCommand(format!("deploy.{other}"))),
        }
    }

    fn execute(&self, params: &Value) -> Result<CommandFuture, StartError> {
        let Some(obj) = params.as_object() else {
            return Err(StartError::InvalidParams(
                "execute_deploy_step: params must be an object".into(),
            ));
        };
        let Some(step) = obj.get("step").filter(|s| s.is_object()).cloned() else {
            return Err(StartError::InvalidParams(
                "execute_deploy_step: `step` (an object) is required".into(),
            ));
        };
        let version = obj.get("deploy_version").cloned();
        let args = step_args(obj, &step);
        let standby = Arc::clone(&self.standby);
        let disk = Arc::clone(&self.disk);
        Ok(Box::pin(async move {
            check_versions(version.as_ref())?;
            let Some(name) = step.get("step").and_then(Value::as_str).map(str::to_owned) else {
                return Err(CommandError::new(
                    IpaErrorKind::CommandExecution,
                    format!("Malformed deploy_step, no \"step\" key: {step}"),
                ));
            };
            tracing::info!(step = %name, "deploy step starting");
            let result = match name.as_str() {
                WRITE_IMAGE => write_image(&standby, &args).await?,
                ERASE_DEVICES_METADATA => {
                    erase_devices_metadata(&disk, IpaErrorKind::Deployment).await?
                }
                other => return Err(unknown_step(other)),
            };
            tracing::info!(step = %name, "deploy step completed");
            Ok(json!({"deploy_result": result, "deploy_step": step}))
        }))
    }
}

/// The step's arguments: the extra parameters of the command, overlaid with `step.args` (IPA:
/// `kwargs.update(step.get('args') or {})`).
fn step_args(params: &Map<String, Value>, step: &Value) -> Map<String, Value> {
    let mut args: Map<String, Value> = params
        .iter()
        .filter(|(k, _)| !OWN_PARAMS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(from_step) = step.get("args").and_then(Value::as_object) {
        args.extend(from_step.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    args
}

/// `write_image`: `standby.prepare_image` with the step's `image_info` and `configdrive`; its
/// result (`{"result": "prepare_image: ..."}`) is the step's, as in IPA. A refusal of the
/// parameters becomes the step's failure (IPA validates them inside the running step).
async fn write_image(standby: &Standby, args: &Map<String, Value>) -> Result<Value, CommandError> {
    let Some(image_info) = args.get("image_info").filter(|v| v.is_object()) else {
        return Err(CommandError::new(
            IpaErrorKind::InvalidCommandParams,
            "write_image: image_info (an object) is required",
        ));
    };
    let params = json!({
        "image_info": image_info,
        "configdrive": args.get("configdrive").cloned().unwrap_or(Value::Null),
    });
    match standby.prepare_image(&params) {
        Ok(run) => run.await,
        Err(e) => Err(CommandError::new(e.kind(), format!("write_image: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest as _;
    use std::io::{Read as _, Write as _};
    use std::path::PathBuf;
    use std::sync::Mutex;
    use tokio::sync::Notify;

    /// The versions `get_deploy_steps` hands out, as Ironic stores and sends them back.
    fn our_version() -> Value {
        json!({"generic_hardware_manager": "1.1"})
    }

    fn deploy_on(disk: Result<PathBuf, String>) -> Deploy {
        let disk: DiskChoice = Arc::new(disk);
        Deploy {
            standby: Arc::new(Standby {
                disk: Arc::clone(&disk),
                ca_pem: None,
                progress: Arc::new(Mutex::new(None)),
                power_off: Arc::new(Notify::new()),
                installed: crate::install::InstalledState::default(),
            }),
            disk,
        }
    }

    async fn run(deploy: &Deploy, cmd: &str, params: Value) -> Result<Value, CommandError> {
        match deploy.start(cmd, &params) {
            Ok(f) => f.await,
            Err(e) => panic!("{cmd} refused: {e}"),
        }
    }

    /// Serves `body` to every GET on 127.0.0.1 (one response per connection).
    fn serve_image(body: Vec<u8>) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let url = format!("http://{}/image.raw", listener.local_addr().expect("addr"));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match conn.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => break,
                    }
                }
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: \
                     application/octet-stream\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(&body);
            }
        });
        url
    }

    #[tokio::test]
    async fn get_deploy_steps_answers_ipas_shape() {
        let deploy = deploy_on(Err("none".into()));
        let v = run(
            &deploy,
            "get_deploy_steps",
            json!({"node": {}, "ports": []}),
        )
        .await
        .expect("steps");
        // As IPA's deploy extension answers and Ironic's refresh_steps reads it: steps by
        // manager, each with step/priority/interface/reboot_requested (no abortable), and the
        // versions Ironic sends back as deploy_version; the same manager and version as
        // clean.get_clean_steps.
        assert_eq!(
            v,
            json!({
                "deploy_steps": {"GenericHardwareManager": [
                    {"step": "erase_devices_metadata", "priority": 0, "interface": "deploy",
                     "reboot_requested": false},
                    {"step": "write_image", "priority": 0, "interface": "deploy",
                     "reboot_requested": false}
                ]},
                "hardware_manager_version": {"generic_hardware_manager": "1.1"}
            })
        );
        let clean = super::super::clean::clean_steps();
        assert_eq!(
            v["hardware_manager_version"],
            serde_json::to_value(&clean.hardware_manager_version).expect("json")
        );
    }

    #[tokio::test]
    async fn write_image_runs_prepare_image_with_the_steps_args() {
        let dir = tempfile::Builder::new()
            .prefix("vmdeploy-deploy-test")
            .tempdir_in("/var/tmp")
            .expect("scratch");
        let disk = dir.path().join("disk.img");
        std::fs::write(&disk, vec![0u8; 4 << 20]).expect("disk");
        let mut image = vec![0x33u8; 1 << 20];
        image[510] = 0x55;
        image[511] = 0xAA;
        let sha: String = sha2::Sha256::digest(&image)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let url = serve_image(image.clone());
        let deploy = deploy_on(Ok(disk.clone()));
        // What Ironic 39's AgentDeploy.write_image sends (agent.py): the in-band step with no
        // priority and its arguments in `args`; agent_client adds node, ports and
        // deploy_version.
        let step = json!({"interface": "deploy", "step": "write_image", "args": {
            "image_info": {"id": "img-1", "urls": [url], "disk_format": "raw",
                           "container_format": "bare", "stream_raw_images": true,
                           "os_hash_algo": "sha256", "os_hash_value": sha,
                           "node_uuid": "node-1"},
            "configdrive": null}});
        let v = run(
            &deploy,
            "execute_deploy_step",
            json!({"step": step, "node": {"uuid": "node-1", "instance_info": {}},
                   "ports": [], "deploy_version": our_version()}),
        )
        .await
        .expect("written");
        assert_eq!(v.as_object().expect("object").len(), 2, "{v}");
        assert_eq!(v["deploy_step"], step, "the step echoed as sent");
        let msg = v["deploy_result"]["result"]
            .as_str()
            .expect("IPA's result text");
        assert!(
            msg.starts_with("prepare_image: image (img-1) written to device"),
            "{msg}"
        );
        let back = std::fs::read(&disk).expect("read back");
        assert_eq!(&back[..image.len()], image.as_slice());
    }

    #[tokio::test]
    async fn versions_unknown_steps_and_bad_params_fail_as_ipa_does() {
        let deploy = deploy_on(Err("no disk matches the hints".into()));
        let write = json!({"interface": "deploy", "step": "write_image",
                           "args": {"image_info": {"id": "i", "urls": ["http://127.0.0.1:9/x"],
                                                   "checksum": "a".repeat(32)}}});
        let err = run(
            &deploy,
            "execute_deploy_step",
            json!({"step": write, "node": {}, "ports": [],
                   "deploy_version": {"generic_hardware_manager": "0.9"}}),
        )
        .await
        .expect_err("other version");
        assert_eq!((err.kind.as_str(), err.code), ("VersionMismatch", 409));
        let err = run(
            &deploy,
            "execute_deploy_step",
            json!({"step": {"interface": "raid", "step": "apply_configuration", "args": {}},
                   "node": {}, "ports": [], "deploy_version": our_version()}),
        )
        .await
        .expect_err("not offered");
        assert_eq!(err.kind, "HardwareManagerMethodNotFound");
        assert!(
            err.message.contains("apply_configuration"),
            "{}",
            err.message
        );
        let err = run(
            &deploy,
            "execute_deploy_step",
            json!({"step": {"interface": "deploy"}, "node": {}, "ports": []}),
        )
        .await
        .expect_err("malformed");
        assert_eq!(err.kind, "CommandExecutionError");
        assert!(
            err.message.contains("Malformed deploy_step"),
            "{}",
            err.message
        );
        let err = run(
            &deploy,
            "execute_deploy_step",
            json!({"step": {"interface": "deploy", "step": "write_image", "args": {}},
                   "node": {}, "ports": [], "deploy_version": null}),
        )
        .await
        .expect_err("no image_info");
        assert_eq!(err.kind, "InvalidCommandParamsError");
        // A null deploy_version skips the check (IPA: the first run); then no disk.
        let err = run(
            &deploy,
            "execute_deploy_step",
            json!({"step": write, "node": {}, "ports": [], "deploy_version": null}),
        )
        .await
        .expect_err("no disk");
        assert_eq!(err.kind, "DeviceNotFound");
        let err = run(
            &deploy,
            "execute_deploy_step",
            json!({"step": {"interface": "deploy", "step": "erase_devices_metadata",
                            "priority": 0}, "node": {}, "ports": []}),
        )
        .await
        .expect_err("no disk to erase");
        assert_eq!(err.kind, "DeviceNotFound");
        assert!(matches!(
            deploy.start("execute_deploy_step", &json!({"node": {}})),
            Err(StartError::InvalidParams(_))
        ));
        assert!(matches!(
            deploy.start("zap", &json!({})),
            Err(StartError::UnknownCommand(_))
        ));
    }

    #[test]
    fn step_args_are_the_extra_params_overlaid_with_step_args() {
        let params = json!({"step": {}, "node": {}, "ports": [], "deploy_version": null,
                            "configdrive": "from-params", "extra": 1});
        let step = json!({"step": "write_image", "args": {"configdrive": "from-step"}});
        let args = step_args(params.as_object().expect("object"), &step);
        assert_eq!(
            Value::Object(args),
            json!({"configdrive": "from-step", "extra": 1})
        );
    }
}
