//! Shared by the `ilo_emulator_*` tests (included with `#[path]`): starting the `ilo-emulator`
//! binary and an image HTTP server on loopback, and running a Python client script against them.
//! Compiled on its own as well, where it holds no tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub use vmdeploy_integration_tests::child::ChildGuard;
use vmdeploy_integration_tests::{bin, venv_bin, workspace_root};

/// How long a child may take to print its start-up lines.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads the child's stdout lines on a thread until `done` says stop; returns what it matched.
fn read_until<T: Send + 'static>(
    child: &mut Child,
    mut on_line: impl FnMut(&str, &mut Vec<T>) -> bool + Send + 'static,
) -> Vec<T> {
    let stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut found = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if on_line(&line, &mut found) {
                let _ = tx.send(found);
                // Keep draining so the child never blocks on a full pipe.
                found = Vec::new();
            }
        }
    });
    rx.recv_timeout(START_TIMEOUT)
        .expect("the child printed its start-up lines in time")
}

/// A running `ilo-emulator` with `servers` servers on ephemeral loopback ports.
pub struct EmulatorProcess {
    pub guard: ChildGuard,
    /// `127.0.0.1:PORT` of each server.
    pub addrs: Vec<String>,
    /// The self-signed certificate (SAN 127.0.0.1) the emulator wrote.
    pub cert: PathBuf,
    /// The emulator's log (tracing, one line per request and state change).
    pub log: PathBuf,
}

impl EmulatorProcess {
    /// The last lines of the emulator's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }
}

pub const USER: &str = "vmdeploy";
pub const PASSWORD: &str = "s3cret-pw";

impl EmulatorProcess {
    pub fn start(dir: &Path, servers: usize, extra: &[&str]) -> EmulatorProcess {
        let cert = dir.join("ilo-cert.pem");
        let log = dir.join("ilo-emulator.log");
        let log_file = std::fs::File::create(&log).expect("creating the emulator log");
        let child = Command::new(bin("ilo-emulator"))
            .args(["--listen", "127.0.0.1:0", "--servers", &servers.to_string()])
            .args(["--username", USER, "--password", PASSWORD])
            .arg("--cert-out")
            .arg(&cert)
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .expect("starting ilo-emulator");
        let mut child = ChildGuard::new(child);
        let addrs = read_until(&mut child, |line, found: &mut Vec<String>| {
            if let Some((_, url)) = line.split_once(" https://") {
                if line.starts_with("server ") {
                    found.push(url.to_owned());
                }
            }
            line.trim() == "ready"
        });
        assert_eq!(addrs.len(), servers, "one address per server: {addrs:?}");
        EmulatorProcess {
            guard: child,
            addrs,
            cert,
            log,
        }
    }
}

/// `python3 -m http.server` on an ephemeral loopback port, serving `dir`.
pub struct ImageServer {
    pub guard: ChildGuard,
    /// `http://127.0.0.1:PORT/`
    pub base: String,
}

impl ImageServer {
    pub fn start(dir: &Path) -> ImageServer {
        let child = Command::new("python3")
            .args([
                "-u",
                "-m",
                "http.server",
                "0",
                "--bind",
                "127.0.0.1",
                "--directory",
            ])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting python3 -m http.server");
        let mut child = ChildGuard::new(child);
        // "Serving HTTP on 127.0.0.1 port 40123 (http://127.0.0.1:40123/) ..."
        let base = read_until(&mut child, |line, found: &mut Vec<String>| {
            let port = line
                .split_once(" port ")
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .and_then(|p| p.parse::<u16>().ok());
            if let Some(port) = port {
                found.push(format!("http://127.0.0.1:{port}/"));
                true
            } else {
                false
            }
        });
        ImageServer {
            guard: child,
            base: base.into_iter().next().expect("a base URL"),
        }
    }
}

/// Writes the test images: a 3 MiB "ISO" and a 1.44 MB floppy image.
pub fn write_images(dir: &Path) {
    let iso: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.join("deploy.iso"), iso).expect("writing deploy.iso");
    std::fs::write(dir.join("params.img"), vec![0u8; 1_474_560]).expect("writing params.img");
}

/// Runs `tests/integration/py/<script>` with the venv's Python against `ilo`; panics with the
/// script's output when it exits non-zero (the asserts are in Python).
pub fn run_client_script(
    script: &str,
    emulator: &EmulatorProcess,
    server: usize,
    images: &ImageServer,
) {
    run_client_script_with(script, emulator, server, images, &[]);
}

/// [`run_client_script`] with more arguments for the script.
pub fn run_client_script_with(
    script: &str,
    emulator: &EmulatorProcess,
    server: usize,
    images: &ImageServer,
    extra: &[&str],
) {
    let ilo = &emulator.addrs[server];
    let cert = &emulator.cert;
    let path = workspace_root().join("tests/integration/py").join(script);
    let out = Command::new(venv_bin("python"))
        .arg(&path)
        .args(["--ilo", ilo, "--user", USER, "--password", PASSWORD])
        .args(["--image-base", &images.base])
        .arg("--cacert")
        .arg(cert)
        .args(extra)
        .output()
        .expect("running the Python client script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- emulator log (tail)\n{}",
        out.status,
        emulator.log_tail()
    );
    println!("{stdout}");
}
