//! `vmdeploy-conductor ilo` against the project's iLO emulator (`ilo-emulator`), in both
//! protocols: every CLI command, checked against the emulator's own state
//! (`GET /_emulator/state`), and the emulator's injected faults, each of which must end the CLI
//! with a non-zero status and a one-line reason.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vmdeploy_integration_tests::bin;
use vmdeploy_integration_tests::child::ChildGuard;
use vmdeploy_integration_tests::emulator;

const USER: &str = "admin";
const PASSWORD: &str = "emu-pass";

/// A running `ilo-emulator`, killed on drop.
struct Emulator {
    _child: ChildGuard,
    address: String,
    cert: PathBuf,
    dir: tempfile::TempDir,
}

impl Emulator {
    fn start(extra: &[&str]) -> Emulator {
        let dir = tempfile::tempdir().expect("temp dir");
        let cert = dir.path().join("cert.pem");
        let (child, address) = emulator::spawn(USER, PASSWORD, &cert, extra);
        Emulator {
            _child: child,
            address,
            cert,
            dir,
        }
    }

    fn password_file(&self, password: &str) -> PathBuf {
        let path = self.dir.path().join(format!("pw-{}", password.len()));
        std::fs::write(&path, format!("{password}\n")).expect("writing the password file");
        path
    }

    /// `curl` stands in for a plain HTTPS client on the admin API.
    fn admin(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "10", "--cacert"])
            .arg(&self.cert)
            .args(["-X", method, &format!("https://{}{path}", self.address)]);
        if let Some(b) = body {
            cmd.args(["-H", "Content-Type: application/json", "-d", &b.to_string()]);
        }
        let out = cmd.output().expect("running curl");
        assert!(
            out.status.success(),
            "curl {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Some admin calls answer with no body; anything else must be JSON.
        if out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Value::Null;
        }
        parse_json(&out.stdout, &format!("{method} {path}"))
    }

    /// A Redfish resource as the emulator serves it (Basic auth), to compare the CLI against.
    fn redfish_get(&self, path: &str) -> Value {
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-u",
                &format!("{USER}:{PASSWORD}"),
                "--cacert",
            ])
            .arg(&self.cert)
            .arg(format!("https://{}{path}", self.address))
            .output()
            .expect("running curl");
        assert!(
            out.status.success(),
            "curl {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        parse_json(&out.stdout, &format!("GET {path}"))
    }

    fn state(&self) -> Value {
        self.admin("GET", "/_emulator/state", None)
    }

    fn fault(&self, spec: Value) {
        self.admin("POST", "/_emulator/faults", Some(&spec));
    }
}

/// `body` as JSON, or a panic that shows what came instead.
fn parse_json(body: &[u8], what: &str) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", String::from_utf8_lossy(body)))
}

/// A tiny HTTP image server with Range support (the emulator reads media by range, as iLO does).
struct ImageServer {
    base: String,
    stop: Arc<AtomicBool>,
}

impl Drop for ImageServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl ImageServer {
    fn start() -> ImageServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the image server");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let image: Arc<Vec<u8>> = Arc::new((0..256 * 1024u32).map(|i| (i % 251) as u8).collect());
        std::thread::spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        let image = image.clone();
                        std::thread::spawn(move || {
                            let _ = stream.set_nonblocking(false);
                            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                            let mut buf = vec![0u8; 8192];
                            let mut req = Vec::new();
                            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                                match stream.read(&mut buf) {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => req.extend_from_slice(&buf[..n]),
                                }
                            }
                            let text = String::from_utf8_lossy(&req).to_string();
                            let head = text.starts_with("HEAD");
                            let range = text.lines().find_map(|l| {
                                let l = l.to_ascii_lowercase();
                                let spec = l.strip_prefix("range: bytes=")?.trim().to_string();
                                let (a, b) = spec.split_once('-')?;
                                let a: usize = a.parse().ok()?;
                                let b: usize = b.parse().unwrap_or(image.len() - 1);
                                Some((a, b.min(image.len() - 1)))
                            });
                            let (status, body, extra) = match range {
                                Some((a, b)) if a <= b => (
                                    "206 Partial Content",
                                    &image[a..=b],
                                    format!("Content-Range: bytes {a}-{b}/{}\r\n", image.len()),
                                ),
                                _ => ("200 OK", &image[..], String::new()),
                            };
                            let _ = write!(
                                stream,
                                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nAccept-Ranges: bytes\r\n{extra}Connection: close\r\n\r\n",
                                body.len()
                            );
                            if !head {
                                let _ = stream.write_all(body);
                            }
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        ImageServer { base, stop }
    }
}

struct Outcome {
    ok: bool,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

fn cli(emu: &Emulator, protocol: &str, password: &Path, timeout: u64, args: &[&str]) -> Outcome {
    let start = Instant::now();
    let out = Command::new(bin("vmdeploy-conductor"))
        .args(["ilo", "--address", &emu.address, "--username", USER])
        .arg("--password-file")
        .arg(password)
        .arg("--ca")
        .arg(&emu.cert)
        .args(["--protocol", protocol, "--timeout", &timeout.to_string()])
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("running vmdeploy-conductor");
    Outcome {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        elapsed: start.elapsed(),
    }
}

fn ok(emu: &Emulator, protocol: &str, pw: &Path, args: &[&str]) -> String {
    let o = cli(emu, protocol, pw, 20, args);
    assert!(o.ok, "{protocol} {args:?} failed: {}", o.stderr);
    o.stdout
}

fn every_command_works(protocol: &str) {
    let emu = Emulator::start(&[]);
    let images = ImageServer::start();
    let pw = emu.password_file(PASSWORD);
    let p = protocol;

    let info = ok(&emu, p, &pw, &["info"]);
    assert!(info.contains("ProLiant DL380p Gen8"), "{info}");
    assert!(info.contains(&format!("protocol {p}")), "{info}");

    // Power.
    assert_eq!(ok(&emu, p, &pw, &["power", "status"]), "off");
    assert_eq!(emu.state()["power"], "OFF");
    ok(&emu, p, &pw, &["power", "on"]);
    assert_eq!(emu.state()["power"], "ON");
    assert_eq!(ok(&emu, p, &pw, &["power"]), "on");
    let json_out: Value =
        serde_json::from_str(&ok(&emu, p, &pw, &["--json", "power", "status"])).expect("json");
    assert_eq!(json_out["power"], "on");
    ok(&emu, p, &pw, &["power", "reset"]);
    assert_eq!(emu.state()["power"], "ON");
    ok(&emu, p, &pw, &["power", "off"]);
    assert_eq!(emu.state()["power"], "OFF");
    assert_eq!(ok(&emu, p, &pw, &["power", "status"]), "off");

    // Boot devices.
    ok(&emu, p, &pw, &["boot-once", "cdrom"]);
    assert_eq!(emu.state()["one_time_boot"], "CDROM");
    assert_eq!(ok(&emu, p, &pw, &["boot-once"]), "cdrom");
    ok(&emu, p, &pw, &["boot-once", "network"]);
    assert_eq!(emu.state()["one_time_boot"], "NETWORK");
    ok(&emu, p, &pw, &["boot-persistent", "hdd"]);
    assert_eq!(emu.state()["persistent_boot"][0], "HDD");
    ok(&emu, p, &pw, &["boot-persistent", "network"]);
    assert_eq!(emu.state()["persistent_boot"][0], "NETWORK");
    assert_eq!(
        ok(&emu, p, &pw, &["boot-persistent"]).lines().next(),
        Some("network")
    );
    ok(&emu, p, &pw, &["boot-persistent", "cdrom"]);
    assert_eq!(emu.state()["persistent_boot"][0], "CDROM");

    // The Integrated Management Log: Redfish reads what the firmware recorded, oldest first
    // and at most `--last`; RIBCL has no reader here and says so.
    emu.admin(
        "POST",
        "/_emulator/iml",
        Some(&serde_json::json!({"severity": "OK", "message": "Server power restored"})),
    );
    emu.admin(
        "POST",
        "/_emulator/iml",
        Some(&serde_json::json!({"severity": "Critical", "message": "Secure Boot violation (injected)"})),
    );
    if p == "redfish" {
        let log = ok(&emu, p, &pw, &["iml"]);
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 2, "{log}");
        assert!(lines[0].ends_with(" OK: Server power restored"), "{log}");
        assert!(
            lines[1].ends_with(" Critical: Secure Boot violation (injected)"),
            "{log}"
        );
        let newest: Value =
            serde_json::from_str(&ok(&emu, p, &pw, &["--json", "iml", "--last", "1"]))
                .expect("json");
        let entries = newest["entries"].as_array().expect("entries");
        assert_eq!(entries.len(), 1, "{newest}");
        assert_eq!(entries[0]["severity"], "Critical");
        assert!(
            entries[0]["created"]
                .as_str()
                .is_some_and(|c| c.ends_with('Z')),
            "an RFC 3339 UTC time: {newest}"
        );
    } else {
        let o = cli(&emu, p, &pw, 20, &["iml"]);
        assert!(
            !o.ok && o.stderr.contains("Integrated Management Log"),
            "RIBCL iml: {}",
            o.stderr
        );
    }

    // Boot mode.
    assert_eq!(ok(&emu, p, &pw, &["boot-mode", "get"]), "bios");
    ok(&emu, p, &pw, &["boot-mode", "set", "uefi"]);
    assert_eq!(emu.state()["boot_mode"]["pending"], "UEFI");
    assert_eq!(ok(&emu, p, &pw, &["boot-mode"]), "uefi");
    assert_eq!(ok(&emu, p, &pw, &["boot-mode", "get", "--current"]), "bios");
    ok(&emu, p, &pw, &["boot-mode", "set", "bios"]);
    assert_eq!(emu.state()["boot_mode"]["pending"], "LEGACY");
    assert_eq!(ok(&emu, p, &pw, &["boot-mode", "get"]), "bios");
    assert_eq!(
        ok(&emu, p, &pw, &["boot-mode", "supported"]),
        "bios_and_uefi"
    );

    // UEFI: the iLO lists BootXXXX entries; the CLI reads each as the device it stands for and
    // keeps the iLO's id and description (RIBCL), so a node booting from its RAID volume reads
    // `hdd` in both boot modes.
    ok(&emu, p, &pw, &["boot-mode", "set", "uefi"]);
    ok(&emu, p, &pw, &["power", "on"]);
    assert_eq!(ok(&emu, p, &pw, &["boot-mode", "get", "--current"]), "uefi");
    ok(&emu, p, &pw, &["boot-persistent", "hdd"]);
    assert_eq!(emu.state()["persistent_boot"][0], "HDD");
    let order = ok(&emu, p, &pw, &["boot-persistent"]);
    let first = order.lines().next().unwrap_or_default();
    if p == "ribcl" {
        assert_eq!(
            first,
            "hdd\tBoot0007 (Embedded RAID 1 : Smart Array P420i Controller - 279.37 GiB, RAID 1 Logical Drive(Target:0, Lun:0))",
            "{order}"
        );
        assert!(order.contains("network\tBoot0008 ("), "{order}");
    } else {
        assert_eq!(first, "hdd", "{order}");
    }
    let json_out: Value =
        serde_json::from_str(&ok(&emu, p, &pw, &["--json", "boot-persistent"])).expect("json");
    assert_eq!(json_out["boot_persistent"][0], "hdd", "{json_out}");
    ok(&emu, p, &pw, &["boot-persistent", "network"]);
    assert_eq!(emu.state()["persistent_boot"][0], "NETWORK");
    assert!(
        ok(&emu, p, &pw, &["boot-persistent"]).starts_with("network"),
        "network first"
    );
    ok(&emu, p, &pw, &["boot-mode", "set", "bios"]);
    ok(&emu, p, &pw, &["power", "off"]);
    ok(&emu, p, &pw, &["power", "on"]);
    assert_eq!(ok(&emu, p, &pw, &["boot-mode", "get", "--current"]), "bios");
    ok(&emu, p, &pw, &["power", "off"]);

    // Virtual media, both devices.
    for (dev, key, file) in [
        ("cdrom", "CDROM", "boot.iso"),
        ("floppy", "FLOPPY", "floppy.img"),
    ] {
        let url = format!("{}/{file}", images.base);
        assert_eq!(ok(&emu, p, &pw, &["vmedia", "status", dev]), "not inserted");
        ok(&emu, p, &pw, &["vmedia", "insert", dev, &url]);
        assert_eq!(emu.state()["vmedia"][key]["url"], url.as_str());
        assert_eq!(emu.state()["vmedia"][key]["inserted"], true);
        assert_eq!(
            ok(&emu, p, &pw, &["vmedia", "status", dev]),
            format!("inserted {url}")
        );
        let status: Value =
            serde_json::from_str(&ok(&emu, p, &pw, &["--json", "vmedia", "status", dev]))
                .expect("json");
        assert_eq!(status["inserted"], true);
        assert_eq!(status["image_url"], url.as_str());
        ok(
            &emu,
            p,
            &pw,
            &["vmedia", "set-status", dev, "--boot-option", "boot-once"],
        );
        assert_eq!(emu.state()["vmedia"][key]["boot_option"], "BOOT_ONCE");
        ok(&emu, p, &pw, &["vmedia", "eject", dev]);
        assert_eq!(emu.state()["vmedia"][key]["inserted"], false);
        assert_eq!(ok(&emu, p, &pw, &["vmedia", "status", dev]), "not inserted");
        // Ejecting an empty device is not an error.
        ok(&emu, p, &pw, &["vmedia", "eject", dev]);
    }

    // Licence, health.
    let licence = ok(&emu, p, &pw, &["licence"]);
    assert!(licence.contains("iLO Advanced (advanced)"), "{licence}");
    let health_text = ok(&emu, p, &pw, &["health"]);
    assert!(health_text.contains("power: "), "{health_text}");
    let health: Value =
        serde_json::from_str(&ok(&emu, p, &pw, &["--json", "health"])).expect("json");
    let count = |v: &Value, key: &str| v[key].as_array().map_or(0, Vec::len);
    if p == "ribcl" {
        assert!(health_text.contains("temperature "), "{health_text}");
        assert!(health_text.contains("fan "), "{health_text}");
        assert!(count(&health, "temperatures") > 0, "{health}");
        assert!(health["power"]["present_watts"].is_number(), "{health}");
    } else {
        // Exactly what the emulator's chassis exposes through its Thermal and Power links (it
        // has both; a missing link, an empty list or a missing number fails here rather than
        // shrinking the comparison to nothing).
        let chassis = emu.redfish_get("/redfish/v1/Chassis/1/");
        let link = |name: &str| {
            chassis[name]["@odata.id"]
                .as_str()
                .unwrap_or_else(|| panic!("the chassis has no {name} link: {chassis}"))
                .to_owned()
        };
        let thermal = emu.redfish_get(&link("Thermal"));
        for (ours, theirs) in [("temperatures", "Temperatures"), ("fans", "Fans")] {
            let expected = thermal[theirs]
                .as_array()
                .unwrap_or_else(|| panic!("Thermal has no {theirs} list: {thermal}"))
                .len();
            assert!(expected > 0, "Thermal lists no {theirs}: {thermal}");
            let got = health[ours]
                .as_array()
                .unwrap_or_else(|| panic!("health has no {ours} list: {health}"))
                .len();
            assert_eq!(got, expected, "{ours}: {health}");
        }
        let power = emu.redfish_get(&link("Power"));
        let watts = power["PowerControl"][0]["PowerConsumedWatts"]
            .as_f64()
            .unwrap_or_else(|| panic!("Power has no PowerConsumedWatts: {power}"));
        assert_eq!(
            health["power"]["present_watts"].as_f64(),
            Some(watts),
            "{health}"
        );
    }

    // Wrong password.
    let wrong = emu.password_file("not-the-password");
    let o = cli(&emu, p, &wrong, 20, &["power", "status"]);
    assert!(!o.ok);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(o.stderr.contains("login failed"), "{}", o.stderr);
}

#[test]
fn cli_every_command_over_ribcl() {
    every_command_works("ribcl");
}

#[test]
fn cli_every_command_over_redfish() {
    every_command_works("redfish");
}

#[test]
fn cli_auto_asks_the_generation_not_the_model() {
    // The default (lab) identity is an iLO 4: RIBCL.
    let emu = Emulator::start(&[]);
    let pw = emu.password_file(PASSWORD);
    let o = cli(&emu, "auto", &pw, 20, &["info"]);
    assert!(o.ok, "{}", o.stderr);
    assert!(o.stdout.contains("protocol ribcl"), "{}", o.stdout);
    drop(emu);
    // An iLO 4 whose model reads like a Gen10 is still driven over RIBCL.
    let emu = Emulator::start(&[
        "--profile",
        "ilo4-gen9-2.7x",
        "--product",
        "ProLiant DL360 Gen10",
    ]);
    let pw = emu.password_file(PASSWORD);
    let o = cli(&emu, "auto", &pw, 20, &["info"]);
    assert!(o.ok, "{}", o.stderr);
    assert!(o.stdout.contains("protocol ribcl"), "{}", o.stdout);
    drop(emu);
    // An iLO 6 (RIBCL disabled) over Redfish.
    let emu = Emulator::start(&["--profile", "ilo6-1.6x"]);
    let pw = emu.password_file(PASSWORD);
    let o = cli(&emu, "auto", &pw, 20, &["info"]);
    assert!(o.ok, "{}", o.stderr);
    assert!(o.stdout.contains("protocol redfish"), "{}", o.stdout);
}

fn fault_case(emu: &Emulator, pw: &Path, protocol: &str, spec: Value, timeout: u64) -> Outcome {
    emu.admin("DELETE", "/_emulator/faults", None);
    emu.fault(spec);
    cli(emu, protocol, pw, timeout, &["power", "status"])
}

fn faults_are_reported(protocol: &str) {
    let emu = Emulator::start(&[]);
    let pw = emu.password_file(PASSWORD);
    let p = protocol;
    let failing: Vec<(Value, &str)> = vec![
        (json!({"kind": "login_fail", "count": 10}), "login failed"),
        (json!({"kind": "http500", "count": 10}), "500"),
        (json!({"kind": "non_xml", "count": 10}), "malformed reply"),
        (json!({"kind": "truncated", "count": 10}), "malformed reply"),
    ];
    for (spec, want) in failing {
        let o = fault_case(&emu, &pw, p, spec.clone(), 20);
        assert!(!o.ok, "{p} {spec} succeeded: {}", o.stdout);
        assert_eq!(o.stderr.lines().count(), 1, "{p} {spec}: {}", o.stderr);
        assert!(
            o.stderr.to_lowercase().contains(want),
            "{p} {spec}: {}",
            o.stderr
        );
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    }
    if p == "ribcl" {
        for (spec, want) in [
            (
                json!({"kind": "wrong_root", "count": 10}),
                "where <ribcl> was expected",
            ),
            // The code and the command stay in the message; the variant says "BMC".
            (
                json!({"kind": "ribcl_error", "count": 10}),
                "bmc error 0x0001: get_host_power_status",
            ),
        ] {
            let o = fault_case(&emu, &pw, p, spec.clone(), 20);
            assert!(!o.ok, "{spec}");
            assert!(
                o.stderr.to_lowercase().contains(want),
                "{spec}: {}",
                o.stderr
            );
        }
    }
    // An iLO that never answers: the CLI gives up within --timeout.
    let o = fault_case(
        &emu,
        &pw,
        p,
        json!({"kind": "timeout", "count": 10, "seconds": 30}),
        2,
    );
    assert!(!o.ok);
    assert!(o.stderr.contains("within 2.0 s"), "{}", o.stderr);
    assert!(o.elapsed < Duration::from_secs(6), "took {:?}", o.elapsed);
    // Transient faults once: retried, then the command succeeds.
    for spec in [
        json!({"kind": "http500", "count": 1}),
        json!({"kind": "busy", "count": 2}),
        json!({"kind": "delay", "count": 1, "seconds": 0.5}),
    ] {
        let o = fault_case(&emu, &pw, p, spec.clone(), 20);
        assert!(o.ok, "{p} {spec}: {}", o.stderr);
        assert_eq!(o.stdout, "off");
    }
}

#[test]
fn cli_faults_over_ribcl() {
    faults_are_reported("ribcl");
}

#[test]
fn cli_faults_over_redfish() {
    faults_are_reported("redfish");
}

/// An iLO without an Advanced licence: inserting media is refused as "not licensed" in both
/// protocols (RIBCL and Redfish spell it differently), and the validate-time check refuses from
/// the licence list alone, without touching power. The client is built the way the conductor
/// builds it: from a node's driver_info, parsed above the client.
fn virtual_media_needs_a_licence(protocol: &str) {
    use vmdeploy_conductor::drivers::ilo::IloClient;
    use vmdeploy_conductor::drivers::{DriverErrorKind, Inventory, Power, PowerState};
    use vmdeploy_conductor::node::driver_info::{IloDefaults, IloDriverInfo};

    let emu = Emulator::start(&["--license", "standard"]);
    let images = ImageServer::start();
    let pw = emu.password_file(PASSWORD);
    let p = protocol;
    let url = format!("{}/boot.iso", images.base);

    let o = cli(&emu, p, &pw, 20, &["vmedia", "insert", "cdrom", &url]);
    assert!(!o.ok, "{p}: insert without a licence succeeded");
    assert_eq!(o.stderr.lines().count(), 1, "{p}: {}", o.stderr);
    assert!(
        o.stderr.to_lowercase().contains("not licensed"),
        "{p}: {}",
        o.stderr
    );
    assert_eq!(emu.state()["vmedia"]["CDROM"]["inserted"], false);

    let driver_info = json!({
        "ilo_address": format!("https://{}", emu.address),
        "ilo_username": USER,
        "ilo_password": PASSWORD,
        "ilo_verify_ca": emu.cert.display().to_string(),
        "client_timeout": "20",
        "ilo_protocol": p,
    });
    let Value::Object(driver_info) = driver_info else {
        unreachable!("a JSON object literal")
    };
    let info = IloDriverInfo::parse(&driver_info, &IloDefaults::default()).expect("valid");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = IloClient::connect(&info.config).await.expect("client");
        let power_before = client.power_state().await.expect("power");
        let err = client
            .check_virtual_media_licence()
            .await
            .expect_err("standard licence refused");
        assert_eq!(err.kind(), DriverErrorKind::NotLicensed, "{p}: {err}");
        assert!(err.to_string().contains("iLO Standard"), "{p}: {err}");
        assert_eq!(client.power_state().await.expect("power"), power_before);
        assert_eq!(power_before, PowerState::Off);
    });
}

#[test]
fn virtual_media_needs_a_licence_over_ribcl() {
    virtual_media_needs_a_licence("ribcl");
}

#[test]
fn virtual_media_needs_a_licence_over_redfish() {
    virtual_media_needs_a_licence("redfish");
}

/// `vmdeploy-conductor ilo probe --address … [extra]` (the issue's argument order: the command
/// first); its exit code, standard output and standard error.
fn probe(emu: &Emulator, pw: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin("vmdeploy-conductor"))
        .args([
            "ilo",
            "probe",
            "--address",
            &emu.address,
            "--username",
            USER,
        ])
        .arg("--password-file")
        .arg(pw)
        .arg("--ca")
        .arg(&emu.cert)
        .args(extra)
        .env("RUST_LOG", "error")
        .output()
        .expect("running vmdeploy-conductor");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The status of the check named `name` in a `--json` report.
fn check_status(report: &Value, name: &str) -> String {
    report["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["check"] == name))
        .map(|c| c["status"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_else(|| format!("no {name} check in {report}"))
}

#[test]
fn probe_passes_a_ready_ilo_of_every_profile() {
    for profile in [
        "lab",
        "ilo4-gen8-ribcl",
        "ilo4-gen9-2.7x",
        "ilo5-1.1x",
        "ilo5-2.7x",
        "ilo5-3.x",
        "ilo6-1.6x",
    ] {
        let emu = Emulator::start(&["--profile", profile]);
        let pw = emu.password_file(PASSWORD);
        let (code, out, err) = probe(&emu, &pw, &[]);
        assert_eq!(code, Some(0), "{profile}: {out}{err}");
        for check in [
            "reachable",
            "firmware",
            "protocol",
            "credentials",
            "power",
            "licence",
            "vmedia-floppy",
            "vmedia-cd",
            "boot-mode",
            "clock",
        ] {
            assert!(
                out.lines()
                    .any(|l| l.split_whitespace().nth(1) == Some(check)),
                "{profile}: no {check} line:\n{out}"
            );
        }
        assert!(
            !out.lines().any(|l| l.starts_with("fail")),
            "{profile}:\n{out}"
        );
    }
}

#[test]
fn probe_names_each_problem_of_a_neglected_ilo() {
    // An iLO 6 (RIBCL disabled) whose clock is an hour ahead, with media left in its CD, a
    // boot override stuck on Continuous, and, after those, a Standard licence.
    let emu = Emulator::start(&[
        "--profile",
        "ilo6-1.6x",
        "--clock-skew-secs",
        "3600",
        "--boot-mode",
        "uefi",
    ]);
    let images = ImageServer::start();
    let pw = emu.password_file(PASSWORD);
    // Secure Boot switched on (UEFI): the deploy media must be signed.
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-u",
            &format!("{USER}:{PASSWORD}"),
            "--cacert",
        ])
        .arg(&emu.cert)
        .args(["-X", "PATCH", "-H", "Content-Type: application/json", "-d"])
        .arg(r#"{"SecureBootEnable": true}"#)
        .arg(format!(
            "https://{}/redfish/v1/Systems/1/SecureBoot/",
            emu.address
        ))
        .output()
        .expect("running curl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let url = format!("{}/boot.iso", images.base);
    ok(&emu, "redfish", &pw, &["vmedia", "insert", "cdrom", &url]);
    ok(&emu, "redfish", &pw, &["boot-persistent", "cdrom"]);
    emu.admin(
        "PUT",
        "/_emulator/license",
        Some(&json!({"license": "standard"})),
    );
    let (code, out, err) = probe(&emu, &pw, &["--json"]);
    assert_eq!(code, Some(1), "a failed check exits 1: {out}{err}");
    assert!(err.contains("check(s) failed"), "{err}");
    let report = parse_json(out.as_bytes(), "probe --json");
    for (check, status) in [
        ("licence", "fail"),
        ("vmedia-cd", "warn"),
        ("boot-override", "warn"),
        ("ribcl", "warn"),
        ("clock", "warn"),
        ("secure-boot", "warn"),
        ("credentials", "ok"),
    ] {
        assert_eq!(check_status(&report, check), status, "{check}: {report:#}");
    }
    let clock = report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["check"] == "clock"))
        .cloned()
        .unwrap_or_default();
    assert!(
        clock["detail"]
            .as_str()
            .is_some_and(|d| d.contains("ahead")),
        "{clock}"
    );

    // Wrong credentials fail the credentials check; no address is bad usage (64).
    let wrong = emu.password_file("not-the-password");
    let (code, out, _) = probe(&emu, &wrong, &["--json"]);
    assert_eq!(code, Some(1));
    let report = parse_json(out.as_bytes(), "probe --json");
    assert_eq!(check_status(&report, "credentials"), "fail", "{report:#}");
    let usage = Command::new(bin("vmdeploy-conductor"))
        .args(["ilo", "probe"])
        .output()
        .expect("running vmdeploy-conductor");
    assert_eq!(usage.status.code(), Some(64));
}

#[test]
fn probe_inventory_prints_a_row_per_ilo_and_fails_when_one_does() {
    let gen8 = Emulator::start(&["--profile", "ilo4-gen8-ribcl"]);
    let ilo5 = Emulator::start(&["--profile", "ilo5-2.7x"]);
    let standard = Emulator::start(&["--profile", "ilo6-1.6x", "--license", "standard"]);
    let pw = gen8.password_file(PASSWORD);
    let inventory = gen8.dir.path().join("inventory");
    // Shared user and password file from the command line; each line its own CA.
    let lines: Vec<String> = [&gen8, &ilo5, &standard]
        .iter()
        .map(|e| {
            format!(
                "{} {USER} {} {}  # a comment",
                e.address,
                pw.display(),
                e.cert.display()
            )
        })
        .collect();
    std::fs::write(&inventory, format!("# fleet\n\n{}\n", lines.join("\n"))).expect("inventory");
    let run = |json: bool| {
        Command::new(bin("vmdeploy-conductor"))
            .args(["ilo", "probe", "--inventory"])
            .arg(&inventory)
            .args(["--concurrency", "2"])
            .args(json.then_some("--json"))
            .env("RUST_LOG", "error")
            .output()
            .expect("running vmdeploy-conductor")
    };
    let out = run(false);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 of 3 iLOs failed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 4, "a header and a row per iLO:\n{table}");
    assert!(
        rows[1].contains(&gen8.address)
            && rows[1].contains("iLO 4 2.10")
            && rows[1].contains("ribcl"),
        "{table}"
    );
    assert!(
        rows[2].contains("iLO 5 2.72") && rows[2].contains("redfish"),
        "{table}"
    );
    assert!(rows[3].contains("licence"), "{table}");
    let out = run(true);
    let report = parse_json(&out.stdout, "probe --inventory --json");
    assert_eq!(report["ilos"].as_array().map(Vec::len), Some(3), "{report}");
    assert_eq!(report["ilos"][1]["detected"]["generation"], 5, "{report}");
}
