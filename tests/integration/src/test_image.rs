//! The end-to-end test OS (`vmdeploy-image-build test-image`), built once into the repository's
//! `.cache/test-image/` and reused while its inputs stay the same.
//!
//! # Cache
//! Under a file lock ([`ResourceLock`] `test-image-build`), [`ensure`] asks the tool whether
//! `.cache/test-image` holds a complete build of today's inputs (`test-image --check`); if not,
//! it builds into a fresh directory beside it and renames that into place (the old one is
//! renamed away first and deleted), so a concurrent test never sees half an image. Tests that
//! boot or write an image copy it first: the cached files stay as built.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::lock::ResourceLock;

/// The built test OS: absolute paths and the manifest's fields.
#[derive(Debug, Clone)]
pub struct TestImage {
    /// The directory holding the build.
    pub dir: PathBuf,
    /// The whole-disk raw image (GPT, GRUB for BIOS and UEFI).
    pub disk_raw: PathBuf,
    /// The same disk as qcow2.
    pub disk_qcow2: PathBuf,
    /// UUID of the whole disk's root file system.
    pub disk_root_uuid: String,
    /// SHA-256 of `disk_raw`.
    pub disk_sha256: String,
    /// SHA-256 of `disk_qcow2`.
    pub disk_qcow2_sha256: String,
    /// Size of `disk_raw` in bytes.
    pub disk_size: u64,
    /// The partition image (ext4, no boot loader).
    pub part_image: PathBuf,
    /// UUID of the partition image's file system.
    pub part_root_uuid: String,
    /// SHA-256 of `part_image`.
    pub part_sha256: String,
    /// Size of `part_image` in bytes.
    pub part_size: u64,
    /// The kernel (netboot / boot ISO).
    pub kernel: PathBuf,
    /// The test OS ramdisk.
    pub ramdisk: PathBuf,
    /// SHA-256 of `kernel`.
    pub kernel_sha256: String,
    /// SHA-256 of `ramdisk`.
    pub ramdisk_sha256: String,
    /// `VMDEPLOY-TEST-OS booted root=`.
    pub marker_prefix: String,
}

impl TestImage {
    /// The console line the test OS prints once it mounted the root file system `uuid`.
    pub fn marker(&self, uuid: &str) -> String {
        format!("{}{uuid}", self.marker_prefix)
    }
}

/// The cache directory: `<repository>/.cache/test-image`.
pub fn cache_dir() -> PathBuf {
    crate::workspace_root().join(".cache/test-image")
}

/// The test image in [`cache_dir`], built first if needed.
pub fn ensure() -> TestImage {
    let dir = cache_dir();
    let parent = dir.parent().expect("the cache dir has a parent");
    std::fs::create_dir_all(parent)
        .unwrap_or_else(|e| panic!("creating {}: {e}", parent.display()));
    let tool = crate::bin("vmdeploy-image-build");
    let deb = crate::deploy_iso::kernel_deb();
    let _lock = ResourceLock::acquire("test-image-build");
    let current = Command::new(&tool)
        .arg("test-image")
        .arg("--check")
        .arg("--kernel-deb")
        .arg(&deb)
        .arg("--signed-loaders")
        .arg(crate::deploy_iso::signed_loaders())
        .arg("-o")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("starting {}: {e}", tool.display()))
        .status
        .success();
    if !current {
        let fresh = tempfile::Builder::new()
            .prefix("test-image.new-")
            .tempdir_in(parent)
            .unwrap_or_else(|e| panic!("creating a build directory in {}: {e}", parent.display()));
        build(&tool, &deb, fresh.path());
        let fresh = fresh.keep();
        if dir.exists() {
            let old = parent.join(format!("test-image.old-{}", std::process::id()));
            std::fs::rename(&dir, &old)
                .unwrap_or_else(|e| panic!("moving the old {} away: {e}", dir.display()));
            let _ = std::fs::remove_dir_all(&old);
        }
        std::fs::rename(&fresh, &dir)
            .unwrap_or_else(|e| panic!("moving {} to {}: {e}", fresh.display(), dir.display()));
    }
    read(&dir)
}

/// Runs `vmdeploy-image-build test-image -o out` with Debian's signed boot chain (the disk boots
/// under Secure Boot too); returns what it printed. Panics with that output when it fails.
pub fn build(tool: &Path, deb: &Path, out: &Path) -> String {
    let res = Command::new(tool)
        .arg("test-image")
        .arg("--kernel-deb")
        .arg(deb)
        .arg("--signed-loaders")
        .arg(crate::deploy_iso::signed_loaders())
        .arg("-o")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("starting {}: {e}", tool.display()));
    let said = String::from_utf8_lossy(&res.stderr).into_owned();
    assert!(
        res.status.success(),
        "vmdeploy-image-build test-image -o {} failed ({}):\n{said}",
        out.display(),
        res.status
    );
    said
}

/// Reads `dir/manifest.json` into a [`TestImage`].
pub fn read(dir: &Path) -> TestImage {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let m: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
    let s = |v: &serde_json::Value, what: &str| -> String {
        v.as_str()
            .unwrap_or_else(|| panic!("{}: {what} is not a string", path.display()))
            .to_owned()
    };
    let n = |v: &serde_json::Value, what: &str| -> u64 {
        v.as_u64()
            .unwrap_or_else(|| panic!("{}: {what} is not a number", path.display()))
    };
    let file = |v: &serde_json::Value, what: &str| dir.join(s(v, what));
    let (d, p) = (&m["disk"], &m["partition"]);
    TestImage {
        dir: dir.to_owned(),
        disk_raw: file(&d["raw"], "disk.raw"),
        disk_qcow2: file(&d["qcow2"], "disk.qcow2"),
        disk_root_uuid: s(&d["root_uuid"], "disk.root_uuid"),
        disk_sha256: s(&d["sha256"], "disk.sha256"),
        disk_qcow2_sha256: s(&d["qcow2_sha256"], "disk.qcow2_sha256"),
        disk_size: n(&d["size"], "disk.size"),
        part_image: file(&p["image"], "partition.image"),
        part_root_uuid: s(&p["root_uuid"], "partition.root_uuid"),
        part_sha256: s(&p["sha256"], "partition.sha256"),
        part_size: n(&p["size"], "partition.size"),
        kernel: file(&p["kernel"], "partition.kernel"),
        ramdisk: file(&p["ramdisk"], "partition.ramdisk"),
        kernel_sha256: s(&p["kernel_sha256"], "partition.kernel_sha256"),
        ramdisk_sha256: s(&p["ramdisk_sha256"], "partition.ramdisk_sha256"),
        marker_prefix: s(&m["marker_prefix"], "marker_prefix"),
    }
}
