//! The command API's tests: tokens, one command at a time, IPA's result shapes, waits, TLS.

use super::*;

/// `test.echo` returns its params after `test.gate` opens; `test.fail` fails.
struct TestExec {
    gate: Arc<tokio::sync::Notify>,
}

impl Executor for TestExec {
    fn start(&self, ext: &str, cmd: &str, params: &Value) -> Result<CommandFuture, StartError> {
        if ext != "test" {
            return Err(StartError::UnknownExtension(ext.into()));
        }
        let params = params.clone();
        let gate = Arc::clone(&self.gate);
        match cmd {
            "echo" => Ok(Box::pin(async move {
                gate.notified().await;
                Ok(serde_json::json!({ "result": params }))
            })),
            "fail" => Ok(Box::pin(async move {
                Err(CommandError::new(
                    IpaErrorKind::CommandExecution,
                    "it failed",
                ))
            })),
            "mismatch" => Ok(Box::pin(async move {
                Err(CommandError::new(
                    IpaErrorKind::CleanVersionMismatch,
                    "versions differ",
                ))
            })),
            other => Err(StartError::UnknownCommand(other.into())),
        }
    }
}

async fn call(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, Value) {
    let client = crate::http::build_client(&Default::default()).expect("client");
    let url = format!("http://{addr}{path}");
    let req = match method {
        "POST" => client.post(&url).body(body.unwrap_or("").to_owned()),
        _ => client.get(&url),
    };
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let v = resp.json::<Value>().await.unwrap_or(Value::Null);
    (status, v)
}

/// A command API on loopback, plain HTTP, whose `test.echo` commands wait for `gate`.
struct TestApi {
    addr: std::net::SocketAddr,
    gate: Arc<tokio::sync::Notify>,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl TestApi {
    async fn start(token: &str) -> TestApi {
        TestApi::start_limited(token, ServerLimits::default()).await
    }

    async fn start_limited(token: &str, limits: ServerLimits) -> TestApi {
        let gate = Arc::new(tokio::sync::Notify::new());
        let api = CommandApi::new(
            Some(Secret::new(token)),
            Arc::new(TestExec {
                gate: Arc::clone(&gate),
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_limited(listener, api, None, limits, async move {
            let _ = stop_rx.await;
        }));
        TestApi {
            addr,
            gate,
            stop,
            server,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.server.await.expect("join").expect("serve");
    }
}

/// The top-level keys of a JSON object, sorted.
fn sorted_keys(v: &Value) -> std::collections::BTreeSet<&str> {
    let object = v.as_object().expect("object");
    object.keys().map(String::as_str).collect()
}

/// `POST path` with `body`: the status and the JSON answer.
async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> (u16, Value) {
    call(addr, "POST", path, Some(body)).await
}

/// IPA's `CommandResult` on the wire, as docs/ironic-protocols.md lists it: five fields,
/// no `command_params` (they would hold the node).
const IPA_COMMAND_RESULT_KEYS: [&str; 5] = [
    "command_error",
    "command_name",
    "command_result",
    "command_status",
    "id",
];

#[tokio::test]
async fn token_busy_and_command_results() {
    let api = TestApi::start("s3cret-token").await;
    let (addr, gate) = (api.addr, Arc::clone(&api.gate));

    let (s, v) = call(addr, "GET", "/v1/commands", None).await;
    assert_eq!(s, 401);
    assert_eq!(v["faultstring"], "Token invalid.");
    let (s, _) = call(addr, "GET", "/v1/commands?agent_token=wrong", None).await;
    assert_eq!(s, 401);

    let q = "?agent_token=s3cret-token";
    let (s, v) = post(
        addr,
        &format!("/v1/commands/{q}"),
        r#"{"name":"test.echo","params":{"a":1}}"#,
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(v["command_status"], "RUNNING");
    assert_eq!(v["command_name"], "echo");
    let id = v["id"].as_str().expect("id").to_owned();

    let (s, v) = post(
        addr,
        &format!("/v1/commands{q}"),
        r#"{"name":"test.fail","params":{}}"#,
    )
    .await;
    assert_eq!(s, 409, "busy: {v}");
    // Ironic's agent client matches 409 or "agent is busy" in the faultstring.
    assert_eq!(v["faultstring"], "Agent is busy: executing command echo");
    // IPA's CommandResult has five fields: no command_params (they hold the node).
    let (_, v) = call(addr, "GET", &format!("/v1/commands/{id}{q}"), None).await;
    assert_eq!(sorted_keys(&v), IPA_COMMAND_RESULT_KEYS.into());

    gate.notify_one();
    let mut done = Value::Null;
    for _ in 0..100 {
        let (s, v) = call(addr, "GET", &format!("/v1/commands/{id}{q}"), None).await;
        assert_eq!(s, 200);
        if v["command_status"] != "RUNNING" {
            done = v;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(done["command_status"], "SUCCEEDED");
    assert_eq!(done["command_result"]["result"]["a"], 1);

    let (s, v) = post(
        addr,
        &format!("/v1/commands{q}&wait=true"),
        r#"{"name":"test.fail","params":{}}"#,
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(v["command_status"], "FAILED");
    assert_eq!(v["command_error"]["message"], "it failed");
    assert_eq!(v["command_error"]["type"], "CommandExecutionError");

    // Bad requests: an unknown extension is 404, anything else malformed 400 (IPA's run_command
    // also wants `params`, an object), each a client fault.
    for (body, status) in [
        (r#"{"name":"nope.x","params":{}}"#, 404),
        (r#"{"name":"test.nope","params":{}}"#, 400),
        (r#"{"name":"nodot","params":{}}"#, 400),
        ("not json", 400),
        (r#"{"name":"test.echo"}"#, 400),
        (r#"{"name":"test.echo","params":[1]}"#, 400),
    ] {
        let (s, v) = call(addr, "POST", &format!("/v1/commands{q}"), Some(body)).await;
        assert_eq!(s, status, "{body}: {v}");
        assert_eq!(v["faultcode"], "Client", "{body}: {v}");
    }

    let (s, v) = call(addr, "GET", &format!("/v1/commands{q}"), None).await;
    assert_eq!(s, 200);
    let list = v["commands"].as_array().expect("list");
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["id"], id.as_str());

    api.stop().await;
}

#[tokio::test]
async fn wait_on_get_and_post_and_the_version_mismatch_status() {
    let api = TestApi::start("tok").await;
    let (addr, gate) = (api.addr, Arc::clone(&api.gate));
    // Ironic's agent client: POST {agent_url}/v1/commands/?wait=false&agent_token=...
    let (s, v) = call(
        addr,
        "POST",
        "/v1/commands/?wait=false&agent_token=tok",
        Some(r#"{"name":"test.echo","params":{"x":2}}"#),
    )
    .await;
    assert_eq!((s, v["command_status"].as_str()), (200, Some("RUNNING")));
    let id = v["id"].as_str().expect("id").to_owned();
    // GET of one command with ?wait=true (IPA joins it; any case of "true") holds the
    // answer until the command ends; IPA's routes also answer without the /v1 prefix.
    let waiter = tokio::spawn(async move {
        call(
            addr,
            "GET",
            &format!("/commands/{id}?wait=True&agent_token=tok"),
            None,
        )
        .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "GET ?wait=True answered before the command ended"
    );
    gate.notify_one();
    let (s, v) = tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
        .await
        .expect("the waiting GET answers once the command ends")
        .expect("join");
    assert_eq!(s, 200);
    assert_eq!(v["command_status"], "SUCCEEDED");
    assert_eq!(v["command_result"]["result"]["x"], 2);
    // A version mismatch ends CLEAN_VERSION_MISMATCH (Ironic restarts on it), not FAILED,
    // with IPA's VersionMismatch error.
    let (s, v) = call(
        addr,
        "POST",
        "/v1/commands/?wait=TRUE&agent_token=tok",
        Some(r#"{"name":"test.mismatch","params":{}}"#),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(v["command_status"], "CLEAN_VERSION_MISMATCH");
    assert_eq!(v["command_error"]["type"], "VersionMismatch");
    assert_eq!(v["command_error"]["code"], 409);
    let (s, v) = call(
        addr,
        "GET",
        "/v1/commands/nope?wait=true&agent_token=tok",
        None,
    )
    .await;
    assert_eq!(s, 404, "{v}");
    let (s, v) = call(addr, "GET", "/commands/?agent_token=tok", None).await;
    assert_eq!(s, 200);
    assert_eq!(v["commands"].as_array().map(Vec::len), Some(2));
    api.stop().await;
}

#[tokio::test]
async fn https_with_the_boot_certificate_and_only_it() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let api = CommandApi::new(Some(Secret::new("tok")), Arc::new(TestExec { gate }));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cert = crate::api::tls::generate(addr.ip()).expect("certificate");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_with(
        listener,
        api,
        Some(Arc::clone(&cert.server_config)),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let client = |pem: &str| {
        crate::http::build_client(&crate::http::HttpOptions {
            ca_pem: Some(pem.as_bytes().to_vec()),
            ..Default::default()
        })
        .expect("client")
    };
    let url = format!("https://{addr}/v1/commands/?agent_token=tok");
    let resp = client(&cert.cert_pem)
        .get(&url)
        .send()
        .await
        .expect("pinned certificate accepted");
    assert_eq!(resp.status(), 200);
    let other = crate::api::tls::generate(addr.ip()).expect("another certificate");
    let err = client(&other.cert_pem)
        .get(&url)
        .send()
        .await
        .expect_err("another certificate for the same address is refused");
    assert!(
        crate::http::is_tls_error(&err),
        "{}",
        crate::http::error_chain(&err)
    );
    let err = crate::http::build_client(&Default::default())
        .expect("client")
        .get(format!("http://{addr}/v1/commands/?agent_token=tok"))
        .send()
        .await;
    assert!(
        err.as_ref().map_or(true, |r| r.status() != 200),
        "plain HTTP is not served on the TLS port: {err:?}"
    );
    let _ = stop_tx.send(());
    server.await.expect("join").expect("serve");
}

/// Small limits, so the tests of the limits take milliseconds.
fn small_limits() -> ServerLimits {
    ServerLimits {
        header_timeout: Duration::from_millis(400),
        body_timeout: Duration::from_millis(400),
        max_body: 1024,
        max_connections: 64,
        max_connections_per_client: 4,
    }
}

/// A TCP connection to `addr` from `source` (a loopback address: 127.0.0.2 is a second
/// client on Linux's 127/8).
async fn connect_from(source: &str, addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    let source: std::net::SocketAddr = format!("{source}:0").parse().expect("source");
    socket.bind(source).expect("bind the source address");
    socket.connect(addr).await.expect("connect")
}

/// Reads one answer: its status and body (by `Content-Length`), or `None` at EOF or reset
/// before a whole answer.
async fn read_answer(stream: &mut tokio::net::TcpStream) -> Option<(u16, String)> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_string();
            let status = head.split(' ').nth(1)?.parse().ok()?;
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                let body = String::from_utf8_lossy(&got[end + 4..end + 4 + length]).to_string();
                return Some((status, body));
            }
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Whether the server closes `stream` within `within` (EOF or reset), reading and discarding
/// whatever it sends first.
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    let closing = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, closing).await.is_ok()
}

const LIST: &[u8] = b"GET /v1/commands?agent_token=tok HTTP/1.1\r\nHost: agent\r\n\r\n";

/// An address that holds its share of idle connections gets its next one closed at once,
/// while its established ones still work and another address is answered.
#[tokio::test]
async fn past_its_share_an_address_is_refused_and_others_are_served() {
    use tokio::io::AsyncWriteExt;
    let api = TestApi::start_limited(
        "tok",
        ServerLimits {
            header_timeout: Duration::from_secs(30),
            ..small_limits()
        },
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from("127.0.0.1", api.addr).await);
    }
    // Let the accept loop take them all before the next.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut refused = connect_from("127.0.0.1", api.addr).await;
    assert!(
        closed_within(&mut refused, Duration::from_secs(2)).await,
        "the fifth connection from one address is closed"
    );
    let mut other = connect_from("127.0.0.2", api.addr).await;
    other.write_all(LIST).await.expect("write");
    let started = std::time::Instant::now();
    let (status, body) = read_answer(&mut other).await.expect("an answer");
    assert_eq!(status, 200, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let first = &mut held[0];
    first.write_all(LIST).await.expect("write");
    let (status, _) = read_answer(first)
        .await
        .expect("an established one still works");
    assert_eq!(status, 200);
    drop(held);
    api.stop().await;
}

/// Headers that stall are cut after the header timeout; so is a kept-alive connection that
/// stays idle after its answer.
#[tokio::test]
async fn stalled_headers_and_idle_keep_alive_are_closed() {
    use tokio::io::AsyncWriteExt;
    let api = TestApi::start_limited("tok", small_limits()).await;
    let mut stalled = connect_from("127.0.0.1", api.addr).await;
    stalled
        .write_all(b"GET /v1/commands?agent_token=tok HTTP/1.1\r\nHost: ag")
        .await
        .expect("write");
    let started = std::time::Instant::now();
    assert!(
        closed_within(&mut stalled, Duration::from_secs(3)).await,
        "a stalled header is cut"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );

    let mut idle = connect_from("127.0.0.1", api.addr).await;
    idle.write_all(LIST).await.expect("write");
    let (status, _) = read_answer(&mut idle).await.expect("answered");
    assert_eq!(status, 200);
    let started = std::time::Instant::now();
    assert!(
        closed_within(&mut idle, Duration::from_secs(3)).await,
        "an idle kept-alive connection is closed"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    api.stop().await;
}

/// A body over the limit is 413, declared or chunked; one that stalls is 408.
#[tokio::test]
async fn oversized_bodies_are_413_and_stalled_ones_408() {
    use tokio::io::AsyncWriteExt;
    let api = TestApi::start_limited("tok", small_limits()).await;
    let declared = b"POST /v1/commands?agent_token=tok HTTP/1.1\r\nHost: agent\r\nContent-Length: 2048\r\n\r\n";
    let mut conn = connect_from("127.0.0.1", api.addr).await;
    conn.write_all(declared).await.expect("write");
    let (status, body) = read_answer(&mut conn).await.expect("an answer");
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("1024 bytes"), "{body}");

    let mut conn = connect_from("127.0.0.1", api.addr).await;
    let mut chunked =
        b"POST /v1/commands?agent_token=tok HTTP/1.1\r\nHost: agent\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    for _ in 0..3 {
        chunked.extend_from_slice(b"200\r\n");
        chunked.extend_from_slice(&[b' '; 0x200]);
        chunked.extend_from_slice(b"\r\n");
    }
    conn.write_all(&chunked).await.expect("write");
    let (status, body) = read_answer(&mut conn).await.expect("an answer");
    assert_eq!(status, 413, "{body}");

    let mut conn = connect_from("127.0.0.1", api.addr).await;
    conn.write_all(
        b"POST /v1/commands?agent_token=tok HTTP/1.1\r\nHost: agent\r\nContent-Length: 100\r\n\r\n{\"name\"",
    )
    .await
    .expect("write");
    let (status, body) = read_answer(&mut conn).await.expect("an answer");
    assert_eq!(status, 408, "{body}");
    assert!(
        closed_within(&mut conn, Duration::from_secs(2)).await,
        "then closed"
    );
    api.stop().await;
}
