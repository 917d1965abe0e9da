//! The store contract suite and PostgreSQL's own cases, on a real cluster
//! (`vmdeploy-test-postgres`: initdb + pg_ctl in a temporary directory).

use std::sync::Arc;

use proptest::prelude::*;
use uuid::Uuid;
use vmdeploy_shared::secret::Secret;
use vmdeploy_test_postgres::{shared, Cluster, PASSWORD, ROLE};

use super::schema::{self, latest_version, MIGRATIONS};
use super::{describe, PostgresConfig, PostgresStore};
use crate::store::testing::arbitrary::{
    arbitrary_node, arbitrary_port, node_round_trip, ports_round_trip, runtime,
};
use crate::store::testing::{full_node, store_contract_suite, two_holders_agree_on_the_lock};
use crate::store::{as_operator_read, NodeFilter, NodeIdent, Store, StoreError};

fn socket_config(cluster: &Cluster, database: &str) -> PostgresConfig {
    PostgresConfig {
        url: Secret::new(cluster.socket_url(database)),
        password_file: None,
        ca_file: None,
        max_connections: 8,
    }
}

async fn fresh_store(hint: &str) -> Arc<PostgresStore> {
    let cluster = shared();
    let db = cluster.create_database(hint);
    PostgresStore::open(&socket_config(cluster, &db))
        .await
        .unwrap_or_else(|e| panic!("opening {db}: {e}\n--- server log ---\n{}", cluster.log()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passes_the_store_contract() {
    let store: Arc<dyn Store> = fresh_store("contract").await;
    store_contract_suite(store).await;
}

fn tcp_config(cluster: &Cluster, database: &str, dir: &tempfile::TempDir) -> PostgresConfig {
    let password_file = dir.path().join("db-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).expect("writing the password file");
    PostgresConfig {
        url: Secret::new(format!("{}?sslmode=require", cluster.tcp_url(database))),
        password_file: Some(password_file),
        ca_file: Some(cluster.ca_file()),
        max_connections: 4,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn arbitrary_nodes_round_trip(node in arbitrary_node()) {
        let runtime = runtime();
        let store = runtime.block_on(fresh_store_on(&PROPERTY_DB));
        runtime.block_on(node_round_trip(&*store, &node))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn arbitrary_ports_round_trip_with_the_mac_in_lower_case(
        ports in prop::collection::vec(arbitrary_port(Uuid::nil()), 1..4)
    ) {
        let runtime = runtime();
        // A database per case: every case makes the node Uuid::nil().
        let store = runtime.block_on(fresh_store("ports_property"));
        runtime.block_on(ports_round_trip(&*store, ports))?;
    }
}

/// One database for every case of a property (each case opens its own pool in its own
/// runtime: a pool's connections live on the runtime that made them).
static PROPERTY_DB: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| shared().create_database("node_property"));

async fn fresh_store_on(db: &str) -> Arc<PostgresStore> {
    let cluster = shared();
    PostgresStore::open(&socket_config(cluster, db))
        .await
        .unwrap_or_else(|e| panic!("opening {db}: {e}\n--- server log ---\n{}", cluster.log()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conductors_starting_together_apply_each_migration_once() {
    let cluster = shared();
    let db = cluster.create_database("migrate_together");
    let config = socket_config(cluster, &db);
    let opens = (0..4).map(|_| {
        let config = config.clone();
        tokio::spawn(async move { PostgresStore::open(&config).await })
    });
    for open in futures_util::future::join_all(opens).await {
        open.expect("task")
            .expect("every conductor opens the database");
    }
    let versions = cluster
        .psql(
            &db,
            ROLE,
            "SELECT string_agg(version::text, ',' ORDER BY version) FROM schema_migrations",
        )
        .expect("reading versions");
    let want: Vec<String> = MIGRATIONS.iter().map(|(v, _)| v.to_string()).collect();
    assert_eq!(versions, want.join(","));
    // And again: nothing left to apply.
    let store = PostgresStore::open(&config).await.expect("reopening");
    let client = store.client("test").await.expect("a connection");
    assert_eq!(
        schema::current_version(&client).await.expect("version"),
        latest_version()
    );
}

#[test]
fn migration_versions_have_no_gaps() {
    for (i, (version, _)) in MIGRATIONS.iter().enumerate() {
        assert_eq!(*version, i as i64 + 1);
    }
}

#[tokio::test]
async fn a_newer_database_is_refused() {
    let cluster = shared();
    let db = cluster.create_database("newer");
    drop(fresh_store_on(&db).await);
    cluster
        .psql(
            &db,
            ROLE,
            "INSERT INTO schema_migrations (version) VALUES (999)",
        )
        .expect("pretending a newer conductor migrated it");
    match PostgresStore::open(&socket_config(cluster, &db)).await {
        Err(StoreError::Database(message)) => {
            assert!(message.contains("schema version 999"), "{message}");
            assert!(message.contains("newer vmdeploy"), "{message}");
        }
        other => panic!("a newer database must be refused: {other:?}"),
    }
}

/// A database of the previous schema (2: before conductor groups) with a node and a conductor:
/// after the upgrade both are in the default group, the conductor has no API URL yet, the
/// group is indexed and the new columns take writes.
#[tokio::test]
async fn a_version_2_database_keeps_its_nodes_and_conductors_in_the_default_group() {
    let cluster = shared();
    let db = cluster.create_database("from_v2");
    let uuid = Uuid::new_v4();
    let mut sql = String::from(
        "CREATE TABLE schema_migrations (version bigint PRIMARY KEY, \
         applied_at timestamptz NOT NULL DEFAULT now());",
    );
    for (version, step) in MIGRATIONS.iter().filter(|(v, _)| *v <= 2) {
        sql.push_str(step);
        sql.push_str(&format!(
            "INSERT INTO schema_migrations (version) VALUES ({version});"
        ));
    }
    sql.push_str(&format!(
        "INSERT INTO nodes (uuid, driver, driver_info, driver_internal_info, properties, \
         instance_info, extra, network_data, provision_state, created_at) \
         VALUES ('{uuid}', 'agent_ilo', '{{}}', '{{}}', '{{}}', '{{}}', '{{}}', '{{}}', 'active', \
         now());
         INSERT INTO conductors (hostname, conductor_group, drivers, created_at, updated_at) \
         VALUES ('old-cond', 'rack-1', '[\"ilo\"]', now(), now());"
    ));
    cluster
        .psql(&db, ROLE, &sql)
        .expect("a database of schema version 2");
    let store = fresh_store_on(&db).await;
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

    let client = store.client("test").await.expect("a connection");
    assert_eq!(
        schema::current_version(&client).await.expect("version"),
        latest_version()
    );
    let indexed = cluster
        .psql(
            &db,
            ROLE,
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'nodes_conductor_group'",
        )
        .expect("reading the index");
    assert!(indexed.contains("(conductor_group)"), "{indexed:?}");
}

#[tokio::test]
async fn a_corrupt_row_is_a_database_error_not_a_panic() {
    let cluster = shared();
    let db = cluster.create_database("corrupt");
    let store = fresh_store_on(&db).await;
    let node = full_node("corrupt");
    store.create_node(&node).await.expect("creating");
    cluster
        .psql(
            &db,
            ROLE,
            "UPDATE nodes SET driver_info = '{not json', provision_state = 'nowhere'",
        )
        .expect("corrupting the row");
    match store.node(&NodeIdent::Uuid(node.uuid)).await {
        Err(StoreError::Database(message)) => {
            assert!(
                message.contains("driver_info"),
                "names the column: {message}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        store.list_nodes(&Default::default()).await,
        Err(StoreError::Database(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_conductors_on_one_database_agree_on_the_lock() {
    let cluster = shared();
    let db = cluster.create_database("two_conductors");
    let a = fresh_store_on(&db).await;
    let b = fresh_store_on(&db).await;
    two_holders_agree_on_the_lock(&*a, &*b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_whose_caller_goes_away_releases_its_lock() {
    let cluster = shared();
    let db = cluster.create_database("abandoned");
    let store = fresh_store_on(&db).await;
    let node = full_node("abandoned");
    store.create_node(&node).await.expect("creating");
    // Every change of the node's reservation, in order, from a trigger: the reserve must show
    // up (taken by "gone") and then its release.
    cluster
        .psql(
            &db,
            ROLE,
            "CREATE TABLE seen (n serial, reservation text);
             CREATE FUNCTION note() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO seen (reservation) VALUES (NEW.reservation); RETURN NEW; END $$;
             CREATE TRIGGER note AFTER UPDATE OF reservation ON nodes
               FOR EACH ROW EXECUTE FUNCTION note();",
        )
        .expect("installing the trigger");
    // Another session holds the row, so the reserve surely waits when its caller gives up.
    let (blocker, connection) =
        tokio_postgres::connect(&cluster.socket_url(&db), tokio_postgres::NoTls)
            .await
            .expect("a blocking session");
    tokio::spawn(connection);
    blocker
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM nodes WHERE uuid = '{}' FOR UPDATE",
            node.uuid
        ))
        .await
        .expect("locking the row");
    {
        let mut reserve = Box::pin(store.reserve_node(node.uuid, "gone"));
        let polled =
            tokio::time::timeout(std::time::Duration::from_millis(300), reserve.as_mut()).await;
        assert!(
            polled.is_err(),
            "the reserve cannot finish while the row is held: {polled:?}"
        );
    }
    blocker
        .batch_execute("COMMIT")
        .await
        .expect("letting it run");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let seen = cluster
            .psql(
                &db,
                ROLE,
                "SELECT string_agg(coalesce(reservation, '-'), ',' ORDER BY n) FROM seen",
            )
            .expect("reading the trigger's notes");
        if seen == "gone,-" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the abandoned lock was never released: {seen:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    store
        .reserve_node(node.uuid, "next")
        .await
        .expect("free for the next task");
}

#[tokio::test]
async fn tls_and_a_password_file_reach_the_server_and_the_session_is_encrypted() {
    let cluster = shared();
    let db = cluster.create_database("tls");
    let dir = tempfile::TempDir::new().expect("temp dir");
    let store = PostgresStore::open(&tcp_config(cluster, &db, &dir))
        .await
        .unwrap_or_else(|e| panic!("opening over TLS: {e}\n{}", cluster.log()));
    store
        .create_node(&full_node("over-tls"))
        .await
        .expect("writing over TLS");
    assert_eq!(
        store.target(),
        format!("{ROLE}@127.0.0.1:{}/{db}", cluster.port())
    );
    // The server's own view: every session of ours on this database is TLS.
    let sessions = cluster
        .psql(
            "postgres",
            vmdeploy_test_postgres::SUPERUSER,
            &format!(
                "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_activity a \
                 JOIN pg_stat_ssl s USING (pid) \
                 WHERE a.datname = '{db}' AND a.application_name = 'vmdeploy-conductor'"
            ),
        )
        .expect("reading pg_stat_ssl");
    let (encrypted, all) = sessions.split_once('|').expect("two counts");
    assert!(all != "0", "no session of ours seen: {sessions}");
    assert_eq!(encrypted, all, "every session is TLS: {sessions}");
}

#[tokio::test]
async fn a_server_certificate_from_an_unknown_ca_is_refused() {
    let cluster = shared();
    let db = cluster.create_database("tls_unknown_ca");
    let dir = tempfile::TempDir::new().expect("temp dir");
    let config = PostgresConfig {
        // The system's trust store does not know the test CA.
        ca_file: None,
        ..tcp_config(cluster, &db, &dir)
    };
    match PostgresStore::open(&config).await {
        Err(StoreError::Unavailable(message)) => {
            assert!(message.to_lowercase().contains("certificate"), "{message}")
        }
        other => panic!("an unverified server must be refused: {other:?}"),
    }
}

#[tokio::test]
async fn a_wrong_password_is_a_clear_error_and_the_url_never_shows_it() {
    let cluster = shared();
    let db = cluster.create_database("wrong_password");
    let dir = tempfile::TempDir::new().expect("temp dir");
    let mut config = tcp_config(cluster, &db, &dir);
    let Some(file) = config.password_file.clone() else {
        panic!("the TCP config has a password file")
    };
    std::fs::write(&file, "not-the-password\n").expect("writing");
    match PostgresStore::open(&config).await {
        Err(e @ StoreError::Database(_)) => {
            let message = e.to_string();
            assert!(
                message.contains("password authentication failed"),
                "{message}"
            );
            assert!(!message.contains("not-the-password"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // A password in the URL as well as a file: which one is meant?
    config.url = Secret::new(format!(
        "postgresql://{ROLE}:in-the-url@127.0.0.1:{}/{db}",
        cluster.port()
    ));
    match PostgresStore::open(&config).await {
        Err(StoreError::Database(message)) => {
            assert!(message.contains("keep one"), "{message}");
            assert!(!message.contains("in-the-url"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    config.password_file = None;
    let pg = super::connect::client_config(&config).expect("parses");
    assert!(!describe(&pg).contains("in-the-url"), "{}", describe(&pg));
    for (url, words) in [
        ("mysql://x@y/z", "not a PostgreSQL URL"),
        ("postgresql://127.0.0.1/db", "names no user"),
    ] {
        config.url = Secret::new(url);
        match PostgresStore::open(&config).await {
            Err(StoreError::Database(message)) => assert!(message.contains(words), "{message}"),
            other => panic!("{url}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_fails_calls_in_flight_as_unavailable_and_the_store_recovers() {
    let cluster = Cluster::start().expect("a cluster of this test's own");
    let db = cluster.create_database("restart");
    let store = PostgresStore::open(&socket_config(&cluster, &db))
        .await
        .expect("opening");
    let node = full_node("restart");
    store.create_node(&node).await.expect("creating");
    cluster
        .kill()
        .expect("stopping PostgreSQL as a crash would");
    for _ in 0..3 {
        match store.node(&NodeIdent::Uuid(node.uuid)).await {
            Err(StoreError::Unavailable(_)) => {}
            other => panic!("while the server is down: {other:?}"),
        }
    }
    match store.reserve_node(node.uuid, "during-outage").await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("a reserve while the server is down: {other:?}"),
    }
    cluster.restart().expect("starting PostgreSQL again");
    // The pool drops the dead connections and opens new ones: no reopen of the store.
    let read = store
        .node(&NodeIdent::Uuid(node.uuid))
        .await
        .expect("reading after the restart");
    assert_eq!(read, node, "the committed node survived the crash");
    store
        .reserve_node(node.uuid, "after")
        .await
        .expect("reserving after the restart");
}

#[test]
fn a_quarter_of_the_connections_is_kept_for_reads() {
    use super::connect::split_connections;
    assert_eq!(split_connections(16), (12, Some(4)));
    assert_eq!(split_connections(8), (6, Some(2)));
    assert_eq!(split_connections(3), (2, Some(1)));
    assert_eq!(split_connections(2), (1, Some(1)));
    assert_eq!(split_connections(1), (1, None));
    assert_eq!(split_connections(0), (1, None), "at least one connection");
    for max in 2..64 {
        let (writers, readers) = split_connections(max);
        assert_eq!(writers + readers.unwrap_or(0), max, "{max} in all");
    }
}

/// Operators' reads have connections of their own: with every other connection taken (a
/// thousand deploys' calls), an operator's GET still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_answer_while_every_writer_connection_is_taken() {
    let store = fresh_store("reads-beside-writes").await;
    let node = full_node("read-beside-the-writers");
    store.create_node(&node).await.expect("creating");
    let (writers, _) =
        super::connect::split_connections(socket_config(shared(), "x").max_connections);
    let mut taken = Vec::new();
    for _ in 0..writers {
        taken.push(
            store
                .client("holding a writer")
                .await
                .expect("a writer's connection"),
        );
    }
    let wait = std::time::Duration::from_secs(5);
    let ident = NodeIdent::Uuid(node.uuid);
    let read = tokio::time::timeout(wait, as_operator_read(store.node(&ident)))
        .await
        .expect("an operator's read answers with every writer busy")
        .expect("reading");
    assert_eq!(read.uuid, node.uuid);
    let listed = tokio::time::timeout(
        wait,
        as_operator_read(store.list_nodes(&NodeFilter::default())),
    )
    .await
    .expect("an operator's list answers with every writer busy")
    .expect("listing");
    assert_eq!(listed.len(), 1);
    let task_read =
        tokio::time::timeout(std::time::Duration::from_millis(300), store.node(&ident)).await;
    assert!(
        task_read.is_err(),
        "a node task's read waits with the writers"
    );
    let write = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        store.update_node(&read),
    )
    .await;
    assert!(write.is_err(), "a write waits for a writer's connection");
    drop(taken);
    store
        .update_node(&read)
        .await
        .expect("the write goes on once a writer is free");
}
