//! The agent's call-backs while a deploy waits: lookup, heartbeat and its token, the callback
//! timeout.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use super::harness::*;
use crate::manager::*;
use crate::states::ProvisionState;
use crate::store::{NodeIdent, StoreError};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_waits_for_the_agent_whose_token_must_match() {
    let h = Harness::new().await;
    let uuid = h.node_in(ProvisionState::Available).await;
    h.add_port(uuid, "52:54:00:12:34:56").await;
    // Not deploying yet: lookup does not find it.
    let early = h.manager.lookup(&["52:54:00:12:34:56".into()], None).await;
    assert!(matches!(
        early,
        Err(ManagerError::Store(StoreError::NotFound { .. }))
    ));

    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Deploy, Some(json!("H4sI...")))
        .await
        .expect("deploy accepted");
    h.settle().await;
    let waiting = h.node(uuid).await;
    assert_eq!(waiting.provision_state, ProvisionState::WaitCallBack);
    assert_eq!(waiting.target_provision_state, Some(ProvisionState::Active));
    assert_eq!(
        waiting.instance_info.get("configdrive"),
        Some(&json!("H4sI..."))
    );

    let found = h
        .manager
        .lookup(&["52-54-00-12-34-56".to_uppercase()], None)
        .await
        .expect("lookup finds the node by MAC");
    assert_eq!(found.node["uuid"], json!(uuid));
    assert_eq!(found.config["agent_token_required"], json!(true));
    let shown = format!("{} {}", found.node, found.config);
    assert!(!shown.contains(TOKEN) && !shown.contains("H4sI"), "{shown}");

    for wrong in [None, Some("x"), Some(&TOKEN[..TOKEN.len() - 1])] {
        let refused = h.manager.heartbeat(&id(uuid), heartbeat(wrong)).await;
        assert!(
            matches!(refused, Err(ManagerError::CallbackRefused { .. })),
            "{refused:?}"
        );
        assert_eq!(
            h.node(uuid).await,
            waiting,
            "a refused heartbeat changed the node"
        );
    }

    h.flow.script_heartbeat(Script::Wait);
    let node = h.heartbeat_ok(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::WaitCallBack);
    // The address is the flow's to pin; the manager only notes the time.
    assert!(!node.driver_internal_info.contains_key("agent_url"));
    assert!(node
        .driver_internal_info
        .contains_key("agent_last_heartbeat"));

    let node = h.heartbeat_ok(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::Active);
    assert_eq!(node.target_provision_state, None);
    assert_eq!(node.reservation, None);
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 0);
    // The deploy is over: the token is gone. A late heartbeat with it (sent before the agent
    // was told to power off) is accepted and changes nothing; any other token is answered as
    // for an unknown node.
    assert!(!node.driver_internal_info.contains_key("agent_secret_token"));
    assert!(!node.driver_internal_info.contains_key("agent_url"));
    h.manager
        .heartbeat(&id(uuid), heartbeat(Some(TOKEN)))
        .await
        .expect("the deploy's own agent, late");
    assert_eq!(
        h.node(uuid).await,
        node,
        "a late heartbeat changed the node"
    );
    for wrong in [None, Some("x"), Some(&TOKEN[..TOKEN.len() - 1])] {
        let late = h.manager.heartbeat(&id(uuid), heartbeat(wrong)).await;
        assert!(
            matches!(late, Err(ManagerError::Store(StoreError::NotFound { .. }))),
            "{late:?}"
        );
    }
    assert_eq!(
        h.node(uuid).await,
        node,
        "a refused heartbeat changed the node"
    );
}

/// Nobody can heartbeat a node that holds no agent token: not recorded, the lock never taken
/// (an operator's PATCH goes through meanwhile), and the answer is the unknown node's, word
/// for word, so it tells no outsider which node names exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_token_answers_heartbeats_as_unknown() {
    let h = Harness::new().await;
    let unknown = h
        .manager
        .heartbeat(&NodeIdent::Name("no-such-node".into()), heartbeat(None))
        .await
        .expect_err("unknown node");
    for state in [
        ProvisionState::Enroll,
        ProvisionState::Manageable,
        ProvisionState::Available,
        ProvisionState::Active,
    ] {
        let uuid = h.node_in(state).await;
        let mut node = h.node(uuid).await;
        node.name = Some("no-such-node-2".into());
        h.manager.store().update_node(&node).await.expect("named");
        let before = h.node(uuid).await;
        for token in [None, Some(TOKEN), Some("")] {
            let refused = h
                .manager
                .heartbeat(&NodeIdent::Name("no-such-node-2".into()), heartbeat(token))
                .await
                .expect_err("refused");
            assert!(
                matches!(refused, ManagerError::Store(StoreError::NotFound { .. })),
                "{state}: {refused:?}"
            );
            assert_eq!(
                refused
                    .to_string()
                    .replace("no-such-node-2", "no-such-node"),
                unknown.to_string(),
                "{state}: the same words as for an unknown node"
            );
            assert_eq!(h.node(uuid).await, before, "{state}: the node changed");
        }
        h.manager.store().delete_node(uuid).await.expect("deleted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_heartbeat_fails_the_deploy() {
    let h = Harness::new().await;
    let uuid = h.node_in(ProvisionState::WaitCallBack).await;
    h.flow
        .script_heartbeat(Script::Fail("agent: image checksum mismatch"));
    let node = h.heartbeat_ok(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::DeployFailed);
    assert!(node
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains("checksum mismatch")));
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_ramdisk_times_out() {
    let h = Harness::with_config(config(
        Duration::from_millis(400),
        Duration::from_secs(3600),
    ))
    .await;
    let uuid = h.node_in(ProvisionState::Available).await;
    let _stop = h.start_background().await;
    h.request(uuid, ProvisionVerb::Deploy).await;
    let node = h.wait_released_in(uuid, ProvisionState::DeployFailed).await;
    let text = node.last_error.clone().unwrap_or_default();
    assert!(
        text.starts_with(&format!(
            "Timeout reached while waiting for callback for node {uuid}: "
        )) && text.contains("deploy_callback_timeout"),
        "{text}"
    );
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 1);
    assert!(!node.driver_internal_info.contains_key("agent_secret_token"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_needs_one_node_expecting_a_ramdisk() {
    let h = Harness::new().await;
    let a = h.node_in(ProvisionState::WaitCallBack).await;
    let b = h.node_in(ProvisionState::WaitCallBack).await;
    h.add_port(a, "52:54:00:00:00:0a").await;
    h.add_port(b, "52:54:00:00:00:0b").await;
    let found = h
        .manager
        .lookup(
            &["52:54:00:00:00:0a".into(), "52:54:00:00:00:99".into()],
            None,
        )
        .await
        .expect("one node");
    assert_eq!(found.node["uuid"], json!(a));
    assert_eq!(found.config["agent_token"], json!("******"));
    let both = h
        .manager
        .lookup(
            &["52:54:00:00:00:0a".into(), "52:54:00:00:00:0b".into()],
            None,
        )
        .await;
    assert!(matches!(
        both,
        Err(ManagerError::Store(StoreError::NotFound { .. }))
    ));
    let unknown = h.manager.lookup(&["52:54:00:00:00:99".into()], None).await;
    assert!(matches!(
        unknown,
        Err(ManagerError::Store(StoreError::NotFound { .. }))
    ));
    let by_uuid = h.manager.lookup(&[], Some(b)).await.expect("by uuid");
    assert_eq!(by_uuid.node["uuid"], json!(b));
    let active = h.node_in(ProvisionState::Active).await;
    let refused = h.manager.lookup(&[], Some(active)).await;
    assert!(matches!(
        refused,
        Err(ManagerError::Store(StoreError::NotFound { .. }))
    ));
}
