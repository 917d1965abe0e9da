//! PostgreSQL's failures as [`StoreError`]s: a broken unique constraint (read from the
//! constraint names schema.rs spells out) is `Duplicate` naming the field, a broken foreign key `NotFound` of the node, a server that cannot be reached or
//! went away `Unavailable` (503, worth a retry), anything else `Database`.

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use crate::store::broken::Broken;
use crate::store::{Node, Port, StoreError};

fn broken_constraint(e: &tokio_postgres::Error) -> Option<Broken> {
    let db = e.as_db_error()?;
    if *db.code() == SqlState::FOREIGN_KEY_VIOLATION {
        return Some(Broken::ForeignKey);
    }
    if *db.code() != SqlState::UNIQUE_VIOLATION {
        return None;
    }
    Some(Broken::Unique(match db.constraint()? {
        "nodes_uuid_unique" | "ports_uuid_unique" => "uuid",
        "nodes_name_unique" => "name",
        "nodes_instance_uuid_unique" => "instance_uuid",
        "ports_address_unique" => "address",
        _ => return None,
    }))
}

/// `what` failed with `e`: `Unavailable` when the server could not be reached, went away, is
/// starting or shutting down, or has no connection slot left; else `Database`.
pub(super) fn classify(what: &str, e: tokio_postgres::Error) -> StoreError {
    let Some(db) = e.as_db_error() else {
        // No answer from the server: a refused or broken connection, a failed TLS handshake, a
        // timeout. tokio-postgres's message names only the step; the causes say why.
        let mut message = format!("{what}: {e}");
        let mut cause = std::error::Error::source(&e);
        while let Some(inner) = cause {
            message.push_str(&format!(": {inner}"));
            cause = inner.source();
        }
        return StoreError::Unavailable(message);
    };
    let code = db.code().code();
    let transient = code.starts_with("08") // connection exception
        || code.starts_with("57P") // admin or crash shutdown, cannot connect now
        || *db.code() == SqlState::TOO_MANY_CONNECTIONS
        || *db.code() == SqlState::T_R_SERIALIZATION_FAILURE
        || *db.code() == SqlState::T_R_DEADLOCK_DETECTED
        || *db.code() == SqlState::READ_ONLY_SQL_TRANSACTION; // a standby after a failover
    let message = format!("{what}: {} ({code})", db.message());
    if transient {
        StoreError::Unavailable(message)
    } else {
        StoreError::Database(message)
    }
}

/// No pooled connection for `what`.
pub(super) fn pool_error(what: &str, e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) => classify(what, e),
        PoolError::Timeout(kind) => StoreError::Unavailable(format!(
            "{what}: no database connection within {} s ({kind:?})",
            super::connect::POOL_WAIT.as_secs()
        )),
        other => StoreError::Unavailable(format!("{what}: {other}")),
    }
}

/// Maps a failed node write: a taken unique field is `Duplicate` with its value.
pub(super) fn node_write_error(what: &str, node: &Node, e: tokio_postgres::Error) -> StoreError {
    broken_constraint(&e)
        .and_then(|broken| broken.on_node(node))
        .unwrap_or_else(|| classify(what, e))
}

/// Maps a failed port write: a taken UUID or MAC is `Duplicate`, a missing node `NotFound`.
pub(super) fn port_write_error(what: &str, port: &Port, e: tokio_postgres::Error) -> StoreError {
    match broken_constraint(&e) {
        Some(broken) => broken.on_port(port),
        None => classify(what, e),
    }
}
