//! The `standby` extension: `prepare_image` streams `image_info` to the install disk with
//! [`crate::stream`] (a partition image, `image_type=partition`, through [`crate::install`]);
//! `get_partition_uuids` answers what the partition image write recorded, else reads the written
//! table; `sync` flushes;
//! `power_off` answers and then lets the agent flow end with [`crate::init::FinalAction::PowerOff`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{json, Value};
use tokio::sync::Notify;
use vmdeploy_shared::api::ipa::{CommandError, IpaErrorKind};
use vmdeploy_shared::io::hash::{ExpectedDigest, HashAlgo, HashError};
use vmdeploy_shared::redact::Url;

use super::heartbeat::{ProgressSlot, SharedProgress};
use super::server::{CommandFuture, StartError};
use crate::disk::Disk;
use crate::install::{self, InstalledState, PartitionRecord};
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
    /// What the last partition image write laid out (shared with the `image` extension).
    pub installed: InstalledState,
}

/// The digest `image_info` asks for: `os_hash_algo` + `os_hash_value` first, else `checksum`
/// (bare hex, length tells the algorithm), as modern IPA prefers (docs/ironic-protocols.md §3.4).
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
                let recorded = self
                    .installed
                    .lock()
                    .ok()
                    .and_then(|r| r.as_ref().map(PartitionRecord::to_ipa));
                Ok(Box::pin(async move {
                    if let Some(uuids) = recorded {
                        return Ok(uuids);
                    }
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
        let partition_job = if install::job::is_partition_image(info) {
            let job = install::job::job_from_image_info(info, params.get("configdrive"))
                .map_err(StartError::InvalidParams)?;
            // Refused before the disk is touched: the write could not be made bootable.
            let bios = job.boot_mode == vmdeploy_shared::params::BootMode::Bios;
            if bios && install::job::local_boot(info).map_err(StartError::InvalidParams)? {
                return Err(StartError::InvalidParams(
                    install::job::BIOS_LOCAL_BOOT_UNSUPPORTED.into(),
                ));
            }
            Some(job)
        } else {
            None
        };
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
        let installed = Arc::clone(&self.installed);
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
            tracing::info!(url = %Url(&url), disk = %shown, digest = %expected, "prepare_image: writing");
            if let Ok(mut r) = installed.lock() {
                *r = None;
            }
            let outcome = tokio::task::spawn_blocking(move || {
                let _console =
                    ConsoleReporter::start(Arc::clone(&progress), CONSOLE_PROGRESS_EVERY);
                let Some(job) = partition_job else {
                    let writer = Arc::new(Disk::open(&disk)?);
                    let source = spawn_download(&url, &opts, Arc::clone(&progress))?;
                    return write_image_from(source, writer, Some(&expected), &progress)
                        .map(|o| (o, None));
                };
                // Before the disk is touched: a config drive that cannot be had stops here.
                let configdrive = job
                    .configdrive
                    .as_deref()
                    .map(|value| load_configdrive(value, &opts))
                    .transpose()?;
                let writer = Arc::new(Disk::open(&disk)?);
                let source = spawn_download(&url, &opts, Arc::clone(&progress))?;
                let (record, outcome) = install::write::write_partition_image(
                    source,
                    &writer,
                    &job,
                    configdrive.as_deref(),
                    Some(&expected),
                    &progress,
                )?;
                Ok((outcome, Some(record)))
            })
            .await;
            if let Ok(mut s) = slot.lock() {
                if let Some(s) = s.as_mut() {
                    s.ended = Some(Instant::now());
                }
            }
            match outcome {
                Ok(Ok((o, record))) => {
                    let uuids = match &record {
                        Some(r) => format!(
                            ", root_uuid={} efi_system_partition_uuid={}",
                            r.root_uuid,
                            r.esp_uuid.as_deref().unwrap_or("None")
                        ),
                        None => String::new(),
                    };
                    if let (Some(r), Ok(mut slot)) = (record, installed.lock()) {
                        *slot = Some(r);
                    }
                    Ok(json!({
                        "result": format!(
                            "prepare_image: image ({id}) written to device {shown} ({} bytes, \
                             {}){uuids}",
                            o.image_len,
                            o.digest.as_deref().unwrap_or("no digest")
                        )
                    }))
                }
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

/// The config drive image of `value` (inline base64 of gzip, or an http(s) URL of that text),
/// fetched with the image's HTTP options and decoded by the shared decoder.
fn load_configdrive(value: &str, opts: &HttpOptions) -> anyhow::Result<Vec<u8>> {
    use std::io::Read as _;
    use vmdeploy_shared::partition::configdrive::{decode, is_url, MAX_DOWNLOAD_BYTES};
    if !is_url(value) {
        return Ok(decode(value.as_bytes(), false)?);
    }
    let progress = Arc::new(Progress::default());
    let mut body = Vec::new();
    vmdeploy_shared::io::limit::LimitReader::new(
        spawn_download(value.trim(), opts, progress)?,
        MAX_DOWNLOAD_BYTES,
    )
    .read_to_end(&mut body)
    .context("downloading the config drive")?;
    Ok(decode(&body, true)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standby(installed: InstalledState) -> Standby {
        Standby {
            disk: Arc::new(Err("no disk in this test".into())),
            ca_pem: None,
            progress: Arc::new(std::sync::Mutex::new(None)),
            power_off: Arc::new(Notify::new()),
            installed,
        }
    }

    /// The image URL is logged with its temp URL signature masked: a signature is a bearer
    /// credential for the image (the README's security promise: no secret is logged).
    #[tokio::test]
    async fn prepare_image_logs_no_temp_url_signature() {
        crate::logging::init();
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = dir.path().join("disk");
        std::fs::write(&disk, [0u8; 4096]).expect("disk file");
        let mut standby = standby(InstalledState::default());
        standby.disk = Arc::new(Ok(disk));
        let sig = "5eb1c0de0123456789abcdef0123456789abcdef";
        let url = format!("ftp://images.example/root.img?temp_url_sig={sig}&temp_url_expires=9");
        let params = json!({"image_info": {
            "id": "root.img", "urls": [url],
            "os_hash_algo": "sha256", "os_hash_value": "a".repeat(64),
        }});
        let write = standby
            .start("prepare_image", &params)
            .unwrap_or_else(|e| panic!("started: {e}"));
        let err = write.await.expect_err("no such scheme");
        let log = String::from_utf8_lossy(&crate::logging::recent()).into_owned();
        assert!(log.contains("prepare_image: writing"), "{log}");
        assert!(log.contains("temp_url_sig=******"), "{log}");
        assert!(!log.contains(sig), "the log shows the signature: {log}");
        assert!(!err.message.contains(sig), "{}", err.message);
    }

    /// Partition deploys this agent cannot finish are refused when the command starts, before
    /// the disk is touched (the disk here does not even exist).
    #[test]
    fn unfinishable_partition_deploys_are_refused_before_writing() {
        let cases = [
            (json!({"ephemeral_mb": 2048}), "image_info.ephemeral_mb"),
            (
                json!({"deploy_boot_mode": "bios"}),
                install::job::BIOS_LOCAL_BOOT_UNSUPPORTED,
            ),
            (
                json!({"deploy_boot_mode": "bios", "boot_option": "LOCAL"}),
                "BIOS mode",
            ),
        ];
        for (extra, expected) in cases {
            let mut info = json!({
                "id": "root.img", "urls": ["http://images.example/root.img"],
                "os_hash_algo": "sha256", "os_hash_value": "a".repeat(64),
                "image_type": "partition", "root_mb": 1024, "swap_mb": 0, "ephemeral_mb": 0,
                "ephemeral_format": "ext4", "preserve_ephemeral": false,
                "deploy_boot_mode": "uefi", "boot_option": "local",
            });
            if let (Some(m), Value::Object(e)) = (info.as_object_mut(), extra.clone()) {
                m.extend(e);
            }
            let params = json!({ "image_info": info });
            match standby(InstalledState::default()).start("prepare_image", &params) {
                Err(StartError::InvalidParams(msg)) => {
                    assert!(msg.contains(expected), "{extra}: {msg}")
                }
                Err(e) => panic!("{extra}: unexpected error {e}"),
                Ok(_) => panic!("{extra}: accepted"),
            }
        }
    }

    #[tokio::test]
    async fn get_partition_uuids_answers_the_recorded_write() {
        use vmdeploy_shared::partition::{plan, LayoutRequest, SectorSize, TableKind};
        let layout = plan(&LayoutRequest {
            disk_bytes: 1 << 30,
            sector_size: SectorSize::B512,
            table: TableKind::Gpt,
            efi_mib: 200,
            ephemeral_mib: 0,
            swap_mib: 0,
            configdrive_bytes: 0,
            root_mib: 100,
            image_bytes: 0,
            grow_root_to_image: false,
        })
        .expect("plan");
        let installed = InstalledState::default();
        *installed.lock().expect("lock") = Some(PartitionRecord {
            disk: "/dev/vda".into(),
            layout,
            root_uuid: "7e57da7a-0000-4000-8000-000000000001".into(),
            esp_uuid: Some("1234-ABCD".into()),
        });
        let fut = standby(installed)
            .start("get_partition_uuids", &json!({}))
            .unwrap_or_else(|e| panic!("{e}"));
        let v = fut.await.unwrap_or_else(|e| panic!("{}", e.message));
        // IPA's keys (partition_utils.work_on_disk), which Ironic's agent.py reads.
        assert_eq!(v["root uuid"], "7e57da7a-0000-4000-8000-000000000001");
        assert_eq!(v["efi system partition uuid"], "1234-ABCD");
        assert_eq!(v["partitions"]["root"], "/dev/vda2");
        assert_eq!(v["partitions"]["efi system partition"], "/dev/vda1");
    }

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
