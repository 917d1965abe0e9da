//! The `standby` extension: `prepare_image` streams `image_info` to the install disk with
//! [`crate::stream`]; `get_partition_uuids` reads the written table; `sync` flushes;
//! `power_off` answers and then lets the agent flow end with [`crate::init::FinalAction::PowerOff`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::Notify;
use vmdeploy_shared::api::ipa::{CommandError, IpaErrorKind};
use vmdeploy_shared::io::hash::{ExpectedDigest, HashAlgo, HashError};

use super::heartbeat::{ProgressSlot, SharedProgress};
use super::server::{CommandFuture, StartError};
use crate::disk::Disk;
use crate::stream::progress::{ConsoleReporter, Progress};
use crate::stream::source::{spawn_download, HttpOptions};
use crate::stream::write_image_from;

/// The install disk, or why there is none (reported by every command that needs it).
pub type DiskChoice = Arc<Result<PathBuf, String>>;

/// How often the console gets a progress line while an image is written.
pub const CONSOLE_PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// The `standby` extension.
pub struct Standby {
    /// The install disk.
    pub disk: DiskChoice,
    /// CA for image URLs (the conductor's), if any.
    pub ca_pem: Option<Vec<u8>>,
    /// Progress of the current write, for heartbeats.
    pub progress: SharedProgress,
    /// Notified once `power_off` has run.
    pub power_off: Arc<Notify>,
}

/// The digest `image_info` asks for: `os_hash_algo` + `os_hash_value` first, else `checksum`
/// (bare hex, length tells the algorithm), as modern IPA prefers (reference §3.4).
pub fn expected_digest(info: &Value) -> Result<Option<ExpectedDigest>, String> {
    let algo = info.get("os_hash_algo").and_then(Value::as_str);
    let value = info.get("os_hash_value").and_then(Value::as_str);
    if let (Some(a), Some(v)) = (algo, value) {
        let algo: HashAlgo = a.parse().map_err(|e| format!("{e}"))?;
        return ExpectedDigest::new(algo, v)
            .map(Some)
            .map_err(|e| e.to_string());
    }
    match info.get("checksum").and_then(Value::as_str) {
        Some(c) if c.starts_with("http://") || c.starts_with("https://") => {
            Err("checksum URLs are not supported; send os_hash_algo/os_hash_value".into())
        }
        Some(c) if !c.is_empty() => c.parse().map(Some).map_err(|e: HashError| e.to_string()),
        _ => Ok(None),
    }
}

/// The disk, or the FAILED error saying why there is none.
pub fn require_disk(disk: &DiskChoice) -> Result<PathBuf, CommandError> {
    match disk.as_ref() {
        Ok(p) => Ok(p.clone()),
        Err(why) => Err(CommandError::new(
            IpaErrorKind::DeviceNotFound,
            format!("no install disk: {why}"),
        )),
    }
}

impl Standby {
    /// Starts `standby.<cmd>`.
    pub fn start(&self, cmd: &str, params: &Value) -> Result<CommandFuture, StartError> {
        match cmd {
            "prepare_image" => self.prepare_image(params),
            "get_partition_uuids" => {
                let disk = Arc::clone(&self.disk);
                Ok(Box::pin(async move {
                    let path = require_disk(&disk)?;
                    let shown = path.display().to_string();
                    match tokio::task::spawn_blocking(move || {
                        super::partitions::read_partition_uuids(&path)
                    })
                    .await
                    {
                        Ok(Ok(v)) => Ok(v),
                        Ok(Err(e)) => Err(CommandError::new(
                            IpaErrorKind::CommandExecution,
                            format!("reading the partition table of {shown}: {e:#}"),
                        )),
                        Err(e) => Err(CommandError::new(
                            IpaErrorKind::CommandExecution,
                            format!("the partition reader died: {e}"),
                        )),
                    }
                }))
            }
            "sync" => Ok(Box::pin(async {
                tokio::task::spawn_blocking(|| {
                    // SAFETY: sync(2) takes no arguments and cannot fail.
                    unsafe { libc::sync() };
                })
                .await
                .map_err(|e| {
                    CommandError::new(IpaErrorKind::CommandExecution, format!("sync: {e}"))
                })?;
                Ok(json!({"result": "sync: done"}))
            })),
            "power_off" => {
                let notify = Arc::clone(&self.power_off);
                Ok(Box::pin(async move {
                    tokio::task::spawn_blocking(|| {
                        // SAFETY: as above; flush before the machine goes down.
                        unsafe { libc::sync() };
                    })
                    .await
                    .map_err(|e| {
                        CommandError::new(IpaErrorKind::CommandExecution, format!("sync: {e}"))
                    })?;
                    tracing::info!("power_off requested by the conductor");
                    notify.notify_one();
                    Ok(json!({"result": "power_off: the agent is powering the node off"}))
                }))
            }
            other => Err(StartError::UnknownCommand(format!("standby.{other}"))),
        }
    }

    /// `standby.prepare_image`, also the body of the `write_image` deploy step
    /// ([`super::deploy`]): `params` holds `image_info` and, optionally, `configdrive`.
    pub fn prepare_image(&self, params: &Value) -> Result<CommandFuture, StartError> {
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
        if info.get("image_type").and_then(Value::as_str) == Some("partition") {
            return Err(StartError::InvalidParams(
                "partition images are not supported; vmdeploy writes whole-disk images".into(),
            ));
        }
        let expected = expected_digest(info).map_err(StartError::InvalidParams)?;
        let Some(expected) = expected else {
            return Err(StartError::InvalidParams(
                "image_info carries no checksum (os_hash_algo/os_hash_value or checksum)".into(),
            ));
        };
        let id = info
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("image")
            .to_owned();
        let disk = Arc::clone(&self.disk);
        let opts = HttpOptions {
            ca_pem: self.ca_pem.clone(),
            ..Default::default()
        };
        let slot = Arc::clone(&self.progress);
        Ok(Box::pin(async move {
            let disk = require_disk(&disk)?;
            let progress = Arc::new(Progress::default());
            let started = Instant::now();
            if let Ok(mut s) = slot.lock() {
                *s = Some(ProgressSlot {
                    progress: Arc::clone(&progress),
                    started,
                    ended: None,
                });
            }
            let shown = disk.display().to_string();
            tracing::info!(%url, disk = %shown, digest = %expected, "prepare_image: writing");
            let outcome = tokio::task::spawn_blocking(move || {
                let _console =
                    ConsoleReporter::start(Arc::clone(&progress), CONSOLE_PROGRESS_EVERY);
                let writer = Arc::new(Disk::open(&disk)?);
                let source = spawn_download(&url, &opts, Arc::clone(&progress))?;
                write_image_from(source, writer, Some(&expected), &progress)
            })
            .await;
            if let Ok(mut s) = slot.lock() {
                if let Some(s) = s.as_mut() {
                    s.ended = Some(Instant::now());
                }
            }
            match outcome {
                Ok(Ok(o)) => Ok(json!({
                    "result": format!(
                        "prepare_image: image ({id}) written to device {shown} ({} bytes, {})",
                        o.image_len,
                        o.digest.as_deref().unwrap_or("no digest")
                    )
                })),
                Ok(Err(e)) => {
                    let kind = if e.chain().any(|c| c.is::<HashError>()) {
                        IpaErrorKind::ImageChecksum
                    } else {
                        IpaErrorKind::ImageWrite
                    };
                    Err(CommandError::new(
                        kind,
                        format!("writing image {id} to {shown}: {e:#}"),
                    ))
                }
                Err(e) => Err(CommandError::new(
                    IpaErrorKind::ImageWrite,
                    format!("the writer task died: {e}"),
                )),
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_from_image_info() {
        let v = json!({"os_hash_algo": "sha256", "os_hash_value": "a".repeat(64), "checksum": "b".repeat(32)});
        let d = expected_digest(&v).expect("valid").expect("present");
        assert_eq!(d.algo, HashAlgo::Sha256);
        let v = json!({"checksum": "b".repeat(32)});
        assert_eq!(
            expected_digest(&v).expect("valid").expect("present").algo,
            HashAlgo::Md5
        );
        assert!(expected_digest(&json!({})).expect("valid").is_none());
        assert!(expected_digest(&json!({"checksum": "http://x/sum"})).is_err());
        assert!(expected_digest(&json!({"os_hash_algo": "sha1", "os_hash_value": "ab"})).is_err());
    }
}
