//! `Managers/1`: the iLO itself and its licence service (the virtual media are
//! [`super::virtual_media`]).

use http::{Method, StatusCode};
use serde_json::json;

use super::{collection, json_reply, no_content, unrouted, MANAGER, SYSTEM};
use crate::http::Reply;
use crate::profile::Quirk;
use crate::server::Server;
use crate::state::License;

fn licence_name(licence: License) -> &'static str {
    match licence {
        License::Advanced => "iLO Advanced",
        License::Standard => "iLO Standard",
    }
}

/// `Managers/...`; `rest` is the path after `managers`.
pub(super) async fn handle(
    server: &Server,
    method: &Method,
    rest: &[&str],
    raw_path: &str,
) -> Reply {
    match (method, rest) {
        (&Method::GET, []) => json_reply(
            StatusCode::OK,
            &collection("/redfish/v1/Managers/", "Manager", &[MANAGER]),
        ),
        (&Method::GET, ["1"]) => {
            let identity = &server.config.profile.identity;
            let (major, minor) = identity
                .firmware
                .split_once('.')
                .unwrap_or((identity.firmware, "0"));
            let licence = server.read(|s| s.license).await;
            let mut manager = json!({"@odata.id": MANAGER, "@odata.type": "#Manager.v1_5_1.Manager", "Id": "1", "Name": "Manager",
                    "ManagerType": "BMC", "FirmwareVersion": identity.firmware_version(), "Model": identity.generation.model(),
                    "VirtualMedia": {"@odata.id": "/redfish/v1/Managers/1/VirtualMedia/"},
                    "Links": {"ManagerForServers": [{"@odata.id": SYSTEM}]},
                    "Oem": {"Hpe": {
                        "RIBCLEnabled": !server.quirk(Quirk::RibclDisabled),
                        "Firmware": {"Current": {
                            "MajorVersion": major.parse::<u32>().unwrap_or(0),
                            "MinorVersion": minor.parse::<u32>().unwrap_or(0),
                            "VersionString": identity.firmware_version(),
                            "Date": identity.firmware_date,
                        }},
                        "License": {"LicenseString": licence_name(licence), "LicenseType": "Perpetual",
                            "LicenseKey": "XXXXX-XXXXX-XXXXX-XXXXX-XXXXX"},
                        "Links": {"LicenseService": {"@odata.id": "/redfish/v1/Managers/1/LicenseService/"}}}}});
            if !server.quirk(Quirk::ManagerNoPowerState) {
                // The iLO's own power, always on while it answers; iLO 6 1.70 leaves it out.
                manager["PowerState"] = json!("On");
            }
            json_reply(StatusCode::OK, &manager)
        }
        (&Method::GET, ["1", "licenseservice"]) => json_reply(
            StatusCode::OK,
            &collection(
                "/redfish/v1/Managers/1/LicenseService/",
                "HpeiLOLicense",
                &["/redfish/v1/Managers/1/LicenseService/1/"],
            ),
        ),
        (&Method::GET, ["1", "licenseservice", "1"]) => {
            let lic = server.read(|s| s.license).await;
            let name = licence_name(lic);
            json_reply(
                StatusCode::OK,
                &json!({"@odata.id": "/redfish/v1/Managers/1/LicenseService/1/", "Id": "1", "Name": "iLO License",
                    "License": name, "LicenseType": "Perpetual", "LicenseKey": "XXXXX-XXXXX-XXXXX-XXXXX-XXXXX"}),
            )
        }
        (&Method::POST, ["1", "licenseservice"]) => {
            server.activate_license().await;
            no_content()
        }
        _ => unrouted(method, raw_path),
    }
}
