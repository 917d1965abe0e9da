//! The `iscsi` extension: `iscsi.start_iscsi_target` serves the install disk over iSCSI with the
//! agent's own target ([`crate::target`]), so the conductor's initiator can write it, as IPA's
//! extension does with tgt/LIO.
//!
//! Parameters as IPA's: `iqn` (default `iqn.2008-10.org.openstack:<uuid>`), `portal_port`
//! (default 3260), `wipe_disk_metadata` (zero the partition tables at both ends of the disk
//! first). Result `{"iscsi_target_iqn": <iqn>}`. The portal listens on the command API's address.
//! The target runs until the agent stops (it is flushed then).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use vmdeploy_shared::api::ipa::{CommandError, IpaErrorKind};

use super::server::{CommandFuture, StartError};
use super::standby::{require_disk, DiskChoice};
use crate::target::backend::BlockBackend;
use crate::target::server::{Target, TargetConfig};

/// IPA's default portal port.
pub const DEFAULT_PORTAL_PORT: u16 = 3260;

/// Bytes zeroed at each end of the disk by `wipe_disk_metadata`: the MBR/GPT header and
/// entries at the start, the backup GPT at the end.
pub const WIPE_LEN: u64 = 1024 * 1024;

/// The `iscsi` extension.
pub struct Iscsi {
    /// The install disk.
    pub disk: DiskChoice,
    /// Address the portal binds (the command API's).
    pub bind: IpAddr,
    /// Stops the target when notified.
    pub stop: Arc<Notify>,
    /// The running target, if started.
    pub running: Arc<Mutex<Option<JoinHandle<anyhow::Result<()>>>>>,
}

impl Iscsi {
    /// Starts `iscsi.<cmd>`.
    pub fn start(&self, cmd: &str, params: &Value) -> Result<CommandFuture, StartError> {
        if cmd != "start_iscsi_target" {
            return Err(StartError::UnknownCommand(format!("iscsi.{cmd}")));
        }
        let iqn = match params.get("iqn") {
            None | Some(Value::Null) => {
                format!("iqn.2008-10.org.openstack:{}", super::server::new_id())
            }
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(StartError::InvalidParams("iqn must be a string".into())),
        };
        vmdeploy_shared::iqn::validate(&iqn)
            .map_err(|e| StartError::InvalidParams(format!("iqn {iqn:?}: {e}")))?;
        let port = match params.get("portal_port") {
            None | Some(Value::Null) => DEFAULT_PORTAL_PORT,
            Some(v) => v
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p != 0)
                .ok_or_else(|| {
                    StartError::InvalidParams("portal_port must be a port number".into())
                })?,
        };
        let wipe = match params.get("wipe_disk_metadata") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(StartError::InvalidParams(
                    "wipe_disk_metadata must be a boolean".into(),
                ))
            }
        };
        if self.running.lock().map(|r| r.is_some()).unwrap_or(true) {
            return Err(StartError::InvalidParams(
                "an iSCSI target is already running".into(),
            ));
        }
        let disk = Arc::clone(&self.disk);
        let addr = SocketAddr::new(self.bind, port);
        let stop = Arc::clone(&self.stop);
        let running = Arc::clone(&self.running);
        Ok(Box::pin(async move {
            let path = require_disk(&disk)?;
            let config = TargetConfig {
                iqn: iqn.clone(),
                disk: path.clone(),
                listen: addr,
                chap: None,
                buffered: false,
            };
            let target = Target::start_with(config, move |backend| {
                if wipe {
                    wipe_metadata(backend)?;
                }
                Ok(())
            })
            .await
            .map_err(|e| {
                CommandError::new(
                    IpaErrorKind::Iscsi,
                    format!("starting the iSCSI target: {e:#}"),
                )
            })?;
            tracing::info!(%addr, %iqn, disk = %path.display(), wipe, "iSCSI target started");
            let task = tokio::spawn(async move {
                stop.notified().await;
                target.stop().await
            });
            if let Ok(mut r) = running.lock() {
                *r = Some(task);
            }
            Ok(json!({ "iscsi_target_iqn": iqn }))
        }))
    }

    /// Stops the target (if running) and waits up to `timeout` for its final flush.
    pub async fn shutdown(&self, timeout: Duration) {
        let task = self.running.lock().ok().and_then(|mut r| r.take());
        if let Some(task) = task {
            self.stop.notify_one();
            match tokio::time::timeout(timeout, task).await {
                Ok(Ok(Ok(()))) => tracing::info!("iSCSI target stopped and flushed"),
                Ok(Ok(Err(e))) => tracing::error!("iSCSI target stopped with an error: {e:#}"),
                Ok(Err(e)) => tracing::error!("iSCSI target task failed: {e}"),
                Err(_) => tracing::error!("iSCSI target did not stop within {timeout:?}"),
            }
        }
    }
}

/// Zeroes the first and last [`WIPE_LEN`] of the disk (partition tables, GPT backup).
fn wipe_metadata(backend: &BlockBackend) -> anyhow::Result<()> {
    let size = backend.blocks() * u64::from(backend.block_len());
    let len = WIPE_LEN.min(size);
    let zero_block = vec![0u8; backend.block_len() as usize];
    backend.write_pattern(0, len, &zero_block)?;
    if size > len {
        backend.write_pattern(size - len, len, &zero_block)?;
    }
    backend.sync()?;
    tracing::info!("wiped the disk metadata (first and last {len} bytes)");
    Ok(())
}
