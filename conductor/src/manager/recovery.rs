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
//!
//! Takeover ([`take_over`]) does the same for the nodes a dead conductor held (several
//! conductors on one database): each survivor takes the reservations of the dead conductor on
//! the nodes it now owns and fails those tasks with a `last_error` that names the lost
//! conductor. Nothing is resumed: a write cut short on another host left the disk in an
//! unknown state, and the safe next step (deploy again) is the operator's. Nodes that were only
//! waiting (`wait call-back`, `clean wait`) held no reservation and keep waiting for their
//! ramdisk, whose next call reaches the new owner.

use std::sync::Arc;

use tracing::Instrument;

use super::provision::{fail_clean, fail_deploy};
use super::tasks::{self, apply};
use super::{Core, ManagerError};
use crate::cluster::ClusterView;
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
        recover_node(core, node, "conductor restarted")
            .instrument(span)
            .await;
        reservation.release().await;
    }
    Ok(())
}

/// The conductor a reservation's holder (`<conductor_name>:<task uuid>`) belongs to.
fn holder_conductor(holder: &str) -> &str {
    holder.rsplit_once(':').map_or(holder, |(name, _)| name)
}

/// Takes over the nodes the `dead` conductors held a task on and that this conductor now owns
/// in `view` (module docs); errors only when the store cannot be read.
pub(crate) async fn take_over(
    core: &Arc<Core>,
    view: &ClusterView,
    dead: &std::collections::BTreeSet<String>,
) -> Result<(), ManagerError> {
    let me = &core.config.conductor_name;
    let mut taken = 0usize;
    for listed in core.store().list_nodes(&NodeFilter::default()).await? {
        let Some(holder) = listed.reservation.as_deref() else {
            continue;
        };
        let lost = holder_conductor(holder);
        if !dead.contains(lost) || !view.is_mine(&listed.conductor_group, listed.uuid) {
            continue;
        }
        // Only this exact holder's lock is released: had the node changed hands meanwhile,
        // the release does nothing and the reservation below fails.
        core.store().release_node(listed.uuid, holder).await?;
        let Ok((node, reservation)) = tasks::reserve_uuid(core, listed.uuid).await else {
            continue;
        };
        taken += 1;
        let span = tracing::info_span!("takeover", node = %node.uuid, lost = %lost);
        let cause = format!(
            "conductor {lost} stopped heartbeating (its task was cut short) and conductor {me} \
             took the node over"
        );
        if is_interrupted(node.provision_state) || node.target_power_state.is_some() {
            recover_node(core, node, &cause).instrument(span).await;
        } else {
            span.in_scope(|| tracing::info!("released the lock of a dead conductor"));
        }
        reservation.release().await;
    }
    tracing::warn!(dead = ?dead, nodes = taken, "took over the nodes of conductors that stopped heartbeating");
    Ok(())
}

/// Fails one interrupted node; `cause` says what cut its task short.
async fn recover_node(core: &Core, mut node: Node, cause: &str) {
    let state = node.provision_state;
    let mut message = format!("{cause} while the node was {state}; {}", advice(state));
    let power_target = node.target_power_state.take();
    if let (Some(target), false) = (power_target, is_interrupted(state)) {
        message = format!(
            "{cause} while changing the power state to \"{target}\"; \
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
