//! Netboot of a deployed partition image: the instance boots on every boot from a boot ISO on
//! the virtual CD (DESIGN.md §1, §6; [`super::super::boot_iso`]): the ISO is chosen (given, or
//! built and shared by [`super::super::boot_iso::BootIsos`] under its usage count), attached,
//! and the CD made the persistent boot device. Temp URLs expire, so every later power-on or
//! reboot through the API attaches it again first.

use anyhow::bail;

use super::super::bmc::Bmc;
use super::super::DeployContext;
use crate::store::Node;

/// Attaches the node's boot ISO (acquiring a shared one on first use) and makes the CD the
/// persistent boot device. `root_uuid` goes on the command line of a built ISO.
pub async fn boot_instance(
    ctx: &DeployContext,
    bmc: &Bmc,
    node: &mut Node,
    root_uuid: &str,
) -> anyhow::Result<()> {
    let _ = (ctx, bmc, node, root_uuid);
    bail!("netboot from a boot ISO is not built yet")
}

/// Before the API powers on or reboots an active netboot node: attach its boot ISO again
/// with a fresh temp URL.
pub async fn reattach(ctx: &DeployContext, bmc: &Bmc, node: &Node) -> anyhow::Result<()> {
    let _ = (ctx, bmc, node);
    Ok(())
}

/// Gives the node's boot ISO back (the usage count goes down; the ISO is deleted at zero) and
/// forgets it. Never fails: what cannot be done is logged.
pub async fn release(ctx: &DeployContext, node: &mut Node) {
    let _ = (ctx, node);
}
