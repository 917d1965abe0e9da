//! A protocol-checking stand-in for the conductor's side of the iSCSI deploy
//! (docs/ironic-protocols.md §2.2 step 5, §2.3, §2.4; docs/architecture.md §4).
//!
//! It serves `POST /v1/nodes/{node}/vendor_passthru/pass_deploy_info` on 127.0.0.1, checks the
//! JSON body as the conductor does (400 for a missing or malformed field, 403 for a wrong key),
//! optionally answers 503 to the first N calls (to drive the agent's retries), answers 202
//! otherwise, and records every call. Its refusals are the conductor's API's: the same status
//! and Ironic's fault body ([`crate::fault`]), the 403 in the API's words
//! (`tests/standin_parity.rs` holds the two together). What it prints and shows in `Debug`
//! carries no deploy key or token. [`write_image`] and [`send_done`] then play the rest of the
//! conductor's part: the image goes through `vmdeploy-conductor iscsi write`, `done` is sent as
//! Ironic's `notify` does (4 bytes, no newline, no reply read).
//!
//! The body is checked as raw JSON against the field names and values the reference gives
//! (§2.2 step 5: `address`, `key`, `iqn`, `error`, all strings), never through `shared::api`'s
//! types, so that a wrong shared type cannot pass both the agent and this check.
//!
//! [`IscsiStandin::start_holding`] keeps each answer back until the test releases it, so that a
//! test can stop the agent while it waits for the answer and watch what it does next.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::child::ChildGuard;
use crate::http::AcceptLoop;

/// What the stand-in expects and how it misbehaves.
#[derive(Clone)]
pub struct StandinConfig {
    /// The node UUID (`deployment_id`).
    pub node: String,
    /// The deploy key the agent must send.
    pub key: String,
    /// The target name the agent must send.
    pub iqn: String,
    /// Answer 503 to this many well-formed calls first.
    pub fail_first: usize,
    /// Serve HTTPS with this configuration (e.g. [`crate::http::TestPki`]).
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// One call as received (its `Debug` masks the deploy key and the token).
#[derive(Clone)]
pub struct Received {
    /// `POST /v1/...` request line.
    pub request_line: String,
    /// The parsed body (`Null` if it was not JSON).
    pub body: serde_json::Value,
    /// What the stand-in answered.
    pub status: u16,
    /// Protocol problems found (empty for a correct call).
    pub problems: Vec<String>,
    /// The `X-Auth-Token` header, if sent.
    pub auth_token: Option<String>,
}

impl std::fmt::Debug for Received {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut body = self.body.clone();
        if let Some(key) = body.get_mut("key").filter(|k| !k.is_null()) {
            *key = serde_json::Value::String(vmdeploy_shared::redact::MASK.into());
        }
        vmdeploy_shared::redact::json(&mut body);
        f.debug_struct("Received")
            .field("request_line", &self.request_line)
            .field("body", &body)
            .field("status", &self.status)
            .field("problems", &self.problems)
            .field(
                "auth_token",
                &self
                    .auth_token
                    .as_ref()
                    .map(|_| vmdeploy_shared::redact::MASK),
            )
            .finish()
    }
}

impl Received {
    /// The `error` field, if set and non-empty.
    pub fn error(&self) -> Option<&str> {
        self.body
            .get("error")
            .and_then(|e| e.as_str())
            .filter(|e| !e.is_empty())
    }
}

/// The running stand-in; stops when dropped.
pub struct IscsiStandin {
    accept: AcceptLoop,
    tls: bool,
    received: Arc<Mutex<Vec<Received>>>,
    /// With [`IscsiStandin::start_holding`]: told when a call waits for its answer, and the
    /// channel that releases it.
    hold: Option<(Mutex<Receiver<()>>, Sender<()>)>,
}

/// The stand-in's half of a hold: announces a waiting call, waits for its release.
struct HoldGate {
    arrived: Sender<()>,
    release: Mutex<Receiver<()>>,
}

impl HoldGate {
    fn wait(&self) {
        let _ = self.arrived.send(());
        // A test that never releases fails on its own timeout; do not hang past it.
        let _ = self
            .release
            .lock()
            .expect("stand-in lock")
            .recv_timeout(Duration::from_secs(120));
    }
}

impl IscsiStandin {
    /// Starts serving on an ephemeral loopback port.
    pub fn start(cfg: StandinConfig) -> IscsiStandin {
        Self::start_with(cfg, false)
    }

    /// Like [`IscsiStandin::start`], but every answer waits until [`IscsiStandin::release`]:
    /// [`IscsiStandin::wait_held`] says when a call is waiting.
    pub fn start_holding(cfg: StandinConfig) -> IscsiStandin {
        Self::start_with(cfg, true)
    }

    fn start_with(cfg: StandinConfig, holding: bool) -> IscsiStandin {
        let received = Arc::new(Mutex::new(Vec::new()));
        let tls = cfg.tls.is_some();
        let (gate, hold) = if holding {
            let (arrived_tx, arrived_rx) = channel();
            let (release_tx, release_rx) = channel();
            (
                Some(HoldGate {
                    arrived: arrived_tx,
                    release: Mutex::new(release_rx),
                }),
                Some((Mutex::new(arrived_rx), release_tx)),
            )
        } else {
            (None, None)
        };
        let accept = {
            let rec = Arc::clone(&received);
            // Held while a call is answered: calls are handled one at a time, in arrival order.
            let failures_left = Mutex::new(cfg.fail_first);
            AcceptLoop::start(move |conn| {
                let mut failures_left = failures_left.lock().expect("stand-in lock");
                let gate = gate.as_ref();
                let handled = match &cfg.tls {
                    None => handle(conn, &cfg, &mut failures_left, gate),
                    Some(tls) => {
                        let Ok(session) = rustls::ServerConnection::new(tls.clone()) else {
                            return;
                        };
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                        handle(
                            rustls::StreamOwned::new(session, conn),
                            &cfg,
                            &mut failures_left,
                            gate,
                        )
                    }
                };
                if let Some(r) = handled {
                    eprintln!(
                        "iscsi stand-in: {} -> {} {:?}",
                        r.request_line, r.status, r.problems
                    );
                    rec.lock().expect("stand-in lock").push(r);
                }
            })
        };
        IscsiStandin {
            accept,
            tls,
            received,
            hold,
        }
    }

    /// With [`IscsiStandin::start_holding`]: waits until a call waits for its answer.
    pub fn wait_held(&self, timeout: Duration) -> bool {
        let (arrived, _) = self
            .hold
            .as_ref()
            .expect("wait_held needs a stand-in started with start_holding");
        arrived
            .lock()
            .expect("stand-in lock")
            .recv_timeout(timeout)
            .is_ok()
    }

    /// With [`IscsiStandin::start_holding`]: lets the waiting call have its answer.
    pub fn release(&self) {
        let (_, release) = self
            .hold
            .as_ref()
            .expect("release needs a stand-in started with start_holding");
        release.send(()).expect("the stand-in is running");
    }

    /// The API root to put in `ironic_api_url` (no `/v1`).
    pub fn api_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.accept.addr())
    }

    /// Every call so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("stand-in lock").clone()
    }

    /// Waits until `n` calls have arrived (or `timeout`); returns them.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Received> {
        let start = Instant::now();
        loop {
            let got = self.received();
            if got.len() >= n || start.elapsed() > timeout {
                return got;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn respond(conn: &mut impl Write, status: u16, body: &str) {
    let reason = match status {
        202 => "Accepted",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "Other",
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// Makes a plain connection blocking with a read timeout; TLS ones are set up by the caller.
trait Prepare {
    fn prepare(&self) -> Option<()>;
}

impl Prepare for TcpStream {
    fn prepare(&self) -> Option<()> {
        self.set_read_timeout(Some(Duration::from_secs(10))).ok()
    }
}

impl Prepare for rustls::StreamOwned<rustls::ServerConnection, TcpStream> {
    fn prepare(&self) -> Option<()> {
        Some(())
    }
}

fn handle<S: Read + Write + Prepare>(
    mut conn: S,
    cfg: &StandinConfig,
    failures_left: &mut usize,
    gate: Option<&HoldGate>,
) -> Option<Received> {
    conn.prepare()?;
    let mut reader = BufReader::new(&mut conn);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).ok()?;
    let request_line = request_line.trim().to_owned();
    let mut len = 0usize;
    let mut content_type = String::new();
    let mut accept = String::new();
    let mut auth_token = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 || h.trim().is_empty() {
            break;
        }
        let lower = h.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if let Some(v) = lower.strip_prefix("content-type:") {
            content_type = v.trim().to_owned();
        }
        if let Some(v) = lower.strip_prefix("accept:") {
            accept = v.trim().to_owned();
        }
        if lower.starts_with("x-auth-token:") {
            auth_token = Some(h["x-auth-token:".len()..].trim().to_owned());
        }
    }
    let mut raw = vec![0u8; len.min(1 << 20)];
    reader.read_exact(&mut raw).ok()?;
    drop(reader);
    let body: serde_json::Value = serde_json::from_slice(&raw).unwrap_or(serde_json::Value::Null);

    let mut problems = Vec::new();
    let want_path = format!("/v1/nodes/{}/vendor_passthru/pass_deploy_info", cfg.node);
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let status = if path != want_path {
        problems.push(format!("path {path:?}, expected {want_path:?}"));
        404
    } else if method != "POST" {
        problems.push(format!("method {method}"));
        405
    } else {
        if !content_type.starts_with("application/json") {
            problems.push(format!("content-type {content_type:?}"));
        }
        // DIB's curl sends `Accept: application/json` (§2.2 step 5).
        if !accept.contains("application/json") {
            problems.push(format!("accept {accept:?}"));
        }
        problems.extend(raw_body_problems(&body));
        let field = |k: &str| body.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        match (field("address"), field("key"), field("iqn")) {
            _ if !body.is_object() => {
                problems.push("body is not a JSON object".into());
                400
            }
            (_, Some(key), _) if key != cfg.key => {
                problems.push("wrong deploy key".into());
                403
            }
            (None, _, _) | (_, None, _) | (_, _, None) => {
                problems.push("address, key or iqn missing".into());
                400
            }
            (Some(address), Some(_), Some(iqn)) => {
                let has_error = body
                    .get("error")
                    .is_some_and(|e| e.as_str().is_some_and(|s| !s.is_empty()));
                if !has_error && address.parse::<std::net::IpAddr>().is_err() {
                    problems.push(format!("address {address:?} is not an IP"));
                }
                if !has_error && iqn != cfg.iqn {
                    problems.push(format!("iqn {iqn:?}, expected {:?}", cfg.iqn));
                }
                if *failures_left > 0 {
                    *failures_left -= 1;
                    503
                } else if problems.is_empty() {
                    202
                } else {
                    400
                }
            }
        }
    };
    let answer = match status {
        202 => String::new(),
        // The conductor's words for a wrong (or burnt) key.
        403 => crate::fault::body(
            403,
            &format!(
                "The deploy key for node {} is not valid (wrong, or already used).",
                cfg.node
            ),
        )
        .to_string(),
        503 => crate::fault::body(503, "conductor busy, try again").to_string(),
        _ => crate::fault::body(status, &problems.join("; ")).to_string(),
    };
    if let Some(gate) = gate {
        gate.wait();
    }
    respond(&mut conn, status, &answer);
    let _ = conn.flush();
    Some(Received {
        request_line,
        body,
        status,
        problems,
        auth_token,
    })
}

/// The pass_deploy_info body against docs/ironic-protocols.md §2.2 step 5, written out here: exactly
/// the fields `address`, `key`, `iqn` and (optional, ours omits it on success) `error`, each a
/// JSON string; `key` never empty, `iqn` empty only beside an error. `null` for `error` is what
/// the conductor takes for "no error" too.
fn raw_body_problems(body: &serde_json::Value) -> Vec<String> {
    let Some(obj) = body.as_object() else {
        return Vec::new(); // named by the caller ("body is not a JSON object")
    };
    let has_error = obj
        .get("error")
        .and_then(serde_json::Value::as_str)
        .is_some_and(|e| !e.is_empty());
    let mut problems = Vec::new();
    for (name, value) in obj {
        match name.as_str() {
            // The key's value is a secret even when it is of the wrong type.
            "key" if !value.is_string() => problems.push("key is not a string".into()),
            "address" | "iqn" if !value.is_string() => {
                problems.push(format!("{name} is not a string: {value}"));
            }
            "key" if value.as_str() == Some("") => problems.push("key is empty".into()),
            // An agent that failed before it had a target name reports that with its error.
            "iqn" if value.as_str() == Some("") && !has_error => {
                problems.push("iqn is empty in a success report".into());
            }
            "address" | "key" | "iqn" => {}
            "error" if !(value.is_string() || value.is_null()) => {
                problems.push(format!("error is neither a string nor null: {value}"));
            }
            "error" => {}
            other => problems.push(format!("field {other:?} is not in pass_deploy_info")),
        }
    }
    for required in ["address", "key", "iqn"] {
        if !obj.contains_key(required) {
            problems.push(format!("field {required:?} is missing"));
        }
    }
    problems
}

/// Writes `image` to LUN 1 of `iqn` at `portal` with the conductor's initiator CLI.
pub fn write_image(portal: &str, iqn: &str, image: &Path, limit: Duration) -> Output {
    let mut child = ChildGuard::new(
        Command::new(crate::bin("vmdeploy-conductor"))
            .args(["iscsi", "write"])
            .arg(image)
            .args(["--portal", portal, "--iqn", iqn, "--lun", "1"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting vmdeploy-conductor iscsi write"),
    );
    let start = Instant::now();
    loop {
        if child.try_wait().expect("polling the initiator").is_some() {
            return child
                .wait_with_output()
                .expect("collecting the initiator output");
        }
        if start.elapsed() > limit {
            child.kill();
            let out = child
                .wait_with_output()
                .expect("collecting the initiator output");
            panic!(
                "iscsi write ran over {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `done` as Ironic's `notify` does: connect, 4 bytes, close (no reply read).
pub fn send_done(addr: SocketAddr) -> std::io::Result<()> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.write_all(b"done")?;
    Ok(())
}

/// The conductor's part after an accepted pass_deploy_info: write `image` through the agent's
/// target, then send `done` to `done` (docs/ironic-protocols.md §2.3 step 5, §2.4).
pub fn write_and_notify(
    portal: &str,
    iqn: &str,
    image: &Path,
    done: SocketAddr,
    limit: Duration,
) -> Result<(), String> {
    let out = write_image(portal, iqn, image, limit);
    if !out.status.success() {
        return Err(format!(
            "iscsi write failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    send_done(done).map_err(|e| format!("sending done to {done}: {e}"))
}
