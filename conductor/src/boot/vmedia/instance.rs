//! Netboot of a deployed partition image: the instance boots on every boot from a boot ISO on
//! the virtual CD (docs/architecture.md §1, §6; [`super::boot_iso`]): the ISO is chosen (given, or
//! built and shared by [`super::boot_iso::BootIsos`] under its usage count), attached,
//! and the CD made the persistent boot device. Temp URLs expire, so every later power-on or
//! reboot through the API attaches it again first.
//!
//! # Design
//! - Everything known before the disk is written is checked before it: at `validate`, what
//!   configuration decides (a boot ISO store and its loaders, the kernel and ramdisk fields,
//!   a given ISO's `HEAD`); after the call-back and before the first write, [`prepare`]
//!   fetches and checks the kernel and ramdisk and builds and stores the ISO, its command line
//!   naming the root UUID read from the image itself. After the write only the attach is left
//!   ([`boot_instance`]).
//! - Which ISO: [`boot_iso::choose`] over `instance_info.ilo_boot_iso` and the image's
//!   `boot_iso` property. This conductor has no Glance, so the image's properties are read
//!   where Ironic copies them for images it does not get from Glance: `instance_info`
//!   (`instance_info.boot_iso`, as for Ironic's standalone ramdisk deploy; `kernel` and
//!   `ramdisk` likewise).
//! - A given ISO is the user's: checked (an `http(s)` URL with a `HEAD`, a file or object
//!   for being there), attached through [`image::resolve`] like the deploy ISO, never counted
//!   or deleted.
//! - Otherwise the kernel and ramdisk come from the instance image cache (kept as they are,
//!   [`ImageSource::as_is`]; `instance_info` carries no checksum for them) and
//!   [`BootIsos::acquire`] counts this node in, building the ISO when it is not stored.
//! - The node records its ISO in `driver_internal_info` ([`BOOT_ISO_KEY`]) as soon as the
//!   acquire returns, and the record is written to the store at once, so a failure after it,
//!   or a conductor restart, still finds what to release. [`release`] counts down and forgets
//!   the record, so calling it twice does nothing the second time.
//! - The record holds a reference (`swift://container/boot-...` for a built ISO), not a URL:
//!   each attach resolves it to a fresh temp URL living [`BootIsos::temp_url_ttl`].
//!
//! # Limitations
//! - The kernel and ramdisk are cached by reference: a changed file behind the same URL is
//!   not fetched again while the cache holds the old one (no checksum to tell).
//! - A reboot from inside the instance after the temp URL expired finds no CD; a power action
//!   through the API attaches a fresh one.

use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use vmdeploy_shared::iso;

use super::boot_iso::{self, BootIsoKey, BootIsoSource, BootIsos};
use crate::bmc::{Bmc, VmediaDevice};
use crate::context::image::{self, ImageRef};
use crate::context::DeployContext;
use crate::image_cache::FetchPolicy;
use crate::node::capabilities::secure_boot_wanted;
use crate::node::instance_info::InstanceInfo;
use crate::objects::ObjectPath;
use crate::store::Node;

/// `driver_internal_info` key of the node's boot ISO ([`NodeBootIso`]).
pub const BOOT_ISO_KEY: &str = "netboot_boot_iso";
/// How long the `HEAD` of a given ISO URL may take.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// What a built ISO's record names as its source.
const BUILT: &str = "built";

/// The node's boot ISO as recorded in `driver_internal_info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeBootIso {
    /// `swift://container/object` of a built ISO, or the reference the user gave.
    pub reference: String,
    /// Where it came from: `built`, or the field of a given one.
    pub source: String,
    /// Whether this node holds one count of it in the boot ISO store (built ones only).
    pub counted: bool,
}

impl NodeBootIso {
    /// The node's record, `None` when it has none; a record this code cannot read is an
    /// error naming the key.
    pub fn of(node: &Node) -> anyhow::Result<Option<NodeBootIso>> {
        match node.driver_internal_info.get(BOOT_ISO_KEY) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => serde_json::from_value(v.clone())
                .map(Some)
                .with_context(|| format!("driver_internal_info.{BOOT_ISO_KEY} is {v}: unreadable")),
        }
    }

    fn record(&self, node: &mut Node) {
        // Serialising three plain fields cannot fail; Null would only lose the record.
        let value = serde_json::to_value(self).unwrap_or(Value::Null);
        node.driver_internal_info
            .insert(BOOT_ISO_KEY.to_string(), value);
    }
}

/// A text field of `instance_info`, `None` when absent or not a string.
fn text_field<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.instance_info.get(key).and_then(Value::as_str)
}

/// Makes the node's boot ISO ready before the disk is written: a given one checked, or a
/// built one acquired (kernel and ramdisk fetched and checked, the ISO built and stored when no
/// node shares it yet), and recorded in the node at once, so the deploy's clean-up releases it
/// when a later step fails. `root_uuid` goes on the command line of a built ISO: the root file
/// system's UUID, read from the image before it is written.
pub async fn prepare(ctx: &DeployContext, node: &mut Node, root_uuid: &str) -> anyhow::Result<()> {
    if node.driver_internal_info.contains_key(BOOT_ISO_KEY) {
        // Left by an earlier deploy whose tear-down did not run: give it back first, or its
        // count would never come down.
        tracing::warn!(node = %node.uuid, "an earlier boot ISO is still recorded: releasing it");
        release(ctx, node).await;
    }
    let chosen = match boot_iso::choose(
        text_field(node, "ilo_boot_iso"),
        text_field(node, "boot_iso"),
    ) {
        BootIsoSource::Given { field, reference } => {
            let parsed = image::parse(field, reference)?;
            check_given(ctx, field, &parsed).await?;
            tracing::info!(node = %node.uuid, field, "netboot from a given boot ISO");
            NodeBootIso {
                reference: reference.to_string(),
                source: field.to_string(),
                counted: false,
            }
        }
        BootIsoSource::Build => {
            let lease = acquire_built(ctx, node, root_uuid).await?;
            NodeBootIso {
                reference: ImageRef::Swift(lease.object.clone()).to_string(),
                source: BUILT.to_string(),
                counted: true,
            }
        }
    };
    chosen.record(node);
    if chosen.counted {
        // Written now, not with the deploy's outcome: a crash from here on must still let the
        // recovery's clean-up release the count.
        if let Err(e) = ctx.store.update_node(node).await {
            tracing::warn!(node = %node.uuid, error = %e, "recording the boot ISO in the store failed; it is kept in memory");
        }
    }
    Ok(())
}

/// Attaches the boot ISO [`prepare`] recorded and makes the CD the persistent boot device.
pub async fn boot_instance(ctx: &DeployContext, bmc: &Bmc, node: &Node) -> anyhow::Result<()> {
    let Some(iso) = NodeBootIso::of(node)? else {
        bail!(
            "node {}: no boot ISO is recorded (driver_internal_info.{BOOT_ISO_KEY}) to boot the \
             instance from",
            node.uuid
        );
    };
    attach(ctx, bmc, &iso).await
}

/// The checks `validate` makes for a netboot node, before anything is written: a given ISO
/// is there (its `HEAD` answers), or an ISO can be built (a boot ISO store, a kernel and a
/// ramdisk).
pub async fn validate(ctx: &DeployContext, node: &Node) -> anyhow::Result<()> {
    match boot_iso::choose(
        text_field(node, "ilo_boot_iso"),
        text_field(node, "boot_iso"),
    ) {
        BootIsoSource::Given { field, reference } => {
            check_given(ctx, field, &image::parse(field, reference)?).await
        }
        BootIsoSource::Build => {
            boot_isos(ctx)?.check_loaders(secure_boot_wanted(node)?)?;
            let info = InstanceInfo::of(node).context("instance_info")?;
            if info.kernel.is_none() || info.ramdisk.is_none() {
                bail!(
                    "netboot needs instance_info.kernel and instance_info.ramdisk to build a \
                     boot ISO (or a boot ISO in instance_info.ilo_boot_iso or \
                     instance_info.boot_iso)"
                );
            }
            Ok(())
        }
    }
}

/// Builds the key of the node's ISO, fetches kernel and ramdisk, and counts the node in.
async fn acquire_built(
    ctx: &DeployContext,
    node: &Node,
    root_uuid: &str,
) -> anyhow::Result<boot_iso::BootIsoLease> {
    let isos = boot_isos(ctx)?;
    let images = ctx.images.as_ref().context(
        "this conductor has no instance image cache (images.cache_dir), which building a boot \
         ISO needs",
    )?;
    let info = InstanceInfo::of(node).context("instance_info")?;
    let (Some(kernel), Some(ramdisk)) = (&info.kernel, &info.ramdisk) else {
        bail!(
            "netboot needs instance_info.kernel and instance_info.ramdisk to build a boot ISO \
             (or a boot ISO in instance_info.ilo_boot_iso or instance_info.boot_iso)"
        );
    };
    let root_uuid = root_uuid.trim();
    if root_uuid.is_empty() || root_uuid.contains(char::is_whitespace) {
        bail!("the root file system's UUID {root_uuid:?} cannot go on a kernel command line");
    }
    let (kernel_ref, ramdisk_ref) = (kernel.to_string(), ramdisk.to_string());
    let kernel_file = image::fetch_as_is(ctx, images, "instance_info/kernel", &kernel_ref).await?;
    check_kernel(&kernel_file.path)
        .await
        .with_context(|| format!("instance_info.kernel {kernel_ref}"))?;
    let ramdisk_file =
        image::fetch_as_is(ctx, images, "instance_info/ramdisk", &ramdisk_ref).await?;
    let key = BootIsoKey {
        image_ref: info.image_source.to_string(),
        kernel_ref,
        ramdisk_ref,
        cmdline: isos.cmdline(root_uuid),
        secure_boot: secure_boot_wanted(node)?,
    };
    let lease = isos
        .acquire(&key, &kernel_file.path, &ramdisk_file.path)
        .await
        .context("acquiring the shared boot ISO")?;
    tracing::info!(
        node = %node.uuid,
        object = %lease.object,
        usage_count = lease.usage_count,
        cmdline = %key.cmdline,
        "netboot from a built boot ISO"
    );
    Ok(lease)
}

/// Refuses a kernel no boot loader of the ISO can start, from its first bytes.
async fn check_kernel(path: &std::path::Path) -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt as _;
    let file = tokio::fs::File::open(path)
        .await
        .with_context(|| format!("opening {}", path.display()))?;
    let mut head = Vec::with_capacity(iso::KERNEL_CHECK_LEN);
    file.take(iso::KERNEL_CHECK_LEN as u64)
        .read_to_end(&mut head)
        .await
        .with_context(|| format!("reading {}", path.display()))?;
    iso::check_kernel(&head)?;
    Ok(())
}

fn boot_isos(ctx: &DeployContext) -> anyhow::Result<&BootIsos> {
    ctx.boot_isos.as_deref().context(
        "this conductor has no boot ISO store, which netboot of a partition image needs \
         (or give one in instance_info.ilo_boot_iso)",
    )
}

/// Checks a given ISO: an `http(s)` URL answers a `HEAD` with success (as Ironic validates
/// `ilo_boot_iso`), a file or object exists.
async fn check_given(ctx: &DeployContext, field: &str, reference: &ImageRef) -> anyhow::Result<()> {
    let ImageRef::Http(url) = reference else {
        return image::check(ctx.objects.as_ref(), field, reference).await;
    };
    let shown = crate::image_cache::error::shown_url(url.as_str());
    let client = crate::image_cache::fetch::build_client(&FetchPolicy {
        extra_ca_pem: ctx.config.api_ca_pem.clone(),
        ..FetchPolicy::default()
    })
    .context("an HTTP client to check the boot ISO")?;
    let response = client
        .head(url.clone())
        .timeout(HEAD_TIMEOUT)
        .send()
        .await
        .with_context(|| format!("{field}: HEAD {shown}"))?;
    if !response.status().is_success() {
        bail!(
            "{field}: HEAD {shown} answered HTTP {}: the boot ISO is not there",
            response.status()
        );
    }
    Ok(())
}

/// Inserts the recorded ISO (a fresh URL) as the virtual CD and makes the CD the persistent
/// boot device.
async fn attach(ctx: &DeployContext, bmc: &Bmc, iso: &NodeBootIso) -> anyhow::Result<()> {
    let reference = image::parse(&iso.source, &iso.reference)?;
    let ttl = ctx
        .boot_isos
        .as_deref()
        .map_or(boot_iso::DEFAULT_TEMP_URL_TTL, BootIsos::temp_url_ttl);
    let url = image::resolve(
        ctx.objects.as_ref(),
        &ctx.config.container,
        &iso.source,
        &reference,
        ttl,
    )
    .await
    .context("a URL for the boot ISO")?;
    bmc.insert(VmediaDevice::Cdrom, &url).await?;
    Ok(bmc.boot_from_cd().await?)
}

/// Before the API powers on or reboots an active netboot node: attach its boot ISO again
/// with a fresh temp URL.
pub async fn reattach(ctx: &DeployContext, bmc: &Bmc, node: &Node) -> anyhow::Result<()> {
    let Some(iso) = NodeBootIso::of(node)? else {
        bail!(
            "node {} boots from a boot ISO but none is recorded (driver_internal_info.{BOOT_ISO_KEY}): \
             deploy it again",
            node.uuid
        );
    };
    attach(ctx, bmc, &iso).await?;
    tracing::info!(node = %node.uuid, source = %iso.source, "boot ISO attached again");
    Ok(())
}

/// Gives the node's boot ISO back (the usage count goes down; the ISO is deleted at zero) and
/// forgets it. Never fails: what cannot be done is logged.
pub async fn release(ctx: &DeployContext, node: &mut Node) {
    let iso = match NodeBootIso::of(node) {
        Ok(Some(iso)) => iso,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(node = %node.uuid, error = %format!("{e:#}"), "forgetting an unreadable boot ISO record");
            node.driver_internal_info.remove(BOOT_ISO_KEY);
            return;
        }
    };
    if iso.counted {
        match (counted_object(&iso), ctx.boot_isos.as_deref()) {
            (Ok(object), Some(isos)) => match isos.release(&object).await {
                Ok(count) => {
                    tracing::info!(node = %node.uuid, %object, usage_count = count, "boot ISO released")
                }
                Err(e) => {
                    // Kept recorded: a later tear-down or clean-up can try again.
                    tracing::warn!(node = %node.uuid, %object, error = %format!("{e:#}"), "releasing the boot ISO failed; it stays recorded");
                    return;
                }
            },
            (Err(e), _) => {
                tracing::warn!(node = %node.uuid, error = %format!("{e:#}"), "the recorded boot ISO is not an object: forgetting it");
            }
            (_, None) => {
                tracing::warn!(node = %node.uuid, reference = %iso.reference, "no boot ISO store to release the ISO in: forgetting it");
            }
        }
    }
    node.driver_internal_info.remove(BOOT_ISO_KEY);
}

fn counted_object(iso: &NodeBootIso) -> anyhow::Result<ObjectPath> {
    match image::parse(BOOT_ISO_KEY, &iso.reference)? {
        ImageRef::Swift(path) => Ok(path),
        other => bail!("{other:?} is not a stored boot ISO"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::ProvisionState;
    use serde_json::json;

    #[test]
    fn the_record_reads_back_and_a_bad_one_names_its_key() {
        let mut node = Node::new(uuid::Uuid::new_v4(), "iscsi_ilo", ProvisionState::Active);
        assert_eq!(NodeBootIso::of(&node).expect("readable"), None);
        let iso = NodeBootIso {
            reference: "swift://c/boot-00".into(),
            source: BUILT.into(),
            counted: true,
        };
        iso.record(&mut node);
        assert_eq!(NodeBootIso::of(&node).expect("readable"), Some(iso.clone()));
        assert_eq!(
            counted_object(&iso).expect("an object"),
            ObjectPath::new("c", "boot-00")
        );
        node.driver_internal_info
            .insert(BOOT_ISO_KEY.into(), json!("swift://c/boot-00"));
        let err = NodeBootIso::of(&node).expect_err("unreadable");
        assert!(format!("{err:#}").contains(BOOT_ISO_KEY), "{err:#}");
    }
}
