//! The network boot interface (Ironic's `ilo-pxe`; docs/architecture.md §3;
//! docs/ironic-protocols.md §1.5, §2) of `pxe_ilo`: for a server whose iLO has no Advanced
//! licence, so no virtual media. The iLO still manages power, the boot device and the boot
//! mode; the ramdisk and a netboot instance boot from this conductor's boot root, which
//! `crate::netboot` serves over TFTP and HTTP.
//!
//! # Design
//! - The ramdisk: the deploy kernel and ramdisk (`driver_info.pxe_deploy_kernel`/
//!   `pxe_deploy_ramdisk`, else `netboot.deploy_*`) from the image cache into the boot root,
//!   with PXELINUX, GRUB and iPXE configurations under the node's MACs
//!   ([`crate::netboot::files`]); the deploy parameters on the kernel command line (the PXE
//!   form of the floppy's keys, with a fresh one-use deploy key); a one-time network boot;
//!   power on.
//! - Once the ramdisk has called back its files go (its command line held the key).
//! - A netboot instance: its own kernel and ramdisk in the boot root with
//!   `root=UUID=<root file system>`, the network as the persistent boot device. The files
//!   stay until tear-down, so a later power-on needs nothing renewed.
//!
//! # Limitations
//! DHCP stays the site's: the conductor serves files, the site's DHCP points servers at them
//! (README). Only the iSCSI ramdisk boots this way: no agent, so no automated cleaning.

use std::sync::Arc;

use anyhow::{bail, Context};
use serde_json::Value;
use vmdeploy_shared::params::{keys, BootOption};

use super::vmedia::floppy;
use super::{record_ramdisk_boot, wipe_token, BootInterface, Ramdisk, DEPLOY_KEY_KEY};
use crate::bmc::{Bmc, BootMode};
use crate::context::image;
use crate::context::DeployContext;
use crate::netboot::config::Mac;
use crate::netboot::files::BootFiles;
use crate::netboot::Netboot;
use crate::node::capabilities::{deploy_boot_mode, secure_boot_wanted};
use crate::node::instance_info::InstanceInfo;
use crate::store::Node;

/// `driver_info` key of the deploy kernel (Ironic's).
pub const DEPLOY_KERNEL_FIELD: &str = "pxe_deploy_kernel";
/// `driver_info` key of the deploy ramdisk (Ironic's).
pub const DEPLOY_RAMDISK_FIELD: &str = "pxe_deploy_ramdisk";
/// The x86 kernel's command-line limit (`COMMAND_LINE_SIZE`), the terminating NUL included.
const KERNEL_CMDLINE_MAX: usize = 2048;

/// Which boot entry a node's files hold.
#[derive(Debug, Clone, Copy)]
enum Entry {
    /// The deploy ramdisk, its command line holding the deploy key.
    Deploy,
    /// A netboot instance's own kernel and ramdisk.
    Instance,
}

/// The network boot interface.
pub struct PxeBoot {
    ctx: Arc<DeployContext>,
}

impl PxeBoot {
    /// The interface over `ctx`.
    pub fn new(ctx: Arc<DeployContext>) -> PxeBoot {
        PxeBoot { ctx }
    }

    fn netboot(&self) -> anyhow::Result<&Netboot> {
        self.ctx.netboot.as_deref().context(
            "this conductor serves no network boot, which pxe_ilo needs: set netboot.tftp_listen \
             and/or netboot.http_listen in its configuration",
        )
    }

    /// The node's MACs, for the boot configuration's file names.
    async fn macs(&self, node: &Node) -> anyhow::Result<Vec<Mac>> {
        let ports = self.ctx.node_ports(node.uuid).await?;
        let macs = ports
            .iter()
            .map(|p| {
                Mac::parse(&p.address)
                    .with_context(|| format!("port {} of node {}", p.uuid, node.uuid))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        if macs.is_empty() {
            bail!(
                "node {} has no port: pxe_ilo finds the node's boot configuration by the MAC it \
                 boots from (baremetal port create <mac> --node {})",
                node.uuid,
                node.uuid
            );
        }
        Ok(macs)
    }

    /// `files` (pairs of field and reference: kernel, then ramdisk) from the image cache.
    async fn fetch_pair(
        &self,
        refs: &[(String, String); 2],
    ) -> anyhow::Result<[crate::image_cache::CachedImage; 2]> {
        let images = self.ctx.images.as_ref().context(
            "this conductor has no image cache (images.cache_dir), which pxe_ilo fetches kernels \
             and ramdisks through",
        )?;
        let kernel = image::fetch_as_is(&self.ctx, images, &refs[0].0, &refs[0].1).await?;
        let ramdisk = image::fetch_as_is(&self.ctx, images, &refs[1].0, &refs[1].1).await?;
        Ok([kernel, ramdisk])
    }

    /// A netboot instance: its kernel and ramdisk in the boot root, booting `root_uuid`.
    async fn write_instance_entry(&self, node: &Node, root_uuid: &str) -> anyhow::Result<()> {
        let netboot = self.netboot()?;
        let info = InstanceInfo::of(node).context("instance_info")?;
        let (Some(kernel), Some(ramdisk)) = (&info.kernel, &info.ramdisk) else {
            bail!("netboot needs instance_info.kernel and instance_info.ramdisk");
        };
        let root_uuid = root_uuid.trim();
        if root_uuid.is_empty() || root_uuid.contains(char::is_whitespace) {
            bail!("the root file system's UUID {root_uuid:?} cannot go on a kernel command line");
        }
        let refs = [
            ("instance_info/kernel".to_string(), kernel.to_string()),
            ("instance_info/ramdisk".to_string(), ramdisk.to_string()),
        ];
        let [k, r] = self.fetch_pair(&refs).await?;
        let mut cmdline = format!("root=UUID={root_uuid}");
        if !netboot.instance_append_params.is_empty() {
            cmdline.push(' ');
            cmdline.push_str(&netboot.instance_append_params);
        }
        self.write_entry(node, Entry::Instance, [k, r], cmdline)
            .await
    }

    /// Puts `files` (kernel, initramfs: kept alive until linked) in the boot root as the
    /// node's `entry`, found by every MAC of the node (blocking file work off the runtime).
    async fn write_entry(
        &self,
        node: &Node,
        entry: Entry,
        files: [crate::image_cache::CachedImage; 2],
        cmdline: String,
    ) -> anyhow::Result<()> {
        let root = self.netboot()?.root.clone();
        let macs = self.macs(node).await?;
        let uuid = node.uuid;
        let (label, kernel_name, initrd_name) = match entry {
            Entry::Deploy => ("deploy", "deploy_kernel", "deploy_ramdisk"),
            Entry::Instance => ("instance", "kernel", "ramdisk"),
        };
        tokio::task::spawn_blocking(move || {
            let [kernel, initrd] = &files;
            root.write_node(
                uuid,
                &macs,
                label,
                &BootFiles {
                    kernel_from: &kernel.path,
                    kernel_name,
                    initrd_from: &initrd.path,
                    initrd_name,
                },
                &cmdline,
            )
        })
        .await
        .context("the task writing the boot files failed")?
        .with_context(|| format!("writing the {label} network boot configuration"))
    }

    /// Removes the node's boot files (blocking file work off the runtime).
    async fn remove_boot_files(&self, node: &Node) {
        let Some(netboot) = self.ctx.netboot.as_deref() else {
            return;
        };
        let root = netboot.root.clone();
        let uuid = node.uuid;
        if let Err(e) = tokio::task::spawn_blocking(move || root.remove_node(uuid)).await {
            tracing::warn!(node = %uuid, error = %e, "clean-up: removing the boot files panicked");
        }
    }
}

/// The deploy kernel and ramdisk references: the node's, else the conductor's defaults.
fn deploy_refs(node: &Node, netboot: &Netboot) -> anyhow::Result<[(String, String); 2]> {
    let field = |key: &str, default: &Option<String>| -> anyhow::Result<(String, String)> {
        match node.driver_info.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => {
                let field = format!("driver_info/{key}");
                image::parse(&field, s.trim())?;
                Ok((field, s.trim().to_string()))
            }
            Some(Value::Null) | None => match default {
                Some(d) => {
                    let field = format!("netboot.{}", key.trim_start_matches("pxe_"));
                    image::parse(&field, d)?;
                    Ok((field, d.clone()))
                }
                None => bail!(
                    "driver_info.{key} is missing and the conductor has no default \
                     (netboot.{})",
                    key.trim_start_matches("pxe_")
                ),
            },
            Some(other) => bail!("driver_info.{key} must be an image reference, not {other}"),
        }
    };
    Ok([
        field(DEPLOY_KERNEL_FIELD, &netboot.deploy_kernel)?,
        field(DEPLOY_RAMDISK_FIELD, &netboot.deploy_ramdisk)?,
    ])
}

/// The deploy ramdisk's kernel command line: the floppy's iSCSI keys in their PXE form
/// (no `boot_method=vmedia`: the ramdisk reads its command line only), then
/// `netboot.append_params`.
fn deploy_cmdline(
    config: &crate::context::DeployConfig,
    netboot: &Netboot,
    node: &Node,
    ports: &[crate::store::Port],
    key: &vmdeploy_shared::secret::Secret,
    boot_option: BootOption,
    mode: BootMode,
) -> anyhow::Result<String> {
    let boot_mode = mode.into();
    let params = floppy::iscsi_params(
        node,
        ports,
        config,
        &floppy::IscsiFloppy {
            deploy_key: key,
            boot_option,
            boot_mode,
            chap: config
                .iscsi_chap
                .as_ref()
                .map(|c| (c.user.as_str(), &c.secret)),
        },
    )?;
    let mut words: Vec<String> = params
        .iter()
        .filter(|(k, _)| *k != keys::BOOT_METHOD)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let append = &netboot.append_params;
    if !append.is_empty() {
        words.push(append.clone());
    }
    let cmdline = words.join(" ");
    if cmdline.len() >= KERNEL_CMDLINE_MAX {
        bail!(
            "the deploy ramdisk's kernel command line would be {} bytes, over the kernel's \
             {KERNEL_CMDLINE_MAX}: shorten netboot.append_params or \
             driver_info.kernel_append_params (a TLS API's CA certificate also rides on it)",
            cmdline.len()
        );
    }
    Ok(cmdline)
}

#[async_trait::async_trait]
impl BootInterface for PxeBoot {
    async fn validate(&self, node: &Node) -> anyhow::Result<()> {
        deploy_refs(node, self.netboot()?)?;
        refuse_secure_boot(node)?;
        self.macs(node).await?;
        Ok(())
    }

    async fn validate_bmc(&self, _bmc: &Bmc, _node: &Node) -> anyhow::Result<()> {
        // No licence check: power, boot device and boot mode need none.
        Ok(())
    }

    async fn validate_instance(&self, node: &Node) -> anyhow::Result<()> {
        self.netboot()?;
        let info = InstanceInfo::of(node).context("instance_info")?;
        if info.kernel.is_none() || info.ramdisk.is_none() {
            bail!(
                "node {}: a netboot partition image needs instance_info.kernel and \
                 instance_info.ramdisk (the instance boots them from the network)",
                node.uuid
            );
        }
        Ok(())
    }

    fn boots_agent(&self) -> bool {
        false
    }

    async fn prepare_ramdisk(
        &self,
        bmc: &Bmc,
        node: &mut Node,
        ramdisk: Ramdisk<'_>,
    ) -> anyhow::Result<()> {
        // The CHAP credentials are the configuration's, which `deploy_cmdline` reads.
        let Ramdisk::Iscsi { boot_option, .. } = ramdisk else {
            bail!(
                "node {}: the network boot serves the iSCSI ramdisk only, not the agent",
                node.uuid
            );
        };
        let netboot = self.netboot()?;
        refuse_secure_boot(node)?;
        let wanted_mode = deploy_boot_mode(node)?;
        let refs = deploy_refs(node, netboot)?;
        let [kernel, ramdisk] = self
            .fetch_pair(&refs)
            .await
            .context("fetching the deploy kernel and ramdisk")?;
        bmc.power_off().await?;
        let mode = bmc.ensure_boot_mode(wanted_mode).await?;
        let ports = self.ctx.node_ports(node.uuid).await?;
        let key = floppy::new_deploy_key()?;
        let cmdline = deploy_cmdline(
            &self.ctx.config,
            netboot,
            node,
            &ports,
            &key,
            boot_option,
            mode,
        )?;
        self.write_entry(node, Entry::Deploy, [kernel, ramdisk], cmdline)
            .await?;
        bmc.boot_once_from_network().await?;
        record_ramdisk_boot(&self.ctx, node, DEPLOY_KEY_KEY, &key, mode).await?;
        bmc.power_on().await?;
        tracing::info!(node = %node.uuid, boot_mode = %mode, "deploy ramdisk booting from the network");
        Ok(())
    }

    async fn clean_up_ramdisk(&self, _bmc: Option<&Bmc>, node: &mut Node) {
        self.remove_boot_files(node).await;
        wipe_token(&mut node.driver_internal_info);
    }

    async fn prepare_instance(&self, node: &mut Node, root_uuid: &str) -> anyhow::Result<()> {
        self.write_instance_entry(node, root_uuid)
            .await
            .context("booting the instance from the network")
    }

    async fn boot_instance(&self, bmc: &Bmc, _node: &Node) -> anyhow::Result<()> {
        Ok(bmc.boot_from_network().await?)
    }

    async fn reboot_instance(&self, _bmc: &Bmc, _node: &Node) -> anyhow::Result<()> {
        // The instance's files stay in the boot root until tear-down.
        Ok(())
    }

    async fn clean_up_instance(&self, node: &mut Node) {
        self.remove_boot_files(node).await;
    }
}

/// The network boot serves PXELINUX and iPXE, which no Secure Boot firmware runs: a node that
/// wants Secure Boot is refused before anything is changed, not left at a firmware refusal.
fn refuse_secure_boot(node: &Node) -> anyhow::Result<()> {
    if secure_boot_wanted(node)? {
        bail!(
            "node {}: capabilities ask for secure_boot:true, but the network boot interface \
             serves unsigned loaders (PXELINUX, iPXE); use the vmedia boot interface",
            node.uuid
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::ProvisionState;
    use serde_json::json;

    fn netboot(dir: &std::path::Path, defaults: bool) -> Netboot {
        Netboot {
            root: crate::netboot::files::BootRoot::open(dir.join("boot"), None).expect("root"),
            deploy_kernel: defaults.then(|| "file:///srv/deploy.kernel".to_string()),
            deploy_ramdisk: defaults.then(|| "file:///srv/deploy.initramfs".to_string()),
            append_params: "console=ttyS0".into(),
            instance_append_params: String::new(),
        }
    }

    fn node() -> Node {
        let mut node = Node::new(uuid::Uuid::new_v4(), "pxe_ilo", ProvisionState::Deploying);
        node.instance_info
            .insert("image_source".into(), json!("http://images/root.img"));
        node
    }

    fn port(node: &Node) -> crate::store::Port {
        crate::store::Port {
            uuid: uuid::Uuid::new_v4(),
            address: "52:54:00:12:34:56".into(),
            node_uuid: node.uuid,
            pxe_enabled: true,
            extra: Default::default(),
            created_at: time::OffsetDateTime::UNIX_EPOCH,
            updated_at: None,
        }
    }

    #[test]
    fn the_nodes_deploy_files_win_over_the_conductors() {
        let dir = tempfile::tempdir().expect("dir");
        let mut n = node();
        let refs = deploy_refs(&n, &netboot(dir.path(), true)).expect("defaults");
        assert_eq!(refs[0].0, "netboot.deploy_kernel");
        assert_eq!(refs[1].1, "file:///srv/deploy.initramfs");
        n.driver_info
            .insert(DEPLOY_KERNEL_FIELD.into(), json!("http://h/k"));
        n.driver_info
            .insert(DEPLOY_RAMDISK_FIELD.into(), json!("http://h/r"));
        let refs = deploy_refs(&n, &netboot(dir.path(), true)).expect("node's");
        assert_eq!(
            refs[0],
            ("driver_info/pxe_deploy_kernel".into(), "http://h/k".into())
        );
        assert_eq!(refs[1].1, "http://h/r");
        n.driver_info.clear();
        let err = deploy_refs(&n, &netboot(dir.path(), false)).expect_err("neither");
        assert!(
            format!("{err:#}").contains("driver_info.pxe_deploy_kernel"),
            "{err:#}"
        );
        n.driver_info
            .insert(DEPLOY_KERNEL_FIELD.into(), json!("ftp://h/k"));
        assert!(
            deploy_refs(&n, &netboot(dir.path(), true)).is_err(),
            "ftp is no image reference"
        );
    }

    #[test]
    fn the_deploy_command_line_is_the_floppys_keys_without_vmedia() {
        let dir = tempfile::tempdir().expect("dir");
        let n = node();
        let key = floppy::new_deploy_key().expect("key");
        let config = crate::context::DeployConfig::for_tests();
        let nb = netboot(dir.path(), true);
        let line = deploy_cmdline(
            &config,
            &nb,
            &n,
            &[port(&n)],
            &key,
            BootOption::Netboot,
            BootMode::Uefi,
        )
        .expect("cmdline");
        let words: Vec<&str> = line.split(' ').collect();
        for expected in [
            format!("deployment_id={}", n.uuid),
            format!("deployment_key={}", key.expose()),
            format!("iscsi_target_iqn=iqn-{}", n.uuid),
            "ironic_api_url=http://127.0.0.1:6385".to_string(),
            "ipa-driver-name=pxe_ilo".to_string(),
            "boot_option=netboot".to_string(),
            "boot_mode=uefi".to_string(),
        ] {
            assert!(words.contains(&expected.as_str()), "{expected} in {line}");
        }
        assert!(words.iter().any(|w| w.starts_with("BOOTIF=")), "{line}");
        assert!(!line.contains("boot_method"), "{line}");
        assert_eq!(words.last(), Some(&"console=ttyS0"), "{line}");
        // The whole line goes in a boot configuration.
        crate::netboot::config::BootEntry {
            label: "deploy".into(),
            kernel: "n/k".into(),
            initrd: "n/i".into(),
            cmdline: line.clone(),
        }
        .check()
        .expect("a boot configuration carries it");

        let mut long = nb.clone();
        long.append_params = "x".repeat(KERNEL_CMDLINE_MAX);
        let err = deploy_cmdline(
            &config,
            &long,
            &n,
            &[port(&n)],
            &key,
            BootOption::Local,
            BootMode::Bios,
        )
        .expect_err("too long");
        assert!(format!("{err:#}").contains("2048"), "{err:#}");
    }
}
