//! Failed blocking tasks, and the release of a lock.

use rusqlite::{params, Connection};
use tokio::task::JoinError;
use uuid::Uuid;

use super::errors::db;
use crate::store::StoreError;

/// A blocking task that panicked (or was cancelled at shutdown).
pub(super) fn task_failed(what: &str, e: JoinError) -> StoreError {
    StoreError::Database(format!("{what}: the database task failed: {e}"))
}

pub(super) fn release(conn: &Connection, uuid: Uuid, holder: &str) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE nodes SET reservation = NULL WHERE uuid = ?1 AND reservation = ?2",
        params![uuid.to_string(), holder],
    )
    .map_err(|e| db(&format!("releasing node {uuid}"), e))?;
    Ok(())
}
