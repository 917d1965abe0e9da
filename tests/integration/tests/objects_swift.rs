//! The conductor's Swift object store against the real OpenStack Swift that
//! `tests/integration/src/swift.rs` starts (tempauth): container created on demand,
//! `X-Delete-After` turned into `X-Delete-At`, metadata, the account's temp URL key set when
//! missing (generated or configured), temp URLs fetched by reqwest and curl, delete; an
//! unreachable Swift gives `Unavailable` naming the URL.
//!
//! Keystone v3: no Keystone runs here. `keystone_v3_password_auth_reaches_swift` answers
//! `POST /v3/auth/tokens` from a small in-test server with the field names of Keystone's v3 API
//! reference (request: `auth.identity.methods = ["password"]`, `password.user.{name, domain,
//! password}`, `scope.project.{name, domain}`; reply: 201, `X-Subject-Token`,
//! `token.catalog[].{type, endpoints[].{interface, region_id, region, url}}`); the catalog
//! points at the real Swift and the token is a real tempauth token, so everything after the
//! token request is Swift's own answer.
//!
//! `the_object_store_contract_on_real_swift_with_swifts_own_headers` runs the contract every
//! store runs (`objects::testing`), then checks `set_metadata` in Swift's own headers.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use vmdeploy_conductor::objects::swift::{SwiftAuth, SwiftConfig, SwiftStore};
use vmdeploy_conductor::objects::{ObjectBody, ObjectError, ObjectPath, ObjectStore, PutOptions};
use vmdeploy_integration_tests::free_port;
use vmdeploy_integration_tests::swift::{SwiftPeer, KEY, USER};
use vmdeploy_shared::secret::Secret;

fn now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs(),
    )
    .expect("fits")
}

fn tempauth(swift: &SwiftPeer, key: &str) -> SwiftConfig {
    SwiftConfig::new(SwiftAuth::TempAuth {
        url: format!("{}/auth/v1.0", swift.base_url),
        user: USER.to_string(),
        key: Secret::new(key),
    })
}

/// `curl` with the status, the response headers (lower-cased names) and the body in `out`.
fn curl(args: &[&str], out: Option<&Path>) -> (u16, BTreeMap<String, String>) {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--max-time", "10", "-D", "-", "-o"]);
    match out {
        Some(p) => cmd.arg(p),
        None => cmd.arg("/dev/null"),
    };
    let output = cmd
        .args(args)
        .output()
        .expect("curl runs (apt-get install curl)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut lines = text.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("curl {args:?} printed no status line: {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers)
}

async fn fetch(url: &str) -> (u16, Vec<u8>) {
    let reply = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(url)
        .send()
        .await
        .expect("Swift answers the temp URL");
    let status = reply.status().as_u16();
    (status, reply.bytes().await.expect("body").to_vec())
}

/// Reads the account's temp URL key with a token, as an operator would.
fn account_key(swift: &SwiftPeer) -> Option<String> {
    let (token, storage_url) = swift.auth().expect("tempauth");
    let (status, headers) = curl(
        &["-I", "-H", &format!("X-Auth-Token: {token}"), &storage_url],
        None,
    );
    assert_eq!(status, 204, "HEAD of the account");
    headers.get("x-account-meta-temp-url-key").cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swift_store_against_real_swift() {
    let swift = SwiftPeer::start().expect("Swift starts (scripts/setup installs it)");
    let (token, storage_url) = swift.auth().expect("tempauth");
    let auth = format!("X-Auth-Token: {token}");
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SwiftStore::new(tempauth(&swift, KEY)).expect("store");
    assert_eq!(store.kind(), "swift");

    // The container does not exist yet: the put creates it.
    let container_url = format!("{storage_url}/vmdeploy-ondemand");
    assert_eq!(curl(&["-I", "-H", &auth, &container_url], None).0, 404);
    let floppy = ObjectPath::new("vmdeploy-ondemand", "image-node 1");
    let data: Vec<u8> = (0..70_000u32).map(|i| (i % 253) as u8).collect();
    store
        .put(
            &floppy,
            ObjectBody::Bytes(data.clone().into()),
            &PutOptions {
                delete_after: Some(Duration::from_secs(600)),
                metadata: BTreeMap::from([("Usage-Count".to_string(), "1".to_string())]),
            },
        )
        .await
        .expect("put creates the container");
    assert_eq!(curl(&["-I", "-H", &auth, &container_url], None).0, 204);

    // Swift turned X-Delete-After into X-Delete-At.
    let (status, headers) = curl(
        &[
            "-I",
            "-H",
            &auth,
            &format!("{container_url}/image-node%201"),
        ],
        None,
    );
    assert_eq!(status, 200);
    let delete_at: i64 = headers
        .get("x-delete-at")
        .expect("X-Delete-At present")
        .parse()
        .expect("a Unix time");
    assert!(
        (now() + 595..=now() + 601).contains(&delete_at),
        "{delete_at}"
    );
    assert_eq!(
        headers.get("x-object-meta-usage-count").map(String::as_str),
        Some("1")
    );

    let info = store.head(&floppy).await.expect("head");
    assert_eq!(info.size, 70_000);
    assert_eq!(
        info.metadata.get("usage-count").map(String::as_str),
        Some("1")
    );
    assert_eq!(info.delete_at.map(|t| t.unix_timestamp()), Some(delete_at));

    // The fresh account has no temp URL key: the first temp URL sets a generated one.
    assert_eq!(account_key(&swift), None);
    let url = store
        .temp_url(&floppy, Duration::from_secs(300))
        .await
        .expect("temp URL");
    let generated = account_key(&swift).expect("the key was set");
    assert_eq!(generated.len(), 64, "256 bits in hex: {generated}");
    assert!(generated.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(
        url.starts_with(&format!("{container_url}/image-node%201?temp_url_sig=")),
        "{url}"
    );
    assert_eq!(fetch(&url).await, (200, data.clone()));
    let out = dir.path().join("curl-whole");
    assert_eq!(curl(&[&url], Some(&out)).0, 200);
    assert_eq!(std::fs::read(&out).expect("curl output"), data);
    let out = dir.path().join("curl-range");
    let (status, headers) = curl(&["--range", "512-1023", &url], Some(&out));
    assert_eq!(status, 206);
    assert_eq!(
        headers.get("content-range").map(String::as_str),
        Some("bytes 512-1023/70000")
    );
    assert_eq!(std::fs::read(&out).expect("curl output"), &data[512..1024]);
    // A second temp URL reuses the key.
    let again = store
        .temp_url(&floppy, Duration::from_secs(60))
        .await
        .expect("temp URL");
    assert_eq!(fetch(&again).await.0, 200);
    assert_eq!(account_key(&swift).as_deref(), Some(generated.as_str()));

    // A file body, streamed; no TTL.
    let big: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 251) as u8).collect();
    let source = dir.path().join("deploy.iso");
    std::fs::write(&source, &big).expect("writing the source");
    let iso = ObjectPath::new("vmdeploy-ondemand", "isos/deploy.iso");
    store
        .put(&iso, ObjectBody::File(source), &PutOptions::default())
        .await
        .expect("put of a file");
    let info = store.head(&iso).await.expect("head");
    assert_eq!((info.size, info.delete_at), (3 << 20, None));
    let url = store
        .temp_url(&iso, Duration::from_secs(60))
        .await
        .expect("temp URL");
    let (status, body) = fetch(&url).await;
    assert_eq!(status, 200);
    assert_eq!(Sha256::digest(&body), Sha256::digest(&big));

    // Delete.
    assert!(store.delete(&floppy).await.expect("delete"));
    assert!(matches!(store.head(&floppy).await, Err(ObjectError::NotFound(p)) if p == floppy));
    assert!(!store.delete(&floppy).await.expect("second delete"));
    assert_eq!(fetch(&again).await.0, 404);
    assert!(store.delete(&iso).await.expect("delete"));

    // A configured key is what gets set when the account has none.
    let (status, _) = curl(
        &[
            "-X",
            "POST",
            "-H",
            &auth,
            "-H",
            "X-Remove-Account-Meta-Temp-URL-Key: x",
            &storage_url,
        ],
        None,
    );
    assert_eq!(status, 204);
    assert_eq!(account_key(&swift), None);
    let mut config = tempauth(&swift, KEY);
    config.temp_url_key = Some(Secret::new("configured-temp-url-key"));
    let configured = SwiftStore::new(config).expect("store");
    let path = ObjectPath::new("vmdeploy-ondemand", "configured");
    configured
        .put(
            &path,
            ObjectBody::Bytes(b"abc".to_vec().into()),
            &PutOptions::default(),
        )
        .await
        .expect("put");
    let url = configured
        .temp_url(&path, Duration::from_secs(60))
        .await
        .expect("temp URL");
    assert_eq!(
        account_key(&swift).as_deref(),
        Some("configured-temp-url-key")
    );
    assert_eq!(fetch(&url).await, (200, b"abc".to_vec()));

    // Wrong credentials: an auth error, not a retry loop.
    let refused = SwiftStore::new(tempauth(&swift, "wrong-key")).expect("store");
    let err = refused.head(&path).await.expect_err("refused");
    assert!(matches!(err, ObjectError::Auth(_)), "{err}");
    assert!(err.to_string().contains("/auth/v1.0"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swift_down_is_unavailable_and_names_the_url() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/auth/v1.0");
    let mut config = SwiftConfig::new(SwiftAuth::TempAuth {
        url: url.clone(),
        user: USER.to_string(),
        key: Secret::new(KEY),
    });
    config.timeout = Duration::from_secs(2);
    let store = SwiftStore::new(config).expect("store");
    let started = std::time::Instant::now();
    let err = store
        .put(
            &ObjectPath::new("c", "o"),
            ObjectBody::Bytes(b"x".to_vec().into()),
            &PutOptions::default(),
        )
        .await
        .expect_err("nothing listens there");
    let message = err.to_string();
    assert!(matches!(err, ObjectError::Unavailable(_)), "{message}");
    assert!(message.contains(&url), "{message}");
    assert!(message.contains("after 3 attempts"), "{message}");
    // Bounded: three attempts with 0.25 s and 0.5 s back-off.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// A Keystone stand-in: `POST /v3/auth/tokens` only, answering in the v3 API's shape.
struct Keystone {
    url: String,
    bodies: Arc<Mutex<Vec<serde_json::Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Keystone {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const KS_USER: &str = "vmdeploy";
const KS_PASSWORD: &str = "keystone-password";

/// What the stand-in answers to its n-th good token request (the last one repeats).
#[derive(Clone)]
enum Answer {
    /// 201 with this token.
    Token(String),
    /// 503, as a Keystone behind a restarting load balancer.
    Unavailable,
}

async fn keystone(answers: Vec<Answer>, storage_url: String) -> Keystone {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding");
    let url = format!("http://{}/v3", listener.local_addr().expect("bound"));
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let seen = bodies.clone();
    // Endpoints nothing listens on: picking one of them fails the test.
    let nowhere = format!("http://127.0.0.1:{}/v1/AUTH_wrong", free_port());
    let reply = serde_json::json!({"token": {
    "methods": ["password"],
    "expires_at": "2099-01-01T00:00:00.000000Z",
    "issued_at": "2026-12-01T00:00:00.000000Z",
    "user": {"domain": {"id": "default", "name": "Default"}, "id": "u1", "name": KS_USER},
    "project": {"domain": {"id": "default", "name": "Default"}, "id": "p1", "name": "baremetal"},
    "roles": [{"id": "r1", "name": "admin"}],
    "catalog": [
        {"type": "identity", "name": "keystone", "id": "s1", "endpoints": [
            {"id": "e1", "interface": "public", "region_id": "RegionOne",
             "region": "RegionOne", "url": "http://keystone.invalid:5000/v3/"}]},
        {"type": "object-store", "name": "swift", "id": "s2", "endpoints": [
            {"id": "e2", "interface": "internal", "region_id": "RegionOne",
             "region": "RegionOne", "url": nowhere},
            {"id": "e3", "interface": "public", "region_id": "RegionTwo",
             "region": "RegionTwo", "url": nowhere},
            {"id": "e4", "interface": "public", "region_id": "RegionOne",
             "region": "RegionOne", "url": storage_url}]}
    ]}})
    .to_string();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            let mut data = Vec::new();
            let mut buf = [0u8; 4096];
            let (head_end, length) = loop {
                let Ok(n) = tcp.read(&mut buf).await else {
                    break (0, 0);
                };
                if n == 0 {
                    break (0, 0);
                }
                data.extend_from_slice(&buf[..n]);
                if let Some(pos) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&data[..pos]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    break (pos + 4, length);
                }
            };
            if head_end == 0 {
                continue;
            }
            while data.len() < head_end + length {
                match tcp.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => data.extend_from_slice(&buf[..n]),
                }
            }
            let first_line = String::from_utf8_lossy(&data[..head_end])
                .lines()
                .next()
                .unwrap_or_default()
                .to_string();
            let body: serde_json::Value =
                serde_json::from_slice(&data[head_end..]).unwrap_or(serde_json::Value::Null);
            let n = {
                let mut seen = seen.lock().expect("not poisoned");
                seen.push(body.clone());
                seen.len()
            };
            let planned = answers
                .get(n - 1)
                .or(answers.last())
                .cloned()
                .unwrap_or(Answer::Unavailable);
            let user = &body["auth"]["identity"]["password"]["user"];
            let answer = if !first_line.starts_with("POST /v3/auth/tokens ") {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_string()
            } else if user["name"] != KS_USER || user["password"] != KS_PASSWORD {
                let e = r#"{"error": {"code": 401, "message": "The request you have made requires authentication.", "title": "Unauthorized"}}"#;
                format!(
                    "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{e}",
                    e.len()
                )
            } else if let Answer::Token(token) = planned {
                format!(
                    "HTTP/1.1 201 Created\r\nX-Subject-Token: {token}\r\n\
                     Content-Type: application/json\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{reply}",
                    reply.len()
                )
            } else {
                "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_string()
            };
            let _ = tcp.write_all(answer.as_bytes()).await;
            let _ = tcp.shutdown().await;
        }
    });
    Keystone { url, bodies, task }
}

fn keystone_config(url: &str, password: &str) -> SwiftConfig {
    SwiftConfig::new(SwiftAuth::Keystone {
        auth_url: url.to_string(),
        username: KS_USER.to_string(),
        password: Secret::new(password),
        project_name: "baremetal".to_string(),
        user_domain_name: "Default".to_string(),
        project_domain_name: "Default".to_string(),
        region: Some("RegionOne".to_string()),
        interface: "public".to_string(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keystone_v3_password_auth_reaches_swift() {
    let swift = SwiftPeer::start().expect("Swift starts (scripts/setup installs it)");
    let (token, storage_url) = swift.auth().expect("tempauth");
    let ks = keystone(vec![Answer::Token(token.clone())], storage_url.clone()).await;

    let store = SwiftStore::new(keystone_config(&ks.url, KS_PASSWORD)).expect("store");
    let path = ObjectPath::new("via-keystone", "image-node2");
    store
        .put(
            &path,
            ObjectBody::Bytes(b"floppy bytes".to_vec().into()),
            &PutOptions {
                delete_after: Some(Duration::from_secs(120)),
                metadata: BTreeMap::new(),
            },
        )
        .await
        .expect("put through the Keystone catalog's endpoint");
    let info = store.head(&path).await.expect("head");
    assert_eq!(info.size, 12);
    assert!(info.delete_at.is_some());
    let url = store
        .temp_url(&path, Duration::from_secs(60))
        .await
        .expect("temp URL");
    assert!(
        url.starts_with(&format!("{storage_url}/via-keystone/image-node2?")),
        "{url}"
    );
    assert_eq!(fetch(&url).await, (200, b"floppy bytes".to_vec()));
    assert!(store.delete(&path).await.expect("delete"));

    // One token request for all of it (the token is cached), in the documented shape.
    let bodies = ks.bodies.lock().expect("not poisoned").clone();
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    assert_eq!(
        bodies[0],
        serde_json::json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": KS_USER, "domain": {"name": "Default"}, "password": KS_PASSWORD}}},
            "scope": {"project": {"name": "baremetal", "domain": {"name": "Default"}}}
        }})
    );

    // A wrong password: Keystone's 401 is an auth error naming the URL.
    let refused = SwiftStore::new(keystone_config(&ks.url, "wrong")).expect("store");
    let err = refused.head(&path).await.expect_err("refused");
    assert!(matches!(err, ObjectError::Auth(_)), "{err}");
    assert!(err.to_string().contains("/v3/auth/tokens"), "{err}");
    assert!(
        !err.to_string().contains("wrong"),
        "the password leaked: {err}"
    );

    // Keystone answers 503 first (retried), then a token Swift refuses (401: authenticate
    // again), then a good one: the put goes through, with three token requests in all.
    let flaky = keystone(
        vec![
            Answer::Unavailable,
            Answer::Token("AUTH_tk00000000000000000000000000000000".to_string()),
            Answer::Token(token),
        ],
        storage_url.clone(),
    )
    .await;
    let store = SwiftStore::new(keystone_config(&flaky.url, KS_PASSWORD)).expect("store");
    store
        .put(
            &path,
            ObjectBody::Bytes(b"again".to_vec().into()),
            &PutOptions::default(),
        )
        .await
        .expect("put after a 503 and a refused token");
    assert_eq!(store.head(&path).await.expect("head").size, 5);
    assert_eq!(flaky.bodies.lock().expect("not poisoned").len(), 3);
    assert!(store.delete(&path).await.expect("delete"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_store_contract_on_real_swift_with_swifts_own_headers() {
    let swift = SwiftPeer::start().expect("Swift starts (scripts/setup installs it)");
    let store = SwiftStore::new(tempauth(&swift, KEY)).expect("store");
    vmdeploy_conductor::objects::testing::object_store_contract_suite(&store, "contract").await;

    // set_metadata as Swift records it: the count replaced, the other key gone, X-Delete-At
    // kept (a POST without it would have cleared it).
    let path = ObjectPath::new("contract", "raw-headers");
    store
        .put(
            &path,
            ObjectBody::Bytes(b"abc".to_vec().into()),
            &PutOptions {
                delete_after: Some(Duration::from_secs(300)),
                metadata: BTreeMap::from([
                    ("usage-count".to_string(), "1".to_string()),
                    ("other".to_string(), "x".to_string()),
                ]),
            },
        )
        .await
        .expect("put");
    let (_, before) = swift.raw_head(&path.url_path());
    let delete_at = before
        .iter()
        .find(|h| h.starts_with("X-Delete-At:"))
        .cloned()
        .unwrap_or_else(|| panic!("no X-Delete-At after a put with X-Delete-After: {before:?}"));
    store
        .set_metadata(
            &path,
            &BTreeMap::from([("usage-count".to_string(), "9".to_string())]),
        )
        .await
        .expect("set_metadata");
    let (status, after) = swift.raw_head(&path.url_path());
    assert_eq!(status, 200);
    assert!(
        after.iter().any(|h| h == "X-Object-Meta-Usage-Count: 9"),
        "{after:?}"
    );
    assert!(
        !after
            .iter()
            .any(|h| h.to_ascii_lowercase().starts_with("x-object-meta-other")),
        "{after:?}"
    );
    assert!(after.contains(&delete_at), "{delete_at} lost: {after:?}");
    assert!(store.delete(&path).await.expect("delete"));
}
