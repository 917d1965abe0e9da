//! The boot loaders an ISO needs, taken from this Debian system: isolinux for the BIOS entry
//! and a small standalone GRUB EFI binary built with `grub-mkimage` for the UEFI entry.
//!
//! GRUB is built rather than copied: Debian's monolithic `gcdx64.efi` is 3.8 MB (a third of the
//! deploy ISO's 12 MiB budget), while an image with only the modules our configs use
//! ([`iso::GRUB_EFI_MODULES`]) is about 0.6 MB. grub-mkimage writes the same bytes for the same
//! inputs (no timestamps), so the ISO stays reproducible.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};
use vmdeploy_shared::iso::{self, BootLoaders};

/// Debian's isolinux boot image (package `isolinux`).
pub const ISOLINUX_BIN: &str = "/usr/lib/ISOLINUX/isolinux.bin";
/// The syslinux core module isolinux.bin loads (package `syslinux-common`).
pub const LDLINUX_C32: &str = "/usr/lib/syslinux/modules/bios/ldlinux.c32";
/// GRUB's x86_64 EFI modules (package `grub-efi-amd64-bin`).
pub const GRUB_EFI_MODULE_DIR: &str = "/usr/lib/grub/x86_64-efi";

/// Reads isolinux and ldlinux.c32 and builds the GRUB EFI binary.
pub fn system_loaders() -> anyhow::Result<BootLoaders> {
    let isolinux_bin = read_loader(Path::new(ISOLINUX_BIN), "isolinux")?;
    let ldlinux_c32 = read_loader(Path::new(LDLINUX_C32), "syslinux-common")?;
    let grub_efi = build_grub_efi(Path::new(GRUB_EFI_MODULE_DIR))?;
    Ok(BootLoaders {
        isolinux_bin,
        ldlinux_c32,
        grub_efi,
    })
}

fn read_loader(path: &Path, package: &str) -> anyhow::Result<Vec<u8>> {
    if !path.exists() {
        bail!(
            "{} is missing: install it with `apt-get install {package}`",
            path.display()
        );
    }
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// `grub-mkimage -O x86_64-efi` with [`iso::GRUB_EARLY_CONFIG`] embedded and only
/// [`iso::GRUB_EFI_MODULES`].
pub fn build_grub_efi(module_dir: &Path) -> anyhow::Result<Vec<u8>> {
    if !module_dir.join("linux.mod").exists() {
        bail!(
            "GRUB's x86_64 EFI modules are missing from {}: install them with `apt-get install \
             grub-efi-amd64-bin`",
            module_dir.display()
        );
    }
    let scratch = tempfile::tempdir().context("creating a scratch directory for grub-mkimage")?;
    let early = scratch.path().join("early.cfg");
    std::fs::write(&early, iso::GRUB_EARLY_CONFIG)
        .with_context(|| format!("writing {}", early.display()))?;
    let out: PathBuf = scratch.path().join("bootx64.efi");
    let result = Command::new("grub-mkimage")
        .args(["-O", "x86_64-efi", "-p", iso::GRUB_PREFIX])
        .arg("-d")
        .arg(module_dir)
        .arg("-c")
        .arg(&early)
        .arg("-o")
        .arg(&out)
        .args(iso::GRUB_EFI_MODULES)
        .output();
    let result = match result {
        Ok(r) => r,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            bail!("grub-mkimage is not installed: install it with `apt-get install grub-common`")
        }
        Err(err) => return Err(err).context("starting grub-mkimage"),
    };
    if !result.status.success() {
        bail!(
            "grub-mkimage failed ({}): {}",
            result.status,
            String::from_utf8_lossy(&result.stderr).trim()
        );
    }
    std::fs::read(&out).with_context(|| format!("reading {}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_files_name_the_package() {
        let err =
            read_loader(Path::new("/nonexistent/isolinux.bin"), "isolinux").expect_err("missing");
        assert!(
            err.to_string().contains("apt-get install isolinux"),
            "{err}"
        );
        let err = build_grub_efi(Path::new("/nonexistent")).expect_err("missing");
        assert!(
            err.to_string()
                .contains("apt-get install grub-efi-amd64-bin"),
            "{err}"
        );
    }

    /// The real tools of this machine (scripts/setup installs them): a PE binary, small, and the
    /// same bytes twice.
    #[test]
    fn system_loaders_are_small_and_reproducible() {
        let a = system_loaders().expect("the loaders of this system");
        assert!(a.grub_efi.starts_with(b"MZ"));
        assert!(
            a.grub_efi.len() < 1 << 20,
            "GRUB EFI is {} bytes",
            a.grub_efi.len()
        );
        let b = build_grub_efi(Path::new(GRUB_EFI_MODULE_DIR)).expect("again");
        assert_eq!(a.grub_efi, b, "grub-mkimage output differs between runs");
        assert!(a.isolinux_bin.len() > 2048 && !a.ldlinux_c32.is_empty());
    }
}
