//! Faults of an `agent_ilo` deploy run through the real Manager (`set_provision_state` →
//! tasks, heartbeats, callback timeout, recovery) with the iLO emulator process, the built-in
//! object store over TLS, SQLite, and the agent binary where an agent takes part. Each ends in
//! `deploy failed` with a `last_error` naming the cause in words an operator can act on, the
//! virtual media ejected (or never inserted) and the floppy object gone.
//!
//! The shared set-up (emulator, store, Manager, the conductor's API router the agent calls, the
//! agent process) is `vmdeploy_integration_tests::conductor_env`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use vmdeploy_conductor::boot::vmedia;
use vmdeploy_conductor::deploy::{DeployContext, DeployInterface, DeployStep};
use vmdeploy_conductor::objects::swift::{SwiftAuth, SwiftConfig, SwiftStore};
use vmdeploy_conductor::objects::{ObjectError, ObjectStore};
use vmdeploy_conductor::states::ProvisionState;
use vmdeploy_conductor::store::Node;
use vmdeploy_integration_tests::conductor_env::{
    agent_flow, api_settings, enroll, floppy_params, inserted_floppy, make_image, AgentProcess,
    Api, Builtin, Conductor, Emulator, Media, Settings, CONTAINER, PASSWORD,
};
use vmdeploy_integration_tests::free_port;
use vmdeploy_integration_tests::http::TestPki;
use vmdeploy_integration_tests::loopdev::{require_loop_devices, LoopDevice, LoopIo};
use vmdeploy_integration_tests::swift::{SwiftPeer, KEY, USER};
use vmdeploy_shared::api::ipa::ValidHeartbeat;
use vmdeploy_shared::secret::Secret;

/// Long enough for any step of these tests; the tests that wait for the timeout set it short.
const LONG_CALLBACK: Duration = Duration::from_secs(120);
/// How long a deploy may take to reach a waiting or final state.
const STEP: Duration = Duration::from_secs(60);

/// A conductor over the built-in store, with its API, in a temp directory.
struct Env {
    /// The conductor's CA; its certificate serves the store.
    _pki: TestPki,
    builtin: Builtin,
    conductor: Conductor,
    api: Api,
    settings: Settings,
    db: tempfile::TempDir,
}

impl Env {
    async fn start(callback_timeout: Duration) -> Env {
        let pki = TestPki::new();
        let builtin = Builtin::start(&pki).await;
        let db = tempfile::tempdir().expect("temp dir");
        let (listener, settings) = api_settings(Some(pki.ca_pem.clone()), callback_timeout).await;
        let conductor = Conductor::builder(
            &db.path().join("vmdeploy.sqlite"),
            builtin.objects(),
            &settings,
        )
        .start()
        .await;
        let api = Api::serve(listener, Arc::clone(&conductor.manager));
        Env {
            _pki: pki,
            builtin,
            conductor,
            api,
            settings,
            db,
        }
    }

    /// Whether the node's floppy object is gone from the store.
    async fn floppy_gone(&self, node: uuid::Uuid) -> bool {
        matches!(
            self.builtin
                .store
                .head(&vmedia::floppy_object(CONTAINER, node))
                .await,
            Err(ObjectError::NotFound(_))
        )
    }
}

/// The node's `last_error`, asserted present.
fn last_error(node: &Node) -> String {
    let text = node
        .last_error
        .clone()
        .unwrap_or_else(|| panic!("deploy failed with a last_error: {node:?}"));
    eprintln!("last_error: {text}");
    text
}

/// Asserts what every failed deploy leaves: `deploy failed`, no reservation, no agent token.
fn assert_failed(node: &Node) {
    assert_eq!(node.provision_state, ProvisionState::DeployFailed);
    assert!(node.reservation.is_none(), "{:?}", node.reservation);
    assert!(
        !node.driver_internal_info.contains_key("agent_secret_token"),
        "token wiped: {:?}",
        node.driver_internal_info
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_ilo_fails_the_deploy_naming_its_address() {
    let env = Env::start(LONG_CALLBACK).await;
    let emulator = Emulator::start(&[]);
    let media = Media::new(&[1u8; 4096]);
    let closed = format!("127.0.0.1:{}", free_port());
    let mut driver_info = emulator.driver_info();
    driver_info.insert("ilo_address".into(), json!(closed));
    driver_info.insert("client_timeout".into(), json!(5));
    let node = enroll(
        &env.conductor.nodes,
        ProvisionState::Available,
        driver_info,
        &media,
        &[1u8; 4096],
        json!({}),
    )
    .await;
    let node = env.conductor.deploy(node.uuid, STEP).await;
    assert_failed(&node);
    let text = last_error(&node);
    assert!(text.contains(&closed), "{text}");
    assert!(text.contains("validation"), "{text}");
    assert!(env.floppy_gone(node.uuid).await, "no floppy stored");
    // The emulator at the right address saw nothing of it.
    emulator.assert_media_ejected();
    assert_eq!(emulator.state()["power"], "OFF");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_fails_the_deploy_before_any_power_change() {
    let env = Env::start(LONG_CALLBACK).await;
    let emulator = Emulator::start_with_password("another-password", &[]);
    let media = Media::new(&[1u8; 4096]);
    let mut driver_info = emulator.driver_info();
    driver_info.insert("ilo_password".into(), json!(PASSWORD));
    let node = enroll(
        &env.conductor.nodes,
        ProvisionState::Available,
        driver_info,
        &media,
        &[1u8; 4096],
        json!({}),
    )
    .await;
    let before = emulator.state();
    let node = env.conductor.deploy(node.uuid, STEP).await;
    assert_failed(&node);
    let text = last_error(&node);
    assert!(text.to_lowercase().contains("login"), "{text}");
    assert!(text.contains("credentials"), "{text}");
    assert!(
        !text.contains(PASSWORD),
        "no password in last_error: {text}"
    );
    let after = emulator.state();
    assert_eq!(after["power"], before["power"], "{after}");
    assert_eq!(after["boots"], before["boots"], "{after}");
    emulator.assert_media_ejected();
    assert!(env.floppy_gone(node.uuid).await, "no floppy stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlicensed_ilo_is_refused_at_validate_and_stays_powered_on() {
    let env = Env::start(LONG_CALLBACK).await;
    let emulator = Emulator::start(&["--license", "standard"]);
    emulator.power_on().await;
    let media = Media::new(&[1u8; 4096]);
    let node = enroll(
        &env.conductor.nodes,
        ProvisionState::Available,
        emulator.driver_info(),
        &media,
        &[1u8; 4096],
        json!({}),
    )
    .await;
    let before = emulator.state();
    let node = env.conductor.deploy(node.uuid, STEP).await;
    assert_failed(&node);
    let text = last_error(&node);
    assert!(text.contains("Advanced licence"), "{text}");
    assert!(text.contains("nothing on the node was changed"), "{text}");
    let after = emulator.state();
    assert_eq!(after["power"], "ON", "nothing was powered off: {after}");
    assert_eq!(after["boots"], before["boots"], "no reboot: {after}");
    assert_eq!(
        after["one_time_boot"], before["one_time_boot"],
        "boot settings untouched: {after}"
    );
    emulator.assert_media_ejected();
    assert!(env.floppy_gone(node.uuid).await, "no floppy stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_store_that_is_down_fails_the_deploy_and_leaves_no_media() {
    let env = Env::start(LONG_CALLBACK).await;
    let emulator = Emulator::start(&[]);
    let media = Media::new(&[1u8; 4096]);
    let node = enroll(
        &env.conductor.nodes,
        ProvisionState::Available,
        emulator.driver_info(),
        &media,
        &[1u8; 4096],
        json!({}),
    )
    .await;
    env.builtin.shut_down().await;
    let node = env.conductor.deploy(node.uuid, STEP).await;
    assert_failed(&node);
    let text = last_error(&node);
    assert!(text.contains("virtual media"), "{text}");
    assert!(
        text.contains(env.builtin.store.public_url()),
        "names the store's URL: {text}"
    );
    assert_eq!(
        text.matches("temp_url_sig=").count(),
        text.matches("temp_url_sig=******").count(),
        "no temp URL signature in last_error: {text}"
    );
    emulator.assert_media_ejected();
    assert_eq!(emulator.state()["power"], "OFF");
    assert!(env.floppy_gone(node.uuid).await, "floppy deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_swift_fails_the_deploy_naming_the_store() {
    let swift = SwiftPeer::start().expect("Swift starts (scripts/setup installs it)");
    let auth_url = format!("{}/auth/v1.0", swift.base_url);
    let store: Arc<dyn ObjectStore> = Arc::new(
        SwiftStore::new(SwiftConfig::new(SwiftAuth::TempAuth {
            url: auth_url.clone(),
            user: USER.to_string(),
            key: Secret::new(KEY),
        }))
        .expect("the Swift store"),
    );
    let emulator = Emulator::start(&[]);
    let media = Media::new(&[1u8; 4096]);
    let db = tempfile::tempdir().expect("temp dir");
    let (listener, settings) = api_settings(None, LONG_CALLBACK).await;
    let conductor = Conductor::builder(
        &db.path().join("vmdeploy.sqlite"),
        Arc::clone(&store),
        &settings,
    )
    .start()
    .await;
    let _api = Api::serve(listener, Arc::clone(&conductor.manager));
    let node = enroll(
        &conductor.nodes,
        ProvisionState::Available,
        emulator.driver_info(),
        &media,
        &[1u8; 4096],
        json!({}),
    )
    .await;
    drop(swift);
    let node = conductor.deploy(node.uuid, STEP).await;
    assert_failed(&node);
    let text = last_error(&node);
    assert!(text.contains("swift store"), "{text}");
    assert!(text.contains(&auth_url), "names Swift's URL: {text}");
    assert!(!text.contains(KEY), "no Swift key in last_error: {text}");
    emulator.assert_media_ejected();
    assert_eq!(emulator.state()["power"], "OFF");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_ramdisk_times_out_and_is_cleaned_up() {
    let env = Env::start(Duration::from_secs(2)).await;
    let emulator = Emulator::start(&[]);
    let media = Media::new(&[1u8; 4096]);
    let node = enroll(
        &env.conductor.nodes,
        ProvisionState::Available,
        emulator.driver_info(),
        &media,
        &[1u8; 4096],
        json!({}),
    )
    .await;
    let waiting = env.conductor.deploy(node.uuid, STEP).await;
    assert_eq!(waiting.provision_state, ProvisionState::WaitCallBack);
    assert_eq!(emulator.state()["vmedia"]["FLOPPY"]["inserted"], true);
    assert!(!env.floppy_gone(node.uuid).await, "the floppy is stored");
    let node = env
        .conductor
        .wait_for(node.uuid, &[ProvisionState::DeployFailed], STEP)
        .await;
    assert_failed(&node);
    let text = last_error(&node);
    assert!(
        text.contains("Timeout reached while waiting for callback"),
        "{text}"
    );
    assert!(text.contains("deploy_callback_timeout"), "{text}");
    assert!(text.contains(&env.settings.api_url), "{text}");
    emulator.assert_media_ejected();
    assert_eq!(emulator.state()["power"], "OFF");
    assert!(env.floppy_gone(node.uuid).await, "floppy deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_the_wrong_token_is_refused_and_the_node_times_out() {
    require_loop_devices();
    // Long enough for the agent to start and be refused on a loaded machine.
    let env = Env::start(Duration::from_secs(8)).await;
    let emulator = Emulator::start(&[]);
    let image = make_image(1 << 20);
    let disk = LoopDevice::attach(&[0xAA; 4 << 20], 4 << 20, LoopIo::Direct);
    let media = Media::new(&image);
    let node = enroll(
        &env.conductor.nodes,
        ProvisionState::Available,
        emulator.driver_info(),
        &media,
        &image,
        json!({"root_device": {"name": disk.device().display().to_string()}}),
    )
    .await;
    let waiting = env.conductor.deploy(node.uuid, STEP).await;
    assert_eq!(waiting.provision_state, ProvisionState::WaitCallBack);

    // The agent boots with a floppy of another deploy: same node, another token.
    let mut params = floppy_params(&inserted_floppy(&emulator));
    let right = params.get("ipa-agent-token").expect("a token").to_owned();
    let wrong = format!("{}x", &right[..right.len() - 1]);
    params
        .set("ipa-agent-token", &wrong)
        .expect("setting the token");
    let floppy = vmdeploy_conductor::boot::vmedia::floppy::build_image(&params).expect("floppy");
    let agent = AgentProcess::start(media.dir.path(), &floppy);

    let node = env
        .conductor
        .wait_for(node.uuid, &[ProvisionState::DeployFailed], STEP)
        .await;
    assert!(
        env.api.refused_heartbeats() >= 1,
        "the Manager refused the agent's heartbeats; agent log:\n{}",
        agent.log()
    );
    assert_eq!(env.api.accepted_heartbeats(), 0, "none accepted");
    assert!(
        agent.log().contains("heartbeat answered 403"),
        "the agent saw the refusal:\n{}",
        agent.log()
    );
    assert_failed(&node);
    let text = last_error(&node);
    assert!(
        text.contains("Timeout reached while waiting for callback"),
        "{text}"
    );
    assert!(text.contains("valid agent token"), "{text}");
    assert!(!text.contains(&right) && !text.contains(&wrong), "{text}");
    assert!(
        !node.driver_internal_info.contains_key("agent_url"),
        "the refused agent was never recorded"
    );
    emulator.assert_media_ejected();
    assert!(env.floppy_gone(node.uuid).await, "floppy deleted");
    assert!(
        disk.contents().iter().all(|b| *b == 0xAA),
        "nothing written to the disk"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checksum_mismatch_reported_by_the_agent_ends_in_its_own_words() {
    require_loop_devices();
    let env = Env::start(LONG_CALLBACK).await;
    let emulator = Emulator::start(&[]);
    let image = make_image(1 << 20);
    let disk = LoopDevice::attach(&[0xAA; 4 << 20], 4 << 20, LoopIo::Direct);
    let media = Media::new(&image);
    let mut node = enroll(
        &env.conductor.nodes,
        ProvisionState::Available,
        emulator.driver_info(),
        &media,
        &image,
        json!({"root_device": {"name": disk.device().display().to_string()}}),
    )
    .await;
    let wrong = "0123456789abcdef".repeat(4);
    node.instance_info
        .insert("image_os_hash_value".into(), json!(wrong));
    use vmdeploy_conductor::store::Store as _;
    env.conductor
        .nodes
        .update_node(&node)
        .await
        .expect("saving the wrong checksum");
    let waiting = env.conductor.deploy(node.uuid, STEP).await;
    assert_eq!(waiting.provision_state, ProvisionState::WaitCallBack);
    let agent = AgentProcess::start(media.dir.path(), &inserted_floppy(&emulator));
    let node = env
        .conductor
        .wait_for(
            node.uuid,
            &[ProvisionState::DeployFailed, ProvisionState::Active],
            STEP,
        )
        .await;
    assert_failed(&node);
    let text = last_error(&node);
    assert!(
        text.contains("writing the image failed on the node"),
        "{text}"
    );
    assert!(text.contains("ImageChecksumError"), "{text}");
    assert!(
        text.contains(&wrong),
        "the expected digest is named: {text}"
    );
    assert!(
        env.api.accepted_heartbeats() >= 2,
        "agent log:\n{}",
        agent.log()
    );
    emulator.assert_media_ejected();
    assert_eq!(emulator.state()["power"], "OFF");
    assert!(env.floppy_gone(node.uuid).await, "floppy deleted");
}

/// The `agent_ilo` flow of a conductor that dies right after booting the ramdisk: its deploy
/// never returns, so the node stays `deploying` with the reservation in the store.
struct DiesAfterBoot(Arc<dyn DeployInterface>);

#[async_trait::async_trait]
impl DeployInterface for DiesAfterBoot {
    async fn validate(&self, node: &Node) -> anyhow::Result<()> {
        self.0.validate(node).await
    }
    async fn deploy(&self, node: &mut Node) -> anyhow::Result<DeployStep> {
        self.0.deploy(node).await?;
        std::future::pending().await
    }
    async fn heartbeat(
        &self,
        node: &mut Node,
        heartbeat: &ValidHeartbeat,
    ) -> anyhow::Result<DeployStep> {
        self.0.heartbeat(node, heartbeat).await
    }
    async fn tear_down(&self, node: &mut Node) -> anyhow::Result<()> {
        self.0.tear_down(node).await
    }
    async fn clean_up(&self, node: &mut Node) {
        self.0.clean_up(node).await
    }
}

fn dies_after_boot(context: Arc<DeployContext>) -> Arc<dyn DeployInterface> {
    Arc::new(DiesAfterBoot(agent_flow(context)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conductor_killed_mid_deploy_fails_the_node_at_restart_and_cleans_up() {
    let env = Env::start(LONG_CALLBACK).await;
    let emulator = Emulator::start(&[]);
    let media = Media::new(&[1u8; 4096]);
    let db = env.db.path().join("vmdeploy.sqlite");
    let dying = Conductor::builder(&db, env.builtin.objects(), &env.settings)
        .agent_flow(dies_after_boot)
        .start()
        .await;
    let node = enroll(
        &dying.nodes,
        ProvisionState::Available,
        emulator.driver_info(),
        &media,
        &[1u8; 4096],
        json!({}),
    )
    .await;
    dying
        .manager
        .set_provision_state(
            &vmdeploy_conductor::store::NodeIdent::Uuid(node.uuid),
            vmdeploy_conductor::states::ProvisionVerb::Deploy,
            None,
        )
        .await
        .expect("deploy accepted");
    // Wait until the ramdisk is booting: media in, power on.
    let started = std::time::Instant::now();
    loop {
        let state = emulator.state();
        if state["vmedia"]["FLOPPY"]["inserted"] == true && state["power"] == "ON" {
            break;
        }
        assert!(
            started.elapsed() < STEP,
            "the dying conductor booted the ramdisk: {state}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Give the flow's last store write a moment, then "kill" the conductor: its task never
    // returns, and the Manager and its background duties go away.
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(dying);
    let left = env.conductor.node(node.uuid).await;
    assert_eq!(left.provision_state, ProvisionState::Deploying);
    let holder = left
        .reservation
        .clone()
        .expect("the reservation is in the file");
    assert!(holder.starts_with("conductor-test:"), "{holder}");
    assert!(
        !env.floppy_gone(node.uuid).await,
        "the floppy is still stored"
    );

    // The restarted conductor: a new Manager on the same file runs recovery at start.
    let restarted = Conductor::builder(&db, env.builtin.objects(), &env.settings)
        .start()
        .await;
    let node = restarted
        .wait_for(node.uuid, &[ProvisionState::DeployFailed], STEP)
        .await;
    assert_failed(&node);
    let text = last_error(&node);
    assert!(
        text.contains("conductor restarted while the node was deploying"),
        "{text}"
    );
    assert!(text.contains("deploy it again"), "{text}");
    emulator.assert_media_ejected();
    assert_eq!(emulator.state()["power"], "OFF");
    assert!(env.floppy_gone(node.uuid).await, "floppy deleted");
}
