//! The `WHERE` clauses of a node or port list, written once for both stores: each clause is
//! SQL with at most one `?` and the value it takes, in a neutral type each store turns into its
//! own parameter (SQLite keeps UUIDs as text and flags as integers, PostgreSQL as `uuid` and
//! `boolean`).

use uuid::Uuid;

use super::{normalise_mac, NodeFilter, PortFilter};

/// The value of a clause's `?`.
pub(super) enum FilterValue {
    /// Compared with a text column.
    Text(String),
    /// Compared with a flag column.
    Bool(bool),
    /// Compared with a UUID column.
    Uuid(Uuid),
}

/// One clause of a list's `WHERE`, `AND`ed with the others.
pub(super) struct Clause {
    /// SQL on the list's table, with one `?` when `value` is set.
    pub sql: &'static str,
    /// What the `?` takes.
    pub value: Option<FilterValue>,
}

fn bound(sql: &'static str, value: FilterValue) -> Clause {
    Clause {
        sql,
        value: Some(value),
    }
}

/// The clauses of `filter` (its order, marker and limit are each store's).
pub(super) fn node_clauses(filter: &NodeFilter) -> Vec<Clause> {
    let mut clauses = Vec::new();
    if let Some(state) = filter.provision_state {
        clauses.push(bound(
            "provision_state = ?",
            FilterValue::Text(state.as_str().into()),
        ));
    }
    if let Some(driver) = &filter.driver {
        clauses.push(bound("driver = ?", FilterValue::Text(driver.clone())));
    }
    if let Some(maintenance) = filter.maintenance {
        clauses.push(bound("maintenance = ?", FilterValue::Bool(maintenance)));
    }
    if let Some(instance) = &filter.instance_uuid {
        clauses.push(bound(
            "instance_uuid = ?",
            FilterValue::Text(instance.clone()),
        ));
    }
    if let Some(holder) = &filter.reserved_by {
        clauses.push(bound("reservation = ?", FilterValue::Text(holder.clone())));
    }
    if let Some(group) = &filter.conductor_group {
        // Groups are case-insensitive (Ironic's rule) and kept lower case, so the value is
        // lowered here rather than the column in SQL, which would not use its index.
        clauses.push(bound(
            "conductor_group = ?",
            FilterValue::Text(group.to_ascii_lowercase()),
        ));
    }
    match filter.associated {
        Some(true) => clauses.push(Clause {
            sql: "instance_uuid IS NOT NULL",
            value: None,
        }),
        Some(false) => clauses.push(Clause {
            sql: "instance_uuid IS NULL",
            value: None,
        }),
        None => {}
    }
    clauses
}

/// The clauses of `filter` (its order, marker and limit are each store's).
pub(super) fn port_clauses(filter: &PortFilter) -> Vec<Clause> {
    let mut clauses = Vec::new();
    if let Some(node) = filter.node_uuid {
        clauses.push(bound("node_uuid = ?", FilterValue::Uuid(node)));
    }
    if let Some(address) = &filter.address {
        clauses.push(bound(
            "address = ?",
            FilterValue::Text(normalise_mac(address)),
        ));
    }
    clauses
}
