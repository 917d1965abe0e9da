//! The devices the kernel sees, from sysfs: every device's modalias (what the driver pack's
//! aliases are matched against) and the PCI functions with their class and bound driver (what
//! tells an undriven NIC or disk controller apart).
//!
//! ```text
//! /sys/bus/<bus>/devices/<dev>/modalias   pci:v00008086d000010C9sv...  virtio:d00000001v00001AF4
//! /sys/bus/pci/devices/<addr>/vendor      0x8086
//! /sys/bus/pci/devices/<addr>/device      0x10c9
//! /sys/bus/pci/devices/<addr>/class       0x020000   (base class, subclass, interface)
//! /sys/bus/pci/devices/<addr>/driver      -> ../../../bus/pci/drivers/igb (when bound)
//! ```
//! sysfs is the kernel's, but a value that does not parse is skipped with the device, never a
//! panic: the agent goes on with the devices it can read.

use std::fmt;
use std::path::{Path, PathBuf};

/// Longest modalias read (the kernel's are under 300 bytes; USB interfaces the longest).
const MAX_MODALIAS: usize = 4096;

/// A device and its modalias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Its sysfs directory.
    pub path: PathBuf,
    /// Its modalias.
    pub modalias: String,
}

/// Every device under `sys_bus` (`/sys/bus`) that shows a modalias, by bus then name.
pub fn with_modalias(sys_bus: &Path) -> Vec<Device> {
    let mut found = Vec::new();
    for bus in sorted_entries(sys_bus) {
        for dev in sorted_entries(&bus.join("devices")) {
            let Ok(text) = std::fs::read_to_string(dev.join("modalias")) else {
                continue;
            };
            let modalias = text.trim();
            if modalias.is_empty() || modalias.len() > MAX_MODALIAS {
                continue;
            }
            found.push(Device {
                path: dev.clone(),
                modalias: modalias.to_owned(),
            });
        }
    }
    found
}

/// A PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciFunction {
    /// Its address (`0000:00:03.0`).
    pub address: String,
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// Class code: base class, subclass, programming interface.
    pub class: u32,
    /// The driver bound to it, if any.
    pub driver: Option<String>,
}

impl PciFunction {
    /// "network controller" or "storage controller" for the classes a deploy needs, `None`
    /// for any other.
    pub fn deploy_kind(&self) -> Option<&'static str> {
        match self.class >> 16 {
            0x01 => Some("storage controller"),
            0x02 => Some("network controller"),
            _ => None,
        }
    }
}

impl fmt::Display for PciFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PCI {} [{:04x}:{:04x}] {}",
            self.address,
            self.vendor,
            self.device,
            self.deploy_kind().unwrap_or("device")
        )
    }
}

/// Every PCI function under `sys_bus`/pci, by address.
pub fn pci_functions(sys_bus: &Path) -> Vec<PciFunction> {
    sorted_entries(&sys_bus.join("pci").join("devices"))
        .into_iter()
        .filter_map(|dir| {
            let hex = |name: &str| -> Option<u32> {
                let text = std::fs::read_to_string(dir.join(name)).ok()?;
                u32::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
            };
            Some(PciFunction {
                address: dir.file_name()?.to_string_lossy().into_owned(),
                vendor: u16::try_from(hex("vendor")?).ok()?,
                device: u16::try_from(hex("device")?).ok()?,
                class: hex("class")?,
                driver: std::fs::read_link(dir.join("driver"))
                    .ok()
                    .and_then(|target| Some(target.file_name()?.to_string_lossy().into_owned())),
            })
        })
        .collect()
}

/// The NICs and disk controllers no driver is bound to.
pub fn undriven(sys_bus: &Path) -> Vec<PciFunction> {
    pci_functions(sys_bus)
        .into_iter()
        .filter(|f| f.deploy_kind().is_some() && f.driver.is_none())
        .collect()
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut entries: Vec<PathBuf> = read.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::drivers::tests::{bind, pci};

    /// A fake /sys/bus with one function of each interesting kind.
    fn fake_sys(root: &Path) {
        pci(root, "0000:00:02.0", 0x8086, 0x10c9, 0x020000);
        pci(root, "0000:00:03.0", 0x1000, 0x0060, 0x010400);
        bind(root, "0000:00:03.0", "megaraid_sas");
        pci(root, "0000:00:04.0", 0x1234, 0x1111, 0x030000);
        // A function whose vendor file does not parse: skipped with its device.
        pci(root, "0000:00:05.0", 0x1234, 0x1111, 0x020000);
        std::fs::write(root.join("pci/devices/0000:00:05.0/vendor"), "0xzz\n").expect("vendor");
        let virtio = root.join("virtio/devices/virtio0");
        std::fs::create_dir_all(&virtio).expect("mkdir");
        std::fs::write(virtio.join("modalias"), "virtio:d00000001v00001AF4\n").expect("modalias");
    }

    #[test]
    fn reads_modaliases_of_every_bus() {
        let dir = tempfile::tempdir().expect("tempdir");
        fake_sys(dir.path());
        let got: Vec<String> = with_modalias(dir.path())
            .into_iter()
            .map(|d| d.modalias)
            .collect();
        assert_eq!(got.len(), 5, "{got:?}");
        assert!(got.contains(&"virtio:d00000001v00001AF4".to_owned()));
        assert!(got.iter().any(|m| m.starts_with("pci:v00008086d000010C9")));
    }

    #[test]
    fn an_unbound_nic_is_undriven_and_a_bound_controller_or_a_vga_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        fake_sys(dir.path());
        let all = pci_functions(dir.path());
        assert_eq!(
            all.len(),
            3,
            "the function with a bad vendor is skipped: {all:?}"
        );
        assert_eq!(all[1].driver.as_deref(), Some("megaraid_sas"));
        let undriven = undriven(dir.path());
        assert_eq!(undriven.len(), 1, "{undriven:?}");
        assert_eq!(
            undriven[0].to_string(),
            "PCI 0000:00:02.0 [8086:10c9] network controller"
        );
    }

    #[test]
    fn a_missing_sysfs_is_no_devices() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(with_modalias(&dir.path().join("none")).is_empty());
        assert!(pci_functions(&dir.path().join("none")).is_empty());
    }
}
