//! The agent_ilo protocol: lookup and heartbeats to the conductor, and the command API the
//! conductor calls back on (docs/ironic-protocols.md §3).
//!
//! # Design
//! The JSON bodies live in `vmdeploy_shared::api::ipa` (both ends use them). [`client`] makes the
//! calls to the conductor, [`heartbeat`] decides when and with what progress, [`server`] is the
//! `/v1/commands` API (its connections capped by [`admission`]; over HTTPS with the certificate [`tls`] generates at boot, Ironic's
//! auto-TLS), [`standby`], [`deploy`], [`iscsi`], [`clean`] and [`log`] are the extensions
//! (image write with [`crate::stream`], partition table with [`partitions`], deploy steps
//! routed to the standby and clean code, the iSCSI target with [`crate::target`], cleaning with
//! [`crate::disk::erase`], the logs bundle), and [`agent_mode`] runs the whole flow. A failed or refused command is
//! reported with an `IpaErrorKind` (`vmdeploy_shared::api::ipa`), never a spelled-out name.
//!
//! # Limitations
//! `standby.prepare_image` writes whole-disk images only.

pub mod admission;
pub mod agent_mode;
pub mod clean;
pub mod client;
pub mod deploy;
pub mod heartbeat;
pub mod image;
pub mod iscsi;
pub mod log;
pub mod partitions;
pub mod server;
pub mod standby;
pub mod tls;
