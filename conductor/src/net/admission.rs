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
//! A flood from many addresses, each within its share, could still fill the whole listener.
//! So a full listener makes room instead of refusing: it closes the connection that has waited
//! longest for a request (from its accept, or since its last response on a kept-alive one),
//! as a SYN cache drops its oldest half-open entry. A connection is busy, and never closed
//! for room, from the moment its request's headers are in until its response's last byte has
//! gone ([`Activity::busy`], [`HeldBody`]): a stalled or idle connection gives way, a download
//! in progress does not. A real client's connection waits for its request only for a round
//! trip, so a flood has to open `max_total` connections within that time to push it out.
//! Only when every connection is busy is a new one refused.
//!
//! # Limitations
//! Clients behind one proxy or NAT share one address and so one share: raise
//! `max_per_client` for them.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body::{Body, Frame, SizeHint};
use tokio::sync::watch;

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
    /// Connections waiting for a request, by when they started waiting (oldest first): the
    /// ones a full listener closes to make room.
    waiting: BTreeMap<u64, Arc<Place>>,
    /// Each connection's state, by [`Place::id`]; gone once it is closed for room or ended.
    places: HashMap<u64, PlaceState>,
    /// Sequence of ids and of waiting marks.
    next: u64,
    /// Connections closed for room since the last log line, and when that line was written.
    evicted_unlogged: u64,
    evicted_logged: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct PlaceState {
    /// Requests being served (headers in, response not yet all sent).
    busy: usize,
    /// Of those, the ones waiting for more of their request body ([`PausingBody`]).
    paused: usize,
    /// Its key in `waiting` while every request it serves is paused (or there is none).
    waiting_since: Option<u64>,
}

impl PlaceState {
    fn is_waiting(&self) -> bool {
        self.busy <= self.paused
    }
}

/// One admitted connection.
#[derive(Debug)]
struct Place {
    id: u64,
    client: IpAddr,
    /// Set when the listener closes the connection to make room.
    evicted: watch::Sender<bool>,
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

    /// A place for a connection from `client`, or why there is none (logged here). A full
    /// listener first closes the connection that has waited longest for a request (module
    /// docs).
    pub fn admit(&self, client: IpAddr) -> Result<Ticket, Refusal> {
        let mut counts = self.lock();
        let from_client = counts.per_client.get(&client).copied().unwrap_or(0);
        if counts.total >= self.inner.max_total && from_client < self.inner.max_per_client {
            self.evict_oldest_waiting(&mut counts);
        }
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
        let id = counts.next;
        counts.next += 1;
        let (evicted, _) = watch::channel(false);
        let place = Arc::new(Place {
            id,
            client,
            evicted,
        });
        counts.places.insert(
            id,
            PlaceState {
                busy: 0,
                paused: 0,
                waiting_since: None,
            },
        );
        Self::start_waiting(&mut counts, &place);
        Ok(Ticket {
            activity: Activity {
                admission: self.clone(),
                place,
            },
        })
    }

    /// Closes the connection that has waited longest for a request, if any: its place is
    /// given back at once, and its task drops the connection when it sees [`Ticket::evicted`].
    fn evict_oldest_waiting(&self, counts: &mut Counts) {
        let Some((_, place)) = counts.waiting.pop_first() else {
            return;
        };
        counts.places.remove(&place.id);
        Self::give_back(counts, place.client);
        place.evicted.send_replace(true);
        counts.evicted_unlogged += 1;
        let due = counts
            .evicted_logged
            .is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL);
        if due {
            let evicted = std::mem::take(&mut counts.evicted_unlogged);
            counts.evicted_logged = Some(Instant::now());
            tracing::warn!(
                listener = self.inner.listener,
                last_client = %place.client,
                evicted_since_last_line = evicted,
                connections = counts.total,
                max_connections = self.inner.max_total,
                "listener full: closed the connections that waited longest for a request"
            );
        }
    }

    fn start_waiting(counts: &mut Counts, place: &Arc<Place>) {
        let mark = counts.next;
        counts.next += 1;
        if let Some(state) = counts.places.get_mut(&place.id) {
            state.waiting_since = Some(mark);
            counts.waiting.insert(mark, Arc::clone(place));
        }
    }

    fn give_back(counts: &mut Counts, client: IpAddr) {
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.per_client.get_mut(&client) {
            *n -= 1;
            if *n == 0 {
                counts.per_client.remove(&client);
            }
        }
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

    /// The connection ended: its place back, unless it was already given back for room.
    fn release(&self, place: &Place) {
        let mut counts = self.lock();
        let Some(state) = counts.places.remove(&place.id) else {
            return;
        };
        if let Some(mark) = state.waiting_since {
            counts.waiting.remove(&mark);
        }
        Self::give_back(&mut counts, place.client);
    }

    /// Applies `change` to the connection's state and moves it into or out of `waiting`.
    fn update(&self, place: &Arc<Place>, change: impl FnOnce(&mut PlaceState)) {
        let mut counts = self.lock();
        let Some(state) = counts.places.get_mut(&place.id) else {
            return;
        };
        change(state);
        match (state.is_waiting(), state.waiting_since) {
            (true, None) => Self::start_waiting(&mut counts, place),
            (false, Some(mark)) => {
                state.waiting_since = None;
                counts.waiting.remove(&mark);
            }
            _ => {}
        }
    }
}

/// A connection's place; given back when dropped.
#[derive(Debug)]
pub struct Ticket {
    activity: Activity,
}

impl Ticket {
    /// What the connection's service marks its requests with (cheap to clone).
    pub fn activity(&self) -> Activity {
        self.activity.clone()
    }

    /// Completes when the listener has closed this connection to make room: the connection's
    /// task then drops the connection.
    pub async fn evicted(&self) {
        let mut evicted = self.activity.place.evicted.subscribe();
        // The sender lives in the place this ticket holds: the wait ends only by eviction.
        let _ = evicted.wait_for(|evicted| *evicted).await;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.activity.admission.release(&self.activity.place);
    }
}

/// Marks a connection's requests busy, so a full listener does not close it for room.
#[derive(Debug, Clone)]
pub struct Activity {
    admission: Admission,
    place: Arc<Place>,
}

impl Activity {
    /// A request's headers are in: busy until the guard is dropped, which [`HeldBody`] does
    /// when the response has been sent.
    pub fn busy(&self) -> Busy {
        self.admission.update(&self.place, |s| s.busy += 1);
        Busy {
            activity: self.clone(),
        }
    }

    fn pause(&self) {
        self.admission.update(&self.place, |s| s.paused += 1);
    }

    fn resume(&self) {
        self.admission
            .update(&self.place, |s| s.paused = s.paused.saturating_sub(1));
    }
}

/// A request being served; the connection waits for the next one when dropped.
#[derive(Debug)]
pub struct Busy {
    activity: Activity,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.activity
            .admission
            .update(&self.activity.place, |s| s.busy = s.busy.saturating_sub(1));
    }
}

/// A request body that counts its connection as waiting (closable for room) while it waits
/// for the client's next bytes: a client that sends headers and then stalls its body is as
/// idle as one that stalls its headers. Each frame that arrives makes it busy again, and it
/// is the newest of the waiting when it next waits.
#[derive(Debug)]
pub struct PausingBody<B> {
    inner: B,
    activity: Activity,
    paused: bool,
}

impl<B> PausingBody<B> {
    /// `inner`, reporting its waits to `activity`'s connection.
    pub fn new(inner: B, activity: Activity) -> PausingBody<B> {
        PausingBody {
            inner,
            activity,
            paused: false,
        }
    }
}

impl<B: Body + Unpin> Body for PausingBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match (&polled, this.paused) {
            (Poll::Pending, false) => {
                this.activity.pause();
                this.paused = true;
            }
            (Poll::Ready(_), true) => {
                this.activity.resume();
                this.paused = false;
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for PausingBody<B> {
    fn drop(&mut self) {
        if self.paused {
            self.activity.resume();
        }
    }
}

/// A response body that keeps its connection [`Busy`] until it has been sent (or dropped).
#[derive(Debug)]
pub struct HeldBody<B> {
    inner: B,
    _busy: Busy,
}

impl<B> HeldBody<B> {
    /// `inner`, holding `busy` for as long as it lives.
    pub fn new(inner: B, busy: Busy) -> HeldBody<B> {
        HeldBody { inner, _busy: busy }
    }
}

impl<B: Body + Unpin> Body for HeldBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
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
        // Serving requests, none of them is closed to make room.
        let busy = [&a1, &a2, &b1].map(|t| t.activity().busy());
        assert_eq!(admission.admit(c).err(), Some(Refusal::Full));
        assert_eq!(admission.connections(), 3);
        drop(a1);
        let c1 = admission.admit(c).expect("a place came free");
        drop((busy, a2, b1, c1));
        assert_eq!(admission.connections(), 0);
        assert!(admission.lock().per_client.is_empty(), "no address kept");
        let _again = admission.admit(a).expect("all given back");
    }

    /// Whether `ticket`'s connection has been closed for room.
    fn is_evicted(ticket: &Ticket) -> bool {
        *ticket.activity.place.evicted.borrow()
    }

    #[test]
    fn a_full_listener_closes_the_longest_waiting_connection_never_a_busy_one() {
        let admission = Admission::new("test", 3, 3);
        let ip = |n: u8| IpAddr::from([10, 0, 0, n]);
        let first = admission.admit(ip(1)).expect("first");
        let second = admission.admit(ip(2)).expect("second");
        let third = admission.admit(ip(3)).expect("third");
        // The first is served now; the second waits longest of the idle ones.
        let busy = first.activity().busy();
        let fourth = admission.admit(ip(4)).expect("room made");
        assert!(
            is_evicted(&second),
            "the longest-waiting idle one gives way"
        );
        assert!(!is_evicted(&first) && !is_evicted(&third));
        assert_eq!(admission.connections(), 3);
        // The first waits again once its response is out: now the newest of the waiting.
        drop(busy);
        let fifth = admission.admit(ip(5)).expect("room made");
        assert!(is_evicted(&third), "third waited longer than first");
        assert!(!is_evicted(&first));
        // All busy: nothing to close, so a newcomer is refused.
        let _busy = [&first, &fourth, &fifth].map(|t| t.activity().busy());
        assert_eq!(admission.admit(ip(6)).err(), Some(Refusal::Full));
        // An evicted ticket's drop does not give its place back twice.
        drop((second, third));
        assert_eq!(admission.connections(), 3);
        assert!(
            !admission.lock().per_client.contains_key(&ip(2)),
            "the evicted client's count went with it"
        );
    }

    #[test]
    fn a_request_waiting_for_its_body_counts_as_waiting() {
        let admission = Admission::new("test", 2, 2);
        let ip = |n: u8| IpAddr::from([10, 0, 0, n]);
        let a = admission.admit(ip(1)).expect("a");
        let b = admission.admit(ip(2)).expect("b");
        let _busy = [&a, &b].map(|t| t.activity().busy());
        assert_eq!(admission.admit(ip(3)).err(), Some(Refusal::Full));
        b.activity().pause();
        let _c = admission.admit(ip(3)).expect("room made");
        assert!(is_evicted(&b), "the stalled body gave way");
        assert!(!is_evicted(&a), "the one being served did not");
    }

    #[tokio::test]
    async fn an_evicted_ticket_hears_of_it() {
        let admission = Admission::new("test", 1, 1);
        let old = admission.admit(IpAddr::from([10, 0, 0, 1])).expect("first");
        let waiter = tokio::spawn(async move {
            old.evicted().await;
        });
        tokio::task::yield_now().await;
        let _new = admission
            .admit(IpAddr::from([10, 0, 0, 2]))
            .expect("room made");
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the old connection hears it was closed for room")
            .expect("no panic");
    }
}
