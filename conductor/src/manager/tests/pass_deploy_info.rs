//! The iSCSI ramdisk's `pass_deploy_info` call: state, driver and deploy-key checks (the API
//! checks the body before the manager sees it).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::json;
use uuid::Uuid;

use super::harness::*;
use crate::manager::*;
use crate::states::ProvisionState;
use crate::store::{NodeIdent, StoreError};

const DEPLOY_KEY: &str = "0123456789abcdef0123456789abcdef";

impl Harness {
    /// A node of an iSCSI flow waiting for its ramdisk, holding its deploy key.
    async fn iscsi_waiting(&self) -> Uuid {
        self.flow.iscsi.store(true, Ordering::SeqCst);
        let uuid = self.node_in(ProvisionState::WaitCallBack).await;
        let mut node = self.node(uuid).await;
        node.driver_internal_info
            .insert("deployment_key".into(), json!(DEPLOY_KEY));
        self.store.update_node(&node).await.expect("update node");
        uuid
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_deploy_info_checks_state_driver_and_key_then_burns_the_key() {
    let h = Harness::new().await;
    let uuid = h.iscsi_waiting().await;
    let waiting = h.node(uuid).await;

    let reply = h
        .manager
        .pass_deploy_info(
            &id(uuid),
            pass_deploy_info_body("wrong-key-of-the-same-length-xxx", ""),
        )
        .await;
    assert!(
        matches!(reply, Err(ManagerError::CallbackRefused { .. })),
        "wrong key: {reply:?}"
    );
    h.flow.iscsi.store(false, Ordering::SeqCst);
    let reply = h
        .manager
        .pass_deploy_info(&id(uuid), pass_deploy_info_body(DEPLOY_KEY, ""))
        .await;
    assert!(
        matches!(&reply, Err(ManagerError::Unsupported { message, .. }) if message.contains("heartbeats")),
        "an agent driver: {reply:?}"
    );
    assert_eq!(
        h.node(uuid).await,
        waiting,
        "a refused call changed the node"
    );
    assert!(h
        .flow
        .seen_pass_deploy_info
        .lock()
        .expect("lock")
        .is_empty());

    // The right key: accepted, burnt at once; a replay while the write runs is refused.
    h.flow.iscsi.store(true, Ordering::SeqCst);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    h.flow.script_pass_deploy_info(Script::Block(gate.clone()));
    h.manager
        .pass_deploy_info(&id(uuid), pass_deploy_info_body(DEPLOY_KEY, ""))
        .await
        .expect("the right key is accepted");
    let node = h.node(uuid).await;
    assert!(
        !node.driver_internal_info.contains_key("deployment_key"),
        "key burnt"
    );
    let replay = h
        .manager
        .pass_deploy_info(&id(uuid), pass_deploy_info_body(DEPLOY_KEY, ""))
        .await;
    // The key is burnt: the replay is answered as for an unknown node.
    assert!(
        matches!(
            replay,
            Err(ManagerError::Store(StoreError::NotFound { .. }))
        ),
        "replay: {replay:?}"
    );
    gate.add_permits(1);
    h.settle().await;
    assert_eq!(
        *h.flow.seen_pass_deploy_info.lock().expect("lock"),
        vec![(
            "10.0.2.15".to_string(),
            "iqn-5b8f6a52-2a0e-4c4e-9d42-8c1f0b7e9a31".to_string()
        )]
    );
    // The scripted flow said Wait: the node still waits, unreserved.
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::WaitCallBack);
    assert_eq!(node.reservation, None);

    // A node that holds no key (not waiting): the same 404 as a node that does not exist,
    // whatever the key, so the answer tells nothing about which nodes exist.
    let active = h.node_in(ProvisionState::Active).await;
    let reply = h
        .manager
        .pass_deploy_info(&id(active), pass_deploy_info_body(DEPLOY_KEY, ""))
        .await;
    let unknown = h
        .manager
        .pass_deploy_info(
            &NodeIdent::Uuid(uuid::Uuid::new_v4()),
            pass_deploy_info_body(DEPLOY_KEY, ""),
        )
        .await;
    assert!(
        matches!(reply, Err(ManagerError::Store(StoreError::NotFound { .. })))
            && matches!(
                unknown,
                Err(ManagerError::Store(StoreError::NotFound { .. }))
            ),
        "{reply:?} / {unknown:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_deploy_info_done_makes_the_node_active_and_wipes_its_secrets() {
    let h = Harness::new().await;
    let uuid = h.iscsi_waiting().await;
    h.manager
        .pass_deploy_info(&id(uuid), pass_deploy_info_body(DEPLOY_KEY, ""))
        .await
        .expect("accepted");
    h.settle().await;
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::Active);
    assert_eq!(node.last_error, None);
    assert_eq!(node.reservation, None);
    for key in ["deployment_key", "agent_secret_token"] {
        assert!(!node.driver_internal_info.contains_key(key), "{key} left");
    }
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_from_the_ramdisk_or_the_write_fails_the_deploy_with_its_text() {
    let h = Harness::new().await;
    let reported = h.iscsi_waiting().await;
    let body = pass_deploy_info_body(DEPLOY_KEY, "no disk found");
    h.manager
        .pass_deploy_info(&id(reported), body)
        .await
        .expect("the report is taken");
    h.settle().await;
    let node = h.node(reported).await;
    assert_eq!(node.provision_state, ProvisionState::DeployFailed);
    let error = node.last_error.clone().unwrap_or_default();
    assert!(error.contains("no disk found"), "{error}");
    assert!(!node.driver_internal_info.contains_key("deployment_key"));
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 1);
    assert!(
        h.flow
            .seen_pass_deploy_info
            .lock()
            .expect("lock")
            .is_empty(),
        "the flow never ran for a ramdisk that reported an error"
    );

    let failed_write = h.iscsi_waiting().await;
    h.flow
        .script_pass_deploy_info(Script::Fail("the iSCSI target went away mid-write"));
    h.manager
        .pass_deploy_info(&id(failed_write), pass_deploy_info_body(DEPLOY_KEY, ""))
        .await
        .expect("accepted");
    h.settle().await;
    let node = h.node(failed_write).await;
    assert_eq!(node.provision_state, ProvisionState::DeployFailed);
    let error = node.last_error.clone().unwrap_or_default();
    assert!(error.contains("went away mid-write"), "{error}");
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 2);
}
