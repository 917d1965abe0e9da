//! The `iscsi_ilo` deploy of a whole-disk image through the real Manager: the iLO emulator
//! process, the built-in object store over TLS, SQLite, the conductor's image cache and
//! initiator, and the agent binary as the iSCSI ramdisk on a `losetup --direct-io=on` disk.
//!
//! The conductor boots the ramdisk with a floppy carrying a one-use deploy key; the agent
//! serves the disk and calls `pass_deploy_info` (through the conductor's API router, `conductor_env`); the
//! conductor checks and burns the key, writes the image from its cache over iSCSI, reads the
//! disk identifier back, sends `done`, and boots the node from disk.

use std::time::Duration;

use serde_json::json;
use vmdeploy_conductor::boot::vmedia;
use vmdeploy_conductor::manager::ManagerError;
use vmdeploy_conductor::objects::ObjectStore as _;
use vmdeploy_conductor::states::ProvisionState;
use vmdeploy_conductor::store::{NodeIdent, PortFilter, Store as _};
use vmdeploy_integration_tests::conductor_env::{
    enroll_iscsi, floppy_params, inserted_floppy, make_image, AgentProcess, IscsiEnv, CONTAINER,
};
use vmdeploy_integration_tests::loopdev::{LoopDevice, LoopIo};
use vmdeploy_shared::api::PassDeployInfo;

/// How long a deploy may take to reach a waiting or final state.
const STEP: Duration = Duration::from_secs(120);
const IMAGE_LEN: usize = 8 << 20;
const DISK_LEN: u64 = 16 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_disk_image_goes_over_iscsi_byte_for_byte_and_the_node_boots_from_disk() {
    // Every field bound for the whole test: the temp dir and the CA must live on.
    let IscsiEnv {
        pki: _pki,
        builtin,
        dir: _dir,
        images,
        iscsi_port,
        done_port,
        conductor,
        api,
        emulator,
        ..
    } = IscsiEnv::start(STEP).await;

    let image = make_image(IMAGE_LEN);
    let disk = LoopDevice::attach(&[0xAA; 4096], DISK_LEN, LoopIo::Direct);
    let (node, media) = enroll_iscsi(&conductor, &emulator, &image, &disk, |_| {}).await;

    let waiting = conductor.deploy(node.uuid, STEP).await;
    assert_eq!(
        waiting.provision_state,
        ProvisionState::WaitCallBack,
        "last_error: {:?}",
        waiting.last_error
    );
    // The floppy carries the iSCSI keys and the key the conductor keeps, and no agent token.
    let floppy = inserted_floppy(&emulator);
    let params = floppy_params(&floppy);
    let key = params
        .get("deployment_key")
        .expect("deployment_key on the floppy")
        .to_owned();
    assert_eq!(key.len(), 32, "{key}");
    assert_eq!(
        waiting.driver_internal_info["deployment_key"].as_str(),
        Some(key.as_str())
    );
    let iqn = format!("iqn-{}", node.uuid);
    assert_eq!(params.get("iscsi_target_iqn"), Some(iqn.as_str()));
    assert_eq!(
        params.get("deployment_id"),
        Some(node.uuid.to_string().as_str())
    );
    assert_eq!(params.get("boot_option"), Some("local"));
    assert_eq!(params.get("ipa-agent-token"), None);
    assert_eq!(emulator.state()["power"], "ON");

    let mut agent = AgentProcess::start_iscsi(media.dir.path(), &floppy, iscsi_port, done_port);
    let node = conductor
        .wait_for(
            node.uuid,
            &[ProvisionState::Active, ProvisionState::DeployFailed],
            STEP,
        )
        .await;
    assert_eq!(
        node.provision_state,
        ProvisionState::Active,
        "last_error: {:?}\nagent log:\n{}",
        node.last_error,
        agent.log()
    );
    assert_eq!(node.last_error, None);
    let written = disk.contents();
    assert!(
        written[..IMAGE_LEN] == image[..],
        "the disk does not hold the image byte for byte"
    );
    assert_eq!(
        node.driver_internal_info["root_uuid_or_disk_id"].as_str(),
        Some("0x12345678"),
        "the disk identifier read back from the written MBR"
    );
    assert!(
        !node.driver_internal_info.contains_key("deployment_key"),
        "the key is burnt"
    );
    assert_eq!(api.accepted_heartbeats(), 1, "one pass_deploy_info taken");
    assert_eq!(api.refused_heartbeats(), 0);
    let state = emulator.state();
    emulator.assert_media_ejected();
    assert_eq!(state["power"], "ON", "{state}");
    assert_eq!(state["persistent_boot"][0], "HDD", "{state}");
    assert!(
        matches!(
            builtin
                .store
                .head(&vmedia::floppy_object(CONTAINER, node.uuid))
                .await,
            Err(vmdeploy_conductor::objects::ObjectError::NotFound(_))
        ),
        "the floppy object is deleted"
    );
    assert_eq!(
        images.total_size(),
        IMAGE_LEN as u64,
        "the image is cached once"
    );
    // The agent got `done`, stopped its target and ended.
    assert_eq!(
        agent.wait_exit(Duration::from_secs(30)),
        Some(0),
        "agent log:\n{}",
        agent.log()
    );
    assert!(
        agent.log().contains("done notification received"),
        "{}",
        agent.log()
    );

    // The key cannot be used again, and an active node takes no call-back.
    let replay = conductor
        .manager
        .pass_deploy_info(
            &NodeIdent::Uuid(node.uuid),
            vmdeploy_shared::api::from_value::<PassDeployInfo>(
                json!({"address": "127.0.0.1", "key": key, "iqn": iqn}),
            )
            .and_then(|info| info.validate())
            .expect("the ramdisk's body is valid"),
        )
        .await;
    assert!(
        matches!(
            replay,
            Err(ManagerError::Store(
                vmdeploy_conductor::store::StoreError::NotFound { .. }
            ))
        ),
        "{replay:?}"
    );
}

/// Faults end in `deploy failed` with a `last_error` naming the cause, media ejected and the
/// floppy deleted: an image larger than the node's disk (seen on the LUN's capacity), and an
/// image whose checksum does not match (caught by the cache, which keeps nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_large_or_corrupt_image_fails_the_deploy_in_its_own_words() {
    // Every field bound for the whole test: the temp dir, the CA and the API must live on.
    let IscsiEnv {
        pki: _pki,
        builtin,
        dir: _dir,
        images,
        iscsi_port,
        done_port,
        conductor,
        api: _api,
        emulator,
        ..
    } = IscsiEnv::start(STEP).await;

    for (case, image_len, disk_len, corrupt, expected) in [
        (
            "too large",
            8 << 20,
            4 << 20,
            false,
            "larger than the node's disk",
        ),
        ("corrupt", 1 << 20, 4 << 20, true, "checksum"),
    ] {
        let image = make_image(image_len);
        let disk = LoopDevice::attach(&[0xAA; 4096], disk_len, LoopIo::Direct);
        let (node, media) = enroll_iscsi(&conductor, &emulator, &image, &disk, |media| {
            if corrupt {
                // The file changes after its checksum was recorded: what reaches the cache is
                // not the image the node asked for.
                let mut bad = image.clone();
                bad[4096] ^= 0xFF;
                std::fs::write(&media.image, &bad).expect("corrupting the image");
            }
        })
        .await;
        let waiting = conductor.deploy(node.uuid, STEP).await;
        assert_eq!(
            waiting.provision_state,
            ProvisionState::WaitCallBack,
            "{case}"
        );
        let floppy = inserted_floppy(&emulator);
        let agent = AgentProcess::start_iscsi(media.dir.path(), &floppy, iscsi_port, done_port);
        let node = conductor
            .wait_for(
                node.uuid,
                &[ProvisionState::Active, ProvisionState::DeployFailed],
                STEP,
            )
            .await;
        assert_eq!(
            node.provision_state,
            ProvisionState::DeployFailed,
            "{case}: agent log:\n{}",
            agent.log()
        );
        let error = node.last_error.clone().unwrap_or_default();
        assert!(error.contains(expected), "{case}: {error}");
        emulator.assert_media_ejected();
        assert_eq!(
            emulator.state()["power"],
            "OFF",
            "{case}: the failed node is off"
        );
        assert!(
            !node.driver_internal_info.contains_key("deployment_key"),
            "{case}: key wiped"
        );
        assert!(
            matches!(
                builtin
                    .store
                    .head(&vmedia::floppy_object(CONTAINER, node.uuid))
                    .await,
                Err(vmdeploy_conductor::objects::ObjectError::NotFound(_))
            ),
            "{case}: the floppy object is deleted"
        );
        drop(agent);
        // The next case enrolls a node with the same MAC.
        let ports = conductor
            .nodes
            .list_ports(&PortFilter {
                node_uuid: Some(node.uuid),
                ..PortFilter::default()
            })
            .await
            .expect("ports");
        for port in ports {
            conductor
                .nodes
                .delete_port(port.uuid)
                .await
                .expect("port deleted");
        }
    }
    assert_eq!(
        images.total_size(),
        8 << 20,
        "only the good (too large) image is cached"
    );
}
