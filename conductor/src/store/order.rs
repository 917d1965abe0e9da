//! The order of a list and the page after a marker, in the store: the database sorts (on an
//! index where there is one) and returns one page, instead of every record being loaded, decoded
//! and sorted per request.
//!
//! # Design
//! A list is ordered by one column and then by `id` (creation order), which makes the order
//! total, so a page can start right after its marker (keyset pagination): the records after the
//! marker in that order are those whose `(column, id)` comes after the marker's. NULLs sort first
//! ascending and last descending (the API's order before the store sorted). The marker is read
//! inside the statement (`EXISTS (SELECT … FROM table m WHERE m.uuid = ?)`), so no typed copy of
//! its value is needed and both stores share the clause; each store supplies only how a column
//! compares ([`Dialect`]).

/// Node columns a list may be sorted on (Ironic refuses the JSON ones).
pub const NODE_SORT_KEYS: &[&str] = &[
    "id",
    "uuid",
    "name",
    "created_at",
    "updated_at",
    "driver",
    "provision_state",
    "power_state",
    "maintenance",
    "instance_uuid",
    "provision_updated_at",
];

/// Port columns a list may be sorted on.
pub const PORT_SORT_KEYS: &[&str] = &[
    "id",
    "uuid",
    "address",
    "created_at",
    "updated_at",
    "pxe_enabled",
];

/// Columns holding times.
const TIME_COLUMNS: &[&str] = &["created_at", "updated_at", "provision_updated_at"];

/// How a list is ordered: a column of [`NODE_SORT_KEYS`] or [`PORT_SORT_KEYS`], then `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order {
    column: &'static str,
    /// Descending.
    pub descending: bool,
}

impl Default for Order {
    /// Creation order.
    fn default() -> Order {
        Order {
            column: "id",
            descending: false,
        }
    }
}

impl Order {
    /// `key` if it is one of `keys` (the table's sortable columns).
    pub fn by(keys: &[&'static str], key: &str, descending: bool) -> Option<Order> {
        keys.iter()
            .find(|k| **k == key)
            .map(|column| Order { column, descending })
    }

    /// The column.
    pub fn column(&self) -> &'static str {
        self.column
    }
}

/// How a store's SQL compares a column.
pub(super) trait Dialect {
    /// The expression that orders `alias.column`: a time as a number where the database keeps
    /// it as text, a text column in byte order.
    fn sort_expr(&self, alias: &str, column: &str, is_time: bool) -> String;
}

fn expr(dialect: &dyn Dialect, alias: &str, column: &str) -> String {
    dialect.sort_expr(alias, column, TIME_COLUMNS.contains(&column))
}

/// `ORDER BY` of the outer table `t`.
pub(super) fn order_by(dialect: &dyn Dialect, order: Order) -> String {
    let e = expr(dialect, "t", order.column);
    if order.column == "id" {
        return if order.descending {
            "t.id DESC"
        } else {
            "t.id ASC"
        }
        .to_string();
    }
    if order.descending {
        format!("{e} DESC NULLS LAST, t.id DESC")
    } else {
        format!("{e} ASC NULLS FIRST, t.id ASC")
    }
}

/// The clause that keeps the records of `table` (the outer alias `t`) after the marker, whose
/// UUID is its one `?`.
pub(super) fn after_marker(dialect: &dyn Dialect, table: &str, order: Order) -> String {
    let (t, m) = (
        expr(dialect, "t", order.column),
        expr(dialect, "m", order.column),
    );
    let after = if order.column == "id" {
        if order.descending {
            "t.id < m.id"
        } else {
            "t.id > m.id"
        }
        .to_string()
    } else if order.descending {
        // NULLs last: a NULL marker has only NULLs of lower id after it; a value has the
        // smaller values, its equals of lower id, and every NULL.
        format!(
            "(({m}) IS NULL AND ({t}) IS NULL AND t.id < m.id) \
             OR (({m}) IS NOT NULL AND ({t}) IS NULL) \
             OR ({t}) < ({m}) OR (({t}) = ({m}) AND t.id < m.id)"
        )
    } else {
        // NULLs first: a NULL marker has every value and its NULLs of higher id after it; a
        // value has the greater values and its equals of higher id.
        format!(
            "(({m}) IS NULL AND (({t}) IS NOT NULL OR t.id > m.id)) \
             OR ({t}) > ({m}) OR (({t}) = ({m}) AND t.id > m.id)"
        )
    };
    format!("EXISTS (SELECT 1 FROM {table} m WHERE m.uuid = ? AND ({after}))")
}
