//! `ilo-emulator`: emulated iLOs (RIBCL, Redfish and, with the `ris` quirk of the Gen9 profile,
//! iLO 4's HP RESTful API under `/rest/v1`, over HTTPS) for tests and demos.
//!
//! ```text
//! ilo-emulator --listen ADDR:PORT [--servers N] [--username U --password P]
//!              [--profile NAME] [--quirk NAME[=on|off]]... [--list-profiles]
//!              [--boot-read-mib N [--range-kib K] [--range-latency-ms L] [--range-concurrency C]]
//!              [--tls-cert PEM --tls-key PEM] [--license standard|advanced] [--product NAME]
//!              [--backend memory|qemu] [--qemu-state-dir DIR] [--qemu-memory-mib N]
//!              [--qemu-disk-size-mib N] [--guest-forward HOST:PORT]... [--qemu-vmedia usb|legacy]
//!              [--qemu-nic virtio|e1000] [--qemu-capture-net] [--qemu-guest-ip IP] [--qemu-binary PATH]
//!              [--qemu-pxe-bootfile URL|NAME [--qemu-tftp-root DIR]]
//!              [--qemu-tap IFNAME [--qemu-netns NAME]]
//! ```
//! Server i of N answers on PORT+i. Without a certificate a self-signed one is made (SAN = the
//! listen IP), written to a file, and its path printed. See README.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use vmdeploy_ilo_emulator::backend::{Backend, InMemoryBackend};
use vmdeploy_ilo_emulator::config::BackendFactory;
use vmdeploy_ilo_emulator::config::{EmulatorConfig, ServerConfig, TlsSource};
use vmdeploy_ilo_emulator::media_fetch::BootRead;
use vmdeploy_ilo_emulator::profile::{Profile, QuirkSwitch};
use vmdeploy_ilo_emulator::qemu::{
    DiskController, GuestForward, NicModel, PxeBootfile, QemuBackend, QemuSettings, TapName,
    VmediaBus,
};
use vmdeploy_ilo_emulator::state::{BootMode, License};
use vmdeploy_ilo_emulator::Emulator;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LicenseArg {
    Standard,
    Advanced,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BootModeArg {
    Legacy,
    Uefi,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// No machine: the state is the truth.
    Memory,
    /// A QEMU (TCG) virtual machine per server.
    Qemu,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum VmediaArg {
    /// USB CD-ROM and USB key on xHCI, as an iLO presents them.
    Usb,
    /// AHCI CD-ROM and an ISA floppy drive.
    Legacy,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum NicArg {
    Virtio,
    E1000,
    /// Intel 82576, the chip of HPE's 361i/366i (driver `igb`).
    Igb,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DiskArg {
    /// virtio-blk (fast under TCG).
    Virtio,
    /// An LSI MegaRAID SAS 1078 (driver `megaraid_sas`), the disk on it: ProLiants' MR
    /// controllers use the same driver. SeaBIOS boots from it; OVMF has no driver for it.
    Megasas,
}

/// Emulated HP iLOs: RIBCL and Redfish over HTTPS, one port per server.
#[derive(Debug, Parser)]
#[command(name = "ilo-emulator", version)]
struct Args {
    /// Address of server 0; server i listens on PORT+i (PORT 0: ephemeral ports).
    #[arg(long, required_unless_present = "list_profiles")]
    listen: Option<SocketAddr>,
    /// Firmware profile: identity and quirks of one iLO generation and firmware line
    /// (`--list-profiles`).
    #[arg(long, default_value = "lab", value_parser = parse_profile)]
    profile: Profile,
    /// Turn one quirk on or off on top of the profile: `NAME`, `NAME=on`, `NAME=off`; repeat.
    #[arg(long = "quirk")]
    quirks: Vec<QuirkSwitch>,
    /// Print the profiles and quirks and exit.
    #[arg(long)]
    list_profiles: bool,
    /// At each boot from virtual media, read this many MiB of the image by range before the
    /// boot counts as done (0: only its first sectors).
    #[arg(long, default_value_t = 0)]
    boot_read_mib: u64,
    /// KiB per range request of that read.
    #[arg(long, default_value_t = 256)]
    range_kib: u64,
    /// Milliseconds added to each range request (the BMC's own cost per request).
    #[arg(long, default_value_t = 0)]
    range_latency_ms: u64,
    /// Range requests at once.
    #[arg(long, default_value_t = 4)]
    range_concurrency: usize,
    /// Seconds the iLOs' clocks are ahead of this host's (negative: behind), in their `Date`
    /// headers.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    clock_skew_secs: i64,
    /// Number of emulated servers.
    #[arg(long, default_value_t = 1)]
    servers: usize,
    /// Login accepted by every server.
    #[arg(long, default_value = "Administrator", requires = "password")]
    username: String,
    /// Password accepted by every server.
    #[arg(long, default_value = "password")]
    password: String,
    /// TLS certificate chain (PEM); without it a self-signed certificate is made.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Where to write the self-signed certificate (default: a file in the temp directory).
    #[arg(long, conflicts_with = "tls_cert")]
    cert_out: Option<PathBuf>,
    /// Installed licence: standard has no virtual media, as on real iLO.
    #[arg(long, value_enum, default_value = "advanced")]
    license: LicenseArg,
    /// Product name (GET_PRODUCT_NAME); default: the profile's model. Keep "Gen9"/"Gen10" out
    /// of it to keep proliantutils on RIBCL.
    #[arg(long)]
    product: Option<String>,
    /// Boot mode of a fresh server.
    #[arg(long, value_enum, default_value = "legacy")]
    boot_mode: BootModeArg,
    /// What is behind each iLO: nothing (memory) or a QEMU virtual machine.
    #[arg(long, value_enum, default_value = "memory")]
    backend: BackendArg,
    /// QEMU: where each server's files go (`DIR/server-<i>/`: disk, serial log, QMP socket,
    /// OVMF variables); default a new directory in the temp directory.
    #[arg(long)]
    qemu_state_dir: Option<PathBuf>,
    /// QEMU: guest RAM per server, MiB.
    #[arg(long, default_value_t = 1024)]
    qemu_memory_mib: u32,
    /// QEMU: size of each server's disk image (sparse), MiB.
    #[arg(long, default_value_t = 4096)]
    qemu_disk_size_mib: u64,
    /// QEMU: a host service the guest may reach, `HOST:PORT` (seen by the guest at
    /// 10.0.2.100:PORT) or `GUEST_IP:GUEST_PORT=HOST:PORT`; repeat for more. Nothing else is
    /// reachable from the guest.
    #[arg(long = "guest-forward", value_parser = GuestForward::parse)]
    guest_forwards: Vec<GuestForward>,
    /// QEMU: how virtual media are attached.
    #[arg(long, value_enum, default_value = "usb")]
    qemu_vmedia: VmediaArg,
    /// QEMU: the NIC model.
    #[arg(long, value_enum, default_value = "virtio")]
    qemu_nic: NicArg,
    /// QEMU: the disk controller the disk is on.
    #[arg(long, value_enum, default_value = "virtio")]
    qemu_disk: DiskArg,
    /// QEMU: write every frame of the node's NIC to `server-<i>/net-<run>.pcap`, one file per
    /// QEMU run (QEMU's `filter-dump`): what the node sent, e.g. that it asked no DHCP.
    #[arg(long)]
    qemu_capture_net: bool,
    /// QEMU: the guest address the agent's ports are forwarded to (default: slirp's DHCP
    /// address 10.0.2.15); a node with a static address needs its own.
    #[arg(long)]
    qemu_guest_ip: Option<std::net::Ipv4Addr>,
    /// QEMU: network boot. slirp's DHCP server hands out this boot file (an http://, https://
    /// or tftp:// URL, e.g. http://10.0.2.100:8080/boot.ipxe reached through a
    /// --guest-forward) and the NIC keeps QEMU's iPXE option ROM, so a server whose boot order
    /// puts the network first boots from it (SeaBIOS and OVMF). Without it the NIC has no ROM.
    #[arg(long, value_parser = PxeBootfile::parse)]
    qemu_pxe_bootfile: Option<PxeBootfile>,
    /// QEMU: a directory slirp's built-in TFTP server serves at 10.0.2.2 (the DHCP
    /// next-server), for a --qemu-pxe-bootfile given as a plain file name (`pxelinux.0`).
    #[arg(long)]
    qemu_tftp_root: Option<PathBuf>,
    /// QEMU: plug the NIC into this tap interface (`-netdev tap`) instead of slirp, so the node
    /// is on a real layer-2 network whose own DHCP and boot servers answer it; the NIC keeps
    /// QEMU's iPXE ROM. Nothing is forwarded: the node has its own address there.
    #[arg(long, value_parser = TapName::parse,
          conflicts_with_all = ["qemu_pxe_bootfile", "qemu_tftp_root", "guest_forwards", "qemu_guest_ip"])]
    qemu_tap: Option<TapName>,
    /// QEMU: run QEMU in this network namespace (made by `ip netns add`), where --qemu-tap's
    /// interface is; the emulator itself stays in its own.
    #[arg(long, requires = "qemu_tap")]
    qemu_netns: Option<String>,
    /// QEMU: the emulator binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    qemu_binary: PathBuf,
}

fn main() -> std::process::ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            // Bad configuration exits 64 (EX_USAGE), help/version exit 0.
            return std::process::ExitCode::from(if e.use_stderr() { 64 } else { 0 });
        }
    };
    tracing_subscriber::fmt()
        .with_writer(|| RedactingStderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    if args.list_profiles {
        print!("{}", Profile::listing());
        return std::process::ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ilo-emulator: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ilo-emulator: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The backend settings, taken out of [`Args`] before the rest is moved into the config.
struct BackendArgs {
    kind: BackendArg,
    qemu: Option<QemuSettings>,
}

fn backend_args(args: &Args) -> BackendArgs {
    let qemu = (args.backend == BackendArg::Qemu).then(|| {
        let state_dir = args.qemu_state_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("ilo-emulator-{}", std::process::id()))
        });
        let mut s = QemuSettings::new(state_dir);
        s.qemu_binary = args.qemu_binary.clone();
        s.memory_mib = args.qemu_memory_mib;
        s.disk_size = args.qemu_disk_size_mib.saturating_mul(1 << 20);
        s.guest_forwards = args.guest_forwards.clone();
        s.capture_net = args.qemu_capture_net;
        s.guest_ip = args.qemu_guest_ip;
        s.pxe_bootfile = args.qemu_pxe_bootfile.clone();
        s.tftp_root = args.qemu_tftp_root.clone();
        s.tap = args.qemu_tap.clone();
        s.netns = args.qemu_netns.clone();
        s.vmedia_bus = match args.qemu_vmedia {
            VmediaArg::Usb => VmediaBus::Usb,
            VmediaArg::Legacy => VmediaBus::Legacy,
        };
        s.nic = match args.qemu_nic {
            NicArg::Virtio => NicModel::Virtio,
            NicArg::E1000 => NicModel::E1000,
            NicArg::Igb => NicModel::Igb,
        };
        s.disk_controller = match args.qemu_disk {
            DiskArg::Virtio => DiskController::VirtioBlk,
            DiskArg::Megasas => DiskController::Megasas,
        };
        s
    });
    BackendArgs {
        kind: args.backend,
        qemu,
    }
}

fn backend_factory(b: &BackendArgs, servers: usize) -> anyhow::Result<BackendFactory> {
    match (b.kind, &b.qemu) {
        (BackendArg::Qemu, Some(settings)) => {
            settings.check().map_err(anyhow::Error::msg)?;
            std::fs::create_dir_all(&settings.state_dir).with_context(|| {
                format!(
                    "creating the QEMU state directory {}",
                    settings.state_dir.display()
                )
            })?;
            tracing::info!(state_dir = %settings.state_dir.display(), "QEMU backend");
            let settings = Arc::new(settings.clone());
            // Every backend is made now (its host ports are picked here), so a failure stops the
            // start instead of leaving a server without its machine.
            let backends = (0..servers)
                .map(|i| {
                    QemuBackend::new(settings.clone(), i)
                        .map(|b| Arc::new(b) as Arc<dyn Backend>)
                        .with_context(|| format!("setting up server {i}'s QEMU machine"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok(Arc::new(move |i| -> Arc<dyn Backend> {
                // The emulator asks for indexes 0..servers only.
                backends
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| Arc::new(InMemoryBackend))
            }))
        }
        _ => Ok(Arc::new(|_| Arc::new(InMemoryBackend) as Arc<dyn Backend>)),
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let args_backend = backend_args(&args);
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => TlsSource::Pem { cert, key },
        _ => TlsSource::SelfSigned {
            write_cert_to: Some(args.cert_out.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("ilo-emulator-{}-cert.pem", std::process::id()))
            })),
        },
    };
    let listen = args
        .listen
        .context("--listen is required (clap checks it)")?;
    let profile = args.profile.with_switches(&args.quirks);
    tracing::info!(profile = profile.name, quirks = ?profile.quirks, "firmware profile");
    let defaults = ServerConfig::with_profile(profile);
    let config = EmulatorConfig {
        listen,
        servers: args.servers,
        server: ServerConfig {
            username: args.username,
            password: args.password,
            product: args.product.unwrap_or(defaults.product.clone()),
            clock_skew_secs: args.clock_skew_secs,
            boot_read: BootRead {
                boot_bytes: args.boot_read_mib.saturating_mul(1 << 20),
                range_bytes: args.range_kib.max(1).saturating_mul(1024),
                latency: std::time::Duration::from_millis(args.range_latency_ms),
                concurrency: args.range_concurrency.max(1),
            },
            license: match args.license {
                LicenseArg::Standard => License::Standard,
                LicenseArg::Advanced => License::Advanced,
            },
            boot_mode: match args.boot_mode {
                BootModeArg::Legacy => BootMode::Legacy,
                BootModeArg::Uefi => BootMode::Uefi,
            },
            ..defaults
        },
        tls,
        backend: backend_factory(&args_backend, args.servers)?,
    };
    let emulator = Emulator::start(config)
        .await
        .context("starting the emulated iLOs")?;
    // Machine-readable start-up lines on stdout (tests wait for "ready").
    if let Some(path) = emulator.cert_path() {
        println!("tls-cert {}", path.display());
    }
    for (i, addr) in emulator.addresses().iter().enumerate() {
        println!("server {i} https://{addr}");
    }
    println!("ready");
    wait_for_signal().await?;
    tracing::info!("shutting down");
    emulator.shutdown().await;
    Ok(())
}

fn parse_profile(name: &str) -> Result<Profile, String> {
    Profile::named(name)
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C"),
        _ = term.recv() => Ok(()),
    }
}

/// Standard error with every temp URL signature masked: the emulator logs the media URLs it is
/// given (and structs holding them) as an iLO would show them, and a signature in a log is a
/// credential for the object behind it. tracing writes each event with one `write_all`.
struct RedactingStderr;

impl std::io::Write for RedactingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let masked = vmdeploy_shared::redact::signatures(&text);
        std::io::stderr().write_all(masked.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
