//! Finding the NIC: Ethernet interfaces from sysfs, the `BOOTIF` one or the first whose carrier
//! comes up.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use vmdeploy_shared::params::MacAddr;

use super::config;

/// Where the kernel lists network interfaces.
pub const SYS_CLASS_NET: &str = "/sys/class/net";

/// How often carrier is polled while waiting for link.
const CARRIER_POLL: Duration = Duration::from_millis(100);

/// `ARPHRD_ETHER` (linux/if_arp.h): the `type` sysfs attribute of an Ethernet NIC.
const ARPHRD_ETHER: u32 = 1;

/// An Ethernet interface as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    /// Interface name.
    pub name: String,
    /// MAC address.
    pub mac: MacAddr,
    /// Kernel interface index.
    pub ifindex: i32,
    /// Under /sys/devices/virtual (veth, bridges, …) rather than a bus device.
    pub virtual_device: bool,
    /// A bridge (has a `bridge/` directory).
    pub bridge: bool,
}

fn read_attr(dir: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(name))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Every Ethernet interface under `sys_class_net`, sorted by name; physical NICs first, then
/// virtual ones, bridges last (they are used only when nothing else exists).
pub fn list_nics(sys_class_net: &Path) -> anyhow::Result<Vec<Nic>> {
    let entries = std::fs::read_dir(sys_class_net)
        .with_context(|| format!("listing {}", sys_class_net.display()))?;
    let mut nics = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", sys_class_net.display()))?;
        let dir: PathBuf = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "lo"
            || read_attr(&dir, "type").and_then(|t| t.parse().ok()) != Some(ARPHRD_ETHER)
        {
            continue;
        }
        let Some(mac) = read_attr(&dir, "address").and_then(|a| MacAddr::parse(&a).ok()) else {
            continue;
        };
        let ifindex = read_attr(&dir, "ifindex")
            .and_then(|i| i.parse().ok())
            .unwrap_or(0);
        let virtual_device = std::fs::read_link(&dir)
            .map(|target| target.to_string_lossy().contains("/devices/virtual/"))
            .unwrap_or(false);
        let bridge = dir.join("bridge").is_dir();
        nics.push(Nic {
            name,
            mac,
            ifindex,
            virtual_device,
            bridge,
        });
    }
    nics.sort_by(|a, b| {
        (a.bridge, a.virtual_device, &a.name).cmp(&(b.bridge, b.virtual_device, &b.name))
    });
    Ok(nics)
}

/// True when `name` reports carrier (`carrier` reads EINVAL while the link is down).
pub fn has_carrier(sys_class_net: &Path, name: &str) -> bool {
    read_attr(&sys_class_net.join(name), "carrier").as_deref() == Some("1")
}

/// Chooses the NIC and brings its link up: the one with MAC `bootif`, else the first (in
/// [`list_nics`] order) whose carrier comes up before `deadline`. NICs tried and not chosen are
/// set down again.
pub fn choose_and_bring_up(
    sys_class_net: &Path,
    bootif: Option<MacAddr>,
    deadline: Instant,
) -> anyhow::Result<Nic> {
    let nics = list_nics(sys_class_net)?;
    anyhow::ensure!(
        !nics.is_empty(),
        "no Ethernet interface in {} (is the NIC driver loaded?)",
        sys_class_net.display()
    );
    let candidates: Vec<Nic> = match bootif {
        Some(mac) => {
            let nic = nics.iter().find(|n| n.mac == mac).cloned().ok_or_else(|| {
                let seen: Vec<String> = nics
                    .iter()
                    .map(|n| format!("{} {}", n.name, n.mac))
                    .collect();
                anyhow::anyhow!(
                    "no interface has the BOOTIF MAC {mac} (interfaces: {})",
                    seen.join(", ")
                )
            })?;
            vec![nic]
        }
        None => nics,
    };
    for nic in &candidates {
        config::set_link_up(&nic.name, true).with_context(|| format!("setting {} up", nic.name))?;
    }
    loop {
        if let Some(nic) = candidates
            .iter()
            .find(|n| has_carrier(sys_class_net, &n.name))
        {
            for other in candidates.iter().filter(|n| n.name != nic.name) {
                if let Err(e) = config::set_link_up(&other.name, false) {
                    tracing::debug!(nic = %other.name, error = %e, "setting an unused NIC down");
                }
            }
            tracing::info!(nic = %nic.name, mac = %nic.mac, "link up");
            return Ok(nic.clone());
        }
        if Instant::now() >= deadline {
            let names: Vec<&str> = candidates.iter().map(|n| n.name.as_str()).collect();
            anyhow::bail!("no carrier on {} before the timeout", names.join(", "));
        }
        std::thread::sleep(CARRIER_POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_nic(root: &Path, name: &str, kind: &str, mac: &str, index: u32) {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("type"), format!("{kind}\n")).expect("write");
        std::fs::write(dir.join("address"), format!("{mac}\n")).expect("write");
        std::fs::write(dir.join("ifindex"), format!("{index}\n")).expect("write");
    }

    #[test]
    fn lists_ethernet_nics_and_skips_others() {
        let root = tempfile::tempdir().expect("tempdir");
        fake_nic(root.path(), "lo", "772", "00:00:00:00:00:00", 1);
        fake_nic(root.path(), "eth1", "1", "52:54:00:00:00:02", 3);
        fake_nic(root.path(), "eth0", "1", "52:54:00:00:00:01", 2);
        fake_nic(root.path(), "ib0", "32", "80:00:00:00:00:01", 4);
        fake_nic(root.path(), "br0", "1", "52:54:00:00:00:09", 5);
        std::fs::create_dir(root.path().join("br0/bridge")).expect("mkdir");
        fake_nic(root.path(), "bad", "1", "not-a-mac", 6);
        let nics = list_nics(root.path()).expect("list");
        let names: Vec<&str> = nics.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["eth0", "eth1", "br0"]);
        assert_eq!(nics[0].ifindex, 2);
        assert!(nics[2].bridge);
    }

    #[test]
    fn unknown_bootif_is_a_clear_error() {
        let root = tempfile::tempdir().expect("tempdir");
        fake_nic(root.path(), "eth0", "1", "52:54:00:00:00:01", 2);
        let mac = MacAddr::parse("52:54:00:ff:ff:ff").expect("mac");
        let err =
            choose_and_bring_up(root.path(), Some(mac), Instant::now()).expect_err("no such NIC");
        let msg = format!("{err:#}");
        assert!(
            msg.contains("no interface has the BOOTIF MAC 52:54:00:ff:ff:ff"),
            "{msg}"
        );
        assert!(msg.contains("eth0 52:54:00:00:00:01"), "{msg}");
    }
}
