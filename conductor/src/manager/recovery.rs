//! Start-up recovery: what a stopped conductor left behind (docs/architecture.md §8).
//!
//! # Design
//! First every reservation this conductor's previous run held is released (holders are
//! `<conductor_name>:<task>`). Then each unreserved node found in a state where a task was
//! running moves to that state's failure state with a `last_error` that says what happened and
//! what to do, after the flow's clean-up where media may be left inserted. A node in
//! `wait call-back` had no task running: it keeps waiting, so its agent's next heartbeat
//! resumes the deploy (or the callback timeout fails it). A power change cut short loses its
//! `target_power_state`.

use std::sync::Arc;

use tracing::Instrument;

use super::provision::{fail_clean, fail_deploy};
use super::tasks::{self, apply};
use super::{Core, ManagerError};
use crate::states::{Event, ProvisionState};
use crate::store::{Node, NodeFilter};

/// What an operator should do after a restart cut a task short in `state`.
fn advice(state: ProvisionState) -> &'static str {
    match state {
        ProvisionState::Deploying => "deploy it again, or undeploy it",
        ProvisionState::Deleting => "undeploy it again",
        ProvisionState::Cleaning => "manage and provide it again",
        ProvisionState::Verifying => "manage it again",
        _ => "check the node and retry",
    }
}

/// States in which a task of this conductor was running.
fn is_interrupted(state: ProvisionState) -> bool {
    matches!(
        state,
        ProvisionState::Deploying
            | ProvisionState::Deleting
            | ProvisionState::Cleaning
            | ProvisionState::Verifying
    )
}

/// Runs recovery once; errors only when the store cannot be read.
pub(crate) async fn recover(core: &Arc<Core>) -> Result<(), ManagerError> {
    let released = core
        .store()
        .release_all(&tasks::holder_prefix(core))
        .await?;
    if !released.is_empty() {
        tracing::warn!(
            count = released.len(),
            "released reservations a previous run of this conductor held"
        );
    }
    for listed in core.store().list_nodes(&NodeFilter::default()).await? {
        if listed.reservation.is_some() {
            // Held by another conductor, which is alive and owns the node's task.
            continue;
        }
        if !is_interrupted(listed.provision_state) && listed.target_power_state.is_none() {
            if listed.provision_state == ProvisionState::WaitCallBack {
                tracing::info!(node = %listed.uuid, "still waiting for its ramdisk: a heartbeat resumes the deploy");
            }
            continue;
        }
        let Ok((node, reservation)) = tasks::reserve_uuid(core, listed.uuid).await else {
            continue;
        };
        let span = tracing::info_span!("recovery", node = %node.uuid);
        recover_node(core, node).instrument(span).await;
        reservation.release().await;
    }
    Ok(())
}

/// Fails one interrupted node.
async fn recover_node(core: &Core, mut node: Node) {
    let state = node.provision_state;
    let mut message = format!(
        "conductor restarted while the node was {state}; {}",
        advice(state)
    );
    let power_target = node.target_power_state.take();
    if let (Some(target), false) = (power_target, is_interrupted(state)) {
        message = format!(
            "conductor restarted while changing the power state to \"{target}\"; \
             the power state may not have changed"
        );
    }
    tracing::warn!("{message}");
    match state {
        ProvisionState::Deploying => {
            let flow = core.flow_for(&node);
            fail_deploy(core, &mut node, flow.as_ref(), message).await;
        }
        ProvisionState::Deleting => {
            apply(&mut node, Event::Fail);
            node.last_error = Some(message);
            let flow = core.flow_for(&node);
            if let Some(flow) = flow {
                flow.clean_up(&mut node).await;
            }
            if let Err(err) = core.store().update_node(&node).await {
                tasks::log_store_error(&err, "the interrupted tear-down");
            }
        }
        // Cleaning may have left the agent ramdisk booted from virtual media: cleaned up and
        // powered off as after any failed cleaning.
        ProvisionState::Cleaning => {
            let flow = core.flow_for(&node);
            fail_clean(core, &mut node, flow.as_ref(), message).await;
        }
        ProvisionState::Verifying => {
            apply(&mut node, Event::Fail);
            node.last_error = Some(message);
            if let Err(err) = core.store().update_node(&node).await {
                tasks::log_store_error(&err, "the interrupted task");
            }
        }
        _ => {
            // Only the power target was left: clear it and say why.
            node.last_error = Some(message);
            if let Err(err) = core.store().update_node(&node).await {
                tasks::log_store_error(&err, "the interrupted power change");
            }
        }
    }
}
