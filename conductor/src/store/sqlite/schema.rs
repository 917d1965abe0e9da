//! The SQLite schema and its migrations, applied in order when the store opens.
//!
//! # Design
//! Each step is a numbered SQL batch applied in its own transaction together with its row in
//! `schema_migrations`, so a crash mid-migration leaves the database at the previous version,
//! never half-way. Steps are append-only: a released step is never edited, a change is a new step.
//! A database whose version is newer than the last step here was written by a newer conductor;
//! opening it could silently drop columns that conductor relies on, so it is refused.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::store::StoreError;

/// The numbered steps, oldest first; versions are 1, 2, 3... without gaps.
pub(super) const MIGRATIONS: &[(i64, &str)] = &[
    (1, V1_NODES_PORTS),
    (2, V2_NODE_INTERFACES),
    (3, V3_CONDUCTORS),
    (4, V4_CONDUCTOR_GROUPS),
    (5, V5_NODE_HISTORY),
];

/// The newest schema version this code knows.
pub(super) fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |(version, _)| *version)
}

/// Nodes and ports. `id` gives the creation order lists and pagination markers use (UUIDs are
/// random). JSON objects are TEXT, timestamps RFC 3339 TEXT in UTC, booleans 0/1.
/// `instance_uuid` is unique as in Ironic (`uniq_nodes0instance_uuid`): one node per instance.
/// Port MACs are stored lower case, so the unique index catches the same MAC in another case.
const V1_NODES_PORTS: &str = "
CREATE TABLE nodes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uuid TEXT NOT NULL UNIQUE,
    name TEXT UNIQUE,
    driver TEXT NOT NULL,
    driver_info TEXT NOT NULL,
    driver_internal_info TEXT NOT NULL,
    properties TEXT NOT NULL,
    instance_info TEXT NOT NULL,
    extra TEXT NOT NULL,
    network_data TEXT NOT NULL,
    instance_uuid TEXT UNIQUE,
    provision_state TEXT NOT NULL,
    target_provision_state TEXT,
    provision_updated_at TEXT,
    power_state TEXT,
    target_power_state TEXT,
    maintenance INTEGER NOT NULL DEFAULT 0,
    maintenance_reason TEXT,
    last_error TEXT,
    reservation TEXT,
    console_enabled INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    updated_at TEXT
);
CREATE INDEX nodes_reservation ON nodes (reservation) WHERE reservation IS NOT NULL;
CREATE INDEX nodes_provision_state ON nodes (provision_state);
CREATE TABLE ports (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uuid TEXT NOT NULL UNIQUE,
    address TEXT NOT NULL UNIQUE,
    node_uuid TEXT NOT NULL REFERENCES nodes (uuid) ON DELETE CASCADE,
    pxe_enabled INTEGER NOT NULL DEFAULT 1,
    extra TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT
);
CREATE INDEX ports_node_uuid ON ports (node_uuid);
";

/// The boot and deploy interfaces an operator chose for a node; NULL keeps the driver's
/// default, so existing nodes keep running the flows they ran.
const V2_NODE_INTERFACES: &str = "
ALTER TABLE nodes ADD COLUMN boot_interface TEXT;
ALTER TABLE nodes ADD COLUMN deploy_interface TEXT;
";

/// The conductors that share the database, and their heartbeats. `drivers` is a JSON array.
const V3_CONDUCTORS: &str = "
CREATE TABLE conductors (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    hostname TEXT NOT NULL UNIQUE,
    conductor_group TEXT NOT NULL DEFAULT '',
    drivers TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
";

/// Each node's conductor group ('' is the default group, so the nodes of an older database stay
/// with the conductors of the default group), indexed because every conductor lists the nodes
/// of its own group; and the URL each conductor's API is reached at, NULL in the rows written
/// before this step until their conductors register again. `cluster_secrets` holds the key that
/// signs the requests conductors forward to one another, made by the first that needs it.
const V4_CONDUCTOR_GROUPS: &str = "
ALTER TABLE nodes ADD COLUMN conductor_group TEXT NOT NULL DEFAULT '';
CREATE INDEX nodes_conductor_group ON nodes (conductor_group);
ALTER TABLE conductors ADD COLUMN api_url TEXT;
CREATE TABLE cluster_secrets (
    name TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
";

/// Each node's history (API 1.78), gone with the node. `id` orders a node's events (their
/// times may tie); the index serves both the per-node lists and the trimming to the newest
/// events. `user_id` is the API's `user` (PostgreSQL reserves `user`; the two stores keep one
/// set of names).
const V5_NODE_HISTORY: &str = "
CREATE TABLE node_history (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uuid TEXT NOT NULL UNIQUE,
    node_uuid TEXT NOT NULL REFERENCES nodes (uuid) ON DELETE CASCADE,
    created_at TEXT NOT NULL,
    severity TEXT NOT NULL,
    event_type TEXT NOT NULL,
    event TEXT NOT NULL,
    user_id TEXT,
    conductor TEXT
);
CREATE INDEX node_history_node ON node_history (node_uuid, id);
";

/// Brings the schema up to [`latest_version`]; refuses a database newer than that.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version INTEGER PRIMARY KEY,
            applied_at TEXT NOT NULL
        )",
    )
    .map_err(|e| db("creating schema_migrations", e))?;
    for (version, sql) in MIGRATIONS {
        // IMMEDIATE takes the write lock first, so two conductors opening the same file at once
        // cannot both apply a step; the version is read again under that lock.
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| db("starting a migration", e))?;
        let current = current_version(&tx)?;
        refuse_newer(current)?;
        if current >= *version {
            continue;
        }
        tx.execute_batch(sql)
            .map_err(|e| db(&format!("applying schema migration {version}"), e))?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
            rusqlite::params![version, now_rfc3339()?],
        )
        .map_err(|e| db(&format!("recording schema migration {version}"), e))?;
        tx.commit()
            .map_err(|e| db(&format!("committing schema migration {version}"), e))?;
    }
    // Also refuse a newer database when every known step was already applied (the loop above
    // only checks while it has steps left to look at).
    refuse_newer(current_version(conn)?)
}

fn refuse_newer(current: i64) -> Result<(), StoreError> {
    if current > latest_version() {
        return Err(StoreError::Database(format!(
            "the database has schema version {current}, newer than the {} this conductor knows: \
             it was written by a newer vmdeploy; run that version or use another state directory",
            latest_version()
        )));
    }
    Ok(())
}

/// The highest applied step (0 for a new database).
pub(super) fn current_version(conn: &Connection) -> Result<i64, StoreError> {
    conn.query_row("SELECT MAX(version) FROM schema_migrations", [], |row| {
        row.get::<_, Option<i64>>(0)
    })
    .optional()
    .map(|v| v.flatten().unwrap_or(0))
    .map_err(|e| db("reading the schema version", e))
}

fn now_rfc3339() -> Result<String, StoreError> {
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .map_err(|e| StoreError::Database(format!("formatting the time: {e}")))
}

fn db(what: &str, e: rusqlite::Error) -> StoreError {
    StoreError::Database(format!("{what}: {e}"))
}
