//! The `iscsi_ilo` deploy's fault paths and CHAP, through the conductor's real API router (with
//! and without `/v1`), the real Manager and flow, the iLO emulator, the built-in store, and the
//! agent as a process (the iSCSI ramdisk, or its bare target where the test plays the ramdisk's
//! call-back itself) on a `losetup --direct-io=on` disk.
//!
//! Every fault ends in `deploy failed` with a `last_error` naming the cause, both virtual media
//! ejected, nothing left in the store's container, the deploy key gone from
//! `driver_internal_info` and the node powered off. (An image larger than the disk and a
//! corrupt download are in `conductor_iscsi_deploy.rs`.)

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vmdeploy_conductor::deploy::iscsi::done::DonePolicy;
use vmdeploy_conductor::deploy::IscsiChap;
use vmdeploy_conductor::states::ProvisionState;
use vmdeploy_conductor::store::{Node, Store as _};
use vmdeploy_integration_tests::agent_target::AgentTarget;
use vmdeploy_integration_tests::conductor_env::{
    enroll_iscsi, floppy_params, inserted_floppy, make_image, AgentProcess, IscsiEnv, IscsiOptions,
};
use vmdeploy_integration_tests::loopdev::{LoopDevice, LoopIo};
use vmdeploy_shared::secret::Secret;

/// How long a deploy may take to reach a waiting or final state.
const STEP: Duration = Duration::from_secs(120);
const IMAGE_LEN: usize = 8 << 20;
const DISK_LEN: u64 = 16 << 20;
const CHAP_USER: &str = "vmdeploy-test";
const CHAP_SECRET: &str = "chap-secret-0123456789";

/// The environment with the real API router and `tune` applied to the flow's settings.
async fn env(
    callback_timeout: Duration,
    tune: impl FnOnce(&mut vmdeploy_conductor::deploy::DeployConfig) + Send + 'static,
) -> IscsiEnv {
    IscsiEnv::start_with(IscsiOptions {
        callback_timeout,
        tune: Box::new(tune),
        netboot: false,
    })
    .await
}

/// A deploy started and waiting for its call-back: the node, its media, its disk, the key and
/// the floppy.
struct Waiting {
    node: Node,
    media: vmdeploy_integration_tests::conductor_env::Media,
    disk: LoopDevice,
    image: Vec<u8>,
    key: String,
    floppy: Vec<u8>,
}

async fn deploy_until_wait(env: &IscsiEnv, image_len: usize, disk_len: u64) -> Waiting {
    let image = make_image(image_len);
    let disk = LoopDevice::attach(&[0xAA; 4096], disk_len, LoopIo::Direct);
    let (node, media) = enroll_iscsi(&env.conductor, &env.emulator, &image, &disk, |_| {}).await;
    let node = env.conductor.deploy(node.uuid, STEP).await;
    assert_eq!(
        node.provision_state,
        ProvisionState::WaitCallBack,
        "last_error: {:?}",
        node.last_error
    );
    let floppy = inserted_floppy(&env.emulator);
    let key = floppy_params(&floppy)
        .get("deployment_key")
        .expect("deployment_key on the floppy")
        .to_owned();
    Waiting {
        node,
        media,
        disk,
        image,
        key,
        floppy,
    }
}

/// `POST {api}{path}` with `body`: the status code and the body.
async fn post(env: &IscsiEnv, path: &str, body: &Value) -> (u16, Value) {
    let reply = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a client")
        .post(format!("{}{path}", env.api_url))
        .json(body)
        .send()
        .await
        .expect("the API answers");
    let status = reply.status().as_u16();
    (status, reply.json().await.unwrap_or(Value::Null))
}

fn pass_deploy_info_path(node: &Node, v1: bool) -> String {
    format!(
        "{}/nodes/{}/vendor_passthru/pass_deploy_info",
        if v1 { "/v1" } else { "" },
        node.uuid
    )
}

fn body(node: &Node, key: &str, error: &str) -> Value {
    json!({
        "address": "127.0.0.1",
        "key": key,
        "iqn": format!("iqn-{}", node.uuid),
        "error": error,
    })
}

/// Waits for `active` or `deploy failed`.
async fn finished(env: &IscsiEnv, node: &Node, limit: Duration) -> Node {
    env.conductor
        .wait_for(
            node.uuid,
            &[ProvisionState::Active, ProvisionState::DeployFailed],
            limit,
        )
        .await
}

/// A wrong key gets 403 (with and without `/v1`) and changes nothing on the node: it stays in
/// `wait call-back` with its key and its wait clock, so nothing but the call-back timeout ends
/// the deploy, with Ironic's timeout words and the full clean-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_gets_403_and_the_callback_timeout_ends_the_deploy() {
    let timeout = Duration::from_secs(8);
    let env = env(timeout, |_| {}).await;
    let w = deploy_until_wait(&env, IMAGE_LEN, DISK_LEN).await;
    let before = env.conductor.node(w.node.uuid).await;
    let mut wrong = w.key.clone();
    wrong.replace_range(0..1, if wrong.starts_with('A') { "B" } else { "A" });
    for v1 in [true, false] {
        let (status, reply) = post(
            &env,
            &pass_deploy_info_path(&w.node, v1),
            &body(&w.node, &wrong, ""),
        )
        .await;
        assert_eq!(status, 403, "v1={v1}: {reply}");
        assert!(reply.to_string().contains("deploy key"), "{reply}");
    }
    // A key of another length, and none at all.
    let (status, _) = post(
        &env,
        &pass_deploy_info_path(&w.node, true),
        &body(&w.node, "x", ""),
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(env.api.refused_heartbeats(), 3);
    let after = env.conductor.node(w.node.uuid).await;
    assert_eq!(after.provision_state, ProvisionState::WaitCallBack);
    assert_eq!(after.driver_internal_info, before.driver_internal_info);
    assert_eq!(after.provision_updated_at, before.provision_updated_at);
    assert_eq!(after.last_error, None);
    assert_eq!(after.reservation, None);
    assert!(env.emulator.state()["vmedia"]["FLOPPY"]["inserted"] == true);

    let started = Instant::now();
    let node = finished(&env, &w.node, STEP).await;
    assert!(
        started.elapsed() < timeout + Duration::from_secs(30),
        "the timeout ends the deploy in time: {:?}",
        started.elapsed()
    );
    env.assert_failed_clean(
        &node,
        &[
            "Timeout reached while waiting for callback",
            "no pass_deploy_info with a valid deploy key",
        ],
        "",
    );
    assert!(
        w.disk.contents()[..4096] == [0xAA; 4096],
        "nothing was written"
    );
}

/// The right key is taken once (202) and burnt at once: the identical second call, while the
/// first deploys, finds no key and is answered as for an unknown node (404), and the node
/// reaches `active` from the first. Both paths the
/// ramdisk may post to, `/v1/nodes/...` and Kilo's `/nodes/...`, work the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_key_gets_404_and_the_first_call_deploys_with_and_without_v1() {
    let env = env(STEP, |_| {}).await;
    for v1 in [true, false] {
        let w = deploy_until_wait(&env, IMAGE_LEN, DISK_LEN).await;
        let target = AgentTarget::start_on(
            w.disk.device(),
            &format!("iqn-{}", w.node.uuid),
            env.iscsi_port,
            env.done_port,
            None,
        );
        let path = pass_deploy_info_path(&w.node, v1);
        let call = body(&w.node, &w.key, "");
        let (status, reply) = post(&env, &path, &call).await;
        assert_eq!(status, 202, "v1={v1}: {reply}");
        let (status, reply) = post(&env, &path, &call).await;
        assert_eq!(status, 404, "v1={v1}: the replay: {reply}");
        let node = finished(&env, &w.node, STEP).await;
        assert_eq!(
            node.provision_state,
            ProvisionState::Active,
            "v1={v1}: last_error {:?}",
            node.last_error
        );
        assert_eq!(node.last_error, None, "v1={v1}: the replay left no trace");
        assert!(
            w.disk.contents()[..IMAGE_LEN] == w.image[..],
            "v1={v1}: the disk holds the image"
        );
        assert!(!node.driver_internal_info.contains_key("deployment_key"));
        // After the deploy too: the node holds no key, so it answers as an unknown node.
        let (status, _) = post(&env, &path, &call).await;
        assert_eq!(status, 404, "v1={v1}");
        env.assert_no_temporary_objects();
        drop(target);
        env.conductor.forget_ports(node.uuid).await;
    }
    assert_eq!(env.api.accepted_heartbeats(), 2);
    // The replays were 404s, not 403s: no key was there to refuse.
    assert_eq!(env.api.refused_heartbeats(), 0);
}

/// The ramdisk reports an error (here a root device hint that names no disk): the deploy fails
/// with the ramdisk's own words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_reported_by_the_ramdisk_fails_the_deploy_with_its_text() {
    let env = env(STEP, |_| {}).await;
    let image = make_image(IMAGE_LEN);
    let disk = LoopDevice::attach(&[0xAA; 4096], DISK_LEN, LoopIo::Direct);
    let (mut node, media) =
        enroll_iscsi(&env.conductor, &env.emulator, &image, &disk, |_| {}).await;
    node.properties.insert(
        "root_device".into(),
        json!({"name": "/dev/vmdeploy-no-such-disk"}),
    );
    env.conductor
        .nodes
        .update_node(&node)
        .await
        .expect("a hint naming no disk");
    let waiting = env.conductor.deploy(node.uuid, STEP).await;
    assert_eq!(waiting.provision_state, ProvisionState::WaitCallBack);
    let floppy = inserted_floppy(&env.emulator);
    let agent = AgentProcess::start_iscsi(media.dir.path(), &floppy, env.iscsi_port, env.done_port);
    let node = finished(&env, &node, STEP).await;
    env.assert_failed_clean(
        &node,
        &[
            "reported an error",
            "choosing the install disk",
            "vmdeploy-no-such-disk",
        ],
        &agent.log(),
    );
    assert_eq!(env.api.accepted_heartbeats(), 1, "{}", agent.log());

    // The same through the API by hand, with a free-text error as DIB's ramdisk sends it.
    env.conductor.forget_ports(node.uuid).await;
    let w = deploy_until_wait(&env, IMAGE_LEN, DISK_LEN).await;
    let (status, reply) = post(
        &env,
        &pass_deploy_info_path(&w.node, false),
        &body(&w.node, &w.key, "Failed+to+find+the+target+disk+sda"),
    )
    .await;
    assert_eq!(status, 202, "{reply}");
    let node = finished(&env, &w.node, STEP).await;
    env.assert_failed_clean(
        &node,
        &["reported an error", "Failed+to+find+the+target+disk+sda"],
        "",
    );
}

/// The ramdisk dies while the conductor writes: the write fails at once (the connection is
/// gone, not a timeout), the deploy fails naming the iSCSI write, and the disk shows the
/// write was cut short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_target_gone_mid_write_fails_the_deploy_naming_the_iscsi_write() {
    // Large enough that the write takes seconds here (debug builds, a loop device).
    const BIG: usize = 256 << 20;
    let env = env(STEP, |_| {}).await;
    let w = deploy_until_wait(&env, BIG, BIG as u64 + (16 << 20)).await;
    let agent =
        AgentProcess::start_iscsi(w.media.dir.path(), &w.floppy, env.iscsi_port, env.done_port);
    // The write has begun once the image's first block is on the disk.
    let started = Instant::now();
    let mut first = vec![0u8; 4096];
    loop {
        use std::io::Read;
        let mut dev = std::fs::File::open(w.disk.device()).expect("opening the disk");
        dev.read_exact(&mut first).expect("reading the disk");
        if first[..] == w.image[..4096] {
            break;
        }
        assert!(
            started.elapsed() < STEP,
            "the write never began\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(agent);
    let killed = Instant::now();
    let node = finished(&env, &w.node, STEP).await;
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "the lost target is noticed in bounded time: {took:?}"
    );
    env.assert_failed_clean(&node, &["writing the image over iSCSI"], "");
    let error = node.last_error.clone().unwrap_or_default();
    assert!(!error.contains("logging in"), "{error}");
    // The write was cut: the image's last MiB never reached the disk.
    let disk = w.disk.contents();
    assert!(
        disk[BIG - (1 << 20)..BIG] != w.image[BIG - (1 << 20)..],
        "the kill landed after the write ended: {error}"
    );
    println!("target killed mid-write; deploy failed {took:?} later: {error}");
}

/// Nothing takes `done` (the conductor sends it to a port nobody listens on): after the
/// configured tries, a short wait apart, the deploy fails saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_refused_fails_the_deploy_after_bounded_tries() {
    let closed = vmdeploy_integration_tests::free_port();
    let policy = DonePolicy {
        attempts: 3,
        retry_interval: Duration::from_millis(300),
        timeout: Duration::from_secs(5),
    };
    let env = env(STEP, move |config| {
        config.done_port = closed;
        config.done = policy;
    })
    .await;
    let w = deploy_until_wait(&env, IMAGE_LEN, DISK_LEN).await;
    let agent =
        AgentProcess::start_iscsi(w.media.dir.path(), &w.floppy, env.iscsi_port, env.done_port);
    let node = finished(&env, &w.node, STEP).await;
    env.assert_failed_clean(
        &node,
        &[
            &format!("127.0.0.1:{closed}"),
            "did not take \"done\" after 3 attempts",
            "connection refused",
        ],
        &agent.log(),
    );
    // The image itself went over before `done` was refused.
    assert!(w.disk.contents()[..IMAGE_LEN] == w.image[..]);
}

/// With CHAP configured, the floppy carries the credentials, the ramdisk's target requires
/// them and the conductor logs in with them: the deploy reaches `active`, and the secret is
/// nowhere on the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_chap_configured_a_whole_disk_deploy_reaches_active() {
    let env = env(STEP, |config| {
        config.iscsi_chap = Some(IscsiChap {
            user: CHAP_USER.into(),
            secret: Secret::new(CHAP_SECRET),
        });
    })
    .await;
    let w = deploy_until_wait(&env, IMAGE_LEN, DISK_LEN).await;
    let params = floppy_params(&w.floppy);
    assert_eq!(params.get("vmdeploy-iscsi-chap-user"), Some(CHAP_USER));
    assert_eq!(params.get("vmdeploy-iscsi-chap-secret"), Some(CHAP_SECRET));
    let mut agent =
        AgentProcess::start_iscsi(w.media.dir.path(), &w.floppy, env.iscsi_port, env.done_port);
    let node = finished(&env, &w.node, STEP).await;
    assert_eq!(
        node.provision_state,
        ProvisionState::Active,
        "last_error {:?}\n{}",
        node.last_error,
        agent.log()
    );
    assert!(w.disk.contents()[..IMAGE_LEN] == w.image[..]);
    assert_eq!(
        agent.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        agent.log()
    );
    let stored = format!(
        "{:?} {:?} {:?}",
        node.driver_internal_info, node.instance_info, node.driver_info
    );
    assert!(!stored.contains(CHAP_SECRET), "{stored}");
    assert!(!agent.log().contains(CHAP_SECRET), "{}", agent.log());
}

/// The ramdisk's target requires a secret other than the conductor's (its floppy rebuilt
/// with another one): the login is refused and the deploy fails naming authentication.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chap_secret_the_target_does_not_share_fails_the_deploy_naming_authentication() {
    let env = env(STEP, |config| {
        config.iscsi_chap = Some(IscsiChap {
            user: CHAP_USER.into(),
            secret: Secret::new(CHAP_SECRET),
        });
    })
    .await;
    let w = deploy_until_wait(&env, IMAGE_LEN, DISK_LEN).await;
    let mut params = floppy_params(&w.floppy);
    params
        .set("vmdeploy-iscsi-chap-secret", "another-secret-9876")
        .expect("a parameter");
    let floppy =
        vmdeploy_conductor::boot::vmedia::floppy::build_image(&params).expect("the changed floppy");
    let agent =
        AgentProcess::start_iscsi(w.media.dir.path(), &floppy, env.iscsi_port, env.done_port);
    let node = finished(&env, &w.node, STEP).await;
    env.assert_failed_clean(
        &node,
        &["logging in to", "authentication failure"],
        &agent.log(),
    );
    assert!(
        w.disk.contents()[..4096] == [0xAA; 4096],
        "nothing was written"
    );
    let error = node.last_error.clone().unwrap_or_default();
    assert!(!error.contains(CHAP_SECRET), "{error}");
}

/// A target that requires CHAP refuses a conductor that has none configured: the deploy fails
/// naming authentication.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_requiring_chap_refuses_a_conductor_without_it() {
    let env = env(STEP, |_| {}).await;
    let w = deploy_until_wait(&env, IMAGE_LEN, DISK_LEN).await;
    let mut params = floppy_params(&w.floppy);
    assert_eq!(
        params.get("vmdeploy-iscsi-chap-user"),
        None,
        "no CHAP configured"
    );
    params
        .set("vmdeploy-iscsi-chap-user", CHAP_USER)
        .expect("a parameter");
    params
        .set("vmdeploy-iscsi-chap-secret", CHAP_SECRET)
        .expect("a parameter");
    let floppy =
        vmdeploy_conductor::boot::vmedia::floppy::build_image(&params).expect("the changed floppy");
    let agent =
        AgentProcess::start_iscsi(w.media.dir.path(), &floppy, env.iscsi_port, env.done_port);
    let node = finished(&env, &w.node, STEP).await;
    env.assert_failed_clean(
        &node,
        &["logging in to", "authentication failure"],
        &agent.log(),
    );
    assert!(
        w.disk.contents()[..4096] == [0xAA; 4096],
        "nothing was written"
    );
}
