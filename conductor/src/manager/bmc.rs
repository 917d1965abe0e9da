//! The manager's only way to a node's BMC: one function that turns a node's `driver_info` into
//! a connected client, with failures in operator words.
//!
//! # Design
//! Kept in one place on purpose: the drivers are being split (power, management, virtual
//! media, inventory) and `driver_info` parsing moves to `crate::node`; only this file changes
//! when they do.

use serde_json::Value;

use super::Core;
use super::ManagerError;
use crate::drivers::ilo::{IloClient, IloConfig};
use crate::drivers::{DriverError, DriverErrorKind, Power, PowerAction, PowerState};
use crate::node::driver_info::IloDriverInfo;
use crate::states::NodePower;
use crate::store::Node;

/// The node's BMC settings, or why `driver_info` does not give them (400 for the API).
pub(crate) fn config(core: &Core, node: &Node) -> Result<IloConfig, ManagerError> {
    IloDriverInfo::parse(&node.driver_info, &core.deploy.config.ilo_defaults)
        .map(|info| info.config)
        .map_err(|err| {
            ManagerError::Invalid(format!(
                "node {}: driver_info is incomplete or invalid: {err}",
                node.uuid
            ))
        })
}

/// A client for the node's BMC.
pub(crate) async fn connect(core: &Core, node: &Node) -> Result<IloClient, ManagerError> {
    let config = config(core, node)?;
    IloClient::connect(&config)
        .await
        .map_err(|err| ManagerError::Failed(format!("iLO {}: {}", config.address, describe(&err))))
}

/// Reads the host power through a fresh client.
pub(crate) async fn read_power(core: &Core, node: &Node) -> Result<NodePower, ManagerError> {
    let client = connect(core, node).await?;
    client
        .power_state()
        .await
        .map(node_power)
        .map_err(|err| failed(node, &err))
}

/// Powers the node off (Ironic's power-off: hold the button), for failure paths.
pub(crate) async fn power_off(core: &Core, node: &Node) -> Result<(), ManagerError> {
    let client = connect(core, node).await?;
    if client.power_state().await.map_err(|e| failed(node, &e))? == PowerState::Off {
        return Ok(());
    }
    client
        .set_power(PowerAction::HoldButton)
        .await
        .map(|_| ())
        .map_err(|err| failed(node, &err))
}

/// The API's power state for the BMC's.
pub(crate) fn node_power(state: PowerState) -> NodePower {
    match state {
        PowerState::On => NodePower::On,
        PowerState::Off => NodePower::Off,
    }
}

/// A driver error on this node's BMC as a [`ManagerError::Failed`].
pub(crate) fn failed(node: &Node, err: &DriverError) -> ManagerError {
    let address = node
        .driver_info
        .get("ilo_address")
        .and_then(Value::as_str)
        .unwrap_or("(no ilo_address)");
    ManagerError::Failed(format!("iLO {address}: {}", describe(err)))
}

/// A driver error in words an operator can act on.
pub(crate) fn describe(err: &DriverError) -> String {
    match (err.kind(), err) {
        (_, DriverError::LoginFailed { .. }) => format!(
            "{err}; check ilo_username and ilo_password in the node's driver_info"
        ),
        (_, DriverError::Connection { .. } | DriverError::Timeout { .. }) => format!(
            "{err}; check ilo_address and client_port in driver_info and that the iLO is reachable from the conductor"
        ),
        (_, DriverError::Tls { .. }) => format!(
            "{err}; set ilo_verify_ca in driver_info to the iLO's CA file (or false to skip the check)"
        ),
        (DriverErrorKind::NotLicensed, _) => format!(
            "{err}; install an iLO Advanced licence on the node's iLO"
        ),
        _ => err.to_string(),
    }
}
