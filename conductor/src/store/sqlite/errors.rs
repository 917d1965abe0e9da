//! SQLite's failures as [`StoreError`]s: a broken UNIQUE constraint is `Duplicate` naming the
//! field, a broken foreign key `NotFound` of the node, anything else `Database` with what was
//! being done.

use crate::store::{Node, Port, StoreError};

use crate::store::broken::Broken;

/// The message of a `Database` error without its variant (to add context in front).
pub(super) fn strip_db(e: StoreError) -> String {
    match e {
        StoreError::Database(msg) => msg,
        other => other.to_string(),
    }
}

pub(super) fn broken_constraint(e: &rusqlite::Error) -> Option<Broken> {
    let rusqlite::Error::SqliteFailure(err, msg) = e else {
        return None;
    };
    if err.code != rusqlite::ErrorCode::ConstraintViolation {
        return None;
    }
    match err.extended_code {
        rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY => Some(Broken::ForeignKey),
        rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
            // SQLite says "UNIQUE constraint failed: nodes.name".
            let column = msg.as_deref()?.rsplit('.').next()?;
            Some(Broken::Unique(match column {
                "uuid" => "uuid",
                "name" => "name",
                "address" => "address",
                "instance_uuid" => "instance_uuid",
                _ => return None,
            }))
        }
        _ => None,
    }
}

pub(super) fn db(what: &str, e: rusqlite::Error) -> StoreError {
    StoreError::Database(format!("{what}: {e}"))
}

/// Maps a failed node write: a taken unique field is `Duplicate` with its value.
pub(super) fn node_write_error(what: &str, node: &Node, e: rusqlite::Error) -> StoreError {
    broken_constraint(&e)
        .and_then(|broken| broken.on_node(node))
        .unwrap_or_else(|| db(what, e))
}

/// Maps a failed port write: a taken UUID or MAC is `Duplicate`, a missing node `NotFound`.
pub(super) fn port_write_error(what: &str, port: &Port, e: rusqlite::Error) -> StoreError {
    match broken_constraint(&e) {
        Some(broken) => broken.on_port(port),
        None => db(what, e),
    }
}
