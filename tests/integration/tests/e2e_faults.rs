//! Bad media and faults, end to end: the lab of `vmdeploy_integration_tests::e2e`
//! (the `baremetal` CLI, `vmdeploy-conductor serve`, the QEMU-backed iLO emulator), one fault at
//! a time. Each fault must end in `deploy failed` with a `last_error` an operator can act on,
//! the node powered off with no QEMU left, both virtual media ejected and no floppy left in the
//! conductor's built-in store; the node is then deployable again.
//!
//! Boots are shared to keep the run short: one node with a small disk goes through the corrupt
//! deploy ISO (no boot of the agent), the image larger than its disk, the agent killed
//! mid-stream and a good deploy; the unreachable floppy URL needs a conductor of its own
//! configuration and boots nothing.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};
use vmdeploy_integration_tests::e2e::{Firmware, Lab, LabOptions, ILO_PASSWORD, ILO_USER};

/// `deploy.deploy_callback_timeout` of the lab: short, yet longer than the agent's boot to its
/// first heartbeat under TCG on a loaded machine.
const CALLBACK_TIMEOUT_SECS: u64 = 75;

/// The node's disk (root device hints choose it: the agent skips disks under 4 GiB otherwise).
const DISK_MIB: u32 = 64;

/// Where the node reaches the slow server of the mid-stream fault (a guest forward).
const GUEST_SLOW: &str = "10.0.2.102:8080";

/// A raw disk image whose boot sector prints `marker` on COM1 and powers the machine off; the
/// rest up to `len` bytes is zero.
fn boot_sector_image(marker: &str, len: usize) -> Vec<u8> {
    // xor ax,ax; mov ds,ax; mov dx,0x3f8; mov si,0x7c1d; lodsb; test al,al; jz +3; out dx,al;
    // jmp -8; mov dx,0x604; mov ax,0x2000; out dx,ax (q35 ACPI power-off); cli; hlt; jmp -4.
    let mut mbr = vec![
        0x31, 0xC0, 0x8E, 0xD8, 0xBA, 0xF8, 0x03, 0xBE, 0x1D, 0x7C, 0xAC, 0x84, 0xC0, 0x74, 0x03,
        0xEE, 0xEB, 0xF8, 0xBA, 0x04, 0x06, 0xB8, 0x00, 0x20, 0xEF, 0xFA, 0xF4, 0xEB, 0xFC,
    ];
    mbr.extend_from_slice(format!("\r\n{marker}\r\n\0").as_bytes());
    assert!(mbr.len() <= 510, "the marker fits the boot sector");
    mbr.resize(510, 0);
    mbr.extend_from_slice(&[0x55, 0xAA]);
    mbr.resize(len, 0);
    mbr
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Points the node's instance at `url` (a raw image with that digest).
fn set_image(lab: &Lab, node: &str, url: &str, sha: &str) {
    lab.set_whole_disk_image(node, url, "raw", sha, &[]);
}

/// Deploys and waits for `deploy failed`; returns `last_error` and how long it took.
fn deploy_expecting_failure(lab: &Lab, node: &str, limit: Duration) -> (String, Duration) {
    let started = Instant::now();
    lab.bm(&["node", "deploy", node]);
    let shown = lab.wait_state(node, "deploy failed", limit);
    let error = shown["last_error"].as_str().unwrap_or_default().to_owned();
    eprintln!("last_error after {:?}: {error}", started.elapsed());
    (error, started.elapsed())
}

/// What every failed deploy must leave: the node off (no QEMU process), both media ejected, no
/// object in the built-in store, no agent secrets on the node.
fn assert_cleaned_up(lab: &Lab, node: &str, what: &str) {
    // The clean-up runs before the state changes, but give QEMU's quit a moment to be reaped.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !lab.qemu_pids().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    let state = lab.emulator_state();
    assert_eq!(
        state["power"], "OFF",
        "{what}: the node is left on: {state}"
    );
    assert!(
        lab.qemu_pids().is_empty(),
        "{what}: QEMU processes left: {:?}",
        lab.qemu_pids()
    );
    assert_eq!(
        state["machine"]["running"], false,
        "{what}: the emulator says QEMU runs: {state}"
    );
    for device in ["CDROM", "FLOPPY"] {
        let media = &state["vmedia"][device];
        assert_eq!(
            media["inserted"], false,
            "{what}: the virtual {device} is still inserted: {media}"
        );
    }
    let objects = lab.stored_objects();
    assert!(
        objects.is_empty(),
        "{what}: objects left in the built-in store: {objects:?}"
    );
    let shown = lab.show(node);
    let internal = &shown["driver_internal_info"];
    assert!(
        internal.get("agent_secret_token").is_none()
            || internal["agent_secret_token"] == Value::Null
            || internal["agent_secret_token"] == "******",
        "{what}: the agent token outlives the deploy: {internal}"
    );
}

/// The node's pinned root device: its only disk, `/dev/vda`.
fn pin_root_device(lab: &Lab, node: &str) {
    lab.bm(&[
        "node",
        "set",
        node,
        "--property",
        "root_device={\"name\": \"/dev/vda\"}",
    ]);
}

/// Fault 1 (corrupt deploy ISO), fault 3 (disk smaller than the image), fault 4 (agent killed
/// mid-stream by a reset through the iLO), then a good deploy, on one node.
#[test]
fn e2e_faults_on_one_node() {
    let marker = "E2E-FAULTS-MARKER";
    let good = boot_sector_image(marker, 1 << 20);
    let good_sha = sha256_hex(&good);
    // Larger than the disk: the write must fail at the disk's end.
    let big = boot_sector_image("E2E-FAULTS-TOO-BIG", (DISK_MIB as usize + 16) << 20);
    let big_sha = sha256_hex(&big);
    // Garbage where the deploy ISO should be: deterministic noise, no ISO 9660, no El Torito.
    let mut garbage = vec![0u8; 4 << 20];
    let mut x: u32 = 0x1234_5678;
    for b in garbage.iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    let slow = SlowServer::start(
        boot_sector_image("E2E-FAULTS-HALF-WRITTEN", 32 << 20),
        2 << 20,
    );
    let slow_sha = sha256_hex(&slow.body);

    let lab = Lab::start(
        "e2e_faults_on_one_node",
        LabOptions {
            disk_size_mib: DISK_MIB,
            callback_timeout_secs: CALLBACK_TIMEOUT_SECS,
            media: vec![
                ("/garbage.iso".into(), garbage),
                ("/good.raw".into(), good),
                ("/big.raw".into(), big),
            ],
            guest_forwards: vec![format!("{GUEST_SLOW}=127.0.0.1:{}", slow.port)],
            ..Default::default()
        },
    );
    let node = lab.enroll("faulty", "agent_ilo", Firmware::Bios);
    pin_root_device(&lab, &node);
    let disk_path = lab.emulator_state()["machine"]["disk"]
        .as_str()
        .expect("the emulator names the node's disk file")
        .to_owned();

    // 1. A corrupt deploy ISO: the firmware finds nothing to boot, the node never heartbeats,
    //    and the deploy fails at the callback timeout.
    lab.bm(&[
        "node",
        "set",
        &node,
        "--driver-info",
        &format!("ilo_deploy_iso={}", lab.media.url("/garbage.iso")),
    ]);
    set_image(&lab, &node, &lab.guest_media_url("/good.raw"), &good_sha);
    let (error, took) = deploy_expecting_failure(&lab, &node, Duration::from_secs(240));
    assert!(
        error.contains("Timeout reached while waiting for callback")
            && error.contains("no heartbeat")
            && error.contains("check that the node boots the deploy ISO"),
        "corrupt ISO: {error}"
    );
    assert!(
        took >= Duration::from_secs(CALLBACK_TIMEOUT_SECS - 5),
        "corrupt ISO: failed after {took:?}, before the callback timeout"
    );
    let internal = lab.show(&node)["driver_internal_info"].clone();
    assert!(
        internal.get("agent_last_heartbeat").is_none(),
        "corrupt ISO: a heartbeat was recorded: {internal}"
    );
    assert_cleaned_up(&lab, &node, "corrupt ISO");
    lab.bm(&[
        "node",
        "set",
        &node,
        "--driver-info",
        &format!("ilo_deploy_iso={}", lab.media.url("/deploy.iso")),
    ]);

    // 3. An image larger than the disk: the agent's write fails, and says so.
    set_image(&lab, &node, &lab.guest_media_url("/big.raw"), &big_sha);
    let (error, _) = deploy_expecting_failure(&lab, &node, Duration::from_secs(400));
    let lower = error.to_lowercase();
    assert!(
        lower.contains("writing the image failed on the node")
            && lower.contains("streaming the image to the disk")
            && lower.contains("larger than"),
        "image larger than the disk: {error}"
    );
    assert_cleaned_up(&lab, &node, "image larger than the disk");
    assert_head_zero(&disk_path, "image larger than the disk");

    // 4. The agent killed mid-stream: the node is reset through the iLO while the agent
    //    writes a slowly served image.
    set_image(
        &lab,
        &node,
        &format!("http://{GUEST_SLOW}/slow.raw"),
        &slow_sha,
    );
    let started = Instant::now();
    lab.bm(&["node", "deploy", &node]);
    let deadline = Instant::now() + Duration::from_secs(300);
    while slow.sent.load(Ordering::Relaxed) < 6 << 20 {
        let state = lab.api_node(&node)["provision_state"].clone();
        assert!(
            state != "deploy failed" && Instant::now() < deadline,
            "the agent did not stream 6 MiB of the slow image (state {state}, sent {} bytes)",
            slow.sent.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "resetting the node after {:?}, {} bytes sent",
        started.elapsed(),
        slow.sent.load(Ordering::Relaxed)
    );
    redfish_reset(&lab, "ForceRestart");
    let reset_at = Instant::now();
    let shown = lab.wait_state(&node, "deploy failed", Duration::from_secs(300));
    let error = shown["last_error"].as_str().unwrap_or_default().to_owned();
    eprintln!(
        "agent killed: last_error {:?} after the reset: {error}",
        reset_at.elapsed()
    );
    // The reset node boots the deploy ISO again (the CD stays connected) and its new agent
    // heartbeats with this deploy's token but a new certificate: the conductor fails the deploy
    // at once, saying what happened, rather than waiting for the callback timeout.
    assert!(
        error.contains("the deploy ramdisk restarted")
            && error.contains("image write is lost")
            && error.contains("Deploy the node again"),
        "agent killed: {error}"
    );
    assert!(
        reset_at.elapsed() < Duration::from_secs(CALLBACK_TIMEOUT_SECS + 30),
        "agent killed: the deploy failed {:?} after the reset",
        reset_at.elapsed()
    );
    assert_cleaned_up(&lab, &node, "agent killed mid-stream");
    assert_head_zero(&disk_path, "agent killed mid-stream");
    assert!(
        !lab.console().contains("E2E-FAULTS-HALF-WRITTEN"),
        "the half-written image booted"
    );

    // And the node deploys again.
    set_image(&lab, &node, &lab.guest_media_url("/good.raw"), &good_sha);
    lab.bm(&["node", "deploy", &node]);
    lab.wait_state(&node, "active", Duration::from_secs(400));
    lab.wait_console(marker, 1, Duration::from_secs(180));
}

/// Fault 2: the built-in store's temp URLs point at a closed port, so the iLO refuses the
/// floppy's insert as a real iLO does; the deploy fails at once, naming the floppy.
#[test]
fn e2e_unreachable_floppy_url() {
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").expect("binding a port to close");
        l.local_addr().expect("its address").port()
    };
    let image = boot_sector_image("E2E-FAULTS-NEVER", 1 << 20);
    let sha = sha256_hex(&image);
    let lab = Lab::start(
        "e2e_unreachable_floppy_url",
        LabOptions {
            callback_timeout_secs: CALLBACK_TIMEOUT_SECS,
            media: vec![("/img.raw".into(), image)],
            extra_config: vec![format!(
                "[objects.builtin]\npublic_url = \"https://127.0.0.1:{closed}\""
            )],
            ..Default::default()
        },
    );
    let node = lab.enroll("nofloppy", "agent_ilo", Firmware::Bios);
    set_image(&lab, &node, &lab.guest_media_url("/img.raw"), &sha);
    let (error, took) = deploy_expecting_failure(&lab, &node, Duration::from_secs(120));
    let lower = error.to_lowercase();
    assert!(
        lower.contains("floppy") && lower.contains("virtual"),
        "unreachable floppy: the reason names no virtual floppy: {error}"
    );
    assert!(
        lower.contains("unable to connect") || lower.contains("refused"),
        "unreachable floppy: the reason does not say the iLO could not reach it: {error}"
    );
    assert!(
        took < Duration::from_secs(CALLBACK_TIMEOUT_SECS),
        "unreachable floppy: failed after {took:?}, not at once"
    );
    assert_eq!(
        lab.emulator_state()["boots"],
        0,
        "unreachable floppy: the node booted"
    );
    assert_cleaned_up(&lab, &node, "unreachable floppy");
}

/// The first MiB of the node's disk file (read with QEMU off) is zero.
fn assert_head_zero(disk: &str, what: &str) {
    let mut head = vec![0u8; 1 << 20];
    let mut file = std::fs::File::open(disk).unwrap_or_else(|e| panic!("opening {disk}: {e}"));
    file.read_exact(&mut head)
        .unwrap_or_else(|e| panic!("reading {disk}: {e}"));
    let nonzero = head.iter().position(|b| *b != 0);
    assert_eq!(
        nonzero, None,
        "{what}: the disk's first MiB is not zero (byte {nonzero:?})"
    );
}

/// `ComputerSystem.Reset` on the emulated iLO's Redfish service, as a person does it in the
/// iLO's UI.
fn redfish_reset(lab: &Lab, kind: &str) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "30", "--cacert"])
        .arg(&lab.ilo_cert)
        .args(["-u", &format!("{ILO_USER}:{ILO_PASSWORD}")])
        .args(["-H", "Content-Type: application/json", "-X", "POST"])
        .args(["-d", &format!("{{\"ResetType\": \"{kind}\"}}")])
        .arg(format!(
            "https://{}/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            lab.ilo
        ))
        .output()
        .expect("running curl");
    assert!(
        out.status.success(),
        "Redfish reset: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An HTTP server of one body, sent at `rate` bytes per second (a slow image source), counting
/// the bytes it sent.
struct SlowServer {
    port: u16,
    body: Arc<Vec<u8>>,
    sent: Arc<AtomicU64>,
}

impl SlowServer {
    fn start(body: Vec<u8>, rate: u64) -> SlowServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the slow server");
        let port = listener.local_addr().expect("its address").port();
        let body = Arc::new(body);
        let sent = Arc::new(AtomicU64::new(0));
        let (b, s) = (body.clone(), sent.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let (b, s) = (b.clone(), s.clone());
                std::thread::spawn(move || {
                    let _ = serve_slowly(stream, &b, &s, rate);
                });
            }
        });
        SlowServer { port, body, sent }
    }
}

fn serve_slowly(
    stream: TcpStream,
    body: &[u8],
    sent: &AtomicU64,
    rate: u64,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    let mut request = String::new();
    reader.read_line(&mut request)?;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
    }
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if request.starts_with("HEAD") {
        return out.flush();
    }
    const CHUNK: usize = 64 * 1024;
    let pause = Duration::from_secs_f64(CHUNK as f64 / rate as f64);
    for chunk in body.chunks(CHUNK) {
        out.write_all(chunk)?;
        sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        std::thread::sleep(pause);
    }
    out.flush()
}
