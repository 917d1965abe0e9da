//! Who may hold a connection to a listener: at most `max_total` connections at once, and at
//! most `max_per_client` from one address.
//!
//! # Design
//! A listener asks [`Admission::admit`] right after `accept`; the [`Ticket`] it gets is held
//! by the connection's task and gives the place back when dropped, however the connection
//! ends. A refused connection is closed at once, before a byte is read: one address that
//! opens thousands of idle or stalled connections (slowloris) fills only its own share, and
//! the other clients keep being served. Refusals are counted and logged at most once a second,
//! so a flood cannot flood the log too.
//!
//! # Limitations
//! Clients behind one proxy or NAT share one address and so one share: raise
//! `max_per_client` for them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a refusal is logged at most; the ones between are counted in the next line.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);
/// Connections at once to a listener without a setting of its own (the built-in object store,
/// netboot HTTP): every iLO and ramdisk of a large fleet fetching at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Connections at once from one address to such a listener: a BMC or a ramdisk opens a few.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 256;

/// The connection limits of one listener (cheap to clone; clones share the counts).
#[derive(Debug, Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// What the log lines call the listener (`"API"`, `"object store"`).
    listener: &'static str,
    max_total: usize,
    max_per_client: usize,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_client: HashMap<IpAddr, usize>,
    /// Refusals since the last log line, and when that line was written.
    refused_unlogged: u64,
    last_logged: Option<Instant>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The listener holds `max_total` connections.
    Full,
    /// The client's address holds `max_per_client` connections.
    ClientFull,
}

impl Admission {
    /// Limits for `listener`; a limit of 0 is taken as 1.
    pub fn new(listener: &'static str, max_total: usize, max_per_client: usize) -> Admission {
        Admission {
            inner: Arc::new(Inner {
                listener,
                max_total: max_total.max(1),
                max_per_client: max_per_client.max(1),
                counts: Mutex::new(Counts::default()),
            }),
        }
    }

    /// A place for a connection from `client`, or why there is none (logged here).
    pub fn admit(&self, client: IpAddr) -> Result<Ticket, Refusal> {
        let mut counts = self.lock();
        let from_client = counts.per_client.get(&client).copied().unwrap_or(0);
        let refusal = if counts.total >= self.inner.max_total {
            Some(Refusal::Full)
        } else if from_client >= self.inner.max_per_client {
            Some(Refusal::ClientFull)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            counts.refused_unlogged += 1;
            let due = counts
                .last_logged
                .is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL);
            if due {
                let refused = std::mem::take(&mut counts.refused_unlogged);
                counts.last_logged = Some(Instant::now());
                let (total, max_total, max_per_client) = (
                    counts.total,
                    self.inner.max_total,
                    self.inner.max_per_client,
                );
                drop(counts);
                tracing::warn!(
                    listener = self.inner.listener,
                    %client,
                    reason = match refusal {
                        Refusal::Full => "the listener is full",
                        Refusal::ClientFull => "the client holds its share",
                    },
                    refused_since_last_line = refused,
                    connections = total,
                    max_connections = max_total,
                    max_connections_per_client = max_per_client,
                    "connection refused"
                );
            }
            return Err(refusal);
        }
        counts.total += 1;
        *counts.per_client.entry(client).or_insert(0) += 1;
        Ok(Ticket {
            admission: self.clone(),
            client,
        })
    }

    /// Connections held now (all clients).
    pub fn connections(&self) -> usize {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        // The counts stay consistent at every await-free step: a panic elsewhere cannot leave
        // them half updated, so a poisoned lock is still good to use.
        self.inner
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn release(&self, client: IpAddr) {
        let mut counts = self.lock();
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.per_client.get_mut(&client) {
            *n -= 1;
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
        let admission = Admission::new("test", 3, 2);
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let c: IpAddr = "10.0.0.3".parse().expect("ip");
        let a1 = admission.admit(a).expect("first of a");
        let a2 = admission.admit(a).expect("second of a");
        assert_eq!(admission.admit(a).err(), Some(Refusal::ClientFull));
        let b1 = admission.admit(b).expect("b has its own share");
        assert_eq!(admission.admit(c).err(), Some(Refusal::Full));
        assert_eq!(admission.connections(), 3);
        drop(a1);
        let c1 = admission.admit(c).expect("a place came free");
        drop((a2, b1, c1));
        assert_eq!(admission.connections(), 0);
        assert!(admission.lock().per_client.is_empty(), "no address kept");
        let _again = admission.admit(a).expect("all given back");
    }
}
