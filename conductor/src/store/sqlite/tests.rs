use std::sync::Arc;

use proptest::prelude::*;
use rusqlite::Connection;
use serde_json::Value;
use tempfile::TempDir;
use uuid::Uuid;

use super::schema::{latest_version, MIGRATIONS};
use super::SqliteStore;
use crate::states::{NodePower, ProvisionState};
use crate::store::testing::{full_node, store_contract_suite};
use crate::store::{JsonObject, Node, NodeIdent, Store, StoreError};

fn db_path(dir: &TempDir) -> std::path::PathBuf {
    // A directory that does not exist yet: open creates it.
    dir.path().join("state").join("vmdeploy.sqlite")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contract_suite_on_a_file() {
    let dir = TempDir::new().expect("temp dir");
    let store = SqliteStore::open(&db_path(&dir)).expect("opening");
    store_contract_suite(store).await;
}

#[tokio::test]
async fn contract_suite_in_memory() {
    let store = SqliteStore::open_in_memory().expect("opening");
    store_contract_suite(store).await;
}

#[tokio::test]
async fn data_survives_a_reopen_and_the_file_is_wal() {
    let dir = TempDir::new().expect("temp dir");
    let path = db_path(&dir);
    let node = full_node("persisted");
    {
        let store = SqliteStore::open(&path).expect("opening");
        store.create_node(&node).await.expect("creating");
        store
            .reserve_node(node.uuid, "old-run")
            .await
            .expect("reserving");
    }
    let store = SqliteStore::open(&path).expect("reopening");
    let read = store
        .node(&NodeIdent::Uuid(node.uuid))
        .await
        .expect("reading");
    assert_eq!(read.reservation.as_deref(), Some("old-run"));
    assert_eq!(
        Node {
            reservation: None,
            ..read
        },
        node
    );

    let raw = Connection::open(&path).expect("raw open");
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("journal mode");
    assert_eq!(mode, "wal");
}

#[test]
fn migrations_are_applied_once() {
    let dir = TempDir::new().expect("temp dir");
    let path = db_path(&dir);
    for _ in 0..3 {
        drop(SqliteStore::open(&path).expect("opening"));
    }
    let raw = Connection::open(&path).expect("raw open");
    let versions: Vec<i64> = raw
        .prepare("SELECT version FROM schema_migrations ORDER BY version")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("reading versions");
    let want: Vec<i64> = MIGRATIONS.iter().map(|(v, _)| *v).collect();
    assert_eq!(versions, want);
    assert_eq!(versions.last().copied(), Some(latest_version()));
}

#[test]
fn migration_versions_have_no_gaps() {
    for (i, (version, _)) in MIGRATIONS.iter().enumerate() {
        assert_eq!(*version, i64::try_from(i).expect("small") + 1);
    }
}

#[test]
fn a_newer_database_is_refused() {
    let dir = TempDir::new().expect("temp dir");
    let path = db_path(&dir);
    drop(SqliteStore::open(&path).expect("opening"));
    let future = latest_version() + 1;
    Connection::open(&path)
        .and_then(|raw| {
            raw.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, 'later')",
                [future],
            )
        })
        .expect("writing a future version");
    match SqliteStore::open(&path) {
        Err(StoreError::Database(msg)) => {
            assert!(msg.contains(&format!("schema version {future}")), "{msg}");
            assert!(msg.contains("newer"), "{msg}");
        }
        other => panic!("a newer schema must be refused, got {other:?}"),
    }
}

#[test]
fn a_file_that_is_not_a_database_is_a_clear_error() {
    let dir = TempDir::new().expect("temp dir");
    let path = dir.path().join("garbage.sqlite");
    std::fs::write(&path, vec![0x5a; 8192]).expect("writing garbage");
    match SqliteStore::open(&path) {
        Err(StoreError::Database(msg)) => assert!(msg.contains("garbage.sqlite"), "{msg}"),
        other => panic!("garbage must be refused, got {other:?}"),
    }
}

#[tokio::test]
async fn a_corrupt_row_is_a_database_error_not_a_panic() {
    let dir = TempDir::new().expect("temp dir");
    let path = db_path(&dir);
    let store = SqliteStore::open(&path).expect("opening");
    let node = full_node("corrupt");
    store.create_node(&node).await.expect("creating");
    for (column, value) in [
        ("provision_state", "flying"),
        ("driver_info", "{not json"),
        ("created_at", "yesterday"),
    ] {
        let raw = Connection::open(&path).expect("raw open");
        raw.execute(
            &format!("UPDATE nodes SET {column} = ?1 WHERE uuid = ?2"),
            [value, &node.uuid.to_string()],
        )
        .expect("corrupting");
        match store.node(&NodeIdent::Uuid(node.uuid)).await {
            Err(StoreError::Database(msg)) => assert!(msg.contains("reading node"), "{msg}"),
            other => panic!("{column}: {other:?}"),
        }
        store.delete_node(node.uuid).await.expect("deleting");
        store.create_node(&node).await.expect("creating again");
    }
}

// --- round trip of arbitrary records ---

fn odd_string() -> impl Strategy<Value = String> {
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

fn timestamp() -> impl Strategy<Value = time::OffsetDateTime> {
    // Years 1..9999 (RFC 3339's range), any nanosecond, any offset: stored in UTC.
    (
        -62_135_596_800i64..253_402_300_799,
        0u32..1_000_000_000,
        -86_399i32..86_399,
    )
        .prop_map(|(secs, nanos, offset)| {
            let utc = time::OffsetDateTime::from_unix_timestamp(secs)
                .expect("in range")
                .replace_nanosecond(nanos)
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

fn state() -> impl Strategy<Value = ProvisionState> {
    prop::sample::select(ProvisionState::ALL.to_vec())
}

prop_compose! {
    fn arbitrary_node()(
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
            created_at: times.0,
            updated_at: times.2,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn arbitrary_nodes_round_trip(node in arbitrary_node()) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let store: Arc<dyn Store> = SqliteStore::open_in_memory().expect("opening");
        let read = runtime.block_on(async {
            store.create_node(&node).await.expect("creating");
            store.node(&NodeIdent::Uuid(node.uuid)).await.expect("reading")
        });
        // Byte-equal: the JSON and every text field come back exactly as written.
        prop_assert_eq!(
            serde_json::to_string(&read.driver_info).expect("json"),
            serde_json::to_string(&node.driver_info).expect("json")
        );
        prop_assert_eq!(&read, &node);
        if let Some(name) = &node.name {
            let by_name = runtime
                .block_on(store.node(&NodeIdent::Name(name.clone())))
                .expect("by name");
            prop_assert_eq!(by_name.uuid, node.uuid);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_whose_caller_goes_away_releases_its_lock() {
    let store = SqliteStore::open_in_memory().expect("opening");
    let node = full_node("abandoned");
    store.create_node(&node).await.expect("creating");
    let changes = |store: &SqliteStore| {
        store
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .total_changes()
    };
    let before = changes(&store);
    {
        // Hold the connection so the reserve's task is surely still waiting when its caller
        // gives up; then let it run.
        let conn = Arc::clone(&store.conn);
        let held = conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut reserve = Box::pin(store.reserve_node(node.uuid, "gone"));
        let polled = futures_util::FutureExt::now_or_never(reserve.as_mut());
        assert!(
            polled.is_none(),
            "the reserve cannot finish while the connection is held"
        );
        drop(reserve);
        drop(held);
    }
    // The reserve commits (one change), then the guard releases it (a second change).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while changes(&store) < before + 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the abandoned lock was never released"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let read = store
        .node(&NodeIdent::Uuid(node.uuid))
        .await
        .expect("reading");
    assert_eq!(read.reservation, None);
    store
        .reserve_node(node.uuid, "next")
        .await
        .expect("free for the next task");
}

#[tokio::test]
async fn the_database_is_private_to_the_conductor() {
    use std::os::unix::fs::PermissionsExt;

    let dir = TempDir::new().expect("temp dir");
    let path = db_path(&dir);
    let store = SqliteStore::open(&path).expect("opening");
    // A write, so the WAL files exist too.
    store
        .create_node(&full_node("secret"))
        .await
        .expect("creating");
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&path), 0o600, "database file");
    assert_eq!(mode(&path.with_extension("sqlite-wal")), 0o600, "WAL file");
    assert_eq!(
        mode(path.parent().expect("has a parent")),
        0o700,
        "state directory"
    );
}

prop_compose! {
    fn arbitrary_port(node: Uuid)(
        address in odd_string(),
        pxe_enabled in any::<bool>(),
        extra in json_object(),
        created_at in timestamp(),
        updated_at in prop::option::of(timestamp()),
    ) -> crate::store::Port {
        crate::store::Port {
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn arbitrary_ports_round_trip_with_the_mac_in_lower_case(
        ports in prop::collection::vec(arbitrary_port(Uuid::nil()), 1..4)
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let store: Arc<dyn Store> = SqliteStore::open_in_memory().expect("opening");
        let node = Node::new(Uuid::nil(), "agent_ilo", ProvisionState::Available);
        runtime.block_on(store.create_node(&node)).expect("creating node");
        let mut macs = std::collections::HashSet::new();
        for port in ports {
            let result = runtime.block_on(store.create_port(&port));
            let mac = port.address.to_ascii_lowercase();
            if !macs.insert(mac.clone()) {
                let duplicate =
                    matches!(result, Err(StoreError::Duplicate { field: "address", .. }));
                prop_assert!(duplicate, "{result:?}");
                continue;
            }
            result.expect("creating port");
            let read = runtime.block_on(store.port(port.uuid)).expect("reading port");
            prop_assert_eq!(read, crate::store::Port { address: mac, ..port });
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_file_agree_on_the_lock() {
    // Two connections, as a second conductor process (or the CLI) on the same file: the lock is
    // SQLite's, not the mutex's.
    let dir = TempDir::new().expect("temp dir");
    let path = db_path(&dir);
    let a = SqliteStore::open(&path).expect("opening a");
    let b = SqliteStore::open(&path).expect("opening b");
    for round in 0..20 {
        let node = full_node(&format!("shared-{round}"));
        a.create_node(&node).await.expect("creating");
        let (ra, rb) = tokio::join!(
            a.reserve_node(node.uuid, "conductor-a"),
            b.reserve_node(node.uuid, "conductor-b"),
        );
        let winner = match (&ra, &rb) {
            (Ok(_), Err(StoreError::Locked { holder, .. })) => {
                assert_eq!(holder, "conductor-a");
                "conductor-a"
            }
            (Err(StoreError::Locked { holder, .. }), Ok(_)) => {
                assert_eq!(holder, "conductor-b");
                "conductor-b"
            }
            other => panic!("round {round}: exactly one must win: {other:?}"),
        };
        let seen = b.node(&NodeIdent::Uuid(node.uuid)).await.expect("reading");
        assert_eq!(seen.reservation.as_deref(), Some(winner));
    }
}

#[tokio::test]
async fn a_version_1_database_keeps_its_nodes_on_their_drivers_default_interfaces() {
    let dir = TempDir::new().expect("temp dir");
    let path = db_path(&dir);
    let uuid = Uuid::new_v4();
    {
        let parent = path.parent().expect("the state directory");
        std::fs::create_dir_all(parent).expect("state directory");
        let raw = Connection::open(&path).expect("raw open");
        raw.execute_batch(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL);",
        )
        .expect("migrations table");
        raw.execute_batch(MIGRATIONS[0].1).expect("version 1");
        raw.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (1, 'then')",
            [],
        )
        .expect("version row");
        raw.execute(
            "INSERT INTO nodes (uuid, driver, driver_info, driver_internal_info, properties, \
             instance_info, extra, network_data, provision_state, created_at) \
             VALUES (?1, 'iscsi_ilo', '{}', '{}', '{}', '{}', '{}', '{}', 'available', \
             '2026-01-01T00:00:00Z')",
            [uuid.to_string()],
        )
        .expect("a version 1 node");
    }
    let store = SqliteStore::open(&path).expect("upgrading");
    let node = store
        .node(&NodeIdent::Uuid(uuid))
        .await
        .expect("the old node");
    assert_eq!(node.boot_interface, None);
    assert_eq!(node.deploy_interface, None);
    let interfaces = crate::node::hardware_type::NodeInterfaces::of(&node).expect("resolves");
    assert_eq!(interfaces.deploy, "iscsi");
}
