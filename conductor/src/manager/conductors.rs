//! This conductor in the database's list of conductors (Ironic's conductor registration):
//! registered at start, a heartbeat every `conductor.heartbeat_interval`, removed at a clean
//! shutdown. A conductor whose heartbeat is older than `conductor.heartbeat_timeout` is dead
//! (`GET /v1/conductors` shows `alive: false`); its row stays until it starts again.

use std::sync::Arc;

use super::{Core, ManagerError};
use crate::node::hardware_type::HARDWARE_TYPES;
use crate::store::{ConductorRecord, StoreError};
use vmdeploy_shared::error::Chain;

/// Registers this conductor (or brings the row of its earlier run up to date).
pub(crate) async fn register(core: &Core) -> Result<(), ManagerError> {
    let now = crate::store::now();
    let record = ConductorRecord {
        hostname: core.config.conductor_name.clone(),
        conductor_group: core.config.conductor_group.clone(),
        drivers: HARDWARE_TYPES.iter().map(|t| t.name.to_string()).collect(),
        created_at: now,
        updated_at: now,
    };
    core.store().register_conductor(&record).await?;
    tracing::info!(
        conductor = %record.hostname, group = %record.conductor_group,
        heartbeat_s = core.config.heartbeat_interval.as_secs(),
        "conductor registered"
    );
    Ok(())
}

/// Heartbeats until `shutdown` turns true, then unregisters.
pub(crate) async fn run(core: Arc<Core>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(core.config.heartbeat_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = ticker.tick() => heartbeat(&core).await,
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
        }
    }
    let host = &core.config.conductor_name;
    match core.store().unregister_conductor(host).await {
        Ok(()) => tracing::info!(conductor = %host, "conductor unregistered"),
        Err(e) => {
            tracing::warn!(conductor = %host, error = %Chain(&e), "unregistering the conductor")
        }
    }
}

async fn heartbeat(core: &Core) {
    match core
        .store()
        .heartbeat_conductor(&core.config.conductor_name)
        .await
    {
        Ok(()) => {}
        // The row went (an operator, or another conductor's clean-up): register again.
        Err(StoreError::NotFound { .. }) => {
            tracing::warn!("this conductor's registration was gone; registering again");
            if let Err(e) = register(core).await {
                tracing::warn!(error = %e.chain(), "registering the conductor again");
            }
        }
        Err(e) => tracing::warn!(error = %Chain(&e), "the conductor's heartbeat"),
    }
}
