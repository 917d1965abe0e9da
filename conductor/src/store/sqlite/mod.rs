//! The embedded store: one SQLite file in the state directory (docs/architecture.md §8).
//!
//! # Design
//! rusqlite is blocking, so every call runs on the store's own thread ([`worker`]), one at a time
//! and in order: calls are serialised, which SQLite does anyway for writers, the async runtime
//! never waits on disk, and a thousand waiting calls are a thousand queued closures, not a
//! thousand parked threads. Each [`Store`] method is one transaction; the ones that
//! read after writing (reserve) take the write lock first (`BEGIN IMMEDIATE`) so another process
//! on the same file cannot slip in between.
//!
//! The file runs in WAL mode (readers do not block the writer, and a crash leaves the last
//! committed transaction), with foreign keys on (ports go with their node) and a busy timeout so
//! a second process (the `vmdeploy-conductor` CLI reading the same file) waits instead of failing.
//! `synchronous` stays at SQLite's default `FULL`: a state change the API acknowledged must
//! survive a power cut, and the conductor writes a handful of rows per deploy.
//!
//! Schema migrations ([`schema`]) run in [`SqliteStore::open`].
//!
//! A blocking call runs to its end even when its caller's future is dropped (an API client that
//! hung up). For every call but one that is harmless; a reserve that commits after its caller
//! left would hold the node's lock with no task to release it, so `reserve_node` waits through
//! [`crate::store::abandoned`], which releases such a lock in the background.
//!
//! Reads that stand alone (a node, a list, a port, the conductors) go to [`READERS`] read-only
//! connections of their own, each on its own thread: in WAL mode they see the last committed
//! write and never wait for a running one. Through the writer's queue alone, an operator's
//! `GET` waited behind every deploy's writes and their fsyncs: at 1,000 concurrent deploys its
//! p99 was 330–500 ms. A caller that wrote and then reads sees its write (the answer to a write
//! comes after its commit). An in-memory database (tests) has one connection for everything.
//!
//! # Limitations
//! One writer: writes wait for each other, as SQLite makes them anyway.

mod errors;
mod guard;
mod rows;
mod schema;
mod select;
#[cfg(test)]
mod tests;
mod worker;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension, TransactionBehavior};
use tokio::task::JoinHandle;
use uuid::Uuid;

use self::errors::{db, node_write_error, port_write_error, strip_db};
use self::guard::{release, task_failed};
use self::rows::{
    history_from_row, json, node_from_row, node_values, normalise_mac, port_from_row, time,
    HISTORY_COLUMNS, NODE_COLUMNS, NODE_WRITABLE, PORT_COLUMNS,
};
use self::select::ListQuery;
use super::filter::{node_clauses, port_clauses};
use super::{
    ConductorRecord, HistoryEvent, HistoryQuery, Node, NodeFilter, NodeIdent, Port, PortFilter,
    Store, StoreError,
};

/// How long a call waits for another process's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Read-only connections beside the writer (a file database only): two, so a long listing does
/// not hold up a single-node read.
const READERS: usize = 2;

/// The SQLite store. Cheap to share: hold it as `Arc<dyn Store>`.
#[derive(Debug)]
pub struct SqliteStore {
    /// The connection, locked by the store's thread for each call (tests hold the lock to stall
    /// that thread).
    #[cfg_attr(not(test), allow(dead_code))]
    conn: Arc<Mutex<Connection>>,
    worker: worker::Worker,
    /// The read-only connections' threads; empty for an in-memory database.
    readers: Vec<worker::Worker>,
    /// Which reader takes the next read.
    next_reader: std::sync::atomic::AtomicUsize,
}

impl SqliteStore {
    /// Opens (or creates) the database at `path`, creating its parent directories, and brings
    /// its schema up to date. Blocks briefly: call it at start-up, before serving.
    pub fn open(path: &Path) -> Result<Arc<SqliteStore>, StoreError> {
        create_private(path)?;
        let conn = Connection::open(path)
            .map_err(|e| StoreError::Database(format!("opening {}: {e}", path.display())))?;
        let name = path.display().to_string();
        let (conn, worker) = Self::setup(conn, &name)?;
        // After the writer: the schema is migrated and the WAL files exist.
        let readers = (0..READERS)
            .map(|_| Self::open_reader(path, &name))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(SqliteStore {
            conn,
            worker,
            readers,
            next_reader: Default::default(),
        }))
    }

    /// A read-only connection to the file at `path` on a thread of its own.
    fn open_reader(path: &Path, name: &str) -> Result<worker::Worker, StoreError> {
        use rusqlite::OpenFlags;
        let context = |what: &str, e: rusqlite::Error| {
            StoreError::Database(format!("{what} of {name} (a reader): {e}"))
        };
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| context("opening", e))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| context("setting the busy timeout", e))?;
        worker::Worker::start(Arc::new(Mutex::new(conn)))
    }

    /// A private in-memory database, for tests.
    #[cfg(test)]
    pub fn open_in_memory() -> Result<Arc<SqliteStore>, StoreError> {
        let conn = Connection::open_in_memory()
            .map_err(|e| StoreError::Database(format!("opening an in-memory database: {e}")))?;
        let (conn, worker) = Self::setup(conn, ":memory:")?;
        Ok(Arc::new(SqliteStore {
            conn,
            worker,
            readers: Vec::new(),
            next_reader: Default::default(),
        }))
    }

    /// Sets the writer up (busy timeout, WAL, foreign keys, migrations) and starts its thread.
    fn setup(
        mut conn: Connection,
        name: &str,
    ) -> Result<(Arc<Mutex<Connection>>, worker::Worker), StoreError> {
        let context =
            |what: &str, e: rusqlite::Error| StoreError::Database(format!("{what} of {name}: {e}"));
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| context("setting the busy timeout", e))?;
        // journal_mode answers with the mode it ended up in; an in-memory database stays
        // "memory", which is fine.
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(|e| context("setting WAL mode", e))?;
        if mode != "wal" && name != ":memory:" {
            return Err(StoreError::Database(format!(
                "{name}: SQLite refused WAL mode (journal mode is {mode}); is the file on a \
                 network file system?"
            )));
        }
        conn.pragma_update(None, "foreign_keys", true)
            .map_err(|e| context("turning foreign keys on", e))?;
        schema::migrate(&mut conn)
            .map_err(|e| StoreError::Database(format!("{name}: {}", strip_db(e))))?;
        let conn = Arc::new(Mutex::new(conn));
        let worker = worker::Worker::start(Arc::clone(&conn))?;
        Ok((conn, worker))
    }

    /// Runs the read `f` on a reader's thread (the writer's for an in-memory database). `f`
    /// must only read: its connection is read-only.
    async fn read<T, F>(&self, what: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        if self.readers.is_empty() {
            return self.run(what, f).await;
        }
        let next = self
            .next_reader
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let reader = &self.readers[next % self.readers.len()];
        reader.spawn(f).await.map_err(|e| task_failed(what, e))?
    }

    /// Runs `f` with the connection on the store's thread.
    async fn run<T, F>(&self, what: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.spawn(f).await.map_err(|e| task_failed(what, e))?
    }

    /// Starts `f` with the connection on the store's thread. It runs to its end even when the
    /// caller stops waiting: a transaction is never cut in half.
    fn spawn<T, F>(&self, f: F) -> JoinHandle<Result<T, StoreError>>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.worker.spawn(f)
    }
}

/// Creates the database file (and its directory) readable by the conductor's user only: the
/// nodes' `driver_info` holds BMC passwords. SQLite gives its `-wal` and `-shm` files the mode of
/// the database file. An existing file keeps its mode (the operator chose it).
fn create_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};

    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| {
                StoreError::Database(format!("creating directory {}: {e}", parent.display()))
            })?;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::Database(format!(
            "creating {}: {e}",
            path.display()
        ))),
    }
}

fn now() -> Result<Value, StoreError> {
    time(super::now())
}

fn limit_value(limit: Option<usize>) -> Value {
    // LIMIT -1 is SQLite's "no limit".
    Value::Integer(limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX)))
}

fn read_node(conn: &Connection, ident: &NodeIdent) -> Result<Node, StoreError> {
    let (column, value) = match ident {
        NodeIdent::Uuid(uuid) => ("uuid", uuid.to_string()),
        NodeIdent::Name(name) => ("name", name.clone()),
    };
    conn.query_row(
        &format!("SELECT {NODE_COLUMNS} FROM nodes WHERE {column} = ?1"),
        [value],
        node_from_row,
    )
    .optional()
    .map_err(|e| db(&format!("reading node {ident}"), e))?
    .ok_or_else(|| StoreError::node_not_found(ident))
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn create_node(&self, node: &Node) -> Result<(), StoreError> {
        super::check_node_text(node)?;
        let node = node.clone();
        self.run("creating a node", move |conn| {
            let mut values = node_values(&node)?;
            values.push(node.reservation.clone().map_or(Value::Null, Value::Text));
            values.push(time(node.created_at)?);
            values.push(node.updated_at.map_or(Ok(Value::Null), time)?);
            let columns = NODE_WRITABLE.join(", ");
            let marks = (1..=values.len())
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(", ");
            conn.execute(
                &format!(
                    "INSERT INTO nodes ({columns}, reservation, created_at, updated_at) \
                     VALUES ({marks})"
                ),
                params_from_iter(values),
            )
            .map_err(|e| node_write_error(&format!("creating node {}", node.uuid), &node, e))?;
            Ok(())
        })
        .await
    }

    async fn node(&self, ident: &NodeIdent) -> Result<Node, StoreError> {
        let ident = ident.clone();
        self.read("reading a node", move |conn| read_node(conn, &ident))
            .await
    }

    async fn list_nodes(&self, filter: &NodeFilter) -> Result<Vec<Node>, StoreError> {
        let filter = filter.clone();
        self.read("listing nodes", move |conn| {
            let mut query = ListQuery::new("nodes", filter.order);
            query.filter(node_clauses(&filter));
            if let Some(marker) = filter.marker {
                query.after(conn, marker, StoreError::node_not_found)?;
            }
            query.run(
                conn,
                NODE_COLUMNS,
                filter.limit,
                node_from_row,
                "listing nodes",
            )
        })
        .await
    }

    async fn update_node(&self, node: &Node) -> Result<(), StoreError> {
        super::check_node_text(node)?;
        let node = node.clone();
        self.run("updating a node", move |conn| {
            let mut values = node_values(&node)?;
            values.push(now()?);
            // Every writable column but the last (uuid, the WHERE); then updated_at.
            let uuid_index = NODE_WRITABLE.len();
            let sets = &NODE_WRITABLE[..uuid_index - 1];
            let assignments = sets
                .iter()
                .enumerate()
                .map(|(i, column)| format!("{column} = ?{}", i + 1))
                .collect::<Vec<_>>()
                .join(", ");
            let changed = conn
                .execute(
                    &format!(
                        "UPDATE nodes SET {assignments}, updated_at = ?{} \
                         WHERE uuid = ?{uuid_index}",
                        uuid_index + 1
                    ),
                    params_from_iter(values),
                )
                .map_err(|e| node_write_error(&format!("updating node {}", node.uuid), &node, e))?;
            if changed == 0 {
                return Err(StoreError::node_not_found(node.uuid));
            }
            Ok(())
        })
        .await
    }

    async fn delete_node(&self, uuid: Uuid) -> Result<(), StoreError> {
        self.run("deleting a node", move |conn| {
            // Ports go with it: ports.node_uuid is ON DELETE CASCADE.
            let changed = conn
                .execute("DELETE FROM nodes WHERE uuid = ?1", [uuid.to_string()])
                .map_err(|e| db(&format!("deleting node {uuid}"), e))?;
            if changed == 0 {
                return Err(StoreError::node_not_found(uuid));
            }
            Ok(())
        })
        .await
    }

    async fn reserve_node(&self, uuid: Uuid, holder: &str) -> Result<Node, StoreError> {
        let task_holder = holder.to_string();
        let handle = self.spawn(move |conn| {
            let holder = task_holder;
            let what = || format!("reserving node {uuid}");
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|e| db(&what(), e))?;
            // One conditional UPDATE is the lock: whoever changes the row has it.
            let changed = tx
                .execute(
                    "UPDATE nodes SET reservation = ?1 WHERE uuid = ?2 AND reservation IS NULL",
                    params![holder, uuid.to_string()],
                )
                .map_err(|e| db(&what(), e))?;
            let node = read_node(&tx, &NodeIdent::Uuid(uuid))?;
            if changed == 0 {
                return Err(StoreError::Locked {
                    node: uuid,
                    holder: node.reservation.unwrap_or_default(),
                });
            }
            tx.commit().map_err(|e| db(&what(), e))?;
            Ok(node)
        });
        let worker = self.worker.clone();
        let holder = holder.to_string();
        let release: crate::store::abandoned::Release = Box::new(move |uuid| {
            Box::pin(async move {
                worker
                    .spawn(move |conn| release(conn, uuid, &holder))
                    .await
                    .map_err(|e| task_failed("releasing a node", e))?
            })
        });
        crate::store::abandoned::reserve_to_the_end(handle, release).await
    }

    async fn release_node(&self, uuid: Uuid, holder: &str) -> Result<(), StoreError> {
        let holder = holder.to_string();
        self.run("releasing a node", move |conn| release(conn, uuid, &holder))
            .await
    }

    async fn release_all(&self, holder_prefix: &str) -> Result<Vec<Uuid>, StoreError> {
        let prefix = holder_prefix.to_string();
        self.run("releasing reservations", move |conn| {
            // substr, not LIKE: LIKE is case-insensitive and treats % and _ in the prefix as
            // wildcards.
            let mut stmt = conn
                .prepare(
                    "UPDATE nodes SET reservation = NULL \
                     WHERE reservation IS NOT NULL AND substr(reservation, 1, length(?1)) = ?1 \
                     RETURNING uuid",
                )
                .map_err(|e| db("releasing reservations", e))?;
            let uuids = stmt
                .query_map([prefix], |row| row.get::<_, String>(0))
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(|e| db("releasing reservations", e))?;
            uuids
                .iter()
                .map(|u| {
                    Uuid::parse_str(u).map_err(|e| {
                        StoreError::Database(format!(
                            "releasing reservations: node uuid {u:?}: {e}"
                        ))
                    })
                })
                .collect()
        })
        .await
    }

    async fn create_port(&self, port: &Port) -> Result<(), StoreError> {
        super::check_port_text(port)?;
        let port = port.clone();
        self.run("creating a port", move |conn| {
            conn.execute(
                "INSERT INTO ports (uuid, address, node_uuid, pxe_enabled, extra, created_at, \
                 updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params_from_iter([
                    Value::Text(port.uuid.to_string()),
                    Value::Text(normalise_mac(&port.address)),
                    Value::Text(port.node_uuid.to_string()),
                    Value::Integer(port.pxe_enabled.into()),
                    json(&port.extra)?,
                    time(port.created_at)?,
                    port.updated_at.map_or(Ok(Value::Null), time)?,
                ]),
            )
            .map_err(|e| port_write_error(&format!("creating port {}", port.uuid), &port, e))?;
            Ok(())
        })
        .await
    }

    async fn port(&self, uuid: Uuid) -> Result<Port, StoreError> {
        self.read("reading a port", move |conn| {
            conn.query_row(
                &format!("SELECT {PORT_COLUMNS} FROM ports WHERE uuid = ?1"),
                [uuid.to_string()],
                port_from_row,
            )
            .optional()
            .map_err(|e| db(&format!("reading port {uuid}"), e))?
            .ok_or_else(|| StoreError::port_not_found(uuid))
        })
        .await
    }

    async fn list_ports(&self, filter: &PortFilter) -> Result<Vec<Port>, StoreError> {
        let filter = filter.clone();
        self.read("listing ports", move |conn| {
            let mut query = ListQuery::new("ports", filter.order);
            query.filter(port_clauses(&filter));
            if let Some(marker) = filter.marker {
                query.after(conn, marker, StoreError::port_not_found)?;
            }
            query.run(
                conn,
                PORT_COLUMNS,
                filter.limit,
                port_from_row,
                "listing ports",
            )
        })
        .await
    }

    async fn update_port(&self, port: &Port) -> Result<(), StoreError> {
        super::check_port_text(port)?;
        let port = port.clone();
        self.run("updating a port", move |conn| {
            let changed = conn
                .execute(
                    "UPDATE ports SET address = ?1, node_uuid = ?2, pxe_enabled = ?3, extra = ?4, \
                     updated_at = ?5 WHERE uuid = ?6",
                    params_from_iter([
                        Value::Text(normalise_mac(&port.address)),
                        Value::Text(port.node_uuid.to_string()),
                        Value::Integer(port.pxe_enabled.into()),
                        json(&port.extra)?,
                        now()?,
                        Value::Text(port.uuid.to_string()),
                    ]),
                )
                .map_err(|e| port_write_error(&format!("updating port {}", port.uuid), &port, e))?;
            if changed == 0 {
                return Err(StoreError::port_not_found(port.uuid));
            }
            Ok(())
        })
        .await
    }

    async fn register_conductor(&self, conductor: &ConductorRecord) -> Result<(), StoreError> {
        super::check_conductor_text(conductor)?;
        let conductor = conductor.clone();
        self.run("registering the conductor", move |conn| {
            let drivers = serde_json::to_string(&conductor.drivers)
                .map_err(|e| StoreError::Database(format!("encoding the drivers: {e}")))?;
            conn.execute(
                "INSERT INTO conductors (hostname, conductor_group, drivers, created_at, \
                 updated_at, api_url) VALUES (?1, ?2, ?3, ?4, ?4, ?5) \
                 ON CONFLICT (hostname) DO UPDATE SET conductor_group = excluded.conductor_group, \
                 drivers = excluded.drivers, updated_at = excluded.updated_at, \
                 api_url = excluded.api_url",
                params_from_iter([
                    Value::Text(conductor.hostname.clone()),
                    Value::Text(conductor.conductor_group.clone()),
                    Value::Text(drivers),
                    now()?,
                    conductor.api_url.clone().map_or(Value::Null, Value::Text),
                ]),
            )
            .map_err(|e| db(&format!("registering conductor {}", conductor.hostname), e))?;
            Ok(())
        })
        .await
    }

    async fn heartbeat_conductor(&self, hostname: &str) -> Result<(), StoreError> {
        let hostname = hostname.to_string();
        self.run("the conductor's heartbeat", move |conn| {
            let changed = conn
                .execute(
                    "UPDATE conductors SET updated_at = ?1 WHERE hostname = ?2",
                    params_from_iter([now()?, Value::Text(hostname.clone())]),
                )
                .map_err(|e| db(&format!("heartbeat of conductor {hostname}"), e))?;
            if changed == 0 {
                return Err(StoreError::NotFound {
                    kind: "conductor",
                    ident: hostname,
                });
            }
            Ok(())
        })
        .await
    }

    async fn list_conductors(&self) -> Result<Vec<ConductorRecord>, StoreError> {
        self.read("listing conductors", move |conn| {
            let mut stmt = conn
                .prepare(
                    "SELECT hostname, conductor_group, drivers, created_at, updated_at, api_url \
                     FROM conductors ORDER BY hostname",
                )
                .map_err(|e| db("listing conductors", e))?;
            let rows = stmt
                .query_map([], rows::conductor_from_row)
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(|e| db("listing conductors", e))?;
            Ok(rows)
        })
        .await
    }

    async fn cluster_key(&self) -> Result<Vec<u8>, StoreError> {
        let fresh = super::new_cluster_key()?;
        self.run("reading the cluster key", move |conn| {
            conn.execute(
                "INSERT INTO cluster_secrets (name, value) VALUES ('forwarding', ?1) \
                 ON CONFLICT (name) DO NOTHING",
                [&fresh],
            )
            .map_err(|e| db("storing the cluster key", e))?;
            conn.query_row(
                "SELECT value FROM cluster_secrets WHERE name = 'forwarding'",
                [],
                |row| row.get::<_, Vec<u8>>(0),
            )
            .map_err(|e| db("reading the cluster key", e))
        })
        .await
    }

    async fn add_history(&self, event: &HistoryEvent, keep: usize) -> Result<(), StoreError> {
        super::check_history_text(event)?;
        let event = event.clone();
        if keep == 0 {
            // Kept and trimmed at once: nothing to write.
            return Ok(());
        }
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        self.run("recording a node history event", move |conn| {
            let what = || {
                format!(
                    "recording history event {} of node {}",
                    event.uuid, event.node_uuid
                )
            };
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|e| db(&what(), e))?;
            let node = event.node_uuid.to_string();
            let exists = tx
                .query_row("SELECT 1 FROM nodes WHERE uuid = ?1", [&node], |_| Ok(()))
                .optional()
                .map_err(|e| db(&what(), e))?;
            if exists.is_none() {
                return Err(StoreError::node_not_found(event.node_uuid));
            }
            tx.execute(
                "INSERT INTO node_history (uuid, node_uuid, created_at, severity, event_type, \
                 event, user_id, conductor) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params_from_iter([
                    Value::Text(event.uuid.to_string()),
                    Value::Text(node.clone()),
                    time(event.created_at)?,
                    Value::Text(event.severity.as_str().to_owned()),
                    Value::Text(event.event_type.clone()),
                    Value::Text(event.event.clone()),
                    event.user.clone().map_or(Value::Null, Value::Text),
                    event.conductor.clone().map_or(Value::Null, Value::Text),
                ]),
            )
            .map_err(|e| db(&what(), e))?;
            // The newest `keep` stay; OFFSET skips them, the rest go.
            tx.execute(
                "DELETE FROM node_history WHERE node_uuid = ?1 AND id <= (SELECT id FROM \
                 node_history WHERE node_uuid = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
                params![node, keep],
            )
            .map_err(|e| db(&what(), e))?;
            tx.commit().map_err(|e| db(&what(), e))
        })
        .await
    }

    async fn list_history(
        &self,
        node: Uuid,
        query: &HistoryQuery,
    ) -> Result<Vec<HistoryEvent>, StoreError> {
        let query = query.clone();
        self.read("listing a node's history", move |conn| {
            let what = || format!("listing the history of node {node}");
            let (order, after) = if query.newest_first {
                ("DESC", "<")
            } else {
                ("ASC", ">")
            };
            let mut sql =
                format!("SELECT {HISTORY_COLUMNS} FROM node_history WHERE node_uuid = ?1");
            let mut values = vec![Value::Text(node.to_string())];
            if let Some(marker) = query.marker {
                let id: i64 = conn
                    .query_row(
                        "SELECT id FROM node_history WHERE uuid = ?1 AND node_uuid = ?2",
                        params![marker.to_string(), node.to_string()],
                        |row| row.get(0),
                    )
                    .optional()
                    .map_err(|e| db(&what(), e))?
                    .ok_or_else(|| StoreError::history_event_not_found(marker))?;
                sql.push_str(&format!(" AND id {after} ?2"));
                values.push(Value::Integer(id));
            }
            sql.push_str(&format!(" ORDER BY id {order}"));
            if let Some(limit) = query.limit {
                sql.push_str(&format!(
                    " LIMIT {}",
                    i64::try_from(limit).unwrap_or(i64::MAX)
                ));
            }
            let mut statement = conn.prepare(&sql).map_err(|e| db(&what(), e))?;
            let rows = statement
                .query_map(params_from_iter(values), history_from_row)
                .map_err(|e| db(&what(), e))?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
                .map_err(|e| db(&what(), e))
        })
        .await
    }

    async fn history_event(&self, node: Uuid, event: Uuid) -> Result<HistoryEvent, StoreError> {
        self.read("reading a node history event", move |conn| {
            conn.query_row(
                &format!(
                    "SELECT {HISTORY_COLUMNS} FROM node_history WHERE uuid = ?1 AND node_uuid = ?2"
                ),
                params![event.to_string(), node.to_string()],
                history_from_row,
            )
            .optional()
            .map_err(|e| db(&format!("reading history event {event} of node {node}"), e))?
            .ok_or_else(|| StoreError::history_event_not_found(event))
        })
        .await
    }

    async fn unregister_conductor(&self, hostname: &str) -> Result<(), StoreError> {
        let hostname = hostname.to_string();
        self.run("unregistering the conductor", move |conn| {
            conn.execute("DELETE FROM conductors WHERE hostname = ?1", [&hostname])
                .map_err(|e| db(&format!("unregistering conductor {hostname}"), e))?;
            Ok(())
        })
        .await
    }

    async fn delete_port(&self, uuid: Uuid) -> Result<(), StoreError> {
        self.run("deleting a port", move |conn| {
            let changed = conn
                .execute("DELETE FROM ports WHERE uuid = ?1", [uuid.to_string()])
                .map_err(|e| db(&format!("deleting port {uuid}"), e))?;
            if changed == 0 {
                return Err(StoreError::port_not_found(uuid));
            }
            Ok(())
        })
        .await
    }
}
