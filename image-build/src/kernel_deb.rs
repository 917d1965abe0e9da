//! A Debian kernel package (`linux-image-<release>_*.deb`), unpacked for one build.
//!
//! # Why the tools
//! The .deb is an `ar` archive around a `data.tar.xz`; `dpkg-deb -x` unpacks it the way dpkg
//! would. The package ships no `modules.dep` (its postinst runs depmod), so `depmod -b ROOT
//! RELEASE` writes one; [`crate::kmod`] then derives the load order from it
//! (docs/qemu-and-boot.md §2, §9 item 3). Both tools are asked for by name with a
//! one-line fix when they are missing.
//!
//! # Layout used
//! ```text
//! boot/vmlinuz-<release>          the kernel (bzImage)
//! lib/modules/<release>/          the modules, modules.dep after depmod
//! ```
//! The tree lives in a temporary directory that goes away with [`KernelPackage`].

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// An unpacked kernel package; the files are deleted when it is dropped.
#[derive(Debug)]
pub struct KernelPackage {
    // Held for its Drop: the unpacked tree is removed with it.
    _dir: tempfile::TempDir,
    /// The kernel release, e.g. `6.1.0-57-amd64`.
    pub release: String,
    /// `boot/vmlinuz-<release>`.
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>`, with a `modules.dep`.
    pub modules_dir: PathBuf,
}

impl KernelPackage {
    /// Unpacks `deb` with `dpkg-deb -x` into a temporary directory and runs `depmod -b` on it.
    pub fn unpack(deb: &Path) -> anyhow::Result<KernelPackage> {
        anyhow::ensure!(
            deb.is_file(),
            "the kernel package {} does not exist (scripts/setup downloads one into .cache/kernel)",
            deb.display()
        );
        let dir = tempfile::Builder::new()
            .prefix("vmdeploy-kernel-")
            .tempdir()
            .context("creating a scratch directory for the kernel package")?;
        let root = dir.path();
        crate::tool::run(
            Command::new("dpkg-deb").arg("-x").arg(deb).arg(root),
            "apt-get install dpkg",
        )
        .with_context(|| format!("unpacking {}", deb.display()))?;
        let release = only_release(&root.join("lib/modules"))
            .with_context(|| format!("{} is no linux-image package", deb.display()))?;
        let vmlinuz = root.join("boot").join(format!("vmlinuz-{release}"));
        anyhow::ensure!(
            vmlinuz.is_file(),
            "{} holds no boot/vmlinuz-{release}",
            deb.display()
        );
        crate::tool::run(
            Command::new("depmod").arg("-b").arg(root).arg(&release),
            "apt-get install kmod",
        )
        .with_context(|| format!("indexing the modules of {release}"))?;
        let modules_dir = root.join("lib/modules").join(&release);
        Ok(KernelPackage {
            _dir: dir,
            release,
            vmlinuz,
            modules_dir,
        })
    }
}

/// The single release directory under `lib/modules`.
fn only_release(modules: &Path) -> anyhow::Result<String> {
    let mut releases = Vec::new();
    for entry in
        std::fs::read_dir(modules).with_context(|| format!("listing {}", modules.display()))?
    {
        let entry = entry.with_context(|| format!("listing {}", modules.display()))?;
        if entry.path().is_dir() {
            releases.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    match releases.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("no kernel release under {}", modules.display()),
        many => bail!(
            "more than one kernel release under {}: {}",
            modules.display(),
            many.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_package_and_a_missing_tool_say_what_to_do() {
        let err = KernelPackage::unpack(Path::new("/nonexistent/linux-image.deb"))
            .expect_err("no such file");
        assert!(format!("{err:#}").contains("scripts/setup"), "{err:#}");
    }

    #[test]
    fn a_file_that_is_no_package_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let deb = dir.path().join("bad.deb");
        std::fs::write(&deb, b"not an ar archive").expect("write");
        let err = KernelPackage::unpack(&deb).expect_err("garbage");
        assert!(format!("{err:#}").contains("unpacking"), "{err:#}");
    }

    #[test]
    fn release_directory_must_be_unique() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(only_release(dir.path()).is_err());
        std::fs::create_dir(dir.path().join("6.1.0-1")).expect("dir");
        assert_eq!(only_release(dir.path()).expect("one"), "6.1.0-1");
        std::fs::create_dir(dir.path().join("6.1.0-2")).expect("dir");
        assert!(format!("{:#}", only_release(dir.path()).expect_err("two")).contains("more than"));
    }
}
