//! [`QemuBackend`]: the machine behind an emulated iLO is a real QEMU (TCG) virtual machine.
//!
//! # Design
//! Every power-on (and every reset, and every guest reboot) starts a fresh QEMU process with the
//! firmware of the boot mode the state machine applies and the boot order it chose
//! (`bootindex`). A fresh process is the simplest way to be right about both: the firmware cannot
//! be swapped in a running QEMU, and the boot order is read by the firmware only at reset
//! (docs/qemu-and-boot.md §7). What must survive a power cycle lives in files
//! of the server's state directory: the disk image and the OVMF variable store.
//!
//! QEMU starts paused. Over QMP the backend then attaches the connected media (each URL opened by
//! QEMU's curl block driver, read by range as an iLO reads it), resets so the firmware sees the
//! final boot order, turns the guest's own reboot and power-off into a pause plus a SHUTDOWN event
//! (`set-action`), and lets the machine run. While it runs, QMP carries medium changes; its events
//! tell the emulator when the guest powered off or rebooted ([`crate::backend::MachineEvent`]).
//!
//! A medium QEMU cannot open (the URL answers 404, the server is gone) never stops the machine:
//! the drive stays empty, the firmware finds nothing there and falls through its boot order, as
//! a server whose iLO cannot reach the image does. The error shows in the admin state. QMP
//! commands have timeouts; a QEMU that does not answer is killed, so the emulator never hangs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::machine::{
    self, AttachKind, BootIndexes, DiskController, Firmware, GuestForward, MachineSpec, NicModel,
    PxeBootfile, TapName, VmediaBus,
};
use super::qmp::{Qmp, QmpError, QmpEvent};
use super::spawn::spawn_tied;
use crate::backend::{
    Backend, BackendError, BackendFuture, MachineEvent, MachineEventKind, MachineEvents,
};
use crate::state::{BootDevice, BootMode, VmDevice};
use vmdeploy_shared::error::Chain;
use vmdeploy_shared::redact::Url;

/// The agent's ports forwarded from host loopback by default: the iSCSI target, the command
/// API (agent/src/api/server.rs) and the `done` listener of the iSCSI deploy.
pub const DEFAULT_AGENT_PORTS: [u16; 3] = [3260, 9999, 10000];

/// How long QEMU's curl driver waits for the media server (per request).
const MEDIUM_TIMEOUT_SECS: u32 = 10;
/// QMP timeout for commands that open a URL (longer than the curl timeout).
const MEDIUM_QMP_TIMEOUT: Duration = Duration::from_secs(30);
/// Time for QEMU to create its QMP socket and greet.
const QMP_CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// Time for QEMU to exit after `quit` before it is killed.
const QUIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings shared by every QEMU-backed server of an emulator.
#[derive(Debug, Clone)]
pub struct QemuSettings {
    /// `qemu-system-x86_64`.
    pub qemu_binary: PathBuf,
    /// Each server's files go to `state_dir/server-<index>/`.
    pub state_dir: PathBuf,
    /// Guest RAM in MiB.
    pub memory_mib: u32,
    /// Size of each server's disk image (sparse raw file, made once).
    pub disk_size: u64,
    /// OVMF code (read-only).
    pub ovmf_code: PathBuf,
    /// OVMF variable store template, copied once per server.
    pub ovmf_vars_template: PathBuf,
    /// OVMF built with Secure Boot (it needs SMM), for the boots that enforce it.
    pub ovmf_code_secure_boot: PathBuf,
    /// Its variable store template, with Microsoft's keys enrolled (what a ProLiant ships
    /// with): shim signed by Microsoft boots, anything unsigned is refused.
    pub ovmf_vars_secure_boot_template: PathBuf,
    /// Virtual media layout.
    pub vmedia_bus: VmediaBus,
    /// NIC model.
    pub nic: NicModel,
    /// The disk's controller.
    pub disk_controller: DiskController,
    /// Host services the guest may reach.
    pub guest_forwards: Vec<GuestForward>,
    /// Guest ports forwarded from host loopback ports the backend picks.
    pub agent_ports: Vec<u16>,
    /// Capture the NIC's frames of each QEMU run to `server-<i>/net-<run>.pcap`.
    pub capture_net: bool,
    /// The guest address the host forwards go to; `None`: slirp's first DHCP address
    /// (10.0.2.15). A node with a static address (DHCP-less deploy) needs its own here.
    pub guest_ip: Option<std::net::Ipv4Addr>,
    /// The boot file slirp's DHCP hands out; set, the NIC keeps QEMU's iPXE ROM and network
    /// boots when it comes first in the boot order. `None`: no ROM, no network boot (faster).
    pub pxe_bootfile: Option<PxeBootfile>,
    /// `--qemu-tftp-root`: the directory slirp's TFTP server serves.
    pub tftp_root: Option<PathBuf>,
    /// `--qemu-tap`: the NIC is on this tap interface instead of slirp; no forwards.
    pub tap: Option<TapName>,
    /// `--qemu-netns`: the network namespace (`/run/netns/<name>`, as `ip netns add` makes it)
    /// QEMU runs in, where the tap interface is. Only QEMU's network moves there: the emulator
    /// and its media server stay where they are.
    pub netns: Option<String>,
}

impl QemuSettings {
    /// Defaults: 1 GiB RAM, 4 GiB disk, Debian's OVMF paths, USB media, virtio NIC.
    pub fn new(state_dir: PathBuf) -> Self {
        QemuSettings {
            qemu_binary: "qemu-system-x86_64".into(),
            state_dir,
            memory_mib: 1024,
            disk_size: 4 << 30,
            ovmf_code: "/usr/share/OVMF/OVMF_CODE_4M.fd".into(),
            ovmf_vars_template: "/usr/share/OVMF/OVMF_VARS_4M.fd".into(),
            ovmf_code_secure_boot: "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd".into(),
            ovmf_vars_secure_boot_template: "/usr/share/OVMF/OVMF_VARS_4M.ms.fd".into(),
            vmedia_bus: VmediaBus::Usb,
            nic: NicModel::Virtio,
            disk_controller: DiskController::VirtioBlk,
            guest_forwards: Vec::new(),
            agent_ports: DEFAULT_AGENT_PORTS.to_vec(),
            capture_net: false,
            guest_ip: None,
            pxe_bootfile: None,
            tftp_root: None,
            tap: None,
            netns: None,
        }
    }

    /// Checks that the tools are there; each failure says how to fix it.
    pub fn check(&self) -> Result<(), String> {
        let qemu = Command::new(&self.qemu_binary)
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !matches!(qemu, Ok(s) if s.success()) {
            return Err(format!(
                "{} does not run: install qemu-system-x86 (scripts/setup does) or pass \
                 --qemu-binary",
                self.qemu_binary.display()
            ));
        }
        for f in [&self.ovmf_code, &self.ovmf_vars_template] {
            if !f.is_file() {
                return Err(format!(
                    "{} is missing: install ovmf (scripts/setup does) for UEFI boots",
                    f.display()
                ));
            }
        }
        if !self.guest_forwards.is_empty() {
            let socat = Command::new("socat")
                .arg("-V")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if !matches!(socat, Ok(s) if s.success()) {
                return Err(
                    "socat does not run: install socat (QEMU's guest forwards run it)".into(),
                );
            }
        }
        if let Some(netns) = &self.netns {
            let path = netns_path(netns);
            if !path.exists() {
                return Err(format!(
                    "{} is missing: --qemu-netns names a namespace made by `ip netns add {netns}`",
                    path.display()
                ));
            }
        }
        // sun_path holds 108 bytes.
        let sock = self.state_dir.join("server-99999").join("qmp.sock");
        if sock.as_os_str().len() >= 100 {
            return Err(format!(
                "the state directory {} is too long for a unix socket path: pick a shorter one",
                self.state_dir.display()
            ));
        }
        Ok(())
    }
}

/// One medium in one run.
#[derive(Debug, Clone)]
struct Attached {
    url: String,
    node: String,
    /// The hot-plugged USB key's device id.
    device: Option<String>,
    /// The drive's read counter (`rd_bytes`) when this medium went in: a tray drive's counter
    /// runs across the media of one QEMU run.
    read_base: u64,
}

/// One QEMU process.
struct Run {
    child: Child,
    qmp: Arc<Qmp>,
    generation: u64,
    attached: [Option<Attached>; 2],
    boot: BootIndexes,
}

struct Inner {
    firmware: BootMode,
    secure_boot: bool,
    boot_device: Option<BootDevice>,
    /// What the next start attaches (FLOPPY, CDROM).
    media: [Option<String>; 2],
    run: Option<Run>,
    counter: u64,
}

#[derive(Debug, Clone, Default)]
struct MediumStatus {
    url: Option<String>,
    attached: bool,
    error: Option<String>,
    /// Bytes the machine read from the medium of `read_url` since it last went into a running
    /// machine (each power-on attaches it again: one boot's reads), counted when the run ends
    /// or the medium comes out: what an iLO would fetch over the management network for the
    /// guest's reads. Kept after the medium is ejected, until it goes in again.
    read_bytes: u64,
    /// The URL `read_bytes` counts the reads of.
    read_url: Option<String>,
}

impl MediumStatus {
    /// A new tally for `url` going into a running machine.
    fn count_for(&mut self, url: &str) {
        self.read_url = Some(url.to_owned());
        self.read_bytes = 0;
    }
}

#[derive(Debug, Clone, Default)]
struct Status {
    pid: Option<u32>,
    firmware: Option<&'static str>,
    starts: u64,
    boot_device: Option<&'static str>,
    last_exit: Option<String>,
    media: [MediumStatus; 2],
}

fn slot(device: VmDevice) -> usize {
    match device {
        VmDevice::Floppy => 0,
        VmDevice::Cdrom => 1,
    }
}

fn err(action: &'static str, reason: impl std::fmt::Display) -> BackendError {
    BackendError {
        action,
        reason: reason.to_string(),
    }
}

/// A QEMU virtual machine behind one emulated iLO.
pub struct QemuBackend {
    settings: Arc<QemuSettings>,
    index: usize,
    dir: PathBuf,
    /// (host loopback port, guest port).
    host_forwards: Vec<(u16, u16)>,
    inner: tokio::sync::Mutex<Inner>,
    status: Arc<Mutex<Status>>,
    next_generation: AtomicU64,
    /// The generation of the live run; 0 when none.
    live: Arc<AtomicU64>,
    events_tx: mpsc::UnboundedSender<MachineEvent>,
    events_rx: Mutex<Option<MachineEvents>>,
    /// The last power-off the watcher saw (a guest SHUTDOWN, or QEMU gone), recorded before its
    /// event is queued, for [`Backend::stopped_by_itself`].
    stopped: Arc<Mutex<Option<MachineEvent>>>,
}

impl std::fmt::Debug for QemuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QemuBackend")
            .field("index", &self.index)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// A loopback port free now, below the kernel's ephemeral range.
///
/// The port is kept for the server's lifetime but not held open (QEMU binds it at each power
/// on), so a port from the ephemeral range could be handed to anyone's `bind(0)` meanwhile:
/// once it went to this emulator's own listener, and QEMU could not set up the forward. Ports
/// below the range are never handed out by the kernel, only taken on purpose.
fn free_loopback_port() -> std::io::Result<u16> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low);
    if high > low {
        // A different starting point per process and call, so parallel emulators spread out.
        static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let span = u32::from(high - low);
        let start = (std::process::id() ^ nanos).wrapping_add(call.wrapping_mul(7919)) % span;
        for step in 0..span.min(512) {
            let offset = (start + step * 31) % span;
            let Ok(port) = u16::try_from(u32::from(low) + offset) else {
                continue;
            };
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Where `ip netns add NAME` keeps a network namespace.
fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// The last `max` bytes of a text file, lossily.
fn tail(path: &Path, max: usize) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = bytes.len().saturating_sub(max);
    String::from_utf8_lossy(&bytes[start..]).trim().to_owned()
}

impl QemuBackend {
    /// The backend of server `index`: makes its state directory and picks the host ports the
    /// agent's ports are forwarded from (kept for the server's lifetime).
    pub fn new(settings: Arc<QemuSettings>, index: usize) -> std::io::Result<QemuBackend> {
        let dir = settings.state_dir.join(format!("server-{index}"));
        std::fs::create_dir_all(&dir)?;
        let mut host_forwards = Vec::new();
        // On a tap the node has its own address on a real network: nothing is forwarded.
        if settings.tap.is_none() {
            for guest in &settings.agent_ports {
                host_forwards.push((free_loopback_port()?, *guest));
            }
        }
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        Ok(QemuBackend {
            settings,
            index,
            dir,
            host_forwards,
            inner: tokio::sync::Mutex::new(Inner {
                firmware: BootMode::Legacy,
                secure_boot: false,
                boot_device: None,
                media: [None, None],
                run: None,
                counter: 0,
            }),
            status: Arc::new(Mutex::new(Status::default())),
            next_generation: AtomicU64::new(0),
            live: Arc::new(AtomicU64::new(0)),
            events_tx,
            events_rx: Mutex::new(Some(events_rx)),
            stopped: Arc::new(Mutex::new(None)),
        })
    }

    fn serial_log(&self) -> PathBuf {
        self.dir.join("serial.log")
    }
    fn qemu_log(&self) -> PathBuf {
        self.dir.join("qemu.log")
    }
    fn qmp_socket(&self) -> PathBuf {
        self.dir.join("qmp.sock")
    }
    fn disk(&self) -> PathBuf {
        self.dir.join("disk.raw")
    }
    fn ovmf_vars(&self) -> PathBuf {
        self.dir.join("OVMF_VARS.fd")
    }
    /// The Secure Boot firmware's own NVRAM: its enrolled keys must not meet the plain
    /// firmware's variables, nor the other way round.
    fn ovmf_vars_secure_boot(&self) -> PathBuf {
        self.dir.join("OVMF_VARS.secboot.fd")
    }

    fn with_status(&self, f: impl FnOnce(&mut Status)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }

    /// Files a run needs: the disk (once), the SeaBIOS console switch, the OVMF variables (once,
    /// then kept: that is the server's NVRAM).
    fn prepare(&self, mode: BootMode, secure_boot: bool) -> Result<Firmware, BackendError> {
        let disk = self.disk();
        if !disk.exists() {
            std::fs::File::create(&disk)
                .and_then(|f| f.set_len(self.settings.disk_size))
                .map_err(|e| {
                    err(
                        "creating the disk image",
                        format!("{}: {e}", disk.display()),
                    )
                })?;
        }
        match mode {
            BootMode::Legacy => {
                let sercon = self.dir.join("sercon-port.bin");
                // COM1's I/O port, 0x3f8, little-endian: SeaBIOS prints to the serial port.
                std::fs::write(&sercon, 0x3f8u16.to_le_bytes()).map_err(|e| {
                    err(
                        "writing the SeaBIOS console file",
                        format!("{}: {e}", sercon.display()),
                    )
                })?;
                Ok(Firmware::SeaBios {
                    sercon_file: sercon,
                })
            }
            BootMode::Uefi => {
                let (code, template, vars) = if secure_boot {
                    (
                        &self.settings.ovmf_code_secure_boot,
                        &self.settings.ovmf_vars_secure_boot_template,
                        self.ovmf_vars_secure_boot(),
                    )
                } else {
                    (
                        &self.settings.ovmf_code,
                        &self.settings.ovmf_vars_template,
                        self.ovmf_vars(),
                    )
                };
                if !vars.exists() {
                    std::fs::copy(template, &vars).map_err(|e| {
                        err(
                            "copying the OVMF variable store",
                            format!("{}: {e}", template.display()),
                        )
                    })?;
                }
                Ok(Firmware::Ovmf {
                    code: code.clone(),
                    vars,
                    secure_boot,
                })
            }
        }
    }

    async fn start(&self, inner: &mut Inner) -> Result<(), BackendError> {
        let firmware = self.prepare(inner.firmware, inner.secure_boot)?;
        let generation = self.next_generation.fetch_add(1, Ordering::SeqCst) + 1;
        let boot = BootIndexes::for_device(inner.boot_device);
        let spec = MachineSpec {
            name: format!("ilo-emulator-server-{}", self.index),
            memory_mib: self.settings.memory_mib,
            firmware: firmware.clone(),
            disk: self.disk(),
            serial_log: self.serial_log(),
            qmp_socket: self.qmp_socket(),
            vmedia_bus: self.settings.vmedia_bus,
            nic: self.settings.nic,
            disk_controller: self.settings.disk_controller,
            mac: machine::NIC_MAC.to_owned(),
            guest_forwards: self.settings.guest_forwards.clone(),
            host_forwards: self.host_forwards.clone(),
            guest_ip: self.settings.guest_ip,
            net_capture: self
                .settings
                .capture_net
                .then(|| self.dir.join(format!("net-{generation}.pcap"))),
            pxe_bootfile: self.settings.pxe_bootfile.clone(),
            tftp_root: self.settings.tftp_root.clone(),
            tap: self.settings.tap.clone(),
            boot,
        };
        let _ = std::fs::remove_file(self.qmp_socket());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.qemu_log())
            .map_err(|e| err("opening the QEMU log", e))?;
        let args = spec.args();
        let mut cmd = Command::new(&self.settings.qemu_binary);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // Opened here and moved into the child by setns(2) between fork and exec; the file
        // stays open until the spawn has returned.
        let netns = match &self.settings.netns {
            Some(name) => Some(std::fs::File::open(netns_path(name)).map_err(|e| {
                err(
                    "starting QEMU",
                    format!("opening network namespace {name}: {e}"),
                )
            })?),
            None => None,
        };
        if let Some(netns) = &netns {
            let fd = std::os::fd::AsRawFd::as_raw_fd(netns);
            // SAFETY: the closure runs in the forked child before exec and only calls
            // setns(2), which is async-signal-safe; it allocates nothing.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    // SAFETY: `fd` is the namespace file opened above, open until the spawn
                    // returns (after exec).
                    let fd = std::os::fd::BorrowedFd::borrow_raw(fd);
                    nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let spawned = spawn_tied(cmd);
        drop(netns);
        let mut child = spawned.map_err(|e| {
            err(
                "starting QEMU",
                format!("{}: {e}", self.settings.qemu_binary.display()),
            )
        })?;
        let pid = child.id();
        tracing::info!(
            server = self.index,
            pid,
            generation,
            firmware = firmware.name(),
            boot_device = ?inner.boot_device,
            args = %args.join(" "),
            "QEMU started"
        );
        let (qmp, events) = match Qmp::connect(&self.qmp_socket(), QMP_CONNECT_TIMEOUT).await {
            Ok(c) => c,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(err(
                    "starting QEMU",
                    format!("{e}; QEMU said: {}", tail(&self.qemu_log(), 600)),
                ));
            }
        };
        self.live.store(generation, Ordering::SeqCst);
        self.with_status(|s| {
            s.pid = Some(pid);
            s.firmware = Some(firmware.name());
            s.starts += 1;
            s.boot_device = inner.boot_device.map(|d| d.ribcl());
            s.last_exit = None;
        });
        self.watch(generation, events);
        let mut run = Run {
            child,
            qmp,
            generation,
            attached: [None, None],
            boot,
        };
        for device in [VmDevice::Floppy, VmDevice::Cdrom] {
            if let Some(url) = inner.media[slot(device)].clone() {
                inner.counter += 1;
                self.attach_live(&mut run, device, &url, inner.counter)
                    .await;
            }
        }
        let go = async {
            // The firmware reads the boot order (fw_cfg "bootorder") at reset; the media added
            // above must be in it.
            run.qmp.execute("system_reset", Value::Null).await?;
            run.qmp
                .execute(
                    "set-action",
                    json!({"reboot": "shutdown", "shutdown": "pause"}),
                )
                .await?;
            run.qmp.execute("cont", Value::Null).await
        };
        if let Err(e) = go.await {
            self.live.store(0, Ordering::SeqCst);
            let _ = run.child.kill();
            let _ = run.child.wait();
            self.with_status(|s| {
                s.pid = None;
                s.last_exit = Some(format!("failed to start: {e}"));
            });
            return Err(err(
                "starting QEMU",
                format!("{e}; QEMU said: {}", tail(&self.qemu_log(), 600)),
            ));
        }
        inner.run = Some(run);
        Ok(())
    }

    /// Turns the run's QMP events into machine events until QEMU goes away.
    fn watch(&self, generation: u64, mut events: mpsc::UnboundedReceiver<QmpEvent>) {
        let tx = self.events_tx.clone();
        let live = self.live.clone();
        let status = self.status.clone();
        let stopped = self.stopped.clone();
        let index = self.index;
        tokio::spawn(async move {
            let set_exit = |what: String| {
                if let Ok(mut s) = status.lock() {
                    s.last_exit = Some(what);
                }
            };
            let send = |event: MachineEvent| {
                if event.kind == MachineEventKind::PoweredOff {
                    if let Ok(mut s) = stopped.lock() {
                        *s = Some(event.clone());
                    }
                }
                let _ = tx.send(event);
            };
            while let Some(ev) = events.recv().await {
                if ev.name != "SHUTDOWN" || ev.data["guest"] != true {
                    continue;
                }
                let reason = ev.data["reason"].as_str().unwrap_or("guest").to_owned();
                let kind = if reason == "guest-reset" {
                    MachineEventKind::GuestReset
                } else {
                    MachineEventKind::PoweredOff
                };
                tracing::info!(server = index, generation, %reason, "the guest stopped the machine");
                set_exit(format!("guest: {reason}"));
                send(MachineEvent {
                    kind,
                    generation,
                    reason,
                });
            }
            // QEMU closed QMP: it exited. Unexpected unless the backend stopped this run.
            if live.load(Ordering::SeqCst) == generation {
                tracing::warn!(server = index, generation, "QEMU exited by itself");
                set_exit("QEMU exited unexpectedly (see qemu.log)".into());
                send(MachineEvent {
                    kind: MachineEventKind::PoweredOff,
                    generation,
                    reason: "QEMU exited".into(),
                });
            }
        });
    }

    async fn stop(&self, inner: &mut Inner, why: &str) {
        let Some(mut run) = inner.run.take() else {
            return;
        };
        self.live.store(0, Ordering::SeqCst);
        for device in [VmDevice::Floppy, VmDevice::Cdrom] {
            self.count_reads(&run, device).await;
        }
        let _ = run
            .qmp
            .execute_with_timeout("quit", Value::Null, Duration::from_secs(3))
            .await;
        let deadline = Instant::now() + QUIT_TIMEOUT;
        let exited = loop {
            match run.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                _ => break None,
            }
        };
        if exited.is_none() {
            tracing::warn!(server = self.index, "QEMU did not quit: killing it");
            let _ = run.child.kill();
            let _ = run.child.wait();
        }
        tracing::info!(
            server = self.index,
            generation = run.generation,
            why,
            "QEMU stopped"
        );
        self.with_status(|s| {
            s.pid = None;
            if s.last_exit.is_none() {
                s.last_exit = Some(why.to_owned());
            }
            for m in &mut s.media {
                m.attached = false;
            }
        });
    }

    /// Attaches `url` as `device`'s medium in the running machine. Failures leave the drive
    /// empty and are recorded, never fatal: the machine runs on without that medium.
    async fn attach_live(&self, run: &mut Run, device: VmDevice, url: &str, counter: u64) {
        if run.attached[slot(device)].as_ref().map(|a| a.url.as_str()) == Some(url) {
            return;
        }
        self.detach_live(run, device).await;
        let node = format!("medium-{}-{counter}", device.ribcl().to_ascii_lowercase());
        let result = self.try_attach(run, device, url, &node, counter).await;
        let error = match result {
            Ok(device_id) => {
                let read_base = match &device_id {
                    Some(_) => 0,
                    None => self.drive_read_bytes(run, device, None).await.unwrap_or(0),
                };
                run.attached[slot(device)] = Some(Attached {
                    url: url.to_owned(),
                    node,
                    device: device_id,
                    read_base,
                });
                tracing::info!(server = self.index, ?device, url = %Url(url), "medium attached");
                None
            }
            Err(e) => {
                tracing::warn!(server = self.index, ?device, url = %Url(url), error = %Url(&e.to_string()), "medium not attached: the drive stays empty");
                Some(e)
            }
        };
        self.with_status(|s| {
            let m = &mut s.media[slot(device)];
            m.count_for(url);
            m.url = Some(url.to_owned());
            m.attached = error.is_none();
            m.error = error;
        });
    }

    /// The read counter of the drive holding `device`'s medium (`query-blockstats` of its
    /// device: the hot-plugged key `key`, or the fixed drive).
    async fn drive_read_bytes(
        &self,
        run: &Run,
        device: VmDevice,
        key: Option<&str>,
    ) -> Option<u64> {
        let id = match (key, machine::attach_kind(self.settings.vmedia_bus, device)) {
            (Some(key), _) => key.to_owned(),
            (None, AttachKind::Tray(id)) => id.to_owned(),
            (None, AttachKind::UsbKey) => return None,
        };
        let stats = run
            .qmp
            .execute_with_timeout("query-blockstats", Value::Null, Duration::from_secs(5))
            .await
            .ok()?;
        stats.as_array()?.iter().find_map(|entry| {
            let qdev = entry["qdev"].as_str()?;
            let matches = qdev == id
                || qdev.ends_with(&format!("/{id}"))
                || qdev.contains(&format!("/{id}/"));
            matches
                .then(|| entry["stats"]["rd_bytes"].as_u64())
                .flatten()
        })
    }

    /// Adds what the machine read from `device`'s medium since it went in to its tally.
    async fn count_reads(&self, run: &Run, device: VmDevice) {
        let Some(att) = run.attached[slot(device)].as_ref() else {
            return;
        };
        let Some(now) = self
            .drive_read_bytes(run, device, att.device.as_deref())
            .await
        else {
            return;
        };
        let read = now.saturating_sub(att.read_base);
        self.with_status(|s| s.media[slot(device)].read_bytes += read);
    }

    async fn try_attach(
        &self,
        run: &Run,
        device: VmDevice,
        url: &str,
        node: &str,
        counter: u64,
    ) -> Result<Option<String>, String> {
        let blockdev =
            machine::medium_blockdev(node, url, MEDIUM_TIMEOUT_SECS).map_err(|e| e.to_string())?;
        run.qmp
            .execute_with_timeout("blockdev-add", blockdev, MEDIUM_QMP_TIMEOUT)
            .await
            .map_err(|e| format!("QEMU cannot open the medium: {e}"))?;
        let plugged: Result<Option<String>, QmpError> = async {
            match machine::attach_kind(self.settings.vmedia_bus, device) {
                AttachKind::Tray(id) => {
                    run.qmp
                        .execute("blockdev-open-tray", json!({"id": id, "force": true}))
                        .await?;
                    // An empty drive has nothing to remove.
                    let _ = run
                        .qmp
                        .execute("blockdev-remove-medium", json!({"id": id}))
                        .await;
                    run.qmp
                        .execute(
                            "blockdev-insert-medium",
                            json!({"id": id, "node-name": node}),
                        )
                        .await?;
                    run.qmp
                        .execute("blockdev-close-tray", json!({"id": id}))
                        .await?;
                    Ok(None)
                }
                AttachKind::UsbKey => {
                    let id = format!("vkey{counter}");
                    run.qmp
                        .execute(
                            "device_add",
                            machine::usb_key_device(&id, node, run.boot.floppy),
                        )
                        .await?;
                    Ok(Some(id))
                }
            }
        }
        .await;
        match plugged {
            Ok(id) => Ok(id),
            Err(e) => {
                let _ = run
                    .qmp
                    .execute("blockdev-del", json!({"node-name": node}))
                    .await;
                Err(format!("QEMU cannot connect the medium: {e}"))
            }
        }
    }

    /// Removes `device`'s medium from the running machine (errors are logged: the run ends at
    /// the next power cycle anyway).
    async fn detach_live(&self, run: &mut Run, device: VmDevice) {
        self.count_reads(run, device).await;
        let Some(att) = run.attached[slot(device)].take() else {
            return;
        };
        let result: Result<(), QmpError> = async {
            match (
                &att.device,
                machine::attach_kind(self.settings.vmedia_bus, device),
            ) {
                (Some(id), _) => {
                    run.qmp.execute("device_del", json!({"id": id})).await?;
                }
                (None, AttachKind::Tray(id)) => {
                    run.qmp
                        .execute("blockdev-open-tray", json!({"id": id, "force": true}))
                        .await?;
                    run.qmp
                        .execute("blockdev-remove-medium", json!({"id": id}))
                        .await?;
                    run.qmp
                        .execute("blockdev-close-tray", json!({"id": id}))
                        .await?;
                }
                (None, AttachKind::UsbKey) => {}
            }
            // USB unplug completes asynchronously: the node is in use until the device is gone.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match run
                    .qmp
                    .execute("blockdev-del", json!({"node-name": att.node}))
                    .await
                {
                    Ok(_) => return Ok(()),
                    Err(e @ QmpError::Command { .. }) if Instant::now() >= deadline => {
                        return Err(e)
                    }
                    Err(QmpError::Command { .. }) => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        .await;
        match result {
            Ok(()) => tracing::info!(
                server = self.index,
                ?device,
                url = att.url,
                "medium detached"
            ),
            Err(e) => {
                tracing::warn!(server = self.index, ?device, error = %Chain(&e), "detaching the medium")
            }
        }
        self.with_status(|s| s.media[slot(device)].attached = false);
    }

    fn describe_now(&self) -> Value {
        let s = self.status.lock().map(|s| s.clone()).unwrap_or_default();
        let running = self.live.load(Ordering::SeqCst) != 0;
        let medium = |d: VmDevice| {
            let m = &s.media[slot(d)];
            json!({
                "url": m.url, "attached": running && m.attached, "error": m.error,
                "read_bytes": m.read_bytes, "read_url": m.read_url,
            })
        };
        let forwards: serde_json::Map<String, Value> = self
            .host_forwards
            .iter()
            .map(|(host, guest)| (guest.to_string(), json!(host)))
            .collect();
        json!({
            "kind": "qemu",
            "running": running,
            "pid": if running { s.pid } else { None },
            "starts": s.starts,
            "firmware": s.firmware,
            "boot_device": s.boot_device,
            "last_exit": s.last_exit,
            "machine": "q35",
            "accel": "tcg",
            "memory_mib": self.settings.memory_mib,
            "disk": self.disk(),
            "disk_size": self.settings.disk_size,
            "serial_log": self.serial_log(),
            "qemu_log": self.qemu_log(),
            "qmp_socket": self.qmp_socket(),
            "ovmf_vars": self.ovmf_vars(),
            "mac": machine::NIC_MAC,
            "vmedia_bus": match self.settings.vmedia_bus { VmediaBus::Usb => "usb", VmediaBus::Legacy => "legacy" },
            "forwards": forwards,
            "net_capture": self.settings.capture_net,
            "pxe_bootfile": self.settings.pxe_bootfile.as_ref().map(PxeBootfile::url),
            "tap": self.settings.tap.as_ref().map(TapName::as_str),
            "netns": self.settings.netns,
            "guest_forwards": self.settings.guest_forwards.iter().map(|f| json!({
                "guest": format!("{}:{}", f.guest_addr, f.guest_port),
                "host": f.host,
            })).collect::<Vec<_>>(),
            "media": { "FLOPPY": medium(VmDevice::Floppy), "CDROM": medium(VmDevice::Cdrom) },
        })
    }
}

impl Backend for QemuBackend {
    fn power_on(&self) -> BackendFuture<'_> {
        Box::pin(async move {
            let mut inner = self.inner.lock().await;
            // A run the guest paused by powering off is not cleaned up yet: replace it.
            self.stop(&mut inner, "replaced by a power-on").await;
            self.start(&mut inner).await
        })
    }

    fn power_off(&self) -> BackendFuture<'_> {
        Box::pin(async move {
            let mut inner = self.inner.lock().await;
            self.stop(&mut inner, "powered off by the iLO").await;
            Ok(())
        })
    }

    fn reset(&self) -> BackendFuture<'_> {
        Box::pin(async move {
            let mut inner = self.inner.lock().await;
            self.stop(&mut inner, "reset").await;
            self.start(&mut inner).await
        })
    }

    fn set_boot_device(&self, device: Option<BootDevice>) -> BackendFuture<'_> {
        Box::pin(async move {
            self.inner.lock().await.boot_device = device;
            Ok(())
        })
    }

    fn attach_media<'a>(&'a self, device: VmDevice, url: &'a str) -> BackendFuture<'a> {
        Box::pin(async move {
            let mut guard = self.inner.lock().await;
            let inner = &mut *guard;
            inner.media[slot(device)] = Some(url.to_owned());
            inner.counter += 1;
            let counter = inner.counter;
            match inner.run.as_mut() {
                Some(run) => self.attach_live(run, device, url, counter).await,
                None => self.with_status(|s| {
                    let m = &mut s.media[slot(device)];
                    m.url = Some(url.to_owned());
                    m.attached = false;
                    m.error = None;
                }),
            }
            Ok(())
        })
    }

    fn detach_media(&self, device: VmDevice) -> BackendFuture<'_> {
        Box::pin(async move {
            let mut inner = self.inner.lock().await;
            inner.media[slot(device)] = None;
            if let Some(run) = inner.run.as_mut() {
                self.detach_live(run, device).await;
            }
            self.with_status(|s| {
                let m = &mut s.media[slot(device)];
                *m = MediumStatus {
                    read_bytes: m.read_bytes,
                    read_url: m.read_url.take(),
                    ..MediumStatus::default()
                };
            });
            Ok(())
        })
    }

    fn release_after_boot(&self, device: VmDevice) -> BackendFuture<'_> {
        // The running machine keeps reading the medium (the guest may still need it); the next
        // boot does not get it.
        Box::pin(async move {
            self.inner.lock().await.media[slot(device)] = None;
            Ok(())
        })
    }

    fn firmware_boot_mode(&self) -> BackendFuture<'_, Option<BootMode>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    fn set_firmware_boot_mode(&self, mode: BootMode) -> BackendFuture<'_> {
        Box::pin(async move {
            self.inner.lock().await.firmware = mode;
            Ok(())
        })
    }

    fn set_secure_boot(&self, enforced: bool) -> BackendFuture<'_> {
        Box::pin(async move {
            self.inner.lock().await.secure_boot = enforced;
            Ok(())
        })
    }

    fn take_events(&self) -> Option<MachineEvents> {
        self.events_rx.lock().ok()?.take()
    }

    fn stopped_by_itself(&self) -> Option<MachineEvent> {
        let live = self.live.load(Ordering::SeqCst);
        if live == 0 {
            return None;
        }
        let seen = self.stopped.lock().ok().and_then(|s| s.clone());
        if let Some(event) = seen.filter(|e| e.generation == live) {
            return Some(event);
        }
        // The process itself, in case it exited before QMP's end was read. A backend call in
        // progress holds the lock: that call sees the machine as it is, so skip.
        let mut inner = self.inner.try_lock().ok()?;
        let run = inner.run.as_mut()?;
        match run.child.try_wait() {
            Ok(Some(status)) if run.generation == live => Some(MachineEvent {
                kind: MachineEventKind::PoweredOff,
                generation: live,
                reason: format!("QEMU exited ({status})"),
            }),
            _ => None,
        }
    }

    fn is_current(&self, generation: u64) -> bool {
        generation != 0 && self.live.load(Ordering::SeqCst) == generation
    }

    fn is_running(&self) -> bool {
        self.live.load(Ordering::SeqCst) != 0
    }

    fn describe(&self) -> BackendFuture<'_, Value> {
        Box::pin(std::future::ready(Ok(self.describe_now())))
    }

    fn console_log(&self) -> Option<PathBuf> {
        Some(self.serial_log())
    }
}

impl Drop for QemuBackend {
    fn drop(&mut self) {
        self.live.store(0, Ordering::SeqCst);
        if let Some(mut run) = self.inner.get_mut().run.take() {
            tracing::info!(server = self.index, "stopping QEMU: the emulator ends");
            let _ = run.child.kill();
            let _ = run.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::free_loopback_port;

    /// Forwarded ports come from below the kernel's ephemeral range, so no `bind(0)` (this
    /// emulator's listener, another test's server) can be handed one between two power-ons.
    #[test]
    fn forwarded_ports_are_free_and_never_ephemeral() {
        let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .expect("the ephemeral range")
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .expect("its low end");
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let port = free_loopback_port().expect("a port");
            assert!(
                (10_000..low).contains(&port),
                "{port} (ephemeral from {low})"
            );
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("free");
            seen.insert(port);
        }
        assert!(seen.len() > 10, "spread out: {seen:?}");
    }
}
