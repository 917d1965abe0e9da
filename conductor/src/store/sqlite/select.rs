//! The `SELECT` behind `list_nodes` and `list_ports`: `AND`ed filter clauses with numbered
//! parameters, the order, an optional marker (records after it in that order,
//! `store::order`), a limit.
//!
//! Times are RFC 3339 text here, whose fraction has as many digits as it needs, so their text
//! does not sort as the times do: they are ordered by `unixepoch(…, 'subsec')` (milliseconds;
//! `id` orders what falls in one millisecond).

use rusqlite::types::Value;
use rusqlite::{params_from_iter, Connection, OptionalExtension, Row};
use uuid::Uuid;

use super::errors::db;
use super::limit_value;
use crate::store::filter::{Clause, FilterValue};
use crate::store::order::{after_marker, order_by, Dialect, Order};
use crate::store::StoreError;

struct Sqlite;

impl Dialect for Sqlite {
    fn sort_expr(&self, alias: &str, column: &str, is_time: bool) -> String {
        if is_time {
            format!("unixepoch({alias}.{column}, 'subsec')")
        } else {
            // TEXT compares with BINARY, byte order.
            format!("{alias}.{column}")
        }
    }
}

/// A list query on one table, built clause by clause.
pub(super) struct ListQuery {
    table: &'static str,
    order: Order,
    clauses: Vec<String>,
    values: Vec<Value>,
}

impl ListQuery {
    /// A query on `table` (a name of the schema's, never user input) in `order`.
    pub fn new(table: &'static str, order: Order) -> ListQuery {
        ListQuery {
            table,
            order,
            clauses: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Adds `clause`, whose one `?` takes `value`.
    pub fn bind(&mut self, clause: &str, value: Value) {
        self.values.push(value);
        self.clauses
            .push(clause.replace('?', &format!("?{}", self.values.len())));
    }

    /// Adds the clauses of a list's filter (`store::filter`), its values as SQLite keeps them.
    pub fn filter(&mut self, clauses: Vec<Clause>) {
        for clause in clauses {
            match clause.value {
                Some(FilterValue::Text(text)) => self.bind(clause.sql, Value::Text(text)),
                Some(FilterValue::Bool(flag)) => self.bind(clause.sql, Value::Integer(flag.into())),
                Some(FilterValue::Uuid(uuid)) => {
                    self.bind(clause.sql, Value::Text(uuid.to_string()))
                }
                None => self.clauses.push(clause.sql.to_string()),
            }
        }
    }

    /// Keeps the records after `marker` in the query's order; a marker that names no record is
    /// `not_found`.
    pub fn after(
        &mut self,
        conn: &Connection,
        marker: Uuid,
        not_found: impl FnOnce(Uuid) -> StoreError,
    ) -> Result<(), StoreError> {
        let table = self.table;
        let exists = conn
            .query_row(
                &format!("SELECT 1 FROM {table} WHERE uuid = ?1"),
                [marker.to_string()],
                |_| Ok(()),
            )
            .optional()
            .map_err(|e| db("reading the list marker", e))?;
        if exists.is_none() {
            return Err(not_found(marker));
        }
        self.bind(
            &after_marker(&Sqlite, table, self.order),
            Value::Text(marker.to_string()),
        );
        Ok(())
    }

    /// Runs the query for `columns`, in the query's order, at most `limit` rows, each read by
    /// `from_row`; `what` names the call in errors (`listing nodes`).
    pub fn run<T>(
        mut self,
        conn: &Connection,
        columns: &str,
        limit: Option<usize>,
        from_row: fn(&Row<'_>) -> rusqlite::Result<T>,
        what: &str,
    ) -> Result<Vec<T>, StoreError> {
        let filters = if self.clauses.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", self.clauses.join(" AND "))
        };
        self.values.push(limit_value(limit));
        let sql = format!(
            "SELECT {columns} FROM {} t {filters} ORDER BY {} LIMIT ?{}",
            self.table,
            order_by(&Sqlite, self.order),
            self.values.len()
        );
        let mut stmt = conn.prepare(&sql).map_err(|e| db(what, e))?;
        let rows = stmt
            .query_map(params_from_iter(self.values), from_row)
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| db(what, e))?;
        Ok(rows)
    }
}
