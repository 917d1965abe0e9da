//! `vmdeploy-conductor ilo`: operator commands against one iLO (or other Redfish BMC).
//!
//! Human output by default, one JSON object with `--json`. Every failure ends the process with a
//! non-zero status and one line on stderr (main.rs prints the error chain).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Subcommand, ValueEnum};
use serde_json::{json, Value};
use vmdeploy_shared::exit::UsageError;

use super::{IloClient, IloConfig, Protocol, TlsVerify};
use crate::drivers::{
    BootDevice, BootMode, DriverError, Inventory, Management, Power, PowerAction, Secret,
    VirtualMedia, VmediaBootOption, VmediaDevice,
};

/// Arguments of `vmdeploy-conductor ilo`.
#[derive(clap::Args, Debug)]
pub struct IloArgs {
    /// The iLO, `HOST` or `HOST:PORT` (port 443 by default). Required.
    #[arg(long, global = true)]
    pub address: Option<String>,
    /// Login name. Required.
    #[arg(long, global = true)]
    pub username: Option<String>,
    /// File holding the password (first line); passwords are never taken on the command line.
    /// Required.
    #[arg(long, global = true)]
    pub password_file: Option<PathBuf>,
    /// Verify the iLO's certificate against the CA certificates in this PEM file.
    #[arg(long, global = true, conflicts_with = "insecure")]
    pub ca: Option<PathBuf>,
    /// Do not verify the iLO's certificate.
    #[arg(long, global = true)]
    pub insecure: bool,
    /// Protocol: ribcl, redfish, or auto (ask the BMC: iLO 4 uses RIBCL, iLO 5 and later and
    /// other Redfish BMCs use Redfish).
    #[arg(long, value_enum, default_value = "auto")]
    pub protocol: ProtocolArg,
    /// Seconds each operation may take, retries included.
    #[arg(long, global = true, default_value_t = super::DEFAULT_TIMEOUT_SECS)]
    pub timeout: u64,
    /// Print one JSON object instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: IloCommand,
}

/// `--protocol` values.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolArg {
    /// RIBCL over HTTPS.
    Ribcl,
    /// Redfish.
    Redfish,
    /// Ask the BMC which generation it is.
    Auto,
}

/// Operator commands.
#[derive(Subcommand, Debug)]
pub enum IloCommand {
    /// Power: `status` (default) prints `on` or `off`.
    Power {
        /// on, off (hold the button), reset, press, or status.
        #[arg(value_enum, default_value = "status")]
        action: PowerArg,
    },
    /// Set (or, without a device, show) the device for the next boot only.
    BootOnce {
        /// cdrom, hdd or network.
        #[arg(value_enum)]
        device: Option<DeviceArg>,
    },
    /// Set (or, without a device, show) the first persistent boot device.
    BootPersistent {
        /// cdrom, hdd or network.
        #[arg(value_enum)]
        device: Option<DeviceArg>,
    },
    /// Boot mode: `get` (default; the mode of the next boot), `set uefi|bios`, `supported`.
    BootMode {
        /// What to do.
        #[command(subcommand)]
        action: Option<BootModeAction>,
    },
    /// Virtual media: insert, eject, status or set-status of the floppy or CD.
    Vmedia {
        /// insert, eject, status or set-status.
        #[arg(value_enum)]
        action: VmediaAction,
        /// floppy or cdrom.
        #[arg(value_enum)]
        device: VmediaArg,
        /// Image URL (insert).
        url: Option<String>,
        /// set-status: when the media is connected.
        #[arg(long, value_enum)]
        boot_option: Option<VmBootArg>,
        /// set-status: read-only for the host (yes/no).
        #[arg(long)]
        write_protect: Option<YesNo>,
    },
    /// Installed licences.
    Licence,
    /// Temperatures, fans, power supplies and power draw.
    Health,
    /// The newest entries of the server's Integrated Management Log (what the firmware
    /// recorded about POST and boots, such as a Secure Boot refusal), oldest first. Redfish
    /// (iLO 5/6) only.
    Iml {
        /// How many entries, at most.
        #[arg(long, default_value_t = 20)]
        last: usize,
    },
    /// Model, firmware and protocol.
    Info,
    /// Read-only readiness checks of the iLO before a fleet is enrolled: one line per check,
    /// `ok`, `warn` or `fail` with what to do; exit 1 when a check fails.
    Probe {
        /// An image URL to HEAD from here (the iLO reads media by range).
        #[arg(long)]
        media_url: Option<String>,
        /// Probe a fleet: a file with one iLO per line,
        /// `ADDRESS [USERNAME [PASSWORD_FILE [CA_FILE]]]` (`#` starts a comment); what a line
        /// leaves out comes from --username, --password-file and --ca. Prints a table.
        #[arg(long, conflicts_with = "address")]
        inventory: Option<PathBuf>,
        /// With --inventory: iLOs probed at once.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
    },
}

/// `power` actions.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerArg {
    /// Power on.
    On,
    /// Power off (hold the power button, as Ironic does).
    Off,
    /// Hard reset.
    Reset,
    /// Press the power button briefly.
    Press,
    /// Print `on` or `off`.
    Status,
}

/// Boot devices the CLI sets.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceArg {
    /// CD/DVD (virtual CD).
    Cdrom,
    /// Local disk.
    Hdd,
    /// PXE.
    Network,
}

/// `boot-mode` actions.
#[derive(Subcommand, Debug, Clone, Copy)]
pub enum BootModeAction {
    /// Print the boot mode (`uefi` or `bios`) of the next boot.
    Get {
        /// Print the mode in effect now instead.
        #[arg(long)]
        current: bool,
    },
    /// Set the boot mode for the next boot.
    Set {
        /// uefi or bios.
        #[arg(value_enum)]
        mode: ModeArg,
    },
    /// Print the boot modes the firmware supports.
    Supported,
}

/// Boot modes.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeArg {
    /// UEFI.
    Uefi,
    /// Legacy BIOS.
    Bios,
}

/// `vmedia` actions.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmediaAction {
    /// Insert an image by URL.
    Insert,
    /// Eject.
    Eject,
    /// Print whether an image is inserted, and its URL.
    Status,
    /// Set when it is connected (`--boot-option`) and read-only (`--write-protect`).
    SetStatus,
}

/// Virtual media devices.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmediaArg {
    /// The virtual floppy.
    Floppy,
    /// The virtual CD.
    Cdrom,
}

/// VM boot options.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmBootArg {
    /// Connect at every boot.
    BootAlways,
    /// Connect at the next boot only.
    BootOnce,
    /// Do not connect at boot.
    NoBoot,
    /// Connect now.
    Connect,
    /// Disconnect now.
    Disconnect,
}

/// yes/no.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum YesNo {
    /// Yes.
    Yes,
    /// No.
    No,
}

impl From<DeviceArg> for BootDevice {
    fn from(d: DeviceArg) -> Self {
        match d {
            DeviceArg::Cdrom => BootDevice::Cdrom,
            DeviceArg::Hdd => BootDevice::Hdd,
            DeviceArg::Network => BootDevice::Network,
        }
    }
}

impl From<VmediaArg> for VmediaDevice {
    fn from(d: VmediaArg) -> Self {
        match d {
            VmediaArg::Floppy => VmediaDevice::Floppy,
            VmediaArg::Cdrom => VmediaDevice::Cdrom,
        }
    }
}

/// Reads the password file: its first line, without the line end.
fn read_password(path: &std::path::Path) -> anyhow::Result<Secret> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading password file {}", path.display()))?;
    let password = text.lines().next().unwrap_or("");
    if password.is_empty() {
        bail!("password file {} is empty", path.display());
    }
    Ok(Secret::new(password))
}

fn config(args: &IloArgs) -> anyhow::Result<IloConfig> {
    let (Some(address), Some(username), Some(password_file)) =
        (&args.address, &args.username, &args.password_file)
    else {
        bail!("--address, --username and --password-file are required");
    };
    config_for(args, address, username, password_file, args.ca.as_deref())
}

/// The config of one iLO: its address and login, the rest from `args`.
fn config_for(
    args: &IloArgs,
    address: &str,
    username: &str,
    password_file: &std::path::Path,
    ca: Option<&std::path::Path>,
) -> anyhow::Result<IloConfig> {
    let mut config = IloConfig::new(address, username, read_password(password_file)?);
    if args.timeout == 0 {
        bail!("--timeout must be at least 1 second");
    }
    config.timeout = Duration::from_secs(args.timeout);
    config.tls = match (ca, args.insecure) {
        (Some(ca), _) => TlsVerify::CaFile(ca.to_path_buf()),
        (None, true) => TlsVerify::Insecure,
        (None, false) => TlsVerify::System,
    };
    config.protocol = match args.protocol {
        ProtocolArg::Ribcl => Protocol::Ribcl,
        ProtocolArg::Redfish => Protocol::Redfish,
        ProtocolArg::Auto => Protocol::Auto,
    };
    Ok(config)
}

/// The iLOs of an inventory file (see `IloCommand::Probe`), each with its config.
fn inventory(args: &IloArgs, path: &std::path::Path) -> anyhow::Result<Vec<IloConfig>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the inventory {}", path.display()))?;
    let mut configs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let at = || format!("{} line {}", path.display(), n + 1);
        if fields.len() > 4 {
            bail!("{}: more than ADDRESS USERNAME PASSWORD_FILE CA_FILE", at());
        }
        let username = fields
            .get(1)
            .copied()
            .or(args.username.as_deref())
            .with_context(|| format!("{}: no user name, and no --username", at()))?;
        let password_file = fields
            .get(2)
            .map(PathBuf::from)
            .or_else(|| args.password_file.clone())
            .with_context(|| format!("{}: no password file, and no --password-file", at()))?;
        let ca = fields.get(3).map(PathBuf::from).or_else(|| args.ca.clone());
        configs.push(
            config_for(args, fields[0], username, &password_file, ca.as_deref())
                .with_context(at)?,
        );
    }
    if configs.is_empty() {
        bail!("the inventory {} names no iLO", path.display());
    }
    Ok(configs)
}

/// `ilo probe`: one iLO's checks, or with an inventory the fleet's table.
fn run_probe(
    args: &IloArgs,
    media_url: Option<&str>,
    inventory_file: Option<&std::path::Path>,
    concurrency: usize,
) -> anyhow::Result<()> {
    let configs = match inventory_file {
        Some(path) => inventory(args, path).map_err(UsageError::wrap)?,
        None => vec![config(args).map_err(UsageError::wrap)?],
    };
    if concurrency == 0 {
        return Err(UsageError::wrap(anyhow::anyhow!("--concurrency must be at least 1")).into());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let reports: Vec<super::probe::Report> = runtime.block_on(async {
        use futures_util::stream::StreamExt;
        futures_util::stream::iter(configs.iter())
            .map(|config| super::probe::probe(config, media_url))
            .buffered(concurrency)
            .collect()
            .await
    });
    let failed: Vec<&super::probe::Report> = reports.iter().filter(|r| r.failed()).collect();
    let single = inventory_file.is_none();
    if args.json {
        let json = if single {
            serde_json::to_string(&reports[0])
        } else {
            serde_json::to_string(&json!({ "ilos": reports }))
        };
        println!("{}", json.context("writing the report")?);
    } else if single {
        print!("{}", reports[0].text());
    } else {
        print!("{}", super::probe::fleet_table(&reports));
    }
    match failed.first() {
        None => Ok(()),
        Some(first) if single => {
            let check = first.first_failure().map_or(String::new(), |c| {
                format!(", the first: {}: {}", c.check, c.detail)
            });
            bail!(
                "{} check(s) failed{check}",
                first.count(super::probe::Status::Fail)
            )
        }
        Some(_) => bail!("{} of {} iLOs failed a check", failed.len(), reports.len()),
    }
}

/// Runs an iLO operator command. Errors in the arguments, requests the iLO was never sent
/// because their input is wrong, and requests the iLO refused as invalid
/// ([`DriverError::InvalidRequest`]: an address, a CA file, an image URL, a virtual media option
/// the iLO rejects) are [`UsageError`]s (exit 64).
pub fn run(args: IloArgs) -> anyhow::Result<()> {
    if let IloCommand::Probe {
        media_url,
        inventory,
        concurrency,
    } = &args.command
    {
        return run_probe(
            &args,
            media_url.as_deref(),
            inventory.as_deref(),
            *concurrency,
        );
    }
    let config = config(&args).map_err(UsageError::wrap)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let output = runtime
        .block_on(async {
            let client = IloClient::connect(&config)
                .await
                .with_context(|| format!("connecting to iLO {}", config.address))?;
            let result = execute(&client, &args.command).await;
            if let IloClient::Redfish(redfish) = &client {
                redfish.logout().await;
            }
            result
        })
        .map_err(usage_if_invalid_request)?;
    if args.json {
        println!("{}", output.json);
    } else if !output.text.is_empty() {
        println!("{}", output.text);
    }
    Ok(())
}

/// `err` marked as a usage error when a request was refused before reaching the iLO.
fn usage_if_invalid_request(err: anyhow::Error) -> anyhow::Error {
    let invalid = err.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<DriverError>(),
            Some(DriverError::InvalidRequest(_))
        )
    });
    if invalid {
        UsageError::wrap(err).into()
    } else {
        err
    }
}

/// What a command prints.
struct Output {
    text: String,
    json: Value,
}

impl Output {
    fn new(text: impl Into<String>, json: Value) -> Self {
        Self {
            text: text.into(),
            json,
        }
    }
}

fn opt<T: std::fmt::Display>(v: &Option<T>, unit: &str) -> String {
    v.as_ref()
        .map(|x| format!("{x}{unit}"))
        .unwrap_or_else(|| "-".to_string())
}

/// `iLO4 2.55`; Redfish versions already name the BMC (`iLO 5 v2.72`).
fn firmware_line(info: &crate::drivers::BmcInfo) -> String {
    let version = info.firmware_version.as_deref().unwrap_or("-");
    match info.management_processor.as_deref() {
        Some(p) if !version.starts_with(p) => format!("{p} {version}"),
        _ => version.to_string(),
    }
}

async fn execute(client: &IloClient, command: &IloCommand) -> anyhow::Result<Output> {
    let protocol = client.protocol().to_string();
    Ok(match command {
        IloCommand::Power { action } => {
            let power_action = match action {
                PowerArg::Status => {
                    let state = client.power_state().await.context("reading power state")?;
                    return Ok(Output::new(
                        state.to_string(),
                        json!({"power": state, "protocol": protocol}),
                    ));
                }
                PowerArg::On => PowerAction::On,
                PowerArg::Off => PowerAction::HoldButton,
                PowerArg::Reset => PowerAction::Reset,
                PowerArg::Press => PowerAction::PressButton,
            };
            let message = client
                .set_power(power_action)
                .await
                .with_context(|| format!("power {}", format!("{action:?}").to_lowercase()))?;
            Output::new(
                message.clone().unwrap_or_else(|| "ok".to_string()),
                json!({"ok": true, "action": power_action, "message": message, "protocol": protocol}),
            )
        }
        IloCommand::BootOnce { device: Some(d) } => {
            let device = BootDevice::from(*d);
            client
                .set_one_time_boot(&device)
                .await
                .with_context(|| format!("setting one-time boot to {device}"))?;
            Output::new("ok", json!({"ok": true, "boot_once": device}))
        }
        IloCommand::BootOnce { device: None } => {
            let device = client
                .one_time_boot()
                .await
                .context("reading one-time boot")?;
            Output::new(
                device
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_else(|| "none".to_string()),
                json!({"boot_once": device}),
            )
        }
        IloCommand::BootPersistent { device: Some(d) } => {
            let device = BootDevice::from(*d);
            client
                .set_persistent_boot(&device)
                .await
                .with_context(|| format!("setting persistent boot to {device}"))?;
            Output::new("ok", json!({"ok": true, "boot_persistent": device}))
        }
        IloCommand::BootPersistent { device: None } => {
            // One line per entry: the device it stands for, then the iLO's own id and
            // description of a UEFI entry (`hdd\tBoot0007 (Embedded RAID 1 : ...)`).
            let entries = client
                .persistent_boot_entries()
                .await
                .context("reading persistent boot order")?;
            let text: Vec<String> = entries.iter().map(ToString::to_string).collect();
            let order: Vec<&BootDevice> = entries.iter().map(|e| &e.device).collect();
            Output::new(
                text.join("\n"),
                json!({"boot_persistent": order, "entries": entries}),
            )
        }
        IloCommand::BootMode { action } => {
            match action.unwrap_or(BootModeAction::Get { current: false }) {
                BootModeAction::Get { current } => {
                    let mode = if current {
                        client.current_boot_mode().await
                    } else {
                        client.pending_boot_mode().await
                    }
                    .context("reading boot mode")?;
                    Output::new(
                        mode.to_string(),
                        json!({"boot_mode": mode, "which": if current {"current"} else {"pending"}}),
                    )
                }
                BootModeAction::Set { mode } => {
                    let mode = match mode {
                        ModeArg::Uefi => BootMode::Uefi,
                        ModeArg::Bios => BootMode::Bios,
                    };
                    client
                        .set_pending_boot_mode(mode)
                        .await
                        .with_context(|| format!("setting boot mode {mode}"))?;
                    Output::new("ok", json!({"ok": true, "boot_mode": mode}))
                }
                BootModeAction::Supported => {
                    let modes = client
                        .supported_boot_modes()
                        .await
                        .context("reading supported boot modes")?;
                    let text = serde_json::to_value(modes)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    Output::new(text, json!({"supported_boot_modes": modes}))
                }
            }
        }
        IloCommand::Vmedia {
            action,
            device,
            url,
            boot_option,
            write_protect,
        } => {
            let device = VmediaDevice::from(*device);
            match action {
                VmediaAction::Insert => {
                    let Some(url) = url else {
                        return Err(UsageError::new("vmedia insert needs an image URL").into());
                    };
                    client
                        .insert_vmedia(device, url)
                        .await
                        .with_context(|| format!("inserting {url} into {device}"))?;
                    Output::new("ok", json!({"ok": true, "device": device, "url": url}))
                }
                VmediaAction::Eject => {
                    client
                        .eject_vmedia(device)
                        .await
                        .with_context(|| format!("ejecting {device}"))?;
                    Output::new("ok", json!({"ok": true, "device": device}))
                }
                VmediaAction::Status => {
                    let status = client
                        .vmedia_status(device)
                        .await
                        .with_context(|| format!("reading {device} status"))?;
                    let text = match &status.image_url {
                        Some(url) if status.inserted => format!("inserted {url}"),
                        _ if status.inserted => "inserted".to_string(),
                        _ => "not inserted".to_string(),
                    };
                    Output::new(
                        text,
                        serde_json::to_value(&status).context("encoding status")?,
                    )
                }
                VmediaAction::SetStatus => {
                    let Some(option) = boot_option else {
                        return Err(UsageError::new("vmedia set-status needs --boot-option").into());
                    };
                    let option = match option {
                        VmBootArg::BootAlways => VmediaBootOption::BootAlways,
                        VmBootArg::BootOnce => VmediaBootOption::BootOnce,
                        VmBootArg::NoBoot => VmediaBootOption::NoBoot,
                        VmBootArg::Connect => VmediaBootOption::Connect,
                        VmBootArg::Disconnect => VmediaBootOption::Disconnect,
                    };
                    let wp = write_protect.map(|w| w == YesNo::Yes);
                    client
                        .set_vmedia_status(device, option, wp)
                        .await
                        .with_context(|| format!("setting {device} status"))?;
                    Output::new("ok", json!({"ok": true, "device": device}))
                }
            }
        }
        IloCommand::Licence => {
            let licences = client.licences().await.context("reading licences")?;
            let text: Vec<String> = licences
                .iter()
                .map(|l| {
                    format!(
                        "{} ({})",
                        l.licence_type,
                        serde_json::to_value(l.tier())
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default()
                    )
                })
                .collect();
            let tiers: Vec<_> = licences.iter().map(|l| l.tier()).collect();
            Output::new(
                if text.is_empty() {
                    "no licence".to_string()
                } else {
                    text.join("\n")
                },
                json!({"licences": licences, "tiers": tiers}),
            )
        }
        IloCommand::Iml { last } => {
            let entries = client
                .firmware_log(*last)
                .await
                .context("reading the Integrated Management Log")?;
            let text: Vec<String> = entries
                .iter()
                .map(|e| format!("{} {}: {}", e.created, e.severity, e.message))
                .collect();
            Output::new(
                if text.is_empty() {
                    "the Integrated Management Log is empty".to_string()
                } else {
                    text.join("\n")
                },
                json!({ "entries": entries }),
            )
        }
        IloCommand::Health => {
            let health = client.health().await.context("reading health")?;
            let mut lines = Vec::new();
            for t in &health.temperatures {
                lines.push(format!(
                    "temperature {}: {} (caution {}, critical {}) {}",
                    t.label,
                    opt(&t.celsius, " C"),
                    opt(&t.caution, " C"),
                    opt(&t.critical, " C"),
                    t.status.as_deref().unwrap_or("")
                ));
            }
            for f in &health.fans {
                lines.push(format!(
                    "fan {}: {} {}",
                    f.label,
                    opt(&f.speed_percent, "%"),
                    f.status.as_deref().unwrap_or("")
                ));
            }
            for p in &health.power_supplies {
                lines.push(format!(
                    "power supply {}: {} {}",
                    p.label,
                    opt(&p.capacity_watts, " W"),
                    p.status.as_deref().unwrap_or("")
                ));
            }
            lines.push(format!(
                "power: {} (average {}, max {}, min {})",
                opt(&health.power.present_watts, " W"),
                opt(&health.power.average_watts, " W"),
                opt(&health.power.maximum_watts, " W"),
                opt(&health.power.minimum_watts, " W"),
            ));
            Output::new(
                lines.join("\n"),
                serde_json::to_value(&health).context("encoding health")?,
            )
        }
        IloCommand::Info => {
            let info = client.info().await.context("reading BMC information")?;
            Output::new(
                format!(
                    "{}\nfirmware {}\nprotocol {}",
                    info.product_name,
                    firmware_line(&info),
                    info.protocol
                ),
                serde_json::to_value(&info).context("encoding info")?,
            )
        }
        // Run before a client is connected (run()); never reached.
        IloCommand::Probe { .. } => bail!("probe runs on its own"),
    })
}
