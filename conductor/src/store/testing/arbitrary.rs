//! Arbitrary nodes and ports for the stores' property tests, and the round-trip checks every
//! store runs on them: whatever a store accepts reads back equal (JSON byte-equal), and what it
//! cannot keep (a NUL in a text field) is refused with [`StoreError::Invalid`] by every store.

use std::collections::HashSet;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::Value;
use uuid::Uuid;

use crate::states::{NodePower, ProvisionState};
use crate::store::{JsonObject, Node, NodeIdent, Port, Store, StoreError};

/// Strings that have broken stores before: empty, NUL, quotes, SQL, BOMs, emoji, controls.
pub fn odd_string() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z]{0,8}",
        Just(String::new()),
        Just("\u{0}nul\u{0}".to_string()),
        Just("'; DROP TABLE nodes; --".to_string()),
        Just("\u{feff}\u{1F600}\r\n\t\\\"".to_string()),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Floats that print and parse exactly (serde_json without float_roundtrip may be off by
        // one ULP on others; that is serde_json's parser, not the store).
        (-1_000_000i32..1_000_000).prop_map(|i| Value::from(f64::from(i) / 4.0)),
        odd_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(odd_string(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn json_object() -> impl Strategy<Value = JsonObject> {
    prop::collection::btree_map(odd_string(), json_value(), 0..5)
        .prop_map(|m| m.into_iter().collect())
}

/// Years 1..9999 (RFC 3339's range), any microsecond (the stores' precision), any offset.
fn timestamp() -> impl Strategy<Value = time::OffsetDateTime> {
    (
        -62_135_596_800i64..253_402_300_799,
        0u32..1_000_000,
        -86_399i32..86_399,
    )
        .prop_map(|(secs, micros, offset)| {
            let utc = time::OffsetDateTime::from_unix_timestamp(secs)
                .expect("in range")
                .replace_microsecond(micros)
                .expect("in range");
            let offset = time::UtcOffset::from_whole_seconds(offset).expect("in range");
            // Keep the local date inside RFC 3339's years too.
            let local = utc.to_offset(offset);
            if (1..=9999).contains(&local.year()) {
                local
            } else {
                utc
            }
        })
}

fn power() -> impl Strategy<Value = Option<NodePower>> {
    prop::option::of(prop::sample::select(vec![
        NodePower::On,
        NodePower::Off,
        NodePower::Rebooting,
        NodePower::SoftRebooting,
        NodePower::SoftPowerOff,
    ]))
}

/// Groups as the API makes them (lower case, Ironic's characters), the default group, and odd
/// strings: the store keeps whatever it is handed, and must refuse a NUL like any text field.
fn conductor_group() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z0-9_.-]{1,16}", odd_string()]
}

fn state() -> impl Strategy<Value = ProvisionState> {
    prop::sample::select(ProvisionState::ALL.to_vec())
}

prop_compose! {
    /// A node with every field drawn.
    pub fn arbitrary_node()(
        name in prop::option::of(odd_string()),
        driver in odd_string(),
        objects in prop::collection::vec(json_object(), 6),
        instance_uuid in prop::option::of(odd_string()),
        provision_state in state(),
        target in prop::option::of(state()),
        times in (timestamp(), prop::option::of(timestamp()), prop::option::of(timestamp())),
        power_state in power(),
        target_power_state in power(),
        flags in (any::<bool>(), any::<bool>()),
        texts in (prop::option::of(odd_string()), prop::option::of(odd_string())),
        interfaces in (prop::option::of(odd_string()), prop::option::of(odd_string())),
        conductor_group in conductor_group(),
    ) -> Node {
        let mut objects = objects.into_iter();
        let mut next = move || objects.next().unwrap_or_default();
        Node {
            uuid: Uuid::new_v4(),
            name,
            driver,
            boot_interface: interfaces.0,
            deploy_interface: interfaces.1,
            driver_info: next(),
            driver_internal_info: next(),
            properties: next(),
            instance_info: next(),
            extra: next(),
            network_data: next(),
            instance_uuid,
            provision_state,
            target_provision_state: target,
            provision_updated_at: times.1,
            power_state,
            target_power_state,
            maintenance: flags.0,
            maintenance_reason: texts.0,
            last_error: texts.1,
            reservation: None,
            console_enabled: flags.1,
            conductor_group,
            created_at: times.0,
            updated_at: times.2,
        }
    }
}

prop_compose! {
    /// A port of `node` with every field drawn.
    pub fn arbitrary_port(node: Uuid)(
        address in odd_string(),
        pxe_enabled in any::<bool>(),
        extra in json_object(),
        created_at in timestamp(),
        updated_at in prop::option::of(timestamp()),
    ) -> Port {
        Port {
            uuid: Uuid::new_v4(),
            address,
            node_uuid: node,
            pxe_enabled,
            extra,
            created_at,
            updated_at,
        }
    }
}

/// A current-thread runtime for one property case.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Creates `node` in `store` and reads it back: equal, by UUID and by name, with `last_error`'s
/// NULs replaced; or refused as `Invalid` when a checked text field holds a NUL.
pub async fn node_round_trip(store: &dyn Store, node: &Node) -> Result<(), TestCaseError> {
    let result = store.create_node(node).await;
    if crate::store::check_node_text(node).is_err() {
        prop_assert!(
            matches!(result, Err(StoreError::Invalid(_))),
            "a NUL in a text field must be refused: {result:?}"
        );
        return Ok(());
    }
    result.map_err(|e| TestCaseError::fail(format!("creating: {e}")))?;
    let read = store
        .node(&NodeIdent::Uuid(node.uuid))
        .await
        .map_err(|e| TestCaseError::fail(format!("reading: {e}")))?;
    // Byte-equal: the JSON and every text field come back exactly as written.
    prop_assert_eq!(
        serde_json::to_string(&read.driver_info).expect("json"),
        serde_json::to_string(&node.driver_info).expect("json")
    );
    let want = Node {
        last_error: crate::store::storable_error(node.last_error.as_deref()),
        ..node.clone()
    };
    prop_assert_eq!(&read, &want);
    if let Some(name) = &node.name {
        let by_name = store
            .node(&NodeIdent::Name(name.clone()))
            .await
            .map_err(|e| TestCaseError::fail(format!("reading by name: {e}")))?;
        prop_assert_eq!(by_name.uuid, node.uuid);
    }
    // Leave the store as it was: the next case may draw the same name or instance.
    store
        .delete_node(node.uuid)
        .await
        .map_err(|e| TestCaseError::fail(format!("deleting: {e}")))?;
    Ok(())
}

/// Creates `ports` (of node `Uuid::nil()`, made here) in `store`: each reads back with its MAC
/// in lower case, a MAC taken twice (in any case) is `Duplicate`, a NUL in it `Invalid`.
pub async fn ports_round_trip(store: &dyn Store, ports: Vec<Port>) -> Result<(), TestCaseError> {
    let node = Node::new(Uuid::nil(), "agent_ilo", ProvisionState::Available);
    store
        .create_node(&node)
        .await
        .map_err(|e| TestCaseError::fail(format!("creating node: {e}")))?;
    let mut macs = HashSet::new();
    for port in ports {
        let result = store.create_port(&port).await;
        if port.address.contains('\0') {
            prop_assert!(matches!(result, Err(StoreError::Invalid(_))), "{result:?}");
            continue;
        }
        let mac = port.address.to_ascii_lowercase();
        if !macs.insert(mac.clone()) {
            let duplicate = matches!(
                result,
                Err(StoreError::Duplicate {
                    field: "address",
                    ..
                })
            );
            prop_assert!(duplicate, "{result:?}");
            continue;
        }
        result.map_err(|e| TestCaseError::fail(format!("creating port: {e}")))?;
        let read = store
            .port(port.uuid)
            .await
            .map_err(|e| TestCaseError::fail(format!("reading port: {e}")))?;
        prop_assert_eq!(
            read,
            Port {
                address: mac,
                ..port
            }
        );
    }
    Ok(())
}
