//! What the black-box tests of `vmdeploy-conductor serve` share: starting the built binary,
//! reading its log, signals, and small helpers.
#![allow(dead_code)] // each test binary uses its own share

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_vmdeploy-conductor");
/// How long a start may take before the test gives up (debug build, loaded machine).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `serve`, killed on drop.
pub struct Conductor {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    pub log: Vec<String>,
    pub url: Option<String>,
}

impl Conductor {
    /// Starts `serve` with `args` and env `STATE_DIRECTORY=state`, and waits for the `serving`
    /// line. Panics with the log when it exits first or takes too long.
    pub fn start(args: &[&str], state: &Path) -> Conductor {
        Conductor::start_from(Command::new(BIN), args, state)
    }

    /// [`Conductor::start`] with `config` written to `dir/conductor.toml` and the state in
    /// `dir/state`.
    pub fn with_config(dir: &Path, config: &str) -> Conductor {
        let file = write(dir, "conductor.toml", config);
        Conductor::start(
            &["--config", file.to_str().expect("a UTF-8 temp path")],
            &dir.join("state"),
        )
    }

    /// [`Conductor::start`] with the soft open-files limit at `soft` (the hard one kept), as
    /// a shell or a unit without `LimitNOFILE=` starts it.
    pub fn start_with_open_files(args: &[&str], state: &Path, soft: u64) -> Conductor {
        use std::os::unix::process::CommandExt as _;
        let mut command = Command::new(BIN);
        // SAFETY: between fork and exec only async-signal-safe calls: getrlimit, setrlimit.
        unsafe {
            command.pre_exec(move || {
                let mut limit = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                limit.rlim_cur = soft.min(limit.rlim_max);
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Conductor::start_from(command, args, state)
    }

    pub fn start_from(mut command: Command, args: &[&str], state: &Path) -> Conductor {
        let mut child = command
            .arg("serve")
            .args(args)
            .env("STATE_DIRECTORY", state)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {BIN}: {e} (cargo builds it for this test)"));
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut conductor = Conductor {
            child,
            lines: rx,
            log: Vec::new(),
            url: None,
        };
        conductor.wait_for("serving", START_TIMEOUT);
        conductor
    }

    /// Reads log lines until one contains `needle`; panics with the log when the process ends
    /// or `timeout` passes first.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(line) => {
                    if self.url.is_none() && line.contains("API listening") {
                        self.url = field(&line, "url");
                    }
                    self.log.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "no log line with {needle:?} within {timeout:?}; log so far:\n{}",
                    self.log.join("\n")
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().ok();
                    panic!(
                        "serve exited ({status:?}) before logging {needle:?}; log:\n{}\n\
                         hint: on a branch without the store and object store merged, serve \
                         stops at service::open_store / open_object_store",
                        self.log.join("\n")
                    )
                }
            }
        }
    }

    /// Takes every log line written so far into [`Conductor::log`] (without waiting).
    pub fn drain(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.log.push(line);
        }
        &self.log
    }

    pub fn url(&self) -> String {
        self.url
            .clone()
            .unwrap_or_else(|| panic!("no 'API listening' line:\n{}", self.log.join("\n")))
    }

    /// SIGTERM, then the exit status and the rest of the log.
    pub fn terminate(mut self) -> (ExitStatus, Vec<String>) {
        signal(&self.child, "TERM");
        let deadline = Instant::now() + Duration::from_secs(40);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("waiting for serve") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "serve did not exit within 40 s of SIGTERM; log:\n{}",
                self.log.join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.log.push(line);
        }
        (status, std::mem::take(&mut self.log))
    }
}

impl Drop for Conductor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .expect("running kill(1) (procps)");
    assert!(status.success(), "kill -{name} failed");
}

/// The value of `key=value` in a human log line.
pub fn field(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    let rest = &line[start..];
    let end = rest.find(' ').unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"').to_string())
}

pub fn client() -> reqwest::Client {
    vmdeploy_conductor::service::tls::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("an HTTP client")
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}

/// Holds port 6385 against other test runs on this machine (flock, dropped with the holder).
pub fn lock_default_port() -> std::fs::File {
    let path = std::env::temp_dir().join("vmdeploy-test-port-6385.lock");
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    file.lock()
        .unwrap_or_else(|e| panic!("locking {}: {e}", path.display()));
    file
}
