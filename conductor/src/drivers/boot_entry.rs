//! The persistent boot order's entries ([`BootEntry`]) and the device a UEFI entry stands for,
//! read from its description as the iLO tools read it ([`classify_boot_entry`]).

use std::fmt;

use serde::Serialize;

use super::BootDevice;

/// One entry of the persistent boot order: the device it stands for, and what the BMC called it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BootEntry {
    /// The device, classified from the description in UEFI mode ([`classify_boot_entry`]).
    pub device: BootDevice,
    /// The BMC's own name for the entry (`Boot0007`, `HDD`, a Redfish target), if it gave one.
    pub id: Option<String>,
    /// The firmware's description of a UEFI entry, whitespace collapsed.
    pub description: Option<String>,
}

impl BootEntry {
    /// A legacy-mode entry: the BMC names the device itself.
    pub fn device(device: BootDevice) -> Self {
        Self {
            device,
            id: None,
            description: None,
        }
    }

    /// A UEFI entry `id` with its description, classified.
    pub fn uefi(id: impl Into<String>, description: &str) -> Self {
        let description = collapse_whitespace(description);
        Self {
            device: classify_boot_entry(&description),
            id: Some(id.into()),
            description: Some(description),
        }
    }
}

impl fmt::Display for BootEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.device)?;
        match (&self.id, &self.description) {
            (Some(id), Some(d)) => write!(f, "\t{id} ({d})"),
            (Some(id), None) if *id != self.device.to_string() => write!(f, "\t{id}"),
            _ => Ok(()),
        }
    }
}

/// Real iLOs wrap long descriptions over several lines inside the attribute (proliantutils
/// `tests/ilo/ribcl_sample_outputs.py`); one space between words reads the same everywhere.
fn collapse_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The boot device a UEFI boot entry stands for, from its description, as proliantutils reads a
/// UEFI persistent boot order (`proliantutils/ilo/ribcl.py` `get_persistent_boot_device`,
/// `_get_nic_boot_devices`, `_get_disk_boot_devices`; `proliantutils/ilo/common.py` `isDisk`):
/// the iLO virtual CD is `cdrom`; an entry naming a NIC, PXE or iSCSI is `network`; a logical
/// drive, HDD, storage or LogVol is a disk. On top of those it reads what HPE firmware writes
/// for other disks and controllers (RAID, Smart Array, NVMe, SATA, SAS, "Embedded ...
/// Controller") as a disk, the iLO virtual USB key (the virtual floppy of iLO virtual media) as
/// `floppy`, and other USB entries as `usb`. Anything else stays [`BootDevice::Other`] with the
/// description.
pub fn classify_boot_entry(description: &str) -> BootDevice {
    let text = collapse_whitespace(description);
    let lower = text.to_ascii_lowercase();
    let has = |needle: &str| lower.contains(needle);
    // The order is proliantutils': CD first, then network, then disks. The network words are
    // matched case-sensitively as proliantutils does, so that e.g. "Technician" is no NIC.
    // Redfish may give a UEFI device path instead of a description (`UefiTargetBootSourceOverride`,
    // UEFI spec §10.3 node names such as `CDROM(`, `MAC(`, `Scsi(`): those nodes count too.
    if has("virtual usb cd")
        || has("virtual cd")
        || has("cd/dvd")
        || has("dvd-rom")
        || has("cdrom(")
    {
        BootDevice::Cdrom
    } else if ["NIC", "PXE", "iSCSI"].iter().any(|w| text.contains(w))
        || ["network", "mac(", "ipv4(", "ipv6(", "uri("]
            .iter()
            .any(|k| has(k))
    {
        BootDevice::Network
    } else if has("virtual usb key") || has("floppy") {
        BootDevice::Floppy
    } else if [
        "logical drive",
        "logvol",
        "hdd",
        "hard drive",
        "storage",
        "raid",
        "smart array",
        "nvme",
        "sata",
        "sas ",
        "sas:",
        "disk",
        "scsi(",
        "hd(",
    ]
    .iter()
    .any(|k| has(k))
        || (has("embedded") && has("controller"))
    {
        BootDevice::Hdd
    } else if has("usb") {
        BootDevice::Usb
    } else {
        BootDevice::Other(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// UEFI boot entry descriptions of real iLO 4 answers, written here as data. Sources:
    /// proliantutils `proliantutils/tests/ilo/ribcl_sample_outputs.py`
    /// (GET_PERSISTENT_BOOT_DEVICE_*_UEFI_XML, GET_NIC_DATA; the line breaks inside the
    /// attribute are a real iLO's), and the issue's own RAID example.
    const REAL_UEFI_ENTRIES: &[(&str, &str)] = &[
        (
            "Embedded SAS : Smart Array P830i Controller - 279.367 GB,\n             RAID 1 Logical Drive(Target:0, Lun:0)",
            "hdd",
        ),
        (
            "Embedded SAS : Smart Array P830i Controller - 279.367 GB,\n             RAID 1 Logical Drive( Target:0, Lun:0)",
            "hdd",
        ),
        (
            "Embedded RAID 1 : Smart Array P440ar Controller - 279.37 GiB, RAID 0 Logical Drive(Target:0, Lun:0)",
            "hdd",
        ),
        (
            "Slot 1 : Smart Array P840 Controller - 279.37 GiB,                        RAID 0 Logical Drive(Target:0, Lun:0)",
            "hdd",
        ),
        (
            "Slot1:SmartArrayP840Controller-279.37GiB, RAID0                         LogicalDrive(Target: 0, Lun: 1)",
            "hdd",
        ),
        ("iLO Virtual USB 2 : HP iLO Virtual USB CD/DVD ROM", "cdrom"),
        ("iLO Virtual USB 1 : HP iLO Virtual USB Key", "floppy"),
        (
            "Embedded FlexibleLOM 1 Port 1 :HP Ethernet 1Gb\n            4-port 331FLR Adapter - NIC (IPv4) ",
            "network",
        ),
        (
            "Embedded FlexibleLOM 1 Port 1 : HP Ethernet 1Gb\n             4-port 331FLR Adapter - NIC (IPv6) ",
            "network",
        ),
        (
            "EmbeddedLOM1 Port1: HPEthernet1Gb4-port331iAdapter-                        NIC(iSCSIIPv4)",
            "network",
        ),
        (
            "EmbeddedLOM1Port2: HPEthernet1Gb4-port331iAdapter-                        NIC(PXEIPv4)",
            "network",
        ),
        ("GenericUSBBoot", "usb"),
    ];

    /// iLO 5 (Redfish) names of boot sources and UEFI targets, as data. Source: proliantutils
    /// `proliantutils/tests/redfish/json_samples/bios_boot.json` (BootSources: BootString,
    /// UEFIDevicePath) and `system.json` (UefiTargetBootSourceOverride allowable values).
    const REAL_ILO5_BOOT_SOURCES: &[(&str, &str)] = &[
        (
            "Embedded Storage : HPE Smart Array S100i SR Gen10 - LogVol (Lun:1 VolId:1) 931.48 GiB, RAID 0",
            "hdd",
        ),
        ("PciRoot(0x0)/Pci(0x1C,0x4)/Pci(0x0,0x7)/Scsi(0x0,0x1)", "hdd"),
        ("Generic USB Boot", "usb"),
        ("UsbClass(0xFFFF,0xFFFF,0xFF,0xFF,0xFF)", "usb"),
        (
            "Embedded LOM 1 Port 1 : HPE Ethernet 1Gb 4-port 331i Adapter - NIC (PXE IPv4)",
            "network",
        ),
        (
            "PciRoot(0x0)/Pci(0x1C,0x0)/Pci(0x0,0x0)/MAC(30E17155B124,0x0)/IPv4(0.0.0.0)",
            "network",
        ),
        (
            "HD(1,GPT,7F14DF43-6600-420A-9950-C028836F6A5D,0x800,0x64000)/\\EFI\\centos\\shim.efi",
            "hdd",
        ),
        ("PciRoot(0x0)/Pci(0x17,0x0)/Sata(0x3,0x0,0x0)", "hdd"),
    ];

    #[test]
    fn real_uefi_entries_are_classified_as_the_ilo_tools_do() {
        for (description, want) in REAL_UEFI_ENTRIES.iter().chain(REAL_ILO5_BOOT_SOURCES) {
            assert_eq!(
                classify_boot_entry(description).to_string(),
                *want,
                "{description}"
            );
        }
    }

    #[test]
    fn other_disks_and_unknown_entries() {
        for d in [
            "Embedded SATA Port 1 HDD : Samsung SSD 860",
            "Slot 3 Port 1 : NVMe Drive",
            "Embedded Storage Controller 1",
            "Internal Hard Drive",
        ] {
            assert_eq!(classify_boot_entry(d), BootDevice::Hdd, "{d}");
        }
        assert_eq!(
            classify_boot_entry("Front USB 1 : Kingston DataTraveler"),
            BootDevice::Usb
        );
        assert_eq!(
            classify_boot_entry("  Embedded UEFI   Shell "),
            BootDevice::Other("Embedded UEFI Shell".into())
        );
        assert_eq!(classify_boot_entry(""), BootDevice::Other(String::new()));
        // UEFI device paths, as Redfish's UefiTargetBootSourceOverride gives them.
        let path = |p: &str| classify_boot_entry(p);
        assert_eq!(
            path("PciRoot(0x0)/Pci(0x1C,0x0)/Pci(0x0,0x0)/MAC(A0D3C1F00001,0x0)/IPv4(0.0.0.0)"),
            BootDevice::Network
        );
        assert_eq!(
            path("PciRoot(0x0)/Pci(0x1,0x0)/Pci(0x0,0x0)/Scsi(0x0,0x0)"),
            BootDevice::Hdd
        );
        assert_eq!(
            path("PciRoot(0x0)/Pci(0x1D,0x0)/USB(0x0,0x0)/USB(0x3,0x0)/CDROM(0x1,0x0,0x0)"),
            BootDevice::Cdrom
        );
    }

    #[test]
    fn boot_entries_keep_the_raw_names() {
        let e = BootEntry::uefi(
            "Boot0007",
            "Embedded RAID 1 : Smart Array P440ar Controller - 279.37 GiB,\n   RAID 0 Logical Drive(Target:0, Lun:0)",
        );
        assert_eq!(e.device, BootDevice::Hdd);
        assert_eq!(e.id.as_deref(), Some("Boot0007"));
        assert_eq!(
            e.to_string(),
            "hdd\tBoot0007 (Embedded RAID 1 : Smart Array P440ar Controller - 279.37 GiB, RAID 0 Logical Drive(Target:0, Lun:0))"
        );
        assert_eq!(
            BootEntry::device(BootDevice::Network).to_string(),
            "network"
        );
    }
}
