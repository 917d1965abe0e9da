//! The `log` extension: `collect_system_logs` answers `{"system_logs": <base64 of a gzipped
//! tarball>}` (ironic-python-agent `extensions/log.py`), which Ironic stores per node
//! (`[agent] deploy_logs_collect`, `deploy_logs_local_path`) after a failure or a deploy.
//!
//! # Design
//! The ramdisk has no log file and no tools, so the bundle is made of what the agent holds or
//! can read itself: its own log (the in-memory tail, [`crate::logging::recent`]), the kernel's
//! ring buffer (`klogctl`, as dmesg(1) reads it), `/proc/cmdline`, `/proc/mounts`,
//! `/proc/partitions`, `/proc/meminfo`, `/proc/net/dev` and the kernel and agent versions. A
//! source that cannot be read is named in `errors.txt` instead of failing the command.
//!
//! Secrets never leave: every text is masked before it goes in (the agent token and any other
//! given secret wherever it appears, the value after any key that names a secret, such as
//! `ipa-agent-token=` on the command line, which dmesg repeats, and every temp URL signature). The tarball
//! is written with [`vmdeploy_shared::ustar`] and compressed with `flate2`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::Engine as _;
use serde_json::{json, Value};
use vmdeploy_shared::api::ipa::{CommandError, IpaErrorKind};
use vmdeploy_shared::redact;
use vmdeploy_shared::secret::Secret;
use vmdeploy_shared::ustar::TarWriter;

use super::server::{CommandFuture, StartError};

/// The `log` extension.
pub struct Log {
    /// Values to mask wherever they appear (the agent token).
    pub secrets: Vec<Secret>,
    /// Where `/proc` is (`/proc`; a fake tree in tests).
    pub proc_dir: PathBuf,
    /// Whether to read the kernel's ring buffer (off in tests).
    pub kernel_log: bool,
}

impl Log {
    /// The extension for the running system.
    pub fn system(secrets: Vec<Secret>) -> Log {
        Log {
            secrets,
            proc_dir: PathBuf::from("/proc"),
            kernel_log: true,
        }
    }

    /// Starts `log.<cmd>`.
    pub fn start(&self, cmd: &str, _params: &Value) -> Result<CommandFuture, StartError> {
        match cmd {
            "collect_system_logs" => {
                let secrets = self.secrets.clone();
                let proc_dir = self.proc_dir.clone();
                let kernel_log = self.kernel_log;
                Ok(Box::pin(async move {
                    let bundle = tokio::task::spawn_blocking(move || {
                        bundle(&proc_dir, kernel_log, &secrets)
                    })
                    .await;
                    let failed = |why: String| {
                        CommandError::new(
                            IpaErrorKind::CommandExecution,
                            format!("collecting the system logs: {why}"),
                        )
                    };
                    match bundle {
                        Ok(Ok(gz)) => Ok(json!({
                            "system_logs": base64::engine::general_purpose::STANDARD.encode(gz)
                        })),
                        Ok(Err(e)) => Err(failed(format!("{e:#}"))),
                        Err(e) => Err(failed(format!("the collector task died: {e}"))),
                    }
                }))
            }
            other => Err(StartError::UnknownCommand(format!("log.{other}"))),
        }
    }
}

/// The gzipped tarball of the logs and system facts, every text masked.
pub fn bundle(proc_dir: &Path, kernel_log: bool, secrets: &[Secret]) -> anyhow::Result<Vec<u8>> {
    let mut files: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut errors = String::new();
    files.push(("vmdeploy-agent.log", crate::logging::recent()));
    if kernel_log {
        match read_kernel_log() {
            Ok(text) => files.push(("dmesg", text)),
            Err(e) => errors.push_str(&format!("dmesg: {e}\n")),
        }
    }
    for (name, rel) in [
        ("cmdline", "cmdline"),
        ("mounts", "mounts"),
        ("partitions", "partitions"),
        ("meminfo", "meminfo"),
        ("net-dev", "net/dev"),
        ("kernel-version", "version"),
    ] {
        let path = proc_dir.join(rel);
        match std::fs::read(&path) {
            Ok(data) => files.push((name, data)),
            Err(e) => errors.push_str(&format!("{}: {e}\n", path.display())),
        }
    }
    files.push((
        "agent-version",
        format!("vmdeploy-agent {}\n", env!("CARGO_PKG_VERSION")).into_bytes(),
    ));
    if !errors.is_empty() {
        files.push(("errors.txt", errors.into_bytes()));
    }
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = TarWriter::new(gz, mtime);
    for (name, data) in files {
        let text = mask(&String::from_utf8_lossy(&data), secrets);
        tar.append_file(&format!("vmdeploy-logs/{name}"), text.as_bytes())
            .with_context(|| format!("adding {name}"))?;
    }
    let gz = tar.finish().context("ending the tarball")?;
    gz.finish().context("ending the gzip stream")
}

/// The kernel's ring buffer, as `dmesg` shows it (raw `<level>` prefixes kept).
fn read_kernel_log() -> std::io::Result<Vec<u8>> {
    const SYSLOG_ACTION_READ_ALL: libc::c_int = 3;
    const SYSLOG_ACTION_SIZE_BUFFER: libc::c_int = 10;
    // SAFETY: SIZE_BUFFER takes no buffer (null, length 0) and returns a size.
    let size = unsafe { libc::klogctl(SYSLOG_ACTION_SIZE_BUFFER, std::ptr::null_mut(), 0) };
    if size < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let size = usize::try_from(size).unwrap_or(0).clamp(4096, 16 << 20);
    let mut buf = vec![0u8; size];
    let len = libc::c_int::try_from(buf.len()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `buf` is writable for `len` bytes for the duration of the call.
    let read = unsafe { libc::klogctl(SYSLOG_ACTION_READ_ALL, buf.as_mut_ptr().cast(), len) };
    if read < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(usize::try_from(read).unwrap_or(0));
    Ok(buf)
}

/// `text` with every given secret, every value after a key that names a secret and every temp
/// URL signature masked ([`vmdeploy_shared::redact::text`]: the rules the conductor's API and
/// logs follow).
pub fn mask(text: &str, secrets: &[Secret]) -> String {
    let known: Vec<&str> = secrets.iter().map(|s| s.expose().as_str()).collect();
    redact::text(text, &known)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// The entries of a gzipped ustar archive, read with an independent parser: (name, text).
    fn untar(gz: &[u8]) -> Vec<(String, String)> {
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(gz)
            .read_to_end(&mut tar)
            .expect("gzip");
        let mut out = Vec::new();
        let mut at = 0;
        while at + 512 <= tar.len() && tar[at..at + 512].iter().any(|&b| b != 0) {
            let h = &tar[at..at + 512];
            assert_eq!(&h[257..263], b"ustar\0", "ustar magic");
            let name: String = h[..100]
                .iter()
                .take_while(|&&b| b != 0)
                .map(|&b| b as char)
                .collect();
            let size_text: String = h[124..135].iter().map(|&b| b as char).collect();
            let size = usize::from_str_radix(&size_text, 8).expect("octal size");
            let data = String::from_utf8_lossy(&tar[at + 512..at + 512 + size]).into_owned();
            out.push((name, data));
            at += 512 + size.div_ceil(512) * 512;
        }
        out
    }

    #[test]
    fn secrets_are_masked_in_every_form() {
        let token = Secret::new("-Zq8sP3token-Value_0123456789abcdefXYZ");
        let cmdline = "BOOT_IMAGE=/vmlinuz ir_pub_id=u ipa-api-url=http://10.0.2.2:6385 \
                       ipa-agent-token=-Zq8sP3token-Value_0123456789abcdefXYZ ipa-debug=1 \
                       console=ttyS0";
        let masked = mask(cmdline, std::slice::from_ref(&token));
        assert!(!masked.contains("Zq8sP3"), "{masked}");
        assert!(masked.contains("ipa-agent-token=******"), "{masked}");
        assert!(
            masked.contains("ipa-api-url=http://10.0.2.2:6385"),
            "{masked}"
        );
        assert!(masked.ends_with("ipa-debug=1 console=ttyS0"), "{masked}");
        // Without being told the value: the key gives it away.
        let masked = mask(cmdline, &[]);
        assert!(!masked.contains("Zq8sP3"), "{masked}");
        for (input, want) in [
            (
                r#"{"agent_token": "abc123", "x": 1}"#,
                r#"{"agent_token": "******", "x": 1}"#,
            ),
            (
                "GET /v1/commands?agent_token=abc&wait=true",
                "GET /v1/commands?agent_token=******&wait=true",
            ),
            (
                "image_server_password: hunter2\n",
                "image_server_password: ******\n",
            ),
            ("Token invalid.", "Token invalid."),
            ("no secrets here", "no secrets here"),
            ("token=", "token="),
            ("ünïcode password=gëheim ö", "ünïcode password=****** ö"),
            (
                "GET http://h/o?temp_url_sig=ab12&temp_url_expires=1 failed",
                "GET http://h/o?temp_url_sig=******&temp_url_expires=****** failed",
            ),
        ] {
            assert_eq!(mask(input, &[]), want, "{input}");
        }
    }

    #[tokio::test]
    async fn collect_system_logs_answers_a_gzipped_tarball_in_base64() {
        let proc_dir = tempfile::tempdir().expect("fake /proc");
        let token = "t0ken-value-that-must-not-leak-0123456789";
        std::fs::write(
            proc_dir.path().join("cmdline"),
            format!("console=ttyS0 ipa-agent-token={token} ipa-debug=1\n"),
        )
        .expect("cmdline");
        std::fs::write(
            proc_dir.path().join("partitions"),
            "major minor  #blocks  name\n",
        )
        .expect("partitions");
        crate::logging::init();
        tracing::info!("log bundle test line; token {token} must be masked");
        let log = Log {
            secrets: vec![Secret::new(token)],
            proc_dir: proc_dir.path().to_owned(),
            kernel_log: false,
        };
        let fut = log
            .start("collect_system_logs", &json!({}))
            .expect("known command");
        let v = fut.await.expect("collected");
        // IPA's result: one key, `system_logs`, a base64 string of a gzipped tar.
        let obj = v.as_object().expect("object");
        assert_eq!(obj.keys().collect::<Vec<_>>(), ["system_logs"]);
        let b64 = v["system_logs"].as_str().expect("a string");
        let gz = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .expect("base64");
        assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip magic");
        let entries = untar(&gz);
        let get = |name: &str| {
            entries
                .iter()
                .find(|(n, _)| n == &format!("vmdeploy-logs/{name}"))
                .map(|(_, d)| d.clone())
                .unwrap_or_else(|| panic!("{name} missing: {entries:?}"))
        };
        assert!(get("vmdeploy-agent.log").contains("log bundle test line"));
        assert_eq!(
            get("cmdline"),
            "console=ttyS0 ipa-agent-token=****** ipa-debug=1\n"
        );
        assert!(get("partitions").starts_with("major minor"));
        assert!(get("agent-version").starts_with("vmdeploy-agent "));
        // Sources that are not there are named, not fatal.
        assert!(get("errors.txt").contains("mounts"));
        for (name, data) in &entries {
            assert!(!data.contains(token), "{name} leaks the token");
        }
        assert!(matches!(
            log.start("zap", &json!({})),
            Err(StartError::UnknownCommand(_))
        ));
    }
}
