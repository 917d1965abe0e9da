//! Network bring-up: link up on the `BOOTIF` NIC (or the first with link), DHCP or static.
//!
//! # Design
//! [`link`] finds the NIC in sysfs and sets it up; [`dhcp`] gets a lease over a packet socket
//! (codec in [`dhcp::message`] and [`dhcp::packet`], pure and property-tested); [`config`] applies
//! the address, mask and default route with the classic socket ioctls. Static configuration comes
//! from the floppy keys `vmdeploy-ip=ADDR/PREFIX`, `vmdeploy-gateway=IP`, `vmdeploy-dns=IP[,IP]`
//! (shared::params::StaticNetwork) and skips DHCP.
//! `/etc/resolv.conf` is written only as PID 1 ([`bring_up`]); tests pass their own path to
//! [`bring_up_with`] so the host's file is never touched.
//!
//! # Limitations
//! IPv4 only (a static IPv6 address is refused with a clear error); no lease renewal; one NIC.

pub mod cli;
pub mod config;
pub mod dhcp;
pub mod link;

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use vmdeploy_shared::params::{MacAddr, StaticNetwork};

/// Where PID 1 writes the DNS servers.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// What to bring up.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// The NIC to use (`BOOTIF`); the first NIC with link when `None`.
    pub bootif: Option<MacAddr>,
    /// Static configuration from the floppy; DHCP when `None`.
    pub static_network: Option<StaticNetwork>,
    /// How long to wait for link and a lease in total.
    pub timeout: Duration,
}

/// The configured interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetInfo {
    /// Interface name, e.g. `eth0`.
    pub interface: String,
    /// Its MAC address.
    pub mac: MacAddr,
    /// The address it got.
    pub address: IpAddr,
    /// Prefix length of that address.
    pub prefix_len: u8,
    /// Default gateway, if any.
    pub gateway: Option<IpAddr>,
    /// DNS servers (also written to /etc/resolv.conf as PID 1).
    pub dns: Vec<IpAddr>,
}

/// [`NetInfo`] as JSON (`net-up --json`), plus how it was obtained.
#[derive(Debug, Serialize)]
pub struct NetInfoJson {
    /// Interface name.
    pub interface: String,
    /// MAC, `aa:bb:…`.
    pub mac: String,
    /// Address.
    pub address: IpAddr,
    /// Prefix length.
    pub prefix_len: u8,
    /// Gateway.
    pub gateway: Option<IpAddr>,
    /// DNS servers.
    pub dns: Vec<IpAddr>,
}

impl From<&NetInfo> for NetInfoJson {
    fn from(info: &NetInfo) -> Self {
        Self {
            interface: info.interface.clone(),
            mac: info.mac.to_string(),
            address: info.address,
            prefix_len: info.prefix_len,
            gateway: info.gateway,
            dns: info.dns.clone(),
        }
    }
}

/// Brings the NIC up and configures it (writes /etc/resolv.conf only as PID 1).
pub fn bring_up(cfg: &NetConfig) -> anyhow::Result<NetInfo> {
    let resolv = crate::init::is_pid1().then_some(Path::new(RESOLV_CONF));
    bring_up_with(cfg, resolv)
}

/// [`bring_up`], writing the DNS servers to `resolv_conf` when given.
pub fn bring_up_with(cfg: &NetConfig, resolv_conf: Option<&Path>) -> anyhow::Result<NetInfo> {
    let deadline = Instant::now() + cfg.timeout;
    let sys = Path::new(link::SYS_CLASS_NET);
    if let Some(static_net) = &cfg.static_network {
        anyhow::ensure!(
            static_net.address.is_ipv4(),
            "static IPv6 configuration ({}) is not supported yet; use an IPv4 vmdeploy-ip",
            static_net.address
        );
        if let Some(gw) = static_net.gateway {
            anyhow::ensure!(
                gw.is_ipv4(),
                "static IPv6 gateway ({gw}) is not supported yet"
            );
        }
    }
    // lo carries 127.0.0.1 once up; as PID 1 nobody else sets it up.
    if let Err(e) = config::set_link_up("lo", true) {
        tracing::warn!(error = %e, "setting lo up");
    }
    let nic = link::choose_and_bring_up(sys, cfg.bootif, deadline)
        .context("bringing up the network link")?;
    let (address, prefix_len, gateway, dns) = match &cfg.static_network {
        Some(s) => {
            let IpAddr::V4(address) = s.address else {
                unreachable!("checked above: the static address is IPv4")
            };
            let gateway = s.gateway.and_then(|g| match g {
                IpAddr::V4(g) => Some(g),
                IpAddr::V6(_) => None,
            });
            tracing::info!(nic = %nic.name, %address, prefix_len = s.prefix_len, "static configuration");
            (address, s.prefix_len, gateway, s.dns.clone())
        }
        None => {
            let lease = dhcp::obtain_lease(nic.ifindex, nic.mac.0, deadline)
                .with_context(|| format!("getting a DHCP lease on {}", nic.name))?;
            tracing::info!(
                nic = %nic.name,
                address = %lease.address,
                prefix_len = lease.prefix_len,
                gateway = ?lease.gateway,
                dns = ?lease.dns,
                lease_secs = ?lease.lease_secs,
                server = %lease.server,
                "DHCP lease"
            );
            let dns = lease.dns.iter().copied().map(IpAddr::V4).collect();
            (lease.address, lease.prefix_len, lease.gateway, dns)
        }
    };
    apply(&nic.name, address, prefix_len, gateway)?;
    if let Some(path) = resolv_conf {
        write_resolv_conf(path, &dns)?;
    }
    Ok(NetInfo {
        interface: nic.name,
        mac: nic.mac,
        address: IpAddr::V4(address),
        prefix_len,
        gateway: gateway.map(IpAddr::V4),
        dns,
    })
}

fn apply(
    name: &str,
    address: Ipv4Addr,
    prefix_len: u8,
    gateway: Option<Ipv4Addr>,
) -> anyhow::Result<()> {
    config::set_ipv4_address(name, address, prefix_len)
        .with_context(|| format!("setting {address}/{prefix_len} on {name}"))?;
    if let Some(gw) = gateway {
        config::add_default_route(name, gw)
            .with_context(|| format!("adding the default route via {gw} on {name}"))?;
    }
    Ok(())
}

/// Writes `nameserver` lines (resolv.conf(5)).
pub fn write_resolv_conf(path: &Path, dns: &[IpAddr]) -> anyhow::Result<()> {
    let text: String = dns.iter().map(|ip| format!("nameserver {ip}\n")).collect();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The MAC addresses of every Ethernet NIC (for the IPA lookup), from sysfs.
pub fn mac_addresses() -> anyhow::Result<Vec<MacAddr>> {
    Ok(link::list_nics(Path::new(link::SYS_CLASS_NET))?
        .into_iter()
        .map(|nic| nic.mac)
        .collect())
}
