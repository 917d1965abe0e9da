//! `vmdeploy-agent run`: the agent's `/init` flow, top to bottom.
//!
//! # Design
//! [`run`] reads as the boot does: PID-1 duties → drivers for the devices present, from the CD's driver pack ([`crate::drivers`]) → parameters
//! (kernel command line, then the virtual floppy on top when `boot_method=vmedia`) → network →
//! the deploy mode → finish or fail.
//! Each step logs what it does. Once the conductor is known, every failure is reported to it
//! (iSCSI mode: `pass_deploy_info` with `error`, [`iscsi`]; agent mode reports through its own
//! protocol), then the agent waits for the conductor (PID 1) or exits 1. When the parameters
//! themselves are unusable there is nobody to report to: the console gets the key and the reason.
//!
//! The mode comes from the parameters (docs/ironic-protocols.md §1.2): a
//! `deployment_key` means the conductor waits for `pass_deploy_info` (iSCSI deploy). Kilo's
//! `iscsi_ilo` floppy also carries `ipa-api-url` (§1.2a), so the key is checked first; without
//! it, `ipa-api-url` means the agent (IPA) protocol.

pub mod iscsi;
pub mod report;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use vmdeploy_shared::params::{keys, AgentParams, IscsiDeployParams, MacAddr, Params};

use crate::floppy::{self, FloppySearch};
use crate::init::{self, FinalAction};

/// Arguments of `vmdeploy-agent run` (session2-contract.md).
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Do the PID-1 duties (mounts, modules, reaper) even when not PID 1.
    #[arg(long)]
    pub pid1: bool,
    /// Read the kernel command line from this file instead of /proc/cmdline.
    #[arg(long)]
    pub cmdline_file: Option<PathBuf>,
    /// Read parameters.txt from this FAT image or device instead of searching by label.
    #[arg(long)]
    pub floppy: Option<PathBuf>,
    /// How long to wait for the virtual floppy to appear (scans 1 s apart).
    #[arg(long, default_value_t = 60)]
    pub floppy_wait_secs: u64,
    /// The floppy's FAT label (tests use a label of their own).
    #[arg(long, default_value = vmdeploy_shared::fat::FLOPPY_LABEL, hide = true)]
    pub floppy_label: String,
    /// Skip network bring-up and advertise this address.
    #[arg(long)]
    pub address: Option<IpAddr>,
    /// Where the agent API (`/v1/commands`) listens in agent mode.
    #[arg(long, default_value = "0.0.0.0:9999")]
    pub agent_listen: SocketAddr,
    /// Where the iSCSI target listens in iSCSI mode.
    #[arg(long, default_value = "0.0.0.0:3260")]
    pub iscsi_listen: SocketAddr,
    /// Where the "done" listener waits in iSCSI mode.
    #[arg(long, default_value = "0.0.0.0:10000")]
    pub done_listen: SocketAddr,
    /// As PID 1, how long to wait for the conductor after a failure before powering off.
    #[arg(long, default_value_t = 600)]
    pub fail_timeout_secs: u64,
    /// MAC addresses for the agent-mode lookup (with --address; default: every NIC's).
    #[arg(long = "mac", value_parser = parse_mac)]
    pub macs: Vec<MacAddr>,
    /// Longest wait for the conductor's "done" after pass_deploy_info (Ironic's
    /// deploy_callback_timeout, docs/ironic-protocols.md §2.5).
    #[arg(long, default_value_t = 1800, hide = true)]
    pub done_timeout_secs: u64,
    /// Longest total time spent retrying pass_deploy_info.
    #[arg(long, default_value_t = 300, hide = true)]
    pub report_timeout_secs: u64,
    /// Longest wait for link and an address.
    #[arg(long, default_value_t = 120, hide = true)]
    pub net_timeout_secs: u64,
}

fn parse_mac(s: &str) -> Result<MacAddr, String> {
    MacAddr::parse(s).map_err(|e| e.to_string())
}

/// The deploy protocol the parameters ask for.
#[derive(Debug, Clone)]
pub enum Mode {
    /// `iscsi_ilo` / `pxe_ilo`: serve the disk, report with `pass_deploy_info`, wait for `done`.
    Iscsi(Box<IscsiDeployParams>),
    /// `agent_ilo`: IPA lookup, heartbeats and the command API.
    Agent(Box<AgentParams>),
}

impl Mode {
    /// Picks the mode and checks its parameters; the error names the key and the reason.
    pub fn from_params(params: &Params) -> anyhow::Result<Mode> {
        if params.get(keys::DEPLOYMENT_KEY).is_some() {
            let typed = IscsiDeployParams::from_params(params)
                .context("the parameters of an iSCSI deploy are unusable")?;
            return Ok(Mode::Iscsi(Box::new(typed)));
        }
        if params.get(keys::IPA_API_URL).is_some() {
            let typed = AgentParams::from_params(params)
                .context("the parameters of an agent deploy are unusable")?;
            return Ok(Mode::Agent(Box::new(typed)));
        }
        bail!(
            "the parameters name no deploy: neither {:?} (iSCSI deploy) nor {:?} (agent deploy) \
             is present",
            keys::DEPLOYMENT_KEY,
            keys::IPA_API_URL
        )
    }
}

/// Parameters and where they came from.
#[derive(Debug)]
pub struct LoadedParams {
    /// Command line merged with the floppy (floppy wins).
    pub params: Params,
    /// The floppy's device, never to be chosen as the install disk.
    pub floppy_device: Option<PathBuf>,
}

/// Reads the command line and the floppy on top: the one `--floppy` names, else, with
/// `boot_method=vmedia`, the one found by its label ([`floppy::load_params`]: required when the
/// command line names no deploy, looked for briefly when it does).
pub fn load_params(args: &RunArgs) -> anyhow::Result<LoadedParams> {
    let cmdline_path = cmdline_path(args);
    let cmdline = read_cmdline(&cmdline_path)?;
    tracing::info!(source = %cmdline_path.display(), "kernel command line read");
    if let Some(device) = &args.floppy {
        let cmd = Params::parse_cmdline(&cmdline);
        let floppy = floppy::read_params(device)
            .with_context(|| format!("reading the floppy on {}", device.display()))?;
        tracing::info!(device = %device.display(), keys = floppy.len(), "floppy parameters read");
        return Ok(LoadedParams {
            params: cmd.merged_with(&floppy),
            floppy_device: Some(device.clone()),
        });
    }
    let search = FloppySearch {
        label: args.floppy_label.clone(),
        // A scan now, then one a second until `floppy_wait_secs` have passed.
        attempts: u32::try_from(args.floppy_wait_secs.saturating_add(1)).unwrap_or(u32::MAX),
        interval: Duration::from_secs(1),
        ..Default::default()
    };
    let (params, floppy_device) = floppy::load_params(&cmdline, &search)?;
    tracing::info!(keys = params.len(), floppy = ?floppy_device, "deploy parameters read");
    Ok(LoadedParams {
        params,
        floppy_device,
    })
}

/// `--cmdline-file`, else `/proc/cmdline`.
fn cmdline_path(args: &RunArgs) -> PathBuf {
    args.cmdline_file
        .clone()
        .unwrap_or_else(|| PathBuf::from("/proc/cmdline"))
}

/// The command line is small; anything over 64 KiB is not a command line.
fn read_cmdline(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() > 64 * 1024 {
        bail!(
            "{} is {} bytes: not a kernel command line",
            path.display(),
            bytes.len()
        );
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The whole `/init` flow. Never returns: the agent ends by finishing (exit 0, or reboot as
/// PID 1) or by failing (exit 1, or as PID 1 a wait for the conductor and then power off). A
/// panic is caught and treated as a failure, so PID 1 never exits (the kernel would panic).
pub fn run(args: RunArgs) -> ! {
    let pid1 = args.pid1 || init::is_pid1();
    let fail_timeout = Duration::from_secs(args.fail_timeout_secs);

    // 1. PID 1 duties. Without them the floppy and the disks may be invisible; go on and let the
    //    next step say what is missing.
    if pid1 {
        tracing::info!("PID 1: mounting, loading modules, reaping");
        if let Err(err) = init::setup_pid1() {
            tracing::error!("PID 1 setup failed, going on: {err:#}");
        }
    }
    init::run_as_init(fail_timeout, || {
        let outcome = deploy(&args, pid1);
        match &outcome {
            Ok(action) => tracing::info!(?action, "deploy finished"),
            // On the console in plain words (the log line escapes quotes).
            Err(err) => eprintln!("vmdeploy-agent: deploy failed: {err:#}"),
        }
        outcome
    })
}

/// Steps 2–5 of [`run`]: drivers, parameters, network, the deploy.
fn deploy(args: &RunArgs, pid1: bool) -> anyhow::Result<FinalAction> {
    // 2. Drivers for the devices present, from the CD's driver pack (or the network-boot
    //    ramdisk's), before the parameters: the legacy floppy drive's driver is one of them.
    //    Only the agent's own boot has a kernel to load them into. Whether the node booted
    //    from virtual media is on the kernel command line.
    if pid1 {
        let vmedia = read_cmdline(&cmdline_path(args))
            .map(|text| {
                Params::parse_cmdline(&text)
                    .get(vmdeploy_shared::params::keys::BOOT_METHOD)
                    .is_some_and(|m| m == "vmedia")
            })
            .unwrap_or(false);
        crate::drivers::load_at_boot(vmedia);
    }

    // 3. Parameters. Nobody to report to yet: the console is all there is.
    let loaded =
        load_params(args).context("cannot read the deploy parameters; nobody to report to")?;
    let debug = loaded.params.get(vmdeploy_shared::params::keys::IPA_DEBUG);
    let asked =
        debug.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"));
    if asked && crate::logging::enable_debug() {
        tracing::debug!("debug logging on (ipa-debug)");
    }
    let mode = match Mode::from_params(&loaded.params) {
        Ok(m) => m,
        Err(err) => {
            // An iSCSI deploy whose conductor is known still hears about it.
            if let Some(to) = report::Reporter::from_raw(&loaded.params, args) {
                to.report_error_blocking(&format!("{err:#}"));
            }
            return Err(err);
        }
    };

    // 4. Network, 5. the deploy.
    match mode {
        Mode::Iscsi(params) => run_iscsi(*params, args, loaded.floppy_device, pid1),
        Mode::Agent(params) => {
            let auto_tls = crate::api::agent_mode::auto_tls_from(
                loaded
                    .params
                    .get(vmdeploy_shared::params::keys::IPA_ENABLE_AUTO_TLS),
            )?;
            run_agent(*params, args, auto_tls)
        }
    }
}

/// The address to advertise: `ipa-advertise-host` when the floppy names one (the network is
/// still brought up), else `--address`, else the one the network bring-up got.
fn network(
    args: &RunArgs,
    common: &vmdeploy_shared::params::CommonParams,
) -> anyhow::Result<IpAddr> {
    let got = bring_up(args, common)?;
    match common.advertise_host {
        Some(advertised) if advertised != got => {
            tracing::info!(%got, %advertised, "advertising another address (ipa-advertise-host)");
            Ok(advertised)
        }
        _ => Ok(got),
    }
}

/// `--address`, else the address the network bring-up got.
fn bring_up(
    args: &RunArgs,
    common: &vmdeploy_shared::params::CommonParams,
) -> anyhow::Result<IpAddr> {
    if let Some(addr) = args.address {
        tracing::info!(%addr, "--address given: network bring-up skipped");
        return Ok(addr);
    }
    let cfg = crate::net::NetConfig {
        bootif: common.bootif,
        static_network: common.static_network.clone(),
        timeout: Duration::from_secs(args.net_timeout_secs),
    };
    tracing::info!(bootif = ?cfg.bootif, static_network = cfg.static_network.is_some(), "bringing up the network");
    let info = crate::net::bring_up(&cfg)
        .map_err(crate::drivers::with_undriven_note)
        .context("bringing up the network")?;
    tracing::info!(interface = %info.interface, address = %info.address, "network up");
    Ok(info.address)
}

fn run_iscsi(
    params: IscsiDeployParams,
    args: &RunArgs,
    floppy_device: Option<PathBuf>,
    pid1: bool,
) -> anyhow::Result<FinalAction> {
    tracing::info!(node = %params.deployment_id, conductor = %params.ironic_api_url, "iSCSI deploy");
    let token = floppy_device.as_deref().and_then(report::read_auth_token);
    let reporter = report::Reporter::new(&params, args)?.with_auth_token(token);
    let address = match network(args, &params.common) {
        Ok(a) => a,
        Err(err) => {
            reporter.report_error_blocking(&format!("{err:#}"));
            return Err(err);
        }
    };
    let cfg = iscsi::IscsiConfig {
        params,
        advertise: address,
        iscsi_listen: args.iscsi_listen,
        done_listen: args.done_listen,
        done_timeout: Duration::from_secs(args.done_timeout_secs),
        floppy_device,
        sys_class_block: PathBuf::from("/sys/class/block"),
        dev_dir: PathBuf::from("/dev"),
        allow_free_choice: pid1,
    };
    let action = iscsi::run(cfg, &reporter)?;
    if pid1 {
        // The conductor reboots or powers off the node now (docs/architecture.md §4); if it does not within
        // the grace period, do what the DIB ramdisk does (docs/ironic-protocols.md §2.2 step 9).
        let wait = Duration::from_secs(args.fail_timeout_secs);
        tracing::info!(
            wait_secs = wait.as_secs(),
            "waiting for the conductor to power the node off or reboot it"
        );
        std::thread::sleep(wait);
    }
    Ok(action)
}

fn run_agent(params: AgentParams, args: &RunArgs, auto_tls: bool) -> anyhow::Result<FinalAction> {
    tracing::info!(conductor = %params.api_url, "agent deploy");
    let advertise = network(args, &params.common)?;
    let mac_addresses = if args.macs.is_empty() {
        crate::net::mac_addresses().context("listing the NICs' MAC addresses")?
    } else {
        args.macs.clone()
    };
    crate::api::agent_mode::run(crate::api::agent_mode::AgentModeConfig {
        params,
        advertise,
        listen: args.agent_listen,
        mac_addresses,
        auto_tls,
    })
}

#[cfg(test)]
mod tests;
