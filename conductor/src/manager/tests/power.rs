//! Power: API power changes, their failures, and the periodic power sync.

use std::time::Duration;

use vmdeploy_ilo_emulator::{FaultKind, FaultSpec, Power as EmuPower};

use super::harness::*;
use crate::manager::*;
use crate::states::ProvisionState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_changes_reach_the_bmc_and_clear_the_target() {
    let h = Harness::new().await;
    let uuid = h.node_in(ProvisionState::Available).await;
    for (target, want_emu, want) in [
        (NodePower::On, EmuPower::On, NodePower::On),
        (NodePower::Rebooting, EmuPower::On, NodePower::On),
        (NodePower::Off, EmuPower::Off, NodePower::Off),
        (NodePower::Rebooting, EmuPower::On, NodePower::On),
        (NodePower::SoftPowerOff, EmuPower::Off, NodePower::Off),
        (NodePower::SoftRebooting, EmuPower::On, NodePower::On),
    ] {
        let boots = h.emulator.state(0).await.expect("state").state.boots;
        // The BMC answers its first call late, so the running task can be seen.
        h.emulator.inject_fault(
            0,
            FaultSpec {
                kind: FaultKind::Delay,
                count: 1,
                seconds: 0.3,
                status: None,
                message: None,
            },
        );
        h.manager
            .set_power_state(&id(uuid), target, None)
            .await
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        assert_eq!(h.node(uuid).await.target_power_state, Some(target));
        h.settle().await;
        let node = h.node(uuid).await;
        assert_eq!(node.target_power_state, None, "{target}");
        assert_eq!(
            node.power_state,
            Some(want),
            "{target}: {:?}",
            node.last_error
        );
        assert_eq!(node.last_error, None);
        assert_eq!(h.emulator_power().await, want_emu, "{target}");
        if target == NodePower::Rebooting {
            let after = h.emulator.state(0).await.expect("state").state.boots;
            assert!(after > boots, "{target} booted the server");
        }
    }
    let refused = h
        .manager
        .set_power_state(&id(uuid), NodePower::Off, Some(Duration::ZERO))
        .await;
    assert!(
        matches!(
            refused,
            Err(ManagerError::InvalidInput {
                field: "timeout",
                ..
            })
        ),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_failure_lands_in_last_error() {
    let h = Harness::new().await;
    let uuid = h.ilo_node(ProvisionState::Available, "wrong").await;
    let node = h.power(uuid, NodePower::On).await;
    assert_eq!(node.target_power_state, None);
    let error = node.last_error.expect("last_error");
    assert!(error.contains("ilo_password"), "{error}");
    assert!(!error.contains("wrong"), "the password leaked: {error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_sync_records_a_change_made_behind_our_back() {
    let h = Harness::with_config(config(
        Duration::from_secs(1800),
        Duration::from_millis(200),
    ))
    .await;
    let uuid = h.node_in(ProvisionState::Available).await;
    h.power(uuid, NodePower::On).await;
    assert_eq!(h.node(uuid).await.power_state, Some(NodePower::On));
    let stop = h.start_background().await;
    h.emulator
        .server(0)
        .expect("server")
        .power_off()
        .await
        .expect("off");
    h.wait_until(uuid, "the sync to see power off", |n| {
        n.power_state == Some(NodePower::Off)
    })
    .await;
    // Recorded, not forced back: later passes leave the server off.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.emulator_power().await, EmuPower::Off);
    stop.send(true).expect("stop");
    // The sync holds each node only for its read.
    h.wait_until(uuid, "the sync to release the node", |n| {
        n.reservation.is_none()
    })
    .await;
}

/// A pass reads `sync_power_state_workers` BMCs at once, never more: with every BMC answer held
/// back 0.3 s, twelve nodes keep one request in flight with one worker and up to four with four
/// (one at a time before the bound existed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_power_sync_pass_reads_as_many_bmcs_at_once_as_it_has_workers() {
    for workers in [1, 4] {
        let mut settings = config(Duration::from_secs(1800), Duration::from_secs(3600));
        settings.sync_power_state_workers = workers;
        let h = Harness::with_config(settings).await;
        for _ in 0..12 {
            h.node_in(ProvisionState::Available).await;
        }
        h.emulator.inject_fault(
            0,
            FaultSpec {
                kind: FaultKind::Delay,
                count: 1000,
                seconds: 0.3,
                status: None,
                message: None,
            },
        );
        h.emulator.requests_at_once().reset();
        let read = crate::manager::sync::sync_once(&h.manager.core).await;
        assert_eq!(read, 12, "every node is due");
        let most = h.emulator.requests_at_once().most();
        if workers == 1 {
            assert_eq!(most, 1, "one worker reads one BMC at a time");
        } else {
            assert!(
                (2..=workers).contains(&most),
                "{workers} workers: {most} requests at once at the busiest"
            );
        }
        for node in h
            .store
            .list_nodes(&Default::default())
            .await
            .expect("listing")
        {
            assert_eq!(node.reservation, None, "the pass released {}", node.uuid);
        }
    }
}

/// A pass reads the BMC without the node's lock: an API verb on the node while its BMC is slow
/// to answer the sync is taken at once, not refused with 409; and a reading taken while that
/// verb's task changed the node is not written over the task's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sync_reads_without_locking_and_yields_to_a_task_that_ran_meanwhile() {
    let h = Harness::new().await;
    let uuid = h.node_in(ProvisionState::Available).await;
    // Recorded off, while the server is on: the sync has a change to record.
    h.manager
        .set_power_state(&id(uuid), NodePower::On, None)
        .await
        .expect("power on");
    h.settle().await;
    let mut node = h.node(uuid).await;
    node.power_state = Some(NodePower::Off);
    h.store.update_node(&node).await.expect("recording off");
    h.emulator.inject_fault(
        0,
        FaultSpec {
            kind: FaultKind::Delay,
            count: 1,
            seconds: 1.0,
            status: None,
            message: None,
        },
    );
    let core = h.manager.core.clone();
    let pass = tokio::spawn(async move { crate::manager::sync::sync_once(&core).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        h.node(uuid).await.reservation,
        None,
        "the BMC read holds no lock"
    );
    // An operator's power on while the sync waits for the BMC: accepted, not 409.
    h.manager
        .set_power_state(&id(uuid), NodePower::On, None)
        .await
        .expect("a verb during the sync's BMC read");
    h.settle().await;
    let after_task = h.node(uuid).await.updated_at;
    assert_eq!(pass.await.expect("the pass"), 1);
    let node = h.node(uuid).await;
    assert_eq!(
        node.power_state,
        Some(NodePower::On),
        "the task's result stands"
    );
    assert_eq!(node.reservation, None);
    // The pass saw "on" against the "off" it listed, but the task had written since: it wrote
    // nothing.
    assert_eq!(
        node.updated_at, after_task,
        "the pass wrote over the task's record"
    );

    // Left alone, a pass records what the BMC says.
    let mut node = h.node(uuid).await;
    node.power_state = Some(NodePower::Off);
    h.store.update_node(&node).await.expect("recording off");
    crate::manager::sync::sync_once(&h.manager.core).await;
    assert_eq!(h.node(uuid).await.power_state, Some(NodePower::On));
}
