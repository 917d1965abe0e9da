//! The [`Store`] contract as one test suite, run against every implementation (SQLite and
//! PostgreSQL), so they cannot drift apart.

pub mod arbitrary;

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::json;
use uuid::Uuid;

use super::{
    HistoryEvent, HistoryQuery, JsonObject, Node, NodeFilter, NodeIdent, Port, PortFilter,
    Severity, Store, StoreError,
};
use crate::states::{NodePower, ProvisionState};

/// A node with every optional field set, so a round trip checks them all.
pub fn full_node(name: &str) -> Node {
    let mut node = Node::new(Uuid::new_v4(), "agent_ilo", ProvisionState::Available);
    node.name = Some(name.to_string());
    node.driver_info =
        object(json!({"ilo_address": "10.0.0.1", "ilo_password": "s3cr3t", "client_port": 443}));
    node.driver_internal_info = object(
        json!({"agent_url": "https://10.0.0.9:9999", "nested": {"a": [1, 2.5, null, true]}}),
    );
    node.properties = object(json!({"capabilities": "boot_mode:uefi", "memory_mb": 4096}));
    node.instance_info = object(json!({"image_source": "http://images/x.img", "root_gb": "10"}));
    node.extra = object(json!({"ünïcödé": "✓ \"quoted\" \\ back\nslash"}));
    node.network_data = object(json!({"links": [], "networks": [], "services": []}));
    node.target_provision_state = Some(ProvisionState::Active);
    node.provision_updated_at = Some(node.created_at);
    node.power_state = Some(NodePower::Off);
    node.target_power_state = Some(NodePower::On);
    node.maintenance = true;
    node.maintenance_reason = Some("fan".into());
    node.last_error = Some("it broke".into());
    node.console_enabled = false;
    node.deploy_interface = Some("direct".into());
    node.conductor_group = "rack-1.row_2".into();
    node
}

/// A JSON object from a `json!` literal.
pub fn object(value: serde_json::Value) -> JsonObject {
    match value {
        serde_json::Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

fn port(node: Uuid, mac: &str) -> Port {
    Port {
        uuid: Uuid::new_v4(),
        address: mac.to_string(),
        node_uuid: node,
        pxe_enabled: true,
        extra: object(json!({"vif_port_id": "abc"})),
        created_at: super::now(),
        updated_at: None,
    }
}

fn uuids(nodes: &[Node]) -> Vec<Uuid> {
    nodes.iter().map(|n| n.uuid).collect()
}

/// Runs every contract check on an empty `store`.
pub async fn store_contract_suite(store: Arc<dyn Store>) {
    create_and_get(&*store).await;
    duplicates(&*store).await;
    list_filters(&*store).await;
    list_order(&*store).await;
    update_keeps_reservation(&*store).await;
    delete_cascades_ports(&*store).await;
    ports(&*store).await;
    reservation_race(Arc::clone(&store)).await;
    release_rules(&*store).await;
    conductors(&*store).await;
    history(&*store).await;
}

/// Two stores on one database (two conductors, or a conductor and the CLI) racing for the same
/// node, 20 times: exactly one wins each time, the other sees it as the holder.
pub async fn two_holders_agree_on_the_lock(a: &dyn Store, b: &dyn Store) {
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

/// Registration, heartbeats, a second run of the same host, and a clean shutdown.
async fn conductors(store: &dyn Store) {
    use super::ConductorRecord;
    let record = |host: &str, group: &str| ConductorRecord {
        hostname: host.to_string(),
        conductor_group: group.to_string(),
        drivers: vec!["agent_ilo".into(), "ilo".into()],
        api_url: Some(format!("https://{host}.example:6385")),
        created_at: super::now(),
        updated_at: super::now(),
    };
    assert!(store.list_conductors().await.expect("listing").is_empty());
    assert!(matches!(
        store.heartbeat_conductor("cond-b").await,
        Err(StoreError::NotFound {
            kind: "conductor",
            ..
        })
    ));
    store
        .register_conductor(&record("cond-b", "rack-1"))
        .await
        .expect("registering b");
    store
        .register_conductor(&record("cond-a", ""))
        .await
        .expect("registering a");
    let listed = store.list_conductors().await.expect("listing");
    let hosts: Vec<&str> = listed.iter().map(|c| c.hostname.as_str()).collect();
    assert_eq!(hosts, ["cond-a", "cond-b"], "by host name");
    assert_eq!(listed[1].conductor_group, "rack-1");
    assert_eq!(listed[1].drivers, ["agent_ilo", "ilo"]);
    assert_eq!(
        listed[1].api_url.as_deref(),
        Some("https://cond-b.example:6385")
    );
    let first = listed[1].clone();

    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    store
        .heartbeat_conductor("cond-b")
        .await
        .expect("heartbeat");
    let beat = store.list_conductors().await.expect("listing")[1].clone();
    assert!(
        beat.updated_at > first.updated_at,
        "the heartbeat moves updated_at"
    );
    assert_eq!(beat.created_at, first.created_at);

    // The same host starting again: one row, its first registration kept, the rest new.
    let mut again = record("cond-b", "rack-2");
    again.drivers = vec!["redfish".into()];
    again.api_url = Some("http://10.0.0.2:6385".into());
    store
        .register_conductor(&again)
        .await
        .expect("registering again");
    let rows = store.list_conductors().await.expect("listing");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].created_at, first.created_at);
    assert_eq!(rows[1].conductor_group, "rack-2");
    assert_eq!(rows[1].drivers, ["redfish"]);
    assert_eq!(rows[1].api_url.as_deref(), Some("http://10.0.0.2:6385"));

    // Registering again without a URL clears the earlier run's: calls must not be forwarded to
    // a URL the conductor no longer serves.
    let mut quiet = record("cond-b", "rack-2");
    quiet.api_url = None;
    store
        .register_conductor(&quiet)
        .await
        .expect("registering without a URL");
    let rows = store.list_conductors().await.expect("listing");
    assert_eq!(rows[1].api_url, None);
    assert_eq!(rows[1].created_at, first.created_at);

    // A NUL is refused by every store alike, as in node fields.
    let mut nul = record("cond-c", "");
    nul.api_url = Some("http://x\0y".into());
    assert!(matches!(
        store.register_conductor(&nul).await,
        Err(StoreError::Invalid(_))
    ));
    assert_eq!(store.list_conductors().await.expect("listing").len(), 2);

    store
        .unregister_conductor("cond-b")
        .await
        .expect("unregistering");
    store
        .unregister_conductor("cond-b")
        .await
        .expect("unregistering twice is a no-op");
    store
        .unregister_conductor("cond-a")
        .await
        .expect("unregistering");
    assert!(store.list_conductors().await.expect("listing").is_empty());
}

async fn create_and_get(store: &dyn Store) {
    let node = full_node("create-and-get");
    store.create_node(&node).await.expect("creating");
    let by_uuid = store
        .node(&NodeIdent::Uuid(node.uuid))
        .await
        .expect("by uuid");
    assert_eq!(by_uuid, node);
    let by_name = store
        .node(&NodeIdent::Name("create-and-get".into()))
        .await
        .expect("by name");
    assert_eq!(by_name, node);
    let missing = Uuid::new_v4();
    assert!(matches!(
        store.node(&NodeIdent::Uuid(missing)).await,
        Err(StoreError::NotFound { kind: "node", ident }) if ident == missing.to_string()
    ));
    assert!(matches!(
        store.node(&NodeIdent::Name("nobody".into())).await,
        Err(StoreError::NotFound { kind: "node", .. })
    ));
    // A node without a name: None round-trips, and two of them do not collide.
    for _ in 0..2 {
        let bare = Node::new(Uuid::new_v4(), "iscsi_ilo", ProvisionState::Enroll);
        store
            .create_node(&bare)
            .await
            .expect("creating a nameless node");
        assert_eq!(
            store
                .node(&NodeIdent::Uuid(bare.uuid))
                .await
                .expect("reading"),
            bare
        );
        store.delete_node(bare.uuid).await.expect("deleting");
    }
    store.delete_node(node.uuid).await.expect("deleting");
    assert!(matches!(
        store.delete_node(node.uuid).await,
        Err(StoreError::NotFound { kind: "node", .. })
    ));
}

async fn duplicates(store: &dyn Store) {
    let node = full_node("dup");
    store.create_node(&node).await.expect("creating");

    let mut same_uuid = full_node("dup-other");
    same_uuid.uuid = node.uuid;
    match store.create_node(&same_uuid).await {
        Err(StoreError::Duplicate {
            kind: "node",
            field: "uuid",
            value,
        }) => {
            assert_eq!(value, node.uuid.to_string())
        }
        other => panic!("same uuid: {other:?}"),
    }
    match store.create_node(&full_node("dup")).await {
        Err(StoreError::Duplicate {
            kind: "node",
            field: "name",
            value,
        }) => assert_eq!(value, "dup"),
        other => panic!("same name: {other:?}"),
    }
    // Renaming another node onto a taken name is refused the same way.
    let mut other = full_node("dup-2");
    store.create_node(&other).await.expect("creating");
    other.name = Some("dup".into());
    assert!(matches!(
        store.update_node(&other).await,
        Err(StoreError::Duplicate { field: "name", .. })
    ));
    // One node per instance, as Ironic.
    let mut a = full_node("inst-a");
    a.instance_uuid = Some("11111111-2222-3333-4444-555555555555".into());
    store.create_node(&a).await.expect("creating");
    let mut b = full_node("inst-b");
    b.instance_uuid = a.instance_uuid.clone();
    assert!(matches!(
        store.create_node(&b).await,
        Err(StoreError::Duplicate {
            field: "instance_uuid",
            ..
        })
    ));

    store
        .create_port(&port(node.uuid, "52:54:00:aa:bb:cc"))
        .await
        .expect("creating port");
    let mut upper = port(other.uuid, "52:54:00:AA:BB:CC");
    match store.create_port(&upper).await {
        Err(StoreError::Duplicate {
            kind: "port",
            field: "address",
            value,
        }) => {
            assert_eq!(value, "52:54:00:aa:bb:cc")
        }
        other => panic!("same MAC in upper case: {other:?}"),
    }
    upper.address = "52:54:00:aa:bb:cd".into();
    store.create_port(&upper).await.expect("another MAC");
    let mut same_port_uuid = port(node.uuid, "52:54:00:00:00:01");
    same_port_uuid.uuid = upper.uuid;
    assert!(matches!(
        store.create_port(&same_port_uuid).await,
        Err(StoreError::Duplicate {
            kind: "port",
            field: "uuid",
            ..
        })
    ));
    // A port of a node that does not exist.
    let orphan = port(Uuid::new_v4(), "52:54:00:00:00:02");
    assert!(matches!(
        store.create_port(&orphan).await,
        Err(StoreError::NotFound { kind: "node", ident }) if ident == orphan.node_uuid.to_string()
    ));

    for n in [node.uuid, other.uuid, a.uuid] {
        store.delete_node(n).await.expect("deleting");
    }
}

async fn list_filters(store: &dyn Store) {
    let mut made = Vec::new();
    for i in 0..6 {
        let mut node = Node::new(
            Uuid::new_v4(),
            if i % 2 == 0 { "agent_ilo" } else { "iscsi_ilo" },
            if i < 3 {
                ProvisionState::Available
            } else {
                ProvisionState::Active
            },
        );
        node.name = Some(format!("list-{i}"));
        node.maintenance = i == 4;
        if i >= 3 {
            node.instance_uuid = Some(format!("instance-{i}"));
        }
        node.conductor_group = match i {
            0 | 3 => "rack-a",
            4 => "rack-b",
            _ => "",
        }
        .to_string();
        store.create_node(&node).await.expect("creating");
        made.push(node);
    }
    let all = store
        .list_nodes(&NodeFilter::default())
        .await
        .expect("listing");
    assert_eq!(uuids(&all), uuids(&made), "creation order");

    let list = |filter: NodeFilter| async move {
        uuids(&store.list_nodes(&filter).await.expect("listing"))
    };
    let pick = |idx: &[usize]| idx.iter().map(|&i| made[i].uuid).collect::<Vec<_>>();
    assert_eq!(
        list(NodeFilter {
            provision_state: Some(ProvisionState::Active),
            ..Default::default()
        })
        .await,
        pick(&[3, 4, 5])
    );
    assert_eq!(
        list(NodeFilter {
            driver: Some("iscsi_ilo".into()),
            ..Default::default()
        })
        .await,
        pick(&[1, 3, 5])
    );
    assert_eq!(
        list(NodeFilter {
            maintenance: Some(true),
            ..Default::default()
        })
        .await,
        pick(&[4])
    );
    assert_eq!(
        list(NodeFilter {
            maintenance: Some(false),
            ..Default::default()
        })
        .await,
        pick(&[0, 1, 2, 3, 5])
    );
    assert_eq!(
        list(NodeFilter {
            associated: Some(true),
            ..Default::default()
        })
        .await,
        pick(&[3, 4, 5])
    );
    assert_eq!(
        list(NodeFilter {
            associated: Some(false),
            ..Default::default()
        })
        .await,
        pick(&[0, 1, 2])
    );
    assert_eq!(
        list(NodeFilter {
            instance_uuid: Some("instance-5".into()),
            ..Default::default()
        })
        .await,
        pick(&[5])
    );
    assert_eq!(
        list(NodeFilter {
            driver: Some("agent_ilo".into()),
            provision_state: Some(ProvisionState::Available),
            ..Default::default()
        })
        .await,
        pick(&[0, 2])
    );
    // Pages of two, each starting after the last node of the one before.
    let mut pages = Vec::new();
    let mut marker = None;
    loop {
        let page = list(NodeFilter {
            limit: Some(2),
            marker,
            ..Default::default()
        })
        .await;
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 2);
        marker = page.last().copied();
        pages.extend(page);
    }
    assert_eq!(pages, pick(&[0, 1, 2, 3, 4, 5]));
    assert_eq!(
        list(NodeFilter {
            limit: Some(0),
            ..Default::default()
        })
        .await,
        Vec::<Uuid>::new()
    );
    assert!(matches!(
        store
            .list_nodes(&NodeFilter {
                marker: Some(Uuid::new_v4()),
                ..Default::default()
            })
            .await,
        Err(StoreError::NotFound { kind: "node", .. })
    ));

    let group = |name: &str| NodeFilter {
        conductor_group: Some(name.to_string()),
        ..Default::default()
    };
    assert_eq!(list(group("rack-a")).await, pick(&[0, 3]));
    assert_eq!(list(group("RACK-a")).await, pick(&[0, 3]), "any case");
    assert_eq!(list(group("rack-b")).await, pick(&[4]));
    assert_eq!(list(group("")).await, pick(&[1, 2, 5]), "the default group");
    assert_eq!(list(group("rack-c")).await, pick(&[]));
    assert_eq!(
        list(NodeFilter {
            provision_state: Some(ProvisionState::Active),
            ..group("rack-a")
        })
        .await,
        pick(&[3])
    );
    // A group moves with an update.
    let mut moved = made[1].clone();
    moved.conductor_group = "rack-b".into();
    store.update_node(&moved).await.expect("updating");
    assert_eq!(list(group("rack-b")).await, pick(&[1, 4]));
    assert_eq!(
        store
            .node(&NodeIdent::Uuid(moved.uuid))
            .await
            .expect("reading")
            .conductor_group,
        "rack-b"
    );

    store
        .reserve_node(made[2].uuid, "host-a")
        .await
        .expect("reserving");
    assert_eq!(
        list(NodeFilter {
            reserved_by: Some("host-a".into()),
            ..Default::default()
        })
        .await,
        pick(&[2])
    );
    for node in &made {
        store.delete_node(node.uuid).await.expect("deleting");
    }
}

/// Every sortable column, both directions, whole and in pages of 3 after markers: the store's
/// order is the column's (NULLs first ascending, bytes for text, instants for times), then
/// creation order.
async fn list_order(store: &dyn Store) {
    use super::order::{Order, NODE_SORT_KEYS};
    let base = time::OffsetDateTime::from_unix_timestamp(1_700_000_000).expect("a time");
    let names = [
        Some("delta"),
        None,
        Some("alpha"),
        Some("charlie"),
        None,
        Some("bravo"),
        Some("Zulu"),
    ];
    // Creation times out of creation order, a second apart; provision times 7 ms apart (the
    // SQLite store orders times to the millisecond), some unset.
    let created = [3i64, 0, 6, 1, 5, 2, 4];
    let mut made = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut node = Node::new(
            Uuid::new_v4(),
            if i % 3 == 0 { "iscsi_ilo" } else { "agent_ilo" },
            ProvisionState::Available,
        );
        node.name = name.map(str::to_string);
        node.maintenance = i % 2 == 0;
        node.created_at = base + time::Duration::seconds(created[i]);
        node.provision_updated_at =
            (i % 4 != 1).then(|| base + time::Duration::milliseconds(7 * ((i as i64 * 5) % 7)));
        store.create_node(&node).await.expect("creating");
        made.push(node);
    }
    // The reference order: (value, creation index), values as bytes that sort as they do.
    let value = |node: &Node, key: &str| -> Option<Vec<u8>> {
        let time = |t: time::OffsetDateTime| {
            // Offset so every time is positive; big-endian bytes sort as numbers.
            ((t.unix_timestamp_nanos() + (1i128 << 100)) as u128)
                .to_be_bytes()
                .to_vec()
        };
        match key {
            "id" => None,
            "uuid" => Some(node.uuid.to_string().into_bytes()),
            "name" => node.name.clone().map(String::into_bytes),
            "driver" => Some(node.driver.clone().into_bytes()),
            "maintenance" => Some(vec![u8::from(node.maintenance)]),
            "created_at" => Some(time(node.created_at)),
            "provision_updated_at" => node.provision_updated_at.map(time),
            "provision_state" => Some(node.provision_state.as_str().as_bytes().to_vec()),
            "power_state" => node.power_state.map(|p| p.as_str().as_bytes().to_vec()),
            "instance_uuid" => node.instance_uuid.clone().map(String::into_bytes),
            other => panic!("no reference value for {other}"),
        }
    };
    for key in NODE_SORT_KEYS.iter().filter(|k| **k != "updated_at") {
        for descending in [false, true] {
            let order = Order::by(NODE_SORT_KEYS, key, descending).expect("a sortable key");
            let mut want: Vec<usize> = (0..made.len()).collect();
            want.sort_by_key(|&i| (value(&made[i], key), i));
            if descending {
                want.reverse();
            }
            let want: Vec<Uuid> = want.iter().map(|&i| made[i].uuid).collect();
            let whole = store
                .list_nodes(&NodeFilter {
                    order,
                    ..Default::default()
                })
                .await
                .expect("listing");
            assert_eq!(uuids(&whole), want, "{key} descending={descending}");
            let mut paged = Vec::new();
            let mut marker = None;
            loop {
                let page = store
                    .list_nodes(&NodeFilter {
                        order,
                        limit: Some(3),
                        marker,
                        ..Default::default()
                    })
                    .await
                    .expect("a page");
                if page.is_empty() {
                    break;
                }
                marker = page.last().map(|n| n.uuid);
                paged.extend(uuids(&page));
            }
            assert_eq!(paged, want, "pages of {key} descending={descending}");
        }
    }
    // A filter and an order together, after a marker.
    let agents = store
        .list_nodes(&NodeFilter {
            driver: Some("agent_ilo".into()),
            order: Order::by(NODE_SORT_KEYS, "name", true).expect("name"),
            marker: Some(made[3].uuid),
            ..Default::default()
        })
        .await
        .expect("listing");
    // agent_ilo nodes: 1 (None), 2 alpha, 4 (None), 5 bravo; name descending, NULLs last:
    // bravo, alpha, then the nameless by id descending; after charlie (an iscsi_ilo node, but a
    // marker need not pass the filter) come bravo and the rest.
    assert_eq!(
        uuids(&agents),
        vec![made[5].uuid, made[2].uuid, made[4].uuid, made[1].uuid]
    );
    for node in &made {
        store.delete_node(node.uuid).await.expect("deleting");
    }
}

async fn update_keeps_reservation(store: &dyn Store) {
    let node = full_node("update");
    store.create_node(&node).await.expect("creating");
    let reserved = store
        .reserve_node(node.uuid, "conductor-1")
        .await
        .expect("reserving");
    assert_eq!(reserved.reservation.as_deref(), Some("conductor-1"));

    let mut changed = node.clone();
    changed.reservation = None; // a stale copy: must not release the lock
    changed.created_at = time::OffsetDateTime::UNIX_EPOCH; // read-only too
    changed.provision_state = ProvisionState::Deploying;
    changed.last_error = None;
    changed.instance_info.insert("root_gb".into(), json!(20));
    store.update_node(&changed).await.expect("updating");

    let read = store
        .node(&NodeIdent::Uuid(node.uuid))
        .await
        .expect("reading");
    assert_eq!(read.reservation.as_deref(), Some("conductor-1"));
    assert_eq!(read.created_at, node.created_at);
    assert_eq!(read.provision_state, ProvisionState::Deploying);
    assert_eq!(read.last_error, None);
    assert_eq!(read.instance_info.get("root_gb"), Some(&json!(20)));
    assert!(read.updated_at.is_some(), "update sets updated_at");

    let mut missing = full_node("update-missing");
    missing.name = None;
    assert!(matches!(
        store.update_node(&missing).await,
        Err(StoreError::NotFound { kind: "node", .. })
    ));
    store.delete_node(node.uuid).await.expect("deleting");
}

async fn delete_cascades_ports(store: &dyn Store) {
    let node = full_node("cascade");
    store.create_node(&node).await.expect("creating");
    let keep = full_node("cascade-keep");
    store.create_node(&keep).await.expect("creating");
    let p1 = port(node.uuid, "52:54:00:00:10:01");
    let p2 = port(node.uuid, "52:54:00:00:10:02");
    let p3 = port(keep.uuid, "52:54:00:00:10:03");
    for p in [&p1, &p2, &p3] {
        store.create_port(p).await.expect("creating port");
    }
    store.delete_node(node.uuid).await.expect("deleting");
    for p in [&p1, &p2] {
        assert!(matches!(
            store.port(p.uuid).await,
            Err(StoreError::NotFound { kind: "port", .. })
        ));
    }
    assert_eq!(
        store
            .port(p3.uuid)
            .await
            .expect("the other node's port stays"),
        p3
    );
    // The MAC of a deleted port is free again.
    store
        .create_port(&port(keep.uuid, "52:54:00:00:10:01"))
        .await
        .expect("MAC reused");
    store.delete_node(keep.uuid).await.expect("deleting");
}

/// An event of `node`'s history numbered `n` (its text says which).
fn event(node: Uuid, n: usize, severity: Severity) -> HistoryEvent {
    HistoryEvent {
        uuid: Uuid::new_v4(),
        node_uuid: node,
        created_at: crate::store::now(),
        severity,
        event_type: "deploy".into(),
        event: format!("event {n}: deploying \u{2192} wait call-back"),
        user: n.is_multiple_of(2).then(|| "admin".to_string()),
        conductor: Some("conductor-1".into()),
    }
}

/// History: events read back equal, oldest first or newest first, after a marker, limited;
/// the newest `keep` stay; another node's events are apart; the node's delete takes them.
async fn history(store: &dyn Store) {
    let node = full_node("history");
    store.create_node(&node).await.expect("creating");
    let other = full_node("history-other");
    store.create_node(&other).await.expect("creating");
    let mut written = Vec::new();
    for n in 0..7 {
        let e = event(
            node.uuid,
            n,
            if n == 3 {
                Severity::Error
            } else {
                Severity::Info
            },
        );
        store.add_history(&e, 5).await.expect("recording");
        written.push(e);
    }
    let foreign = event(other.uuid, 0, Severity::Warning);
    store.add_history(&foreign, 5).await.expect("recording");
    let kept = &written[2..];

    let all = store
        .list_history(node.uuid, &HistoryQuery::default())
        .await
        .expect("listing");
    assert_eq!(all, kept, "the newest 5, oldest first, as written");
    let newest = store
        .list_history(
            node.uuid,
            &HistoryQuery {
                newest_first: true,
                limit: Some(2),
                ..HistoryQuery::default()
            },
        )
        .await
        .expect("listing");
    assert_eq!(newest, [written[6].clone(), written[5].clone()]);
    let after = store
        .list_history(
            node.uuid,
            &HistoryQuery {
                marker: Some(written[3].uuid),
                ..HistoryQuery::default()
            },
        )
        .await
        .expect("listing after a marker");
    assert_eq!(after, &written[4..]);
    let before = store
        .list_history(
            node.uuid,
            &HistoryQuery {
                marker: Some(written[3].uuid),
                newest_first: true,
                ..HistoryQuery::default()
            },
        )
        .await
        .expect("listing back from a marker");
    assert_eq!(before, [written[2].clone()]);
    // A marker of another node's history, or a trimmed event, names nothing here.
    for marker in [foreign.uuid, written[0].uuid] {
        let err = store
            .list_history(
                node.uuid,
                &HistoryQuery {
                    marker: Some(marker),
                    ..HistoryQuery::default()
                },
            )
            .await
            .expect_err("not this node's event");
        assert!(
            matches!(
                err,
                StoreError::NotFound {
                    kind: "history event",
                    ..
                }
            ),
            "{err}"
        );
    }

    assert_eq!(
        store
            .history_event(node.uuid, written[3].uuid)
            .await
            .expect("one event"),
        written[3]
    );
    assert!(matches!(
        store.history_event(node.uuid, foreign.uuid).await,
        Err(StoreError::NotFound {
            kind: "history event",
            ..
        })
    ));
    assert_eq!(
        store
            .list_history(other.uuid, &HistoryQuery::default())
            .await
            .expect("listing"),
        std::slice::from_ref(&foreign)
    );

    // No node, no history; a NUL cannot be stored.
    let ghost = Uuid::new_v4();
    assert!(matches!(
        store.add_history(&event(ghost, 0, Severity::Info), 5).await,
        Err(StoreError::NotFound { kind: "node", .. })
    ));
    let mut nul = event(node.uuid, 9, Severity::Info);
    nul.event = "a\0b".into();
    assert!(matches!(
        store.add_history(&nul, 5).await,
        Err(StoreError::Invalid(_))
    ));

    store.delete_node(node.uuid).await.expect("deleting");
    assert!(store
        .list_history(node.uuid, &HistoryQuery::default())
        .await
        .expect("listing a deleted node's history")
        .is_empty());
    assert!(matches!(
        store.history_event(node.uuid, written[6].uuid).await,
        Err(StoreError::NotFound { .. })
    ));
    store.delete_node(other.uuid).await.expect("deleting");
}

async fn ports(store: &dyn Store) {
    let a = full_node("ports-a");
    let b = full_node("ports-b");
    store.create_node(&a).await.expect("creating");
    store.create_node(&b).await.expect("creating");
    let pa1 = port(a.uuid, "52:54:00:00:20:01");
    let pa2 = port(a.uuid, "52:54:00:00:20:02");
    let mut pb1 = port(b.uuid, "52:54:00:00:20:03");
    for p in [&pa1, &pa2, &pb1] {
        store.create_port(p).await.expect("creating port");
    }
    assert_eq!(store.port(pa1.uuid).await.expect("reading"), pa1);
    let list = |filter: PortFilter| async move {
        store
            .list_ports(&filter)
            .await
            .expect("listing ports")
            .into_iter()
            .map(|p| p.uuid)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        list(PortFilter::default()).await,
        vec![pa1.uuid, pa2.uuid, pb1.uuid]
    );
    assert_eq!(
        list(PortFilter {
            node_uuid: Some(a.uuid),
            ..Default::default()
        })
        .await,
        vec![pa1.uuid, pa2.uuid]
    );
    assert_eq!(
        list(PortFilter {
            address: Some("52:54:00:00:20:03".to_uppercase()),
            ..Default::default()
        })
        .await,
        vec![pb1.uuid]
    );
    assert_eq!(
        list(PortFilter {
            limit: Some(1),
            marker: Some(pa1.uuid),
            ..Default::default()
        })
        .await,
        vec![pa2.uuid]
    );

    pb1.extra.insert("vif_port_id".into(), json!("new-vif"));
    pb1.pxe_enabled = false;
    pb1.node_uuid = a.uuid;
    pb1.address = "52:54:00:00:20:0F".into();
    store.update_port(&pb1).await.expect("updating port");
    let read = store.port(pb1.uuid).await.expect("reading");
    assert_eq!(read.extra, pb1.extra);
    assert!(!read.pxe_enabled);
    assert_eq!(read.node_uuid, a.uuid);
    assert_eq!(
        read.address, "52:54:00:00:20:0f",
        "MACs are kept lower case"
    );
    assert!(read.updated_at.is_some());

    let mut onto_taken = pb1.clone();
    onto_taken.address = "52:54:00:00:20:01".into();
    assert!(matches!(
        store.update_port(&onto_taken).await,
        Err(StoreError::Duplicate {
            field: "address",
            ..
        })
    ));
    let mut to_missing_node = pb1.clone();
    to_missing_node.node_uuid = Uuid::new_v4();
    assert!(matches!(
        store.update_port(&to_missing_node).await,
        Err(StoreError::NotFound { kind: "node", .. })
    ));

    store.delete_port(pa2.uuid).await.expect("deleting port");
    assert!(matches!(
        store.delete_port(pa2.uuid).await,
        Err(StoreError::NotFound { kind: "port", .. })
    ));
    assert!(matches!(
        store.update_port(&pa2).await,
        Err(StoreError::NotFound { kind: "port", .. })
    ));
    store.delete_node(a.uuid).await.expect("deleting");
    store.delete_node(b.uuid).await.expect("deleting");
}

async fn reservation_race(store: Arc<dyn Store>) {
    let node = full_node("race");
    store.create_node(&node).await.expect("creating");
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let holder = format!("task-{i}");
                (holder.clone(), store.reserve_node(node.uuid, &holder).await)
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut lost = Vec::new();
    for task in tasks {
        let (holder, result) = task.await.expect("task ran");
        match result {
            Ok(n) => {
                assert_eq!(n.reservation.as_deref(), Some(holder.as_str()));
                winners.push(holder)
            }
            Err(StoreError::Locked {
                node: locked,
                holder: by,
            }) => {
                assert_eq!(locked, node.uuid);
                lost.push(by)
            }
            Err(other) => panic!("{holder}: {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one task wins: {winners:?}");
    assert_eq!(lost.len(), 15);
    let holders: HashSet<_> = lost.iter().collect();
    assert_eq!(holders.len(), 1);
    assert!(
        holders.contains(&winners[0]),
        "losers see the winner as holder"
    );

    // The same holder cannot take it twice: one task per node.
    assert!(matches!(
        store.reserve_node(node.uuid, &winners[0]).await,
        Err(StoreError::Locked { .. })
    ));
    assert!(matches!(
        store.reserve_node(Uuid::new_v4(), "anyone").await,
        Err(StoreError::NotFound { kind: "node", .. })
    ));
    store
        .release_node(node.uuid, &winners[0])
        .await
        .expect("releasing");
    store
        .reserve_node(node.uuid, "next")
        .await
        .expect("free again");
    store.delete_node(node.uuid).await.expect("deleting");
}

async fn release_rules(store: &dyn Store) {
    let node = full_node("release");
    store.create_node(&node).await.expect("creating");
    store
        .reserve_node(node.uuid, "host-a:1")
        .await
        .expect("reserving");
    store
        .release_node(node.uuid, "host-b:1")
        .await
        .expect("wrong holder is a no-op");
    let read = store
        .node(&NodeIdent::Uuid(node.uuid))
        .await
        .expect("reading");
    assert_eq!(read.reservation.as_deref(), Some("host-a:1"));
    store
        .release_node(Uuid::new_v4(), "host-a:1")
        .await
        .expect("missing node is a no-op");

    let mut made = vec![node.uuid];
    for holder in ["host-a:2", "host-b:1", "host-ab:1", "HOST-A:3", "host-a%"] {
        let n = full_node(&format!("release-{holder}"));
        store.create_node(&n).await.expect("creating");
        store.reserve_node(n.uuid, holder).await.expect("reserving");
        made.push(n.uuid);
    }
    let free = full_node("release-free");
    store.create_node(&free).await.expect("creating");

    let mut released = store.release_all("host-a:").await.expect("releasing all");
    released.sort();
    let mut want = vec![made[0], made[1]];
    want.sort();
    assert_eq!(
        released, want,
        "only holders starting with the prefix, case-sensitive"
    );
    for (uuid, held) in made.iter().zip([
        None,
        None,
        Some("host-b:1"),
        Some("host-ab:1"),
        Some("HOST-A:3"),
        Some("host-a%"),
    ]) {
        let read = store.node(&NodeIdent::Uuid(*uuid)).await.expect("reading");
        assert_eq!(read.reservation.as_deref(), held);
    }
    // `%` and `_` are no wildcards.
    assert_eq!(
        store.release_all("host-a_").await.expect("releasing"),
        Vec::<Uuid>::new()
    );
    assert_eq!(
        store.release_all("host-a%").await.expect("releasing"),
        vec![made[5]]
    );
    assert_eq!(
        store.release_all("nobody").await.expect("releasing"),
        Vec::<Uuid>::new()
    );

    for uuid in made.into_iter().chain([free.uuid]) {
        store.delete_node(uuid).await.expect("deleting");
    }
    assert!(store
        .list_nodes(&NodeFilter::default())
        .await
        .expect("listing")
        .is_empty());
}
