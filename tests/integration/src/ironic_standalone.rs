//! A standalone OpenStack Ironic from the setup's venv, for tests that need a real Ironic API and
//! conductor but no deploy lab: one `ironic` process (API and conductor, `rpc_transport =
//! none`), SQLite in a temporary directory, `auth_strategy = noauth`, the hardware types and
//! interfaces the caller enables, automated cleaning off. (The end-to-end lab's Ironic,
//! `crate::e2e::ironic`, adds what real deploys need around it: an HTTP root, ISO tools, the
//! guest forwards.)
//!
//! A missing Ironic fails the test with the fix (`run scripts/setup`), never skips it.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::Value;

use crate::child::ChildGuard;
use crate::{free_port, tcp_listening, venv_bin};

/// The microversion the helpers call Ironic with.
pub const VERSION: (&str, &str) = ("X-OpenStack-Ironic-API-Version", "1.73");

/// What an Ironic enables: hardware types and the implementations of the interfaces that
/// differ between them (the rest are the `no-*`/`noop` ones).
#[derive(Debug, Clone, Copy)]
pub struct Drivers<'a> {
    /// `enabled_hardware_types`.
    pub hardware_types: &'a [&'a str],
    /// `enabled_boot_interfaces`.
    pub boot: &'a [&'a str],
    /// `enabled_deploy_interfaces`.
    pub deploy: &'a [&'a str],
    /// `enabled_power_interfaces`.
    pub power: &'a [&'a str],
    /// `enabled_management_interfaces`.
    pub management: &'a [&'a str],
}

/// `fake-hardware` only: every operation succeeds at once, no BMC is touched.
pub const FAKE: Drivers<'static> = Drivers {
    hardware_types: &["fake-hardware"],
    boot: &["fake"],
    deploy: &["fake"],
    power: &["fake"],
    management: &["fake"],
};

/// `redfish` (virtual-media boot, `direct` deploy) and `fake-hardware`.
pub const REDFISH_AND_FAKE: Drivers<'static> = Drivers {
    hardware_types: &["redfish", "fake-hardware"],
    boot: &["redfish-virtual-media", "fake"],
    deploy: &["direct", "fake"],
    power: &["redfish", "fake"],
    management: &["redfish", "fake"],
};

/// `ironic.conf` for a standalone Ironic keeping its state in `dir`, its API on
/// `127.0.0.1:port`; `max_limit`, when given, is the most records a list page holds (`[api]
/// max_limit`, 1000 by default), to make clients follow `next` links.
pub fn ironic_conf(
    dir: &Path,
    port: u16,
    drivers: &Drivers<'_>,
    max_limit: Option<usize>,
) -> String {
    format!(
        "[DEFAULT]
auth_strategy = noauth
rpc_transport = none
host = vmdeploy-test
use_stderr = true
enabled_hardware_types = {hardware_types}
enabled_boot_interfaces = {boot}
enabled_deploy_interfaces = {deploy}
enabled_power_interfaces = {power}
enabled_management_interfaces = {management}
enabled_inspect_interfaces = no-inspect
enabled_network_interfaces = noop
default_network_interface = noop
enabled_raid_interfaces = no-raid
enabled_bios_interfaces = no-bios
enabled_vendor_interfaces = no-vendor
enabled_firmware_interfaces = no-firmware
enabled_console_interfaces = no-console
enabled_rescue_interfaces = no-rescue

[api]
host_ip = 127.0.0.1
port = {port}
{max_limit}

[database]
connection = sqlite:///{db}

[oslo_concurrency]
lock_path = {locks}

[dhcp]
dhcp_provider = none

[conductor]
automated_clean = false
",
        hardware_types = drivers.hardware_types.join(","),
        boot = drivers.boot.join(","),
        deploy = drivers.deploy.join(","),
        power = drivers.power.join(","),
        management = drivers.management.join(","),
        db = dir.join("ironic.sqlite").display(),
        locks = dir.join("locks").display(),
        max_limit = max_limit
            .map(|n| format!("max_limit = {n}"))
            .unwrap_or_default(),
    )
}

/// A running standalone Ironic; stopped (its whole process group) when dropped.
pub struct Ironic {
    /// The process (leader of its group).
    pub child: ChildGuard,
    /// Its API, `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its log.
    pub log: PathBuf,
}

impl Ironic {
    /// Writes `ironic.conf` into `dir`, creates the database and starts `ironic`; returns once
    /// its API listens (the conductor side registers a moment later: [`Ironic::wait_drivers`]).
    pub fn start(dir: &Path, drivers: &Drivers<'_>) -> Ironic {
        Ironic::start_paged(dir, drivers, None)
    }

    /// [`Ironic::start`] with list pages of at most `max_limit` records, when given.
    pub fn start_paged(dir: &Path, drivers: &Drivers<'_>, max_limit: Option<usize>) -> Ironic {
        Ironic::try_start(dir, drivers, max_limit).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// [`Ironic::start_paged`] that returns what went wrong instead of failing the test (the
    /// benches report it and go on).
    pub fn try_start(
        dir: &Path,
        drivers: &Drivers<'_>,
        max_limit: Option<usize>,
    ) -> anyhow::Result<Ironic> {
        std::fs::create_dir_all(dir.join("locks")).context("Ironic's lock directory")?;
        let port = free_port();
        let conf = dir.join("ironic.conf");
        std::fs::write(&conf, ironic_conf(dir, port, drivers, max_limit))
            .context("writing ironic.conf")?;
        let path = ironic_path(&[]);
        create_schema(&conf, &path)?;
        let log = dir.join("ironic.log");
        let child = ironic_command(&conf, &path, &log)?
            .spawn()
            .context("starting ironic (fix: run scripts/setup)")?;
        let mut child = ChildGuard::new(child)
            .killing_group()
            .with_log("ironic", &log);
        let deadline = Instant::now() + Duration::from_secs(180);
        while !tcp_listening(port) {
            if let Ok(Some(status)) = child.try_wait() {
                bail!(
                    "ironic exited ({status}) before listening: {}",
                    log_tail(&log, 30)
                );
            }
            if Instant::now() > deadline {
                bail!("ironic did not listen within 180 s: {}", log_tail(&log, 30));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(Ironic {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        })
    }

    /// Waits until `GET /v1/drivers` lists every driver of `names` (the conductor side has
    /// registered them).
    pub async fn wait_drivers(&self, names: &[&str], limit: Duration) {
        vmdeploy_conductor::net::https::install_crypto_provider();
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("an HTTP client");
        let deadline = Instant::now() + limit;
        loop {
            let listed: Vec<String> = match http
                .get(format!("{}/v1/drivers", self.url))
                .header(VERSION.0, VERSION.1)
                .send()
                .await
            {
                Ok(r) => r
                    .json::<Value>()
                    .await
                    .ok()
                    .and_then(|v| v.get("drivers").and_then(Value::as_array).cloned())
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|d| d.get("name").and_then(Value::as_str).map(str::to_string))
                    .collect(),
                Err(_) => Vec::new(),
            };
            if names.iter().all(|n| listed.iter().any(|l| l == n)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Ironic lists {listed:?}, not all of {names:?}, after {} s",
                limit.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// `PATH` for Ironic's processes: `first`, then the venv's `bin` (Ironic runs its own tools by
/// name), then the caller's.
pub fn ironic_path(first: &[&Path]) -> String {
    let venv = venv_bin("python3");
    let mut parts: Vec<String> = first.iter().map(|p| p.display().to_string()).collect();
    if let Some(bin) = venv.parent() {
        parts.push(bin.display().to_string());
    }
    parts.push(std::env::var("PATH").unwrap_or_default());
    parts.join(":")
}

/// `ironic-dbsync create_schema` for the configuration `conf`.
pub fn create_schema(conf: &Path, path: &str) -> anyhow::Result<()> {
    let out = Command::new(venv_bin("ironic-dbsync"))
        .arg("--config-file")
        .arg(conf)
        .arg("create_schema")
        .env("PATH", path)
        .output()
        .context("running ironic-dbsync (fix: run scripts/setup)")?;
    if !out.status.success() {
        bail!(
            "ironic-dbsync create_schema failed (fix: run scripts/setup): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The all-in-one `ironic` process for `conf`: no proxy from the environment (a caller sets
/// its own after this), its own process group (a guard that kills the group stops its workers
/// too), stderr to `log`.
pub fn ironic_command(conf: &Path, path: &str, log: &Path) -> anyhow::Result<Command> {
    let mut command = Command::new(venv_bin("ironic"));
    command
        .arg("--config-file")
        .arg(conf)
        .env("PATH", path)
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(log)
                .with_context(|| format!("creating Ironic's log {}", log.display()))?,
        );
    Ok(command)
}

/// The last `lines` lines of a log, for an error message.
fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
