//! Network bring-up: link up on the `BOOTIF` NIC (or the first with link), DHCP or static.
//!
//! SKELETON (session 2): the signatures are fixed; the bodies are being built.

use std::net::IpAddr;
use std::time::Duration;

use vmdeploy_shared::params::{MacAddr, StaticNetwork};

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

/// Brings the NIC up and configures it.
pub fn bring_up(cfg: &NetConfig) -> anyhow::Result<NetInfo> {
    let _ = cfg;
    anyhow::bail!("network bring-up is not built yet")
}

/// The MAC addresses of every Ethernet NIC (for the IPA lookup), from sysfs.
pub fn mac_addresses() -> anyhow::Result<Vec<MacAddr>> {
    anyhow::bail!("NIC listing is not built yet")
}
