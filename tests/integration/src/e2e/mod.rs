//! The end-to-end lab: the product as an operator runs it, against one emulated ProLiant that is
//! a real QEMU (TCG) machine.
//!
//! - `ilo-emulator --backend qemu`, one server: its virtual media are QMP medium changes of
//!   URLs QEMU reads by range, power is the QEMU process, the pending boot mode picks SeaBIOS or
//!   OVMF (docs/qemu-and-boot.md §6–§8).
//! - `vmdeploy-conductor serve` with a configuration file: SQLite and the built-in store in the
//!   lab's directory, its API on a loopback port.
//! - A media server on loopback for the deploy ISO and the instance images.
//! - The `baremetal` CLI of the setup's venv, unchanged, for every call to the API.
//!
//! # The network
//! The node sits on QEMU's user network with `restrict=on`: it reaches only what the emulator
//! forwards into it (`--guest-forward`): the API at `10.0.2.100:6385` (the floppy's
//! `ipa-api-url`) and the media server at `10.0.2.101:8080` (the image URL the agent gets).
//! The conductor reaches the node's agent API, iSCSI target and `done` listener through the
//! host ports the emulator forwards to the guest's 9999, 3260 and 10000: the node's
//! `driver_info.kernel_append_params` makes the agent advertise `127.0.0.1:<forwarded port>`
//! (`ipa-advertise-host/port`), and `deploy.iscsi_portal_port`/`iscsi_done_port` point the
//! conductor's login and `done` at the forwarded ports.
//!
//! A `pxe_ilo` lab ([`LabOptions::netboot`]) puts the node on a real layer-2 network instead
//! ([`provisioning_net`]): dnsmasq answers its DHCP, and it reaches the conductor's TFTP, HTTP
//! and API at the host's address there, as the conductor reaches its agent; nothing is
//! forwarded.
//!
//! # Failures
//! When a test panics with a lab alive, the lab copies the node's serial console, the QEMU log,
//! the conductor's and the emulator's logs to `target/e2e-artifacts/<test>/` and says so.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::child::ChildGuard;
use crate::emulator::MediaServer;
use crate::{bin, free_port, workspace_root};

pub mod checks;
pub mod ironic;
pub mod provisioning_net;
pub mod secrets;

/// The iLO's credentials in the lab.
pub const ILO_USER: &str = "Administrator";
/// The iLO's password in the lab.
pub const ILO_PASSWORD: &str = "e2e-ilo-Passw0rd";
/// Where the node finds the API (a guest forward).
pub const GUEST_API: &str = "10.0.2.100:6385";
/// Where the node finds the media server (a guest forward).
pub const GUEST_MEDIA: &str = "10.0.2.101:8080";

/// Where [`partition_media`] puts the test OS's root image, kernel and ramdisk.
pub const TEST_OS_PARTITION_MEDIA: [&str; 3] = ["/root.img", "/vmlinuz", "/initrd"];

/// The media server's files for [`Lab::set_partition_image`].
pub fn partition_media(image: &crate::test_image::TestImage) -> Vec<(String, Vec<u8>)> {
    let [root, kernel, ramdisk] = TEST_OS_PARTITION_MEDIA;
    [
        (root, &image.part_image),
        (kernel, &image.kernel),
        (ramdisk, &image.ramdisk),
    ]
    .into_iter()
    .map(|(path, file)| {
        let bytes =
            std::fs::read(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        (path.to_owned(), bytes)
    })
    .collect()
}

/// Firmware of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Firmware {
    /// SeaBIOS (legacy BIOS).
    Bios,
    /// OVMF (UEFI).
    Uefi,
}

impl Firmware {
    /// The firmware's name as the emulator reports it (`machine.firmware`).
    pub fn emulator_name(self) -> &'static str {
        match self {
            Firmware::Bios => "SeaBIOS",
            Firmware::Uefi => "OVMF",
        }
    }

    /// `capabilities` value Ironic uses.
    pub fn capability(self) -> &'static str {
        match self {
            Firmware::Bios => "bios",
            Firmware::Uefi => "uefi",
        }
    }
}

/// What the lab is built with.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Guest RAM, MiB (UEFI needs 512).
    pub memory_mib: u32,
    /// The node's disk, MiB (sparse; the agent, as IPA, installs only on disks of 4 GiB or more
    /// unless root device hints choose).
    pub disk_size_mib: u32,
    /// `deploy.deploy_callback_timeout`, seconds.
    pub callback_timeout_secs: u64,
    /// `deploy.automated_clean`.
    pub automated_clean: bool,
    /// Files the media server serves, by path (`/deploy.iso` is added).
    pub media: Vec<(String, Vec<u8>)>,
    /// More `[deploy]` lines for the conductor's configuration.
    pub deploy_config: Vec<String>,
    /// Whole TOML sections appended to the conductor's configuration (e.g.
    /// `"[objects.builtin]\npublic_url = ..."`).
    pub extra_config: Vec<String>,
    /// More `--guest-forward GUEST_IP:PORT=HOST:PORT` of the emulator (a test's own server).
    pub guest_forwards: Vec<String>,
    /// `--qemu-capture-net`: every QEMU run's frames in `server-0/net-<run>.pcap`.
    pub capture_net: bool,
    /// `--qemu-guest-ip`: the node's static address, where the agent's ports are forwarded.
    pub guest_ip: Option<String>,
    /// A `pxe_ilo` lab: the iLO has a Standard licence (no virtual media), the node's NIC is on
    /// a real provisioning network ([`provisioning_net`]: a bridge in a network namespace,
    /// dnsmasq for DHCP) with its iPXE ROM, and the conductor serves the boot root there over
    /// TFTP (port 69) and HTTP, with the deploy ISO's kernel and initramfs as its default deploy
    /// kernel and ramdisk. The loader is the one the node boots with first
    /// ([`Lab::boot_as_pxe_rom`] changes it). `None`: virtual media on QEMU's user network.
    pub netboot: Option<NetbootLoader>,
    /// Which conductor serves the API: ours, or upstream Ironic 39 ([`ironic`]).
    pub peer: Peer,
    /// `ilo-emulator --profile`: the iLO generation and firmware line the node's BMC answers as
    /// (docs/ilo-firmware.md); `None`: the emulator's default (`lab`).
    pub profile: Option<&'static str>,
    /// Debug logging on every component: the emulator (`RUST_LOG=debug`), the conductor
    /// (`[log] level`: trace for our crates, debug for the libraries) and the agent (`ipa-debug=1` on the floppy through the node's
    /// `kernel_append_params`), for [`checks::assert_no_secret_leaked`].
    pub debug_logging: bool,
    /// `ilo-emulator --qemu-nic`: the node's NIC model (`virtio`, `e1000`, `igb`).
    pub nic: &'static str,
    /// `ilo-emulator --qemu-disk`: the controller of the node's disk (`virtio`, `megasas`).
    pub disk_controller: &'static str,
}

/// The conductor a lab runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Peer {
    /// `vmdeploy-conductor serve`.
    #[default]
    Vmdeploy,
    /// OpenStack Ironic 39 standalone from the setup's venv, with the `redfish` hardware type
    /// against the emulator's Redfish side (an iLO 5), our kernel and initramfs as its deploy
    /// ramdisk ([`ironic`]).
    Ironic,
}

/// What a `pxe_ilo` lab's node boots from the network with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetbootLoader {
    /// The ROM's iPXE gets the URL of the conductor's master `boot.ipxe` from dnsmasq and runs
    /// it over HTTP; it chains the node's script by MAC.
    Ipxe,
    /// The ROM is answered as a plain PXE ROM: dnsmasq names the loader for its architecture
    /// and the conductor's TFTP server sends it. PXELINUX under BIOS (it reads
    /// `pxelinux.cfg/01-<mac>`), GRUB's network image under UEFI (`grub.cfg-01-<mac>`).
    PxeRom,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            memory_mib: 512,
            disk_size_mib: 4096,
            callback_timeout_secs: 600,
            automated_clean: false,
            media: Vec::new(),
            deploy_config: Vec::new(),
            extra_config: Vec::new(),
            guest_forwards: Vec::new(),
            capture_net: false,
            guest_ip: None,
            netboot: None,
            peer: Peer::Vmdeploy,
            profile: None,
            debug_logging: false,
            nic: "virtio",
            disk_controller: "virtio",
        }
    }
}

/// The emulator's arguments of a `pxe_ilo` lab: a Standard licence, and the node's NIC on the
/// provisioning network's tap, QEMU in its namespace.
fn netboot_args(net: &provisioning_net::ProvisioningNet) -> Vec<String> {
    [
        "--license",
        "standard",
        "--qemu-tap",
        provisioning_net::TAP,
        "--qemu-netns",
        &net.netns,
    ]
    .map(String::from)
    .into()
}

/// The site's boot loaders in the boot root, as the README tells an operator to put them
/// there: PXELINUX from Debian's packages, and GRUB's network image made by `grub-mkimage`
/// with its prefix on the TFTP server it was loaded from (so it looks up `grub.cfg-01-<mac>`
/// there).
fn install_boot_loaders(boot_root: &Path) {
    std::fs::create_dir_all(boot_root).expect("the boot root");
    for (from, name) in [
        ("/usr/lib/PXELINUX/pxelinux.0", "pxelinux.0"),
        ("/usr/lib/syslinux/modules/bios/ldlinux.c32", "ldlinux.c32"),
    ] {
        std::fs::copy(from, boot_root.join(name)).unwrap_or_else(|e| {
            panic!("copying {from}: {e} (apt-get install pxelinux syslinux-common; scripts/setup does)")
        });
    }
    let out = boot_root.join("grubnetx64.efi");
    crate::tools::tool_ok(
        "grub-mkimage",
        "grub-common grub-efi-amd64-bin",
        &[
            "-O",
            "x86_64-efi",
            "-p",
            "(tftp)",
            "-o",
            &out.display().to_string(),
            "tftp",
            "efinet",
            "linux",
            "normal",
            "configfile",
            "echo",
            "boot",
        ],
    );
}

/// A running lab: one emulated iLO with its QEMU node, a conductor, a media server.
pub struct Lab {
    name: String,
    dir: tempfile::TempDir,
    // Field order is drop order: the conductor goes first (it would power the node off through
    // an emulator that is gone otherwise), then the emulator (QEMU dies with it).
    conductor: Option<ChildGuard>,
    emulator: Option<ChildGuard>,
    /// Ironic's HTTP server (`[deploy] http_root`), in an Ironic lab.
    ironic: Option<ironic::IronicHttp>,
    /// The media server (deploy ISO, images).
    pub media: MediaServer,
    /// `127.0.0.1:PORT` of the emulated iLO.
    pub ilo: String,
    /// The emulator's certificate.
    pub ilo_cert: PathBuf,
    /// The API's port on loopback.
    pub api_port: u16,
    /// The conductor's netboot HTTP port (`pxe_ilo` labs), on the provisioning network.
    pub netboot_http_port: Option<u16>,
    /// The provisioning network (`pxe_ilo` labs): the conductor's TFTP (port 69), HTTP and
    /// API listen on its `server_ip`. Dropped after the emulator, so QEMU is gone first.
    pub net: Option<provisioning_net::ProvisioningNet>,
    /// Guest port → forwarded host port (3260, 9999, 10000).
    pub forwards: HashMap<u16, u16>,
    /// [`LabOptions::debug_logging`].
    debug_logging: bool,
    started: Instant,
}

impl Lab {
    /// Starts the emulator (QEMU backend, powered off), the media server and the conductor.
    /// `name` names the artifact directory.
    pub fn start(name: &str, options: LabOptions) -> Lab {
        let dir = tempfile::Builder::new()
            .prefix("e2e")
            .tempdir_in("/var/tmp")
            .expect("lab directory (short: QMP socket paths)");
        let iso = crate::deploy_iso::deploy_iso();
        let mut files = vec![(
            "/deploy.iso".to_owned(),
            std::fs::read(&iso).expect("reading the deploy ISO"),
        )];
        files.extend(options.media.iter().cloned());
        let media =
            MediaServer::start(files.iter().map(|(p, b)| (p.as_str(), b.clone())).collect());
        let media_port = media
            .url("/")
            .rsplit_once(':')
            .and_then(|(_, rest)| rest.trim_end_matches('/').parse::<u16>().ok())
            .expect("the media server's port");
        // Ironic serves the node its images from its own HTTP root: the node's media address
        // leads there instead.
        let ironic = (options.peer == Peer::Ironic)
            .then(|| ironic::IronicHttp::start(&dir.path().join("ironic-http")));
        let media_port = ironic.as_ref().map_or(media_port, |h| h.port);

        let api_port = free_port();
        let netboot_http_port = free_port();
        let net = options.netboot.map(|_| {
            install_boot_loaders(&dir.path().join("conductor").join("netboot"));
            provisioning_net::ProvisioningNet::start(&dir.path().join("dhcp"), netboot_http_port)
        });
        let ilo_cert = dir.path().join("ilo-cert.pem");
        let qemu_state = dir.path().join("qemu");
        let emulator_log = dir.path().join("emulator.log");
        let mut emulator = Command::new(bin("ilo-emulator"));
        emulator
            .args(["--listen", "127.0.0.1:0", "--servers", "1"])
            .args(["--username", ILO_USER, "--password", ILO_PASSWORD])
            .arg("--cert-out")
            .arg(&ilo_cert)
            .args(["--backend", "qemu", "--qemu-state-dir"])
            .arg(&qemu_state)
            .args(["--qemu-memory-mib", &options.memory_mib.to_string()])
            .args(["--qemu-disk-size-mib", &options.disk_size_mib.to_string()])
            .args([
                "--qemu-nic",
                options.nic,
                "--qemu-disk",
                options.disk_controller,
            ])
            .args(options.capture_net.then_some("--qemu-capture-net"));
        match &net {
            Some(net) => emulator.args(netboot_args(net)),
            // On QEMU's user network the node reaches the host's services through forwards.
            None => emulator
                .arg("--guest-forward")
                .arg(format!("{GUEST_API}=127.0.0.1:{api_port}"))
                .arg("--guest-forward")
                .arg(format!("{GUEST_MEDIA}=127.0.0.1:{media_port}"))
                .args(
                    options
                        .guest_forwards
                        .iter()
                        .flat_map(|f| ["--guest-forward", f.as_str()]),
                ),
        };
        emulator
            .args(
                options
                    .guest_ip
                    .iter()
                    .flat_map(|ip| ["--qemu-guest-ip", ip.as_str()]),
            )
            .args(options.profile.iter().flat_map(|p| ["--profile", p]))
            .args(
                (options.peer == Peer::Ironic)
                    .then_some(["--product", ironic::ILO5_PRODUCT])
                    .into_iter()
                    .flatten(),
            )
            .env(
                "RUST_LOG",
                if options.debug_logging {
                    "debug"
                } else {
                    "info"
                },
            )
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&emulator_log).expect("emulator log"));
        let mut emulator = ChildGuard::new(emulator.spawn().expect("starting ilo-emulator"));
        let ilo = read_emulator_address(&mut emulator, &emulator_log);

        let mut lab = Lab {
            name: name.to_owned(),
            dir,
            conductor: None,
            emulator: Some(emulator),
            ironic,
            media,
            ilo,
            ilo_cert,
            api_port,
            netboot_http_port: options.netboot.map(|_| netboot_http_port),
            net,
            forwards: HashMap::new(),
            debug_logging: options.debug_logging,
            started: Instant::now(),
        };
        let state = lab.emulator_state();
        if let Some(net) = &lab.net {
            if options.netboot == Some(NetbootLoader::PxeRom) {
                net.boot_as_pxe_rom(&mac_in(&state));
            }
        }
        // On the provisioning network nothing is forwarded: the conductor reaches the node at
        // its own address.
        for guest in [3260u16, 9999, 10000]
            .into_iter()
            .filter(|_| lab.net.is_none())
        {
            let host = state["machine"]["forwards"][guest.to_string()]
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or_else(|| {
                    panic!("the emulator forwards no host port to guest {guest}: {state}")
                });
            lab.forwards.insert(guest, host);
        }
        match options.peer {
            Peer::Vmdeploy => lab.start_conductor(&options),
            Peer::Ironic => lab.start_ironic(&options),
        }
        lab
    }

    /// The lab's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn start_conductor(&mut self, options: &LabOptions) {
        let state_dir = self.dir.path().join("conductor");
        std::fs::create_dir_all(&state_dir).expect("conductor state dir");
        // The address the node reaches the API at: a guest forward on the user network, the
        // host's end of the provisioning network otherwise.
        let (api_url, api_listen) = match &self.net {
            Some(net) => (
                format!("http://{}:{}", net.server_ip, self.api_port),
                // The deploy ramdisk speaks plain HTTP to the API, as IPA does without a CA
                // on its command line: the operator opts in to serving it beyond loopback.
                format!(
                    "[\"127.0.0.1:{port}\", \"{}:{port}\"]\ninsecure_listen_without_tls = true",
                    net.server_ip,
                    port = self.api_port
                ),
            ),
            None => (
                format!("http://{GUEST_API}"),
                format!("[\"127.0.0.1:{}\"]", self.api_port),
            ),
        };
        let mut deploy = vec![
            format!("api_url = \"{api_url}\""),
            format!(
                "deploy_callback_timeout = {}",
                options.callback_timeout_secs
            ),
            // The guest powers itself off after standby.power_off; QEMU's SHUTDOWN event
            // turns the emulated server OFF, so the conductor rarely waits this long.
            "agent_power_off_wait = 30".into(),
            format!("automated_clean = {}", options.automated_clean),
            format!(
                "boot_loaders_dir = \"{}\"",
                crate::conductor_env::boot_loaders_dir(self.dir.path()).display()
            ),
            "boot_iso_append = \"console=ttyS0\"".into(),
        ];
        if self.net.is_none() {
            deploy.push(format!("iscsi_portal_port = {}", self.forwards[&3260]));
            deploy.push(format!("iscsi_done_port = {}", self.forwards[&10000]));
        }
        deploy.extend(options.deploy_config.iter().cloned());
        let mut config = format!(
            "[api]\nlisten = {}\n\n[deploy]\n{}\n\n[ilo]\nverify_ca = \"{}\"\n\n[log]\nlevel = \"{}\"\n",
            api_listen,
            deploy.join("\n"),
            self.ilo_cert.display(),
            // Every level of our own crates (trace included), debug for the libraries.
            if options.debug_logging {
                "debug,vmdeploy_conductor=trace,vmdeploy_shared=trace"
            } else {
                "info"
            },
        );
        if let (Some(http_port), Some(net)) = (self.netboot_http_port, &self.net) {
            let iso = crate::deploy_iso::deploy_iso_build();
            config.push_str(&format!(
                "\n[netboot]\ntftp_listen = \"{server}:69\"\nhttp_listen = \"{server}:{http_port}\"\nhttp_url = \"http://{server}:{http_port}\"\n\
                 deploy_kernel = \"file://{}\"\ndeploy_ramdisk = \"file://{}\"\n\
                 append_params = \"console=ttyS0\"\ninstance_append_params = \"console=ttyS0\"\n",
                iso.kernel.display(),
                iso.initramfs.display(),
                server = net.server_ip,
            ));
        }
        for section in &options.extra_config {
            config.push('\n');
            config.push_str(section);
            config.push('\n');
        }
        let config_path = self.dir.path().join("conductor.toml");
        std::fs::write(&config_path, config).expect("writing conductor.toml");
        let log = self.dir.path().join("conductor.log");
        let child = Command::new(bin("vmdeploy-conductor"))
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .arg("--state-dir")
            .arg(&state_dir)
            .env_remove("RUST_LOG")
            .env_remove("STATE_DIRECTORY")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("conductor log"))
            .spawn()
            .expect("starting vmdeploy-conductor serve");
        self.conductor = Some(wait_api(
            ChildGuard::new(child),
            "serve",
            self.api_port,
            &log,
            60,
        ));
    }

    /// The emulated server's QEMU files (`disk.raw`, `serial.log`, `net-<run>.pcap`).
    pub fn qemu_server_dir(&self) -> PathBuf {
        self.dir.path().join("qemu").join("server-0")
    }

    /// The conductor's boot root (`<state dir>/netboot`).
    pub fn boot_root(&self) -> PathBuf {
        self.dir.path().join("conductor").join("netboot")
    }

    /// What the boot root holds for `node`: its directory's files and every MAC link into it,
    /// relative to the root, sorted.
    pub fn netboot_files(&self, node: &str) -> Vec<String> {
        let root = self.boot_root();
        let mut found = Vec::new();
        for dir in [root.clone(), root.join("pxelinux.cfg")] {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if let Ok(target) = std::fs::read_link(entry.path()) {
                    if target.to_string_lossy().contains(node) {
                        let rel = entry.path().strip_prefix(&root).map(Path::to_path_buf);
                        found.push(rel.unwrap_or_else(|_| entry.path()).display().to_string());
                    }
                }
            }
        }
        for entry in std::fs::read_dir(root.join(node))
            .into_iter()
            .flatten()
            .flatten()
        {
            found.push(format!("{node}/{}", entry.file_name().to_string_lossy()));
        }
        found.sort();
        found
    }

    /// The objects in the conductor's built-in store (`<state dir>/objects`), as
    /// `container/name`, uploads in progress left out.
    pub fn stored_objects(&self) -> Vec<String> {
        let root = self.dir.path().join("conductor").join("objects");
        let mut found = Vec::new();
        for container in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let cname = container.file_name().to_string_lossy().into_owned();
            if cname.starts_with('.') || !container.path().is_dir() {
                continue;
            }
            for object in std::fs::read_dir(container.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let oname = object.file_name().to_string_lossy().into_owned();
                if let Some(stem) = oname.strip_suffix(".data") {
                    found.push(format!("{cname}/{stem}"));
                }
            }
        }
        found.sort();
        found
    }

    /// The QEMU processes of this lab's emulator still running (their pids).
    pub fn qemu_pids(&self) -> Vec<u32> {
        let Some(emulator) = self.emulator.as_ref() else {
            return Vec::new();
        };
        let parent = emulator.id();
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid ...`: comm may hold spaces, so split after the last ')'.
            let Some((head, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let mut fields = rest.split_whitespace();
            let state = fields.next();
            let ppid = fields.next().and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(parent) && head.contains("qemu-system") && state != Some("Z") {
                pids.push(pid);
            }
        }
        pids
    }

    /// The node's MAC as the emulator reports it (`aa:bb:..`, lower case).
    pub fn node_mac(&self) -> String {
        mac_in(&self.emulator_state())
    }

    /// From the next DHCP request on, the node boots as from a plain PXE ROM
    /// ([`NetbootLoader::PxeRom`]; `pxe_ilo` labs).
    pub fn boot_as_pxe_rom(&self) {
        self.net
            .as_ref()
            .expect("a pxe_ilo lab has a provisioning network")
            .boot_as_pxe_rom(&self.node_mac());
    }

    /// The media server's URL of `path` as the node reaches it (through the guest forward).
    pub fn guest_media_url(&self, path: &str) -> String {
        format!("http://{GUEST_MEDIA}{path}")
    }

    /// The `baremetal` CLI against this lab's conductor.
    pub fn baremetal(&self, args: &[&str]) -> Output {
        let home = self.dir.path().join("cli-home");
        std::fs::create_dir_all(&home).expect("CLI home");
        crate::baremetal::run(&format!("http://127.0.0.1:{}", self.api_port), &home, args)
    }

    /// `baremetal ARGS`, which must succeed; its stdout.
    pub fn bm(&self, args: &[&str]) -> String {
        crate::baremetal::succeeded(args, &self.baremetal(args))
    }

    /// Sets the node's instance to the whole-disk image at `url` (`format` `raw` or `qcow2`,
    /// checked against `sha256`), with `extra` arguments of `baremetal node set`.
    pub fn set_whole_disk_image(
        &self,
        node: &str,
        url: &str,
        format: &str,
        sha256: &str,
        extra: &[&str],
    ) {
        let source = format!("image_source={url}");
        let format = format!("image_disk_format={format}");
        let hash = format!("image_os_hash_value={sha256}");
        let mut args = vec!["node", "set", node, "--instance-info", &source];
        args.extend(["--instance-info", &format, "--instance-info"]);
        args.extend(["image_os_hash_algo=sha256", "--instance-info", &hash]);
        args.extend(extra);
        self.bm(&args);
    }

    /// Sets the node's instance to the test OS's partition image, kernel and ramdisk, served
    /// by the media server from [`TEST_OS_PARTITION_MEDIA`] (the conductor fetches all three:
    /// host URLs), `root_gb` 1, netboot (the default for partition images).
    pub fn set_partition_image(&self, node: &str, image: &crate::test_image::TestImage) {
        let [root, kernel, ramdisk] = TEST_OS_PARTITION_MEDIA;
        self.bm(&[
            "node",
            "set",
            node,
            "--instance-info",
            &format!("image_source={}", self.media.url(root)),
            "--instance-info",
            &format!("kernel={}", self.media.url(kernel)),
            "--instance-info",
            &format!("ramdisk={}", self.media.url(ramdisk)),
            "--instance-info",
            "root_gb=1",
            "--instance-info",
            "image_os_hash_algo=sha256",
            "--instance-info",
            &format!("image_os_hash_value={}", image.part_sha256),
        ]);
    }

    /// `baremetal node show NODE -f json`.
    pub fn show(&self, node: &str) -> Value {
        let text = self.bm(&["node", "show", node, "-f", "json"]);
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("node show is not JSON ({e}): {text}"))
    }

    /// Enrolls a node on the emulated iLO with `driver` and `firmware`, and brings it to
    /// `available` (manage, provide); returns its UUID.
    pub fn enroll(&self, name: &str, driver: &str, firmware: Firmware) -> String {
        let uuid = self.create_node(name, driver, firmware);
        self.add_port_and_provide(&uuid);
        uuid
    }

    /// Gives the enrolled node `uuid` a port with the emulated server's MAC (the agent looks its
    /// node up by the MACs of its NICs) and brings it to `available` (manage, provide).
    pub fn add_port_and_provide(&self, uuid: &str) {
        self.bm(&["port", "create", &self.node_mac(), "--node", uuid]);
        self.bm(&["node", "manage", uuid, "--wait", "180"]);
        self.bm(&["node", "provide", uuid, "--wait", "180"]);
        let state = self.show(uuid)["provision_state"].clone();
        assert_eq!(state, "available", "after provide");
    }

    /// Creates a node of `driver` on the emulated iLO (`enroll` without the port and the
    /// moves to `available`); returns its UUID.
    pub fn create_node(&self, name: &str, driver: &str, firmware: Firmware) -> String {
        let port = self.ilo.rsplit_once(':').map(|(_, p)| p).unwrap_or("443");
        let driver_info = [
            "ilo_address=127.0.0.1".to_owned(),
            format!("client_port={port}"),
            format!("ilo_username={ILO_USER}"),
            format!("ilo_password={ILO_PASSWORD}"),
            format!("ilo_verify_ca={}", self.ilo_cert.display()),
            format!("ilo_deploy_iso={}", self.media.url("/deploy.iso")),
        ];
        self.node_create(name, driver, &[], &driver_info, "", firmware)
    }

    /// `baremetal node create`: a node `name` of `driver` with the `interfaces` (`--boot-interface`
    /// and the like, with their values), `driver_info` (`key=value`), the boot mode capability of
    /// `firmware`, and kernel parameters that start with `append` and end with the agent's address
    /// as the conductor reaches it through QEMU's NAT. Returns its UUID.
    pub(crate) fn node_create(
        &self,
        name: &str,
        driver: &str,
        interfaces: &[(&str, &str)],
        driver_info: &[String],
        append: &str,
        firmware: Firmware,
    ) -> String {
        let debug = if self.debug_logging {
            "ipa-debug=1 "
        } else {
            ""
        };
        // Through QEMU's NAT the agent advertises the forwarded port on loopback; on the
        // provisioning network its own address.
        let append = match self.forwards.get(&9999) {
            Some(port) => {
                format!("{append}{debug}ipa-advertise-host=127.0.0.1 ipa-advertise-port={port}")
            }
            None => format!("{append}{debug}").trim_end().to_owned(),
        };
        let mut args: Vec<String> = ["node", "create", "--driver", driver, "--name", name]
            .map(str::to_owned)
            .to_vec();
        for (flag, value) in interfaces {
            args.extend([(*flag).to_owned(), (*value).to_owned()]);
        }
        let append_info = format!("kernel_append_params={append}");
        for info in driver_info.iter().chain([&append_info]) {
            args.extend(["--driver-info".to_owned(), info.clone()]);
        }
        let capabilities = format!("capabilities=boot_mode:{}", firmware.capability());
        args.extend(["--property".to_owned(), capabilities]);
        args.extend(["-f", "value", "-c", "uuid"].map(str::to_owned));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.bm(&args).trim().to_owned()
    }

    /// `node deploy` of a partition image with the iSCSI drivers, to `active` without an error
    /// and set to netboot; returns the node.
    pub fn deploy_to_netboot(&self, node: &str, limit: Duration) -> Value {
        self.bm(&["node", "deploy", node]);
        let shown = self.wait_state(node, "active", limit);
        assert_eq!(shown["last_error"], Value::Null, "{shown}");
        assert_eq!(
            shown["driver_internal_info"]["iscsi_boot_option"], "netboot",
            "{shown}"
        );
        shown
    }

    /// Polls the node until its provision state is `want`; panics at a failed state (with
    /// `last_error`) or at `limit`. Returns the node as `baremetal node show` shows it.
    ///
    /// The polls read the API with curl: each `baremetal` run costs about a second of CPU
    /// (Python importing openstackclient), so polling through it every 2 s kept a core busy
    /// for the whole wait, beside the QEMU machine that does the work being waited for. The
    /// CLI is still what acts on the node and what shows it at the end.
    pub fn wait_state(&self, node: &str, want: &str, limit: Duration) -> Value {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        loop {
            let polled = self.api_node(node);
            let state = polled["provision_state"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let failed = state.ends_with("failed") || state == "error";
            // The CLI's view of the node, once the state is the one waited for or a failure;
            // the API's if a state waited for passed before the CLI read it.
            let shown = if state == want || failed {
                let shown = self.show(node);
                if shown["provision_state"] == polled["provision_state"] {
                    shown
                } else {
                    polled
                }
            } else {
                polled
            };
            if state != last {
                eprintln!(
                    "[{:>5.1} s] {node}: {state}",
                    self.started.elapsed().as_secs_f64()
                );
                last = state.clone();
            }
            if state == want {
                return shown;
            }
            assert!(
                !failed || want.ends_with("failed"),
                "node {node} is {state}, not {want}: {}",
                shown["last_error"]
            );
            assert!(
                Instant::now() < deadline,
                "node {node} is not {want} after {limit:?} (last {state}, last_error {})",
                shown["last_error"]
            );
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    /// The node's error events (`baremetal node history list`), oldest first. Ironic records a
    /// failure there; its `last_error` can be gone by the time the node reads `deploy failed`
    /// (the clean-up's power-off clears it while the node still waits for its agent).
    pub fn history_errors(&self, node: &str) -> Vec<String> {
        let text = self.bm(&["node", "history", "list", node, "--long", "-f", "json"]);
        let events: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("node history is not JSON ({e}): {text}"));
        events
            .as_array()
            .unwrap_or_else(|| panic!("node history is not a list: {text}"))
            .iter()
            .filter(|e| e["severity"] == "ERROR")
            .filter_map(|e| e["event"].as_str().map(str::to_owned))
            .collect()
    }

    /// `GET /_emulator/state` of the server.
    pub fn emulator_state(&self) -> Value {
        let text = self.curl("/_emulator/state");
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("emulator state is not JSON ({e}): {text}"))
    }

    /// The node's serial console since the emulator started (every boot).
    pub fn console(&self) -> String {
        self.curl("/_emulator/console")
    }

    /// How many times `needle` shows on the console.
    pub fn console_count(&self, needle: &str) -> usize {
        self.console().matches(needle).count()
    }

    /// Waits until `needle` shows `times` times on the console.
    pub fn wait_console(&self, needle: &str, times: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let count = self.console_count(needle);
            if count >= times {
                eprintln!(
                    "[{:>5.1} s] console: {needle:?} ×{count}",
                    self.started.elapsed().as_secs_f64()
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{needle:?} shows {count} times on the console, not {times}, after {limit:?}"
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// `GET /v1/nodes/{node}` on the conductor's API (the newest microversion).
    pub fn api_node(&self, node: &str) -> Value {
        let url = format!("http://127.0.0.1:{}/v1/nodes/{node}", self.api_port);
        let text = curl_get(&url, &["-H", "X-OpenStack-Ironic-API-Version: latest"]);
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("GET {url} is not JSON ({e}): {text}"))
    }

    /// `GET path` on the emulator's admin API.
    fn curl(&self, path: &str) -> String {
        let cacert = self.ilo_cert.display().to_string();
        curl_get(
            &format!("https://{}{path}", self.ilo),
            &["--cacert", &cacert],
        )
    }

    /// The pid of `vmdeploy-conductor serve` (benchmarks sample its memory).
    pub fn conductor_pid(&self) -> Option<u32> {
        self.conductor.as_ref().map(|c| c.id())
    }

    /// The emulator's log so far (it logs each QEMU start, in UTC RFC 3339).
    pub fn emulator_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("emulator.log")).unwrap_or_default()
    }

    /// The conductor's log so far.
    pub fn conductor_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("conductor.log")).unwrap_or_default()
    }

    /// Copies the logs to `target/e2e-artifacts/<name>/`; returns that directory.
    pub fn save_artifacts(&self) -> PathBuf {
        let out = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join("target"))
            .join("e2e-artifacts")
            .join(&self.name);
        let _ = std::fs::create_dir_all(&out);
        let state = self.dir.path().join("qemu").join("server-0");
        for (from, to) in [
            (state.join("serial.log"), "serial.log"),
            (state.join("qemu.log"), "qemu.log"),
            (self.dir.path().join("conductor.log"), "conductor.log"),
            (self.dir.path().join("emulator.log"), "emulator.log"),
            (self.dir.path().join("conductor.toml"), "conductor.toml"),
            (self.dir.path().join("ironic.conf"), "ironic.conf"),
        ] {
            let _ = std::fs::copy(from, out.join(to));
        }
        out
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let dir = self.save_artifacts();
            let console = std::fs::read_to_string(dir.join("serial.log")).unwrap_or_default();
            let tail: Vec<&str> = console.lines().rev().take(40).collect();
            eprintln!(
                "--- the node's serial console, last lines (all logs in {}) ---\n{}",
                dir.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        self.conductor.take();
        self.emulator.take();
        self.ironic.take();
        self.net.take();
    }
}

/// The node's MAC in the emulator's state (`machine.mac`), lower case.
fn mac_in(state: &Value) -> String {
    state["machine"]["mac"]
        .as_str()
        .expect("the emulator names the node's MAC")
        .to_lowercase()
}

/// The body of `GET url` by curl with `extra` arguments; panics with curl's message on a
/// failure or an HTTP error.
fn curl_get(url: &str, extra: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "30"])
        .args(extra)
        .arg(url)
        .output()
        .expect("running curl (apt install curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "GET {url}: {}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// `proc` (`what`) once it listens on `port`, within `limit_secs`; panics with its `log` when it
/// exits first or takes longer.
fn wait_api(
    mut proc: ChildGuard,
    what: &str,
    port: u16,
    log: &Path,
    limit_secs: u64,
) -> ChildGuard {
    let deadline = Instant::now() + Duration::from_secs(limit_secs);
    while !crate::tcp_listening(port) {
        if let Ok(Some(status)) = proc.try_wait() {
            panic!(
                "{what} exited ({status}) before listening; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not listen within {limit_secs} s; its log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    proc
}

/// The emulator's address once it is ready; panics with its log otherwise (the guard then
/// kills it).
fn read_emulator_address(child: &mut ChildGuard, log: &Path) -> String {
    match crate::emulator::ready_address(child) {
        Some(address) => address,
        None => panic!(
            "ilo-emulator did not print its address and `ready` within 30 s; its log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        ),
    }
}
