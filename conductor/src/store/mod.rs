//! Node and port records, and the store that keeps them (docs/architecture.md §2 `store`, §8).
//!
//! # Design
//! [`Store`] is an async trait object (`Arc<dyn Store>`): the embedded SQLite implementation
//! ([`sqlite::SqliteStore`], rusqlite on a blocking thread) is the default, and
//! [`postgres::PostgresStore`] (tokio-postgres, pooled) is the store several conductors share
//! (docs/crates.md §3.4). One contract suite ([`testing`]) runs against both.
//!
//! Times are kept to the microsecond ([`now`]): PostgreSQL's `timestamptz` has no finer unit,
//! and a record must read back equal to the one written, whichever store holds it.
//!
//! One task per node: [`Store::reserve_node`] sets `reservation` atomically only when it is
//! empty, and fails with [`StoreError::Locked`] (the API's 409 `NodeLocked`) otherwise. Writes of
//! a node record never touch its reservation; only reserve and release do.
//!
//! Records hold JSON objects (`driver_info`, `instance_info`, ...) as Ironic does: their keys are
//! open-ended, and the API and the flows parse the keys they need (`crate::node`).

use serde_json::{Map, Value};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::states::{NodePower, ProvisionState};

mod abandoned;
mod broken;
mod columns;
mod filter;
pub mod order;
pub mod postgres;
pub mod sqlite;
#[cfg(test)]
pub mod testing;

tokio::task_local! {
    /// Set while an operator's read runs (a `GET` to the API other than the ramdisk's lookup;
    /// module `crate::api`).
    static OPERATOR_READ: ();
}

/// Runs `request` as an operator's read: the PostgreSQL store serves its reads from the
/// connections it keeps for them, so they never queue behind the node tasks' calls
/// (`postgres::PostgresStore`).
pub async fn as_operator_read<F: std::future::Future>(request: F) -> F::Output {
    OPERATOR_READ.scope((), request).await
}

/// Whether the running task is an operator's read ([`as_operator_read`]).
pub(crate) fn is_operator_read() -> bool {
    OPERATOR_READ.try_with(|()| ()).is_ok()
}

/// Now, in UTC, to the microsecond: the precision both stores keep.
pub fn now() -> OffsetDateTime {
    let t = OffsetDateTime::now_utc();
    t.replace_nanosecond(t.nanosecond() / 1_000 * 1_000)
        .unwrap_or(t)
}

/// Refuses a node whose text fields hold a NUL character (JSON fields may: they are stored as
/// JSON text, where it is the escape `\u0000`). `last_error` is not checked: it is the
/// conductor's own words, often quoting a BMC, and a failure must always be recorded; the stores
/// write it through [`storable_error`].
pub(crate) fn check_node_text(node: &Node) -> Result<(), StoreError> {
    let fields = [
        ("name", node.name.as_deref()),
        ("driver", Some(node.driver.as_str())),
        ("boot_interface", node.boot_interface.as_deref()),
        ("deploy_interface", node.deploy_interface.as_deref()),
        ("conductor_group", Some(node.conductor_group.as_str())),
        ("instance_uuid", node.instance_uuid.as_deref()),
        ("maintenance_reason", node.maintenance_reason.as_deref()),
        ("reservation", node.reservation.as_deref()),
    ];
    check_text("node", &fields)
}

/// `last_error` as both stores keep it: a NUL character becomes U+FFFD.
pub(crate) fn storable_error(last_error: Option<&str>) -> Option<String> {
    last_error.map(|text| text.replace('\0', "\u{FFFD}"))
}

/// Refuses a conductor record whose text fields hold a NUL character. The values come from the
/// conductor's own configuration, but PostgreSQL would refuse them as a database error, and the
/// SQLite store would keep them: both refuse them alike instead.
pub(crate) fn check_conductor_text(conductor: &ConductorRecord) -> Result<(), StoreError> {
    check_text(
        "conductor",
        &[
            ("hostname", Some(conductor.hostname.as_str())),
            ("conductor_group", Some(conductor.conductor_group.as_str())),
            ("api_url", conductor.api_url.as_deref()),
        ],
    )
}

/// Refuses a port whose MAC holds a NUL character.
pub(crate) fn check_port_text(port: &Port) -> Result<(), StoreError> {
    check_text("port", &[("address", Some(port.address.as_str()))])
}

fn check_text(kind: &str, fields: &[(&str, Option<&str>)]) -> Result<(), StoreError> {
    match fields
        .iter()
        .find(|(_, value)| value.is_some_and(|v| v.contains('\0')))
    {
        Some((field, _)) => Err(StoreError::Invalid(format!(
            "the {kind}'s {field} holds a NUL character, which cannot be stored"
        ))),
        None => Ok(()),
    }
}

/// A MAC as stored and compared: lower case, so `AA:BB:..` and `aa:bb:..` are one port.
pub fn normalise_mac(address: &str) -> String {
    address.to_ascii_lowercase()
}

/// A JSON object field of a record.
pub type JsonObject = Map<String, Value>;

/// A bare-metal node.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Identity, chosen by the API at create (or given by the caller).
    pub uuid: Uuid,
    /// Optional unique logical name (API ≥ 1.5).
    pub name: Option<String>,
    /// `agent_ilo`, `iscsi_ilo`, `pxe_ilo`, or a hardware type alias (`ilo`, `redfish`).
    pub driver: String,
    /// The boot interface the operator chose (`None`: the driver's default; see
    /// [`crate::node::hardware_type`]).
    pub boot_interface: Option<String>,
    /// The deploy interface the operator chose (`None`: the driver's default).
    pub deploy_interface: Option<String>,
    /// BMC address and credentials, deploy ISO (`ilo_*`, `client_*`).
    pub driver_info: JsonObject,
    /// Conductor-private state of the flows (agent URL, token, progress); hidden below 1.3.
    pub driver_internal_info: JsonObject,
    /// Hardware properties; `capabilities` (`boot_mode:uefi,...`) among them.
    pub properties: JsonObject,
    /// What to deploy (set by the scheduler): `image_source`, `root_gb`, checksums, ...
    pub instance_info: JsonObject,
    /// Operator's free-form data.
    pub extra: JsonObject,
    /// Static network configuration for DHCP-less deploys (Ironic's `network_data`).
    pub network_data: JsonObject,
    /// The Nova instance deployed on the node.
    pub instance_uuid: Option<String>,
    /// Provision state.
    pub provision_state: ProvisionState,
    /// Where a running transition goes.
    pub target_provision_state: Option<ProvisionState>,
    /// When `provision_state` last changed.
    pub provision_updated_at: Option<OffsetDateTime>,
    /// Last known power state (`None` until first read).
    pub power_state: Option<NodePower>,
    /// Power state a running power task is moving to.
    pub target_power_state: Option<NodePower>,
    /// Maintenance mode: no power sync, no new tasks except the operator's.
    pub maintenance: bool,
    /// Why it is in maintenance.
    pub maintenance_reason: Option<String>,
    /// The last failure, in words an operator can act on.
    pub last_error: Option<String>,
    /// Who holds the node's task lock (`None` = free). Read-only for [`Store::update_node`].
    pub reservation: Option<String>,
    /// Serial console enabled (always false here).
    pub console_enabled: bool,
    /// The conductor group whose conductors manage the node (Ironic's field, API ≥ 1.46): lower
    /// case, empty for the default group. The API checks and lower-cases what it is given; the
    /// store keeps what it is handed.
    pub conductor_group: String,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Last written.
    pub updated_at: Option<OffsetDateTime>,
}

impl Node {
    /// A new node in `initial` state with empty fields.
    pub fn new(uuid: Uuid, driver: impl Into<String>, initial: ProvisionState) -> Node {
        Node {
            uuid,
            name: None,
            driver: driver.into(),
            boot_interface: None,
            deploy_interface: None,
            driver_info: JsonObject::new(),
            driver_internal_info: JsonObject::new(),
            properties: JsonObject::new(),
            instance_info: JsonObject::new(),
            extra: JsonObject::new(),
            network_data: JsonObject::new(),
            instance_uuid: None,
            provision_state: initial,
            target_provision_state: None,
            provision_updated_at: None,
            power_state: None,
            target_power_state: None,
            maintenance: false,
            maintenance_reason: None,
            last_error: None,
            reservation: None,
            console_enabled: false,
            conductor_group: String::new(),
            created_at: now(),
            updated_at: None,
        }
    }
}

/// A NIC of a node (Ironic's port): its MAC is how the ramdisk is looked up.
#[derive(Debug, Clone, PartialEq)]
pub struct Port {
    /// Identity.
    pub uuid: Uuid,
    /// MAC address, lower case `aa:bb:cc:dd:ee:ff`, unique.
    pub address: String,
    /// The node it belongs to.
    pub node_uuid: Uuid,
    /// PXE-enabled NIC (`BOOTIF` comes from the first such port).
    pub pxe_enabled: bool,
    /// Free-form data (`vif_port_id` for Kilo Nova).
    pub extra: JsonObject,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Last written.
    pub updated_at: Option<OffsetDateTime>,
}

/// How serious a node history event is (Ironic's `severity`: `INFO`, `WARNING`, `ERROR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Something that happened as asked.
    Info,
    /// Something the operator may want to look at.
    Warning,
    /// A failure.
    Error,
}

impl Severity {
    /// The name Ironic's API shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "INFO",
            Severity::Warning => "WARNING",
            Severity::Error => "ERROR",
        }
    }

    /// The severity named `name` (as [`Self::as_str`] writes it).
    pub fn parse(name: &str) -> Option<Severity> {
        match name {
            "INFO" => Some(Severity::Info),
            "WARNING" => Some(Severity::Warning),
            "ERROR" => Some(Severity::Error),
            _ => None,
        }
    }
}

/// One event of a node's history (Ironic's `node_history` table, API 1.78): what happened to
/// the node, when, how serious it was, and who and which conductor made it happen. Kept with
/// the node, at most a configured number per node, and gone with it.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryEvent {
    /// Identity (`/v1/nodes/{node}/history/{uuid}`).
    pub uuid: Uuid,
    /// The node.
    pub node_uuid: Uuid,
    /// When it happened.
    pub created_at: OffsetDateTime,
    /// How serious.
    pub severity: Severity,
    /// What kind of event (Ironic's `event_type`: `provisioning`, `deploy`, `clean`, `console`,
    /// `inspection`, ...).
    pub event_type: String,
    /// What happened, in words.
    pub event: String,
    /// The user whose request it was, when known.
    pub user: Option<String>,
    /// The conductor that did it, when known.
    pub conductor: Option<String>,
}

/// Which history events to list: oldest first unless `newest_first`, after the event `marker`
/// in that order, at most `limit`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryQuery {
    /// List from the newest event back.
    pub newest_first: bool,
    /// Start after this event.
    pub marker: Option<Uuid>,
    /// At most this many.
    pub limit: Option<usize>,
}

/// A conductor as the database knows it (Ironic's `conductors` table): one row per running
/// conductor, kept fresh by its heartbeat; a row whose heartbeat is older than
/// `conductor.heartbeat_timeout` is a conductor that died.
#[derive(Debug, Clone, PartialEq)]
pub struct ConductorRecord {
    /// Its name (`deploy.conductor_name`, the host name by default), unique.
    pub hostname: String,
    /// `conductor.conductor_group` (empty: the default group).
    pub conductor_group: String,
    /// The drivers (hardware types) it runs.
    pub drivers: Vec<String>,
    /// Where other conductors reach its API (`http(s)://host:port`), to hand it the actions of
    /// the nodes it owns; `None` when it gave none (a row from before the migration that added
    /// the column, until the conductor registers again).
    pub api_url: Option<String>,
    /// When it first registered.
    pub created_at: OffsetDateTime,
    /// Its last heartbeat (or registration).
    pub updated_at: OffsetDateTime,
}

/// A node named by UUID or by logical name, as the API's `{node_ident}` allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeIdent {
    /// By UUID.
    Uuid(Uuid),
    /// By name.
    Name(String),
}

impl NodeIdent {
    /// A UUID if `s` parses as one, else a name.
    pub fn parse(s: &str) -> NodeIdent {
        match Uuid::parse_str(s) {
            Ok(uuid) => NodeIdent::Uuid(uuid),
            Err(_) => NodeIdent::Name(s.to_string()),
        }
    }
}

impl std::fmt::Display for NodeIdent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeIdent::Uuid(u) => write!(f, "{u}"),
            NodeIdent::Name(n) => f.write_str(n),
        }
    }
}

/// Filters of a node list (all must hold); empty = every node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFilter {
    /// Only nodes in this provision state.
    pub provision_state: Option<ProvisionState>,
    /// Only nodes of this driver.
    pub driver: Option<String>,
    /// Only nodes with (or without) maintenance.
    pub maintenance: Option<bool>,
    /// Only nodes with this instance.
    pub instance_uuid: Option<String>,
    /// Only nodes with (`Some(true)`) or without an instance.
    pub associated: Option<bool>,
    /// Only nodes reserved by this holder.
    pub reserved_by: Option<String>,
    /// Only nodes of this conductor group (any case in, lower case compared: groups are kept
    /// lower case; `""` is the default group).
    pub conductor_group: Option<String>,
    /// The order (creation order by default).
    pub order: order::Order,
    /// At most this many.
    pub limit: Option<usize>,
    /// Start after this node, in `order` (pagination marker).
    pub marker: Option<Uuid>,
}

/// Filters of a port list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PortFilter {
    /// Only this node's ports.
    pub node_uuid: Option<Uuid>,
    /// Only the port with this MAC (any case in, lower case compared).
    pub address: Option<String>,
    /// The order (creation order by default).
    pub order: order::Order,
    /// At most this many.
    pub limit: Option<usize>,
    /// Start after this port.
    pub marker: Option<Uuid>,
}

/// Why a store call failed. The API maps these to Ironic's status codes.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such node or port (404).
    #[error("{kind} {ident} could not be found")]
    NotFound {
        /// `node` or `port`.
        kind: &'static str,
        /// What was asked for.
        ident: String,
    },
    /// A unique field is taken: node UUID or name, port UUID or MAC (409).
    #[error("{kind} with {field} {value} already exists")]
    Duplicate {
        /// `node` or `port`.
        kind: &'static str,
        /// The field (`uuid`, `name`, `address`).
        field: &'static str,
        /// Its value.
        value: String,
    },
    /// The node is reserved by another task (409 `NodeLocked`).
    #[error(
        "node {node} is locked by {holder}, please retry after the current operation is completed"
    )]
    Locked {
        /// The node.
        node: Uuid,
        /// Who holds it.
        holder: String,
    },
    /// The node still has ports, or another record refers to it (409).
    #[error("{0}")]
    InUse(String),
    /// The database failed (500): I/O, corruption, a migration.
    #[error("database: {0}")]
    Database(String),
    /// The database cannot be reached now (503): the server is down or restarting, the
    /// connection broke mid-call, or every pooled connection stayed busy. Nothing is known to
    /// have been written; the caller may retry.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The record cannot be stored as it is (400): a text field holds a NUL character, which
    /// PostgreSQL's `text` cannot keep. Both stores refuse it, so a node does not work on one
    /// and fail on the other.
    #[error("{0}")]
    Invalid(String),
}

impl StoreError {
    /// No node named `ident`.
    pub fn node_not_found(ident: impl ToString) -> StoreError {
        StoreError::NotFound {
            kind: "node",
            ident: ident.to_string(),
        }
    }

    /// No port named `ident`.
    pub fn port_not_found(ident: impl ToString) -> StoreError {
        StoreError::NotFound {
            kind: "port",
            ident: ident.to_string(),
        }
    }

    /// No history event `ident` (of the node asked about).
    pub fn history_event_not_found(ident: impl ToString) -> StoreError {
        StoreError::NotFound {
            kind: "history event",
            ident: ident.to_string(),
        }
    }
}

/// Where nodes and ports live. Every method is one transaction.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Adds a node; [`StoreError::Duplicate`] when its UUID or name is taken.
    async fn create_node(&self, node: &Node) -> Result<(), StoreError>;
    /// One node by UUID or name.
    async fn node(&self, ident: &NodeIdent) -> Result<Node, StoreError>;
    /// Nodes that pass `filter`, in its order; a marker that names no node is `NotFound`.
    async fn list_nodes(&self, filter: &NodeFilter) -> Result<Vec<Node>, StoreError>;
    /// Writes every field of `node` except `reservation` and `created_at`; sets `updated_at`.
    async fn update_node(&self, node: &Node) -> Result<(), StoreError>;
    /// Removes a node and its ports.
    async fn delete_node(&self, uuid: Uuid) -> Result<(), StoreError>;
    /// Takes the node's task lock for `holder` when it is free, and returns the node as it is
    /// now; [`StoreError::Locked`] when someone holds it.
    async fn reserve_node(&self, uuid: Uuid, holder: &str) -> Result<Node, StoreError>;
    /// Releases the lock if `holder` has it (a no-op otherwise, so it is safe on every path).
    async fn release_node(&self, uuid: Uuid, holder: &str) -> Result<(), StoreError>;
    /// Releases every lock whose holder starts with `holder_prefix` (a restarted conductor
    /// releasing what its previous run held); returns the nodes released.
    async fn release_all(&self, holder_prefix: &str) -> Result<Vec<Uuid>, StoreError>;
    /// Adds a port; [`StoreError::Duplicate`] when its UUID or MAC is taken.
    async fn create_port(&self, port: &Port) -> Result<(), StoreError>;
    /// One port.
    async fn port(&self, uuid: Uuid) -> Result<Port, StoreError>;
    /// Ports that pass `filter`, in its order; a marker that names no port is `NotFound`.
    async fn list_ports(&self, filter: &PortFilter) -> Result<Vec<Port>, StoreError>;
    /// Writes every field of `port` except `created_at`; sets `updated_at`.
    async fn update_port(&self, port: &Port) -> Result<(), StoreError>;
    /// Removes a port.
    async fn delete_port(&self, uuid: Uuid) -> Result<(), StoreError>;
    /// Records `conductor` as running: a new row, or the row of its earlier run brought up to
    /// date (its `created_at` kept; group, drivers and `api_url` replaced); `updated_at` is
    /// now. [`StoreError::Invalid`] when a text field holds a NUL character.
    async fn register_conductor(&self, conductor: &ConductorRecord) -> Result<(), StoreError>;
    /// Sets the conductor's `updated_at` to now; `NotFound` when it is not registered (another
    /// conductor removed it as dead: it registers again).
    async fn heartbeat_conductor(&self, hostname: &str) -> Result<(), StoreError>;
    /// Every registered conductor, by host name.
    async fn list_conductors(&self) -> Result<Vec<ConductorRecord>, StoreError>;
    /// Removes the conductor's row (a clean shutdown); a no-op when it has none.
    async fn unregister_conductor(&self, hostname: &str) -> Result<(), StoreError>;
    /// The key every conductor of this database signs forwarded requests with
    /// (`crate::cluster::forward`): [`CLUSTER_KEY_LEN`] random bytes, made by the first caller and
    /// the same for every later one.
    async fn cluster_key(&self) -> Result<Vec<u8>, StoreError>;
    /// Adds `event` to its node's history and drops the node's oldest events beyond the newest
    /// `keep`, in one transaction; `NotFound` when the node is gone, [`StoreError::Invalid`]
    /// when a text field holds a NUL character.
    async fn add_history(&self, event: &HistoryEvent, keep: usize) -> Result<(), StoreError>;
    /// The history of node `node` (by UUID) as `query` asks; a marker that names no event of
    /// that node is `NotFound`. An unknown node has no history (an empty list).
    async fn list_history(
        &self,
        node: Uuid,
        query: &HistoryQuery,
    ) -> Result<Vec<HistoryEvent>, StoreError>;
    /// One event of node `node`'s history; `NotFound` when that node has no such event.
    async fn history_event(&self, node: Uuid, event: Uuid) -> Result<HistoryEvent, StoreError>;
}

/// Refuses an event whose text holds a NUL character (neither store keeps one in text).
pub(crate) fn check_history_text(event: &HistoryEvent) -> Result<(), StoreError> {
    let fields = [
        ("event_type", Some(event.event_type.as_str())),
        ("event", Some(event.event.as_str())),
        ("user", event.user.as_deref()),
        ("conductor", event.conductor.as_deref()),
    ];
    check_text("history event", &fields)
}

/// Length of [`Store::cluster_key`]'s key: HMAC-SHA256's block-sized key.
pub const CLUSTER_KEY_LEN: usize = 32;

/// A fresh random cluster key, for the store to keep unless another conductor's is there.
pub(crate) fn new_cluster_key() -> Result<Vec<u8>, StoreError> {
    let mut key = vec![0u8; CLUSTER_KEY_LEN];
    getrandom::fill(&mut key)
        .map_err(|e| StoreError::Database(format!("no randomness for the cluster key: {e}")))?;
    Ok(key)
}
