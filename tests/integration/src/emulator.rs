//! Starting the project's iLO emulator (`ilo-emulator`) as a process, shared by the tests that
//! drive it: it listens on an ephemeral loopback port, writes its certificate where asked and
//! prints `server 0 https://<host:port>` and then `ready` on stdout.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::bin;
use crate::child::ChildGuard;

/// Starts `ilo-emulator` with `username`/`password`, its certificate written to `cert_out`, and
/// `extra` arguments; returns the guarded child and the `host:port` of its HTTPS server once it
/// printed `ready`. Panics (after killing the child) when it does not within 30 s.
pub fn spawn(
    username: &str,
    password: &str,
    cert_out: &Path,
    extra: &[&str],
) -> (ChildGuard, String) {
    let child = Command::new(bin("ilo-emulator"))
        .args(["--listen", "127.0.0.1:0", "--username", username])
        .args(["--password", password])
        .arg("--cert-out")
        .arg(cert_out)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting ilo-emulator");
    let mut child = ChildGuard::new(child);
    match ready_address(&mut child) {
        Some(address) => (child, address),
        // The guard kills the emulator as the panic unwinds.
        None => panic!("ilo-emulator did not print its address and `ready` within 30 s"),
    }
}

/// The `host:port` of server 0 once a started `ilo-emulator` (stdout piped) printed it and
/// `ready`; `None` when it does not within 30 s. A thread of its own keeps reading stdout
/// afterwards, so the emulator never blocks on a full pipe.
pub fn ready_address(child: &mut Child) -> Option<String> {
    let stdout = child.stdout.take()?;
    let (tx, rx) = std::sync::mpsc::channel();
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
    rx.recv_timeout(Duration::from_secs(30)).ok().flatten()
}

/// An HTTP image server for virtual media tests of the QEMU-backed emulator: serves named
/// in-memory files with `Accept-Ranges: bytes` and honours `Range: bytes=A-B` and `bytes=A-`
/// (QEMU's curl driver needs both: it checks `Accept-Ranges` on its HEAD, then reads ranges), 404
/// for anything else. A file can be withdrawn while it runs ([`MediaServer::withdraw`]), like an
/// expired temporary URL. Stops when dropped.
pub struct MediaServer {
    accept: crate::http::AcceptLoop,
    files: std::sync::Arc<
        std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Vec<u8>>>>,
    >,
}

impl MediaServer {
    /// Serves `files` (`("/deploy.iso", bytes)`) on 127.0.0.1 (ephemeral port).
    pub fn start(files: Vec<(&str, Vec<u8>)>) -> MediaServer {
        Self::start_with_root(files, None)
    }

    /// Serves the files under `root` by their paths relative to it (read at each request,
    /// symbolic links followed, nothing outside `root` by `..`), as a web server serves a
    /// directory: for a conductor that writes its HTTP root while it runs (upstream Ironic's
    /// `[deploy] http_root`), with the `Range` requests QEMU's curl driver makes.
    pub fn start_dir(root: &Path) -> MediaServer {
        Self::start_with_root(Vec::new(), Some(root.to_owned()))
    }

    fn start_with_root(files: Vec<(&str, Vec<u8>)>, root: Option<PathBuf>) -> MediaServer {
        let files = std::sync::Arc::new(std::sync::Mutex::new(
            files
                .into_iter()
                .map(|(p, b)| (p.to_owned(), std::sync::Arc::new(b)))
                .collect::<std::collections::HashMap<_, _>>(),
        ));
        let served = files.clone();
        let accept = crate::http::AcceptLoop::start(move |stream| {
            let _ = serve_media(stream, &served, root.as_deref());
        });
        MediaServer { accept, files }
    }

    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.accept.addr()
    }

    /// `http://127.0.0.1:PORT/path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.accept.addr())
    }

    /// From now on `path` answers 404.
    pub fn withdraw(&self, path: &str) {
        self.files.lock().expect("media lock").remove(path);
    }
}

/// `bytes=A-B` or `bytes=A-` against a body of `len` bytes: the inclusive range to send.
fn parse_range(value: &str, len: u64) -> Option<(u64, u64)> {
    let spec = value.trim().strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let start: u64 = a.trim().parse().ok()?;
    let end = match b.trim() {
        "" => len.checked_sub(1)?,
        e => e.parse::<u64>().ok()?.min(len.checked_sub(1)?),
    };
    (start <= end).then_some((start, end))
}

/// What answers one path: bytes in memory, or a file under the served directory.
enum Body {
    Memory(std::sync::Arc<Vec<u8>>),
    File(std::fs::File, u64),
}

impl Body {
    fn len(&self) -> u64 {
        match self {
            Body::Memory(b) => b.len() as u64,
            Body::File(_, len) => *len,
        }
    }

    fn send(&mut self, start: u64, end: u64, out: &mut impl std::io::Write) -> std::io::Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        match self {
            Body::Memory(b) => out.write_all(&b[start as usize..end as usize]),
            Body::File(f, _) => {
                f.seek(SeekFrom::Start(start))?;
                let copied = std::io::copy(&mut f.take(end - start), out)?;
                if copied != end - start {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the file shrank while it was sent",
                    ));
                }
                Ok(())
            }
        }
    }
}

/// The regular file `path` (a URL path) names under `root`, if any; `..` never leaves it.
fn file_under(root: &Path, path: &str) -> Option<Body> {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let mut full = root.to_owned();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        if part == ".." || part == "." {
            return None;
        }
        full.push(part);
    }
    let file = std::fs::File::open(&full).ok()?;
    let meta = file.metadata().ok()?;
    meta.is_file().then(|| Body::File(file, meta.len()))
}

fn serve_media(
    stream: std::net::TcpStream,
    files: &std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Vec<u8>>>>,
    root: Option<&Path>,
) -> std::io::Result<()> {
    use std::io::Write;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    // Keep-alive: QEMU's curl driver reuses its connections.
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_owned();
        let path = parts.next().unwrap_or_default().to_owned();
        let mut range = None;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.trim().eq_ignore_ascii_case("range") {
                    range = Some(value.trim().to_owned());
                }
            }
        }
        // A client that uses this server as its HTTP proxy sends the absolute form
        // (`GET http://host:port/path`): it is served by its path (the Ironic lab's conductor
        // reaches the node's view of its HTTP root this way, e2e/ironic.rs).
        let path = match path.strip_prefix("http://") {
            Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]).to_owned(),
            None => path,
        };
        let body = files
            .lock()
            .expect("media lock")
            .get(&path)
            .cloned()
            .map(Body::Memory)
            .or_else(|| root.and_then(|r| file_under(r, &path)));
        let Some(mut body) = body else {
            out.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nContent-Type: text/plain\r\n\r\nnot found",
            )?;
            out.flush()?;
            continue;
        };
        let len = body.len();
        let (status, start, end) = match range.as_deref().and_then(|r| parse_range(r, len)) {
            Some((a, b)) => ("206 Partial Content", a, b + 1),
            None => ("200 OK", 0, len),
        };
        let mut head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nAccept-Ranges: bytes\r\n\
             Content-Type: application/octet-stream\r\n",
            end - start
        );
        if status.starts_with("206") {
            head.push_str(&format!(
                "Content-Range: bytes {start}-{}/{len}\r\n",
                end - 1
            ));
        }
        head.push_str("\r\n");
        out.write_all(head.as_bytes())?;
        if method != "HEAD" {
            body.send(start, end, &mut out)?;
        }
        out.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::parse_range;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-2047", 4096), Some((0, 2047)));
        assert_eq!(parse_range("bytes=4000-", 4096), Some((4000, 4095)));
        assert_eq!(parse_range("bytes=4000-99999", 4096), Some((4000, 4095)));
        assert_eq!(parse_range("bytes=5-1", 4096), None);
        assert_eq!(parse_range("items=0-1", 4096), None);
        assert_eq!(parse_range("bytes=0-", 0), None);
    }
}
