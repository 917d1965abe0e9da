//! Several conductors on one database: who is alive, which conductor owns which node, and how a
//! request reaches a node's owner (docs/architecture.md §8).
//!
//! # Design
//! The database's `conductors` table is the membership list: each conductor heartbeats there
//! (`manager::conductors`) and, on every heartbeat, reads the table back and rebuilds its
//! [`ClusterView`]: the live conductors (heartbeat newer than `conductor.heartbeat_timeout`, and
//! always this one), one [`ring::HashRing`] per `conductor_group`, and the dead. Every conductor
//! reads the same table and builds the same rings, so they agree on owners without a protocol
//! of their own; for the few seconds two views differ (one conductor saw a heartbeat the other
//! has not yet), the node's reservation in the database still allows one task at a time.
//!
//! The owner runs a node's background duties (power sync, call-back timeouts, takeover of a
//! dead conductor's nodes) and carries out the API's actions on it: any other conductor
//! forwards those requests to the owner's `internal_url` ([`forward`]).
//!
//! # Limitations
//! A conductor that is alive but cut off from the database for longer than the timeout is
//! taken for dead: its nodes are taken over while it may still be running a task on one. The
//! task's later writes then race the new owner's; the timeout (60 s by default, 6 heartbeats)
//! is what keeps this rare, as in Ironic.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

use crate::store::ConductorRecord;

pub mod forward;
pub mod ring;

use ring::HashRing;

/// Who owns a node, as one [`ClusterView`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This conductor.
    Me,
    /// Another live conductor, reached at `url` (`None`: it registered no internal URL).
    Other {
        /// Its name.
        hostname: String,
        /// Its `conductor.internal_url`.
        url: Option<String>,
    },
    /// No live conductor serves the node's group.
    Nobody,
}

/// One reading of the `conductors` table.
#[derive(Debug, Clone)]
pub struct ClusterView {
    me: String,
    /// Live conductors by group.
    rings: HashMap<String, HashRing>,
    /// Internal URLs of the live conductors.
    urls: HashMap<String, String>,
    /// Registered conductors whose heartbeat is too old.
    dead: BTreeSet<String>,
}

impl ClusterView {
    /// The view before the table was first read: this conductor alone in its group.
    pub fn alone(me: &str, group: &str) -> ClusterView {
        ClusterView {
            me: me.to_string(),
            rings: HashMap::from([(group.to_string(), HashRing::new([me]))]),
            urls: HashMap::new(),
            dead: BTreeSet::new(),
        }
    }

    /// Builds the view from the table's rows as of `now`: a conductor is alive when its last
    /// heartbeat is less than `timeout` old, or when it is `me` (this conductor knows it runs,
    /// even when its own heartbeat could not be written).
    ///
    /// `reachable_since` is when this conductor's heartbeats got through again after the
    /// database was out of its reach: no other conductor could heartbeat while it was down
    /// either, so a heartbeat is aged from then at the earliest. Without it, every conductor
    /// would take every other for dead when the database comes back after an outage longer
    /// than the timeout, and take over their running tasks.
    pub fn from_records(
        me: &str,
        my_group: &str,
        records: &[ConductorRecord],
        now: OffsetDateTime,
        timeout: Duration,
        reachable_since: Option<OffsetDateTime>,
    ) -> ClusterView {
        let mut members: HashMap<String, Vec<&str>> = HashMap::new();
        members.entry(my_group.to_string()).or_default().push(me);
        let mut urls = HashMap::new();
        let mut dead = BTreeSet::new();
        for record in records {
            if record.hostname == me {
                continue;
            }
            let last_seen = match reachable_since {
                Some(since) => record.updated_at.max(since),
                None => record.updated_at,
            };
            let age = now - last_seen;
            if age >= timeout {
                dead.insert(record.hostname.clone());
                continue;
            }
            members
                .entry(record.conductor_group.clone())
                .or_default()
                .push(&record.hostname);
            if let Some(url) = &record.api_url {
                urls.insert(record.hostname.clone(), url.clone());
            }
        }
        let rings = members
            .into_iter()
            .map(|(group, hosts)| (group, HashRing::new(hosts)))
            .collect();
        ClusterView {
            me: me.to_string(),
            rings,
            urls,
            dead,
        }
    }

    /// The owner of the node `uuid` of `group`.
    pub fn owner(&self, group: &str, uuid: Uuid) -> Owner {
        match self.rings.get(group).and_then(|ring| ring.owner(uuid)) {
            None => Owner::Nobody,
            Some(host) if host == self.me => Owner::Me,
            Some(host) => Owner::Other {
                hostname: host.to_string(),
                url: self.urls.get(host).cloned(),
            },
        }
    }

    /// The name of the node's owner, this conductor included; `None` when nobody serves its
    /// group.
    pub fn owner_name(&self, group: &str, uuid: Uuid) -> Option<String> {
        match self.owner(group, uuid) {
            Owner::Me => Some(self.me.clone()),
            Owner::Other { hostname, .. } => Some(hostname),
            Owner::Nobody => None,
        }
    }

    /// Whether this conductor owns the node.
    pub fn is_mine(&self, group: &str, uuid: Uuid) -> bool {
        self.owner(group, uuid) == Owner::Me
    }

    /// Whether no other conductor is alive: every node of this conductor's group is its own,
    /// and nothing needs forwarding.
    pub fn is_alone(&self) -> bool {
        self.rings.values().map(|r| r.hosts().len()).sum::<usize>() <= 1
    }

    /// Registered conductors whose heartbeat is older than the timeout.
    pub fn dead(&self) -> &BTreeSet<String> {
        &self.dead
    }

    /// The live conductors, sorted.
    pub fn alive(&self) -> BTreeSet<&str> {
        self.rings
            .values()
            .flat_map(|r| r.hosts().iter().map(String::as_str))
            .collect()
    }
}

/// This conductor's current [`ClusterView`], replaced on every heartbeat.
#[derive(Debug)]
pub struct Cluster {
    me: String,
    group: String,
    timeout: Duration,
    view: RwLock<Arc<ClusterView>>,
}

impl Cluster {
    /// This conductor (`me` in `group`), alone until [`Cluster::update`]; `timeout` is
    /// `conductor.heartbeat_timeout`.
    pub fn new(me: &str, group: &str, timeout: Duration) -> Cluster {
        Cluster {
            me: me.to_string(),
            group: group.to_string(),
            timeout,
            view: RwLock::new(Arc::new(ClusterView::alone(me, group))),
        }
    }

    /// The current view (a snapshot: later updates do not change it).
    pub fn view(&self) -> Arc<ClusterView> {
        match self.view.read() {
            Ok(view) => Arc::clone(&view),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Rebuilds the view from the `conductors` table's rows (`reachable_since`: see
    /// [`ClusterView::from_records`]); returns the new view and the conductors that died since
    /// the last one (they have nodes to take over).
    pub fn update(
        &self,
        records: &[ConductorRecord],
        reachable_since: Option<OffsetDateTime>,
    ) -> (Arc<ClusterView>, Vec<String>) {
        let view = Arc::new(ClusterView::from_records(
            &self.me,
            &self.group,
            records,
            crate::store::now(),
            self.timeout,
            reachable_since,
        ));
        let mut slot = match self.view.write() {
            Ok(slot) => slot,
            Err(poisoned) => poisoned.into_inner(),
        };
        let newly_dead = view.dead.difference(&slot.dead).cloned().collect();
        if view.alive() != slot.alive() {
            tracing::info!(
                alive = ?view.alive(), dead = ?view.dead,
                "the conductors changed: nodes are re-mapped"
            );
        }
        *slot = Arc::clone(&view);
        (view, newly_dead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(host: &str, group: &str, age_s: i64, now: OffsetDateTime) -> ConductorRecord {
        ConductorRecord {
            hostname: host.to_string(),
            conductor_group: group.to_string(),
            drivers: vec!["ilo".to_string()],
            api_url: Some(format!("https://{host}:6385")),
            created_at: now - time::Duration::hours(1),
            updated_at: now - time::Duration::seconds(age_s),
        }
    }

    #[test]
    fn live_dead_and_groups() {
        let now = crate::store::now();
        let timeout = Duration::from_secs(60);
        let records = [
            record("c1", "", 5, now),
            record("c2", "", 59, now),
            record("c3", "", 61, now),
            record("r1", "rack1", 1, now),
            // This conductor's own row, however old, does not make it dead.
            record("me", "", 600, now),
        ];
        let view = ClusterView::from_records("me", "", &records, now, timeout, None);
        assert_eq!(view.alive(), BTreeSet::from(["c1", "c2", "me", "r1"]));
        assert_eq!(view.dead(), &BTreeSet::from(["c3".to_string()]));
        assert!(!view.is_alone());
        let mut mine = 0;
        for i in 0..300u128 {
            let node = Uuid::from_u128(i * 7919 + 1);
            match view.owner("", node) {
                Owner::Me => mine += 1,
                Owner::Other { hostname, url } => {
                    assert!(hostname == "c1" || hostname == "c2", "{hostname}");
                    assert_eq!(url, Some(format!("https://{hostname}:6385")));
                }
                Owner::Nobody => panic!("the default group has conductors"),
            }
            assert!(
                matches!(view.owner("rack1", node), Owner::Other { hostname, .. } if hostname == "r1")
            );
            assert_eq!(view.owner("rack2", node), Owner::Nobody);
        }
        assert!((50..=150).contains(&mine), "a third of 300, got {mine}");
    }

    #[test]
    fn after_an_outage_heartbeats_are_aged_from_when_the_database_came_back() {
        let now = crate::store::now();
        let timeout = Duration::from_secs(60);
        // The database was out of reach for 5 minutes and came back 10 s ago: c1's last
        // heartbeat is 5 minutes old but it had no chance to write one since.
        let records = [record("c1", "", 310, now), record("c2", "", 3600, now)];
        let back = Some(now - time::Duration::seconds(10));
        let view = ClusterView::from_records("me", "", &records, now, timeout, back);
        assert_eq!(view.alive(), BTreeSet::from(["c1", "c2", "me"]));
        assert!(view.dead().is_empty());
        // Once the timeout has passed since, silence means death again.
        let back = Some(now - time::Duration::seconds(61));
        let view = ClusterView::from_records("me", "", &records, now, timeout, back);
        assert_eq!(view.alive(), BTreeSet::from(["me"]));
        assert_eq!(view.dead().len(), 2);
    }

    #[test]
    fn alone_until_others_heartbeat_and_deaths_are_reported_once() {
        let now = crate::store::now();
        let cluster = Cluster::new("me", "", Duration::from_secs(60));
        assert!(cluster.view().is_alone());
        assert!(cluster.view().is_mine("", Uuid::from_u128(9)));
        let (view, died) =
            cluster.update(&[record("c1", "", 1, now), record("me", "", 1, now)], None);
        assert!(!view.is_alone());
        assert!(died.is_empty());
        let (view, died) = cluster.update(&[record("c1", "", 120, now)], None);
        assert!(view.is_alone());
        assert_eq!(died, ["c1"]);
        let (_, died) = cluster.update(&[record("c1", "", 130, now)], None);
        assert!(died.is_empty(), "reported once");
    }
}
