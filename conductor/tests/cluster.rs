//! Several `vmdeploy-conductor serve` processes on one PostgreSQL database, black box: they
//! agree on which conductor owns which node (the node's `conductor` field, API 1.49), any
//! conductor's API accepts a node's action and the owner carries it out, and when one is
//! killed with SIGKILL the others take its nodes over (and fail the task it was running, naming
//! it), then hand them back when it starts again.
//!
//! The BMCs are the in-process iLO emulator (RIBCL); which conductor carried out a power
//! change is read from each conductor's own log (`power change requested node=…`). Each
//! conductor keeps its built-in object store, and must say that several need a shared one.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use vmdeploy_ilo_emulator::{Emulator, EmulatorConfig, FaultKind, FaultSpec};

const VERSION: (&str, &str) = ("X-OpenStack-Ironic-API-Version", "1.49");
const NODES: usize = 30;
/// Short heartbeats, so takeover happens within seconds.
const HEARTBEAT_INTERVAL_S: u64 = 1;
const HEARTBEAT_TIMEOUT_S: u64 = 3;

fn start_conductor(dir: &Path, name: &str, database_url: &str) -> Conductor {
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir).expect("conductor dir");
    Conductor::with_config(
        &dir,
        &format!(
            "[api]\nlisten = [\"127.0.0.1:0\"]\n\
             [deploy]\nconductor_name = \"{name}\"\npower_sync_interval = 86400\n\
             [conductor]\nheartbeat_interval = {HEARTBEAT_INTERVAL_S}\n\
             heartbeat_timeout = {HEARTBEAT_TIMEOUT_S}\n\
             [database]\nurl = \"{database_url}\"\n"
        ),
    )
}

async fn get(http: &reqwest::Client, url: &str) -> (u16, Value) {
    let reply = http
        .get(url)
        .header(VERSION.0, VERSION.1)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = reply.status().as_u16();
    (status, reply.json().await.unwrap_or(Value::Null))
}

async fn put(http: &reqwest::Client, url: &str, body: Value) -> (u16, String) {
    let reply = http
        .put(url)
        .header(VERSION.0, VERSION.1)
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("PUT {url}: {e}"));
    let status = reply.status().as_u16();
    (status, reply.text().await.unwrap_or_default())
}

/// Node UUID -> its `conductor` field, as the conductor at `url` shows it.
async fn owners(http: &reqwest::Client, url: &str) -> BTreeMap<String, String> {
    let (status, body) = get(http, &format!("{url}/v1/nodes?detail=True&limit=1000")).await;
    assert_eq!(status, 200, "{body}");
    body["nodes"]
        .as_array()
        .expect("a node list")
        .iter()
        .map(|n| {
            (
                n["uuid"].as_str().expect("uuid").to_string(),
                n["conductor"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Waits until every conductor in `urls` shows the same owner for every node, each owner one of
/// `expected`; returns that mapping.
async fn agreed_owners(
    http: &reqwest::Client,
    urls: &[String],
    expected: &BTreeSet<&str>,
    within: Duration,
) -> BTreeMap<String, String> {
    let deadline = Instant::now() + within;
    loop {
        let mut views = Vec::new();
        for url in urls {
            views.push(owners(http, url).await);
        }
        let agreed = views.windows(2).all(|w| w[0] == w[1]);
        let used: BTreeSet<&str> = views[0].values().map(String::as_str).collect();
        if agreed && used == *expected {
            return views.swap_remove(0);
        }
        assert!(
            Instant::now() < deadline,
            "the conductors did not agree on owners among {expected:?} within {within:?}: {views:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The nodes whose power change a conductor's log says it carried out.
fn power_changes_in(log: &[String]) -> BTreeSet<String> {
    log.iter()
        .filter(|l| l.contains("power change requested"))
        .filter_map(|l| {
            let at = l.find("node=")? + 5;
            Some(l[at..at + 36].to_string())
        })
        .collect()
}

#[test]
fn conductors_share_nodes_forward_actions_and_take_over_a_killed_ones_nodes() {
    let cluster = vmdeploy_test_postgres::shared();
    let database = cluster.socket_url(&cluster.create_database("cluster"));
    let dir = tempfile::tempdir().expect("temp dir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let emulator = rt.block_on(async {
        let mut config = EmulatorConfig::loopback();
        config.servers = NODES;
        Emulator::start(config)
            .await
            .expect("the iLO emulator starts")
    });
    let cert = dir.path().join("ilo.pem");
    std::fs::write(&cert, emulator.cert_pem()).expect("the emulator's certificate");

    let mut conductors: BTreeMap<&str, Conductor> = ["c1", "c2", "c3"]
        .into_iter()
        .map(|name| (name, start_conductor(dir.path(), name, &database)))
        .collect();
    let url = |c: &BTreeMap<&str, Conductor>, name: &str| c[name].url();
    let all_urls: Vec<String> = conductors.values().map(Conductor::url).collect();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client");

    rt.block_on(async {
        // Every conductor lists the three, alive.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (_, body) = get(&http, &format!("{}/v1/conductors", all_urls[0])).await;
            let alive: BTreeSet<&str> = body["conductors"]
                .as_array()
                .map(|list| {
                    list.iter()
                        .filter(|c| c["alive"] == json!(true))
                        .filter_map(|c| c["hostname"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            if alive == BTreeSet::from(["c1", "c2", "c3"]) {
                break;
            }
            assert!(Instant::now() < deadline, "conductors: {body}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // Nodes created through c1, one per emulated iLO.
        for (i, addr) in emulator.addresses().iter().enumerate() {
            let reply = http
                .post(format!("{}/v1/nodes", all_urls[0]))
                .header(VERSION.0, VERSION.1)
                .json(&json!({
                    "name": format!("n{i}"), "driver": "ilo",
                    "driver_info": {
                        "ilo_address": addr.to_string(), "ilo_username": "Administrator",
                        "ilo_password": "password", "ilo_verify_ca": cert.to_string_lossy(),
                        "ilo_protocol": "ribcl", "client_timeout": 10,
                    },
                }))
                .send()
                .await
                .expect("creating a node");
            assert_eq!(
                reply.status(),
                201,
                "node {i}: {}",
                reply.text().await.unwrap_or_default()
            );
        }
    });
    let three = BTreeSet::from(["c1", "c2", "c3"]);
    let owners_before = rt.block_on(agreed_owners(
        &http,
        &all_urls,
        &three,
        Duration::from_secs(10),
    ));

    // Every power change is sent to c1; each is carried out by the node's owner.
    rt.block_on(async {
        for uuid in owners_before.keys() {
            let (status, body) = put(
                &http,
                &format!("{}/v1/nodes/{uuid}/states/power", url(&conductors, "c1")),
                json!({"target": "power on"}),
            )
            .await;
            assert_eq!(status, 202, "power on {uuid} through c1: {body}");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, body) = get(
                &http,
                &format!("{}/v1/nodes?detail=True&limit=1000", url(&conductors, "c3")),
            )
            .await;
            let on = body["nodes"]
                .as_array()
                .map(|n| n.iter().filter(|n| n["power_state"] == "power on").count())
                .unwrap_or(0);
            if on == NODES {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{on} of {NODES} powered on: {body}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    for (name, conductor) in conductors.iter_mut() {
        let log = conductor.drain();
        // Each keeps floppies and ISOs in its built-in object store: it says that several
        // conductors need a shared one.
        assert!(
            log.iter()
                .any(|l| l.contains("several conductors share this database")),
            "{name} did not warn about its built-in object store:\n{}",
            log.join("\n")
        );
        let carried_out = power_changes_in(log);
        let owned: BTreeSet<String> = owners_before
            .iter()
            .filter(|(_, owner)| owner == name)
            .map(|(uuid, _)| uuid.clone())
            .collect();
        assert_eq!(
            carried_out, owned,
            "{name} carried out the power changes of exactly its own nodes"
        );
    }

    // c2 is running a power change on one of its nodes (its BMC answers after 20 s) when it is
    // killed.
    let (victim, victim_index) = owners_before
        .iter()
        .find(|(_, owner)| *owner == "c2")
        .map(|(uuid, _)| {
            let index = rt.block_on(async {
                let (_, node) = get(&http, &format!("{}/v1/nodes/{uuid}", all_urls[0])).await;
                let name = node["name"].as_str().expect("a name").to_string();
                name[1..].parse::<usize>().expect("n<index>")
            });
            (uuid.clone(), index)
        })
        .expect("c2 owns a node");
    assert!(emulator.inject_fault(
        victim_index,
        FaultSpec {
            kind: FaultKind::Delay,
            count: 10,
            seconds: 20.0,
            status: None,
            message: None,
        }
    ));
    rt.block_on(async {
        let (status, body) = put(
            &http,
            &format!("{}/v1/nodes/{victim}/states/power", url(&conductors, "c1")),
            json!({"target": "power off"}),
        )
        .await;
        assert_eq!(status, 202, "{body}");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (_, node) = get(&http, &format!("{}/v1/nodes/{victim}", all_urls[0])).await;
            if node["reservation"]
                .as_str()
                .is_some_and(|r| r.starts_with("c2:"))
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "c2 never reserved {victim}: {node}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let killed_at = Instant::now();
    conductors
        .get_mut("c2")
        .expect("c2")
        .child
        .kill()
        .expect("SIGKILL to c2");
    let _ = conductors.get_mut("c2").expect("c2").child.wait();
    let survivors = vec![url(&conductors, "c1"), url(&conductors, "c3")];

    rt.block_on(async {
        // Until c2's heartbeat is older than the timeout, its nodes' actions cannot reach it:
        // 503 with the reason, not a hang and not a wrong answer.
        let other_c2_node = owners_before
            .iter()
            .find(|(uuid, owner)| *owner == "c2" && **uuid != victim)
            .map(|(uuid, _)| uuid.clone());
        if let Some(node) = other_c2_node {
            let (status, body) = put(
                &http,
                &format!("{}/v1/nodes/{node}/states/power", survivors[0]),
                json!({"target": "power off"}),
            )
            .await;
            if killed_at.elapsed() < Duration::from_secs(HEARTBEAT_TIMEOUT_S - HEARTBEAT_INTERVAL_S)
            {
                assert_eq!(status, 503, "{body}");
                assert!(body.contains("conductor c2"), "{body}");
            }
        }

        // Taken over within the timeout and one interval (plus the test's own slack).
        let two = BTreeSet::from(["c1", "c3"]);
        let owners_after = agreed_owners(
            &http,
            &survivors,
            &two,
            Duration::from_secs(HEARTBEAT_TIMEOUT_S + HEARTBEAT_INTERVAL_S + 5),
        )
        .await;
        for (uuid, owner) in &owners_before {
            if owner != "c2" {
                assert_eq!(&owners_after[uuid], owner, "a survivor's node moved");
            }
        }
        let (_, list) = get(&http, &format!("{}/v1/conductors", survivors[0])).await;
        let c2 = list["conductors"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["hostname"] == "c2"))
            .cloned()
            .unwrap_or(Value::Null);
        assert_eq!(c2["alive"], json!(false), "{list}");

        // The power change c2 was running: released and failed, naming c2.
        let deadline = Instant::now() + Duration::from_secs(10);
        let node = loop {
            let (_, node) = get(&http, &format!("{}/v1/nodes/{victim}", survivors[1])).await;
            if node["reservation"].is_null() && node["last_error"].is_string() {
                break node;
            }
            assert!(Instant::now() < deadline, "not taken over: {node}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let error = node["last_error"].as_str().unwrap_or("");
        assert!(
            error.contains("conductor c2 stopped heartbeating"),
            "{error}"
        );
        assert!(node["target_power_state"].is_null(), "{node}");

        // The survivors act on c2's former nodes (the victim's BMC is still slow: skip it).
        for (uuid, owner) in &owners_before {
            if owner == "c2" && *uuid != victim {
                let (status, body) = put(
                    &http,
                    &format!("{}/v1/nodes/{uuid}/states/power", survivors[0]),
                    json!({"target": "power off"}),
                )
                .await;
                assert_eq!(status, 202, "power off {uuid} after the takeover: {body}");
            }
        }
    });

    // c2 starts again under its name: it rejoins and gets its nodes back (the ring is the same).
    let restarted = start_conductor(dir.path(), "c2", &database);
    conductors.insert("c2", restarted);
    let all_urls: Vec<String> = conductors.values().map(Conductor::url).collect();
    let owners_again = rt.block_on(agreed_owners(
        &http,
        &all_urls,
        &three,
        Duration::from_secs(10),
    ));
    assert_eq!(
        owners_again, owners_before,
        "the ring gave c2 its nodes back"
    );
    rt.block_on(emulator.shutdown());
}

/// PostgreSQL killed (as a crash: `pg_ctl -m immediate`) under a load of API writes, down for
/// longer than `heartbeat_timeout`, then started again: requests meanwhile fail with 503 and
/// nothing else (no 500, no dropped connection, no panic); both conductors reconnect by
/// themselves; every acknowledged create is there; and neither conductor takes the other for
/// dead when the database comes back: a power change one of them ran across the outage
/// finishes as its own, not failed by a takeover.
#[test]
fn postgresql_restarted_under_load_gives_503s_then_everything_works_again() {
    use std::sync::{Arc, Mutex};
    let cluster = vmdeploy_test_postgres::Cluster::start()
        .unwrap_or_else(|e| panic!("a private PostgreSQL cluster: {e}"));
    let database = cluster.socket_url(&cluster.create_database("restart"));
    let dir = tempfile::tempdir().expect("temp dir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let emulator = rt.block_on(async {
        let mut config = EmulatorConfig::loopback();
        config.servers = 10;
        Emulator::start(config)
            .await
            .expect("the iLO emulator starts")
    });
    let cert = dir.path().join("ilo.pem");
    std::fs::write(&cert, emulator.cert_pem()).expect("the emulator's certificate");
    let mut conductors: BTreeMap<&str, Conductor> = ["c1", "c2"]
        .into_iter()
        .map(|name| (name, start_conductor(dir.path(), name, &database)))
        .collect();
    let urls: Vec<String> = conductors.values().map(Conductor::url).collect();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("an HTTP client");
    let driver_info = |i: usize| {
        json!({
            "ilo_address": emulator.addresses()[i].to_string(), "ilo_username": "Administrator",
            "ilo_password": "password", "ilo_verify_ca": cert.to_string_lossy(),
            "ilo_protocol": "ribcl", "client_timeout": 30,
        })
    };
    rt.block_on(async {
        for i in 0..10 {
            let reply = http
                .post(format!("{}/v1/nodes", urls[0]))
                .header(VERSION.0, VERSION.1)
                .json(&json!({"name": format!("n{i}"), "driver": "ilo", "driver_info": driver_info(i)}))
                .send()
                .await
                .expect("creating a node");
            assert_eq!(reply.status(), 201);
        }
    });
    let owners = rt.block_on(agreed_owners(
        &http,
        &urls,
        &BTreeSet::from(["c1", "c2"]),
        Duration::from_secs(10),
    ));
    // A power change of each conductor's that runs across the outage (its BMC answers after
    // 8 s): whichever conductor reads the table first when the database is back would take the
    // other's for dead, were heartbeats not aged from the outage's end.
    let mut victims = Vec::new();
    for conductor in ["c1", "c2"] {
        let (victim, _) = owners
            .iter()
            .find(|(_, owner)| *owner == conductor)
            .expect("each conductor owns a node");
        let index = rt.block_on(async {
            let (_, node) = get(&http, &format!("{}/v1/nodes/{victim}", urls[0])).await;
            node["name"].as_str().expect("a name")[1..]
                .parse::<usize>()
                .expect("n<index>")
        });
        assert!(emulator.inject_fault(
            index,
            FaultSpec {
                kind: FaultKind::Delay,
                count: 1,
                seconds: 8.0,
                status: None,
                message: None,
            }
        ));
        rt.block_on(async {
            let (status, body) = put(
                &http,
                &format!("{}/v1/nodes/{victim}/states/power", urls[1]),
                json!({"target": "power on"}),
            )
            .await;
            assert_eq!(status, 202, "{body}");
        });
        victims.push(victim.clone());
    }

    // The load: creates and PATCHes against both conductors until told to stop.
    // Per request: the status and, for an acknowledged create, the node's name; or the error.
    type Outcome = Result<(u16, Option<String>), String>;
    let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|worker| {
            let (http, urls, outcomes, stop) =
                (http.clone(), urls.clone(), outcomes.clone(), stop.clone());
            rt.spawn(async move {
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let url = &urls[(worker + i) % urls.len()];
                    let name = format!("load-{worker}-{i}");
                    let request = if i % 2 == 0 {
                        http.post(format!("{url}/v1/nodes"))
                            .json(&json!({"name": name, "driver": "ilo"}))
                    } else {
                        http.patch(format!("{url}/v1/nodes/n{}", (worker + i) % 10)).json(
                            &json!([{"op": "add", "path": format!("/extra/{name}"), "value": i}]),
                        )
                    };
                    let outcome = match request.header(VERSION.0, VERSION.1).send().await {
                        Ok(reply) => {
                            let status = reply.status().as_u16();
                            Ok((status, (i % 2 == 0 && status == 201).then_some(name)))
                        }
                        Err(e) => Err(format!("{e:?}")),
                    };
                    outcomes.lock().expect("outcomes").push(outcome);
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    cluster
        .kill()
        .unwrap_or_else(|e| panic!("stopping PostgreSQL: {e}"));
    std::thread::sleep(Duration::from_secs(HEARTBEAT_TIMEOUT_S + 2));
    cluster
        .restart()
        .unwrap_or_else(|e| panic!("starting PostgreSQL again: {e}"));
    // Both serve writes again within a few heartbeats.
    rt.block_on(async {
        for url in &urls {
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let reply = http
                    .get(format!("{url}/v1/nodes?limit=1"))
                    .header(VERSION.0, VERSION.1)
                    .send()
                    .await
                    .map(|r| r.status().as_u16());
                if matches!(reply, Ok(200)) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{url} after the restart: {reply:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    rt.block_on(async {
        for task in load {
            task.await.expect("a load worker");
        }
    });

    let outcomes = outcomes.lock().expect("outcomes").clone();
    let unavailable = outcomes
        .iter()
        .filter(|o| matches!(o, Ok((503, _))))
        .count();
    let bad: Vec<_> = outcomes
        .iter()
        .filter(|o| !matches!(o, Ok((200 | 201 | 409 | 503, _))))
        .collect();
    assert!(
        bad.is_empty(),
        "answers other than 2xx, 409 and 503: {bad:?}"
    );
    assert!(unavailable > 0, "no request met the outage: {outcomes:?}");
    let acknowledged: Vec<String> = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok().and_then(|(_, name)| name.clone()))
        .collect();
    rt.block_on(async {
        for name in &acknowledged {
            let (status, _) = get(&http, &format!("{}/v1/nodes/{name}", urls[1])).await;
            assert_eq!(status, 200, "acknowledged create {name} is lost");
        }
        // The power changes across the outage finished as their conductors' own: no takeover.
        for victim in &victims {
            let deadline = Instant::now() + Duration::from_secs(30);
            let node = loop {
                let (_, node) = get(&http, &format!("{}/v1/nodes/{victim}", urls[0])).await;
                if node["reservation"].is_null() && node["target_power_state"].is_null() {
                    break node;
                }
                assert!(
                    Instant::now() < deadline,
                    "the power change never ended: {node}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            let error = node["last_error"].as_str().unwrap_or("");
            assert!(
                !error.contains("stopped heartbeating"),
                "a conductor was taken for dead after the outage: {error}"
            );
        }
        let (_, list) = get(&http, &format!("{}/v1/conductors", urls[1])).await;
        let alive = list["conductors"]
            .as_array()
            .map(|l| l.iter().filter(|c| c["alive"] == json!(true)).count())
            .unwrap_or(0);
        assert_eq!(alive, 2, "{list}");
    });
    for (name, conductor) in conductors.iter_mut() {
        assert!(
            conductor.child.try_wait().expect("waiting").is_none(),
            "{name} exited"
        );
        let log = conductor.drain();
        assert!(
            !log.iter().any(|l| l.contains("panicked")),
            "{name} panicked:\n{}",
            log.join("\n")
        );
        // Neither took the other for dead (the takeover's log line is written even when the
        // dead conductor held nothing, and a task that later finishes overwrites what the
        // takeover recorded, so the log is what tells).
        let takeovers: Vec<&String> = log
            .iter()
            .filter(|l| l.contains("dead={\"") || l.contains("took over the nodes"))
            .collect();
        assert!(
            takeovers.is_empty(),
            "{name} took a live conductor for dead after the outage: {takeovers:#?}"
        );
        assert!(
            log.iter()
                .any(|l| l.contains("the database is reachable again")),
            "{name} never saw the outage end:\n{}",
            log.join("\n")
        );
    }
    rt.block_on(emulator.shutdown());
}
