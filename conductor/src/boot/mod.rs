//! The boot interfaces (docs/architecture.md §2): how a node boots the deploy ramdisk and,
//! after the deploy, the instance. A deploy interface (`crate::deploy`) drives one of them
//! through [`BootInterface`]; a driver is the pair (`iscsi_ilo` = virtual media + iSCSI,
//! `pxe_ilo` = network boot + iSCSI).
//!
//! - [`vmedia`]: the iLO's virtual media: the floppy with the ramdisk's parameters and the
//!   deploy ISO for the ramdisk; a netboot instance's boot ISO on the virtual CD.
//! - [`pxe`]: the network: the ramdisk's and a netboot instance's kernel and initramfs in
//!   this conductor's boot root (`crate::netboot` serves them over TFTP and HTTP), the
//!   ramdisk's parameters on its kernel command line.
//!
//! # Design
//! A boot interface knows nothing of how the image is written: it boots what it is asked to
//! (the agent or the iSCSI ramdisk, [`Ramdisk`]) and hands the ramdisk its secret, which it
//! records in `driver_internal_info` ([`AGENT_TOKEN_KEY`], [`DEPLOY_KEY_KEY`]) before the
//! node powers on. It imports no deploy interface.

use anyhow::Context as _;
use serde_json::Value;
use vmdeploy_shared::secret::Secret;

use crate::bmc::{Bmc, BootMode};
use crate::context::DeployContext;
use crate::store::{JsonObject, Node};

pub mod pxe;
pub mod secure_boot;
pub mod vmedia;

/// `driver_internal_info` key of the pre-generated agent token.
pub const AGENT_TOKEN_KEY: &str = "agent_secret_token";
/// `driver_internal_info` key of the iSCSI ramdisk's one-use deploy key (Ironic's name).
pub const DEPLOY_KEY_KEY: &str = "deployment_key";
/// `driver_internal_info` key of the boot mode the ramdisk was booted in.
pub const BOOT_MODE_KEY: &str = "deploy_boot_mode";
/// `driver_internal_info` key of the SHA-256 (hex) of the last agent token wiped: a heartbeat
/// the agent sent before its deploy ended can still arrive after it, and is told apart from a
/// stranger's by this (`crate::manager::heartbeat`).
pub const RETIRED_TOKEN_KEY: &str = "agent_token_retired_sha256";
/// `driver_internal_info` key of when (Unix time) [`RETIRED_TOKEN_KEY`] was retired.
pub const RETIRED_AT_KEY: &str = "agent_token_retired_at";

/// Which ramdisk boots, and so which secret it is handed.
#[derive(Debug, Clone, Copy)]
pub enum Ramdisk<'a> {
    /// The agent: a pre-generated agent token, kept as [`AGENT_TOKEN_KEY`].
    Agent,
    /// The iSCSI ramdisk: a one-use deploy key, kept as [`DEPLOY_KEY_KEY`].
    Iscsi {
        /// Where the instance boots from afterwards.
        boot_option: vmdeploy_shared::params::BootOption,
        /// CHAP user and secret the ramdisk's target requires.
        chap: Option<(&'a str, &'a vmdeploy_shared::secret::Secret)>,
    },
}

/// Records the secret the ramdisk booting now was handed (under `secret_key`, one of
/// [`AGENT_TOKEN_KEY`] and [`DEPLOY_KEY_KEY`]) and the boot mode it boots in, and saves the node
/// before it powers on: the ramdisk's first call-back is checked against what is saved.
pub(crate) async fn record_ramdisk_boot(
    ctx: &DeployContext,
    node: &mut Node,
    secret_key: &str,
    secret: &Secret,
    mode: BootMode,
) -> anyhow::Result<()> {
    node.driver_internal_info
        .insert(secret_key.into(), Value::String(secret.expose().clone()));
    node.driver_internal_info
        .insert(BOOT_MODE_KEY.into(), Value::String(mode.to_string()));
    ctx.store
        .update_node(node)
        .await
        .context("saving the ramdisk's secret before the node boots")
}

/// The boot mode [`record_ramdisk_boot`] recorded, if it did.
pub(crate) fn recorded_boot_mode(node: &Node) -> Option<BootMode> {
    match node.driver_internal_info.get(BOOT_MODE_KEY)?.as_str()? {
        m if m.eq_ignore_ascii_case("uefi") => Some(BootMode::Uefi),
        m if m.eq_ignore_ascii_case("bios") => Some(BootMode::Bios),
        _ => None,
    }
}

/// Forgets the ramdisk's secrets (agent token, deploy key). The agent token's digest and the
/// time are kept ([`RETIRED_TOKEN_KEY`], [`RETIRED_AT_KEY`]): not the token, which could be
/// replayed, but enough to recognise the agent's own late heartbeat.
pub(crate) fn wipe_token(info: &mut JsonObject) {
    if let Some(Value::String(token)) = info.remove(AGENT_TOKEN_KEY) {
        if !token.is_empty() {
            info.insert(
                RETIRED_TOKEN_KEY.into(),
                Value::String(token_digest(&token)),
            );
            info.insert(
                RETIRED_AT_KEY.into(),
                Value::from(time::OffsetDateTime::now_utc().unix_timestamp()),
            );
        }
    }
    info.remove(DEPLOY_KEY_KEY);
}

/// The SHA-256 (hex) of an agent token, as [`RETIRED_TOKEN_KEY`] keeps it.
pub(crate) fn token_digest(token: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// One boot interface (Ironic's `boot_interface`). Errors are in operator words with context;
/// the clean-ups never fail: what cannot be undone is logged.
#[async_trait::async_trait]
pub trait BootInterface: Send + Sync {
    /// What booting the ramdisk needs that the node's fields and this conductor's
    /// configuration decide, checked before the BMC is reached.
    async fn validate(&self, node: &Node) -> anyhow::Result<()>;
    /// What booting the ramdisk needs of the BMC (whose credentials the caller has checked)
    /// and of the references the boot reads.
    async fn validate_bmc(&self, bmc: &Bmc, node: &Node) -> anyhow::Result<()>;
    /// What a netboot instance (a partition image booting its own kernel and ramdisk) needs,
    /// checked at `validate`, before anything is written.
    async fn validate_instance(&self, node: &Node) -> anyhow::Result<()>;
    /// Whether this interface boots the agent ramdisk, which automated cleaning runs on.
    fn boots_agent(&self) -> bool;
    /// Boots `ramdisk` on the validated node: the BMC set to boot it once, its secret saved
    /// to the store, the node powered on.
    async fn prepare_ramdisk(
        &self,
        bmc: &Bmc,
        node: &mut Node,
        ramdisk: Ramdisk<'_>,
    ) -> anyhow::Result<()>;
    /// Undoes [`BootInterface::prepare_ramdisk`] and wipes the ramdisk's secrets; `bmc` is
    /// `None` when the BMC could not be reached.
    async fn clean_up_ramdisk(&self, bmc: Option<&Bmc>, node: &mut Node);
    /// Makes a netboot instance's boot ready before the disk is written, booting the root
    /// file system `root_uuid` (read from the image); recorded in the node, so
    /// [`BootInterface::clean_up_instance`] finds it after a later failure.
    async fn prepare_instance(&self, node: &mut Node, root_uuid: &str) -> anyhow::Result<()>;
    /// After the write: makes what [`BootInterface::prepare_instance`] readied the node's
    /// persistent boot device.
    async fn boot_instance(&self, bmc: &Bmc, node: &Node) -> anyhow::Result<()>;
    /// Before the API powers on or reboots an active netboot node: whatever must be renewed
    /// for it to boot again.
    async fn reboot_instance(&self, bmc: &Bmc, node: &Node) -> anyhow::Result<()>;
    /// Undeploy or failure: forgets the instance's boot.
    async fn clean_up_instance(&self, node: &mut Node);
}
