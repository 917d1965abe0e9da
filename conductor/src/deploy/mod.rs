//! The deploy flows (docs/architecture.md §1, §3): `agent` (`agent_ilo`) now, `iscsi` and `pxe` in the
//! issues after this one, and the steps they share: the virtual-media boot of the deploy ISO
//! (`vmedia`, the seeds' setup/cleanup_virtual_media_boot) and the floppy it carries.
//!
//! # Design
//! A flow works on a node the manager has reserved: it talks to the BMC, the object store and
//! the agent, and writes its progress into `driver_internal_info`. It never changes
//! `provision_state` itself: it returns, and the manager moves the node with
//! [`crate::states::next`] and records `last_error`.

use std::sync::Arc;
use std::time::Duration;

use crate::node::driver_info::IloDefaults;
use crate::node::hardware_type::{BootMethod, DeployMethod, NodeInterfaces};
use crate::objects::ObjectStore;
use crate::store::{Node, Store};
use vmdeploy_shared::api::ipa::ValidHeartbeat;

pub mod agent;
pub mod agent_session;
pub mod clean;
pub mod image;
pub mod iscsi;

/// Settings of the flows (the `[deploy]` table of the configuration).
#[derive(Debug, Clone)]
pub struct DeployConfig {
    /// The API URL the ramdisk calls back (`ipa-api-url` / `ironic_api_url` on the floppy).
    pub api_url: String,
    /// The CAs (PEM bundle) the ramdisk must trust, `ipa-agent-ca` on the floppy: the API's when
    /// it speaks TLS, and the built-in store's, whose temp URLs the agent downloads images from.
    pub api_ca_pem: Option<String>,
    /// Container for floppies and deploy ISOs in the object store.
    pub container: String,
    /// Lifetime of floppy objects and their temp URLs (`deploy_helper_images_ttl`, 10 min).
    pub deploy_helper_images_ttl: Duration,
    /// Talk plain HTTP to an agent that offers no certificate (off unless configured).
    pub agent_allow_plain_http: bool,
    /// Timeout of one call to an agent's command API.
    pub agent_call_timeout: Duration,
    /// How long the host may take to power off after the agent's `standby.power_off` before
    /// the iLO powers it off (`agent_power_off_wait`; Ironic polls 6 × 5 s = 30 s).
    pub agent_power_off_wait: Duration,
    /// What a node's `driver_info` leaves out: iLO port, timeout, certificate check (`[ilo]`).
    pub ilo_defaults: IloDefaults,
    /// The iSCSI ramdisk's portal port (3260).
    pub iscsi_port: u16,
    /// The iSCSI ramdisk's `done` port (10000).
    pub done_port: u16,
    /// How `done` is sent to the iSCSI ramdisk (tries, wait between them).
    pub done: iscsi::done::DonePolicy,
    /// CHAP credentials the iSCSI ramdisk's target requires and the conductor logs in with
    /// (`deploy.iscsi_chap_user` / `iscsi_chap_secret`); `None`: no authentication, as Ironic.
    pub iscsi_chap: Option<IscsiChap>,
}

/// A CHAP user and secret for the iSCSI deploy (the secret masked in `Debug`).
#[derive(Debug, Clone)]
pub struct IscsiChap {
    /// CHAP_N.
    pub user: String,
    /// The shared secret.
    pub secret: vmdeploy_shared::secret::Secret,
}

/// The iSCSI portal port of the deploy ramdisk.
pub const ISCSI_PORT: u16 = 3260;
/// The port the iSCSI ramdisk waits for `done` on (docs/ironic-protocols.md §2.4).
pub const DONE_PORT: u16 = 10000;

#[cfg(test)]
impl DeployConfig {
    /// The settings the unit tests deploy with: the API on plain loopback HTTP, agents allowed
    /// plain HTTP, short agent timeouts.
    pub(crate) fn for_tests() -> DeployConfig {
        DeployConfig {
            api_url: "http://127.0.0.1:6385".into(),
            api_ca_pem: None,
            container: "vmdeploy".into(),
            deploy_helper_images_ttl: Duration::from_secs(600),
            agent_allow_plain_http: true,
            agent_call_timeout: Duration::from_secs(5),
            agent_power_off_wait: Duration::from_secs(2),
            ilo_defaults: Default::default(),
            iscsi_port: ISCSI_PORT,
            done_port: DONE_PORT,
            done: Default::default(),
            iscsi_chap: None,
        }
    }
}

/// What a flow works with. Shared by every node task.
pub struct DeployContext {
    /// Nodes and ports.
    pub store: Arc<dyn Store>,
    /// Floppies, ISOs and images.
    pub objects: Arc<dyn ObjectStore>,
    /// Settings.
    pub config: DeployConfig,
    /// The instance image cache (`iscsi_ilo` writes images from it); `None` where no flow
    /// needs it.
    pub images: Option<Arc<crate::image_cache::ImageCache>>,
    /// The boot ISOs netboot instances share (`iscsi_ilo` partition images); `None` where no
    /// flow needs them.
    pub boot_isos: Option<Arc<crate::boot::vmedia::boot_iso::BootIsos>>,
    /// The network boot service `pxe_ilo` boots nodes from; `None` when it is off.
    pub netboot: Option<Arc<crate::netboot::Netboot>>,
}

impl DeployContext {
    /// The ports of `node` (BOOTIF on the floppy, the MACs the agent is told about).
    pub async fn node_ports(&self, node: uuid::Uuid) -> anyhow::Result<Vec<crate::store::Port>> {
        use anyhow::Context as _;
        self.store
            .list_ports(&crate::store::PortFilter {
                node_uuid: Some(node),
                ..crate::store::PortFilter::default()
            })
            .await
            .context("listing the node's ports")
    }
}

/// Where a flow stands after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeployStep {
    /// Waiting for the ramdisk (the manager moves the node to `wait call-back`, unreserved).
    Wait,
    /// Deployed (the manager moves the node to `active`).
    Done,
}

/// One deploy interface (`agent`, later `iscsi`, `pxe`). Errors are in operator words with
/// context (`anyhow`); the manager writes them to `last_error` and then calls
/// [`DeployInterface::clean_up`].
#[async_trait::async_trait]
pub trait DeployInterface: Send + Sync {
    /// Everything needed to deploy is there and works (credentials, licence, image fields).
    async fn validate(&self, node: &Node) -> anyhow::Result<()>;
    /// Starts a deploy of a reserved node: boots the ramdisk and returns [`DeployStep::Wait`].
    async fn deploy(&self, node: &mut Node) -> anyhow::Result<DeployStep>;
    /// A heartbeat of the node's agent while it is in `wait call-back`. The iSCSI flows'
    /// ramdisk calls back with `pass_deploy_info` instead: for them a heartbeat changes nothing.
    async fn heartbeat(
        &self,
        node: &mut Node,
        heartbeat: &ValidHeartbeat,
    ) -> anyhow::Result<DeployStep> {
        let _ = heartbeat;
        tracing::debug!(node = %node.uuid, driver = %node.driver, "heartbeat ignored: this ramdisk reports through pass_deploy_info");
        Ok(DeployStep::Wait)
    }
    /// Whether this flow's ramdisk calls back with `pass_deploy_info` (the iSCSI ramdisk)
    /// rather than heartbeats (the agent).
    fn takes_pass_deploy_info(&self) -> bool {
        false
    }
    /// The iSCSI ramdisk's `pass_deploy_info` while the node is in `wait call-back`: the
    /// manager has checked and burnt the deploy key, and reserved the node. A flow that takes
    /// it writes the image and returns [`DeployStep::Done`].
    async fn pass_deploy_info(
        &self,
        node: &mut Node,
        info: &vmdeploy_shared::api::ValidPassDeployInfo,
    ) -> anyhow::Result<DeployStep> {
        let _ = info;
        anyhow::bail!(
            "driver {} takes no pass_deploy_info: its ramdisk reports through heartbeats",
            node.driver
        )
    }
    /// Before the API powers on or reboots an `active` node: whatever the instance needs to
    /// boot (a netboot instance's boot ISO attached again: its temp URL has expired).
    async fn prepare_instance_boot(&self, node: &mut Node) -> anyhow::Result<()> {
        let _ = node;
        Ok(())
    }
    /// Automated cleaning starts (`cleaning`, after undeploy or `provide`): boots the agent
    /// ramdisk from virtual media with a fresh token; the manager then waits in `clean wait`.
    async fn prepare_cleaning(&self, node: &mut Node) -> anyhow::Result<()> {
        bail_no_cleaning(node)
    }
    /// The agent's heartbeat in `clean wait`: runs the clean steps, then powers the node off
    /// and ejects the media. `Ok` means the node is clean.
    async fn clean_heartbeat(
        &self,
        node: &mut Node,
        heartbeat: &ValidHeartbeat,
    ) -> anyhow::Result<()> {
        let _ = heartbeat;
        bail_no_cleaning(node)
    }
    /// Undeploy: power off, eject, forget the instance's boot settings.
    async fn tear_down(&self, node: &mut Node) -> anyhow::Result<()>;
    /// After a failure or an abort: eject media, delete temporary objects, wipe the token.
    /// Never fails: what cannot be cleaned is logged.
    async fn clean_up(&self, node: &mut Node);
}

/// What a flow without automated cleaning answers.
fn bail_no_cleaning(node: &Node) -> anyhow::Result<()> {
    anyhow::bail!(
        "driver {} cannot clean through the agent; turn deploy.automated_clean off for it",
        node.driver
    )
}

/// The flow that runs the node's boot and deploy interfaces (`crate::node::hardware_type`), or
/// `None` when its driver is not served here or no flow runs that pair.
pub fn for_node(node: &Node, context: Arc<DeployContext>) -> Option<Arc<dyn DeployInterface>> {
    let interfaces = NodeInterfaces::of(node).ok()?;
    let flow: Arc<dyn DeployInterface> =
        match (interfaces.boot_method(), interfaces.deploy_method()) {
            (BootMethod::VirtualMedia, DeployMethod::Agent) => {
                Arc::new(agent::AgentDeploy::new(context))
            }
            (BootMethod::VirtualMedia, DeployMethod::Iscsi) => {
                Arc::new(iscsi::IscsiDeploy::new(context))
            }
            (BootMethod::Network, DeployMethod::Iscsi) => {
                Arc::new(crate::boot::pxe::PxeDeploy::new(context))
            }
            (BootMethod::Network, DeployMethod::Agent) => return None,
        };
    Some(flow)
}
