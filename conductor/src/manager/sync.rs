//! The periodic power-state sync (Ironic's `_sync_power_states`).
//!
//! # Design
//! Every `power_sync_interval`, each node not in maintenance, not in `enroll` (its credentials
//! are unverified) and not reserved has its BMC read, without taking the node's lock; only a
//! state that differs from the record is written, under a lock held for that write. It is
//! recorded and logged: the BMC is the truth, and this conductor
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
        // A node waiting for its ramdisk is the flow's to power (it boots, reboots, and the
        // call-back may arrive mid-read): Ironic leaves deploy wait and clean wait out too.
        .filter(|n| {
            n.reservation.is_none()
                && n.provision_state != ProvisionState::Enroll
                && !n.provision_state.is_waiting()
        })
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

/// Reads one node's BMC, then records a changed state under a brief reservation.
///
/// The BMC is read without the node's lock (Ironic reads under a shared lock): a BMC can take
/// seconds to answer, and holding the node's only lock that long would refuse every API verb
/// and call-back on the node with 409 during a pass. The lock is taken only to write, and the
/// reading is written only when the record did not change since the list: a task that ran
/// meanwhile knows the power state better than a reading taken while it ran.
async fn sync_node(core: &Arc<Core>, listed: Node) {
    let mut read_node = listed.clone();
    let known_protocol = read_node.driver_internal_info.get(PROTOCOL_KEY).cloned();
    let read = Bmc::read_power(&mut read_node, &core.deploy.config.ilo_defaults).await;
    let learned = read_node.driver_internal_info.get(PROTOCOL_KEY) != known_protocol.as_ref();
    let power = match read {
        Ok(power) => power,
        Err(err) => {
            tracing::warn!(node = %listed.uuid, error = %Chain(&err), "power sync: could not read the power state");
            return;
        }
    };
    let changed = listed.power_state != Some(power);
    if !changed && !learned {
        return;
    }
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
    if node.updated_at != listed.updated_at {
        // Written since the list (a task, an operator): this reading may predate it.
        reservation.release().await;
        return;
    }
    if changed {
        tracing::warn!(
            node = %node.uuid,
            recorded = node.power_state.map(|p| p.as_str()).unwrap_or("unknown"),
            actual = %power,
            "power state changed outside the conductor; recording the BMC's state"
        );
        node.power_state = Some(power);
    }
    if learned {
        // The protocol an `auto` probe chose, kept so the next pass does not ask again.
        if let Some(choice) = read_node.driver_internal_info.get(PROTOCOL_KEY) {
            node.driver_internal_info
                .insert(PROTOCOL_KEY.into(), choice.clone());
        }
    }
    if let Err(err) = core.store().update_node(&node).await {
        tasks::log_store_error(&err, "the synced power state");
    }
    reservation.release().await;
}
