//! Node management: delete, maintenance, validate and the boot device.

use super::harness::*;
use crate::manager::*;
use crate::states::ProvisionState;
use crate::store::StoreError;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_maintenance_pass_deploy_info_validate_and_boot_device() {
    let h = Harness::new().await;
    let active = h.node_in(ProvisionState::Active).await;
    let refused = h.manager.delete_node(&id(active)).await;
    assert!(
        matches!(refused, Err(ManagerError::StateConflict { .. })),
        "{refused:?}"
    );
    h.manager
        .set_maintenance(&id(active), true, Some("disk swap".into()))
        .await
        .expect("maintenance on");
    let node = h.node(active).await;
    assert!(node.maintenance);
    assert_eq!(node.maintenance_reason.as_deref(), Some("disk swap"));
    let refused = h
        .manager
        .set_provision_state(&id(active), ProvisionVerb::Rebuild, None)
        .await;
    assert!(
        matches!(refused, Err(ManagerError::InMaintenance { .. })),
        "{refused:?}"
    );
    h.manager
        .set_maintenance(&id(active), false, None)
        .await
        .expect("maintenance off");
    assert_eq!(h.node(active).await.maintenance_reason, None);

    let available = h.node_in(ProvisionState::Available).await;
    let port = h.add_port(available, "52:54:00:00:00:01").await;
    let report = pass_deploy_info_body("0123456789abcdef", "");
    let refused = h
        .manager
        .pass_deploy_info(&id(available), report.clone())
        .await;
    // Neither holds a deploy key (not waiting; an agent driver's node never gets one): both
    // answered as unknown nodes.
    assert!(
        matches!(
            refused,
            Err(ManagerError::Store(StoreError::NotFound { .. }))
        ),
        "{refused:?}"
    );
    let waiting = h.node_in(ProvisionState::WaitCallBack).await;
    let refused = h.manager.pass_deploy_info(&id(waiting), report).await;
    assert!(
        matches!(
            refused,
            Err(ManagerError::Store(StoreError::NotFound { .. }))
        ),
        "{refused:?}"
    );

    let lines = h.manager.validate(&id(available)).await.expect("validate");
    assert_eq!(lines["power"].result, Some(true), "{:?}", lines["power"]);
    assert_eq!(
        lines["management"].result,
        Some(true),
        "{:?}",
        lines["management"]
    );
    assert_eq!(lines["deploy"].result, Some(true));
    assert_eq!(lines["console"].result, None);
    // A Standard licence fails the readiness checks: management says which, power does not.
    h.emulator
        .server(0)
        .expect("server 0")
        .update(|s| s.license = vmdeploy_ilo_emulator::License::Standard)
        .await;
    let lines = h.manager.validate(&id(available)).await.expect("validate");
    assert_eq!(lines["power"].result, Some(true), "{:?}", lines["power"]);
    assert_eq!(lines["management"].result, Some(false));
    let reason = lines["management"].reason.clone().unwrap_or_default();
    assert!(
        reason.contains("readiness check licence failed") && reason.contains("Advanced"),
        "{reason}"
    );
    // A network-booted node on the same iLO needs no virtual media licence.
    let netboot = h
        .create_node(
            "pxe_ilo",
            ProvisionState::Available,
            h.driver_info("password"),
        )
        .await;
    let lines = h.manager.validate(&id(netboot)).await.expect("validate");
    assert_eq!(
        lines["management"].result,
        Some(true),
        "{:?}",
        lines["management"]
    );
    h.emulator
        .server(0)
        .expect("server 0")
        .update(|s| s.license = vmdeploy_ilo_emulator::License::Advanced)
        .await;
    *h.flow.validate_error.lock().expect("lock") = Some("virtual media not licensed".into());
    let lines = h.manager.validate(&id(available)).await.expect("validate");
    assert_eq!(lines["boot"].result, Some(false));
    assert!(lines["boot"]
        .reason
        .as_deref()
        .is_some_and(|r| r.contains("not licensed")));

    h.manager
        .set_boot_device(&id(available), "pxe", true)
        .await
        .expect("set pxe");
    let reading = h.manager.boot_device(&id(available)).await.expect("read");
    assert_eq!(reading.boot_device.as_deref(), Some("pxe"));
    assert_eq!(reading.persistent, Some(true));
    h.manager
        .set_boot_device(&id(available), "cdrom", false)
        .await
        .expect("set cdrom once");
    let reading = h.manager.boot_device(&id(available)).await.expect("read");
    assert_eq!(reading.boot_device.as_deref(), Some("cdrom"));
    assert_eq!(reading.persistent, Some(false));
    let refused = h
        .manager
        .set_boot_device(&id(available), "safe", false)
        .await;
    assert!(
        matches!(
            refused,
            Err(ManagerError::InvalidInput {
                field: "boot_device",
                ..
            })
        ),
        "{refused:?}"
    );

    h.manager.delete_node(&id(available)).await.expect("delete");
    assert!(h.store.node(&id(available)).await.is_err());
    assert!(
        h.store.port(port).await.is_err(),
        "the port went with its node"
    );
}
