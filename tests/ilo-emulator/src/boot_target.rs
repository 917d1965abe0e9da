//! The Redfish boot override targets an iLO 5 lists (`Boot.BootSourceOverrideTarget`) and what
//! each one means to the emulated server: which device it boots, whether it may stay in force
//! across boots, and how the RIBCL side sees it.
//!
//! # Design
//! The list and its order are iLO 5's, docs/ilo-management.md §3.3 "Boot
//! override": None, Cd, Hdd, Usb, SDCard, Utilities, Diags, BiosSetup, Pxe, UefiShell, UefiHttp,
//! UefiTarget. There is no `Floppy`: on iLO 5 the virtual floppy is a USB key.
//!
//! Targets fall in three groups:
//! - boot devices of the emulated machine: `Cd`, `Hdd`, `Usb`, `Pxe`, and `UefiHttp` (a network
//!   boot: the NIC's firmware fetches its boot file over HTTP where `Pxe` uses TFTP; the emulated
//!   NIC boots the same way for both);
//! - firmware applications: `BiosSetup` (RBSU), `Utilities` (System Utilities), `Diags`,
//!   `UefiShell`. They are not entries of the persistent boot order (§3.3 lists the order's
//!   devices under `bios/boot`, and none of these is one), so the emulator takes them as one-time
//!   only: a `Continuous` request for one of them acts as `Once`, is reported back as `Once`, and
//!   the boots after it follow the persistent order unchanged. The reference does not say what
//!   iLO 5 does with `Continuous` + `BiosSetup`; this is the reading the project chose (a server
//!   that re-entered setup at every power-on could never boot anything else, and writing RBSU at
//!   the head of the order made the emulated machine fall through to disk, then CD);
//! - devices the emulated machine does not have: `SDCard` (no SD slot) and `UefiTarget` (the UEFI
//!   device path in `UefiTargetBootSourceOverride`, which names nothing here). They are accepted
//!   and reported back; a boot with them finds nothing there and falls through to the boot order,
//!   as a real server does with an empty device.
//!
//! The emulated machine has no setup, utilities, diagnostics or shell to run: a boot into one is
//! recorded (`last_boot.device` RBSU for BiosSetup, none for the others) and the QEMU backend
//! then runs the firmware's own boot order.

use serde::Serialize;

use crate::state::BootDevice;

/// A `Boot.BootSourceOverrideTarget` value of iLO 5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum BootTarget {
    /// No override.
    None,
    /// The virtual CD/DVD.
    Cd,
    /// The disk (embedded RAID logical drive).
    Hdd,
    /// A USB device.
    Usb,
    /// An SD card (the emulated server has no slot).
    #[serde(rename = "SDCard")]
    SdCard,
    /// HPE System Utilities.
    Utilities,
    /// Embedded diagnostics.
    Diags,
    /// RBSU, the setup utility.
    BiosSetup,
    /// PXE on the embedded NIC.
    Pxe,
    /// The UEFI shell.
    UefiShell,
    /// UEFI HTTP boot on the embedded NIC.
    UefiHttp,
    /// The UEFI device path in `UefiTargetBootSourceOverride`.
    UefiTarget,
}

impl BootTarget {
    /// Every target, in the order iLO 5 lists them
    /// (`BootSourceOverrideTarget@Redfish.AllowableValues`).
    pub const ALL: [BootTarget; 12] = [
        BootTarget::None,
        BootTarget::Cd,
        BootTarget::Hdd,
        BootTarget::Usb,
        BootTarget::SdCard,
        BootTarget::Utilities,
        BootTarget::Diags,
        BootTarget::BiosSetup,
        BootTarget::Pxe,
        BootTarget::UefiShell,
        BootTarget::UefiHttp,
        BootTarget::UefiTarget,
    ];

    /// The Redfish spelling.
    pub fn redfish(self) -> &'static str {
        match self {
            BootTarget::None => "None",
            BootTarget::Cd => "Cd",
            BootTarget::Hdd => "Hdd",
            BootTarget::Usb => "Usb",
            BootTarget::SdCard => "SDCard",
            BootTarget::Utilities => "Utilities",
            BootTarget::Diags => "Diags",
            BootTarget::BiosSetup => "BiosSetup",
            BootTarget::Pxe => "Pxe",
            BootTarget::UefiShell => "UefiShell",
            BootTarget::UefiHttp => "UefiHttp",
            BootTarget::UefiTarget => "UefiTarget",
        }
    }

    /// Parses the Redfish spelling, exactly (iLO's enumerations are case-sensitive).
    pub fn from_redfish(s: &str) -> Option<BootTarget> {
        BootTarget::ALL.into_iter().find(|t| t.redfish() == s)
    }

    /// The device of the emulated machine this target boots; `None` when it boots none (a
    /// firmware application other than RBSU, or a device the machine does not have).
    pub fn device(self) -> Option<BootDevice> {
        match self {
            BootTarget::Cd => Some(BootDevice::Cdrom),
            BootTarget::Hdd => Some(BootDevice::Hdd),
            BootTarget::Usb => Some(BootDevice::Usb),
            BootTarget::Pxe | BootTarget::UefiHttp => Some(BootDevice::Network),
            BootTarget::BiosSetup => Some(BootDevice::Rbsu),
            BootTarget::None
            | BootTarget::SdCard
            | BootTarget::Utilities
            | BootTarget::Diags
            | BootTarget::UefiShell
            | BootTarget::UefiTarget => None,
        }
    }

    /// A firmware application, which is never part of the persistent boot order: an override
    /// to it lasts one boot whatever `BootSourceOverrideEnabled` says (module doc).
    pub fn one_boot_only(self) -> bool {
        matches!(
            self,
            BootTarget::BiosSetup
                | BootTarget::Utilities
                | BootTarget::Diags
                | BootTarget::UefiShell
        )
    }

    /// What RIBCL's GET_ONE_TIME_BOOT shows for a one-time override to this target, for the
    /// targets RIBCL has no name of its own for (the others map to a [`BootDevice`] or an
    /// `EMB-*` application). A real iLO speaks one protocol or the other, so these names are the
    /// emulator's own [guess].
    pub fn ribcl(self) -> &'static str {
        match self {
            BootTarget::Pxe | BootTarget::UefiHttp => "NETWORK",
            BootTarget::SdCard => "SDCARD",
            BootTarget::UefiShell => "UEFI-SHELL",
            BootTarget::UefiTarget => "UEFI-TARGET",
            BootTarget::None => "Normal",
            BootTarget::Cd => "CDROM",
            BootTarget::Hdd => "HDD",
            BootTarget::Usb => "USB",
            BootTarget::Utilities => "EMB-MENU",
            BootTarget::Diags => "EMB-DIAGS",
            BootTarget::BiosSetup => "RBSU",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_floppy_is_not_one() {
        for t in BootTarget::ALL {
            assert_eq!(BootTarget::from_redfish(t.redfish()), Some(t));
            assert_eq!(
                serde_json::to_value(t).expect("serializes"),
                serde_json::json!(t.redfish())
            );
        }
        assert_eq!(BootTarget::from_redfish("Floppy"), None);
        assert_eq!(BootTarget::from_redfish("uefihttp"), None);
    }

    #[test]
    fn network_targets_boot_the_nic_and_applications_last_one_boot() {
        assert_eq!(BootTarget::UefiHttp.device(), Some(BootDevice::Network));
        assert_eq!(BootTarget::Pxe.device(), Some(BootDevice::Network));
        assert_eq!(BootTarget::BiosSetup.device(), Some(BootDevice::Rbsu));
        assert_eq!(BootTarget::SdCard.device(), None);
        let once: Vec<_> = BootTarget::ALL
            .into_iter()
            .filter(|t| t.one_boot_only())
            .map(BootTarget::redfish)
            .collect();
        assert_eq!(once, ["Utilities", "Diags", "BiosSetup", "UefiShell"]);
    }
}
