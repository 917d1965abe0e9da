//! The iLO emulator with its QEMU backend (`ilo-emulator --backend qemu`): each emulated server is
//! a real QEMU (TCG) machine (docs/architecture.md §9, docs/qemu-and-boot.md §6–§8).
//!
//! - Bad media, without booting Linux: an ISO URL that 404s and an unreachable floppy URL are
//!   refused at insert as an iLO refuses them, with QEMU never started; an ISO that serves garbage
//!   boots to SeaBIOS's "No bootable device"; a URL that stops answering between insert and power
//!   on (an expired temporary URL, a stopped media server) leaves the drive empty, the machine in
//!   firmware and the error in the admin state. Power off ends QEMU. A pending UEFI boot mode
//!   makes the next power-on run OVMF, whose variables land in the server's own store.
//! - The deploy, through proliantutils (RIBCL), in legacy BIOS (SeaBIOS, 256 MiB) and in UEFI
//!   (OVMF, 512 MiB): the deploy ISO and a parameter floppy (made by mkfs.vfat and mcopy) are
//!   inserted by URL, the CD set to boot once, the pending boot mode set, the server powered on;
//!   the agent boots from the USB CD, finds the USB key by its label and calls
//!   `pass_deploy_info` on a host stand-in reached only through the emulator's `--guest-forward`.
//!   In BIOS the test then plays the conductor: the image (a boot sector that prints a marker and
//!   powers off) goes through the forwarded iSCSI and `done` ports, the floppy is ejected, the
//!   persistent boot set to HDD and the server reset; the new machine boots the disk, and its
//!   power-off reads Off over Redfish and RIBCL within seconds of the boot sector's marker.
//!
//! Every test holds the emulator in a guard whose drop kills it; QEMU dies with it (parent-death
//! signal), which each test checks at its end, also for the QEMU pids it saw.

#[path = "ilo_emulator_support.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{EmulatorProcess, PASSWORD, USER};
use vmdeploy_integration_tests::emulator::MediaServer;
use vmdeploy_integration_tests::iscsi_standin::{self, IscsiStandin, StandinConfig};
use vmdeploy_integration_tests::qemu::alive;
use vmdeploy_integration_tests::{deploy_iso, venv_bin};

/// TCG on two busy cores (docs/qemu-and-boot.md §9 item 7).
const BOOT_LIMIT: Duration = Duration::from_secs(180);
const NODE: &str = "0b6f3c4e-7d1a-4f59-9c2e-3a5b7d9e1f20";
const KEY: &str = "EMULQEMU0123456789ABCDEFGHIJKLMN";

fn iqn() -> String {
    format!("iqn-{NODE}")
}

/// A scratch directory short enough for QMP socket paths.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("iloq")
        .tempdir_in("/var/tmp")
        .expect("scratch dir")
}

/// The emulator with the QEMU backend, and the QEMU pids the test saw (checked gone at the end).
struct QemuEmulator {
    emulator: Option<EmulatorProcess>,
    addr: String,
    seen_pids: Vec<u32>,
}

impl QemuEmulator {
    fn start(dir: &Path, extra: &[&str]) -> QemuEmulator {
        let state = dir.join("state");
        let state = state.to_str().expect("UTF-8 path").to_owned();
        let mut args = vec!["--backend", "qemu", "--qemu-state-dir", &state];
        args.extend_from_slice(extra);
        let emulator = EmulatorProcess::start(dir, 1, &args);
        let addr = emulator.addrs[0].clone();
        QemuEmulator {
            emulator: Some(emulator),
            addr,
            seen_pids: Vec::new(),
        }
    }

    fn log_tail(&self) -> String {
        self.emulator
            .as_ref()
            .map(|e| e.log_tail())
            .unwrap_or_default()
    }

    fn curl(&self, args: &[&str]) -> String {
        vmdeploy_integration_tests::tools::curl(args)
    }

    /// `GET /_emulator/state`; remembers the QEMU pid it shows.
    fn state(&mut self) -> Value {
        let text = self.curl(&[&format!("https://{}/_emulator/state", self.addr)]);
        let state: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("state is not JSON ({e}): {text}"));
        if let Some(pid) = state["machine"]["pid"].as_u64() {
            let pid = pid as u32;
            if !self.seen_pids.contains(&pid) {
                self.seen_pids.push(pid);
            }
        }
        state
    }

    fn console(&self) -> String {
        self.curl(&[&format!("https://{}/_emulator/console", self.addr)])
    }

    /// One RIBCL command (raw XML, as proliantutils sends it); returns the reply's STATUS and
    /// MESSAGE of the command's document (the last non-zero status, else the last message).
    fn ribcl(&self, block: &str, mode: &str, command: &str) -> (u32, String) {
        ribcl_result(&self.ribcl_raw(block, mode, command))
    }

    /// GET_HOST_POWER_STATUS: the reply's STATUS and HOST_POWER.
    fn ribcl_power(&self) -> (u32, String) {
        let reply = self.ribcl_raw("SERVER_INFO", "read", "<GET_HOST_POWER_STATUS/>");
        let power = reply
            .split_once("HOST_POWER=\"")
            .and_then(|(_, rest)| rest.split('"').next())
            .unwrap_or_default()
            .to_owned();
        (ribcl_result(&reply).0, power)
    }

    /// One RIBCL command; the whole reply.
    fn ribcl_raw(&self, block: &str, mode: &str, command: &str) -> String {
        let body = format!(
            "<RIBCL VERSION=\"2.0\"><LOGIN USER_LOGIN=\"{USER}\" PASSWORD=\"{PASSWORD}\">\
             <{block} MODE=\"{mode}\">{command}</{block}></LOGIN></RIBCL>\r\n"
        );
        self.curl(&[
            "-X",
            "POST",
            "--data-binary",
            &body,
            &format!("https://{}/ribcl", self.addr),
        ])
    }

    /// Polls the state until `pred` holds, or fails with the state, console and log.
    fn wait_state(&mut self, what: &str, limit: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let state = self.state();
            if pred(&state) {
                return state;
            }
            if Instant::now() > deadline {
                panic!(
                    "{what}: not within {limit:?}; state: {state:#}\n--- console\n{}\n--- emulator log\n{}",
                    self.console(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Waits until the console shows `needle` `times` times.
    fn wait_console(&mut self, needle: &str, times: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let console = self.console();
            if console.matches(needle).count() >= times {
                return;
            }
            if Instant::now() > deadline {
                let state = self.state();
                panic!(
                    "{needle:?} ×{times} not on the console within {limit:?}; console:\n{console}\n\
                     --- state: {state:#}\n--- emulator log\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The pids of every QEMU the emulator started, from its log (`QEMU started ... pid=N`),
    /// plus those the state showed.
    fn started_pids(&self) -> Vec<u32> {
        let log = self
            .emulator
            .as_ref()
            .map(|e| std::fs::read_to_string(&e.log).unwrap_or_default())
            .unwrap_or_default();
        let mut pids: Vec<u32> = log
            .lines()
            .filter(|l| l.contains("QEMU started"))
            .filter_map(|l| l.split_once(" pid=").map(|(_, rest)| rest))
            .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
            .collect();
        pids.extend(&self.seen_pids);
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Kills the emulator (SIGKILL) and checks that no QEMU it started is left.
    fn stop_and_check_no_qemu_left(mut self) {
        let pids = self.started_pids();
        assert!(!pids.is_empty(), "no QEMU start in the emulator log");
        drop(self.emulator.take());
        assert_no_qemu_left(&pids);
    }
}

impl Drop for QemuEmulator {
    fn drop(&mut self) {
        // Also on a failed assert: the emulator dies, its QEMUs with it (parent-death signal).
        drop(self.emulator.take());
    }
}

/// The STATUS and MESSAGE of a RIBCL reply's command document (the last non-zero status, else
/// the last message).
fn ribcl_result(reply: &str) -> (u32, String) {
    let mut result = (0, String::new());
    for doc in reply.split("<RESPONSE").skip(1) {
        let attr = |name: &str| {
            doc.split_once(&format!("{name}="))
                .and_then(|(_, rest)| {
                    let q = rest.chars().next()?;
                    rest[1..].split(q).next().map(str::to_owned)
                })
                .unwrap_or_default()
        };
        let status =
            u32::from_str_radix(attr("STATUS").trim_start_matches("0x"), 16).expect("a hex STATUS");
        let message = attr("MESSAGE");
        if status != 0 || result.0 == 0 {
            result = (status, message);
        }
    }
    result
}

fn assert_no_qemu_left(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "QEMU processes left behind: {left:?}");
}

fn ok(what: &str, (status, message): (u32, String)) {
    assert_eq!(status, 0, "{what}: STATUS 0x{status:04X} {message}");
}

/// Bad media end as on an iLO and leave QEMU off or in firmware, never hung; no Linux boot.
#[test]
fn bad_media_end_like_an_ilo_and_leave_qemu_off_or_in_firmware() {
    let dir = scratch();
    let garbage: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let media = MediaServer::start(vec![
        ("/garbage.iso", garbage.clone()),
        ("/expiring.iso", garbage),
    ]);
    let gone = MediaServer::start(vec![("/params.img", vec![0u8; 1_474_560])]);
    let mut emu = QemuEmulator::start(dir.path(), &[]);

    // An ISO URL that 404s: the insert fails as on an iLO, nothing is inserted, no QEMU runs.
    let (status, message) = emu.ribcl(
        "RIB_INFO",
        "write",
        &format!(
            "<INSERT_VIRTUAL_MEDIA DEVICE=\"CDROM\" IMAGE_URL=\"{}\"/>",
            media.url("/missing.iso")
        ),
    );
    assert_ne!(status, 0, "a 404 ISO was accepted: {message}");
    assert!(message.contains("404"), "{message}");
    // An unreachable floppy URL: the same.
    let closed = format!(
        "http://127.0.0.1:{}/params.img",
        vmdeploy_integration_tests::free_port()
    );
    let (status, message) = emu.ribcl(
        "RIB_INFO",
        "write",
        &format!("<INSERT_VIRTUAL_MEDIA DEVICE=\"FLOPPY\" IMAGE_URL=\"{closed}\"/>"),
    );
    assert_ne!(status, 0, "an unreachable floppy was accepted: {message}");
    let state = emu.state();
    assert_eq!(state["vmedia"]["CDROM"]["inserted"], false, "{state:#}");
    assert_eq!(state["vmedia"]["FLOPPY"]["inserted"], false, "{state:#}");
    assert_eq!(state["power"], "OFF");
    assert_eq!(state["machine"]["kind"], "qemu");
    assert_eq!(state["machine"]["running"], false, "{state:#}");

    // Garbage behind a good URL: QEMU reads it by range, SeaBIOS cannot boot it and stays in
    // firmware.
    ok(
        "insert garbage",
        emu.ribcl(
            "RIB_INFO",
            "write",
            &format!(
                "<INSERT_VIRTUAL_MEDIA DEVICE=\"CDROM\" IMAGE_URL=\"{}\"/>",
                media.url("/garbage.iso")
            ),
        ),
    );
    ok(
        "boot once",
        emu.ribcl(
            "RIB_INFO",
            "write",
            "<SET_VM_STATUS DEVICE=\"CDROM\"><VM_BOOT_OPTION VALUE=\"BOOT_ONCE\"/></SET_VM_STATUS>",
        ),
    );
    ok(
        "power on",
        emu.ribcl(
            "SERVER_INFO",
            "write",
            "<SET_HOST_POWER HOST_POWER=\"Yes\"/>",
        ),
    );
    let state = emu.wait_state("QEMU running", Duration::from_secs(30), |s| {
        s["machine"]["running"] == true
    });
    assert_eq!(state["power"], "ON");
    assert_eq!(state["machine"]["firmware"], "SeaBIOS");
    assert_eq!(
        state["machine"]["media"]["CDROM"]["attached"], true,
        "{state:#}"
    );
    assert_eq!(state["machine"]["media"]["CDROM"]["error"], Value::Null);
    for key in ["serial_log", "disk", "qmp_socket"] {
        let path = state["machine"][key].as_str().expect("a path");
        assert!(Path::new(path).exists(), "{key} {path} missing");
    }
    for port in ["3260", "9999", "10000"] {
        assert!(
            state["machine"]["forwards"][port].as_u64().is_some(),
            "no host port for {port}: {state:#}"
        );
    }
    assert!(alive(state["machine"]["pid"].as_u64().expect("pid") as u32));
    // The NIC has the MAC the iLO reports for port 1 (SMBIOS type 209 in GET_HOST_DATA).
    let mac = state["machine"]["mac"].as_str().expect("a MAC");
    let host_data = emu.ribcl_raw("SERVER_INFO", "read", "<GET_HOST_DATA/>");
    assert!(
        host_data.contains(&format!("VALUE=\"{}\"", mac.replace(':', "-"))),
        "{mac} not in {host_data}"
    );
    emu.wait_console("Booting from DVD/CD", 1, BOOT_LIMIT);
    emu.wait_console("No bootable device", 1, BOOT_LIMIT);
    let console = emu.console();
    assert!(
        console.contains("Could not read from CDROM")
            || console.contains("not a bootable")
            || console.contains("Boot failed"),
        "{console}"
    );

    // Power off: QEMU ends.
    let pid = emu.state()["machine"]["pid"].as_u64().expect("pid") as u32;
    ok(
        "power off",
        emu.ribcl("SERVER_INFO", "write", "<HOLD_PWR_BTN TOGGLE=\"NO\"/>"),
    );
    let state = emu.wait_state("QEMU stopped", Duration::from_secs(20), |s| {
        s["machine"]["running"] == false
    });
    assert_eq!(state["power"], "OFF");
    assert_no_qemu_left(&[pid]);

    // URLs that were fine at insert but stop answering by power-on: the drives stay empty, the
    // machine runs in firmware, the errors show.
    ok(
        "insert expiring",
        emu.ribcl(
            "RIB_INFO",
            "write",
            &format!(
                "<INSERT_VIRTUAL_MEDIA DEVICE=\"CDROM\" IMAGE_URL=\"{}\"/>",
                media.url("/expiring.iso")
            ),
        ),
    );
    ok(
        "insert floppy",
        emu.ribcl(
            "RIB_INFO",
            "write",
            &format!(
                "<INSERT_VIRTUAL_MEDIA DEVICE=\"FLOPPY\" IMAGE_URL=\"{}\"/>",
                gone.url("/params.img")
            ),
        ),
    );
    for device in ["CDROM", "FLOPPY"] {
        ok(
            "connect",
            emu.ribcl(
                "RIB_INFO",
                "write",
                &format!(
                    "<SET_VM_STATUS DEVICE=\"{device}\"><VM_BOOT_OPTION VALUE=\"CONNECT\"/></SET_VM_STATUS>"
                ),
            ),
        );
    }
    media.withdraw("/expiring.iso");
    drop(gone);
    ok(
        "power on again",
        emu.ribcl(
            "SERVER_INFO",
            "write",
            "<SET_HOST_POWER HOST_POWER=\"Yes\"/>",
        ),
    );
    let state = emu.wait_state("QEMU running again", Duration::from_secs(60), |s| {
        s["machine"]["running"] == true
    });
    assert_eq!(state["power"], "ON");
    let cd = &state["machine"]["media"]["CDROM"];
    assert_eq!(cd["attached"], false, "{state:#}");
    assert!(
        cd["error"].as_str().is_some_and(|e| e.contains("404")),
        "{state:#}"
    );
    let fd = &state["machine"]["media"]["FLOPPY"];
    assert_eq!(fd["attached"], false, "{state:#}");
    assert!(fd["error"].is_string(), "{state:#}");
    assert!(
        state["last_boot"]["media_read_error"].is_string(),
        "{state:#}"
    );
    emu.wait_console("No bootable device", 2, BOOT_LIMIT);
    // The iLO still answers while the machine sits in firmware.
    let (status, _) = emu.ribcl("SERVER_INFO", "read", "<GET_HOST_POWER_STATUS/>");
    assert_eq!(status, 0);

    // UEFI pending: the next power-on runs OVMF with the server's own variable store, which
    // OVMF writes (its boot options) and which stays for later boots.
    ok(
        "power off before UEFI",
        emu.ribcl("SERVER_INFO", "write", "<HOLD_PWR_BTN TOGGLE=\"NO\"/>"),
    );
    ok(
        "pending UEFI",
        emu.ribcl(
            "SERVER_INFO",
            "write",
            "<SET_PENDING_BOOT_MODE VALUE=\"UEFI\"/>",
        ),
    );
    ok(
        "power on UEFI",
        emu.ribcl(
            "SERVER_INFO",
            "write",
            "<SET_HOST_POWER HOST_POWER=\"Yes\"/>",
        ),
    );
    let state = emu.wait_state("OVMF running", Duration::from_secs(60), |s| {
        s["machine"]["running"] == true
    });
    assert_eq!(state["machine"]["firmware"], "OVMF", "{state:#}");
    assert_eq!(state["boot_mode"]["current"], "UEFI");
    emu.wait_console("BdsDxe", 1, BOOT_LIMIT);
    ok(
        "power off after UEFI",
        emu.ribcl("SERVER_INFO", "write", "<HOLD_PWR_BTN TOGGLE=\"NO\"/>"),
    );
    let state = emu.wait_state("OVMF stopped", Duration::from_secs(20), |s| {
        s["machine"]["running"] == false
    });
    let vars = std::fs::read(state["machine"]["ovmf_vars"].as_str().expect("vars path"))
        .expect("the server's OVMF variable store is kept");
    let template =
        std::fs::read("/usr/share/OVMF/OVMF_VARS_4M.fd").expect("reading the OVMF template");
    assert_eq!(vars.len(), template.len());
    assert!(
        vars != template,
        "OVMF wrote nothing to the server's variable store"
    );

    // The emulator dies with its machine running (SIGKILL: no clean-up code runs); the
    // parent-death signal takes QEMU along.
    ok(
        "power on to leave it running",
        emu.ribcl(
            "SERVER_INFO",
            "write",
            "<SET_HOST_POWER HOST_POWER=\"Yes\"/>",
        ),
    );
    let state = emu.wait_state("QEMU running at the end", Duration::from_secs(60), |s| {
        s["machine"]["running"] == true
    });
    let last = state["machine"]["pid"].as_u64().expect("pid") as u32;
    assert!(alive(last));
    emu.stop_and_check_no_qemu_left();
}

/// The parameter floppy as the conductor writes it, made by mkfs.vfat + mcopy (not our writer).
fn floppy_with(dir: &Path, params: &str) -> PathBuf {
    let img = dir.join("params.img");
    let txt = dir.join("parameters.txt");
    std::fs::write(&txt, params).expect("parameters.txt");
    let mkfs = Command::new("mkfs.vfat")
        .args(["-C", "-n", "ir-vfd-dev"])
        .arg(&img)
        .arg("1440")
        .output()
        .expect("running mkfs.vfat (apt-get install dosfstools)");
    assert!(
        mkfs.status.success(),
        "{}",
        String::from_utf8_lossy(&mkfs.stderr)
    );
    let mcopy = Command::new("mcopy")
        .arg("-i")
        .arg(&img)
        .arg(&txt)
        .arg("::parameters.txt")
        .output()
        .expect("running mcopy (apt-get install mtools)");
    assert!(
        mcopy.status.success(),
        "{}",
        String::from_utf8_lossy(&mcopy.stderr)
    );
    img
}

/// What the test's boot sector prints on COM1 before it powers the machine off.
const DISK_MARKER: &str = "VMDEPLOY-DISK-BOOTED";

/// A 1 MiB disk image whose MBR boot code prints [`DISK_MARKER`] on COM1 and powers a q35
/// machine off through the ICH9 PM1a control register (port 0x604, SLP_EN with QEMU's S5 type
/// 0). Hand-assembled 16-bit code, loaded at 0x7c00:
/// `xor ax,ax; mov ds,ax; mov dx,0x3f8; mov si,msg; l: lodsb; test al,al; jz d; out dx,al;
/// jmp l; d: mov dx,0x604; mov ax,0x2000; out dx,ax; h: cli; hlt; jmp h; msg: ...`.
fn boot_sector_image() -> Vec<u8> {
    let mut mbr = vec![
        0x31, 0xC0, 0x8E, 0xD8, 0xBA, 0xF8, 0x03, 0xBE, 0x1D, 0x7C, 0xAC, 0x84, 0xC0, 0x74, 0x03,
        0xEE, 0xEB, 0xF8, 0xBA, 0x04, 0x06, 0xB8, 0x00, 0x20, 0xEF, 0xFA, 0xF4, 0xEB, 0xFC,
    ];
    assert_eq!(mbr.len(), 0x1D, "the message address in `mov si` is 0x7c1d");
    mbr.extend_from_slice(format!("\r\n{DISK_MARKER}\r\n\0").as_bytes());
    mbr.resize(510, 0);
    mbr.extend_from_slice(&[0x55, 0xAA]);
    mbr.resize(1 << 20, 0);
    mbr
}

/// A deploy booted through the emulator: the scratch directory, the stand-in that got
/// `pass_deploy_info`, the emulator and its state right after the power-on.
struct Booted {
    dir: tempfile::TempDir,
    _standin: IscsiStandin,
    _media: MediaServer,
    emu: QemuEmulator,
    state: Value,
}

/// proliantutils inserts the deploy ISO and the floppy, sets boot once CD, sets the pending boot
/// mode (`uefi`) and powers on; the agent boots from the USB CD, reads the USB key and reaches
/// the stand-in through the guest forward with the right key, IQN and address.
fn boot_the_deploy_iso(uefi: bool, memory_mib: &str) -> Booted {
    let dir = scratch();
    let iso = deploy_iso::deploy_iso();
    let standin = IscsiStandin::start(StandinConfig {
        node: NODE.into(),
        key: KEY.into(),
        iqn: iqn(),
        fail_first: 0,
        tls: None,
    });
    let standin_port: u16 = standin
        .api_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the stand-in URL ends with its port");
    // The guest reaches the stand-in only through the forward, at 10.0.2.100.
    let params = format!(
        "deployment_id={NODE}\ndeployment_key={KEY}\niscsi_target_iqn={}\n\
         ironic_api_url=http://10.0.2.100:{standin_port}\ndisk=vda\nboot_option=netboot\n\
         boot_mode={}\n",
        iqn(),
        if uefi { "uefi" } else { "bios" }
    );
    let floppy = floppy_with(dir.path(), &params);
    let media = MediaServer::start(vec![
        ("/deploy.iso", std::fs::read(&iso).expect("reading the ISO")),
        (
            "/params.img",
            std::fs::read(&floppy).expect("reading the floppy"),
        ),
    ]);
    let forward = format!("127.0.0.1:{standin_port}");
    let mut emu = QemuEmulator::start(
        dir.path(),
        &["--guest-forward", &forward, "--qemu-memory-mib", memory_mib],
    );

    let script = r#"
import sys
from proliantutils.ilo import ribcl
ilo, user, password, iso, floppy, mode = sys.argv[1:7]
r = ribcl.RIBCLOperations(ilo, user, password, timeout=120, port=None)
r.set_pending_boot_mode(mode)
assert r.get_pending_boot_mode() == mode, r.get_pending_boot_mode()
r.insert_virtual_media(iso, device='CDROM')
r.set_vm_status(device='CDROM', boot_option='BOOT_ONCE', write_protect='YES')
r.insert_virtual_media(floppy, device='FLOPPY')
r.set_vm_status(device='FLOPPY', boot_option='CONNECT', write_protect='YES')
assert r.get_vm_status('FLOPPY')['IMAGE_INSERTED'] == 'YES'
r.set_host_power('ON')
assert r.get_host_power_status() == 'ON', r.get_host_power_status()
print('powered on')
"#;
    let out = Command::new(venv_bin("python"))
        .args(["-c", script, &emu.addr, USER, PASSWORD])
        .arg(media.url("/deploy.iso"))
        .arg(media.url("/params.img"))
        .arg(if uefi { "UEFI" } else { "LEGACY" })
        .output()
        .expect("running proliantutils");
    assert!(
        out.status.success(),
        "proliantutils failed:\n{}\n{}\n--- emulator log\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        emu.log_tail()
    );
    let state = emu.wait_state("QEMU running", Duration::from_secs(60), |s| {
        s["machine"]["running"] == true
    });
    assert_eq!(state["last_boot"]["device"], "CDROM", "{state:#}");
    assert_eq!(state["last_boot"]["reason"], "vmedia_boot_once");
    assert_eq!(state["machine"]["memory_mib"].to_string(), memory_mib);
    assert_eq!(
        state["machine"]["firmware"],
        if uefi { "OVMF" } else { "SeaBIOS" },
        "{state:#}"
    );
    assert_eq!(
        state["machine"]["media"]["CDROM"]["attached"], true,
        "{state:#}"
    );
    assert_eq!(
        state["machine"]["media"]["FLOPPY"]["attached"], true,
        "{state:#}"
    );
    assert_eq!(
        state["machine"]["guest_forwards"][0]["host"],
        forward.as_str()
    );

    let started = Instant::now();
    let received = loop {
        let got = standin.received();
        if !got.is_empty() {
            break got;
        }
        if started.elapsed() > BOOT_LIMIT {
            panic!(
                "no pass_deploy_info within {BOOT_LIMIT:?}; console:\n{}\n--- state {:#}\n--- emulator log\n{}",
                emu.console(),
                emu.state(),
                emu.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let call = &received[0];
    assert_eq!(call.status, 202, "{:?}", call.problems);
    assert!(call.problems.is_empty(), "{:?}", call.problems);
    assert_eq!(call.body["address"], "10.0.2.15", "{}", call.body);
    assert_eq!(call.body["key"], KEY);
    assert_eq!(call.body["iqn"], iqn());
    let console = emu.console();
    assert!(
        console.contains("found the virtual floppy"),
        "the agent did not find the USB key:\n{console}"
    );
    eprintln!(
        "{}: pass_deploy_info {:.1?} after power-on",
        if uefi { "UEFI" } else { "BIOS" },
        started.elapsed()
    );
    Booted {
        dir,
        _standin: standin,
        _media: media,
        emu,
        state,
    }
}

/// The deploy in UEFI (OVMF, 512 MiB: GRUB's EFI heap needs more than 256 MiB, docs/qemu-and-boot.md §6),
/// then power off through RIBCL.
#[test]
fn proliantutils_boots_the_deploy_iso_in_uefi_on_the_qemu_backend() {
    let Booted { mut emu, .. } = boot_the_deploy_iso(true, "512");
    ok(
        "power off",
        emu.ribcl("SERVER_INFO", "write", "<HOLD_PWR_BTN TOGGLE=\"NO\"/>"),
    );
    let state = emu.wait_state("QEMU stopped", Duration::from_secs(20), |s| {
        s["machine"]["running"] == false
    });
    assert_eq!(state["power"], "OFF");
    assert_eq!(state["boot_mode"]["current"], "UEFI");
    emu.stop_and_check_no_qemu_left();
}

/// The deploy in legacy BIOS in 256 MiB (the agent must work in small machines; the default is
/// 1 GiB); then the conductor's part through the forwarded agent ports, and the reboot into the
/// deployed disk, whose guest power-off turns the server off.
#[test]
fn proliantutils_boots_the_deploy_iso_on_the_qemu_backend_and_the_agent_reports() {
    let Booted {
        dir,
        mut emu,
        state,
        ..
    } = boot_the_deploy_iso(false, "256");

    // The conductor's part: the image through the forwarded target port, `done` through the
    // forwarded port 10000 (host ports from the admin state).
    let forwards = &state["machine"]["forwards"];
    let port = |guest: &str| {
        forwards[guest]
            .as_u64()
            .unwrap_or_else(|| panic!("no host port for {guest}: {state:#}"))
    };
    let image = boot_sector_image();
    let image_path = dir.path().join("image.raw");
    std::fs::write(&image_path, &image).expect("writing the image");
    let done: std::net::SocketAddr = format!("127.0.0.1:{}", port("10000"))
        .parse()
        .expect("an address");
    if let Err(e) = iscsi_standin::write_and_notify(
        &format!("127.0.0.1:{}", port("3260")),
        &iqn(),
        &image_path,
        done,
        BOOT_LIMIT,
    ) {
        panic!("{e}; console:\n{}", emu.console());
    }
    emu.wait_console("disk flushed", 1, BOOT_LIMIT);

    // As ironic ends an iSCSI deploy: media out, boot from the disk, reboot. The emulator starts
    // a new machine that boots the written disk; the boot sector prints its marker and powers
    // off, and the emulator reports the server off, as an iLO does when the OS shuts down.
    ok(
        "eject floppy",
        emu.ribcl(
            "RIB_INFO",
            "write",
            "<EJECT_VIRTUAL_MEDIA DEVICE=\"FLOPPY\"/>",
        ),
    );
    ok(
        "persistent boot HDD",
        emu.ribcl(
            "SERVER_INFO",
            "write",
            "<SET_PERSISTENT_BOOT><DEVICE VALUE=\"HDD\"/></SET_PERSISTENT_BOOT>",
        ),
    );
    ok(
        "reset",
        emu.ribcl("SERVER_INFO", "write", "<RESET_SERVER/>"),
    );
    emu.wait_console(DISK_MARKER, 1, BOOT_LIMIT);
    // The boot sector powers off right after printing its marker: a client polling the power
    // state reads Off within a second or two, over Redfish and RIBCL alike (Ironic reads it
    // after asking its agent to power off, and forces the power off when it still reads On).
    let marker_seen = Instant::now();
    let off_after = loop {
        let redfish: Value = serde_json::from_str(&emu.curl(&[
            "-u",
            &format!("{USER}:{PASSWORD}"),
            &format!("https://{}/redfish/v1/Systems/1/", emu.addr),
        ]))
        .expect("the System is JSON");
        let (status, ribcl) = emu.ribcl_power();
        if redfish["PowerState"] == "Off" && ribcl == "OFF" {
            break marker_seen.elapsed();
        }
        assert_eq!(status, 0, "GET_HOST_POWER_STATUS failed");
        assert!(
            marker_seen.elapsed() < Duration::from_secs(3),
            "still {} (Redfish) / {ribcl} (RIBCL) {:?} after the guest powered off; console:\n{}\n--- emulator log\n{}",
            redfish["PowerState"],
            marker_seen.elapsed(),
            emu.console(),
            emu.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("the guest's power-off read as Off {off_after:.1?} after its marker");
    let state = emu.wait_state(
        "the server off after the guest powered off",
        Duration::from_secs(10),
        |s| s["power"] == "OFF" && s["machine"]["running"] == false,
    );
    assert_eq!(state["boots"], 2, "{state:#}");
    assert_eq!(state["last_boot"]["device"], "HDD", "{state:#}");
    assert!(
        state["machine"]["last_exit"]
            .as_str()
            .is_some_and(|e| e.contains("guest-shutdown")),
        "{state:#}"
    );
    assert_eq!(
        state["machine"]["starts"], 2,
        "one QEMU per boot: {state:#}"
    );
    assert_eq!(emu.started_pids().len(), 2, "{:?}", emu.started_pids());
    let disk = std::fs::read(state["machine"]["disk"].as_str().expect("disk path"))
        .expect("reading the server's disk");
    assert!(disk.starts_with(&image), "the disk does not hold the image");
    emu.stop_and_check_no_qemu_left();
}
