//! `vmdeploy-conductor serve`, black box: the built binary with real files, sockets and signals;
//! and the drain at the library level with a small router of our own (a slow route the API
//! does not have).
//!
//! Every test that starts the binary reads its log on stderr: the address it bound (`API
//! listening ... url=...`) and the line that says it serves. Tests bind port 0, except the one
//! that checks the default port 6385, which holds a file lock on that port so two test runs on
//! one machine do not collide.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

use vmdeploy_conductor::service::{self, listen, request::InFlight};

#[test]
fn with_no_configuration_it_serves_on_6385_and_says_what_it_fell_back_to() {
    let _port = lock_default_port();
    let state = tempfile::tempdir().expect("temp dir");
    let state_dir = state.path().join("state");
    let conductor = Conductor::start(&[], &state_dir);
    let log = conductor.log.join("\n");
    assert_eq!(
        conductor.url(),
        "http://127.0.0.1:6385",
        "the default address; log:\n{log}"
    );
    for (what, needle) in [
        ("no file", "no configuration file"),
        ("listen default", "key=\"api.listen\""),
        ("state dir and why", "$STATE_DIRECTORY"),
        ("store kind", "sqlite at"),
        ("object store kind", "builtin at"),
        ("builtin listen", "key=\"objects.builtin.listen\""),
        ("auth", "noauth"),
        ("TLS", "API TLS: off"),
        ("api_url", "key=\"deploy.api_url\""),
    ] {
        assert!(
            log.contains(needle),
            "{what}: no {needle:?} in the first lines:\n{log}"
        );
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&state_dir)
            .expect("state dir created")
            .permissions(),
    ) & 0o777;
    assert_eq!(mode, 0o700, "the state directory is private");

    let rt = runtime();
    let _enter = rt.enter();
    let response = rt
        .block_on(client().get("http://127.0.0.1:6385/").send())
        .expect("GET / answers");
    assert_eq!(response.status(), 200, "GET / on the default port");
    let id = response
        .headers()
        .get("x-openstack-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(id.starts_with("req-"), "request id header: {id:?}");

    let (status, log) = conductor.terminate();
    assert!(
        status.success(),
        "SIGTERM exits 0: {status:?}\n{}",
        log.join("\n")
    );
    assert!(
        log.iter().any(|l| l.contains("SIGTERM")),
        "the shutdown is logged:\n{}",
        log.join("\n")
    );
}

fn check_config(file: &Path, state: &Path) -> (i32, String) {
    let out = Command::new(BIN)
        .args(["serve", "--check-config", "--config"])
        .arg(file)
        .env("STATE_DIRECTORY", state)
        .output()
        .expect("running serve --check-config");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_accepts_good_files_and_names_the_key_of_bad_ones() {
    let dir = tempfile::tempdir().expect("temp dir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("vmdeploy-conductor.example.toml");
    let (code, stderr) = check_config(&example, dir.path());
    assert_eq!(code, 0, "the example file is good: {stderr}");

    let hash = bcrypt::hash("pw", 4).expect("bcrypt");
    let htpasswd = write(dir.path(), "htpasswd", &format!("admin:{hash}\n"));
    let good = write(
        dir.path(),
        "good.toml",
        &format!(
            "[api]\nlisten = [\"0.0.0.0:6385\"]\ntls = \"auto\"\n[auth]\nstrategy = \"http_basic\"\n\
             htpasswd = \"{}\"\n",
            htpasswd.display()
        ),
    );
    let (code, stderr) = check_config(&good, dir.path());
    assert_eq!(
        code, 0,
        "auto TLS beyond loopback with basic auth: {stderr}"
    );

    let md5 = write(dir.path(), "htpasswd-md5", "admin:$apr1$x$y\n");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "unknown key",
            "[api]\nlistn = [\"127.0.0.1:1\"]\n".into(),
            "api.listn",
        ),
        (
            "bad type",
            "[api]\nmax_body = \"lots\"\n".into(),
            "api.max_body",
        ),
        (
            "missing cert file",
            "[api]\ntls = { cert = \"/nonexistent/c.pem\", key = \"/nonexistent/k.pem\" }\n".into(),
            "api.tls.cert",
        ),
        (
            "non-loopback without TLS",
            "[api]\nlisten = [\"0.0.0.0:6385\"]\n".into(),
            "api.listen",
        ),
        (
            "htpasswd not bcrypt",
            format!(
                "[auth]\nstrategy = \"http_basic\"\nhtpasswd = \"{}\"\n",
                md5.display()
            ),
            "line 1",
        ),
    ];
    for (name, text, key) in cases {
        let file = write(dir.path(), "bad.toml", &text);
        let (code, stderr) = check_config(&file, dir.path());
        assert_eq!(code, 64, "{name}: exit 64; stderr: {stderr}");
        assert!(
            stderr.contains(key),
            "{name}: {key:?} not named in: {stderr}"
        );
    }
    let (code, stderr) = check_config(&dir.path().join("missing.toml"), dir.path());
    assert_eq!(code, 64, "a missing file is a usage error: {stderr}");
}

#[test]
fn tls_auto_makes_a_ca_clients_can_trust_and_reuses_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    let config = write(
        dir.path(),
        "tls.toml",
        "[api]\nlisten = [\"127.0.0.1:0\"]\ntls = \"auto\"\n",
    );
    let config_arg = config.to_str().expect("utf-8 path");
    let conductor = Conductor::start(&["--config", config_arg], &state);
    let url = conductor.url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let ca_path = state.join("tls/ca.pem");
    let ca_pem = std::fs::read(&ca_path).expect("ca.pem written");
    for key in ["tls/ca-key.pem", "tls/server-key.pem"] {
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(state.join(key))
                .expect("key file")
                .permissions(),
        ) & 0o777;
        assert_eq!(mode, 0o600, "{key}");
    }

    let rt = runtime();
    let _enter = rt.enter();
    vmdeploy_conductor::service::tls::install_crypto_provider();
    let trusting = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca_pem).expect("CA PEM")])
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let rt = runtime();
    let _enter = rt.enter();
    let response = rt
        .block_on(trusting.get(format!("{url}/")).send())
        .expect("a client trusting only the generated CA connects");
    assert_eq!(response.status(), 200);
    let stranger = reqwest::Client::builder()
        .tls_certs_only(Vec::<reqwest::Certificate>::new())
        .build()
        .expect("client");
    assert!(
        rt.block_on(stranger.get(format!("{url}/")).send()).is_err(),
        "a client without the CA is refused"
    );
    let (status, log) = conductor.terminate();
    assert!(status.success(), "{status}; log:\n{}", log.join("\n"));

    let again = Conductor::start(&["--config", config_arg], &state);
    let log = again.log.join("\n");
    assert!(log.contains("reusing the generated CA"), "{log}");
    assert_eq!(
        std::fs::read(&ca_path).expect("ca.pem"),
        ca_pem,
        "the same CA at the second start"
    );
    let response = rt
        .block_on(trusting.get(format!("{}/", again.url())).send())
        .expect("still trusted after a restart");
    assert_eq!(response.status(), 200);
    let (status, log) = again.terminate();
    assert!(status.success(), "{status}; log:\n{}", log.join("\n"));
}

#[test]
fn http_basic_refuses_without_or_with_wrong_credentials() {
    /// Above the 1 MiB default, as for an inline config drive.
    const MAX_BODY: usize = 3 * 1024 * 1024;
    let dir = tempfile::tempdir().expect("temp dir");
    let hash = bcrypt::hash("s3cret", 4).expect("bcrypt");
    let htpasswd = write(dir.path(), "htpasswd", &format!("admin:{hash}\n"));
    let conductor = Conductor::with_config(
        dir.path(),
        &format!(
            "[api]\nlisten = [\"127.0.0.1:0\"]\nmax_body = {MAX_BODY}\n\
             [auth]\nstrategy = \"http_basic\"\nhtpasswd = \"{}\"\n",
            htpasswd.display()
        ),
    );
    let url = conductor.url();
    let rt = runtime();
    let _enter = rt.enter();
    let http = client();
    let nodes = format!("{url}/v1/nodes");

    let none = rt.block_on(http.get(&nodes).send()).expect("answer");
    assert_eq!(none.status(), 401, "no credentials");
    assert_eq!(
        none.headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Basic realm=\"Baremetal API\"")
    );
    let body: serde_json::Value = rt.block_on(none.json()).expect("JSON body");
    let fault: serde_json::Value = serde_json::from_str(
        body["error_message"]
            .as_str()
            .expect("error_message is a string"),
    )
    .expect("error_message holds JSON");
    assert!(fault["faultstring"].is_string(), "{body}");

    let wrong = rt
        .block_on(http.get(&nodes).basic_auth("admin", Some("nope")).send())
        .expect("answer");
    assert_eq!(wrong.status(), 401, "wrong password");
    let stranger = rt
        .block_on(http.get(&nodes).basic_auth("eve", Some("s3cret")).send())
        .expect("answer");
    assert_eq!(stranger.status(), 401, "unknown user");

    let right = rt
        .block_on(http.get(&nodes).basic_auth("admin", Some("s3cret")).send())
        .expect("answer");
    assert_eq!(right.status(), 200, "right credentials");

    let public = rt
        .block_on(http.get(format!("{url}/")).send())
        .expect("answer");
    assert_eq!(public.status(), 200, "the root document is public");

    // The ramdisk's call-backs are public in both of Ironic's spellings (the deploy key is
    // their check): an unknown node is a 404, not a 401.
    for callback in [
        "v1/nodes/no-such-node/vendor_passthru?method=pass_deploy_info",
        "v1/nodes/no-such-node/vendor_passthru/pass_deploy_info",
        "nodes/no-such-node/vendor_passthru?method=pass_deploy_info",
    ] {
        let answer = rt
            .block_on(
                http.post(format!("{url}/{callback}"))
                    .json(&serde_json::json!({"address": "10.0.0.9", "key": "k"}))
                    .send(),
            )
            .expect("answer");
        // Past auth: the API's own answer to a node it does not know, or to the body.
        assert!(
            matches!(answer.status().as_u16(), 400 | 404)
                && answer.headers().get("www-authenticate").is_none(),
            "{callback}: {} (public: no 401)",
            answer.status()
        );
    }
    let other_method = rt
        .block_on(
            http.post(format!(
                "{url}/v1/nodes/no-such-node/vendor_passthru?method=other"
            ))
            .send(),
        )
        .expect("answer");
    assert_eq!(
        other_method.status(),
        401,
        "other vendor methods need credentials"
    );

    // `api.max_body` is the limit: a body above the old fixed 1 MiB but below it is read (and
    // refused for what it says), one above it is a 413 that names the limit.
    let node_named = |len: usize| serde_json::json!({ "name": "n".repeat(len) }).to_string();
    let below = rt
        .block_on(
            http.post(&nodes)
                .basic_auth("admin", Some("s3cret"))
                .header("content-type", "application/json")
                .body(node_named(2 * 1024 * 1024))
                .send(),
        )
        .expect("answer");
    assert_eq!(
        below.status(),
        400,
        "read under api.max_body, refused for its content"
    );
    let above = rt
        .block_on(
            http.post(&nodes)
                .basic_auth("admin", Some("s3cret"))
                .header("content-type", "application/json")
                .body(node_named(MAX_BODY + 1))
                .send(),
        )
        .expect("answer");
    assert_eq!(above.status(), 413, "over api.max_body");
    let text = rt.block_on(above.text()).expect("body");
    assert!(
        text.contains(&MAX_BODY.to_string()),
        "names the limit: {text}"
    );
    let (status, log) = conductor.terminate();
    assert!(status.success(), "{status}; log:\n{}", log.join("\n"));
}

/// Stalled request bodies and connection floods, without credentials: the call-backs are
/// public and read their body first. The conductor starts with a soft open-files limit of
/// 256, as a shell gives it; 400 connections from one address that send a heartbeat's headers
/// and stall its body neither exhaust its descriptors nor keep others out: a client on another
/// address is answered at once, the stalled bodies get 408 after `api.body_timeout`, and the
/// places are given back.
#[test]
fn stalled_bodies_and_connection_floods_leave_the_api_answering() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const FLOOD: usize = 400;
    const PER_CLIENT: usize = 100;
    let dir = tempfile::tempdir().expect("temp dir");
    let hash = bcrypt::hash("s3cret", 4).expect("bcrypt");
    let htpasswd = write(dir.path(), "htpasswd", &format!("admin:{hash}\n"));
    let config = write(
        dir.path(),
        "flood.toml",
        &format!(
            "[api]\nlisten = [\"127.0.0.1:0\"]\nbody_timeout = 2\n\
             max_connections_per_client = {PER_CLIENT}\n\
             [auth]\nstrategy = \"http_basic\"\nhtpasswd = \"{}\"\n",
            htpasswd.display()
        ),
    );
    let conductor = Conductor::start_with_open_files(
        &["--config", config.to_str().expect("utf-8")],
        &dir.path().join("state"),
        256,
    );
    let limit_line = conductor
        .log
        .iter()
        .find(|l| l.contains("open-files limit"))
        .unwrap_or_else(|| panic!("no open-files line:\n{}", conductor.log.join("\n")));
    assert_eq!(
        field(limit_line, "was").as_deref(),
        Some("256"),
        "{limit_line}"
    );
    assert_eq!(
        field(limit_line, "soft"),
        field(limit_line, "hard"),
        "raised to the hard limit: {limit_line}"
    );
    let url = conductor.url();
    let addr: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .parse()
        .expect("the API's address");
    let rt = runtime();
    let _enter = rt.enter();
    let stalled_request = format!(
        "POST /v1/heartbeat/{} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{",
        uuid::Uuid::new_v4()
    );
    let flood = rt.block_on(async {
        let mut flood = Vec::new();
        for _ in 0..FLOOD {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket
                .bind("127.0.0.2:0".parse().expect("address"))
                .expect("binding 127.0.0.2 (loopback)");
            let Ok(mut stream) = socket.connect(addr).await else {
                continue;
            };
            // Refused connections may be closed before this write lands.
            let _ = stream.write_all(stalled_request.as_bytes()).await;
            flood.push(stream);
        }
        flood
    });
    assert_eq!(
        flood.len(),
        FLOOD,
        "every connection was accepted by the kernel"
    );

    // Another client is answered at once.
    let http = client();
    let started = Instant::now();
    let answer = rt
        .block_on(
            http.get(format!("{url}/v1"))
                .timeout(Duration::from_secs(10))
                .send(),
        )
        .expect("GET /v1 answered during the flood");
    assert_eq!(answer.status(), 200);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "GET /v1 took {:?} during the flood",
        started.elapsed()
    );

    // Every flood connection ends: 408 for those let in, closed at once for the rest.
    let (timed_out, closed) = rt.block_on(async {
        let (mut timed_out, mut closed) = (0, 0);
        for mut stream in flood {
            let mut reply = Vec::new();
            let read =
                tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut reply))
                    .await
                    .expect("the conductor ended the connection within 20 s");
            let reply = String::from_utf8_lossy(&reply);
            if reply.starts_with("HTTP/1.1 408") {
                timed_out += 1;
            } else {
                assert!(
                    read.is_err() || reply.is_empty(),
                    "unexpected reply: {reply}"
                );
                closed += 1;
            }
        }
        (timed_out, closed)
    });
    assert_eq!(
        timed_out, PER_CLIENT,
        "one client's share got 408s ({closed} closed)"
    );
    assert_eq!(closed, FLOOD - PER_CLIENT);
    assert!(
        conductor.log.iter().all(|l| !l.contains("accept failed")),
        "accept failed: {}",
        conductor.log.join("\n")
    );

    // The places are given back: the flooding address is served again.
    let again = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.2:0".parse().expect("address"))
            .expect("bind");
        let mut stream = socket.connect(addr).await.expect("connect");
        stream
            .write_all(
                format!("GET /v1 HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .expect("request");
        let mut reply = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut reply))
            .await
            .expect("answered")
            .expect("read");
        String::from_utf8_lossy(&reply).into_owned()
    });
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
    let (status, log) = conductor.terminate();
    assert!(status.success(), "{status}; log:\n{}", log.join("\n"));
}

/// A slowloris flood from many addresses, each within its share, past `api.max_connections`:
/// half the connections stall their headers, half send headers and stall their body. The
/// listener closes the longest-waiting of them to make room, so a client that sends a whole
/// request is answered every time, at once.
#[test]
fn a_flood_from_many_addresses_cannot_fill_the_listener() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const MAX: usize = 60;
    const SOURCES: u8 = 12;
    const PER_SOURCE: usize = 10;
    let dir = tempfile::tempdir().expect("temp dir");
    let conductor = Conductor::with_config(
        dir.path(),
        &format!(
            "[api]\nlisten = [\"127.0.0.1:0\"]\nmax_connections = {MAX}\n\
             max_connections_per_client = {PER_SOURCE}\n"
        ),
    );
    let url = conductor.url();
    let addr: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .parse()
        .expect("the API's address");
    let rt = runtime();
    let flood = rt.block_on(async {
        let mut flood = Vec::new();
        for source in 0..SOURCES {
            for n in 0..PER_SOURCE {
                let socket = tokio::net::TcpSocket::new_v4().expect("socket");
                socket
                    .bind(std::net::SocketAddr::from(([127, 0, 0, 2 + source], 0)))
                    .expect("binding a loopback address");
                let Ok(mut stream) = socket.connect(addr).await else {
                    continue;
                };
                let stalled = if n % 2 == 0 {
                    "GET /v1 HTTP/1.1\r\nHost: x\r\n".to_string()
                } else {
                    format!(
                        "POST /v1/heartbeat/{} HTTP/1.1\r\nHost: x\r\n\
                         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{",
                        uuid::Uuid::new_v4()
                    )
                };
                let _ = stream.write_all(stalled.as_bytes()).await;
                flood.push(stream);
            }
        }
        // Let the listener take them all in before the real client comes.
        tokio::time::sleep(Duration::from_millis(300)).await;
        flood
    });
    assert!(flood.len() > MAX, "only {} flood connections", flood.len());
    for attempt in 0..5 {
        let reply = rt.block_on(async {
            let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            stream
                .write_all(
                    format!("GET /v1 HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await
                .expect("request");
            let mut reply = Vec::new();
            let read =
                tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut reply)).await;
            (read.is_ok(), String::from_utf8_lossy(&reply).into_owned())
        });
        assert!(
            reply.0 && reply.1.starts_with("HTTP/1.1 200"),
            "attempt {attempt}: GET /v1 during a flood from {SOURCES} addresses: {reply:?}"
        );
    }
    drop(flood);
    let (status, log) = conductor.terminate();
    assert!(status.success(), "{status}; log:\n{}", log.join("\n"));
    assert!(
        log.iter()
            .any(|l| l.contains("closed the connections that waited longest")),
        "no line about making room:\n{}",
        log.join("\n")
    );
}

/// The listener tells the API each request's client address: an address that keeps naming
/// unknown nodes in call-backs gets 429 with `Retry-After` (and one `warn` line, without any
/// token), while another address is still answered as before.
#[test]
fn call_back_failures_are_counted_per_client_address() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut conductor = Conductor::with_config(
        dir.path(),
        "[api]\nlisten = [\"127.0.0.1:0\"]\ncallback_failures_per_client = 3\n",
    );
    let url = conductor.url();
    let rt = runtime();
    let _enter = rt.enter();
    let from = |ip: &str| {
        vmdeploy_conductor::service::tls::install_crypto_provider();
        reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .local_address(Some(ip.parse().expect("address")))
            .build()
            .expect("an HTTP client")
    };
    let heartbeat = |client: &reqwest::Client| {
        let request = client
            .post(format!("{url}/v1/heartbeat/{}", uuid::Uuid::new_v4()))
            .header("X-OpenStack-Ironic-API-Version", "1.62")
            .json(&serde_json::json!({
                "callback_url": "https://10.0.0.5:9999",
                "agent_token": "a-guessed-token-never-logged"
            }))
            .send();
        let answer = rt.block_on(request).expect("answered");
        let retry_after = answer
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (answer.status().as_u16(), retry_after)
    };
    let guesser = from("127.0.0.2");
    let statuses: Vec<_> = (0..5).map(|_| heartbeat(&guesser)).collect();
    assert_eq!(
        statuses,
        vec![
            (404, None),
            (404, None),
            (404, None),
            (429, Some("20".to_string())),
            (429, Some("20".to_string())),
        ]
    );
    assert_eq!(
        heartbeat(&from("127.0.0.1")),
        (404, None),
        "another address"
    );
    let line = conductor.wait_for("throttled", Duration::from_secs(10));
    assert!(line.contains("127.0.0.2"), "{line}");
    let (status, log) = conductor.terminate();
    assert!(status.success(), "{status}; log:\n{}", log.join("\n"));
    let throttled = log.iter().filter(|l| l.contains("throttled")).count();
    assert_eq!(
        throttled, 1,
        "one line per episode, not per request: {log:#?}"
    );
    assert!(
        log.iter().all(|l| !l.contains("a-guessed-token")),
        "the token is never logged"
    );
}

#[test]
fn json_log_lines_parse_and_carry_the_request_id() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut conductor = Conductor::with_config(
        dir.path(),
        "[api]\nlisten = [\"127.0.0.1:0\"]\n[log]\nformat = \"json\"\n",
    );
    // The listening line is JSON: find the URL in its fields.
    let listening = conductor
        .log
        .iter()
        .find(|l| l.contains("API listening"))
        .cloned()
        .unwrap_or_else(|| panic!("no listening line:\n{}", conductor.log.join("\n")));
    let parsed: serde_json::Value = serde_json::from_str(&listening).expect("JSON line");
    let url = parsed["fields"]["url"]
        .as_str()
        .unwrap_or_else(|| panic!("no fields.url in {listening}"))
        .to_string();
    conductor.url = Some(url.clone());

    let rt = runtime();
    let _enter = rt.enter();
    let response = rt
        .block_on(client().get(format!("{url}/v1")).send())
        .expect("GET /v1 answers");
    let id = response
        .headers()
        .get("x-openstack-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(id.starts_with("req-"), "{id:?}");
    conductor.wait_for("answered", Duration::from_secs(10));
    let (status, log) = conductor.terminate();
    assert!(status.success(), "{status}; log:\n{}", log.join("\n"));
    let mut with_id = 0;
    for line in &log {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let spans = value["spans"].as_array().cloned().unwrap_or_default();
        if spans.iter().any(|s| s["request_id"] == id.as_str()) {
            with_id += 1;
        }
    }
    assert!(with_id >= 1, "no line carries {id}:\n{}", log.join("\n"));
}

/// A router of our own with a slow route, served by the library's listener and drain.
fn slow_app(delay: Duration, in_flight: InFlight) -> axum::Router {
    let router = axum::Router::new().route(
        "/slow",
        axum::routing::get(move || async move {
            tokio::time::sleep(delay).await;
            "done"
        }),
    );
    service::app(router, None, in_flight)
}

#[test]
fn a_drain_lets_a_slow_request_finish_and_stops_accepting() {
    let rt = runtime();
    rt.block_on(async {
        let listeners = listen::bind(&["127.0.0.1:0".parse().expect("addr")], None)
            .await
            .expect("bind");
        let addr = listeners[0].addr;
        let in_flight = InFlight::default();
        let app = slow_app(Duration::from_millis(1500), in_flight.clone());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(listen::run(
            tokio::runtime::Handle::current(),
            listeners,
            app,
            async move {
                let _ = stop_rx.await;
            },
            Duration::from_secs(10),
            in_flight.clone(),
            listen::Limits::default(),
        ));
        let http = client();
        let request = tokio::spawn({
            let http = http.clone();
            async move { http.get(format!("http://{addr}/slow")).send().await }
        });
        // Shut down while the request sleeps in its handler.
        let deadline = Instant::now() + Duration::from_secs(10);
        while in_flight.is_empty() {
            assert!(Instant::now() < deadline, "the request never arrived");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop_tx.send(()).expect("server running");
        let response = request
            .await
            .expect("request task")
            .expect("the request in flight is answered");
        assert_eq!(response.status(), 200);
        assert!(response.headers().contains_key("x-openstack-request-id"));
        assert_eq!(response.text().await.expect("body"), "done");
        let report = server.await.expect("server task");
        assert!(report.clean, "{report:?}");
        assert!(report.cut.is_empty());
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "no longer accepting"
        );
    });
}

#[test]
fn a_drain_past_its_grace_names_the_requests_it_cut() {
    let rt = runtime();
    rt.block_on(async {
        let listeners = listen::bind(&["127.0.0.1:0".parse().expect("addr")], None)
            .await
            .expect("bind");
        let addr = listeners[0].addr;
        let in_flight = InFlight::default();
        let app = slow_app(Duration::from_secs(30), in_flight.clone());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(listen::run(
            tokio::runtime::Handle::current(),
            listeners,
            app,
            async move {
                let _ = stop_rx.await;
            },
            Duration::from_millis(300),
            in_flight.clone(),
            listen::Limits::default(),
        ));
        let http = client();
        let _request =
            tokio::spawn(async move { http.get(format!("http://{addr}/slow")).send().await });
        let deadline = Instant::now() + Duration::from_secs(10);
        while in_flight.is_empty() {
            assert!(Instant::now() < deadline, "the request never arrived");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = Instant::now();
        stop_tx.send(()).expect("server running");
        let report = server.await.expect("server task");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the grace period bounds the drain"
        );
        assert!(!report.clean);
        assert_eq!(report.cut.len(), 1, "{report:?}");
        assert_eq!(report.cut[0].path, "/slow");
        assert!(report.cut[0].id.starts_with("req-"));
    });
}

/// The same checks as the binary tests above, at the library level with a router of our own,
/// so they hold whatever the API's routes are: basic auth in front of a route, TLS with the
/// generated CA, and the request id on every answer, 401s included.
#[test]
fn library_level_basic_auth_and_auto_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let hash = bcrypt::hash("s3cret", 4).expect("bcrypt");
    let users = service::auth::Htpasswd::parse(&format!("admin:{hash}\n")).expect("htpasswd");
    let names = service::tls::names_for(&["127.0.0.1:0".parse().expect("addr")], &[]);
    let (cert, outcome) = service::tls::AutoTls::new(dir.path())
        .ensure(&names)
        .expect("auto TLS");
    assert_eq!(outcome, service::tls::AutoOutcome::CreatedCa);
    let ca_pem = cert.ca_pem.clone().expect("a CA to trust");
    let rt = runtime();
    rt.block_on(async {
        let listeners = listen::bind(
            &["127.0.0.1:0".parse().expect("addr")],
            Some(cert.server_config().expect("rustls config")),
        )
        .await
        .expect("bind");
        let url = listeners[0].url();
        assert!(url.starts_with("https://127.0.0.1:"), "{url}");
        let in_flight = InFlight::default();
        let router =
            axum::Router::new().route("/v1/nodes", axum::routing::get(|| async { "nodes" }));
        let app = service::app(router, Some(users), in_flight.clone());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(listen::run(
            tokio::runtime::Handle::current(),
            listeners,
            app,
            async move {
                let _ = stop_rx.await;
            },
            Duration::from_secs(5),
            in_flight,
            listen::Limits::default(),
        ));
        service::tls::install_crypto_provider();
        let http = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).expect("CA")])
            .timeout(Duration::from_secs(20))
            .build()
            .expect("client");
        let nodes = format!("{url}/v1/nodes");

        let none = http.get(&nodes).send().await.expect("answer over TLS");
        assert_eq!(none.status(), 401);
        assert_eq!(
            none.headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok()),
            Some("Basic realm=\"Baremetal API\"")
        );
        assert!(
            none.headers().contains_key("x-openstack-request-id"),
            "a 401 carries the request id too"
        );
        let body: serde_json::Value = none.json().await.expect("JSON body");
        let fault: serde_json::Value =
            serde_json::from_str(body["error_message"].as_str().expect("error_message"))
                .expect("error_message holds JSON");
        assert!(fault["faultstring"].is_string(), "{body}");

        let wrong = http
            .get(&nodes)
            .basic_auth("admin", Some("nope"))
            .send()
            .await
            .expect("answer");
        assert_eq!(wrong.status(), 401);
        let right = http
            .get(&nodes)
            .basic_auth("admin", Some("s3cret"))
            .send()
            .await
            .expect("answer");
        assert_eq!(right.status(), 200);
        assert_eq!(right.text().await.expect("body"), "nodes");

        stop_tx.send(()).expect("server running");
        let report = server.await.expect("server task");
        assert!(report.clean, "{report:?}");
    });
}

/// Collects log output in memory.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// At `log.level = "warn"` in JSON, a warning inside a handler is one JSON line that carries the
/// request id the client got (the request span exists whatever the level).
#[test]
fn library_level_json_warnings_carry_the_request_id() {
    use vmdeploy_conductor::logging::{subscriber, LogFormat};
    let captured = Captured::default();
    let sink = captured.clone();
    let _default =
        tracing::subscriber::set_default(subscriber(LogFormat::Json, "warn", move || sink.clone()));
    // One thread, so every task logs through the thread-local subscriber set above.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let id = rt.block_on(async {
        let listeners = listen::bind(&["127.0.0.1:0".parse().expect("addr")], None)
            .await
            .expect("bind");
        let url = listeners[0].url();
        let in_flight = InFlight::default();
        let router = axum::Router::new().route(
            "/v1/warn",
            axum::routing::get(|| async {
                tracing::warn!(node = "1be26c0b-03f2-4d2e-ae87-c02d7f33c123", "a warning");
                "ok"
            }),
        );
        let app = service::app(router, None, in_flight.clone());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(listen::run(
            tokio::runtime::Handle::current(),
            listeners,
            app,
            async move {
                let _ = stop_rx.await;
            },
            Duration::from_secs(5),
            in_flight,
            listen::Limits::default(),
        ));
        let response = client()
            .get(format!("{url}/v1/warn"))
            .send()
            .await
            .expect("answer");
        assert_eq!(response.status(), 200);
        let id = response
            .headers()
            .get("x-openstack-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        stop_tx.send(()).expect("server running");
        server.await.expect("server task");
        id
    });
    assert!(id.starts_with("req-"), "{id:?}");
    let text = String::from_utf8(captured.0.lock().expect("log").clone()).expect("UTF-8 log");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let warning = lines
        .iter()
        .find(|v| v["fields"]["message"] == "a warning")
        .unwrap_or_else(|| panic!("no warning line in:\n{text}"));
    assert_eq!(warning["level"], "WARN");
    assert_eq!(
        warning["fields"]["node"],
        "1be26c0b-03f2-4d2e-ae87-c02d7f33c123"
    );
    let spans = warning["spans"].as_array().cloned().unwrap_or_default();
    assert!(
        spans.iter().any(|s| s["request_id"] == id.as_str()),
        "the warning carries {id}: {warning}"
    );
    assert!(
        lines.iter().all(|v| v["level"] != "INFO"),
        "warn level keeps INFO lines out:\n{text}"
    );
}

/// One write the API acknowledged (2xx) during a burst.
#[derive(Debug, Clone)]
enum Acked {
    /// `POST /v1/nodes` of a node with this name.
    Create(String),
    /// `PATCH` that added `extra/<key> = value` to the seed node `node`.
    Patch {
        node: String,
        key: String,
        value: u64,
    },
    /// `PUT …/states/power` on the seed node (202: a task reserved it).
    Power(String),
}

/// A count from the environment (the full figures of the issue: `VMDEPLOY_CRASH_ROUNDS=5
/// VMDEPLOY_CRASH_WRITES=200`), or `default` (the test command's smaller run).
fn count_from_env(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a count")),
        Err(_) => default,
    }
}

/// `GET /v1/nodes/{node}` as JSON.
async fn read_node(http: &reqwest::Client, url: &str, node: &str) -> serde_json::Value {
    http.get(format!("{url}/v1/nodes/{node}"))
        .header("X-OpenStack-Ironic-API-Version", "1.73")
        .send()
        .await
        .expect("reading a node")
        .json()
        .await
        .expect("a node as JSON")
}

/// The database of a crash test, and its integrity check.
enum CrashStore {
    /// `vmdeploy.sqlite` in the state directory: `PRAGMA integrity_check`.
    Sqlite,
    /// A database of a real PostgreSQL cluster: `pg_amcheck` of every table and index.
    Postgres(&'static vmdeploy_test_postgres::Cluster, String),
}

impl CrashStore {
    /// The configuration lines that choose this store.
    fn config(&self) -> String {
        match self {
            CrashStore::Sqlite => String::new(),
            CrashStore::Postgres(cluster, db) => {
                format!("[database]\nurl = \"{}\"\n", cluster.socket_url(db))
            }
        }
    }

    /// The database's own integrity check, run while no conductor runs; "ok" when it passes.
    fn integrity_check(&self, state: &Path) -> String {
        match self {
            CrashStore::Sqlite => {
                let db = state.join("vmdeploy.sqlite");
                let conn = rusqlite::Connection::open(&db)
                    .unwrap_or_else(|e| panic!("opening {}: {e}", db.display()));
                conn.query_row("PRAGMA integrity_check", [], |row| row.get::<_, String>(0))
                    .unwrap_or_else(|e| panic!("integrity_check of {}: {e}", db.display()))
            }
            CrashStore::Postgres(cluster, db) => match cluster.amcheck(db) {
                Ok(()) => "ok".into(),
                Err(e) => e,
            },
        }
    }
}

/// The conductor killed with SIGKILL in the middle of a burst of concurrent API writes (node
/// creates, PATCHes, power changes that reserve the node), several times over on one SQLite
/// database: after each restart every write the API acknowledged is there, recovery has left
/// no reservation and no half-done power change, and the database passes its integrity check.
/// The kill lands after a random share (20–80 %) of the burst was answered, so requests
/// are in flight and tasks hold locks when it comes.
#[test]
fn a_kill_mid_burst_loses_no_acknowledged_write_and_leaves_no_lock() {
    kill_mid_burst(&CrashStore::Sqlite);
}

/// The same on PostgreSQL: the conductor's connections die with it mid-statement; every
/// acknowledged write is committed, recovery releases the locks, and `pg_amcheck` finds the
/// tables and indexes sound.
#[test]
fn a_kill_mid_burst_on_postgresql_loses_no_acknowledged_write_and_leaves_no_lock() {
    let cluster = vmdeploy_test_postgres::shared();
    let db = cluster.create_database("crash");
    kill_mid_burst(&CrashStore::Postgres(cluster, db));
}

fn kill_mid_burst(store: &CrashStore) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    const SEEDS: usize = 16;
    const VERSION: (&str, &str) = ("X-OpenStack-Ironic-API-Version", "1.73");
    let rounds = count_from_env("VMDEPLOY_CRASH_ROUNDS", 3);
    let writes = count_from_env("VMDEPLOY_CRASH_WRITES", 60);
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    // Power syncs would take reservations of their own while the test reads the nodes.
    let config = write(
        dir.path(),
        "crash.toml",
        &format!(
            "[api]\nlisten = [\"127.0.0.1:0\"]\n[deploy]\npower_sync_interval = 86400\n{}",
            store.config()
        ),
    );
    let args = ["--config", config.to_str().expect("utf-8")];
    // A BMC address where nothing listens: a power task fails fast, after it reserved the node.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let closed_port = closed.local_addr().expect("its address").port();
    drop(closed);
    let driver_info = serde_json::json!({
        "ilo_address": "127.0.0.1", "client_port": closed_port, "client_timeout": 5,
        "ilo_username": "admin", "ilo_password": "crash-Secret-1",
        "ilo_deploy_iso": "http://127.0.0.1:1/deploy.iso",
    });
    let rt = runtime();
    let http = client();
    let mut conductor = Conductor::start(&args, &state);
    let mut url = conductor.url();
    rt.block_on(async {
        for seed in 0..SEEDS {
            let reply = http
                .post(format!("{url}/v1/nodes"))
                .header(VERSION.0, VERSION.1)
                .json(&serde_json::json!({
                    "name": format!("seed-{seed}"), "driver": "agent_ilo",
                    "driver_info": driver_info,
                }))
                .send()
                .await
                .expect("creating a seed node");
            assert_eq!(reply.status(), 201, "seed node {seed}");
        }
    });
    let mut acked_all: Vec<Acked> = Vec::new();
    let mut unacked_total = 0;
    let mut seed_state = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
    for round in 0..rounds {
        // xorshift: a different kill point each round and run.
        seed_state ^= seed_state << 13;
        seed_state ^= seed_state >> 7;
        seed_state ^= seed_state << 17;
        let kill_after = writes * (20 + (seed_state % 61) as usize) / 100;
        let acked = Arc::new(Mutex::new(Vec::new()));
        let count = Arc::new(AtomicUsize::new(0));
        let power_acks = Arc::new(AtomicUsize::new(0));
        let notify = Arc::new(tokio::sync::Notify::new());
        let tasks: Vec<_> = (0..writes)
            .map(|i| {
                let (http, url, acked, count, power_acks, notify) = (
                    http.clone(),
                    url.clone(),
                    acked.clone(),
                    count.clone(),
                    power_acks.clone(),
                    notify.clone(),
                );
                let driver_info = driver_info.clone();
                rt.spawn(async move {
                    // PATCHes go to the first half of the seeds, power changes to the other
                    // half: a power task's lock would refuse most PATCHes (409) otherwise.
                    let seed = match i % 3 {
                        2 => format!("seed-{}", SEEDS / 2 + i % (SEEDS / 2)),
                        _ => format!("seed-{}", i % (SEEDS / 2)),
                    };
                    let (request, ack) = match i % 3 {
                        0 => {
                            let name = format!("r{round}-w{i}");
                            let body = serde_json::json!({
                                "name": name, "driver": "agent_ilo", "driver_info": driver_info,
                            });
                            (
                                http.post(format!("{url}/v1/nodes")).json(&body),
                                Acked::Create(name),
                            )
                        }
                        1 => {
                            let key = format!("r{round}_w{i}");
                            let value = (round * writes + i) as u64;
                            let body = serde_json::json!([
                                {"op": "add", "path": format!("/extra/{key}"), "value": value}
                            ]);
                            let request = http.patch(format!("{url}/v1/nodes/{seed}")).json(&body);
                            (
                                request,
                                Acked::Patch {
                                    node: seed,
                                    key,
                                    value,
                                },
                            )
                        }
                        _ => {
                            let target = if i % 2 == 0 { "power on" } else { "power off" };
                            let request = http
                                .put(format!("{url}/v1/nodes/{seed}/states/power"))
                                .json(&serde_json::json!({ "target": target }));
                            (request, Acked::Power(seed))
                        }
                    };
                    let reply = request.header(VERSION.0, VERSION.1).send().await;
                    if matches!(&reply, Ok(r) if r.status().is_success()) {
                        if matches!(ack, Acked::Power(_)) {
                            power_acks.fetch_add(1, Ordering::SeqCst);
                        }
                        acked.lock().expect("acks").push(ack);
                    }
                    // Answered, acknowledged or refused (a 409 while a task holds the node).
                    count.fetch_add(1, Ordering::SeqCst);
                    notify.notify_one();
                })
            })
            .collect();
        rt.block_on(async {
            // Creates and PATCHes answer sooner than power changes, which reserve the node
            // first: on a loaded machine (a CI run on PostgreSQL) an early kill point cut every
            // power change off in all three rounds. The kill waits for one, so each round kills
            // a conductor that holds reservations.
            let waited = tokio::time::timeout(Duration::from_secs(60), async {
                while count.load(Ordering::SeqCst) < kill_after
                    || power_acks.load(Ordering::SeqCst) == 0
                {
                    notify.notified().await;
                }
            })
            .await;
            assert!(
                waited.is_ok(),
                "round {round}: only {} of {kill_after} writes answered ({} power changes \
                 acknowledged) within 60 s",
                count.load(Ordering::SeqCst),
                power_acks.load(Ordering::SeqCst)
            );
        });
        conductor.child.kill().expect("SIGKILL to serve");
        conductor.child.wait().expect("reaping serve");
        rt.block_on(async {
            for task in tasks {
                // A request cut by the kill ends with a connection error, not an ack.
                let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
            }
        });
        let acked = std::mem::take(&mut *acked.lock().expect("acks"));
        eprintln!(
            "round {round}: killed after {kill_after} answers, {} of {writes} writes acknowledged",
            acked.len()
        );
        unacked_total += writes - acked.len();
        acked_all.extend(acked);
        assert_eq!(
            store.integrity_check(&state),
            "ok",
            "round {round}: after SIGKILL"
        );

        conductor = Conductor::start(&args, &state);
        url = conductor.url();
        rt.block_on(async {
            for ack in &acked_all {
                match ack {
                    Acked::Create(name) => {
                        let reply = http
                            .get(format!("{url}/v1/nodes/{name}"))
                            .header(VERSION.0, VERSION.1)
                            .send()
                            .await
                            .expect("reading a node");
                        assert_eq!(
                            reply.status(),
                            200,
                            "round {round}: acknowledged create of {name} lost"
                        );
                    }
                    Acked::Patch { node, key, value } => {
                        let node_json = read_node(&http, &url, node).await;
                        assert_eq!(
                            node_json["extra"][key.as_str()],
                            serde_json::json!(value),
                            "round {round}: acknowledged PATCH {key} of {node} lost"
                        );
                    }
                    // The BMC refuses every call, so an acknowledged power change ends in
                    // a last_error: the task's own, or recovery's "restarted while changing".
                    Acked::Power(node) => {
                        let node_json = read_node(&http, &url, node).await;
                        assert!(
                            node_json["last_error"].is_string(),
                            "round {round}: acknowledged power change of {node} left no trace: \
                             {node_json}"
                        );
                    }
                }
            }
            let list: serde_json::Value = http
                .get(format!("{url}/v1/nodes?detail=true&limit=1000"))
                .header(VERSION.0, VERSION.1)
                .send()
                .await
                .expect("listing nodes")
                .json()
                .await
                .expect("the node list as JSON");
            let nodes = list["nodes"].as_array().expect("a node list");
            assert!(nodes.len() >= SEEDS, "{list}");
            // The restarted conductor took its own row again: one conductor, alive.
            let conductors: serde_json::Value = http
                .get(format!("{url}/v1/conductors"))
                .header(VERSION.0, VERSION.1)
                .send()
                .await
                .expect("listing conductors")
                .json()
                .await
                .expect("the conductor list as JSON");
            let rows = conductors["conductors"]
                .as_array()
                .expect("a conductor list");
            assert_eq!(rows.len(), 1, "round {round}: {conductors}");
            assert_eq!(rows[0]["alive"], true, "round {round}: {conductors}");
            for node in nodes {
                assert!(
                    node["reservation"].is_null() && node["target_power_state"].is_null(),
                    "round {round}: recovery left a lock or a power change behind: {node}"
                );
            }
        });
    }
    let powers = acked_all
        .iter()
        .filter(|a| matches!(a, Acked::Power(_)))
        .count();
    assert!(
        powers > 0,
        "no power change was acknowledged: nothing reserved a node"
    );
    assert!(
        unacked_total > 0,
        "every write was acknowledged before the kills: none cut a burst short"
    );
    let (status, log) = conductor.terminate();
    assert!(
        status.success(),
        "serve after the last restart: {status:?}\n{}",
        log.join("\n")
    );
}
