//! The manager against a real SQLite store and the in-process iLO emulator, with a scripted
//! deploy flow standing in for the `agent_ilo` one (another helper's component): it returns
//! what each test scripts and counts its clean-ups.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uuid::Uuid;
use vmdeploy_ilo_emulator::{Emulator, EmulatorConfig, FaultKind, FaultSpec, Power as EmuPower};

use super::*;
use crate::deploy::{DeployConfig, DeployInterface, DeployStep};
use crate::objects::{ObjectBody, ObjectError, ObjectInfo, ObjectPath, PutOptions};
use crate::states::{next, Event};
use crate::store::sqlite::SqliteStore;
use crate::store::{Node, Port};

const TOKEN: &str = "pre-generated-agent-token-of-43-characters-xx";

/// What one call of the scripted flow does.
enum Script {
    Wait,
    Done,
    Fail(&'static str),
    Panic,
    /// Waits until the test adds a permit, then returns `Wait`.
    Block(Arc<tokio::sync::Semaphore>),
}

/// A deploy interface that follows a script (default: deploy waits, heartbeat finishes).
#[derive(Default)]
struct ScriptedFlow {
    deploys: Mutex<VecDeque<Script>>,
    heartbeats: Mutex<VecDeque<Script>>,
    pass_deploy_infos: Mutex<VecDeque<Script>>,
    /// Whether the flow is an iSCSI one (takes `pass_deploy_info`).
    iscsi: std::sync::atomic::AtomicBool,
    /// (address, iqn) of each `pass_deploy_info` the flow got.
    seen_pass_deploy_info: Mutex<Vec<(String, String)>>,
    clean_ups: AtomicUsize,
    tear_downs: AtomicUsize,
    /// Scripts of `prepare_cleaning` and `clean_heartbeat` (`Wait`/`Done` succeed).
    clean_prepares: Mutex<VecDeque<Script>>,
    clean_heartbeats: Mutex<VecDeque<Script>>,
    /// Calls of `prepare_cleaning` and `clean_heartbeat`.
    cleanings: AtomicUsize,
    clean_steps_run: AtomicUsize,
    validate_error: Mutex<Option<String>>,
}

impl ScriptedFlow {
    fn script_deploy(&self, s: Script) {
        self.deploys.lock().expect("lock").push_back(s);
    }
    fn script_heartbeat(&self, s: Script) {
        self.heartbeats.lock().expect("lock").push_back(s);
    }
    fn script_pass_deploy_info(&self, s: Script) {
        self.pass_deploy_infos.lock().expect("lock").push_back(s);
    }
    async fn play(script: Option<Script>, default: DeployStep) -> anyhow::Result<DeployStep> {
        match script {
            None => Ok(default),
            Some(Script::Wait) => Ok(DeployStep::Wait),
            Some(Script::Done) => Ok(DeployStep::Done),
            Some(Script::Fail(why)) => Err(anyhow::anyhow!("{why}")),
            Some(Script::Panic) => panic!("scripted panic"),
            Some(Script::Block(gate)) => {
                let _permit = gate.acquire().await.expect("gate open");
                Ok(DeployStep::Wait)
            }
        }
    }
}

#[async_trait::async_trait]
impl DeployInterface for ScriptedFlow {
    async fn validate(&self, _node: &Node) -> anyhow::Result<()> {
        match self.validate_error.lock().expect("lock").clone() {
            Some(e) => Err(anyhow::anyhow!(e)),
            None => Ok(()),
        }
    }
    async fn deploy(&self, node: &mut Node) -> anyhow::Result<DeployStep> {
        let script = self.deploys.lock().expect("lock").pop_front();
        // As the agent flow does: the token is made before the ramdisk boots.
        node.driver_internal_info
            .insert("agent_secret_token".into(), json!(TOKEN));
        Self::play(script, DeployStep::Wait).await
    }
    async fn heartbeat(
        &self,
        _node: &mut Node,
        _heartbeat: &HeartbeatRequest,
    ) -> anyhow::Result<DeployStep> {
        let script = self.heartbeats.lock().expect("lock").pop_front();
        Self::play(script, DeployStep::Done).await
    }
    fn takes_pass_deploy_info(&self) -> bool {
        self.iscsi.load(Ordering::SeqCst)
    }
    async fn pass_deploy_info(
        &self,
        _node: &mut Node,
        info: &vmdeploy_shared::api::ValidPassDeployInfo,
    ) -> anyhow::Result<DeployStep> {
        self.seen_pass_deploy_info
            .lock()
            .expect("lock")
            .push((info.address.to_string(), info.iqn.clone()));
        let script = self.pass_deploy_infos.lock().expect("lock").pop_front();
        Self::play(script, DeployStep::Done).await
    }
    async fn prepare_cleaning(&self, node: &mut Node) -> anyhow::Result<()> {
        self.cleanings.fetch_add(1, Ordering::SeqCst);
        node.driver_internal_info
            .insert("agent_secret_token".into(), json!(TOKEN));
        let script = self.clean_prepares.lock().expect("lock").pop_front();
        Self::play(script, DeployStep::Wait).await.map(|_| ())
    }
    async fn clean_heartbeat(
        &self,
        node: &mut Node,
        _heartbeat: &HeartbeatRequest,
    ) -> anyhow::Result<()> {
        self.clean_steps_run.fetch_add(1, Ordering::SeqCst);
        // What the API shows while a step runs.
        assert_eq!(node.provision_state, ProvisionState::Cleaning);
        let script = self.clean_heartbeats.lock().expect("lock").pop_front();
        Self::play(script, DeployStep::Done).await.map(|_| ())
    }
    async fn tear_down(&self, _node: &mut Node) -> anyhow::Result<()> {
        self.tear_downs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn clean_up(&self, node: &mut Node) {
        self.clean_ups.fetch_add(1, Ordering::SeqCst);
        node.driver_internal_info.remove("agent_secret_token");
    }
}

/// The manager never touches the object store; this one refuses everything.
struct NoObjects;

#[async_trait::async_trait]
impl ObjectStore for NoObjects {
    async fn put(&self, _: &ObjectPath, _: ObjectBody, _: &PutOptions) -> Result<(), ObjectError> {
        Err(ObjectError::Unavailable("not in these tests".into()))
    }
    async fn delete(&self, _: &ObjectPath) -> Result<bool, ObjectError> {
        Err(ObjectError::Unavailable("not in these tests".into()))
    }
    async fn head(&self, _: &ObjectPath) -> Result<ObjectInfo, ObjectError> {
        Err(ObjectError::Unavailable("not in these tests".into()))
    }
    async fn temp_url(&self, _: &ObjectPath, _: Duration) -> Result<String, ObjectError> {
        Err(ObjectError::Unavailable("not in these tests".into()))
    }
    fn kind(&self) -> &'static str {
        "none"
    }
}

struct Harness {
    manager: Arc<Manager>,
    store: Arc<SqliteStore>,
    flow: Arc<ScriptedFlow>,
    emulator: Emulator,
    cert: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn config(callback_timeout: Duration, sync: Duration) -> ManagerConfig {
    ManagerConfig {
        deploy_callback_timeout: callback_timeout,
        power_sync_interval: sync,
        automated_clean: false,
        conductor_name: "cond-test".into(),
    }
}

impl Harness {
    async fn new() -> Harness {
        Harness::with_config(config(Duration::from_secs(1800), Duration::from_secs(60))).await
    }

    async fn with_config(config: ManagerConfig) -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(&dir.path().join("vmdeploy.sqlite")).expect("store opens");
        Harness::on_store(dir, store, config).await
    }

    async fn on_store(
        dir: tempfile::TempDir,
        store: Arc<SqliteStore>,
        config: ManagerConfig,
    ) -> Harness {
        let emulator = Emulator::start(EmulatorConfig::loopback())
            .await
            .expect("emulator starts");
        let cert = dir.path().join("ilo-cert.pem");
        std::fs::write(&cert, emulator.cert_pem()).expect("writing the emulator's cert");
        let context = Arc::new(DeployContext {
            store: store.clone(),
            objects: Arc::new(NoObjects),
            config: DeployConfig::for_tests(),
            images: None,
            boot_isos: None,
            netboot: None,
        });
        let manager = Arc::new(Manager::new(context, config));
        let flow = Arc::new(ScriptedFlow::default());
        let for_resolver = flow.clone();
        manager.set_deploy_resolver(Arc::new(move |node: &Node| {
            (node.driver == "agent_ilo").then(|| for_resolver.clone() as Arc<dyn DeployInterface>)
        }));
        Harness {
            manager,
            store,
            flow,
            emulator,
            cert,
            _dir: dir,
        }
    }

    fn driver_info(&self, password: &str) -> Value {
        json!({
            "ilo_address": self.emulator.addresses()[0].to_string(),
            "ilo_username": "Administrator",
            "ilo_password": password,
            "ilo_verify_ca": self.cert.to_string_lossy(),
            "ilo_protocol": "ribcl",
            "client_timeout": 10,
        })
    }

    async fn node_in(&self, state: ProvisionState) -> Uuid {
        let mut node = Node::new(Uuid::new_v4(), "agent_ilo", state);
        node.driver_info = self
            .driver_info("password")
            .as_object()
            .expect("object")
            .clone();
        if state == ProvisionState::WaitCallBack {
            node.driver_internal_info
                .insert("agent_secret_token".into(), json!(TOKEN));
            node.provision_updated_at = Some(time::OffsetDateTime::now_utc());
        }
        self.store.create_node(&node).await.expect("create node");
        node.uuid
    }

    async fn node(&self, uuid: Uuid) -> Node {
        self.store
            .node(&NodeIdent::Uuid(uuid))
            .await
            .expect("node exists")
    }

    /// Waits until every task is done.
    async fn settle(&self) {
        self.manager.drain(Duration::from_secs(20)).await;
        assert_eq!(self.manager.running_tasks(), 0, "tasks still running");
    }

    async fn emulator_power(&self) -> EmuPower {
        self.emulator.state(0).await.expect("server 0").state.power
    }

    async fn wait_until(&self, uuid: Uuid, what: &str, cond: impl Fn(&Node) -> bool) -> Node {
        let start = Instant::now();
        loop {
            let node = self.node(uuid).await;
            if cond(&node) {
                return node;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "timed out waiting for {what}: {node:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn id(uuid: Uuid) -> NodeIdent {
    NodeIdent::Uuid(uuid)
}

fn heartbeat(token: Option<&str>) -> HeartbeatRequest {
    HeartbeatRequest {
        callback_url: "https://127.0.0.1:9999".into(),
        agent_token: token.map(vmdeploy_shared::secret::Secret::from),
        agent_version: Some("10.0.0".into()),
        agent_verify_ca: None,
        agent_status_message: None,
    }
}

fn is_locked(result: &Result<(), ManagerError>) -> bool {
    matches!(result, Err(ManagerError::Store(StoreError::Locked { .. })))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_task_is_locked_out_until_the_first_ends() {
    let h = Harness::new().await;
    let uuid = h.node_in(ProvisionState::Available).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    h.flow.script_deploy(Script::Block(gate.clone()));
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Deploy, None)
        .await
        .expect("deploy accepted");
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
    let uuid = h.node_in(ProvisionState::Available).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    h.flow.script_deploy(Script::Block(gate.clone()));
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Deploy, None)
        .await
        .expect("deploy accepted");
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
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Deploy, None)
        .await
        .expect("deploy accepted");
    h.settle().await;
    let node = h.node(uuid).await;
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
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Deploy, None)
        .await
        .expect("deploy accepted");
    let node = h
        .wait_until(uuid, "release after the panic", |n| n.reservation.is_none())
        .await;
    assert_eq!(node.provision_state, ProvisionState::DeployFailed);
    let error = node.last_error.expect("last_error");
    assert!(error.contains("internal error"), "{error}");
    h.settle().await;
}

/// Where each allowed verb leaves a node once its task ended (the scripted flow waits after
/// deploy; the emulator's credentials are right).
fn settled_state(from: ProvisionState, verb: ProvisionVerb) -> ProvisionState {
    use ProvisionState::*;
    match (from, verb) {
        (_, ProvisionVerb::Manage) => Manageable,
        (_, ProvisionVerb::Provide) => Available,
        (_, ProvisionVerb::Deploy | ProvisionVerb::Rebuild) => WaitCallBack,
        (_, ProvisionVerb::Undeploy) => Available,
        (WaitCallBack, ProvisionVerb::Abort) => DeployFailed,
        (_, ProvisionVerb::Abort) => CleanFailed,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verb_from_every_state() {
    let h = Harness::new().await;
    let verbs = [
        ProvisionVerb::Manage,
        ProvisionVerb::Provide,
        ProvisionVerb::Deploy,
        ProvisionVerb::Rebuild,
        ProvisionVerb::Undeploy,
        ProvisionVerb::Abort,
    ];
    let mut allowed = 0;
    for from in ProvisionState::ALL {
        for verb in verbs {
            let uuid = h.node_in(from).await;
            let before = h.node(uuid).await;
            let result = h.manager.set_provision_state(&id(uuid), verb, None).await;
            h.settle().await;
            let after = h.node(uuid).await;
            assert_eq!(after.reservation, None, "{verb:?} from {from}");
            match next(from, Event::Verb(verb)) {
                None => {
                    assert!(
                        matches!(result, Err(ManagerError::InvalidState { state, .. }) if state == from),
                        "{verb:?} from {from}: {result:?}"
                    );
                    assert_eq!(
                        after, before,
                        "a refused {verb:?} changed the node in {from}"
                    );
                }
                Some(_) => {
                    allowed += 1;
                    result.unwrap_or_else(|e| panic!("{verb:?} from {from}: {e}"));
                    assert_eq!(
                        after.provision_state,
                        settled_state(from, verb),
                        "{verb:?} from {from}: {:?}",
                        after.last_error
                    );
                }
            }
        }
    }
    assert_eq!(allowed, 15, "the state machine's verbs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_waits_for_the_agent_whose_token_must_match() {
    let h = Harness::new().await;
    let uuid = h.node_in(ProvisionState::Available).await;
    h.store
        .create_port(&Port {
            uuid: Uuid::new_v4(),
            address: "52:54:00:12:34:56".into(),
            node_uuid: uuid,
            pxe_enabled: true,
            extra: Default::default(),
            created_at: time::OffsetDateTime::now_utc(),
            updated_at: None,
        })
        .await
        .expect("port");
    // Not deploying yet: lookup does not find it.
    let early = h.manager.lookup(&["52:54:00:12:34:56".into()], None).await;
    assert!(matches!(
        early,
        Err(ManagerError::Store(StoreError::NotFound { .. }))
    ));

    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Deploy, Some(json!("H4sI...")))
        .await
        .expect("deploy accepted");
    h.settle().await;
    let waiting = h.node(uuid).await;
    assert_eq!(waiting.provision_state, ProvisionState::WaitCallBack);
    assert_eq!(waiting.target_provision_state, Some(ProvisionState::Active));
    assert_eq!(
        waiting.instance_info.get("configdrive"),
        Some(&json!("H4sI..."))
    );

    let found = h
        .manager
        .lookup(&["52-54-00-12-34-56".to_uppercase()], None)
        .await
        .expect("lookup finds the node by MAC");
    assert_eq!(found.node["uuid"], json!(uuid));
    assert_eq!(found.config["agent_token_required"], json!(true));
    let shown = format!("{} {}", found.node, found.config);
    assert!(!shown.contains(TOKEN) && !shown.contains("H4sI"), "{shown}");

    for wrong in [None, Some("x"), Some(&TOKEN[..TOKEN.len() - 1])] {
        let refused = h.manager.heartbeat(&id(uuid), heartbeat(wrong)).await;
        assert!(
            matches!(refused, Err(ManagerError::Forbidden(_))),
            "{refused:?}"
        );
        assert_eq!(
            h.node(uuid).await,
            waiting,
            "a refused heartbeat changed the node"
        );
    }

    h.flow.script_heartbeat(Script::Wait);
    h.manager
        .heartbeat(&id(uuid), heartbeat(Some(TOKEN)))
        .await
        .expect("heartbeat accepted");
    h.settle().await;
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::WaitCallBack);
    // The address is the flow's to pin; the manager only notes the time.
    assert!(!node.driver_internal_info.contains_key("agent_url"));
    assert!(node
        .driver_internal_info
        .contains_key("agent_last_heartbeat"));

    h.manager
        .heartbeat(&id(uuid), heartbeat(Some(TOKEN)))
        .await
        .expect("heartbeat accepted");
    h.settle().await;
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::Active);
    assert_eq!(node.target_provision_state, None);
    assert_eq!(node.reservation, None);
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 0);
    // The deploy is over: the token is gone, and a late heartbeat is only recorded.
    assert!(!node.driver_internal_info.contains_key("agent_secret_token"));
    assert!(!node.driver_internal_info.contains_key("agent_url"));
    h.manager
        .heartbeat(&id(uuid), heartbeat(Some(TOKEN)))
        .await
        .expect("late heartbeat recorded");
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::Active);
    assert!(!node.driver_internal_info.contains_key("agent_url"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_heartbeat_fails_the_deploy() {
    let h = Harness::new().await;
    let uuid = h.node_in(ProvisionState::WaitCallBack).await;
    h.flow
        .script_heartbeat(Script::Fail("agent: image checksum mismatch"));
    h.manager
        .heartbeat(&id(uuid), heartbeat(Some(TOKEN)))
        .await
        .expect("heartbeat accepted");
    h.settle().await;
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::DeployFailed);
    assert!(node
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains("checksum mismatch")));
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_done_at_once_is_active() {
    let h = Harness::new().await;
    let uuid = h.node_in(ProvisionState::DeployFailed).await;
    h.flow.script_deploy(Script::Done);
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Deploy, None)
        .await
        .expect("deploy accepted");
    h.settle().await;
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::Active);
    assert_eq!(node.target_provision_state, None);
    assert_eq!(node.reservation, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_ramdisk_times_out() {
    let h = Harness::with_config(config(
        Duration::from_millis(400),
        Duration::from_secs(3600),
    ))
    .await;
    let uuid = h.node_in(ProvisionState::Available).await;
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    h.manager
        .start_background(shutdown)
        .await
        .expect("background starts");
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Deploy, None)
        .await
        .expect("deploy accepted");
    let node = h
        .wait_until(uuid, "deploy failed by timeout", |n| {
            n.provision_state == ProvisionState::DeployFailed && n.reservation.is_none()
        })
        .await;
    let text = node.last_error.clone().unwrap_or_default();
    assert!(
        text.starts_with(&format!(
            "Timeout reached while waiting for callback for node {uuid}: "
        )) && text.contains("deploy_callback_timeout"),
        "{text}"
    );
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 1);
    assert!(!node.driver_internal_info.contains_key("agent_secret_token"));
}

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
        matches!(refused, Err(ManagerError::Invalid(_))),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_failure_lands_in_last_error() {
    let h = Harness::new().await;
    let mut node = Node::new(Uuid::new_v4(), "agent_ilo", ProvisionState::Available);
    node.driver_info = h.driver_info("wrong").as_object().expect("object").clone();
    h.store.create_node(&node).await.expect("create");
    h.manager
        .set_power_state(&id(node.uuid), NodePower::On, None)
        .await
        .expect("accepted");
    h.settle().await;
    let node = h.node(node.uuid).await;
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
    h.manager
        .set_power_state(&id(uuid), NodePower::On, None)
        .await
        .expect("power on");
    h.settle().await;
    assert_eq!(h.node(uuid).await.power_state, Some(NodePower::On));
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    h.manager
        .start_background(shutdown)
        .await
        .expect("background");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manage_checks_the_credentials() {
    let h = Harness::new().await;
    let good = h.node_in(ProvisionState::Enroll).await;
    let mut bad = Node::new(Uuid::new_v4(), "agent_ilo", ProvisionState::Enroll);
    bad.driver_info = h.driver_info("wrong").as_object().expect("object").clone();
    h.store.create_node(&bad).await.expect("create");
    for uuid in [good, bad.uuid] {
        h.manager
            .set_provision_state(&id(uuid), ProvisionVerb::Manage, None)
            .await
            .expect("manage accepted");
    }
    h.settle().await;
    let node = h.node(good).await;
    assert_eq!(node.provision_state, ProvisionState::Manageable);
    assert!(node.power_state.is_some());
    let node = h.node(bad.uuid).await;
    assert_eq!(node.provision_state, ProvisionState::Enroll);
    let error = node.last_error.expect("last_error");
    assert!(error.contains("verify the BMC credentials"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_maintenance_pass_deploy_info_validate_and_boot_device() {
    let h = Harness::new().await;
    let active = h.node_in(ProvisionState::Active).await;
    let refused = h.manager.delete_node(&id(active)).await;
    assert!(
        matches!(refused, Err(ManagerError::Conflict(_))),
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
        matches!(refused, Err(ManagerError::Invalid(_))),
        "{refused:?}"
    );
    h.manager
        .set_maintenance(&id(active), false, None)
        .await
        .expect("maintenance off");
    assert_eq!(h.node(active).await.maintenance_reason, None);

    let available = h.node_in(ProvisionState::Available).await;
    let port = Uuid::new_v4();
    h.store
        .create_port(&Port {
            uuid: port,
            address: "52:54:00:00:00:01".into(),
            node_uuid: available,
            pxe_enabled: true,
            extra: Default::default(),
            created_at: time::OffsetDateTime::now_utc(),
            updated_at: None,
        })
        .await
        .expect("port");
    let refused = h.manager.pass_deploy_info(&id(available), json!({})).await;
    assert!(
        matches!(refused, Err(ManagerError::Conflict(_))),
        "{refused:?}"
    );
    let waiting = h.node_in(ProvisionState::WaitCallBack).await;
    let refused = h.manager.pass_deploy_info(&id(waiting), json!({})).await;
    assert!(
        matches!(&refused, Err(ManagerError::Invalid(m)) if m.contains("iscsi_ilo")),
        "{refused:?}"
    );

    let lines = h.manager.validate(&id(available)).await.expect("validate");
    assert_eq!(lines["power"].result, Some(true), "{:?}", lines["power"]);
    assert_eq!(lines["deploy"].result, Some(true));
    assert_eq!(lines["console"].result, None);
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
        matches!(refused, Err(ManagerError::Invalid(_))),
        "{refused:?}"
    );

    h.manager.delete_node(&id(available)).await.expect("delete");
    assert!(h.store.node(&id(available)).await.is_err());
    assert!(
        h.store.port(port).await.is_err(),
        "the port went with its node"
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_needs_one_node_expecting_a_ramdisk() {
    let h = Harness::new().await;
    let port = |node: Uuid, mac: &str| Port {
        uuid: Uuid::new_v4(),
        address: mac.into(),
        node_uuid: node,
        pxe_enabled: true,
        extra: Default::default(),
        created_at: time::OffsetDateTime::now_utc(),
        updated_at: None,
    };
    let a = h.node_in(ProvisionState::WaitCallBack).await;
    let b = h.node_in(ProvisionState::WaitCallBack).await;
    h.store
        .create_port(&port(a, "52:54:00:00:00:0a"))
        .await
        .expect("port");
    h.store
        .create_port(&port(b, "52:54:00:00:00:0b"))
        .await
        .expect("port");
    let found = h
        .manager
        .lookup(
            &["52:54:00:00:00:0a".into(), "52:54:00:00:00:99".into()],
            None,
        )
        .await
        .expect("one node");
    assert_eq!(found.node["uuid"], json!(a));
    assert_eq!(found.config["agent_token"], json!("******"));
    let both = h
        .manager
        .lookup(
            &["52:54:00:00:00:0a".into(), "52:54:00:00:00:0b".into()],
            None,
        )
        .await;
    assert!(matches!(
        both,
        Err(ManagerError::Store(StoreError::NotFound { .. }))
    ));
    let unknown = h.manager.lookup(&["52:54:00:00:00:99".into()], None).await;
    assert!(matches!(
        unknown,
        Err(ManagerError::Store(StoreError::NotFound { .. }))
    ));
    let by_uuid = h.manager.lookup(&[], Some(b)).await.expect("by uuid");
    assert_eq!(by_uuid.node["uuid"], json!(b));
    let active = h.node_in(ProvisionState::Active).await;
    let refused = h.manager.lookup(&[], Some(active)).await;
    assert!(matches!(
        refused,
        Err(ManagerError::Store(StoreError::NotFound { .. }))
    ));
}

const DEPLOY_KEY: &str = "0123456789abcdef0123456789abcdef";

fn pass_deploy_info_body(key: &str, error: &str) -> Value {
    json!({
        "address": "10.0.2.15",
        "key": key,
        "iqn": "iqn-5b8f6a52-2a0e-4c4e-9d42-8c1f0b7e9a31",
        "error": error,
    })
}

impl Harness {
    /// A node of an iSCSI flow waiting for its ramdisk, holding its deploy key.
    async fn iscsi_waiting(&self) -> Uuid {
        self.flow.iscsi.store(true, Ordering::SeqCst);
        let uuid = self.node_in(ProvisionState::WaitCallBack).await;
        let mut node = self.node(uuid).await;
        node.driver_internal_info
            .insert("deployment_key".into(), json!(DEPLOY_KEY));
        self.store.update_node(&node).await.expect("update node");
        uuid
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_deploy_info_checks_body_state_driver_and_key_then_burns_the_key() {
    let h = Harness::new().await;
    let uuid = h.iscsi_waiting().await;
    let waiting = h.node(uuid).await;

    let missing_address = json!({"key": DEPLOY_KEY, "iqn": "iqn-x", "error": ""});
    for (body, what) in [
        (missing_address, "a body without address"),
        (
            json!({"address": 5, "key": DEPLOY_KEY}),
            "a body of the wrong types",
        ),
        (pass_deploy_info_body("", ""), "a body without key"),
    ] {
        let reply = h.manager.pass_deploy_info(&id(uuid), body).await;
        assert!(
            matches!(reply, Err(ManagerError::Invalid(_))),
            "{what}: {reply:?}"
        );
    }
    let reply = h
        .manager
        .pass_deploy_info(
            &id(uuid),
            pass_deploy_info_body("wrong-key-of-the-same-length-xxx", ""),
        )
        .await;
    assert!(
        matches!(reply, Err(ManagerError::Forbidden(_))),
        "wrong key: {reply:?}"
    );
    h.flow.iscsi.store(false, Ordering::SeqCst);
    let reply = h
        .manager
        .pass_deploy_info(&id(uuid), pass_deploy_info_body(DEPLOY_KEY, ""))
        .await;
    assert!(
        matches!(&reply, Err(ManagerError::Invalid(m)) if m.contains("heartbeats")),
        "an agent driver: {reply:?}"
    );
    assert_eq!(
        h.node(uuid).await,
        waiting,
        "a refused call changed the node"
    );
    assert!(h
        .flow
        .seen_pass_deploy_info
        .lock()
        .expect("lock")
        .is_empty());

    // The right key: accepted, burnt at once; a replay while the write runs is refused.
    h.flow.iscsi.store(true, Ordering::SeqCst);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    h.flow.script_pass_deploy_info(Script::Block(gate.clone()));
    h.manager
        .pass_deploy_info(&id(uuid), pass_deploy_info_body(DEPLOY_KEY, ""))
        .await
        .expect("the right key is accepted");
    let node = h.node(uuid).await;
    assert!(
        !node.driver_internal_info.contains_key("deployment_key"),
        "key burnt"
    );
    let replay = h
        .manager
        .pass_deploy_info(&id(uuid), pass_deploy_info_body(DEPLOY_KEY, ""))
        .await;
    assert!(
        matches!(replay, Err(ManagerError::Forbidden(_))),
        "replay: {replay:?}"
    );
    gate.add_permits(1);
    h.settle().await;
    assert_eq!(
        *h.flow.seen_pass_deploy_info.lock().expect("lock"),
        vec![(
            "10.0.2.15".to_string(),
            "iqn-5b8f6a52-2a0e-4c4e-9d42-8c1f0b7e9a31".to_string()
        )]
    );
    // The scripted flow said Wait: the node still waits, unreserved.
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::WaitCallBack);
    assert_eq!(node.reservation, None);

    // A node that is not waiting: 409, whatever the key.
    let active = h.node_in(ProvisionState::Active).await;
    let reply = h
        .manager
        .pass_deploy_info(&id(active), pass_deploy_info_body(DEPLOY_KEY, ""))
        .await;
    assert!(matches!(reply, Err(ManagerError::Conflict(_))), "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_deploy_info_done_makes_the_node_active_and_wipes_its_secrets() {
    let h = Harness::new().await;
    let uuid = h.iscsi_waiting().await;
    h.manager
        .pass_deploy_info(&id(uuid), pass_deploy_info_body(DEPLOY_KEY, ""))
        .await
        .expect("accepted");
    h.settle().await;
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::Active);
    assert_eq!(node.last_error, None);
    assert_eq!(node.reservation, None);
    for key in ["deployment_key", "agent_secret_token"] {
        assert!(!node.driver_internal_info.contains_key(key), "{key} left");
    }
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_from_the_ramdisk_or_the_write_fails_the_deploy_with_its_text() {
    let h = Harness::new().await;
    let reported = h.iscsi_waiting().await;
    let body = json!({"address": "", "key": DEPLOY_KEY, "iqn": "", "error": "no disk found"});
    h.manager
        .pass_deploy_info(&id(reported), body)
        .await
        .expect("the report is taken");
    h.settle().await;
    let node = h.node(reported).await;
    assert_eq!(node.provision_state, ProvisionState::DeployFailed);
    let error = node.last_error.clone().unwrap_or_default();
    assert!(error.contains("no disk found"), "{error}");
    assert!(!node.driver_internal_info.contains_key("deployment_key"));
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 1);
    assert!(
        h.flow
            .seen_pass_deploy_info
            .lock()
            .expect("lock")
            .is_empty(),
        "the flow never ran for a ramdisk that reported an error"
    );

    let failed_write = h.iscsi_waiting().await;
    h.flow
        .script_pass_deploy_info(Script::Fail("the iSCSI target went away mid-write"));
    h.manager
        .pass_deploy_info(&id(failed_write), pass_deploy_info_body(DEPLOY_KEY, ""))
        .await
        .expect("accepted");
    h.settle().await;
    let node = h.node(failed_write).await;
    assert_eq!(node.provision_state, ProvisionState::DeployFailed);
    let error = node.last_error.clone().unwrap_or_default();
    assert!(error.contains("went away mid-write"), "{error}");
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 2);
}

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
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Undeploy, None)
        .await
        .expect("undeploy accepted");
    h.settle().await;
    let node = h.node(uuid).await;
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
        Err(ManagerError::Forbidden(_))
    ));
    h.manager
        .heartbeat(&id(uuid), heartbeat(Some(TOKEN)))
        .await
        .expect("heartbeat accepted");
    h.settle().await;
    let node = h.node(uuid).await;
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
    h.manager
        .set_provision_state(&id(active), ProvisionVerb::Undeploy, None)
        .await
        .expect("undeploy");
    h.manager
        .set_provision_state(&id(manageable), ProvisionVerb::Provide, None)
        .await
        .expect("provide");
    h.settle().await;
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
    h.manager
        .set_power_state(&id(uuid), NodePower::On, None)
        .await
        .expect("power on");
    h.settle().await;
    assert_eq!(h.emulator_power().await, EmuPower::On);
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Provide, None)
        .await
        .expect("provide accepted");
    h.settle().await;
    assert_eq!(
        h.node(uuid).await.provision_state,
        ProvisionState::CleanWait
    );
    h.flow
        .clean_heartbeats
        .lock()
        .expect("lock")
        .push_back(Script::Fail(
            "clean step erase_devices_metadata failed on the node: disk gone (CleaningError)",
        ));
    h.manager
        .heartbeat(&id(uuid), heartbeat(Some(TOKEN)))
        .await
        .expect("heartbeat accepted");
    h.settle().await;
    let node = h.node(uuid).await;
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
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Manage, None)
        .await
        .expect("manage accepted");
    h.settle().await;
    assert_eq!(
        h.node(uuid).await.provision_state,
        ProvisionState::Manageable
    );
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Provide, None)
        .await
        .expect("provide again");
    h.settle().await;
    assert_eq!(
        h.node(uuid).await.provision_state,
        ProvisionState::CleanWait
    );
    assert_eq!(h.flow.cleanings.load(Ordering::SeqCst), 2);
    h.manager
        .heartbeat(&id(uuid), heartbeat(Some(TOKEN)))
        .await
        .expect("heartbeat");
    h.settle().await;
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::Available);
    assert_eq!(node.last_error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ramdisk_that_cannot_boot_or_never_calls_fails_the_cleaning() {
    let h = cleaning_harness(Duration::from_millis(400)).await;
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    h.manager
        .start_background(shutdown)
        .await
        .expect("background starts");
    // The ramdisk cannot be booted (virtual media refused, say).
    let refused = h.node_in(ProvisionState::Manageable).await;
    h.flow
        .clean_prepares
        .lock()
        .expect("lock")
        .push_back(Script::Fail("inserting the virtual CD failed"));
    h.manager
        .set_provision_state(&id(refused), ProvisionVerb::Provide, None)
        .await
        .expect("provide accepted");
    let node = h
        .wait_until(refused, "clean failed", |n| {
            n.provision_state == ProvisionState::CleanFailed && n.reservation.is_none()
        })
        .await;
    let error = node.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("booting the agent ramdisk") && error.contains("virtual CD"),
        "{error}"
    );
    // The ramdisk boots but never heartbeats.
    let silent = h.node_in(ProvisionState::Manageable).await;
    h.manager
        .set_provision_state(&id(silent), ProvisionVerb::Provide, None)
        .await
        .expect("provide accepted");
    let node = h
        .wait_until(silent, "clean failed by timeout", |n| {
            n.provision_state == ProvisionState::CleanFailed && n.reservation.is_none()
        })
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
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Provide, None)
        .await
        .expect("provide");
    h.settle().await;
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Abort, None)
        .await
        .expect("abort");
    h.settle().await;
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::CleanFailed);
    assert_eq!(h.flow.clean_ups.load(Ordering::SeqCst), 1);
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

impl Harness {
    /// `driver_info` of a `redfish` node as Ironic's redfish hardware type takes it: only
    /// `redfish_*` keys, the address a URL, the system named by its path.
    fn redfish_driver_info(&self, password: &str) -> Value {
        json!({
            "redfish_address": format!("https://{}", self.emulator.addresses()[0]),
            "redfish_system_id": "/redfish/v1/Systems/1",
            "redfish_username": "Administrator",
            "redfish_password": password,
            "redfish_verify_ca": self.cert.to_string_lossy(),
        })
    }

    async fn redfish_node(&self, password: &str) -> Uuid {
        let mut node = Node::new(Uuid::new_v4(), "redfish", ProvisionState::Enroll);
        node.driver_info = self
            .redfish_driver_info(password)
            .as_object()
            .expect("object")
            .clone();
        self.store.create_node(&node).await.expect("create node");
        node.uuid
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redfish_node_with_ironics_keys_is_managed_validated_and_powered() {
    let h = Harness::new().await;
    let uuid = h.redfish_node("password").await;
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Manage, None)
        .await
        .expect("manage accepted");
    h.settle().await;
    let node = h.node(uuid).await;
    assert_eq!(
        node.provision_state,
        ProvisionState::Manageable,
        "{:?}",
        node.last_error
    );
    assert_eq!(node.power_state, Some(NodePower::Off));

    let lines = h.manager.validate(&id(uuid)).await.expect("validate");
    for interface in ["power", "management"] {
        assert_eq!(
            lines[interface].result,
            Some(true),
            "{interface}: {:?}",
            lines[interface]
        );
    }

    h.manager
        .set_power_state(&id(uuid), NodePower::On, None)
        .await
        .expect("power on accepted");
    h.settle().await;
    let node = h.node(uuid).await;
    assert_eq!(node.last_error, None);
    assert_eq!(node.power_state, Some(NodePower::On));
    assert_eq!(h.emulator_power().await, EmuPower::On);
    let reading = h.manager.boot_device(&id(uuid)).await.expect("boot device");
    assert!(reading.persistent.is_some(), "{reading:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redfish_node_with_a_wrong_password_is_told_about_its_redfish_keys() {
    let h = Harness::new().await;
    let uuid = h.redfish_node("wrong").await;
    h.manager
        .set_provision_state(&id(uuid), ProvisionVerb::Manage, None)
        .await
        .expect("manage accepted");
    h.settle().await;
    let node = h.node(uuid).await;
    assert_eq!(node.provision_state, ProvisionState::Enroll);
    let error = node.last_error.expect("last_error");
    assert!(error.contains("redfish_password"), "{error}");
    assert!(!error.contains("ilo_"), "an iLO key named: {error}");
    assert!(!error.contains("wrong"), "the password leaked: {error}");
}
