//! Boot device and boot mode: their values and the [`Management`] interface. The boot order's
//! entries and how a UEFI entry is read as a device are in `boot_entry.rs`.

use std::fmt;
use std::future::Future;

use serde::Serialize;

use super::{BootEntry, DriverError};

/// A boot device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BootDevice {
    /// CD/DVD, including the virtual CD.
    Cdrom,
    /// Local disk.
    Hdd,
    /// PXE / network.
    Network,
    /// Floppy (virtual floppy / USB key).
    Floppy,
    /// USB.
    Usb,
    /// A UEFI boot entry by id (`Boot000B`) with its description when the BMC gave one.
    Uefi {
        /// The `BootXXXX` id.
        id: String,
        /// What the firmware calls it.
        description: Option<String>,
    },
    /// Any other name the BMC uses (RBSU, EMB-MENU, BiosSetup, ...), kept verbatim.
    Other(String),
}

impl fmt::Display for BootDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootDevice::Cdrom => f.write_str("cdrom"),
            BootDevice::Hdd => f.write_str("hdd"),
            BootDevice::Network => f.write_str("network"),
            BootDevice::Floppy => f.write_str("floppy"),
            BootDevice::Usb => f.write_str("usb"),
            BootDevice::Uefi {
                id,
                description: Some(d),
            } => write!(f, "{id} ({d})"),
            BootDevice::Uefi { id, .. } => f.write_str(id),
            BootDevice::Other(name) => f.write_str(name),
        }
    }
}

impl BootDevice {
    /// The name Ironic's API uses for this device (`ironic.common.boot_devices`: `pxe`, `disk`,
    /// `cdrom`, `floppy`, `bios`), `None` where Ironic has none (USB, a raw UEFI entry).
    pub fn ironic_name(&self) -> Option<&'static str> {
        match self {
            BootDevice::Hdd => Some("disk"),
            BootDevice::Network => Some("pxe"),
            BootDevice::Cdrom => Some("cdrom"),
            BootDevice::Floppy => Some("floppy"),
            BootDevice::Other(name)
                if ["rbsu", "biossetup"].contains(&name.to_ascii_lowercase().as_str()) =>
            {
                Some("bios")
            }
            BootDevice::Usb | BootDevice::Uefi { .. } | BootDevice::Other(_) => None,
        }
    }
}

/// Firmware boot mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BootMode {
    /// UEFI.
    Uefi,
    /// Legacy BIOS.
    Bios,
}

/// The same mode as the ramdisk's parameters name it (`boot_mode` on the floppy or the kernel
/// command line).
impl From<BootMode> for vmdeploy_shared::params::BootMode {
    fn from(mode: BootMode) -> Self {
        match mode {
            BootMode::Uefi => vmdeploy_shared::params::BootMode::Uefi,
            BootMode::Bios => vmdeploy_shared::params::BootMode::Bios,
        }
    }
}

impl fmt::Display for BootMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BootMode::Uefi => "uefi",
            BootMode::Bios => "bios",
        })
    }
}

/// Boot modes the firmware supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SupportedBootModes {
    /// Legacy BIOS only.
    BiosOnly,
    /// UEFI only.
    UefiOnly,
    /// Both.
    BiosAndUefi,
}

/// One entry of the server's Integrated Management Log: the firmware's own record of a POST or
/// boot event, such as a Secure Boot refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FirmwareLogEntry {
    /// When the BMC recorded it, as it wrote it (RFC 3339 on iLO 5/6).
    pub created: String,
    /// `OK`, `Warning` or `Critical`.
    pub severity: String,
    /// What happened, in the firmware's words.
    pub message: String,
}

impl FirmwareLogEntry {
    /// Whether it is worth an operator's attention (not an informational `OK`).
    pub fn is_problem(&self) -> bool {
        !self.severity.eq_ignore_ascii_case("ok")
    }
}

/// Boot device and boot mode (Ironic's management interface).
pub trait Management {
    /// The one-time boot device, `None` when none is set.
    fn one_time_boot(&self)
        -> impl Future<Output = Result<Option<BootDevice>, DriverError>> + Send;

    /// Sets the device for the next boot only.
    fn set_one_time_boot(
        &self,
        device: &BootDevice,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// The persistent boot order, first entry first, each with the device it stands for and
    /// the BMC's own name and description.
    fn persistent_boot_entries(
        &self,
    ) -> impl Future<Output = Result<Vec<BootEntry>, DriverError>> + Send;

    /// The persistent boot order as devices: the same in legacy and UEFI mode (a UEFI node
    /// booting from its RAID volume reads [`BootDevice::Hdd`]).
    fn persistent_boot(&self) -> impl Future<Output = Result<Vec<BootDevice>, DriverError>> + Send
    where
        Self: Sync,
    {
        async move {
            Ok(self
                .persistent_boot_entries()
                .await?
                .into_iter()
                .map(|e| e.device)
                .collect())
        }
    }

    /// Makes `device` the first persistent boot device.
    fn set_persistent_boot(
        &self,
        device: &BootDevice,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// The boot mode in effect now.
    fn current_boot_mode(&self) -> impl Future<Output = Result<BootMode, DriverError>> + Send;

    /// The boot mode after the next reset.
    fn pending_boot_mode(&self) -> impl Future<Output = Result<BootMode, DriverError>> + Send;

    /// Sets the boot mode for the next reset.
    fn set_pending_boot_mode(
        &self,
        mode: BootMode,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// The boot modes the firmware supports.
    fn supported_boot_modes(
        &self,
    ) -> impl Future<Output = Result<SupportedBootModes, DriverError>> + Send;

    /// Whether UEFI Secure Boot is set to be on (`SecureBootEnable`). The setting takes
    /// effect at the next boot. A BMC without a Secure Boot interface answers
    /// [`DriverError::NotSupported`].
    fn secure_boot_enabled(&self) -> impl Future<Output = Result<bool, DriverError>> + Send {
        async {
            Err(DriverError::NotSupported {
                operation: "reading Secure Boot".into(),
                message: "this BMC interface has no Secure Boot setting".into(),
            })
        }
    }

    /// The newest `limit` entries of the Integrated Management Log, oldest first. A BMC
    /// interface that cannot read it answers [`DriverError::NotSupported`].
    fn firmware_log(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<FirmwareLogEntry>, DriverError>> + Send {
        let _ = limit;
        async {
            Err(DriverError::NotSupported {
                operation: "reading the Integrated Management Log".into(),
                message: "this BMC interface does not read it".into(),
            })
        }
    }

    /// Turns UEFI Secure Boot on or off for the next boot. Firmware accepts it only with UEFI
    /// pending (iLO 5/6 answer `UnsupportedOperationInLegacyBootMode` otherwise).
    fn set_secure_boot(
        &self,
        enable: bool,
    ) -> impl Future<Output = Result<(), DriverError>> + Send {
        async move {
            Err(DriverError::NotSupported {
                operation: format!("turning Secure Boot {}", if enable { "on" } else { "off" }),
                message: "this BMC interface has no Secure Boot setting".into(),
            })
        }
    }
}
