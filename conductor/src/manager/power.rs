//! `PUT /v1/nodes/{node}/states/power` with Ironic's semantics: `target_power_state` is set
//! while the task runs and cleared at its end (Nova waits for that), `power_state` is what the
//! BMC reports afterwards, a failure goes to `last_error`.
//!
//! # Design
//! The actions follow Ironic's iLO power interface: power off holds the power button, reboot
//! is a reset when on and a power-on when off, soft power off presses the button (the OS
//! shuts down on ACPI), soft reboot presses it, waits for off, then powers on. Each action
//! ends by polling the BMC until the state is reached or the timeout passes (Ironic's
//! `power_state_change_timeout`, or the request's `timeout` for the soft variants).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::tasks;
use super::{Core, ManagerError};
use crate::bmc::{Bmc, BmcError, PowerAction, PowerState};
use crate::drivers::DriverError;
use crate::states::{NodePower, ProvisionState};
use crate::store::{Node, NodeIdent};

/// How long a power change may take (Ironic's `[conductor]power_state_change_timeout`).
pub(crate) const POWER_STATE_CHANGE_TIMEOUT: Duration = Duration::from_secs(60);

/// Reserves the node, records the target and starts the power task.
pub(crate) async fn set_power_state(
    core: &Arc<Core>,
    ident: &NodeIdent,
    target: NodePower,
    timeout: Option<Duration>,
) -> Result<(), ManagerError> {
    if timeout.is_some_and(|t| t.is_zero()) {
        return Err(ManagerError::InvalidInput {
            field: "timeout",
            message: "timeout must be a positive number of seconds".into(),
        });
    }
    let (mut node, reservation) = tasks::reserve(core, ident).await?;
    // Refuse what cannot work before touching the node: a driver_info the BMC client cannot
    // use is the operator's to fix (400), not a task failure.
    if let Err(err) = Bmc::settings(&node, &core.deploy.config.ilo_defaults) {
        reservation.release().await;
        return Err(err.into());
    }
    node.target_power_state = Some(target);
    node.last_error = None;
    if let Err(err) = core.store().update_node(&node).await {
        reservation.release().await;
        return Err(err.into());
    }
    tracing::info!(node = %node.uuid, target = %target, "power change requested");
    tasks::spawn(core, reservation, "power", move |core| async move {
        run(&core, node, target, timeout).await;
    });
    Ok(())
}

/// The power task: act, wait, record.
async fn run(core: &Core, mut node: Node, target: NodePower, timeout: Option<Duration>) {
    let limit = timeout.unwrap_or(POWER_STATE_CHANGE_TIMEOUT);
    // One connection for the whole action, the read after a failure included.
    let (bmc, outcome) = match Bmc::connect(&mut node, &core.deploy.config.ilo_defaults).await {
        Ok(bmc) => {
            let outcome = match prepare_instance_boot(core, &mut node, &bmc, target).await {
                Ok(()) => change(&bmc, target, limit).await,
                Err(err) => Err(err),
            };
            (Some(bmc), outcome)
        }
        Err(err) => (None, Err(err.into())),
    };
    // Whatever happened, show the state the BMC reports now (or keep the last known one).
    node.target_power_state = None;
    match outcome {
        Ok(reached) => {
            tracing::info!(power = %reached, "power change done");
            node.power_state = Some(reached);
            node.last_error = None;
        }
        Err(err) => {
            let message = format!(
                "Failed to change the power state of node {} to \"{target}\": {}",
                node.uuid,
                err.chain()
            );
            tracing::error!("{message}");
            if let Some(bmc) = &bmc {
                if let Ok(now) = bmc.node_power().await {
                    node.power_state = Some(now);
                }
            }
            node.last_error = Some(message);
        }
    }
    if let Err(err) = core.store().update_node(&node).await {
        tasks::log_store_error(&err, "the outcome of the power change");
    }
}

/// Before a power action that boots an `active` node's instance (power on from off, reboot):
/// the deploy interface's [`DeployInterface::prepare_instance_boot`] (a netboot instance's
/// boot ISO attached again with a fresh temp URL). When it fails the power action is not
/// taken: the instance would not find what it boots from.
///
/// [`DeployInterface::prepare_instance_boot`]: crate::deploy::DeployInterface::prepare_instance_boot
async fn prepare_instance_boot(
    core: &Core,
    node: &mut Node,
    bmc: &Bmc,
    target: NodePower,
) -> Result<(), ManagerError> {
    if node.provision_state != ProvisionState::Active {
        return Ok(());
    }
    let boots = match target {
        NodePower::Off | NodePower::SoftPowerOff => false,
        NodePower::Rebooting | NodePower::SoftRebooting => true,
        // Powering on a host that is on boots nothing.
        NodePower::On => bmc.power_state().await? == PowerState::Off,
    };
    let Some(flow) = core.flow_for(node).filter(|_| boots) else {
        return Ok(());
    };
    flow.prepare_instance_boot(node).await.map_err(|e| {
        ManagerError::flow(
            "the instance's boot could not be prepared, so the node was not powered on or \
             rebooted",
            e,
        )
    })
}

/// Carries out one power request and returns the state reached.
pub(crate) async fn change(
    bmc: &Bmc,
    target: NodePower,
    limit: Duration,
) -> Result<NodePower, ManagerError> {
    let deadline = Instant::now() + limit;
    let now = bmc.power_state().await?;
    let act = |action: PowerAction| async move {
        bmc.set_power(action)
            .await
            .map_err(|e| match e.driver_error() {
                Some(DriverError::NotSupported { .. }) => ManagerError::bmc(format!(
                    "the BMC does not support \"{target}\"; use \"power off\" or \"rebooting\""
                ))(e),
                _ => e.into(),
            })
    };
    let wait = |want: PowerState| async move {
        bmc.wait_power(want, deadline, limit)
            .await
            .map_err(|e| match e {
                BmcError::PowerTimeout { .. } => ManagerError::bmc(
                    "the power state did not change in time; check the server, or retry with \
                     a longer timeout",
                )(e),
                other => other.into(),
            })
    };
    match (target, now) {
        (NodePower::On, PowerState::On)
        | (NodePower::Off | NodePower::SoftPowerOff, PowerState::Off) => {}
        (NodePower::On | NodePower::Rebooting | NodePower::SoftRebooting, PowerState::Off) => {
            act(PowerAction::On).await?;
            wait(PowerState::On).await?;
        }
        (NodePower::Off, PowerState::On) => {
            act(PowerAction::HoldButton).await?;
            wait(PowerState::Off).await?;
        }
        (NodePower::Rebooting, PowerState::On) => {
            act(PowerAction::Reset).await?;
            wait(PowerState::On).await?;
        }
        (NodePower::SoftPowerOff, PowerState::On) => {
            act(PowerAction::PressButton).await?;
            wait(PowerState::Off).await?;
        }
        (NodePower::SoftRebooting, PowerState::On) => {
            act(PowerAction::PressButton).await?;
            wait(PowerState::Off).await?;
            act(PowerAction::On).await?;
            wait(PowerState::On).await?;
        }
    }
    Ok(match target {
        NodePower::Off | NodePower::SoftPowerOff => NodePower::Off,
        NodePower::On | NodePower::Rebooting | NodePower::SoftRebooting => NodePower::On,
    })
}
