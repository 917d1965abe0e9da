//! A fake-ramdisk harness: the deploy agent (IPA-compatible, `agent/`) of many nodes at once,
//! without booting them, so that a benchmark can drive hundreds of concurrent `agent_ilo`
//! deploys, cleanings and undeploys through the conductor's API against the in-memory iLO
//! emulator (docs/architecture.md §10, "a fake-ramdisk harness"). It stands in for ramdisks in
//! tests and benches; nothing here ships.
//!
//! # What one node's ramdisk does (as `agent/src/api/agent_mode.rs` does)
//! 1. **Boot**: the server's iLO says it booted the deploy media: power on, the last boot from
//!    the CD (`last_boot.device == "CDROM"`, no media read error) with a floppy inserted
//!    ([`boot_watch`]). Each boot of the emulator's server has a number (`boots`); a ramdisk
//!    runs for one boot, and a later boot of the deploy media starts a fresh one (cleaning,
//!    redeploy).
//! 2. **Floppy**: fetched from the temp URL the conductor gave the iLO (TLS not verified, as an
//!    iLO fetches), `parameters.txt` read with shared's FAT reader and parameters parser
//!    (`ipa-api-url`, `ipa-agent-token`, `ipa-agent-ca`, `BOOTIF`, `ipa-enable-auto-tls`).
//! 3. **Lookup and heartbeats** ([`ramdisk`]): the API version negotiated as the agent does,
//!    `GET /v1/lookup?addresses=<MACs>` (retried 5, 10, 30 s apart on 404/409), then
//!    `POST /v1/heartbeat/{uuid}` with `callback_url`, `agent_token`, `agent_version`,
//!    `agent_verify_ca` and the write progress, every `heartbeat_timeout × [0.3, 0.6]` (the
//!    agent's own [`vmdeploy_agent::api::heartbeat::next_interval`]), early after a finished
//!    command, times multiplied by [`Config::heartbeat_scale`] so tests run fast.
//! 4. **Command API** ([`listener`], [`commands`]): the real agent's
//!    [`vmdeploy_agent::api::server::CommandApi`] (token check, one command at a time, history,
//!    `wait`) in front of a fake executor: `standby.prepare_image` "writes" for
//!    [`Config::write_delay`] and reports the image written with its checksum as the agent
//!    words it, nothing touches a disk. Auto-TLS as the agent: a certificate generated per boot
//!    for the node's address ([`vmdeploy_agent::api::tls::generate`]), sent in heartbeats and
//!    pinned by the conductor; or plain HTTP ([`TlsMode`]).
//! 5. **Stop**: `standby.power_off` ends the ramdisk (after [`Config::power_off_grace`]); so does
//!    the iLO reporting the server off, or booted again.
//!
//! # Telling nodes apart
//! Node `i` (the `i`-th server given) has its own loopback address, [`Config::node_net`] + 1 +
//! `i` (127.77.0.1, 127.77.0.2, ...; Linux routes all of 127.0.0.0/8 to `lo` with no set-up).
//! One listener on [`Config::listen`] (`0.0.0.0:PORT`) serves every node's command API: each
//! accepted connection is given to the node whose address it was made to (its local address);
//! a connection to any other address is closed at once. `callback_url` is
//! `https://127.77.0.(i+1):PORT`. The node's own calls (floppy, lookup, heartbeats) leave from
//! that address too when the peer is on loopback, so the conductor sees one client address
//! per node, as with real ramdisks (its per-address connection shares and failed call-back
//! throttling would otherwise lump a thousand agents together).
//!
//! # Counters
//! [`Stats`]: ramdisks started and ended, floppies, lookups (and misses), heartbeats (and
//! conflicts), commands by name, command API requests, emulator polls, and every error with
//! its text ([`Harness::errors`]). A 404/409 lookup and a 409 heartbeat (the node is locked
//! by a task of the conductor: the previous heartbeat's, a cleaning, a power sync pass) are
//! protocol, not errors; both are retried.
//!
//! # Limitations
//! - The emulator has no listing of all its servers: each server's `GET /_emulator/state` is
//!   polled, every [`Config::poll_interval`], at most [`Config::poll_concurrency`] at once, the
//!   servers' polls spread over the interval.
//! - The in-memory emulator's host does not power itself off after `standby.power_off`: the
//!   conductor powers it off through the iLO after `deploy.agent_power_off_wait` (set it low).
//! - No `iscsi` or `image` extension (the iSCSI and partition-image flows are not faked); the
//!   emulator reports one MAC for every server, so MACs are the harness's ([`ServerSpec::macs`],
//!   else the floppy's `BOOTIF`). `ipa-advertise-host/port` are ignored.
//! - Heartbeats stop as soon as `standby.power_off` arrives (the agent keeps heartbeating
//!   during its 1 s grace), so a heartbeat never races the conductor's wipe of the token.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub mod boot_watch;
pub mod commands;
pub mod listener;
pub mod ramdisk;

/// Errors kept with their text; past this many only the count goes on.
pub const MAX_KEPT_ERRORS: usize = 1000;

/// Whether a node's command API speaks TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Auto-TLS, as the agent by default: a certificate per boot, sent in heartbeats.
    Auto,
    /// Plain HTTP (the agent with `ipa-enable-auto-tls=0`): the conductor must allow it
    /// (`deploy.agent_allow_plain_http`).
    Off,
    /// Auto-TLS on even-numbered servers, plain HTTP on odd ones: both of the conductor's agent
    /// client paths in one run.
    Mixed,
}

impl TlsMode {
    /// Whether server `index` serves HTTPS (before the floppy's `ipa-enable-auto-tls`).
    pub fn for_server(self, index: usize) -> bool {
        match self {
            TlsMode::Auto => true,
            TlsMode::Off => false,
            TlsMode::Mixed => index.is_multiple_of(2),
        }
    }
}

impl std::str::FromStr for TlsMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(TlsMode::Auto),
            "off" => Ok(TlsMode::Off),
            "mixed" => Ok(TlsMode::Mixed),
            other => Err(format!("{other:?} is not auto, off or mixed")),
        }
    }
}

/// One emulated server whose deploy ramdisk the harness plays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// `host:port` of the server's iLO (its admin API is `/_emulator/state` there).
    pub emulator: SocketAddr,
    /// The node's MACs for the lookup (as its ports are enrolled); empty: the floppy's `BOOTIF`.
    pub macs: Vec<String>,
}

/// How the harness runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The servers, by index (node `i` gets address `node_net + 1 + i`).
    pub servers: Vec<ServerSpec>,
    /// The emulator's certificate (PEM) to verify its admin API with; `None` accepts any.
    pub emulator_ca_pem: Option<String>,
    /// Where the command API of every node listens (port 0: ephemeral). The IP must be one
    /// that every node address reaches: `0.0.0.0` (127.0.0.0/8 cannot be bound as one).
    pub listen: SocketAddr,
    /// The nodes' loopback addresses start after this one (must be in 127.0.0.0/8).
    pub node_net: Ipv4Addr,
    /// HTTPS or plain HTTP command APIs.
    pub tls: TlsMode,
    /// How often each server's state is read.
    pub poll_interval: Duration,
    /// State reads in flight at once.
    pub poll_concurrency: usize,
    /// Multiplies every heartbeat and lookup pause (1.0: the agent's own timing).
    pub heartbeat_scale: f64,
    /// Pause between the boot seen at the iLO and the floppy read (the kernel's boot).
    pub boot_delay: Duration,
    /// How long `standby.prepare_image` "writes".
    pub write_delay: Duration,
    /// How long a clean step (and the `erase_devices_metadata` deploy step) runs.
    pub clean_step_delay: Duration,
    /// The image size reported (progress and result) when the image is not downloaded.
    pub image_size: u64,
    /// Download the image from the URL the conductor gave and check its checksum (as the agent
    /// would, without a disk): the result then reports the real size and MBR signature.
    pub verify_image: bool,
    /// How long the command API stays up after `standby.power_off` (the agent's
    /// `VMDEPLOY_POWER_OFF_GRACE_MS`, 1 s).
    pub power_off_grace: Duration,
    /// How long a ramdisk looks its node up before it gives up (the agent's 900 s).
    pub lookup_timeout: Duration,
    /// Events (boot seen, lookup, power-off, stop) to stderr.
    pub verbose: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            servers: Vec::new(),
            emulator_ca_pem: None,
            listen: SocketAddr::from(([0, 0, 0, 0], 9999)),
            node_net: Ipv4Addr::new(127, 77, 0, 0),
            tls: TlsMode::Auto,
            poll_interval: Duration::from_secs(1),
            poll_concurrency: 64,
            heartbeat_scale: 1.0,
            boot_delay: Duration::from_secs(2),
            write_delay: Duration::from_secs(2),
            clean_step_delay: Duration::from_secs(1),
            image_size: 1 << 30,
            verify_image: false,
            power_off_grace: Duration::from_secs(1),
            lookup_timeout: Duration::from_secs(900),
            verbose: false,
        }
    }
}

impl Config {
    /// The loopback address of node `index` (x.y.z.0 and x.y.z.255 included: 127.0.0.0/8 is
    /// one network, whose broadcast address 127.255.255.255 is the only one left out).
    pub fn node_ip(&self, index: usize) -> Option<Ipv4Addr> {
        let offset = u32::try_from(index).ok()?.checked_add(1)?;
        let ip = Ipv4Addr::from(u32::from(self.node_net).checked_add(offset)?);
        (ip.octets()[0] == 127 && ip != Ipv4Addr::new(127, 255, 255, 255)).then_some(ip)
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.servers.is_empty() {
            bail!("no servers to play the ramdisk of");
        }
        if !(self.listen.is_ipv4() && self.listen.ip().is_unspecified()) {
            bail!(
                "listen {} must be 0.0.0.0:PORT: only a wildcard listener is reached at every \
                 node's 127.x.y.z address",
                self.listen
            );
        }
        if self.node_net.octets()[0] != 127 {
            bail!("node_net {} is not in 127.0.0.0/8", self.node_net);
        }
        if self.node_ip(self.servers.len() - 1).is_none() {
            bail!(
                "{} node addresses after {} run out of 127.0.0.0/8",
                self.servers.len(),
                self.node_net
            );
        }
        if !(self.heartbeat_scale.is_finite() && self.heartbeat_scale > 0.0) {
            bail!("heartbeat_scale {} must be above 0", self.heartbeat_scale);
        }
        if self.poll_concurrency == 0 {
            bail!("poll_concurrency must be at least 1");
        }
        Ok(())
    }
}

/// The MAC `base + index` (the last three bytes counted up), as `aa:bb:cc:dd:ee:ff`.
pub fn mac_plus(base: &str, index: usize) -> anyhow::Result<String> {
    let mac = vmdeploy_shared::params::MacAddr::parse(base)
        .with_context(|| format!("reading the MAC {base:?}"))?;
    let m = mac.0;
    let low = u32::from_be_bytes([0, m[3], m[4], m[5]]);
    let low = low
        .checked_add(u32::try_from(index).context("index too large")?)
        .filter(|v| *v < 1 << 24)
        .with_context(|| format!("{base} + {index} overflows the MAC's last three bytes"))?;
    let [_, a, b, c] = low.to_be_bytes();
    Ok(vmdeploy_shared::params::MacAddr([m[0], m[1], m[2], a, b, c]).to_string())
}

/// Reads the servers from the emulator's stdout (`server <i> https://<host:port>` lines).
pub fn servers_from_emulator_output(text: &str) -> anyhow::Result<Vec<SocketAddr>> {
    let mut found: BTreeMap<usize, SocketAddr> = BTreeMap::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("server") {
            continue;
        }
        let (Some(index), Some(url)) = (words.next(), words.next()) else {
            continue;
        };
        let index: usize = index
            .parse()
            .with_context(|| format!("reading the index of {line:?}"))?;
        let addr = url
            .strip_prefix("https://")
            .unwrap_or(url)
            .trim_end_matches('/')
            .parse()
            .with_context(|| format!("reading the address of {line:?}"))?;
        found.insert(index, addr);
    }
    let addrs: Vec<SocketAddr> = found.values().copied().collect();
    if found.keys().copied().ne(0..addrs.len()) {
        bail!("the server indexes are not 0..{}", addrs.len());
    }
    Ok(addrs)
}

/// The harness's counters (see the module docs).
#[derive(Debug, Default)]
pub struct Stats {
    /// Ramdisks started (boots of the deploy media seen).
    pub ramdisks_started: AtomicU64,
    /// Ramdisks that received `standby.power_off` (and so ended).
    pub ramdisks_powered_off: AtomicU64,
    /// Ramdisks stopped because the iLO showed the server off or booted again.
    pub ramdisks_stopped_by_bmc: AtomicU64,
    /// Ramdisks that ended with an error (counted in `errors` too).
    pub ramdisks_failed: AtomicU64,
    /// Floppies fetched and read.
    pub floppies: AtomicU64,
    /// Lookups that found the node.
    pub lookups: AtomicU64,
    /// Lookups answered 404 or 409 (not yet expected), retried.
    pub lookup_misses: AtomicU64,
    /// Heartbeats accepted (202).
    pub heartbeats: AtomicU64,
    /// Heartbeats answered 409 (the node locked by the conductor), retried.
    pub heartbeat_conflicts: AtomicU64,
    /// Requests to the command APIs.
    pub api_requests: AtomicU64,
    /// Command API connections that completed a TLS handshake (auto-TLS nodes).
    pub api_tls_connections: AtomicU64,
    /// Connections to an address no ramdisk serves now, closed.
    pub api_connections_refused: AtomicU64,
    /// State reads of the emulator.
    pub polls: AtomicU64,
    /// Commands started, by `extension.command`.
    commands: Mutex<BTreeMap<String, u64>>,
    /// Errors so far (all, including those past [`MAX_KEPT_ERRORS`]).
    pub error_count: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Stats {
    /// Counts one more.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a command started.
    pub fn command(&self, name: &str) {
        if let Ok(mut map) = self.commands.lock() {
            *map.entry(name.to_owned()).or_default() += 1;
        }
    }

    /// Keeps an error.
    pub fn error(&self, text: String) {
        self.error_count.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut errors) = self.errors.lock() {
            if errors.len() < MAX_KEPT_ERRORS {
                errors.push(text);
            }
        }
    }

    /// The commands started so far, by name.
    pub fn commands(&self) -> BTreeMap<String, u64> {
        self.commands.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// The errors kept so far.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Every counter as JSON (the errors' count, and the first 20 texts).
    pub fn to_json(&self) -> Value {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let errors = self.errors();
        let commands = self.commands();
        json!({
            "ramdisks_started": n(&self.ramdisks_started),
            "ramdisks_powered_off": n(&self.ramdisks_powered_off),
            "ramdisks_stopped_by_bmc": n(&self.ramdisks_stopped_by_bmc),
            "ramdisks_failed": n(&self.ramdisks_failed),
            "floppies": n(&self.floppies),
            "lookups": n(&self.lookups),
            "lookup_misses": n(&self.lookup_misses),
            "heartbeats": n(&self.heartbeats),
            "heartbeat_conflicts": n(&self.heartbeat_conflicts),
            "commands": commands.values().sum::<u64>(),
            "commands_by_name": commands,
            "api_requests": n(&self.api_requests),
            "api_tls_connections": n(&self.api_tls_connections),
            "api_connections_refused": n(&self.api_connections_refused),
            "polls": n(&self.polls),
            "errors": n(&self.error_count),
            "first_errors": errors.iter().take(20).collect::<Vec<_>>(),
        })
    }
}

/// What every task of the harness shares.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) stats: Arc<Stats>,
    /// The command API of each running ramdisk, by the node's address.
    pub(crate) endpoints: RwLock<HashMap<IpAddr, Arc<listener::Endpoint>>>,
    /// The port every command API listens on.
    pub(crate) port: u16,
    /// The client of the emulator's admin API.
    pub(crate) emulator: reqwest::Client,
    /// Bounds the state reads in flight.
    pub(crate) polls: tokio::sync::Semaphore,
}

impl Shared {
    pub(crate) fn log(&self, text: impl FnOnce() -> String) {
        if self.config.verbose {
            eprintln!("fake-ramdisk: {}", text());
        }
    }
}

/// A running harness; dropping it stops every task (and so every fake ramdisk).
pub struct Harness {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("listen", &self.local_addr)
            .field("servers", &self.shared.config.servers.len())
            .finish_non_exhaustive()
    }
}

impl Harness {
    /// Binds the command API listener, then watches every server. Must run inside a tokio
    /// runtime.
    pub async fn start(config: Config) -> anyhow::Result<Harness> {
        config.check()?;
        // Fails only when a provider is installed already, which is what we want anyway.
        let _ = rustls::crypto::ring::default_provider().install_default();
        raise_fd_limit(config.servers.len());
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding the command API listener on {}", config.listen))?;
        let local_addr = listener
            .local_addr()
            .context("reading the listener's address")?;
        let emulator = emulator_client(config.emulator_ca_pem.as_deref())?;
        let shared = Arc::new(Shared {
            polls: tokio::sync::Semaphore::new(config.poll_concurrency),
            port: local_addr.port(),
            config,
            stats: Arc::new(Stats::default()),
            endpoints: RwLock::new(HashMap::new()),
            emulator,
        });
        let (stop, stopped) = watch::channel(false);
        let mut tasks = vec![tokio::spawn(listener::serve(
            listener,
            Arc::clone(&shared),
            stopped.clone(),
        ))];
        for index in 0..shared.config.servers.len() {
            tasks.push(tokio::spawn(boot_watch::watch_server(
                Arc::clone(&shared),
                index,
                stopped.clone(),
            )));
        }
        Ok(Harness {
            shared,
            local_addr,
            stop,
            tasks,
        })
    }

    /// Where the command API listener is bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Node `index`'s `callback_url` host and port.
    pub fn node_address(&self, index: usize) -> Option<SocketAddr> {
        self.shared
            .config
            .node_ip(index)
            .map(|ip| SocketAddr::from((ip, self.local_addr.port())))
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// The errors kept so far.
    pub fn errors(&self) -> Vec<String> {
        self.shared.stats.errors()
    }

    /// Ramdisks serving a command API now.
    pub fn running(&self) -> usize {
        self.shared.endpoints.read().map(|e| e.len()).unwrap_or(0)
    }

    /// Stops every task and waits for them.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The client of the emulator's admin API: pinned to its certificate when given, else
/// trusting any (the emulator's is self-signed, and this is a test tool on loopback).
fn emulator_client(ca_pem: Option<&str>) -> anyhow::Result<reqwest::Client> {
    let builder = reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(15))
        // The emulator closes a connection idle for 30 s.
        .pool_idle_timeout(Duration::from_secs(20))
        .pool_max_idle_per_host(1);
    let builder = match ca_pem {
        Some(pem) => {
            let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
                .context("reading the emulator's certificate")?;
            builder.tls_certs_only(certs)
        }
        None => builder.tls_danger_accept_invalid_certs(true),
    };
    builder
        .build()
        .context("building the emulator's admin client")
}

/// Raises the soft open-file limit to the hard one when many nodes run: each holds a
/// connection to its iLO, to the conductor and from it.
fn raise_fd_limit(nodes: usize) {
    let wanted = (nodes as u64).saturating_mul(6).saturating_add(256);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own and pass by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    if limit.rlim_cur >= wanted || limit.rlim_cur >= limit.rlim_max {
        return;
    }
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads one valid rlimit from the struct we own; a refusal changes nothing.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        eprintln!(
            "fake-ramdisk: could not raise the open-file limit from {} to {}",
            limit.rlim_cur, limit.rlim_max
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_addresses_stay_in_loopback() {
        let config = Config::default();
        assert_eq!(config.node_ip(0), Some(Ipv4Addr::new(127, 77, 0, 1)));
        assert_eq!(config.node_ip(254), Some(Ipv4Addr::new(127, 77, 0, 255)));
        assert_eq!(config.node_ip(255), Some(Ipv4Addr::new(127, 77, 1, 0)));
        assert_eq!(config.node_ip(999), Some(Ipv4Addr::new(127, 77, 3, 232)));
        let edge = Config {
            node_net: Ipv4Addr::new(127, 255, 255, 250),
            ..Config::default()
        };
        assert_eq!(edge.node_ip(3), Some(Ipv4Addr::new(127, 255, 255, 254)));
        assert_eq!(edge.node_ip(4), None, "the broadcast address is no node's");
        assert_eq!(edge.node_ip(10), None, "128.0.0.x is not loopback");
    }

    #[test]
    fn macs_count_up_from_the_base() {
        assert_eq!(
            mac_plus("52:54:00:00:00:00", 0).expect("mac"),
            "52:54:00:00:00:00"
        );
        assert_eq!(
            mac_plus("52-54-00-00-00-ff", 1).expect("mac"),
            "52:54:00:00:01:00"
        );
        assert_eq!(
            mac_plus("52:54:00:00:00:00", 999).expect("mac"),
            "52:54:00:00:03:e7"
        );
        assert!(mac_plus("52:54:00:ff:ff:ff", 1).is_err());
        assert!(mac_plus("nonsense", 1).is_err());
    }

    #[test]
    fn servers_come_from_the_emulators_stdout() {
        let out = "tls-cert /tmp/c.pem\nserver 1 https://127.0.0.1:8444\n\
                   server 0 https://127.0.0.1:8443\nready\n";
        let servers = servers_from_emulator_output(out).expect("servers");
        assert_eq!(
            servers,
            vec![
                "127.0.0.1:8443".parse::<SocketAddr>().expect("addr"),
                "127.0.0.1:8444".parse().expect("addr")
            ]
        );
        assert!(servers_from_emulator_output("server 1 https://127.0.0.1:1\n").is_err());
        assert!(servers_from_emulator_output("server x https://127.0.0.1:1\n").is_err());
    }

    #[test]
    fn tls_modes() {
        assert!(TlsMode::Auto.for_server(1));
        assert!(!TlsMode::Off.for_server(0));
        assert!(TlsMode::Mixed.for_server(0) && !TlsMode::Mixed.for_server(1));
        assert_eq!("mixed".parse::<TlsMode>(), Ok(TlsMode::Mixed));
        assert!("on".parse::<TlsMode>().is_err());
    }

    #[test]
    fn errors_are_kept_up_to_a_bound() {
        let stats = Stats::default();
        for i in 0..MAX_KEPT_ERRORS + 5 {
            stats.error(format!("e{i}"));
        }
        assert_eq!(stats.errors().len(), MAX_KEPT_ERRORS);
        assert_eq!(stats.to_json()["errors"], json!(MAX_KEPT_ERRORS as u64 + 5));
        stats.command("standby.power_off");
        stats.command("standby.power_off");
        assert_eq!(stats.to_json()["commands_by_name"]["standby.power_off"], 2);
    }
}
