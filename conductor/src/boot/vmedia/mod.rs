//! The virtual-media boot interface (the seeds' setup/cleanup_virtual_media_boot;
//! docs/ironic-protocols.md §1.1, §3.5): the deploy ramdisk boots from the deploy ISO with its
//! parameters on a floppy ([`floppy`]); a netboot instance boots from a boot ISO
//! ([`instance`], built by [`boot_iso`]). `agent_ilo`, `iscsi_ilo` and `redfish` boot this way.
//!
//! # Design
//! [`prepare`] powers the node off, builds and stores its floppy (TTL
//! `deploy_helper_images_ttl`, so a crashed conductor leaks nothing), inserts the floppy and the
//! deploy ISO by temp URL, boots once from the CD in the node's boot mode and powers on.
//! [`cleanup`] undoes it, every step attempted even when an earlier one failed, and never
//! fails: what cannot be cleaned is logged with the node's UUID.
//!
//! The floppy object is named after the node alone (`<container>/<uuid>-floppy`), so a
//! clean-up finds it without any state from the deploy that made it.

use std::sync::Arc;

use anyhow::{bail, Context};
use bytes::Bytes;
use serde_json::Value;

use super::{
    record_ramdisk_boot, wipe_token, BootInterface, Ramdisk, AGENT_TOKEN_KEY, DEPLOY_KEY_KEY,
};
use crate::bmc::{Bmc, VmediaDevice};
use crate::context::image::{self, ImageRef};
use crate::context::DeployContext;
use crate::node::capabilities::deploy_boot_mode;
use crate::objects::{ObjectBody, ObjectPath, PutOptions};
use crate::store::Node;

pub mod boot_iso;
pub mod floppy;
pub mod instance;

/// `driver_info` keys that name the deploy ISO, in the order they are looked at: the iLO
/// drivers' own, then the generic and Redfish names of the modern hardware types.
const DEPLOY_ISO_KEYS: [&str; 3] = ["ilo_deploy_iso", "deploy_iso", "redfish_deploy_iso"];

/// Where a node's floppy is stored.
pub fn floppy_object(container: &str, node: uuid::Uuid) -> ObjectPath {
    ObjectPath::new(container, format!("{node}-floppy"))
}

/// The deploy ISO reference of `node` and the field it came from.
pub fn deploy_iso(node: &Node) -> anyhow::Result<(String, ImageRef)> {
    for key in DEPLOY_ISO_KEYS {
        match node.driver_info.get(key) {
            None | Some(Value::Null) => continue,
            Some(Value::String(s)) => {
                let field = format!("driver_info.{key}");
                let r = image::parse(&field, s)?;
                return Ok((field, r));
            }
            Some(other) => bail!("driver_info.{key} must be a string, found {other}"),
        }
    }
    bail!("driver_info.ilo_deploy_iso is missing: the deploy ISO to boot the node from")
}

/// The virtual-media boot interface (Ironic's `ilo-virtual-media`): the ramdisk from the
/// deploy ISO and its floppy, a netboot instance from its boot ISO ([`instance`]).
pub struct VirtualMediaBoot {
    ctx: Arc<DeployContext>,
}

impl VirtualMediaBoot {
    /// The interface over `ctx`.
    pub fn new(ctx: Arc<DeployContext>) -> VirtualMediaBoot {
        VirtualMediaBoot { ctx }
    }
}

#[async_trait::async_trait]
impl BootInterface for VirtualMediaBoot {
    async fn validate(&self, node: &Node) -> anyhow::Result<()> {
        deploy_iso(node)?;
        Ok(())
    }

    /// The virtual-media licence, and the deploy ISO there to be read.
    async fn validate_bmc(&self, bmc: &Bmc, node: &Node) -> anyhow::Result<()> {
        let (licensed, licences) = bmc.vmedia_licensed().await?;
        if !licensed {
            bail!(
                "virtual media needs an iLO Advanced licence; this iLO has: {}. Deploy this node \
                 with the pxe_ilo driver (network boot, iLO for power and boot device only)",
                if licences.is_empty() {
                    "none"
                } else {
                    &licences
                }
            );
        }
        let (iso_field, iso) = deploy_iso(node)?;
        image::check(self.ctx.objects.as_ref(), &iso_field, &iso).await
    }

    async fn validate_instance(&self, node: &Node) -> anyhow::Result<()> {
        instance::validate(&self.ctx, node)
            .await
            .context("checking the boot ISO the instance will boot from")
    }

    fn boots_agent(&self) -> bool {
        true
    }

    async fn prepare_ramdisk(
        &self,
        bmc: &Bmc,
        node: &mut Node,
        ramdisk: Ramdisk<'_>,
    ) -> anyhow::Result<()> {
        prepare(&self.ctx, bmc, node, ramdisk).await
    }

    async fn clean_up_ramdisk(&self, bmc: Option<&Bmc>, node: &mut Node) {
        cleanup(&self.ctx, bmc, node).await
    }

    async fn prepare_instance(&self, node: &mut Node, root_uuid: &str) -> anyhow::Result<()> {
        instance::prepare(&self.ctx, node, root_uuid).await
    }

    async fn boot_instance(&self, bmc: &Bmc, node: &Node) -> anyhow::Result<()> {
        instance::boot_instance(&self.ctx, bmc, node)
            .await
            .context("booting the instance from its boot ISO")
    }

    async fn reboot_instance(&self, bmc: &Bmc, node: &Node) -> anyhow::Result<()> {
        instance::reattach(&self.ctx, bmc, node)
            .await
            .context("attaching the instance's boot ISO again")
    }

    async fn clean_up_instance(&self, node: &mut Node) {
        instance::release(&self.ctx, node).await
    }
}

/// Floppies built and stored at once, by all nodes together. Each is a 1.44 MB image in
/// memory until stored (with the built-in store's copy buffer and fsync); 1,000 deploys started
/// at once held them all together and took the conductor to 470 MiB. Eight keep the store
/// busy (a floppy takes milliseconds) and the memory flat.
const FLOPPY_BUILDS: usize = 8;
static FLOPPY_SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(FLOPPY_BUILDS);

/// Boots `node`'s deploy ramdisk from virtual media; the node must be validated. Writes the
/// ramdisk's secret (agent token or deploy key) to the store before the node powers on, so
/// its first call back finds it.
async fn prepare(
    ctx: &DeployContext,
    bmc: &Bmc,
    node: &mut Node,
    ramdisk: Ramdisk<'_>,
) -> anyhow::Result<()> {
    let config = &ctx.config;
    let wanted_mode = deploy_boot_mode(node)?;
    let (iso_field, iso) = deploy_iso(node)?;
    bmc.power_off().await?;

    let ports = ctx.node_ports(node.uuid).await?;
    // The iSCSI floppy names the boot mode, so it is settled before the floppy is built.
    let mode = bmc.ensure_boot_mode(wanted_mode).await?;
    super::secure_boot::prepare(bmc, node).await?;
    let (params, secret_key, secret) = match ramdisk {
        Ramdisk::Agent => {
            let token = floppy::new_agent_token()?;
            let params = floppy::agent_params(node, &ports, config, &token)?;
            (params, AGENT_TOKEN_KEY, token)
        }
        Ramdisk::Iscsi { boot_option, chap } => {
            let key = floppy::new_deploy_key()?;
            let boot_mode = mode.into();
            let params = floppy::iscsi_params(
                node,
                &ports,
                config,
                &floppy::IscsiFloppy {
                    deploy_key: &key,
                    boot_option,
                    boot_mode,
                    chap,
                },
            )?;
            (params, DEPLOY_KEY_KEY, key)
        }
    };
    let floppy_path = floppy_object(&config.container, node.uuid);
    {
        let _slot = FLOPPY_SLOTS
            .acquire()
            .await
            .context("waiting for a turn to build the floppy")?;
        let image = floppy::build_image(&params)?;
        let options = PutOptions {
            delete_after: Some(config.deploy_helper_images_ttl),
            ..PutOptions::default()
        };
        ctx.objects
            .put(
                &floppy_path,
                ObjectBody::Bytes(Bytes::from(image)),
                &options,
            )
            .await
            .with_context(|| {
                format!(
                    "storing the floppy as {floppy_path} in the {} store",
                    ctx.objects.kind()
                )
            })?;
    }
    let floppy_url = ctx
        .objects
        .temp_url(&floppy_path, config.deploy_helper_images_ttl)
        .await
        .with_context(|| format!("making a temp URL for {floppy_path}"))?;
    let iso_url = image::resolve(
        ctx.objects.as_ref(),
        &config.container,
        &iso_field,
        &iso,
        config.deploy_helper_images_ttl,
    )
    .await?;

    // A BMC that cannot read a medium quotes its URL; the signature must not reach
    // `last_error` (it would let anyone read the floppy and its agent token).
    bmc.insert(VmediaDevice::Floppy, &floppy_url)
        .await
        .map_err(without_signatures)?;
    bmc.insert(VmediaDevice::Cdrom, &iso_url)
        .await
        .map_err(without_signatures)?;
    bmc.boot_once_from_cd().await?;

    record_ramdisk_boot(ctx, node, secret_key, &secret, mode).await?;
    bmc.power_on().await?;
    tracing::info!(node = %node.uuid, boot_mode = %mode, "deploy ramdisk booting from virtual media");
    Ok(())
}

/// `err` as text with every temp URL signature masked.
fn without_signatures(err: crate::bmc::BmcError) -> anyhow::Error {
    anyhow::anyhow!(vmdeploy_shared::redact::signatures(&err.to_string()).into_owned())
}

/// Ejects both media, deletes the floppy object and wipes the token. Never fails; `bmc` is
/// `None` when the BMC could not be reached (the media are then left, and said so).
async fn cleanup(ctx: &DeployContext, bmc: Option<&Bmc>, node: &mut Node) {
    let uuid = node.uuid;
    match bmc {
        Some(bmc) => {
            for device in [VmediaDevice::Floppy, VmediaDevice::Cdrom] {
                if let Err(e) = bmc.eject(device).await {
                    tracing::warn!(node = %uuid, error = %format!("{e:#}"), "clean-up: ejecting the virtual {device} failed");
                }
            }
        }
        None => {
            tracing::warn!(node = %uuid, "clean-up: the BMC is unreachable, virtual media left inserted")
        }
    }
    let path = floppy_object(&ctx.config.container, uuid);
    if let Err(e) = ctx.objects.delete(&path).await {
        tracing::warn!(node = %uuid, object = %path, error = %e, "clean-up: deleting the floppy failed (it expires by itself)");
    }
    wipe_token(&mut node.driver_internal_info);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bmc::BootMode;
    use crate::node::capabilities::{secure_boot_wanted, CapabilitiesError};
    use crate::states::ProvisionState;
    use serde_json::json;
    use uuid::Uuid;

    fn node(properties: Value, instance_info: Value) -> Node {
        let mut n = Node::new(Uuid::new_v4(), "agent_ilo", ProvisionState::Deploying);
        if let Value::Object(o) = properties {
            n.properties = o;
        }
        if let Value::Object(o) = instance_info {
            n.instance_info = o;
        }
        n
    }

    #[test]
    fn boot_mode_from_capabilities() {
        let n = node(
            json!({"capabilities": "cpu_vt:true,boot_mode:uefi"}),
            json!({}),
        );
        assert_eq!(deploy_boot_mode(&n).expect("ok"), Some(BootMode::Uefi));
        let n = node(json!({}), json!({"capabilities": {"boot_mode": "bios"}}));
        assert_eq!(deploy_boot_mode(&n).expect("ok"), Some(BootMode::Bios));
        // The node's secure_boot:true means UEFI, and refuses a BIOS deploy.
        let n = node(json!({"capabilities": "secure_boot:true"}), json!({}));
        assert_eq!(deploy_boot_mode(&n).expect("ok"), Some(BootMode::Uefi));
        assert!(secure_boot_wanted(&n).expect("ok"));
        let n = node(
            json!({"capabilities": "secure_boot:true"}),
            json!({"capabilities": {"boot_mode": "bios"}}),
        );
        assert!(matches!(
            secure_boot_wanted(&n),
            Err(CapabilitiesError::SecureBootNeedsUefi)
        ));
        // The flavor's explicit false wins over the node's true.
        let n = node(
            json!({"capabilities": "secure_boot:true"}),
            json!({"capabilities": {"secure_boot": "false"}}),
        );
        assert!(!secure_boot_wanted(&n).expect("ok"));
        let n = node(json!({"capabilities": "boot_mode:efi"}), json!({}));
        let err = deploy_boot_mode(&n).expect_err("bad mode");
        assert!(
            format!("{err}").contains("properties/capabilities"),
            "{err}"
        );
    }

    #[test]
    fn deploy_iso_field_is_required_and_named() {
        let mut n = node(json!({}), json!({}));
        let err = deploy_iso(&n).expect_err("missing");
        assert!(
            format!("{err}").contains("driver_info.ilo_deploy_iso"),
            "{err}"
        );
        n.driver_info
            .insert("ilo_deploy_iso".into(), json!("ftp://x/deploy.iso"));
        let err = deploy_iso(&n).expect_err("bad scheme");
        assert!(
            format!("{err}").contains("driver_info.ilo_deploy_iso"),
            "{err}"
        );
        n.driver_info
            .insert("ilo_deploy_iso".into(), json!("swift://isos/deploy.iso"));
        let (field, r) = deploy_iso(&n).expect("valid");
        assert_eq!(field, "driver_info.ilo_deploy_iso");
        assert_eq!(r, ImageRef::Swift(ObjectPath::new("isos", "deploy.iso")));
        assert_eq!(
            floppy_object("c", n.uuid).to_string(),
            format!("c/{}-floppy", n.uuid)
        );
    }
}
