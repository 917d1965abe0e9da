//! `Systems/1/Bios`: the current BIOS attributes (`BootMode`), the pending settings object and
//! the HPE `bios/boot` resource (UEFI boot sources and the persistent order).

use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::{
    error, json_reply, no_content, op_error, parse_json, unrouted, BIOS_BOOT, BIOS_SETTINGS,
};
use crate::http::Reply;
use crate::server::Server;
use crate::state::{BootDevice, BootMode, ServerState};

/// `Systems/1/Bios/...`; `rest` is the path after `bios`.
pub(super) async fn handle(
    server: &Server,
    method: &Method,
    rest: &[&str],
    req: Request<Incoming>,
    raw_path: &str,
) -> Reply {
    match (method, rest) {
        (&Method::GET, []) => {
            let (mode, messages) = server
                .read(|s| (s.boot_mode_current, s.bios_settings_messages.clone()))
                .await;
            let messages: Vec<Value> = messages
                .iter()
                .map(|(id, arg)| match arg {
                    Some(a) => json!({"MessageId": id, "MessageArgs": [a]}),
                    None => json!({"MessageId": id}),
                })
                .collect();
            json_reply(
                StatusCode::OK,
                &json!({"@odata.id": "/redfish/v1/Systems/1/Bios/", "Id": "Bios", "Name": "BIOS Current Settings",
                    "AttributeRegistry": "BiosAttributeRegistryP89.v1_0_0",
                    "Attributes": {"BootMode": bios_mode(mode), "UefiOptimizedBoot": if mode == BootMode::Uefi { "Enabled" } else { "Disabled" }},
                    "@Redfish.Settings": {"SettingsObject": {"@odata.id": BIOS_SETTINGS}, "Messages": messages},
                    "Oem": {"Hpe": {"Links": {"Boot": {"@odata.id": BIOS_BOOT}}}}}),
            )
        }
        (&Method::GET, ["boot"]) => {
            let v = server.read(bios_boot_json).await;
            json_reply(StatusCode::OK, &v)
        }
        (&Method::GET, ["settings"]) => {
            let mode = server.read(|s| s.boot_mode_pending).await;
            json_reply(
                StatusCode::OK,
                &json!({"@odata.id": BIOS_SETTINGS, "Id": "settings", "Name": "BIOS Pending Settings",
                    "Attributes": {"BootMode": bios_mode(mode), "UefiOptimizedBoot": if mode == BootMode::Uefi { "Enabled" } else { "Disabled" }}}),
            )
        }
        (&Method::PATCH, ["settings"]) => {
            let body = match parse_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let mode = match body.pointer("/Attributes/BootMode").and_then(Value::as_str) {
                Some("Uefi") => BootMode::Uefi,
                Some("LegacyBios") => BootMode::Legacy,
                None => return no_content(),
                Some(other) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "Base.1.4.PropertyValueNotInList",
                        &format!("BootMode {other} is not one of Uefi, LegacyBios."),
                    )
                }
            };
            server
                .set_pending_boot_mode(mode)
                .await
                .map(|()| no_content())
                .unwrap_or_else(op_error)
        }
        _ => unrouted(method, raw_path),
    }
}

fn bios_mode(m: BootMode) -> &'static str {
    match m {
        BootMode::Legacy => "LegacyBios",
        BootMode::Uefi => "Uefi",
    }
}

/// iLO 5 UEFI boot sources: (StructuredBootString, BootString). proliantutils maps BootString
/// back by substring ("HPE Virtual CD-ROM", "NIC"/"PXE", "Logical Drive"; its
/// `BOOT_SOURCE_TARGET_TO_PARTIAL_STRING_MAP`). The strings are shaped like iLO 5's [guess].
fn uefi_boot_source(d: BootDevice) -> Option<(&'static str, &'static str)> {
    match d {
        BootDevice::Cdrom => Some(("Usb.Virtual.1.1", "iLO Virtual USB 1 : HPE Virtual CD-ROM")),
        BootDevice::Floppy => Some(("Usb.Virtual.1.2", "iLO Virtual USB 2 : HPE Virtual USB Key")),
        BootDevice::Hdd => Some((
            "RAID.Slot1.1",
            "Slot 1 : HPE Smart Array P408i-a SR Gen10 - 279.37 GiB, RAID 1 Logical Drive 1(Target:0, Lun:0)",
        )),
        BootDevice::Network => Some((
            "NIC.LOM.1.1.IPv4",
            "Embedded LOM 1 Port 1 : HPE Ethernet 1Gb 4-port 331i Adapter - NIC (PXE IPv4)",
        )),
        BootDevice::Usb | BootDevice::Rbsu => None,
    }
}

/// `Systems/1/bios/boot/` (HPE OEM): UEFI boot sources and the persistent order.
fn bios_boot_json(s: &ServerState) -> Value {
    let sources: Vec<Value> = crate::state::DEFAULT_BOOT_ORDER
        .iter()
        .filter_map(|d| uefi_boot_source(*d))
        .map(|(structured, text)| json!({"StructuredBootString": structured, "BootString": text}))
        .collect();
    let order: Vec<&str> = s
        .persistent_boot
        .iter()
        .filter_map(|d| uefi_boot_source(*d).map(|(structured, _)| structured))
        .collect();
    json!({
        "@odata.id": BIOS_BOOT,
        "Id": "boot",
        "Name": "Boot Order Current Settings",
        "BootSources": sources,
        "PersistentBootConfigOrder": order,
    })
}
