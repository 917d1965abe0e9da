//! The boot root on disk: the master iPXE script, and per node a directory with its kernel,
//! initramfs and configurations, plus the MAC-named links each boot loader finds them by.
//!
//! # Layout (Ironic's, so a site's DHCP settings carry over)
//! ```text
//! <root>/boot.ipxe                         master iPXE script (written at start-up)
//! <root>/<node>/deploy_kernel, deploy_ramdisk   (or kernel, ramdisk for a netboot instance)
//! <root>/<node>/config  grub.cfg  boot.ipxe     PXELINUX, GRUB, iPXE
//! <root>/pxelinux.cfg/01-<mac> -> ../<node>/config
//! <root>/grub.cfg-01-<mac>     -> <node>/grub.cfg
//! <root>/pxelinux.cfg/<mac>    -> ../<node>/boot.ipxe
//! ```
//!
//! # Design
//! Every file is written to a temporary name and renamed into place, so a server booting
//! while its entry changes reads either the old file or the new one. Kernels and initramfs
//! are hard links to the image cache's files where they share a file system (no copy, and an
//! eviction from the cache does not pull a file from under a booting server), else copies.
//! [`BootRoot::remove_node`] removes the directory and every link that points into it, found
//! by reading the links rather than by the node's current ports, so a port deleted or changed
//! since the prepare leaves nothing behind.
//!
//! # Security
//! The deploy command line holds the one-use deploy key, and TFTP and HTTP serve it to anyone
//! on the provisioning network who knows the node's MAC: that is PXE's nature. The key works
//! once and only while the node waits for its call-back, and the files go at the first
//! call-back or failure; the README recommends the virtual-media drivers where the licence
//! allows.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use uuid::Uuid;

use super::config::{self, BootEntry, Mac};
use vmdeploy_shared::error::Chain;

/// The per-node PXELINUX configuration's name in its directory (Ironic's).
const PXELINUX_CONFIG: &str = "config";
/// The per-node GRUB configuration's name.
const GRUB_CONFIG: &str = "grub.cfg";
/// The per-node iPXE script's name.
const IPXE_SCRIPT: &str = "boot.ipxe";
/// The directory of the PXELINUX and iPXE MAC links.
const PXELINUX_DIR: &str = "pxelinux.cfg";

/// A kernel and initramfs to put in a node's directory under these names.
#[derive(Debug, Clone)]
pub struct BootFiles<'a> {
    /// Where the kernel is now (the image cache).
    pub kernel_from: &'a Path,
    /// Its name in the node's directory (`deploy_kernel`, `kernel`).
    pub kernel_name: &'a str,
    /// Where the initramfs is now.
    pub initrd_from: &'a Path,
    /// Its name in the node's directory (`deploy_ramdisk`, `ramdisk`).
    pub initrd_name: &'a str,
}

/// The directory TFTP and HTTP serve.
#[derive(Debug, Clone)]
pub struct BootRoot {
    root: PathBuf,
    http_url: Option<String>,
}

impl BootRoot {
    /// Creates `root` when missing and writes the master iPXE script. `http_url` is the URL
    /// nodes reach `root` at over HTTP (for the iPXE scripts); `None` when no HTTP is served.
    pub fn open(root: PathBuf, http_url: Option<String>) -> anyhow::Result<BootRoot> {
        if !root.is_absolute() {
            bail!("the boot root {} is not an absolute path", root.display());
        }
        std::fs::create_dir_all(root.join(PXELINUX_DIR))
            .with_context(|| format!("creating the boot root {}", root.display()))?;
        let boot_root = BootRoot { root, http_url };
        boot_root.write_file(
            Path::new(config::MASTER_IPXE),
            config::master_ipxe().as_bytes(),
        )?;
        Ok(boot_root)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    fn node_dir(&self, node: Uuid) -> PathBuf {
        self.root.join(node.to_string())
    }

    /// Puts `files` in the node's directory and points every loader's configuration, under
    /// each of `macs`, at an entry booting them with `cmdline`. Files of an earlier entry
    /// that this one does not name are removed (the deploy kernel once the instance's is in).
    pub fn write_node(
        &self,
        node: Uuid,
        macs: &[Mac],
        label: &str,
        files: &BootFiles<'_>,
        cmdline: &str,
    ) -> anyhow::Result<()> {
        if macs.is_empty() {
            bail!("node {node} has no port: a network boot configuration is found by MAC address");
        }
        let dir = self.node_dir(node);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let rel = node.to_string();
        let entry = BootEntry {
            label: label.to_string(),
            kernel: format!("{rel}/{}", files.kernel_name),
            initrd: format!("{rel}/{}", files.initrd_name),
            cmdline: cmdline.to_string(),
        };
        entry.check()?;
        link_or_copy(files.kernel_from, &dir.join(files.kernel_name))?;
        link_or_copy(files.initrd_from, &dir.join(files.initrd_name))?;
        let node_rel = Path::new(&rel);
        self.write_file(
            &node_rel.join(PXELINUX_CONFIG),
            config::pxelinux(&entry).as_bytes(),
        )?;
        self.write_file(&node_rel.join(GRUB_CONFIG), config::grub(&entry).as_bytes())?;
        if let Some(url) = &self.http_url {
            self.write_file(
                &node_rel.join(IPXE_SCRIPT),
                config::ipxe(&entry, url).as_bytes(),
            )?;
        }
        for mac in macs {
            self.link(
                &config::pxelinux_mac_file(mac),
                &format!("../{rel}/{PXELINUX_CONFIG}"),
            )?;
            self.link(&config::grub_mac_file(mac), &format!("{rel}/{GRUB_CONFIG}"))?;
            if self.http_url.is_some() {
                self.link(
                    &config::ipxe_mac_file(mac),
                    &format!("../{rel}/{IPXE_SCRIPT}"),
                )?;
            }
        }
        // What the previous entry booted and this one does not.
        let keep = [
            files.kernel_name,
            files.initrd_name,
            PXELINUX_CONFIG,
            GRUB_CONFIG,
            IPXE_SCRIPT,
        ];
        for dirent in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let dirent = dirent.with_context(|| format!("reading {}", dir.display()))?;
            let name = dirent.file_name();
            if !keep.iter().any(|k| name == std::ffi::OsStr::new(k)) {
                let path = dirent.path();
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing the stale {}", path.display()))?;
            }
        }
        tracing::info!(node = %node, label, macs = macs.len(), dir = %dir.display(), "network boot configuration written");
        Ok(())
    }

    /// Removes the node's directory and every MAC link into it. Never fails: what cannot be
    /// removed is logged (the caller is a clean-up).
    pub fn remove_node(&self, node: Uuid) {
        let rel = node.to_string();
        for (dir, target_prefix) in [
            (self.root.join(PXELINUX_DIR), format!("../{rel}/")),
            (self.root.clone(), format!("{rel}/")),
        ] {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) => {
                    tracing::warn!(node = %node, dir = %dir.display(), error = %Chain(&e), "clean-up: cannot read the boot root");
                    continue;
                }
            };
            for dirent in entries.flatten() {
                let path = dirent.path();
                let Ok(target) = std::fs::read_link(&path) else {
                    continue;
                };
                if target.to_string_lossy().starts_with(&target_prefix) {
                    if let Err(e) = std::fs::remove_file(&path) {
                        tracing::warn!(node = %node, link = %path.display(), error = %Chain(&e), "clean-up: cannot remove a boot link");
                    }
                }
            }
        }
        let dir = self.node_dir(node);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                tracing::info!(node = %node, dir = %dir.display(), "network boot configuration removed")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(node = %node, dir = %dir.display(), error = %Chain(&e), "clean-up: cannot remove the node's boot directory")
            }
        }
    }

    /// Every path under the root that belongs to `node`: its directory's files and the links
    /// into it (for checks and tests).
    pub fn node_paths(&self, node: Uuid) -> Vec<PathBuf> {
        let rel = node.to_string();
        let mut found = Vec::new();
        for (dir, prefix) in [
            (self.root.join(PXELINUX_DIR), format!("../{rel}/")),
            (self.root.clone(), format!("{rel}/")),
        ] {
            for dirent in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if let Ok(target) = std::fs::read_link(dirent.path()) {
                    if target.to_string_lossy().starts_with(&prefix) {
                        found.push(dirent.path());
                    }
                }
            }
        }
        for dirent in std::fs::read_dir(self.node_dir(node))
            .into_iter()
            .flatten()
            .flatten()
        {
            found.push(dirent.path());
        }
        found
    }

    /// Writes `rel` under the root through a temporary file and a rename.
    fn write_file(&self, rel: &Path, data: &[u8]) -> anyhow::Result<()> {
        let path = self.root.join(rel);
        let tmp = path.with_extension("vmdeploy-tmp");
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(data)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().with_context(|| format!("writing {}", path.display()))
    }

    /// Points the link `rel` at `target` (relative), replacing what was there.
    fn link(&self, rel: &str, target: &str) -> anyhow::Result<()> {
        let path = self.root.join(rel);
        let tmp = path.with_extension("vmdeploy-tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .with_context(|| format!("linking {} to {target}", path.display()))
    }
}

/// `to` becomes `from`'s data: a hard link where both are on one file system, else a copy
/// (through a temporary name, so a reader never sees half a kernel).
fn link_or_copy(from: &Path, to: &Path) -> anyhow::Result<()> {
    let tmp = to.with_extension("vmdeploy-tmp");
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(from, &tmp).is_err() {
        std::fs::copy(from, &tmp)
            .with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
    }
    std::fs::rename(&tmp, to).with_context(|| format!("renaming into {}", to.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, BootRoot, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = BootRoot::open(
            dir.path().join("boot"),
            Some("http://10.0.2.102:8080".into()),
        )
        .expect("open");
        let kernel = dir.path().join("k");
        let initrd = dir.path().join("i");
        std::fs::write(&kernel, b"KERNEL").expect("kernel");
        std::fs::write(&initrd, b"INITRD").expect("initrd");
        (dir, root, kernel, initrd)
    }

    fn files<'a>(kernel: &'a Path, initrd: &'a Path, k: &'a str, i: &'a str) -> BootFiles<'a> {
        BootFiles {
            kernel_from: kernel,
            kernel_name: k,
            initrd_from: initrd,
            initrd_name: i,
        }
    }

    #[test]
    fn a_node_is_written_found_by_mac_and_removed_without_a_trace() {
        let (_dir, root, kernel, initrd) = setup();
        let node = Uuid::new_v4();
        let other = Uuid::new_v4();
        let mac = Mac::parse("52:54:00:12:34:56").expect("mac");
        let other_mac = Mac::parse("52:54:00:00:00:01").expect("mac");
        let deploy = files(&kernel, &initrd, "deploy_kernel", "deploy_ramdisk");
        root.write_node(node, &[mac], "deploy", &deploy, "deployment_id=x")
            .expect("write");
        root.write_node(other, &[other_mac], "deploy", &deploy, "deployment_id=y")
            .expect("other");
        let r = root.path();
        let read = |rel: &str| std::fs::read_to_string(r.join(rel)).expect(rel);
        assert!(read("pxelinux.cfg/01-52-54-00-12-34-56")
            .contains(&format!("kernel {node}/deploy_kernel")));
        assert!(
            read("grub.cfg-01-52-54-00-12-34-56").contains(&format!("linux /{node}/deploy_kernel"))
        );
        assert!(read("pxelinux.cfg/52-54-00-12-34-56").contains("http://10.0.2.102:8080/"));
        assert_eq!(
            std::fs::read(r.join(format!("{node}/deploy_kernel"))).expect("k"),
            b"KERNEL"
        );
        assert!(read("boot.ipxe").starts_with("#!ipxe"));
        assert_eq!(
            root.node_paths(node).len(),
            3 + 5,
            "{:?}",
            root.node_paths(node)
        );

        // The instance's entry replaces the deploy's files.
        let inst = files(&kernel, &initrd, "kernel", "ramdisk");
        root.write_node(node, &[mac], "instance", &inst, "root=UUID=abc")
            .expect("instance");
        assert!(!r.join(format!("{node}/deploy_kernel")).exists());
        assert!(read("pxelinux.cfg/01-52-54-00-12-34-56").contains("root=UUID=abc"));

        root.remove_node(node);
        assert!(
            root.node_paths(node).is_empty(),
            "{:?}",
            root.node_paths(node)
        );
        assert!(!r.join("pxelinux.cfg/01-52-54-00-12-34-56").exists());
        assert!(!r.join(node.to_string()).exists());
        // The other node and the master script stay.
        assert_eq!(root.node_paths(other).len(), 8);
        assert!(r.join("boot.ipxe").exists());
        // Removing twice is quiet.
        root.remove_node(node);
    }

    #[test]
    fn no_port_or_a_bad_command_line_writes_nothing() {
        let (_dir, root, kernel, initrd) = setup();
        let node = Uuid::new_v4();
        let f = files(&kernel, &initrd, "deploy_kernel", "deploy_ramdisk");
        let err = root
            .write_node(node, &[], "deploy", &f, "x=1")
            .expect_err("no port");
        assert!(format!("{err:#}").contains("no port"), "{err:#}");
        let mac = Mac::parse("52:54:00:12:34:56").expect("mac");
        let err = root
            .write_node(node, &[mac], "deploy", &f, "a;b")
            .expect_err("bad");
        assert!(format!("{err:#}").contains("command line"), "{err:#}");
        root.remove_node(node);
        assert!(root.node_paths(node).is_empty());
    }
}
