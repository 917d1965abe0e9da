//! The scale benchmark, run by `bench/scale.sh` (issue 27, docs/architecture.md §10: "conductor:
//! concurrent deploys against emulated iLOs + a fake-ramdisk harness" and "node list at 10,000
//! nodes").
//!
//! One run, side by side, everything measured in it:
//! 1. vmdeploy: the in-memory iLO emulator (`ilo-emulator`) with `N` servers, the fake-ramdisk
//!    harness (`src/fake_ramdisk.rs`, in this process) as the deploy agent of all of them, and
//!    `N` concurrent `agent_ilo` deploys through the API: enroll `N` nodes with a port each,
//!    `manage`, `provide` (no automated clean: a deploy bench), set the instance image, then
//!    `PUT …/states/provision {"target": "active"}` for all `N` at once and poll until every
//!    node is `active` or failed. In the set-ups of `SETUPS`: `sqlite` (one conductor, SQLite),
//!    `pg` (one conductor, PostgreSQL), `pg3` (three conductors on one PostgreSQL database
//!    behind the TCP front door of `src/front_door.rs`: the API calls and the ramdisks'
//!    `deploy.api_url` go to the front door, each conductor's `conductor.internal_url` is its own
//!    address, `heartbeat_interval`/`heartbeat_timeout` at their defaults). A fresh emulator,
//!    harness and database per set-up.
//! 2. Upstream Ironic 39 standalone from the venv (`IRONIC=1`): one all-in-one `ironic` process,
//!    SQLite, noauth, `rpc_transport = none`, `fake-hardware` nodes with the `fake` boot, deploy,
//!    power and management interfaces (Ironic's fake agent is its `fake` deploy interface: the
//!    deploy step returns at once, no ramdisk is involved), `[fake]` delays at their default 0,
//!    `automated_clean = false`, `sync_power_state_interval` at its default 60 s, as ours. The
//!    same flow and figures. `N` first, within `IRONIC_BUDGET_SECS` (900) from the first
//!    enrollment; if it does not finish, the next smaller of 1000, 500, 200, 100.
//! 3. `LISTING=1`: `LIST_NODES` (10,000) nodes enrolled through the API of one conductor
//!    (SQLite), the enrollment timed, then 50 `GET /v1/nodes?detail=True` (one default page,
//!    `api.max_limit` = 1000 nodes) timed one after another.
//!
//! Figures per set-up: deploys per minute and the time from the first provision request to the
//! last `active` (each node's `provision_updated_at` as the API reports it, against the clock
//! at the first request); API latency p50/p99 from a sampler in a thread of its own (its own
//! runtime and connection) that alternates `GET /v1/nodes/{uuid}` and `GET /v1/nodes?limit=50`
//! `SAMPLER_HZ` (5) times a second from the first provision request to the last `active`; each
//! conductor's peak RSS (`VmHWM` at the end: the process's life, enrollment included) and CPU
//! seconds (`utime+stime`, plus reaped children, from `/proc/PID/stat`: in the deploy phase,
//! and in all); PostgreSQL's CPU seconds (the postmaster and its children, reaped backends
//! included) and its peak connection count (`pg_stat_activity`'s client backends other than
//! the sampling one, every 500 ms); the errors (nodes not `active`, API 5xx answers to the
//! bench's calls and to the sampler's, harness errors); CPU seconds per deploy (conductors +
//! database, deploy phase). Ironic: its process group's summed VmRSS, sampled every 100 ms
//! (peak), and its group's CPU.
//!
//! Conductor settings: `deploy.agent_power_off_wait = 1` (the emulated host never powers
//! itself off), `deploy.power_sync_interval` at its default 60 s, `api.max_connections` and
//! `api.max_connections_per_client` 16384 (every bench call and, behind the front door, every
//! ramdisk call comes from 127.0.0.1), logging at its default `info`. The ramdisks use the
//! agent's auto-TLS (`AGENT_TLS=auto`, the realistic case: a certificate per boot, pinned by
//! the conductor); `AGENT_TLS=off` uses plain HTTP and `deploy.agent_allow_plain_http`.
//!
//! Calls answered 409 or 503 are retried as python-ironicclient retries them (2 s apart, here
//! up to 30 times) and counted; a 5xx is counted as an error even when the retry succeeds. A
//! request that gets no answer (connection refused, reset, closed: Ironic's API server,
//! cheroot, serves 10 requests at once with a listen backlog of 5) is retried the same way,
//! except a POST, and counted as an error too; a repeated state change refused with 400 after
//! one is taken as done (the wait that follows checks every node's state).
//!
//! Output: `BENCH `-prefixed lines (the script shows those). Environment: `N` (1000), `SETUPS`
//! (`sqlite,pg,pg3`), `IRONIC` (1), `LISTING` (0), `LIST_NODES` (10000), `PHASE_SECS` (900, the
//! limit of each provision phase), `IRONIC_BUDGET_SECS` (900), `HEARTBEAT_SCALE` (1.0: the
//! agent's own heartbeat timing), `BOOT_DELAY_MS` (2000), `WRITE_DELAY_MS` (2000), `AGENT_TLS`
//! (`auto`), `SAMPLER_HZ` (5), `KEEP_DIR` (0; 1 keeps the logs), `VMDEPLOY_BIN_DIR` (the
//! release binaries), `VMDEPLOY_VENV`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::task::JoinSet;
use vmdeploy_integration_tests::child::ChildGuard;
use vmdeploy_integration_tests::conductor_env::make_image;
use vmdeploy_integration_tests::emulator::MediaServer;
use vmdeploy_integration_tests::fake_ramdisk::{
    mac_plus, servers_from_emulator_output, Config, Harness, ServerSpec, TlsMode,
};
use vmdeploy_integration_tests::front_door::FrontDoor;
use vmdeploy_integration_tests::ironic_standalone::{self, Ironic};
use vmdeploy_integration_tests::rss::RssSampler;
use vmdeploy_integration_tests::{bin, free_port, tcp_listening};

const ILO_USER: &str = "Administrator";
const ILO_PASSWORD: &str = "scale-bench-pass";
/// Node i's port MAC is this + i.
const MAC_BASE: &str = "52:54:00:5c:00:00";
/// The microversion of every call (both APIs serve it).
const VERSION: (&str, &str) = ("X-OpenStack-Ironic-API-Version", "1.73");
/// Requests in flight while enrolling and patching (the provision requests go all at once).
const ENROLL_CONCURRENCY: usize = 16;
/// Retries of a 409 or 503 answer, 2 s apart.
const RETRIES: u32 = 30;
/// Ironic's sizes to fall back to when `N` does not finish in its budget.
const IRONIC_SIZES: [usize; 4] = [1000, 500, 200, 100];
/// A heartbeat the conductor answered 404: sent before `standby.power_off` reached the
/// ramdisk, answered after the deploy ended and wiped the token (a node without a token
/// answers as an unknown node). Counted as an error, and apart.
const LATE_HEARTBEAT: &str = "heartbeat answered 404";
/// Targets (docs/architecture.md §10).
const RSS_TARGET_MIB: f64 = 200.0;
const P99_TARGET_MS: f64 = 50.0;
const CPU_RATIO_TARGET: f64 = 1.2;
const LIST_P99_TARGET_MS: f64 = 100.0;
const LIST_REQUESTS: usize = 50;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(text) if !text.is_empty() => text
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} cannot be read")),
        _ => default,
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|e| format!("? ({e})"))
}

macro_rules! bench {
    ($($arg:tt)*) => {{
        println!("BENCH {}", format!($($arg)*));
    }};
}

// ---------------------------------------------------------------------------------------------
// /proc

fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The fields of /proc/PID/stat after `comm`: index 0 is the state, 1 ppid, 2 pgrp, 11 utime,
/// 12 stime, 13 cutime, 14 cstime.
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(
        rest.split_whitespace()
            .map(|f| f.parse::<u64>().unwrap_or(0))
            .collect(),
    )
}

/// CPU seconds of `pid`: its own utime+stime, and with `children` its reaped children's too.
fn cpu_secs(pid: u32, children: bool) -> Option<f64> {
    let f = stat_fields(pid)?;
    let mut ticks = f.get(11)? + f.get(12)?;
    if children {
        ticks += f.get(13)? + f.get(14)?;
    }
    Some(ticks as f64 / clock_ticks())
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// CPU seconds of a process tree one level deep: `root` (with its reaped children) and its
/// live children (PostgreSQL's postmaster and backends).
fn tree_cpu_secs(root: u32) -> f64 {
    let mut total = cpu_secs(root, true).unwrap_or(0.0);
    for pid in all_pids() {
        if pid != root && stat_fields(pid).and_then(|f| f.get(1).copied()) == Some(u64::from(root))
        {
            total += cpu_secs(pid, false).unwrap_or(0.0);
        }
    }
    total
}

/// CPU seconds of process group `pgid` (Ironic): every member, and the leader's reaped
/// children.
fn group_cpu_secs(pgid: u32) -> f64 {
    let mut total = 0.0;
    for pid in all_pids() {
        if stat_fields(pid).and_then(|f| f.get(2).copied()) == Some(u64::from(pgid)) {
            total += cpu_secs(pid, pid == pgid).unwrap_or(0.0);
        }
    }
    total
}

/// A `Vm…:` line of /proc/PID/status, KiB.
fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

// ---------------------------------------------------------------------------------------------
// statistics

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One timed request: milliseconds, the status (0: no answer), which request, and when it
/// started (seconds after the first).
#[derive(Debug, Clone)]
struct Sample {
    ms: f64,
    status: u16,
    what: &'static str,
    at: f64,
}

#[derive(Debug, Default, Clone)]
struct Latency {
    count: usize,
    p50: f64,
    p99: f64,
    max: f64,
    /// Answers 5xx or no answer.
    failed: usize,
    /// The three slowest requests.
    slowest: Vec<Sample>,
}

impl Latency {
    fn of(samples: &[Sample]) -> Latency {
        let mut ms: Vec<f64> = samples.iter().map(|s| s.ms).collect();
        ms.sort_by(f64::total_cmp);
        let mut slowest = samples.to_vec();
        slowest.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        slowest.truncate(3);
        Latency {
            count: ms.len(),
            p50: percentile(&ms, 50.0),
            p99: percentile(&ms, 99.0),
            max: ms.last().copied().unwrap_or(f64::NAN),
            failed: samples
                .iter()
                .filter(|s| s.status == 0 || s.status >= 500)
                .count(),
            slowest,
        }
    }

    fn slowest_text(&self) -> String {
        self.slowest
            .iter()
            .map(|s| format!("{:.1} ms {} at {:.1} s ({})", s.ms, s.what, s.at, s.status))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

// ---------------------------------------------------------------------------------------------
// the API client

#[derive(Debug, Default)]
struct CallCounts {
    calls: AtomicU64,
    answers_5xx: AtomicU64,
    retried_409: AtomicU64,
    retried_503: AtomicU64,
    /// Requests that got no answer (connection refused, reset or closed), retried.
    retried_unanswered: AtomicU64,
    /// Why the first of them got none.
    first_unanswered: std::sync::Mutex<Option<String>>,
    failed: AtomicU64,
}

#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    url: String,
    counts: Arc<CallCounts>,
}

impl Api {
    fn new(url: String) -> Api {
        Api {
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(120))
                .pool_idle_timeout(Duration::from_secs(20))
                .build()
                .expect("an HTTP client"),
            url,
            counts: Arc::default(),
        }
    }

    /// One call and its JSON answer; 409 and 503 retried.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let mut tries = 0;
        let mut unanswered = false;
        loop {
            self.counts.calls.fetch_add(1, Ordering::Relaxed);
            let mut request = self
                .http
                .request(method.clone(), format!("{}{path}", self.url))
                .header(VERSION.0, VERSION.1);
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = match request.send().await {
                Ok(r) => r,
                // No answer: retried, except a POST (it may have created what it posted).
                Err(e) if method != reqwest::Method::POST && tries < RETRIES => {
                    tries += 1;
                    unanswered = true;
                    if let Ok(mut first) = self.counts.first_unanswered.lock() {
                        first.get_or_insert_with(|| error_chain(&e));
                    }
                    self.counts
                        .retried_unanswered
                        .fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    continue;
                }
                Err(e) => {
                    self.counts.failed.fetch_add(1, Ordering::Relaxed);
                    bail!("{method} {path}: {}", error_chain(&e));
                }
            };
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            if status.is_server_error() {
                self.counts.answers_5xx.fetch_add(1, Ordering::Relaxed);
            }
            let retry = match status.as_u16() {
                409 => Some(&self.counts.retried_409),
                503 => Some(&self.counts.retried_503),
                _ => None,
            };
            if let Some(counter) = retry {
                if tries < RETRIES {
                    tries += 1;
                    counter.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    continue;
                }
            }
            // An unanswered state change may have been carried out: its repeat is then refused
            // (400, the node is in the new state already); the wait that follows checks.
            if status == reqwest::StatusCode::BAD_REQUEST
                && unanswered
                && method == reqwest::Method::PUT
            {
                return Ok(Value::Null);
            }
            if !status.is_success() {
                self.counts.failed.fetch_add(1, Ordering::Relaxed);
                bail!("{method} {path}: {status}: {}", text.trim());
            }
            return Ok(serde_json::from_str(&text).unwrap_or(Value::Null));
        }
    }

    /// Every node with the given fields (the list, page by page).
    async fn list(&self, fields: &str) -> anyhow::Result<Vec<Value>> {
        let mut nodes = Vec::new();
        let mut path = format!("/v1/nodes?fields={fields}&limit=1000");
        loop {
            let page = self.call(reqwest::Method::GET, &path, None).await?;
            nodes.extend(page["nodes"].as_array().cloned().unwrap_or_default());
            match page["next"]
                .as_str()
                .and_then(|n| n.find("/v1/").map(|i| &n[i..]))
            {
                Some(next) => path = next.to_owned(),
                None => return Ok(nodes),
            }
        }
    }
}

/// An error and its sources, `: `-separated (reqwest's own text names no cause).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// Runs `calls` (path, body) with `method`, `concurrency` at a time (0: all at once); returns
/// the errors' texts.
async fn call_all(
    api: &Api,
    method: reqwest::Method,
    calls: Vec<(String, Value)>,
    concurrency: usize,
) -> Vec<String> {
    let limit = Arc::new(tokio::sync::Semaphore::new(if concurrency == 0 {
        tokio::sync::Semaphore::MAX_PERMITS
    } else {
        concurrency
    }));
    let mut set = JoinSet::new();
    for (path, body) in calls {
        let (api, method, limit) = (api.clone(), method.clone(), limit.clone());
        set.spawn(async move {
            let _permit = limit.acquire_owned().await;
            api.call(method, &path, Some(&body)).await.err()
        });
    }
    let mut errors = Vec::new();
    while let Some(done) = set.join_next().await {
        match done {
            Ok(Some(e)) => errors.push(format!("{e:#}")),
            Ok(None) => {}
            Err(e) => errors.push(format!("task: {e}")),
        }
    }
    errors
}

/// Waits until every node is in one of `done` (with no target) or `failed`, within `limit`
/// from `since`; returns the last listing and whether it finished.
async fn wait_states(
    api: &Api,
    count: usize,
    done: &[&str],
    failed: &[&str],
    since: Instant,
    limit: Duration,
) -> anyhow::Result<(Vec<Value>, bool)> {
    loop {
        let nodes = api
            .list("uuid,provision_state,target_provision_state,provision_updated_at,last_error")
            .await?;
        if nodes.len() != count {
            bail!("{} nodes listed, {count} enrolled", nodes.len());
        }
        // A state is where the node stays only without a target (`available` with the target
        // `active` is a deploy about to start).
        let finished = nodes.iter().all(|n| {
            let state = n["provision_state"].as_str().unwrap_or("");
            n["target_provision_state"].is_null()
                && (failed.contains(&state) || done.contains(&state))
                || matches!(state, "deploy failed" | "clean failed" | "error")
        });
        if finished {
            return Ok((nodes, true));
        }
        if since.elapsed() > limit {
            return Ok((nodes, false));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn states_summary(nodes: &[Value]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for n in nodes {
        let s = n["provision_state"].as_str().unwrap_or("?").to_owned();
        *counts.entry(s).or_default() += 1;
    }
    counts
        .iter()
        .map(|(s, c)| format!("{c} {s}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn first_last_error(nodes: &[Value]) -> Option<String> {
    nodes
        .iter()
        .find(|n| n["last_error"].is_string())
        .map(|n| format!("{}: {}", n["uuid"], n["last_error"]))
}

/// Samples the API's latency from a thread of its own until `stop`.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(url: String, uuids: Vec<String>, hz: f64) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the sampler's runtime");
            rt.block_on(async move {
                let http = reqwest::Client::builder()
                    .no_proxy()
                    .timeout(Duration::from_secs(30))
                    .build()
                    .expect("the sampler's client");
                let period = Duration::from_secs_f64(1.0 / hz.max(0.1));
                let mut ticker = tokio::time::interval(period);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut samples = Vec::new();
                let mut i = 0usize;
                let first = Instant::now();
                while !flag.load(Ordering::Relaxed) {
                    ticker.tick().await;
                    let (path, what) = if i.is_multiple_of(2) {
                        (
                            format!("/v1/nodes/{}", uuids[(i / 2) % uuids.len()]),
                            "GET /v1/nodes/{uuid}",
                        )
                    } else {
                        ("/v1/nodes?limit=50".to_owned(), "GET /v1/nodes?limit=50")
                    };
                    i += 1;
                    let started = Instant::now();
                    let status = match http
                        .get(format!("{url}{path}"))
                        .header(VERSION.0, VERSION.1)
                        .send()
                        .await
                    {
                        Ok(r) => {
                            let s = r.status().as_u16();
                            // The whole body, as a client reads it.
                            match r.bytes().await {
                                Ok(_) => s,
                                Err(_) => 0,
                            }
                        }
                        Err(_) => 0,
                    };
                    samples.push(Sample {
                        ms: started.elapsed().as_secs_f64() * 1000.0,
                        status,
                        what,
                        at: (started - first).as_secs_f64(),
                    });
                }
                samples
            })
        });
        Sampler { stop, thread }
    }

    fn finish(self) -> Latency {
        self.stop.store(true, Ordering::Relaxed);
        Latency::of(&self.thread.join().unwrap_or_default())
    }
}

// ---------------------------------------------------------------------------------------------
// what a run measures

#[derive(Debug, Clone)]
struct ProcFigures {
    name: String,
    peak_rss_kib: u64,
    cpu_deploy: f64,
    cpu_total: f64,
    log_errors: usize,
}

#[derive(Debug, Clone)]
struct DbFigures {
    cpu_deploy: f64,
    cpu_total: f64,
    peak_connections: i64,
}

#[derive(Debug, Clone)]
struct Figures {
    label: String,
    n: usize,
    enroll_secs: f64,
    manage_provide_secs: f64,
    active: usize,
    deploy_finished: bool,
    first_to_last_active: f64,
    deploys_per_min: f64,
    api: Latency,
    procs: Vec<ProcFigures>,
    db: Option<DbFigures>,
    api_5xx: u64,
    /// 409, 503 and unanswered requests retried in the deploy phase.
    retried: (u64, u64, u64),
    call_failures: u64,
    harness_errors: Option<u64>,
    /// Of those, heartbeats answered 404 (see [`LATE_HEARTBEAT`]).
    late_heartbeats: u64,
    harness_first_errors: Vec<String>,
    first_node_error: Option<String>,
    owners: String,
    states: String,
}

impl Figures {
    fn not_active(&self) -> usize {
        self.n - self.active
    }

    fn errors(&self) -> u64 {
        self.not_active() as u64
            + self.api_5xx
            + self.api.failed as u64
            + self.call_failures
            + self.retried.2
            + self.harness_errors.unwrap_or(0)
    }

    fn cpu_deploy(&self) -> f64 {
        self.procs.iter().map(|p| p.cpu_deploy).sum::<f64>()
            + self.db.as_ref().map_or(0.0, |d| d.cpu_deploy)
    }

    fn cpu_per_deploy(&self) -> f64 {
        if self.active == 0 {
            f64::NAN
        } else {
            self.cpu_deploy() / self.active as f64
        }
    }

    fn max_rss_mib(&self) -> f64 {
        self.procs
            .iter()
            .map(|p| p.peak_rss_kib as f64 / 1024.0)
            .fold(0.0, f64::max)
    }
}

/// The times each node reached `active` (its `provision_updated_at`), as seconds after `t0`.
fn active_offsets(nodes: &[Value], t0: SystemTime) -> Vec<f64> {
    let t0 = time::OffsetDateTime::from(t0);
    nodes
        .iter()
        .filter(|n| n["provision_state"] == "active")
        .filter_map(|n| {
            let at = n["provision_updated_at"].as_str()?;
            let at =
                time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
                    .ok()
                    .or_else(|| {
                        // Ironic's timestamps may lack an offset: UTC.
                        time::PrimitiveDateTime::parse(
                            at,
                            time::macros::format_description!(
                                "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond]"
                            ),
                        )
                        .ok()
                        .map(|t| t.assume_utc())
                    })?;
            Some((at - t0).as_seconds_f64())
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// vmdeploy

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    Sqlite,
    Pg,
    Pg3,
}

impl Setup {
    fn parse(s: &str) -> Setup {
        match s.trim() {
            "sqlite" => Setup::Sqlite,
            "pg" => Setup::Pg,
            "pg3" => Setup::Pg3,
            other => panic!("SETUPS: {other:?} is not sqlite, pg or pg3"),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Setup::Sqlite => "(a) 1 cond. SQLite",
            Setup::Pg => "(b) 1 cond. PG",
            Setup::Pg3 => "(c) 3 cond. PG",
        }
    }
}

#[derive(Debug, Clone)]
struct Options {
    n: usize,
    /// The limit of each provision phase.
    phase: Duration,
    /// And of all of them (Ironic's budget).
    deadline: Option<Instant>,
    heartbeat_scale: f64,
    boot_delay: Duration,
    write_delay: Duration,
    tls: TlsMode,
    sampler_hz: f64,
    /// The deploy ISO stand-in's size: what the emulator's boot read (EMULATOR_ARGS
    /// `--boot-read-mib`) can read of it at most.
    iso_bytes: usize,
}

impl Options {
    /// How long the next provision phase may take.
    fn limit(&self) -> Duration {
        self.deadline.map_or(self.phase, |d| {
            self.phase.min(d.saturating_duration_since(Instant::now()))
        })
    }
}

struct Emulator {
    _child: ChildGuard,
    servers: Vec<SocketAddr>,
    cert: PathBuf,
}

/// One boot's read of its medium, as the emulator counted it (`last_boot.media_read`).
#[derive(Debug, Clone, Copy)]
struct MediaRead {
    ranges: u64,
    bytes: u64,
    millis: u64,
}

/// The last boot-medium read of every emulated server: the deploy ramdisk's ISO boot.
async fn media_reads(emulator: &Emulator) -> anyhow::Result<Vec<MediaRead>> {
    let pem = std::fs::read(&emulator.cert)?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem)?)
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut reads = Vec::new();
    for ilo in &emulator.servers {
        let state: Value = http
            .get(format!("https://{ilo}/_emulator/state"))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        // The last boot is the instance's, from disk; the ISO boot's read is kept apart.
        let read = state.get("last_media_read").filter(|v| !v.is_null());
        if let Some(read) = read {
            let field = |name: &str| read.get(name).and_then(Value::as_u64).unwrap_or(0);
            reads.push(MediaRead {
                ranges: field("ranges"),
                bytes: field("bytes"),
                millis: field("millis"),
            });
        }
    }
    Ok(reads)
}

/// One line: how many boots read media, and what each read.
fn media_read_summary(reads: &[MediaRead]) -> String {
    if reads.is_empty() {
        return "boot media reads: none recorded".into();
    }
    let mut millis: Vec<u64> = reads.iter().map(|r| r.millis).collect();
    millis.sort_unstable();
    let mut ranges: Vec<u64> = reads.iter().map(|r| r.ranges).collect();
    ranges.sort_unstable();
    let bytes: u64 = reads.iter().map(|r| r.bytes).sum();
    format!(
        "boot media reads: {} boots, {:.1} MiB each on average, {} ranges (median), \
         {} ms median / {} ms max per boot",
        reads.len(),
        bytes as f64 / reads.len() as f64 / (1024.0 * 1024.0),
        ranges[ranges.len() / 2],
        millis[millis.len() / 2],
        millis[millis.len() - 1],
    )
}

fn start_emulator(dir: &Path, servers: usize) -> anyhow::Result<Emulator> {
    let log = dir.join("emulator.log");
    let cert = dir.join("ilo-cert.pem");
    let child = Command::new(bin("ilo-emulator"))
        .args(["--listen", "127.0.0.1:0", "--servers", &servers.to_string()])
        .args(["--username", ILO_USER, "--password", ILO_PASSWORD])
        .arg("--cert-out")
        .arg(&cert)
        // EMULATOR_ARGS: e.g. the slow media read of a real BMC (`--boot-read-mib 32
        // --range-kib 64 --range-latency-ms 10`), or a firmware profile.
        .args(
            std::env::var("EMULATOR_ARGS")
                .unwrap_or_default()
                .split_whitespace(),
        )
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting ilo-emulator")?;
    let mut child = ChildGuard::new(child).with_log("ilo-emulator", &log);
    let stdout = child.stdout.take().context("the emulator's stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.trim() == "ready" {
                let _ = tx.send(text.clone());
            }
            text.push_str(&line);
            text.push('\n');
        }
    });
    let text = rx
        .recv_timeout(Duration::from_secs(120))
        .context("ilo-emulator did not print `ready` within 120 s")?;
    let addresses = servers_from_emulator_output(&text)?;
    if addresses.len() != servers {
        bail!(
            "the emulator lists {} servers, not {servers}",
            addresses.len()
        );
    }
    Ok(Emulator {
        _child: child,
        servers: addresses,
        cert,
    })
}

struct Conductor {
    child: ChildGuard,
    name: String,
    port: u16,
    log: PathBuf,
}

/// Starts `vmdeploy-conductor serve` named `name` on a free port; returns once it listens.
fn start_conductor(
    dir: &Path,
    name: &str,
    api_url: Option<&str>,
    database: Option<&str>,
    ilo_cert: &Path,
    tls: TlsMode,
) -> anyhow::Result<Conductor> {
    let port = free_port();
    let own = format!("http://127.0.0.1:{port}");
    let mut config = format!(
        "[api]\nlisten = [\"127.0.0.1:{port}\"]\nmax_connections = 16384\n\
         max_connections_per_client = 16384\n\n\
         [conductor]\ninternal_url = \"{own}\"\n\n\
         [deploy]\napi_url = \"{}\"\nconductor_name = \"{name}\"\nagent_power_off_wait = 1\n{}\n\
         [ilo]\nverify_ca = \"{}\"\n",
        api_url.unwrap_or(&own),
        if tls == TlsMode::Auto {
            ""
        } else {
            "agent_allow_plain_http = true\n"
        },
        ilo_cert.display()
    );
    if let Some(url) = database {
        config.push_str(&format!("\n[database]\nurl = \"{url}\"\n"));
    }
    let cdir = dir.join(name);
    std::fs::create_dir_all(cdir.join("state"))?;
    let config_path = cdir.join("conductor.toml");
    std::fs::write(&config_path, config)?;
    let log = cdir.join("conductor.log");
    let child = Command::new(bin("vmdeploy-conductor"))
        .arg("serve")
        .arg("--config")
        .arg(&config_path)
        .arg("--state-dir")
        .arg(cdir.join("state"))
        .env_remove("RUST_LOG")
        .env_remove("STATE_DIRECTORY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting vmdeploy-conductor serve")?;
    let mut child = ChildGuard::new(child).with_log(name, &log);
    let deadline = Instant::now() + Duration::from_secs(90);
    while !tcp_listening(port) {
        if let Ok(Some(status)) = child.try_wait() {
            bail!(
                "{name} exited ({status}) before listening: {}",
                tail(&log, 20)
            );
        }
        if Instant::now() > deadline {
            bail!("{name} did not listen within 90 s: {}", tail(&log, 20));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(Conductor {
        child,
        name: name.to_owned(),
        port,
        log,
    })
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Lines of a log at level ERROR (ours: `ERROR` after the time stamp; Ironic's: ` ERROR `).
fn log_errors(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" ERROR "))
        .count()
}

struct Postgres {
    cluster: vmdeploy_test_postgres::Cluster,
}

impl Postgres {
    fn postmaster(&self) -> anyhow::Result<u32> {
        let pidfile = self
            .cluster
            .socket_dir()
            .parent()
            .context("the cluster's directory")?
            .join("data/postmaster.pid");
        let text = std::fs::read_to_string(&pidfile)
            .with_context(|| format!("reading {}", pidfile.display()))?;
        text.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .context("the postmaster's pid")
    }
}

/// Samples `pg_stat_activity`'s client backends (other than its own) every 500 ms until
/// `stop`; returns the peak.
async fn sample_connections(
    pg: &Postgres,
    database: &str,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<tokio::task::JoinHandle<i64>> {
    let mut config = tokio_postgres::Config::new();
    config
        .host_path(pg.cluster.socket_dir())
        .port(pg.cluster.port())
        .user(vmdeploy_test_postgres::ROLE)
        .dbname(database);
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .context("connecting to PostgreSQL to sample pg_stat_activity")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(tokio::spawn(async move {
        let mut peak = 0i64;
        while !stop.load(Ordering::Relaxed) {
            if let Ok(row) = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                    &[],
                )
                .await
            {
                peak = peak.max(row.get::<_, i64>(0));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        peak
    }))
}

async fn run_setup(
    setup: Setup,
    o: &Options,
    root: &Path,
    pg: &mut Option<Postgres>,
    image: &(String, String),
) -> anyhow::Result<Figures> {
    let dir = root.join(match setup {
        Setup::Sqlite => "sqlite",
        Setup::Pg => "pg",
        Setup::Pg3 => "pg3",
    });
    std::fs::create_dir_all(&dir)?;
    let n = o.n;
    let emulator = start_emulator(&dir, n)?;
    let macs: Vec<String> = (0..n)
        .map(|i| mac_plus(MAC_BASE, i))
        .collect::<Result<_, _>>()?;
    let iso = dir.join("deploy.iso");
    std::fs::write(&iso, vec![0x5a; o.iso_bytes])?;

    let database = match setup {
        Setup::Sqlite => None,
        Setup::Pg | Setup::Pg3 => {
            if pg.is_none() {
                let cluster = tokio::task::spawn_blocking(vmdeploy_test_postgres::Cluster::start)
                    .await?
                    .map_err(|e| anyhow::anyhow!("starting PostgreSQL: {e}"))?;
                *pg = Some(Postgres { cluster });
            }
            let pg = pg.as_ref().context("the cluster")?;
            let name = pg.cluster.create_database(if setup == Setup::Pg {
                "scale_pg"
            } else {
                "scale_pg3"
            });
            Some(name)
        }
    };
    let database_url = database
        .as_ref()
        .zip(pg.as_ref())
        .map(|(db, pg)| pg.cluster.socket_url(db));

    // The front door's port is known before the conductors start: they tell the ramdisks.
    let mut door = None;
    let mut conductors = Vec::new();
    match setup {
        Setup::Pg3 => {
            let front = FrontDoor::start(Vec::new()).await?;
            let url = front.url();
            for name in ["c1", "c2", "c3"] {
                conductors.push(start_conductor(
                    &dir,
                    name,
                    Some(&url),
                    database_url.as_deref(),
                    &emulator.cert,
                    o.tls,
                )?);
            }
            front.set_backends(
                conductors
                    .iter()
                    .map(|c| SocketAddr::from(([127, 0, 0, 1], c.port)))
                    .collect(),
            );
            door = Some(front);
        }
        _ => conductors.push(start_conductor(
            &dir,
            "c1",
            None,
            database_url.as_deref(),
            &emulator.cert,
            o.tls,
        )?),
    }
    let url = door
        .as_ref()
        .map(FrontDoor::url)
        .unwrap_or_else(|| format!("http://127.0.0.1:{}", conductors[0].port));
    let api = Api::new(url.clone());

    // Three conductors: every one alive in every one's view before the nodes arrive.
    if setup == Setup::Pg3 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut ok = true;
            for c in &conductors {
                let view = Api::new(format!("http://127.0.0.1:{}", c.port))
                    .call(reqwest::Method::GET, "/v1/conductors", None)
                    .await?;
                let alive = view["conductors"]
                    .as_array()
                    .map(|l| l.iter().filter(|c| c["alive"] == json!(true)).count())
                    .unwrap_or(0);
                ok &= alive == 3;
            }
            if ok {
                break;
            }
            if Instant::now() > deadline {
                bail!("the three conductors did not all see each other alive within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    let conn_stop = Arc::new(AtomicBool::new(false));
    let conn_sampler = match (pg.as_ref(), database.as_ref()) {
        (Some(pg), Some(db)) => Some(sample_connections(pg, db, conn_stop.clone()).await?),
        _ => None,
    };

    let harness = Harness::start(Config {
        servers: emulator
            .servers
            .iter()
            .zip(&macs)
            .map(|(ilo, mac)| ServerSpec {
                emulator: *ilo,
                macs: vec![mac.clone()],
            })
            .collect(),
        emulator_ca_pem: Some(std::fs::read_to_string(&emulator.cert)?),
        listen: "0.0.0.0:0".parse()?,
        tls: o.tls,
        // At most 200 state reads a second in all, 5 a second per server.
        poll_interval: Duration::from_millis((5 * n as u64).clamp(200, 5000)),
        heartbeat_scale: o.heartbeat_scale,
        boot_delay: o.boot_delay,
        write_delay: o.write_delay,
        ..Config::default()
    })
    .await?;

    // Enroll.
    let started = Instant::now();
    let mut nodes = Vec::with_capacity(n);
    for (i, (ilo, mac)) in emulator.servers.iter().zip(&macs).enumerate() {
        let body = json!({
            "name": format!("scale-{i}"),
            "driver": "agent_ilo",
            "driver_info": {
                "ilo_address": ilo.to_string(),
                "ilo_username": ILO_USER,
                "ilo_password": ILO_PASSWORD,
                "ilo_protocol": "ribcl",
                "ilo_deploy_iso": format!("file://{}", iso.display()),
            },
        });
        nodes.push((body, mac.clone()));
    }
    let uuids = enroll_with_ports(&api, nodes).await?;
    let enroll_secs = started.elapsed().as_secs_f64();
    bench!(
        "  {}: {n} nodes with ports enrolled in {enroll_secs:.1} s ({:.0}/s)",
        setup.label(),
        n as f64 / enroll_secs
    );

    // Three conductors: each maps nodes to owners with the ring of its own view, read back
    // after each of its heartbeats (every `heartbeat_interval`, 10 s): a conductor started
    // first still sees fewer peers. Wait until all three show the same owner for every node.
    if setup == Setup::Pg3 {
        let waited = Instant::now();
        loop {
            let mut views = Vec::new();
            for c in &conductors {
                let direct = Api::new(format!("http://127.0.0.1:{}", c.port));
                let nodes = direct.list("uuid,conductor").await?;
                let view: BTreeMap<String, String> = nodes
                    .iter()
                    .map(|x| {
                        (
                            x["uuid"].as_str().unwrap_or("").to_owned(),
                            x["conductor"].as_str().unwrap_or("").to_owned(),
                        )
                    })
                    .collect();
                views.push(view);
            }
            let owners: std::collections::BTreeSet<&String> = views[0].values().collect();
            if views.windows(2).all(|w| w[0] == w[1]) && (n < 30 || owners.len() == 3) {
                break;
            }
            if waited.elapsed() > Duration::from_secs(60) {
                bail!("the three conductors did not agree on the nodes' owners within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        bench!(
            "  {}: the conductors agreed on every node's owner after {:.1} s more",
            setup.label(),
            waited.elapsed().as_secs_f64()
        );
    }

    let figures = deploy_phase(
        setup.label(),
        &api,
        &uuids,
        o,
        image,
        Some(&harness),
        |phase| match phase {
            Phase::Start => conductors
                .iter()
                .map(|c| cpu_secs(c.child.id(), true).unwrap_or(0.0))
                .chain(
                    pg.as_ref()
                        .map(|pg| pg.postmaster().map_or(0.0, tree_cpu_secs)),
                )
                .collect(),
            Phase::End => conductors
                .iter()
                .map(|c| cpu_secs(c.child.id(), true).unwrap_or(0.0))
                .chain(
                    pg.as_ref()
                        .map(|pg| pg.postmaster().map_or(0.0, tree_cpu_secs)),
                )
                .collect(),
        },
    )
    .await;
    match media_reads(&emulator).await {
        Ok(reads) => bench!("  {}: {}", setup.label(), media_read_summary(&reads)),
        Err(e) => bench!(
            "  {}: the emulator's boot reads could not be read: {e:#}",
            setup.label()
        ),
    }
    let (mut figures, start_cpu, end_cpu) = match figures {
        Ok(f) => f,
        Err(e) => {
            for c in &conductors {
                eprintln!("--- {} log tail ---\n{}", c.name, tail(&c.log, 40));
            }
            return Err(e);
        }
    };
    figures.enroll_secs = enroll_secs;

    // Owners (three conductors): how the ring spread the nodes.
    if setup == Setup::Pg3 {
        let nodes = api.list("uuid,conductor").await.unwrap_or_default();
        let mut by: BTreeMap<String, usize> = BTreeMap::new();
        for node in &nodes {
            *by.entry(node["conductor"].as_str().unwrap_or("?").to_owned())
                .or_default() += 1;
        }
        figures.owners = by
            .iter()
            .map(|(c, k)| format!("{c} {k}"))
            .collect::<Vec<_>>()
            .join(", ");
    }

    for (i, c) in conductors.iter().enumerate() {
        figures.procs.push(ProcFigures {
            name: c.name.clone(),
            peak_rss_kib: status_kib(c.child.id(), "VmHWM:").unwrap_or(0),
            cpu_deploy: end_cpu[i] - start_cpu[i],
            cpu_total: cpu_secs(c.child.id(), true).unwrap_or(0.0),
            log_errors: log_errors(&c.log),
        });
    }
    if let Some(pg) = pg.as_ref().filter(|_| database.is_some()) {
        conn_stop.store(true, Ordering::Relaxed);
        let peak = match conn_sampler {
            Some(task) => task.await.unwrap_or(-1),
            None => -1,
        };
        let k = conductors.len();
        figures.db = Some(DbFigures {
            cpu_deploy: end_cpu[k] - start_cpu[k],
            cpu_total: pg.postmaster().map_or(0.0, tree_cpu_secs),
            peak_connections: peak,
        });
    }
    let stats = harness.stats().to_json();
    figures.harness_errors = stats["errors"].as_u64();
    let kept = harness.errors();
    figures.late_heartbeats = kept.iter().filter(|e| e.contains(LATE_HEARTBEAT)).count() as u64;
    // The first of each kind (kinds told apart by the first 60 characters after the server's
    // number).
    let mut seen = std::collections::BTreeSet::new();
    for e in kept {
        let kind: String = e
            .split_once(": ")
            .map_or(e.as_str(), |(_, rest)| rest)
            .chars()
            .take(60)
            .collect();
        if seen.insert(kind) && figures.harness_first_errors.len() < 5 {
            figures.harness_first_errors.push(e);
        }
    }
    harness.shutdown().await;
    drop(door);
    drop(conductors);
    // The database of a set-up goes with it (its CPU is counted; the next starts empty).
    if let (Some(pg), Some(db)) = (pg.as_ref(), database.as_ref()) {
        let _ = pg.cluster.psql(
            "postgres",
            vmdeploy_test_postgres::SUPERUSER,
            &format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
        );
    }
    Ok(figures)
}

enum Phase {
    Start,
    End,
}

/// manage, provide, set the image, then the measured deploy of every node at once. `cpu`
/// reads the CPU seconds of the processes counted (at the start and at the end of the deploy
/// phase).
async fn deploy_phase(
    label: &str,
    api: &Api,
    uuids: &[String],
    o: &Options,
    image: &(String, String),
    harness: Option<&Harness>,
    cpu: impl Fn(Phase) -> Vec<f64>,
) -> anyhow::Result<(Figures, Vec<f64>, Vec<f64>)> {
    let n = uuids.len();
    let started = Instant::now();
    for (target, done) in [("manage", "manageable"), ("provide", "available")] {
        let calls = uuids
            .iter()
            .map(|u| {
                (
                    format!("/v1/nodes/{u}/states/provision"),
                    json!({ "target": target }),
                )
            })
            .collect();
        let errors = call_all(api, reqwest::Method::PUT, calls, 0).await;
        if let Some(e) = errors.first() {
            bail!("{target}: {} calls failed, e.g. {e}", errors.len());
        }
        let (nodes, finished) = wait_states(
            api,
            n,
            &[done],
            &["enroll", "clean failed", "error"],
            Instant::now(),
            o.limit(),
        )
        .await?;
        if !finished || nodes.iter().any(|x| x["provision_state"] != done) {
            bail!(
                "{target}: not every node {done} within {:?}: {}; {}",
                o.limit(),
                states_summary(&nodes),
                first_last_error(&nodes).unwrap_or_default()
            );
        }
    }
    let manage_provide_secs = started.elapsed().as_secs_f64();
    let calls = uuids
        .iter()
        .map(|u| {
            (
                format!("/v1/nodes/{u}"),
                json!([
                    {"op": "add", "path": "/instance_info/image_source", "value": image.0},
                    {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
                    {"op": "add", "path": "/instance_info/image_os_hash_value", "value": image.1},
                    {"op": "add", "path": "/instance_info/image_disk_format", "value": "raw"},
                ]),
            )
        })
        .collect();
    let errors = call_all(api, reqwest::Method::PATCH, calls, ENROLL_CONCURRENCY).await;
    if let Some(e) = errors.first() {
        bail!("setting the image: {} calls failed, e.g. {e}", errors.len());
    }

    // The measured phase.
    let counts_before = (
        api.counts.answers_5xx.load(Ordering::Relaxed),
        api.counts.retried_409.load(Ordering::Relaxed),
        api.counts.retried_503.load(Ordering::Relaxed),
        api.counts.failed.load(Ordering::Relaxed),
        api.counts.retried_unanswered.load(Ordering::Relaxed),
    );
    let harness_before = harness.map(|h| h.stats().error_count.load(Ordering::Relaxed));
    let start_cpu = cpu(Phase::Start);
    let sampler = Sampler::start(api.url.clone(), uuids.to_vec(), o.sampler_hz);
    let t0 = SystemTime::now();
    let i0 = Instant::now();
    let calls = uuids
        .iter()
        .map(|u| {
            (
                format!("/v1/nodes/{u}/states/provision"),
                json!({ "target": "active" }),
            )
        })
        .collect();
    let put_errors = call_all(api, reqwest::Method::PUT, calls, 0).await;
    let puts_secs = i0.elapsed().as_secs_f64();
    let (nodes, finished) = wait_states(
        api,
        n,
        &["active"],
        &["deploy failed", "error", "available"],
        i0,
        o.limit(),
    )
    .await?;
    let end_cpu = cpu(Phase::End);
    let latency = sampler.finish();
    let offsets = active_offsets(&nodes, t0);
    let active = nodes
        .iter()
        .filter(|x| x["provision_state"] == "active")
        .count();
    let last = offsets.iter().copied().fold(f64::NAN, f64::max);
    bench!(
        "  {label}: {n} PUT active in {puts_secs:.1} s ({} failed); {}; last active {last:.1} s \
         after the first request; requests retried unanswered since the start: {}",
        put_errors.len(),
        states_summary(&nodes),
        api.counts.retried_unanswered.load(Ordering::Relaxed)
    );
    if let Some(e) = api
        .counts
        .first_unanswered
        .lock()
        .ok()
        .and_then(|e| e.clone())
    {
        bench!("  {label}: the first unanswered request: {e}");
    }
    if let Some(e) = put_errors.first() {
        bench!("  {label}: a failed PUT: {e}");
    }
    let figures = Figures {
        label: label.to_owned(),
        n,
        enroll_secs: 0.0,
        manage_provide_secs,
        active,
        deploy_finished: finished,
        first_to_last_active: last,
        deploys_per_min: active as f64 / last * 60.0,
        api: latency,
        procs: Vec::new(),
        db: None,
        api_5xx: api.counts.answers_5xx.load(Ordering::Relaxed) - counts_before.0,
        retried: (
            api.counts.retried_409.load(Ordering::Relaxed) - counts_before.1,
            api.counts.retried_503.load(Ordering::Relaxed) - counts_before.2,
            api.counts.retried_unanswered.load(Ordering::Relaxed) - counts_before.4,
        ),
        call_failures: api.counts.failed.load(Ordering::Relaxed) - counts_before.3,
        harness_errors: harness
            .zip(harness_before)
            .map(|(h, b)| h.stats().error_count.load(Ordering::Relaxed) - b),
        late_heartbeats: 0,
        harness_first_errors: Vec::new(),
        first_node_error: first_last_error(&nodes),
        owners: String::new(),
        states: states_summary(&nodes),
    };
    Ok((figures, start_cpu, end_cpu))
}

// ---------------------------------------------------------------------------------------------
// Ironic

async fn run_ironic(
    n: usize,
    o: &Options,
    dir: &Path,
    image: &(String, String),
    budget: Duration,
) -> anyhow::Result<Figures> {
    std::fs::create_dir_all(dir)?;
    let ironic = Ironic::try_start(dir, &ironic_standalone::FAKE, None)?;
    let pgid = ironic.child.id();
    let api = Api::new(ironic.url.clone());
    // The conductor side registers a moment after the API listens.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ok = api
            .call(reqwest::Method::GET, "/v1/drivers", None)
            .await
            .map(|d| d.to_string().contains("fake-hardware"))
            .unwrap_or(false);
        if ok {
            break;
        }
        if Instant::now() > deadline {
            bail!("Ironic lists no fake-hardware driver within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let rss = RssSampler::start_group(pgid);
    let started = Instant::now();
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        let mac = mac_plus(MAC_BASE, i)?;
        let body = json!({
            "name": format!("scale-{i}"),
            "driver": "fake-hardware",
            "boot_interface": "fake",
            "deploy_interface": "fake",
            "power_interface": "fake",
            "management_interface": "fake",
        });
        nodes.push((body, mac));
    }
    let uuids = enroll_with_ports(&api, nodes).await?;
    let enroll_secs = started.elapsed().as_secs_f64();
    bench!(
        "  Ironic: {n} nodes with ports enrolled in {enroll_secs:.1} s ({:.0}/s)",
        n as f64 / enroll_secs
    );
    let o = Options {
        deadline: Some(started + budget),
        ..o.clone()
    };
    let label = format!("Ironic 39 (fake), N={n}");
    let (mut figures, start_cpu, end_cpu) =
        deploy_phase(&label, &api, &uuids, &o, image, None, |_| {
            vec![group_cpu_secs(pgid)]
        })
        .await?;
    if started.elapsed() > budget || !figures.deploy_finished {
        bail!(
            "not finished within {:?} of the first enrollment: {}",
            budget,
            figures.states
        );
    }
    figures.enroll_secs = enroll_secs;
    let members = all_pids()
        .into_iter()
        .filter(|p| stat_fields(*p).and_then(|f| f.get(2).copied()) == Some(u64::from(pgid)))
        .count();
    bench!(
        "  Ironic: {members} processes in its group (RSS and CPU are their sums; shared pages \
         count once per process)"
    );
    figures.procs.push(ProcFigures {
        name: "ironic".into(),
        peak_rss_kib: rss.peak(),
        cpu_deploy: end_cpu[0] - start_cpu[0],
        cpu_total: group_cpu_secs(pgid),
        log_errors: log_errors(&ironic.log),
    });
    Ok(figures)
}

// ---------------------------------------------------------------------------------------------
// listing

async fn run_listing(nodes: usize, root: &Path) -> anyhow::Result<(f64, Latency, f64)> {
    let dir = root.join("listing");
    std::fs::create_dir_all(&dir)?;
    // The nodes stay in `enroll` (no power sync reads their BMCs): no emulator needed.
    let cert = dir.join("none.pem");
    std::fs::write(&cert, "")?;
    let conductor = start_conductor(&dir, "c1", None, None, &cert, TlsMode::Auto)?;
    let api = Api::new(format!("http://127.0.0.1:{}", conductor.port));
    let started = Instant::now();
    let calls = (0..nodes)
        .map(|i| {
            (
                "/v1/nodes".to_owned(),
                json!({
                    "name": format!("list-{i}"),
                    "driver": "agent_ilo",
                    "driver_info": {
                        "ilo_address": format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
                        "ilo_username": ILO_USER,
                        "ilo_password": ILO_PASSWORD,
                    },
                    "properties": {"cpus": 32, "memory_mb": 262144, "local_gb": 960},
                }),
            )
        })
        .collect();
    let errors = call_all(&api, reqwest::Method::POST, calls, ENROLL_CONCURRENCY).await;
    if let Some(e) = errors.first() {
        bail!("enrolling: {} calls failed, e.g. {e}", errors.len());
    }
    let enroll = started.elapsed().as_secs_f64();
    // One warm-up request, then the measured ones, one after another.
    let http = reqwest::Client::builder().no_proxy().build()?;
    let mut samples = Vec::new();
    let mut page_bytes = 0;
    let first = Instant::now();
    for i in 0..=LIST_REQUESTS {
        let started = Instant::now();
        let reply = http
            .get(format!("{}/v1/nodes?detail=True", api.url))
            .header(VERSION.0, VERSION.1)
            .send()
            .await?;
        let status = reply.status().as_u16();
        // The time to the whole body; parsing it is the client's business.
        let bytes = reply.bytes().await?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let body: Value = serde_json::from_slice(&bytes)?;
        page_bytes = bytes.len();
        let count = body["nodes"].as_array().map_or(0, Vec::len);
        if count != nodes.min(1000) {
            bail!("a page of {count} nodes, not {}", nodes.min(1000));
        }
        if i > 0 {
            samples.push(Sample {
                ms,
                status,
                what: "GET /v1/nodes?detail=True",
                at: (started - first).as_secs_f64(),
            });
        }
    }
    let rss = status_kib(conductor.child.id(), "VmHWM:").unwrap_or(0) as f64 / 1024.0;
    bench!(
        "  listing: a page is {page_bytes} bytes; the conductor's CPU {} s in all",
        fmt(cpu_secs(conductor.child.id(), true).unwrap_or(0.0), 2)
    );
    Ok((enroll, Latency::of(&samples), rss))
}

// ---------------------------------------------------------------------------------------------
// the table

fn fmt(v: f64, digits: usize) -> String {
    if v.is_finite() {
        format!("{v:.digits$}")
    } else {
        "-".into()
    }
}

fn pass(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "FAIL"
    }
}

fn print_table(all: &[Figures]) {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |name: &str, f: &dyn Fn(&Figures) -> String| {
        rows.push((name.to_owned(), all.iter().map(f).collect()));
    };
    row("nodes deployed at once", &|f| f.n.to_string());
    row("enroll (nodes + ports), s", &|f| fmt(f.enroll_secs, 1));
    row("manage + provide, s", &|f| fmt(f.manage_provide_secs, 1));
    row("active / not active", &|f| {
        format!("{} / {}", f.active, f.not_active())
    });
    row("first request -> last active, s", &|f| {
        fmt(f.first_to_last_active, 1)
    });
    row("deploys per minute", &|f| fmt(f.deploys_per_min, 0));
    row("API p50 / p99 ms (samples)", &|f| {
        format!(
            "{} / {} ({})",
            fmt(f.api.p50, 1),
            fmt(f.api.p99, 1),
            f.api.count
        )
    });
    row("API max ms", &|f| fmt(f.api.max, 1));
    row("processes", &|f| {
        f.procs
            .iter()
            .map(|p| p.name.clone())
            .collect::<Vec<_>>()
            .join(" / ")
    });
    row("peak RSS MiB (each process)", &|f| {
        f.procs
            .iter()
            .map(|p| fmt(p.peak_rss_kib as f64 / 1024.0, 1))
            .collect::<Vec<_>>()
            .join(" / ")
    });
    row("CPU s, deploy phase (each)", &|f| {
        f.procs
            .iter()
            .map(|p| fmt(p.cpu_deploy, 2))
            .collect::<Vec<_>>()
            .join(" / ")
    });
    row("CPU s, whole life (each)", &|f| {
        f.procs
            .iter()
            .map(|p| fmt(p.cpu_total, 2))
            .collect::<Vec<_>>()
            .join(" / ")
    });
    row("PostgreSQL CPU s, deploy / all", &|f| {
        f.db.as_ref().map_or("-".into(), |d| {
            format!("{} / {}", fmt(d.cpu_deploy, 2), fmt(d.cpu_total, 2))
        })
    });
    row("PostgreSQL peak connections", &|f| {
        f.db.as_ref()
            .map_or("-".into(), |d| d.peak_connections.to_string())
    });
    row("CPU s per deploy (all above)", &|f| {
        fmt(f.cpu_per_deploy(), 3)
    });
    row("API 5xx / failed calls", &|f| {
        format!("{} / {}", f.api_5xx + f.api.failed as u64, f.call_failures)
    });
    row("retried 409 / 503 / unanswered", &|f| {
        format!("{} / {} / {}", f.retried.0, f.retried.1, f.retried.2)
    });
    row("harness errors (late heartbeat 404)", &|f| {
        f.harness_errors
            .map_or("-".into(), |e| format!("{e} ({})", f.late_heartbeats))
    });
    row("log ERROR lines", &|f| {
        f.procs
            .iter()
            .map(|p| p.log_errors.to_string())
            .collect::<Vec<_>>()
            .join(" / ")
    });
    row("errors (sum)", &|f| f.errors().to_string());

    let widths: Vec<usize> = (0..all.len())
        .map(|i| {
            rows.iter()
                .map(|r| r.1[i].len())
                .chain(std::iter::once(all[i].label.len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let name_w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let line = |first: &str, cells: Vec<String>| {
        let mut s = format!("| {first:<name_w$} |");
        for (c, w) in cells.iter().zip(&widths) {
            s.push_str(&format!(" {c:>w$} |"));
        }
        s
    };
    bench!(
        "{}",
        line("", all.iter().map(|f| f.label.clone()).collect())
    );
    bench!(
        "|{}|{}",
        "-".repeat(name_w + 2),
        widths
            .iter()
            .map(|w| format!("{}|", "-".repeat(w + 2)))
            .collect::<String>()
    );
    for (name, cells) in rows {
        bench!("{}", line(&name, cells));
    }
}

fn main() -> anyhow::Result<()> {
    // reqwest is built without a provider (the workspace's ring); fails only when one is set.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let n: usize = env_or("N", 1000);
    // Set but empty (or `none`): Ironic and the listing only.
    let setups: Vec<Setup> = std::env::var("SETUPS")
        .unwrap_or_else(|_| "sqlite,pg,pg3".to_owned())
        .split(',')
        .filter(|s| !s.trim().is_empty() && s.trim() != "none")
        .map(Setup::parse)
        .collect();
    let ironic = env_or("IRONIC", 1u8) == 1;
    let listing = env_or("LISTING", 0u8) == 1;
    let list_nodes: usize = env_or("LIST_NODES", 10_000);
    let tls: TlsMode = env_or("AGENT_TLS", "auto".to_owned())
        .parse()
        .map_err(anyhow::Error::msg)?;
    let o = Options {
        n,
        phase: Duration::from_secs(env_or("PHASE_SECS", 900)),
        deadline: None,
        heartbeat_scale: env_or("HEARTBEAT_SCALE", 1.0),
        boot_delay: Duration::from_millis(env_or("BOOT_DELAY_MS", 2000)),
        write_delay: Duration::from_millis(env_or("WRITE_DELAY_MS", 2000)),
        tls,
        sampler_hz: env_or("SAMPLER_HZ", 5.0),
        iso_bytes: env_or("ISO_KIB", 64usize) * 1024,
    };
    let budget = Duration::from_secs(env_or("IRONIC_BUDGET_SECS", 900));
    let dir = tempfile::Builder::new()
        .prefix("vmdeploy-scale-")
        .tempdir()?;
    let keep = env_or("KEEP_DIR", 0u8) == 1;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let wall = Instant::now();
    let load_before = loadavg();
    bench!(
        "scale bench: N={n}, set-ups {setups:?}, Ironic {}, listing {}; ramdisks: heartbeat \
         scale {}, boot {:?}, write {:?}, agent TLS {tls:?}; sampler {} req/s",
        if ironic { "on" } else { "off" },
        if listing {
            format!("on ({list_nodes} nodes)")
        } else {
            "off".into()
        },
        o.heartbeat_scale,
        o.boot_delay,
        o.write_delay,
        o.sampler_hz
    );
    bench!("load average before: {load_before}");

    let image_bytes = make_image(1 << 20);
    let image_sha = hex::encode(Sha256::digest(&image_bytes));
    let media = MediaServer::start(vec![("/image.raw", image_bytes)]);
    let image = (media.url("/image.raw"), image_sha);

    let mut results: Vec<Figures> = Vec::new();
    let mut failures = Vec::new();
    let mut pg: Option<Postgres> = None;
    for setup in &setups {
        bench!("{} ...", setup.label());
        match rt.block_on(run_setup(*setup, &o, dir.path(), &mut pg, &image)) {
            Ok(f) => {
                bench!("  slowest API samples: {}", f.api.slowest_text());
                for e in &f.harness_first_errors {
                    bench!("  harness error: {e}");
                }
                if let Some(e) = &f.first_node_error {
                    bench!("  a node's last_error: {e}");
                }
                if !f.owners.is_empty() {
                    bench!("  nodes per conductor: {}", f.owners);
                }
                results.push(f);
            }
            Err(e) => {
                bench!("  {} FAILED: {e:#}", setup.label());
                failures.push(format!("{}: {e:#}", setup.label()));
            }
        }
    }
    drop(pg);

    let mut listing_result = None;
    if listing {
        bench!("listing: {list_nodes} nodes, one conductor on SQLite ...");
        match rt.block_on(run_listing(list_nodes, dir.path())) {
            Ok(r) => listing_result = Some(r),
            Err(e) => {
                bench!("  listing FAILED: {e:#}");
                failures.push(format!("listing: {e:#}"));
            }
        }
    }

    let mut ironic_result = None;
    if ironic {
        let mut sizes = vec![n];
        sizes.extend(IRONIC_SIZES.iter().copied().filter(|s| *s < n));
        for size in sizes {
            bench!(
                "Ironic 39 standalone, fake-hardware, N={size} (budget {} s) ...",
                budget.as_secs()
            );
            let idir = dir.path().join(format!("ironic-{size}"));
            match rt.block_on(run_ironic(size, &o, &idir, &image, budget)) {
                Ok(f) => {
                    bench!("  slowest API samples: {}", f.api.slowest_text());
                    if let Some(e) = &f.first_node_error {
                        bench!("  a node's last_error: {e}");
                    }
                    ironic_result = Some(f);
                    break;
                }
                Err(e) => bench!("  Ironic N={size} did not complete: {e:#}"),
            }
        }
        if ironic_result.is_none() {
            failures.push("Ironic: no size completed".into());
        }
    }
    let load_after = loadavg();

    bench!("");
    let mut table = results.clone();
    table.extend(ironic_result.clone());
    if !table.is_empty() {
        print_table(&table);
    }
    bench!("");

    // Ratios and targets.
    let get = |label: &str| results.iter().find(|f| f.label == label);
    let a = get(Setup::Sqlite.label());
    let b = get(Setup::Pg.label());
    let c = get(Setup::Pg3.label());
    if let Some(c) = c {
        for (name, base) in [("(a)", a), ("(b)", b)] {
            if let Some(base) = base {
                bench!(
                    "CPU s per deploy, (c) / {name}: {} / {} = {}x; deploys/min (c) / {name}: {}x",
                    fmt(c.cpu_per_deploy(), 3),
                    fmt(base.cpu_per_deploy(), 3),
                    fmt(c.cpu_per_deploy() / base.cpu_per_deploy(), 2),
                    fmt(c.deploys_per_min / base.deploys_per_min, 2)
                );
            }
        }
    }
    if let Some(i) = &ironic_result {
        for f in &results {
            bench!(
                "{} vs Ironic (N={}): deploys/min {}x, CPU s per deploy {}x, peak RSS {}x, \
                 API p99 {}x",
                f.label,
                i.n,
                fmt(f.deploys_per_min / i.deploys_per_min, 2),
                fmt(f.cpu_per_deploy() / i.cpu_per_deploy(), 2),
                fmt(f.max_rss_mib() / i.max_rss_mib(), 2),
                fmt(f.api.p99 / i.api.p99, 2)
            );
        }
    }
    bench!("targets (docs/architecture.md §10):");
    for f in [a, b].into_iter().flatten() {
        bench!(
            "  {}: RSS {} MiB <= {RSS_TARGET_MIB}: {}; API p99 {} ms <= {P99_TARGET_MS}: {}; \
             errors {} = 0: {}",
            f.label,
            fmt(f.max_rss_mib(), 1),
            pass(f.max_rss_mib() <= RSS_TARGET_MIB),
            fmt(f.api.p99, 1),
            pass(f.api.p99 <= P99_TARGET_MS),
            f.errors(),
            pass(f.errors() == 0)
        );
    }
    if let Some(c) = c {
        for (name, base) in [("(a)", a), ("(b)", b)] {
            if let Some(base) = base {
                let ratio = c.cpu_per_deploy() / base.cpu_per_deploy();
                bench!(
                    "  {}: CPU s per deploy {}x {name}'s <= {CPU_RATIO_TARGET}: {}",
                    c.label,
                    fmt(ratio, 2),
                    pass(ratio <= CPU_RATIO_TARGET)
                );
            }
        }
        bench!(
            "  {}: errors {} = 0: {}",
            c.label,
            c.errors(),
            pass(c.errors() == 0)
        );
    }
    if let Some((enroll, lat, rss)) = &listing_result {
        bench!(
            "  node list at {list_nodes} nodes (GET /v1/nodes?detail=True, a page of {}, {} \
             requests): p50 {} ms, p99 {} ms <= {LIST_P99_TARGET_MS}: {}; enrolled through the \
             API in {} s ({:.0}/s); conductor peak RSS {} MiB",
            list_nodes.min(1000),
            lat.count,
            fmt(lat.p50, 1),
            fmt(lat.p99, 1),
            pass(lat.p99 <= LIST_P99_TARGET_MS),
            fmt(*enroll, 1),
            list_nodes as f64 / enroll,
            fmt(*rss, 1)
        );
        bench!("    slowest list requests: {}", lat.slowest_text());
    }
    for failure in &failures {
        bench!("FAILED: {failure}");
    }
    bench!("load average before: {load_before}; after: {load_after}");
    bench!("wall time: {:.0} s", wall.elapsed().as_secs_f64());
    if keep {
        let kept = dir.keep();
        bench!("logs kept in {}", kept.display());
    }
    if failures.is_empty() {
        Ok(())
    } else {
        bail!("{} part(s) failed", failures.len())
    }
}

/// Enrolls each `(node body, MAC)` with a port, [`ENROLL_CONCURRENCY`] at a time; the UUIDs in
/// the order the enrollments finished.
async fn enroll_with_ports(api: &Api, nodes: Vec<(Value, String)>) -> anyhow::Result<Vec<String>> {
    let limit = Arc::new(tokio::sync::Semaphore::new(ENROLL_CONCURRENCY));
    let mut set = JoinSet::new();
    for (body, mac) in nodes {
        let (api, limit) = (api.clone(), limit.clone());
        set.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let node = api
                .call(reqwest::Method::POST, "/v1/nodes", Some(&body))
                .await?;
            let uuid = node["uuid"].as_str().context("a node UUID")?.to_owned();
            api.call(
                reqwest::Method::POST,
                "/v1/ports",
                Some(&json!({"address": mac, "node_uuid": uuid, "pxe_enabled": true})),
            )
            .await?;
            anyhow::Ok(uuid)
        });
    }
    let mut uuids = Vec::new();
    while let Some(done) = set.join_next().await {
        uuids.push(done??);
    }
    Ok(uuids)
}
