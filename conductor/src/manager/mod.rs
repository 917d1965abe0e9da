//! The conductor's manager: carries out what the API asks of a node, one task per node
//! (docs/architecture.md §8). The API layer parses a request and calls one method here; it never calls a
//! BMC client or a flow itself (docs/style.md §1).
//!
//! # Design
//! A method that starts work on a node reserves it in the store ([`crate::store::Store::reserve_node`]),
//! checks the transition with [`crate::states::next`], records the target state, and returns at
//! once (the API answers 202); the work runs in a spawned task that writes the outcome
//! (`provision_state`, `last_error`) and releases the reservation on every exit path. Waiting
//! states (`wait call-back`) hold no reservation: the ramdisk's call-back reserves the node again.
//!
//! Background duties, started by [`Manager::start_background`]: the periodic power-state sync,
//! the deploy callback timeout, and at start the recovery of nodes a stopped conductor left
//! mid-task. With several conductors on one database each runs its duties for the nodes it owns
//! ([`crate::cluster`]), and takes over those of a conductor that stopped heartbeating
//! (`recovery::take_over`).
//!
//! One file per duty: `tasks` (reservation guard and the registry `drain` waits on), `power`,
//! `provision`, `heartbeat` (lookup and heartbeat of the ramdisk), `management` (boot device,
//! maintenance, delete), `validate`, and the background `sync`, `timeouts` and `recovery`.
//! Every BMC access goes through [`crate::bmc::Bmc`].

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tracing::Instrument;
use uuid::Uuid;
use vmdeploy_shared::api::ipa::ValidHeartbeat;
use vmdeploy_shared::api::ValidPassDeployInfo;

use crate::cluster::forward::Forwarder;
use crate::cluster::Cluster;
use crate::deploy::{DeployContext, DeployInterface};
use crate::net::https::{HttpsClientError, Trust};
use crate::objects::ObjectStore;
use crate::states::{NodePower, ProvisionVerb};
use crate::store::{Node, NodeIdent, Store, StoreError};

mod conductors;
mod error;
mod heartbeat;
mod management;
mod pass_deploy_info;
mod power;
mod provision;
mod recovery;
mod sync;
mod tasks;
#[cfg(test)]
mod tests;
mod timeouts;
mod validate;

pub use error::ManagerError;

/// Settings of the manager (the `[conductor]` table of the configuration).
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// How long a node may wait for its ramdisk (`deploy_callback_timeout`, default 1800 s).
    pub deploy_callback_timeout: Duration,
    /// How often power states are read from the BMCs (default 60 s; Ironic's
    /// `sync_power_state_interval`).
    pub power_sync_interval: Duration,
    /// Clean nodes through the agent on undeploy and provide (`deploy.automated_clean`, off by
    /// default): `crate::deploy::clean`.
    pub automated_clean: bool,
    /// Name of this conductor: prefix of its reservations (the host name by default).
    pub conductor_name: String,
    /// BMCs a power sync pass reads at once (`conductor.sync_power_state_workers`, Ironic's
    /// name and default, 8).
    pub sync_power_state_workers: usize,
    /// `conductor.conductor_group` (empty: the default group).
    pub conductor_group: String,
    /// How often this conductor heartbeats in the database (`conductor.heartbeat_interval`).
    pub heartbeat_interval: Duration,
    /// A conductor whose heartbeat is older is dead (`conductor.heartbeat_timeout`).
    pub heartbeat_timeout: Duration,
}

/// Ironic's default `heartbeat_interval`.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
/// Ironic's default `heartbeat_timeout`.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(60);

/// Ironic's default `sync_power_state_workers`.
pub const DEFAULT_SYNC_POWER_STATE_WORKERS: usize = 8;

/// One interface's line of `GET /v1/nodes/{node}/validate`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InterfaceValidation {
    /// `true` valid, `false` invalid, `None` when the interface is not supported.
    pub result: Option<bool>,
    /// Why not, when not.
    pub reason: Option<String>,
}

/// The boot device as `GET .../management/boot_device` reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BootDeviceReading {
    /// Ironic's name (`pxe`, `disk`, `cdrom`, `bios`, `safe`, `floppy`, `usb`), or `None`.
    pub boot_device: Option<String>,
    /// Whether it is persistent, when known.
    pub persistent: Option<bool>,
}

/// What `GET /v1/lookup` returns to a ramdisk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LookupReply {
    /// The node, restricted to the fields the ramdisk may see.
    pub node: Value,
    /// `heartbeat_timeout` and friends.
    pub config: Value,
}

/// The span of a request about one node: every log line under it names the node.
fn node_span(node: &NodeIdent) -> tracing::Span {
    tracing::info_span!("node", node = %node)
}

/// Finds the flow of a node; [`crate::deploy::for_node`] unless replaced (tests replace it with
/// a scripted flow).
pub type DeployResolver = Arc<dyn Fn(&Node) -> Option<Arc<dyn DeployInterface>> + Send + Sync>;

/// The manager: the store, the object store and the flows, behind one handle the API shares.
pub struct Manager {
    core: Arc<Core>,
}

/// What every node task shares: spawned tasks hold an `Arc` of it, as they outlive the call
/// that started them.
pub(crate) struct Core {
    deploy: Arc<DeployContext>,
    config: ManagerConfig,
    resolver: RwLock<DeployResolver>,
    tasks: tasks::TaskRegistry,
    /// The live conductors and the ring of node owners.
    cluster: Cluster,
    /// Set by [`Manager::enable_forwarding`] (the service does; in-process tests run alone).
    forwarding: std::sync::OnceLock<Forwarding>,
    /// The key forwarded requests are signed with, read from the store once.
    cluster_key: tokio::sync::OnceCell<Arc<[u8]>>,
    /// The runtime node tasks run on: the one the manager was made on. The service serves the
    /// API on a runtime of its own (`crate::service::run`), so a task started by a request
    /// must not land on the request's runtime.
    runtime: Option<tokio::runtime::Handle>,
}

/// How this conductor is reached by, and reaches, the others.
struct Forwarding {
    /// `conductor.internal_url`, registered for the others to forward to.
    internal_url: Option<String>,
    forwarder: Forwarder,
}

impl Core {
    /// The node store.
    fn store(&self) -> &Arc<dyn Store> {
        &self.deploy.store
    }

    /// The flow of the node's boot and deploy interfaces, or `None` when this conductor has none.
    fn flow_for(&self, node: &Node) -> Option<Arc<dyn DeployInterface>> {
        let resolver = match self.resolver.read() {
            Ok(guard) => guard.clone(),
            // A panic while replacing the resolver leaves the old one, which is still valid.
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        resolver(node)
    }

    /// The key that signs forwarded requests (module `crate::cluster::forward`).
    async fn cluster_key(&self) -> Result<Arc<[u8]>, StoreError> {
        self.cluster_key
            .get_or_try_init(|| async { self.store().cluster_key().await.map(Arc::from) })
            .await
            .cloned()
    }

    /// This conductor's `conductor.internal_url`, when forwarding is on.
    fn internal_url(&self) -> Option<String> {
        self.forwarding.get().and_then(|f| f.internal_url.clone())
    }

    /// The node's UUID from an API identifier.
    async fn uuid_of(&self, ident: &NodeIdent) -> Result<Uuid, ManagerError> {
        match ident {
            NodeIdent::Uuid(uuid) => Ok(*uuid),
            NodeIdent::Name(_) => Ok(self.store().node(ident).await?.uuid),
        }
    }
}

impl Manager {
    /// A manager running flows in `deploy` (which holds the stores).
    pub fn new(deploy: Arc<DeployContext>, config: ManagerConfig) -> Manager {
        let context = deploy.clone();
        let resolver: DeployResolver =
            Arc::new(move |node: &Node| crate::deploy::for_node(node, context.clone()));
        Manager {
            core: Arc::new(Core {
                deploy,
                resolver: RwLock::new(resolver),
                tasks: tasks::TaskRegistry::default(),
                cluster: Cluster::new(
                    &config.conductor_name,
                    &config.conductor_group,
                    config.heartbeat_timeout,
                ),
                config,
                forwarding: std::sync::OnceLock::new(),
                cluster_key: tokio::sync::OnceCell::new(),
                runtime: tokio::runtime::Handle::try_current().ok(),
            }),
        }
    }

    /// Replaces how a node's flow is found (tests use a scripted flow).
    pub fn set_deploy_resolver(&self, resolver: DeployResolver) {
        match self.core.resolver.write() {
            Ok(mut guard) => *guard = resolver,
            Err(poisoned) => *poisoned.into_inner() = resolver,
        }
    }

    /// The node store (the API reads and writes records through it directly for plain CRUD).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.core.deploy.store
    }

    /// The object store.
    pub fn objects(&self) -> &Arc<dyn ObjectStore> {
        &self.core.deploy.objects
    }

    /// What the flows work with.
    pub fn deploy_context(&self) -> &Arc<DeployContext> {
        &self.core.deploy
    }

    /// The settings.
    pub fn config(&self) -> &ManagerConfig {
        &self.core.config
    }

    /// Lets this conductor forward node actions to their owners, trusting their certificates
    /// as `trust` says, and registers `internal_url` for the others to forward to it. Call before
    /// [`Manager::start_background`]; a second call changes nothing.
    pub fn enable_forwarding(
        &self,
        internal_url: Option<String>,
        trust: Trust,
    ) -> Result<(), HttpsClientError> {
        let forwarder = Forwarder::new(&self.core.config.conductor_name, trust)?;
        let _ = self.core.forwarding.set(Forwarding {
            internal_url,
            forwarder,
        });
        Ok(())
    }

    /// The live conductors and who owns which node.
    pub fn cluster(&self) -> &Cluster {
        &self.core.cluster
    }

    /// The client that forwards requests to other conductors (`None` until
    /// [`Manager::enable_forwarding`]).
    pub fn forwarder(&self) -> Option<&Forwarder> {
        self.core.forwarding.get().map(|f| &f.forwarder)
    }

    /// The key that signs requests forwarded between the conductors of this database.
    pub async fn cluster_key(&self) -> Result<Arc<[u8]>, StoreError> {
        self.core.cluster_key().await
    }

    /// `PUT /v1/nodes/{node}/states/power`: starts a power change (202 when `Ok`).
    pub async fn set_power_state(
        &self,
        node: &NodeIdent,
        target: NodePower,
        timeout: Option<Duration>,
    ) -> Result<(), ManagerError> {
        power::set_power_state(&self.core, node, target, timeout)
            .instrument(node_span(node))
            .await
    }

    /// `PUT /v1/nodes/{node}/states/provision`: starts a provision verb (202 when `Ok`).
    pub async fn set_provision_state(
        &self,
        node: &NodeIdent,
        verb: ProvisionVerb,
        configdrive: Option<Value>,
    ) -> Result<(), ManagerError> {
        provision::set_provision_state(&self.core, node, verb, configdrive)
            .instrument(node_span(node))
            .await
    }

    /// `GET /v1/nodes/{node}/validate`: one line per interface (`power`, `management`,
    /// `deploy`, `boot`, `console`, `inspect`, ...).
    pub async fn validate(
        &self,
        node: &NodeIdent,
    ) -> Result<BTreeMap<String, InterfaceValidation>, ManagerError> {
        validate::validate(&self.core, node)
            .instrument(node_span(node))
            .await
    }

    /// `PUT /v1/nodes/{node}/management/boot_device`.
    pub async fn set_boot_device(
        &self,
        node: &NodeIdent,
        device: &str,
        persistent: bool,
    ) -> Result<(), ManagerError> {
        management::set_boot_device(&self.core, node, device, persistent)
            .instrument(node_span(node))
            .await
    }

    /// `GET /v1/nodes/{node}/management/boot_device`.
    pub async fn boot_device(&self, node: &NodeIdent) -> Result<BootDeviceReading, ManagerError> {
        management::boot_device(&self.core, node)
            .instrument(node_span(node))
            .await
    }

    /// `PATCH .../maintenance` equivalents: `PUT /v1/nodes/{node}/maintenance` (on, with a
    /// reason) and `DELETE` (off).
    pub async fn set_maintenance(
        &self,
        node: &NodeIdent,
        on: bool,
        reason: Option<String>,
    ) -> Result<(), ManagerError> {
        management::set_maintenance(&self.core, node, on, reason)
            .instrument(node_span(node))
            .await
    }

    /// `DELETE /v1/nodes/{node}`: refused (409) while a task holds the node or it is `active`.
    pub async fn delete_node(&self, node: &NodeIdent) -> Result<(), ManagerError> {
        management::delete_node(&self.core, node)
            .instrument(node_span(node))
            .await
    }

    /// `GET /v1/lookup?addresses=..&node_uuid=..`: the ramdisk finds its node.
    pub async fn lookup(
        &self,
        addresses: &[String],
        node_uuid: Option<Uuid>,
    ) -> Result<LookupReply, ManagerError> {
        heartbeat::lookup(&self.core, addresses, node_uuid).await
    }

    /// `POST /v1/heartbeat/{node}`: the agent is alive; drives the `agent_ilo` flow on. The
    /// API has parsed and checked the body.
    pub async fn heartbeat(
        &self,
        node: &NodeIdent,
        heartbeat: ValidHeartbeat,
    ) -> Result<(), ManagerError> {
        heartbeat::heartbeat(&self.core, node, heartbeat)
            .instrument(node_span(node))
            .await
    }

    /// `POST /v1/nodes/{node}/vendor_passthru/pass_deploy_info` (and without `/v1`): the
    /// iSCSI ramdisk's call-back, its body parsed and checked by the API; see
    /// [`pass_deploy_info`](self::pass_deploy_info) for the checks and their answers.
    pub async fn pass_deploy_info(
        &self,
        node: &NodeIdent,
        info: ValidPassDeployInfo,
    ) -> Result<(), ManagerError> {
        pass_deploy_info::pass_deploy_info(&self.core, node, info)
            .instrument(node_span(node))
            .await
    }

    /// Starts the background duties (power sync, callback timeouts) after recovering nodes a
    /// previous run left mid-task. Returns when recovery is done; the duties run until
    /// `shutdown` fires.
    pub async fn start_background(
        self: &Arc<Self>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), ManagerError> {
        conductors::register(&self.core).await?;
        recovery::recover(&self.core).await?;
        tasks::spawn_on(
            &self.core,
            conductors::run(self.core.clone(), shutdown.clone()),
        );
        tasks::spawn_on(&self.core, sync::run(self.core.clone(), shutdown.clone()));
        tasks::spawn_on(&self.core, timeouts::run(self.core.clone(), shutdown));
        Ok(())
    }

    /// Waits until every running node task has finished or `grace` passed (SIGTERM drain).
    pub async fn drain(&self, grace: Duration) {
        self.core.tasks.drain(grace).await;
    }

    /// How many node tasks run now (for the service's log line at drain, and tests).
    pub fn running_tasks(&self) -> usize {
        self.core.tasks.running()
    }
}
