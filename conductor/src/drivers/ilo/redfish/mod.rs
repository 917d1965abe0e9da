//! Redfish for iLO 5/6 and other Redfish BMCs (docs/ilo-management.md §3).
//!
//! Same files as `ribcl`: `client` moves requests (sessions, redirects, discovery), `codec`
//! reads resources, `power` and `management` map the driver interfaces, `error` maps HTTP
//! error replies.

pub mod client;
pub mod codec;
pub mod error;
pub mod management;
pub mod power;

pub use client::RedfishClient;
