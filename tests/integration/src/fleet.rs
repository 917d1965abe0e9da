//! A fleet of emulated servers driven through the conductor's API, for the tests and benches
//! that run many nodes at once with the fake ramdisk (`crate::fake_ramdisk`): the in-memory
//! emulator started as a process, and an API client that provisions many nodes and waits for
//! them.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bin;
use crate::child::ChildGuard;
use crate::fake_ramdisk::{servers_from_emulator_output, Config, Harness, ServerSpec};

/// The emulated iLOs' credentials.
pub const ILO_USER: &str = "Administrator";
/// Their password.
pub const ILO_PASSWORD: &str = "fake-ramdisk-pass";
/// The microversion of every API call.
pub const VERSION: (&str, &str) = ("X-OpenStack-Ironic-API-Version", "1.73");

/// A setting from the environment, or `default`.
pub fn from_env<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} cannot be read")),
        Err(_) => default,
    }
}

/// Starts `vmdeploy-conductor serve` with `config` (a `conductor.toml` whose API listens on
/// `127.0.0.1:port`), its state and log in `dir`; returns once the API listens.
pub fn start_conductor(dir: &Path, port: u16, config: &str) -> ChildGuard {
    start_named_conductor(dir, "vmdeploy-conductor", port, config)
}

/// [`start_conductor`] whose log, printed when a test fails, is headed `name`.
pub fn start_named_conductor(dir: &Path, name: &str, port: u16, config: &str) -> ChildGuard {
    let config_path = dir.join("conductor.toml");
    std::fs::write(&config_path, config).expect("writing conductor.toml");
    let state = dir.join("conductor");
    std::fs::create_dir_all(&state).expect("state dir");
    let log = dir.join("conductor.log");
    let child = Command::new(bin("vmdeploy-conductor"))
        .arg("serve")
        .arg("--config")
        .arg(&config_path)
        .arg("--state-dir")
        .arg(&state)
        .env_remove("RUST_LOG")
        .env_remove("STATE_DIRECTORY")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("conductor log"))
        .spawn()
        .expect("starting vmdeploy-conductor serve");
    let mut child = ChildGuard::new(child).with_log(name, &log);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !crate::tcp_listening(port) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{name} (vmdeploy-conductor serve) exited ({status}) before listening");
        }
        assert!(
            Instant::now() < deadline,
            "{name} (vmdeploy-conductor serve) did not listen within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}

/// Starts the in-memory emulator with `servers` servers; returns its guard and the servers'
/// addresses once it printed `ready`.
pub fn start_emulator(dir: &Path, servers: usize) -> (ChildGuard, Vec<SocketAddr>) {
    start_emulator_with(dir, servers, &[])
}

/// [`start_emulator`] with more arguments (`--profile ilo6-1.6x`, `--quirk NAME`); its log and
/// certificate go to `dir`.
pub fn start_emulator_with(
    dir: &Path,
    servers: usize,
    extra: &[&str],
) -> (ChildGuard, Vec<SocketAddr>) {
    let log = dir.join("emulator.log");
    let child = Command::new(bin("ilo-emulator"))
        .args(["--listen", "127.0.0.1:0", "--servers", &servers.to_string()])
        .args(["--username", ILO_USER, "--password", ILO_PASSWORD])
        .args(extra)
        .arg("--cert-out")
        .arg(dir.join("ilo-cert.pem"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("emulator log"))
        .spawn()
        .expect("starting ilo-emulator");
    let mut child = ChildGuard::new(child).with_log("ilo-emulator", &log);
    let stdout = child.stdout.take().expect("piped stdout");
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
        .recv_timeout(Duration::from_secs(30))
        .expect("ilo-emulator printed `ready` within 30 s");
    let addresses = servers_from_emulator_output(&text).expect("the servers' addresses");
    assert_eq!(addresses.len(), servers, "{text}");
    (child, addresses)
}

/// The fake ramdisk's settings for the emulated iLOs `ilos`, node i with the MAC `macs[i]`
/// (the emulator's certificate in `ilo_cert`): quick boots, clean steps and power-offs; the
/// caller sets what its test is about (TLS, the write's length, heartbeats).
pub fn harness_config(ilos: &[SocketAddr], macs: &[String], ilo_cert: &Path) -> Config {
    Config {
        servers: ilos
            .iter()
            .zip(macs)
            .map(|(ilo, mac)| ServerSpec {
                emulator: *ilo,
                macs: vec![mac.clone()],
            })
            .collect(),
        emulator_ca_pem: Some(std::fs::read_to_string(ilo_cert).expect("the emulator's cert")),
        listen: "0.0.0.0:0".parse().expect("address"),
        boot_delay: Duration::from_millis(200),
        clean_step_delay: Duration::from_millis(200),
        power_off_grace: Duration::from_millis(200),
        lookup_timeout: Duration::from_secs(60),
        ..Config::default()
    }
}

/// The conductor's API, as a client sees it.
pub struct Api {
    /// The client.
    pub http: reqwest::Client,
    /// The API's base URL.
    pub url: String,
    /// Longest a provision phase (cleaning, deploy, undeploy) may take for every node.
    pub phase_limit: Duration,
}

/// An error with its causes, `: `-separated (reqwest's own text leaves them out).
fn chain(e: &dyn std::error::Error) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

impl Api {
    /// One call, its JSON answer; a 409 (the node locked by a task: a power sync pass reserves
    /// each node for its BMC read) is retried as python-ironicclient retries it, 5 times 2 s
    /// apart. A GET whose connection fails before an answer is sent again, up to 3 times: a
    /// kept-alive connection the server closed as the client reused it is not an API failure
    /// (through the front door, which copies bytes, the client cannot tell it from a reset).
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut retries = 5;
        let mut resends = if method == reqwest::Method::GET { 3 } else { 0 };
        loop {
            let mut request = self
                .http
                .request(method.clone(), format!("{}{path}", self.url))
                .header(VERSION.0, VERSION.1);
            if let Some(body) = &body {
                request = request.json(body);
            }
            let response = match request.send().await {
                Ok(response) => response,
                Err(e) if resends > 0 && !e.is_timeout() => {
                    resends -= 1;
                    eprintln!("{method} {path}: {}; sending it again", chain(&e));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => panic!("{method} {path}: {}", chain(&e)),
            };
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            if status == reqwest::StatusCode::CONFLICT && retries > 0 {
                retries -= 1;
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
            assert!(status.is_success(), "{method} {path}: {status}: {text}");
            return serde_json::from_str(&text).unwrap_or(Value::Null);
        }
    }

    /// Enrolls one `agent_ilo` node per emulated iLO (named `<prefix>-<i>`, booting the deploy
    /// ISO at `iso`, with `extra` merged into its body) and a port with `macs[i]`; returns the
    /// nodes' UUIDs in order.
    pub async fn enroll(
        &self,
        prefix: &str,
        ilos: &[SocketAddr],
        macs: &[String],
        iso: &Path,
        extra: Value,
    ) -> Vec<String> {
        let mut uuids = Vec::new();
        for (i, (ilo, mac)) in ilos.iter().zip(macs).enumerate() {
            let mut body = json!({
                "name": format!("{prefix}-{i}"),
                "driver": "agent_ilo",
                "driver_info": {
                    "ilo_address": ilo.to_string(),
                    "ilo_username": ILO_USER,
                    "ilo_password": ILO_PASSWORD,
                    "ilo_protocol": "ribcl",
                    "ilo_deploy_iso": format!("file://{}", iso.display()),
                },
            });
            if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
                body.extend(extra.clone());
            }
            let node = self
                .call(reqwest::Method::POST, "/v1/nodes", Some(body))
                .await;
            let uuid = node["uuid"].as_str().expect("a node UUID").to_owned();
            self.call(
                reqwest::Method::POST,
                "/v1/ports",
                Some(json!({"address": mac, "node_uuid": uuid, "pxe_enabled": true})),
            )
            .await;
            uuids.push(uuid);
        }
        uuids
    }

    pub async fn node(&self, uuid: &str) -> Value {
        self.call(reqwest::Method::GET, &format!("/v1/nodes/{uuid}"), None)
            .await
    }

    /// `PUT /v1/nodes/{uuid}/states/provision {"target": target}` for every node, then waits
    /// until every node is in `state`; returns the time from the first `PUT`.
    pub async fn provision_all(
        &self,
        nodes: &[String],
        target: &str,
        state: &str,
        harness: &Harness,
    ) -> Duration {
        let started = Instant::now();
        for uuid in nodes {
            self.call(
                reqwest::Method::PUT,
                &format!("/v1/nodes/{uuid}/states/provision"),
                Some(json!({ "target": target })),
            )
            .await;
        }
        self.wait_all(nodes.len(), state, harness, started).await;
        started.elapsed()
    }

    /// Every node's UUID, states and last error (the list, page by page).
    pub async fn states(&self) -> Vec<Value> {
        let mut nodes = Vec::new();
        let mut path =
            "/v1/nodes?fields=uuid,provision_state,target_provision_state,last_error&limit=1000"
                .to_owned();
        loop {
            let page = self.call(reqwest::Method::GET, &path, None).await;
            nodes.extend(page["nodes"].as_array().cloned().unwrap_or_default());
            match page["next"]
                .as_str()
                .and_then(|n| n.find("/v1/").map(|i| &n[i..]))
            {
                Some(next) => path = next.to_owned(),
                None => return nodes,
            }
        }
    }

    /// Waits until all `count` nodes are in `state` with no target, within the phase limit
    /// from `started`; fails at once when one fails.
    pub async fn wait_all(&self, count: usize, state: &str, harness: &Harness, started: Instant) {
        loop {
            let nodes = self.states().await;
            assert_eq!(nodes.len(), count, "the nodes listed");
            if let Some(failed) = nodes.iter().find(|n| {
                matches!(
                    n["provision_state"].as_str(),
                    Some("deploy failed" | "clean failed" | "error")
                )
            }) {
                panic!(
                    "{failed}\nharness errors: {:#?}\nharness: {}",
                    harness.errors(),
                    harness.stats().to_json()
                );
            }
            let pending: Vec<&Value> = nodes
                .iter()
                .filter(|n| n["provision_state"] != state || !n["target_provision_state"].is_null())
                .collect();
            if pending.is_empty() {
                return;
            }
            assert!(
                started.elapsed() < self.phase_limit,
                "{} nodes not {state} within {:?}, e.g. {}\nharness errors: {:#?}\nharness: {}",
                pending.len(),
                self.phase_limit,
                pending[0],
                harness.errors(),
                harness.stats().to_json()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
