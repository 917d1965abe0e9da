//! The `agent_ilo` flow: lookup, heartbeats with progress, and the command API until the
//! conductor powers the node off.
//!
//! SKELETON (session 2): the signatures are fixed; the body is being built.

use std::net::{IpAddr, SocketAddr};

use vmdeploy_shared::params::{AgentParams, MacAddr};

use crate::init::FinalAction;

/// Everything the agent flow needs from `/init`.
#[derive(Debug, Clone)]
pub struct AgentModeConfig {
    /// Parameters from the floppy / command line.
    pub params: AgentParams,
    /// The address the conductor reaches this agent at (host of `callback_url`).
    pub advertise: IpAddr,
    /// Where `/v1/commands` listens (0.0.0.0:9999 in the ramdisk; loopback in tests).
    pub listen: SocketAddr,
    /// MAC addresses for the lookup.
    pub mac_addresses: Vec<MacAddr>,
}

/// Runs the agent flow; returns what to do with the machine when the conductor is done.
pub fn run(cfg: AgentModeConfig) -> anyhow::Result<FinalAction> {
    let _ = cfg;
    anyhow::bail!("agent mode is not built yet")
}
