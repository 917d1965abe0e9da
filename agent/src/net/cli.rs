//! `vmdeploy-agent net-up` (hidden, for debugging and tests/integration/tests/agent_net.rs):
//! brings the network up as the agent would and prints what it configured.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use vmdeploy_shared::params::{MacAddr, StaticNetwork};

use super::{bring_up_with, NetConfig, NetInfoJson};

/// Arguments of `net-up`.
#[derive(Debug, clap::Args)]
pub struct NetUpArgs {
    /// MAC of the NIC to use (`BOOTIF` forms accepted); the first with link otherwise.
    #[arg(long)]
    pub bootif: Option<String>,
    /// Static address `ADDR/PREFIX` (skips DHCP).
    #[arg(long)]
    pub ip: Option<String>,
    /// Static default gateway.
    #[arg(long, requires = "ip")]
    pub gateway: Option<IpAddr>,
    /// Static DNS server (repeatable).
    #[arg(long, requires = "ip")]
    pub dns: Vec<IpAddr>,
    /// Total time for link and lease.
    #[arg(long, default_value_t = 30)]
    pub timeout_secs: u64,
    /// Write the DNS servers here (never /etc/resolv.conf unless asked).
    #[arg(long)]
    pub resolv_conf: Option<PathBuf>,
    /// Print the result as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

fn parse_static(
    ip: &str,
    gateway: Option<IpAddr>,
    dns: Vec<IpAddr>,
) -> anyhow::Result<StaticNetwork> {
    let (addr, prefix) = ip
        .split_once('/')
        .with_context(|| format!("--ip must be ADDR/PREFIX, found {ip:?}"))?;
    let address: IpAddr = addr
        .parse()
        .with_context(|| format!("parsing the address {addr:?}"))?;
    let prefix_len: u8 = prefix
        .parse()
        .ok()
        .filter(|p| *p <= if address.is_ipv4() { 32 } else { 128 })
        .with_context(|| format!("bad prefix length {prefix:?}"))?;
    Ok(StaticNetwork {
        address,
        prefix_len,
        gateway,
        dns,
    })
}

/// Runs `net-up`.
pub fn run(args: NetUpArgs) -> anyhow::Result<()> {
    let bootif = args
        .bootif
        .as_deref()
        .map(MacAddr::parse)
        .transpose()
        .context("parsing --bootif")?;
    let static_network = args
        .ip
        .as_deref()
        .map(|ip| parse_static(ip, args.gateway, args.dns.clone()))
        .transpose()?;
    let cfg = NetConfig {
        bootif,
        static_network,
        timeout: Duration::from_secs(args.timeout_secs),
    };
    let info = bring_up_with(&cfg, args.resolv_conf.as_deref())?;
    if args.json {
        let json = serde_json::to_string(&NetInfoJson::from(&info)).context("serializing")?;
        println!("{json}");
    } else {
        println!(
            "{} {} {}/{} gateway {:?} dns {:?}",
            info.interface, info.mac, info.address, info.prefix_len, info.gateway, info.dns
        );
    }
    Ok(())
}
