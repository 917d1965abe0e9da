//! `Systems/1`: the ComputerSystem as iLO 4 RIS shapes it (`Power`, `Boot`, `AvailableActions`,
//! `Oem.Hp`), its actions (POSTed to the resource itself: `Reset`, and `PowerButton` with
//! `Target: /Oem/Hp`), the boot override PATCH, and `Systems/1/SecureBoot`.

use http::{Method, StatusCode};
use serde_json::{json, Map, Value};

use super::{collection, json_reply, Call, Refusal};
use crate::boot_target::BootTarget;
use crate::http::Reply;
use crate::server::{PowerChange, Server};
use crate::state::{BootDevice, BootMode, Power, ServerState, SupportedBootModes};

const SYSTEM: &str = "/rest/v1/Systems/1";
const SECURE_BOOT: &str = "/rest/v1/Systems/1/SecureBoot";
const ALLOW_SYSTEM: &str = "GET, HEAD, POST, PATCH";
const ALLOW_SECURE_BOOT: &str = "GET, HEAD, PATCH";

/// The override targets iLO 4 lists in `BootSourceOverrideSupported`: iLO 5's twelve without
/// `SDCard` and `UefiHttp` (docs/ilo-quirks.md §3; the Gen9 capture).
pub(super) const RIS_TARGETS: [BootTarget; 10] = [
    BootTarget::None,
    BootTarget::Cd,
    BootTarget::Hdd,
    BootTarget::Usb,
    BootTarget::Utilities,
    BootTarget::Diags,
    BootTarget::BiosSetup,
    BootTarget::Pxe,
    BootTarget::UefiShell,
    BootTarget::UefiTarget,
];

/// The UEFI structured boot strings of the emulated machine's devices, as iLO 4 names them
/// (`CD.Virtual.2.1` and the `NIC.*.IPv4` form are in the capture and proliantutils' samples;
/// the others follow the same pattern [guess]). The same devices RIBCL lists as `BootXXXX`.
pub(super) fn structured_boot_strings(d: BootDevice) -> &'static [&'static str] {
    match d {
        BootDevice::Cdrom => &["CD.Virtual.2.1"],
        BootDevice::Floppy => &["FD.Virtual.1.1"],
        BootDevice::Hdd => &["HD.Emb.1.2"],
        BootDevice::Network => &["NIC.LOM.1.1.IPv4", "NIC.LOM.1.1.IPv6"],
        BootDevice::Usb => &["Generic.USB.1.1"],
        BootDevice::Rbsu => &[],
    }
}

/// `Systems/...`; `rest` is the path after `systems` (the BIOS resources are [`super::bios`]).
pub(super) async fn handle(call: &Call<'_>, rest: &[&str]) -> Reply {
    let server = call.server;
    match (&call.req.method, rest) {
        (&Method::GET | &Method::HEAD, []) => json_reply(
            StatusCode::OK,
            &collection(
                "/rest/v1/Systems",
                "Computer Systems",
                "ComputerSystem.1",
                &[SYSTEM],
            ),
            Some("GET, HEAD"),
        ),
        (&Method::GET | &Method::HEAD, ["1"]) => {
            let post_state = server.post_state().await;
            let v = server.read(|s| system_json(server, s, post_state)).await;
            json_reply(StatusCode::OK, &v, Some(ALLOW_SYSTEM))
        }
        (&Method::POST, ["1"]) => match call.json_body() {
            Some(body) => action(call, &body).await,
            None => call.malformed(),
        },
        (&Method::PATCH, ["1"]) => match call.json_body() {
            Some(body) => patch_system(call, &body).await,
            None => call.malformed(),
        },
        (_, ["1"]) => call.not_allowed(ALLOW_SYSTEM),
        (&Method::GET | &Method::HEAD, ["1", "secureboot"]) => {
            let v = server.read(secure_boot_json).await;
            json_reply(StatusCode::OK, &v, Some(ALLOW_SECURE_BOOT))
        }
        (&Method::PATCH, ["1", "secureboot"]) => match call.json_body() {
            Some(body) => patch_secure_boot(call, &body).await,
            None => call.malformed(),
        },
        (_, ["1", "secureboot"]) => call.not_allowed(ALLOW_SECURE_BOOT),
        _ => call.not_found(),
    }
}

fn uefi_class(s: &ServerState) -> u8 {
    match s.supported_boot_modes {
        SupportedBootModes::LegacyOnly => 0,
        SupportedBootModes::LegacyUefi => 2,
        SupportedBootModes::UefiOnly => 3,
    }
}

/// The override as RIS reports it: target and `Once`/`Continuous`/`Disabled`.
pub(super) fn boot_override(s: &ServerState) -> (BootTarget, &'static str) {
    match (s.one_time_boot, s.continuous_override) {
        (Some(one), _) => (ris_target(one.target()), "Once"),
        (None, Some(t)) => (ris_target(t), "Continuous"),
        (None, None) => (BootTarget::None, "Disabled"),
    }
}

/// A target iLO 4 has no name for (set over RIBCL or Redfish: an SD card, UEFI HTTP) as the
/// nearest one it lists: UEFI HTTP boots from the NIC, an SD card is a USB device [guess].
fn ris_target(t: BootTarget) -> BootTarget {
    match t {
        BootTarget::UefiHttp => BootTarget::Pxe,
        BootTarget::SdCard => BootTarget::Usb,
        other => other,
    }
}

/// The system ROM, the same one RIBCL's health data reports.
const ROM_FAMILY: &str = "P70";
const ROM_DATE: &str = "07/01/2015";

/// `GET /rest/v1/Systems/1`, keyed as the Gen9 capture is
/// (tests/fixtures/ilo-captures/proliantutils-ilo4-ris/rest_v1_computer_system_gen9.json).
/// Hardware figures agree with RIBCL's health data (two processors, 64 GB, the two LOM MACs).
pub(super) fn system_json(server: &Server, s: &ServerState, post_state: &str) -> Value {
    let (target, enabled) = boot_override(s);
    let identity = &server.config.profile.identity;
    let on = s.power == Power::On;
    let rom = format!("{ROM_FAMILY} v1.40 ({ROM_DATE})");
    let uefi_targets: Vec<&str> = crate::state::DEFAULT_BOOT_ORDER
        .iter()
        .flat_map(|d| structured_boot_strings(*d).iter().copied())
        .collect();
    json!({
        "Type": "ComputerSystem.1.0.1",
        "Name": "Computer System",
        "Description": "Computer System View",
        "AssetTag": "",
        "Manufacturer": "HP",
        "Model": server.config.product,
        "SKU": "755258-B21",
        "SerialNumber": server.serial,
        "UUID": server.uuid,
        "SystemType": "Physical",
        "IndicatorLED": "Off",
        "Power": if on { "On" } else { "Off" },
        "Status": {"Health": "OK", "State": if on { "Enabled" } else { "Disabled" }},
        "Bios": {"Current": {"VersionString": rom}},
        "Memory": {"TotalSystemMemoryGB": 64},
        "Processors": {
            "Count": 2,
            "ProcessorFamily": "Intel(R) Xeon(R) CPU E5-2650 0 @ 2.00GHz",
            "Status": {"HealthRollUp": "OK"},
        },
        "HostCorrelation": {
            "HostMACAddress": ["2c:76:8a:5a:30:11", "2c:76:8a:5a:30:12"],
            "HostName": "",
            "IPAddress": ["", ""],
        },
        "Boot": {
            "BootSourceOverrideEnabled": enabled,
            "BootSourceOverrideTarget": target.redfish(),
            "BootSourceOverrideSupported": RIS_TARGETS.iter().map(|t| t.redfish()).collect::<Vec<_>>(),
            // The UEFI device path chosen for `UefiTarget` is not kept [simplification].
            "UefiTargetBootSourceOverride": "None",
            "UefiTargetBootSourceOverrideSupported": uefi_targets,
        },
        "AvailableActions": [{
            "Action": "Reset",
            "Capabilities": [{"PropertyName": "ResetType", "AllowableValues": identity.reset_types}],
        }],
        "Oem": {"Hp": oem_hp(s, on, post_state)},
        "links": {
            "self": {"href": SYSTEM},
            "Chassis": [{"href": "/rest/v1/Chassis/1"}],
            "Logs": {"href": "/rest/v1/Systems/1/Logs"},
            "ManagedBy": [{"href": "/rest/v1/Managers/1"}],
        },
    })
}

/// `Oem.Hp` of the ComputerSystem.
fn oem_hp(s: &ServerState, on: bool, post_state: &str) -> Value {
    json!({
            "Type": "HpComputerSystemExt.0.10.1",
            "AvailableActions": [
                {"Action": "PowerButton", "Capabilities": [
                    {"PropertyName": "PushType", "AllowableValues": ["Press", "PressAndHold"]},
                    {"PropertyName": "Target", "AllowableValues": ["/Oem/Hp"]},
                ]},
                {"Action": "SystemReset", "Capabilities": [
                    {"PropertyName": "ResetType", "AllowableValues": ["ColdBoot"]},
                    {"PropertyName": "Target", "AllowableValues": ["/Oem/Hp"]},
                ]},
            ],
            "Battery": [],
            "Bios": {
                "Backup": {"Date": format!("v1.40 ({ROM_DATE})"), "Family": ROM_FAMILY, "VersionString": format!("{ROM_FAMILY} v1.40 ({ROM_DATE})")},
                "Current": {"Date": ROM_DATE, "Family": ROM_FAMILY, "VersionString": format!("{ROM_FAMILY} v1.40 ({ROM_DATE})")},
                "UefiClass": uefi_class(s),
            },
            "DeviceDiscoveryComplete": {
                "AMSDeviceDiscovery": "NoAMS",
                "SmartArrayDiscovery": if on { "Complete" } else { "Initial" },
                "vAuxDeviceDiscovery": if on { "DeviceDiscoveryComplete" } else { "DataIncomplete" },
                "vMainDeviceDiscovery": if on { "ServerOn" } else { "ServerOff" },
            },
            "PostState": post_state,
            "PowerAllocationLimit": 500,
            "PowerAutoOn": "PowerOn",
            "PowerOnDelay": "Minimum",
            "PowerRegulatorMode": "Dynamic",
            "PowerRegulatorModesSupported": ["OSControl", "Dynamic", "Max", "Min"],
            "ServerSignature": 0,
            "VirtualProfile": "Inactive",
            "VirtualUUID": null,
            "links": {
                "BIOS": {"href": "/rest/v1/systems/1/bios"},
                "MEMORY": {"href": "/rest/v1/Systems/1/Memory"},
                "PCIDevices": {"href": "/rest/v1/Systems/1/PCIDevices"},
                "PCISlots": {"href": "/rest/v1/Systems/1/PCISlots"},
                "SecureBoot": {"href": SECURE_BOOT},
            },

    })
}

/// `GET /rest/v1/Systems/1/SecureBoot` (`HpSecureBoot`, proliantutils reads
/// `SecureBootCurrentState`).
pub(super) fn secure_boot_json(s: &ServerState) -> Value {
    json!({
        "Type": "HpSecureBoot.1.0.0",
        "Name": "SecureBoot",
        "SecureBootEnable": s.secure_boot_enable,
        "SecureBootCurrentState": s.secure_boot_current,
        "ResetToDefaultKeys": false,
        "ResetAllKeys": false,
        "links": {"self": {"href": SECURE_BOOT}},
    })
}

fn str_field<'a>(body: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    body.get(key).and_then(Value::as_str)
}

/// `InvalidOperationForSystemState`: iLO 4 refuses a power request for the state the host is
/// already in (docs/ilo-quirks.md §2).
fn wrong_state(call: &Call<'_>) -> Reply {
    call.error(
        StatusCode::BAD_REQUEST,
        &call.ilo_id("InvalidOperationForSystemState"),
        &[],
    )
}

fn not_in_list(call: &Call<'_>, value: &str, property: &str) -> Reply {
    call.error(
        StatusCode::BAD_REQUEST,
        &call.base_id("ActionParameterValueNotInList"),
        &[value, property],
    )
}

/// A POST to `Systems/1`: `{"Action": "Reset", "ResetType": ...}`, `{"Action": "PowerButton",
/// "Target": "/Oem/Hp", "PushType": ...}` or `{"Action": "SystemReset", "Target": "/Oem/Hp",
/// "ResetType": "ColdBoot"}`.
async fn action(call: &Call<'_>, body: &Map<String, Value>) -> Reply {
    let server = call.server;
    let on = server.read(|s| s.power == Power::On).await;
    match str_field(body, "Action") {
        Some("Reset") => {
            let reset_type = str_field(body, "ResetType").unwrap_or("");
            if !call
                .server
                .config
                .profile
                .identity
                .reset_types
                .contains(&reset_type)
            {
                return not_in_list(call, reset_type, "ResetType");
            }
            let result = match reset_type {
                "On" | "ForceOn" if on => return wrong_state(call),
                "ForceOff" | "GracefulShutdown" | "ForceRestart" | "GracefulRestart" | "Nmi"
                    if !on =>
                {
                    return wrong_state(call)
                }
                // The profile's allowable list was checked above.
                _ => server.reset_by_type(reset_type).await.unwrap_or(Ok(())),
            };
            result.map_or_else(|e| call.op_error(e), |()| call.success())
        }
        Some("PowerButton") => {
            let target = str_field(body, "Target").unwrap_or("");
            if target != "/Oem/Hp" {
                return not_in_list(call, target, "Target");
            }
            match str_field(body, "PushType") {
                Some("Press") => server
                    .press_power_button()
                    .await
                    .map_or_else(|e| call.op_error(e), |()| call.success()),
                // Holding the button of a host that is off [guess: refused like the Reset of the
                // same state].
                Some("PressAndHold") if !on => wrong_state(call),
                Some("PressAndHold") => match server.power_off().await {
                    Ok(PowerChange::Changed | PowerChange::AlreadyThere) => call.success(),
                    Err(e) => call.op_error(e),
                },
                other => not_in_list(call, other.unwrap_or(""), "PushType"),
            }
        }
        Some("SystemReset") => {
            // A cold boot: power off, then on [guess: the HP OEM action is not documented].
            if str_field(body, "ResetType") != Some("ColdBoot") {
                return not_in_list(
                    call,
                    str_field(body, "ResetType").unwrap_or(""),
                    "ResetType",
                );
            }
            if !on {
                return wrong_state(call);
            }
            let result = match server.power_off().await {
                Ok(_) => server.power_on().await.map(|_| ()),
                Err(e) => Err(e),
            };
            result.map_or_else(|e| call.op_error(e), |()| call.success())
        }
        other => call.error(
            StatusCode::BAD_REQUEST,
            &call.base_id("ActionNotSupported"),
            &[other.unwrap_or("")],
        ),
    }
}

/// What a valid Boot PATCH asks for (`None`: the property was not sent).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BootPatch {
    target: Option<BootTarget>,
    enabled: Option<&'static str>,
}

/// Reads a `Boot` object of a PATCH, or the error iLO 4 answers. Only the override target,
/// its tenure and the UEFI target are properties of `Boot` on iLO 4: `BootSourceOverrideMode`
/// does not exist there (docs/ilo-quirks.md §0, §3), so it is unknown like any other name
/// [guess at the message id].
pub(super) fn parse_boot(boot: &Value) -> Result<BootPatch, Refusal> {
    let Some(obj) = boot.as_object() else {
        return Err(("PropertyValueTypeError", vec!["Boot".into()]));
    };
    for key in obj.keys() {
        if !matches!(
            key.as_str(),
            "BootSourceOverrideTarget"
                | "BootSourceOverrideEnabled"
                | "UefiTargetBootSourceOverride"
        ) {
            return Err(("PropertyUnknown", vec![key.clone()]));
        }
    }
    let shown = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
    let target = match obj.get("BootSourceOverrideTarget") {
        None => None,
        Some(v) => match v
            .as_str()
            .and_then(BootTarget::from_redfish)
            .filter(|t| RIS_TARGETS.contains(t))
        {
            Some(t) => Some(t),
            None => {
                return Err((
                    "PropertyValueNotInList",
                    vec![shown(v), "BootSourceOverrideTarget".into()],
                ))
            }
        },
    };
    let enabled = match obj.get("BootSourceOverrideEnabled") {
        None => None,
        Some(v) => match v.as_str() {
            Some("Once") => Some("Once"),
            Some("Continuous") => Some("Continuous"),
            Some("Disabled") => Some("Disabled"),
            _ => {
                return Err((
                    "PropertyValueNotInList",
                    vec![shown(v), "BootSourceOverrideEnabled".into()],
                ))
            }
        },
    };
    if let Some(v) = obj.get("UefiTargetBootSourceOverride") {
        let known = v.as_str().is_some_and(|s| {
            s == "None"
                || crate::state::DEFAULT_BOOT_ORDER
                    .iter()
                    .any(|d| structured_boot_strings(*d).contains(&s))
        });
        if !known {
            return Err((
                "PropertyValueNotInList",
                vec![shown(v), "UefiTargetBootSourceOverride".into()],
            ));
        }
    }
    Ok(BootPatch { target, enabled })
}

/// Applies a Boot PATCH the way the Redfish side does (`Once` is the one-time boot,
/// `Continuous` heads the persistent order, `Disabled` clears), so RIBCL reads it back.
pub(super) fn apply_boot(s: &mut ServerState, patch: &BootPatch) {
    s.apply_boot_override(patch.target, patch.enabled);
}

async fn patch_system(call: &Call<'_>, body: &Map<String, Value>) -> Reply {
    // Only `Boot` is writable here [simplification: AssetTag and IndicatorLED are not kept].
    if let Some(key) = body.keys().find(|k| k.as_str() != "Boot") {
        return call.error(
            StatusCode::BAD_REQUEST,
            &call.base_id("PropertyUnknown"),
            &[key],
        );
    }
    let Some(boot) = body.get("Boot") else {
        return call.success();
    };
    let patch = match parse_boot(boot) {
        Ok(p) => p,
        Err((name, args)) => {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            return call.error(StatusCode::BAD_REQUEST, &call.base_id(name), &args);
        }
    };
    call.server.update(|s| apply_boot(s, &patch)).await;
    call.success()
}

async fn patch_secure_boot(call: &Call<'_>, body: &Map<String, Value>) -> Reply {
    for (key, value) in body {
        let known = matches!(
            key.as_str(),
            "SecureBootEnable" | "ResetToDefaultKeys" | "ResetAllKeys"
        );
        if !known {
            return call.error(
                StatusCode::BAD_REQUEST,
                &call.base_id("PropertyUnknown"),
                &[key],
            );
        }
        if !value.is_boolean() {
            return call.error(
                StatusCode::BAD_REQUEST,
                &call.base_id("PropertyValueTypeError"),
                &[&value.to_string(), key],
            );
        }
    }
    // Secure Boot is a UEFI feature: refused while the next boot is legacy
    // (docs/ilo-quirks.md §7).
    let legacy = call
        .server
        .read(|s| s.boot_mode_pending == BootMode::Legacy)
        .await;
    if legacy {
        return call.error(
            StatusCode::BAD_REQUEST,
            &call.ilo_id("UnsupportedOperationInLegacyBootMode"),
            &[],
        );
    }
    // Key resets change no state the emulator models; the enable applies at the next boot.
    if let Some(enable) = body.get("SecureBootEnable").and_then(Value::as_bool) {
        call.server.update(|s| s.secure_boot_enable = enable).await;
    }
    call.success()
}

#[cfg(test)]
mod tests {
    use http::Method;
    use serde_json::json;

    use super::super::tests::{call, gen9, ids, request, runtime};
    use super::*;
    use crate::state::OneTimeBoot;
    use crate::state::Power;

    #[test]
    fn the_system_has_the_ris_shape() {
        let rt = runtime();
        let s = gen9();
        let (status, v) = rt.block_on(call(&s, &request(Method::GET, "/rest/v1/Systems/1", None)));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(v["Type"], "ComputerSystem.1.0.1");
        assert_eq!(v["Manufacturer"], "HP");
        assert_eq!(v["Model"], "ProLiant DL360 Gen9");
        assert_eq!(v["Power"], "Off");
        assert!(v.get("PowerState").is_none() && v.get("@odata.id").is_none());
        assert_eq!(v["links"]["self"]["href"], SYSTEM);
        assert_eq!(
            v["Oem"]["Hp"]["links"]["BIOS"]["href"],
            "/rest/v1/systems/1/bios"
        );
        assert_eq!(v["Oem"]["Hp"]["Bios"]["UefiClass"], 2);
        assert_eq!(v["Oem"]["Hp"]["PostState"], "PowerOff");
        let supported = v["Boot"]["BootSourceOverrideSupported"]
            .as_array()
            .expect("list");
        assert_eq!(supported.len(), 10);
        assert!(!supported.contains(&json!("SDCard")) && !supported.contains(&json!("UefiHttp")));
        assert!(v["Boot"].get("BootSourceOverrideMode").is_none());
        assert_eq!(
            v["AvailableActions"][0]["Capabilities"][0]["AllowableValues"],
            json!(["On", "ForceOff", "ForceRestart", "Nmi", "PushPowerButton"])
        );
    }

    #[test]
    fn power_actions_change_the_shared_state_and_same_state_is_refused() {
        let rt = runtime();
        let s = gen9();
        let post = |body: Value| request(Method::POST, "/rest/v1/Systems/1", Some(body));
        let (status, body) = rt.block_on(call(
            &s,
            &post(json!({"Action": "Reset", "ResetType": "ForceOff"})),
        ));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(ids(&body), ["iLO.0.10.InvalidOperationForSystemState"]);
        let (status, body) = rt.block_on(call(
            &s,
            &post(json!({"Action": "Reset", "ResetType": "On"})),
        ));
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(ids(&body), ["Base.0.10.Success"]);
        assert_eq!(rt.block_on(s.read(|st| st.power)), Power::On);
        let (status, _) = rt.block_on(call(
            &s,
            &post(json!({"Action": "Reset", "ResetType": "On"})),
        ));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _) = rt.block_on(call(
            &s,
            &post(json!({"Action": "Reset", "ResetType": "ForceRestart"})),
        ));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(rt.block_on(s.read(|st| st.boots)), 2);
        // PowerCycle is not an iLO 4 reset type.
        let (status, body) = rt.block_on(call(
            &s,
            &post(json!({"Action": "Reset", "ResetType": "PowerCycle"})),
        ));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(ids(&body), ["Base.0.10.ActionParameterValueNotInList"]);
        let hold =
            json!({"Action": "PowerButton", "Target": "/Oem/Hp", "PushType": "PressAndHold"});
        assert_eq!(rt.block_on(call(&s, &post(hold.clone()))).0, StatusCode::OK);
        assert_eq!(rt.block_on(s.read(|st| st.power)), Power::Off);
        assert_eq!(
            rt.block_on(call(&s, &post(hold))).0,
            StatusCode::BAD_REQUEST
        );
        let wrong_target =
            json!({"Action": "PowerButton", "Target": "/Oem/Hpe", "PushType": "Press"});
        assert_eq!(
            rt.block_on(call(&s, &post(wrong_target))).0,
            StatusCode::BAD_REQUEST
        );
        let press = json!({"Action": "PowerButton", "Target": "/Oem/Hp", "PushType": "Press"});
        assert_eq!(rt.block_on(call(&s, &post(press))).0, StatusCode::OK);
        assert_eq!(rt.block_on(s.read(|st| st.power)), Power::On);
        assert_eq!(
            rt.block_on(call(&s, &post(json!({"Action": "Fly"})))).0,
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn boot_patches_follow_the_ris_target_list() {
        let rt = runtime();
        let s = gen9();
        let patch = |boot: Value| {
            request(
                Method::PATCH,
                "/rest/v1/Systems/1",
                Some(json!({"Boot": boot})),
            )
        };
        let (status, _) = rt.block_on(call(
            &s,
            &patch(json!({"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"})),
        ));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            rt.block_on(s.read(|st| st.one_time_boot)),
            Some(OneTimeBoot::Device(BootDevice::Network))
        );
        let (status, _) = rt.block_on(call(&s, &patch(json!({"BootSourceOverrideTarget": "Hdd", "BootSourceOverrideEnabled": "Continuous"}))));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            rt.block_on(s.read(|st| st.persistent_boot[0])),
            BootDevice::Hdd
        );
        assert_eq!(rt.block_on(s.read(|st| st.one_time_boot)), None);
        for (boot, id) in [
            (
                json!({"BootSourceOverrideTarget": "UefiHttp"}),
                "Base.0.10.PropertyValueNotInList",
            ),
            (
                json!({"BootSourceOverrideTarget": "SDCard"}),
                "Base.0.10.PropertyValueNotInList",
            ),
            (
                json!({"BootSourceOverrideMode": "UEFI"}),
                "Base.0.10.PropertyUnknown",
            ),
            (
                json!({"BootSourceOverrideEnabled": "Always"}),
                "Base.0.10.PropertyValueNotInList",
            ),
            (
                json!({"UefiTargetBootSourceOverride": "NIC.Nowhere.9"}),
                "Base.0.10.PropertyValueNotInList",
            ),
        ] {
            let (status, body) = rt.block_on(call(&s, &patch(boot.clone())));
            assert_eq!(status, StatusCode::BAD_REQUEST, "{boot}");
            assert_eq!(ids(&body), [id], "{boot}");
        }
        // A refused PATCH changed nothing.
        assert_eq!(
            rt.block_on(s.read(|st| st.continuous_override)),
            Some(BootTarget::Hdd)
        );
        let (_, v) = rt.block_on(call(&s, &request(Method::GET, "/rest/v1/Systems/1", None)));
        assert_eq!(v["Boot"]["BootSourceOverrideEnabled"], "Continuous");
        assert_eq!(v["Boot"]["BootSourceOverrideTarget"], "Hdd");
    }

    #[test]
    fn secure_boot_is_uefi_only() {
        let rt = runtime();
        let s = gen9();
        let patch = request(
            Method::PATCH,
            SECURE_BOOT,
            Some(json!({"SecureBootEnable": true})),
        );
        let (status, body) = rt.block_on(call(&s, &patch));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            ids(&body),
            ["iLO.0.10.UnsupportedOperationInLegacyBootMode"]
        );
        rt.block_on(s.set_pending_boot_mode(BootMode::Uefi))
            .expect("uefi");
        assert_eq!(rt.block_on(call(&s, &patch)).0, StatusCode::OK);
        let (_, v) = rt.block_on(call(&s, &request(Method::GET, SECURE_BOOT, None)));
        assert_eq!(v["Type"], "HpSecureBoot.1.0.0");
        assert_eq!(v["SecureBootEnable"], true);
        assert_eq!(v["SecureBootCurrentState"], false);
    }
}
