//! Typed views of a node's fields: its driver as a composition of interfaces
//! (`hardware_type`), `driver_info` (BMC address and credentials, deploy ISO), `instance_info`
//! (image, sizes, capabilities), `properties.capabilities`, and the image references both name. Parsing and validation live here,
//! above the BMC clients and the flows, so they happen once.

pub mod capabilities;
pub mod driver_info;
pub mod hardware_type;
pub mod image_ref;
pub mod instance_info;
