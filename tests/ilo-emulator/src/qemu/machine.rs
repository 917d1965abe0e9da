//! The QEMU command line of one emulated server, as a pure function of its settings and of the
//! boot the state machine planned ([`MachineSpec::args`]), plus the QMP arguments that attach a
//! virtual medium.
//!
//! # Design (docs/qemu-and-boot.md §1, §6–§9)
//! - `-accel tcg` always: `/dev/kvm` on these machines is PVM and cannot run a stock guest (§1).
//! - `q35` for both firmwares: OVMF needs it, SeaBIOS boots from it as well (§6), and the guest
//!   sees the same hardware whichever boot mode is pending, as on a real server whose hardware does
//!   not change with the boot mode. SeaBIOS is QEMU's default firmware; OVMF is
//!   `OVMF_CODE_4M.fd` (read-only pflash) plus the server's own copy of `OVMF_VARS_4M.fd`, kept
//!   across power cycles so a UEFI boot order persists.
//! - Virtual media as an iLO presents them: on an xHCI controller, the CD is a USB mass-storage
//!   CD-ROM (`usb-bot` + `scsi-cd`, an empty tray until a medium is inserted), the floppy a USB key
//!   (`usb-storage`, plugged in when a medium is connected: a USB disk cannot be empty). The
//!   legacy layout puts the CD on the AHCI controller (`ide-cd`) and the floppy in an ISA floppy
//!   drive (`isa-fdc` + `floppy`, which q35 only has when asked for, §9 item 5).
//! - The guest's own reboot and power-off do not end QEMU (`-action reboot=shutdown,
//!   shutdown=pause` is set over QMP once the machine is started): QEMU pauses and reports a
//!   SHUTDOWN event, so the emulator sees it and decides (power state Off, or a new boot through
//!   the state machine).
//! - Networking: one NIC with the MAC the iLO reports, slirp with `restrict=on` (nothing but the
//!   forwards below is reachable), `guestfwd=...-cmd:socat - TCP:HOST:PORT` for the host
//!   services the guest may reach (§8: the chardev form keeps one connection only), and
//!   `hostfwd` from loopback ports to the agent's ports. The NIC has no option ROM
//!   (`romfile=""`: firmware spends no time on PXE) unless a PXE boot file is configured
//!   ([`PxeBootfile`]): then it keeps QEMU's iPXE ROM, and slirp's built-in DHCP server hands
//!   out the boot file name, which iPXE fetches (an `http://` URL through a guest forward), in
//!   SeaBIOS (iPXE's PXE ROM) and in OVMF (iPXE's EFI driver) alike.
//! - The serial console appends to a log file across power cycles; SeaBIOS prints to it through
//!   the `etc/sercon-port` fw_cfg file (§7).

use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::state::{BootDevice, BootMode, VmDevice};

/// The address in the slirp network where host services appear to the guest by default (the
/// slirp host address 10.0.2.2 cannot carry a `guestfwd`).
pub const GUEST_SERVICE_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 100);

/// The MAC of the server's first NIC: what the emulator reports for port 1 (RIBCL
/// `GET_HOST_DATA` SMBIOS type 209 and `GET_EMBEDDED_HEALTH` NIC_INFORMATION).
pub const NIC_MAC: &str = "2c:76:8a:5a:30:11";

/// How virtual media are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmediaBus {
    /// USB CD-ROM and USB key on an xHCI controller, as an iLO presents them.
    Usb,
    /// AHCI CD-ROM and an ISA floppy drive.
    Legacy,
}

/// The NIC model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NicModel {
    /// virtio-net-pci (fast under TCG).
    Virtio,
    /// Intel e1000 (a driver every ramdisk has).
    E1000,
    /// Intel 82576 (`igb`, HPE's 361i/366i): a driver the deploy ISO loads from its pack.
    Igb,
}

impl NicModel {
    fn driver(self) -> &'static str {
        match self {
            NicModel::Virtio => "virtio-net-pci",
            NicModel::E1000 => "e1000",
            NicModel::Igb => "igb",
        }
    }
}

/// The controller the server's disk is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskController {
    /// virtio-blk-pci: `/dev/vda` in the guest.
    VirtioBlk,
    /// An LSI MegaRAID SAS 1078 (`megasas`, driver `megaraid_sas`) with the disk as its first
    /// logical drive: `/dev/sdX` in the guest. SeaBIOS boots from it, OVMF cannot.
    Megasas,
}

/// A host service the guest may reach: guest `guest_addr:guest_port` → host `host`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestForward {
    /// Address inside the slirp network (10.0.2.0/24, not .2 or .3).
    pub guest_addr: Ipv4Addr,
    /// Port the guest connects to.
    pub guest_port: u16,
    /// `host:port` (or `ip:port`) on the host side, reached through `socat`.
    pub host: String,
}

impl GuestForward {
    /// Parses `HOST:PORT` (the guest sees it at [`GUEST_SERVICE_ADDR`]`:PORT`) or
    /// `GUEST_IP:GUEST_PORT=HOST:PORT`.
    pub fn parse(s: &str) -> Result<GuestForward, String> {
        let (guest, host) = match s.split_once('=') {
            Some((g, h)) => (Some(g), h),
            None => (None, s),
        };
        let (host_name, host_port) = host
            .rsplit_once(':')
            .ok_or_else(|| format!("{s:?}: expected HOST:PORT"))?;
        let host_port: u16 = host_port
            .parse()
            .map_err(|_| format!("{s:?}: bad host port {host_port:?}"))?;
        // The host part ends up in QEMU's comma-separated option string and in socat's address:
        // only host-name characters.
        if host_name.is_empty()
            || !host_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return Err(format!("{s:?}: bad host {host_name:?}"));
        }
        let (guest_addr, guest_port) = match guest {
            None => (GUEST_SERVICE_ADDR, host_port),
            Some(g) => {
                let (a, p) = g
                    .rsplit_once(':')
                    .ok_or_else(|| format!("{s:?}: expected GUEST_IP:PORT before '='"))?;
                let a: Ipv4Addr = a
                    .parse()
                    .map_err(|_| format!("{s:?}: bad guest address {a:?}"))?;
                let p: u16 = p
                    .parse()
                    .map_err(|_| format!("{s:?}: bad guest port {p:?}"))?;
                let o = a.octets();
                if o[..3] != [10, 0, 2] || matches!(o[3], 0 | 2 | 3 | 15 | 255) {
                    return Err(format!(
                        "{s:?}: the guest address must be in slirp's 10.0.2.0/24 and not the \
                         gateway (.2), DNS (.3) or the guest itself (.15)"
                    ));
                }
                (a, p)
            }
        };
        Ok(GuestForward {
            guest_addr,
            guest_port,
            host: format!("{host_name}:{host_port}"),
        })
    }

    fn slirp_rule(&self) -> String {
        format!(
            "guestfwd=tcp:{}:{}-cmd:socat - TCP:{}",
            self.guest_addr, self.guest_port, self.host
        )
    }
}

/// A boot file name slirp's DHCP server hands out (`-netdev user,bootfile=`), for network boots
/// through the NIC's iPXE ROM: a URL such as `http://10.0.2.100:8080/boot.ipxe`, or a file name
/// (`pxelinux.0`) that iPXE fetches from slirp's TFTP server ([`MachineSpec::tftp_root`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PxeBootfile(String);

/// The longest boot file name: BOOTP's `file` field holds 128 bytes with the terminating NUL
/// (RFC 951), and libslirp copies the name there.
pub const PXE_BOOTFILE_MAX: usize = 127;

impl PxeBootfile {
    /// Checks `s`: an `http`, `https` or `tftp` URL of printable ASCII without spaces (QEMU's
    /// option syntax and the BOOTP field take nothing else; commas are escaped in
    /// [`PxeBootfile::slirp_option`]), at most [`PXE_BOOTFILE_MAX`] bytes.
    pub fn parse(s: &str) -> Result<PxeBootfile, String> {
        if let Some(c) = s.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(format!(
                "{s:?}: the PXE boot file URL may hold only printable ASCII without spaces \
                 (found {c:?}); percent-encode it"
            ));
        }
        if s.len() > PXE_BOOTFILE_MAX {
            return Err(format!(
                "{s:?}: the PXE boot file URL is {} bytes, DHCP's boot file field takes at most \
                 {PXE_BOOTFILE_MAX}",
                s.len()
            ));
        }
        if !s.contains("://") {
            // A plain name: fetched over TFTP from slirp's own server (`--qemu-tftp-root`),
            // as a site's DHCP names `pxelinux.0` with next-server.
            if s.is_empty() || s.starts_with('/') || s.split('/').any(|p| p == "..") {
                return Err(format!(
                    "{s:?}: a PXE boot file name is relative to the TFTP root, without .."
                ));
            }
            return Ok(PxeBootfile(s.to_owned()));
        }
        let url = url::Url::parse(s).map_err(|e| format!("{s:?}: not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https" | "tftp") || url.host_str().is_none() {
            return Err(format!(
                "{s:?}: the PXE boot file must be an http://, https:// or tftp:// URL with a host, \
                 or a file name under --qemu-tftp-root"
            ));
        }
        Ok(PxeBootfile(s.to_owned()))
    }

    /// The URL as given.
    pub fn url(&self) -> &str {
        &self.0
    }

    /// The `bootfile=` option of `-netdev user`: a comma in a QEMU option value is written `,,`.
    fn slirp_option(&self) -> String {
        format!("bootfile={}", self.0.replace(',', ",,"))
    }
}

/// A host tap interface the node's NIC is plugged into (`-netdev tap`), instead of slirp: the
/// node is then on a real layer-2 network (a bridge with a DHCP server on it), as a ProLiant's
/// NIC is on the provisioning network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TapName(String);

/// Linux interface names hold at most 15 bytes (`IFNAMSIZ` less the NUL).
pub const TAP_NAME_MAX: usize = 15;

impl TapName {
    /// Checks `s` as a Linux interface name: 1 to [`TAP_NAME_MAX`] bytes of ASCII letters,
    /// digits, `-`, `_` and `.`, and not `.` or `..` (the kernel refuses `/`, `:` and white
    /// space; a comma would end QEMU's option value).
    pub fn parse(s: &str) -> Result<TapName, String> {
        let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if s.is_empty() || s.len() > TAP_NAME_MAX || s == "." || s == ".." {
            return Err(format!(
                "{s:?}: a tap interface name is 1 to {TAP_NAME_MAX} bytes"
            ));
        }
        if let Some(c) = s.chars().find(|c| !valid_char(*c)) {
            return Err(format!(
                "{s:?}: a tap interface name holds only ASCII letters, digits, '-', '_' and '.' \
                 (found {c:?})"
            ));
        }
        Ok(TapName(s.to_owned()))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Firmware of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Firmware {
    /// SeaBIOS (QEMU's default), with the sercon fw_cfg file that sends its output to COM1.
    SeaBios {
        /// A 2-byte file holding 0x03f8 little-endian.
        sercon_file: PathBuf,
    },
    /// OVMF: the read-only code and the server's variable store.
    Ovmf {
        /// `OVMF_CODE_4M.fd`, or `OVMF_CODE_4M.secboot.fd` for Secure Boot.
        code: PathBuf,
        /// The server's copy of `OVMF_VARS_4M.fd` (or `OVMF_VARS_4M.ms.fd`).
        vars: PathBuf,
        /// Secure Boot firmware: it runs only with SMM on and its variable flash secure, so
        /// the guest cannot write the key store around the firmware.
        secure_boot: bool,
    },
}

impl Firmware {
    /// The boot mode this firmware implements.
    pub fn mode(&self) -> BootMode {
        match self {
            Firmware::SeaBios { .. } => BootMode::Legacy,
            Firmware::Ovmf { .. } => BootMode::Uefi,
        }
    }

    /// Name for the admin API.
    pub fn name(&self) -> &'static str {
        match self {
            Firmware::SeaBios { .. } => "SeaBIOS",
            Firmware::Ovmf {
                secure_boot: true, ..
            } => "OVMF (Secure Boot)",
            Firmware::Ovmf { .. } => "OVMF",
        }
    }
}

/// Boot priorities (`bootindex`, lower first) of the server's devices for one boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootIndexes {
    /// The virtual CD.
    pub cdrom: u32,
    /// The virtual floppy / USB key.
    pub floppy: u32,
    /// The disk.
    pub disk: u32,
    /// The NIC: it boots (iPXE) only when the machine has a PXE boot file
    /// ([`MachineSpec::pxe_bootfile`]); without one it has no option ROM and firmware skips it.
    pub nic: u32,
}

impl BootIndexes {
    /// The device the state machine chose first, then the others in the server's default
    /// order, so that the firmware falls through as a real one does when the chosen device has
    /// nothing bootable.
    pub fn for_device(device: Option<BootDevice>) -> BootIndexes {
        let mut order = vec![
            BootDevice::Cdrom,
            BootDevice::Floppy,
            BootDevice::Hdd,
            BootDevice::Network,
        ];
        if let Some(d) = device {
            if let Some(pos) = order.iter().position(|x| *x == d) {
                let d = order.remove(pos);
                order.insert(0, d);
            }
        }
        let index = |d: BootDevice| order.iter().position(|x| *x == d).map_or(9, |p| p as u32);
        BootIndexes {
            cdrom: index(BootDevice::Cdrom),
            floppy: index(BootDevice::Floppy),
            disk: index(BootDevice::Hdd),
            nic: index(BootDevice::Network),
        }
    }
}

/// Device ids on the QEMU side.
pub mod ids {
    /// The CD drive (`scsi-cd` or `ide-cd`).
    pub const CDROM: &str = "vcd";
    /// The legacy floppy drive.
    pub const FLOPPY_DRIVE: &str = "vfd";
    /// The xHCI controller.
    pub const XHCI: &str = "xhci";
    /// The disk.
    pub const DISK: &str = "disk0";
    /// The RAID controller the disk is on, when it is not virtio.
    pub const RAID: &str = "raid0";
}

/// Everything one QEMU run needs; [`MachineSpec::args`] turns it into the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSpec {
    /// `-name` (shows in `ps`).
    pub name: String,
    /// RAM in MiB.
    pub memory_mib: u32,
    /// Firmware of this run.
    pub firmware: Firmware,
    /// The server's disk image (raw).
    pub disk: PathBuf,
    /// The serial console log (appended).
    pub serial_log: PathBuf,
    /// The QMP socket.
    pub qmp_socket: PathBuf,
    /// Virtual media layout.
    pub vmedia_bus: VmediaBus,
    /// NIC model.
    pub nic: NicModel,
    /// The disk's controller.
    pub disk_controller: DiskController,
    /// NIC MAC.
    pub mac: String,
    /// Host services the guest may reach.
    pub guest_forwards: Vec<GuestForward>,
    /// `(host loopback port, guest port)` forwarded into the guest.
    pub host_forwards: Vec<(u16, u16)>,
    /// The guest address of the host forwards (`None`: slirp's first DHCP address).
    pub guest_ip: Option<std::net::Ipv4Addr>,
    /// Where QEMU writes every frame of the NIC as pcap (`filter-dump`), if anywhere.
    pub net_capture: Option<PathBuf>,
    /// The boot file slirp's DHCP hands out; with it the NIC keeps QEMU's iPXE option ROM and
    /// can network boot, without it the NIC has no ROM.
    pub pxe_bootfile: Option<PxeBootfile>,
    /// The directory slirp's built-in TFTP server serves at 10.0.2.2 (`-netdev user,tftp=`).
    pub tftp_root: Option<PathBuf>,
    /// The host tap interface the NIC is on instead of slirp (no forwards, no slirp DHCP or
    /// TFTP: the network's own servers answer); the NIC keeps its iPXE ROM, so it can network
    /// boot from that network.
    pub tap: Option<TapName>,
    /// Boot priorities.
    pub boot: BootIndexes,
}

fn device(v: Value) -> [String; 2] {
    ["-device".into(), v.to_string()]
}

impl MachineSpec {
    /// The command line (without the program). QEMU starts paused (`-S`): the backend attaches
    /// the media over QMP, resets (the firmware reads the boot order at reset) and continues.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        let mut push = |items: &[&str]| a.extend(items.iter().map(|s| (*s).to_owned()));
        push(&["-name", &self.name]);
        push(&["-accel", "tcg", "-machine", "q35", "-smp", "1"]);
        push(&["-m", &self.memory_mib.to_string()]);
        push(&["-nodefaults", "-no-user-config", "-display", "none", "-S"]);
        push(&[
            "-qmp",
            &format!("unix:{},server=on,wait=off", self.qmp_socket.display()),
        ]);
        push(&[
            "-chardev",
            &format!(
                "file,id=serial0,path={},append=on",
                self.serial_log.display()
            ),
            "-serial",
            "chardev:serial0",
        ]);
        match &self.firmware {
            Firmware::SeaBios { sercon_file } => push(&[
                "-fw_cfg",
                &format!("name=etc/sercon-port,file={}", sercon_file.display()),
            ]),
            Firmware::Ovmf {
                code,
                vars,
                secure_boot,
            } => {
                if *secure_boot {
                    push(&[
                        "-machine",
                        "smm=on",
                        "-global",
                        "driver=cfi.pflash01,property=secure,value=on",
                    ]);
                }
                push(&[
                    "-blockdev",
                    &json!({"driver": "file", "filename": code, "node-name": "ovmf-code-file", "read-only": true}).to_string(),
                    "-blockdev",
                    &json!({"driver": "raw", "file": "ovmf-code-file", "node-name": "ovmf-code", "read-only": true}).to_string(),
                    "-blockdev",
                    &json!({"driver": "file", "filename": vars, "node-name": "ovmf-vars-file"}).to_string(),
                    "-blockdev",
                    &json!({"driver": "raw", "file": "ovmf-vars-file", "node-name": "ovmf-vars"}).to_string(),
                    "-machine",
                    "pflash0=ovmf-code,pflash1=ovmf-vars",
                ]);
            }
        }
        // The disk: virtio-blk by default, so it is /dev/vda and never mistaken for a USB medium;
        // or behind a MegaRAID controller, as on a ProLiant with an MR controller.
        push(&[
            "-blockdev",
            &json!({"driver": "file", "filename": self.disk, "node-name": "disk0-file"})
                .to_string(),
            "-blockdev",
            &json!({"driver": "raw", "file": "disk0-file", "node-name": "disk0"}).to_string(),
        ]);
        match self.disk_controller {
            DiskController::VirtioBlk => a.extend(device(json!({
                "driver": "virtio-blk-pci", "id": ids::DISK, "drive": "disk0",
                "serial": "VMDEPLOY-DISK0", "bootindex": self.boot.disk
            }))),
            DiskController::Megasas => {
                a.extend(device(json!({"driver": "megasas", "id": ids::RAID})));
                a.extend(device(json!({
                    "driver": "scsi-hd", "bus": format!("{}.0", ids::RAID), "id": ids::DISK,
                    "drive": "disk0", "serial": "VMDEPLOY-DISK0", "bootindex": self.boot.disk
                })));
            }
        }
        match self.vmedia_bus {
            VmediaBus::Usb => {
                a.extend(device(json!({"driver": "qemu-xhci", "id": ids::XHCI})));
                a.extend(device(
                    json!({"driver": "usb-bot", "bus": "xhci.0", "id": "vcd-bot"}),
                ));
                a.extend(device(json!({
                    "driver": "scsi-cd", "bus": "vcd-bot.0", "id": ids::CDROM,
                    "bootindex": self.boot.cdrom
                })));
            }
            VmediaBus::Legacy => {
                a.extend(device(json!({
                    "driver": "ide-cd", "bus": "ide.2", "id": ids::CDROM,
                    "bootindex": self.boot.cdrom
                })));
                a.extend(device(json!({
                    "driver": "isa-fdc", "id": "fdc", "bootindexA": self.boot.floppy
                })));
                a.extend(device(
                    json!({"driver": "floppy", "id": ids::FLOPPY_DRIVE, "unit": 0}),
                ));
            }
        }
        let netdev = match &self.tap {
            // `script=no`: the interface is made and bridged before QEMU starts.
            Some(tap) => format!(
                "tap,id=net0,ifname={},script=no,downscript=no",
                tap.as_str()
            ),
            None => self.slirp_netdev(),
        };
        a.extend(["-netdev".to_owned(), netdev]);
        if let Some(pcap) = &self.net_capture {
            a.extend([
                "-object".to_owned(),
                format!(
                    "filter-dump,id=netdump0,netdev=net0,file={}",
                    pcap.display()
                ),
            ]);
        }
        let mut nic = json!({
            "driver": self.nic.driver(), "netdev": "net0", "mac": self.mac,
            "bootindex": self.boot.nic
        });
        if self.pxe_bootfile.is_none() && self.tap.is_none() {
            // `romfile=""`: no iPXE option ROM, so firmware does not spend time on PXE. With a
            // boot file, or on a real network, the NIC keeps QEMU's default ROM (ipxe-qemu),
            // which network boots.
            nic["romfile"] = json!("");
        }
        a.extend(device(nic));
        a
    }
    /// `-netdev user`: slirp with its forwards, boot file and TFTP root.
    fn slirp_netdev(&self) -> String {
        let mut netdev = String::from("user,id=net0,restrict=on");
        for f in &self.guest_forwards {
            netdev.push(',');
            netdev.push_str(&f.slirp_rule());
        }
        for (host, guest) in &self.host_forwards {
            let to = self.guest_ip.map(|ip| ip.to_string()).unwrap_or_default();
            netdev.push_str(&format!(",hostfwd=tcp:127.0.0.1:{host}-{to}:{guest}"));
        }
        if let Some(bootfile) = &self.pxe_bootfile {
            netdev.push(',');
            netdev.push_str(&bootfile.slirp_option());
        }
        if let Some(root) = &self.tftp_root {
            netdev.push_str(&format!(
                ",tftp={}",
                root.display().to_string().replace(',', ",,")
            ));
        }
        netdev
    }
}

/// Node and device names of one attached medium.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediumNames {
    /// Block node of the medium.
    pub node: String,
    /// Hot-plugged USB key device (the USB floppy only).
    pub device: Option<String>,
}

/// How a medium is attached on this bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachKind {
    /// A medium in a drive with a tray (CD, legacy floppy drive).
    Tray(&'static str),
    /// A USB key plugged in with the medium.
    UsbKey,
}

/// How `device` takes a medium on `bus`.
pub fn attach_kind(bus: VmediaBus, device: VmDevice) -> AttachKind {
    match (bus, device) {
        (_, VmDevice::Cdrom) => AttachKind::Tray(ids::CDROM),
        (VmediaBus::Legacy, VmDevice::Floppy) => AttachKind::Tray(ids::FLOPPY_DRIVE),
        (VmediaBus::Usb, VmDevice::Floppy) => AttachKind::UsbKey,
    }
}

/// Why a medium URL cannot be handed to QEMU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MediumUrlError(pub String);

/// The `blockdev-add` arguments that open `url` by HTTP range reads through QEMU's curl block
/// driver (`sslverify: false`: iLO does not check the media server's certificate), read-only
/// (the curl driver cannot write).
pub fn medium_blockdev(node: &str, url: &str, timeout_secs: u32) -> Result<Value, MediumUrlError> {
    let parsed = url::Url::parse(url).map_err(|e| MediumUrlError(format!("{url:?}: {e}")))?;
    let mut file = match parsed.scheme() {
        "https" => json!({"driver": "https", "sslverify": false}),
        "http" => json!({"driver": "http"}),
        other => {
            return Err(MediumUrlError(format!(
                "{url:?}: scheme {other:?} is not http or https"
            )))
        }
    };
    file["url"] = json!(url);
    file["read-only"] = json!(true);
    file["timeout"] = json!(timeout_secs);
    Ok(json!({"driver": "raw", "node-name": node, "read-only": true, "file": file}))
}

/// The `device_add` arguments of the USB key holding `node`.
pub fn usb_key_device(id: &str, node: &str, bootindex: u32) -> Value {
    json!({
        "driver": "usb-storage", "bus": "xhci.0", "id": id, "drive": node,
        "removable": true, "bootindex": bootindex
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(firmware: Firmware, bus: VmediaBus) -> MachineSpec {
        MachineSpec {
            name: "ilo-emulator-server-0".into(),
            memory_mib: 1024,
            firmware,
            disk: "/s/disk.raw".into(),
            serial_log: "/s/serial.log".into(),
            qmp_socket: "/s/qmp.sock".into(),
            vmedia_bus: bus,
            nic: NicModel::Virtio,
            disk_controller: DiskController::VirtioBlk,
            mac: NIC_MAC.into(),
            guest_forwards: vec![GuestForward::parse("127.0.0.1:6385").expect("parse")],
            host_forwards: vec![(40001, 3260), (40002, 9999)],
            guest_ip: None,
            net_capture: None,
            pxe_bootfile: None,
            tftp_root: None,
            tap: None,
            boot: BootIndexes::for_device(Some(BootDevice::Cdrom)),
        }
    }

    fn after<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    }

    fn devices(args: &[String]) -> Vec<Value> {
        after(args, "-device")
            .into_iter()
            .map(|d| serde_json::from_str(d).expect("JSON device"))
            .collect()
    }

    #[test]
    fn seabios_usb_machine() {
        let args = spec(
            Firmware::SeaBios {
                sercon_file: "/s/sercon.bin".into(),
            },
            VmediaBus::Usb,
        )
        .args();
        assert_eq!(after(&args, "-accel"), ["tcg"]);
        assert_eq!(after(&args, "-machine"), ["q35"]);
        assert_eq!(after(&args, "-m"), ["1024"]);
        assert!(args.iter().any(|a| a == "-S"));
        assert_eq!(
            after(&args, "-qmp"),
            ["unix:/s/qmp.sock,server=on,wait=off"]
        );
        assert_eq!(
            after(&args, "-chardev"),
            ["file,id=serial0,path=/s/serial.log,append=on"]
        );
        assert_eq!(
            after(&args, "-fw_cfg"),
            ["name=etc/sercon-port,file=/s/sercon.bin"]
        );
        assert!(!args.iter().any(|a| a.contains("pflash")));
        let devs = devices(&args);
        let by_id = |id: &str| {
            devs.iter()
                .find(|d| d["id"] == id)
                .unwrap_or_else(|| panic!("no device {id}: {devs:?}"))
                .clone()
        };
        assert_eq!(by_id("vcd")["driver"], "scsi-cd");
        assert_eq!(by_id("vcd")["bus"], "vcd-bot.0");
        assert_eq!(by_id("vcd")["bootindex"], 0);
        assert_eq!(by_id("vcd-bot")["bus"], "xhci.0");
        assert_eq!(by_id("xhci")["driver"], "qemu-xhci");
        assert_eq!(by_id("disk0")["bootindex"], 2);
        assert!(!devs.iter().any(|d| d["driver"] == "isa-fdc"));
        let nic = devs
            .iter()
            .find(|d| d["driver"] == "virtio-net-pci")
            .expect("a NIC");
        assert_eq!(nic["mac"], NIC_MAC);
        assert_eq!(nic["romfile"], "");
        assert_eq!(
            after(&args, "-netdev"),
            ["user,id=net0,restrict=on,guestfwd=tcp:10.0.2.100:6385-cmd:socat - TCP:127.0.0.1:6385,\
              hostfwd=tcp:127.0.0.1:40001-:3260,hostfwd=tcp:127.0.0.1:40002-:9999"]
        );
    }

    #[test]
    fn secure_boot_firmware_runs_with_smm_and_a_secure_variable_flash() {
        let s = spec(
            Firmware::Ovmf {
                code: "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd".into(),
                vars: "/s/OVMF_VARS.secboot.fd".into(),
                secure_boot: true,
            },
            VmediaBus::Usb,
        );
        let args = s.args();
        assert_eq!(
            after(&args, "-machine"),
            ["q35", "smm=on", "pflash0=ovmf-code,pflash1=ovmf-vars"]
        );
        assert_eq!(
            after(&args, "-global"),
            ["driver=cfi.pflash01,property=secure,value=on"]
        );
        assert_eq!(s.firmware.name(), "OVMF (Secure Boot)");
        let plain = spec(
            Firmware::Ovmf {
                code: "/c.fd".into(),
                vars: "/v.fd".into(),
                secure_boot: false,
            },
            VmediaBus::Usb,
        );
        assert!(after(&plain.args(), "-global").is_empty());
    }

    #[test]
    fn ovmf_legacy_media_machine() {
        let mut s = spec(
            Firmware::Ovmf {
                code: "/usr/share/OVMF/OVMF_CODE_4M.fd".into(),
                vars: "/s/OVMF_VARS.fd".into(),
                secure_boot: false,
            },
            VmediaBus::Legacy,
        );
        s.boot = BootIndexes::for_device(Some(BootDevice::Floppy));
        let args = s.args();
        assert_eq!(
            after(&args, "-machine"),
            ["q35", "pflash0=ovmf-code,pflash1=ovmf-vars"]
        );
        let blockdevs: Vec<Value> = after(&args, "-blockdev")
            .into_iter()
            .map(|b| serde_json::from_str(b).expect("JSON"))
            .collect();
        let code = blockdevs
            .iter()
            .find(|b| b["node-name"] == "ovmf-code-file")
            .expect("code");
        assert_eq!(code["read-only"], true);
        assert_eq!(code["filename"], "/usr/share/OVMF/OVMF_CODE_4M.fd");
        let vars = blockdevs
            .iter()
            .find(|b| b["node-name"] == "ovmf-vars-file")
            .expect("vars");
        assert_eq!(vars["filename"], "/s/OVMF_VARS.fd");
        assert!(vars.get("read-only").is_none());
        assert!(after(&args, "-fw_cfg").is_empty());
        let devs = devices(&args);
        assert!(devs
            .iter()
            .any(|d| d["driver"] == "ide-cd" && d["id"] == "vcd" && d["bootindex"] == 1));
        assert!(devs
            .iter()
            .any(|d| d["driver"] == "isa-fdc" && d["bootindexA"] == 0));
        assert!(devs
            .iter()
            .any(|d| d["driver"] == "floppy" && d["id"] == "vfd"));
        assert!(!devs.iter().any(|d| d["driver"] == "qemu-xhci"));
    }

    #[test]
    fn boot_indexes_put_the_chosen_device_first() {
        let cd = BootIndexes::for_device(Some(BootDevice::Cdrom));
        assert_eq!((cd.cdrom, cd.floppy, cd.disk, cd.nic), (0, 1, 2, 3));
        let hdd = BootIndexes::for_device(Some(BootDevice::Hdd));
        assert_eq!((hdd.disk, hdd.cdrom, hdd.floppy, hdd.nic), (0, 1, 2, 3));
        let net = BootIndexes::for_device(Some(BootDevice::Network));
        // The NIC first; the rest in the default order behind it.
        assert_eq!((net.nic, net.cdrom, net.floppy, net.disk), (0, 1, 2, 3));
        // USB, RBSU or nothing: the default order.
        assert_eq!(BootIndexes::for_device(None), cd);
        assert_eq!(BootIndexes::for_device(Some(BootDevice::Usb)), cd);
    }

    #[test]
    fn a_tftp_root_is_slirps_tftp_server() {
        let mut s = spec(
            Firmware::SeaBios {
                sercon_file: "/s/sercon.bin".into(),
            },
            VmediaBus::Usb,
        );
        s.pxe_bootfile = Some(PxeBootfile::parse("pxelinux.0").expect("name"));
        s.tftp_root = Some("/var/tmp/boot,root".into());
        let args = s.args();
        let netdev = after(&args, "-netdev")[0];
        assert!(
            netdev.ends_with(",bootfile=pxelinux.0,tftp=/var/tmp/boot,,root"),
            "{netdev}"
        );
    }

    #[test]
    fn a_pxe_bootfile_keeps_the_ipxe_rom_and_goes_to_slirps_dhcp() {
        let mut s = spec(
            Firmware::SeaBios {
                sercon_file: "/s/sercon.bin".into(),
            },
            VmediaBus::Usb,
        );
        s.boot = BootIndexes::for_device(Some(BootDevice::Network));
        s.pxe_bootfile =
            Some(PxeBootfile::parse("http://10.0.2.101:8080/boot.ipxe?a=1,b=2").expect("URL"));
        let args = s.args();
        assert_eq!(
            after(&args, "-netdev"),
            ["user,id=net0,restrict=on,guestfwd=tcp:10.0.2.100:6385-cmd:socat - TCP:127.0.0.1:6385,\
              hostfwd=tcp:127.0.0.1:40001-:3260,hostfwd=tcp:127.0.0.1:40002-:9999,\
              bootfile=http://10.0.2.101:8080/boot.ipxe?a=1,,b=2"]
        );
        let devs = devices(&args);
        let nic = devs
            .iter()
            .find(|d| d["driver"] == "virtio-net-pci")
            .expect("a NIC");
        // No `romfile` at all: QEMU's default iPXE ROM for the model.
        assert!(nic.get("romfile").is_none(), "{nic}");
        assert_eq!(nic["bootindex"], 0);
        assert_eq!(nic["mac"], NIC_MAC);
        let disk = devs.iter().find(|d| d["id"] == "disk0").expect("disk");
        assert_eq!(disk["bootindex"], 3);

        // The same machine in UEFI: the same NIC and netdev (iPXE's EFI driver).
        s.firmware = Firmware::Ovmf {
            code: "/c.fd".into(),
            vars: "/v.fd".into(),
            secure_boot: false,
        };
        let uefi = s.args();
        assert_eq!(after(&uefi, "-netdev"), after(&args, "-netdev"));
        let nic = devices(&uefi)
            .into_iter()
            .find(|d| d["driver"] == "virtio-net-pci")
            .expect("a NIC");
        assert!(nic.get("romfile").is_none(), "{nic}");
    }

    #[test]
    fn a_tap_puts_the_nic_on_the_real_network_with_its_ipxe_rom_and_no_slirp() {
        let mut s = spec(
            Firmware::SeaBios {
                sercon_file: "/s/sercon.bin".into(),
            },
            VmediaBus::Usb,
        );
        s.boot = BootIndexes::for_device(Some(BootDevice::Network));
        s.tap = Some(TapName::parse("tap0").expect("name"));
        let args = s.args();
        // Only the tap: slirp's forwards, DHCP and TFTP are not there.
        assert_eq!(
            after(&args, "-netdev"),
            ["tap,id=net0,ifname=tap0,script=no,downscript=no"]
        );
        let nic = devices(&args)
            .into_iter()
            .find(|d| d["driver"] == "virtio-net-pci")
            .expect("a NIC");
        assert!(nic.get("romfile").is_none(), "{nic}");
        assert_eq!(nic["netdev"], "net0");
        assert_eq!(nic["bootindex"], 0);
    }

    #[test]
    fn tap_names_parse() {
        for good in ["tap0", "vpxe-123.4_x", "a", "abcdefghijklmno"] {
            assert_eq!(TapName::parse(good).expect(good).as_str(), good);
        }
        for bad in [
            "",
            ".",
            "..",
            "abcdefghijklmnop",
            "tap 0",
            "tap,0",
            "tap/0",
            "tap:0",
            "tap\u{e9}",
        ] {
            let err = TapName::parse(bad).expect_err(bad);
            assert!(err.contains("tap interface name"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn pxe_bootfiles_parse() {
        for good in [
            "http://10.0.2.100:8080/boot.ipxe",
            "https://10.0.2.100/x/boot.ipxe",
            "tftp://10.0.2.100/pxelinux.0",
            "http://h/a,b",
            "pxelinux.0",
            "boot/grubnetx64.efi",
        ] {
            assert_eq!(PxeBootfile::parse(good).expect(good).url(), good);
        }
        let long = format!("http://10.0.2.100/{}", "a".repeat(PXE_BOOTFILE_MAX));
        for bad in [
            "",
            "/pxelinux.0",
            "../pxelinux.0",
            "http://10.0.2.100/boot ipxe",
            "http://10.0.2.100/bo\not",
            "http://10.0.2.100/böot",
            "ftp://10.0.2.100/boot.ipxe",
            "http://10.0.2.100/a\tb",
            long.as_str(),
        ] {
            let e = PxeBootfile::parse(bad).expect_err(bad);
            assert!(e.contains("boot file") || e.contains("URL"), "{bad:?}: {e}");
            assert!(!e.contains("  "), "{bad:?}: {e}");
        }
    }

    #[test]
    fn guest_forwards_parse() {
        assert_eq!(
            GuestForward::parse("127.0.0.1:6385").expect("short form"),
            GuestForward {
                guest_addr: GUEST_SERVICE_ADDR,
                guest_port: 6385,
                host: "127.0.0.1:6385".into()
            }
        );
        assert_eq!(
            GuestForward::parse("10.0.2.50:80=localhost:8080").expect("long form"),
            GuestForward {
                guest_addr: Ipv4Addr::new(10, 0, 2, 50),
                guest_port: 80,
                host: "localhost:8080".into()
            }
        );
        for bad in [
            "127.0.0.1",
            "127.0.0.1:x",
            "a,b:1",
            ":80",
            "10.0.2.2:80=127.0.0.1:1",
            "192.168.1.5:80=127.0.0.1:1",
            "10.0.2.50=127.0.0.1:1",
            "host with space:1",
        ] {
            assert!(GuestForward::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn medium_blockdevs_use_the_curl_driver_read_only() {
        let b = medium_blockdev("m1", "https://127.0.0.1:8443/deploy.iso", 10).expect("https");
        assert_eq!(b["driver"], "raw");
        assert_eq!(b["node-name"], "m1");
        assert_eq!(b["read-only"], true);
        assert_eq!(b["file"]["driver"], "https");
        assert_eq!(b["file"]["sslverify"], false);
        assert_eq!(b["file"]["url"], "https://127.0.0.1:8443/deploy.iso");
        assert_eq!(b["file"]["timeout"], 10);
        let h = medium_blockdev("m2", "http://h/f.img", 5).expect("http");
        assert_eq!(h["file"]["driver"], "http");
        assert!(h["file"].get("sslverify").is_none());
        assert!(medium_blockdev("m3", "ftp://h/f", 5).is_err());
        assert!(medium_blockdev("m3", "not a url", 5).is_err());
        assert_eq!(
            attach_kind(VmediaBus::Usb, VmDevice::Floppy),
            AttachKind::UsbKey
        );
        assert_eq!(
            attach_kind(VmediaBus::Legacy, VmDevice::Floppy),
            AttachKind::Tray("vfd")
        );
        let key = usb_key_device("vkey1", "m1", 1);
        assert_eq!(key["driver"], "usb-storage");
        assert_eq!(key["removable"], true);
    }
}
