//! `Managers/1/VirtualMedia`: 1 (Floppy/USBStick) and 2 (CD/DVD). iLO 4 has no insert or eject
//! action: a PATCH of `Image` inserts (a URL) or ejects (`null`), and
//! `Oem.Hp.BootOnNextServerReset` on the CD slot boots it once (docs/ilo-quirks.md §5).

use http::{Method, StatusCode};
use serde_json::{json, Map, Value};

use super::{collection, json_reply, Call, Refusal};
use crate::http::Reply;
use crate::profile::Quirk;
use crate::server::Server;
use crate::state::{ServerState, VmBootAction, VmBootOption, VmDevice};

const COLLECTION: &str = "/rest/v1/Managers/1/VirtualMedia";
const ALLOW_MEDIUM: &str = "GET, HEAD, PATCH";

fn vm_device(id: &str) -> Option<VmDevice> {
    match id {
        "1" => Some(VmDevice::Floppy),
        "2" => Some(VmDevice::Cdrom),
        _ => None,
    }
}

fn href(d: VmDevice) -> &'static str {
    match d {
        VmDevice::Floppy => "/rest/v1/Managers/1/VirtualMedia/1",
        VmDevice::Cdrom => "/rest/v1/Managers/1/VirtualMedia/2",
    }
}

/// Whether the slot carries `Oem.Hp.BootOnNextServerReset`: the CD only with the
/// `boot-once-cd-only` quirk (proliantutils' RIS floppy sample has no `Oem` at all).
fn has_boot_flag(server: &Server, d: VmDevice) -> bool {
    d == VmDevice::Cdrom || !server.quirk(Quirk::BootOnceCdOnly)
}

/// `GET /rest/v1/Managers/1/VirtualMedia/N`, shaped like proliantutils' RIS samples.
pub(super) fn medium_json(server: &Server, d: VmDevice, s: &ServerState) -> Value {
    let vm = s.vm(d);
    let mut v = json!({
        "Type": "VirtualMedia.1.0.0",
        "Name": "VirtualMedia",
        "Description": "Virtual Removable Media",
        "MediaTypes": match d {
            VmDevice::Floppy => json!(["Floppy", "USBStick"]),
            VmDevice::Cdrom => json!(["CD", "DVD"]),
        },
        "Image": vm.url.as_deref().unwrap_or(""),
        "Inserted": vm.inserted(),
        "WriteProtected": vm.write_protect,
        "ConnectedVia": if vm.connected { "URI" } else { "NotConnected" },
        "links": {"self": {"href": href(d)}},
    });
    if let Some(obj) = v.as_object_mut() {
        if let Some(name) = vm.url.as_deref().and_then(|u| u.rsplit('/').next()) {
            obj.insert("ImageName".into(), json!(name));
        }
        if has_boot_flag(server, d) {
            obj.insert(
                "Oem".into(),
                json!({"Hp": {"Type": "HpiLOVirtualMedia.1.0.0",
                    "BootOnNextServerReset": vm.boot_option == VmBootOption::BootOnce}}),
            );
        }
    }
    v
}

/// `Managers/1/VirtualMedia/...`; `rest` is the path after `virtualmedia`.
pub(super) async fn handle(call: &Call<'_>, rest: &[&str]) -> Reply {
    let server = call.server;
    match (&call.req.method, rest) {
        (&Method::GET | &Method::HEAD, []) => json_reply(
            StatusCode::OK,
            &collection(
                COLLECTION,
                "Virtual Media",
                "VirtualMedia.1",
                &[href(VmDevice::Floppy), href(VmDevice::Cdrom)],
            ),
            Some("GET, HEAD"),
        ),
        (method, [id]) => {
            let Some(d) = vm_device(id) else {
                return call.not_found();
            };
            match *method {
                Method::GET | Method::HEAD => {
                    let v = server.read(|s| medium_json(server, d, s)).await;
                    json_reply(StatusCode::OK, &v, Some(ALLOW_MEDIUM))
                }
                Method::PATCH => match call.json_body() {
                    Some(body) => patch(call, d, &body).await,
                    None => call.malformed(),
                },
                _ => call.not_allowed(ALLOW_MEDIUM),
            }
        }
        _ => call.not_found(),
    }
}

/// What a valid PATCH asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ImageChange {
    /// No `Image` in the body.
    Keep,
    /// `Image: null` (or empty [guess]): eject.
    Eject,
    /// `Image: URL`: insert.
    Insert(String),
}

/// Reads a PATCH body: `Image` and `Oem.Hp.BootOnNextServerReset` only. `Inserted` and
/// `WriteProtected` are not writable on iLO 4: 400 `PropertyUnknown` naming them
/// (docs/ilo-quirks.md §5), as is any other name.
pub(super) fn parse_patch(
    body: &Map<String, Value>,
) -> Result<(ImageChange, Option<bool>), Refusal> {
    let mut boot_once = None;
    for (key, value) in body {
        match key.as_str() {
            "Image" => {}
            "Oem" => {
                let flag = value
                    .as_object()
                    .filter(|o| o.len() == 1)
                    .and_then(|o| o.get("Hp"))
                    .and_then(Value::as_object)
                    .filter(|hp| hp.len() == 1)
                    .and_then(|hp| hp.get("BootOnNextServerReset"));
                match flag.map(Value::as_bool) {
                    Some(Some(b)) => boot_once = Some(b),
                    Some(None) => {
                        return Err((
                            "PropertyValueTypeError",
                            vec!["BootOnNextServerReset".into()],
                        ))
                    }
                    None => return Err(("PropertyUnknown", vec!["Oem".into()])),
                }
            }
            other => return Err(("PropertyUnknown", vec![other.to_owned()])),
        }
    }
    let image = match body.get("Image") {
        None => ImageChange::Keep,
        Some(Value::Null) => ImageChange::Eject,
        Some(Value::String(s)) if s.is_empty() => ImageChange::Eject,
        Some(Value::String(s)) => ImageChange::Insert(s.clone()),
        Some(_) => return Err(("PropertyValueTypeError", vec!["Image".into()])),
    };
    Ok((image, boot_once))
}

async fn patch(call: &Call<'_>, d: VmDevice, body: &Map<String, Value>) -> Reply {
    let server = call.server;
    let (image, boot_once) = match parse_patch(body) {
        Ok(p) => p,
        Err((name, args)) => {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            return call.error(StatusCode::BAD_REQUEST, &call.base_id(name), &args);
        }
    };
    if boot_once.is_some() && !has_boot_flag(server, d) {
        // The floppy cannot be a boot device (docs/ilo-quirks.md §5).
        return call.error(
            StatusCode::BAD_REQUEST,
            &call.base_id("PropertyUnknown"),
            &["BootOnNextServerReset"],
        );
    }
    match image {
        ImageChange::Keep => {}
        ImageChange::Eject => {
            if let Err(e) = server.eject_media(d).await {
                return call.op_error(e);
            }
        }
        ImageChange::Insert(url) => {
            if server.read(|s| s.vm(d).inserted()).await {
                // RIS does not overwrite an inserted image; proliantutils ejects first
                // (docs/ilo-quirks.md §5) [guess at the id].
                return call.error(
                    StatusCode::BAD_REQUEST,
                    &call.ilo_id("MediaAlreadyInserted"),
                    &[],
                );
            }
            if let Err(e) = server.insert_media(d, &url).await {
                return call.op_error(e);
            }
            // A RIS insert connects the medium at once (ConnectedVia `URI` in proliantutils'
            // inserted samples), as a Redfish one does.
            if let Err(e) = server.connect_media(d).await {
                return call.op_error(e);
            }
        }
    }
    if let Some(once) = boot_once {
        let option = if once {
            VmBootOption::BootOnce
        } else {
            VmBootOption::NoBoot
        };
        if let Err(e) = server
            .set_vm_status(d, Some(VmBootAction::Set(option)), None)
            .await
        {
            return call.op_error(e);
        }
    }
    call.success()
}

#[cfg(test)]
mod tests {
    use http::Method;
    use serde_json::json;

    use super::super::tests::{call, gen9, ids, request, runtime};
    use super::*;

    #[test]
    fn slots_have_the_ris_shape_and_the_flag_on_the_cd_only() {
        let rt = runtime();
        let s = gen9();
        let (_, cd) = rt.block_on(call(&s, &request(Method::GET, href(VmDevice::Cdrom), None)));
        assert_eq!(cd["MediaTypes"], json!(["CD", "DVD"]));
        assert_eq!(cd["Inserted"], false);
        assert_eq!(cd["ConnectedVia"], "NotConnected");
        assert_eq!(cd["Oem"]["Hp"]["BootOnNextServerReset"], false);
        assert_eq!(cd["links"]["self"]["href"], href(VmDevice::Cdrom));
        assert!(cd.get("Actions").is_none());
        let (_, floppy) = rt.block_on(call(
            &s,
            &request(Method::GET, href(VmDevice::Floppy), None),
        ));
        assert!(floppy.get("Oem").is_none(), "{floppy}");
        let (_, coll) = rt.block_on(call(&s, &request(Method::GET, COLLECTION, None)));
        assert_eq!(coll["Type"], "Collection.1.0.0");
        assert_eq!(coll["links"]["Member"][1]["href"], href(VmDevice::Cdrom));
    }

    #[test]
    fn patches_other_than_image_and_the_cd_flag_are_refused() {
        let rt = runtime();
        let s = gen9();
        for (path, body, id) in [
            (
                href(VmDevice::Cdrom),
                json!({"Inserted": true}),
                "Base.0.10.PropertyUnknown",
            ),
            (
                href(VmDevice::Cdrom),
                json!({"WriteProtected": false}),
                "Base.0.10.PropertyUnknown",
            ),
            (
                href(VmDevice::Cdrom),
                json!({"Image": 5}),
                "Base.0.10.PropertyValueTypeError",
            ),
            (
                href(VmDevice::Floppy),
                json!({"Oem": {"Hp": {"BootOnNextServerReset": true}}}),
                "Base.0.10.PropertyUnknown",
            ),
            (
                href(VmDevice::Cdrom),
                json!({"Image": null}),
                "iLO.0.10.NoVirtualMediaInserted",
            ),
        ] {
            let (status, reply) =
                rt.block_on(call(&s, &request(Method::PATCH, path, Some(body.clone()))));
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(ids(&reply), [id], "{body}");
        }
        // The CD's flag is BOOT_ONCE in the shared state.
        let flag = json!({"Oem": {"Hp": {"BootOnNextServerReset": true}}});
        let (status, _) = rt.block_on(call(
            &s,
            &request(Method::PATCH, href(VmDevice::Cdrom), Some(flag)),
        ));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            rt.block_on(s.read(|st| st.vm(VmDevice::Cdrom).boot_option)),
            VmBootOption::BootOnce
        );
        // An image that cannot be read is refused and nothing is inserted.
        let (status, _) = rt.block_on(call(
            &s,
            &request(
                Method::PATCH,
                href(VmDevice::Cdrom),
                Some(json!({"Image": "http://127.0.0.1:1/x.iso"})),
            ),
        ));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(!rt.block_on(s.read(|st| st.vm(VmDevice::Cdrom).inserted())));
    }

    #[test]
    fn parse_patch_reads_insert_eject_and_the_flag() {
        let obj = |v: Value| v.as_object().cloned().expect("object");
        assert_eq!(
            parse_patch(&obj(json!({"Image": "http://h/a.iso"}))),
            Ok((ImageChange::Insert("http://h/a.iso".into()), None))
        );
        assert_eq!(
            parse_patch(&obj(json!({"Image": null}))),
            Ok((ImageChange::Eject, None))
        );
        assert_eq!(
            parse_patch(&obj(
                json!({"Oem": {"Hp": {"BootOnNextServerReset": false}}})
            )),
            Ok((ImageChange::Keep, Some(false)))
        );
        assert!(parse_patch(&obj(
            json!({"Oem": {"Hpe": {"BootOnNextServerReset": true}}})
        ))
        .is_err());
    }
}
