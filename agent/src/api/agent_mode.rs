//! The `agent_ilo` flow: lookup, heartbeats with progress, and the command API until the
//! conductor powers the node off (docs/ironic-protocols.md §3, docs/architecture.md §4).
//!
//! # Design
//! One tokio runtime runs three things: the command API ([`super::server`]) with the `standby`,
//! `deploy`, `image`, `iscsi`, `clean` and `log` extensions, the heartbeat loop
//! ([`super::heartbeat`]), and the wait for
//! `standby.power_off`. In order: bind the command API port (fail early if taken), generate the
//! command API's certificate ([`super::tls`], Ironic's auto-TLS), negotiate the API version, look
//! the node up by MAC (retried, bounded), pick the install disk (the lookup's
//! `properties.root_device` hints, else the floppy's), serve commands over HTTPS, heartbeat with
//! `callback_url` `https://…` and the certificate in `agent_verify_ca`. A finished command
//! triggers an early heartbeat (rate limited: at least 1 s after the previous one).
//!
//! Auto-TLS is on unless the parameters say `ipa-enable-auto-tls=0` (IPA's `enable_auto_tls`;
//! docs/architecture.md §7: plain HTTP only when asked for). Unlike IPA, the agent does not fall back to
//! plain HTTP when the conductor's API is older than 1.68 (where `agent_verify_ca` came): it
//! says so in the log, and such a conductor needs auto-TLS turned off.
//!
//! # Limitations
//! Whole-disk images only.
//! Tuning for tests, read from the environment: `VMDEPLOY_LOOKUP_TIMEOUT_SECS` (default 900) and
//! `VMDEPLOY_POWER_OFF_GRACE_MS` (default 1000: time to let the conductor read the `power_off`
//! result before the API goes away).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;
use tokio::sync::Notify;
use vmdeploy_shared::api::ipa::ApiVersion;
use vmdeploy_shared::params::{AgentParams, MacAddr, RootDeviceHints};
use vmdeploy_shared::partition::local_boot::GRUB_EFI_INITRAMFS_PATH;

use super::clean::Clean;
use super::client::ConductorClient;
use super::deploy::Deploy;
use super::heartbeat::{run_heartbeats, HeartbeatPlan, SharedProgress, DEFAULT_HEARTBEAT_TIMEOUT};
use super::image::Image;
use super::iscsi::Iscsi;
use super::log::Log;
use super::server::{self, CommandApi, CommandFuture, Executor, StartError};
use super::standby::{DiskChoice, Standby};
use crate::init::FinalAction;
use crate::install::InstalledState;

/// Everything the agent flow needs from `/init`.
#[derive(Debug, Clone)]
pub struct AgentModeConfig {
    /// Parameters from the floppy / command line.
    pub params: AgentParams,
    /// The address the conductor reaches this agent at (host of `callback_url`).
    pub advertise: IpAddr,
    /// Where `/v1/commands` listens (0.0.0.0:9999 in the ramdisk; loopback in tests).
    pub listen: SocketAddr,
    /// MAC addresses for the lookup.
    pub mac_addresses: Vec<MacAddr>,
    /// Serve the command API over HTTPS with a boot-time certificate (`ipa-enable-auto-tls`).
    pub auto_tls: bool,
}

/// Whether `ipa-enable-auto-tls` asks for auto-TLS: on when absent; `1/true/yes/on` or
/// `0/false/no/off` (any case, as oslo.config reads IPA's boolean options), else an error
/// naming the key.
pub fn auto_tls_from(value: Option<&str>) -> anyhow::Result<bool> {
    let Some(v) = value.map(str::trim) else {
        return Ok(true);
    };
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => bail!(
            "{}={v:?} is not a boolean (1/0, true/false, yes/no, on/off)",
            vmdeploy_shared::params::keys::IPA_ENABLE_AUTO_TLS
        ),
    }
}

/// How long the lookup may take in all, by default: the ramdisk may boot long before the
/// conductor moves the node to `wait call-back`.
pub const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(900);

/// How long the iSCSI target may take to stop and flush at the end.
const TARGET_STOP_TIMEOUT: Duration = Duration::from_secs(120);

fn env_duration(name: &str, unit: fn(u64) -> Duration, default: Duration) -> Duration {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(unit)
        .unwrap_or(default)
}

/// Runs the agent flow; returns what to do with the machine when the conductor is done.
pub fn run(cfg: AgentModeConfig) -> anyhow::Result<FinalAction> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(run_async(cfg));
    // Downloads and disk jobs may still sit in the blocking pool after a failure: do not wait.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

async fn run_async(cfg: AgentModeConfig) -> anyhow::Result<FinalAction> {
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("listening for the command API on {}", cfg.listen))?;
    let port = listener
        .local_addr()
        .context("reading the command API address")?
        .port();
    let cert = if cfg.auto_tls {
        let cert = super::tls::generate(cfg.advertise).with_context(|| {
            format!(
                "generating the command API certificate for {}",
                cfg.advertise
            )
        })?;
        tracing::info!(address = %cfg.advertise, "command API certificate generated (auto-TLS)");
        Some(cert)
    } else {
        tracing::warn!("auto-TLS is off (ipa-enable-auto-tls): the command API speaks plain HTTP");
        None
    };
    let scheme = if cert.is_some() { "https" } else { "http" };
    // `ipa-advertise-port`: the conductor reaches this agent through a port forward.
    let advertised_port = cfg.params.common.advertise_port.unwrap_or(port);
    let callback_url = format!(
        "{scheme}://{}",
        SocketAddr::new(cfg.advertise, advertised_port)
    );
    if advertised_port != port {
        tracing::info!(
            listen_port = port,
            advertised_port,
            "advertising another port (ipa-advertise-port)"
        );
    }

    let mut client =
        ConductorClient::new(&cfg.params.api_url, cfg.params.common.agent_ca_pem.clone())
            .context("setting up the conductor client")?;
    client.negotiate_version().await;
    if cert.is_some() && client.version() < ApiVersion::AGENT_VERIFY_CA {
        tracing::error!(
            using = %client.version(),
            "the conductor's API predates agent_verify_ca (1.68): it cannot learn this agent's \
             certificate and will not reach the command API; set ipa-enable-auto-tls=0 for it"
        );
    }
    let macs: Vec<String> = cfg.mac_addresses.iter().map(ToString::to_string).collect();
    if macs.is_empty() {
        bail!("no MAC addresses to look this node up by");
    }
    let lookup_timeout = env_duration(
        "VMDEPLOY_LOOKUP_TIMEOUT_SECS",
        Duration::from_secs,
        DEFAULT_LOOKUP_TIMEOUT,
    );
    tracing::info!(conductor = %cfg.params.api_url, macs = %macs.join(","), "looking the node up");
    let found = client
        .lookup(&macs, None, lookup_timeout)
        .await
        .context("looking the node up at the conductor")?;
    let node_uuid = found.node.uuid.clone();
    tracing::info!(node = %node_uuid, "lookup succeeded");

    // The floppy's pre-generated token wins (the lookup then answers `******`).
    let token = match (&cfg.params.agent_token, found.disclosed_token()) {
        (Some(t), _) => t.clone(),
        (None, Some(t)) => t.clone(),
        (None, None) => bail!(
            "no agent token: neither ipa-agent-token in the parameters nor one disclosed by the \
             lookup (it answered a masked or no token); refusing to serve commands unauthenticated"
        ),
    };
    let heartbeat_timeout = found
        .heartbeat_timeout()
        .filter(|t| *t > 0)
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_HEARTBEAT_TIMEOUT);

    let disk: DiskChoice = Arc::new(
        choose_disk(
            &found.node.properties,
            &cfg.params,
            Path::new("/sys/class/block"),
            Path::new("/dev"),
        )
        .map_err(|e| format!("{e:#}")),
    );
    match disk.as_ref() {
        Ok(d) => tracing::info!(disk = %d.display(), "install disk"),
        Err(e) => tracing::error!("no install disk (commands that need one will fail): {e}"),
    }

    let progress: SharedProgress = Arc::new(Mutex::new(None));
    let power_off = Arc::new(Notify::new());
    let command_done = Arc::new(Notify::new());
    let iscsi = Arc::new(Iscsi {
        disk: Arc::clone(&disk),
        bind: cfg.listen.ip(),
        stop: Arc::new(Notify::new()),
        running: Arc::new(Mutex::new(None)),
    });
    let installed = InstalledState::default();
    let standby = Arc::new(Standby {
        disk: Arc::clone(&disk),
        ca_pem: cfg.params.common.image_trust_pem(),
        progress: Arc::clone(&progress),
        power_off: Arc::clone(&power_off),
        installed: Arc::clone(&installed),
    });
    let dispatcher = Dispatcher {
        clean: Clean {
            disk: Arc::clone(&disk),
        },
        image: Image {
            disk: Arc::clone(&disk),
            installed,
            grub_efi: std::env::var_os("VMDEPLOY_GRUB_EFI")
                .map_or_else(|| GRUB_EFI_INITRAMFS_PATH.into(), Into::into),
            secure_boot: crate::firmware::SecureBoot::of_this_boot,
        },
        deploy: Deploy {
            standby: Arc::clone(&standby),
            disk,
        },
        standby,
        iscsi: Arc::clone(&iscsi),
        log: Log::system(vec![token.clone()]),
        command_done: Arc::clone(&command_done),
    };
    let api = CommandApi::new(Some(token.clone()), Arc::new(dispatcher));
    let stop_server = Arc::new(Notify::new());
    let server_task = {
        let stop = Arc::clone(&stop_server);
        let tls = cert.as_ref().map(|c| Arc::clone(&c.server_config));
        tokio::spawn(server::serve_with(listener, api, tls, async move {
            stop.notified().await;
        }))
    };
    tracing::info!(%callback_url, "command API serving");

    let stop_heartbeats = Arc::new(Notify::new());
    let heartbeats = tokio::spawn(run_heartbeats(
        client,
        HeartbeatPlan {
            node_uuid,
            callback_url,
            agent_verify_ca: cert.map(|c| c.cert_pem),
            agent_token: token,
            heartbeat_timeout,
        },
        progress,
        command_done,
        Arc::clone(&stop_heartbeats),
    ));

    power_off.notified().await;
    let grace = env_duration(
        "VMDEPLOY_POWER_OFF_GRACE_MS",
        Duration::from_millis,
        Duration::from_secs(1),
    );
    tokio::time::sleep(grace).await;
    stop_heartbeats.notify_one();
    stop_server.notify_one();
    let _ = heartbeats.await;
    match server_task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("command API ended with an error: {e}"),
        Err(e) => tracing::warn!("command API task failed: {e}"),
    }
    iscsi.shutdown(TARGET_STOP_TIMEOUT).await;
    tracing::info!("agent flow done: powering off");
    Ok(FinalAction::PowerOff)
}

/// Routes commands to the extensions and asks for an early heartbeat when one finishes.
struct Dispatcher {
    clean: Clean,
    deploy: Deploy,
    image: Image,
    standby: Arc<Standby>,
    iscsi: Arc<Iscsi>,
    log: Log,
    command_done: Arc<Notify>,
}

impl Executor for Dispatcher {
    fn start(&self, ext: &str, cmd: &str, params: &Value) -> Result<CommandFuture, StartError> {
        let fut = match ext {
            "standby" => self.standby.start(cmd, params)?,
            "iscsi" => self.iscsi.start(cmd, params)?,
            "clean" => self.clean.start(cmd, params)?,
            "deploy" => self.deploy.start(cmd, params)?,
            "image" => self.image.start(cmd, params)?,
            "log" => self.log.start(cmd, params)?,
            other => return Err(StartError::UnknownExtension(other.into())),
        };
        let done = Arc::clone(&self.command_done);
        Ok(Box::pin(async move {
            let out = fut.await;
            done.notify_one();
            out
        }))
    }
}

/// The install disk: the lookup's `properties.root_device` hints when present, else the
/// parameters' hints and `disk` list (docs/architecture.md §4; `disk::select`).
pub fn choose_disk(
    properties: &serde_json::Map<String, Value>,
    params: &AgentParams,
    sys_class_block: &Path,
    dev_dir: &Path,
) -> anyhow::Result<PathBuf> {
    let from_node = match properties.get("root_device") {
        None => None,
        Some(v) => RootDeviceHints::from_json(v).context("reading the node's root_device hints")?,
    };
    let hints = from_node.or_else(|| params.common.root_device.clone());
    // Loop devices are never install disks, unless a `name` hint names one (tests on loop
    // devices; an operator's explicit choice).
    let include_loop = hints
        .as_ref()
        .and_then(|h| h.name.as_deref())
        .is_some_and(|n| n.trim_start_matches("/dev/").starts_with("loop"));
    let disks = crate::disk::select::list_disks(sys_class_block, dev_dir, include_loop)
        .context("listing the disks")?;
    let list = params.common.disks.join(",");
    let chosen = crate::disk::select::select_disk(
        &disks,
        hints.as_ref(),
        (!list.is_empty()).then_some(list.as_str()),
    )
    .map_err(crate::drivers::with_undriven_note)?;
    Ok(chosen.path.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn auto_tls_parameter() {
        assert!(auto_tls_from(None).expect("absent"));
        for on in ["1", "true", "TRUE", "yes", "on", " 1 "] {
            assert!(auto_tls_from(Some(on)).expect(on), "{on}");
        }
        for off in ["0", "false", "False", "no", "off"] {
            assert!(!auto_tls_from(Some(off)).expect(off), "{off}");
        }
        let err = auto_tls_from(Some("maybe")).expect_err("not a boolean");
        assert!(
            format!("{err:#}").contains("ipa-enable-auto-tls"),
            "{err:#}"
        );
    }

    fn fake_disk(root: &Path, name: &str, gib: u64) {
        let d = root.join(name);
        std::fs::create_dir_all(d.join("device")).expect("dir");
        std::fs::write(d.join("size"), format!("{}\n", gib << 21)).expect("size");
        std::fs::write(d.join("removable"), "0\n").expect("removable");
        std::fs::write(d.join("ro"), "0\n").expect("ro");
    }

    #[test]
    fn node_hints_win_over_the_floppy() {
        let sys = tempfile::tempdir().expect("tmp");
        fake_disk(sys.path(), "sda", 10);
        fake_disk(sys.path(), "sdb", 20);
        fake_disk(sys.path(), "loop3", 1);
        let mut p = vmdeploy_shared::params::Params::new();
        p.set("ipa-api-url", "http://10.0.0.1:6385").expect("set");
        p.set("root_device", "size=10").expect("set");
        let params = AgentParams::from_params(&p).expect("params");
        let dev = Path::new("/dev");
        let none = serde_json::Map::new();
        assert_eq!(
            choose_disk(&none, &params, sys.path(), dev).expect("floppy hints"),
            PathBuf::from("/dev/sda")
        );
        // An empty object is no hints, as in Ironic: the floppy's apply.
        let empty = json!({"root_device": {}});
        assert_eq!(
            choose_disk(empty.as_object().expect("obj"), &params, sys.path(), dev)
                .expect("floppy hints"),
            PathBuf::from("/dev/sda")
        );
        let node = json!({"root_device": {"size": 20}});
        let node = node.as_object().expect("object");
        assert_eq!(
            choose_disk(node, &params, sys.path(), dev).expect("node hints"),
            PathBuf::from("/dev/sdb")
        );
        let looped = json!({"root_device": {"name": "/dev/loop3"}});
        assert_eq!(
            choose_disk(looped.as_object().expect("obj"), &params, sys.path(), dev)
                .expect("loop by name"),
            PathBuf::from("/dev/loop3")
        );
        let operator = json!({"root_device": {"size": ">= 10"}});
        let err = choose_disk(operator.as_object().expect("obj"), &params, sys.path(), dev)
            .expect_err("operator");
        assert!(format!("{err:#}").contains("operator \">=\""), "{err:#}");
        let missing = json!({"root_device": {"serial": "nope"}});
        let err = choose_disk(missing.as_object().expect("obj"), &params, sys.path(), dev)
            .expect_err("no match");
        assert!(format!("{err:#}").contains("no disk matches"), "{err:#}");
    }
}
