//! Debian's signed boot chain, for media that boot under UEFI Secure Boot.
//!
//! # The chain
//! ```text
//! firmware db: Microsoft UEFI CA 2011 ──verifies── shimx64.efi.signed   (package shim-signed)
//! shim's built-in Debian key ─────────verifies── gcdx64.efi.signed /    (grub-efi-amd64-signed)
//!                                                grubx64.efi.signed
//!                                     ─verifies── vmlinuz-<release>      (linux-image-<release>)
//! the kernel's built-in key ──────────verifies── each module's appended signature, enforced
//!                                                under Secure Boot (lockdown)
//! ```
//! So a Secure Boot build takes shim and GRUB from Debian's packages unchanged, refuses a kernel
//! without an Authenticode signature (the `-unsigned` package), and keeps the modules exactly as
//! the package ships them: `objcopy` would drop their signatures ([`crate::module_strip`]).
//!
//! The loaders are read from a root holding the packages' files at their installed paths: `/`
//! when `shim-signed` and `grub-efi-amd64-signed` are installed, or the tree `scripts/setup`
//! unpacks them into (`.cache/secure-boot/root`) without installing them: their maintainer
//! scripts would run `grub-install` on a machine booted through UEFI.

use std::path::Path;

use anyhow::{bail, Context as _};
use vmdeploy_shared::pe::certificate_table_len;

/// shim, signed by Microsoft, relative to the root.
pub const SHIM: &str = "usr/lib/shim/shimx64.efi.signed";
/// GRUB for CDs (prefix `/boot/grub` on the device it was loaded from), signed by Debian.
pub const GRUB_CD: &str = "usr/lib/grub/x86_64-efi-signed/gcdx64.efi.signed";
/// GRUB for disks (prefix `/EFI/debian`, then `grub.cfg` beside itself), signed by Debian.
pub const GRUB_DISK: &str = "usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed";
/// The Debian packages the loaders come from.
pub const PACKAGES: &str = "shim-signed grub-efi-amd64-signed";

/// What the kernel appends to a signed module (include/linux/module_signature.h).
pub const MODULE_SIGNATURE_MAGIC: &[u8] = b"~Module signature appended~\n";

/// The signed loaders, read whole.
#[derive(Debug, Clone)]
pub struct SignedLoaders {
    /// `shimx64.efi.signed`.
    pub shim: Vec<u8>,
    /// `gcdx64.efi.signed`, for ISOs.
    pub grub_cd: Vec<u8>,
    /// `grubx64.efi.signed`, for a disk's EFI system partition.
    pub grub_disk: Vec<u8>,
}

impl SignedLoaders {
    /// [`Self::read`] when a root was given (`--signed-loaders`), `None` otherwise.
    pub fn read_if_given(root: Option<&Path>) -> anyhow::Result<Option<Self>> {
        root.map(Self::read)
            .transpose()
            .context("reading the signed loaders for Secure Boot")
    }

    /// Reads the three loaders under `root`; each must be a PE image with a signature.
    pub fn read(root: &Path) -> anyhow::Result<Self> {
        let read = |rel: &str| -> anyhow::Result<Vec<u8>> {
            let path = root.join(rel);
            let bytes = std::fs::read(&path).with_context(|| {
                format!(
                    "reading {} (Debian's {PACKAGES}: install them, or run scripts/setup, which \
                     unpacks them into .cache/secure-boot/root)",
                    path.display()
                )
            })?;
            require_signed(&path.display().to_string(), &bytes)?;
            Ok(bytes)
        };
        Ok(SignedLoaders {
            shim: read(SHIM)?,
            grub_cd: read(GRUB_CD)?,
            grub_disk: read(GRUB_DISK)?,
        })
    }
}

/// Refuses `bytes` (named `what`) unless it is a PE image carrying a signature.
pub fn require_signed(what: &str, bytes: &[u8]) -> anyhow::Result<()> {
    match certificate_table_len(bytes) {
        None => bail!("{what} is not a PE image: it cannot be a signed EFI binary"),
        Some(0) => bail!(
            "{what} carries no Authenticode signature: under Secure Boot the firmware or shim \
             would refuse it (for the kernel, use Debian's signed linux-image package, not the \
             -unsigned one)"
        ),
        Some(_) => Ok(()),
    }
}

/// Refuses the kernel at `path` unless it carries a signature.
pub fn require_signed_kernel(path: &Path) -> anyhow::Result<()> {
    let kernel = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    require_signed(&format!("the kernel {}", path.display()), &kernel)
}

/// Whether a module file ends with the kernel's appended-signature marker.
pub fn module_is_signed(module: &[u8]) -> bool {
    module.ends_with(MODULE_SIGNATURE_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdeploy_shared::pe::test_support::pe;

    #[test]
    fn only_a_signed_pe_image_passes() {
        assert!(require_signed("k", &pe((0x400, 0x100), 0x500)).is_ok());
        let err = require_signed("the kernel", &pe((0, 0), 0x500)).expect_err("unsigned");
        assert!(
            err.to_string().contains("no Authenticode signature"),
            "{err}"
        );
        let err = require_signed("x", b"not a PE").expect_err("not PE");
        assert!(err.to_string().contains("not a PE image"), "{err}");
    }

    #[test]
    fn module_signature_marker() {
        assert!(module_is_signed(b"\x7fELF...~Module signature appended~\n"));
        assert!(!module_is_signed(b"\x7fELF..."));
    }

    #[test]
    fn the_agent_looks_for_the_loaders_where_we_put_them() {
        // The test image's partition root carries them at these paths, and the agent's
        // install_bootloader takes the first chain of SIGNED_CHAINS it finds.
        let first = vmdeploy_shared::partition::local_boot::SIGNED_CHAINS[0];
        assert_eq!(first.shim, format!("/{SHIM}"));
        assert_eq!(first.grub, format!("/{GRUB_DISK}"));
    }

    #[test]
    fn a_missing_loader_names_the_packages() {
        let err = SignedLoaders::read(Path::new("/nonexistent")).expect_err("missing");
        let text = format!("{err:#}");
        assert!(text.contains("shim-signed grub-efi-amd64-signed"), "{text}");
        assert!(text.contains("scripts/setup"), "{text}");
    }
}
