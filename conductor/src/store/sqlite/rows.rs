//! Node and port records to and from SQLite rows: JSON objects as TEXT, timestamps as RFC 3339
//! TEXT in UTC, states by their Ironic names, UUIDs hyphenated lower case.

use std::str::FromStr;

use rusqlite::types::{Type, Value};
use rusqlite::Row;
use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, UtcOffset};
use uuid::Uuid;

use crate::store::{HistoryEvent, JsonObject, Node, Port, Severity, StoreError};

pub(super) use crate::store::columns::{NODE_COLUMNS, NODE_WRITABLE, PORT_COLUMNS};

/// Values of [`NODE_WRITABLE`], `uuid` last (the `WHERE` of an update).
pub(super) fn node_values(node: &Node) -> Result<Vec<Value>, StoreError> {
    Ok(vec![
        opt_text(node.name.clone()),
        Value::Text(node.driver.clone()),
        json(&node.driver_info)?,
        json(&node.driver_internal_info)?,
        json(&node.properties)?,
        json(&node.instance_info)?,
        json(&node.extra)?,
        json(&node.network_data)?,
        opt_text(node.instance_uuid.clone()),
        Value::Text(node.provision_state.as_str().to_string()),
        opt_text(node.target_provision_state.map(|s| s.as_str().to_string())),
        opt_time(node.provision_updated_at)?,
        opt_text(node.power_state.map(|p| p.as_str().to_string())),
        opt_text(node.target_power_state.map(|p| p.as_str().to_string())),
        Value::Integer(i64::from(node.maintenance)),
        opt_text(node.maintenance_reason.clone()),
        opt_text(crate::store::storable_error(node.last_error.as_deref())),
        Value::Integer(i64::from(node.console_enabled)),
        opt_text(node.boot_interface.clone()),
        opt_text(node.deploy_interface.clone()),
        Value::Text(node.conductor_group.clone()),
        Value::Text(node.uuid.to_string()),
    ])
}

/// Reads a row of [`NODE_COLUMNS`].
pub(super) fn node_from_row(row: &Row<'_>) -> rusqlite::Result<Node> {
    Ok(Node {
        uuid: parsed::<Uuid>(row, 0)?,
        name: row.get(1)?,
        driver: row.get(2)?,
        boot_interface: row.get(22)?,
        deploy_interface: row.get(23)?,
        driver_info: json_from(row, 3)?,
        driver_internal_info: json_from(row, 4)?,
        properties: json_from(row, 5)?,
        instance_info: json_from(row, 6)?,
        extra: json_from(row, 7)?,
        network_data: json_from(row, 8)?,
        instance_uuid: row.get(9)?,
        provision_state: parsed(row, 10)?,
        target_provision_state: opt_parsed(row, 11)?,
        provision_updated_at: opt_time_from(row, 12)?,
        power_state: opt_parsed(row, 13)?,
        target_power_state: opt_parsed(row, 14)?,
        maintenance: row.get(15)?,
        maintenance_reason: row.get(16)?,
        last_error: row.get(17)?,
        reservation: row.get(18)?,
        console_enabled: row.get(19)?,
        created_at: time_from(row, 20)?,
        updated_at: opt_time_from(row, 21)?,
        conductor_group: row.get(24)?,
    })
}

/// Reads `hostname, conductor_group, drivers, created_at, updated_at, api_url` of `conductors`.
pub(super) fn conductor_from_row(row: &Row<'_>) -> rusqlite::Result<crate::store::ConductorRecord> {
    let drivers: String = row.get(2)?;
    Ok(crate::store::ConductorRecord {
        hostname: row.get(0)?,
        conductor_group: row.get(1)?,
        drivers: serde_json::from_str(&drivers).map_err(|e| bad_column(2, e))?,
        created_at: time_from(row, 3)?,
        updated_at: time_from(row, 4)?,
        api_url: row.get(5)?,
    })
}

/// Reads a row of [`PORT_COLUMNS`].
pub(super) fn port_from_row(row: &Row<'_>) -> rusqlite::Result<Port> {
    Ok(Port {
        uuid: parsed(row, 0)?,
        address: row.get(1)?,
        node_uuid: parsed(row, 2)?,
        pxe_enabled: row.get(3)?,
        extra: json_from(row, 4)?,
        created_at: time_from(row, 5)?,
        updated_at: opt_time_from(row, 6)?,
    })
}

/// The columns of `node_history` that [`history_from_row`] reads, in its order.
pub(super) const HISTORY_COLUMNS: &str =
    "uuid, node_uuid, created_at, severity, event_type, event, user_id, conductor";

/// Reads a row of [`HISTORY_COLUMNS`].
pub(super) fn history_from_row(row: &Row<'_>) -> rusqlite::Result<HistoryEvent> {
    let severity: String = row.get(3)?;
    Ok(HistoryEvent {
        uuid: parsed(row, 0)?,
        node_uuid: parsed(row, 1)?,
        created_at: time_from(row, 2)?,
        severity: Severity::parse(&severity)
            .ok_or_else(|| bad_column(3, UnknownSeverity(severity)))?,
        event_type: row.get(4)?,
        event: row.get(5)?,
        user: row.get(6)?,
        conductor: row.get(7)?,
    })
}

/// A `severity` column that names no [`Severity`].
#[derive(Debug, thiserror::Error)]
#[error("unknown severity {0:?}")]
struct UnknownSeverity(String);

pub(super) use crate::store::normalise_mac;

/// A JSON object as TEXT.
pub(super) fn json(object: &JsonObject) -> Result<Value, StoreError> {
    serde_json::to_string(object)
        .map(Value::Text)
        .map_err(|e| StoreError::Database(format!("encoding a JSON field: {e}")))
}

/// A time as RFC 3339 TEXT in UTC. UTC first: RFC 3339 cannot carry an offset with seconds, and
/// one zone keeps the text sortable.
pub(super) fn time(t: OffsetDateTime) -> Result<Value, StoreError> {
    t.to_offset(UtcOffset::UTC)
        .format(&Rfc3339)
        .map(Value::Text)
        .map_err(|e| StoreError::Database(format!("formatting time {t}: {e}")))
}

fn opt_time(t: Option<OffsetDateTime>) -> Result<Value, StoreError> {
    t.map_or(Ok(Value::Null), time)
}

fn opt_text(s: Option<String>) -> Value {
    s.map_or(Value::Null, Value::Text)
}

fn bad_column(idx: usize, e: impl std::error::Error + Send + Sync + 'static) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e))
}

fn parsed<T>(row: &Row<'_>, idx: usize) -> rusqlite::Result<T>
where
    T: FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let text: String = row.get(idx)?;
    text.parse().map_err(|e| bad_column(idx, e))
}

fn opt_parsed<T>(row: &Row<'_>, idx: usize) -> rusqlite::Result<Option<T>>
where
    T: FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let text: Option<String> = row.get(idx)?;
    text.map(|t| t.parse().map_err(|e| bad_column(idx, e)))
        .transpose()
}

fn json_from(row: &Row<'_>, idx: usize) -> rusqlite::Result<JsonObject> {
    let text: String = row.get(idx)?;
    serde_json::from_str(&text).map_err(|e| bad_column(idx, e))
}

fn time_from(row: &Row<'_>, idx: usize) -> rusqlite::Result<OffsetDateTime> {
    let text: String = row.get(idx)?;
    OffsetDateTime::parse(&text, &Rfc3339).map_err(|e| bad_column(idx, e))
}

fn opt_time_from(row: &Row<'_>, idx: usize) -> rusqlite::Result<Option<OffsetDateTime>> {
    let text: Option<String> = row.get(idx)?;
    text.map(|t| OffsetDateTime::parse(&t, &Rfc3339).map_err(|e| bad_column(idx, e)))
        .transpose()
}
