//! `Systems/1`: the ComputerSystem (power, one-time and continuous boot override, pending boot
//! mode), its Reset action and the HPE power button. The boot override targets and what each
//! means to the emulated machine are [`crate::boot_target`]'s.

use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::{
    collection, error, error_with_args, json_reply, no_content, op_error, parse_json, unrouted,
    MANAGER, SYSTEM,
};
use crate::boot_target::BootTarget;
use crate::http::Reply;
use crate::profile::Quirk;
use crate::server::Server;
use crate::state::{BootMode, Power, ServerState};

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
            let post_state = server.post_state().await;
            let v = server.read(|s| system_json(server, s, post_state)).await;
            json_reply(StatusCode::OK, &v)
        }
        (&Method::PATCH, ["1"]) => {
            let body = match parse_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            patch_system(server, &body).await
        }
        (&Method::GET, ["1", "secureboot"]) => {
            let (enable, current) = server
                .read(|s| (s.secure_boot_enable, s.secure_boot_current))
                .await;
            json_reply(
                StatusCode::OK,
                &json!({"@odata.id": "/redfish/v1/Systems/1/SecureBoot/", "@odata.type": "#SecureBoot.v1_0_0.SecureBoot",
                    "Id": "SecureBoot", "Name": "Secure Boot",
                    "SecureBootEnable": enable,
                    "SecureBootCurrentBoot": if current { "Enabled" } else { "Disabled" },
                    "SecureBootMode": "UserMode"}),
            )
        }
        (&Method::PATCH, ["1", "secureboot"]) => {
            let body = match parse_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let Some(enable) = body.get("SecureBootEnable").and_then(Value::as_bool) else {
                return no_content();
            };
            // Only in UEFI mode (docs/ilo-quirks.md §7); it applies at the next boot.
            let legacy = server
                .read(|s| s.boot_mode_pending == BootMode::Legacy)
                .await;
            if enable && legacy {
                return error(
                    StatusCode::BAD_REQUEST,
                    &server
                        .config
                        .profile
                        .identity
                        .ilo_message("UnsupportedOperationInLegacyBootMode"),
                    "Secure Boot needs UEFI boot mode.",
                );
            }
            server.update(|s| s.secure_boot_enable = enable).await;
            no_content()
        }
        // The Integrated Management Log ([`crate::iml`]).
        (&Method::GET, ["1", "logservices"]) => json_reply(
            StatusCode::OK,
            &collection(
                "/redfish/v1/Systems/1/LogServices/",
                "LogService",
                &["/redfish/v1/Systems/1/LogServices/IML/"],
            ),
        ),
        (&Method::GET, ["1", "logservices", "iml"]) => json_reply(
            StatusCode::OK,
            &json!({"@odata.id": "/redfish/v1/Systems/1/LogServices/IML/",
                "@odata.type": "#LogService.v1_0_0.LogService",
                "Id": "IML", "Name": "Integrated Management Log",
                "Entries": {"@odata.id": "/redfish/v1/Systems/1/LogServices/IML/Entries/"}}),
        ),
        (&Method::GET, ["1", "logservices", "iml", "entries"]) => {
            let ids: Vec<String> = server
                .iml_entries()
                .iter()
                .map(|e| format!("/redfish/v1/Systems/1/LogServices/IML/Entries/{}/", e.id))
                .collect();
            let members: Vec<&str> = ids.iter().map(String::as_str).collect();
            json_reply(
                StatusCode::OK,
                &collection(
                    "/redfish/v1/Systems/1/LogServices/IML/Entries/",
                    "LogEntry",
                    &members,
                ),
            )
        }
        (&Method::GET, ["1", "logservices", "iml", "entries", id]) => {
            match server
                .iml_entries()
                .iter()
                .find(|e| e.id.to_string() == *id)
            {
                Some(entry) => json_reply(StatusCode::OK, &entry.to_redfish()),
                None => unrouted(method, raw_path),
            }
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

fn system_json(server: &Server, s: &ServerState, post_state: &str) -> Value {
    let (target, enabled) = match (s.one_time_boot, s.continuous_override) {
        (Some(one), _) => (one.target(), "Once"),
        (None, Some(t)) => (t, "Continuous"),
        (None, None) => (BootTarget::None, "Disabled"),
    };
    let allowable: Vec<&str> = BootTarget::ALL.iter().map(|t| t.redfish()).collect();
    let identity = &server.config.profile.identity;
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
            "BootSourceOverrideTarget": target.redfish(),
            "BootSourceOverrideEnabled": enabled,
            "BootSourceOverrideMode": boot_mode_redfish(s.boot_mode_current),
            "BootSourceOverrideTarget@Redfish.AllowableValues": allowable,
            "BootSourceOverrideEnabled@Redfish.AllowableValues": ["Disabled", "Once", "Continuous"],
        },
        "Bios": {"@odata.id": "/redfish/v1/Systems/1/Bios/"},
        "SecureBoot": {"@odata.id": "/redfish/v1/Systems/1/SecureBoot/"},
        "LogServices": {"@odata.id": "/redfish/v1/Systems/1/LogServices/"},
        "Links": {"ManagedBy": [{"@odata.id": MANAGER}], "Chassis": [{"@odata.id": "/redfish/v1/Chassis/1/"}]},
        "Actions": {
            "#ComputerSystem.Reset": {
                "target": "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset/",
                "ResetType@Redfish.AllowableValues": identity.reset_types,
            }
        },
        "Oem": {"Hpe": {
            "@odata.type": "#HpeComputerSystemExt.v2_3_0.HpeComputerSystemExt",
            "Bios": {"UefiClass": uefi_class(s)},
            "PostState": post_state,
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

/// The `reset-window` refusal: a reset too soon after the last power change, or to the state
/// the host is already in (docs/ilo-quirks.md §2).
async fn refused_reset(server: &Server, reset_type: &str) -> Option<Reply> {
    if !server.quirk(Quirk::ResetWindow) {
        return None;
    }
    let on = server.read(|s| s.power == Power::On).await;
    let same_state = matches!(
        (reset_type, on),
        ("On" | "ForceOn", true) | ("ForceOff" | "GracefulShutdown", false)
    );
    if !same_state && !server.in_reset_window() {
        return None;
    }
    Some(error(
        StatusCode::BAD_REQUEST,
        &server
            .config
            .profile
            .identity
            .ilo_message("InvalidOperationForSystemState"),
        "The operation is not allowed in the current system state.",
    ))
}

async fn reset(server: &Server, reset_type: &str) -> Reply {
    if !server
        .config
        .profile
        .identity
        .reset_types
        .contains(&reset_type)
    {
        return error(
            StatusCode::BAD_REQUEST,
            &server
                .config
                .profile
                .identity
                .base_message("ActionParameterValueNotInList"),
            &format!("ResetType {reset_type:?} is not supported."),
        );
    }
    if let Some(refusal) = refused_reset(server, reset_type).await {
        return refusal;
    }
    let Some(result) = server.reset_by_type(reset_type).await else {
        return error(
            StatusCode::BAD_REQUEST,
            "Base.1.4.ActionParameterValueNotInList",
            &format!("ResetType {reset_type:?} is not supported."),
        );
    };
    result.map(|()| no_content()).unwrap_or_else(op_error)
}

/// A PATCH value iLO does not take: 400 `PropertyValueNotInList` naming the value and the
/// property (iLO's `MessageArgs`).
fn value_not_in_list(property: &str, value: &Value) -> Reply {
    let shown = value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_owned);
    error_with_args(
        StatusCode::BAD_REQUEST,
        "Base.1.4.PropertyValueNotInList",
        &format!(
            "The value {shown} for the property {property} is not in the list of acceptable values."
        ),
        &[&shown, property],
    )
}

/// The profile's refusals of a Boot PATCH, before anything is looked at further.
async fn refused_boot_patch(server: &Server, boot: &Value) -> Option<Reply> {
    let identity = &server.config.profile.identity;
    if server.quirk(Quirk::BootModeOverrideReadonly) && boot.get("BootSourceOverrideMode").is_some()
    {
        // "iLO 5 implements BootSourceOverrideMode as a read-only item" (docs/ilo-quirks.md §3).
        return Some(error_with_args(
            StatusCode::BAD_REQUEST,
            &identity.ilo_message("UnsupportedOperation"),
            "The operation is not supported: BootSourceOverrideMode is read-only.",
            &["BootSourceOverrideMode"],
        ));
    }
    if server.quirk(Quirk::StrictBootPatch) {
        let uefi_target =
            boot.get("BootSourceOverrideTarget").and_then(Value::as_str) == Some("UefiTarget");
        if let Some(obj) = boot.as_object() {
            for (key, value) in obj {
                let known = matches!(
                    key.as_str(),
                    "BootSourceOverrideTarget" | "BootSourceOverrideEnabled"
                ) || (uefi_target && key == "UefiTargetBootSourceOverride");
                if !known || value.as_str() == Some("") {
                    return Some(error_with_args(
                        StatusCode::BAD_REQUEST,
                        &identity.base_message("PropertyNotWritableOrUnknown"),
                        &format!("The property {key} is not writable or unknown."),
                        &[key],
                    ));
                }
            }
        }
    }
    if server.quirk(Quirk::PostRefusesBootChanges) && server.in_post().await {
        return Some(error(
            StatusCode::BAD_REQUEST,
            &identity.ilo_message("UnableToModifyDuringSystemPOST"),
            "The value cannot be modified while the system is in POST.",
        ));
    }
    None
}

async fn patch_system(server: &Server, body: &Value) -> Reply {
    let Some(boot) = body.get("Boot") else {
        return no_content();
    };
    if let Some(refusal) = refused_boot_patch(server, boot).await {
        return refusal;
    }
    // Everything is checked before anything changes: a refused PATCH changes nothing.
    let target = match boot.get("BootSourceOverrideTarget") {
        None => None,
        Some(v) => match v.as_str().and_then(BootTarget::from_redfish) {
            Some(t) => Some(t),
            None => return value_not_in_list("BootSourceOverrideTarget", v),
        },
    };
    let enabled = match boot.get("BootSourceOverrideEnabled") {
        None => None,
        Some(v) => match v.as_str() {
            Some(e @ ("Once" | "Continuous" | "Disabled")) => Some(e),
            _ => return value_not_in_list("BootSourceOverrideEnabled", v),
        },
    };
    let mode = match boot.get("BootSourceOverrideMode") {
        None => None,
        Some(v) => match v.as_str() {
            Some("UEFI") => Some(BootMode::Uefi),
            Some("Legacy") => Some(BootMode::Legacy),
            _ => return value_not_in_list("BootSourceOverrideMode", v),
        },
    };
    if let Some(m) = mode {
        if let Err(e) = server.set_pending_boot_mode(m).await {
            return op_error(e);
        }
    }
    // `UefiTargetBootSourceOverride` and `HttpBootUri` are taken and not used: the emulated
    // machine has no UEFI device paths of its own, and its NIC boots what its DHCP names.
    server
        .update(|s| {
            s.apply_boot_override(target, enabled);
        })
        .await;
    no_content()
}
