//! The image cache against a real HTTP server (in-process, counting GETs), real qcow2 files made
//! by `qemu-img`, and real sparse files.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

const MIB: usize = 1024 * 1024;

/// How the server answers one path.
#[derive(Clone)]
struct Route {
    body: Arc<Vec<u8>>,
    /// Wait this long after the headers before the body (lets concurrent callers pile up).
    delay: Duration,
    /// The first this many GETs send half the body, then close the connection.
    drop_first: usize,
}

impl Route {
    fn ok(body: Vec<u8>) -> Route {
        Route {
            body: Arc::new(body),
            delay: Duration::ZERO,
            drop_first: 0,
        }
    }
}

/// An HTTP/1.1 server on 127.0.0.1 with a GET counter per path.
struct Server {
    addr: std::net::SocketAddr,
    gets: Arc<std::sync::Mutex<HashMap<String, usize>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(routes: HashMap<&str, Route>) -> Server {
        let routes: Arc<HashMap<String, Route>> =
            Arc::new(routes.into_iter().map(|(k, v)| (k.to_owned(), v)).collect());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let gets: Arc<std::sync::Mutex<HashMap<String, usize>>> = Arc::default();
        let counter = gets.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let (routes, counter) = (routes.clone(), counter.clone());
                tokio::spawn(async move {
                    let mut req = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&req);
                    let path = line.split(' ').nth(1).unwrap_or("/").to_owned();
                    let nth = {
                        let mut gets = counter.lock().expect("counter");
                        let n = gets.entry(path.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    let Some(route) = routes.get(&path) else {
                        let _ = sock
                            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                            .await;
                        return;
                    };
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        route.body.len()
                    );
                    if sock.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(route.delay).await;
                    let body: &[u8] = if nth <= route.drop_first {
                        &route.body[..route.body.len() / 2]
                    } else {
                        &route.body
                    };
                    let _ = sock.write_all(body).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        Server { addr, gets, task }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn gets(&self, path: &str) -> usize {
        self.gets
            .lock()
            .expect("counter")
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn policy() -> FetchPolicy {
    FetchPolicy {
        attempts: 2,
        connect_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(5),
        retry_delay: Duration::from_millis(10),
        extra_ca_pem: None,
    }
}

fn open(dir: &Path, limit: u64) -> Arc<ImageCache> {
    ImageCache::open_with(dir.join("images"), limit, policy()).expect("open the cache")
}

/// Non-zero pseudo-random bytes (no zero block, so nothing of it becomes a hole).
fn noise(len: usize, seed: u8) -> Vec<u8> {
    let mut x = u32::from(seed).wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as u8) | 1
        })
        .collect()
}

/// A raw disk image: 1 MiB of data, an 8 MiB zero hole, 1 MiB of data.
fn raw_image() -> Vec<u8> {
    let mut img = noise(MIB, 1);
    img.resize(9 * MIB, 0);
    img.extend_from_slice(&noise(MIB, 2));
    img
}

fn sha256(data: &[u8]) -> ExpectedDigest {
    ExpectedDigest::new(HashAlgo::Sha256, &hex::encode(Sha256::digest(data))).expect("valid digest")
}

fn read(path: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut v))
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    v
}

/// Files in the cache directory and in its tmp/, by name.
fn listing(dir: &Path) -> (Vec<String>, Vec<String>) {
    let names = |d: PathBuf| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&d)
            .unwrap_or_else(|e| panic!("listing {}: {e}", d.display()))
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let top = names(dir.to_path_buf())
        .into_iter()
        .filter(|n| n != TMP_DIR)
        .collect();
    (top, names(dir.join(TMP_DIR)))
}

/// `qemu-img convert -O qcow2` of `raw` into a file; fails with a fix hint when it is missing.
fn make_qcow2(dir: &Path, raw: &[u8]) -> Vec<u8> {
    let (src, dst) = (dir.join("src.raw"), dir.join("src.qcow2"));
    std::fs::write(&src, raw).expect("write the raw image");
    let out = std::process::Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap_or_else(|e| {
            panic!("running qemu-img: {e} (install it: apt-get install qemu-utils)")
        });
    assert!(
        out.status.success(),
        "qemu-img convert failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    read(&dst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_image_is_cached_once_sparse_and_verified() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = raw_image();
    let server = Server::start(HashMap::from([("/raw.img", Route::ok(img.clone()))])).await;
    let cache = open(tmp.path(), 1 << 30);
    let source = ImageSource::new(
        "http://x/raw.img",
        server.url("/raw.img"),
        Some(sha256(&img)),
    );

    let got = cache.get(&source).await.expect("get");
    assert_eq!(got.size, img.len() as u64);
    assert_eq!(got.format_in, ImageFormat::Raw);
    assert!(got.verified);
    assert_eq!(got.digest, sha256(&img));
    assert!(
        read(&got.path) == img,
        "the cached image differs from the served one"
    );
    // The 8 MiB hole is not on disk, and data_ranges skips it.
    let allocated = sparse::allocated_bytes(&File::open(&got.path).expect("open")).expect("stat");
    assert!(
        allocated < (img.len() - 7 * MIB) as u64,
        "{allocated} bytes allocated for {} with an 8 MiB hole",
        img.len()
    );
    let ranges = got.data_ranges().expect("ranges");
    let covered: u64 = ranges.iter().map(|r| r.1).sum();
    assert!(covered <= 3 * MIB as u64, "{ranges:?}");
    assert!(
        ranges
            .iter()
            .all(|(s, l)| *s + l <= MIB as u64 || *s >= 9 * MIB as u64),
        "{ranges:?}"
    );
    assert_eq!(ranges.first().map(|r| r.0), Some(0));

    // A second get is a hit: same file, no new GET.
    let again = cache.get(&source).await.expect("second get");
    assert_eq!(again.path, got.path);
    assert_eq!(server.gets("/raw.img"), 1);
    assert_eq!(cache.total_size(), img.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qcow2_is_converted_to_the_identical_raw_image() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = raw_image();
    let qcow2 = make_qcow2(tmp.path(), &img);
    assert!(vmdeploy_shared::qcow2::is_qcow2(&qcow2));
    let md5 = ExpectedDigest::new(HashAlgo::Md5, &hex::encode(md5_of(&qcow2))).expect("md5");
    let server = Server::start(HashMap::from([("/img.qcow2", Route::ok(qcow2))])).await;
    let cache = open(tmp.path(), 1 << 30);
    let source = ImageSource::new(
        "http://x/img.qcow2",
        server.url("/img.qcow2"),
        Some(md5.clone()),
    );
    let got = cache.get(&source).await.expect("get");
    assert_eq!(got.format_in, ImageFormat::Qcow2);
    assert_eq!(got.size, img.len() as u64);
    assert_eq!(got.digest, md5);
    // Byte-identical to the original raw image, as `cmp` sees it.
    let status = std::process::Command::new("cmp")
        .arg(&got.path)
        .arg(tmp.path().join("src.raw"))
        .status()
        .expect("running cmp (diffutils)");
    assert!(status.success(), "cmp: the converted image differs");
    let ranges = got.data_ranges().expect("ranges");
    let covered: u64 = ranges.iter().map(|r| r.1).sum();
    assert!(
        covered <= 3 * MIB as u64,
        "the hole was written: {ranges:?}"
    );
    // Only the raw entry and its record remain; the qcow2 download is gone.
    let (top, tmpdir) = listing(cache.dir());
    assert_eq!(top.len(), 2, "{top:?}");
    assert!(tmpdir.is_empty(), "{tmpdir:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qcow2_whose_l1_table_lies_past_its_end_is_refused_and_not_cached() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut qcow2 = make_qcow2(tmp.path(), &raw_image());
    // l1_size (header offset 36) forged to a million entries: an 8 MB table in a small file.
    qcow2[36..40].copy_from_slice(&1_000_000u32.to_be_bytes());
    let server = Server::start(HashMap::from([("/img.qcow2", Route::ok(qcow2))])).await;
    let cache = open(tmp.path(), 1 << 30);
    let source = ImageSource::new("http://x/img.qcow2", server.url("/img.qcow2"), None);
    let err = cache.get(&source).await.expect_err("a corrupt qcow2");
    match &err {
        ImageCacheError::UnsupportedFormat { reason, .. } => {
            assert!(reason.contains("past the image's end"), "{reason}")
        }
        other => panic!("expected UnsupportedFormat, got {other:?}"),
    }
    assert!(!cache.contains(&source.key));
    assert_eq!(listing(cache.dir()), (vec![], vec![]), "nothing is left");
}

fn md5_of(data: &[u8]) -> Vec<u8> {
    let mut h = vmdeploy_shared::io::hash::Hasher::new(HashAlgo::Md5);
    h.update(data);
    hex::decode(h.finalize_hex()).expect("hex")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_checksum_names_both_sums_and_caches_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = raw_image();
    let server = Server::start(HashMap::from([("/raw.img", Route::ok(img.clone()))])).await;
    let cache = open(tmp.path(), 1 << 30);
    let wrong = sha256(b"another image");
    let source = ImageSource::new(
        "http://x/raw.img",
        server.url("/raw.img"),
        Some(wrong.clone()),
    );
    let err = cache.get(&source).await.expect_err("checksum mismatch");
    let actual = sha256(&img).hex;
    match &err {
        ImageCacheError::ChecksumMismatch {
            expected,
            actual: a,
            ..
        } => {
            assert_eq!(*expected, wrong.hex);
            assert_eq!(*a, actual);
        }
        other => panic!("expected a checksum mismatch, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(&wrong.hex) && text.contains(&actual),
        "{text}"
    );
    assert!(!cache.contains(&source.key));
    assert_eq!(listing(cache.dir()), (vec![], vec![]));
    // Not remembered as a failure: the next get downloads again.
    assert!(cache.get(&source).await.is_err());
    assert_eq!(server.gets("/raw.img"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_gets_share_one_download() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = raw_image();
    let mut route = Route::ok(img.clone());
    route.delay = Duration::from_millis(300);
    let server = Server::start(HashMap::from([("/raw.img", route)])).await;
    let cache = open(tmp.path(), 1 << 30);
    let source = ImageSource::new(
        "http://x/raw.img",
        server.url("/raw.img"),
        Some(sha256(&img)),
    );
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (cache, source) = (cache.clone(), source.clone());
        tasks.push(tokio::spawn(async move { cache.get(&source).await }));
    }
    let mut paths = Vec::new();
    for t in tasks {
        paths.push(t.await.expect("join").expect("get").path.clone());
    }
    assert_eq!(server.gets("/raw.img"), 1, "one HTTP GET for ten callers");
    assert!(paths.iter().all(|p| *p == paths[0]), "{paths:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_gets_of_a_failing_download_all_fail() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = raw_image();
    let mut route = Route::ok(img);
    route.delay = Duration::from_millis(300);
    let server = Server::start(HashMap::from([("/raw.img", route)])).await;
    let cache = open(tmp.path(), 1 << 30);
    let source = ImageSource::new(
        "http://x/raw.img",
        server.url("/raw.img"),
        Some(sha256(b"no")),
    );
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let (cache, source) = (cache.clone(), source.clone());
        tasks.push(tokio::spawn(async move { cache.get(&source).await }));
    }
    for t in tasks {
        let err = t.await.expect("join").expect_err("all fail");
        assert!(
            matches!(err, ImageCacheError::ChecksumMismatch { .. }),
            "{err}"
        );
    }
    assert_eq!(server.gets("/raw.img"), 1);
    assert_eq!(listing(cache.dir()), (vec![], vec![]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_recently_used_is_evicted_unless_leased() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let names = ["/a", "/b", "/c", "/d", "/e", "/f"];
    let routes = names
        .iter()
        .enumerate()
        .map(|(i, n)| (*n, Route::ok(noise(MIB, i as u8 + 10))))
        .collect();
    let server = Server::start(routes).await;
    // Room for three 1 MiB images.
    let cache = open(tmp.path(), 3 * MIB as u64);
    let src = |n: &str| ImageSource::new(n, server.url(n), None);

    let a = cache.get(&src("/a")).await.expect("a"); // leased throughout the first round
    drop(cache.get(&src("/b")).await.expect("b"));
    drop(cache.get(&src("/c")).await.expect("c"));
    // d needs room: a is the least recently used but leased, so b goes.
    drop(cache.get(&src("/d")).await.expect("d"));
    assert!(cache.contains(&src("/a").key), "a leased, kept");
    assert!(!cache.contains(&src("/b").key), "b evicted");
    assert!(cache.contains(&src("/c").key) && cache.contains(&src("/d").key));
    // Released, a is now the least recently used: e evicts it, not c or d.
    drop(a);
    drop(cache.get(&src("/e")).await.expect("e"));
    assert!(!cache.contains(&src("/a").key), "a evicted once released");
    for n in ["/c", "/d", "/e"] {
        assert!(cache.contains(&src(n).key), "{n} kept");
    }
    assert_eq!(cache.total_size(), 3 * MIB as u64);
    // The evicted files are gone from the disk too: three entries, two files each.
    assert_eq!(listing(cache.dir()).0.len(), 6);
    // A hit refreshes the order: c used again, so f evicts d, the least recently used now.
    drop(cache.get(&src("/c")).await.expect("c again"));
    assert_eq!(server.gets("/c"), 1, "a hit downloads nothing");
    drop(cache.get(&src("/f")).await.expect("f"));
    assert!(!cache.contains(&src("/d").key), "d evicted");
    for n in ["/c", "/e", "/f"] {
        assert!(cache.contains(&src(n).key), "{n} kept");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_larger_than_the_limit_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = raw_image();
    let qcow2 = make_qcow2(tmp.path(), &img);
    let server = Server::start(HashMap::from([
        ("/raw.img", Route::ok(img.clone())),
        ("/img.qcow2", Route::ok(qcow2)),
    ]))
    .await;
    // Smaller than the raw image (11 MiB), larger than the qcow2 file (~2 MiB).
    let cache = open(tmp.path(), 4 * MIB as u64);
    for path in ["/raw.img", "/img.qcow2"] {
        let err = cache
            .get(&ImageSource::new(path, server.url(path), None))
            .await
            .expect_err("too large");
        match err {
            ImageCacheError::TooLarge { limit, size, .. } => {
                assert_eq!(limit, 4 * MIB as u64);
                assert!(size > limit, "{path}: {size}");
            }
            other => panic!("{path}: expected TooLarge, got {other}"),
        }
    }
    assert_eq!(listing(cache.dir()), (vec![], vec![]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_complete_entries_and_drops_partial_ones() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = raw_image();
    let server = Server::start(HashMap::from([("/raw.img", Route::ok(img.clone()))])).await;
    let source = ImageSource::new(
        "http://x/raw.img",
        server.url("/raw.img"),
        Some(sha256(&img)),
    );
    let path = {
        let cache = open(tmp.path(), 1 << 30);
        cache.get(&source).await.expect("get").path.clone()
    };
    let dir = tmp.path().join("images");
    // Leftovers of a crash: a partial download, a raw file without its record, a record whose
    // image was cut short.
    std::fs::write(dir.join(TMP_DIR).join("x.download"), b"partial").expect("write");
    std::fs::write(dir.join("stray.raw"), b"no record").expect("write");
    let short = entry_name("short");
    std::fs::write(dir.join(format!("{short}.raw")), b"cut").expect("write");
    let record = Record {
        key: "short".into(),
        size: 100,
        format_in: ImageFormat::Raw,
        digest: sha256(b"x").to_string(),
        verified: false,
    };
    std::fs::write(
        dir.join(format!("{short}.json")),
        serde_json::to_vec(&record).expect("json"),
    )
    .expect("write");

    let cache = open(tmp.path(), 1 << 30);
    assert!(cache.contains(&source.key));
    assert!(!cache.contains("short"));
    let (top, tmpdir) = listing(&dir);
    assert_eq!(top.len(), 2, "only the complete entry is left: {top:?}");
    assert!(tmpdir.is_empty(), "{tmpdir:?}");
    let got = cache.get(&source).await.expect("hit after restart");
    assert_eq!(got.path, path);
    assert!(read(&got.path) == img);
    assert_eq!(
        server.gets("/raw.img"),
        1,
        "no new download after the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_mid_body_is_retried_or_fails_cleanly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = raw_image();
    let mut once = Route::ok(img.clone());
    once.drop_first = 1;
    let mut always = Route::ok(img.clone());
    always.drop_first = usize::MAX;
    let server = Server::start(HashMap::from([("/once", once), ("/always", always)])).await;
    let cache = open(tmp.path(), 1 << 30);

    let got = cache
        .get(&ImageSource::new(
            "once",
            server.url("/once"),
            Some(sha256(&img)),
        ))
        .await
        .expect("the retry succeeds");
    assert!(read(&got.path) == img);
    assert_eq!(server.gets("/once"), 2);

    let err = cache
        .get(&ImageSource::new("always", server.url("/always"), None))
        .await
        .expect_err("every attempt breaks");
    match &err {
        ImageCacheError::Fetch { attempts, .. } => assert_eq!(*attempts, 2),
        other => panic!("expected Fetch, got {other}"),
    }
    assert_eq!(server.gets("/always"), 2);
    assert!(!cache.contains("always"));
    assert!(listing(cache.dir()).1.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_unsupported_and_local_sources() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut gz = vec![0x1f, 0x8b, 8, 0];
    gz.extend_from_slice(&noise(4096, 3));
    let server = Server::start(HashMap::from([("/img.gz", Route::ok(gz))])).await;
    let cache = open(tmp.path(), 1 << 30);

    let err = cache
        .get(&ImageSource::new(
            "m",
            server.url("/missing?temp_url_sig=s3cret&temp_url_expires=1"),
            None,
        ))
        .await
        .expect_err("404");
    assert!(matches!(err, ImageCacheError::NotFound { .. }), "{err}");
    assert!(
        !err.to_string().contains("s3cret"),
        "the signature leaks: {err}"
    );
    let err = cache
        .get(&ImageSource::new("g", server.url("/img.gz"), None))
        .await
        .expect_err("gzip");
    assert!(
        matches!(err, ImageCacheError::UnsupportedFormat { .. }),
        "{err}"
    );
    let err = cache
        .get(&ImageSource::new("s", "swift://c/o", None))
        .await
        .expect_err("swift");
    assert!(
        matches!(err, ImageCacheError::UnsupportedUrl { .. }),
        "{err}"
    );
    let err = cache
        .get(&ImageSource::new("f", "file:///nonexistent/img.raw", None))
        .await
        .expect_err("no file");
    assert!(matches!(err, ImageCacheError::NotFound { .. }), "{err}");

    // A local file: cached like a download, with its sha256 reported.
    let img = raw_image();
    let file = tmp.path().join("local.img");
    std::fs::File::create(&file)
        .and_then(|mut f| f.write_all(&img))
        .expect("write");
    let url = url::Url::from_file_path(&file)
        .expect("file URL")
        .to_string();
    let got = cache
        .get(&ImageSource::new(&url, url.clone(), None))
        .await
        .expect("file://");
    assert!(!got.verified);
    assert_eq!(got.digest, sha256(&img));
    assert!(read(&got.path) == img);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_server_times_out_after_bounded_attempts() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut stalled = Route::ok(raw_image());
    stalled.delay = Duration::from_secs(60);
    let server = Server::start(HashMap::from([("/stalled", stalled)])).await;
    let cache = ImageCache::open_with(
        tmp.path().join("images"),
        1 << 30,
        FetchPolicy {
            read_timeout: Duration::from_millis(300),
            ..policy()
        },
    )
    .expect("open");
    let started = std::time::Instant::now();
    let err = cache
        .get(&ImageSource::new("stalled", server.url("/stalled"), None))
        .await
        .expect_err("stalls");
    assert!(
        matches!(err, ImageCacheError::Fetch { attempts: 2, .. }),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.gets("/stalled"), 2);
    assert_eq!(listing(cache.dir()), (vec![], vec![]));
}
