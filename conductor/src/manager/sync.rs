//! The periodic power-state sync (Ironic's `_sync_power_states`).
//!
//! # Design
//! Every `power_sync_interval`, each node not in maintenance, not in `enroll` (its credentials
//! are unverified) and not reserved is reserved for a moment and its BMC read. A state that
//! differs from the record is recorded and logged: the BMC is the truth, and this conductor
//! does not force the recorded state back (someone changed it on purpose, or the server
//! failed; either way an operator should see it, not have it undone).

use std::sync::Arc;

use super::tasks;
use super::Core;
use crate::bmc::{Bmc, PROTOCOL_KEY};
use crate::states::ProvisionState;
use crate::store::{NodeFilter, StoreError};
use vmdeploy_shared::error::Chain;

/// Runs the sync until `shutdown` turns true.
pub(crate) async fn run(core: Arc<Core>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(core.config.power_sync_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick fires at once; skip it so start-up is not a burst of BMC logins.
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = ticker.tick() => sync_once(&core).await,
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    return;
                }
            }
        }
    }
}

/// One pass over every node.
pub(crate) async fn sync_once(core: &Arc<Core>) {
    let filter = NodeFilter {
        maintenance: Some(false),
        ..NodeFilter::default()
    };
    let nodes = match core.store().list_nodes(&filter).await {
        Ok(nodes) => nodes,
        Err(err) => {
            tracing::error!(error = %Chain(&err), "power sync: could not list nodes");
            return;
        }
    };
    for listed in nodes {
        if listed.reservation.is_some() || listed.provision_state == ProvisionState::Enroll {
            continue;
        }
        let (mut node, reservation) = match tasks::reserve_uuid(core, listed.uuid).await {
            Ok(reserved) => reserved,
            // Taken or deleted since the list: the next pass sees it.
            Err(super::ManagerError::Store(
                StoreError::Locked { .. } | StoreError::NotFound { .. },
            )) => continue,
            Err(err) => {
                tracing::warn!(node = %listed.uuid, error = %err.chain(), "power sync: could not reserve the node");
                continue;
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
}
