//! Redfish, iLO 5 style, on the same port as RIBCL (reference §3).
//!
//! # Design
//! Fixed ids (System `1`, Manager `1`, Chassis `1`), collection `@odata.id` values with a trailing
//! slash (proliantutils builds member paths with `urljoin`, §3.2), paths matched
//! case-insensitively and with or without the trailing slash (iLO 5 serves
//! `/redfish/v1/systems/1/bios/settings/` in lower case). Authentication: sessions
//! (`POST /redfish/v1/SessionService/Sessions/`, `X-Auth-Token`) or Basic; only the service root
//! is open (§3.1).
//!
//! Operations map onto the same state machine as RIBCL:
//! - `ComputerSystem.Reset` On/ForceOn → power on; ForceOff/GracefulShutdown → off;
//!   ForceRestart/GracefulRestart → reset; PowerCycle → off then on; PushPowerButton → press;
//! - `Boot.BootSourceOverrideTarget` + `Enabled` Once → the one-time boot; Continuous → the
//!   persistent order's head; Disabled → clears; `BootSourceOverrideMode` → pending boot mode;
//! - BIOS `Attributes.BootMode` (current) and the settings object (pending); the HPE
//!   `bios/boot` resource (UEFI BootSources and PersistentBootConfigOrder);
//! - VirtualMedia 1 (Floppy/USBStick) and 2 (CD/DVD): standard InsertMedia/EjectMedia and the
//!   HPE OEM InsertVirtualMedia/EjectVirtualMedia; PATCH `Oem.Hpe.BootOnNextServerReset` →
//!   BOOT_ONCE. A Redfish insert connects the medium at once (ConnectedVia `URI`).
//!
//! # Limitations
//! No ETags, no `$expand`, no task monitors, no event service.

use base64::Engine;
use http::{header, Method, Request, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use crate::fault::{FaultKind, FaultSpec};
use crate::http::{read_body, simple, Reply};
use crate::server::{OpError, Server};
use crate::state::{
    BootDevice, BootMode, OneTimeBoot, Power, ServerState, StateError, VmBootAction, VmBootOption,
    VmDevice,
};

const ROOT: &str = "/redfish/v1/";
const SYSTEM: &str = "/redfish/v1/Systems/1/";
const MANAGER: &str = "/redfish/v1/Managers/1/";
const BIOS_SETTINGS: &str = "/redfish/v1/systems/1/bios/settings/";
const BIOS_BOOT: &str = "/redfish/v1/systems/1/bios/boot/";

fn json_reply(status: StatusCode, value: &Value) -> Reply {
    let mut r = simple(status, "application/json; charset=utf-8", value.to_string());
    r.headers_mut()
        .insert("OData-Version", header::HeaderValue::from_static("4.0"));
    r
}

fn no_content() -> Reply {
    json_reply(
        StatusCode::OK,
        &json!({"error": {"code": "iLO.0.10.ExtendedInfo", "message": "See @Message.ExtendedInfo for more information.",
            "@Message.ExtendedInfo": [{"MessageId": "Base.1.4.Success"}]}}),
    )
}

/// A Redfish error body (sushy reads `error.code`, `error.message`, `@Message.ExtendedInfo`).
fn error(status: StatusCode, message_id: &str, message: &str) -> Reply {
    json_reply(
        status,
        &json!({"error": {
            "code": "iLO.0.10.ExtendedInfo",
            "message": message,
            "@Message.ExtendedInfo": [{"MessageId": message_id, "Message": message}],
        }}),
    )
}

fn not_found(path: &str) -> Reply {
    error(
        StatusCode::NOT_FOUND,
        "Base.1.4.ResourceMissingAtURI",
        &format!("The resource at the URI {path} was not found."),
    )
}

fn op_error(e: OpError) -> Reply {
    match e {
        OpError::LicenseRequired => error(
            StatusCode::BAD_REQUEST,
            "iLO.2.14.LicenseKeyRequired",
            "A license key is required for this operation (iLO Advanced).",
        ),
        OpError::Fetch(f) => error(
            StatusCode::BAD_REQUEST,
            "iLO.2.14.UnableToConnectToURL",
            &format!("Unable to connect to the image URL: {f}"),
        ),
        OpError::State(StateError::PoweredOff) => error(
            StatusCode::BAD_REQUEST,
            "iLO.2.14.InvalidOperationForSystemState",
            "The operation is not allowed while the server is powered off.",
        ),
        OpError::State(StateError::NoImage) => error(
            StatusCode::BAD_REQUEST,
            "iLO.2.14.NoVirtualMediaInserted",
            "No virtual media is inserted.",
        ),
        OpError::State(StateError::BootModeNotSupported(m)) => error(
            StatusCode::BAD_REQUEST,
            "Base.1.4.PropertyValueNotInList",
            &format!("Boot mode {} is not supported.", m.ribcl()),
        ),
        OpError::Backend(b) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Base.1.4.InternalError",
            &b.to_string(),
        ),
    }
}

/// Normalised path: lower case, no trailing slash.
fn norm(path: &str) -> String {
    path.trim_end_matches('/').to_ascii_lowercase()
}

fn authorized(server: &Server, req: &Request<Incoming>) -> bool {
    let headers = req.headers();
    if let Some(token) = headers.get("X-Auth-Token").and_then(|v| v.to_str().ok()) {
        return server.session_ok(token);
    }
    let Some(basic) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
    else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(basic.trim()) else {
        return false;
    };
    let text = String::from_utf8_lossy(&decoded);
    match text.split_once(':') {
        Some((u, p)) => server.credentials_ok(u, p),
        None => false,
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

fn bios_mode(m: BootMode) -> &'static str {
    match m {
        BootMode::Legacy => "LegacyBios",
        BootMode::Uefi => "Uefi",
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

fn vm_id(d: VmDevice) -> &'static str {
    match d {
        VmDevice::Floppy => "1",
        VmDevice::Cdrom => "2",
    }
}

fn vm_json(d: VmDevice, s: &ServerState) -> Value {
    let vm = s.vm(d);
    let base = format!("/redfish/v1/Managers/1/VirtualMedia/{}/", vm_id(d));
    let image_name = vm
        .url
        .as_deref()
        .and_then(|u| u.rsplit('/').next())
        .unwrap_or("");
    json!({
        "@odata.context": "/redfish/v1/$metadata#VirtualMedia.VirtualMedia",
        "@odata.id": base,
        "@odata.type": "#VirtualMedia.v1_2_0.VirtualMedia",
        "Id": vm_id(d),
        "Name": "VirtualMedia",
        "Description": "Virtual Removable Media",
        "MediaTypes": match d { VmDevice::Floppy => json!(["Floppy", "USBStick"]), VmDevice::Cdrom => json!(["CD", "DVD"]) },
        "Image": vm.url.as_deref().unwrap_or(""),
        "ImageName": image_name,
        "Inserted": vm.inserted(),
        "WriteProtected": vm.write_protect,
        "ConnectedVia": if vm.connected { "URI" } else { "NotConnected" },
        "Actions": {
            "#VirtualMedia.InsertMedia": {"target": format!("{base}Actions/VirtualMedia.InsertMedia/")},
            "#VirtualMedia.EjectMedia": {"target": format!("{base}Actions/VirtualMedia.EjectMedia/")},
        },
        "Oem": {"Hpe": {
            "@odata.type": "#HpeiLOVirtualMedia.v2_2_0.HpeiLOVirtualMedia",
            "BootOnNextServerReset": vm.boot_option == VmBootOption::BootOnce,
            "Actions": {
                "#HpeiLOVirtualMedia.InsertVirtualMedia": {"target": format!("{base}Actions/Oem/Hpe/HpeiLOVirtualMedia.InsertVirtualMedia/")},
                "#HpeiLOVirtualMedia.EjectVirtualMedia": {"target": format!("{base}Actions/Oem/Hpe/HpeiLOVirtualMedia.EjectVirtualMedia/")},
            },
        }},
    })
}

fn collection(id: &str, name: &str, members: &[&str]) -> Value {
    json!({
        "@odata.id": id,
        "@odata.type": format!("#{name}Collection.{name}Collection"),
        "Name": format!("{name} Collection"),
        "Members@odata.count": members.len(),
        "Members": members.iter().map(|m| json!({"@odata.id": m})).collect::<Vec<_>>(),
    })
}

fn service_root(server: &Server) -> Value {
    json!({
        "@odata.context": "/redfish/v1/$metadata#ServiceRoot.ServiceRoot",
        "@odata.id": ROOT,
        "@odata.type": "#ServiceRoot.v1_5_1.ServiceRoot",
        "Id": "RootService",
        "Name": "HPE RESTful Root Service",
        "RedfishVersion": "1.6.0",
        "UUID": server.uuid,
        "Product": server.config.product,
        "Vendor": "HPE",
        "Systems": {"@odata.id": "/redfish/v1/Systems/"},
        "Managers": {"@odata.id": "/redfish/v1/Managers/"},
        "Chassis": {"@odata.id": "/redfish/v1/Chassis/"},
        "SessionService": {"@odata.id": "/redfish/v1/SessionService/"},
        "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions/"}},
        "Oem": {"Hpe": {"Manager": [{"ManagerType": "iLO 5", "ManagerFirmwareVersion": "2.72"}]}},
    })
}

async fn parse_json(req: Request<Incoming>) -> Result<Value, Reply> {
    let body = read_body(req.into_body()).await?;
    if body.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(&body).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            "Base.1.4.MalformedJSON",
            &format!("The request body is not valid JSON: {e}"),
        )
    })
}

fn vm_device(id: &str) -> Option<VmDevice> {
    match id {
        "1" => Some(VmDevice::Floppy),
        "2" => Some(VmDevice::Cdrom),
        _ => None,
    }
}

/// Handles a `/redfish/...` request.
pub async fn handle(server: &Server, req: Request<Incoming>, fault: Option<&FaultSpec>) -> Reply {
    let method = req.method().clone();
    let raw_path = req.uri().path().to_owned();
    let path = norm(&raw_path);
    if path == "/redfish" {
        return json_reply(StatusCode::OK, &json!({"v1": ROOT}));
    }
    if path == "/redfish/v1" {
        return json_reply(StatusCode::OK, &service_root(server));
    }
    if let Some(f) = fault {
        match f.kind {
            FaultKind::Busy => {
                let mut r = error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Base.1.4.ServiceTemporarilyUnavailable",
                    f.message
                        .as_deref()
                        .unwrap_or("The service is temporarily unavailable. Retry later."),
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
                return r;
            }
            FaultKind::RibclError => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "Base.1.4.GeneralError",
                    f.message
                        .as_deref()
                        .unwrap_or("Internal error (injected fault)."),
                )
            }
            _ => {}
        }
    }
    let login_fault = fault.is_some_and(|f| f.kind == FaultKind::LoginFail);
    // Session creation is the one call that authenticates by body.
    if path == "/redfish/v1/sessionservice/sessions" && method == Method::POST {
        let body = match parse_json(req).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        let user = body.get("UserName").and_then(Value::as_str).unwrap_or("");
        let password = body.get("Password").and_then(Value::as_str).unwrap_or("");
        if login_fault || !server.credentials_ok(user, password) {
            tracing::warn!(server = server.index, user, "Redfish session login failed");
            return error(
                StatusCode::UNAUTHORIZED,
                "Base.1.4.NoValidSession",
                "Login failed: invalid credentials.",
            );
        }
        let token = server.new_session();
        let location = format!("/redfish/v1/SessionService/Sessions/{}/", &token[..16]);
        let mut r = json_reply(
            StatusCode::CREATED,
            &json!({"@odata.id": location, "Id": &token[..16], "Name": "User Session", "UserName": user}),
        );
        if let (Ok(t), Ok(l)) = (
            header::HeaderValue::from_str(&token),
            header::HeaderValue::from_str(&location),
        ) {
            r.headers_mut().insert("X-Auth-Token", t);
            r.headers_mut().insert(header::LOCATION, l);
        }
        return r;
    }
    if login_fault || !authorized(server, &req) {
        return error(
            StatusCode::UNAUTHORIZED,
            "Base.1.4.NoValidSession",
            "No valid session or credentials were provided.",
        );
    }
    let segments: Vec<&str> = path.trim_start_matches("/redfish/v1/").split('/').collect();
    tracing::info!(server = server.index, %method, path = %raw_path, "Redfish request");
    match (&method, segments.as_slice()) {
        (&Method::GET, ["sessionservice"]) => json_reply(
            StatusCode::OK,
            &json!({"@odata.id": "/redfish/v1/SessionService/", "Id": "SessionService", "Name": "Session Service",
                "ServiceEnabled": true, "Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions/"}}),
        ),
        (&Method::GET, ["sessionservice", "sessions"]) => json_reply(
            StatusCode::OK,
            &collection("/redfish/v1/SessionService/Sessions/", "Session", &[]),
        ),
        (&Method::DELETE, ["sessionservice", "sessions", _id]) => {
            if let Some(token) = req
                .headers()
                .get("X-Auth-Token")
                .and_then(|v| v.to_str().ok())
            {
                server.end_session(token);
            }
            no_content()
        }
        (&Method::GET, ["systems"]) => json_reply(
            StatusCode::OK,
            &collection("/redfish/v1/Systems/", "ComputerSystem", &[SYSTEM]),
        ),
        (&Method::GET, ["systems", "1"]) => {
            let v = server.read(|s| system_json(server, s)).await;
            json_reply(StatusCode::OK, &v)
        }
        (&Method::PATCH, ["systems", "1"]) => {
            let body = match parse_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            patch_system(server, &body).await
        }
        (&Method::POST, ["systems", "1", "actions", "computersystem.reset"]) => {
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
        (
            &Method::POST,
            ["systems", "1", "actions", "oem", "hpe", "hpecomputersystemext.powerbutton"],
        ) => {
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
        (&Method::GET, ["systems", "1", "bios"]) => {
            let mode = server.read(|s| s.boot_mode_current).await;
            json_reply(
                StatusCode::OK,
                &json!({"@odata.id": "/redfish/v1/Systems/1/Bios/", "Id": "Bios", "Name": "BIOS Current Settings",
                    "AttributeRegistry": "BiosAttributeRegistryP89.v1_0_0",
                    "Attributes": {"BootMode": bios_mode(mode), "UefiOptimizedBoot": if mode == BootMode::Uefi { "Enabled" } else { "Disabled" }},
                    "@Redfish.Settings": {"SettingsObject": {"@odata.id": BIOS_SETTINGS}},
                    "Oem": {"Hpe": {"Links": {"Boot": {"@odata.id": BIOS_BOOT}}}}}),
            )
        }
        (&Method::GET, ["systems", "1", "bios", "boot"]) => {
            let v = server.read(bios_boot_json).await;
            json_reply(StatusCode::OK, &v)
        }
        (&Method::GET, ["systems", "1", "bios", "settings"]) => {
            let mode = server.read(|s| s.boot_mode_pending).await;
            json_reply(
                StatusCode::OK,
                &json!({"@odata.id": BIOS_SETTINGS, "Id": "settings", "Name": "BIOS Pending Settings",
                    "Attributes": {"BootMode": bios_mode(mode), "UefiOptimizedBoot": if mode == BootMode::Uefi { "Enabled" } else { "Disabled" }}}),
            )
        }
        (&Method::PATCH, ["systems", "1", "bios", "settings"]) => {
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
        (&Method::GET, ["managers"]) => json_reply(
            StatusCode::OK,
            &collection("/redfish/v1/Managers/", "Manager", &[MANAGER]),
        ),
        (&Method::GET, ["managers", "1"]) => json_reply(
            StatusCode::OK,
            &json!({"@odata.id": MANAGER, "@odata.type": "#Manager.v1_5_1.Manager", "Id": "1", "Name": "Manager",
                "ManagerType": "BMC", "FirmwareVersion": "iLO 5 v2.72", "Model": "iLO 5",
                "VirtualMedia": {"@odata.id": "/redfish/v1/Managers/1/VirtualMedia/"},
                "Links": {"ManagerForServers": [{"@odata.id": SYSTEM}]},
                "Oem": {"Hpe": {"Links": {"LicenseService": {"@odata.id": "/redfish/v1/Managers/1/LicenseService/"}}}}}),
        ),
        (&Method::GET, ["managers", "1", "licenseservice"]) => json_reply(
            StatusCode::OK,
            &collection(
                "/redfish/v1/Managers/1/LicenseService/",
                "HpeiLOLicense",
                &["/redfish/v1/Managers/1/LicenseService/1/"],
            ),
        ),
        (&Method::GET, ["managers", "1", "licenseservice", "1"]) => {
            let lic = server.read(|s| s.license).await;
            let name = match lic {
                crate::state::License::Advanced => "iLO Advanced",
                crate::state::License::Standard => "iLO Standard",
            };
            json_reply(
                StatusCode::OK,
                &json!({"@odata.id": "/redfish/v1/Managers/1/LicenseService/1/", "Id": "1", "Name": "iLO License",
                    "License": name, "LicenseType": "Perpetual", "LicenseKey": "XXXXX-XXXXX-XXXXX-XXXXX-XXXXX"}),
            )
        }
        (&Method::POST, ["managers", "1", "licenseservice"]) => {
            server.activate_license().await;
            no_content()
        }
        (&Method::GET, ["managers", "1", "virtualmedia"]) => json_reply(
            StatusCode::OK,
            &collection(
                "/redfish/v1/Managers/1/VirtualMedia/",
                "VirtualMedia",
                &[
                    "/redfish/v1/Managers/1/VirtualMedia/1/",
                    "/redfish/v1/Managers/1/VirtualMedia/2/",
                ],
            ),
        ),
        (&Method::GET, ["managers", "1", "virtualmedia", id]) => match vm_device(id) {
            Some(d) => {
                let v = server.read(|s| vm_json(d, s)).await;
                json_reply(StatusCode::OK, &v)
            }
            None => not_found(&raw_path),
        },
        (&Method::PATCH, ["managers", "1", "virtualmedia", id]) => {
            let Some(d) = vm_device(id) else {
                return not_found(&raw_path);
            };
            let body = match parse_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            patch_vmedia(server, d, &body).await
        }
        (&Method::POST, ["managers", "1", "virtualmedia", id, "actions", action @ ..]) => {
            let Some(d) = vm_device(id) else {
                return not_found(&raw_path);
            };
            let body = match parse_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let action = action.join("/");
            match action.as_str() {
                "virtualmedia.insertmedia" | "oem/hpe/hpeilovirtualmedia.insertvirtualmedia" => {
                    insert(server, d, &body).await
                }
                "virtualmedia.ejectmedia" | "oem/hpe/hpeilovirtualmedia.ejectvirtualmedia" => {
                    server
                        .eject_media(d)
                        .await
                        .map(|()| no_content())
                        .unwrap_or_else(op_error)
                }
                _ => not_found(&raw_path),
            }
        }
        (&Method::GET, ["chassis"]) => json_reply(
            StatusCode::OK,
            &collection(
                "/redfish/v1/Chassis/",
                "Chassis",
                &["/redfish/v1/Chassis/1/"],
            ),
        ),
        (&Method::GET, ["chassis", "1"]) => json_reply(
            StatusCode::OK,
            &json!({"@odata.id": "/redfish/v1/Chassis/1/", "Id": "1", "Name": "Computer System Chassis",
                "ChassisType": "RackMount", "Manufacturer": "HPE", "Model": server.config.product,
                "SerialNumber": server.serial,
                "Thermal": {"@odata.id": "/redfish/v1/Chassis/1/Thermal/"},
                "Power": {"@odata.id": "/redfish/v1/Chassis/1/Power/"}}),
        ),
        (&Method::GET, ["chassis", "1", "thermal"]) => json_reply(StatusCode::OK, &thermal()),
        (&Method::GET, ["chassis", "1", "power"]) => {
            let on = server.read(|s| s.power == Power::On).await;
            json_reply(StatusCode::OK, &power_readings(on))
        }
        (&Method::GET, _) => not_found(&raw_path),
        _ => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "Base.1.4.OperationNotAllowed",
            &format!("{method} is not allowed on {raw_path}."),
        ),
    }
}

/// The chassis Thermal resource: the same sensors as the RIBCL GET_EMBEDDED_HEALTH answer
/// (`ribcl/health.rs`), in the Redfish shape iLO 5 uses.
fn thermal() -> Value {
    let temperatures: Vec<Value> = crate::ribcl::health::TEMPERATURES
        .iter()
        .enumerate()
        .map(|(i, (label, location, current, caution, critical))| {
            json!({"MemberId": i.to_string(), "Name": label, "PhysicalContext": location,
                "ReadingCelsius": current.parse::<u32>().unwrap_or(0),
                "UpperThresholdNonCritical": caution.parse::<u32>().unwrap_or(0),
                "UpperThresholdCritical": critical.parse::<u32>().unwrap_or(0),
                "Status": {"State": "Enabled", "Health": "OK"}})
        })
        .collect();
    let fans: Vec<Value> = crate::ribcl::health::FAN_SPEEDS
        .iter()
        .enumerate()
        .map(|(i, speed)| {
            json!({"MemberId": i.to_string(), "Name": format!("Fan {}", i + 1),
                "Reading": speed.parse::<u32>().unwrap_or(0), "ReadingUnits": "Percent",
                "Status": {"State": "Enabled", "Health": "OK"}})
        })
        .collect();
    json!({"@odata.id": "/redfish/v1/Chassis/1/Thermal/", "Id": "Thermal", "Name": "Thermal",
        "Temperatures": temperatures, "Fans": fans})
}

/// The chassis Power resource, matching GET_POWER_READINGS.
fn power_readings(on: bool) -> Value {
    let watts = crate::ribcl::health::present_watts(on);
    json!({"@odata.id": "/redfish/v1/Chassis/1/Power/", "Id": "Power", "Name": "PowerMetrics",
        "PowerControl": [{"MemberId": "0", "PowerConsumedWatts": watts, "PowerCapacityWatts": 920,
            "PowerMetrics": {"AverageConsumedWatts": watts, "MinConsumedWatts": watts,
                "MaxConsumedWatts": watts, "IntervalInMin": 20}}],
        "PowerSupplies": [
            {"MemberId": "0", "Name": "Power Supply 1", "PowerCapacityWatts": 460, "Model": "656362-B21",
                "Status": {"State": "Enabled", "Health": "OK"}},
            {"MemberId": "1", "Name": "Power Supply 2", "PowerCapacityWatts": 460, "Model": "656362-B21",
                "Status": {"State": "Enabled", "Health": "OK"}}]})
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

async fn insert(server: &Server, d: VmDevice, body: &Value) -> Reply {
    let Some(image) = body.get("Image").and_then(Value::as_str) else {
        return error(
            StatusCode::BAD_REQUEST,
            "Base.1.4.ActionParameterMissing",
            "The action requires the parameter Image.",
        );
    };
    if server.read(|s| s.vm(d).inserted()).await {
        // iLO 5 refuses to insert over an inserted image [guess at the id]; proliantutils
        // ejects first (reference §3.3).
        return error(
            StatusCode::BAD_REQUEST,
            "iLO.2.14.MediaAlreadyInserted",
            "Virtual media is already inserted; eject it first.",
        );
    }
    if let Err(e) = server.insert_media(d, image).await {
        return op_error(e);
    }
    let write_protect = body.get("WriteProtected").and_then(Value::as_bool);
    let inserted = body
        .get("Inserted")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    if let Err(e) = server.set_vm_status(d, None, write_protect).await {
        return op_error(e);
    }
    if inserted {
        // Redfish media are connected as soon as they are inserted (ConnectedVia URI).
        if let Err(e) = server.connect_media(d).await {
            return op_error(e);
        }
    }
    no_content()
}

async fn patch_vmedia(server: &Server, d: VmDevice, body: &Value) -> Reply {
    let boot_once = body
        .pointer("/Oem/Hpe/BootOnNextServerReset")
        .or_else(|| body.pointer("/Oem/Hp/BootOnNextServerReset"))
        .and_then(Value::as_bool);
    let write_protect = body.get("WriteProtected").and_then(Value::as_bool);
    if let Some(image) = body.get("Image").and_then(Value::as_str) {
        let r = insert(
            server,
            d,
            &json!({"Image": image, "WriteProtected": write_protect}),
        )
        .await;
        if r.status() != StatusCode::OK {
            return r;
        }
    } else if body.get("Inserted").and_then(Value::as_bool) == Some(false) {
        if let Err(e) = server.eject_media(d).await {
            return op_error(e);
        }
    }
    let action = boot_once.map(|once| {
        VmBootAction::Set(if once {
            VmBootOption::BootOnce
        } else {
            VmBootOption::NoBoot
        })
    });
    server
        .set_vm_status(d, action, write_protect)
        .await
        .map(|()| no_content())
        .unwrap_or_else(op_error)
}
