//! RIBCL over HTTPS: the XML protocol of iLO 2-4 (and iLO 5 while it is enabled).
//!
//! `codec` is the wire format, `client` moves it, `power` and `management` map the driver
//! interfaces to commands, `error` maps RESPONSE statuses (docs/ilo-management.md §1).

pub mod client;
pub mod codec;
pub mod error;
pub mod management;
pub mod power;

pub use client::RibclClient;
pub use error::RibclParseError;
