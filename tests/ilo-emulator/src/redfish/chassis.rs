//! `Chassis/1`: the enclosure, its Thermal and Power resources (the same sensors as RIBCL's
//! GET_EMBEDDED_HEALTH).

use http::{Method, StatusCode};
use serde_json::{json, Value};

use super::{collection, json_reply, unrouted};
use crate::http::Reply;
use crate::server::Server;
use crate::state::Power;

/// `Chassis/...`; `rest` is the path after `chassis`.
pub(super) async fn handle(
    server: &Server,
    method: &Method,
    rest: &[&str],
    raw_path: &str,
) -> Reply {
    match (method, rest) {
        (&Method::GET, []) => json_reply(
            StatusCode::OK,
            &collection(
                "/redfish/v1/Chassis/",
                "Chassis",
                &["/redfish/v1/Chassis/1/"],
            ),
        ),
        (&Method::GET, ["1"]) => json_reply(
            StatusCode::OK,
            &json!({"@odata.id": "/redfish/v1/Chassis/1/", "Id": "1", "Name": "Computer System Chassis",
                "ChassisType": "RackMount", "Manufacturer": "HPE", "Model": server.config.product,
                "SerialNumber": server.serial,
                "Thermal": {"@odata.id": "/redfish/v1/Chassis/1/Thermal/"},
                "Power": {"@odata.id": "/redfish/v1/Chassis/1/Power/"}}),
        ),
        (&Method::GET, ["1", "thermal"]) => json_reply(StatusCode::OK, &thermal()),
        (&Method::GET, ["1", "power"]) => {
            let on = server.read(|s| s.power == Power::On).await;
            json_reply(StatusCode::OK, &power_readings(on))
        }
        _ => unrouted(method, raw_path),
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
