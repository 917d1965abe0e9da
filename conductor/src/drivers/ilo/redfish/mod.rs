//! Redfish for iLO 5/6 and other Redfish BMCs (docs/ilo-management.md §3).
//!
//! Same files as `ribcl`: `client` moves requests (sessions, redirects, discovery), `codec`
//! reads resources, `power` and `management` map the driver interfaces, `error` maps HTTP
//! error replies with the rules of `refusals` (one table of iLO refusals and what the client
//! does about each); `sessions` is the conductor's cache of sessions, one per BMC.

pub mod client;
pub mod codec;
pub mod error;
pub mod management;
pub mod power;
pub mod refusals;
pub mod sessions;

pub use client::RedfishClient;
pub use sessions::RedfishSessions;
