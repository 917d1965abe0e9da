use std::sync::Arc;

use proptest::prelude::*;
use rusqlite::Connection;
use tempfile::TempDir;
use uuid::Uuid;

use super::schema::{latest_version, MIGRATIONS};
use super::SqliteStore;

use crate::store::testing::arbitrary::{
    arbitrary_node, arbitrary_port, node_round_trip, ports_round_trip, runtime,
};
use crate::store::testing::{full_node, store_contract_suite, two_holders_agree_on_the_lock};
use crate::store::{Node, NodeFilter, NodeIdent, Store, StoreError};

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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn arbitrary_nodes_round_trip(node in arbitrary_node()) {
        let store: Arc<dyn Store> = SqliteStore::open_in_memory().expect("opening");
        runtime().block_on(node_round_trip(&*store, &node))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn arbitrary_ports_round_trip_with_the_mac_in_lower_case(
        ports in prop::collection::vec(arbitrary_port(Uuid::nil()), 1..4)
    ) {
        let store: Arc<dyn Store> = SqliteStore::open_in_memory().expect("opening");
        runtime().block_on(ports_round_trip(&*store, ports))?;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_file_agree_on_the_lock() {
    // Two connections, as a second conductor process (or the CLI) on the same file: the lock is
    // SQLite's, not the mutex's.
    let dir = TempDir::new().expect("temp dir");
    let path = db_path(&dir);
    let a = SqliteStore::open(&path).expect("opening a");
    let b = SqliteStore::open(&path).expect("opening b");
    two_holders_agree_on_the_lock(&*a, &*b).await;
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

/// A database of the previous schema (3: before conductor groups) with a node and a conductor:
/// after the upgrade both are in the default group, the conductor has no API URL yet, the
/// group is indexed and the new columns take writes.
#[tokio::test]
async fn a_version_3_database_keeps_its_nodes_and_conductors_in_the_default_group() {
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
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v <= 3) {
            raw.execute_batch(sql).expect("an older step");
            raw.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, 'then')",
                [version],
            )
            .expect("version row");
        }
        raw.execute(
            "INSERT INTO nodes (uuid, driver, driver_info, driver_internal_info, properties, \
             instance_info, extra, network_data, provision_state, created_at) \
             VALUES (?1, 'agent_ilo', '{}', '{}', '{}', '{}', '{}', '{}', 'active', \
             '2026-01-01T00:00:00Z')",
            [uuid.to_string()],
        )
        .expect("a version 3 node");
        raw.execute(
            "INSERT INTO conductors (hostname, conductor_group, drivers, created_at, updated_at) \
             VALUES ('old-cond', 'rack-1', '[\"ilo\"]', '2026-01-01T00:00:00Z', \
             '2026-01-01T00:00:00Z')",
            [],
        )
        .expect("a version 3 conductor");
    }
    let store = SqliteStore::open(&path).expect("upgrading");
    let mut node = store
        .node(&NodeIdent::Uuid(uuid))
        .await
        .expect("the old node");
    assert_eq!(node.conductor_group, "");
    let in_default = store
        .list_nodes(&NodeFilter {
            conductor_group: Some(String::new()),
            ..Default::default()
        })
        .await
        .expect("listing the default group");
    assert_eq!(
        in_default.iter().map(|n| n.uuid).collect::<Vec<_>>(),
        [uuid]
    );
    node.conductor_group = "rack-1".into();
    store.update_node(&node).await.expect("moving the node");
    assert_eq!(
        store
            .node(&NodeIdent::Uuid(uuid))
            .await
            .expect("reading")
            .conductor_group,
        "rack-1"
    );
    let conductors = store.list_conductors().await.expect("listing conductors");
    assert_eq!(conductors.len(), 1);
    assert_eq!(conductors[0].conductor_group, "rack-1");
    assert_eq!(conductors[0].api_url, None);

    let raw = Connection::open(&path).expect("raw open");
    let version: i64 = raw
        .query_row("SELECT MAX(version) FROM schema_migrations", [], |r| {
            r.get(0)
        })
        .expect("version");
    assert_eq!(version, latest_version());
    let plan: String = raw
        .query_row(
            "EXPLAIN QUERY PLAN SELECT uuid FROM nodes WHERE conductor_group = 'rack-1'",
            [],
            |r| r.get(3),
        )
        .expect("query plan");
    assert!(plan.contains("nodes_conductor_group"), "{plan}");
}

/// Threads of this process now (`/proc/self/task`).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("reading /proc/self/task")
        .count()
}

/// 500 calls at once wait in the store's queue, not on threads of their own: the process
/// stays within a few threads of where it started (on tokio's blocking pool each waiting call
/// held a thread, up to 512).
#[test]
fn a_burst_of_calls_queues_without_a_thread_each() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = TempDir::new().expect("temp dir");
    let store: Arc<dyn Store> = SqliteStore::open(&db_path(&dir)).expect("opening");
    runtime.block_on(async {
        for i in 0..20 {
            store
                .create_node(&full_node(&format!("burst-{i}")))
                .await
                .expect("creating");
        }
    });
    let before = threads();
    let peak = Arc::new(std::sync::atomic::AtomicUsize::new(before));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (Arc::clone(&peak), Arc::clone(&done));
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                peak.fetch_max(threads(), std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    };
    runtime.block_on(async {
        let calls: Vec<_> = (0..500)
            .map(|_| {
                let store = Arc::clone(&store);
                tokio::spawn(async move { store.list_nodes(&Default::default()).await })
            })
            .collect();
        for call in calls {
            let nodes = call.await.expect("task").expect("listing");
            assert_eq!(nodes.len(), 20);
        }
    });
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    sampler.join().expect("sampler");
    let peak = peak.load(std::sync::atomic::Ordering::SeqCst);
    // The sampler itself is one more thread.
    assert!(
        peak <= before + 4,
        "{peak} threads at the busiest, {before} before the burst"
    );
}

/// Reads go to connections of their own: an operator's GET does not queue behind the writes
/// (and fsyncs) of a thousand deploys. With the writer's thread stalled, reads still answer,
/// and they see every write committed before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::await_holding_lock,
    reason = "the lock stalls the store's writer thread; the reads awaited never take it"
)]
async fn reads_do_not_wait_for_the_writer() {
    let dir = TempDir::new().expect("temp dir");
    let store = SqliteStore::open(&db_path(&dir)).expect("opening");
    let node = full_node("read-beside-the-writer");
    store.create_node(&node).await.expect("creating");
    let held = store
        .conn
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut write = Box::pin(store.update_node(&node));
    assert!(
        futures_util::FutureExt::now_or_never(write.as_mut()).is_none(),
        "the write waits for the stalled writer"
    );
    let wait = std::time::Duration::from_secs(10);
    let read = tokio::time::timeout(wait, store.node(&NodeIdent::Uuid(node.uuid)))
        .await
        .expect("a read answers while the writer is stalled")
        .expect("reading");
    assert_eq!(read.uuid, node.uuid);
    let listed = tokio::time::timeout(wait, store.list_nodes(&NodeFilter::default()))
        .await
        .expect("a list answers while the writer is stalled")
        .expect("listing");
    assert_eq!(listed.len(), 1);
    drop(held);
    tokio::time::timeout(wait, write)
        .await
        .expect("the write goes on once the writer runs")
        .expect("updating");
}
