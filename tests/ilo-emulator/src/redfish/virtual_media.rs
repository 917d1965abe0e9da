//! `Managers/1/VirtualMedia`: 1 (Floppy/USBStick) and 2 (CD/DVD), the standard InsertMedia and
//! EjectMedia actions, the HPE OEM InsertVirtualMedia/EjectVirtualMedia, and PATCH
//! (`Image`, `Inserted`, `Oem.Hpe.BootOnNextServerReset`).

use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::{
    collection, error, error_with_args, json_reply, no_content, not_found, op_error, parse_json,
    unrouted,
};
use crate::http::Reply;
use crate::profile::Quirk;
use crate::server::Server;
use crate::state::{ServerState, VmBootAction, VmBootOption, VmDevice};

/// `Managers/1/VirtualMedia/...`; `rest` is the path after `virtualmedia`.
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
            &collection(
                "/redfish/v1/Managers/1/VirtualMedia/",
                "VirtualMedia",
                &[
                    "/redfish/v1/Managers/1/VirtualMedia/1/",
                    "/redfish/v1/Managers/1/VirtualMedia/2/",
                ],
            ),
        ),
        (&Method::GET, [id]) => match vm_device(id) {
            Some(d) => {
                let v = server.read(|s| vm_json(server, d, s)).await;
                json_reply(StatusCode::OK, &v)
            }
            None => not_found(raw_path),
        },
        (&Method::PATCH, [id]) => {
            let Some(d) = vm_device(id) else {
                return not_found(raw_path);
            };
            let body = match parse_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            patch_vmedia(server, d, &body).await
        }
        (&Method::POST, [id, "actions", action @ ..]) => {
            let Some(d) = vm_device(id) else {
                return not_found(raw_path);
            };
            let action = action.join("/");
            let standard = matches!(
                action.as_str(),
                "virtualmedia.insertmedia" | "virtualmedia.ejectmedia"
            );
            if standard && server.quirk(Quirk::VmediaOemActionsOnly) {
                // VirtualMedia v1_0_0 has no standard actions (iLO 5 1.1x).
                return not_found(raw_path);
            }
            let empty_body = req
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .is_some_and(|l| l.as_bytes() == b"0")
                || (req.headers().get(http::header::CONTENT_LENGTH).is_none()
                    && req.headers().get(http::header::TRANSFER_ENCODING).is_none());
            if action == "oem/hpe/hpeilovirtualmedia.ejectvirtualmedia"
                && empty_body
                && server.quirk(Quirk::EjectEmptyBody415)
            {
                // iLO 5 1.x wants a JSON body, even `{}` (docs/ilo-quirks.md §5).
                return error(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    &server
                        .config
                        .profile
                        .identity
                        .base_message("UnsupportedMediaType"),
                    "The request body is missing or its media type is not supported.",
                );
            }
            let body = match parse_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
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
                _ => not_found(raw_path),
            }
        }
        _ => unrouted(method, raw_path),
    }
}

fn vm_device(id: &str) -> Option<VmDevice> {
    match id {
        "1" => Some(VmDevice::Floppy),
        "2" => Some(VmDevice::Cdrom),
        _ => None,
    }
}

fn vm_id(d: VmDevice) -> &'static str {
    match d {
        VmDevice::Floppy => "1",
        VmDevice::Cdrom => "2",
    }
}

fn vm_json(server: &Server, d: VmDevice, s: &ServerState) -> Value {
    let vm = s.vm(d);
    let base = format!("/redfish/v1/Managers/1/VirtualMedia/{}/", vm_id(d));
    let image_name = vm
        .url
        .as_deref()
        .and_then(|u| u.rsplit('/').next())
        .unwrap_or("");
    let oem_only = server.quirk(Quirk::VmediaOemActionsOnly);
    let mut v = json!({
        "@odata.context": "/redfish/v1/$metadata#VirtualMedia.VirtualMedia",
        "@odata.id": base,
        "@odata.type": if oem_only { "#VirtualMedia.v1_0_0.VirtualMedia" } else { "#VirtualMedia.v1_2_0.VirtualMedia" },
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
    });
    if let Some(obj) = v.as_object_mut() {
        if oem_only {
            obj.remove("Actions");
        }
        if d == VmDevice::Floppy && server.quirk(Quirk::BootOnceCdOnly) {
            if let Some(hpe) = obj
                .get_mut("Oem")
                .and_then(|o| o.get_mut("Hpe"))
                .and_then(Value::as_object_mut)
            {
                hpe.remove("BootOnNextServerReset");
            }
        }
    }
    v
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
        // ejects first (docs/ilo-management.md §3.3).
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
    if boot_once.is_some() && d == VmDevice::Floppy && server.quirk(Quirk::BootOnceCdOnly) {
        // Only the CD slot carries the flag; the floppy cannot be booted (docs/ilo-quirks.md §5).
        return error_with_args(
            StatusCode::BAD_REQUEST,
            &server
                .config
                .profile
                .identity
                .base_message("PropertyNotWritableOrUnknown"),
            "The property BootOnNextServerReset is not writable or unknown.",
            &["BootOnNextServerReset"],
        );
    }
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
