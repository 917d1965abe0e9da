//! The boot loaders an ISO needs, taken from this Debian system: isolinux for the BIOS entry
//! and a small standalone GRUB EFI binary built with `grub-mkimage` for the UEFI entry. Where
//! they come from, their names in a loaders directory and grub-mkimage's arguments are
//! `vmdeploy_shared::iso::loaders`' (the conductor makes its loaders directory from the same
//! facts); this module reads and runs them.
//!
//! GRUB is built rather than copied: Debian's monolithic `gcdx64.efi` is 3.8 MB (a third of the
//! deploy ISO's 12 MiB budget), while an image with only the modules our configs use
//! ([`iso::GRUB_EFI_MODULES`]) is about 0.6 MB. grub-mkimage writes the same bytes for the same
//! inputs (no timestamps), so the ISO stays reproducible.
//!
//! `vmdeploy-image-build loaders -o DIR` ([`write_dir`]) writes the three binaries as files for
//! the conductor's `[deploy] boot_loaders_dir`, for a conductor on a machine without the loader
//! packages (with them, the conductor makes the directory itself on first need).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};
use vmdeploy_shared::iso::{self, loaders, BootLoaders};
use vmdeploy_shared::partition::local_boot;

pub use vmdeploy_shared::iso::loaders::{
    DEBIAN_GRUB_EFI_MODULES as GRUB_EFI_MODULE_DIR, DEBIAN_ISOLINUX_BIN as ISOLINUX_BIN,
    DEBIAN_LDLINUX_C32 as LDLINUX_C32, GRUB_EFI_FILE, ISOLINUX_BIN_FILE, LDLINUX_C32_FILE,
};

/// Writes `loaders` into `dir` (created when missing), each file written beside its final name
/// and renamed into place, so a conductor reading the directory meanwhile sees old or new
/// files, never a half-written one. Returns the paths written.
pub fn write_dir(loaders: &BootLoaders, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    write_files(
        dir,
        &[
            (ISOLINUX_BIN_FILE, &loaders.isolinux_bin),
            (LDLINUX_C32_FILE, &loaders.ldlinux_c32),
            (GRUB_EFI_FILE, &loaders.grub_efi),
        ],
    )
}

/// Writes Debian's signed shim and CD GRUB into the loaders directory `dir` too, under
/// [`loaders::SHIM_FILE`] and [`loaders::SIGNED_GRUB_EFI_FILE`], for the conductor's Secure
/// Boot ISOs. Returns the paths written.
pub fn write_signed(
    signed: &crate::secure_boot::SignedLoaders,
    dir: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    write_files(
        dir,
        &[
            (loaders::SHIM_FILE, &signed.shim),
            (loaders::SIGNED_GRUB_EFI_FILE, &signed.grub_cd),
        ],
    )
}

fn write_files(dir: &Path, files: &[(&str, &Vec<u8>)]) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    for (name, bytes) in files {
        let path = dir.join(name);
        let mut tmp = tempfile::NamedTempFile::new_in(dir)
            .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
        std::io::Write::write_all(&mut tmp, bytes)
            .with_context(|| format!("writing {}", path.display()))?;
        tmp.as_file()
            .sync_all()
            .with_context(|| format!("syncing {}", path.display()))?;
        tmp.persist(&path)
            .with_context(|| format!("moving {} into place", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// Reads isolinux and ldlinux.c32 and builds the GRUB EFI binary.
pub fn system_loaders() -> anyhow::Result<BootLoaders> {
    let isolinux_bin = read_loader(Path::new(ISOLINUX_BIN), "isolinux")?;
    let ldlinux_c32 = read_loader(Path::new(LDLINUX_C32), "syslinux-common")?;
    let grub_efi = build_grub_efi(Path::new(GRUB_EFI_MODULE_DIR))?;
    Ok(BootLoaders {
        isolinux_bin,
        ldlinux_c32,
        grub_efi,
        shim: None,
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
    mkimage_efi(
        module_dir,
        iso::GRUB_PREFIX,
        iso::GRUB_EARLY_CONFIG,
        iso::GRUB_EFI_MODULES,
    )
}

/// The GRUB the agent installs for a partition image's UEFI local boot
/// (`vmdeploy_shared::partition::local_boot`): `grub-mkimage -O x86_64-efi -p /EFI/BOOT` with
/// [`local_boot::GRUB_EMBEDDED_CONFIG`] and only [`local_boot::GRUB_EFI_MODULES`]. The deploy
/// initramfs carries it at [`local_boot::GRUB_EFI_INITRAMFS_PATH`].
pub fn build_local_boot_grub(module_dir: &Path) -> anyhow::Result<Vec<u8>> {
    mkimage_efi(
        module_dir,
        local_boot::GRUB_EFI_PREFIX,
        local_boot::GRUB_EMBEDDED_CONFIG,
        local_boot::GRUB_EFI_MODULES,
    )
}

/// `grub-mkimage -O x86_64-efi -p PREFIX -c CONFIG MODULES`.
fn mkimage_efi(
    module_dir: &Path,
    prefix: &str,
    config: &str,
    modules: &[&str],
) -> anyhow::Result<Vec<u8>> {
    if !module_dir.join("linux.mod").exists() {
        bail!(
            "GRUB's x86_64 EFI modules are missing from {}: install them with `apt-get install \
             grub-efi-amd64-bin`",
            module_dir.display()
        );
    }
    let scratch = tempfile::tempdir().context("creating a scratch directory for grub-mkimage")?;
    let early = scratch.path().join("early.cfg");
    std::fs::write(&early, config).with_context(|| format!("writing {}", early.display()))?;
    let out: PathBuf = scratch.path().join("bootx64.efi");
    let result = Command::new(loaders::GRUB_MKIMAGE)
        .args(loaders::grub_mkimage_args(
            module_dir, prefix, &early, &out, modules,
        ))
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

    #[test]
    fn the_local_boot_grub_is_small_and_reproducible() {
        let a = build_local_boot_grub(Path::new(GRUB_EFI_MODULE_DIR)).expect("grub-mkimage");
        assert!(a.starts_with(b"MZ"));
        // Without `normal` it stays near 260 KB (~65 KB in the xz ramdisk).
        assert!(a.len() < 300 << 10, "local-boot GRUB is {} bytes", a.len());
        let b = build_local_boot_grub(Path::new(GRUB_EFI_MODULE_DIR)).expect("again");
        assert_eq!(a, b, "grub-mkimage output differs between runs");
        // The embedded config is in the image as text.
        let text = String::from_utf8_lossy(&a);
        assert!(text.contains("load_env -f ${prefix}/grubenv"));
    }

    #[test]
    fn a_loaders_directory_holds_the_three_binaries() {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("new/boot-loaders");
        let loaders = BootLoaders {
            isolinux_bin: vec![1; 4096],
            ldlinux_c32: vec![2; 100],
            grub_efi: b"MZ grub".to_vec(),
            shim: None,
        };
        let written = write_dir(&loaders, &out).expect("writes");
        assert_eq!(written.len(), 3);
        let read = |name: &str| std::fs::read(out.join(name)).expect(name);
        assert_eq!(read(ISOLINUX_BIN_FILE), loaders.isolinux_bin);
        assert_eq!(read(LDLINUX_C32_FILE), loaders.ldlinux_c32);
        assert_eq!(read(GRUB_EFI_FILE), loaders.grub_efi);
        // Written again over the old ones: nothing else is left in the directory.
        write_dir(&loaders, &out).expect("writes again");
        assert_eq!(std::fs::read_dir(&out).expect("dir").count(), 3);
    }
}
