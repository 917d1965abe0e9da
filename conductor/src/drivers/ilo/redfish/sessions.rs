//! Redfish sessions shared by every client of the conductor: one session per BMC and user,
//! reused across operations and node tasks, logged out when idle and at shutdown.
//!
//! # Design
//! A real iLO has a few dozen session slots for all its users, and a session left open holds
//! one until the iLO's idle timeout (30 min by default; 15 min is the shortest setting,
//! docs/ilo-quirks.md §1). A client per node task that logged in and never out filled them, so
//! the clients of a conductor take their session from one [`RedfishSessions`]:
//! - an entry per base URL (`https://host:port`) and user name, holding the token, the session
//!   URI, a salted SHA-256 of the password it was made with (never the password) and when it
//!   was last used. A client whose password hashes differently does not get it: it logs in,
//!   and its session replaces the old one, which is logged out;
//! - one login at a time per entry, so tasks for one BMC starting together make one session
//!   and share it (a Redfish session is not tied to a request or a connection);
//! - a client that gets 401 with the cached token drops it (only if it is still the cached
//!   one: another task may have logged in again already) and takes the next one, logging in
//!   once if there is none;
//! - a sweep, every quarter of the idle time (at most [`MAX_SWEEP_INTERVAL`]), logs out
//!   (DELETE of the session URI) sessions unused for the idle time: [`DEFAULT_IDLE`], 5 min,
//!   well below the iLO's shortest idle timeout, so a cached token is very unlikely to have
//!   expired on the iLO, while a node worked on every few minutes (power sync, a deploy's
//!   steps) keeps its one session;
//! - [`RedfishSessions::close_all`] logs every session out at shutdown, within
//!   [`CLOSE_ALL_WAIT`].
//!
//! A logout that fails is logged and forgotten: the iLO ends the session at its idle timeout.
//! Services without a SessionService (HTTP Basic on every request) have nothing cached.
//!
//! The conductor's cache is [`RedfishSessions::conductor`], one per process: `Bmc` hands it to
//! the clients it builds through `IloConfig::redfish_sessions`. The sweep task is started on
//! the Tokio runtime of the first session stored (again if that runtime has gone).
//!
//! # Limitations
//! A task still running after `close_all` (one that outlived the drain) may log in again; that
//! session is left to the iLO's idle timeout. Two nodes naming the same BMC and user with
//! different passwords take turns replacing (and logging out) each other's session: one login
//! and one logout per turn, nothing left open.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::drivers::ilo::http::map_reqwest_error;
use crate::drivers::Secret;
use vmdeploy_shared::error::Chain;

/// How long a session may go unused before the sweep logs it out.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(5 * 60);
/// The longest time between two sweeps.
pub const MAX_SWEEP_INTERVAL: Duration = Duration::from_secs(30);
/// The shortest time between two sweeps (tests use idle times of milliseconds).
const MIN_SWEEP_INTERVAL: Duration = Duration::from_millis(10);
/// The bound on one logout (a DELETE), whatever the node's `client_timeout`.
const LOGOUT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RedfishSessions::close_all`] waits for the logouts at shutdown.
pub const CLOSE_ALL_WAIT: Duration = Duration::from_secs(15);
/// Logouts sent at once by a sweep or at shutdown.
const LOGOUTS_AT_ONCE: usize = 32;

/// The cache of Redfish sessions; clones share it.
#[derive(Clone)]
pub struct RedfishSessions {
    inner: Arc<Inner>,
}

struct Inner {
    idle: Duration,
    /// Mixed into the password hashes, so they are worth nothing outside this process.
    salt: [u8; 16],
    entries: Mutex<HashMap<Key, Arc<Entry>>>,
    logins: AtomicU64,
    reuses: AtomicU64,
    logouts: AtomicU64,
    sweeper: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    base: String,
    username: String,
}

/// The session of one BMC and user.
pub(crate) struct Entry {
    /// Held while logging in, so tasks for the same BMC make one session.
    login: tokio::sync::Mutex<()>,
    session: Mutex<Option<Cached>>,
}

/// A session in the cache.
struct Cached {
    token: Secret,
    uri: Option<String>,
    password: PasswordHash,
    last_used: Instant,
    /// What a logout needs: the client that logged in, the service, the node's timeout.
    http: reqwest::Client,
    base: String,
    timeout: Duration,
}

impl Entry {
    /// Waits for a login to the same BMC to end, and holds off others until dropped.
    pub(crate) async fn lock_login(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.login.lock().await
    }
}

/// SHA-256 of the process salt and a password.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct PasswordHash([u8; 32]);

/// A session as a client uses it.
#[derive(Debug, Clone)]
pub(crate) struct SessionToken {
    /// `X-Auth-Token`.
    pub token: Secret,
    /// The session URI (DELETE logs out).
    pub uri: Option<String>,
}

/// What a client hands over with a session it opened: enough to log it out later.
pub(crate) struct Opened {
    pub token: Secret,
    pub uri: Option<String>,
    pub http: reqwest::Client,
    pub timeout: Duration,
}

impl fmt::Debug for RedfishSessions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No lock taken: a config holding the cache may be printed anywhere.
        f.debug_struct("RedfishSessions")
            .field("idle", &self.inner.idle)
            .field("logins", &self.logins())
            .field("logouts", &self.logouts())
            .finish()
    }
}

impl Default for RedfishSessions {
    fn default() -> Self {
        RedfishSessions::new(DEFAULT_IDLE)
    }
}

impl RedfishSessions {
    /// An empty cache whose sessions are logged out after `idle` unused.
    pub fn new(idle: Duration) -> Self {
        let mut salt = [0u8; 16];
        if let Err(e) = getrandom::fill(&mut salt) {
            // The hash still tells passwords apart; it is only easier to guess at.
            tracing::warn!(error = %e, "no random salt for the Redfish session cache");
        }
        RedfishSessions {
            inner: Arc::new(Inner {
                idle,
                salt,
                entries: Mutex::default(),
                logins: AtomicU64::new(0),
                reuses: AtomicU64::new(0),
                logouts: AtomicU64::new(0),
                sweeper: Mutex::new(None),
            }),
        }
    }

    /// The conductor's cache (one per process), with [`DEFAULT_IDLE`].
    pub fn conductor() -> &'static RedfishSessions {
        static CONDUCTOR: OnceLock<RedfishSessions> = OnceLock::new();
        CONDUCTOR.get_or_init(RedfishSessions::default)
    }

    /// The idle time after which a session is logged out.
    pub fn idle(&self) -> Duration {
        self.inner.idle
    }

    /// Sessions opened for this cache's clients so far.
    pub fn logins(&self) -> u64 {
        self.inner.logins.load(Ordering::Relaxed)
    }

    /// Times a client took a session another client (or task) had opened.
    pub fn reuses(&self) -> u64 {
        self.inner.reuses.load(Ordering::Relaxed)
    }

    /// Sessions logged out (DELETE answered 2xx) so far.
    pub fn logouts(&self) -> u64 {
        self.inner.logouts.load(Ordering::Relaxed)
    }

    /// Sessions in the cache now.
    pub fn len(&self) -> usize {
        self.entries()
            .iter()
            .filter(|e| lock(&e.session).is_some())
            .count()
    }

    /// Whether no session is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cached token of `base` and `username`, if any (tests).
    #[cfg(test)]
    pub(crate) fn token(&self, base: &str, username: &str) -> Option<String> {
        let key = Key {
            base: base.to_string(),
            username: username.to_string(),
        };
        let entry = lock(&self.inner.entries).get(&key).cloned()?;
        let session = lock(&entry.session);
        session.as_ref().map(|s| s.token.expose().clone())
    }

    /// The hash a password is compared by.
    pub(crate) fn password_hash(&self, password: &Secret) -> PasswordHash {
        let mut hasher = Sha256::new();
        hasher.update(self.inner.salt);
        hasher.update(password.expose().as_bytes());
        PasswordHash(hasher.finalize().into())
    }

    /// The entry of `base` and `username`, made if new.
    pub(crate) fn entry(&self, base: &str, username: &str) -> Arc<Entry> {
        let key = Key {
            base: base.to_string(),
            username: username.to_string(),
        };
        lock(&self.inner.entries)
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Entry {
                    login: tokio::sync::Mutex::new(()),
                    session: Mutex::new(None),
                })
            })
            .clone()
    }

    /// The session of `entry` made with `password`, marked used; `None` when there is none
    /// or it was made with another password.
    pub(crate) fn current(&self, entry: &Entry, password: PasswordHash) -> Option<SessionToken> {
        let mut session = lock(&entry.session);
        let cached = session.as_mut().filter(|s| s.password == password)?;
        cached.last_used = Instant::now();
        Some(SessionToken {
            token: cached.token.clone(),
            uri: cached.uri.clone(),
        })
    }

    /// Counts a client taking a session it did not open.
    pub(crate) fn count_reuse(&self, base: &str) {
        self.inner.reuses.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%base, "Redfish session reused");
        self.ensure_sweeper();
    }

    /// Keeps the session a client of `base` just opened with `password`; a session it
    /// replaces (made with another password) is logged out in the background.
    pub(crate) fn store(&self, entry: &Entry, base: &str, password: PasswordHash, opened: Opened) {
        self.inner.logins.fetch_add(1, Ordering::Relaxed);
        let replaced = lock(&entry.session).replace(Cached {
            token: opened.token,
            uri: opened.uri,
            password,
            last_used: Instant::now(),
            http: opened.http,
            base: base.to_string(),
            timeout: opened.timeout,
        });
        tracing::debug!(%base, logins = self.logins(), "Redfish session cached");
        if let Some(old) = replaced {
            tracing::debug!(%base, "Redfish session replaced (the password changed): logging the old one out");
            let this = self.clone();
            tokio::spawn(async move { this.log_out(old, "replaced").await });
        }
        self.ensure_sweeper();
    }

    /// Drops the session of `entry` if its token is still `token` (the BMC refused it); no
    /// logout is sent, the BMC no longer knows it. False when another session is there.
    pub(crate) fn forget(&self, entry: &Entry, base: &str, token: &Secret) -> bool {
        let mut session = lock(&entry.session);
        if session
            .as_ref()
            .is_some_and(|s| s.token.expose() == token.expose())
        {
            *session = None;
            tracing::debug!(%base, "Redfish session dropped from the cache (refused by the BMC)");
            true
        } else {
            false
        }
    }

    /// Logs out the sessions unused for the idle time.
    pub async fn sweep(&self) {
        let idle = self.inner.idle;
        let expired: Vec<Cached> = self
            .entries()
            .iter()
            .filter_map(|entry| {
                let mut session = lock(&entry.session);
                if session.as_ref()?.last_used.elapsed() >= idle {
                    session.take()
                } else {
                    None
                }
            })
            .collect();
        self.forget_empty_entries();
        if !expired.is_empty() {
            tracing::debug!(
                sessions = expired.len(),
                idle_s = idle.as_secs(),
                "logging out idle Redfish sessions"
            );
            self.log_out_all(expired, "idle").await;
        }
    }

    /// Logs out every cached session (at shutdown), within [`CLOSE_ALL_WAIT`]; sessions not
    /// logged out by then are left to the BMCs' idle timeout.
    pub async fn close_all(&self) {
        self.close_all_within(CLOSE_ALL_WAIT).await;
    }

    async fn close_all_within(&self, wait: Duration) {
        let all: Vec<Cached> = self
            .entries()
            .iter()
            .filter_map(|entry| lock(&entry.session).take())
            .collect();
        self.forget_empty_entries();
        if all.is_empty() {
            return;
        }
        let count = all.len();
        tracing::debug!(sessions = count, "logging out every Redfish session");
        if tokio::time::timeout(wait, self.log_out_all(all, "shutdown"))
            .await
            .is_err()
        {
            tracing::warn!(
                sessions = count,
                wait_s = wait.as_secs(),
                "not every Redfish session was logged out in time: the rest end at the BMCs' idle timeout"
            );
        }
    }

    async fn log_out_all(&self, sessions: Vec<Cached>, why: &'static str) {
        futures_util::stream::iter(sessions)
            .for_each_concurrent(LOGOUTS_AT_ONCE, |s| self.log_out(s, why))
            .await;
    }

    /// DELETEs a session's URI; failures are logged, never returned.
    async fn log_out(&self, session: Cached, why: &'static str) {
        let base = session.base.clone();
        let Some(uri) = session.uri.as_deref() else {
            tracing::debug!(%base, why, "Redfish session without a URI: left to expire");
            return;
        };
        let Some(url) = session_url(&base, uri) else {
            tracing::warn!(%base, uri, why, "Redfish session URI unusable: left to expire");
            return;
        };
        let timeout = session.timeout.min(LOGOUT_TIMEOUT);
        let result = session
            .http
            .delete(&url)
            .header(reqwest::header::ACCEPT, "application/json")
            .header("OData-Version", "4.0")
            .header("X-Auth-Token", session.token.expose())
            .timeout(timeout)
            .send()
            .await;
        match result {
            Ok(reply) if reply.status().is_success() => {
                self.inner.logouts.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%base, why, "Redfish session logged out");
            }
            Ok(reply) if matches!(reply.status().as_u16(), 401 | 404) => {
                tracing::debug!(%base, why, status = %reply.status(), "Redfish session already gone");
            }
            Ok(reply) => {
                tracing::warn!(%base, why, status = %reply.status(), "Redfish logout refused: the session ends at the BMC's idle timeout");
            }
            Err(e) => {
                let error = map_reqwest_error(&url, timeout, &e);
                tracing::warn!(%base, why, error = %Chain(&error), "Redfish logout failed: the session ends at the BMC's idle timeout");
            }
        }
    }

    fn entries(&self) -> Vec<Arc<Entry>> {
        lock(&self.inner.entries).values().cloned().collect()
    }

    /// Drops entries with no session that no client holds (the map stays as large as the
    /// BMCs in use).
    fn forget_empty_entries(&self) {
        lock(&self.inner.entries)
            .retain(|_, entry| Arc::strong_count(entry) > 1 || lock(&entry.session).is_some());
    }

    /// Starts the sweep task if none runs (none yet, or its runtime has gone).
    fn ensure_sweeper(&self) {
        let mut sweeper = lock(&self.inner.sweeper);
        if sweeper.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let every = (self.inner.idle / 4).clamp(MIN_SWEEP_INTERVAL, MAX_SWEEP_INTERVAL);
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        *sweeper = Some(runtime.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                RedfishSessions { inner }.sweep().await;
            }
        }));
    }
}

/// The URL to DELETE for a session URI: its path on `base` (iLO answers an absolute
/// `Location` that may name the iLO by another host name than the one configured).
pub(crate) fn session_url(base: &str, uri: &str) -> Option<String> {
    if uri.starts_with('/') {
        return Some(format!("{base}{uri}"));
    }
    let url = url::Url::parse(uri).ok()?;
    if !matches!(url.scheme(), "https" | "http") {
        return None;
    }
    Some(format!("{base}{}", url.path()))
}

/// Locks a mutex whose data stays consistent even if a holder panicked (each critical section
/// is a single read or write).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_urls_are_taken_onto_the_service() {
        let base = "https://10.0.0.5:443";
        assert_eq!(
            session_url(base, "/redfish/v1/SessionService/Sessions/a1/").as_deref(),
            Some("https://10.0.0.5:443/redfish/v1/SessionService/Sessions/a1/")
        );
        assert_eq!(
            session_url(
                base,
                "https://ilo-name.example/redfish/v1/SessionService/Sessions/a1/"
            )
            .as_deref(),
            Some("https://10.0.0.5:443/redfish/v1/SessionService/Sessions/a1/")
        );
        assert_eq!(session_url(base, "Sessions/a1"), None);
        assert_eq!(session_url(base, "file:///etc/passwd"), None);
    }

    #[test]
    fn passwords_are_compared_by_a_salted_hash() {
        let sessions = RedfishSessions::new(DEFAULT_IDLE);
        let a = sessions.password_hash(&Secret::new("secret"));
        assert!(a == sessions.password_hash(&Secret::new("secret")));
        assert!(a != sessions.password_hash(&Secret::new("secret2")));
        // Another cache (another process) hashes differently.
        let other = RedfishSessions::new(DEFAULT_IDLE);
        assert!(a != other.password_hash(&Secret::new("secret")));
    }
}
