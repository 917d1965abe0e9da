//! The source of an import: an Ironic's nodes and ports, read from its API or from the JSON its
//! `baremetal` CLI prints, into one typed form ([`SourceNode`], [`SourcePort`]).
//!
//! # Design
//! Every input is outside input: a field may be missing, null, of another type than Ironic
//! gives it, or (older clients) a dictionary printed as a string. Each field is read by one
//! small function that never fails: what cannot be read is recorded in `unreadable` with the
//! reason, and the mapping ([`super::mapping`]) decides whether the node can still be taken
//! over. Nothing here panics on input.
//!
//! # Where the names come from
//! The API's field names (`GET /v1/nodes/detail`, `GET /v1/ports/detail`, microversion 1.73)
//! and the column titles of `baremetal node list --long -f json` and `baremetal port list
//! --long -f json` are python-ironicclient's: `ironicclient/v1/resource_fields.py` maps each
//! field to its label (`Resource.FIELDS`), and `NODE_DETAILED_RESOURCE` /
//! `PORT_DETAILED_RESOURCE` list the fields of the two long listings. Releases up to 5.x head
//! the JSON keys with the labels (`"UUID"`, `"Driver Info"`, `"Provisioning State"`, `"PXE boot
//! enabled"`); 6.x (the setup's venv has 6.3.0) heads them with the field names, as the API does
//! (its release note: "All baremetal list commands now use actual resource field names ... as
//! column headers"). Both are read: [`NODE_COLUMNS`] and [`PORT_COLUMNS`] hold the pairs this
//! module relies on. The CLI prints one page (the API's `max_limit` records) unless given
//! `--limit 0`, so the messages ask for that.

use anyhow::{bail, Context};
use serde_json::{Map, Value};
use url::Url;
use vmdeploy_shared::json::kind;

use super::client::ApiClient;

/// One field: its API name and the title python-ironicclient gives its column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// The API's field name (and the 6.x CLI's JSON key).
    pub field: &'static str,
    /// The label of `ironicclient/v1/resource_fields.py` `Resource.FIELDS` (the 5.x CLI's key).
    pub title: &'static str,
}

const fn column(field: &'static str, title: &'static str) -> Column {
    Column { field, title }
}

/// The node fields an import reads (a subset of `NODE_DETAILED_RESOURCE`).
pub mod node_columns {
    use super::{column, Column};
    /// `uuid`.
    pub const UUID: Column = column("uuid", "UUID");
    /// `name`.
    pub const NAME: Column = column("name", "Name");
    /// `driver`.
    pub const DRIVER: Column = column("driver", "Driver");
    /// `driver_info`.
    pub const DRIVER_INFO: Column = column("driver_info", "Driver Info");
    /// `properties`.
    pub const PROPERTIES: Column = column("properties", "Properties");
    /// `instance_info`.
    pub const INSTANCE_INFO: Column = column("instance_info", "Instance Info");
    /// `instance_uuid`.
    pub const INSTANCE_UUID: Column = column("instance_uuid", "Instance UUID");
    /// `provision_state`.
    pub const PROVISION_STATE: Column = column("provision_state", "Provisioning State");
    /// `boot_interface`.
    pub const BOOT_INTERFACE: Column = column("boot_interface", "Boot Interface");
    /// `deploy_interface`.
    pub const DEPLOY_INTERFACE: Column = column("deploy_interface", "Deploy Interface");
    /// `management_interface`.
    pub const MANAGEMENT_INTERFACE: Column = column("management_interface", "Management Interface");
    /// `power_interface`.
    pub const POWER_INTERFACE: Column = column("power_interface", "Power Interface");
    /// `extra`.
    pub const EXTRA: Column = column("extra", "Extra");
    /// `resource_class`.
    pub const RESOURCE_CLASS: Column = column("resource_class", "Resource Class");
    /// `maintenance`.
    pub const MAINTENANCE: Column = column("maintenance", "Maintenance");
    /// `maintenance_reason`.
    pub const MAINTENANCE_REASON: Column = column("maintenance_reason", "Maintenance Reason");
    /// `conductor_group`.
    pub const CONDUCTOR_GROUP: Column = column("conductor_group", "Conductor Group");
    /// `network_data`.
    pub const NETWORK_DATA: Column = column("network_data", "Network Configuration");
}

/// Every node column read, for documentation and the tests.
pub const NODE_COLUMNS: &[Column] = &[
    node_columns::UUID,
    node_columns::NAME,
    node_columns::DRIVER,
    node_columns::DRIVER_INFO,
    node_columns::PROPERTIES,
    node_columns::INSTANCE_INFO,
    node_columns::INSTANCE_UUID,
    node_columns::PROVISION_STATE,
    node_columns::BOOT_INTERFACE,
    node_columns::DEPLOY_INTERFACE,
    node_columns::MANAGEMENT_INTERFACE,
    node_columns::POWER_INTERFACE,
    node_columns::EXTRA,
    node_columns::RESOURCE_CLASS,
    node_columns::MAINTENANCE,
    node_columns::MAINTENANCE_REASON,
    node_columns::CONDUCTOR_GROUP,
    node_columns::NETWORK_DATA,
];

/// The port fields an import reads (a subset of `PORT_DETAILED_RESOURCE`).
pub mod port_columns {
    use super::{column, Column};
    /// `uuid`.
    pub const UUID: Column = column("uuid", "UUID");
    /// `address`.
    pub const ADDRESS: Column = column("address", "Address");
    /// `node_uuid`.
    pub const NODE_UUID: Column = column("node_uuid", "Node UUID");
    /// `pxe_enabled`.
    pub const PXE_ENABLED: Column = column("pxe_enabled", "PXE boot enabled");
    /// `extra`.
    pub const EXTRA: Column = column("extra", "Extra");
    /// `local_link_connection`.
    pub const LOCAL_LINK_CONNECTION: Column =
        column("local_link_connection", "Local Link Connection");
    /// `physical_network`.
    pub const PHYSICAL_NETWORK: Column = column("physical_network", "Physical Network");
    /// `portgroup_uuid`.
    pub const PORTGROUP_UUID: Column = column("portgroup_uuid", "Portgroup UUID");
    /// `name` (ports have names from API 1.88).
    pub const NAME: Column = column("name", "Name");
}

/// Every port column read.
pub const PORT_COLUMNS: &[Column] = &[
    port_columns::UUID,
    port_columns::ADDRESS,
    port_columns::NODE_UUID,
    port_columns::PXE_ENABLED,
    port_columns::EXTRA,
    port_columns::LOCAL_LINK_CONNECTION,
    port_columns::PHYSICAL_NETWORK,
    port_columns::PORTGROUP_UUID,
    port_columns::NAME,
];

/// A field that was there but could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The API's field name.
    pub field: &'static str,
    /// What was wrong (the JSON type found, never the value: it may be a secret).
    pub reason: String,
}

/// One node of the source, as read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SourceNode {
    /// Its UUID, as given (checked by the mapping).
    pub uuid: Option<String>,
    /// Its name.
    pub name: Option<String>,
    /// Its driver (hardware type, or a classic driver of an old Ironic).
    pub driver: Option<String>,
    /// Boot interface.
    pub boot_interface: Option<String>,
    /// Deploy interface.
    pub deploy_interface: Option<String>,
    /// Management interface.
    pub management_interface: Option<String>,
    /// Power interface.
    pub power_interface: Option<String>,
    /// Provision state.
    pub provision_state: Option<String>,
    /// The instance it is associated with, if any.
    pub instance_uuid: Option<String>,
    /// Whether it is in maintenance.
    pub maintenance: bool,
    /// Why.
    pub maintenance_reason: Option<String>,
    /// Resource class.
    pub resource_class: Option<String>,
    /// Conductor group.
    pub conductor_group: Option<String>,
    /// `driver_info`.
    pub driver_info: Map<String, Value>,
    /// `properties`.
    pub properties: Map<String, Value>,
    /// `instance_info`.
    pub instance_info: Map<String, Value>,
    /// `extra`.
    pub extra: Map<String, Value>,
    /// `network_data`.
    pub network_data: Map<String, Value>,
    /// Fields present but unreadable.
    pub unreadable: Vec<Unreadable>,
}

/// One port of the source, as read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SourcePort {
    /// Its UUID.
    pub uuid: Option<String>,
    /// Its MAC address, as given (checked by the mapping).
    pub address: Option<String>,
    /// The node it belongs to.
    pub node_uuid: Option<String>,
    /// Whether the node may network boot from it (Ironic's default: true).
    pub pxe_enabled: Option<bool>,
    /// `extra`.
    pub extra: Map<String, Value>,
    /// `local_link_connection` (the switch port).
    pub local_link_connection: Map<String, Value>,
    /// `physical_network`.
    pub physical_network: Option<String>,
    /// `portgroup_uuid`.
    pub portgroup_uuid: Option<String>,
    /// `name`.
    pub name: Option<String>,
    /// Fields present but unreadable.
    pub unreadable: Vec<Unreadable>,
}

/// A field's value under either of its names (the API's first).
fn lookup(obj: &Map<String, Value>, column: Column) -> Option<&Value> {
    obj.get(column.field).or_else(|| obj.get(column.title))
}

/// A string field: absent, null and empty are `None`; another type is unreadable.
fn text(
    obj: &Map<String, Value>,
    column: Column,
    unreadable: &mut Vec<Unreadable>,
) -> Option<String> {
    match lookup(obj, column)? {
        Value::Null => None,
        Value::String(s) if s.trim().is_empty() => None,
        Value::String(s) => Some(s.trim().to_string()),
        other => {
            unreadable.push(Unreadable {
                field: column.field,
                reason: format!("expected a string, found {}", kind(other)),
            });
            None
        }
    }
}

/// An object field: absent, null and `""` are empty; a string holding a JSON object is read
/// (a value a script stored as text); anything else is unreadable and taken as empty.
fn object(
    obj: &Map<String, Value>,
    column: Column,
    unreadable: &mut Vec<Unreadable>,
) -> Map<String, Value> {
    let found = match lookup(obj, column) {
        None | Some(Value::Null) => return Map::new(),
        Some(v) => v,
    };
    match found {
        Value::Object(m) => m.clone(),
        Value::String(s) if s.trim().is_empty() => Map::new(),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => m,
            _ => {
                unreadable.push(Unreadable {
                    field: column.field,
                    reason: "expected a JSON object, found a string that is not one".into(),
                });
                Map::new()
            }
        },
        other => {
            unreadable.push(Unreadable {
                field: column.field,
                reason: format!("expected a JSON object, found {}", kind(other)),
            });
            Map::new()
        }
    }
}

/// A boolean field: JSON booleans and the strings `true`/`false` (any case).
fn flag(
    obj: &Map<String, Value>,
    column: Column,
    unreadable: &mut Vec<Unreadable>,
) -> Option<bool> {
    match lookup(obj, column)? {
        Value::Null => None,
        Value::Bool(b) => Some(*b),
        Value::String(s) if s.trim().eq_ignore_ascii_case("true") => Some(true),
        Value::String(s) if s.trim().eq_ignore_ascii_case("false") => Some(false),
        other => {
            unreadable.push(Unreadable {
                field: column.field,
                reason: format!("expected true or false, found {}", kind(other)),
            });
            None
        }
    }
}

impl SourceNode {
    /// Reads one node (an element of the CLI's array, or of the API's `nodes`).
    pub fn from_json(value: &Value) -> SourceNode {
        let Value::Object(obj) = value else {
            return SourceNode {
                unreadable: vec![Unreadable {
                    field: "node",
                    reason: format!("expected a JSON object, found {}", kind(value)),
                }],
                ..SourceNode::default()
            };
        };
        use node_columns as c;
        let mut bad = Vec::new();
        let u = &mut bad;
        let node = SourceNode {
            uuid: text(obj, c::UUID, u),
            name: text(obj, c::NAME, u),
            driver: text(obj, c::DRIVER, u),
            boot_interface: text(obj, c::BOOT_INTERFACE, u),
            deploy_interface: text(obj, c::DEPLOY_INTERFACE, u),
            management_interface: text(obj, c::MANAGEMENT_INTERFACE, u),
            power_interface: text(obj, c::POWER_INTERFACE, u),
            provision_state: text(obj, c::PROVISION_STATE, u),
            instance_uuid: text(obj, c::INSTANCE_UUID, u),
            maintenance: flag(obj, c::MAINTENANCE, u).unwrap_or(false),
            maintenance_reason: text(obj, c::MAINTENANCE_REASON, u),
            resource_class: text(obj, c::RESOURCE_CLASS, u),
            conductor_group: text(obj, c::CONDUCTOR_GROUP, u),
            driver_info: object(obj, c::DRIVER_INFO, u),
            properties: object(obj, c::PROPERTIES, u),
            instance_info: object(obj, c::INSTANCE_INFO, u),
            extra: object(obj, c::EXTRA, u),
            network_data: object(obj, c::NETWORK_DATA, u),
            unreadable: Vec::new(),
        };
        SourceNode {
            unreadable: bad,
            ..node
        }
    }
}

impl SourcePort {
    /// Reads one port.
    pub fn from_json(value: &Value) -> SourcePort {
        let Value::Object(obj) = value else {
            return SourcePort {
                unreadable: vec![Unreadable {
                    field: "port",
                    reason: format!("expected a JSON object, found {}", kind(value)),
                }],
                ..SourcePort::default()
            };
        };
        use port_columns as c;
        let mut bad = Vec::new();
        let u = &mut bad;
        let port = SourcePort {
            uuid: text(obj, c::UUID, u),
            address: text(obj, c::ADDRESS, u),
            node_uuid: text(obj, c::NODE_UUID, u),
            pxe_enabled: flag(obj, c::PXE_ENABLED, u),
            extra: object(obj, c::EXTRA, u),
            local_link_connection: object(obj, c::LOCAL_LINK_CONNECTION, u),
            physical_network: text(obj, c::PHYSICAL_NETWORK, u),
            portgroup_uuid: text(obj, c::PORTGROUP_UUID, u),
            name: text(obj, c::NAME, u),
            unreadable: Vec::new(),
        };
        SourcePort {
            unreadable: bad,
            ..port
        }
    }
}

/// Why a JSON export could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Not JSON.
    #[error("{what} is not JSON: {source}")]
    NotJson {
        /// What was read.
        what: String,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// JSON, but not a list of records.
    #[error(
        "{what} is not a list of {collection}: expected a JSON array (the output of `baremetal \
         {singular} list --long --limit 0 -f json`) or an object with a {collection:?} array (the API's), \
         found {found}"
    )]
    NotAList {
        /// What was read.
        what: String,
        /// `nodes` or `ports`.
        collection: &'static str,
        /// `node` or `port`.
        singular: &'static str,
        /// The JSON type found.
        found: &'static str,
    },
}

/// The records of a JSON export: a top-level array (the CLI's `-f json`) or the `collection`
/// array of an API document.
fn records(
    text: &str,
    what: &str,
    collection: &'static str,
    singular: &'static str,
) -> Result<Vec<Value>, SourceError> {
    let value: Value = serde_json::from_str(text).map_err(|source| SourceError::NotJson {
        what: what.to_string(),
        source,
    })?;
    match value {
        Value::Array(items) => Ok(items),
        Value::Object(mut obj) => match obj.remove(collection) {
            Some(Value::Array(items)) => Ok(items),
            _ => Err(SourceError::NotAList {
                what: what.to_string(),
                collection,
                singular,
                found: "an object without one",
            }),
        },
        other => Err(SourceError::NotAList {
            what: what.to_string(),
            collection,
            singular,
            found: kind(&other),
        }),
    }
}

/// The nodes of `baremetal node list --long -f json` output (or an API `nodes` document);
/// `what` names the input in errors.
pub fn nodes_from_json(text: &str, what: &str) -> Result<Vec<SourceNode>, SourceError> {
    Ok(records(text, what, "nodes", "node")?
        .iter()
        .map(SourceNode::from_json)
        .collect())
}

/// The ports of `baremetal port list --long -f json` output (or an API `ports` document).
pub fn ports_from_json(text: &str, what: &str) -> Result<Vec<SourcePort>, SourceError> {
    Ok(records(text, what, "ports", "port")?
        .iter()
        .map(SourcePort::from_json)
        .collect())
}

/// The microversion asked of the source Ironic: 1.73 shows every field read here.
pub const IRONIC_VERSION: &str = "1.73";

/// The lowest microversion an import can work with: 1.31 shows the nodes' interfaces.
pub const IRONIC_MIN_VERSION: u32 = 31;

/// Reads every node and port of a running Ironic: `GET /v1/nodes/detail` and
/// `GET /v1/ports/detail`, each followed through its `next` links.
pub async fn read_ironic(ironic: &ApiClient) -> anyhow::Result<(Vec<SourceNode>, Vec<SourcePort>)> {
    let nodes = ironic
        .list("/v1/nodes/detail", "nodes")
        .await
        .context("listing the source Ironic's nodes")?;
    let ports = ironic
        .list("/v1/ports/detail", "ports")
        .await
        .context("listing the source Ironic's ports")?;
    Ok((
        nodes.iter().map(SourceNode::from_json).collect(),
        ports.iter().map(SourcePort::from_json).collect(),
    ))
}

/// An API base URL as an operator gives it: `http(s)://HOST[:PORT][/PREFIX]`, with or without
/// a final `/` or `/v1`; returned without either.
pub fn base_url(given: &str, what: &str) -> anyhow::Result<Url> {
    let mut url =
        Url::parse(given.trim()).with_context(|| format!("{what} {given:?} is not a URL"))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        bail!("{what} {given:?}: expected an http:// or https:// URL");
    }
    if url.host_str().is_none_or(str::is_empty) {
        bail!("{what} {given:?} has no host");
    }
    if url.query().is_some() || url.fragment().is_some() {
        bail!("{what} {given:?}: expected a base URL without a query");
    }
    let path = url.path().trim_end_matches('/');
    let path = path.strip_suffix("/v1").unwrap_or(path).to_string();
    url.set_path(&path);
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn titles_and_field_names_read_alike() {
        let by_field = json!({
            "uuid": "9f0c2a4e-5b7d-4c1e-8a3f-2b6d1e0c9a71", "name": "n1", "driver": "ilo",
            "driver_info": {"ilo_address": "10.0.0.1"}, "properties": {"cpus": 8},
            "instance_info": {}, "instance_uuid": null, "provision_state": "manageable",
            "boot_interface": "ilo-virtual-media", "deploy_interface": "direct",
            "management_interface": "ilo", "power_interface": "ilo", "extra": {"rack": "r1"},
            "resource_class": "gen9", "maintenance": false, "maintenance_reason": null,
            "conductor_group": "", "network_data": {},
        });
        let Value::Object(fields) = &by_field else {
            panic!("an object literal")
        };
        let mut by_title = Map::new();
        for (key, value) in fields {
            let column = NODE_COLUMNS
                .iter()
                .find(|c| c.field == key)
                .expect("every key of the literal is a column");
            by_title.insert(column.title.to_string(), value.clone());
        }
        let a = SourceNode::from_json(&by_field);
        let b = SourceNode::from_json(&Value::Object(by_title));
        assert_eq!(a, b);
        assert_eq!(
            a.uuid.as_deref(),
            Some("9f0c2a4e-5b7d-4c1e-8a3f-2b6d1e0c9a71")
        );
        assert_eq!(a.provision_state.as_deref(), Some("manageable"));
        assert_eq!(a.boot_interface.as_deref(), Some("ilo-virtual-media"));
        assert_eq!(a.driver_info.get("ilo_address"), Some(&json!("10.0.0.1")));
        assert_eq!(a.conductor_group, None, "an empty string is no value");
        assert!(a.unreadable.is_empty(), "{:?}", a.unreadable);
    }

    #[test]
    fn the_column_tables_match_python_ironicclient() {
        // Spot checks of labels that differ from a title-cased field name.
        let title = |field: &str| {
            NODE_COLUMNS
                .iter()
                .chain(PORT_COLUMNS)
                .find(|c| c.field == field)
                .map(|c| c.title)
        };
        assert_eq!(title("provision_state"), Some("Provisioning State"));
        assert_eq!(title("network_data"), Some("Network Configuration"));
        assert_eq!(title("pxe_enabled"), Some("PXE boot enabled"));
        assert_eq!(title("uuid"), Some("UUID"));
        assert_eq!(title("node_uuid"), Some("Node UUID"));
    }

    #[test]
    fn wrong_types_are_recorded_never_fatal() {
        let node = SourceNode::from_json(&json!({
            "uuid": 17, "Name": ["x"], "driver": "ilo", "driver_info": "not json",
            "properties": [1, 2], "extra": "{\"a\": 1}", "maintenance": "yes",
            "instance_info": true,
        }));
        assert_eq!(node.uuid, None);
        assert_eq!(node.name, None);
        assert_eq!(node.driver.as_deref(), Some("ilo"));
        assert!(node.driver_info.is_empty());
        assert_eq!(
            node.extra.get("a"),
            Some(&json!(1)),
            "a JSON object in a string is read"
        );
        assert!(!node.maintenance);
        let fields: Vec<&str> = node.unreadable.iter().map(|u| u.field).collect();
        assert_eq!(
            fields,
            [
                "uuid",
                "name",
                "maintenance",
                "driver_info",
                "properties",
                "instance_info"
            ]
        );
        for u in &node.unreadable {
            assert!(u.reason.starts_with("expected"), "{u:?}");
        }
        // A secret of the wrong type is never quoted.
        let node = SourceNode::from_json(&json!({"driver_info": "hunter2"}));
        assert!(!format!("{:?}", node.unreadable).contains("hunter2"));
    }

    #[test]
    fn a_non_object_entry_is_one_unreadable_node() {
        for value in [json!(null), json!(3), json!("node"), json!([1])] {
            let node = SourceNode::from_json(&value);
            assert_eq!(node.unreadable.len(), 1, "{value}");
            assert_eq!(node.unreadable[0].field, "node");
            let port = SourcePort::from_json(&value);
            assert_eq!(port.unreadable[0].field, "port");
        }
    }

    #[test]
    fn ports_read_both_spellings() {
        let a = SourcePort::from_json(&json!({
            "UUID": "p1", "Address": "52:54:00:AA:BB:CC", "Node UUID": "n1",
            "PXE boot enabled": false, "Local Link Connection": {"switch_id": "x"},
        }));
        let b = SourcePort::from_json(&json!({
            "uuid": "p1", "address": "52:54:00:AA:BB:CC", "node_uuid": "n1",
            "pxe_enabled": "False", "local_link_connection": {"switch_id": "x"},
        }));
        assert_eq!(a, b);
        assert_eq!(a.pxe_enabled, Some(false));
        assert_eq!(a.local_link_connection.len(), 1);
    }

    #[test]
    fn exports_are_arrays_or_api_documents() {
        let cli = r#"[{"UUID": "a"}, {"UUID": "b"}]"#;
        assert_eq!(nodes_from_json(cli, "f").expect("array").len(), 2);
        let api = r#"{"nodes": [{"uuid": "a"}], "next": "x"}"#;
        assert_eq!(nodes_from_json(api, "f").expect("document").len(), 1);
        assert_eq!(
            ports_from_json(r#"{"ports": []}"#, "f")
                .expect("empty")
                .len(),
            0
        );
        for (bad, want) in [
            ("", "is not JSON"),
            ("{", "is not JSON"),
            ("3", "found a number"),
            (r#"{"ports": []}"#, "an object without one"),
            (r#"{"nodes": {}}"#, "an object without one"),
        ] {
            let err = nodes_from_json(bad, "nodes.json").expect_err(bad);
            let text = err.to_string();
            assert!(text.starts_with("nodes.json "), "{text}");
            assert!(text.contains(want), "{bad}: {text}");
        }
    }

    #[test]
    fn base_urls() {
        let cases = [
            ("http://127.0.0.1:6385", Some("http://127.0.0.1:6385/")),
            ("http://127.0.0.1:6385/", Some("http://127.0.0.1:6385/")),
            ("http://127.0.0.1:6385/v1", Some("http://127.0.0.1:6385/")),
            (
                "https://cloud.example/baremetal/v1/",
                Some("https://cloud.example/baremetal"),
            ),
            (" http://h:1 ", Some("http://h:1/")),
            ("ftp://h", None),
            ("127.0.0.1:6385", None),
            ("http://", None),
            ("http://h/?x=1", None),
            ("", None),
        ];
        for (given, want) in cases {
            let got = base_url(given, "--to").ok().map(|u| u.to_string());
            assert_eq!(got.as_deref(), want, "{given:?}");
        }
    }
}
