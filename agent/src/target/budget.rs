//! How much memory the target spends on write data: a target-wide byte budget, handed out as a
//! fixed share per logged-in session, and within a session one reservation per write buffer.
//!
//! # Design
//! A write's buffer is reserved for its whole expected length before it is allocated, and the
//! reservation lives until the command's disk write has finished (or the command or the
//! connection is dropped). A session can therefore hold at most its share, whatever it
//! announces; the target at most the budget.
//!
//! The budget is split into shares at login instead of being one pool that writes draw from:
//! a session that announces writes and never sends their data holds its reservations for as
//! long as its connection lives, and with one pool a couple of such sessions would leave the
//! real one nothing. With shares, the deploy's session keeps its own whatever the others do;
//! a login beyond the budget is refused (Out of resources).
//!
//! A READ's result draws on the same share, from before the disk is read until its last
//! Data-In PDU is sent: the CmdSN window moves on as each command arrives, so without it an
//! initiator that never reads its answers could queue results without end. "Write" in the
//! names below is the larger user; read results count the same way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::commands::MAX_TRANSFER_BYTES;

/// How much more data than its CDB asks for a WRITE may carry (residual overflow of the
/// initiator's buffer) before it is refused instead of drained.
pub const MAX_WRITE_SLACK: u32 = 1 << 20;

/// The write buffers one session may hold at once: the largest command (Block Limits
/// MAXIMUM TRANSFER LENGTH plus the residual slack the connection accepts) must fit. The
/// conductor's initiator keeps 16 WRITEs of 1 MiB in flight and qemu-img (libiscsi) a few of
/// 2 MiB, both well within it.
pub const SESSION_WRITE_QUOTA: usize = (MAX_TRANSFER_BYTES + MAX_WRITE_SLACK) as usize;

/// Sessions that may write at once: the deploy's own, one left over from a connection the
/// initiator lost and replaced before the target noticed, and one more (a check with the
/// libiscsi tools while the deploy runs).
pub const MAX_SESSIONS: usize = 3;

/// The default target-wide budget for buffered write data (99 MiB): the deploy ramdisk has
/// 256 to 512 MiB for everything, the image's page cache included, so the target must not
/// take more than about a third of the smallest; the buffer pool's idle buffers
/// (`BufferPool`, at most 32 MiB) come on top.
pub const DEFAULT_WRITE_BUDGET: usize = MAX_SESSIONS * SESSION_WRITE_QUOTA;

/// The target-wide budget: shares for sessions, and the count of bytes reserved in all of them.
#[derive(Debug)]
pub struct WriteBudget {
    shares: Arc<Semaphore>,
    buffered: Arc<AtomicUsize>,
}

impl WriteBudget {
    /// A budget of `bytes` (at least one share).
    pub fn new(bytes: usize) -> WriteBudget {
        WriteBudget {
            shares: Arc::new(Semaphore::new(bytes.max(SESSION_WRITE_QUOTA))),
            buffered: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A session's share, or `None` when the budget has no share left.
    pub fn admit(&self) -> Option<SessionQuota> {
        let share = self
            .shares
            .clone()
            .try_acquire_many_owned(SESSION_WRITE_QUOTA as u32)
            .ok()?;
        Some(SessionQuota {
            _share: share,
            reservations: Arc::new(Semaphore::new(SESSION_WRITE_QUOTA)),
            buffered: self.buffered.clone(),
        })
    }

    /// Bytes reserved for write buffers right now, over all sessions.
    pub fn buffered(&self) -> usize {
        self.buffered.load(Ordering::Relaxed)
    }
}

/// One session's share of the budget; dropped (returned) when the session ends. Commands
/// still running hold their reservations, not the share: the connection waits for them
/// before it ends.
#[derive(Debug)]
pub struct SessionQuota {
    _share: OwnedSemaphorePermit,
    reservations: Arc<Semaphore>,
    buffered: Arc<AtomicUsize>,
}

impl SessionQuota {
    /// Reserves `bytes` now, or `None` when the share has not that much free.
    pub fn try_reserve(&self, bytes: usize) -> Option<Reservation> {
        let n = u32::try_from(bytes).ok()?;
        let permit = self.reservations.clone().try_acquire_many_owned(n).ok()?;
        Some(self.reserved(permit, bytes))
    }

    /// Reserves `bytes`, waiting for reservations to be released. `None`: more than the whole
    /// share.
    pub async fn reserve(&self, bytes: usize) -> Option<Reservation> {
        if bytes > SESSION_WRITE_QUOTA {
            return None;
        }
        let n = u32::try_from(bytes).ok()?;
        // The semaphore is never closed.
        let permit = self.reservations.clone().acquire_many_owned(n).await.ok()?;
        Some(self.reserved(permit, bytes))
    }

    fn reserved(&self, permit: OwnedSemaphorePermit, bytes: usize) -> Reservation {
        self.buffered.fetch_add(bytes, Ordering::Relaxed);
        Reservation {
            _permit: permit,
            bytes,
            buffered: self.buffered.clone(),
        }
    }
}

/// Bytes of one write buffer, counted against the session's share until dropped.
#[derive(Debug)]
pub struct Reservation {
    _permit: OwnedSemaphorePermit,
    bytes: usize,
    buffered: Arc<AtomicUsize>,
}

impl Reservation {
    /// The bytes reserved.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.buffered.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_budget_gives_whole_shares_and_counts_reservations() {
        let budget = WriteBudget::new(2 * SESSION_WRITE_QUOTA + 1);
        let a = budget.admit().expect("a first share");
        let b = budget.admit().expect("a second share");
        assert!(budget.admit().is_none(), "no third share in two and a bit");
        let r1 = a.try_reserve(SESSION_WRITE_QUOTA - 4096).expect("fits");
        assert!(a.try_reserve(8192).is_none(), "over the session's share");
        let r2 = b
            .try_reserve(8192)
            .expect("the other session's share is its own");
        assert_eq!(budget.buffered(), SESSION_WRITE_QUOTA - 4096 + 8192);
        drop(r1);
        assert!(a.try_reserve(8192).is_some(), "released");
        drop(r2);
        assert_eq!(budget.buffered(), 0);
        drop(a);
        assert!(budget.admit().is_some(), "a share returns with its session");
    }

    #[tokio::test]
    async fn target_quota_waits_for_released_reservations() {
        let budget = WriteBudget::new(SESSION_WRITE_QUOTA);
        let q = Arc::new(budget.admit().expect("a share"));
        assert!(q.reserve(SESSION_WRITE_QUOTA + 1).await.is_none());
        let held = q.try_reserve(SESSION_WRITE_QUOTA).expect("all of it");
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.reserve(1 << 20).await.map(|r| r.bytes()) }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "nothing free yet");
        drop(held);
        assert_eq!(waiter.await.expect("joins"), Some(1 << 20));
    }
}
