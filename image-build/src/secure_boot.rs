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

/// The size of a PE image's attribute certificate table (its Authenticode signatures), `Some(0)`
/// for an unsigned image, `None` when `pe` is not a PE32 or PE32+ image. Never panics.
pub fn certificate_table_len(pe: &[u8]) -> Option<u32> {
    let u16_at = |at: usize| -> Option<u16> {
        Some(u16::from_le_bytes(
            pe.get(at..at.checked_add(2)?)?.try_into().ok()?,
        ))
    };
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            pe.get(at..at.checked_add(4)?)?.try_into().ok()?,
        ))
    };
    if pe.get(..2) != Some(b"MZ".as_slice()) {
        return None;
    }
    let header = usize::try_from(u32_at(0x3c)?).ok()?;
    if pe.get(header..header.checked_add(4)?) != Some(b"PE\0\0".as_slice()) {
        return None;
    }
    // The optional header follows the 4-byte signature and the 20-byte COFF header; its data
    // directories start at 96 (PE32) or 112 (PE32+), the certificate table is entry 4.
    let optional = header.checked_add(24)?;
    let directories = match u16_at(optional)? {
        0x10b => optional.checked_add(96)?,
        0x20b => optional.checked_add(112)?,
        _ => return None,
    };
    let count = u32_at(directories.checked_sub(4)?)?;
    if count <= 4 {
        return Some(0);
    }
    let entry = directories.checked_add(4 * 8)?;
    let (offset, len) = (u32_at(entry)?, u32_at(entry.checked_add(4)?)?);
    let end = usize::try_from(offset)
        .ok()?
        .checked_add(usize::try_from(len).ok()?)?;
    if offset == 0 || len == 0 || end > pe.len() {
        return Some(0);
    }
    Some(len)
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
    use proptest::prelude::*;

    /// A minimal PE32+ image: MZ, the header at 0x80, 16 data directories, the certificate
    /// table at `cert` (offset, len).
    fn pe(cert: (u32, u32), len: usize) -> Vec<u8> {
        let mut d = vec![0u8; len];
        d[..2].copy_from_slice(b"MZ");
        d[0x3c..0x40].copy_from_slice(&0x80u32.to_le_bytes());
        d[0x80..0x84].copy_from_slice(b"PE\0\0");
        let optional = 0x80 + 24;
        d[optional..optional + 2].copy_from_slice(&0x20bu16.to_le_bytes());
        let dirs = optional + 112;
        d[dirs - 4..dirs].copy_from_slice(&16u32.to_le_bytes());
        d[dirs + 32..dirs + 36].copy_from_slice(&cert.0.to_le_bytes());
        d[dirs + 36..dirs + 40].copy_from_slice(&cert.1.to_le_bytes());
        d
    }

    #[test]
    fn signed_unsigned_and_not_pe() {
        assert_eq!(
            certificate_table_len(&pe((0x400, 0x100), 0x500)),
            Some(0x100)
        );
        assert_eq!(certificate_table_len(&pe((0, 0), 0x500)), Some(0));
        // A table that runs past the end is no signature.
        assert_eq!(certificate_table_len(&pe((0x400, 0x200), 0x500)), Some(0));
        assert_eq!(certificate_table_len(b"ELF"), None);
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
    fn a_missing_loader_names_the_packages() {
        let err = SignedLoaders::read(Path::new("/nonexistent")).expect_err("missing");
        let text = format!("{err:#}");
        assert!(text.contains("shim-signed grub-efi-amd64-signed"), "{text}");
        assert!(text.contains("scripts/setup"), "{text}");
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600), at in 0usize..600) {
            let _ = certificate_table_len(&bytes);
            let mut b = pe((at as u32, 0x10), 0x300);
            let n = bytes.len().min(b.len());
            b[..n.min(at)].copy_from_slice(&bytes[..n.min(at)]);
            let _ = certificate_table_len(&b);
        }
    }
}
