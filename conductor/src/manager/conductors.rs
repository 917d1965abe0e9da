//! This conductor in the database's list of conductors (Ironic's conductor registration):
//! registered at start, a heartbeat every `conductor.heartbeat_interval`, removed at a clean
//! shutdown. A conductor whose heartbeat is older than `conductor.heartbeat_timeout` is dead
//! (`GET /v1/conductors` shows `alive: false`); its row stays until it starts again.
//!
//! After each heartbeat the table is read back into the [`crate::cluster::Cluster`] view (who
//! is alive, who owns which node), and the nodes of a conductor seen dead for the first time
//! are taken over ([`super::recovery::take_over`]); a takeover that fails (the database went
//! away) is tried again on the next heartbeat.

use std::collections::BTreeSet;
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
        api_url: core.internal_url(),
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
    // Dead conductors whose nodes are still to be taken over.
    let mut pending = BTreeSet::new();
    let mut reach = Reach::default();
    refresh(&core, &mut pending, reach.since).await;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                let written = heartbeat(&core).await;
                reach.record(written, std::time::Instant::now(), 2 * core.config.heartbeat_interval);
                refresh(&core, &mut pending, reach.since).await;
            }
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

/// Whether this conductor's heartbeats reach the database, and since when they do again after
/// they did not (`ClusterView::from_records` ages the others' heartbeats from then).
///
/// A heartbeat that failed is an outage; so is a gap between two written heartbeats longer
/// than the caller's limit: a heartbeat can wait out a whole outage (on a pooled connection
/// or a connect) and then succeed without ever failing, and the others' heartbeats were held
/// up as long.
#[derive(Debug, Default)]
struct Reach {
    failing: bool,
    since: Option<time::OffsetDateTime>,
    last_written: Option<std::time::Instant>,
}

impl Reach {
    /// Records a heartbeat that ended at `now`; `gap` is the longest time between two written
    /// heartbeats that is not an outage.
    fn record(&mut self, written: bool, now: std::time::Instant, gap: std::time::Duration) {
        if !written {
            self.failing = true;
            return;
        }
        let held_up = self
            .last_written
            .is_some_and(|last| now.saturating_duration_since(last) > gap);
        if self.failing || held_up {
            self.since = Some(crate::store::now());
            tracing::info!(
                after_a_failure = self.failing,
                "the database is reachable again: the other conductors' heartbeats are aged \
                 from now"
            );
        }
        self.failing = false;
        self.last_written = Some(now);
    }
}

/// Reads the conductors back into the cluster view, then takes over the nodes of the dead.
async fn refresh(
    core: &Arc<Core>,
    pending: &mut BTreeSet<String>,
    reachable_since: Option<time::OffsetDateTime>,
) {
    let records = match core.store().list_conductors().await {
        Ok(records) => records,
        Err(e) => {
            tracing::warn!(error = %Chain(&e), "reading the conductors (the ring stays as it was)");
            return;
        }
    };
    let alive_before = core.cluster.view().alive().len();
    let (view, newly_dead) = core.cluster.update(&records, reachable_since);
    let alive = view.alive();
    if alive.len() > 1 && alive.len() != alive_before && core.deploy.objects.kind() == "builtin" {
        // A node taken over by another conductor could not reach the floppy and ISO this one
        // keeps on its own disk.
        tracing::warn!(
            conductors = ?alive,
            "several conductors share this database, but this one keeps floppies and ISOs in its \
             built-in object store, which the others cannot serve: use a shared object store \
             (objects.kind = \"swift\") on every conductor"
        );
    }
    pending.extend(newly_dead);
    // One that came back is no longer to be taken over (its own start released its locks).
    pending.retain(|host| view.dead().contains(host));
    if pending.is_empty() {
        return;
    }
    match super::recovery::take_over(core, &view, pending).await {
        Ok(()) => pending.clear(),
        Err(e) => {
            tracing::warn!(error = %e.chain(), "taking over the nodes of dead conductors; trying again at the next heartbeat")
        }
    }
}

/// Writes this conductor's heartbeat; whether it reached the database.
async fn heartbeat(core: &Core) -> bool {
    match core
        .store()
        .heartbeat_conductor(&core.config.conductor_name)
        .await
    {
        Ok(()) => true,
        // The row went (an operator, or another conductor's clean-up): register again.
        Err(StoreError::NotFound { .. }) => {
            tracing::warn!("this conductor's registration was gone; registering again");
            match register(core).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e.chain(), "registering the conductor again");
                    false
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %Chain(&e), "the conductor's heartbeat");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Reach;
    use std::time::{Duration, Instant};

    #[test]
    fn an_outage_is_a_failed_heartbeat_or_a_long_gap_between_written_ones() {
        let gap = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut reach = Reach::default();
        reach.record(true, t0, gap);
        reach.record(true, t0 + Duration::from_secs(1), gap);
        assert_eq!(reach.since, None, "heartbeats on time");
        // Failed, then written: aged from now.
        reach.record(false, t0 + Duration::from_secs(2), gap);
        reach.record(true, t0 + Duration::from_secs(3), gap);
        let first = reach.since.expect("an outage");
        // A heartbeat held up for 5 s that then went through, with no failure seen.
        reach.record(true, t0 + Duration::from_secs(8), gap);
        let second = reach.since.expect("an outage");
        assert!(second >= first);
        assert!(!reach.failing);
        // On time again: nothing new.
        reach.record(true, t0 + Duration::from_secs(9), gap);
        assert_eq!(reach.since, Some(second));
    }
}
