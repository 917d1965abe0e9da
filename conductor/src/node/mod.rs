//! Typed views of a node's fields: its driver as a composition of interfaces
//! (`hardware_type`), `driver_info` (BMC address and credentials, deploy ISO), `instance_info`
//! (image, sizes, capabilities), `properties.capabilities`, and the image references both name. Parsing and validation live here,
//! above the BMC clients and the flows, so they happen once.

pub mod capabilities;
pub mod driver_info;
pub mod hardware_type;
pub mod image_ref;
pub mod instance_info;

use serde_json::Value;

/// The JSON type of a value, for messages (never the value: it may be a secret).
pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
