//! The boot loaders directory (`deploy.boot_loaders_dir`) built ISOs take isolinux and GRUB
//! from, made by the conductor itself on first need when this system has the loader packages,
//! so the default configuration of a new install can build boot ISOs.
//!
//! # Design
//! - Where the loaders come from, their names in the directory and grub-mkimage's arguments are
//!   `vmdeploy_shared::iso::loaders`' facts, which `vmdeploy-image-build loaders -o DIR` uses
//!   too: the two cannot make different directories. The file work (two copies, one
//!   grub-mkimage run) is here, not in `shared`, which reads no file and runs no program.
//! - [`LoadersDir::check`] is what `validate` asks: a complete directory, or what to make one
//!   from. It only looks at paths, so it is cheap enough for every validation.
//! - [`LoadersDir::load`] (blocking, run on the ISO build's thread) makes a missing or partial
//!   directory once, under a lock, each file written beside its name and renamed into place,
//!   so a reader never sees half a file; then reads it.
//! - A directory an operator filled is used as it is: the conductor never rewrites a complete
//!   one, so upgrading the loaders stays the operator's `vmdeploy-image-build loaders`.
//! - Secure Boot ISOs ([`LoadersDir::load_secure_boot`]) take Debian's signed shim and CD GRUB
//!   from the same directory, where only `vmdeploy-image-build loaders --signed-loaders ROOT`
//!   puts them: the conductor never makes those itself (a built GRUB would be unsigned), and
//!   [`LoadersDir::check_secure_boot`] says so at `validate`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use anyhow::{bail, Context as _};
use vmdeploy_shared::iso::loaders::{
    self, LoaderSources, GRUB_EFI_FILE, ISOLINUX_BIN_FILE, LDLINUX_C32_FILE, LOADER_FILES,
    LOADER_PACKAGES, SECURE_BOOT_FILES, SECURE_BOOT_PACKAGES, SHIM_FILE, SIGNED_GRUB_EFI_FILE,
};
use vmdeploy_shared::iso::{self, BootLoaders};

/// What makes the loaders directory on another machine, for error messages.
pub const LOADERS_COMMAND: &str = "vmdeploy-image-build loaders -o";

/// The loaders directory of a boot ISO store, and where to make it from.
#[derive(Debug)]
pub struct LoadersDir {
    dir: PathBuf,
    sources: LoaderSources,
    /// Held while the directory is made: two first builds make it once.
    making: Mutex<()>,
}

impl LoadersDir {
    /// The directory `dir`, made from `sources` when it is missing.
    pub fn new(dir: PathBuf, sources: LoaderSources) -> LoadersDir {
        LoadersDir {
            dir,
            sources,
            making: Mutex::new(()),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the directory holds every loader.
    fn is_complete(&self) -> bool {
        LOADER_FILES
            .iter()
            .all(|name| self.dir.join(name).is_file())
    }

    /// Ok when a boot ISO can get its loaders: the directory is complete, or this system has
    /// what the conductor makes it from. Otherwise the error says what is missing and the two
    /// ways to fix it (the packages here, or the directory written on another machine).
    pub fn check(&self) -> anyhow::Result<()> {
        if self.is_complete() {
            return Ok(());
        }
        let mut missing: Vec<String> = self
            .sources
            .files_and_packages()
            .into_iter()
            .filter(|(path, _)| !path.is_file())
            .map(|(path, package)| format!("{} ({package})", path.display()))
            .collect();
        if !on_path(loaders::GRUB_MKIMAGE) {
            missing.push(format!("{} (grub-common)", loaders::GRUB_MKIMAGE));
        }
        if missing.is_empty() {
            return Ok(());
        }
        bail!(
            "the boot loaders directory {dir} (deploy.boot_loaders_dir) is missing or \
             incomplete, and this system lacks what the conductor makes it from: {}; install \
             them with `apt-get install {LOADER_PACKAGES}` (the conductor then makes the \
             directory on the first build), or write the directory with `{LOADERS_COMMAND} \
             {dir}` on a machine that has them",
            missing.join(", "),
            dir = self.dir.display(),
        )
    }

    /// Ok when a Secure Boot ISO can get its loaders: [`LoadersDir::check`], and Debian's signed
    /// shim and CD GRUB are in the directory. The error names the missing files and the
    /// command that writes them.
    pub fn check_secure_boot(&self) -> anyhow::Result<()> {
        self.check()?;
        self.require_signed_files()
    }

    /// Ok when Debian's signed shim and CD GRUB are in the directory; the error names the
    /// missing ones and the command that writes them.
    fn require_signed_files(&self) -> anyhow::Result<()> {
        let missing: Vec<&str> = SECURE_BOOT_FILES
            .into_iter()
            .filter(|name| !self.dir.join(name).is_file())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        bail!(
            "the node boots under UEFI Secure Boot (capabilities secure_boot:true), and the boot \
             loaders directory {dir} (deploy.boot_loaders_dir) lacks Debian's signed loaders {}: \
             write them with `vmdeploy-image-build loaders --signed-loaders ROOT -o {dir}`, ROOT \
             holding the packages {SECURE_BOOT_PACKAGES} at their installed paths (/ where they \
             are installed)",
            missing.join(", "),
            dir = self.dir.display(),
        )
    }

    /// The loaders of a Secure Boot ISO (blocking): [`LoadersDir::load`]'s, with Debian's signed
    /// CD GRUB in place of ours and the signed shim in front of it.
    pub fn load_secure_boot(&self) -> anyhow::Result<BootLoaders> {
        let mut loaders = self.load()?;
        self.require_signed_files()?;
        let read = |name: &str| -> anyhow::Result<Vec<u8>> {
            let path = self.dir.join(name);
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            if !bytes.starts_with(b"MZ") {
                bail!(
                    "{} is not an EFI (PE) image: write it again with `vmdeploy-image-build \
                     loaders --signed-loaders ROOT -o {}`",
                    path.display(),
                    self.dir.display()
                );
            }
            Ok(bytes)
        };
        loaders.grub_efi = read(SIGNED_GRUB_EFI_FILE)?;
        loaders.shim = Some(read(SHIM_FILE)?);
        Ok(loaders)
    }

    /// The loaders, the directory made first when it is missing or partial (blocking).
    pub fn load(&self) -> anyhow::Result<BootLoaders> {
        if !self.is_complete() {
            let _making = self.making.lock().unwrap_or_else(|e| e.into_inner());
            // Another build may have made it while this one waited.
            if !self.is_complete() {
                self.check()?;
                self.make().with_context(|| {
                    format!(
                        "making the boot loaders directory {} from this system's packages",
                        self.dir.display()
                    )
                })?;
            }
        }
        read_loaders(&self.dir)
    }

    /// Writes the three loaders from the system into the directory.
    fn make(&self) -> anyhow::Result<()> {
        let read = |path: &Path| {
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))
        };
        let isolinux_bin = read(&self.sources.isolinux_bin)?;
        let ldlinux_c32 = read(&self.sources.ldlinux_c32)?;
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let grub_efi = self.build_grub_efi()?;
        for (name, bytes) in [
            (ISOLINUX_BIN_FILE, &isolinux_bin),
            (LDLINUX_C32_FILE, &ldlinux_c32),
            (GRUB_EFI_FILE, &grub_efi),
        ] {
            write_into_place(&self.dir.join(name), bytes)?;
        }
        tracing::info!(
            dir = %self.dir.display(),
            grub_efi_bytes = grub_efi.len(),
            "made the boot loaders directory from this system's packages"
        );
        Ok(())
    }

    /// `grub-mkimage` of the ISOs' GRUB, in a scratch directory beside the loaders.
    fn build_grub_efi(&self) -> anyhow::Result<Vec<u8>> {
        let scratch = tempfile::Builder::new()
            .prefix(".grub-mkimage")
            .tempdir_in(&self.dir)
            .with_context(|| format!("a scratch directory in {}", self.dir.display()))?;
        let early = scratch.path().join("early.cfg");
        std::fs::write(&early, iso::GRUB_EARLY_CONFIG)
            .with_context(|| format!("writing {}", early.display()))?;
        let out = scratch.path().join(GRUB_EFI_FILE);
        let result = Command::new(loaders::GRUB_MKIMAGE)
            .args(loaders::grub_mkimage_args(
                &self.sources.grub_efi_modules,
                iso::GRUB_PREFIX,
                &early,
                &out,
                iso::GRUB_EFI_MODULES,
            ))
            .output()
            .with_context(|| format!("starting {}", loaders::GRUB_MKIMAGE))?;
        if !result.status.success() {
            bail!(
                "{} failed ({}): {}",
                loaders::GRUB_MKIMAGE,
                result.status,
                String::from_utf8_lossy(&result.stderr).trim()
            );
        }
        std::fs::read(&out).with_context(|| format!("reading {}", out.display()))
    }
}

/// Writes `bytes` beside `path` and renames the file into place.
fn write_into_place(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, bytes)
        .with_context(|| format!("writing {}", path.display()))?;
    tmp.as_file()
        .sync_all()
        .with_context(|| format!("syncing {}", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("moving {} into place", path.display()))?;
    Ok(())
}

/// Whether `program` is an executable file in a directory of `PATH`.
fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Reads a complete loaders directory; a missing directory or file names the command that
/// writes it.
pub fn read_loaders(dir: &Path) -> anyhow::Result<BootLoaders> {
    if !dir.is_dir() {
        bail!(
            "the boot loaders directory {} is missing (deploy.boot_loaders_dir): a boot ISO \
             cannot be built without it; make it with `{LOADERS_COMMAND} {}`",
            dir.display(),
            dir.display()
        );
    }
    let read = |name: &str| -> anyhow::Result<Vec<u8>> {
        let path = dir.join(name);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
                "{} is missing from the boot loaders directory: write it with \
                 `{LOADERS_COMMAND} {}`",
                path.display(),
                dir.display()
            ),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    };
    Ok(BootLoaders {
        isolinux_bin: read(ISOLINUX_BIN_FILE)?,
        ldlinux_c32: read(LDLINUX_C32_FILE)?,
        grub_efi: read(GRUB_EFI_FILE)?,
        shim: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nowhere() -> LoaderSources {
        LoaderSources {
            isolinux_bin: "/nonexistent/isolinux.bin".into(),
            ldlinux_c32: "/nonexistent/ldlinux.c32".into(),
            grub_efi_modules: "/nonexistent/x86_64-efi".into(),
        }
    }

    #[test]
    fn without_the_packages_the_check_names_them_and_the_command() {
        let dir = tempfile::tempdir().expect("temp dir");
        let loaders = LoadersDir::new(dir.path().join("boot-loaders"), nowhere());
        let err = format!(
            "{:#}",
            loaders.check().expect_err("nothing to make it from")
        );
        assert!(
            err.contains("/nonexistent/isolinux.bin (isolinux)"),
            "{err}"
        );
        assert!(
            err.contains(&format!("apt-get install {LOADER_PACKAGES}")),
            "{err}"
        );
        assert!(
            err.contains(&format!(
                "{LOADERS_COMMAND} {}",
                dir.path().join("boot-loaders").display()
            )),
            "{err}"
        );
        let err = format!("{:#}", loaders.load().expect_err("not made"));
        assert!(err.contains("apt-get install"), "{err}");
        assert!(!dir.path().join("boot-loaders").exists(), "nothing made");
    }

    /// This machine's packages (scripts/setup installs them): the directory is made once, as
    /// `vmdeploy-image-build loaders` makes it, and a complete one is left alone.
    #[test]
    fn a_missing_directory_is_made_from_the_system_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("state/boot-loaders");
        let loaders = LoadersDir::new(path.clone(), LoaderSources::default());
        loaders
            .check()
            .expect("this system has the loader packages (fix: bash scripts/setup)");
        let made = loaders.load().expect("made from the system");
        assert!(made.grub_efi.starts_with(b"MZ"));
        assert!(made.isolinux_bin.len() > 2048 && !made.ldlinux_c32.is_empty());
        let mut names: Vec<String> = std::fs::read_dir(&path)
            .expect("made")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["grubx64.efi", "isolinux.bin", "ldlinux.c32"]);
        // An operator's directory is used as it is.
        std::fs::write(path.join(GRUB_EFI_FILE), b"MZ operator's").expect("replace");
        let again = loaders.load().expect("read");
        assert_eq!(again.grub_efi, b"MZ operator's");
    }
}
