//! A constraint a write broke, as each store reads it from its database's error, and the
//! [`StoreError`] that says so: `Duplicate` naming the taken field and its value, or the missing
//! node of a port.

use super::{normalise_mac, Node, Port, StoreError};

/// What a failed write broke.
pub(super) enum Broken {
    /// A unique constraint on this column (`uuid`, `name`, `instance_uuid`, `address`).
    Unique(&'static str),
    /// A foreign key: the port's node does not exist.
    ForeignKey,
}

impl Broken {
    /// The error of a write of `node` that broke this; `None` when a node write cannot break it.
    pub(super) fn on_node(self, node: &Node) -> Option<StoreError> {
        let Broken::Unique(field) = self else {
            return None;
        };
        Some(StoreError::Duplicate {
            kind: "node",
            field,
            value: match field {
                "name" => node.name.clone().unwrap_or_default(),
                "instance_uuid" => node.instance_uuid.clone().unwrap_or_default(),
                _ => node.uuid.to_string(),
            },
        })
    }

    /// The error of a write of `port` that broke this.
    pub(super) fn on_port(self, port: &Port) -> StoreError {
        match self {
            Broken::Unique(field @ "address") => StoreError::Duplicate {
                kind: "port",
                field,
                value: normalise_mac(&port.address),
            },
            Broken::Unique(field) => StoreError::Duplicate {
                kind: "port",
                field,
                value: port.uuid.to_string(),
            },
            Broken::ForeignKey => StoreError::node_not_found(port.node_uuid),
        }
    }
}
