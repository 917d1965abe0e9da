//! Network boots of the QEMU-backed iLO emulator (`ilo-emulator --backend qemu
//! --qemu-pxe-bootfile URL`), what `pxe_ilo` needs from a server whose iLO has a Standard licence:
//! the iLO refuses virtual media but sets the boot mode and the boot device and powers the
//! server; the NIC's iPXE ROM gets the boot file from slirp's DHCP and fetches it through a guest
//! forward from a small HTTP server of this test.
//!
//! One emulator, one QEMU at a time (TCG), both firmwares:
//! - RIBCL: boot mode LEGACY, one-time boot NETWORK, power on: SeaBIOS runs iPXE, whose script
//!   chains to `/seen/${mac:hexhyp}/${platform}`: the MAC is the one GET_HOST_DATA reports, the
//!   platform `pcbios`. The next boot (a reset) is HDD from the persistent order, the disk first
//!   in QEMU's boot order. SET_PERSISTENT_BOOT with NETWORK first network boots every boot.
//! - Redfish: BIOS `BootMode` Uefi, `Boot` override `Pxe` `Once`, PowerCycle: OVMF runs iPXE's
//!   EFI driver, platform `efi`; the override reads `Disabled` afterwards. `Continuous` `Pxe`
//!   network boots again.
//!
//! A real iLO answers these calls without an Advanced licence (docs/ilo-management.md §1.5,
//! §3.3); only virtual media need one.

#[path = "ilo_emulator_support.rs"]
mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{EmulatorProcess, PASSWORD, USER};
use vmdeploy_integration_tests::qemu::alive;

/// From power-on to iPXE's second request under TCG on busy cores (SeaBIOS takes a few seconds,
/// OVMF up to ~20; docs/qemu-and-boot.md §9 item 7).
const NETBOOT_LIMIT: Duration = Duration::from_secs(120);
/// Where the guest reaches this test's HTTP server (a `--guest-forward`).
const GUEST_HTTP: &str = "10.0.2.101";

/// The netboot HTTP server: `/boot.ipxe` chains to `/seen/<mac>/<platform>`, which answers an
/// iPXE script that only prints; every request path is recorded.
struct NetbootServer {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl NetbootServer {
    fn start() -> NetbootServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the netboot server");
        let port = listener.local_addr().expect("its address").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let log = log.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, port, &log);
                });
            }
        });
        NetbootServer { port, seen }
    }

    fn bootfile(&self) -> String {
        format!("http://{GUEST_HTTP}:{}/boot.ipxe", self.port)
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().expect("request log").clone()
    }

    /// How many `/seen/<mac>/<platform>` requests came so far.
    fn count(&self, mac: &str, platform: &str) -> usize {
        let want = format!("/seen/{mac}/{platform}");
        self.seen().iter().filter(|p| **p == want).count()
    }
}

fn serve(stream: TcpStream, port: u16, seen: &Mutex<Vec<String>>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    seen.lock().expect("request log").push(path.clone());
    let body = if path == "/boot.ipxe" {
        format!(
            "#!ipxe\necho vmdeploy netboot script\n\
             chain http://{GUEST_HTTP}:{port}/seen/${{mac:hexhyp}}/${{platform}}\n"
        )
    } else if path.starts_with("/seen/") {
        "#!ipxe\necho vmdeploy netboot seen\n".to_owned()
    } else {
        let _ = out.write_all(b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        return Ok(());
    };
    write!(
        out,
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}

/// The emulator process and the QEMU pids it started (checked gone at the end).
struct Emulator {
    process: Option<EmulatorProcess>,
    addr: String,
}

impl Emulator {
    fn curl(&self, args: &[&str]) -> String {
        let user = format!("{USER}:{PASSWORD}");
        let mut all = vec!["-u", user.as_str()];
        all.extend_from_slice(args);
        vmdeploy_integration_tests::tools::curl(&all)
    }

    /// One RIBCL command; the STATUS (the last non-zero one) and MESSAGE, and the whole reply.
    fn ribcl(&self, block: &str, mode: &str, command: &str) -> (u32, String, String) {
        let body = format!(
            "<RIBCL VERSION=\"2.0\"><LOGIN USER_LOGIN=\"{USER}\" PASSWORD=\"{PASSWORD}\">\
             <{block} MODE=\"{mode}\">{command}</{block}></LOGIN></RIBCL>\r\n"
        );
        let reply = self.curl(&[
            "-X",
            "POST",
            "--data-binary",
            &body,
            &format!("https://{}/ribcl", self.addr),
        ]);
        let mut result = (0, String::new());
        for doc in reply.split("<RESPONSE").skip(1) {
            let status = attr(doc, "STATUS");
            let status = u32::from_str_radix(status.trim_start_matches("0x"), 16)
                .unwrap_or_else(|_| panic!("a hex STATUS in {reply}"));
            if status != 0 || result.0 == 0 {
                result = (status, attr(doc, "MESSAGE"));
            }
        }
        (result.0, result.1, reply)
    }

    /// A RIBCL command that must succeed; its reply.
    fn ribcl_ok(&self, block: &str, mode: &str, command: &str) -> String {
        let (status, message, reply) = self.ribcl(block, mode, command);
        assert_eq!(status, 0, "{command}: STATUS 0x{status:04X} {message}");
        reply
    }

    /// A Redfish request with Basic auth; the HTTP status and the body.
    fn redfish(&self, method: &str, path: &str, body: Option<Value>) -> (u16, String) {
        let url = format!("https://{}{path}", self.addr);
        let mut args = vec!["-X", method, "-w", "\n%{http_code}"];
        let body = body.map(|b| b.to_string());
        if let Some(b) = &body {
            args.extend(["-H", "Content-Type: application/json", "--data-binary", b]);
        }
        args.push(&url);
        let out = self.curl(&args);
        let (text, code) = out.rsplit_once('\n').unwrap_or(("", &out));
        (
            code.trim().parse().unwrap_or_else(|_| panic!("{out}")),
            text.to_owned(),
        )
    }

    fn redfish_ok(&self, method: &str, path: &str, body: Value) {
        let (code, text) = self.redfish(method, path, Some(body));
        assert!((200..300).contains(&code), "{method} {path}: {code} {text}");
    }

    fn system(&self) -> Value {
        let (code, text) = self.redfish("GET", "/redfish/v1/Systems/1/", None);
        assert_eq!(code, 200, "{text}");
        serde_json::from_str(&text).expect("the system is JSON")
    }

    fn state(&self) -> Value {
        let text = self.curl(&[&format!("https://{}/_emulator/state", self.addr)]);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("state is not JSON ({e}): {text}"))
    }

    fn diagnostics(&self) -> String {
        let console = self.curl(&[&format!("https://{}/_emulator/console", self.addr)]);
        let tail: String = console
            .chars()
            .rev()
            .take(3000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!(
            "state: {:#}\n--- console (end)\n{tail}\n--- emulator log\n{}",
            self.state(),
            self.process
                .as_ref()
                .map(|p| p.log_tail())
                .unwrap_or_default()
        )
    }

    fn log(&self) -> String {
        self.process
            .as_ref()
            .map(|p| std::fs::read_to_string(&p.log).unwrap_or_default())
            .unwrap_or_default()
    }

    /// The `-device` JSON objects of the last QEMU the emulator started (from its log line
    /// `QEMU started ... args=...`).
    fn last_devices(&self) -> Vec<Value> {
        let log = self.log();
        let line = log
            .lines()
            .rfind(|l| l.contains("QEMU started"))
            .unwrap_or_else(|| panic!("no QEMU start in the log:\n{log}"));
        let mut devices = Vec::new();
        let mut rest = line;
        while let Some(at) = rest.find("-device {") {
            rest = &rest[at + "-device ".len()..];
            let end = rest.find('}').expect("a closing brace");
            devices.push(serde_json::from_str(&rest[..=end]).expect("device JSON"));
            rest = &rest[end..];
        }
        devices
    }

    /// The pids of every QEMU the emulator started.
    fn qemu_pids(&self) -> Vec<u32> {
        self.log()
            .lines()
            .filter(|l| l.contains("QEMU started"))
            .filter_map(|l| l.split_once(" pid=").map(|(_, rest)| rest))
            .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
            .collect()
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        // Also on a failed assert: the emulator dies, its QEMU with it (parent-death signal).
        drop(self.process.take());
    }
}

fn attr(doc: &str, name: &str) -> String {
    doc.split_once(&format!("{name}="))
        .and_then(|(_, rest)| {
            let q = rest.chars().next()?;
            rest[1..].split(q).next().map(str::to_owned)
        })
        .unwrap_or_default()
}

fn wait_for(emulator: &Emulator, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > NETBOOT_LIMIT {
            panic!(
                "{what}: not within {NETBOOT_LIMIT:?}\n{}",
                emulator.diagnostics()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    start.elapsed()
}

fn device<'a>(devices: &'a [Value], driver: &str) -> &'a Value {
    devices
        .iter()
        .find(|d| d["driver"] == driver)
        .unwrap_or_else(|| panic!("no {driver} in {devices:?}"))
}

#[test]
fn a_standard_licence_ilo_network_boots_seabios_and_ovmf_through_ipxe() {
    let dir = tempfile::Builder::new()
        .prefix("ilopxe")
        .tempdir_in("/var/tmp")
        .expect("scratch dir");
    let http = NetbootServer::start();
    let state_dir = dir.path().join("state");
    let state_dir = state_dir.to_str().expect("UTF-8 path").to_owned();
    let forward = format!("{GUEST_HTTP}:{0}=127.0.0.1:{0}", http.port);
    let bootfile = http.bootfile();
    let process = EmulatorProcess::start(
        dir.path(),
        1,
        &[
            "--backend",
            "qemu",
            "--qemu-state-dir",
            &state_dir,
            "--license",
            "standard",
            "--qemu-memory-mib",
            "512",
            "--guest-forward",
            &forward,
            "--qemu-pxe-bootfile",
            &bootfile,
        ],
    );
    let emulator = Emulator {
        addr: process.addrs[0].clone(),
        process: Some(process),
    };
    let started = Instant::now();

    // Standard licence: no virtual media, over RIBCL and Redfish, before anything boots.
    let (status, message, _) = emulator.ribcl(
        "RIB_INFO",
        "write",
        &format!(
            "<INSERT_VIRTUAL_MEDIA DEVICE=\"CDROM\" IMAGE_URL=\"http://127.0.0.1:{}/boot.ipxe\"/>",
            http.port
        ),
    );
    assert_ne!(status, 0, "INSERT_VIRTUAL_MEDIA on a Standard licence");
    assert!(
        message.to_ascii_lowercase().contains("license"),
        "{message}"
    );
    let (code, text) = emulator.redfish(
        "POST",
        "/redfish/v1/Managers/1/VirtualMedia/2/Actions/VirtualMedia.InsertMedia/",
        Some(json!({"Image": format!("http://127.0.0.1:{}/boot.ipxe", http.port)})),
    );
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("LicenseKeyRequired"), "{text}");
    let licences = emulator.ribcl_ok("RIB_INFO", "read", "<GET_ALL_LICENSES/>");
    assert!(licences.contains("iLO Standard"), "{licences}");
    let state = emulator.state();
    assert_eq!(state["license"], "standard", "{state:#}");
    assert_eq!(state["machine"]["pxe_bootfile"], bootfile.as_str());
    assert_eq!(state["machine"]["running"], false, "no QEMU yet: {state:#}");

    // The MAC the iLO reports (SMBIOS type 209, port 1), as iPXE's ${mac:hexhyp} spells it.
    let host_data = emulator.ribcl_ok("SERVER_INFO", "read", "<GET_HOST_DATA/>");
    let mac = host_data
        .split("NAME=\"MAC\" VALUE=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no MAC in GET_HOST_DATA: {host_data}"))
        .to_ascii_lowercase();
    assert_eq!(mac.len(), 17, "{mac}");

    // --- SeaBIOS, over RIBCL: one-time NETWORK.
    emulator.ribcl_ok(
        "SERVER_INFO",
        "write",
        "<SET_PENDING_BOOT_MODE VALUE=\"LEGACY\"/>",
    );
    emulator.ribcl_ok(
        "SERVER_INFO",
        "write",
        "<SET_ONE_TIME_BOOT value=\"NETWORK\"/>",
    );
    let once = emulator.ribcl_ok("SERVER_INFO", "read", "<GET_ONE_TIME_BOOT/>");
    assert!(once.contains("VALUE=\"NETWORK\""), "{once}");
    emulator.ribcl_ok(
        "SERVER_INFO",
        "write",
        "<SET_HOST_POWER HOST_POWER=\"Yes\"/>",
    );
    let devices = emulator.last_devices();
    let nic = device(&devices, "virtio-net-pci");
    assert_eq!(nic["bootindex"], 0, "{nic}");
    assert!(nic.get("romfile").is_none(), "the NIC keeps its ROM: {nic}");
    assert_eq!(
        nic["mac"].as_str().map(|m| m.replace(':', "-")),
        Some(mac.clone())
    );
    let bios = wait_for(&emulator, "SeaBIOS's iPXE fetching the chained URL", || {
        http.count(&mac, "pcbios") >= 1
    });
    let seen = http.seen();
    assert!(
        seen.first().map(String::as_str) == Some("/boot.ipxe"),
        "iPXE fetched the DHCP boot file first: {seen:?}"
    );
    assert!(
        seen.iter().all(|p| !p.ends_with("/efi")),
        "SeaBIOS is not EFI: {seen:?}"
    );
    let state = emulator.state();
    assert_eq!(state["machine"]["firmware"], "SeaBIOS", "{state:#}");
    assert_eq!(state["machine"]["boot_device"], "NETWORK", "{state:#}");
    assert_eq!(state["last_boot"]["reason"], "one_time", "{state:#}");
    let once = emulator.ribcl_ok("SERVER_INFO", "read", "<GET_ONE_TIME_BOOT/>");
    assert!(once.contains("VALUE=\"Normal\""), "consumed: {once}");

    // The boot after falls back to the persistent order: HDD, the disk first.
    emulator.ribcl_ok("SERVER_INFO", "write", "<RESET_SERVER/>");
    let state = emulator.state();
    assert_eq!(state["last_boot"]["reason"], "persistent", "{state:#}");
    assert_eq!(state["last_boot"]["device"], "HDD", "{state:#}");
    assert_eq!(state["machine"]["boot_device"], "HDD", "{state:#}");
    let devices = emulator.last_devices();
    assert_eq!(device(&devices, "virtio-blk-pci")["bootindex"], 0);
    assert_ne!(device(&devices, "virtio-net-pci")["bootindex"], 0);

    // Persistent NETWORK first: every boot is a network boot.
    emulator.ribcl_ok(
        "SERVER_INFO",
        "write",
        "<SET_PERSISTENT_BOOT><DEVICE VALUE=\"NETWORK\"/><DEVICE VALUE=\"HDD\"/></SET_PERSISTENT_BOOT>",
    );
    let persistent = emulator.ribcl_ok("SERVER_INFO", "read", "<GET_PERSISTENT_BOOT/>");
    let first = persistent.split("<DEVICE").nth(1).unwrap_or_default();
    assert!(first.contains("\"NETWORK\""), "{persistent}");
    let before = http.count(&mac, "pcbios");
    emulator.ribcl_ok("SERVER_INFO", "write", "<RESET_SERVER/>");
    let state = emulator.state();
    assert_eq!(state["last_boot"]["reason"], "persistent", "{state:#}");
    assert_eq!(state["machine"]["boot_device"], "NETWORK", "{state:#}");
    assert_eq!(
        device(&emulator.last_devices(), "virtio-net-pci")["bootindex"],
        0
    );
    wait_for(&emulator, "a persistent network boot in SeaBIOS", || {
        http.count(&mac, "pcbios") > before
    });
    // Back to the disk first, so the UEFI part tests the one-time override alone.
    emulator.ribcl_ok(
        "SERVER_INFO",
        "write",
        "<SET_PERSISTENT_BOOT><DEVICE VALUE=\"HDD\"/></SET_PERSISTENT_BOOT>",
    );

    // --- OVMF, over Redfish: boot mode Uefi (the BIOS settings), one-time Pxe, power cycle.
    emulator.redfish_ok(
        "PATCH",
        "/redfish/v1/systems/1/bios/settings/",
        json!({"Attributes": {"BootMode": "Uefi", "UefiOptimizedBoot": "Enabled"}}),
    );
    emulator.redfish_ok(
        "PATCH",
        "/redfish/v1/Systems/1/",
        json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}}),
    );
    let boot = emulator.system()["Boot"].clone();
    assert_eq!(boot["BootSourceOverrideTarget"], "Pxe", "{boot}");
    assert_eq!(boot["BootSourceOverrideEnabled"], "Once", "{boot}");
    emulator.redfish_ok(
        "POST",
        "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset/",
        json!({"ResetType": "PowerCycle"}),
    );
    let state = emulator.state();
    assert_eq!(state["machine"]["firmware"], "OVMF", "{state:#}");
    assert_eq!(state["machine"]["boot_device"], "NETWORK", "{state:#}");
    let nic = device(&emulator.last_devices(), "virtio-net-pci").clone();
    assert_eq!(nic["bootindex"], 0, "{nic}");
    assert!(nic.get("romfile").is_none(), "{nic}");
    let uefi = wait_for(&emulator, "OVMF's iPXE fetching the chained URL", || {
        http.count(&mac, "efi") >= 1
    });
    let boot = emulator.system()["Boot"].clone();
    assert_eq!(
        boot["BootSourceOverrideEnabled"], "Disabled",
        "consumed: {boot}"
    );
    assert_eq!(boot["BootSourceOverrideMode"], "UEFI", "{boot}");

    // Continuous Pxe: persistent, in UEFI.
    emulator.redfish_ok(
        "PATCH",
        "/redfish/v1/Systems/1/",
        json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Continuous"}}),
    );
    let before = http.count(&mac, "efi");
    emulator.redfish_ok(
        "POST",
        "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset/",
        json!({"ResetType": "ForceRestart"}),
    );
    let state = emulator.state();
    assert_eq!(state["last_boot"]["reason"], "persistent", "{state:#}");
    assert_eq!(state["machine"]["boot_device"], "NETWORK", "{state:#}");
    wait_for(&emulator, "a continuous network boot in OVMF", || {
        http.count(&mac, "efi") > before
    });
    let boot = emulator.system()["Boot"].clone();
    assert_eq!(boot["BootSourceOverrideEnabled"], "Continuous", "{boot}");
    assert_eq!(boot["BootSourceOverrideTarget"], "Pxe", "{boot}");
    eprintln!(
        "network boots: SeaBIOS to iPXE's chain {bios:.1?}, OVMF {uefi:.1?}, whole test {:.1?}",
        started.elapsed()
    );

    // Power off ends QEMU; the emulator's end leaves none behind.
    emulator.redfish_ok(
        "POST",
        "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset/",
        json!({"ResetType": "ForceOff"}),
    );
    assert_eq!(emulator.state()["machine"]["running"], false);
    let pids = emulator.qemu_pids();
    assert!(pids.len() >= 5, "one QEMU per boot: {pids:?}");
    drop(emulator);
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "QEMU processes left behind: {left:?}");
}
