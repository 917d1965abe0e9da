//! The PostgreSQL schema and its migrations, applied when the store opens.
//!
//! # Design
//! As for SQLite (`store::sqlite::schema`): numbered, append-only steps recorded in
//! `schema_migrations`, and a database newer than this code refused. Here every pending step
//! runs in one transaction (PostgreSQL's DDL is transactional) under a transaction-scoped
//! advisory lock, so conductors that start together against one database apply each step once:
//! the second waits for the first's commit and then finds nothing left to do.
//!
//! Types: UUIDs as `uuid`, times as `timestamptz` (microseconds; the store hands it times
//! already cut to that), flags as `boolean`; JSON objects as `text` holding the JSON, as the
//! SQLite store and Ironic keep them (no `jsonb`: it reorders keys and refuses `\u0000`, which
//! the API accepts). Constraint names are spelled out: the store reads them back from unique
//! violations to say which field is taken.

use tokio_postgres::Client;

use super::errors::classify;
use crate::store::StoreError;

/// The numbered steps, oldest first; versions are 1, 2, 3... without gaps.
pub(super) const MIGRATIONS: &[(i64, &str)] = &[
    (1, V1_NODES_PORTS),
    (2, V2_CONDUCTORS),
    (3, V3_CONDUCTOR_GROUPS),
    (4, V4_NODE_HISTORY),
];

/// The key of the advisory lock migrations hold (any fixed number; this one spells "vmdeploy").
const MIGRATION_LOCK: i64 = 0x766d_6465_706c_6f79;

/// Nodes and ports, with the SQLite store's columns (`store::columns`). `id` gives the creation
/// order lists and pagination markers use.
const V1_NODES_PORTS: &str = "
CREATE TABLE nodes (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    uuid uuid NOT NULL CONSTRAINT nodes_uuid_unique UNIQUE,
    name text CONSTRAINT nodes_name_unique UNIQUE,
    driver text NOT NULL,
    boot_interface text,
    deploy_interface text,
    driver_info text NOT NULL,
    driver_internal_info text NOT NULL,
    properties text NOT NULL,
    instance_info text NOT NULL,
    extra text NOT NULL,
    network_data text NOT NULL,
    instance_uuid text CONSTRAINT nodes_instance_uuid_unique UNIQUE,
    provision_state text NOT NULL,
    target_provision_state text,
    provision_updated_at timestamptz,
    power_state text,
    target_power_state text,
    maintenance boolean NOT NULL DEFAULT false,
    maintenance_reason text,
    last_error text,
    reservation text,
    console_enabled boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL,
    updated_at timestamptz
);
CREATE INDEX nodes_reservation ON nodes (reservation) WHERE reservation IS NOT NULL;
CREATE INDEX nodes_provision_state ON nodes (provision_state);
CREATE TABLE ports (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    uuid uuid NOT NULL CONSTRAINT ports_uuid_unique UNIQUE,
    address text NOT NULL CONSTRAINT ports_address_unique UNIQUE,
    node_uuid uuid NOT NULL CONSTRAINT ports_node_uuid_fkey
        REFERENCES nodes (uuid) ON DELETE CASCADE,
    pxe_enabled boolean NOT NULL DEFAULT true,
    extra text NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz
);
CREATE INDEX ports_node_uuid ON ports (node_uuid);
";

/// The conductors that share the database, and their heartbeats. `drivers` is a JSON array.
const V2_CONDUCTORS: &str = "
CREATE TABLE conductors (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    hostname text NOT NULL CONSTRAINT conductors_hostname_unique UNIQUE,
    conductor_group text NOT NULL DEFAULT '',
    drivers text NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
";

/// As SQLite's step 4: each node's conductor group ('' is the default group, so existing nodes
/// stay with the default group's conductors), indexed for the per-group lists; and the URL each
/// conductor's API is reached at, NULL in the rows written before this step until their
/// conductors register again. A column with a constant default is added without rewriting the
/// table (PostgreSQL 11 and later). `cluster_secrets` holds the key that signs the requests
/// conductors forward to one another, made by the first that needs it.
const V3_CONDUCTOR_GROUPS: &str = "
ALTER TABLE nodes ADD COLUMN conductor_group text NOT NULL DEFAULT '';
CREATE INDEX nodes_conductor_group ON nodes (conductor_group);
ALTER TABLE conductors ADD COLUMN api_url text;
CREATE TABLE cluster_secrets (
    name text PRIMARY KEY,
    value bytea NOT NULL
);
";

/// As SQLite's step 5: each node's history (API 1.78), gone with the node; `id` orders a node's
/// events, `user_id` is the API's `user` (a reserved word here).
const V4_NODE_HISTORY: &str = "
CREATE TABLE node_history (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    uuid uuid NOT NULL CONSTRAINT node_history_uuid_unique UNIQUE,
    node_uuid uuid NOT NULL CONSTRAINT node_history_node_uuid_fkey
        REFERENCES nodes (uuid) ON DELETE CASCADE,
    created_at timestamptz NOT NULL,
    severity text NOT NULL,
    event_type text NOT NULL,
    event text NOT NULL,
    user_id text,
    conductor text
);
CREATE INDEX node_history_node ON node_history (node_uuid, id);
";

/// The newest schema version this code knows.
pub(super) fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |(version, _)| *version)
}

/// Brings the schema up to [`latest_version`]; refuses a database newer than that.
pub(super) async fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(|e| classify("starting the schema migration", e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| classify("waiting for the migration lock", e))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version bigint PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT now()
        )",
    )
    .await
    .map_err(|e| classify("creating schema_migrations", e))?;
    let current: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| classify("reading the schema version", e))?;
    if current > latest_version() {
        return Err(StoreError::Database(format!(
            "the database has schema version {current}, newer than the {} this conductor knows: \
             it was written by a newer vmdeploy; run that version or use another database",
            latest_version()
        )));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
        tx.batch_execute(sql)
            .await
            .map_err(|e| classify(&format!("applying schema migration {version}"), e))?;
        tx.execute(
            "INSERT INTO schema_migrations (version) VALUES ($1)",
            &[version],
        )
        .await
        .map_err(|e| classify(&format!("recording schema migration {version}"), e))?;
    }
    tx.commit()
        .await
        .map_err(|e| classify("committing the schema migration", e))
}

/// The highest applied step (0 for a new database).
#[cfg(test)]
pub(super) async fn current_version(client: &Client) -> Result<i64, StoreError> {
    client
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| classify("reading the schema version", e))
}
