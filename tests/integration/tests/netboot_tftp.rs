//! The conductor's TFTP server (`netboot::tftp`) against real clients: tftp-hpa's
//! `tftp` (no options: plain RFC 1350, octet and netascii) and curl's `tftp://` (tsize, blksize
//! and timeout by default, `--tftp-blksize`, `--tftp-no-options`). The server runs in-process on
//! 127.0.0.1 with an ephemeral port.
//!
//! Every fetch is compared byte for byte; refusals are checked through what the client reports
//! (curl's exit codes 68 "TFTP: file not found" and 69 "TFTP: access violation"; tftp-hpa's
//! `Error code N` message, as it exits 0 even then) and through the output file, which must hold
//! nothing of the refused file.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use vmdeploy_conductor::netboot::tftp::{TftpConfig, TftpServer};
use vmdeploy_integration_tests::tools::{tool, xorshift_bytes};

/// curl's exit codes for the TFTP errors (libcurl-errors(3): CURLE_TFTP_NOTFOUND, CURLE_TFTP_PERM).
const CURL_TFTP_NOT_FOUND: i32 = 68;
const CURL_TFTP_PERM: i32 = 69;

/// Above 65535 blocks of 512 bytes, so the block number wraps (34 MiB: a large initramfs).
const WRAP_FILE_LEN: usize = 34 * 1024 * 1024 + 123;
const _: () = assert!(WRAP_FILE_LEN / 512 > 65_535);

/// The server running on a runtime of its own, stopped on drop.
struct Server {
    addr: SocketAddr,
    root: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl Server {
    fn start() -> Server {
        let root = tempfile::tempdir().expect("temp dir");
        let config = TftpConfig::new(root.path());
        let (stop, stopped) = oneshot::channel::<()>();
        let (ready, bound) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("building the server's runtime");
            runtime.block_on(async move {
                let addr: SocketAddr = "127.0.0.1:0".parse().expect("address");
                let server = match TftpServer::bind(addr, config).await {
                    Ok(server) => server,
                    Err(err) => {
                        let _ = ready.send(Err(format!("{err:#}")));
                        return Err(err);
                    }
                };
                let _ = ready.send(Ok(server.local_addr()));
                server
                    .serve(async move {
                        let _ = stopped.await;
                    })
                    .await
            })
        });
        let addr = bound
            .recv()
            .expect("the server thread reports its address")
            .unwrap_or_else(|err| panic!("starting the TFTP server: {err}"));
        Server {
            addr,
            root,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Puts a file of `len` deterministic bytes under the root; returns its content.
    fn put(&self, name: &str, len: usize, seed: u64) -> Vec<u8> {
        let content = xorshift_bytes(len, seed);
        self.put_bytes(name, &content);
        content
    }

    fn put_bytes(&self, name: &str, content: &[u8]) {
        let path = self.root.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir under the root");
        }
        std::fs::write(&path, content).expect("writing a served file");
    }

    fn url(&self, name: &str) -> String {
        format!("tftp://{}/{name}", self.addr)
    }

    fn port(&self) -> String {
        self.addr.port().to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let result = thread.join();
            if !std::thread::panicking() {
                result
                    .expect("the server thread does not panic")
                    .expect("serve ends without an error");
            }
        }
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn curl(server: &Server, name: &str, extra: &[&str], out: &Path) -> Output {
    let out_path = out.to_str().expect("UTF-8 temp path");
    let mut args = vec!["-sS", "--max-time", "120", "-o", out_path];
    args.extend_from_slice(extra);
    let url = server.url(name);
    args.push(&url);
    tool("curl", "curl", &args)
}

fn curl_ok(server: &Server, name: &str, extra: &[&str], out: &Path) {
    let output = curl(server, name, extra, out);
    assert!(
        output.status.success(),
        "curl {extra:?} {name} failed ({}): {}",
        output.status,
        text(&output)
    );
}

/// tftp-hpa's client: `tftp -m MODE 127.0.0.1 PORT -c get NAME OUT`, under `timeout` (the
/// client has no overall time limit).
fn tftp_hpa(server: &Server, mode: &str, name: &str, out: &Path) -> Output {
    // Fails with the install hint when the client is missing (`timeout` would only say 127).
    tool("tftp", "tftp-hpa", &["-V"]);
    let out_path = out.to_str().expect("UTF-8 temp path");
    let port = server.port();
    tool(
        "timeout",
        "coreutils",
        &[
            "120",
            "tftp",
            "-m",
            mode,
            "127.0.0.1",
            &port,
            "-c",
            "get",
            name,
            out_path,
        ],
    )
}

fn assert_same(got: &Path, expected: &[u8], what: &str) {
    let got = std::fs::read(got).unwrap_or_else(|e| panic!("{what}: reading the output: {e}"));
    assert_eq!(got.len(), expected.len(), "{what}: length");
    assert!(got == expected, "{what}: content differs");
}

/// The files every client fetches: a short one, one of exactly 8 blocks of 512 bytes (so the
/// transfer ends with an empty DATA), one that ends mid-block at every block size we use.
fn standard_files(server: &Server) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("small.bin", server.put("small.bin", 100, 1)),
        ("blocks.bin", server.put("blocks.bin", 8 * 512, 2)),
        ("sub/dir/odd.bin", server.put("sub/dir/odd.bin", 70_001, 3)),
        ("empty.bin", server.put("empty.bin", 0, 4)),
    ]
}

#[test]
fn tftp_hpa_fetches_files_byte_for_byte_in_octet_and_netascii() {
    let server = Server::start();
    let files = standard_files(&server);
    let out_dir = tempfile::tempdir().expect("temp dir");
    for (name, content) in &files {
        let out = out_dir.path().join("out");
        let output = tftp_hpa(&server, "binary", name, &out);
        assert!(
            output.status.success(),
            "tftp get {name}: {}",
            text(&output)
        );
        assert_same(&out, content, &format!("tftp-hpa octet {name}"));
        // A leading slash, as PXE ROMs send it, names the same file.
        let output = tftp_hpa(&server, "binary", &format!("/{name}"), &out);
        assert!(
            output.status.success(),
            "tftp get /{name}: {}",
            text(&output)
        );
        assert_same(&out, content, &format!("tftp-hpa octet /{name}"));
    }
    // netascii: the server sends CR LF and CR NUL, the client turns them back into LF and CR.
    let lines = b"DEFAULT deploy\nLABEL deploy\n  KERNEL deploy.kernel\r\n\rbare cr\n".repeat(50);
    server.put_bytes("pxelinux.cfg/default", &lines);
    let out = out_dir.path().join("text");
    let output = tftp_hpa(&server, "netascii", "pxelinux.cfg/default", &out);
    assert!(output.status.success(), "tftp netascii: {}", text(&output));
    assert_same(&out, &lines, "tftp-hpa netascii");
}

#[test]
fn curl_fetches_with_and_without_blksize_and_tsize() {
    let server = Server::start();
    let files = standard_files(&server);
    let out_dir = tempfile::tempdir().expect("temp dir");
    let variants: &[(&str, &[&str])] = &[
        // curl's default request: tsize 0, blksize 512, timeout 6 (declined: above the
        // server's 5 s maximum; curl does without).
        ("default options", &[]),
        ("no options", &["--tftp-no-options"]),
        ("blksize 1468", &["--tftp-blksize", "1468"]),
        // Above the server's maximum (1468): the OACK lowers it and curl follows.
        ("blksize 8192", &["--tftp-blksize", "8192"]),
        ("blksize 8", &["--tftp-blksize", "8"]),
    ];
    for (variant, args) in variants {
        for (name, content) in &files {
            let out = out_dir.path().join("out");
            curl_ok(&server, name, args, &out);
            assert_same(&out, content, &format!("curl {variant} {name}"));
        }
    }
}

#[test]
fn a_file_past_65535_blocks_wraps_the_block_number() {
    let server = Server::start();
    let content = server.put("initramfs.img", WRAP_FILE_LEN, 5);
    let out_dir = tempfile::tempdir().expect("temp dir");
    let out = out_dir.path().join("out");

    let started = Instant::now();
    curl_ok(&server, "initramfs.img", &[], &out);
    eprintln!(
        "curl, blksize 512, {WRAP_FILE_LEN} bytes: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_same(&out, &content, "curl at 512-byte blocks");

    let started = Instant::now();
    let output = tftp_hpa(&server, "binary", "initramfs.img", &out);
    eprintln!(
        "tftp-hpa, blksize 512, {WRAP_FILE_LEN} bytes: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(output.status.success(), "tftp get: {}", text(&output));
    assert_same(&out, &content, "tftp-hpa at 512-byte blocks");
}

#[test]
fn missing_files_and_paths_outside_the_root_get_tftp_errors() {
    let server = Server::start();
    // A file beside the root that must never be served, and symlinks to it and to /etc.
    let secret = b"SECRET-OUTSIDE-THE-ROOT\n";
    let beside = server
        .root
        .path()
        .parent()
        .expect("the root has a parent")
        .join(format!(
            "tftp-secret-{}",
            server
                .root
                .path()
                .file_name()
                .map_or_else(|| "x".into(), |n| n.to_string_lossy().into_owned())
        ));
    std::fs::write(&beside, secret).expect("writing the secret");
    let _cleanup = RemoveOnDrop(beside.clone());
    std::os::unix::fs::symlink(&beside, server.root.path().join("leak")).expect("symlink");
    std::os::unix::fs::symlink("/etc", server.root.path().join("etc")).expect("symlink");
    let beside_name = beside
        .file_name()
        .expect("a file name")
        .to_string_lossy()
        .into_owned();
    let out_dir = tempfile::tempdir().expect("temp dir");

    // (name as sent, curl's exit code)
    let up = format!("../{beside_name}");
    let absolute = beside.display().to_string();
    let double = format!("/{absolute}");
    let cases: Vec<(&str, i32)> = vec![
        ("missing.bin", CURL_TFTP_NOT_FOUND),
        ("../etc/passwd", CURL_TFTP_PERM),
        (&up, CURL_TFTP_PERM),
        ("//etc/passwd", CURL_TFTP_PERM),
        ("leak", CURL_TFTP_PERM),
        ("etc/passwd", CURL_TFTP_PERM),
        // One leading slash is dropped: `/etc/passwd` is `etc/passwd` under the root (the
        // symlink above), refused.
        ("/etc/passwd", CURL_TFTP_PERM),
        // The secret's absolute path is relative to the root after that: not found there.
        (&absolute, CURL_TFTP_NOT_FOUND),
        // With two leading slashes it stays absolute: refused.
        (&double, CURL_TFTP_PERM),
    ];
    for (name, code) in &cases {
        let out = out_dir
            .path()
            .join(format!("curl-{}", name.replace('/', "_")));
        // --path-as-is: curl would otherwise remove the `..` before sending.
        let output = curl(&server, name, &["--path-as-is"], &out);
        assert_eq!(
            output.status.code(),
            Some(*code),
            "curl {name}: {}",
            text(&output)
        );
        assert_nothing_leaked(&out, name);

        let out = out_dir
            .path()
            .join(format!("tftp-{}", name.replace('/', "_")));
        let output = tftp_hpa(&server, "binary", name, &out);
        let said = text(&output);
        let expected = if *code == CURL_TFTP_NOT_FOUND {
            "Error code 1"
        } else {
            "Error code 2"
        };
        // tftp-hpa 5.2 exits 0 after a TFTP error: its message is what it reports.
        assert!(
            said.contains(expected),
            "tftp-hpa {name}: expected {expected:?} in {said:?}"
        );
        assert_nothing_leaked(&out, name);
    }

    // Directories are not files, and write requests are refused (read-only server).
    server.put("dir/file", 10, 6);
    let out = out_dir.path().join("dir");
    assert_eq!(
        curl(&server, "dir", &[], &out).status.code(),
        Some(CURL_TFTP_PERM)
    );
    let upload = out_dir.path().join("upload");
    std::fs::write(&upload, b"data").expect("write");
    let output = tool(
        "curl",
        "curl",
        &[
            "-sS",
            "--max-time",
            "30",
            "-T",
            upload.to_str().expect("UTF-8"),
            &server.url("uploaded"),
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(CURL_TFTP_PERM),
        "{}",
        text(&output)
    );
    assert!(!server.root.path().join("uploaded").exists());
}

/// The client may leave an empty output file behind (tftp-hpa does); it must hold nothing.
fn assert_nothing_leaked(out: &Path, name: &str) {
    if let Ok(content) = std::fs::read(out) {
        assert!(
            content.is_empty(),
            "{name}: the client wrote {} bytes",
            content.len()
        );
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn eight_transfers_at_once_each_byte_for_byte() {
    let server = Server::start();
    let out_dir = tempfile::tempdir().expect("temp dir");
    let option_sets: [&[&str]; 4] = [
        &[],
        &["--tftp-no-options"],
        &["--tftp-blksize", "1468"],
        &["--tftp-blksize", "1024"],
    ];
    let mut children: Vec<(Child, PathBuf, Vec<u8>)> = Vec::new();
    for i in 0..8usize {
        let name = format!("node-{i}.img");
        let content = server.put(&name, 2 * 1024 * 1024 + i * 1001, 10 + i as u64);
        let out = out_dir.path().join(&name);
        let child = Command::new("curl")
            .args(["-sS", "--max-time", "120", "-o"])
            .arg(&out)
            .args(option_sets[i % option_sets.len()])
            .arg(server.url(&name))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting curl (apt-get install curl): {e}"));
        children.push((child, out, content));
    }
    for (child, out, content) in children {
        let output = child.wait_with_output().expect("waiting for curl");
        assert!(output.status.success(), "curl: {}", text(&output));
        assert_same(&out, &content, &out.display().to_string());
    }
}

#[test]
fn malformed_packets_do_not_disturb_a_transfer_in_progress() {
    let server = Server::start();
    let len = 24 * 1024 * 1024 + 7;
    let content = server.put("big.img", len, 20);
    let existing = server.put("small.bin", 3000, 21);
    let out_dir = tempfile::tempdir().expect("temp dir");
    let out = out_dir.path().join("big");
    let before = our_udp_ports();

    // A real transfer at 512-byte blocks: long enough to be hit while it runs.
    let mut curl = Command::new("curl")
        .args(["-sS", "--max-time", "120", "-o"])
        .arg(&out)
        .arg(server.url("big.img"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting curl (apt-get install curl): {e}"));

    // The transfer's socket is the one new UDP socket of this process on 127.0.0.1.
    let deadline = Instant::now() + Duration::from_secs(10);
    let transfer_port = loop {
        let new: Vec<u16> = our_udp_ports()
            .into_iter()
            .filter(|port| !before.contains(port))
            .collect();
        if let [port] = new[..] {
            break port;
        }
        assert!(
            Instant::now() < deadline,
            "no transfer socket appeared (new ports {new:?})"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let transfer: SocketAddr = SocketAddr::from(([127, 0, 0, 1], transfer_port));

    let fuzz = UdpSocket::bind("127.0.0.1:0").expect("fuzz socket");
    fuzz.set_nonblocking(true).expect("non-blocking");
    let mut rng = Rng(0x7f7f_1234_5678_9abc);
    let mut sent = 0;
    let mut unknown_tid_answers = 0;
    let mut main_answers = 0;
    for round in 0..3000 {
        let packet = malformed_packet(&mut rng);
        for target in [server.addr, transfer] {
            // A full socket buffer only drops the packet, which is fine for junk.
            if fuzz.send_to(&packet, target).is_ok() {
                sent += 1;
            }
        }
        if round % 50 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = fuzz.recv_from(&mut buf) {
            if from == transfer && buf.get(..4) == Some(&[0, 5, 0, 5][..]) {
                unknown_tid_answers += 1;
            } else if from == server.addr && n >= 4 {
                main_answers += 1;
            }
        }
    }
    let still_running = curl.try_wait().expect("polling curl").is_none();
    let output = curl.wait_with_output().expect("waiting for curl");
    assert!(output.status.success(), "curl: {}", text(&output));
    assert_same(&out, &content, "the transfer under fire");
    assert!(
        still_running,
        "the fuzzing ended after the transfer: make the file larger"
    );
    assert!(sent >= 5000, "only {sent} packets sent");
    assert!(
        unknown_tid_answers > 0,
        "the transfer socket never answered ERROR 5 (was it hit?)"
    );
    assert!(main_answers > 0, "the main socket never answered");

    // The server still serves.
    let out = out_dir.path().join("after");
    curl_ok(&server, "small.bin", &[], &out);
    assert_same(&out, &existing, "a fetch after the fuzzing");
}

/// xorshift64: reproducible junk.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// One packet of the kinds a broken or hostile client sends.
fn malformed_packet(rng: &mut Rng) -> Vec<u8> {
    let opcode = |op: u16| op.to_be_bytes().to_vec();
    let mut packet = match rng.below(12) {
        0 => {
            let len = rng.below(600) as usize;
            rng.bytes(len)
        }
        // Truncated headers.
        1 => {
            let len = rng.below(4) as usize;
            let mut p = opcode(rng.below(7) as u16);
            p.extend(rng.bytes(len));
            p.truncate(len);
            p
        }
        // Requests without NUL terminators.
        2 => {
            let mut p = opcode(1 + rng.below(2) as u16);
            p.extend_from_slice(b"big.img");
            if rng.below(2) == 0 {
                p.extend_from_slice(b"\0octet");
            }
            p
        }
        // Unknown opcodes.
        3 => {
            let mut p = opcode(7 + rng.below(65_000) as u16);
            let len = rng.below(32) as usize;
            p.extend(rng.bytes(len));
            p
        }
        // Requests with huge, negative, or absurd option values, for names that do not exist.
        4 => {
            let mut p = opcode(1);
            p.extend_from_slice(format!("nope-{}\0octet\0", rng.below(1000)).as_bytes());
            let values = [
                "99999999999999999999999",
                "0",
                "-1",
                "7",
                "65465",
                "",
                "1e9",
            ];
            for name in ["blksize", "tsize", "timeout", "windowsize"] {
                let value = values[rng.below(values.len() as u64) as usize];
                p.extend_from_slice(format!("{name}\0{value}\0").as_bytes());
            }
            p
        }
        // Write requests.
        5 => {
            let mut p = opcode(2);
            p.extend_from_slice(b"big.img\0octet\0");
            p
        }
        // Stray ACKs of any block (to the transfer: a stranger's, so ERROR 5).
        6 => {
            let mut p = opcode(4);
            p.extend_from_slice(&(rng.below(65_536) as u16).to_be_bytes());
            p
        }
        // Stray DATA.
        7 => {
            let mut p = opcode(3);
            p.extend_from_slice(&(rng.below(65_536) as u16).to_be_bytes());
            let len = rng.below(520) as usize;
            p.extend(rng.bytes(len));
            p
        }
        // Stray ERRORs, with and without NUL.
        8 => {
            let mut p = opcode(5);
            p.extend_from_slice(&(rng.below(10) as u16).to_be_bytes());
            p.extend_from_slice(b"go away");
            if rng.below(2) == 0 {
                p.push(0);
            }
            p
        }
        // OACKs.
        9 => {
            let mut p = opcode(6);
            p.extend_from_slice(b"blksize\0");
            p
        }
        // Paths outside the root, in unknown modes.
        10 => {
            let mut p = opcode(1);
            p.extend_from_slice(b"../../etc/passwd\0");
            p.extend_from_slice(if rng.below(2) == 0 {
                b"octet\0".as_slice()
            } else {
                b"binary\0".as_slice()
            });
            p
        }
        // Huge datagrams.
        _ => {
            let mut p = opcode(1 + rng.below(6) as u16);
            let len = 1000 + rng.below(60_000) as usize;
            p.extend(rng.bytes(len));
            p
        }
    };
    if rng.below(20) == 0 {
        packet.truncate(rng.below(packet.len() as u64 + 1) as usize);
    }
    packet
}

/// Ports of this process's IPv4 UDP sockets on 127.0.0.1: the socket inodes of /proc/self/fd
/// matched against /proc/net/udp (proc(5)).
fn our_udp_ports() -> Vec<u16> {
    let mut inodes = std::collections::HashSet::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("reading /proc/self/fd") {
        let Ok(entry) = entry else { continue };
        if let Ok(target) = std::fs::read_link(entry.path()) {
            let target = target.to_string_lossy().into_owned();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|rest| rest.strip_suffix(']'))
            {
                inodes.insert(inode.to_owned());
            }
        }
    }
    let table = std::fs::read_to_string("/proc/net/udp").expect("reading /proc/net/udp");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (ip, port) = fields.get(1)?.split_once(':')?;
            let inode = fields.get(9)?;
            (ip == "0100007F" && inodes.contains(*inode))
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect()
}
