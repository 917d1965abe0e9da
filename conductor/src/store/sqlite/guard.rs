//! The lock of a reserve whose caller went away (see [`ReserveGuard`]).

use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::{params, Connection};
use tokio::task::{JoinError, JoinHandle};
use uuid::Uuid;

use super::errors::db;
use crate::store::{Node, StoreError};

/// A blocking task that panicked (or was cancelled at shutdown).
pub(super) fn task_failed(what: &str, e: JoinError) -> StoreError {
    StoreError::Database(format!("{what}: the database task failed: {e}"))
}

/// Held while [`crate::store::Store::reserve_node`] waits for its blocking task. If the
/// caller's future is dropped first (an API client that hung up, a timeout), nobody would ever
/// learn that the lock was taken and it would stay taken until the next restart; so the guard
/// waits for the task in the background and releases what it took.
pub(super) struct ReserveGuard {
    pub(super) handle: Option<JoinHandle<Result<Node, StoreError>>>,
    pub(super) conn: Arc<Mutex<Connection>>,
    pub(super) holder: String,
}

impl Drop for ReserveGuard {
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime left (shutdown): the reservation is released by release_all at the
            // next start, as for a crash.
            return;
        };
        let conn = Arc::clone(&self.conn);
        let holder = std::mem::take(&mut self.holder);
        runtime.spawn(async move {
            let Ok(Ok(node)) = handle.await else {
                return;
            };
            let released = tokio::task::spawn_blocking(move || {
                let conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
                release(&conn, node.uuid, &holder)
            })
            .await;
            let error = match released {
                Ok(Ok(())) => {
                    tracing::debug!(node = %node.uuid, "released the lock of an abandoned reserve");
                    return;
                }
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            tracing::warn!(node = %node.uuid, %error, "releasing the lock of an abandoned reserve");
        });
    }
}

pub(super) fn release(conn: &Connection, uuid: Uuid, holder: &str) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE nodes SET reservation = NULL WHERE uuid = ?1 AND reservation = ?2",
        params![uuid.to_string(), holder],
    )
    .map_err(|e| db(&format!("releasing node {uuid}"), e))?;
    Ok(())
}
