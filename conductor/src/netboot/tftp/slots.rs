//! Which transfers hold the server's slots, and which one gives way when they are all taken.
//!
//! # Design
//! A transfer is *half-open* until the client acknowledges its first packet (the OACK or
//! DATA 1). Until then nothing shows the request came from the address it names: a UDP source
//! address is forged at no cost, and a flood of requests nobody acknowledges would otherwise
//! hold every slot for the whole handshake. So, as a SYN cache does for TCP, a half-open
//! transfer is only borrowing its slot: a new request takes the slot of the oldest half-open
//! transfer rather than being dropped. An acknowledged transfer keeps its slot to the end.
//!
//! A request is admitted in this order:
//! 1. The same client address and port and the same file name as a running transfer: the
//!    client retransmitting its request; dropped, the running transfer answers it.
//! 2. The client's IP address already runs [`Slots::max_per_client`] transfers: its own oldest
//!    half-open transfer gives way, else the request is dropped. One host (or one forged
//!    address) cannot take more than its share of the slots, however fast it asks.
//! 3. Every slot taken: the oldest half-open transfer of any client gives way, else the request
//!    is dropped.
//!
//! Giving way means the transfer's task is aborted, silently: an ERROR would go to an address
//! that is likely forged, and would end a real PXE ROM's boot attempt for good where silence
//! makes it ask again.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What became of a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission<H> {
    /// Serve it; `evicted` is the handle of the half-open transfer that gave way, to abort.
    Admit { evicted: Option<H> },
    /// The client retransmitting the request of a running transfer.
    Duplicate,
    /// No room: the client's own transfers are all acknowledged and at its cap
    /// (`per_client`), or every slot holds an acknowledged transfer.
    Busy { per_client: bool },
}

/// One running transfer.
struct Slot<H> {
    client: SocketAddr,
    filename: String,
    /// Admission order: the oldest half-open transfer gives way first.
    seq: u64,
    /// Set by the transfer when the client acknowledges its first packet.
    acknowledged: Arc<AtomicBool>,
    handle: H,
}

impl<H> Slot<H> {
    fn half_open(&self) -> bool {
        !self.acknowledged.load(Ordering::Relaxed)
    }
}

/// The running transfers by key (the task's ID), and the bookkeeping of the admission rules.
pub struct Slots<K, H> {
    max_total: usize,
    max_per_client: usize,
    slots: HashMap<K, Slot<H>>,
    per_client: HashMap<IpAddr, usize>,
    requests: HashSet<(SocketAddr, String)>,
    next_seq: u64,
}

impl<K: Copy + Eq + Hash, H> Slots<K, H> {
    /// Room for `max_total` transfers, at most `max_per_client` of them from one IP address.
    pub fn new(max_total: usize, max_per_client: usize) -> Slots<K, H> {
        Slots {
            max_total,
            max_per_client,
            slots: HashMap::new(),
            per_client: HashMap::new(),
            requests: HashSet::new(),
            next_seq: 0,
        }
    }

    /// The cap on one IP address's transfers.
    pub fn max_per_client(&self) -> usize {
        self.max_per_client
    }

    /// Running transfers.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Running transfers not yet acknowledged.
    pub fn half_open(&self) -> usize {
        self.slots.values().filter(|slot| slot.half_open()).count()
    }

    /// Decides on a request from `client` for `filename` (module docs); on
    /// [`Admission::Admit`] the caller starts the transfer and [`Slots::insert`]s it at once.
    /// An evicted transfer's slot is already free when this returns.
    pub fn admit(&mut self, client: SocketAddr, filename: &str) -> Admission<H> {
        if self.requests.contains(&(client, filename.to_owned())) {
            return Admission::Duplicate;
        }
        let ip = client.ip();
        // Which transfers may give way: the client's own at its cap, anyone's when full.
        let per_client = self.per_client.get(&ip).copied().unwrap_or(0) >= self.max_per_client;
        let scope = if per_client {
            Some(ip)
        } else if self.slots.len() >= self.max_total {
            None
        } else {
            return Admission::Admit { evicted: None };
        };
        match self.oldest_half_open(scope) {
            Some(key) => Admission::Admit {
                evicted: self.remove(key),
            },
            None => Admission::Busy { per_client },
        }
    }

    /// Records an admitted transfer; `acknowledged` is the flag its task sets.
    pub fn insert(
        &mut self,
        key: K,
        client: SocketAddr,
        filename: String,
        acknowledged: Arc<AtomicBool>,
        handle: H,
    ) {
        self.requests.insert((client, filename.clone()));
        *self.per_client.entry(client.ip()).or_insert(0) += 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = Slot {
            client,
            filename,
            seq,
            acknowledged,
            handle,
        };
        if let Some(replaced) = self.slots.insert(key, slot) {
            // Task IDs are unique while the task lives; undo the replaced slot's counts anyway
            // so the books cannot drift.
            self.forget(&replaced);
        }
    }

    /// Frees the slot of a transfer that ended (or gave way); its handle, when it was still
    /// recorded.
    pub fn remove(&mut self, key: K) -> Option<H> {
        let slot = self.slots.remove(&key)?;
        self.forget(&slot);
        Some(slot.handle)
    }

    fn forget(&mut self, slot: &Slot<H>) {
        self.requests.remove(&(slot.client, slot.filename.clone()));
        if let Some(count) = self.per_client.get_mut(&slot.client.ip()) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.per_client.remove(&slot.client.ip());
            }
        }
    }

    /// The oldest half-open transfer, of `ip` only when given. A linear scan: it runs only when
    /// a limit is reached, over at most `max_total` slots.
    fn oldest_half_open(&self, ip: Option<IpAddr>) -> Option<K> {
        self.slots
            .iter()
            .filter(|(_, slot)| slot.half_open())
            .filter(|(_, slot)| ip.is_none_or(|ip| slot.client.ip() == ip))
            .min_by_key(|(_, slot)| slot.seq)
            .map(|(key, _)| *key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(host: u8, port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, host], port))
    }

    /// Admits and inserts request `key`; what the admission said, and the transfer's flag.
    fn request(
        slots: &mut Slots<u32, u32>,
        key: u32,
        client: SocketAddr,
        name: &str,
    ) -> (Admission<u32>, Arc<AtomicBool>) {
        let admission = slots.admit(client, name);
        let acknowledged = Arc::new(AtomicBool::new(false));
        if let Admission::Admit { .. } = admission {
            slots.insert(key, client, name.into(), Arc::clone(&acknowledged), key);
        }
        (admission, acknowledged)
    }

    fn admitted(evicted: Option<u32>) -> Admission<u32> {
        Admission::Admit { evicted }
    }

    #[test]
    fn a_full_table_evicts_the_oldest_half_open_transfer() {
        let mut slots = Slots::new(3, 8);
        let (_, first) = request(&mut slots, 1, addr(1, 1000), "a");
        request(&mut slots, 2, addr(2, 1000), "a");
        request(&mut slots, 3, addr(3, 1000), "a");
        // 1 is acknowledged, so 2 is the oldest half-open one.
        first.store(true, Ordering::Relaxed);
        assert_eq!(
            request(&mut slots, 4, addr(4, 1000), "a").0,
            admitted(Some(2))
        );
        assert_eq!(
            request(&mut slots, 5, addr(5, 1000), "a").0,
            admitted(Some(3))
        );
        assert_eq!((slots.len(), slots.half_open()), (3, 2));
        // The evicted client's retransmission is a new request again, not a duplicate.
        assert_eq!(
            request(&mut slots, 6, addr(2, 1000), "a").0,
            admitted(Some(4))
        );
    }

    #[test]
    fn a_table_of_acknowledged_transfers_drops_new_requests() {
        let mut slots = Slots::new(2, 8);
        for key in [1, 2] {
            let (_, flag) = request(&mut slots, key, addr(key as u8, 1000), "a");
            flag.store(true, Ordering::Relaxed);
        }
        assert_eq!(
            request(&mut slots, 3, addr(3, 1000), "a").0,
            Admission::Busy { per_client: false }
        );
        // A transfer ends: its slot is free again.
        assert_eq!(slots.remove(1), Some(1));
        assert_eq!(slots.remove(1), None);
        assert_eq!(request(&mut slots, 3, addr(3, 1000), "a").0, admitted(None));
    }

    #[test]
    fn one_address_is_capped_and_gives_way_to_itself() {
        let mut slots = Slots::new(64, 2);
        let (_, first) = request(&mut slots, 1, addr(1, 1000), "a");
        request(&mut slots, 2, addr(1, 1001), "a");
        // At its cap: its own oldest half-open transfer gives way, nobody else's.
        request(&mut slots, 3, addr(2, 1000), "a");
        first.store(true, Ordering::Relaxed);
        assert_eq!(
            request(&mut slots, 4, addr(1, 1002), "a").0,
            admitted(Some(2))
        );
        // Both its transfers acknowledged: dropped, though slots are free.
        slots.remove(4);
        let (_, flag) = request(&mut slots, 5, addr(1, 1003), "a");
        flag.store(true, Ordering::Relaxed);
        assert_eq!(
            request(&mut slots, 6, addr(1, 1004), "a").0,
            Admission::Busy { per_client: true }
        );
        assert_eq!(request(&mut slots, 7, addr(3, 1000), "a").0, admitted(None));
    }

    #[test]
    fn a_repeated_request_is_a_duplicate_and_another_file_is_not() {
        let mut slots = Slots::new(64, 8);
        request(&mut slots, 1, addr(1, 1000), "a");
        assert_eq!(slots.admit(addr(1, 1000), "a"), Admission::Duplicate);
        assert_eq!(slots.admit(addr(1, 1000), "b"), admitted(None));
        assert_eq!(slots.admit(addr(1, 1001), "a"), admitted(None));
        slots.remove(1);
        assert_eq!(slots.admit(addr(1, 1000), "a"), admitted(None));
    }
}
