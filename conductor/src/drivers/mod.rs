//! Hardware interfaces split as in Ironic: power, management (boot device, boot mode), virtual
//! media and inventory (licences, model, health), and the clients that carry them out.
//!
//! # Design
//! [`Power`], [`Management`], [`VirtualMedia`] and [`Inventory`] are the interfaces the deploy
//! flows call (docs/architecture.md §2). Their types say what a BMC can do, never how one protocol spells
//! it: `BootDevice::Cdrom` is `CDROM` in RIBCL and `Cd` in Redfish, and a UEFI boot entry is
//! classified into the device it stands for ([`classify_boot_entry`]) so that the boot device
//! reads the same in both boot modes. Both iLO clients (RIBCL for iLO 4, Redfish for iLO 5/6
//! and other Redfish BMCs) implement them; [`ilo::IloClient`] picks one per node.
//!
//! Every failure is a [`DriverError`] whose [`DriverError::kind`] says what a caller may branch
//! on: a failed login is not retried, an unsupported boot-mode command means "assume legacy
//! BIOS" (Ironic's behaviour, docs/ilo-management.md §1.8), a missing licence is refused at
//! validate, a timeout or an HTTP 500 is transient. Protocol words live only in the messages.
//!
//! # Limitations
//! Sensors come from the BMC's own health data (RIBCL GET_EMBEDDED_HEALTH, Redfish Thermal/Power),
//! not IPMI as Ironic's iLO driver does (docs/ilo-management.md §1.6).

pub mod ilo;

mod boot_entry;
mod error;
mod inventory;
mod management;
mod power;
mod virtual_media;

pub use boot_entry::{classify_boot_entry, BootEntry};
pub use error::{DriverError, DriverErrorKind};
pub use inventory::{
    virtual_media_licensed, BmcInfo, Fan, Health, Inventory, Licence, LicenceTier, PowerReading,
    PowerSupply, Temperature,
};
pub use management::{BootDevice, BootMode, FirmwareLogEntry, Management, SupportedBootModes};
pub use power::{Power, PowerAction, PowerState};
pub use virtual_media::{VirtualMedia, VmediaBootOption, VmediaDevice, VmediaStatus};
/// A password or other secret: shown as `******` by `Debug`, `Display` and `Serialize`, so it
/// never reaches a log line (docs/architecture.md §7); `expose()` reads it for a login.
pub use vmdeploy_shared::secret::Secret;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s: Secret = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "******");
        assert_eq!(format!("{s}"), "******");
        assert_eq!(s.expose(), "hunter2");
        let config = ilo::IloConfig::new("10.0.0.9", "admin", Secret::new("hunter2"));
        let shown = format!("{config:?} {config:#?}");
        assert!(
            shown.contains("admin") && !shown.contains("hunter2"),
            "{shown}"
        );
    }
}
