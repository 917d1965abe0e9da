//! Where the boot loaders of our ISOs come from, as facts both ends that make loaders use:
//! `vmdeploy-image-build` (the deploy ISO, `loaders -o DIR`) and the conductor (instance boot
//! ISOs, which makes its loaders directory itself on first need). No file is read here.
//!
//! # The three binaries
//! - `isolinux.bin`, the BIOS El Torito image: Debian's package `isolinux`;
//! - `ldlinux.c32`, the syslinux core module isolinux.bin loads: package `syslinux-common`;
//! - `grubx64.efi`, a standalone GRUB built with `grub-mkimage -O x86_64-efi` from the modules
//!   of package `grub-efi-amd64-bin` (`grub-mkimage` is in `grub-common`), carrying
//!   [`super::GRUB_EARLY_CONFIG`] and only [`super::GRUB_EFI_MODULES`] (about 0.6 MB, against
//!   3.8 MB for Debian's monolithic image). grub-mkimage writes the same bytes for the same
//!   inputs, so everything built from them stays reproducible.
//!
//! A loaders directory holds them under [`ISOLINUX_BIN_FILE`], [`LDLINUX_C32_FILE`] and
//! [`GRUB_EFI_FILE`].
//!
//! # Secure Boot
//! For nodes that boot under UEFI Secure Boot, a loaders directory may also hold Debian's
//! Microsoft-signed shim ([`SHIM_FILE`], package `shim-signed`) and Debian's signed GRUB for CDs
//! ([`SIGNED_GRUB_EFI_FILE`], `gcdx64.efi.signed` of `grub-efi-amd64-signed`), as
//! `vmdeploy-image-build loaders --signed-loaders ROOT` writes them. They are copied, never
//! built: a rebuilt GRUB would lose Debian's signature.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// `isolinux.bin`'s name in a loaders directory.
pub const ISOLINUX_BIN_FILE: &str = "isolinux.bin";
/// `ldlinux.c32`'s name in a loaders directory.
pub const LDLINUX_C32_FILE: &str = "ldlinux.c32";
/// The GRUB EFI binary's name in a loaders directory.
pub const GRUB_EFI_FILE: &str = "grubx64.efi";
/// Every file of a loaders directory.
pub const LOADER_FILES: [&str; 3] = [ISOLINUX_BIN_FILE, LDLINUX_C32_FILE, GRUB_EFI_FILE];
/// Debian's signed shim's name in a loaders directory (Secure Boot ISOs).
pub const SHIM_FILE: &str = "shimx64.efi";
/// Debian's signed CD GRUB's name in a loaders directory (Secure Boot ISOs).
pub const SIGNED_GRUB_EFI_FILE: &str = "gcdx64.efi";
/// The files a loaders directory holds for Secure Boot ISOs, besides [`LOADER_FILES`].
pub const SECURE_BOOT_FILES: [&str; 2] = [SHIM_FILE, SIGNED_GRUB_EFI_FILE];
/// The Debian packages the Secure Boot loaders come from.
pub const SECURE_BOOT_PACKAGES: &str = "shim-signed grub-efi-amd64-signed";

/// Debian's `isolinux.bin` (package `isolinux`).
pub const DEBIAN_ISOLINUX_BIN: &str = "/usr/lib/ISOLINUX/isolinux.bin";
/// Debian's `ldlinux.c32` (package `syslinux-common`).
pub const DEBIAN_LDLINUX_C32: &str = "/usr/lib/syslinux/modules/bios/ldlinux.c32";
/// Debian's GRUB x86_64 EFI modules (package `grub-efi-amd64-bin`).
pub const DEBIAN_GRUB_EFI_MODULES: &str = "/usr/lib/grub/x86_64-efi";

/// The Debian packages the loaders are made from.
pub const LOADER_PACKAGES: &str = "isolinux syslinux-common grub-efi-amd64-bin grub-common";
/// The program that builds the GRUB EFI binary.
pub const GRUB_MKIMAGE: &str = "grub-mkimage";
/// A module every GRUB module directory has: its presence says the directory is there.
const GRUB_PROBE_MODULE: &str = "linux.mod";

/// Where a system keeps what the loaders are made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderSources {
    /// `isolinux.bin` (package `isolinux`).
    pub isolinux_bin: PathBuf,
    /// `ldlinux.c32` (package `syslinux-common`).
    pub ldlinux_c32: PathBuf,
    /// GRUB's x86_64 EFI modules (package `grub-efi-amd64-bin`).
    pub grub_efi_modules: PathBuf,
}

impl Default for LoaderSources {
    /// Debian's (and Ubuntu's) paths.
    fn default() -> Self {
        LoaderSources {
            isolinux_bin: PathBuf::from(DEBIAN_ISOLINUX_BIN),
            ldlinux_c32: PathBuf::from(DEBIAN_LDLINUX_C32),
            grub_efi_modules: PathBuf::from(DEBIAN_GRUB_EFI_MODULES),
        }
    }
}

impl LoaderSources {
    /// The file that shows GRUB's EFI modules are installed.
    pub fn grub_probe_module(&self) -> PathBuf {
        self.grub_efi_modules.join(GRUB_PROBE_MODULE)
    }

    /// Each source file with the Debian package that installs it, in the order they are used.
    pub fn files_and_packages(&self) -> [(PathBuf, &'static str); 3] {
        [
            (self.isolinux_bin.clone(), "isolinux"),
            (self.ldlinux_c32.clone(), "syslinux-common"),
            (self.grub_probe_module(), "grub-efi-amd64-bin"),
        ]
    }
}

/// The arguments of `grub-mkimage` for an x86_64 EFI GRUB from `module_dir` with `prefix`, the
/// embedded config in the file `config` and only `modules`, written to `out`. For the ISOs'
/// GRUB: `prefix` [`super::GRUB_PREFIX`], the config [`super::GRUB_EARLY_CONFIG`], the modules
/// [`super::GRUB_EFI_MODULES`].
pub fn grub_mkimage_args(
    module_dir: &Path,
    prefix: &str,
    config: &Path,
    out: &Path,
    modules: &[&str],
) -> Vec<OsString> {
    let mut args: Vec<OsString> = ["-O", "x86_64-efi", "-p", prefix, "-d"]
        .iter()
        .map(OsString::from)
        .collect();
    args.push(module_dir.into());
    args.push("-c".into());
    args.push(config.into());
    args.push("-o".into());
    args.push(out.into());
    args.extend(modules.iter().map(OsString::from));
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mkimage_arguments_name_the_format_the_inputs_and_the_modules_last() {
        let args = grub_mkimage_args(
            Path::new("/m"),
            "/boot/grub",
            Path::new("/t/early.cfg"),
            Path::new("/t/out.efi"),
            &["iso9660", "linux"],
        );
        let args: Vec<&str> = args.iter().map(|a| a.to_str().expect("utf-8")).collect();
        assert_eq!(
            args,
            [
                "-O",
                "x86_64-efi",
                "-p",
                "/boot/grub",
                "-d",
                "/m",
                "-c",
                "/t/early.cfg",
                "-o",
                "/t/out.efi",
                "iso9660",
                "linux"
            ]
        );
    }

    #[test]
    fn every_source_names_its_package() {
        let sources = LoaderSources::default();
        let packages: Vec<&str> = sources
            .files_and_packages()
            .iter()
            .map(|(_, p)| *p)
            .collect();
        for package in packages {
            assert!(
                LOADER_PACKAGES.split(' ').any(|p| p == package),
                "{package}"
            );
        }
        assert!(sources
            .grub_probe_module()
            .ends_with("x86_64-efi/linux.mod"));
    }
}
