//! Network extras of both deploy protocols: the NIC to bring up (`BOOTIF`) and a static
//! configuration for DHCP-less deploys.

use std::fmt;
use std::net::IpAddr;

use super::{cut, keys, Params, ParamsError};

/// A MAC address, as in `BOOTIF`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// Parses `aa:bb:cc:dd:ee:ff`, `aa-bb-…`, and pxelinux's `01-aa-bb-…` (hardware type 1 prefix).
    pub fn parse(value: &str) -> Result<Self, ParamsError> {
        let invalid = || ParamsError::Invalid {
            key: keys::BOOTIF,
            reason: format!("expected a MAC address, found {:?}", cut(value)),
        };
        let parts: Vec<&str> = value.split([':', '-']).collect();
        let parts = match parts.len() {
            6 => &parts[..],
            7 if parts[0] == "01" => &parts[1..],
            _ => return Err(invalid()),
        };
        let mut mac = [0u8; 6];
        for (byte, part) in mac.iter_mut().zip(parts) {
            if part.len() != 2 {
                return Err(invalid());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| invalid())?;
        }
        Ok(MacAddr(mac))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Static network configuration for DHCP-less deploys (vmdeploy keys `vmdeploy-ip`,
/// `vmdeploy-gateway`, `vmdeploy-dns`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticNetwork {
    /// Address of the interface.
    pub address: IpAddr,
    /// Prefix length.
    pub prefix_len: u8,
    /// Default gateway.
    pub gateway: Option<IpAddr>,
    /// DNS servers.
    pub dns: Vec<IpAddr>,
}

fn parse_ip(key: &'static str, value: &str) -> Result<IpAddr, ParamsError> {
    value.parse().map_err(|_| ParamsError::Invalid {
        key,
        reason: format!("expected an IP address, found {:?}", cut(value)),
    })
}

impl StaticNetwork {
    pub(super) fn from_params(params: &Params) -> Result<Option<Self>, ParamsError> {
        let Some(ip) = params.get(keys::STATIC_IP) else {
            return Ok(None);
        };
        let (addr, prefix) = ip.split_once('/').ok_or_else(|| ParamsError::Invalid {
            key: keys::STATIC_IP,
            reason: format!("expected ADDR/PREFIX, found {:?}", cut(ip)),
        })?;
        let address = parse_ip(keys::STATIC_IP, addr)?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        let prefix_len = prefix
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| ParamsError::Invalid {
                key: keys::STATIC_IP,
                reason: format!("prefix length must be 0..={max}, found {:?}", cut(prefix)),
            })?;
        let gateway = params
            .get(keys::STATIC_GATEWAY)
            .map(|g| parse_ip(keys::STATIC_GATEWAY, g))
            .transpose()?;
        let dns = params
            .get(keys::STATIC_DNS)
            .map(|list| {
                list.split(',')
                    .filter(|s| !s.is_empty())
                    .map(|d| parse_ip(keys::STATIC_DNS, d))
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?
            .unwrap_or_default();
        Ok(Some(StaticNetwork {
            address,
            prefix_len,
            gateway,
            dns,
        }))
    }
}
