//! A real OpenStack Swift (from PyPI, in the venv) on loopback: one replica, tempauth + tempurl,
//! memcached for tempauth. Facts: `docs/iscsi-and-swift-peers.md` §5.
//!
//! [`SwiftPeer::start`] lays out rings and configuration in a temporary directory, starts
//! memcached and the four servers on free ports, and waits for the proxy's healthcheck; dropping
//! the peer stops every process it started.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::child::ChildGuard;
use crate::{free_port, venv_bin};

/// The tempauth account the peer is set up with.
pub const USER: &str = "test:tester";
/// Its key.
pub const KEY: &str = "testing";

/// A running Swift.
pub struct SwiftPeer {
    children: Vec<(String, ChildGuard)>,
    /// The proxy's base URL, `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// The proxy's port.
    pub proxy_port: u16,
    /// The object, container and account servers' ports, which readiness probes one by one.
    backends: Vec<(&'static str, u16)>,
    dir: tempfile::TempDir,
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Swift's servers refuse every write with 507 Insufficient Storage while less than
/// `fallocate_reserve` of the disk is free, and its default is 1% of the whole disk: 2.5 GB on
/// a 252 GB CI disk, far more than a test's few megabytes need. A CI run on a nearly full
/// machine failed every Swift test within seconds, as this reserve would, so the test servers
/// keep none; a disk with truly no room still fails the write, with ENOSPC in the server's log.
const FALLOCATE_RESERVE: &str = "fallocate_reserve = 0\n";

fn server_conf(etc: &Path, node: &Path, port: u16, kind: &str) -> String {
    format!(
        "[DEFAULT]\nbind_ip = 127.0.0.1\nbind_port = {port}\nworkers = 0\nuser = root\n\
         swift_dir = {etc}\ndevices = {node}\nmount_check = false\nlog_level = INFO\n\
         {FALLOCATE_RESERVE}\n\
         [pipeline:main]\npipeline = {kind}-server\n\n[app:{kind}-server]\nuse = egg:swift#{kind}\n",
        etc = etc.display(),
        node = node.display(),
    )
}

impl SwiftPeer {
    /// Starts Swift; fails with the servers' logs when it does not come up within 60 s.
    pub fn start() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("making the Swift directory")?;
        let etc = dir.path().join("etc");
        let node = dir.path().join("srv/node");
        let logs = dir.path().join("log");
        for d in [&etc, &node.join("d1"), &logs] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let memcached_port = free_port();
        let (object, container, account, proxy) =
            (free_port(), free_port(), free_port(), free_port());

        write(
            &etc.join("swift.conf"),
            "[swift-hash]\nswift_hash_path_suffix = vmdeploy-test\nswift_hash_path_prefix = vmdeploy\n\n\
             [storage-policy:0]\nname = Policy-0\ndefault = yes\n",
        )?;
        let ring_builder = venv_bin("swift-ring-builder");
        for (kind, port) in [
            ("object", object),
            ("container", container),
            ("account", account),
        ] {
            let builder = etc.join(format!("{kind}.builder"));
            let dev = format!("r1z1-127.0.0.1:{port}/d1");
            for args in [
                vec!["create", "6", "1", "1"],
                vec!["add", dev.as_str(), "1"],
                vec!["rebalance"],
            ] {
                let out = Command::new(&ring_builder)
                    .arg(&builder)
                    .args(&args)
                    .output()
                    .context("running swift-ring-builder")?;
                // rebalance exits 1 with a warning on a one-device ring; the ring file is what counts.
                if !out.status.success() && args[0] != "rebalance" {
                    bail!(
                        "swift-ring-builder {args:?} failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
            let ring = etc.join(format!("{kind}.ring.gz"));
            if !ring.exists() {
                bail!("swift-ring-builder made no {}", ring.display());
            }
            write(
                &etc.join(format!("{kind}-server.conf")),
                &server_conf(&etc, &node, port, kind),
            )?;
        }
        let mut proxy_conf = String::new();
        let _ = write!(
            proxy_conf,
            "[DEFAULT]\nbind_ip = 127.0.0.1\nbind_port = {proxy}\nworkers = 0\nuser = root\n\
             swift_dir = {etc}\nlog_level = INFO\n{FALLOCATE_RESERVE}\n\
             [pipeline:main]\npipeline = catch_errors gatekeeper healthcheck proxy-logging cache \
             listing_formats tempurl tempauth proxy-logging proxy-server\n\n\
             [app:proxy-server]\nuse = egg:swift#proxy\naccount_autocreate = true\n\n\
             [filter:tempauth]\nuse = egg:swift#tempauth\nuser_test_tester = {KEY} .admin\n\n\
             [filter:tempurl]\nuse = egg:swift#tempurl\n\n\
             [filter:cache]\nuse = egg:swift#memcache\nmemcache_servers = 127.0.0.1:{memcached_port}\n\n\
             [filter:catch_errors]\nuse = egg:swift#catch_errors\n\n\
             [filter:gatekeeper]\nuse = egg:swift#gatekeeper\n\n\
             [filter:healthcheck]\nuse = egg:swift#healthcheck\n\n\
             [filter:proxy-logging]\nuse = egg:swift#proxy_logging\n\n\
             [filter:listing_formats]\nuse = egg:swift#listing_formats\n",
            etc = etc.display(),
        );
        write(&etc.join("proxy-server.conf"), &proxy_conf)?;

        let mut peer = SwiftPeer {
            children: Vec::new(),
            base_url: format!("http://127.0.0.1:{proxy}"),
            proxy_port: proxy,
            backends: vec![
                ("object", object),
                ("container", container),
                ("account", account),
            ],
            dir,
        };
        let log = |name: &str| -> anyhow::Result<Stdio> {
            let file = std::fs::File::create(logs.join(format!("{name}.log")))
                .context("creating a Swift log")?;
            Ok(Stdio::from(file))
        };
        let memcached = Command::new("memcached")
            .args(["-l", "127.0.0.1", "-U", "0", "-u", "root", "-m", "16", "-p"])
            .arg(memcached_port.to_string())
            .stdout(log("memcached")?)
            .stderr(log("memcached.err")?)
            .spawn()
            .context("starting memcached (scripts/setup installs it)")?;
        peer.children
            .push(("memcached".into(), ChildGuard::new(memcached)));
        for kind in ["object", "container", "account", "proxy"] {
            let child = Command::new(venv_bin(&format!("swift-{kind}-server")))
                .arg(etc.join(format!("{kind}-server.conf")))
                .arg("-v")
                .stdout(log(kind)?)
                .stderr(log(&format!("{kind}.err"))?)
                .spawn()
                .with_context(|| format!("starting swift-{kind}-server"))?;
            peer.children.push((kind.into(), ChildGuard::new(child)));
        }
        peer.wait_ready(Duration::from_secs(60))?;
        Ok(peer)
    }

    fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        let url = format!("{}/healthcheck", self.base_url);
        loop {
            let exited =
                self.children
                    .iter_mut()
                    .find_map(|(name, child)| match child.try_wait() {
                        Ok(Some(status)) => Some(format!("{name} exited with {status}")),
                        _ => None,
                    });
            if let Some(exited) = exited {
                bail!("{exited}:\n{}", self.logs());
            }
            let ok = Command::new("curl")
                .args(["-sf", "-o", "/dev/null", "--max-time", "2", &url])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            // The proxy (and tempauth, which lives in it) answers before the backends have
            // loaded their apps; a request then gets 503 from the proxy. On a loaded machine the
            // account server came up seconds late and a container PUT failed, so each backend
            // must answer HTTP itself (any status: a bare `/` is a 400 from a loaded app).
            if ok
                && self.auth().is_ok()
                && self.backends.iter().all(|&(_, port)| answers_http(port))
            {
                return Ok(());
            }
            if start.elapsed() > limit {
                bail!("Swift did not come up within {limit:?}:\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The servers' logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        if let Ok(entries) = std::fs::read_dir(self.dir.path().join("log")) {
            for entry in entries.flatten() {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                let tail: String = text
                    .lines()
                    .rev()
                    .take(20)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                let _ = writeln!(all, "--- {}\n{tail}", entry.path().display());
            }
        }
        all
    }

    /// A raw `HEAD` of `path` under the account's storage URL (`/<container>/<object>`) with a
    /// token, by curl: the status and the header lines exactly as Swift wrote them (names not
    /// folded to lower case), an oracle that is not our Swift client.
    pub fn raw_head(&self, path: &str) -> (u16, Vec<String>) {
        let (token, storage_url) = self.auth().expect("tempauth");
        let out = Command::new("curl")
            .args(["-s", "--max-time", "10", "-I", "-H"])
            .arg(format!("X-Auth-Token: {token}"))
            .arg(format!("{storage_url}{path}"))
            .output()
            .expect("curl runs (fix: apt-get install curl)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = text.lines().map(|l| l.trim_end().to_string());
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1).and_then(|s| s.parse().ok()))
            .unwrap_or_else(|| panic!("curl printed no status line: {text:?}"));
        (status, lines.filter(|l| !l.is_empty()).collect())
    }

    /// Authenticates with tempauth: `(token, storage URL)`.
    pub fn auth(&self) -> anyhow::Result<(String, String)> {
        let out = Command::new("curl")
            .args(["-s", "-D", "-", "-o", "/dev/null", "--max-time", "5"])
            .args(["-H", &format!("X-Auth-User: {USER}")])
            .args(["-H", &format!("X-Auth-Key: {KEY}")])
            .arg(format!("{}/auth/v1.0", self.base_url))
            .output()
            .context("running curl")?;
        let headers = String::from_utf8_lossy(&out.stdout);
        let header = |name: &str| {
            headers.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
        };
        match (header("x-auth-token"), header("x-storage-url")) {
            (Some(token), Some(url)) => Ok((token, url)),
            _ => bail!("tempauth gave no token: {headers}"),
        }
    }

    /// The temporary directory holding the peer's files.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

/// Whether a server on loopback `port` gives any HTTP answer to `GET /`.
fn answers_http(port: u16) -> bool {
    Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "2",
        ])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .map(|out| {
            let code = String::from_utf8_lossy(&out.stdout);
            !code.trim().is_empty() && code.trim() != "000"
        })
        .unwrap_or(false)
}
