//! The set-up the conductor's deploy tests share (`conductor_*.rs`): the iLO emulator as a
//! process, the built-in object store over TLS, the real [`Manager`] on a SQLite file (one
//! [`Conductor::builder`] for every flow and option), the conductor's real API router
//! ([`Api`]) in front of it, and the agent binary as a process.
//!
//! The API is the service's own router, not a stand-in: the ramdisk's `lookup`, heartbeats and
//! `pass_deploy_info` get exactly the status codes, fault bodies and masked node the service
//! gives (a refused token or deploy key is a 403).
//!
//! One CA ([`TestPki`]) signs the built-in store's certificate and goes on the floppy as the
//! conductor's CA (`ipa-agent-ca`), as the service's `tls = "auto"` does; the agent then trusts
//! the store's temp URLs. The API itself is plain HTTP on loopback.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use vmdeploy_conductor::deploy::agent::AgentDeploy;
use vmdeploy_conductor::deploy::{DeployConfig, DeployContext, DeployInterface};
use vmdeploy_conductor::manager::{Manager, ManagerConfig};
use vmdeploy_conductor::node::hardware_type::{DeployMethod, NodeInterfaces};
use vmdeploy_conductor::objects::builtin::{BuiltinConfig, BuiltinStore};
use vmdeploy_conductor::objects::ObjectStore;
use vmdeploy_conductor::states::ProvisionState;
use vmdeploy_conductor::store::sqlite::SqliteStore;
use vmdeploy_conductor::store::{JsonObject, Node, NodeIdent, Port, Store};
use vmdeploy_shared::secret::Secret;

use crate::child::ChildGuard;
use crate::http::TestPki;
use crate::{bin, free_port};

/// The emulator's credentials.
pub const USER: &str = "deployer";
/// The emulator's password.
pub const PASSWORD: &str = "flow-pass";
/// The MAC of the node's one port (the agent is started with it).
pub const MAC: &str = "52:54:00:12:34:56";
/// The object store container of floppies and uploaded images.
pub const CONTAINER: &str = "vmdeploy-test";
/// The floppy's lifetime (`deploy_helper_images_ttl`).
pub const FLOPPY_TTL: Duration = Duration::from_secs(600);
/// The conductor name of the Manager (prefix of its reservations).
pub const CONDUCTOR: &str = "conductor-test";

/// A JSON object from a `json!` literal.
pub fn obj(v: Value) -> JsonObject {
    match v {
        Value::Object(o) => o,
        other => panic!("not an object: {other}"),
    }
}

/// The flows' settings in these tests: the API at `api_url`, `ca_pem` on the floppy, floppies in
/// [`CONTAINER`] for [`FLOPPY_TTL`], agents over HTTPS only.
pub fn deploy_config(api_url: String, ca_pem: Option<String>) -> DeployConfig {
    DeployConfig {
        api_url,
        api_ca_pem: ca_pem,
        container: CONTAINER.into(),
        deploy_helper_images_ttl: FLOPPY_TTL,
        agent_allow_plain_http: false,
        agent_call_timeout: Duration::from_secs(30),
        agent_power_off_wait: Duration::from_secs(2),
        ilo_defaults: Default::default(),
        iscsi_port: vmdeploy_conductor::deploy::ISCSI_PORT,
        done_port: vmdeploy_conductor::deploy::DONE_PORT,
        done: Default::default(),
        iscsi_chap: None,
    }
}

// ---------------------------------------------------------------------------------------------
// The iLO emulator.

/// A running `ilo-emulator`, killed on drop.
pub struct Emulator {
    _child: ChildGuard,
    /// `host:port` of its HTTPS server.
    pub address: String,
    /// Its certificate (PEM file), for `ilo_verify_ca`.
    pub cert: PathBuf,
    _dir: tempfile::TempDir,
}

impl Emulator {
    /// Starts the emulator with [`USER`]/`password` and `extra` arguments.
    pub fn start_with_password(password: &str, extra: &[&str]) -> Emulator {
        let dir = tempfile::tempdir().expect("temp dir");
        let cert = dir.path().join("cert.pem");
        let (child, address) = crate::emulator::spawn(USER, password, &cert, extra);
        Emulator {
            _child: child,
            address,
            cert,
            _dir: dir,
        }
    }

    /// Starts the emulator with [`USER`]/[`PASSWORD`].
    pub fn start(extra: &[&str]) -> Emulator {
        Emulator::start_with_password(PASSWORD, extra)
    }

    /// `curl` as a plain HTTPS client of the admin API.
    pub fn admin(&self, method: &str, path: &str) -> Value {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(&self.cert)
            .args(["-X", method, &format!("https://{}{path}", self.address)])
            .output()
            .expect("running curl (fix: apt-get install curl)");
        assert!(
            out.status.success(),
            "curl {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// `GET /_emulator/state`.
    pub fn state(&self) -> Value {
        self.admin("GET", "/_emulator/state")
    }

    /// The node's `driver_info` for this emulator (RIBCL).
    pub fn driver_info(&self) -> JsonObject {
        obj(json!({
            "ilo_address": self.address,
            "ilo_username": USER,
            "ilo_password": PASSWORD,
            "ilo_verify_ca": self.cert.display().to_string(),
            "ilo_protocol": "ribcl",
        }))
    }

    /// Powers the host on through the conductor's own iLO client.
    pub async fn power_on(&self) {
        use vmdeploy_conductor::drivers::ilo::IloClient;
        use vmdeploy_conductor::drivers::{Power, PowerAction};
        use vmdeploy_conductor::node::driver_info::{IloDefaults, IloDriverInfo};
        let config = IloDriverInfo::parse(&self.driver_info(), &IloDefaults::default())
            .expect("config")
            .config;
        let client = IloClient::connect(&config).await.expect("connecting");
        client.set_power(PowerAction::On).await.expect("power on");
        assert_eq!(self.state()["power"], "ON");
    }

    /// Asserts that both virtual media are ejected.
    pub fn assert_media_ejected(&self) {
        let state = self.state();
        assert_eq!(state["vmedia"]["FLOPPY"]["inserted"], false, "{state}");
        assert_eq!(state["vmedia"]["CDROM"]["inserted"], false, "{state}");
    }
}

// ---------------------------------------------------------------------------------------------
// The built-in object store.

/// The built-in store serving over TLS with a certificate of the test CA; stopped on drop.
pub struct Builtin {
    /// The store.
    pub store: Arc<BuiltinStore>,
    stop: watch::Sender<bool>,
    _dir: tempfile::TempDir,
}

impl Builtin {
    /// Starts the store in a fresh directory on 127.0.0.1 with `pki`'s server certificate.
    pub async fn start(pki: &TestPki) -> Builtin {
        let dir = tempfile::tempdir().expect("temp dir");
        let (stop, shutdown) = watch::channel(false);
        let (store, _addr) = BuiltinStore::start(
            BuiltinConfig {
                root: dir.path().join("objects"),
                listen: "127.0.0.1:0".parse().expect("address"),
                public_url: None,
                temp_url_key: Secret::new("conductor-env-temp-url-key"),
                tls: Arc::clone(&pki.server_config),
            },
            shutdown,
        )
        .await
        .expect("the built-in store starts");
        Builtin {
            store,
            stop,
            _dir: dir,
        }
    }

    /// The store as the Manager sees it.
    pub fn objects(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.store) as Arc<dyn ObjectStore>
    }

    /// Stops serving (the object directory stays).
    pub async fn shut_down(&self) {
        let _ = self.stop.send(true);
        let port = self
            .store
            .public_url()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .expect("the public URL names a port");
        let started = Instant::now();
        while crate::tcp_listening(port) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the built-in store still listens 10 s after its shutdown"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Builtin {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

// ---------------------------------------------------------------------------------------------
// The API and the Manager.

/// Binds the API's port first, because its URL goes on the floppy the Manager builds.
pub async fn api_listener() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding the API");
    let addr = listener.local_addr().expect("bound address");
    (listener, format!("http://{addr}"))
}

/// Binds the API's port ([`api_listener`]) and the settings naming its URL, with `ca_pem` for
/// the floppy and `callback_timeout` for the ramdisk's call-backs.
pub async fn api_settings(
    ca_pem: Option<String>,
    callback_timeout: Duration,
) -> (tokio::net::TcpListener, Settings) {
    let (listener, api_url) = api_listener().await;
    let settings = Settings {
        api_url,
        ca_pem,
        callback_timeout,
    };
    (listener, settings)
}

/// The conductor's real API router ([`vmdeploy_conductor::api::router`]: every `/v1`
/// resource, and the unversioned paths old ramdisks post to) serving a Manager on loopback, as
/// `vmdeploy-conductor serve` does, so the ramdisk's calls get the status codes, fault bodies
/// and masking the service gives. It counts the ramdisk call-backs (heartbeats and
/// `pass_deploy_info`) it answers 202 (accepted) and 403 (refused). Stops on drop.
pub struct Api {
    refused: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
    stop: watch::Sender<bool>,
}

impl Drop for Api {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl Api {
    /// Serves `manager`'s API on `listener` (from [`api_listener`]).
    pub fn serve(listener: tokio::net::TcpListener, manager: Arc<Manager>) -> Api {
        let refused = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counters = (Arc::clone(&refused), Arc::clone(&accepted));
        let router = vmdeploy_conductor::api::router(manager, Default::default()).layer(
            axum::middleware::from_fn(
                move |req: axum::extract::Request, next: axum::middleware::Next| {
                    let (refused, accepted) = counters.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let response = next.run(req).await;
                        if path.contains("/heartbeat/") || path.ends_with("/pass_deploy_info") {
                            match response.status() {
                                StatusCode::ACCEPTED => accepted.fetch_add(1, Ordering::SeqCst),
                                StatusCode::FORBIDDEN => refused.fetch_add(1, Ordering::SeqCst),
                                _ => 0,
                            };
                        }
                        response
                    }
                },
            ),
        );
        let (stop, mut stopped) = watch::channel(false);
        tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await;
        });
        Api {
            refused,
            accepted,
            stop,
        }
    }

    /// Call-backs the API refused with 403 (wrong or missing token, wrong deploy key).
    pub fn refused_heartbeats(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    /// Call-backs the API accepted (202).
    pub fn accepted_heartbeats(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// How a test conductor is set up.
#[derive(Clone)]
pub struct Settings {
    /// The API URL on the floppy.
    pub api_url: String,
    /// The conductor's CA (on the floppy as `ipa-agent-ca`).
    pub ca_pem: Option<String>,
    /// `deploy_callback_timeout`.
    pub callback_timeout: Duration,
}

/// The `agent_ilo` flow as the Manager runs it, with a short wait for the host to go down
/// after the agent's `standby.power_off` (the agent is a process here: the emulated host never
/// powers itself off, so the iLO always powers it off after this wait).
pub fn agent_flow(context: Arc<DeployContext>) -> Arc<dyn DeployInterface> {
    Arc::new(AgentDeploy::new(context).with_agent_power_off_wait(Duration::from_secs(1)))
}

/// The real `iscsi_ilo` flow.
fn iscsi_flow(context: Arc<DeployContext>) -> Arc<dyn DeployInterface> {
    Arc::new(vmdeploy_conductor::deploy::iscsi::IscsiDeploy::new(context))
}

/// A deploy flow the test's Manager runs, built from the Manager's context.
pub type Flow = fn(Arc<DeployContext>) -> Arc<dyn DeployInterface>;

/// The real Manager on the SQLite file `db` over `objects`, background duties (recovery,
/// callback timeouts) started. Built with [`Conductor::builder`].
pub struct Conductor {
    /// The Manager.
    pub manager: Arc<Manager>,
    /// The node store (the same SQLite file).
    pub nodes: Arc<SqliteStore>,
    stop: watch::Sender<bool>,
}

impl Drop for Conductor {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// A change to the flows' settings, made after [`deploy_config`] (see [`ConductorBuilder::tune`]).
pub type Tune = Box<dyn FnOnce(&mut DeployConfig) + Send>;

/// A [`Conductor`] to be started: by default the agent drivers' flow is [`agent_flow`], with no
/// image cache, no boot ISO store and no automated cleaning; each method changes one part.
pub struct ConductorBuilder {
    db: PathBuf,
    objects: Arc<dyn ObjectStore>,
    settings: Settings,
    deploy_method: DeployMethod,
    flow: Flow,
    images: Option<Arc<vmdeploy_conductor::image_cache::ImageCache>>,
    boot_isos: Option<Arc<vmdeploy_conductor::boot::vmedia::boot_iso::BootIsos>>,
    tune: Option<Tune>,
    automated_clean: bool,
}

impl ConductorBuilder {
    /// Runs the agent drivers' nodes through `flow` instead of [`agent_flow`].
    pub fn agent_flow(mut self, flow: Flow) -> ConductorBuilder {
        self.deploy_method = DeployMethod::Agent;
        self.flow = flow;
        self
    }

    /// Runs the iSCSI drivers' nodes through the real `iscsi_ilo` flow, with `images` as the
    /// instance image cache (the conductor writes the image itself).
    pub fn iscsi(
        mut self,
        images: Arc<vmdeploy_conductor::image_cache::ImageCache>,
    ) -> ConductorBuilder {
        self.deploy_method = DeployMethod::Iscsi;
        self.flow = iscsi_flow;
        self.images = Some(images);
        self
    }

    /// Gives the flows a boot ISO store (netboot instances).
    pub fn boot_isos(
        mut self,
        isos: Arc<vmdeploy_conductor::boot::vmedia::boot_iso::BootIsos>,
    ) -> ConductorBuilder {
        self.boot_isos = Some(isos);
        self
    }

    /// Changes the flows' settings after [`deploy_config`] made them.
    pub fn tune(
        mut self,
        tune: impl FnOnce(&mut DeployConfig) + Send + 'static,
    ) -> ConductorBuilder {
        self.tune = Some(Box::new(tune));
        self
    }

    /// Turns `deploy.automated_clean` on: undeploy and provide clean the node through the agent.
    pub fn automated_clean(mut self) -> ConductorBuilder {
        self.automated_clean = true;
        self
    }

    /// Opens the SQLite file, builds the Manager with the test's flow and starts its recovery
    /// and background duties.
    pub async fn start(self) -> Conductor {
        let mut config = deploy_config(self.settings.api_url.clone(), self.settings.ca_pem.clone());
        if let Some(tune) = self.tune {
            tune(&mut config);
        }
        let nodes = SqliteStore::open(&self.db).expect("opening SQLite");
        let context = Arc::new(DeployContext {
            store: Arc::clone(&nodes) as Arc<dyn Store>,
            objects: self.objects,
            config,
            images: self.images,
            boot_isos: self.boot_isos,
            netboot: None,
        });
        let manager = Arc::new(Manager::new(
            Arc::clone(&context),
            ManagerConfig {
                deploy_callback_timeout: self.settings.callback_timeout,
                power_sync_interval: Duration::from_secs(3600),
                automated_clean: self.automated_clean,
                conductor_name: CONDUCTOR.into(),
                sync_power_state_workers:
                    vmdeploy_conductor::manager::DEFAULT_SYNC_POWER_STATE_WORKERS,
                conductor_group: String::new(),
                heartbeat_interval: vmdeploy_conductor::manager::DEFAULT_HEARTBEAT_INTERVAL,
                heartbeat_timeout: vmdeploy_conductor::manager::DEFAULT_HEARTBEAT_TIMEOUT,
            },
        ));
        let flow = (self.flow)(context);
        let deploy_method = self.deploy_method;
        // The test's flow runs every node whose deploy interface is the one it stands for.
        manager.set_deploy_resolver(Arc::new(move |node: &Node| {
            NodeInterfaces::of(node)
                .is_ok_and(|i| i.deploy_method() == deploy_method)
                .then(|| Arc::clone(&flow))
        }));
        let (stop, shutdown) = watch::channel(false);
        manager
            .start_background(shutdown)
            .await
            .expect("recovery and background duties start");
        Conductor {
            manager,
            nodes,
            stop,
        }
    }
}

impl Conductor {
    /// A conductor on the SQLite file `db` (created when missing, reopened as a restarted
    /// service does otherwise) over `objects`, set up as `settings` say.
    pub fn builder(
        db: &Path,
        objects: Arc<dyn ObjectStore>,
        settings: &Settings,
    ) -> ConductorBuilder {
        ConductorBuilder {
            db: db.to_path_buf(),
            objects,
            settings: settings.clone(),
            deploy_method: DeployMethod::Agent,
            flow: agent_flow,
            images: None,
            boot_isos: None,
            tune: None,
            automated_clean: false,
        }
    }

    /// The node as stored.
    pub async fn node(&self, uuid: uuid::Uuid) -> Node {
        self.nodes
            .node(&NodeIdent::Uuid(uuid))
            .await
            .expect("the node is stored")
    }

    /// Waits until the node is in one of `states` (not reserved), failing after `limit`.
    pub async fn wait_for(
        &self,
        uuid: uuid::Uuid,
        states: &[ProvisionState],
        limit: Duration,
    ) -> Node {
        let started = Instant::now();
        loop {
            let node = self.node(uuid).await;
            if states.contains(&node.provision_state) && node.reservation.is_none() {
                return node;
            }
            assert!(
                started.elapsed() < limit,
                "node not in {states:?} within {limit:?}: {} (last_error {:?}, reservation {:?})",
                node.provision_state,
                node.last_error,
                node.reservation
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Deletes the node's ports, so that the next node enrolled may take the same MAC.
    pub async fn forget_ports(&self, node: uuid::Uuid) {
        let ports = self
            .nodes
            .list_ports(&vmdeploy_conductor::store::PortFilter {
                node_uuid: Some(node),
                ..vmdeploy_conductor::store::PortFilter::default()
            })
            .await
            .expect("listing the node's ports");
        for port in ports {
            self.nodes
                .delete_port(port.uuid)
                .await
                .expect("deleting a port");
        }
    }

    /// `PUT .../states/provision {"target": "active"}`, then waits for a state after it.
    pub async fn deploy(&self, uuid: uuid::Uuid, limit: Duration) -> Node {
        self.manager
            .set_provision_state(
                &NodeIdent::Uuid(uuid),
                vmdeploy_conductor::states::ProvisionVerb::Deploy,
                None,
            )
            .await
            .expect("the deploy verb is accepted");
        self.wait_for(
            uuid,
            &[
                ProvisionState::WaitCallBack,
                ProvisionState::DeployFailed,
                ProvisionState::Active,
            ],
            limit,
        )
        .await
    }
}

// ---------------------------------------------------------------------------------------------
// The node and its media.

/// The deploy ISO and instance image of a node, as conductor-local files.
pub struct Media {
    /// The deploy ISO (64 KiB of 0x5a).
    pub iso: PathBuf,
    /// The instance image.
    pub image: PathBuf,
    /// The directory holding them (and the agent's files).
    pub dir: tempfile::TempDir,
}

impl Media {
    /// Writes the ISO and `image` into a fresh directory.
    pub fn new(image: &[u8]) -> Media {
        let dir = tempfile::tempdir().expect("temp dir");
        let iso = dir.path().join("deploy.iso");
        std::fs::write(&iso, vec![0x5a; 64 * 1024]).expect("writing the deploy ISO stand-in");
        let path = dir.path().join("instance.raw");
        std::fs::write(&path, image).expect("writing the image");
        Media {
            iso,
            image: path,
            dir,
        }
    }
}

/// Enrolls an `agent_ilo` node in `state` with `driver_info`, the media's ISO and image
/// (`sha256` of `image`), `properties`, one PXE-enabled port with [`MAC`] and a static network.
pub async fn enroll(
    nodes: &SqliteStore,
    state: ProvisionState,
    driver_info: JsonObject,
    media: &Media,
    image: &[u8],
    properties: Value,
) -> Node {
    let mut node = Node::new(uuid::Uuid::new_v4(), "agent_ilo", state);
    // Entered `state` now, as the transition that put it there would record: a node waiting
    // for its ramdisk without this time counts as timed out at the Manager's next check.
    node.provision_updated_at = Some(time::OffsetDateTime::now_utc());
    node.driver_info = driver_info;
    node.driver_info.insert(
        "ilo_deploy_iso".into(),
        json!(format!("file://{}", media.iso.display())),
    );
    node.instance_info = obj(json!({
        "image_source": format!("file://{}", media.image.display()),
        "image_os_hash_algo": "sha256",
        "image_os_hash_value": hex::encode(Sha256::digest(image)),
        "image_disk_format": "raw",
    }));
    node.properties = obj(properties);
    node.network_data = obj(json!({
        "networks": [{"id": "n0", "type": "ipv4", "ip_address": "192.0.2.10",
                      "netmask": "255.255.255.0",
                      "routes": [{"network": "0.0.0.0", "netmask": "0.0.0.0",
                                  "gateway": "192.0.2.1"}]}],
        "services": [{"type": "dns", "address": "192.0.2.53"}]
    }));
    nodes.create_node(&node).await.expect("node");
    nodes
        .create_port(&Port {
            uuid: uuid::Uuid::new_v4(),
            address: MAC.into(),
            node_uuid: node.uuid,
            pxe_enabled: true,
            extra: JsonObject::new(),
            created_at: time::OffsetDateTime::now_utc(),
            updated_at: None,
        })
        .await
        .expect("port");
    node
}

// ---------------------------------------------------------------------------------------------
// The floppy and the agent.

/// The bytes behind a media URL the emulator was given, fetched as iLO fetches (TLS not
/// verified); `None` when the server answers an error status.
pub fn fetch_media(url: &str) -> Option<Vec<u8>> {
    let out = Command::new("curl")
        .args(["-sk", "--fail", "--max-time", "10", url])
        .output()
        .expect("running curl (fix: apt-get install curl)");
    out.status.success().then_some(out.stdout)
}

/// The parameters on a floppy image.
pub fn floppy_params(image: &[u8]) -> vmdeploy_shared::params::Params {
    assert_eq!(
        vmdeploy_shared::fat::fat_label(&image[..512])
            .expect("a FAT image")
            .as_deref(),
        Some("ir-vfd-dev")
    );
    let text = vmdeploy_shared::fat::read_root_file(
        std::io::Cursor::new(image.to_vec()),
        "parameters.txt",
        64 * 1024,
    )
    .expect("parameters.txt on the floppy");
    vmdeploy_shared::params::Params::parse(&text).expect("a valid parameters file")
}

/// The floppy the emulator has inserted now.
pub fn inserted_floppy(emulator: &Emulator) -> Vec<u8> {
    let state = emulator.state();
    let url = state["vmedia"]["FLOPPY"]["url"]
        .as_str()
        .unwrap_or_else(|| panic!("a floppy is inserted: {state}"));
    fetch_media(url).expect("the floppy's temp URL answers")
}

/// The agent process, killed on drop; its log printed when the test fails.
pub struct AgentProcess {
    child: ChildGuard,
}

impl AgentProcess {
    /// Runs `vmdeploy-agent run` in `dir` with `floppy` as its virtual floppy, as a node
    /// booted from the deploy ISO would.
    pub fn start(dir: &Path, floppy: &[u8]) -> AgentProcess {
        let floppy_file = dir.join("floppy.img");
        std::fs::write(&floppy_file, floppy).expect("writing the floppy");
        AgentProcess::spawn(dir, &floppy_file, "ir-vfd-dev").0
    }

    /// Runs `vmdeploy-agent run` with its cmdline file and log in `dir`, the floppy found at
    /// `floppy` (an image file or a block device) under FAT label `label`, and [`MAC`] as its
    /// one MAC; the agent API listens on a free loopback port, returned as `host:port`.
    pub fn spawn(dir: &Path, floppy: &Path, label: &str) -> (AgentProcess, String) {
        AgentProcess::spawn_with(dir, floppy, label, &[])
    }

    /// [`AgentProcess::start`] for the iSCSI ramdisk: the target on `iscsi` and the `done`
    /// listener on `done` (loopback ports the test chose).
    pub fn start_iscsi(dir: &Path, floppy: &[u8], iscsi: u16, done: u16) -> AgentProcess {
        let floppy_file = dir.join("floppy.img");
        std::fs::write(&floppy_file, floppy).expect("writing the floppy");
        let iscsi = format!("127.0.0.1:{iscsi}");
        let done = format!("127.0.0.1:{done}");
        AgentProcess::spawn_with(
            dir,
            &floppy_file,
            "ir-vfd-dev",
            &["--iscsi-listen", &iscsi, "--done-listen", &done],
        )
        .0
    }

    /// [`AgentProcess::spawn`] with more arguments.
    pub fn spawn_with(
        dir: &Path,
        floppy: &Path,
        label: &str,
        extra: &[&str],
    ) -> (AgentProcess, String) {
        let cmdline = dir.join("cmdline");
        std::fs::write(&cmdline, "console=ttyS0 boot_method=vmedia\n").expect("cmdline");
        let log = dir.join("agent.log");
        let listen = format!("127.0.0.1:{}", free_port());
        let child = Command::new(bin("vmdeploy-agent"))
            .arg("run")
            .arg("--cmdline-file")
            .arg(&cmdline)
            .arg("--floppy")
            .arg(floppy)
            .args(["--floppy-label", label, "--floppy-wait-secs", "5"])
            .args(["--address", "127.0.0.1", "--agent-listen", &listen])
            .args(["--mac", MAC, "--fail-timeout-secs", "1"])
            .args(extra)
            .env("RUST_LOG", "info")
            .env("VMDEPLOY_LOOKUP_TIMEOUT_SECS", "60")
            .env("VMDEPLOY_POWER_OFF_GRACE_MS", "200")
            .env("VMDEPLOY_RETRY_BACKOFF_MS", "50")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("log file"))
            .stderr(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&log)
                    .expect("log file"),
            )
            .spawn()
            .expect("starting vmdeploy-agent run");
        let child = ChildGuard::new(child).with_log("agent", &log);
        (AgentProcess { child }, listen)
    }

    /// Its output so far.
    pub fn log(&self) -> String {
        self.child.log()
    }

    /// Its exit code, when it exits within `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        self.child.wait_exit(limit).and_then(|status| status.code())
    }
}

/// A pseudo-random image whose first sector is an MBR with one partition.
pub fn make_image(len: usize) -> Vec<u8> {
    make_image_seeded(len, 0x9e37_79b9_7f4a_7c15)
}

/// A pseudo-random image (xorshift from `seed`) whose first sector is an MBR: disk signature
/// 0x12345678, one Linux partition from LBA 2048.
pub fn make_image_seeded(len: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    // xorshift never leaves 0; an odd seed keeps the sequence going.
    let mut x = seed | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v[..512].fill(0);
    v[440..444].copy_from_slice(&0x1234_5678u32.to_le_bytes());
    v[446 + 4] = 0x83;
    v[446 + 8..446 + 12].copy_from_slice(&2048u32.to_le_bytes());
    v[446 + 12..446 + 16].copy_from_slice(&4096u32.to_le_bytes());
    v[510] = 0x55;
    v[511] = 0xAA;
    v
}

// ---------------------------------------------------------------------------------------------
// The iscsi_ilo set-up (`conductor_iscsi_deploy.rs`, `conductor_iscsi_faults.rs`).

/// How an [`IscsiEnv`] is set up beyond the defaults.
pub struct IscsiOptions {
    /// `deploy_callback_timeout`.
    pub callback_timeout: Duration,
    /// Changes to the flow's settings (after the iSCSI and done ports are set to the env's).
    pub tune: Box<dyn FnOnce(&mut DeployConfig) + Send>,
    /// A boot ISO store over the built-in store, with the loaders `vmdeploy-image-build
    /// loaders` writes, so that partition images can netboot ([`IscsiEnv::boot_isos`]).
    pub netboot: bool,
}

impl IscsiOptions {
    /// `callback_timeout`, the settings as they are, no boot ISO store.
    pub fn new(callback_timeout: Duration) -> IscsiOptions {
        IscsiOptions {
            callback_timeout,
            tune: Box::new(|_| {}),
            netboot: false,
        }
    }
}

/// A conductor with the real `iscsi_ilo` flow over the built-in store, its image cache (trusting
/// the test CA, as the service's trusts the built-in store's), the real API and the
/// emulator.
pub struct IscsiEnv {
    /// The CA of the store's certificate (on the floppy).
    pub pki: TestPki,
    /// The built-in object store.
    pub builtin: Builtin,
    /// The SQLite file and the image cache.
    pub dir: tempfile::TempDir,
    /// The instance image cache.
    pub images: Arc<vmdeploy_conductor::image_cache::ImageCache>,
    /// The port the agent's target listens on (the conductor logs in there).
    pub iscsi_port: u16,
    /// The port the agent waits for `done` on (the conductor sends it there unless tuned).
    pub done_port: u16,
    /// The conductor.
    pub conductor: Conductor,
    /// The API the ramdisk calls back.
    pub api: Api,
    /// The API's URL (on the floppy).
    pub api_url: String,
    /// The iLO emulator.
    pub emulator: Emulator,
    /// The conductor's boot ISO store, when [`IscsiOptions::netboot`] asked for one.
    pub boot_isos: Option<Arc<vmdeploy_conductor::boot::vmedia::boot_iso::BootIsos>>,
}

impl IscsiEnv {
    /// The set-up with `callback_timeout`.
    pub async fn start(callback_timeout: Duration) -> IscsiEnv {
        IscsiEnv::start_with(IscsiOptions::new(callback_timeout)).await
    }

    /// The set-up as `options` say.
    pub async fn start_with(options: IscsiOptions) -> IscsiEnv {
        crate::loopdev::require_loop_devices();
        let pki = TestPki::new();
        let builtin = Builtin::start(&pki).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let (listener, settings) =
            api_settings(Some(pki.ca_pem.clone()), options.callback_timeout).await;
        let images = vmdeploy_conductor::image_cache::ImageCache::open_with(
            dir.path().join("images"),
            4 << 30,
            vmdeploy_conductor::image_cache::FetchPolicy {
                extra_ca_pem: Some(pki.ca_pem.clone()),
                ..Default::default()
            },
        )
        .expect("image cache");
        let boot_isos = options.netboot.then(|| {
            let scratch = dir.path().join("iso-scratch");
            std::fs::create_dir(&scratch).expect("boot ISO scratch dir");
            Arc::new(
                vmdeploy_conductor::boot::vmedia::boot_iso::BootIsos::new(
                    builtin.objects(),
                    CONTAINER.into(),
                    boot_loaders_dir(dir.path()),
                )
                .with_scratch_dir(scratch),
            )
        });
        let (iscsi_port, done_port) = (free_port(), free_port());
        let tune = options.tune;
        let mut conductor = Conductor::builder(
            &dir.path().join("vmdeploy.sqlite"),
            builtin.objects(),
            &settings,
        )
        .iscsi(Arc::clone(&images))
        .tune(move |config| {
            config.iscsi_port = iscsi_port;
            config.done_port = done_port;
            tune(config);
        });
        if let Some(isos) = &boot_isos {
            conductor = conductor.boot_isos(Arc::clone(isos));
        }
        let conductor = conductor.start().await;
        let api = Api::serve(listener, Arc::clone(&conductor.manager));
        let emulator = Emulator::start(&[]);
        IscsiEnv {
            pki,
            builtin,
            dir,
            images,
            iscsi_port,
            done_port,
            conductor,
            api,
            api_url: settings.api_url,
            emulator,
            boot_isos,
        }
    }

    /// The clean-up every failed deploy must leave: `deploy failed`, `last_error` holding each
    /// of `words`, both media ejected, the node off, the key wiped, no temporary object left.
    /// `log` (the ramdisk's) is shown when it fails.
    pub fn assert_failed_clean(&self, node: &Node, words: &[&str], log: &str) {
        assert_eq!(
            node.provision_state,
            ProvisionState::DeployFailed,
            "last_error {:?}\n{log}",
            node.last_error
        );
        let error = node.last_error.clone().unwrap_or_default();
        for word in words {
            assert!(error.contains(word), "{word:?} not in last_error: {error}");
        }
        self.emulator.assert_media_ejected();
        assert_eq!(
            self.emulator.state()["power"],
            "OFF",
            "the failed node is off"
        );
        assert!(
            !node.driver_internal_info.contains_key("deployment_key"),
            "the deploy key is wiped: {:?}",
            node.driver_internal_info
        );
        self.assert_no_temporary_objects();
    }

    /// The container holds no per-deploy object (floppy, boot ISO): only the upload of the
    /// conductor-local deploy ISO (`file-<digest>-deploy.iso`), which `image::resolve` keeps
    /// for the next deploy as Ironic keeps its deploy ISO in Glance.
    pub fn assert_no_temporary_objects(&self) {
        let left: Vec<String> = self
            .stored_objects()
            .into_iter()
            .filter(|name| !(name.starts_with("file-") && name.contains("-deploy.iso.")))
            .collect();
        assert_eq!(left, Vec::<String>::new(), "objects left in the container");
    }

    /// The objects left in the conductor's container of the built-in store (its directory
    /// listed: `<name>.json` is an object's commit record).
    pub fn stored_objects(&self) -> Vec<String> {
        let dir = self.builtin.store.root().join(
            vmdeploy_conductor::objects::builtin::files::encode_name(CONTAINER),
        );
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".json") || n.ends_with(".data"))
            .collect();
        names.sort();
        names
    }
}

/// Enrolls an `iscsi_ilo` node for `image` whose root device is `disk`; `prepare` may change
/// the media before the node is saved.
pub async fn enroll_iscsi(
    conductor: &Conductor,
    emulator: &Emulator,
    image: &[u8],
    disk: &crate::loopdev::LoopDevice,
    prepare: impl FnOnce(&Media),
) -> (Node, Media) {
    let media = Media::new(image);
    let mut node = enroll(
        &conductor.nodes,
        ProvisionState::Available,
        emulator.driver_info(),
        &media,
        image,
        json!({"root_device": {"name": disk.device().display().to_string()}}),
    )
    .await;
    node.driver = "iscsi_ilo".into();
    prepare(&media);
    conductor
        .nodes
        .update_node(&node)
        .await
        .expect("making it an iscsi_ilo node");
    (node, media)
}

/// The boot loaders of built boot ISOs, written into `dir/boot-loaders` by
/// `vmdeploy-image-build loaders` (as an operator fills `deploy.boot_loaders_dir`).
pub fn boot_loaders_dir(dir: &Path) -> PathBuf {
    let out = dir.join("boot-loaders");
    let result = std::process::Command::new(crate::bin("vmdeploy-image-build"))
        .arg("loaders")
        .arg("-o")
        .arg(&out)
        .output()
        .expect("vmdeploy-image-build runs (fix: cargo build --workspace --bins)");
    assert!(
        result.status.success(),
        "vmdeploy-image-build loaders failed: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

/// A kernel the ISO writer takes (the x86 boot header is all it checks) and a ramdisk that
/// starts as a gzip stream does, as `dir/vmlinuz` and `dir/initrd.gz`: enough for a boot ISO
/// that the in-memory emulator never boots.
pub fn stand_in_kernel_and_ramdisk(dir: &Path) -> (PathBuf, PathBuf) {
    let mut kernel: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
    kernel[0x202..0x206].copy_from_slice(b"HdrS");
    let mut ramdisk: Vec<u8> = (0..100_000u32).map(|i| (i % 239) as u8).collect();
    ramdisk[..2].copy_from_slice(&[0x1f, 0x8b]);
    let (k, r) = (dir.join("vmlinuz"), dir.join("initrd.gz"));
    std::fs::write(&k, kernel).expect("kernel");
    std::fs::write(&r, ramdisk).expect("ramdisk");
    (k, r)
}
