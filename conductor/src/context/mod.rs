//! What the boot and deploy interfaces work with: the conductor's stores and caches
//! ([`DeployContext`]), the settings of the `[deploy]` table ([`DeployConfig`]), and the image
//! references both resolve ([`image`]). Below `boot` and `deploy`, so neither imports the other
//! for it (docs/architecture.md §2).

use std::sync::Arc;
use std::time::Duration;

use crate::net::retry::RetryPolicy;
use crate::node::driver_info::IloDefaults;
use crate::objects::ObjectStore;
use crate::store::Store;

pub mod image;

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
    pub done: DonePolicy,
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

/// How `done` is sent ([`DonePolicy::default`]: Ironic's wait, bounded tries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DonePolicy {
    /// How often `done` is tried before the deploy fails (at least once).
    pub attempts: u32,
    /// The wait between two tries.
    pub retry_interval: Duration,
    /// Time allowed for one try: connect and send.
    pub timeout: Duration,
}

impl DonePolicy {
    /// The tries as a retry policy: a fixed interval (the cap is the first pause).
    pub fn retry(&self) -> RetryPolicy {
        RetryPolicy::new(self.attempts, self.retry_interval).capped_at(self.retry_interval)
    }
}

impl Default for DonePolicy {
    /// 5 tries, 3 s apart (Ironic's sleep before its one try), 10 s each: at most about a
    /// minute before the deploy fails.
    fn default() -> Self {
        DonePolicy {
            attempts: 5,
            retry_interval: Duration::from_secs(3),
            timeout: Duration::from_secs(10),
        }
    }
}
