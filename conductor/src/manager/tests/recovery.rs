//! What a restarted conductor does with the nodes its previous run left mid-task.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::harness::*;
use crate::manager::*;
use crate::states::ProvisionState;
use crate::store::sqlite::SqliteStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_fails_interrupted_nodes_and_keeps_waiting_ones() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("vmdeploy.sqlite");
    let (deploying, waiting, verifying, foreign);
    {
        // The "crashed" run: nodes left mid-task with this conductor's reservations.
        let h = Harness::on_store(
            tempfile::tempdir().expect("dir"),
            SqliteStore::open(&path).expect("store"),
            config(Duration::from_secs(1800), Duration::from_secs(3600)),
        )
        .await;
        deploying = h.node_in(ProvisionState::Deploying).await;
        waiting = h.node_in(ProvisionState::WaitCallBack).await;
        verifying = h.node_in(ProvisionState::Verifying).await;
        foreign = h.node_in(ProvisionState::Deploying).await;
        for (uuid, holder) in [
            (deploying, "cond-test:old-task"),
            (waiting, "cond-test:old-task-2"),
            (verifying, "cond-test:old-task-3"),
            (foreign, "cond-test-2:alive"),
        ] {
            h.store.reserve_node(uuid, holder).await.expect("reserve");
        }
    }
    let h = Harness::on_store(
        dir,
        SqliteStore::open(&path).expect("store reopens"),
        config(Duration::from_secs(1800), Duration::from_secs(3600)),
    )
    .await;
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    h.manager
        .start_background(shutdown)
        .await
        .expect("recovery");
    let node = h.node(deploying).await;
    assert_eq!(node.provision_state, ProvisionState::DeployFailed);
    assert_eq!(node.reservation, None);
    assert!(node
        .last_error
        .as_deref()
        .is_some_and(|e| e.starts_with("conductor restarted while the node was deploying;")));
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 1);
    let node = h.node(waiting).await;
    assert_eq!(node.provision_state, ProvisionState::WaitCallBack);
    assert_eq!(node.reservation, None);
    let node = h.node(verifying).await;
    assert_eq!(node.provision_state, ProvisionState::Enroll);
    assert!(node.last_error.is_some());
    let node = h.node(foreign).await;
    assert_eq!(node.provision_state, ProvisionState::Deploying);
    assert_eq!(node.reservation.as_deref(), Some("cond-test-2:alive"));
    // The waiting node's agent resumes it.
    h.manager
        .heartbeat(&id(waiting), heartbeat(Some(TOKEN)))
        .await
        .expect("heartbeat");
    h.settle().await;
    assert_eq!(
        h.node(waiting).await.provision_state,
        ProvisionState::Active
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_fails_an_interrupted_cleaning_and_cleans_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("vmdeploy.sqlite");
    let cleaning;
    {
        let h = Harness::on_store(
            tempfile::tempdir().expect("dir"),
            SqliteStore::open(&path).expect("store"),
            config(Duration::from_secs(1800), Duration::from_secs(3600)),
        )
        .await;
        cleaning = h.node_in(ProvisionState::Cleaning).await;
        h.store
            .reserve_node(cleaning, "cond-test:old-clean")
            .await
            .expect("reserve");
    }
    let h = Harness::on_store(
        dir,
        SqliteStore::open(&path).expect("store reopens"),
        config(Duration::from_secs(1800), Duration::from_secs(3600)),
    )
    .await;
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    h.manager
        .start_background(shutdown)
        .await
        .expect("recovery");
    let node = h.node(cleaning).await;
    assert_eq!(node.provision_state, ProvisionState::CleanFailed);
    assert_eq!(node.reservation, None);
    assert!(node
        .last_error
        .as_deref()
        .is_some_and(|e| e
            .starts_with("conductor restarted while the node was cleaning; manage and provide")));
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 1);
}
