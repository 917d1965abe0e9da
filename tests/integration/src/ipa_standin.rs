//! A protocol-checking stand-in for the conductor's side of the IPA protocol
//! (docs/ironic-protocols.md §3.2–3.3), for tests of the agent's `agent_ilo` mode:
//!
//! - [`IpaStandin`] serves `GET /`, `GET /v1/lookup` and `POST /v1/heartbeat/{node}` on 127.0.0.1
//!   and checks every field and the `X-OpenStack-Ironic-API-Version` header as Ironic would
//!   (fields the version does not know are a 400, as in Ironic's ramdisk controller). It records
//!   each heartbeat; every violation is kept in [`IpaStandin::violations`] for the test to
//!   assert empty. Its refusals are the conductor's API's: a wrong or missing token is a 403 in
//!   the API's words, and every error carries Ironic's fault body ([`crate::fault`];
//!   `tests/standin_parity.rs` holds the two together).
//! - With auto-TLS (the agent's default), each heartbeat must carry `callback_url` `https://` and
//!   the agent's certificate in `agent_verify_ca` (Ironic's auto-TLS, §3.2): a PEM certificate
//!   valid for the callback's IP address, the same in every heartbeat. [`IpaStandin::pinned_cert`]
//!   gives it to the test.
//! - [`AgentDriver`] calls the agent's `/v1/commands` as Ironic's agent client does: `POST` with
//!   `?agent_token=`, then `GET /v1/commands` until the command is no longer `RUNNING`; over
//!   HTTPS trusting only the pinned certificate when it has one.
//!
//! Plain std threads, rustls' blocking streams and a minimal HTTP/1.1 (one request per
//! connection), so the stand-in shares no code with the agent's HTTP stack.
//!
//! Every check is made twice: through `shared`'s types (what the agent itself uses), and on the
//! raw JSON and header text against the field names, versions and values written out here from
//! docs/ironic-protocols.md §3.2–3.3, so that a wrong type or constant in `shared` cannot pass both
//! the agent and the check.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http::AcceptLoop;
use vmdeploy_shared::api::ipa::{
    ApiVersion, CommandList, CommandResult, CommandStatus, Heartbeat, WriteProgress,
};

/// What the stand-in conductor knows about the node.
#[derive(Debug, Clone)]
pub struct StandinConfig {
    /// Node UUID the lookup answers.
    pub node_uuid: String,
    /// MACs that identify the node (lowercase, colon form); the lookup must name all of them.
    pub macs: Vec<String>,
    /// The token the agent must send. With `pregenerated` the lookup masks it (`******`) as
    /// Ironic does for a token that came on the floppy; otherwise the lookup discloses it.
    pub token: String,
    /// Whether the token was pre-generated (sent on the floppy).
    pub pregenerated: bool,
    /// `config.heartbeat_timeout` in seconds.
    pub heartbeat_timeout: u64,
    /// The newest API version the stand-in claims in `GET /`.
    pub max_version: ApiVersion,
    /// `node.properties`, e.g. `{"root_device": {"name": "/dev/loop3"}}`.
    pub properties: Value,
    /// Answer this many lookups with 404 first (node not yet in `wait call-back`).
    pub lookup_misses: u32,
    /// Answer this many (valid) heartbeats with 409 first, as Ironic does when the node is
    /// locked; the agent must retry.
    pub heartbeat_conflicts: u32,
    /// Whether the agent runs with auto-TLS (its default; off with `ipa-enable-auto-tls=0`):
    /// `https://` callback and `agent_verify_ca` expected (from API 1.68), else `http://` and
    /// no certificate.
    pub auto_tls: bool,
}

/// One heartbeat as received.
#[derive(Debug, Clone)]
pub struct RecordedHeartbeat {
    /// Since the stand-in started.
    pub at: Duration,
    /// The body.
    pub body: Heartbeat,
    /// Its progress, when it carried one.
    pub progress: Option<WriteProgress>,
}

#[derive(Default)]
struct Shared {
    heartbeats: Mutex<Vec<RecordedHeartbeat>>,
    violations: Mutex<Vec<String>>,
    lookups: AtomicU32,
    heartbeat_count: AtomicU32,
    /// The certificate of the first heartbeat that carried one.
    pinned: Mutex<Option<String>>,
}

/// The running stand-in; stops on drop.
pub struct IpaStandin {
    accept: AcceptLoop,
    shared: Arc<Shared>,
}

/// The newest microversion the agent speaks: 1.72, the one that added `agent_status` (§3.2).
const AGENT_NEWEST: (u32, u32) = (1, 72);

/// Heartbeat fields and the microversion each came with, as §3.2 lists them (`callback_url` is
/// as old as the `/v1/heartbeat` route, 1.22).
const HEARTBEAT_FIELDS: [(&str, (u32, u32)); 6] = [
    ("callback_url", (1, 22)),
    ("agent_version", (1, 36)),
    ("agent_token", (1, 62)),
    ("agent_verify_ca", (1, 68)),
    ("agent_status", (1, 72)),
    ("agent_status_message", (1, 72)),
];

/// The version the agent must send: the smaller of the stand-in's and the agent's newest.
fn expected_version(cfg: &StandinConfig) -> (u32, u32) {
    (cfg.max_version.major, cfg.max_version.minor).min(AGENT_NEWEST)
}

impl IpaStandin {
    /// Starts serving on 127.0.0.1 (ephemeral port).
    pub fn start(cfg: StandinConfig) -> IpaStandin {
        let shared = Arc::new(Shared::default());
        let started = Instant::now();
        let accept = {
            let shared = Arc::clone(&shared);
            AcceptLoop::start(move |stream| {
                if let Err(e) = serve(stream, &cfg, &shared, started) {
                    shared
                        .violations
                        .lock()
                        .expect("lock")
                        .push(format!("connection error: {e}"));
                }
            })
        };
        IpaStandin { accept, shared }
    }

    /// The API URL to put in `ipa-api-url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.accept.addr())
    }

    /// Every heartbeat so far.
    pub fn heartbeats(&self) -> Vec<RecordedHeartbeat> {
        self.shared.heartbeats.lock().expect("lock").clone()
    }

    /// Every protocol violation so far (empty when the agent behaved).
    pub fn violations(&self) -> Vec<String> {
        self.shared.violations.lock().expect("lock").clone()
    }

    /// The agent's certificate (PEM) from its heartbeats, once one arrived.
    pub fn pinned_cert(&self) -> Option<String> {
        self.shared.pinned.lock().expect("lock").clone()
    }

    /// Lookups received.
    pub fn lookups(&self) -> u32 {
        self.shared.lookups.load(Ordering::Relaxed)
    }

    /// Waits until a heartbeat arrives (returns the first one's callback URL).
    pub fn wait_for_heartbeat(&self, timeout: Duration) -> Option<RecordedHeartbeat> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(h) = self.heartbeats().into_iter().next() {
                return Some(h);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn read_request(stream: &mut impl Read) -> std::io::Result<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let len = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len.min(1 << 20)];
    reader.read_exact(&mut body)?;
    Ok(Request {
        method,
        target,
        headers,
        body,
    })
}

/// Ironic's fault body.
fn fault(status: u16, faultstring: &str) -> Value {
    crate::fault::body(status, faultstring)
}

/// Whether the heartbeat carries the node's token, where its microversion has the field.
fn token_matches(body: &[u8], cfg: &StandinConfig, version: (u32, u32)) -> bool {
    if version < (1, 62) {
        return true;
    }
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("agent_token")?.as_str().map(str::to_owned))
        .is_some_and(|token| token == cfg.token)
}

fn respond(stream: &mut impl Write, status: u16, body: &Value) -> std::io::Result<()> {
    let text = body.to_string();
    let reason = match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        406 => "Not Acceptable",
        409 => "Conflict",
        _ => "Other",
    };
    write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )?;
    stream.flush()
}

fn serve(
    mut stream: TcpStream,
    cfg: &StandinConfig,
    shared: &Shared,
    started: Instant,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let req = read_request(&mut stream)?;
    let mut problems = Vec::new();
    let (path, query) = req.target.split_once('?').unwrap_or((&req.target, ""));
    let want = expected_version(cfg);
    let (status, body) = match (req.method.as_str(), path) {
        ("GET", "/") => (
            200,
            json!({"name": "OpenStack Ironic API (vmdeploy stand-in)",
                   "default_version": {"id": "v1", "version": cfg.max_version.to_string(),
                                       "min_version": "1.1", "status": "CURRENT"},
                   "versions": [{"id": "v1"}]}),
        ),
        ("GET", "/v1/lookup") => {
            check_version(&req, want, &mut problems);
            let n = shared.lookups.fetch_add(1, Ordering::Relaxed);
            let addresses: BTreeSet<String> = query
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .filter(|(k, _)| *k == "addresses")
                .flat_map(|(_, v)| {
                    v.replace("%3A", ":")
                        .replace("%3a", ":")
                        .replace("%2C", ",")
                        .replace("%2c", ",")
                        .split(',')
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
                .collect();
            for mac in &cfg.macs {
                if !addresses.contains(mac) {
                    problems.push(format!("lookup addresses {addresses:?} lack {mac}"));
                }
            }
            if n < cfg.lookup_misses {
                (404, fault(404, "node not found"))
            } else {
                let token = if cfg.pregenerated {
                    "******".to_owned()
                } else {
                    cfg.token.clone()
                };
                (
                    200,
                    json!({"node": {"uuid": cfg.node_uuid, "properties": cfg.properties,
                                    "instance_info": {}, "driver_internal_info": {}},
                           "config": {"heartbeat_timeout": cfg.heartbeat_timeout,
                                      "agent_token": token, "agent_token_required": true,
                                      "metrics": {}, "metrics_statsd": {}}}),
                )
            }
        }
        ("POST", p) if p.starts_with("/v1/heartbeat/") => {
            check_version(&req, want, &mut problems);
            let node = p.trim_start_matches("/v1/heartbeat/");
            if node != cfg.node_uuid {
                problems.push(format!("heartbeat for node {node:?}"));
            }
            match check_heartbeat(&req.body, cfg, want, &shared.pinned, &mut problems) {
                Some((hb, progress)) => {
                    shared
                        .heartbeats
                        .lock()
                        .expect("lock")
                        .push(RecordedHeartbeat {
                            at: started.elapsed(),
                            body: hb,
                            progress,
                        });
                }
                None => problems.push("heartbeat body unreadable".into()),
            }
            let n = shared.heartbeat_count.fetch_add(1, Ordering::Relaxed);
            if !token_matches(&req.body, cfg, want) {
                // The conductor checks the token before anything else of the node's, and
                // answers in these words.
                (403, fault(403, "Invalid or missing agent token received."))
            } else if problems.is_empty() && n < cfg.heartbeat_conflicts {
                (409, fault(409, "node is locked (stand-in conflict)"))
            } else if problems.is_empty() {
                (202, Value::Null)
            } else {
                (400, fault(400, &problems.join("; ")))
            }
        }
        (m, p) => {
            problems.push(format!("unexpected request {m} {p}"));
            (404, fault(404, "not found"))
        }
    };
    if !problems.is_empty() {
        shared
            .violations
            .lock()
            .expect("lock")
            .extend(problems.iter().cloned());
    }
    let body = if status == 202 { json!({}) } else { body };
    respond(&mut stream, status, &body)
}

fn check_version(req: &Request, want: (u32, u32), problems: &mut Vec<String>) {
    let header = req.header("X-OpenStack-Ironic-API-Version");
    // The raw text, as Ironic reads it: "<major>.<minor>".
    let text = format!("{}.{}", want.0, want.1);
    if header != Some(text.as_str()) {
        problems.push(format!(
            "{} {}: API version header {header:?}, expected {text:?}",
            req.method, req.target
        ));
    }
    // And through shared's parser, which the agent's own negotiation uses.
    match header.map(ApiVersion::parse) {
        Some(Ok(v)) if v == ApiVersion::new(want.0, want.1) => {}
        other => problems.push(format!(
            "{} {}: API version header parses as {other:?}",
            req.method, req.target
        )),
    }
}

fn check_heartbeat(
    body: &[u8],
    cfg: &StandinConfig,
    version: (u32, u32),
    pinned: &Mutex<Option<String>>,
    problems: &mut Vec<String>,
) -> Option<(Heartbeat, Option<WriteProgress>)> {
    let raw: Value = serde_json::from_slice(body).ok()?;
    let obj = raw.as_object()?;
    // Ironic's controller knows exactly these fields, each from its microversion on.
    for key in obj.keys() {
        match HEARTBEAT_FIELDS.iter().find(|(k, _)| k == key) {
            Some((_, since)) if version >= *since => {}
            Some((_, since)) => problems.push(format!(
                "heartbeat field {key} needs API {}.{}, sent at {}.{}",
                since.0, since.1, version.0, version.1
            )),
            None => problems.push(format!("unknown heartbeat field {key}")),
        }
    }
    check_heartbeat_raw(obj, cfg, version, problems);
    check_auto_tls(obj, cfg, version, pinned, problems);
    let hb = Heartbeat::from_json(body).ok()?;
    let scheme = if cfg.auto_tls { "https://" } else { "http://" };
    match hb.callback_url.strip_prefix(scheme) {
        Some(rest) if rest.parse::<SocketAddr>().is_ok() => {}
        _ => problems.push(format!(
            "callback_url {:?} is not {scheme}IP:PORT",
            hb.callback_url
        )),
    }
    if hb.agent_verify_ca != text_field(obj, "agent_verify_ca") {
        problems.push("shared's Heartbeat reads agent_verify_ca differently from the JSON".into());
    }
    if version >= (1, 62)
        && hb.agent_token.as_ref().map(|t| t.expose().as_str()) != Some(cfg.token.as_str())
    {
        problems.push("heartbeat agent_token is wrong or missing".into());
    }
    if version >= (1, 36) && hb.agent_version.as_deref().is_none_or(str::is_empty) {
        problems.push("heartbeat agent_version is missing".into());
    }
    if let Some(s) = &hb.agent_status {
        if !["start", "end", "error"].contains(&s.as_str()) {
            problems.push(format!("agent_status {s:?} is not start/end/error"));
        }
    }
    let progress = match &hb.agent_status_message {
        Some(m) => match WriteProgress::parse(m) {
            Ok(p) => Some(p),
            Err(e) => {
                problems.push(format!("agent_status_message: {e}"));
                None
            }
        },
        None => None,
    };
    Some((hb, progress))
}

/// The heartbeat's raw JSON against §3.2, without `shared`: field types, the token, the values
/// `agent_status` may take.
fn check_heartbeat_raw(
    obj: &serde_json::Map<String, Value>,
    cfg: &StandinConfig,
    version: (u32, u32),
    problems: &mut Vec<String>,
) {
    let text = |key: &str| obj.get(key).and_then(Value::as_str);
    for (key, value) in obj {
        if !value.is_string() {
            // A secret's value stays out of the violations, which tests print.
            let shown = if vmdeploy_shared::redact::is_secret_key(key) {
                Value::String(vmdeploy_shared::redact::MASK.into())
            } else {
                value.clone()
            };
            problems.push(format!("raw heartbeat: {key} is not a string: {shown}"));
        }
    }
    match text("callback_url") {
        Some(url) if url.starts_with("http://") || url.starts_with("https://") => {}
        other => problems.push(format!("raw heartbeat: callback_url {other:?}")),
    }
    if version >= (1, 62) && text("agent_token") != Some(cfg.token.as_str()) {
        problems.push("raw heartbeat: agent_token is not the node's token".into());
    }
    if version >= (1, 36) && text("agent_version").is_none_or(str::is_empty) {
        problems.push("raw heartbeat: agent_version missing or empty".into());
    }
    if let Some(status) = obj.get("agent_status") {
        if !["start", "end", "error"].contains(&status.as_str().unwrap_or_default()) {
            problems.push(format!("raw heartbeat: agent_status {status}"));
        }
    }
}

fn text_field(obj: &serde_json::Map<String, Value>, key: &str) -> Option<String> {
    obj.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// Ironic's auto-TLS on the raw JSON (§3.2): with auto-TLS and API >= 1.68, `callback_url` is
/// `https://IP:PORT` and `agent_verify_ca` a PEM certificate valid for that IP (checked with
/// webpki as a client pinned to it would, and its DER holding the IP SAN), the same in every
/// heartbeat; without auto-TLS no certificate at all.
fn check_auto_tls(
    obj: &serde_json::Map<String, Value>,
    cfg: &StandinConfig,
    version: (u32, u32),
    pinned: &Mutex<Option<String>>,
    problems: &mut Vec<String>,
) {
    let ca = text_field(obj, "agent_verify_ca");
    let url = text_field(obj, "callback_url").unwrap_or_default();
    if !cfg.auto_tls {
        if ca.is_some() {
            problems.push("agent_verify_ca sent with auto-TLS off".into());
        }
        return;
    }
    if version < (1, 68) {
        return;
    }
    let Some(pem) = ca else {
        problems.push("auto-TLS: heartbeat without agent_verify_ca".into());
        return;
    };
    let Some(addr) = url
        .strip_prefix("https://")
        .and_then(|rest| rest.parse::<SocketAddr>().ok())
    else {
        problems.push(format!(
            "auto-TLS: callback_url {url:?} is not https://IP:PORT"
        ));
        return;
    };
    if let Err(e) = cert_valid_for(&pem, addr.ip()) {
        problems.push(format!("agent_verify_ca: {e}"));
    }
    let mut first = pinned.lock().expect("lock");
    match first.as_ref() {
        None => *first = Some(pem),
        Some(p) if *p == pem => {}
        Some(_) => problems.push("agent_verify_ca changed between heartbeats".into()),
    }
}

/// Whether `pem` is one certificate that a client pinned to it accepts for `ip`.
pub fn cert_valid_for(pem: &str, ip: std::net::IpAddr) -> Result<(), String> {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not PEM: {e:?}"))?;
    let [cert] = certs.as_slice() else {
        return Err(format!("{} certificates, expected one", certs.len()));
    };
    // The IP SAN: iPAddress is [7] IMPLICIT OCTET STRING, tag 0x87, then the address bytes.
    let octets = match ip {
        std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
        std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    let mut san = vec![0x87, octets.len() as u8];
    san.extend_from_slice(&octets);
    if !cert.windows(san.len()).any(|w| w == san.as_slice()) {
        return Err(format!("no IP SAN {ip} in the certificate"));
    }
    let verifier = pinned_verifier(cert.clone())?;
    verifier
        .verify_server_cert(
            cert,
            &[],
            &ServerName::IpAddress(ip.into()),
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
        .map_err(|e| format!("not valid for {ip} when pinned: {e}"))
}

fn pinned_verifier(
    cert: rustls::pki_types::CertificateDer<'static>,
) -> Result<Arc<rustls::client::WebPkiServerVerifier>, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(cert)
        .map_err(|e| format!("not usable as a trust anchor: {e}"))?;
    rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
        .build()
        .map_err(|e| format!("verifier: {e}"))
}

/// The command states IPA reports (§3.3).
const COMMAND_STATES: [&str; 4] = ["RUNNING", "SUCCEEDED", "FAILED", "CLEAN_VERSION_MISMATCH"];

/// A CommandResult's raw JSON against §3.3, without `shared`: exactly IPA's five fields (IPA
/// 13's `BaseCommandResult.serializable_fields`: `command_params` is not sent), their types, a
/// known state, and an error object `{type, code, message, details}` on a failed or
/// version-mismatched command. Panics (this is the test's side) with what is wrong.
pub fn assert_raw_command_result(v: &Value) {
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("a command result is not an object: {v}"));
    let fields = [
        "id",
        "command_name",
        "command_status",
        "command_error",
        "command_result",
    ];
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut want = fields.to_vec();
    want.sort_unstable();
    assert_eq!(keys, want, "command result fields: {v}");
    assert!(
        obj["id"].as_str().is_some_and(|id| !id.is_empty()),
        "command id: {v}"
    );
    assert!(
        obj["command_name"]
            .as_str()
            .is_some_and(|n| !n.is_empty() && !n.contains('.')),
        "command_name is the command part only (no extension): {v}"
    );
    let state = obj["command_status"].as_str().unwrap_or_default();
    assert!(COMMAND_STATES.contains(&state), "command_status: {v}");
    match &obj["command_error"] {
        Value::Null => assert!(
            state == "RUNNING" || state == "SUCCEEDED",
            "a failed command has an error: {v}"
        ),
        Value::Object(e) => {
            assert!(
                state == "FAILED" || state == "CLEAN_VERSION_MISMATCH",
                "an error on a command that did not fail: {v}"
            );
            assert!(
                e.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| !t.is_empty()),
                "error type: {v}"
            );
            assert!(e.get("code").is_some_and(Value::is_u64), "error code: {v}");
            assert!(
                e.get("message").is_some_and(Value::is_string),
                "error message: {v}"
            );
            assert!(
                e.get("details").is_some_and(Value::is_string),
                "error details: {v}"
            );
        }
        other => panic!("command_error is neither null nor an object: {other}"),
    }
    assert!(
        obj["command_result"].is_null() || obj["command_result"].is_object(),
        "command_result: {v}"
    );
}

/// Calls the agent's command API as Ironic's agent client does.
#[derive(Debug, Clone)]
pub struct AgentDriver {
    /// `https://IP:PORT` (or `http://`): the heartbeat's callback_url.
    pub base: String,
    /// The token appended to every call.
    pub token: String,
    /// The certificate to pin for `https://` (the heartbeat's `agent_verify_ca`).
    pub cert_pem: Option<String>,
}

/// The TLS client side pinned to `pem` only, for `ip`.
fn pinned_client(pem: &str, ip: std::net::IpAddr, sock: TcpStream) -> std::io::Result<TlsStream> {
    use rustls::pki_types::pem::PemObject;
    let cert = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| std::io::Error::other(format!("pinned certificate: {e:?}")))?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).map_err(std::io::Error::other)?;
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let conn = rustls::ClientConnection::new(
        Arc::new(config),
        rustls::pki_types::ServerName::IpAddress(ip.into()),
    )
    .map_err(std::io::Error::other)?;
    Ok(rustls::StreamOwned::new(conn, sock))
}

type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A minimal blocking HTTP/1.1 call over plain HTTP: status and JSON body (Null when empty).
pub fn http_call(base: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    call(base, None, method, path, body).unwrap_or_else(|e| panic!("{method} {base}{path}: {e}"))
}

/// One HTTP/1.1 call to `base` (`http://IP:PORT`, or `https://IP:PORT` trusting only
/// `cert_pem`): status and JSON body (Null when empty); an I/O or TLS failure is the error.
pub fn call(
    base: &str,
    cert_pem: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<(u16, Value)> {
    let (tls, host) = match base.strip_prefix("https://") {
        Some(h) => (true, h),
        None => (false, base.trim_start_matches("http://")),
    };
    let host = host.trim_end_matches('/');
    let sock = TcpStream::connect(host)?;
    sock.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut stream: Box<dyn ReadWrite> = if tls {
        let pem = cert_pem.ok_or_else(|| std::io::Error::other("https without a pinned cert"))?;
        let ip = host
            .parse::<SocketAddr>()
            .map_err(|e| std::io::Error::other(format!("{host}: {e}")))?
            .ip();
        Box::new(pinned_client(pem, ip, sock)?)
    } else {
        Box::new(sock)
    };
    let text = body.map(Value::to_string).unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )?;
    stream.flush()?;
    let mut raw = Vec::new();
    match stream.read_to_end(&mut raw) {
        Ok(_) => {}
        // hyper closes without TLS close_notify after `Connection: close`; the answer is whole.
        Err(e) if tls && e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e),
    }
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // An empty body (204, a bare status) is Null; any other body must be JSON, or the agent
    // answered something a conductor could not read.
    let json = if rest.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(rest).unwrap_or_else(|e| {
            panic!("{method} {path}: status {status}, body is not JSON ({e}): {rest:?}")
        })
    };
    Ok((status, json))
}

/// A stream to write a request to and read its answer from.
trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

impl AgentDriver {
    /// One call to the agent (pinned to `cert_pem` over HTTPS); panics on a transport failure.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        call(&self.base, self.cert_pem.as_deref(), method, path, body)
            .unwrap_or_else(|e| panic!("{method} {}{path}: {e}", self.base))
    }

    /// `POST /v1/commands/?wait=<wait>&agent_token=<token>` with `{"name", "params"}`.
    pub fn post(&self, name: &str, params: Value, wait: bool) -> (u16, Value) {
        self.call(
            "POST",
            &format!("/v1/commands/?wait={wait}&agent_token={}", self.token),
            Some(&json!({"name": name, "params": params})),
        )
    }

    /// `GET /v1/commands/?agent_token=<token>`, parsed.
    pub fn list(&self) -> CommandList {
        let (status, body) = self.call(
            "GET",
            &format!("/v1/commands/?agent_token={}", self.token),
            None,
        );
        assert_eq!(status, 200, "GET /v1/commands answered {status}: {body}");
        let listed = body["commands"]
            .as_array()
            .unwrap_or_else(|| panic!("GET /v1/commands has no \"commands\" list: {body}"));
        listed.iter().for_each(assert_raw_command_result);
        serde_json::from_value(body).expect("a CommandList")
    }

    /// Runs `name` as Ironic does for async commands: POST without waiting, then poll the
    /// command list until the newest entry (this command) is no longer RUNNING.
    pub fn run(&self, name: &str, params: Value, timeout: Duration) -> CommandResult {
        let (status, body) = self.post(name, params, false);
        assert_eq!(status, 200, "POST {name} answered {status}: {body}");
        assert_raw_command_result(&body);
        let (_, command) = name.split_once('.').expect("extension.command");
        assert_eq!(body["command_name"], command, "{body}");
        let started: CommandResult = serde_json::from_value(body).expect("a CommandResult");
        let deadline = Instant::now() + timeout;
        loop {
            let list = self.list();
            let last = list.commands.last().expect("the command is listed").clone();
            assert_eq!(last.id, started.id, "the newest command is ours");
            if last.command_status != CommandStatus::Running {
                return last;
            }
            assert!(
                Instant::now() < deadline,
                "{name} still RUNNING after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
