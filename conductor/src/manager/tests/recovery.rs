//! What a restarted conductor does with the nodes its previous run left mid-task.

use std::path::Path;
use std::sync::atomic::Ordering;

use uuid::Uuid;

use super::harness::*;
use crate::manager::*;
use crate::states::ProvisionState;

/// Leaves the database at `path` as a crashed run would: a node in each of `nodes`' states,
/// reserved by its holder (this conductor's name or another's). Returns the nodes in order.
async fn crashed_run<const N: usize>(path: &Path, nodes: [(ProvisionState, &str); N]) -> [Uuid; N] {
    let h = Harness::on_database(path).await;
    let mut uuids = Vec::new();
    for (state, holder) in nodes {
        let uuid = h.node_in(state).await;
        h.store.reserve_node(uuid, holder).await.expect("reserve");
        uuids.push(uuid);
    }
    uuids.try_into().expect("one node each")
}

/// The conductor restarted on the database at `path`, its recovery done; the sender keeps its
/// periodic duties running.
async fn restarted(path: &Path) -> (Harness, tokio::sync::watch::Sender<bool>) {
    let h = Harness::on_database(path).await;
    let stop = h.start_background().await;
    (h, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_fails_interrupted_nodes_and_keeps_waiting_ones() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("vmdeploy.sqlite");
    let [deploying, waiting, verifying, foreign] = crashed_run(
        &path,
        [
            (ProvisionState::Deploying, "cond-test:old-task"),
            (ProvisionState::WaitCallBack, "cond-test:old-task-2"),
            (ProvisionState::Verifying, "cond-test:old-task-3"),
            (ProvisionState::Deploying, "cond-test-2:alive"),
        ],
    )
    .await;
    let (h, _stop) = restarted(&path).await;
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
    assert_eq!(
        h.heartbeat_ok(waiting).await.provision_state,
        ProvisionState::Active
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_fails_an_interrupted_cleaning_and_cleans_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("vmdeploy.sqlite");
    let [cleaning] = crashed_run(&path, [(ProvisionState::Cleaning, "cond-test:old-clean")]).await;
    let (h, _stop) = restarted(&path).await;
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
