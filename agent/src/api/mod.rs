//! The agent_ilo protocol: lookup and heartbeats to the conductor, and the command API the
//! conductor calls back on (../shared/reference/ironic-protocols.md §3).
//!
//! # Design
//! [`wire`] holds the JSON bodies, [`client`] the calls to the conductor, [`server`] the
//! `/v1/commands` API, [`standby`] the `standby.*` commands that write the image with
//! [`crate::stream`].
//!
//! # Limitations
//! Not wired into `/init` yet (no PID-1 duties this session); `standby.prepare_image` writes
//! whole-disk images only.

pub mod agent_mode;
pub mod client;
pub mod server;
pub mod standby;
pub mod wire;
