//! Who may hold a connection to the command API: at most `max_total` at once, and at most
//! `max_per_client` from one address (the agent's own small copy of the conductor's
//! `net::admission`; the agent crate does not depend on the conductor, and the logic is a
//! counter table).
//!
//! # Design
//! The accept loop asks [`Admission::admit`] right after `accept`; the [`Ticket`] is held by
//! the connection's task and gives the place back when dropped, however the connection ends.
//! A refused connection is closed at once, before a byte is read, so one address that opens
//! thousands of idle connections (slowloris) fills only its own share and the conductor's
//! calls keep being served. Refusals are logged at most once a second.
//!
//! # Limitations
//! Many addresses together can still fill `max_total`: the agent cannot tell the conductor's
//! address from another (the conductor may call from any of its addresses), so it reserves it
//! no place; on a deploy network an attacker with many addresses is rare, and the timeouts
//! free idle places within the header timeout.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How often a refusal is logged at most; the ones between are counted in the next line.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The connection limits of the command API (cheap to clone; clones share the counts).
#[derive(Debug, Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    max_total: usize,
    max_per_client: usize,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_client: HashMap<IpAddr, usize>,
    refused_unlogged: u64,
    last_logged: Option<Instant>,
}

impl Admission {
    /// Limits of `max_total` connections and `max_per_client` from one address (0 taken as 1).
    pub fn new(max_total: usize, max_per_client: usize) -> Admission {
        Admission {
            inner: Arc::new(Inner {
                max_total: max_total.max(1),
                max_per_client: max_per_client.max(1),
                counts: Mutex::new(Counts::default()),
            }),
        }
    }

    // Every update is a few integer writes with no await or panic between them: a poisoned
    // lock still holds consistent counts.
    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.inner
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a connection from `client`, or `None` (the refusal is logged here).
    pub fn admit(&self, client: IpAddr) -> Option<Ticket> {
        let mut counts = self.lock();
        let from_client = counts.per_client.get(&client).copied().unwrap_or(0);
        let full = counts.total >= self.inner.max_total;
        if full || from_client >= self.inner.max_per_client {
            counts.refused_unlogged += 1;
            let due = counts
                .last_logged
                .is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL);
            if due {
                let refused = std::mem::take(&mut counts.refused_unlogged);
                counts.last_logged = Some(Instant::now());
                let connections = counts.total;
                drop(counts);
                tracing::warn!(
                    %client,
                    reason = if full { "the command API is full" } else { "the client holds its share" },
                    refused_since_last_line = refused,
                    connections,
                    max_connections = self.inner.max_total,
                    max_connections_per_client = self.inner.max_per_client,
                    "command API connection refused"
                );
            }
            return None;
        }
        counts.total += 1;
        *counts.per_client.entry(client).or_insert(0) += 1;
        Some(Ticket {
            admission: self.clone(),
            client,
        })
    }

    /// Connections held now.
    pub fn connections(&self) -> usize {
        self.lock().total
    }

    fn release(&self, client: IpAddr) {
        let mut counts = self.lock();
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.per_client.get_mut(&client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.per_client.remove(&client);
            }
        }
    }
}

/// A connection's place; given back when dropped.
#[derive(Debug)]
pub struct Ticket {
    admission: Admission,
    client: IpAddr,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission.release(self.client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_per_client_and_in_all_and_given_back_on_drop() {
        let admission = Admission::new(3, 2);
        let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
        let (a, b, c) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"));
        let a1 = admission.admit(a).expect("first of a");
        let a2 = admission.admit(a).expect("second of a");
        assert!(admission.admit(a).is_none(), "a holds its share");
        let b1 = admission.admit(b).expect("b has its own share");
        assert!(admission.admit(c).is_none(), "full");
        assert_eq!(admission.connections(), 3);
        drop(a1);
        let c1 = admission.admit(c).expect("a place came free");
        drop((a2, b1, c1));
        assert_eq!(admission.connections(), 0);
        assert!(admission.lock().per_client.is_empty(), "no address kept");
    }
}
