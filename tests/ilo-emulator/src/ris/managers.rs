//! `Managers/1`: the iLO (`Type` `Manager`, firmware under `Firmware` and `Oem.Hp.Firmware`,
//! the licence under `Oem.Hp.License`) and its licence service. The virtual media are
//! [`super::virtual_media`].

use http::{Method, StatusCode};
use serde_json::{json, Value};

use super::{collection, json_reply, Call};
use crate::http::Reply;
use crate::server::Server;
use crate::state::License;

const MANAGER: &str = "/rest/v1/Managers/1";
const LICENSES: &str = "/rest/v1/Managers/1/LicenseService";
const LICENSE: &str = "/rest/v1/Managers/1/LicenseService/1";

/// "iLO 4 Advanced", as iLO 4 names its licences (proliantutils' RIS manager sample).
fn licence_name(server: &Server, licence: License) -> String {
    let model = server.config.profile.identity.generation.model();
    match licence {
        License::Advanced => format!("{model} Advanced"),
        License::Standard => format!("{model} Standard"),
    }
}

/// `GET /rest/v1/Managers/1`.
pub(super) fn manager_json(server: &Server, licence: License) -> Value {
    let identity = &server.config.profile.identity;
    let (major, minor) = identity
        .firmware
        .split_once('.')
        .unwrap_or((identity.firmware, "0"));
    json!({
        "Type": "Manager.1.0.0",
        "Name": "Manager",
        "Description": "Manager View",
        "ManagerType": "BMC",
        "Model": identity.generation.model(),
        "UUID": server.uuid,
        "Status": {"State": "Enabled"},
        "Firmware": {"Current": {"VersionString": identity.firmware_version()}},
        "AvailableActions": [{"Action": "Reset"}],
        "Oem": {"Hp": {
            "Type": "HpiLO.1.0.0",
            "Firmware": {"Current": {
                "Date": identity.firmware_date,
                "DebugBuild": false,
                "MajorVersion": major.parse::<u32>().unwrap_or(0),
                "MinorVersion": minor.parse::<u32>().unwrap_or(0),
                "VersionString": identity.firmware_version(),
            }},
            "License": {
                "LicenseString": licence_name(server, licence),
                "LicenseType": "Perpetual",
                "LicenseKey": "XXXXX-XXXXX-XXXXX-XXXXX-XXXXX",
            },
            "links": {"LicenseService": {"href": LICENSES}},
        }},
        "links": {
            "self": {"href": MANAGER},
            "ManagerForServers": [{"href": "/rest/v1/Systems/1"}],
            "VirtualMedia": {"href": "/rest/v1/Managers/1/VirtualMedia"},
        },
    })
}

/// `Managers/...`; `rest` is the path after `managers`.
pub(super) async fn handle(call: &Call<'_>, rest: &[&str]) -> Reply {
    let server = call.server;
    match (&call.req.method, rest) {
        (&Method::GET | &Method::HEAD, []) => json_reply(
            StatusCode::OK,
            &collection("/rest/v1/Managers", "Managers", "Manager.1", &[MANAGER]),
            Some("GET, HEAD"),
        ),
        (&Method::GET | &Method::HEAD, ["1"]) => {
            let licence = server.read(|s| s.license).await;
            json_reply(
                StatusCode::OK,
                &manager_json(server, licence),
                Some("GET, HEAD"),
            )
        }
        (_, ["1"]) => call.not_allowed("GET, HEAD"),
        (&Method::GET | &Method::HEAD, ["1", "licenseservice"]) => json_reply(
            StatusCode::OK,
            &collection(LICENSES, "Licenses", "HpiLOLicense.1", &[LICENSE]),
            Some("GET, HEAD, POST"),
        ),
        (&Method::POST, ["1", "licenseservice"]) => {
            let Some(body) = call.json_body() else {
                return call.malformed();
            };
            // Any key makes the emulated iLO Advanced; an empty one is refused [guess at the id].
            match body.get("LicenseKey").and_then(Value::as_str) {
                Some(key) if !key.trim().is_empty() => {
                    server.activate_license().await;
                    call.success()
                }
                _ => call.error(
                    StatusCode::BAD_REQUEST,
                    &call.ilo_id("InvalidLicenseKey"),
                    &[],
                ),
            }
        }
        (_, ["1", "licenseservice"]) => call.not_allowed("GET, HEAD, POST"),
        (&Method::GET | &Method::HEAD, ["1", "licenseservice", "1"]) => {
            let licence = server.read(|s| s.license).await;
            json_reply(
                StatusCode::OK,
                &json!({"Type": "HpiLOLicense.1.0.0", "Name": "iLO License",
                    "LicenseString": licence_name(server, licence), "LicenseType": "Perpetual",
                    "LicenseKey": "XXXXX-XXXXX-XXXXX-XXXXX-XXXXX",
                    "links": {"self": {"href": LICENSE}}}),
                Some("GET, HEAD"),
            )
        }
        _ => call.not_found(),
    }
}

#[cfg(test)]
mod tests {
    use http::Method;
    use serde_json::json;

    use super::super::tests::{call, gen9, request, runtime};
    use super::*;

    #[test]
    fn the_manager_reports_firmware_and_licence_and_a_key_activates() {
        let rt = runtime();
        let s = gen9();
        rt.block_on(s.update(|st| st.license = License::Standard));
        let (status, v) = rt.block_on(call(&s, &request(Method::GET, MANAGER, None)));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(v["Type"], "Manager.1.0.0");
        assert_eq!(
            v["Oem"]["Hp"]["Firmware"]["Current"]["VersionString"],
            "iLO 4 v2.70"
        );
        assert_eq!(v["Oem"]["Hp"]["License"]["LicenseString"], "iLO 4 Standard");
        assert_eq!(
            v["links"]["VirtualMedia"]["href"],
            "/rest/v1/Managers/1/VirtualMedia"
        );
        let (status, _) = rt.block_on(call(
            &s,
            &request(Method::POST, LICENSES, Some(json!({"LicenseKey": ""}))),
        ));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _) = rt.block_on(call(
            &s,
            &request(
                Method::POST,
                LICENSES,
                Some(json!({"LicenseKey": "ABCDE-FGHIJ-KLMNO-PQRST-UVWXY"})),
            ),
        ));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(rt.block_on(s.read(|st| st.license)), License::Advanced);
    }
}
