//! Automated cleaning: undeploy and provide through clean wait, clean failures and abort.

use std::sync::atomic::Ordering;
use std::time::Duration;

use vmdeploy_ilo_emulator::Power as EmuPower;

use super::harness::*;
use crate::manager::*;
use crate::states::ProvisionState;

/// A manager with `automated_clean` on (and `timeout` as the callback timeout).
async fn cleaning_harness(timeout: Duration) -> Harness {
    let mut c = config(timeout, Duration::from_secs(3600));
    c.automated_clean = true;
    Harness::with_config(c).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeploy_with_automated_clean_waits_for_the_agent_then_is_available() {
    let h = cleaning_harness(Duration::from_secs(1800)).await;
    let uuid = h.node_in(ProvisionState::Active).await;
    let node = h.provision(uuid, ProvisionVerb::Undeploy).await;
    assert_eq!(node.provision_state, ProvisionState::CleanWait);
    assert_eq!(node.target_provision_state, Some(ProvisionState::Available));
    assert_eq!(node.reservation, None);
    assert_eq!(h.flow.tear_downs.load(Ordering::SeqCst), 1);
    assert_eq!(h.flow.cleanings.load(Ordering::SeqCst), 1);
    // A heartbeat with a wrong token is refused in clean wait too.
    assert!(matches!(
        h.manager
            .heartbeat(&id(uuid), heartbeat(Some("not-the-token")))
            .await,
        Err(ManagerError::CallbackRefused { .. })
    ));
    let node = h.heartbeat_ok(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::Available);
    assert_eq!(node.target_provision_state, None);
    assert_eq!(node.last_error, None);
    assert_eq!(h.flow.clean_steps_run.load(Ordering::SeqCst), 1);
    assert!(!node.driver_internal_info.contains_key("agent_secret_token"));
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_automated_clean_undeploy_and_provide_end_available_at_once() {
    let h = Harness::new().await;
    let active = h.node_in(ProvisionState::Active).await;
    let manageable = h.node_in(ProvisionState::Manageable).await;
    h.request(active, ProvisionVerb::Undeploy).await;
    h.provision(manageable, ProvisionVerb::Provide).await;
    for uuid in [active, manageable] {
        assert_eq!(
            h.node(uuid).await.provision_state,
            ProvisionState::Available
        );
    }
    assert_eq!(h.flow.cleanings.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_clean_step_ends_clean_failed_and_manage_provide_cleans_again() {
    let h = cleaning_harness(Duration::from_secs(1800)).await;
    let uuid = h.node_in(ProvisionState::Manageable).await;
    h.power(uuid, NodePower::On).await;
    assert_eq!(h.emulator_power().await, EmuPower::On);
    assert_eq!(
        h.provision(uuid, ProvisionVerb::Provide)
            .await
            .provision_state,
        ProvisionState::CleanWait
    );
    h.flow
        .clean_heartbeats
        .lock()
        .expect("lock")
        .push_back(Script::Fail(
            "clean step erase_devices_metadata failed on the node: disk gone (CleaningError)",
        ));
    let node = h.heartbeat_ok(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::CleanFailed);
    assert_eq!(node.target_provision_state, None);
    let error = node.last_error.clone().unwrap_or_default();
    assert!(
        error.starts_with(&format!("Cleaning of node {uuid} failed: clean step"))
            && error.contains("disk gone")
            && error.contains("manage and provide"),
        "{error}"
    );
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 1);
    assert_eq!(h.emulator_power().await, EmuPower::Off, "powered off");
    assert!(!node.driver_internal_info.contains_key("agent_secret_token"));
    // Ironic's way back: clean failed -manage-> manageable -provide-> cleaning.
    assert!(matches!(
        h.manager
            .set_provision_state(&id(uuid), ProvisionVerb::Provide, None)
            .await,
        Err(ManagerError::InvalidState { .. })
    ));
    assert_eq!(
        h.provision(uuid, ProvisionVerb::Manage)
            .await
            .provision_state,
        ProvisionState::Manageable
    );
    assert_eq!(
        h.provision(uuid, ProvisionVerb::Provide)
            .await
            .provision_state,
        ProvisionState::CleanWait
    );
    assert_eq!(h.flow.cleanings.load(Ordering::SeqCst), 2);
    let node = h.heartbeat_ok(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::Available);
    assert_eq!(node.last_error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ramdisk_that_cannot_boot_or_never_calls_fails_the_cleaning() {
    let h = cleaning_harness(Duration::from_millis(400)).await;
    let _stop = h.start_background().await;
    // The ramdisk cannot be booted (virtual media refused, say).
    let refused = h.node_in(ProvisionState::Manageable).await;
    h.flow
        .clean_prepares
        .lock()
        .expect("lock")
        .push_back(Script::Fail("inserting the virtual CD failed"));
    h.request(refused, ProvisionVerb::Provide).await;
    let node = h
        .wait_released_in(refused, ProvisionState::CleanFailed)
        .await;
    let error = node.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("booting the agent ramdisk") && error.contains("virtual CD"),
        "{error}"
    );
    // The ramdisk boots but never heartbeats.
    let silent = h.node_in(ProvisionState::Manageable).await;
    h.request(silent, ProvisionVerb::Provide).await;
    let node = h
        .wait_released_in(silent, ProvisionState::CleanFailed)
        .await;
    let error = node.last_error.clone().unwrap_or_default();
    assert!(
        error.starts_with(&format!(
            "Timeout reached while waiting for callback for node {silent} in clean wait: "
        )) && error.contains("manage and provide"),
        "{error}"
    );
    assert!(!node.driver_internal_info.contains_key("agent_secret_token"));
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_in_clean_wait_cleans_up() {
    let h = cleaning_harness(Duration::from_secs(1800)).await;
    let uuid = h.node_in(ProvisionState::Manageable).await;
    h.provision(uuid, ProvisionVerb::Provide).await;
    let node = h.provision(uuid, ProvisionVerb::Abort).await;
    assert_eq!(node.provision_state, ProvisionState::CleanFailed);
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 1);
}
