//! `standby.*` commands: `prepare_image` streams `image_info` to the chosen disk with
//! [`crate::stream`]; `sync` flushes; `power_off` is left to the conductor's BMC for now.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};
use vmdeploy_shared::io::hash::{ExpectedDigest, HashAlgo};

use super::server::{CommandFuture, Executor, StartError};
use super::wire::CommandError;
use crate::disk::DiskWriter;
use crate::stream::http::{spawn_download, HttpOptions};
use crate::stream::progress::Progress;
use crate::stream::write_image_from;

/// The `standby` extension, writing to one disk.
pub struct Standby {
    /// The install disk.
    pub disk: PathBuf,
    /// CA for image URLs (the conductor's), if any.
    pub ca_pem: Option<Vec<u8>>,
    /// Progress of the current write, for heartbeats.
    pub progress: Arc<std::sync::Mutex<Option<Arc<Progress>>>>,
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
        Some(c) if !c.is_empty() => c
            .parse()
            .map(Some)
            .map_err(|e: vmdeploy_shared::io::hash::HashError| e.to_string()),
        _ => Ok(None),
    }
}

fn command_error(kind: &str, message: String) -> CommandError {
    CommandError {
        kind: kind.into(),
        code: 500,
        message,
        details: String::new(),
    }
}

impl Executor for Standby {
    fn start(&self, ext: &str, cmd: &str, params: &Value) -> Result<CommandFuture, StartError> {
        if ext != "standby" {
            return Err(StartError::UnknownExtension(ext.into()));
        }
        match cmd {
            "prepare_image" => {
                let info = params
                    .get("image_info")
                    .ok_or_else(|| StartError::InvalidParams("image_info is required".into()))?;
                let url = info
                    .get("urls")
                    .and_then(Value::as_array)
                    .and_then(|u| u.first())
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        StartError::InvalidParams("image_info.urls must list a URL".into())
                    })?
                    .to_owned();
                let expected = expected_digest(info).map_err(StartError::InvalidParams)?;
                if expected.is_none() {
                    return Err(StartError::InvalidParams(
                        "image_info carries no checksum (os_hash_value or checksum)".into(),
                    ));
                }
                let id = info
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or("image")
                    .to_owned();
                let disk = self.disk.clone();
                let opts = HttpOptions {
                    ca_pem: self.ca_pem.clone(),
                    ..Default::default()
                };
                let slot = Arc::clone(&self.progress);
                Ok(Box::pin(async move {
                    let progress = Arc::new(Progress::default());
                    if let Ok(mut s) = slot.lock() {
                        *s = Some(Arc::clone(&progress));
                    }
                    let disk_for_msg = disk.display().to_string();
                    let outcome = tokio::task::spawn_blocking(move || {
                        let writer = Arc::new(DiskWriter::open(&disk)?);
                        let source = spawn_download(&url, &opts, Arc::clone(&progress))?;
                        write_image_from(source, writer, expected.as_ref(), &progress)
                    })
                    .await;
                    match outcome {
                        Ok(Ok(o)) => Ok(json!({
                            "result": format!(
                                "prepare_image: image ({id}) written to device {disk_for_msg} ({} bytes)",
                                o.image_len
                            )
                        })),
                        Ok(Err(e)) => {
                            let kind = if e.is::<vmdeploy_shared::io::hash::HashError>() {
                                "ImageChecksumError"
                            } else {
                                "ImageWriteError"
                            };
                            Err(command_error(kind, format!("{e:#}")))
                        }
                        Err(e) => Err(command_error(
                            "ImageWriteError",
                            format!("the writer task died: {e}"),
                        )),
                    }
                }))
            }
            "sync" => Ok(Box::pin(async {
                // SAFETY: sync(2) takes no arguments and cannot fail.
                unsafe { libc::sync() };
                Ok(json!({"result": "sync: done"}))
            })),
            other => Err(StartError::UnknownCommand(other.into())),
        }
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
