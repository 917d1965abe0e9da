//! The server against a hand-driven client on loopback: what real clients cannot be made to do
//! on purpose (duplicate ACKs, silence, a stranger's packets, junk).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use vmdeploy_shared::tftp::{parse, ErrorCode, Mode, Packet, TftpOption};

use super::{TftpConfig, TftpServer};

/// How long a test waits for a packet that must come.
const PATIENCE: Duration = Duration::from_secs(5);

struct Running {
    addr: SocketAddr,
    root: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    async fn start(configure: impl FnOnce(&mut TftpConfig)) -> Running {
        let root = tempfile::tempdir().expect("temp dir");
        let mut config = TftpConfig::new(root.path());
        configure(&mut config);
        let server = TftpServer::bind("127.0.0.1:0".parse().expect("address"), config)
            .await
            .expect("binding the server");
        let addr = server.local_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(async move {
            let _ = stopped.await;
        }));
        Running {
            addr,
            root,
            stop: Some(stop),
            task,
        }
    }

    fn file(&self, name: &str, content: &[u8]) {
        let path = self.root.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(path, content).expect("writing a served file");
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(PATIENCE, &mut self.task)
            .await
            .expect("the server stops at shutdown")
            .expect("the server task does not panic")
            .expect("serve ends without an error");
    }
}

struct Client {
    socket: UdpSocket,
}

impl Client {
    async fn new() -> Client {
        Client::on([127, 0, 0, 1]).await
    }

    /// A client on another loopback address (Linux routes all of 127.0.0.0/8 to `lo`), to play
    /// other hosts.
    async fn on(ip: [u8; 4]) -> Client {
        Client {
            socket: UdpSocket::bind(SocketAddr::from((ip, 0)))
                .await
                .expect("client socket"),
        }
    }

    async fn send(&self, packet: &Packet, to: SocketAddr) {
        let bytes = packet.encode().expect("test packets encode");
        self.socket.send_to(&bytes, to).await.expect("sending");
    }

    async fn rrq(&self, to: SocketAddr, name: &str, mode: Mode, options: &[(&str, &str)]) {
        let options = options
            .iter()
            .map(|(n, v)| TftpOption::new(*n, *v))
            .collect();
        let packet = Packet::Rrq {
            filename: name.into(),
            mode,
            options,
        };
        self.send(&packet, to).await;
    }

    async fn recv(&self) -> (Packet, SocketAddr) {
        let mut buf = vec![0; 70_000];
        let (len, from) = tokio::time::timeout(PATIENCE, self.socket.recv_from(&mut buf))
            .await
            .expect("a packet within the patience")
            .expect("receiving");
        (
            parse(&buf[..len]).expect("the server sends valid packets"),
            from,
        )
    }

    /// The next packet within `within`, or `None`; a packet that does not parse is a test
    /// failure.
    async fn try_recv(&self, within: Duration) -> Option<(Packet, SocketAddr)> {
        let mut buf = vec![0; 70_000];
        let (len, from) = tokio::time::timeout(within, self.socket.recv_from(&mut buf))
            .await
            .ok()?
            .expect("receiving");
        Some((
            parse(&buf[..len]).expect("the server sends valid packets"),
            from,
        ))
    }

    async fn expect_silence(&self, for_: Duration) {
        let mut buf = vec![0; 70_000];
        if let Ok(received) = tokio::time::timeout(for_, self.socket.recv_from(&mut buf)).await {
            let (len, _) = received.expect("receiving");
            panic!("unexpected packet {:?}", parse(&buf[..len]));
        }
    }

    async fn expect_error(&self, code: ErrorCode) -> SocketAddr {
        match self.recv().await {
            (Packet::Error { code: got, .. }, from) if got == code => from,
            other => panic!("expected ERROR {code}, got {other:?}"),
        }
    }

    async fn expect_data(&self, block: u16) -> (Vec<u8>, SocketAddr) {
        match self.recv().await {
            (
                Packet::Data {
                    block: got,
                    payload,
                },
                from,
            ) if got == block => (payload, from),
            other => panic!("expected DATA {block}, got {other:?}"),
        }
    }

    /// Acknowledges block after block from `first` until a short one; the file's bytes.
    async fn fetch_rest(&self, tid: SocketAddr, blksize: usize, first: u16) -> Vec<u8> {
        let mut content = Vec::new();
        let mut block = first;
        loop {
            let (payload, from) = self.expect_data(block).await;
            assert_eq!(from, tid, "every DATA comes from the transfer's port");
            content.extend_from_slice(&payload);
            self.send(&Packet::Ack { block }, tid).await;
            if payload.len() < blksize {
                return content;
            }
            block = block.wrapping_add(1);
        }
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

#[tokio::test]
async fn serves_files_without_options_ending_in_a_short_or_empty_block() {
    let server = Running::start(|_| {}).await;
    for (name, len) in [("small", 100), ("whole", 1024), ("empty", 0), ("odd", 1500)] {
        server.file(name, &pattern(len));
        let client = Client::new().await;
        client.rrq(server.addr, name, Mode::Octet, &[]).await;
        let (first, tid) = client.expect_data(1).await;
        assert_ne!(tid, server.addr, "a transfer runs on its own port");
        client.send(&Packet::Ack { block: 1 }, tid).await;
        let mut content = first.clone();
        if first.len() == 512 {
            content.extend(client.fetch_rest(tid, 512, 2).await);
        }
        assert_eq!(content, pattern(len), "{name}");
    }
    server.stop().await;
}

#[tokio::test]
async fn negotiates_blksize_tsize_and_timeout_in_an_oack() {
    let server = Running::start(|config| config.max_blksize = 1024).await;
    server.file("sub/kernel", &pattern(5000));
    let client = Client::new().await;
    let options = [
        ("BLKSIZE", "4096"),
        ("tsize", "0"),
        ("timeout", "3"),
        ("windowsize", "4"),
    ];
    client
        .rrq(server.addr, "/sub/kernel", Mode::Octet, &options)
        .await;
    let (oack, tid) = client.recv().await;
    assert_eq!(
        oack,
        Packet::Oack {
            options: vec![
                TftpOption::new("blksize", "1024"),
                TftpOption::new("tsize", "5000"),
                TftpOption::new("timeout", "3"),
            ]
        }
    );
    client.send(&Packet::Ack { block: 0 }, tid).await;
    assert_eq!(client.fetch_rest(tid, 1024, 1).await, pattern(5000));

    // An empty file: no `tsize 0` (curl fails on it), so with nothing else accepted no OACK,
    // just the empty DATA 1.
    server.file("empty", b"");
    client
        .rrq(server.addr, "empty", Mode::Octet, &[("tsize", "0")])
        .await;
    let (payload, _) = client.expect_data(1).await;
    assert!(payload.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn netascii_converts_and_leaves_tsize_out() {
    let server = Running::start(|_| {}).await;
    server.file("text", b"one\ntwo\rthree");
    let client = Client::new().await;
    client
        .rrq(
            server.addr,
            "text",
            Mode::Netascii,
            &[("tsize", "0"), ("blksize", "8")],
        )
        .await;
    let (oack, tid) = client.recv().await;
    assert_eq!(
        oack,
        Packet::Oack {
            options: vec![TftpOption::new("blksize", "8")]
        }
    );
    client.send(&Packet::Ack { block: 0 }, tid).await;
    assert_eq!(
        client.fetch_rest(tid, 8, 1).await,
        b"one\r\ntwo\r\0three".to_vec()
    );
    server.stop().await;
}

#[tokio::test]
async fn duplicate_acks_are_ignored_and_strangers_get_unknown_tid() {
    let server = Running::start(|config| config.retransmit_timeout = Duration::from_secs(3)).await;
    server.file("f", &pattern(512 * 3 + 1));
    let client = Client::new().await;
    client.rrq(server.addr, "f", Mode::Octet, &[]).await;
    let (_, tid) = client.expect_data(1).await;
    client.send(&Packet::Ack { block: 1 }, tid).await;
    client.expect_data(2).await;
    // The ACK of block 1 again, as a client whose ACK seemed lost sends it: no DATA 2 again.
    client.send(&Packet::Ack { block: 1 }, tid).await;
    client.expect_silence(Duration::from_millis(300)).await;

    // Another port sends to the transfer: ERROR 5 to it, the transfer carries on.
    let stranger = Client::new().await;
    stranger.send(&Packet::Ack { block: 2 }, tid).await;
    assert_eq!(stranger.expect_error(ErrorCode::UnknownTid).await, tid);
    // Junk from the client itself is ignored too.
    client
        .socket
        .send_to(b"\x00\x09junk", tid)
        .await
        .expect("sending");
    client.expect_silence(Duration::from_millis(200)).await;

    client.send(&Packet::Ack { block: 2 }, tid).await;
    let rest = client.fetch_rest(tid, 512, 3).await;
    assert_eq!(rest, pattern(512 * 3 + 1)[1024..].to_vec());
    server.stop().await;
}

#[tokio::test]
async fn retransmits_then_gives_up_on_a_silent_client() {
    let server = Running::start(|config| {
        config.retransmit_timeout = Duration::from_millis(100);
        config.max_retries = 2;
    })
    .await;
    server.file("f", &pattern(2000));

    // DATA 1, then twice again, then nothing.
    let silent = Client::new().await;
    silent.rrq(server.addr, "f", Mode::Octet, &[]).await;
    for _ in 0..3 {
        silent.expect_data(1).await;
    }
    silent.expect_silence(Duration::from_millis(500)).await;

    // The same for an OACK nobody acknowledges.
    let silent = Client::new().await;
    silent
        .rrq(server.addr, "f", Mode::Octet, &[("tsize", "0")])
        .await;
    for _ in 0..3 {
        assert!(matches!(silent.recv().await.0, Packet::Oack { .. }));
    }
    silent.expect_silence(Duration::from_millis(500)).await;
    server.stop().await;
}

#[tokio::test]
async fn refusals_get_the_right_error_and_the_server_keeps_serving() {
    let server = Running::start(|_| {}).await;
    server.file("ok", b"fine");
    std::fs::create_dir(server.root.path().join("dir")).expect("mkdir");
    let client = Client::new().await;
    let cases: &[(&str, Mode, ErrorCode)] = &[
        ("missing", Mode::Octet, ErrorCode::FileNotFound),
        ("../etc/passwd", Mode::Octet, ErrorCode::AccessViolation),
        ("//etc/passwd", Mode::Octet, ErrorCode::AccessViolation),
        ("dir", Mode::Octet, ErrorCode::AccessViolation),
        ("ok", Mode::Mail, ErrorCode::IllegalOperation),
    ];
    for (name, mode, code) in cases {
        client.rrq(server.addr, name, *mode, &[]).await;
        client.expect_error(*code).await;
    }

    let write = Packet::Wrq {
        filename: "ok".into(),
        mode: Mode::Octet,
        options: vec![],
    };
    client.send(&write, server.addr).await;
    assert_eq!(
        client.expect_error(ErrorCode::AccessViolation).await,
        server.addr
    );
    for junk in [
        &b""[..],
        b"\x00",
        b"\x00\x07",
        b"\x00\x01name",
        b"\x00\x04\x00\x01",
    ] {
        client
            .socket
            .send_to(junk, server.addr)
            .await
            .expect("sending");
        client.expect_error(ErrorCode::IllegalOperation).await;
    }
    // Errors are never answered, malformed or not.
    for error in [&b"\x00\x05"[..], b"\x00\x05\x00\x01oops\x00"] {
        client
            .socket
            .send_to(error, server.addr)
            .await
            .expect("sending");
    }
    client.expect_silence(Duration::from_millis(200)).await;

    client.rrq(server.addr, "ok", Mode::Octet, &[]).await;
    assert_eq!(client.expect_data(1).await.0, b"fine");
    server.stop().await;
}

#[tokio::test]
async fn a_request_beyond_max_transfers_is_dropped_and_served_when_retried() {
    let server = Running::start(|config| {
        config.max_transfers = 1;
        config.retransmit_timeout = Duration::from_secs(3);
    })
    .await;
    server.file("f", &pattern(1000));
    let first = Client::new().await;
    first.rrq(server.addr, "f", Mode::Octet, &[]).await;
    let (_, tid) = first.expect_data(1).await;
    // The same request again from the same port: the running transfer answers it, not a new one.
    first.rrq(server.addr, "f", Mode::Octet, &[]).await;
    first.expect_silence(Duration::from_millis(200)).await;
    // Acknowledged, the transfer keeps its slot (a half-open one would give way).
    first.send(&Packet::Ack { block: 1 }, tid).await;
    let (last, _) = first.expect_data(2).await;
    assert_eq!(last.len(), 1000 - 512);

    let second = Client::new().await;
    second.rrq(server.addr, "f", Mode::Octet, &[]).await;
    second.expect_silence(Duration::from_millis(300)).await;

    first.send(&Packet::Ack { block: 2 }, tid).await;
    // The slot is free once the finished transfer is reaped.
    let mut served = false;
    for _ in 0..20 {
        second.rrq(server.addr, "f", Mode::Octet, &[]).await;
        let mut buf = [0u8; 600];
        if let Ok(Ok((len, _))) = tokio::time::timeout(
            Duration::from_millis(100),
            second.socket.recv_from(&mut buf),
        )
        .await
        {
            assert!(matches!(
                parse(&buf[..len]),
                Ok(Packet::Data { block: 1, .. })
            ));
            served = true;
            break;
        }
    }
    assert!(served, "the retried request is served once a slot is free");
    server.stop().await;
}

#[tokio::test]
async fn bind_refuses_a_root_that_is_not_a_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").expect("write");
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("address");
    for root in [file, dir.path().join("missing")] {
        let err = TftpServer::bind(addr, TftpConfig::new(&root))
            .await
            .err()
            .expect("a bad root is refused");
        assert!(format!("{err:#}").contains("TFTP root"), "{err:#}");
    }
}

#[tokio::test]
async fn one_client_port_may_fetch_another_file_while_a_transfer_runs() {
    let server = Running::start(|config| config.retransmit_timeout = Duration::from_secs(3)).await;
    server.file("a", &pattern(600));
    server.file("b", &pattern(700));
    let client = Client::new().await;
    client.rrq(server.addr, "a", Mode::Octet, &[]).await;
    let (_, tid_a) = client.expect_data(1).await;
    // A retransmitted request for `a` is left to the running transfer ...
    client.rrq(server.addr, "a", Mode::Octet, &[]).await;
    client.expect_silence(Duration::from_millis(200)).await;
    // ... a request for `b` is a transfer of its own.
    client.rrq(server.addr, "b", Mode::Octet, &[]).await;
    let (first_b, tid_b) = client.expect_data(1).await;
    assert_ne!(tid_a, tid_b);
    assert_eq!(first_b, pattern(700)[..512].to_vec());
    client.send(&Packet::Ack { block: 1 }, tid_b).await;
    assert_eq!(
        client.fetch_rest(tid_b, 512, 2).await,
        pattern(700)[512..].to_vec()
    );
    client.send(&Packet::Ack { block: 1 }, tid_a).await;
    assert_eq!(
        client.fetch_rest(tid_a, 512, 2).await,
        pattern(600)[512..].to_vec()
    );
    server.stop().await;
}

/// Fetches `name` (no options, 512-byte blocks) the way a PXE ROM does: the read request again,
/// from a fresh port, whenever a packet is late, until `within` has passed. The file's bytes,
/// or `None` when no attempt got the whole file in time.
async fn fetch_retrying(server: SocketAddr, name: &str, within: Duration) -> Option<Vec<u8>> {
    /// How long an attempt waits for each packet: the first retransmission of a PXE ROM.
    const LATE: Duration = Duration::from_millis(500);
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        let client = Client::new().await;
        client.rrq(server, name, Mode::Octet, &[]).await;
        let mut content = Vec::new();
        let mut block: u16 = 1;
        let whole = loop {
            match client.try_recv(LATE).await {
                Some((
                    Packet::Data {
                        block: got,
                        payload,
                    },
                    tid,
                )) if got == block => {
                    content.extend_from_slice(&payload);
                    client.send(&Packet::Ack { block }, tid).await;
                    if payload.len() < 512 {
                        break true;
                    }
                    block = block.wrapping_add(1);
                }
                // A retransmission of the previous block: our ACK crossed it.
                Some((Packet::Data { .. }, _)) => {}
                Some(other) => panic!("expected DATA {block}, got {other:?}"),
                None => break false,
            }
        };
        if whole {
            return Some(content);
        }
    }
    None
}

/// Read requests from `sockets`, each asking for the longest timeout RFC 2349 allows and never
/// acknowledging anything: what the flood of the tests below is made of.
async fn flood(server: SocketAddr, sockets: &[Client], name: &str) {
    for socket in sockets {
        socket
            .rrq(
                server,
                name,
                Mode::Octet,
                &[("timeout", "255"), ("tsize", "0")],
            )
            .await;
    }
}

#[tokio::test]
async fn never_acknowledged_requests_from_one_address_leave_the_server_serving() {
    let server = Running::start(|_| {}).await;
    server.file("pxelinux.0", &pattern(3000));
    // 200 ports of one host, more than the default 64 slots, with `timeout 255`: each transfer
    // would hold its slot for 6 × 255 s if the server let it.
    let mut attackers = Vec::new();
    for _ in 0..200 {
        attackers.push(Client::on([127, 0, 0, 2]).await);
    }
    flood(server.addr, &attackers, "pxelinux.0").await;
    let fetched = fetch_retrying(server.addr, "pxelinux.0", Duration::from_secs(3)).await;
    assert!(
        fetched.as_deref() == Some(&pattern(3000)[..]),
        "the real client is served despite the flood (got {:?} bytes)",
        fetched.map(|f| f.len())
    );
    server.stop().await;
}

#[tokio::test]
async fn a_flood_from_many_addresses_does_not_starve_a_real_client() {
    let server = Running::start(|_| {}).await;
    server.file("pxelinux.0", &pattern(3000));
    // One port on each of 199 addresses (spoofed sources, as far as the server can tell), again
    // and again while the real client fetches: more half-open transfers than slots, at about
    // 2000 requests a second, some 200 times the rate that used to keep the server down. (A
    // flood that fills every slot within one round trip of the real client still wins: see
    // the module docs' limitations.)
    let mut attackers = Vec::new();
    for host in 2..=200u8 {
        attackers.push(Client::on([127, 0, 0, host]).await);
    }
    flood(server.addr, &attackers, "pxelinux.0").await;
    let addr = server.addr;
    let flooding = tokio::spawn(async move {
        loop {
            flood(addr, &attackers, "pxelinux.0").await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let fetched = fetch_retrying(server.addr, "pxelinux.0", Duration::from_secs(5)).await;
    flooding.abort();
    assert!(
        fetched.as_deref() == Some(&pattern(3000)[..]),
        "the real client is served despite the flood (got {:?} bytes)",
        fetched.map(|f| f.len())
    );
    server.stop().await;
}

#[tokio::test]
async fn garbage_interleaved_with_a_flood_leaves_the_server_serving() {
    let server = Running::start(|_| {}).await;
    server.file("pxelinux.0", &pattern(3000));
    let garbage: &[&[u8]] = &[
        b"",
        b"\x00",
        b"\xff\xff\xff\xff",
        b"\x00\x01no-terminator",
        b"\x00\x01pxelinux.0\x00octet\x00timeout\x00",
        b"\x00\x01pxelinux.0\x00octet\x00timeout\x00255\x00blksize",
        b"\x00\x02pxelinux.0\x00octet\x00",
        b"\x00\x03\x00\x01data",
        b"\x00\x04\x00\x00",
        b"\x00\x05\x00\x01oops\x00",
        b"\x00\x06timeout\x00255\x00",
    ];
    let mut attackers = Vec::new();
    for host in 2..=101u8 {
        attackers.push(Client::on([127, 0, 0, host]).await);
    }
    for (i, attacker) in attackers.iter().enumerate() {
        let junk = garbage[i % garbage.len()];
        attacker
            .socket
            .send_to(junk, server.addr)
            .await
            .expect("sending");
        flood(server.addr, std::slice::from_ref(attacker), "pxelinux.0").await;
        attacker
            .socket
            .send_to(&[0x00, 0x09, i as u8], server.addr)
            .await
            .expect("sending");
    }
    let fetched = fetch_retrying(server.addr, "pxelinux.0", Duration::from_secs(3)).await;
    assert!(
        fetched.as_deref() == Some(&pattern(3000)[..]),
        "the real client is served despite the garbage (got {:?} bytes)",
        fetched.map(|f| f.len())
    );
    server.stop().await;
}

#[tokio::test]
async fn a_timeout_above_the_server_maximum_is_declined() {
    let server = Running::start(|_| {}).await;
    server.file("f", &pattern(100));
    let client = Client::new().await;
    client
        .rrq(
            server.addr,
            "f",
            Mode::Octet,
            &[("timeout", "255"), ("tsize", "0")],
        )
        .await;
    let (oack, tid) = client.recv().await;
    assert_eq!(
        oack,
        Packet::Oack {
            options: vec![TftpOption::new("tsize", "100")]
        },
        "RFC 2349: a timeout the server will not use is left out of the OACK"
    );
    client.send(&Packet::Ack { block: 0 }, tid).await;
    assert_eq!(client.fetch_rest(tid, 512, 1).await, pattern(100));

    // Alone, it is no OACK at all: the transfer starts with DATA 1. (A new port: the finished
    // transfer may not be reaped yet, and the same request from its port would be a repeat.)
    let client = Client::new().await;
    client
        .rrq(server.addr, "f", Mode::Octet, &[("timeout", "6")])
        .await;
    let (payload, _) = client.expect_data(1).await;
    assert_eq!(payload, pattern(100));
    server.stop().await;
}

#[tokio::test]
async fn a_half_open_transfer_retransmits_at_the_server_timeout() {
    let server = Running::start(|config| {
        config.retransmit_timeout = Duration::from_millis(200);
        config.max_retries = 2;
    })
    .await;
    server.file("f", &pattern(2000));
    // The client asks for 3 s; until it acknowledges the OACK the server keeps its own 200 ms,
    // so the unanswered OACK is sent three times within about 0.6 s, then given up.
    let silent = Client::new().await;
    silent
        .rrq(server.addr, "f", Mode::Octet, &[("timeout", "3")])
        .await;
    for _ in 0..3 {
        match silent.try_recv(Duration::from_secs(1)).await {
            Some((Packet::Oack { options }, _)) => {
                assert_eq!(options, vec![TftpOption::new("timeout", "3")]);
            }
            other => panic!("expected the OACK again within 1 s, got {other:?}"),
        }
    }
    silent.expect_silence(Duration::from_millis(600)).await;

    // Once acknowledged, the transfer runs at the granted 3 s.
    let client = Client::new().await;
    client
        .rrq(server.addr, "f", Mode::Octet, &[("timeout", "3")])
        .await;
    let (_, tid) = client.recv().await;
    client.send(&Packet::Ack { block: 0 }, tid).await;
    client.expect_data(1).await;
    client.expect_silence(Duration::from_secs(1)).await;
    client.expect_data(1).await;
    client.send(&Packet::Ack { block: 1 }, tid).await;
    assert_eq!(
        client.fetch_rest(tid, 512, 2).await,
        pattern(2000)[512..].to_vec()
    );
    server.stop().await;
}

#[tokio::test]
async fn one_address_holds_at_most_its_share_of_acknowledged_transfers() {
    let server = Running::start(|config| config.retransmit_timeout = Duration::from_secs(3)).await;
    server.file("f", &pattern(2000));
    // Transfers from one host, each acknowledged once and then left hanging.
    let mut hogs = Vec::new();
    for _ in 0..super::MAX_TRANSFERS_PER_CLIENT {
        let hog = Client::on([127, 0, 0, 2]).await;
        hog.rrq(server.addr, "f", Mode::Octet, &[]).await;
        let (_, tid) = hog.expect_data(1).await;
        hog.send(&Packet::Ack { block: 1 }, tid).await;
        hog.expect_data(2).await;
        hogs.push(hog);
    }
    // One more from that host is dropped; other hosts are still served.
    let one_more = Client::on([127, 0, 0, 2]).await;
    one_more.rrq(server.addr, "f", Mode::Octet, &[]).await;
    one_more.expect_silence(Duration::from_millis(300)).await;
    let fetched = fetch_retrying(server.addr, "f", Duration::from_secs(3)).await;
    assert!(
        fetched.as_deref() == Some(&pattern(2000)[..]),
        "another host is served (got {:?} bytes)",
        fetched.map(|f| f.len())
    );
    server.stop().await;
}

/// A `MakeWriter` that keeps what the subscriber writes, for counting log lines.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for Captured {
    type Writer = Captured;
    fn make_writer(&'w self) -> Captured {
        self.clone()
    }
}

/// Read requests for missing files, one refusal line each, far more than the budget: the log
/// holds at most the budget's lines for them, and the server still answers every request.
#[tokio::test]
async fn a_flood_of_refused_requests_writes_at_most_the_line_budget() {
    use super::request_log::REQUEST_LINES_PER_INTERVAL;
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish();
    // The test's runtime has one thread: every task logs to this subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);
    let server = Running::start(|_| {}).await;
    let client = Client::new().await;
    let requests = 3 * REQUEST_LINES_PER_INTERVAL;
    for i in 0..requests {
        client
            .rrq(server.addr, &format!("missing-{i}"), Mode::Octet, &[])
            .await;
        client.expect_error(ErrorCode::FileNotFound).await;
    }
    server.stop().await;
    let text = String::from_utf8_lossy(&captured.0.lock().expect("log")).into_owned();
    let refused = text.matches("tftp: refused").count();
    assert!(
        refused > 0 && refused <= REQUEST_LINES_PER_INTERVAL as usize,
        "{refused} refusal lines for {requests} requests"
    );
}
