//! `Managers/1`: the iLO itself and its licence service (the virtual media are
//! [`super::virtual_media`]).

use http::{Method, StatusCode};
use serde_json::json;

use super::{collection, json_reply, no_content, unrouted, MANAGER, SYSTEM};
use crate::http::Reply;
use crate::server::Server;

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
        (&Method::GET, ["1"]) => json_reply(
            StatusCode::OK,
            &json!({"@odata.id": MANAGER, "@odata.type": "#Manager.v1_5_1.Manager", "Id": "1", "Name": "Manager",
                "ManagerType": "BMC", "FirmwareVersion": "iLO 5 v2.72", "Model": "iLO 5",
                "VirtualMedia": {"@odata.id": "/redfish/v1/Managers/1/VirtualMedia/"},
                "Links": {"ManagerForServers": [{"@odata.id": SYSTEM}]},
                "Oem": {"Hpe": {"Links": {"LicenseService": {"@odata.id": "/redfish/v1/Managers/1/LicenseService/"}}}}}),
        ),
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
        (&Method::POST, ["1", "licenseservice"]) => {
            server.activate_license().await;
            no_content()
        }
        _ => unrouted(method, raw_path),
    }
}
