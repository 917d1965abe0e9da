//! UEFI Secure Boot around a deploy: turned on through the BMC before the deploy ramdisk
//! boots when the node or its instance asks for it (`secure_boot:true`,
//! [`secure_boot_wanted`]), and off again at undeploy, only when this conductor turned it on.
//!
//! # Why on before the ramdisk
//! Upstream Ironic turned Secure Boot off for its unsigned ramdisk and on again just before the
//! instance's first boot. Ours boots signed (shim, GRUB and kernel from Debian): the ramdisk
//! then proves the chain works on this node before the disk is written, and the node is never
//! without Secure Boot between the deploy and the instance.
//!
//! # What is remembered
//! [`ENABLED_BY_US_KEY`] in `driver_internal_info`: set when [`prepare`] changed the setting,
//! so an operator's own Secure Boot survives an undeploy untouched.

use anyhow::Context;

use crate::bmc::Bmc;
use crate::node::capabilities::secure_boot_wanted;
use crate::store::Node;

/// `driver_internal_info` key: this conductor turned Secure Boot on for the deploy.
pub const ENABLED_BY_US_KEY: &str = "secure_boot_enabled_by_vmdeploy";

/// Before the deploy boot, with the boot mode already set: turns Secure Boot on when wanted.
pub async fn prepare(bmc: &Bmc, node: &mut Node) -> anyhow::Result<()> {
    if !secure_boot_wanted(node)? {
        return Ok(());
    }
    if bmc
        .ensure_secure_boot(true)
        .await
        .context("turning UEFI Secure Boot on for the deploy")?
    {
        tracing::info!(node = %node.uuid, "Secure Boot turned on for the deploy");
        node.driver_internal_info
            .insert(ENABLED_BY_US_KEY.into(), serde_json::Value::Bool(true));
    }
    Ok(())
}

/// At undeploy: turns Secure Boot off again when [`prepare`] turned it on.
pub async fn restore(bmc: &Bmc, node: &mut Node) -> anyhow::Result<()> {
    if node.driver_internal_info.get(ENABLED_BY_US_KEY).is_none() {
        return Ok(());
    }
    bmc.ensure_secure_boot(false)
        .await
        .context("turning UEFI Secure Boot off again (the deploy turned it on)")?;
    node.driver_internal_info.remove(ENABLED_BY_US_KEY);
    tracing::info!(node = %node.uuid, "Secure Boot turned off again at undeploy");
    Ok(())
}
