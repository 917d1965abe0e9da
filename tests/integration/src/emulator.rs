//! Starting the project's iLO emulator (`ilo-emulator`) as a process, shared by the tests that
//! drive it: it listens on an ephemeral loopback port, writes its certificate where asked and
//! prints `server 0 https://<host:port>` and then `ready` on stdout.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::bin;

/// Starts `ilo-emulator` with `username`/`password`, its certificate written to `cert_out`, and
/// `extra` arguments; returns the child and the `host:port` of its HTTPS server once it printed
/// `ready`. Panics (after killing the child) when it does not within 30 s.
pub fn spawn(username: &str, password: &str, cert_out: &Path, extra: &[&str]) -> (Child, String) {
    let mut child = Command::new(bin("ilo-emulator"))
        .args(["--listen", "127.0.0.1:0", "--username", username])
        .args(["--password", password])
        .arg("--cert-out")
        .arg(cert_out)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting ilo-emulator");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    // A thread of its own keeps reading, so the emulator never blocks on a full pipe later.
    std::thread::spawn(move || {
        let mut address = None;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("server 0 https://") {
                address = Some(url.trim().to_string());
            }
            if line.trim() == "ready" {
                let _ = tx.send(address.take());
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(30)).ok().flatten() {
        Some(address) => (child, address),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ilo-emulator printed its address and `ready` within 30 s");
        }
    }
}
