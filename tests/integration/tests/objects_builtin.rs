//! The conductor's built-in object store, started in-process over TLS on a free port: objects
//! put through the `ObjectStore` trait are fetched through their temp URLs by reqwest and by
//! curl (an independent client) byte for byte, ranges answer as iLO and QEMU expect, bad or
//! expired signatures get Swift's 401, and objects with a TTL go on time, also across a
//! restart of the store on the same directory.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sha2::{Digest as _, Sha256};
use tokio::sync::watch;
use vmdeploy_conductor::objects::builtin::{BuiltinConfig, BuiltinStore};
use vmdeploy_conductor::objects::{ObjectBody, ObjectError, ObjectPath, ObjectStore, PutOptions};
use vmdeploy_shared::secret::Secret;
use vmdeploy_shared::tempurl::{self, TempUrlDigest, TempUrlKey};

const KEY: &str = "builtin-test-temp-url-key";

fn tls() -> Arc<rustls::ServerConfig> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("generating a test certificate");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
        cert.signing_key.serialize_der(),
    ));
    Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .expect("a valid test certificate"),
    )
}

struct Running {
    store: Arc<BuiltinStore>,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
}

async fn start(root: &Path) -> Running {
    let (stop, shutdown) = watch::channel(false);
    let (store, addr) = BuiltinStore::start(
        BuiltinConfig {
            root: root.to_path_buf(),
            listen: "127.0.0.1:0".parse().expect("address"),
            public_url: None,
            temp_url_key: Secret::new(KEY),
            tls: tls(),
        },
        shutdown,
    )
    .await
    .expect("the store starts");
    Running { store, addr, stop }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        // The store's certificate is generated; iLOs do not check it either (docs/architecture.md §6a).
        .danger_accept_invalid_certs(true)
        .no_proxy()
        .build()
        .expect("a client")
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// Bytes that differ at every offset, so a misplaced range shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from((i * 7 + i / 251) % 256).expect("below 256"))
        .collect()
}

fn header<'a>(reply: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    reply.headers().get(name).and_then(|v| v.to_str().ok())
}

async fn get(url: &str, range: Option<&str>) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let mut req = client().get(url);
    if let Some(r) = range {
        req = req.header("Range", r);
    }
    let reply = req.send().await.expect("the store answers");
    let status = reply.status().as_u16();
    let headers = reply.headers().clone();
    let body = reply.bytes().await.expect("a whole body").to_vec();
    (status, headers, body)
}

fn files_of(root: &Path, container: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join(container))
        .map(|rd| {
            rd.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// `curl -k` with the status and the body written to `out`.
fn curl(args: &[&str], out: &Path) -> u16 {
    let output = Command::new("curl")
        .args(["-s", "-k", "--max-time", "30", "-w", "%{http_code}", "-o"])
        .arg(out)
        .args(args)
        .output()
        .expect("curl runs (apt-get install curl)");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("curl prints the status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temp_urls_ranges_signatures_and_delete() {
    let dir = tempfile::tempdir().expect("temp dir");
    let running = start(dir.path()).await;
    let store = running.store.clone();
    let data = pattern(100_000);
    let path = ObjectPath::new("ironic_ilo_container", "image-node 1");
    let options = PutOptions {
        delete_after: Some(Duration::from_secs(600)),
        metadata: BTreeMap::from([("Usage-Count".to_string(), "1".to_string())]),
    };
    store
        .put(&path, ObjectBody::Bytes(data.clone().into()), &options)
        .await
        .expect("put");

    let info = store.head(&path).await.expect("head");
    assert_eq!(info.size, 100_000);
    assert_eq!(
        info.metadata.get("usage-count").map(String::as_str),
        Some("1")
    );
    let delete_at = info.delete_at.expect("a deletion time").unix_timestamp();
    let now_s = i64::try_from(now()).expect("fits");
    assert!(
        (now_s + 598..=now_s + 601).contains(&delete_at),
        "{delete_at} vs {now_s}"
    );

    let url = store
        .temp_url(&path, Duration::from_secs(300))
        .await
        .expect("temp URL");
    let base = format!(
        "https://{}/v1/AUTH_vmdeploy/ironic_ilo_container/image-node%201?",
        running.addr
    );
    assert!(url.starts_with(&base), "{url}");
    assert!(
        url.contains("temp_url_sig=") && url.contains("temp_url_expires="),
        "{url}"
    );

    // Whole object.
    let reply = client().get(&url).send().await.expect("GET");
    assert_eq!(reply.status().as_u16(), 200);
    assert_eq!(header(&reply, "accept-ranges"), Some("bytes"));
    assert_eq!(header(&reply, "content-length"), Some("100000"));
    let etag = format!("\"{}\"", hex::encode(Sha256::digest(&data)));
    assert_eq!(header(&reply, "etag"), Some(etag.as_str()));
    assert!(header(&reply, "last-modified").is_some_and(|v| v.ends_with(" GMT")));
    assert_eq!(reply.bytes().await.expect("body").as_ref(), data.as_slice());

    // HEAD: the length, no body.
    let reply = client().head(&url).send().await.expect("HEAD");
    assert_eq!(reply.status().as_u16(), 200);
    assert_eq!(header(&reply, "content-length"), Some("100000"));
    assert!(reply.bytes().await.expect("body").is_empty());

    // Ranges, as QEMU's curl driver and iLO read.
    let cases: &[(&str, usize, usize)] = &[
        ("bytes=0-511", 0, 511),
        ("bytes=4096-8191", 4096, 8191),
        ("bytes=99990-", 99_990, 99_999),
        ("bytes=-100", 99_900, 99_999),
        ("bytes=99999-200000", 99_999, 99_999),
    ];
    for (range, first, last) in cases {
        let (status, headers, body) = get(&url, Some(range)).await;
        assert_eq!(status, 206, "{range}");
        assert_eq!(
            headers.get("content-range").and_then(|v| v.to_str().ok()),
            Some(format!("bytes {first}-{last}/100000").as_str()),
            "{range}"
        );
        assert_eq!(body, &data[*first..=*last], "{range}");
    }
    for range in ["bytes=100000-", "bytes=200000-300000", "bytes=-0"] {
        let (status, headers, body) = get(&url, Some(range)).await;
        assert_eq!(status, 416, "{range}");
        assert_eq!(
            headers.get("content-range").and_then(|v| v.to_str().ok()),
            Some("bytes */100000"),
            "{range}"
        );
        assert!(body.is_empty());
    }
    // Several ranges: the whole object (documented choice).
    let (status, _, body) = get(&url, Some("bytes=0-1,10-11")).await;
    assert_eq!((status, body.len()), (200, 100_000));

    // Signatures from other clients: SHA-1 hex and SHA-512 base64 as Swift accepts them.
    let key = TempUrlKey::new(KEY);
    let signed = "/v1/AUTH_vmdeploy/ironic_ilo_container/image-node 1";
    let server = format!("https://{}", running.addr);
    let encoded = "/v1/AUTH_vmdeploy/ironic_ilo_container/image-node%201";
    for digest in [TempUrlDigest::Sha1, TempUrlDigest::Sha512] {
        let query = tempurl::query(&key, digest, "GET", now() + 60, signed).expect("signs");
        let (status, _, body) = get(&format!("{server}{encoded}?{query}"), None).await;
        assert_eq!((status, body.len()), (200, 100_000), "{digest:?}");
    }

    // Refused: tampered, for another object, expired, unsigned, wrong key.
    let sig_at = url.find("temp_url_sig=").expect("sig") + "temp_url_sig=".len();
    let flipped = if url.as_bytes()[sig_at] == b'0' {
        "1"
    } else {
        "0"
    };
    let tampered = format!("{}{flipped}{}", &url[..sig_at], &url[sig_at + 1..]);
    let other = url.replace("image-node%201", "image-node%202");
    let expired_q =
        tempurl::query(&key, TempUrlDigest::Sha256, "GET", now() - 5, signed).expect("signs");
    let wrong_key_q = tempurl::query(
        &TempUrlKey::new("not-the-key"),
        TempUrlDigest::Sha256,
        "GET",
        now() + 60,
        signed,
    )
    .expect("signs");
    for bad in [
        tampered,
        other,
        format!("{server}{encoded}?{expired_q}"),
        format!("{server}{encoded}"),
        format!("{server}{encoded}?{wrong_key_q}"),
    ] {
        let (status, _, _) = get(&bad, None).await;
        assert_eq!(status, 401, "{bad}");
    }
    // A good signature for an object that does not exist: 404.
    let missing = ObjectPath::new("ironic_ilo_container", "nothing-here");
    let missing_url = store
        .temp_url(&missing, Duration::from_secs(60))
        .await
        .expect("temp URL");
    assert_eq!(get(&missing_url, None).await.0, 404);
    // Only GET and HEAD.
    let reply = client().put(&url).body("x").send().await.expect("PUT");
    assert_eq!(reply.status().as_u16(), 405);

    // Delete: gone for the trait and for the URL; a second delete says so.
    assert!(store.delete(&path).await.expect("delete"));
    assert_eq!(get(&url, None).await.0, 404);
    assert!(!store.delete(&path).await.expect("second delete"));
    assert!(matches!(
        store.head(&path).await,
        Err(ObjectError::NotFound(p)) if p == path
    ));
    assert!(files_of(dir.path(), "ironic_ilo_container").is_empty());
    let _ = running.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20_mib_file_streams_and_curl_reads_ranges() {
    let dir = tempfile::tempdir().expect("temp dir");
    let running = start(&dir.path().join("objects")).await;
    let store = running.store.clone();
    let data = pattern(20 << 20);
    let source = dir.path().join("deploy.iso");
    std::fs::write(&source, &data).expect("writing the source file");
    let path = ObjectPath::new("vmdeploy", "isos/deploy.iso");
    store
        .put(
            &path,
            ObjectBody::File(source.clone()),
            &PutOptions::default(),
        )
        .await
        .expect("put of a file");
    assert_eq!(store.head(&path).await.expect("head").size, 20 << 20);
    let url = store
        .temp_url(&path, Duration::from_secs(60))
        .await
        .expect("temp URL");
    assert!(
        url.contains("/v1/AUTH_vmdeploy/vmdeploy/isos/deploy.iso?"),
        "{url}"
    );

    // reqwest, streamed chunk by chunk.
    let mut reply = client().get(&url).send().await.expect("GET");
    assert_eq!(reply.status().as_u16(), 200);
    let mut hasher = Sha256::new();
    let mut got = 0usize;
    while let Some(chunk) = reply.chunk().await.expect("a chunk") {
        hasher.update(&chunk);
        got += chunk.len();
    }
    assert_eq!(got, 20 << 20);
    assert_eq!(
        hasher.finalize().as_slice(),
        Sha256::digest(&data).as_slice()
    );

    // curl, an independent client: a range in the middle and the whole file.
    let out = dir.path().join("curl-range");
    assert_eq!(curl(&["--range", "1048576-2097151", &url], &out), 206);
    assert_eq!(
        std::fs::read(&out).expect("curl output"),
        &data[1_048_576..2_097_152]
    );
    let out = dir.path().join("curl-whole");
    assert_eq!(curl(&[&url], &out), 200);
    assert!(
        std::fs::read(&out).expect("curl output") == data,
        "curl's copy differs"
    );
    let _ = running.stop.send(true);
}

/// Waits until the object's files are gone; returns when that happened.
async fn wait_gone(root: &Path, container: &str, limit: Duration) -> Option<Instant> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if files_of(root, container).is_empty() {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_expire_on_time() {
    let dir = tempfile::tempdir().expect("temp dir");
    let running = start(dir.path()).await;
    let store = running.store.clone();
    let path = ObjectPath::new("ttl", "floppy");
    let ttl = Duration::from_secs(2);
    let put_at = Instant::now();
    store
        .put(
            &path,
            ObjectBody::Bytes(b"parameters".to_vec().into()),
            &PutOptions {
                delete_after: Some(ttl),
                metadata: BTreeMap::new(),
            },
        )
        .await
        .expect("put");
    let url = store
        .temp_url(&path, Duration::from_secs(60))
        .await
        .expect("temp URL");
    assert_eq!(get(&url, None).await.0, 200);
    let gone = wait_gone(dir.path(), "ttl", Duration::from_secs(10))
        .await
        .expect("the sweeper deletes the object");
    let after = gone.duration_since(put_at);
    // Not before its time, and promptly after: a loaded machine gets two seconds of slack,
    // far below the sweeper's longest sleep (60 s), so a polling sweeper would fail here.
    assert!(after >= ttl, "deleted after {after:?}, before the TTL");
    assert!(
        after < ttl + Duration::from_secs(2),
        "deleted after {after:?}"
    );
    assert_eq!(get(&url, None).await.0, 404);
    assert!(matches!(
        store.head(&path).await,
        Err(ObjectError::NotFound(_))
    ));
    let _ = running.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_object_is_not_served_before_the_sweep() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Two stores on one directory: `reader` never scheduled the object, so after its deadline
    // only the read path's own check keeps it from being served.
    let reader = start(dir.path()).await;
    let writer = start(dir.path()).await;
    let path = ObjectPath::new("ttl", "floppy");
    writer
        .store
        .put(
            &path,
            ObjectBody::Bytes(b"parameters".to_vec().into()),
            &PutOptions {
                delete_after: Some(Duration::from_secs(1)),
                metadata: BTreeMap::new(),
            },
        )
        .await
        .expect("put");
    let _ = writer.stop.send(true);
    let url = reader
        .store
        .temp_url(&path, Duration::from_secs(60))
        .await
        .expect("temp URL");
    assert_eq!(get(&url, None).await.0, 200);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        files_of(dir.path(), "ttl"),
        vec!["floppy.data", "floppy.json"],
        "nobody swept it"
    );
    assert_eq!(get(&url, None).await.0, 404);
    assert!(matches!(
        reader.store.head(&path).await,
        Err(ObjectError::NotFound(_))
    ));
    let _ = reader.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_survives_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = start(dir.path()).await;
    let put = |store: Arc<BuiltinStore>, name: &'static str, ttl: Option<u64>| async move {
        store
            .put(
                &ObjectPath::new(name, "object"),
                ObjectBody::Bytes(b"bytes".to_vec().into()),
                &PutOptions {
                    delete_after: ttl.map(Duration::from_secs),
                    metadata: BTreeMap::new(),
                },
            )
            .await
            .expect("put");
    };
    put(first.store.clone(), "short", Some(1)).await;
    let put_at = Instant::now();
    put(first.store.clone(), "long", Some(4)).await;
    put(first.store.clone(), "kept", None).await;
    // The conductor goes down before the first deadline.
    let _ = first.stop.send(true);
    drop(first);
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let second = start(dir.path()).await;
    // Past due while the store was down: deleted during start.
    assert!(
        files_of(dir.path(), "short").is_empty(),
        "past-due object kept"
    );
    assert_eq!(files_of(dir.path(), "long").len(), 2);
    let long = ObjectPath::new("long", "object");
    assert_eq!(second.store.head(&long).await.expect("head").size, 5);
    // Still due later: deleted on time by the new sweeper.
    let gone = wait_gone(dir.path(), "long", Duration::from_secs(10))
        .await
        .expect("the restarted store deletes it");
    let after = gone.duration_since(put_at);
    assert!(after >= Duration::from_secs(4), "deleted after {after:?}");
    assert!(after < Duration::from_secs(6), "deleted after {after:?}");
    assert_eq!(files_of(dir.path(), "kept").len(), 2);
    assert_eq!(
        second
            .store
            .head(&ObjectPath::new("kept", "object"))
            .await
            .expect("head")
            .delete_at,
        None
    );
    let _ = second.stop.send(true);
}

/// QEMU's curl block driver (what the emulator's virtual media and the QEMU end-to-end read
/// with) probes the object, checks `Accept-Ranges`, and reads it by range: the copy it makes
/// must be byte-exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_reads_an_object_by_range() {
    let dir = tempfile::tempdir().expect("temp dir");
    let running = start(&dir.path().join("objects")).await;
    // Not a multiple of QEMU's readahead or of a sector: the last range is a short one.
    let data = pattern((3 << 20) + 512 * 3);
    let path = ObjectPath::new("vmdeploy", "deploy.iso");
    running
        .store
        .put(
            &path,
            ObjectBody::Bytes(data.clone().into()),
            &PutOptions::default(),
        )
        .await
        .expect("put");
    let url = running
        .store
        .temp_url(&path, Duration::from_secs(120))
        .await
        .expect("temp URL");
    let source = serde_json::json!({"file": {"driver": "https", "url": url, "sslverify": false}});
    let out = dir.path().join("copy.raw");
    // `-m 1`: one read in flight, as from the emulator's CD drive (USB BOT or ATAPI carry one
    // command at a time). With convert's default of 8, two ranges can end in the same wake-up,
    // and QEMU 10.0's curl driver reaps one finished transfer per wake-up: qemu-img then waits
    // forever on the other (docs/qemu-and-boot.md §9).
    let convert = tokio::process::Command::new("qemu-img")
        .args(["convert", "-m", "1", "-f", "raw", "-O", "raw"])
        .arg(format!("json:{source}"))
        .arg(&out)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), convert)
        .await
        .expect("qemu-img convert finishes a 3 MiB copy within 60 s")
        .expect("qemu-img runs (apt-get install qemu-utils qemu-block-extra)");
    assert!(
        output.status.success(),
        "qemu-img convert failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        std::fs::read(&out).expect("the copy") == data,
        "QEMU's copy differs"
    );
    let _ = running.stop.send(true);
}
