//! One boot of one node's fake ramdisk (the harness's steps 2, 3 and 5), in the order of the
//! agent's `agent_mode::run_async`: floppy, API version, lookup by MAC, the command API
//! registered, heartbeats until `standby.power_off`, a grace for the conductor to read that
//! answer, the end.
//!
//! # Design
//! The conductor client mirrors the agent's `api/client.rs` (the microversion negotiated from
//! `GET /` and heartbeat fields fitted to it; lookups 5, 10, 30 s apart; heartbeat bodies are
//! shared's [`Heartbeat`]) and the loop its `api/heartbeat.rs` (the agent's own
//! [`next_interval`] and early heartbeat after a finished command), every pause multiplied by
//! `heartbeat_scale`. A failed heartbeat's pause is kept above [`MIN_ERROR_PAUSE`], so that a
//! node the conductor holds locked for seconds (cleaning) is not asked ten times a second.
//! Calls to a loopback peer leave from the node's own address (module docs of the harness).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use reqwest::StatusCode;
use vmdeploy_agent::api::client::{FALLBACK_API_VERSION, MAX_API_VERSION, VERSION_HEADER};
use vmdeploy_agent::api::heartbeat::{
    next_interval, random_unit, DEFAULT_HEARTBEAT_TIMEOUT, EARLY_HEARTBEAT_MIN_GAP,
    MIN_HEARTBEAT_INTERVAL,
};
use vmdeploy_agent::api::server::CommandApi;
use vmdeploy_shared::api::ipa::{ApiRoot, ApiVersion, Heartbeat, LookupResponse};
use vmdeploy_shared::params::{self, keys, AgentParams, MacAddr, Params};
use vmdeploy_shared::secret::Secret;

use super::boot_watch::RamdiskBoot;
use super::commands::{FakeExecutor, NodeState};
use super::{listener, Shared, Stats};

/// What the heartbeats say the agent is (the agent sends its crate version; this harness is
/// built from the same workspace).
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Shortest pause after a failed heartbeat, whatever the scale.
pub const MIN_ERROR_PAUSE: Duration = Duration::from_millis(500);

/// Shortest pause between heartbeats or lookups, whatever the scale.
pub const MIN_PAUSE: Duration = Duration::from_millis(50);

/// Largest floppy read (a 1.44 MB image; anything bigger is not the conductor's).
const MAX_FLOPPY_BYTES: usize = 4 << 20;

/// Runs one ramdisk boot of server `index`; its failure is counted, never propagated.
/// `powered_off` turns true when `standby.power_off` arrives (the ramdisk then has only its
/// grace left: the iLO powering the server off during it is no interruption).
pub(crate) async fn run(
    shared: Arc<Shared>,
    index: usize,
    boot: RamdiskBoot,
    powered_off: Arc<AtomicBool>,
) {
    Stats::bump(&shared.stats.ramdisks_started);
    if let Err(e) = run_boot(&shared, index, &boot, &powered_off).await {
        Stats::bump(&shared.stats.ramdisks_failed);
        shared.stats.error(format!(
            "server {index} boot {}: the ramdisk failed: {e:#}",
            boot.boots
        ));
    }
}

async fn run_boot(
    shared: &Arc<Shared>,
    index: usize,
    boot: &RamdiskBoot,
    powered_off: &AtomicBool,
) -> anyhow::Result<()> {
    let config = &shared.config;
    let ip = IpAddr::V4(
        config
            .node_ip(index)
            .context("the node has no loopback address")?,
    );
    tokio::time::sleep(config.boot_delay).await;

    let floppy = fetch_floppy(ip, &boot.floppy_url).await?;
    let params = read_floppy(&floppy)?;
    Stats::bump(&shared.stats.floppies);
    let agent = AgentParams::from_params(&params).context("reading the floppy's parameters")?;
    let macs: Vec<String> = if config.servers[index].macs.is_empty() {
        agent.common.bootif.iter().map(MacAddr::to_string).collect()
    } else {
        config.servers[index].macs.clone()
    };
    if macs.is_empty() {
        bail!(
            "no MAC addresses to look the node up by: none given for the server and no BOOTIF \
             on the floppy"
        );
    }
    let tls = config.tls.for_server(index)
        && vmdeploy_agent::api::agent_mode::auto_tls_from(params.get(keys::IPA_ENABLE_AUTO_TLS))?;

    let mut conductor = Conductor::new(&agent.api_url, agent.common.agent_ca_pem.clone(), ip)?;
    conductor.negotiate_version(shared, index).await;
    let found = conductor.lookup(shared, index, &macs).await?;
    let node_uuid = found.node.uuid.clone();
    shared.log(|| {
        format!(
            "server {index} boot {}: lookup found node {node_uuid}",
            boot.boots
        )
    });
    // The floppy's pre-generated token wins (the lookup then answers `******`), as in the agent.
    let token = match (&agent.agent_token, found.disclosed_token()) {
        (Some(t), _) | (None, Some(t)) => t.clone(),
        (None, None) => bail!(
            "no agent token: neither ipa-agent-token on the floppy nor one disclosed by the lookup"
        ),
    };
    let heartbeat_timeout = found
        .heartbeat_timeout()
        .filter(|t| *t > 0)
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_HEARTBEAT_TIMEOUT);

    let cert = if tls {
        Some(
            vmdeploy_agent::api::tls::generate(ip)
                .with_context(|| format!("generating the command API certificate for {ip}"))?,
        )
    } else {
        None
    };
    let node = Arc::new(NodeState::new(index));
    let executor = FakeExecutor::new(
        Arc::clone(shared),
        Arc::clone(&node),
        ip,
        agent.common.image_trust_pem(),
    );
    let api = CommandApi::new(Some(token.clone()), Arc::new(executor));
    let _registration = listener::register(
        shared,
        ip,
        index,
        api,
        cert.as_ref().map(|c| Arc::clone(&c.server_config)),
    );
    let scheme = if cert.is_some() { "https" } else { "http" };
    let plan = Plan {
        node_uuid,
        callback_url: format!("{scheme}://{}", SocketAddr::new(ip, shared.port)),
        agent_verify_ca: cert.map(|c| c.cert_pem),
        token,
        heartbeat_timeout,
    };
    heartbeats(shared, index, &conductor, &plan, &node).await;
    powered_off.store(true, Ordering::SeqCst);
    Stats::bump(&shared.stats.ramdisks_powered_off);
    shared.log(|| format!("server {index} boot {}: standby.power_off", boot.boots));
    // Time for the conductor to read the answer to `power_off` before the API goes away.
    tokio::time::sleep(config.power_off_grace).await;
    Ok(())
}

/// Whether `url`'s host is a loopback address (or `localhost`): calls there leave from the
/// node's own loopback address.
fn loopback_peer(url: &str) -> bool {
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return false;
    };
    let Some(host) = parsed.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => bare.eq_ignore_ascii_case("localhost"),
    }
}

/// Whom a node's client trusts for `https://`.
pub(crate) enum Trust {
    /// Anything (an iLO does not check the media server's certificate).
    Any,
    /// Only these CAs (PEM); `None`: the platform's, else nothing (as the agent's client).
    Ca(Option<Vec<u8>>),
}

/// A client for node `ip` calling `peer_url`.
pub(crate) fn node_client(
    ip: IpAddr,
    peer_url: &str,
    trust: Trust,
    timeout: Duration,
) -> anyhow::Result<reqwest::Client> {
    let base = || {
        let builder = reqwest::Client::builder()
            .no_proxy()
            .http1_only()
            .connect_timeout(Duration::from_secs(10))
            .timeout(timeout)
            .pool_max_idle_per_host(1)
            .pool_idle_timeout(Duration::from_secs(20));
        if loopback_peer(peer_url) {
            builder.local_address(ip)
        } else {
            builder
        }
    };
    let built = match trust {
        Trust::Any => base().tls_danger_accept_invalid_certs(true).build(),
        Trust::Ca(Some(pem)) => {
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).context("reading the CA bundle")?;
            if certs.is_empty() {
                bail!("the CA bundle holds no PEM certificate");
            }
            base().tls_certs_only(certs).build()
        }
        // The agent's fallback: the platform's roots, else none (http works, https needs a CA).
        Trust::Ca(None) => base()
            .build()
            .or_else(|_| base().tls_certs_only(Vec::new()).build()),
    };
    built.context("building an HTTP client")
}

/// The floppy image behind `url`, fetched as an iLO fetches virtual media (no TLS check).
async fn fetch_floppy(ip: IpAddr, url: &str) -> anyhow::Result<Vec<u8>> {
    let shown = vmdeploy_shared::redact::signatures(url).into_owned();
    let client = node_client(ip, url, Trust::Any, Duration::from_secs(15))?;
    let mut response = client
        .get(url)
        .send()
        .await
        .with_context(|| format!("fetching the floppy {shown}"))?;
    if !response.status().is_success() {
        bail!("fetching the floppy {shown}: HTTP {}", response.status());
    }
    let mut image = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .with_context(|| format!("reading the floppy {shown}"))?
    {
        if image.len() + chunk.len() > MAX_FLOPPY_BYTES {
            bail!("the floppy {shown} is larger than {MAX_FLOPPY_BYTES} bytes");
        }
        image.extend_from_slice(&chunk);
    }
    Ok(image)
}

/// `parameters.txt` of a floppy image labelled `ir-vfd-dev`, read with shared's FAT reader as
/// the agent reads it (`agent/src/floppy`).
pub fn read_floppy(image: &[u8]) -> anyhow::Result<Params> {
    let sector = image
        .get(..512)
        .context("the floppy is shorter than a sector")?;
    let label = vmdeploy_shared::fat::fat_label(sector).context("reading the floppy's label")?;
    if !label
        .as_deref()
        .is_some_and(|l| l.eq_ignore_ascii_case(vmdeploy_shared::fat::FLOPPY_LABEL))
    {
        bail!(
            "the floppy is labelled {label:?}, not {:?}",
            vmdeploy_shared::fat::FLOPPY_LABEL
        );
    }
    let text = vmdeploy_shared::fat::read_root_file(
        std::io::Cursor::new(image),
        "parameters.txt",
        params::MAX_FILE_LEN as u64,
    )
    .context("reading parameters.txt from the floppy")?;
    Params::parse(&text).context("parsing parameters.txt")
}

/// What every heartbeat of one boot carries.
struct Plan {
    node_uuid: String,
    callback_url: String,
    agent_verify_ca: Option<String>,
    token: Secret,
    heartbeat_timeout: Duration,
}

/// A pause of the agent's timing, scaled.
fn scaled(shared: &Shared, pause: Duration) -> Duration {
    pause.mul_f64(shared.config.heartbeat_scale).max(MIN_PAUSE)
}

/// Heartbeats until `standby.power_off` (see the module docs).
async fn heartbeats(
    shared: &Shared,
    index: usize,
    conductor: &Conductor,
    plan: &Plan,
    node: &NodeState,
) {
    let mut last_sent: Option<tokio::time::Instant> = None;
    let mut last_ok = true;
    let mut wait = Duration::ZERO;
    loop {
        let deadline = tokio::time::Instant::now() + wait;
        tokio::select! {
            biased;
            () = node.power_off.notified() => return,
            () = tokio::time::sleep_until(deadline) => {}
            () = node.command_done.notified() => {
                // Early, but not sooner than the agent's gap after the previous heartbeat.
                let gap = if last_ok { EARLY_HEARTBEAT_MIN_GAP } else { MIN_HEARTBEAT_INTERVAL };
                let gap = scaled(shared, gap);
                if let Some(at) = last_sent.map(|t| (t + gap).min(deadline)) {
                    tokio::select! {
                        biased;
                        () = node.power_off.notified() => return,
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
            }
        }
        let body = Heartbeat {
            callback_url: plan.callback_url.clone(),
            agent_token: Some(plan.token.clone()),
            agent_version: Some(AGENT_VERSION.to_owned()),
            agent_verify_ca: plan.agent_verify_ca.clone(),
            agent_status: None,
            agent_status_message: node.progress().map(|p| p.to_message()),
        };
        last_ok = match conductor.heartbeat(&plan.node_uuid, body).await {
            Ok(HeartbeatAnswer::Accepted) => {
                Stats::bump(&shared.stats.heartbeats);
                true
            }
            Ok(HeartbeatAnswer::Locked) => {
                Stats::bump(&shared.stats.heartbeat_conflicts);
                false
            }
            Err(e) => {
                shared
                    .stats
                    .error(format!("server {index}: heartbeat: {e:#}"));
                false
            }
        };
        last_sent = Some(tokio::time::Instant::now());
        wait = scaled(
            shared,
            next_interval(plan.heartbeat_timeout, last_ok, random_unit()),
        );
        if !last_ok {
            wait = wait.max(MIN_ERROR_PAUSE);
        }
    }
}

/// How the conductor took a heartbeat.
enum HeartbeatAnswer {
    /// 202 (or 200).
    Accepted,
    /// 409: the node is locked by a task (the previous heartbeat's, a cleaning): retried.
    Locked,
}

/// A node's client of the conductor's ramdisk API (`agent/src/api/client.rs`).
struct Conductor {
    http: reqwest::Client,
    api_url: String,
    version: ApiVersion,
}

impl Conductor {
    fn new(api_url: &str, ca_pem: Option<Vec<u8>>, ip: IpAddr) -> anyhow::Result<Conductor> {
        let lower = api_url.to_ascii_lowercase();
        if lower.starts_with("https://") && ca_pem.is_none() {
            bail!(
                "ipa-api-url {api_url} is https but no CA came with the parameters (ipa-agent-ca)"
            );
        }
        Ok(Conductor {
            http: node_client(ip, api_url, Trust::Ca(ca_pem), Duration::from_secs(30))?,
            api_url: api_url.trim_end_matches('/').to_owned(),
            version: FALLBACK_API_VERSION,
        })
    }

    /// `min(server, agent)` from `GET /`; the agent's fallback (counted as an error) when the
    /// root cannot be read.
    async fn negotiate_version(&mut self, shared: &Shared, index: usize) {
        match self.server_version().await {
            Ok(server) => self.version = server.min(MAX_API_VERSION),
            Err(e) => shared.stats.error(format!(
                "server {index}: reading the conductor's API version (going on with \
                 {FALLBACK_API_VERSION}): {e:#}"
            )),
        }
    }

    async fn server_version(&self) -> anyhow::Result<ApiVersion> {
        let response = self
            .http
            .get(format!("{}/", self.api_url))
            .send()
            .await
            .context("sending GET /")?;
        if !response.status().is_success() {
            bail!("GET / answered {}", response.status());
        }
        let body = response.bytes().await.context("reading GET /")?;
        Ok(ApiRoot::from_json(&body)?.max_version()?)
    }

    /// Looks up until found, 5, 10, then 30 s apart (scaled), as the agent; `None` answers
    /// (404, 409) are misses, anything else an error, both retried.
    async fn lookup(
        &self,
        shared: &Shared,
        index: usize,
        macs: &[String],
    ) -> anyhow::Result<LookupResponse> {
        let started = Instant::now();
        let mut pause = Duration::from_secs(5);
        loop {
            match self.lookup_once(macs).await {
                Ok(Some(found)) => {
                    Stats::bump(&shared.stats.lookups);
                    return Ok(found);
                }
                Ok(None) => Stats::bump(&shared.stats.lookup_misses),
                Err(e) => shared.stats.error(format!("server {index}: lookup: {e:#}")),
            }
            let wait = scaled(shared, pause);
            if started.elapsed() + wait > shared.config.lookup_timeout {
                bail!(
                    "the lookup by MAC addresses {} did not find the node within {:?}",
                    macs.join(","),
                    shared.config.lookup_timeout
                );
            }
            tokio::time::sleep(wait).await;
            pause = (pause * 2).min(Duration::from_secs(30));
        }
    }

    async fn lookup_once(&self, macs: &[String]) -> anyhow::Result<Option<LookupResponse>> {
        let mut url = reqwest::Url::parse(&format!("{}/v1/lookup", self.api_url))
            .context("building the lookup URL")?;
        url.query_pairs_mut()
            .append_pair("addresses", &macs.join(","));
        let response = self
            .http
            .get(url)
            .header(VERSION_HEADER, self.version.to_string())
            .header("accept", "application/json")
            .send()
            .await
            .context("sending the lookup")?;
        match response.status() {
            StatusCode::OK => {
                let body = response.bytes().await.context("reading the lookup")?;
                Ok(Some(
                    LookupResponse::from_json(&body).context("parsing the lookup")?,
                ))
            }
            StatusCode::NOT_FOUND | StatusCode::CONFLICT => Ok(None),
            status => {
                let text = response.text().await.unwrap_or_default();
                bail!("lookup answered {status}: {}", cut(&text))
            }
        }
    }

    /// The agent's `fit_to_version`: fields the negotiated version does not know are left out
    /// (the conductor answers 400 to them).
    fn fit(&self, mut body: Heartbeat) -> Heartbeat {
        if self.version < ApiVersion::AGENT_VERSION {
            body.agent_version = None;
        }
        if self.version < ApiVersion::AGENT_TOKEN {
            body.agent_token = None;
        }
        if self.version < ApiVersion::AGENT_VERIFY_CA {
            body.agent_verify_ca = None;
        }
        if self.version < ApiVersion::AGENT_STATUS {
            body.agent_status = None;
            body.agent_status_message = None;
        }
        body
    }

    async fn heartbeat(&self, node: &str, body: Heartbeat) -> anyhow::Result<HeartbeatAnswer> {
        let body = serde_json::to_vec(&self.fit(body)).context("encoding the heartbeat")?;
        let response = self
            .http
            .post(format!("{}/v1/heartbeat/{node}", self.api_url))
            .header(VERSION_HEADER, self.version.to_string())
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .context("sending the heartbeat")?;
        match response.status() {
            StatusCode::ACCEPTED | StatusCode::OK => Ok(HeartbeatAnswer::Accepted),
            StatusCode::CONFLICT => Ok(HeartbeatAnswer::Locked),
            status => {
                let text = response.text().await.unwrap_or_default();
                bail!("heartbeat answered {status}: {}", cut(&text))
            }
        }
    }
}

/// The start of a body, for an error.
fn cut(text: &str) -> String {
    text.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conductors_floppy_reads_back() {
        let image = vmdeploy_shared::fat::build_floppy(
            "ir-vfd-dev",
            &[(
                "parameters.txt",
                b"ipa-api-url=http://127.0.0.1:6385\nipa-agent-token=tok\n\
                  BOOTIF=52:54:00:00:00:07\n",
            )],
        )
        .expect("a floppy");
        let params = read_floppy(&image).expect("read");
        assert_eq!(params.get("ipa-api-url"), Some("http://127.0.0.1:6385"));
        let agent = AgentParams::from_params(&params).expect("agent params");
        assert_eq!(
            agent.common.bootif.map(|m| m.to_string()).as_deref(),
            Some("52:54:00:00:00:07")
        );
        let other = vmdeploy_shared::fat::build_floppy("other", &[("parameters.txt", b"a=1")])
            .expect("a floppy");
        assert!(read_floppy(&other).is_err(), "wrong label");
        assert!(read_floppy(b"short").is_err());
    }

    #[test]
    fn loopback_peers() {
        assert!(loopback_peer("http://127.0.0.1:6385"));
        assert!(loopback_peer("https://localhost/x"));
        assert!(loopback_peer("http://[::1]:1/"));
        assert!(!loopback_peer("http://10.0.0.1:6385"));
        assert!(!loopback_peer("nonsense"));
    }
}
