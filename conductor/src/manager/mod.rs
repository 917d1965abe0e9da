//! The conductor's manager: carries out what the API asks of a node, one task per node
//! (DESIGN.md §8). The API layer parses a request and calls one method here; it never calls a
//! BMC client or a flow itself (STYLE.md §1).
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
//! mid-task.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::deploy::DeployContext;
use crate::objects::ObjectStore;
use crate::states::{NodePower, ProvisionState, ProvisionVerb};
use crate::store::{NodeIdent, Store, StoreError};

/// Settings of the manager (the `[conductor]` table of the configuration).
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// How long a node may wait for its ramdisk (`deploy_callback_timeout`, default 1800 s).
    pub deploy_callback_timeout: Duration,
    /// How often power states are read from the BMCs (default 60 s; Ironic's
    /// `sync_power_state_interval`).
    pub power_sync_interval: Duration,
    /// Clean nodes through the agent on undeploy and provide (`automated_clean`); off for now.
    pub automated_clean: bool,
    /// Name of this conductor: prefix of its reservations (the host name by default).
    pub conductor_name: String,
}

/// Why a manager call failed; the API maps each to Ironic's status code.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// From the store: not found (404), duplicate (409), locked (409 `NodeLocked`).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The verb is not allowed in the node's state (400, Ironic's `InvalidStateRequested`).
    #[error("The requested action \"{action}\" can not be performed on node \"{node}\" while it is in state \"{state}\".")]
    InvalidState {
        /// The verb or action asked for.
        action: String,
        /// The node.
        node: Uuid,
        /// Its state.
        state: ProvisionState,
    },
    /// The request is invalid for this node (400): missing field, bad value.
    #[error("{0}")]
    Invalid(String),
    /// The request conflicts with the node's condition (409): e.g. delete while active.
    #[error("{0}")]
    Conflict(String),
    /// A ramdisk call-back with a wrong or missing token or key (Ironic answers 401/403).
    #[error("{0}")]
    Forbidden(String),
    /// The driver or the flow failed while the caller waited (500), in operator words.
    #[error("{0}")]
    Failed(String),
}

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

/// A heartbeat as the ramdisk sent it (`POST /v1/heartbeat/{node}`), already parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct HeartbeatRequest {
    /// Where the agent's command API listens (`https://ip:9999`).
    pub callback_url: String,
    /// The agent token from the floppy.
    pub agent_token: Option<String>,
    /// The agent's version string.
    pub agent_version: Option<String>,
    /// The agent's self-signed certificate (PEM) to pin for calls to it (`agent_verify_ca`).
    pub agent_verify_ca: Option<String>,
    /// Free-form status text (progress of an image write).
    pub agent_status_message: Option<String>,
}

/// What `GET /v1/lookup` returns to a ramdisk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LookupReply {
    /// The node, restricted to the fields the ramdisk may see.
    pub node: Value,
    /// `heartbeat_timeout` and friends.
    pub config: Value,
}

/// The manager: the store, the object store and the flows, behind one handle the API shares.
pub struct Manager {
    deploy: Arc<DeployContext>,
    config: ManagerConfig,
}

impl Manager {
    /// A manager running flows in `deploy` (which holds the stores).
    pub fn new(deploy: Arc<DeployContext>, config: ManagerConfig) -> Manager {
        Manager { deploy, config }
    }

    /// The node store (the API reads and writes records through it directly for plain CRUD).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.deploy.store
    }

    /// The object store.
    pub fn objects(&self) -> &Arc<dyn ObjectStore> {
        &self.deploy.objects
    }

    /// What the flows work with.
    pub fn deploy_context(&self) -> &Arc<DeployContext> {
        &self.deploy
    }

    /// The settings.
    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    /// `PUT /v1/nodes/{node}/states/power`: starts a power change (202 when `Ok`).
    pub async fn set_power_state(
        &self,
        node: &NodeIdent,
        target: NodePower,
        timeout: Option<Duration>,
    ) -> Result<(), ManagerError> {
        let _ = (node, target, timeout);
        Err(ManagerError::Failed("not built yet".into()))
    }

    /// `PUT /v1/nodes/{node}/states/provision`: starts a provision verb (202 when `Ok`).
    pub async fn set_provision_state(
        &self,
        node: &NodeIdent,
        verb: ProvisionVerb,
        configdrive: Option<Value>,
    ) -> Result<(), ManagerError> {
        let _ = (node, verb, configdrive);
        Err(ManagerError::Failed("not built yet".into()))
    }

    /// `GET /v1/nodes/{node}/validate`: one line per interface (`power`, `management`,
    /// `deploy`, `boot`, `console`, `inspect`, ...).
    pub async fn validate(
        &self,
        node: &NodeIdent,
    ) -> Result<BTreeMap<String, InterfaceValidation>, ManagerError> {
        let _ = node;
        Err(ManagerError::Failed("not built yet".into()))
    }

    /// `PUT /v1/nodes/{node}/management/boot_device`.
    pub async fn set_boot_device(
        &self,
        node: &NodeIdent,
        device: &str,
        persistent: bool,
    ) -> Result<(), ManagerError> {
        let _ = (node, device, persistent);
        Err(ManagerError::Failed("not built yet".into()))
    }

    /// `GET /v1/nodes/{node}/management/boot_device`.
    pub async fn boot_device(&self, node: &NodeIdent) -> Result<BootDeviceReading, ManagerError> {
        let _ = node;
        Err(ManagerError::Failed("not built yet".into()))
    }

    /// `PATCH .../maintenance` equivalents: `PUT /v1/nodes/{node}/maintenance` (on, with a
    /// reason) and `DELETE` (off).
    pub async fn set_maintenance(
        &self,
        node: &NodeIdent,
        on: bool,
        reason: Option<String>,
    ) -> Result<(), ManagerError> {
        let _ = (node, on, reason);
        Err(ManagerError::Failed("not built yet".into()))
    }

    /// `DELETE /v1/nodes/{node}`: refused (409) while a task holds the node or it is `active`.
    pub async fn delete_node(&self, node: &NodeIdent) -> Result<(), ManagerError> {
        let _ = node;
        Err(ManagerError::Failed("not built yet".into()))
    }

    /// `GET /v1/lookup?addresses=..&node_uuid=..`: the ramdisk finds its node.
    pub async fn lookup(
        &self,
        addresses: &[String],
        node_uuid: Option<Uuid>,
    ) -> Result<LookupReply, ManagerError> {
        let _ = (addresses, node_uuid);
        Err(ManagerError::Failed("not built yet".into()))
    }

    /// `POST /v1/heartbeat/{node}`: the agent is alive; drives the `agent_ilo` flow on.
    pub async fn heartbeat(
        &self,
        node: &NodeIdent,
        heartbeat: HeartbeatRequest,
    ) -> Result<(), ManagerError> {
        let _ = (node, heartbeat);
        Err(ManagerError::Failed("not built yet".into()))
    }

    /// `POST /v1/nodes/{node}/vendor_passthru/pass_deploy_info` (and without `/v1`): the
    /// iSCSI ramdisk's call-back. The route exists now; the flow behind it is the `iscsi_ilo`
    /// issue's.
    pub async fn pass_deploy_info(
        &self,
        node: &NodeIdent,
        body: Value,
    ) -> Result<(), ManagerError> {
        let _ = (node, body);
        Err(ManagerError::Failed("not built yet".into()))
    }

    /// Starts the background duties (power sync, callback timeouts) after recovering nodes a
    /// previous run left mid-task. Returns when recovery is done; the duties run until
    /// `shutdown` fires.
    pub async fn start_background(
        self: &Arc<Self>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), ManagerError> {
        let _ = shutdown;
        Ok(())
    }

    /// Waits until every running node task has finished or `grace` passed (SIGTERM drain).
    pub async fn drain(&self, grace: Duration) {
        let _ = grace;
    }
}
