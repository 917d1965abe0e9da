//! The conductor's `agent_ilo` deploy against the iLO emulator process, with real parts only:
//! the built-in object store over TLS (or the real Swift), SQLite, the agent binary writing to a
//! `losetup --direct-io=on` loop device, and the real Manager driving the whole deploy
//! (`set_provision_state(Deploy)` → `wait call-back` → the agent's heartbeats → `active`).
//!
//! The first tests call the flow (`AgentDeploy`) directly: the virtual-media boot (floppy and
//! deploy ISO inserted, boot once from CD, boot mode, power on), its clean-up, validation
//! refusing an unlicensed iLO before anything is powered off, the tear-down. The last two run
//! the whole deploy through the Manager, once with each object store.
//!
//! The agent calls the conductor's real API router; it and the rest of the set-up live in
//! `vmdeploy_integration_tests::conductor_env`, shared with `conductor_faults.rs`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use time::OffsetDateTime;
use vmdeploy_conductor::boot::vmedia;
use vmdeploy_conductor::deploy::agent::AgentDeploy;
use vmdeploy_conductor::deploy::{DeployContext, DeployInterface, DeployStep};
use vmdeploy_conductor::objects::swift::{SwiftAuth, SwiftConfig, SwiftStore};
use vmdeploy_conductor::objects::{ObjectError, ObjectPath, ObjectStore};
use vmdeploy_conductor::states::ProvisionState;
use vmdeploy_conductor::store::sqlite::SqliteStore;
use vmdeploy_conductor::store::{Node, NodeIdent, Store};
use vmdeploy_integration_tests::conductor_env::{
    api_settings, deploy_config, enroll, fetch_media, floppy_params, inserted_floppy, make_image,
    AgentProcess, Api, Builtin, Conductor, Emulator, Media, CONTAINER, FLOPPY_TTL, MAC,
};
use vmdeploy_integration_tests::http::TestPki;
use vmdeploy_integration_tests::loopdev::{require_loop_devices, LoopDevice, LoopIo};
use vmdeploy_integration_tests::swift::{SwiftPeer, KEY, USER};
use vmdeploy_shared::secret::Secret;

/// The node as stored.
async fn stored(store: &SqliteStore, uuid: uuid::Uuid) -> Node {
    store
        .node(&NodeIdent::Uuid(uuid))
        .await
        .expect("the node is stored")
}

/// Whether `path` is in `objects` (a head answers).
async fn exists(objects: &dyn ObjectStore, path: &ObjectPath) -> bool {
    match objects.head(path).await {
        Ok(_) => true,
        Err(ObjectError::NotFound(_)) => false,
        Err(e) => panic!("head {path}: {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The flow on its own.

struct Rig {
    emulator: Emulator,
    builtin: Builtin,
    pki: TestPki,
    nodes: Arc<SqliteStore>,
    deploy: AgentDeploy,
    node: Node,
    media: Media,
    _db: tempfile::TempDir,
}

/// A node in `deploying` on a fresh emulator, with a conductor-local deploy ISO and instance
/// image, one PXE-enabled port, the given `properties`, and the built-in store over TLS.
async fn rig(emulator_args: &[&str], api_url: &str, image: &[u8], properties: Value) -> Rig {
    let db = tempfile::tempdir().expect("temp dir");
    let nodes = SqliteStore::open(&db.path().join("vmdeploy.sqlite")).expect("opening SQLite");
    let emulator = Emulator::start(emulator_args);
    let pki = TestPki::new();
    let builtin = Builtin::start(&pki).await;
    let media = Media::new(image);
    let node = enroll(
        &nodes,
        ProvisionState::Deploying,
        emulator.driver_info(),
        &media,
        image,
        properties,
    )
    .await;
    let ctx = Arc::new(DeployContext {
        store: Arc::clone(&nodes) as Arc<dyn Store>,
        objects: builtin.objects(),
        config: deploy_config(api_url.into(), Some(pki.ca_pem.clone())),
        images: None,
        boot_isos: None,
        netboot: None,
    });
    let deploy = AgentDeploy::new(ctx).with_agent_power_off_wait(Duration::from_secs(2));
    Rig {
        emulator,
        builtin,
        pki,
        nodes,
        deploy,
        node,
        media,
        _db: db,
    }
}

impl Rig {
    async fn has(&self, path: &ObjectPath) -> bool {
        exists(self.builtin.store.as_ref(), path).await
    }
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_boots_the_ramdisk_from_virtual_media_and_clean_up_undoes_it() {
    let mut rig = rig(
        &[],
        "https://192.0.2.1:6385/",
        &[7u8; 4096],
        json!({"capabilities": "boot_mode:uefi", "root_device": {"serial": "S123"}}),
    )
    .await;
    rig.emulator.power_on().await;
    let step = rig
        .deploy
        .deploy(&mut rig.node)
        .await
        .expect("deploy starts");
    assert_eq!(step, DeployStep::Wait);

    let state = rig.emulator.state();
    assert_eq!(state["power"], "ON", "{state}");
    assert_eq!(state["boot_mode"]["current"], "UEFI", "{state}");
    assert_eq!(state["last_boot"]["device"], "CDROM", "{state}");
    assert_eq!(state["last_boot"]["reason"], "one_time", "{state}");
    assert!(state["last_boot"]["media_read_error"].is_null(), "{state}");
    let floppy = &state["vmedia"]["FLOPPY"];
    let cdrom = &state["vmedia"]["CDROM"];
    assert_eq!(floppy["inserted"], true, "{state}");
    assert_eq!(cdrom["inserted"], true, "{state}");
    assert_eq!(cdrom["image_size"], 64 * 1024, "{state}");

    // The emulator read both media from the built-in store over TLS (it probes the first
    // sectors by range at insert, verification off as iLO's), the ISO uploaded from the file.
    let floppy_object = vmedia::floppy_object(CONTAINER, rig.node.uuid);
    let public = rig.builtin.store.public_url().to_owned();
    assert!(public.starts_with("https://"), "{public}");
    let url = floppy["url"].as_str().expect("floppy URL").to_owned();
    assert!(
        url.starts_with(&format!("{public}/")) && url.contains(&floppy_object.to_string()),
        "{url}"
    );
    let cdrom_url = cdrom["url"].as_str().expect("ISO URL");
    assert!(
        cdrom_url.starts_with(&format!("{public}/")) && cdrom_url.contains("/file-"),
        "the deploy ISO comes from the store: {cdrom_url}"
    );
    let floppy_bytes = fetch_media(&url).expect("the floppy's temp URL answers");
    assert_eq!(floppy["image_size"], floppy_bytes.len(), "{state}");
    let info = rig
        .builtin
        .store
        .head(&floppy_object)
        .await
        .expect("the floppy is stored");
    let deadline = OffsetDateTime::now_utc() + FLOPPY_TTL;
    let delete_at = info.delete_at.expect("the floppy expires");
    assert!(
        (deadline - delete_at).abs() < time::Duration::seconds(30),
        "deleted after deploy_helper_images_ttl: {delete_at} vs {deadline}"
    );

    // What the emulator was given is the node's floppy, with the node's values.
    let params = floppy_params(&floppy_bytes);
    let stored = stored(&rig.nodes, rig.node.uuid).await;
    let token = stored.driver_internal_info["agent_secret_token"]
        .as_str()
        .expect("the token is stored before the node boots");
    assert!(token.len() >= 43, "a token of at least 256 bits");
    assert_eq!(params.get("ipa-agent-token"), Some(token));
    assert_eq!(params.get("ipa-api-url"), Some("https://192.0.2.1:6385"));
    assert_eq!(params.get("BOOTIF"), Some(MAC));
    assert_eq!(params.get("root_device"), Some("serial=s123"));
    assert_eq!(params.get("vmdeploy-ip"), Some("192.0.2.10/24"));
    assert_eq!(params.get("vmdeploy-gateway"), Some("192.0.2.1"));
    assert_eq!(params.get("vmdeploy-dns"), Some("192.0.2.53"));
    let agent = vmdeploy_shared::params::AgentParams::from_params(&params).expect("agent view");
    assert_eq!(
        agent.common.agent_ca_pem.as_deref(),
        Some(rig.pki.ca_pem.as_bytes())
    );

    rig.deploy.clean_up(&mut rig.node).await;
    let state = rig.emulator.state();
    assert_eq!(state["vmedia"]["FLOPPY"]["inserted"], false, "{state}");
    assert_eq!(state["vmedia"]["CDROM"]["inserted"], false, "{state}");
    assert_eq!(state["power"], "OFF", "{state}");
    assert!(!rig.has(&floppy_object).await, "floppy object deleted");
    assert!(!rig
        .node
        .driver_internal_info
        .contains_key("agent_secret_token"));
    assert_eq!(
        fetch_media(&url),
        None,
        "the floppy URL no longer serves it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlicensed_ilo_is_refused_before_anything_is_powered_off() {
    let mut rig = rig(
        &["--license", "standard"],
        "http://127.0.0.1:6385",
        &[1u8; 512],
        json!({}),
    )
    .await;
    rig.emulator.power_on().await;
    let err = rig
        .deploy
        .validate(&rig.node)
        .await
        .expect_err("standard licence");
    assert!(format!("{err:#}").contains("Advanced licence"), "{err:#}");
    let err = rig
        .deploy
        .deploy(&mut rig.node)
        .await
        .expect_err("standard licence");
    assert!(format!("{err:#}").contains("Advanced licence"), "{err:#}");
    let state = rig.emulator.state();
    assert_eq!(state["power"], "ON", "nothing was powered off: {state}");
    assert_eq!(state["vmedia"]["FLOPPY"]["inserted"], false, "{state}");
    assert!(
        !rig.has(&vmedia::floppy_object(CONTAINER, rig.node.uuid))
            .await,
        "no floppy stored"
    );
    assert!(stored(&rig.nodes, rig.node.uuid)
        .await
        .driver_internal_info
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tear_down_powers_off_ejects_and_forgets_the_agent() {
    let mut rig = rig(&[], "http://127.0.0.1:6385", &[3u8; 1024], json!({})).await;
    assert_eq!(
        rig.deploy
            .deploy(&mut rig.node)
            .await
            .expect("deploy starts"),
        DeployStep::Wait
    );
    assert_eq!(rig.emulator.state()["power"], "ON");
    // As a heartbeat would have left it.
    rig.node
        .driver_internal_info
        .insert("agent_url".into(), json!("https://127.0.0.1:9999"));
    rig.node
        .driver_internal_info
        .insert("agent_verify_ca".into(), json!(rig.pki.ca_pem));
    rig.deploy
        .tear_down(&mut rig.node)
        .await
        .expect("tear down");
    let state = rig.emulator.state();
    assert_eq!(state["power"], "OFF", "{state}");
    assert_eq!(state["vmedia"]["FLOPPY"]["inserted"], false, "{state}");
    assert_eq!(state["vmedia"]["CDROM"]["inserted"], false, "{state}");
    assert!(
        !rig.has(&vmedia::floppy_object(CONTAINER, rig.node.uuid))
            .await
    );
    for gone in ["agent_secret_token", "agent_url", "agent_verify_ca"] {
        assert!(
            !rig.node.driver_internal_info.contains_key(gone),
            "{gone} forgotten"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_names_the_field_of_a_missing_deploy_iso_or_image() {
    let mut rig = rig(&[], "http://127.0.0.1:6385", &[1u8; 512], json!({})).await;
    rig.node
        .driver_info
        .insert("ilo_deploy_iso".into(), json!("swift://isos/missing.iso"));
    let err = rig
        .deploy
        .validate(&rig.node)
        .await
        .expect_err("no such object");
    assert!(
        format!("{err:#}").contains("driver_info.ilo_deploy_iso"),
        "{err:#}"
    );
    rig.node.driver_info.insert(
        "ilo_deploy_iso".into(),
        json!(format!("file://{}", rig.media.iso.display())),
    );
    rig.deploy.validate(&rig.node).await.expect("valid again");
    rig.node.instance_info.remove("image_os_hash_value");
    let err = rig
        .deploy
        .validate(&rig.node)
        .await
        .expect_err("no checksum");
    assert!(
        format!("{err:#}").contains("image_os_hash_value"),
        "{err:#}"
    );
    rig.node
        .driver_info
        .insert("ilo_password".into(), json!("wrong"));
    rig.node
        .instance_info
        .insert("image_os_hash_value".into(), json!("0".repeat(64)));
    let err = rig
        .deploy
        .validate(&rig.node)
        .await
        .expect_err("bad credentials");
    assert!(
        format!("{err:#}").to_lowercase().contains("login"),
        "{err:#}"
    );
    assert_eq!(rig.emulator.state()["power"], "OFF");
}

// ---------------------------------------------------------------------------------------------
// The whole deploy, through the Manager and the agent binary.

/// Deploys an image through the Manager with `objects` as the object store (`ca_pem`: the
/// conductor's CA, which signs the built-in store's certificate) and checks the disk, the
/// floppy the emulator fetched, the node, the media and the objects afterwards.
async fn deploy_through_the_manager(objects: Arc<dyn ObjectStore>, ca_pem: Option<String>) {
    require_loop_devices();
    const DISK_LEN: u64 = 32 * 1024 * 1024;
    let image = make_image(6 * 1024 * 1024 + 4096);
    let disk = LoopDevice::attach(&vec![0xAA; DISK_LEN as usize], DISK_LEN, LoopIo::Direct);
    let disk_name = disk.device().display().to_string();
    let emulator = Emulator::start(&[]);
    let media = Media::new(&image);
    let db = tempfile::tempdir().expect("temp dir");
    let (listener, settings) = api_settings(ca_pem.clone(), Duration::from_secs(120)).await;
    let conductor = Conductor::builder(
        &db.path().join("vmdeploy.sqlite"),
        Arc::clone(&objects),
        &settings,
    )
    .start()
    .await;
    let api = Api::serve(listener, Arc::clone(&conductor.manager));
    let node = enroll(
        &conductor.nodes,
        ProvisionState::Available,
        emulator.driver_info(),
        &media,
        &image,
        json!({"root_device": {"name": disk_name}}),
    )
    .await;
    let uuid = node.uuid;
    let floppy_object = vmedia::floppy_object(CONTAINER, uuid);

    let waiting = conductor.deploy(uuid, Duration::from_secs(60)).await;
    assert_eq!(
        waiting.provision_state,
        ProvisionState::WaitCallBack,
        "{:?}",
        waiting.last_error
    );
    assert!(exists(objects.as_ref(), &floppy_object).await);

    // The node "boots": the agent reads the floppy the emulator fetched.
    let state = emulator.state();
    assert_eq!(state["power"], "ON", "{state}");
    assert_eq!(state["last_boot"]["device"], "CDROM", "{state}");
    assert_eq!(state["vmedia"]["CDROM"]["image_size"], 64 * 1024, "{state}");
    let floppy = inserted_floppy(&emulator);
    assert_eq!(
        state["vmedia"]["FLOPPY"]["image_size"],
        floppy.len(),
        "{state}"
    );
    let params = floppy_params(&floppy);
    let token = waiting.driver_internal_info["agent_secret_token"]
        .as_str()
        .expect("the token is stored before the node boots");
    assert_eq!(params.get("ipa-agent-token"), Some(token));
    assert_eq!(params.get("ipa-api-url"), Some(settings.api_url.as_str()));
    assert_eq!(params.get("ipa-driver-name"), Some("agent_ilo"));
    assert_eq!(params.get("BOOTIF"), Some(MAC));
    assert_eq!(
        params.get("root_device"),
        Some(format!("name={disk_name}").as_str())
    );
    assert_eq!(params.get("vmdeploy-ip"), Some("192.0.2.10/24"));
    let agent_view =
        vmdeploy_shared::params::AgentParams::from_params(&params).expect("agent view");
    assert_eq!(
        agent_view.common.agent_ca_pem.as_deref(),
        ca_pem.as_deref().map(str::as_bytes)
    );
    let mut agent = AgentProcess::start(media.dir.path(), &floppy);

    let node = conductor
        .wait_for(
            uuid,
            &[ProvisionState::Active, ProvisionState::DeployFailed],
            Duration::from_secs(120),
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
    assert_eq!(
        api.refused_heartbeats(),
        0,
        "the floppy's token was accepted"
    );
    assert!(
        api.accepted_heartbeats() >= 2,
        "prepare_image on the first heartbeat, done on a later one"
    );

    // The disk holds the image, the node boots from it, and nothing of the deploy is left.
    let written = disk.contents();
    assert_eq!(
        &written[..image.len()],
        &image[..],
        "the image is on the disk"
    );
    let info = &node.driver_internal_info;
    assert!(info.contains_key("partition_uuids"), "{info:?}");
    for gone in ["agent_secret_token", "agent_url", "agent_verify_ca"] {
        assert!(!info.contains_key(gone), "{gone} wiped: {info:?}");
    }
    let progress = &info["deploy_progress"];
    assert_eq!(progress["written"], image.len(), "{progress}");
    assert_eq!(progress["total"], image.len(), "{progress}");
    assert!(
        progress["rate"].as_u64().is_some_and(|r| r > 0),
        "{progress}"
    );
    let state = emulator.state();
    assert_eq!(state["power"], "ON", "{state}");
    assert_eq!(state["persistent_boot"][0], "HDD", "{state}");
    emulator.assert_media_ejected();
    assert!(
        !exists(objects.as_ref(), &floppy_object).await,
        "the floppy object is deleted"
    );
    assert_eq!(
        agent.wait_exit(Duration::from_secs(30)),
        Some(0),
        "the agent powered off (exited) on standby.power_off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_ilo_deploy_through_the_manager_with_the_builtin_store() {
    let pki = TestPki::new();
    let builtin = Builtin::start(&pki).await;
    deploy_through_the_manager(builtin.objects(), Some(pki.ca_pem.clone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_ilo_deploy_through_the_manager_with_swift() {
    let swift = SwiftPeer::start().expect("Swift starts (scripts/setup installs it)");
    let store = SwiftStore::new(SwiftConfig::new(SwiftAuth::TempAuth {
        url: format!("{}/auth/v1.0", swift.base_url),
        user: USER.to_string(),
        key: Secret::new(KEY),
    }))
    .expect("the Swift store");
    deploy_through_the_manager(Arc::new(store), None).await;
}
