//! The fake executor behind a node's command API: the agent's extensions, answered as the
//! agent answers them, with no disk (the harness's step 4).
//!
//! # Design
//! The agent's [`Executor`] trait, so the agent's own `CommandApi` runs these commands (token,
//! one at a time, history, `wait`). What `agent_ilo` deploys, cleanings and undeploys send
//! (`conductor/src/deploy/agent.rs`, `clean.rs`, `agent_session/`) and what else the agent
//! serves:
//! - `standby.prepare_image`: the agent's parameter checks (a URL, a checksum:
//!   [`expected_digest`]), then [`Config::write_delay`](super::Config::write_delay) of
//!   "writing" with progress for the heartbeats, and the agent's result text
//!   `prepare_image: image (<id>) written to device <disk> (<n> bytes, <algo>:<hex>)`. With
//!   `verify_image` the image is downloaded and its checksum checked first (a mismatch fails
//!   as the agent's `ImageChecksumError`);
//! - `standby.get_partition_uuids` (`root uuid`: the MBR disk signature, IPA's
//!   `0x%08x`), `standby.sync`, `standby.power_off` (ends the ramdisk);
//! - `clean.get_clean_steps` and `deploy.get_deploy_steps`: the agent's own lists;
//!   `clean.execute_clean_step` and `deploy.execute_deploy_step` (`erase_devices_metadata`
//!   waits [`Config::clean_step_delay`](super::Config::clean_step_delay), `write_image` is
//!   `prepare_image`), with the agent's version check and unknown-step error;
//! - `log.collect_system_logs`: a small gzipped tarball saying it is a fake.
//!
//! Every command started is counted by name; a refused one (unknown extension or command, bad
//! parameters) and a failed one are kept as errors too: the conductor asked for something the
//! harness does not do, or the deploy went wrong.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Map, Value};
use tokio::sync::Notify;
use vmdeploy_agent::api::clean::{check_versions, clean_steps, unknown_step};
use vmdeploy_agent::api::deploy::{deploy_steps, WRITE_IMAGE};
use vmdeploy_agent::api::server::{CommandFuture, Executor, StartError};
use vmdeploy_agent::api::standby::expected_digest;
use vmdeploy_shared::api::clean::{ExecuteCleanStepParams, ERASE_DEVICES_METADATA};
use vmdeploy_shared::api::ipa::{CommandError, IpaErrorKind, WriteProgress};
use vmdeploy_shared::io::hash::{ExpectedDigest, Hasher};

use super::ramdisk::{node_client, Trust};
use super::Shared;

/// The install disk every fake node reports.
pub const FAKE_DISK: &str = "/dev/sda";

/// Parameters of `execute_deploy_step` that are not the step's arguments (the agent's).
const OWN_PARAMS: [&str; 4] = ["step", "node", "ports", "deploy_version"];

/// `log.collect_system_logs`' bundle: gzip (mtime 0) of a ustar archive holding
/// `fake-ramdisk.txt` = "fake-ramdisk: no logs (test harness)\n", made with Python's `tarfile`
/// (USTAR_FORMAT, mtime 0) and `gzip.compress(raw, mtime=0)`.
const LOGS_TAR_GZ: [u8; 137] = [
    0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0xed, 0xd1, 0xb1, 0x0a, 0xc2, 0x40,
    0x10, 0x84, 0xe1, 0xad, 0x7d, 0x8a, 0x2d, 0xb5, 0x50, 0x36, 0x78, 0x5a, 0xf8, 0x36, 0x07, 0x5e,
    0xa2, 0x44, 0x13, 0xb8, 0x3d, 0xc1, 0xc7, 0xcf, 0x69, 0xa3, 0xd8, 0x47, 0x04, 0xff, 0xaf, 0x99,
    0x65, 0x9a, 0x29, 0xb6, 0x8d, 0x7d, 0x5a, 0xe7, 0x78, 0x3d, 0x9e, 0xbd, 0xdf, 0x94, 0x7b, 0x91,
    0x19, 0x58, 0xb5, 0x0f, 0xe1, 0x99, 0xd5, 0x67, 0x9a, 0x85, 0xdd, 0xeb, 0x7e, 0xf4, 0x4d, 0x63,
    0x61, 0x2b, 0x6a, 0xf2, 0x05, 0x37, 0x2f, 0x31, 0xd7, 0x79, 0xf9, 0x4f, 0xed, 0xdb, 0xff, 0x0f,
    0x3a, 0x8c, 0x7a, 0x19, 0x3b, 0xd7, 0x65, 0x49, 0x5e, 0xf4, 0x14, 0xf3, 0x90, 0xdc, 0x57, 0x0b,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xfc, 0x9a,
    0x09, 0x6d, 0x4a, 0x21, 0xdc, 0x00, 0x28, 0x00, 0x00,
];

/// The image write of one boot, for the heartbeats' progress.
#[derive(Debug, Clone, Copy)]
struct WriteState {
    started: Instant,
    planned: Duration,
    total: u64,
    ended: Option<Instant>,
}

/// What one boot's command API and heartbeat loop share.
#[derive(Debug)]
pub struct NodeState {
    /// The server's index.
    pub index: usize,
    /// `standby.power_off` arrived: the ramdisk ends.
    pub power_off: Notify,
    /// A command finished: heartbeat early.
    pub command_done: Notify,
    write: Mutex<Option<WriteState>>,
    /// The MBR disk signature of the "written" image.
    signature: Mutex<u32>,
}

impl NodeState {
    /// A fresh boot of server `index`.
    pub fn new(index: usize) -> NodeState {
        NodeState {
            index,
            power_off: Notify::new(),
            command_done: Notify::new(),
            write: Mutex::new(None),
            // A made-up signature per node until an image is read.
            signature: Mutex::new(0x7e57_0000 | (index as u32 & 0xffff)),
        }
    }

    /// The write progress to report, once a write started: as if the image went to disk at
    /// an even pace over the write's planned time.
    pub fn progress(&self) -> Option<WriteProgress> {
        let w = (*self.write.lock().ok()?)?;
        let end = w.ended.unwrap_or_else(Instant::now);
        let elapsed = end.saturating_duration_since(w.started);
        let written = if w.ended.is_some() || w.planned.is_zero() {
            w.total
        } else {
            let share = (elapsed.as_secs_f64() / w.planned.as_secs_f64()).min(1.0);
            (w.total as f64 * share) as u64
        };
        let secs = elapsed.as_secs_f64();
        Some(WriteProgress {
            written,
            total: Some(w.total),
            rate: if secs > 0.0 {
                (written as f64 / secs) as u64
            } else {
                0
            },
        })
    }

    fn set_write(&self, state: WriteState) {
        if let Ok(mut w) = self.write.lock() {
            *w = Some(state);
        }
    }

    fn signature(&self) -> u32 {
        self.signature.lock().map(|s| *s).unwrap_or(0)
    }
}

/// The fake agent of one ramdisk boot.
pub struct FakeExecutor {
    shared: Arc<Shared>,
    node: Arc<NodeState>,
    ip: IpAddr,
    image_ca: Option<Vec<u8>>,
}

impl FakeExecutor {
    /// The executor of node `node` at `ip`, trusting `image_ca` (the floppy's CAs) for image
    /// downloads.
    pub(crate) fn new(
        shared: Arc<Shared>,
        node: Arc<NodeState>,
        ip: IpAddr,
        image_ca: Option<Vec<u8>>,
    ) -> FakeExecutor {
        FakeExecutor {
            shared,
            node,
            ip,
            image_ca,
        }
    }

    fn standby(&self, cmd: &str, params: &Value) -> Result<CommandFuture, StartError> {
        match cmd {
            "prepare_image" => self.prepare_image(params),
            "get_partition_uuids" => {
                let signature = self.node.signature();
                Ok(Box::pin(async move {
                    Ok(json!({
                        "root uuid": format!("0x{signature:08x}"),
                        "vmdeploy_table": "fake",
                        "vmdeploy_partitions": [],
                    }))
                }))
            }
            "sync" => Ok(Box::pin(async { Ok(json!({"result": "sync: done"})) })),
            "power_off" => {
                let node = Arc::clone(&self.node);
                Ok(Box::pin(async move {
                    node.power_off.notify_one();
                    Ok(json!({"result": "power_off: the agent is powering the node off"}))
                }))
            }
            other => Err(StartError::UnknownCommand(format!("standby.{other}"))),
        }
    }

    /// `standby.prepare_image` (and the `write_image` deploy step).
    fn prepare_image(&self, params: &Value) -> Result<CommandFuture, StartError> {
        let info = params
            .get("image_info")
            .ok_or_else(|| StartError::InvalidParams("image_info is required".into()))?;
        let url = info
            .get("urls")
            .and_then(Value::as_array)
            .and_then(|u| u.first())
            .and_then(Value::as_str)
            .ok_or_else(|| StartError::InvalidParams("image_info.urls must list a URL".into()))?
            .to_owned();
        let expected = expected_digest(info)
            .map_err(StartError::InvalidParams)?
            .ok_or_else(|| {
                StartError::InvalidParams(
                    "image_info carries no checksum (os_hash_algo/os_hash_value or checksum)"
                        .into(),
                )
            })?;
        let id = info
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("image")
            .to_owned();
        let config = &self.shared.config;
        let (planned, size, verify) = (config.write_delay, config.image_size, config.verify_image);
        let node = Arc::clone(&self.node);
        let client = verify
            .then(|| {
                node_client(
                    self.ip,
                    &url,
                    Trust::Ca(self.image_ca.clone()),
                    Duration::from_secs(60),
                )
            })
            .transpose()
            .map_err(|e| StartError::InvalidParams(format!("{e:#}")))?;
        Ok(Box::pin(async move {
            let started = Instant::now();
            let mut write = WriteState {
                started,
                planned,
                total: size,
                ended: None,
            };
            node.set_write(write);
            let total = match client {
                None => size,
                Some(client) => {
                    let (len, signature) =
                        download(&client, &url, &expected)
                            .await
                            .map_err(|(kind, why)| {
                                CommandError::new(
                                    kind,
                                    format!("writing image {id} to {FAKE_DISK}: {why}"),
                                )
                            })?;
                    if let (Some(sig), Ok(mut s)) = (signature, node.signature.lock()) {
                        *s = sig;
                    }
                    write.total = len;
                    node.set_write(write);
                    len
                }
            };
            tokio::time::sleep_until((started + planned).into()).await;
            write.ended = Some(Instant::now());
            node.set_write(write);
            Ok(json!({
                "result": format!(
                    "prepare_image: image ({id}) written to device {FAKE_DISK} ({total} bytes, \
                     {expected})"
                )
            }))
        }))
    }

    fn clean(&self, cmd: &str, params: &Value) -> Result<CommandFuture, StartError> {
        match cmd {
            "get_clean_steps" => {
                let steps = serde_json::to_value(clean_steps())
                    .map_err(|e| StartError::InvalidParams(format!("listing steps: {e}")))?;
                Ok(Box::pin(async move { Ok(steps) }))
            }
            "execute_clean_step" => {
                let parsed: ExecuteCleanStepParams = serde_json::from_value(params.clone())
                    .map_err(|e| StartError::InvalidParams(format!("execute_clean_step: {e}")))?;
                // Echoed back as sent: Ironic compares it with the step it asked for.
                let step = params.get("step").cloned().unwrap_or(Value::Null);
                let version = params.get("clean_version").cloned();
                let delay = self.shared.config.clean_step_delay;
                Ok(Box::pin(async move {
                    check_versions(version.as_ref())?;
                    let result = match parsed.step.step.as_str() {
                        ERASE_DEVICES_METADATA => erase_devices_metadata(delay).await,
                        other => return Err(unknown_step(other)),
                    };
                    Ok(json!({"clean_result": result, "clean_step": step}))
                }))
            }
            other => Err(StartError::UnknownCommand(format!("clean.{other}"))),
        }
    }

    fn deploy(&self, cmd: &str, params: &Value) -> Result<CommandFuture, StartError> {
        match cmd {
            "get_deploy_steps" => {
                let steps = deploy_steps();
                Ok(Box::pin(async move { Ok(steps) }))
            }
            "execute_deploy_step" => {
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
                let name = step.get("step").and_then(Value::as_str).map(str::to_owned);
                // write_image is prepare_image: its parameters are checked (and refused) when
                // the step runs, as IPA validates them inside the running step.
                let write = match name.as_deref() {
                    Some(WRITE_IMAGE) => Some(self.prepare_image(&json!({
                        "image_info": args.get("image_info").cloned().unwrap_or(Value::Null),
                        "configdrive": args.get("configdrive").cloned().unwrap_or(Value::Null),
                    }))),
                    _ => None,
                };
                let delay = self.shared.config.clean_step_delay;
                Ok(Box::pin(async move {
                    check_versions(version.as_ref())?;
                    let Some(name) = name else {
                        return Err(CommandError::new(
                            IpaErrorKind::CommandExecution,
                            format!("Malformed deploy_step, no \"step\" key: {step}"),
                        ));
                    };
                    let result = match (name.as_str(), write) {
                        (WRITE_IMAGE, Some(Ok(run))) => run.await?,
                        (WRITE_IMAGE, Some(Err(e))) => {
                            return Err(CommandError::new(e.kind(), format!("write_image: {e}")))
                        }
                        (ERASE_DEVICES_METADATA, _) => erase_devices_metadata(delay).await,
                        (other, _) => return Err(unknown_step(other)),
                    };
                    Ok(json!({"deploy_result": result, "deploy_step": step}))
                }))
            }
            other => Err(StartError::UnknownCommand(format!("deploy.{other}"))),
        }
    }

    fn log(&self, cmd: &str) -> Result<CommandFuture, StartError> {
        match cmd {
            "collect_system_logs" => Ok(Box::pin(async {
                Ok(json!({
                    "system_logs": base64::engine::general_purpose::STANDARD.encode(LOGS_TAR_GZ)
                }))
            })),
            other => Err(StartError::UnknownCommand(format!("log.{other}"))),
        }
    }
}

impl Executor for FakeExecutor {
    fn start(
        &self,
        extension: &str,
        command: &str,
        params: &Value,
    ) -> Result<CommandFuture, StartError> {
        let name = format!("{extension}.{command}");
        let started = match extension {
            "standby" => self.standby(command, params),
            "clean" => self.clean(command, params),
            "deploy" => self.deploy(command, params),
            "log" => self.log(command),
            other => Err(StartError::UnknownExtension(other.into())),
        };
        let index = self.node.index;
        let stats = Arc::clone(&self.shared.stats);
        match started {
            Err(e) => {
                stats.error(format!("server {index}: {name} refused: {e}"));
                Err(e)
            }
            Ok(run) => {
                stats.command(&name);
                let node = Arc::clone(&self.node);
                Ok(Box::pin(async move {
                    let outcome = run.await;
                    if let Err(e) = &outcome {
                        stats.error(format!(
                            "server {index}: {name} failed: {} ({})",
                            e.message, e.kind
                        ));
                    }
                    node.command_done.notify_one();
                    outcome
                }))
            }
        }
    }
}

/// The step's arguments: the command's extra parameters overlaid with `step.args` (the
/// agent's, after IPA's `kwargs.update(step.get('args') or {})`).
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

/// `erase_devices_metadata` after `delay`, reported in the agent's fields.
async fn erase_devices_metadata(delay: Duration) -> Value {
    tokio::time::sleep(delay).await;
    json!({"device": FAKE_DISK, "table": "none", "partitions": 0, "bytes_zeroed": 0, "fake": true})
}

/// Downloads `url` and checks it against `expected`: its length and MBR disk signature (when
/// it has an MBR), or the error kind and text the agent would report.
async fn download(
    client: &reqwest::Client,
    url: &str,
    expected: &ExpectedDigest,
) -> Result<(u64, Option<u32>), (IpaErrorKind, String)> {
    let shown = vmdeploy_shared::redact::signatures(url).into_owned();
    let failed = |what: String| (IpaErrorKind::ImageWrite, what);
    let mut response = client
        .get(url)
        .send()
        .await
        .map_err(|e| failed(format!("downloading {shown}: {e}")))?;
    if !response.status().is_success() {
        return Err(failed(format!(
            "downloading {shown}: HTTP {}",
            response.status()
        )));
    }
    let mut hasher = Hasher::new(expected.algo);
    let mut first = Vec::with_capacity(512);
    let mut len = 0u64;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| failed(format!("downloading {shown}: {e}")))?
    {
        if first.len() < 512 {
            let take = (512 - first.len()).min(chunk.len());
            first.extend_from_slice(&chunk[..take]);
        }
        hasher.update(&chunk);
        len += chunk.len() as u64;
    }
    expected
        .verify(&hasher.finalize_hex())
        .map_err(|e| (IpaErrorKind::ImageChecksum, e.to_string()))?;
    let signature = (first.len() == 512 && first[510] == 0x55 && first[511] == 0xAA)
        .then(|| u32::from_le_bytes([first[440], first[441], first[442], first[443]]));
    Ok((len, signature))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_bundle_is_gzip() {
        assert_eq!(&LOGS_TAR_GZ[..3], &[0x1f, 0x8b, 0x08]);
        // ISIZE, the last four bytes: the 10240-byte tar.
        let isize = u32::from_le_bytes([
            LOGS_TAR_GZ[133],
            LOGS_TAR_GZ[134],
            LOGS_TAR_GZ[135],
            LOGS_TAR_GZ[136],
        ]);
        assert_eq!(isize, 10240);
    }

    #[test]
    fn step_args_overlay_the_steps_own() {
        let params = json!({"step": {}, "node": {}, "ports": [], "deploy_version": null,
                            "image_info": {"id": "a"}, "configdrive": "x"});
        let step = json!({"step": "write_image", "args": {"image_info": {"id": "b"}}});
        let args = step_args(params.as_object().expect("object"), &step);
        assert_eq!(
            Value::Object(args),
            json!({"image_info": {"id": "b"}, "configdrive": "x"})
        );
    }

    #[test]
    fn progress_runs_evenly_to_the_total() {
        let node = NodeState::new(3);
        assert!(node.progress().is_none());
        let started = Instant::now() - Duration::from_secs(1);
        node.set_write(WriteState {
            started,
            planned: Duration::from_secs(4),
            total: 400,
            ended: None,
        });
        let p = node.progress().expect("progress");
        assert!((90..=120).contains(&p.written), "{p:?}");
        assert_eq!(p.total, Some(400));
        node.set_write(WriteState {
            started,
            planned: Duration::from_secs(4),
            total: 400,
            ended: Some(started + Duration::from_secs(2)),
        });
        let p = node.progress().expect("progress");
        assert_eq!((p.written, p.rate), (400, 200));
        assert_eq!(node.signature(), 0x7e57_0003);
    }
}
