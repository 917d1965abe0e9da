//! `Systems/1/bios`: the current BIOS settings (read-only), the pending settings object that
//! takes a PATCH, and the UEFI boot order resource `bios/Boot`. iLO 4 keeps BIOS attributes
//! flat (no `Attributes` object) and links them from `links` (docs/ilo-quirks.md §4).

use http::{Method, StatusCode};
use serde_json::{json, Map, Value};

use super::systems::structured_boot_strings;
use super::{json_reply, Call};
use crate::http::Reply;
use crate::state::{BootMode, ServerState, DEFAULT_BOOT_ORDER};

const BIOS: &str = "/rest/v1/systems/1/bios";
const SETTINGS: &str = "/rest/v1/systems/1/bios/Settings";
const BOOT: &str = "/rest/v1/systems/1/bios/Boot";
/// The current settings are read-only: a client PATCHes `links.Settings` instead (proliantutils
/// reads this `Allow` to choose) [guess that a Gen9 lists no PATCH here].
const ALLOW_BIOS: &str = "GET, HEAD";
const ALLOW_SETTINGS: &str = "GET, HEAD, PUT, PATCH";
const ALLOW_BOOT: &str = "GET, HEAD";
const REGISTRY: &str = "HpBiosAttributeRegistryP89.1.1.00";

/// Attributes a PATCH may set. `CustomPostMessage` is there because proliantutils toggles a
/// trailing space in it after a Secure Boot change (a Gen9 workaround); the emulated BIOS does
/// not keep it [simplification].
const WRITABLE: [&str; 3] = ["BootMode", "UefiOptimizedBoot", "CustomPostMessage"];
/// Properties of the resource no PATCH may set.
const READ_ONLY: [&str; 6] = [
    "Type",
    "Name",
    "Description",
    "AttributeRegistry",
    "SettingsResult",
    "links",
];

fn bios_mode(m: BootMode) -> &'static str {
    match m {
        BootMode::Legacy => "LegacyBios",
        BootMode::Uefi => "Uefi",
    }
}

fn optimized(m: BootMode) -> &'static str {
    match m {
        BootMode::Uefi => "Enabled",
        BootMode::Legacy => "Disabled",
    }
}

/// A message id as RIS settings results write it: the registry and the name joined by a colon
/// (`Base.1.0:Success`; docs/ilo-quirks.md §10).
pub(super) fn colon_id(id: &str) -> String {
    match id.rsplit_once('.') {
        Some((registry, name)) => format!("{registry}:{name}"),
        None => id.to_owned(),
    }
}

/// `GET /rest/v1/systems/1/bios`: the settings in effect, and the result of the last apply.
pub(super) fn current_json(s: &ServerState) -> Value {
    let messages: Vec<Value> = s
        .bios_settings_messages
        .iter()
        .map(|(id, arg)| json!({"MessageID": colon_id(id), "MessageArgs": arg.iter().collect::<Vec<_>>()}))
        .collect();
    json!({
        "Type": "HpBios.1.2.0",
        "Name": "BIOS Current Settings",
        "Description": "This is the Platform/BIOS Configuration (RBSU) Current Settings",
        "AttributeRegistry": REGISTRY,
        "BootMode": bios_mode(s.boot_mode_current),
        "UefiOptimizedBoot": optimized(s.boot_mode_current),
        "CustomPostMessage": "",
        "SettingsResult": {"Messages": messages},
        "links": {
            "self": {"href": BIOS},
            "Settings": {"href": SETTINGS},
            "Boot": {"href": BOOT},
        },
    })
}

/// `GET /rest/v1/systems/1/bios/Settings`: what the next boot applies.
pub(super) fn pending_json(s: &ServerState) -> Value {
    json!({
        "Type": "HpBios.1.2.0",
        "Name": "BIOS Pending Settings",
        "AttributeRegistry": REGISTRY,
        "BootMode": bios_mode(s.boot_mode_pending),
        "UefiOptimizedBoot": optimized(s.boot_mode_pending),
        "CustomPostMessage": "",
        "links": {"self": {"href": SETTINGS}},
    })
}

/// `GET /rest/v1/systems/1/bios/Boot`: the UEFI boot sources and the persistent order, each
/// named by its structured string. Boot strings are iLO 4's (the ones RIBCL lists; proliantutils
/// maps them back by substring: "HP iLO Virtual USB CD", "NIC"/"PXE", "Logical Drive").
pub(super) fn boot_json(s: &ServerState) -> Value {
    let entries = |d: crate::state::BootDevice| {
        structured_boot_strings(d)
            .iter()
            .zip(d.uefi_options())
            .map(|(structured, (_, text))| {
                // RIBCL wraps the long descriptions over lines; JSON carries them on one.
                let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
                (*structured, text)
            })
            .collect::<Vec<_>>()
    };
    let sources: Vec<Value> = DEFAULT_BOOT_ORDER
        .iter()
        .flat_map(|d| entries(*d))
        .map(|(structured, text)| json!({"StructuredBootString": structured, "BootString": text}))
        .collect();
    let order: Vec<&str> = s
        .persistent_boot
        .iter()
        .flat_map(|d| structured_boot_strings(*d).iter().copied())
        .collect();
    json!({
        "Type": "HpServerBootSettings.1.2.0",
        "Name": "Boot Order Current Settings",
        "AttributeRegistry": REGISTRY,
        "BootSources": sources,
        "PersistentBootConfigOrder": order,
        "DefaultBootOrder": ["Floppy", "Cd", "Usb", "EmbeddedStorage", "PcieSlotStorage", "EmbeddedFlexLOM", "PcieSlotNic", "UefiShell"],
        "links": {"self": {"href": BOOT}},
    })
}

/// `Systems/1/bios/...`; `rest` is the path after `bios`.
pub(super) async fn handle(call: &Call<'_>, rest: &[&str]) -> Reply {
    let server = call.server;
    match (&call.req.method, rest) {
        (&Method::GET | &Method::HEAD, []) => {
            let v = server.read(current_json).await;
            json_reply(StatusCode::OK, &v, Some(ALLOW_BIOS))
        }
        (_, []) => call.not_allowed(ALLOW_BIOS),
        (&Method::GET | &Method::HEAD, ["settings"]) => {
            let v = server.read(pending_json).await;
            json_reply(StatusCode::OK, &v, Some(ALLOW_SETTINGS))
        }
        (&Method::PATCH | &Method::PUT, ["settings"]) => match call.json_body() {
            Some(body) => patch_settings(call, &body).await,
            None => call.malformed(),
        },
        (_, ["settings"]) => call.not_allowed(ALLOW_SETTINGS),
        (&Method::GET | &Method::HEAD, ["boot"]) => {
            let v = server.read(boot_json).await;
            json_reply(StatusCode::OK, &v, Some(ALLOW_BOOT))
        }
        (_, ["boot"]) => call.not_allowed(ALLOW_BOOT),
        _ => call.not_found(),
    }
}

/// Reads the boot mode a settings PATCH asks for. proliantutils writes `uefi` in lower case
/// (it upper-cases only the legacy name), so the value is matched without case [guess that
/// iLO 4 takes it].
fn parse_mode(v: &Value) -> Option<BootMode> {
    let s = v.as_str()?;
    if s.eq_ignore_ascii_case("uefi") {
        Some(BootMode::Uefi)
    } else if s.eq_ignore_ascii_case("legacybios") {
        Some(BootMode::Legacy)
    } else {
        None
    }
}

/// A PATCH of the pending settings. Every name is checked before anything changes: an unknown
/// one is 400 `PropertyUnknown`, a read-only one 400 `PropertyNotWritable` [guess: a real
/// iLO 4 may take the PATCH and report these in `SettingsResult` after the reboot].
async fn patch_settings(call: &Call<'_>, body: &Map<String, Value>) -> Reply {
    for (key, value) in body {
        if READ_ONLY.contains(&key.as_str()) {
            return call.error(
                StatusCode::BAD_REQUEST,
                &call.base_id("PropertyNotWritable"),
                &[key],
            );
        }
        if !WRITABLE.contains(&key.as_str()) {
            return call.error(
                StatusCode::BAD_REQUEST,
                &call.base_id("PropertyUnknown"),
                &[key],
            );
        }
        let valid = match key.as_str() {
            "BootMode" => parse_mode(value).is_some(),
            "UefiOptimizedBoot" => matches!(value.as_str(), Some("Enabled" | "Disabled")),
            _ => value.is_string(),
        };
        if !valid {
            let shown = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned);
            return call.error(
                StatusCode::BAD_REQUEST,
                &call.base_id("PropertyValueNotInList"),
                &[&shown, key],
            );
        }
    }
    if let Some(mode) = body.get("BootMode").and_then(parse_mode) {
        if let Err(e) = call.server.set_pending_boot_mode(mode).await {
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
    fn boot_mode_is_current_and_pending_with_the_patch_on_settings() {
        let rt = runtime();
        let s = gen9();
        let (status, v) = rt.block_on(call(&s, &request(Method::GET, BIOS, None)));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(v["BootMode"], "LegacyBios");
        assert!(v.get("Attributes").is_none());
        assert_eq!(v["links"]["Settings"]["href"], SETTINGS);
        // The current settings take no PATCH.
        let (status, _) = rt.block_on(call(
            &s,
            &request(Method::PATCH, BIOS, Some(json!({"BootMode": "Uefi"}))),
        ));
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        let (status, body) = rt.block_on(call(
            &s,
            &request(
                Method::PATCH,
                SETTINGS,
                Some(json!({"BootMode": "uefi", "UefiOptimizedBoot": "Enabled"})),
            ),
        ));
        assert_eq!(status, StatusCode::OK, "{body}");
        let (_, pending) = rt.block_on(call(&s, &request(Method::GET, SETTINGS, None)));
        assert_eq!(pending["BootMode"], "Uefi");
        let (_, current) = rt.block_on(call(&s, &request(Method::GET, BIOS, None)));
        assert_eq!(current["BootMode"], "LegacyBios");
        // The next boot applies it and says so in RIS's colon form.
        rt.block_on(s.power_on()).expect("power on");
        let (_, current) = rt.block_on(call(&s, &request(Method::GET, BIOS, None)));
        assert_eq!(current["BootMode"], "Uefi");
        assert_eq!(
            current["SettingsResult"]["Messages"][0]["MessageID"],
            "Base.1.0:Success"
        );
        for (body, id) in [
            (
                json!({"BootMode": "Bios"}),
                "Base.0.10.PropertyValueNotInList",
            ),
            (json!({"NoSuchThing": "x"}), "Base.0.10.PropertyUnknown"),
            (
                json!({"AttributeRegistry": "x"}),
                "Base.0.10.PropertyNotWritable",
            ),
        ] {
            let (status, reply) = rt.block_on(call(
                &s,
                &request(Method::PATCH, SETTINGS, Some(body.clone())),
            ));
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(ids(&reply), [id]);
        }
    }

    #[test]
    fn the_boot_resource_names_sources_as_proliantutils_maps_them() {
        let rt = runtime();
        let s = gen9();
        let (_, v) = rt.block_on(call(&s, &request(Method::GET, BOOT, None)));
        let sources = v["BootSources"].as_array().expect("sources");
        let cd = sources
            .iter()
            .find(|x| x["StructuredBootString"] == "CD.Virtual.2.1")
            .expect("the CD");
        assert!(cd["BootString"]
            .as_str()
            .is_some_and(|t| t.contains("HP iLO Virtual USB CD")));
        assert!(sources
            .iter()
            .all(|x| !x["BootString"].as_str().unwrap_or("\n").contains('\n')));
        assert_eq!(v["PersistentBootConfigOrder"][0], "CD.Virtual.2.1");
        assert_eq!(
            colon_id("Base.1.0.PropertyNotWritable"),
            "Base.1.0:PropertyNotWritable"
        );
    }
}
