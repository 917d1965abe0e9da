//! The periodic power-state sync (Ironic's `_sync_power_states`).
//!
//! # Design
//! Every `power_sync_interval`, each node not in maintenance, not in `enroll` (its credentials
//! are unverified) and not reserved is reserved for a moment and its BMC read. A state that
//! differs from the record is recorded and logged: the BMC is the truth, and this conductor
//! does not force the recorded state back (someone changed it on purpose, or the server
//! failed; either way an operator should see it, not have it undone).
//!
//! A pass reads `sync_power_state_workers` BMCs at once (Ironic's bound): at 1,000 nodes one
//! at a time a pass outlasted its interval. A pass that does is logged; the next one waits for
//! it, so passes never pile up.

use std::sync::Arc;

use super::tasks;
use super::Core;
use crate::bmc::{Bmc, PROTOCOL_KEY};
use crate::states::ProvisionState;
use crate::store::{Node, NodeFilter, StoreError};
use vmdeploy_shared::error::Chain;

/// Runs the sync until `shutdown` turns true.
pub(crate) async fn run(core: Arc<Core>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let interval = core.config.power_sync_interval;
    let mut ticker = tokio::time::interval(interval);
    // A pass runs inside the loop, so a slow one delays the next tick: passes never overlap.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick fires at once; skip it so start-up is not a burst of BMC logins.
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                let started = tokio::time::Instant::now();
                let nodes = sync_once(&core).await;
                let took = started.elapsed();
                if took > interval {
                    tracing::warn!(
                        nodes, took_s = took.as_secs_f64(), interval_s = interval.as_secs(),
                        workers = core.config.sync_power_state_workers,
                        "power sync pass took longer than its interval; the next starts now \
                         (raise conductor.sync_power_state_workers or deploy.power_sync_interval)"
                    );
                } else {
                    tracing::debug!(nodes, took_ms = took.as_millis() as u64, "power sync pass");
                }
            }
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    return;
                }
            }
        }
    }
}

/// One pass over every node, `sync_power_state_workers` BMCs at a time; returns how many nodes
/// it read.
pub(crate) async fn sync_once(core: &Arc<Core>) -> usize {
    use futures_util::StreamExt as _;
    let filter = NodeFilter {
        maintenance: Some(false),
        ..NodeFilter::default()
    };
    let nodes = match core.store().list_nodes(&filter).await {
        Ok(nodes) => nodes,
        Err(err) => {
            tracing::error!(error = %Chain(&err), "power sync: could not list nodes");
            return 0;
        }
    };
    // Only this conductor's nodes: each conductor of the database syncs its own share.
    let view = core.cluster.view();
    let due: Vec<Node> = nodes
        .into_iter()
        .filter(|n| n.reservation.is_none() && n.provision_state != ProvisionState::Enroll)
        .filter(|n| view.is_mine(&n.conductor_group, n.uuid))
        .collect();
    let count = due.len();
    futures_util::stream::iter(due)
        .for_each_concurrent(core.config.sync_power_state_workers.max(1), |listed| {
            sync_node(core, listed)
        })
        .await;
    count
}

/// Reads one node's BMC under its reservation and records a changed state.
async fn sync_node(core: &Arc<Core>, listed: Node) {
    let (mut node, reservation) = match tasks::reserve_uuid(core, listed.uuid).await {
        Ok(reserved) => reserved,
        // Taken or deleted since the list: the next pass sees it.
        Err(super::ManagerError::Store(
            StoreError::Locked { .. } | StoreError::NotFound { .. },
        )) => return,
        Err(err) => {
            tracing::warn!(node = %listed.uuid, error = %err.chain(), "power sync: could not reserve the node");
            return;
        }
    };
    let known_protocol = node.driver_internal_info.get(PROTOCOL_KEY).cloned();
    let read = Bmc::read_power(&mut node, &core.deploy.config.ilo_defaults).await;
    let learned = node.driver_internal_info.get(PROTOCOL_KEY) != known_protocol.as_ref();
    match read {
        Ok(power) if node.power_state != Some(power) => {
            tracing::warn!(
                node = %node.uuid,
                recorded = node.power_state.map(|p| p.as_str()).unwrap_or("unknown"),
                actual = %power,
                "power state changed outside the conductor; recording the BMC's state"
            );
            node.power_state = Some(power);
            if let Err(err) = core.store().update_node(&node).await {
                tasks::log_store_error(&err, "the synced power state");
            }
        }
        Ok(_) => {
            // The protocol an `auto` probe chose, kept so the next pass does not ask again.
            if learned {
                if let Err(err) = core.store().update_node(&node).await {
                    tasks::log_store_error(&err, "the BMC protocol chosen");
                }
            }
        }
        Err(err) => {
            tracing::warn!(node = %node.uuid, error = %Chain(&err), "power sync: could not read the power state");
        }
    }
    reservation.release().await;
}
