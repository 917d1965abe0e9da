//! Node and port records to and from PostgreSQL rows: `uuid`, `timestamptz` and `boolean`
//! columns as their Rust types, JSON objects as `text`, states by their Ironic names.

use std::str::FromStr;

use time::OffsetDateTime;
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::store::{normalise_mac, HistoryEvent, JsonObject, Node, Port, Severity, StoreError};

/// One statement parameter.
pub(super) type Param = Box<dyn ToSql + Sync + Send>;

/// The parameters as tokio-postgres takes them.
pub(super) fn refs(params: &[Param]) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|p| p.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

/// Values of `store::columns::NODE_WRITABLE`, `uuid` last (the `WHERE` of an update).
pub(super) fn node_values(node: &Node) -> Result<Vec<Param>, StoreError> {
    Ok(vec![
        Box::new(node.name.clone()),
        Box::new(node.driver.clone()),
        Box::new(json(&node.driver_info)?),
        Box::new(json(&node.driver_internal_info)?),
        Box::new(json(&node.properties)?),
        Box::new(json(&node.instance_info)?),
        Box::new(json(&node.extra)?),
        Box::new(json(&node.network_data)?),
        Box::new(node.instance_uuid.clone()),
        Box::new(node.provision_state.as_str().to_string()),
        Box::new(node.target_provision_state.map(|s| s.as_str().to_string())),
        Box::new(node.provision_updated_at),
        Box::new(node.power_state.map(|p| p.as_str().to_string())),
        Box::new(node.target_power_state.map(|p| p.as_str().to_string())),
        Box::new(node.maintenance),
        Box::new(node.maintenance_reason.clone()),
        Box::new(crate::store::storable_error(node.last_error.as_deref())),
        Box::new(node.console_enabled),
        Box::new(node.boot_interface.clone()),
        Box::new(node.deploy_interface.clone()),
        Box::new(node.conductor_group.clone()),
        Box::new(node.uuid),
    ])
}

/// The values of a new port's columns: uuid, address, node_uuid, pxe_enabled, extra,
/// created_at, updated_at.
pub(super) fn port_values(port: &Port) -> Result<Vec<Param>, StoreError> {
    Ok(vec![
        Box::new(port.uuid),
        Box::new(normalise_mac(&port.address)),
        Box::new(port.node_uuid),
        Box::new(port.pxe_enabled),
        Box::new(json(&port.extra)?),
        Box::new(port.created_at),
        Box::new(port.updated_at),
    ])
}

/// Reads a row of `store::columns::NODE_COLUMNS`.
pub(super) fn node_from_row(row: &Row) -> Result<Node, StoreError> {
    Ok(Node {
        uuid: get(row, 0)?,
        name: get(row, 1)?,
        driver: get(row, 2)?,
        driver_info: json_from(row, 3)?,
        driver_internal_info: json_from(row, 4)?,
        properties: json_from(row, 5)?,
        instance_info: json_from(row, 6)?,
        extra: json_from(row, 7)?,
        network_data: json_from(row, 8)?,
        instance_uuid: get(row, 9)?,
        provision_state: parsed(row, 10)?,
        target_provision_state: opt_parsed(row, 11)?,
        provision_updated_at: get::<Option<OffsetDateTime>>(row, 12)?,
        power_state: opt_parsed(row, 13)?,
        target_power_state: opt_parsed(row, 14)?,
        maintenance: get(row, 15)?,
        maintenance_reason: get(row, 16)?,
        last_error: get(row, 17)?,
        reservation: get(row, 18)?,
        console_enabled: get(row, 19)?,
        created_at: get(row, 20)?,
        updated_at: get(row, 21)?,
        boot_interface: get(row, 22)?,
        deploy_interface: get(row, 23)?,
        conductor_group: get(row, 24)?,
    })
}

/// Reads a row of `store::columns::PORT_COLUMNS`.
pub(super) fn port_from_row(row: &Row) -> Result<Port, StoreError> {
    Ok(Port {
        uuid: get(row, 0)?,
        address: get(row, 1)?,
        node_uuid: get::<Uuid>(row, 2)?,
        pxe_enabled: get(row, 3)?,
        extra: json_from(row, 4)?,
        created_at: get(row, 5)?,
        updated_at: get(row, 6)?,
    })
}

/// The columns of `node_history` that [`history_from_row`] reads, in its order.
pub(super) const HISTORY_COLUMNS: &str =
    "uuid, node_uuid, created_at, severity, event_type, event, user_id, conductor";

/// Reads a row of [`HISTORY_COLUMNS`].
pub(super) fn history_from_row(row: &Row) -> Result<HistoryEvent, StoreError> {
    let severity: &str = get(row, 3)?;
    Ok(HistoryEvent {
        uuid: get(row, 0)?,
        node_uuid: get(row, 1)?,
        created_at: get(row, 2)?,
        severity: Severity::parse(severity)
            .ok_or_else(|| bad_column(row, 3, format!("unknown severity {severity:?}")))?,
        event_type: get(row, 4)?,
        event: get(row, 5)?,
        user: get(row, 6)?,
        conductor: get(row, 7)?,
    })
}

/// Reads `hostname, conductor_group, drivers, created_at, updated_at, api_url` of `conductors`.
pub(super) fn conductor_from_row(row: &Row) -> Result<crate::store::ConductorRecord, StoreError> {
    let drivers: &str = get(row, 2)?;
    Ok(crate::store::ConductorRecord {
        hostname: get(row, 0)?,
        conductor_group: get(row, 1)?,
        drivers: serde_json::from_str(drivers).map_err(|e| bad_column(row, 2, e))?,
        created_at: get(row, 3)?,
        updated_at: get(row, 4)?,
        api_url: get(row, 5)?,
    })
}

/// A JSON object as text.
fn json(object: &JsonObject) -> Result<String, StoreError> {
    serde_json::to_string(object)
        .map_err(|e| StoreError::Database(format!("encoding a JSON field: {e}")))
}

fn bad_column(row: &Row, idx: usize, e: impl std::fmt::Display) -> StoreError {
    let name = row.columns().get(idx).map_or("?", |c| c.name());
    StoreError::Database(format!("reading column {name}: {e}"))
}

fn get<'a, T: FromSql<'a>>(row: &'a Row, idx: usize) -> Result<T, StoreError> {
    row.try_get(idx).map_err(|e| bad_column(row, idx, e))
}

fn parsed<T>(row: &Row, idx: usize) -> Result<T, StoreError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    let text: &str = get(row, idx)?;
    text.parse().map_err(|e| bad_column(row, idx, e))
}

fn opt_parsed<T>(row: &Row, idx: usize) -> Result<Option<T>, StoreError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    let text: Option<&str> = get(row, idx)?;
    text.map(|t| t.parse().map_err(|e| bad_column(row, idx, e)))
        .transpose()
}

fn json_from(row: &Row, idx: usize) -> Result<JsonObject, StoreError> {
    let text: &str = get(row, idx)?;
    serde_json::from_str(text).map_err(|e| bad_column(row, idx, e))
}
