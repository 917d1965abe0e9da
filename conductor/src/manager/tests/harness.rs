//! What every manager test stands on: a real SQLite store, the in-process iLO emulator and a
//! scripted deploy flow standing in for the real ones; it returns what each test scripts and
//! counts its clean-ups.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uuid::Uuid;
use vmdeploy_ilo_emulator::{Emulator, EmulatorConfig, Power as EmuPower};
use vmdeploy_shared::api::ipa::ValidHeartbeat;
use vmdeploy_shared::api::{PassDeployInfo, ValidPassDeployInfo};
use vmdeploy_shared::secret::Secret;

use crate::deploy::{DeployConfig, DeployInterface, DeployStep};
use crate::manager::*;
use crate::objects::{ObjectBody, ObjectError, ObjectInfo, ObjectPath, PutOptions};
use crate::states::ProvisionState;
use crate::store::sqlite::SqliteStore;
use crate::store::StoreError;
use crate::store::{Node, Port};

pub(super) const TOKEN: &str = "pre-generated-agent-token-of-43-characters-xx";

/// What one call of the scripted flow does.
pub(super) enum Script {
    Wait,
    Done,
    Fail(&'static str),
    Panic,
    /// Waits until the test adds a permit, then returns `Wait`.
    Block(Arc<tokio::sync::Semaphore>),
}

/// A deploy interface that follows a script (default: deploy waits, heartbeat finishes).
#[derive(Default)]
pub(super) struct ScriptedFlow {
    pub(super) deploys: Mutex<VecDeque<Script>>,
    pub(super) heartbeats: Mutex<VecDeque<Script>>,
    pub(super) pass_deploy_infos: Mutex<VecDeque<Script>>,
    /// Whether the flow is an iSCSI one (takes `pass_deploy_info`).
    pub(super) iscsi: std::sync::atomic::AtomicBool,
    /// (address, iqn) of each `pass_deploy_info` the flow got.
    pub(super) seen_pass_deploy_info: Mutex<Vec<(String, String)>>,
    pub(super) clean_ups: AtomicUsize,
    pub(super) tear_downs: AtomicUsize,
    /// Scripts of `prepare_cleaning` and `clean_heartbeat` (`Wait`/`Done` succeed).
    pub(super) clean_prepares: Mutex<VecDeque<Script>>,
    pub(super) clean_heartbeats: Mutex<VecDeque<Script>>,
    /// Calls of `prepare_cleaning` and `clean_heartbeat`.
    pub(super) cleanings: AtomicUsize,
    pub(super) clean_steps_run: AtomicUsize,
    pub(super) validate_error: Mutex<Option<String>>,
}

impl ScriptedFlow {
    pub(super) fn script_deploy(&self, s: Script) {
        self.deploys.lock().expect("lock").push_back(s);
    }
    pub(super) fn script_heartbeat(&self, s: Script) {
        self.heartbeats.lock().expect("lock").push_back(s);
    }
    pub(super) fn script_pass_deploy_info(&self, s: Script) {
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
        _heartbeat: &ValidHeartbeat,
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
        info: &ValidPassDeployInfo,
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
        _heartbeat: &ValidHeartbeat,
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

pub(super) struct Harness {
    pub(super) manager: Arc<Manager>,
    pub(super) store: Arc<SqliteStore>,
    pub(super) flow: Arc<ScriptedFlow>,
    pub(super) emulator: Emulator,
    pub(super) cert: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

pub(super) fn config(callback_timeout: Duration, sync: Duration) -> ManagerConfig {
    ManagerConfig {
        deploy_callback_timeout: callback_timeout,
        power_sync_interval: sync,
        automated_clean: false,
        conductor_name: "cond-test".into(),
        sync_power_state_workers: crate::manager::DEFAULT_SYNC_POWER_STATE_WORKERS,
        conductor_group: String::new(),
        heartbeat_interval: crate::manager::DEFAULT_HEARTBEAT_INTERVAL,
        heartbeat_timeout: crate::manager::DEFAULT_HEARTBEAT_TIMEOUT,
    }
}

impl Harness {
    pub(super) async fn new() -> Harness {
        Harness::with_config(config(Duration::from_secs(1800), Duration::from_secs(60))).await
    }

    pub(super) async fn with_config(config: ManagerConfig) -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(&dir.path().join("vmdeploy.sqlite")).expect("store opens");
        Harness::on_store(dir, store, config).await
    }

    /// A manager on the SQLite database at `path` (kept when the harness goes, so a second
    /// harness can reopen it as a restarted conductor would).
    pub(super) async fn on_database(path: &std::path::Path) -> Harness {
        Harness::on_store(
            tempfile::tempdir().expect("temp dir"),
            SqliteStore::open(path).expect("store opens"),
            config(Duration::from_secs(1800), Duration::from_secs(3600)),
        )
        .await
    }

    pub(super) async fn on_store(
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

    pub(super) fn driver_info(&self, password: &str) -> Value {
        json!({
            "ilo_address": self.emulator.addresses()[0].to_string(),
            "ilo_username": "Administrator",
            "ilo_password": password,
            "ilo_verify_ca": self.cert.to_string_lossy(),
            "ilo_protocol": "ribcl",
            "client_timeout": 10,
        })
    }

    /// An `agent_ilo` node in `state` whose BMC takes the password.
    pub(super) async fn node_in(&self, state: ProvisionState) -> Uuid {
        self.ilo_node(state, "password").await
    }

    /// An `agent_ilo` node in `state` that gives the emulated iLO `password`.
    pub(super) async fn ilo_node(&self, state: ProvisionState, password: &str) -> Uuid {
        self.create_node("agent_ilo", state, self.driver_info(password))
            .await
    }

    /// Stores a `driver` node in `state` with `driver_info`. A node waiting for its call-back
    /// holds the agent token and has just changed state, as after the flow booted the ramdisk.
    pub(super) async fn create_node(
        &self,
        driver: &str,
        state: ProvisionState,
        driver_info: Value,
    ) -> Uuid {
        let mut node = Node::new(Uuid::new_v4(), driver, state);
        node.driver_info = driver_info.as_object().expect("object").clone();
        if state == ProvisionState::WaitCallBack {
            node.driver_internal_info
                .insert("agent_secret_token".into(), json!(TOKEN));
            node.provision_updated_at = Some(time::OffsetDateTime::now_utc());
        }
        self.store.create_node(&node).await.expect("create node");
        node.uuid
    }

    /// Adds a PXE-enabled port with `mac` to `node`; returns the port's UUID.
    pub(super) async fn add_port(&self, node: Uuid, mac: &str) -> Uuid {
        let port = Port {
            uuid: Uuid::new_v4(),
            address: mac.into(),
            node_uuid: node,
            pxe_enabled: true,
            extra: Default::default(),
            created_at: time::OffsetDateTime::now_utc(),
            updated_at: None,
        };
        self.store.create_port(&port).await.expect("create port");
        port.uuid
    }

    /// Asks for `verb` on the node; its task may still run.
    pub(super) async fn request(&self, uuid: Uuid, verb: ProvisionVerb) {
        self.manager
            .set_provision_state(&id(uuid), verb, None)
            .await
            .unwrap_or_else(|e| panic!("{verb:?} refused: {e}"));
    }

    /// Asks for `verb` on the node, waits for its task and returns the node.
    pub(super) async fn provision(&self, uuid: Uuid, verb: ProvisionVerb) -> Node {
        self.request(uuid, verb).await;
        self.settle().await;
        self.node(uuid).await
    }

    /// Asks for `target` power on the node, waits for its task and returns the node.
    pub(super) async fn power(&self, uuid: Uuid, target: NodePower) -> Node {
        self.manager
            .set_power_state(&id(uuid), target, None)
            .await
            .unwrap_or_else(|e| panic!("power {target} refused: {e}"));
        self.settle().await;
        self.node(uuid).await
    }

    /// The agent's heartbeat with the right token, waited for; returns the node.
    pub(super) async fn heartbeat_ok(&self, uuid: Uuid) -> Node {
        self.manager
            .heartbeat(&id(uuid), heartbeat(Some(TOKEN)))
            .await
            .expect("heartbeat accepted");
        self.settle().await;
        self.node(uuid).await
    }

    /// Starts recovery and the periodic duties; they run until the returned sender sends
    /// `true` or is dropped.
    pub(super) async fn start_background(&self) -> tokio::sync::watch::Sender<bool> {
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        self.manager
            .start_background(shutdown)
            .await
            .expect("background duties start");
        stop
    }

    pub(super) async fn node(&self, uuid: Uuid) -> Node {
        self.store
            .node(&NodeIdent::Uuid(uuid))
            .await
            .expect("node exists")
    }

    /// Waits until every task is done.
    pub(super) async fn settle(&self) {
        self.manager.drain(Duration::from_secs(20)).await;
        assert_eq!(self.manager.running_tasks(), 0, "tasks still running");
    }

    pub(super) async fn emulator_power(&self) -> EmuPower {
        self.emulator.state(0).await.expect("server 0").state.power
    }

    /// Waits until the node is in `state` with no task holding it.
    pub(super) async fn wait_released_in(&self, uuid: Uuid, state: ProvisionState) -> Node {
        self.wait_until(uuid, &format!("{state}, released"), |n| {
            n.provision_state == state && n.reservation.is_none()
        })
        .await
    }

    pub(super) async fn wait_until(
        &self,
        uuid: Uuid,
        what: &str,
        cond: impl Fn(&Node) -> bool,
    ) -> Node {
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

pub(super) fn id(uuid: Uuid) -> NodeIdent {
    NodeIdent::Uuid(uuid)
}

pub(super) fn heartbeat(token: Option<&str>) -> ValidHeartbeat {
    ValidHeartbeat {
        callback_url: "https://127.0.0.1:9999".into(),
        agent_token: token.map(Secret::from),
        agent_version: Some("10.0.0".into()),
        agent_verify_ca: None,
        agent_status: None,
        agent_status_message: None,
    }
}

/// A `pass_deploy_info` as the API hands it over: the iSCSI ramdisk's report with `key`, and
/// its `error` (empty on success; an error report carries no address and no target).
pub(super) fn pass_deploy_info_body(key: &str, error: &str) -> ValidPassDeployInfo {
    let served = error.is_empty();
    PassDeployInfo {
        address: if served { "10.0.2.15" } else { "" }.into(),
        key: Secret::new(key),
        iqn: if served {
            "iqn-5b8f6a52-2a0e-4c4e-9d42-8c1f0b7e9a31"
        } else {
            ""
        }
        .into(),
        error: Some(error.into()),
    }
    .validate()
    .expect("a body the API accepts")
}

pub(super) fn is_locked(result: &Result<(), ManagerError>) -> bool {
    matches!(result, Err(ManagerError::Store(StoreError::Locked { .. })))
}
