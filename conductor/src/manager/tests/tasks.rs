//! The task runner: one task per node at a time, drain, and a node released whatever way its
//! task ends (failure, panic, a reservation dropped unreleased).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;
use vmdeploy_ilo_emulator::Power as EmuPower;

use super::harness::*;
use crate::manager::*;
use crate::states::ProvisionState;

impl Harness {
    /// A node whose deploy task runs until a permit is added to the returned gate.
    async fn held_deploy(&self) -> (Uuid, Arc<tokio::sync::Semaphore>) {
        let uuid = self.node_in(ProvisionState::Available).await;
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        self.flow.script_deploy(Script::Block(gate.clone()));
        self.request(uuid, ProvisionVerb::Deploy).await;
        (uuid, gate)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_task_is_locked_out_until_the_first_ends() {
    let h = Harness::new().await;
    let (uuid, gate) = h.held_deploy().await;
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::Deploying);
    assert!(node
        .reservation
        .as_deref()
        .is_some_and(|r| r.starts_with("cond-test:")));
    assert!(is_locked(
        &h.manager
            .set_power_state(&id(uuid), NodePower::On, None)
            .await
    ));
    assert!(is_locked(
        &h.manager
            .set_provision_state(&id(uuid), ProvisionVerb::Undeploy, None)
            .await
    ));
    assert!(is_locked(
        &h.manager.set_maintenance(&id(uuid), true, None).await
    ));
    assert!(is_locked(&h.manager.delete_node(&id(uuid)).await));
    gate.add_permits(1);
    h.settle().await;
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::WaitCallBack);
    assert_eq!(node.reservation, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_a_running_task() {
    let h = Harness::new().await;
    let (uuid, gate) = h.held_deploy().await;
    // A short grace ends with the task still running.
    let started = Instant::now();
    h.manager.drain(Duration::from_millis(200)).await;
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(h.manager.running_tasks(), 1);
    let opener = gate.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        opener.add_permits(1);
    });
    let started = Instant::now();
    h.manager.drain(Duration::from_secs(10)).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "drain returned after {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(10),
        "drain hit its grace: {waited:?}"
    );
    assert_eq!(h.manager.running_tasks(), 0);
    assert_eq!(
        h.node(uuid).await.provision_state,
        ProvisionState::WaitCallBack
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_deploy_records_why_cleans_up_powers_off_and_releases() {
    let h = Harness::new().await;
    h.emulator
        .server(0)
        .expect("server")
        .power_on()
        .await
        .expect("on");
    let uuid = h.node_in(ProvisionState::Available).await;
    h.flow
        .script_deploy(Script::Fail("inserting the deploy ISO: not licensed"));
    let node = h.provision(uuid, ProvisionVerb::Deploy).await;
    assert_eq!(node.provision_state, ProvisionState::DeployFailed);
    assert_eq!(node.reservation, None);
    let error = node.last_error.expect("last_error");
    assert!(
        error.contains("not licensed") && error.contains(&uuid.to_string()),
        "{error}"
    );
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 1);
    assert_eq!(h.emulator_power().await, EmuPower::Off);
    assert_eq!(node.power_state, Some(NodePower::Off));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_task_still_releases_and_fails_the_node() {
    let h = Harness::new().await;
    let uuid = h.node_in(ProvisionState::Available).await;
    h.flow.script_deploy(Script::Panic);
    h.request(uuid, ProvisionVerb::Deploy).await;
    let node = h
        .wait_until(uuid, "release after the panic", |n| n.reservation.is_none())
        .await;
    assert_eq!(node.provision_state, ProvisionState::DeployFailed);
    let error = node.last_error.expect("last_error");
    assert!(error.contains("internal error"), "{error}");
    h.settle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_dropped_without_release_is_released() {
    let h = Harness::new().await;
    let uuid = h.node_in(ProvisionState::Available).await;
    // As when a request is cancelled between reserving and spawning its task.
    let (_node, reservation) = tasks::reserve_uuid(&h.manager.core, uuid)
        .await
        .expect("reserved");
    assert!(h.node(uuid).await.reservation.is_some());
    drop(reservation);
    h.wait_until(uuid, "the dropped reservation to be released", |n| {
        n.reservation.is_none()
    })
    .await;
}
