//! The emulator as a library (`Emulator::start`), driven by a Rust HTTPS client that pins the
//! emulator's self-signed certificate: RIBCL framing, each injectable fault, the Standard
//! licence, the admin API, and many servers in one process.

use std::time::{Duration, Instant};

use vmdeploy_ilo_emulator::{
    Emulator, EmulatorConfig, FaultKind, FaultSpec, License, Power, VmDevice,
};

const USER: &str = "Administrator";
const PASSWORD: &str = "password";

fn client(emulator: &Emulator, timeout: Duration) -> reqwest::Client {
    let cert = reqwest::Certificate::from_pem(emulator.cert_pem().as_bytes())
        .expect("the emulator's certificate is valid PEM");
    reqwest::Client::builder()
        .tls_certs_only([cert])
        .timeout(timeout)
        .no_proxy()
        .build()
        .expect("building the test client")
}

fn ribcl(block: &str, mode: &str, command: &str) -> String {
    format!(
        "<RIBCL VERSION=\"2.0\"><LOGIN USER_LOGIN=\"{USER}\" PASSWORD=\"{PASSWORD}\"><{block} MODE=\"{mode}\">{command}</{block}></LOGIN></RIBCL>\r\n"
    )
}

async fn post(
    c: &reqwest::Client,
    addr: std::net::SocketAddr,
    body: String,
) -> reqwest::Result<reqwest::Response> {
    c.post(format!("https://{addr}/ribcl"))
        .body(body)
        .send()
        .await
}

fn power_status() -> String {
    ribcl("SERVER_INFO", "read", "<GET_HOST_POWER_STATUS/>")
}

fn fault(kind: FaultKind, count: u32, seconds: f64) -> FaultSpec {
    FaultSpec {
        kind,
        count,
        seconds,
        status: None,
        message: None,
    }
}

#[tokio::test]
async fn ribcl_reply_is_chunked_documents_with_payload_after_response() {
    let emulator = Emulator::start(EmulatorConfig::loopback())
        .await
        .expect("starting");
    let c = client(&emulator, Duration::from_secs(10));
    let r = post(&c, emulator.addresses()[0], power_status())
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/xml");
    assert_eq!(r.headers()["transfer-encoding"], "chunked");
    assert!(r.headers().get("content-length").is_none());
    let text = r.text().await.expect("body");
    let docs: Vec<&str> = text.split("<?xml version=\"1.0\"?>").skip(1).collect();
    assert!(docs.len() >= 5, "one document per stage: {text}");
    let data = docs
        .iter()
        .find(|d| d.contains("GET_HOST_POWER"))
        .expect("a payload document");
    let response_at = data.find("<RESPONSE").expect("RESPONSE first");
    let payload_at = data.find("<GET_HOST_POWER").expect("payload");
    assert!(response_at < payload_at);
    assert!(data.contains("HOST_POWER=\"OFF\""));
    assert!(data.contains("MESSAGE='No error'"));
}

#[tokio::test]
async fn wrong_block_unknown_command_and_bad_login_fail_like_ilo() {
    let emulator = Emulator::start(EmulatorConfig::loopback())
        .await
        .expect("starting");
    let addr = emulator.addresses()[0];
    let c = client(&emulator, Duration::from_secs(10));
    let text = |body: String| {
        let c = c.clone();
        async move {
            post(&c, addr, body)
                .await
                .expect("request")
                .text()
                .await
                .expect("body")
        }
    };
    // GET_VM_STATUS belongs in RIB_INFO.
    let t = text(ribcl(
        "SERVER_INFO",
        "read",
        "<GET_VM_STATUS DEVICE=\"CDROM\"/>",
    ))
    .await;
    assert!(
        t.contains("STATUS=\"0x0001\"") && t.contains("syntax error near \"GET_VM_STATUS\""),
        "{t}"
    );
    let t = text(ribcl("SERVER_INFO", "read", "<FROBNICATE/>")).await;
    assert!(t.contains("syntax error"), "{t}");
    let t = text("<RIBCL VERSION=\"2.0\"><LOGIN USER_LOGIN=\"x\" PASSWORD=\"y\"><SERVER_INFO MODE=\"read\"><GET_HOST_POWER_STATUS/></SERVER_INFO></LOGIN></RIBCL>".into()).await;
    assert!(
        t.contains("STATUS=\"0x005F\"") && t.contains("Login failed."),
        "{t}"
    );
    assert!(
        !t.contains("GET_HOST_POWER "),
        "nothing runs after a failed login: {t}"
    );
    let t = text("<RIBCL><LOGIN".into()).await;
    assert!(t.starts_with("<?xml") && t.contains("0x0001"), "{t}");
    // python-hpilo's protocol probe: a bare RIBCL gets an answer.
    let t = text("<?xml version=\"1.0\"?>\r\n<RIBCL VERSION=\"2.0\"></RIBCL>".into()).await;
    assert!(t.contains("STATUS=\"0x0000\""), "{t}");
}

#[tokio::test]
async fn each_fault_kind_hits_the_next_n_requests_only() {
    let emulator = Emulator::start(EmulatorConfig::loopback())
        .await
        .expect("starting");
    let addr = emulator.addresses()[0];
    let c = client(&emulator, Duration::from_secs(10));

    emulator.inject_fault(0, fault(FaultKind::Delay, 1, 0.4));
    let t0 = Instant::now();
    let r = post(&c, addr, power_status())
        .await
        .expect("delayed request");
    assert_eq!(r.status(), 200);
    assert!(t0.elapsed() >= Duration::from_millis(400));

    emulator.inject_fault(0, fault(FaultKind::Http500, 2, 0.0));
    for _ in 0..2 {
        let r = post(&c, addr, power_status()).await.expect("request");
        assert_eq!(r.status(), 500);
    }
    let r = post(&c, addr, power_status()).await.expect("request");
    assert_eq!(r.status(), 200, "the fault is spent after count requests");

    emulator.inject_fault(0, fault(FaultKind::Timeout, 1, 2.0));
    let short = client(&emulator, Duration::from_millis(500));
    let e = post(&short, addr, power_status())
        .await
        .expect_err("no answer");
    assert!(e.is_timeout(), "{e}");
    // With a patient client: the emulator drops the connection without answering.
    emulator.inject_fault(0, fault(FaultKind::Timeout, 1, 0.3));
    assert!(post(&c, addr, power_status()).await.is_err());

    emulator.inject_fault(0, fault(FaultKind::Truncated, 1, 0.0));
    let r = post(&c, addr, power_status())
        .await
        .expect("headers arrive");
    assert!(r.text().await.is_err(), "the body is cut short");

    emulator.inject_fault(0, fault(FaultKind::NonXml, 1, 0.0));
    let t = post(&c, addr, power_status())
        .await
        .expect("r")
        .text()
        .await
        .expect("body");
    assert!(!t.contains("<?xml") && t.contains("<html>"), "{t}");

    emulator.inject_fault(0, fault(FaultKind::WrongRoot, 1, 0.0));
    let t = post(&c, addr, power_status())
        .await
        .expect("r")
        .text()
        .await
        .expect("body");
    assert!(t.starts_with("<?xml") && !t.contains("<RIBCL"), "{t}");

    emulator.inject_fault(0, fault(FaultKind::Busy, 1, 0.0));
    let t = post(&c, addr, power_status())
        .await
        .expect("r")
        .text()
        .await
        .expect("body");
    assert!(t.contains("busy") && t.contains("0x0001"), "{t}");

    emulator.inject_fault(
        0,
        FaultSpec {
            status: Some("0x0023".into()),
            message: Some("Permission denied.".into()),
            ..fault(FaultKind::RibclError, 1, 0.0)
        },
    );
    let t = post(&c, addr, power_status())
        .await
        .expect("r")
        .text()
        .await
        .expect("body");
    assert!(
        t.contains("STATUS=\"0x0023\"") && t.contains("Permission denied."),
        "{t}"
    );

    emulator.inject_fault(0, fault(FaultKind::LoginFail, 1, 0.0));
    let t = post(&c, addr, power_status())
        .await
        .expect("r")
        .text()
        .await
        .expect("body");
    assert!(t.contains("0x005F"), "{t}");

    let r = post(&c, addr, power_status()).await.expect("request");
    assert!(r.text().await.expect("body").contains("HOST_POWER=\"OFF\""));
    let state = emulator.state(0).await.expect("server 0");
    assert!(state.faults_pending.is_empty());
}

#[tokio::test]
async fn admin_api_queues_faults_and_reports_state() {
    let emulator = Emulator::start(EmulatorConfig::loopback())
        .await
        .expect("starting");
    let addr = emulator.addresses()[0];
    let c = client(&emulator, Duration::from_secs(10));
    let r = c
        .post(format!("https://{addr}/_emulator/faults"))
        .body(r#"{"kind":"http500","count":3}"#)
        .send()
        .await
        .expect("admin post");
    assert_eq!(r.status(), 200);
    let bad = c
        .post(format!("https://{addr}/_emulator/faults"))
        .body(r#"{"kind":"meltdown"}"#)
        .send()
        .await
        .expect("admin post");
    assert_eq!(bad.status(), 400);
    let state: serde_json::Value = c
        .get(format!("https://{addr}/_emulator/state"))
        .send()
        .await
        .expect("state")
        .json()
        .await
        .expect("json");
    assert_eq!(state["power"], "OFF");
    assert_eq!(state["faults_pending"][0]["count"], 3);
    assert_eq!(state["vmedia"]["CDROM"]["write_protect"], true);
    assert_eq!(state["vmedia"]["FLOPPY"]["write_protect"], false);
    assert_eq!(state["boot_mode"]["current"], "LEGACY");
    assert_eq!(state["license"], "advanced");
    let r = c
        .delete(format!("https://{addr}/_emulator/faults"))
        .send()
        .await
        .expect("admin delete");
    assert_eq!(r.status(), 200);
    let r = post(&c, addr, power_status()).await.expect("request");
    assert_eq!(r.status(), 200, "faults were dropped");
}

#[tokio::test]
async fn standard_licence_has_no_virtual_media() {
    let mut config = EmulatorConfig::loopback();
    config.server.license = License::Standard;
    let emulator = Emulator::start(config).await.expect("starting");
    let addr = emulator.addresses()[0];
    let c = client(&emulator, Duration::from_secs(10));
    let t = post(
        &c,
        addr,
        ribcl(
            "RIB_INFO",
            "write",
            "<INSERT_VIRTUAL_MEDIA DEVICE=\"CDROM\" IMAGE_URL=\"http://127.0.0.1:9/x.iso\"/>",
        ),
    )
    .await
    .expect("r")
    .text()
    .await
    .expect("body");
    assert!(
        t.contains("0x003C") && t.contains("Advanced license"),
        "{t}"
    );
    let t = post(&c, addr, ribcl("RIB_INFO", "read", "<GET_ALL_LICENSES/>"))
        .await
        .expect("r")
        .text()
        .await
        .expect("body");
    assert!(t.contains("iLO Standard"), "{t}");
    assert!(!emulator
        .state(0)
        .await
        .expect("s")
        .state
        .vm(VmDevice::Cdrom)
        .inserted());
    // Activating a key makes it Advanced.
    post(
        &c,
        addr,
        ribcl(
            "RIB_INFO",
            "write",
            "<LICENSE><ACTIVATE KEY=\"AAAAA-BBBBB\"/></LICENSE>",
        ),
    )
    .await
    .expect("activate");
    assert_eq!(
        emulator.state(0).await.expect("s").state.license,
        License::Advanced
    );
}

/// Many servers in one process (the later scale issue runs 1000): each answers on its own port
/// with its own state. Every 10th server is powered on, concurrently; prints the cost per server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_servers_in_one_process_keep_separate_state() {
    const SERVERS: usize = 1000;
    const STEP: usize = 10;
    let rss_before = rss_kib();
    let mut config = EmulatorConfig::loopback();
    config.servers = SERVERS;
    let t0 = Instant::now();
    let emulator = Emulator::start(config).await.expect("starting");
    let started = t0.elapsed();
    let rss_after = rss_kib();
    let addrs = emulator.addresses();
    assert_eq!(addrs.len(), SERVERS);
    let c = client(&emulator, Duration::from_secs(30));
    // Power on every even server, concurrently.
    let t1 = Instant::now();
    let mut tasks = Vec::new();
    for addr in addrs.iter().step_by(STEP) {
        let c = c.clone();
        let addr = *addr;
        tasks.push(tokio::spawn(async move {
            post(
                &c,
                addr,
                ribcl(
                    "SERVER_INFO",
                    "write",
                    "<SET_HOST_POWER HOST_POWER=\"Yes\"/>",
                ),
            )
            .await
            .map(|r| r.status())
        }));
    }
    for t in tasks {
        assert_eq!(t.await.expect("task").expect("request"), 200);
    }
    let requests = t1.elapsed();
    for (i, addr) in addrs.iter().enumerate() {
        let s = emulator.state(i).await.expect("server");
        let want = if i % STEP == 0 { Power::On } else { Power::Off };
        assert_eq!(s.state.power, want, "server {i}");
        assert_eq!(s.address, *addr);
    }
    println!(
        "{SERVERS} servers: start {started:?}, RSS +{} KiB ({} B/server), {} concurrent power-ons in {requests:?}",
        rss_after.saturating_sub(rss_before),
        rss_after.saturating_sub(rss_before) * 1024 / SERVERS as u64,
        SERVERS / STEP
    );
    emulator.shutdown().await;
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// An image server that records each request head and answers 2 KiB of partial content, until
/// its task is aborted (then connections are refused).
async fn range_server() -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<String>,
    tokio::task::JoinHandle<()>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding the image server");
    let addr = listener.local_addr().expect("address");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match sock.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let reply = b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-2047/1048576\r\nContent-Length: 2048\r\nConnection: close\r\n\r\n";
            let _ = sock.write_all(reply).await;
            let _ = sock.write_all(&[0u8; 2048]).await;
            let _ = tx.send(String::from_utf8_lossy(&head).to_ascii_lowercase());
        }
    });
    (addr, rx, task)
}

#[tokio::test]
async fn virtual_media_insert_reads_the_image_by_range() {
    let emulator = Emulator::start(EmulatorConfig::loopback())
        .await
        .expect("starting");
    let addr = emulator.addresses()[0];
    let c = client(&emulator, Duration::from_secs(20));
    let (image, mut seen, _server) = range_server().await;
    let url = format!("http://{image}/boot.iso");
    let t = post(
        &c,
        addr,
        ribcl(
            "RIB_INFO",
            "write",
            &format!("<INSERT_VIRTUAL_MEDIA DEVICE=\"CDROM\" IMAGE_URL=\"{url}\"/>"),
        ),
    )
    .await
    .expect("r")
    .text()
    .await
    .expect("body");
    assert!(!t.contains("0x0001"), "{t}");
    let head = seen.recv().await.expect("image server");
    assert!(head.starts_with("get /boot.iso "), "{head}");
    assert!(head.contains("\r\nrange: bytes=0-2047\r\n"), "{head}");
    let s = emulator.state(0).await.expect("s");
    let cd = s.state.vm(VmDevice::Cdrom);
    assert_eq!(cd.url.as_deref(), Some(url.as_str()));
    assert_eq!(cd.image_size, Some(1_048_576));

    // A refused connection fails the insert and leaves the drive as it was.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let t = post(
        &c,
        addr,
        ribcl(
            "RIB_INFO",
            "write",
            &format!(
                "<INSERT_VIRTUAL_MEDIA DEVICE=\"FLOPPY\" IMAGE_URL=\"http://{closed}/x.img\"/>"
            ),
        ),
    )
    .await
    .expect("r")
    .text()
    .await
    .expect("body");
    assert!(
        t.contains("STATUS=\"0x0001\"") && t.contains("Unable to connect"),
        "{t}"
    );
    assert!(!emulator
        .state(0)
        .await
        .expect("s")
        .state
        .vm(VmDevice::Floppy)
        .inserted());
}

#[tokio::test]
async fn the_backend_is_told_what_each_transition_does() {
    use std::sync::Arc;
    use vmdeploy_ilo_emulator::backend::ScriptedMachine;
    use vmdeploy_ilo_emulator::state::{VmBootAction, VmBootOption};
    use vmdeploy_ilo_emulator::{Backend, BootDevice, BootMode};

    let backend = Arc::new(ScriptedMachine::with_firmware(Some(BootMode::Uefi)));
    let mut config = EmulatorConfig::loopback();
    let b = backend.clone();
    config.backend = Arc::new(move |_| b.clone() as Arc<dyn Backend>);
    let emulator = Emulator::start(config).await.expect("starting");
    let server = emulator.server(0).expect("server 0").clone();
    // The machine's firmware (UEFI here) is the starting boot mode.
    let s = emulator.state(0).await.expect("s").state;
    assert_eq!(
        (s.boot_mode_current, s.boot_mode_pending),
        (BootMode::Uefi, BootMode::Uefi)
    );

    let (image, mut seen, image_server) = range_server().await;
    let url = format!("http://{image}/boot.iso");
    server
        .insert_media(VmDevice::Cdrom, &url)
        .await
        .expect("insert");
    seen.recv().await.expect("range read");
    assert!(
        backend.take_calls().is_empty(),
        "insert alone connects nothing"
    );
    server
        .set_vm_status(
            VmDevice::Cdrom,
            Some(VmBootAction::Set(VmBootOption::BootOnce)),
            Some(true),
        )
        .await
        .expect("boot once");
    server
        .set_pending_boot_mode(BootMode::Legacy)
        .await
        .expect("pending");
    server.power_on().await.expect("power on");
    assert_eq!(
        backend.take_calls(),
        vec![
            "firmware Legacy".to_owned(),
            format!("attach Cdrom {url}"),
            format!("boot_device {:?}", Some(BootDevice::Cdrom)),
            "power_on".into(),
            "detach Cdrom".into(),
        ]
    );
    // The boot read the medium again, by range.
    assert!(seen
        .recv()
        .await
        .expect("boot read")
        .contains("range: bytes=0-2047"));
    let last = emulator
        .state(0)
        .await
        .expect("s")
        .state
        .last_boot
        .expect("booted");
    assert_eq!(last.media_url.as_deref(), Some(url.as_str()));
    assert_eq!(last.media_read_error, None);
    server.power_off().await.expect("off");
    server.power_off().await.expect("off again is a no-op");
    assert_eq!(backend.take_calls(), vec!["power_off".to_owned()]);

    // A medium whose URL stopped answering: the boot records that it could not read it.
    server
        .insert_media(VmDevice::Cdrom, &url)
        .await
        .expect("insert");
    server
        .set_vm_status(VmDevice::Cdrom, Some(VmBootAction::Connect), None)
        .await
        .expect("connect");
    image_server.abort();
    let _ = image_server.await;
    server.power_on().await.expect("power on");
    let last = emulator
        .state(0)
        .await
        .expect("s")
        .state
        .last_boot
        .expect("booted");
    assert_eq!(last.device, Some(BootDevice::Cdrom));
    assert!(last.media_read_error.is_some(), "{last:?}");
}
