//! What the firmware told the kernel at boot that the agent acts on: whether UEFI Secure Boot
//! is on. `image.install_bootloader` installs the image's own signed boot chain when it is, and
//! the agent says at start which it saw.
//!
//! # Where it is read
//! x86's EFI stub records Secure Boot's state in the boot parameters it hands the kernel
//! (`struct boot_params`, byte 0x1ec `secure_boot`: 0 unset, 1 unknown, 2 disabled, 3
//! enabled; the kernel's `enum efi_secureboot_mode`), and the kernel shows that block as it
//! got it at `/sys/kernel/boot_params/data`. The kernel's own "secureboot: Secure boot enabled"
//! line comes from the same byte. Nothing needs mounting (no efivarfs) and nothing is written.

use std::fmt;
use std::path::Path;

/// The kernel's copy of the boot parameters (x86).
pub const BOOT_PARAMS: &str = "/sys/kernel/boot_params/data";

/// `struct boot_params`'s `secure_boot` byte.
const SECURE_BOOT_OFFSET: usize = 0x1ec;

/// UEFI Secure Boot as the firmware reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecureBoot {
    /// On: the firmware runs only signed loaders.
    Enabled,
    /// Off, or a UEFI firmware without it.
    Disabled,
    /// Not reported: a BIOS boot, a loader that bypassed the EFI stub, or no boot parameters.
    Unknown,
}

impl SecureBoot {
    /// The state in a copy of `struct boot_params`.
    pub fn from_boot_params(params: &[u8]) -> SecureBoot {
        match params.get(SECURE_BOOT_OFFSET) {
            Some(3) => SecureBoot::Enabled,
            Some(2) => SecureBoot::Disabled,
            _ => SecureBoot::Unknown,
        }
    }

    /// The state in the boot parameters at `path`; [`SecureBoot::Unknown`] when they cannot be
    /// read.
    pub fn read(path: &Path) -> SecureBoot {
        match std::fs::read(path) {
            Ok(params) => SecureBoot::from_boot_params(&params),
            Err(e) => {
                tracing::debug!(path = %path.display(), "boot parameters not readable: {e}");
                SecureBoot::Unknown
            }
        }
    }

    /// The running kernel's ([`BOOT_PARAMS`]).
    pub fn of_this_boot() -> SecureBoot {
        SecureBoot::read(Path::new(BOOT_PARAMS))
    }
}

impl fmt::Display for SecureBoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SecureBoot::Enabled => "enabled",
            SecureBoot::Disabled => "disabled",
            SecureBoot::Unknown => "not reported (BIOS boot, or no EFI stub)",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secure_boot_byte_of_the_boot_parameters() {
        let mut params = vec![0u8; 4096];
        assert_eq!(SecureBoot::from_boot_params(&params), SecureBoot::Unknown);
        params[0x1ec] = 3;
        assert_eq!(SecureBoot::from_boot_params(&params), SecureBoot::Enabled);
        params[0x1ec] = 2;
        assert_eq!(SecureBoot::from_boot_params(&params), SecureBoot::Disabled);
        params[0x1ec] = 1;
        assert_eq!(SecureBoot::from_boot_params(&params), SecureBoot::Unknown);
        assert_eq!(
            SecureBoot::from_boot_params(&params[..0x1ec]),
            SecureBoot::Unknown
        );
        assert_eq!(
            SecureBoot::read(Path::new("/nonexistent/boot_params")),
            SecureBoot::Unknown
        );
    }
}
