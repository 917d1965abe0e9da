//! Boot device, maintenance mode and node deletion: short calls that finish in the request.
//!
//! # Design
//! Each one that writes takes the node's reservation for its duration (a running task means
//! 409 `NodeLocked`, as in Ironic). Boot devices use Ironic's names on the API side and
//! [`BootDevice`] on the driver side; the mapping is here, in one table.

use std::sync::Arc;

use super::tasks;
use super::{BootDeviceReading, Core, ManagerError};
use crate::bmc::{Bmc, BootDevice};
use crate::states::ProvisionState;
use crate::store::NodeIdent;

/// Ironic's boot device names this conductor can set, and the driver's device for each.
/// `bios` and `safe` have no iLO equivalent in Ironic's iLO driver either.
fn driver_device(name: &str) -> Option<BootDevice> {
    Some(match name {
        "pxe" => BootDevice::Network,
        "disk" => BootDevice::Hdd,
        "cdrom" => BootDevice::Cdrom,
        "floppy" => BootDevice::Floppy,
        "usb" => BootDevice::Usb,
        _ => return None,
    })
}

/// Ironic's name for a driver's device, `None` when it has none.
fn ironic_name(device: &BootDevice) -> Option<&'static str> {
    match device {
        BootDevice::Network => Some("pxe"),
        BootDevice::Hdd => Some("disk"),
        BootDevice::Cdrom => Some("cdrom"),
        BootDevice::Floppy => Some("floppy"),
        BootDevice::Usb => Some("usb"),
        // A raw UEFI entry: classified by its description as the iLO tools do, when the
        // client has not done it already.
        BootDevice::Uefi { description, .. } => {
            let d = description
                .as_deref()
                .unwrap_or_default()
                .to_ascii_lowercase();
            if d.contains("virtual") && (d.contains("cd") || d.contains("dvd")) {
                Some("cdrom")
            } else if d.contains("virtual") && (d.contains("usb key") || d.contains("floppy")) {
                Some("usb")
            } else if d.contains("nic") || d.contains("pxe") || d.contains("network") {
                Some("pxe")
            } else if d.is_empty() {
                None
            } else {
                Some("disk")
            }
        }
        BootDevice::Other(name) => match name.to_ascii_uppercase().as_str() {
            "RBSU" | "BIOSSETUP" => Some("bios"),
            _ => None,
        },
    }
}

/// `PUT .../management/boot_device`.
pub(crate) async fn set_boot_device(
    core: &Arc<Core>,
    ident: &NodeIdent,
    device: &str,
    persistent: bool,
) -> Result<(), ManagerError> {
    let wanted = driver_device(device).ok_or_else(|| ManagerError::InvalidInput {
        field: "boot_device",
        message: format!(
            "boot device \"{device}\" is not supported by the iLO driver; use pxe, disk, \
                 cdrom, floppy or usb"
        ),
    })?;
    let (node, reservation) = tasks::reserve(core, ident).await?;
    let outcome: Result<(), ManagerError> = async {
        let bmc = Bmc::connect_read_only(&node, &core.deploy.config.ilo_defaults).await?;
        Ok(bmc.set_boot_device(&wanted, persistent).await?)
    }
    .await;
    reservation.release().await;
    match &outcome {
        Ok(()) => tracing::info!(node = %node.uuid, device, persistent, "boot device set"),
        Err(err) => {
            tracing::error!(node = %node.uuid, device, error = %err.chain(), "could not set the boot device")
        }
    }
    outcome
}

/// `GET .../management/boot_device`: the one-time device when set, else the first
/// persistent one.
pub(crate) async fn boot_device(
    core: &Core,
    ident: &NodeIdent,
) -> Result<BootDeviceReading, ManagerError> {
    let node = core.store().node(ident).await?;
    let bmc = Bmc::connect_read_only(&node, &core.deploy.config.ilo_defaults).await?;
    if let Some(once) = bmc.one_time_boot().await? {
        return Ok(BootDeviceReading {
            boot_device: ironic_name(&once).map(str::to_string),
            persistent: Some(false),
        });
    }
    let order = bmc.persistent_boot().await?;
    Ok(BootDeviceReading {
        boot_device: order.first().and_then(ironic_name).map(str::to_string),
        persistent: Some(true),
    })
}

/// Maintenance on (with a reason) or off.
pub(crate) async fn set_maintenance(
    core: &Arc<Core>,
    ident: &NodeIdent,
    on: bool,
    reason: Option<String>,
) -> Result<(), ManagerError> {
    let (mut node, reservation) = tasks::reserve(core, ident).await?;
    node.maintenance = on;
    node.maintenance_reason = if on { reason } else { None };
    let written = core.store().update_node(&node).await;
    reservation.release().await;
    written?;
    tracing::info!(node = %node.uuid, maintenance = on, "maintenance set");
    Ok(())
}

/// `DELETE /v1/nodes/{node}`: the node and its ports.
pub(crate) async fn delete_node(core: &Arc<Core>, ident: &NodeIdent) -> Result<(), ManagerError> {
    let (node, reservation) = tasks::reserve(core, ident).await?;
    let refusal = if let Some(instance) = &node.instance_uuid {
        Some(format!(
            "Node {} is associated with instance {instance}; undeploy it and remove \
             instance_uuid first",
            node.uuid
        ))
    } else {
        let state = node.provision_state;
        let allowed = matches!(
            state,
            ProvisionState::Enroll | ProvisionState::Manageable | ProvisionState::Available
        ) || (node.maintenance && state.is_stable());
        (!allowed).then(|| {
            format!(
                "Can not delete node {} while it is in provision state \"{state}\"; valid \
                 states are enroll, manageable and available, or any stable state in \
                 maintenance mode",
                node.uuid
            )
        })
    };
    if let Some(message) = refusal {
        reservation.release().await;
        return Err(ManagerError::StateConflict {
            node: node.uuid,
            message,
        });
    }
    let deleted = core.store().delete_node(node.uuid).await;
    // The row is gone with its reservation; releasing is a no-op kept for the guard.
    reservation.release().await;
    deleted?;
    tracing::info!(node = %node.uuid, "node deleted");
    Ok(())
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn boot_device_names_round_trip() {
        for name in ["pxe", "disk", "cdrom", "floppy", "usb"] {
            let device = driver_device(name).expect("supported");
            assert_eq!(ironic_name(&device), Some(name));
        }
        assert!(driver_device("bios").is_none());
        assert!(driver_device("safe").is_none());
        let uefi = |d: &str| BootDevice::Uefi {
            id: "Boot0001".into(),
            description: Some(d.into()),
        };
        assert_eq!(ironic_name(&uefi("Embedded RAID 1 : Smart Array P440ar Controller - 279.37 GiB, RAID1 Logical Drive 1")), Some("disk"));
        assert_eq!(
            ironic_name(&uefi(
                "Embedded LOM 1 Port 1 : HP Ethernet 1Gb 4-port 331i Adapter - NIC (PXE IPv4)"
            )),
            Some("pxe")
        );
        assert_eq!(
            ironic_name(&uefi("iLO Virtual USB 2 : iLO Virtual CD-ROM")),
            Some("cdrom")
        );
    }
}
