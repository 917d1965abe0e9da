//! Deleting objects at their `delete_after` deadline.
//!
//! # Design
//! [`Schedule`] keeps the deadlines in order; the sweeper ([`sweep`]) sleeps until the
//! earliest one (or until a put schedules an earlier one, or shutdown), deletes what is due,
//! and sleeps again: no fixed poll. The deadline lives in the object's sidecar, so a restarted
//! store rebuilds the schedule from the sidecars (`BuiltinStore::start`) and deletes past-due
//! objects at once. Before deleting, the sweeper re-reads the sidecar: an object replaced
//! since (a new deadline, or none) is left alone; its new deadline has its own entry.
//!
//! Reads never wait for the sweeper: a GET or head of an object past its deadline answers
//! "not found" even if the sweeper has not run yet (as Swift answers 404 before its expirer
//! runs, docs/iscsi-and-swift-peers.md §5).
//!
//! # Limitations
//! Deadlines are wall-clock times (they must survive a restart). A sleep is capped at
//! [`MAX_SLEEP`] so that a clock set forward is noticed within a minute.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use super::BuiltinStore;
use crate::objects::ObjectPath;
use vmdeploy_shared::error::Chain;

/// Longest sleep between two looks at the clock.
pub const MAX_SLEEP: Duration = Duration::from_secs(60);

/// Deadlines in order: `(Unix ms, container, object)`.
#[derive(Debug, Default)]
pub struct Schedule {
    deadlines: Mutex<BTreeSet<(u64, String, String)>>,
    wake: Notify,
}

impl Schedule {
    /// Adds a deadline, waking the sweeper when it is the new earliest.
    pub fn add(&self, at_ms: u64, path: &ObjectPath) {
        let mut deadlines = self.deadlines.lock().unwrap_or_else(|e| e.into_inner());
        let earliest = deadlines.first().is_none_or(|first| at_ms < first.0);
        deadlines.insert((at_ms, path.container.clone(), path.object.clone()));
        drop(deadlines);
        if earliest {
            // notify_one keeps a permit when the sweeper is not waiting yet, so a deadline
            // added between its look at the schedule and its sleep is not missed.
            self.wake.notify_one();
        }
    }

    /// Removes and returns the entries due at `now_ms`, earliest first.
    pub fn take_due(&self, now_ms: u64) -> Vec<ObjectPath> {
        let mut deadlines = self.deadlines.lock().unwrap_or_else(|e| e.into_inner());
        let mut due = Vec::new();
        while let Some(first) = deadlines.first() {
            if first.0 > now_ms {
                break;
            }
            if let Some((_, container, object)) = deadlines.pop_first() {
                due.push(ObjectPath::new(container, object));
            }
        }
        due
    }

    /// The earliest deadline, Unix ms.
    pub fn next(&self) -> Option<u64> {
        let deadlines = self.deadlines.lock().unwrap_or_else(|e| e.into_inner());
        deadlines.first().map(|d| d.0)
    }
}

/// Runs until `shutdown` turns true (or its sender is gone), deleting objects on time.
pub async fn sweep(store: Arc<BuiltinStore>, mut shutdown: watch::Receiver<bool>) {
    loop {
        if *shutdown.borrow() {
            return;
        }
        let now = super::now_ms();
        for path in store.schedule.take_due(now) {
            match store.files.sidecar(&path).await {
                Ok(Some(sidecar)) if sidecar.expired(now) => {
                    match store.files.remove(&path).await {
                        Ok(_) => tracing::info!(object = %path, "deleted expired object"),
                        Err(e) => {
                            tracing::warn!(object = %path, error = %Chain(&e), "deleting an expired object failed")
                        }
                    }
                }
                // Replaced without a deadline, with a later one, or deleted already.
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(object = %path, error = %Chain(&e), "reading an expiring object failed")
                }
            }
        }
        let sleep = match store.schedule.next() {
            Some(at) => Duration::from_millis(at.saturating_sub(super::now_ms())).min(MAX_SLEEP),
            None => MAX_SLEEP,
        };
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = store.schedule.wake.notified() => {}
            changed = shutdown.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_come_out_in_order_and_only_when_due() {
        let schedule = Schedule::default();
        assert_eq!(schedule.next(), None);
        schedule.add(3_000, &ObjectPath::new("c", "third"));
        schedule.add(1_000, &ObjectPath::new("c", "first"));
        schedule.add(2_000, &ObjectPath::new("c", "second"));
        schedule.add(2_000, &ObjectPath::new("b", "second-too"));
        assert_eq!(schedule.next(), Some(1_000));
        assert_eq!(schedule.take_due(999), vec![]);
        assert_eq!(
            schedule.take_due(2_000),
            vec![
                ObjectPath::new("c", "first"),
                ObjectPath::new("b", "second-too"),
                ObjectPath::new("c", "second"),
            ]
        );
        assert_eq!(schedule.next(), Some(3_000));
        assert_eq!(
            schedule.take_due(10_000),
            vec![ObjectPath::new("c", "third")]
        );
        assert_eq!(schedule.next(), None);
    }

    #[tokio::test]
    async fn an_earlier_deadline_wakes_the_sweeper() {
        let schedule = Arc::new(Schedule::default());
        schedule.add(5_000, &ObjectPath::new("c", "late"));
        // The first add left a permit: consume it, as the sweeper's first wait would.
        schedule.wake.notified().await;
        let waiter = {
            let schedule = schedule.clone();
            tokio::spawn(async move { schedule.wake.notified().await })
        };
        schedule.add(9_000, &ObjectPath::new("c", "later"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "a later deadline must not wake it");
        schedule.add(1_000, &ObjectPath::new("c", "early"));
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("task");
    }
}
