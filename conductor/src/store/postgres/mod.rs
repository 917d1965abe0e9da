//! The shared store: PostgreSQL, for several conductors on one database (docs/architecture.md
//! §8; `[database] url = "postgresql://…"`).
//!
//! # Design
//! tokio-postgres connections in deadpool pools ([`connect`]): opened on demand up to
//! `database.max_connections`, each statement prepared once per connection. A quarter of them
//! (at least one, when there are two or more) form a pool of their own for operators' reads
//! (the API's `GET`s, [`crate::store::as_operator_read`]): with one pool, an operator's `GET`
//! waited for a free connection behind a thousand deploys' calls (p99 216–385 ms at 1,000
//! concurrent deploys). Everything else, the node tasks' reads included, uses the other pool. Every [`Store`]
//! method is one statement, so autocommit makes each one transaction, and no transaction is
//! ever left open across an `await` of anything but the database.
//!
//! The node lock is one conditional `UPDATE … WHERE reservation IS NULL RETURNING …`.
//! PostgreSQL serialises writers of a row: of two conductors racing for a node, the second waits
//! for the first's commit, re-checks the condition on the new row version, and changes nothing.
//! As in the SQLite store, a reserve runs to its end in a task of its own and a lock taken for a
//! caller that left is released ([`crate::store::abandoned`]).
//!
//! A server that cannot be reached, restarts or cuts a connection fails the call in flight with
//! [`StoreError::Unavailable`] (the API's 503); the pool drops a closed connection at its next
//! checkout and opens a new one, so calls after the server is back succeed with no restart of
//! the conductor.

mod connect;
mod errors;
mod rows;
mod schema;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

pub use self::connect::{describe, parse_url, PostgresConfig};
use self::errors::{classify, node_write_error, pool_error, port_write_error};
use self::rows::{
    history_from_row, node_from_row, node_values, port_from_row, port_values, refs, Param,
    HISTORY_COLUMNS,
};
use super::columns::{NODE_COLUMNS, NODE_WRITABLE, PORT_COLUMNS};
use super::filter::{node_clauses, port_clauses, Clause, FilterValue};
use super::order::{after_marker, order_by, Dialect, Order};
use super::{
    normalise_mac, ConductorRecord, HistoryEvent, HistoryQuery, Node, NodeFilter, NodeIdent, Port,
    PortFilter, Store, StoreError,
};

/// The PostgreSQL store. Cheap to share: hold it as `Arc<dyn Store>`.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    /// The standalone reads' pool; `None` with a single connection (reads share `pool`).
    read_pool: Option<Pool>,
    /// `user@host:port/database`, for logs.
    target: String,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to the database of `config` and brings its schema up to date. Fails (at once,
    /// or after the connect timeout) when the server cannot be reached or refuses the login.
    pub async fn open(config: &PostgresConfig) -> Result<Arc<PostgresStore>, StoreError> {
        Self::open_on(config, None).await
    }

    /// [`PostgresStore::open`], with the connections run on `io` (the service passes the API's
    /// runtime: `connect::ConnectOn` says why).
    pub async fn open_on(
        config: &PostgresConfig,
        io: Option<tokio::runtime::Handle>,
    ) -> Result<Arc<PostgresStore>, StoreError> {
        let pg = connect::client_config(config)?;
        let target = describe(&pg);
        let (writers, readers) = connect::split_connections(config.max_connections);
        let read_pool = match readers {
            Some(size) => Some(connect::pool(pg.clone(), config, size, io.clone())?),
            None => None,
        };
        let pool = connect::pool(pg, config, writers, io)?;
        let store = PostgresStore {
            pool,
            read_pool,
            target,
        };
        let mut client = store
            .pool
            .get()
            .await
            .map_err(|e| pool_error(&format!("connecting to {}", store.target), e))?;
        schema::migrate(&mut client).await.map_err(|e| match e {
            StoreError::Database(m) => StoreError::Database(format!("{}: {m}", store.target)),
            StoreError::Unavailable(m) => StoreError::Unavailable(format!("{}: {m}", store.target)),
            other => other,
        })?;
        Ok(Arc::new(store))
    }

    /// `user@host:port/database`, without the password.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Connections open now and the bound, both pools together.
    pub fn connections(&self) -> (usize, usize) {
        let status = self.pool.status();
        let (read_size, read_max) = self
            .read_pool
            .as_ref()
            .map_or((0, 0), |p| (p.status().size, p.status().max_size));
        (status.size + read_size, status.max_size + read_max)
    }

    async fn client(&self, what: &str) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool.get().await.map_err(|e| pool_error(what, e))
    }

    /// Runs `sql` with `params` and returns the rows.
    async fn query(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let client = self.client(what).await?;
        Self::rows(&client, what, sql, params).await
    }

    /// Runs the read `sql` with `params` and returns the rows: on the readers' pool for an
    /// operator's read, else on the main pool.
    async fn read(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let pool = match &self.read_pool {
            Some(readers) if crate::store::is_operator_read() => readers,
            _ => &self.pool,
        };
        let client = pool.get().await.map_err(|e| pool_error(what, e))?;
        Self::rows(&client, what, sql, params).await
    }

    /// `sql` with `params` on `client`, prepared once per connection.
    async fn rows(
        client: &deadpool_postgres::Client,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(|e| classify(what, e))?;
        client
            .query(&stmt, params)
            .await
            .map_err(|e| classify(what, e))
    }

    /// Runs `sql` with `params` and returns how many rows it changed; `on_error` maps a failure.
    async fn execute(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        on_error: impl FnOnce(tokio_postgres::Error) -> StoreError,
    ) -> Result<u64, StoreError> {
        let client = self.client(what).await?;
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(|e| classify(what, e))?;
        client.execute(&stmt, params).await.map_err(on_error)
    }

    async fn read_node(&self, ident: &NodeIdent) -> Result<Node, StoreError> {
        let what = format!("reading node {ident}");
        let rows = match ident {
            NodeIdent::Uuid(uuid) => {
                let sql = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE uuid = $1");
                self.read(&what, &sql, &[uuid]).await?
            }
            NodeIdent::Name(name) => {
                let sql = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE name = $1");
                self.read(&what, &sql, &[name]).await?
            }
        };
        match rows.first() {
            Some(row) => node_from_row(row),
            None => Err(StoreError::node_not_found(ident)),
        }
    }

    /// The reserve itself, run as a task of its own by [`Store::reserve_node`].
    async fn try_reserve(&self, uuid: Uuid, holder: &str) -> Result<Node, StoreError> {
        let what = format!("reserving node {uuid}");
        let sql = format!(
            "UPDATE nodes SET reservation = $1 WHERE uuid = $2 AND reservation IS NULL \
             RETURNING {NODE_COLUMNS}"
        );
        // A lock released between the UPDATE and the read of its holder: try again, a few
        // times, rather than report a lock nobody holds.
        for _ in 0..3 {
            let rows = self.query(&what, &sql, &[&holder, &uuid]).await?;
            if let Some(row) = rows.first() {
                return node_from_row(row);
            }
            let held = self
                .query(
                    &what,
                    "SELECT reservation FROM nodes WHERE uuid = $1",
                    &[&uuid],
                )
                .await?;
            let Some(row) = held.first() else {
                return Err(StoreError::node_not_found(uuid));
            };
            let holder: Option<String> = row.try_get(0).map_err(|e| classify(&what, e))?;
            if let Some(holder) = holder {
                return Err(StoreError::Locked { node: uuid, holder });
            }
        }
        Err(StoreError::Locked {
            node: uuid,
            holder: String::new(),
        })
    }

    async fn release(&self, uuid: Uuid, holder: &str) -> Result<(), StoreError> {
        let what = format!("releasing node {uuid}");
        self.execute(
            &what,
            "UPDATE nodes SET reservation = NULL WHERE uuid = $1 AND reservation = $2",
            &[&uuid, &holder],
            |e| classify(&what, e),
        )
        .await?;
        Ok(())
    }
}

/// How PostgreSQL orders a column: text in byte order (`COLLATE "C"`, as SQLite's BINARY; the
/// database's own collation may be a language's), the other types as they are.
struct Postgres;

impl Dialect for Postgres {
    fn sort_expr(&self, alias: &str, column: &str, is_time: bool) -> String {
        match column {
            "id" | "uuid" | "maintenance" | "pxe_enabled" => format!("{alias}.{column}"),
            _ if is_time => format!("{alias}.{column}"),
            _ => format!("{alias}.{column} COLLATE \"C\""),
        }
    }
}

/// A `SELECT` of a list, built clause by clause with numbered parameters.
struct ListQuery {
    table: &'static str,
    order: Order,
    clauses: Vec<String>,
    params: Vec<Param>,
}

impl ListQuery {
    fn new(table: &'static str, order: Order) -> ListQuery {
        ListQuery {
            table,
            order,
            clauses: Vec::new(),
            params: Vec::new(),
        }
    }

    /// Adds `clause`, whose one `?` takes `value`.
    fn bind(&mut self, clause: &str, value: Param) {
        self.params.push(value);
        self.clauses
            .push(clause.replace('?', &format!("${}", self.params.len())));
    }

    /// Adds the clauses of a list's filter (`store::filter`), its values as PostgreSQL's types.
    fn filter(&mut self, clauses: Vec<Clause>) {
        for clause in clauses {
            match clause.value {
                Some(FilterValue::Text(text)) => self.bind(clause.sql, Box::new(text)),
                Some(FilterValue::Bool(flag)) => self.bind(clause.sql, Box::new(flag)),
                Some(FilterValue::Uuid(uuid)) => self.bind(clause.sql, Box::new(uuid)),
                None => self.clauses.push(clause.sql.to_string()),
            }
        }
    }

    /// The statement for `columns`, in the query's order, at most `limit` rows.
    fn sql(&mut self, columns: &str, limit: Option<usize>) -> String {
        let filters = if self.clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", self.clauses.join(" AND "))
        };
        let limit = match limit {
            Some(n) => {
                self.params
                    .push(Box::new(i64::try_from(n).unwrap_or(i64::MAX)));
                format!(" LIMIT ${}", self.params.len())
            }
            None => String::new(),
        };
        format!(
            "SELECT {columns} FROM {} t{filters} ORDER BY {}{limit}",
            self.table,
            order_by(&Postgres, self.order)
        )
    }
}

impl PostgresStore {
    /// Keeps the records of `query`'s table after `marker` in its order; a marker that names no
    /// record is `not_found`.
    async fn after(
        &self,
        query: &mut ListQuery,
        marker: Uuid,
        not_found: fn(Uuid) -> StoreError,
    ) -> Result<(), StoreError> {
        let table = query.table;
        let found = self
            .read(
                "reading the list marker",
                &format!("SELECT 1 FROM {table} WHERE uuid = $1"),
                &[&marker],
            )
            .await?;
        if found.is_empty() {
            return Err(not_found(marker));
        }
        query.bind(
            &after_marker(&Postgres, table, query.order),
            Box::new(marker),
        );
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    async fn create_node(&self, node: &Node) -> Result<(), StoreError> {
        super::check_node_text(node)?;
        let what = format!("creating node {}", node.uuid);
        let mut values = node_values(node)?;
        values.push(Box::new(node.reservation.clone()));
        values.push(Box::new(node.created_at));
        values.push(Box::new(node.updated_at));
        let columns = NODE_WRITABLE.join(", ");
        let marks = (1..=values.len())
            .map(|i| format!("${i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "INSERT INTO nodes ({columns}, reservation, created_at, updated_at) VALUES ({marks})"
        );
        self.execute(&what, &sql, &refs(&values), |e| {
            node_write_error(&what, node, e)
        })
        .await?;
        Ok(())
    }

    async fn node(&self, ident: &NodeIdent) -> Result<Node, StoreError> {
        self.read_node(ident).await
    }

    async fn list_nodes(&self, filter: &NodeFilter) -> Result<Vec<Node>, StoreError> {
        let mut query = ListQuery::new("nodes", filter.order);
        query.filter(node_clauses(filter));
        if let Some(marker) = filter.marker {
            self.after(&mut query, marker, StoreError::node_not_found)
                .await?;
        }
        let sql = query.sql(NODE_COLUMNS, filter.limit);
        self.read("listing nodes", &sql, &refs(&query.params))
            .await?
            .iter()
            .map(node_from_row)
            .collect()
    }

    async fn update_node(&self, node: &Node) -> Result<(), StoreError> {
        super::check_node_text(node)?;
        let what = format!("updating node {}", node.uuid);
        let mut values = node_values(node)?;
        values.push(Box::new(super::now()));
        // Every writable column but the last (uuid, the WHERE); then updated_at.
        let uuid_index = NODE_WRITABLE.len();
        let assignments = NODE_WRITABLE[..uuid_index - 1]
            .iter()
            .enumerate()
            .map(|(i, column)| format!("{column} = ${}", i + 1))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "UPDATE nodes SET {assignments}, updated_at = ${} WHERE uuid = ${uuid_index}",
            uuid_index + 1
        );
        let changed = self
            .execute(&what, &sql, &refs(&values), |e| {
                node_write_error(&what, node, e)
            })
            .await?;
        if changed == 0 {
            return Err(StoreError::node_not_found(node.uuid));
        }
        Ok(())
    }

    async fn delete_node(&self, uuid: Uuid) -> Result<(), StoreError> {
        let what = format!("deleting node {uuid}");
        // Ports go with it: ports.node_uuid is ON DELETE CASCADE.
        let changed = self
            .execute(&what, "DELETE FROM nodes WHERE uuid = $1", &[&uuid], |e| {
                classify(&what, e)
            })
            .await?;
        if changed == 0 {
            return Err(StoreError::node_not_found(uuid));
        }
        Ok(())
    }

    async fn reserve_node(&self, uuid: Uuid, holder: &str) -> Result<Node, StoreError> {
        let store = self.clone();
        let task_holder = holder.to_string();
        let handle = tokio::spawn(async move { store.try_reserve(uuid, &task_holder).await });
        let store = self.clone();
        let holder = holder.to_string();
        let release: super::abandoned::Release =
            Box::new(move |uuid| Box::pin(async move { store.release(uuid, &holder).await }));
        super::abandoned::reserve_to_the_end(handle, release).await
    }

    async fn release_node(&self, uuid: Uuid, holder: &str) -> Result<(), StoreError> {
        self.release(uuid, holder).await
    }

    async fn release_all(&self, holder_prefix: &str) -> Result<Vec<Uuid>, StoreError> {
        let what = "releasing reservations";
        // starts_with, not LIKE: LIKE treats % and _ in the prefix as wildcards.
        self.query(
            what,
            "UPDATE nodes SET reservation = NULL \
             WHERE reservation IS NOT NULL AND starts_with(reservation, $1) RETURNING uuid",
            &[&holder_prefix],
        )
        .await?
        .iter()
        .map(|row| row.try_get::<_, Uuid>(0).map_err(|e| classify(what, e)))
        .collect()
    }

    async fn create_port(&self, port: &Port) -> Result<(), StoreError> {
        super::check_port_text(port)?;
        let what = format!("creating port {}", port.uuid);
        let values = port_values(port)?;
        self.execute(
            &what,
            "INSERT INTO ports (uuid, address, node_uuid, pxe_enabled, extra, created_at, \
             updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &refs(&values),
            |e| port_write_error(&what, port, e),
        )
        .await?;
        Ok(())
    }

    async fn port(&self, uuid: Uuid) -> Result<Port, StoreError> {
        let sql = format!("SELECT {PORT_COLUMNS} FROM ports WHERE uuid = $1");
        let rows = self
            .read(&format!("reading port {uuid}"), &sql, &[&uuid])
            .await?;
        match rows.first() {
            Some(row) => port_from_row(row),
            None => Err(StoreError::port_not_found(uuid)),
        }
    }

    async fn list_ports(&self, filter: &PortFilter) -> Result<Vec<Port>, StoreError> {
        let mut query = ListQuery::new("ports", filter.order);
        query.filter(port_clauses(filter));
        if let Some(marker) = filter.marker {
            self.after(&mut query, marker, StoreError::port_not_found)
                .await?;
        }
        let sql = query.sql(PORT_COLUMNS, filter.limit);
        self.read("listing ports", &sql, &refs(&query.params))
            .await?
            .iter()
            .map(port_from_row)
            .collect()
    }

    async fn update_port(&self, port: &Port) -> Result<(), StoreError> {
        super::check_port_text(port)?;
        let what = format!("updating port {}", port.uuid);
        let values: Vec<Param> = vec![
            Box::new(normalise_mac(&port.address)),
            Box::new(port.node_uuid),
            Box::new(port.pxe_enabled),
            Box::new(
                serde_json::to_string(&port.extra)
                    .map_err(|e| StoreError::Database(format!("encoding a JSON field: {e}")))?,
            ),
            Box::new(super::now()),
            Box::new(port.uuid),
        ];
        let changed = self
            .execute(
                &what,
                "UPDATE ports SET address = $1, node_uuid = $2, pxe_enabled = $3, extra = $4, \
                 updated_at = $5 WHERE uuid = $6",
                &refs(&values),
                |e| port_write_error(&what, port, e),
            )
            .await?;
        if changed == 0 {
            return Err(StoreError::port_not_found(port.uuid));
        }
        Ok(())
    }

    async fn register_conductor(&self, conductor: &ConductorRecord) -> Result<(), StoreError> {
        super::check_conductor_text(conductor)?;
        let what = format!("registering conductor {}", conductor.hostname);
        let drivers = serde_json::to_string(&conductor.drivers)
            .map_err(|e| StoreError::Database(format!("encoding the drivers: {e}")))?;
        self.execute(
            &what,
            "INSERT INTO conductors (hostname, conductor_group, drivers, created_at, updated_at, \
             api_url) VALUES ($1, $2, $3, $4, $4, $5) \
             ON CONFLICT (hostname) DO UPDATE SET conductor_group = excluded.conductor_group, \
             drivers = excluded.drivers, updated_at = excluded.updated_at, \
             api_url = excluded.api_url",
            &[
                &conductor.hostname,
                &conductor.conductor_group,
                &drivers,
                &super::now(),
                &conductor.api_url,
            ],
            |e| classify(&what, e),
        )
        .await?;
        Ok(())
    }

    async fn heartbeat_conductor(&self, hostname: &str) -> Result<(), StoreError> {
        let what = format!("heartbeat of conductor {hostname}");
        let changed = self
            .execute(
                &what,
                "UPDATE conductors SET updated_at = $1 WHERE hostname = $2",
                &[&super::now(), &hostname],
                |e| classify(&what, e),
            )
            .await?;
        if changed == 0 {
            return Err(StoreError::NotFound {
                kind: "conductor",
                ident: hostname.to_string(),
            });
        }
        Ok(())
    }

    async fn list_conductors(&self) -> Result<Vec<ConductorRecord>, StoreError> {
        self.read(
            "listing conductors",
            "SELECT hostname, conductor_group, drivers, created_at, updated_at, api_url \
             FROM conductors ORDER BY hostname COLLATE \"C\"",
            &[],
        )
        .await?
        .iter()
        .map(rows::conductor_from_row)
        .collect()
    }

    async fn cluster_key(&self) -> Result<Vec<u8>, StoreError> {
        let what = "reading the cluster key";
        let fresh = super::new_cluster_key()?;
        // Two statements, not one: a key another conductor commits while this INSERT waits
        // on it is visible to the SELECT that follows, not to the INSERT's own snapshot.
        self.execute(
            what,
            "INSERT INTO cluster_secrets (name, value) VALUES ('forwarding', $1) \
             ON CONFLICT (name) DO NOTHING",
            &[&fresh],
            |e| classify(what, e),
        )
        .await?;
        let rows = self
            .query(
                what,
                "SELECT value FROM cluster_secrets WHERE name = 'forwarding'",
                &[],
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Database(format!("{what}: the key vanished")))?;
        row.try_get::<_, Vec<u8>>(0).map_err(|e| classify(what, e))
    }

    async fn add_history(&self, event: &HistoryEvent, keep: usize) -> Result<(), StoreError> {
        super::check_history_text(event)?;
        let what = format!(
            "recording history event {} of node {}",
            event.uuid, event.node_uuid
        );
        if keep == 0 {
            // Kept and trimmed at once: nothing to write.
            return Ok(());
        }
        // One statement, so one transaction. The DELETE does not see the row the INSERT adds
        // (one snapshot), so it keeps the newest `keep - 1` older events beside it.
        let older_kept = i64::try_from(keep - 1).unwrap_or(i64::MAX);
        let node_uuid = event.node_uuid;
        self.execute(
            &what,
            "WITH added AS (INSERT INTO node_history (uuid, node_uuid, created_at, severity, \
             event_type, event, user_id, conductor) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             RETURNING id) \
             DELETE FROM node_history WHERE node_uuid = $2 AND id <= (SELECT id FROM \
             node_history WHERE node_uuid = $2 ORDER BY id DESC LIMIT 1 OFFSET $9)",
            &[
                &event.uuid,
                &node_uuid,
                &event.created_at,
                &event.severity.as_str(),
                &event.event_type,
                &event.event,
                &event.user,
                &event.conductor,
                &older_kept,
            ],
            |e| match e.as_db_error().map(|db| db.code().clone()) {
                Some(tokio_postgres::error::SqlState::FOREIGN_KEY_VIOLATION) => {
                    StoreError::node_not_found(node_uuid)
                }
                _ => classify(&what, e),
            },
        )
        .await?;
        Ok(())
    }

    async fn list_history(
        &self,
        node: Uuid,
        query: &HistoryQuery,
    ) -> Result<Vec<HistoryEvent>, StoreError> {
        let what = format!("listing the history of node {node}");
        let (order, after) = if query.newest_first {
            ("DESC", "<")
        } else {
            ("ASC", ">")
        };
        let mut sql = format!("SELECT {HISTORY_COLUMNS} FROM node_history WHERE node_uuid = $1");
        let mut params: Vec<Param> = vec![Box::new(node)];
        if let Some(marker) = query.marker {
            let rows = self
                .read(
                    &what,
                    "SELECT id FROM node_history WHERE uuid = $1 AND node_uuid = $2",
                    &[&marker, &node],
                )
                .await?;
            let id: i64 = rows
                .first()
                .ok_or_else(|| StoreError::history_event_not_found(marker))?
                .try_get(0)
                .map_err(|e| classify(&what, e))?;
            sql.push_str(&format!(" AND id {after} $2"));
            params.push(Box::new(id));
        }
        sql.push_str(&format!(" ORDER BY id {order}"));
        if let Some(limit) = query.limit {
            sql.push_str(&format!(
                " LIMIT {}",
                i64::try_from(limit).unwrap_or(i64::MAX)
            ));
        }
        self.read(&what, &sql, &refs(&params))
            .await?
            .iter()
            .map(history_from_row)
            .collect()
    }

    async fn history_event(&self, node: Uuid, event: Uuid) -> Result<HistoryEvent, StoreError> {
        let sql = format!(
            "SELECT {HISTORY_COLUMNS} FROM node_history WHERE uuid = $1 AND node_uuid = $2"
        );
        let rows = self
            .read(
                &format!("reading history event {event} of node {node}"),
                &sql,
                &[&event, &node],
            )
            .await?;
        match rows.first() {
            Some(row) => history_from_row(row),
            None => Err(StoreError::history_event_not_found(event)),
        }
    }

    async fn unregister_conductor(&self, hostname: &str) -> Result<(), StoreError> {
        let what = format!("unregistering conductor {hostname}");
        self.execute(
            &what,
            "DELETE FROM conductors WHERE hostname = $1",
            &[&hostname],
            |e| classify(&what, e),
        )
        .await?;
        Ok(())
    }

    async fn delete_port(&self, uuid: Uuid) -> Result<(), StoreError> {
        let what = format!("deleting port {uuid}");
        let changed = self
            .execute(&what, "DELETE FROM ports WHERE uuid = $1", &[&uuid], |e| {
                classify(&what, e)
            })
            .await?;
        if changed == 0 {
            return Err(StoreError::port_not_found(uuid));
        }
        Ok(())
    }
}
