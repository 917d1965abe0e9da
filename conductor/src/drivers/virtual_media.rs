//! Virtual media: the devices, their boot options and status, and the [`VirtualMedia`]
//! interface.

use std::fmt;
use std::future::Future;

use serde::Serialize;

use super::DriverError;

/// A virtual media device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VmediaDevice {
    /// The virtual floppy / USB key (Ironic's parameters floppy).
    Floppy,
    /// The virtual CD/DVD.
    Cdrom,
}

impl fmt::Display for VmediaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VmediaDevice::Floppy => "floppy",
            VmediaDevice::Cdrom => "cdrom",
        })
    }
}

/// When virtual media is connected to the host (RIBCL VM_BOOT_OPTION; docs/ilo-management.md §1.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VmediaBootOption {
    /// Connect at every boot.
    BootAlways,
    /// Connect at the next boot only.
    BootOnce,
    /// Do not connect at boot.
    NoBoot,
    /// Connect now (and boot always).
    Connect,
    /// Disconnect now.
    Disconnect,
}

/// State of one virtual media device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmediaStatus {
    /// The device.
    pub device: VmediaDevice,
    /// Whether an image is inserted.
    pub inserted: bool,
    /// The image URL, when one is inserted.
    pub image_url: Option<String>,
    /// Whether the host sees it now (RIBCL VM_APPLET=CONNECTED, Redfish ConnectedVia=URI).
    pub connected: bool,
    /// When it is connected at boot, if the BMC says.
    pub boot_option: Option<VmediaBootOption>,
    /// Whether the host sees it read-only, if the BMC says.
    pub write_protected: Option<bool>,
}

/// Virtual media (the calls Ironic's iLO virtual-media boot interface makes).
pub trait VirtualMedia {
    /// The state of a virtual media device.
    fn vmedia_status(
        &self,
        device: VmediaDevice,
    ) -> impl Future<Output = Result<VmediaStatus, DriverError>> + Send;

    /// Inserts an image (by URL the BMC fetches) into a virtual media device.
    fn insert_vmedia(
        &self,
        device: VmediaDevice,
        url: &str,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// Ejects a virtual media device (a no-op when it is empty).
    fn eject_vmedia(
        &self,
        device: VmediaDevice,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// Sets when the device is connected and whether it is read-only.
    fn set_vmedia_status(
        &self,
        device: VmediaDevice,
        boot_option: VmediaBootOption,
        write_protect: Option<bool>,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;
}
