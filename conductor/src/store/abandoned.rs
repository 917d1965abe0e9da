//! A reserve whose caller went away: both stores run [`crate::store::Store::reserve_node`] as a
//! task of its own and wait for it through [`reserve_to_the_end`].
//!
//! A reserve that commits after its caller's future was dropped (an API client that hung up, a
//! timeout) would hold the node's lock with nobody to release it until the next restart. So the
//! statement runs to its end in its own task, and when the caller is gone by then, what it took
//! is released in the background.

use std::future::Future;
use std::pin::Pin;

use tokio::task::JoinHandle;
use uuid::Uuid;

use super::{Node, StoreError};

/// Releases one node's lock (the store's `release_node` for the reserve's holder).
pub(super) type Release =
    Box<dyn FnOnce(Uuid) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>> + Send>;

/// Waits for `reserve` and returns its answer; releases the lock it took when this future is
/// dropped before the answer reached it.
pub(super) async fn reserve_to_the_end(
    reserve: JoinHandle<Result<Node, StoreError>>,
    release: Release,
) -> Result<Node, StoreError> {
    let mut guard = Guard {
        reserve: Some(reserve),
        release: Some(release),
    };
    let result = match guard.reserve.as_mut() {
        Some(handle) => handle.await,
        // Not reached: the handle was put there just above.
        None => return Err(StoreError::Database("reserving a node: no task".into())),
    };
    // The answer reached the caller: from here on the lock is theirs to release.
    guard.reserve = None;
    result.map_err(|e| {
        StoreError::Database(format!("reserving a node: the database task failed: {e}"))
    })?
}

struct Guard {
    reserve: Option<JoinHandle<Result<Node, StoreError>>>,
    release: Option<Release>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let (Some(handle), Some(release)) = (self.reserve.take(), self.release.take()) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime left (shutdown): the reservation is released by release_all at the
            // next start, as for a crash.
            return;
        };
        runtime.spawn(async move {
            let Ok(Ok(node)) = handle.await else {
                return;
            };
            match release(node.uuid).await {
                Ok(()) => {
                    tracing::debug!(node = %node.uuid, "released the lock of an abandoned reserve")
                }
                Err(e) => tracing::warn!(
                    node = %node.uuid, error = %e,
                    "releasing the lock of an abandoned reserve"
                ),
            }
        });
    }
}
