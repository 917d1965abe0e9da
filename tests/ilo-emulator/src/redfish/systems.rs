//! `Systems/1`: the ComputerSystem (power, one-time and continuous boot override, pending boot
//! mode), its Reset action and the HPE power button.

use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::{
    collection, error, json_reply, no_content, op_error, parse_json, unrouted, MANAGER, SYSTEM,
};
use crate::http::Reply;
use crate::server::Server;
use crate::state::{BootDevice, BootMode, OneTimeBoot, Power, ServerState};

/// `Systems/...`; `rest` is the path after `systems` (the BIOS resources are [`super::bios`]).
pub(super) async fn handle(
    server: &Server,
    method: &Method,
    rest: &[&str],
    req: Request<Incoming>,
    raw_path: &str,
) -> Reply {
    match (method, rest) {
        (&Method::GET, []) => json_reply(
            StatusCode::OK,
            &collection("/redfish/v1/Systems/", "ComputerSystem", &[SYSTEM]),
        ),
        (&Method::GET, ["1"]) => {
            let v = server.read(|s| system_json(server, s)).await;
            json_reply(StatusCode::OK, &v)
        }
        (&Method::PATCH, ["1"]) => {
            let body = match parse_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            patch_system(server, &body).await
        }
        (&Method::POST, ["1", "actions", "computersystem.reset"]) => {
            let body = match parse_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            reset(
                server,
                body.get("ResetType").and_then(Value::as_str).unwrap_or(""),
            )
            .await
        }
        (&Method::POST, ["1", "actions", "oem", "hpe", "hpecomputersystemext.powerbutton"]) => {
            let body = match parse_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let result = match body.get("PushType").and_then(Value::as_str) {
                Some("Press") => server.press_power_button().await,
                Some("PressAndHold") => server.power_off().await.map(|_| ()),
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "Base.1.4.ActionParameterValueNotInList",
                        "PushType must be Press or PressAndHold.",
                    )
                }
            };
            result.map(|()| no_content()).unwrap_or_else(op_error)
        }
        _ => unrouted(method, raw_path),
    }
}

fn redfish_target(d: BootDevice) -> &'static str {
    match d {
        BootDevice::Cdrom => "Cd",
        BootDevice::Floppy => "Floppy",
        BootDevice::Hdd => "Hdd",
        BootDevice::Usb => "Usb",
        BootDevice::Network => "Pxe",
        BootDevice::Rbsu => "BiosSetup",
    }
}

fn device_from_target(t: &str) -> Option<Option<BootDevice>> {
    Some(match t {
        "None" => None,
        "Cd" => Some(BootDevice::Cdrom),
        "Floppy" => Some(BootDevice::Floppy),
        "Hdd" => Some(BootDevice::Hdd),
        "Usb" => Some(BootDevice::Usb),
        "Pxe" => Some(BootDevice::Network),
        "BiosSetup" => Some(BootDevice::Rbsu),
        _ => return None,
    })
}

fn boot_mode_redfish(m: BootMode) -> &'static str {
    match m {
        BootMode::Legacy => "Legacy",
        BootMode::Uefi => "UEFI",
    }
}

fn uefi_class(s: &ServerState) -> u8 {
    match s.supported_boot_modes {
        crate::state::SupportedBootModes::LegacyOnly => 0,
        crate::state::SupportedBootModes::LegacyUefi => 2,
        crate::state::SupportedBootModes::UefiOnly => 3,
    }
}

fn system_json(server: &Server, s: &ServerState) -> Value {
    let (target, enabled) = match (s.one_time_boot, s.continuous_override) {
        (Some(OneTimeBoot::Device(d)), _) => (redfish_target(d), "Once"),
        (Some(OneTimeBoot::Embedded(_)), _) => ("Utilities", "Once"),
        (None, Some(d)) => (redfish_target(d), "Continuous"),
        (None, None) => ("None", "Disabled"),
    };
    json!({
        "@odata.context": "/redfish/v1/$metadata#ComputerSystem.ComputerSystem",
        "@odata.id": SYSTEM,
        "@odata.type": "#ComputerSystem.v1_4_0.ComputerSystem",
        "Id": "1",
        "Name": "Computer System",
        "Manufacturer": "HPE",
        "Model": server.config.product,
        "SerialNumber": server.serial,
        "UUID": server.uuid,
        "SystemType": "Physical",
        "PowerState": match s.power { Power::On => "On", Power::Off => "Off" },
        "Status": {"Health": "OK", "State": "Enabled"},
        "Boot": {
            "BootSourceOverrideTarget": target,
            "BootSourceOverrideEnabled": enabled,
            "BootSourceOverrideMode": boot_mode_redfish(s.boot_mode_current),
            "BootSourceOverrideTarget@Redfish.AllowableValues":
                ["None", "Cd", "Hdd", "Usb", "Pxe", "Floppy", "BiosSetup"],
            "BootSourceOverrideEnabled@Redfish.AllowableValues": ["Disabled", "Once", "Continuous"],
        },
        "Bios": {"@odata.id": "/redfish/v1/Systems/1/Bios/"},
        "Links": {"ManagedBy": [{"@odata.id": MANAGER}], "Chassis": [{"@odata.id": "/redfish/v1/Chassis/1/"}]},
        "Actions": {
            "#ComputerSystem.Reset": {
                "target": "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset/",
                "ResetType@Redfish.AllowableValues":
                    ["On", "ForceOff", "GracefulShutdown", "ForceRestart", "Nmi", "PushPowerButton", "GracefulRestart"],
            }
        },
        "Oem": {"Hpe": {
            "@odata.type": "#HpeComputerSystemExt.v2_3_0.HpeComputerSystemExt",
            "Bios": {"UefiClass": uefi_class(s)},
            "Actions": {
                "#HpeComputerSystemExt.PowerButton": {
                    "target": "/redfish/v1/Systems/1/Actions/Oem/Hpe/HpeComputerSystemExt.PowerButton/",
                    "PushType@Redfish.AllowableValues": ["Press", "PressAndHold"],
                },
                "#HpeComputerSystemExt.SystemReset": {
                    "target": "/redfish/v1/Systems/1/Actions/Oem/Hpe/HpeComputerSystemExt.SystemReset/",
                },
            },
        }},
    })
}

async fn reset(server: &Server, reset_type: &str) -> Reply {
    let result = match reset_type {
        "On" | "ForceOn" => server.power_on().await.map(|_| ()),
        "ForceOff" | "GracefulShutdown" => server.power_off().await.map(|_| ()),
        "ForceRestart" | "GracefulRestart" => server.reset().await,
        "PowerCycle" => match server.power_off().await {
            Ok(_) => server.power_on().await.map(|_| ()),
            Err(e) => Err(e),
        },
        "PushPowerButton" => server.press_power_button().await,
        "Nmi" => Ok(()),
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                "Base.1.4.ActionParameterValueNotInList",
                &format!("ResetType {other:?} is not supported."),
            )
        }
    };
    result.map(|()| no_content()).unwrap_or_else(op_error)
}

async fn patch_system(server: &Server, body: &Value) -> Reply {
    let Some(boot) = body.get("Boot") else {
        return no_content();
    };
    let target = boot.get("BootSourceOverrideTarget").and_then(Value::as_str);
    let enabled = boot
        .get("BootSourceOverrideEnabled")
        .and_then(Value::as_str);
    let mode = boot.get("BootSourceOverrideMode").and_then(Value::as_str);
    let device = match target.map(device_from_target) {
        None => None,
        Some(Some(d)) => Some(d),
        Some(None) => {
            return error(
                StatusCode::BAD_REQUEST,
                "Base.1.4.PropertyValueNotInList",
                &format!(
                    "BootSourceOverrideTarget {:?} is not supported.",
                    target.unwrap_or("")
                ),
            )
        }
    };
    if let Some(m) = mode {
        let m = match m {
            "UEFI" => BootMode::Uefi,
            "Legacy" => BootMode::Legacy,
            other => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "Base.1.4.PropertyValueNotInList",
                    &format!("BootSourceOverrideMode {other:?} is not supported."),
                )
            }
        };
        if let Err(e) = server.set_pending_boot_mode(m).await {
            return op_error(e);
        }
    }
    if !matches!(enabled, None | Some("Once" | "Continuous" | "Disabled")) {
        return error(
            StatusCode::BAD_REQUEST,
            "Base.1.4.PropertyValueNotInList",
            "BootSourceOverrideEnabled must be Disabled, Once or Continuous.",
        );
    }
    server
        .update(|s| {
            // The target in effect: the new one, or the one already set.
            let current = s
                .one_time_boot
                .and_then(|o| match o {
                    OneTimeBoot::Device(d) => Some(d),
                    OneTimeBoot::Embedded(_) => None,
                })
                .or(s.continuous_override);
            let dev = device.unwrap_or(current);
            let enabled = enabled.unwrap_or(if s.continuous_override.is_some() {
                "Continuous"
            } else {
                "Once"
            });
            match (enabled, dev) {
                ("Disabled", _) | (_, None) => {
                    s.one_time_boot = None;
                    s.continuous_override = None;
                }
                ("Continuous", Some(d)) => {
                    s.one_time_boot = None;
                    s.continuous_override = Some(d);
                    s.set_persistent_boot(&[d]);
                }
                (_, Some(d)) => {
                    s.continuous_override = None;
                    s.one_time_boot = Some(OneTimeBoot::Device(d));
                }
            }
        })
        .await;
    no_content()
}
