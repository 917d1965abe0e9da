//! How many failed secret checks the ramdisk call-backs take (`lookup`, `heartbeat`,
//! `pass_deploy_info`): per client address and per node, each a token bucket, in bounded
//! memory.
//!
//! # Design
//! A *failure* is a call-back that named a node it may not call about: a wrong or missing agent
//! token or deploy key (403), or a node that is unknown or holds no secret (404, counted too:
//! otherwise an outsider could list node names and UUIDs for free). Each failure takes one
//! token from the bucket of the client's address and, for a 403, from the bucket of the node;
//! a bucket holds `per_minute` tokens and gets them back at `per_minute` a minute.
//!
//! - An address whose bucket is empty gets 429 with `Retry-After` for every call-back, before
//!   its body is read or a node looked at: a guesser's own address stops, nobody else's does.
//! - A node whose bucket is empty answers a wrong secret with 429 instead of 403, and its
//!   refusals are no longer logged one by one. The right secret is checked first and is never
//!   refused by the node's count: a storm of wrong tokens from many addresses (which the
//!   address buckets let through, a few each) cannot keep the node's own agent out. The
//!   guesses themselves are not made cheaper (the secret lives in the store, and a guess has to
//!   be compared with it), but the address buckets bound how many each address makes, and the
//!   secrets are 256-bit random strings no rate of guessing gets through.
//!
//! One `warn` line is logged when an address or a node starts being throttled, and none per
//! request; it names the address or the node, never a secret. A bucket that is full again
//! (no failure for a minute) is the same as none and is dropped.
//!
//! # Limitations
//! Each table keeps at most [`MAX_TRACKED`] keys; past that the key that failed longest ago is
//! forgotten, so a flood from more addresses than that (IPv6 is tracked per /64, so this takes
//! that many /64 prefixes) can wipe an address's count. Clients behind one NAT or proxy share
//! one address and one bucket: raise `api.callback_failures_per_client` for them.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use uuid::Uuid;

/// Most keys one table keeps (about 80 bytes each: under 1 MiB per table).
pub const MAX_TRACKED: usize = 8192;
/// The period the limits are counted over: `per_minute` failures are allowed in a burst, and
/// come back at that rate.
const WINDOW: Duration = Duration::from_secs(60);
/// Failed call-back checks per minute from one address (`api.callback_failures_per_client`):
/// a ramdisk that looks its node up before the node waits for it fails a few times with IPA's
/// back-off (1, 2, 4 … 30 s), a guesser fails many times a second.
pub const DEFAULT_PER_CLIENT: u32 = 10;
/// Failed call-back checks per minute against one node (`api.callback_failures_per_node`): a
/// stale agent of an earlier deploy heartbeats every few seconds at most.
pub const DEFAULT_PER_NODE: u32 = 20;

/// How many failures the call-backs take before refusing (`api.callback_failures_per_client`,
/// `api.callback_failures_per_node`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureLimits {
    /// Failures per minute from one client address (IPv6: one /64).
    pub per_client: u32,
    /// Failures per minute against one node.
    pub per_node: u32,
}

impl Default for FailureLimits {
    fn default() -> Self {
        FailureLimits {
            per_client: DEFAULT_PER_CLIENT,
            per_node: DEFAULT_PER_NODE,
        }
    }
}

/// One key's bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
    /// Whether it ran empty and has not been full since: the `warn` is logged once per episode.
    throttled: bool,
    /// Its place in the eviction order.
    seq: u64,
}

/// What a failure did to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// The key may still fail.
    Allowed,
    /// This failure emptied the bucket: the key is throttled from now on (log it).
    StartedThrottling,
    /// The bucket was empty already.
    Throttled,
}

/// Token buckets of failures, one per key, at most `cap` keys.
#[derive(Debug)]
pub struct FailureLimiter<K> {
    per_minute: f64,
    cap: usize,
    buckets: HashMap<K, Bucket>,
    /// Keys by the sequence number of their last failure: the first is the one to forget.
    order: BTreeMap<u64, K>,
    next_seq: u64,
}

impl<K: Hash + Eq + Clone> FailureLimiter<K> {
    /// `per_minute` failures per key (0 is taken as 1), at most `cap` keys (0 taken as 1).
    pub fn new(per_minute: u32, cap: usize) -> FailureLimiter<K> {
        FailureLimiter {
            per_minute: f64::from(per_minute.max(1)),
            cap: cap.max(1),
            buckets: HashMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
        }
    }

    fn rate_per_sec(&self) -> f64 {
        self.per_minute / WINDOW.as_secs_f64()
    }

    /// The bucket's tokens at `now`, refilled since it was last touched.
    fn level(&self, bucket: &Bucket, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        (bucket.tokens + elapsed * self.rate_per_sec()).min(self.per_minute)
    }

    /// How long `key` must wait before its next failure would be counted rather than refused,
    /// or `None` when it is not throttled.
    pub fn retry_after(&self, key: &K, now: Instant) -> Option<Duration> {
        let bucket = self.buckets.get(key)?;
        let level = self.level(bucket, now);
        if level >= 1.0 {
            return None;
        }
        Some(Duration::from_secs_f64((1.0 - level) / self.rate_per_sec()))
    }

    /// Counts one failure of `key` at `now`.
    pub fn fail(&mut self, key: &K, now: Instant) -> Counted {
        let seq = self.next_seq;
        self.next_seq += 1;
        let existing = self.buckets.get(key).copied();
        let mut bucket = match existing {
            Some(bucket) => {
                self.order.remove(&bucket.seq);
                let tokens = self.level(&bucket, now);
                Bucket {
                    tokens,
                    at: now,
                    // Full again since the last failure: a new episode.
                    throttled: bucket.throttled && tokens < self.per_minute,
                    seq,
                }
            }
            None => {
                self.make_room(now);
                Bucket {
                    tokens: self.per_minute,
                    at: now,
                    throttled: false,
                    seq,
                }
            }
        };
        let counted = if bucket.tokens < 1.0 {
            Counted::Throttled
        } else {
            bucket.tokens -= 1.0;
            if bucket.tokens < 1.0 && !bucket.throttled {
                bucket.throttled = true;
                Counted::StartedThrottling
            } else {
                Counted::Allowed
            }
        };
        self.buckets.insert(key.clone(), bucket);
        self.order.insert(seq, key.clone());
        counted
    }

    /// Makes room for one more key: drops the full buckets at the front of the eviction order
    /// (they are worth nothing), then, if still at the cap, the key that failed longest ago.
    fn make_room(&mut self, now: Instant) {
        while self.buckets.len() >= self.cap {
            let Some((&seq, _)) = self.order.iter().next() else {
                return;
            };
            if let Some(key) = self.order.remove(&seq) {
                self.buckets.remove(&key);
            }
        }
        // Cheap clean-up of the oldest entries that are full again, a few per insert, so a
        // table that saw a burst once does not stay at its cap.
        for _ in 0..4 {
            let Some((&seq, key)) = self.order.iter().next() else {
                return;
            };
            let full = self
                .buckets
                .get(key)
                .is_none_or(|b| self.level(b, now) >= self.per_minute);
            if !full {
                return;
            }
            if let Some(key) = self.order.remove(&seq) {
                self.buckets.remove(&key);
            }
        }
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

/// The key of a client address: IPv4 as is (also when mapped into IPv6), IPv6 by its /64,
/// the smallest block one host is usually given, so rotating through a prefix gains nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientKey(IpAddr);

impl From<IpAddr> for ClientKey {
    fn from(ip: IpAddr) -> ClientKey {
        match ip {
            IpAddr::V4(_) => ClientKey(ip),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => ClientKey(IpAddr::V4(v4)),
                None => {
                    let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                    ClientKey(IpAddr::V6(prefix.into()))
                }
            },
        }
    }
}

impl std::fmt::Display for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// A call-back refused for too many failures: 429 with `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    /// Whole seconds until a failure is counted again (at least 1).
    pub retry_after_secs: u64,
}

impl Throttled {
    fn after(wait: Duration) -> Throttled {
        Throttled {
            retry_after_secs: wait.as_secs_f64().ceil().max(1.0) as u64,
        }
    }
}

/// The call-backs' two tables (module docs); shared by every request (cheap to share in an
/// `Arc`; one short lock per failed or throttled call, none for a call that succeeds).
#[derive(Debug)]
pub struct FailedChecks {
    clients: Mutex<FailureLimiter<ClientKey>>,
    nodes: Mutex<FailureLimiter<Uuid>>,
}

impl FailedChecks {
    /// Tables with `limits`.
    pub fn new(limits: FailureLimits) -> FailedChecks {
        FailedChecks::with_capacity(limits, MAX_TRACKED)
    }

    /// Tables of at most `cap` keys each (tests).
    pub fn with_capacity(limits: FailureLimits, cap: usize) -> FailedChecks {
        FailedChecks {
            clients: Mutex::new(FailureLimiter::new(limits.per_client, cap)),
            nodes: Mutex::new(FailureLimiter::new(limits.per_node, cap)),
        }
    }

    // A panic elsewhere cannot leave a bucket half written (every update is one insert), so a
    // poisoned lock is still good to use.
    fn clients(&self) -> MutexGuard<'_, FailureLimiter<ClientKey>> {
        self.clients.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn nodes(&self) -> MutexGuard<'_, FailureLimiter<Uuid>> {
        self.nodes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `client` is throttled: asked before a call-back's body is read.
    pub fn check_client(&self, client: IpAddr) -> Result<(), Throttled> {
        self.check_client_at(client, Instant::now())
    }

    fn check_client_at(&self, client: IpAddr, now: Instant) -> Result<(), Throttled> {
        match self.clients().retry_after(&ClientKey::from(client), now) {
            Some(wait) => Err(Throttled::after(wait)),
            None => Ok(()),
        }
    }

    /// Counts a failed check from `client` (when known) about `node` (when the node exists and
    /// holds a secret, i.e. a 403). `Err` when the node's bucket is empty: answer 429 rather
    /// than the 403.
    pub fn failed(&self, client: Option<IpAddr>, node: Option<Uuid>) -> Result<(), Throttled> {
        self.failed_at(client, node, Instant::now())
    }

    fn failed_at(
        &self,
        client: Option<IpAddr>,
        node: Option<Uuid>,
        now: Instant,
    ) -> Result<(), Throttled> {
        if let Some(client) = client {
            let key = ClientKey::from(client);
            let counted = self.clients().fail(&key, now);
            if counted == Counted::StartedThrottling {
                tracing::warn!(
                    client = %key,
                    "call-backs from this address throttled: too many wrong tokens, deploy \
                     keys or unknown nodes (429 until the rate falls)"
                );
            }
        }
        let Some(node) = node else {
            return Ok(());
        };
        let mut nodes = self.nodes();
        let counted = nodes.fail(&node, now);
        let wait = nodes.retry_after(&node, now);
        drop(nodes);
        if counted == Counted::StartedThrottling {
            tracing::warn!(
                node = %node,
                "wrong agent tokens or deploy keys for this node throttled: 429 until the rate \
                 falls; the right one is still taken"
            );
        }
        match (counted, wait) {
            (Counted::Throttled, Some(wait)) => Err(Throttled::after(wait)),
            _ => Ok(()),
        }
    }

    /// Whether the node's wrong secrets are answered with 429 now (so the refusal need not be
    /// logged again).
    pub fn node_throttled(&self, node: Uuid) -> bool {
        self.nodes().retry_after(&node, Instant::now()).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn a_bucket_allows_its_burst_then_refuses_then_refills() {
        let mut limiter = FailureLimiter::new(10, 100);
        let t0 = Instant::now();
        for n in 1..=9 {
            assert_eq!(limiter.fail(&"a", t0), Counted::Allowed, "failure {n}");
            assert_eq!(limiter.retry_after(&"a", t0), None, "after {n}");
        }
        assert_eq!(limiter.fail(&"a", t0), Counted::StartedThrottling);
        let wait = limiter.retry_after(&"a", t0).expect("throttled");
        assert!(
            (Duration::from_secs(5)..=Duration::from_secs(6)).contains(&wait),
            "one token in 6 s: {wait:?}"
        );
        assert_eq!(limiter.fail(&"a", t0), Counted::Throttled);
        assert_eq!(limiter.retry_after(&"b", t0), None, "other keys unaffected");
        // One token back after 6 s: one failure counted, throttled again, not logged again.
        let t6 = t0 + Duration::from_secs(6);
        assert_eq!(limiter.retry_after(&"a", t6), None);
        assert_eq!(limiter.fail(&"a", t6), Counted::Allowed);
        assert!(limiter.retry_after(&"a", t6).is_some());
        assert_eq!(limiter.fail(&"a", t6), Counted::Throttled);
        // Full after a quiet minute: a new episode, logged again.
        let later = t6 + WINDOW;
        assert_eq!(limiter.retry_after(&"a", later), None);
        for _ in 1..=9 {
            assert_eq!(limiter.fail(&"a", later), Counted::Allowed);
        }
        assert_eq!(limiter.fail(&"a", later), Counted::StartedThrottling);
    }

    #[test]
    fn a_limit_of_one_throttles_at_the_first_failure() {
        let mut limiter = FailureLimiter::new(0, 10);
        let t0 = Instant::now();
        assert_eq!(limiter.fail(&1, t0), Counted::StartedThrottling);
        assert_eq!(
            limiter.retry_after(&1, t0),
            Some(Duration::from_secs(60)),
            "1 a minute"
        );
    }

    #[test]
    fn memory_is_bounded_and_the_oldest_key_goes_first() {
        let mut limiter = FailureLimiter::new(2, 3);
        let t0 = Instant::now();
        for key in 0..3 {
            limiter.fail(&key, t0);
            limiter.fail(&key, t0);
        }
        assert!(limiter.retry_after(&0, t0).is_some());
        // Key 0 failed again last: key 1 is now the oldest.
        limiter.fail(&0, t0);
        for key in 100..10_100 {
            limiter.fail(&key, t0);
            assert!(limiter.len() <= 3, "{} keys", limiter.len());
        }
        assert_eq!(limiter.order.len(), limiter.len(), "index and table agree");
        assert_eq!(limiter.retry_after(&0, t0), None, "forgotten at last");
        // A flood of new keys forgets key 1 before key 0.
        let mut limiter = FailureLimiter::new(2, 3);
        for key in [0, 1, 2, 0] {
            limiter.fail(&key, t0);
        }
        limiter.fail(&9, t0);
        assert!(limiter.buckets.contains_key(&0));
        assert!(!limiter.buckets.contains_key(&1));
    }

    #[test]
    fn full_buckets_are_dropped_when_room_is_made() {
        let mut limiter = FailureLimiter::new(5, 1000);
        let t0 = Instant::now();
        for key in 0..4 {
            limiter.fail(&key, t0);
        }
        let later = t0 + WINDOW;
        limiter.fail(&99, later);
        assert_eq!(limiter.len(), 1, "the refilled ones are gone");
    }

    #[test]
    fn ipv6_is_keyed_by_its_64_and_mapped_ipv4_as_ipv4() {
        let cases = [
            ("10.0.0.1", "10.0.0.1"),
            ("::ffff:10.0.0.1", "10.0.0.1"),
            ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
            ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
        ];
        for (given, key) in cases {
            assert_eq!(ClientKey::from(ip(given)).to_string(), key, "{given}");
        }
        assert_ne!(
            ClientKey::from(ip("2001:db8:1:2::1")),
            ClientKey::from(ip("2001:db8:1:3::1"))
        );
    }

    #[test]
    fn addresses_and_nodes_are_counted_apart() {
        let checks = FailedChecks::new(FailureLimits {
            per_client: 3,
            per_node: 5,
        });
        let t0 = Instant::now();
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        let node = Uuid::new_v4();
        for _ in 0..3 {
            assert_eq!(checks.failed_at(Some(a), Some(node), t0), Ok(()));
        }
        let refused = checks.check_client_at(a, t0).expect_err("a throttled");
        assert_eq!(refused.retry_after_secs, 20, "3 a minute: one in 20 s");
        assert_eq!(checks.check_client_at(b, t0), Ok(()), "b is not");
        // The node's bucket: 3 of 5 used; b's two more empty it, the next is refused.
        assert_eq!(checks.failed_at(Some(b), Some(node), t0), Ok(()));
        assert_eq!(checks.failed_at(Some(b), Some(node), t0), Ok(()));
        let refused = checks
            .failed_at(None, Some(node), t0)
            .expect_err("node throttled");
        assert_eq!(refused.retry_after_secs, 12, "5 a minute: one in 12 s");
        // Unknown nodes count against the address only.
        let c = ip("10.0.0.3");
        for _ in 0..3 {
            assert_eq!(checks.failed_at(Some(c), None, t0), Ok(()));
        }
        assert!(checks.check_client_at(c, t0).is_err());
    }
}
