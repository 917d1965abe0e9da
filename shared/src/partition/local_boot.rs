//! Local boot of a partition image under UEFI: the contract between the GRUB EFI binary
//! image-build puts in the deploy initramfs and the agent's `image.install_bootloader`, which
//! copies it into the EFI system partition and writes what it reads.
//!
//! # Design
//! The binary goes to the firmware's removable-media path, `\EFI\BOOT\BOOTX64.EFI`, so no NVRAM
//! boot entry is needed. It is built (`grub-mkimage -O x86_64-efi -p /EFI/BOOT`) with
//! [`GRUB_EMBEDDED_CONFIG`] and only [`GRUB_EFI_MODULES`]: no `normal` module, whose weight
//! (~80 KB compressed, with `configfile`) the deploy ISO's 12 MiB budget does not have room
//! for. Without `normal`, GRUB runs the embedded config with its small built-in parser (no
//! `if`, no `configfile`), so the per-deploy value, the root file system's UUID, reaches it as
//! a variable in a GRUB environment block, `\EFI\BOOT\grubenv` ([`grubenv`]), read with
//! `load_env`. The agent also writes `\EFI\BOOT\grub.cfg` ([`grub_cfg`]) with the same steps
//! spelled out, for a full GRUB put in place of ours and for a person reading the ESP; our
//! binary does not read it.
//!
//! The instance boots `/boot/vmlinuz` with `/boot/initrd.img` from the root file system, with
//! `root=UUID=<root uuid> console=ttyS0,115200`.
//!
//! # Under UEFI Secure Boot
//! Our GRUB is unsigned, and the firmware would refuse it. When the firmware booted the deploy
//! ramdisk with Secure Boot on, the agent installs the partition image's own signed chain
//! instead, as IPA runs the image's own `grub-install`: the distribution's shim (signed by
//! Microsoft, so the firmware runs it) and its signed GRUB (signed with the key shim carries,
//! which also signed the image's kernel), read from the root file system just written at the
//! paths the distribution's packages install them ([`SIGNED_CHAINS`]). Shim goes to
//! `\EFI\BOOT\BOOTX64.EFI` and loads [`ESP_SIGNED_GRUB_FILE`] from its own directory. A
//! signed GRUB cannot carry our configuration (its signature covers what is embedded), so
//! [`grub_cfg`] goes where that GRUB looks: its built-in prefix ([`grub_prefix`], e.g.
//! `/EFI/debian`), and `\EFI\BOOT\grub.cfg`, which Debian's and Ubuntu's GRUB read when the
//! prefix directory is missing. An image without a signed chain is refused with the paths
//! looked for.
//!
//! # Limitations
//! - The root file system must be ext2/3/4 (the only file system module in the binary) and hold
//!   `/boot/vmlinuz` and `/boot/initrd.img` (Debian and Ubuntu keep these links); the image's own
//!   `grub.cfg` and kernel command line are not used.
//! - x86_64 UEFI only; BIOS local boot of a partition image is not built.

use thiserror::Error;

/// Where the GRUB EFI binary is in the deploy initramfs (and so in the running agent's root).
pub const GRUB_EFI_INITRAMFS_PATH: &str = "/usr/lib/vmdeploy/grub-x86_64.efi";

/// GRUB's prefix: the directory of the ESP the binary is in (`grub-mkimage -p`).
pub const GRUB_EFI_PREFIX: &str = "/EFI/BOOT";

/// The GRUB modules of the binary: GPT and MBR tables, FAT (the ESP, where grubenv is), ext2
/// (the root), search by UUID, `load_env` and the Linux loader; nothing else fits the deploy
/// ISO's budget (the binary is ~260 KB, ~65 KB compressed in the initramfs). No `serial` or
/// `terminal`: GRUB writes to the firmware's console, which the firmware redirects to the
/// serial port where it is set to (OVMF always). No `efi_gop`: GRUB says "no suitable video
/// mode found" and boots on (Linux then has no EFI frame buffer; the console is the serial
/// port).
pub const GRUB_EFI_MODULES: &[&str] = &[
    "part_gpt",
    "part_msdos",
    "fat",
    "ext2",
    "search",
    "loadenv",
    "linux",
];

/// The environment variable [`grubenv`] sets to the root file system's UUID.
pub const ROOT_UUID_VAR: &str = "vmdeploy_root_uuid";

/// The config embedded in the binary (`grub-mkimage -c`): read the ESP's grubenv, find the
/// root by its UUID, boot its kernel.
pub const GRUB_EMBEDDED_CONFIG: &str = "load_env -f ${prefix}/grubenv\n\
     search --no-floppy --fs-uuid --set=root ${vmdeploy_root_uuid}\n\
     linux /boot/vmlinuz root=UUID=${vmdeploy_root_uuid} console=ttyS0,115200\n\
     initrd /boot/initrd.img\n\
     boot\n";

/// The files the agent writes in the ESP, as FAT paths from its root.
pub const ESP_BOOT_DIR: [&str; 2] = ["EFI", "BOOT"];
/// The binary's file name in [`ESP_BOOT_DIR`] (the x86_64 removable-media name).
pub const ESP_LOADER_FILE: &str = "BOOTX64.EFI";
/// The environment block's file name in [`ESP_BOOT_DIR`].
pub const ESP_GRUBENV_FILE: &str = "grubenv";
/// The readable configuration's file name in [`ESP_BOOT_DIR`].
pub const ESP_GRUB_CFG_FILE: &str = "grub.cfg";

/// Shim's and the signed GRUB's paths in a root file system, as each distribution's packages
/// install them: Debian and Ubuntu (`shim-signed`, `grub-efi-amd64-signed`), then the Red Hat
/// family (`shim-x64`, `grub2-efi-x64`, in `/boot/efi/EFI/<vendor>`). Tried in order; the
/// first pair whose shim is present is taken.
pub const SIGNED_CHAINS: &[SignedChainPaths] = &[
    SignedChainPaths {
        shim: "/usr/lib/shim/shimx64.efi.signed",
        grub: "/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed",
    },
    SignedChainPaths {
        shim: "/usr/lib/shim/shimx64.efi.signed.latest",
        grub: "/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed",
    },
    SignedChainPaths {
        shim: "/boot/efi/EFI/redhat/shimx64.efi",
        grub: "/boot/efi/EFI/redhat/grubx64.efi",
    },
    SignedChainPaths {
        shim: "/boot/efi/EFI/centos/shimx64.efi",
        grub: "/boot/efi/EFI/centos/grubx64.efi",
    },
    SignedChainPaths {
        shim: "/boot/efi/EFI/rocky/shimx64.efi",
        grub: "/boot/efi/EFI/rocky/grubx64.efi",
    },
    SignedChainPaths {
        shim: "/boot/efi/EFI/almalinux/shimx64.efi",
        grub: "/boot/efi/EFI/almalinux/grubx64.efi",
    },
    SignedChainPaths {
        shim: "/boot/efi/EFI/fedora/shimx64.efi",
        grub: "/boot/efi/EFI/fedora/grubx64.efi",
    },
];

/// Where one distribution installs its signed boot chain ([`SIGNED_CHAINS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignedChainPaths {
    /// Shim, signed by Microsoft's UEFI CA.
    pub shim: &'static str,
    /// GRUB, signed with the distribution's key that shim carries.
    pub grub: &'static str,
}

/// The signed GRUB's name beside shim in the ESP: shim loads `grubx64.efi` from its own
/// directory.
pub const ESP_SIGNED_GRUB_FILE: &str = "grubx64.efi";

/// The largest shim or GRUB read from an image (each is a few MB).
pub const MAX_SIGNED_LOADER_BYTES: u64 = 32 << 20;

/// GRUB's module objects of type prefix (`OBJ_TYPE_PREFIX` in GRUB's kernel.h).
const GRUB_OBJECT_PREFIX: u32 = 3;
/// The magic of the module info at the start of GRUB's `mods` section (`mimg`).
const GRUB_MODULE_MAGIC: u32 = 0x676d_696d;

/// The directory a GRUB EFI image reads its configuration from when it starts (its prefix,
/// `grub-mkimage -p`), as a path on the partition it was loaded from: `/EFI/debian` for
/// Debian's signed GRUB. `None` when `grub` holds no prefix, or one that names another device
/// or is not a plain path.
///
/// GRUB keeps it in its `mods` PE section: a module info header (magic `mimg`, 4 bytes of
/// padding, the offset and the size of the objects, u64 each), then objects of a type (u32) and
/// a size (u32, header included); the prefix object holds a NUL-terminated string.
pub fn grub_prefix(grub: &[u8]) -> Option<String> {
    let mods = crate::pe::section(grub, "mods")?;
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            mods.get(at..at.checked_add(4)?)?.try_into().ok()?,
        ))
    };
    let u64_at = |at: usize| -> Option<usize> {
        usize::try_from(u64::from_le_bytes(
            mods.get(at..at.checked_add(8)?)?.try_into().ok()?,
        ))
        .ok()
    };
    if u32_at(0)? != GRUB_MODULE_MAGIC {
        return None;
    }
    let end = u64_at(16)?.min(mods.len());
    let mut at = u64_at(8)?;
    while at.checked_add(8)? <= end {
        let (kind, size) = (u32_at(at)?, usize::try_from(u32_at(at + 4)?).ok()?);
        if size < 8 {
            return None;
        }
        if kind == GRUB_OBJECT_PREFIX {
            let body = mods.get(at + 8..at.checked_add(size)?.min(end))?;
            let text = body.split(|&b| b == 0).next()?;
            let path = std::str::from_utf8(text).ok()?;
            let plain = path.starts_with('/')
                && path.len() <= 128
                && path
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"/_-.".contains(&b))
                && !path.split('/').any(|c| c == "..");
            return plain.then(|| path.trim_end_matches('/').to_owned());
        }
        at = at.checked_add(size)?;
    }
    None
}

/// A GRUB environment block is exactly this long (grub-editenv's `DEFAULT_ENVBLK_SIZE`).
pub const GRUBENV_LEN: usize = 1024;
const GRUBENV_HEADER: &str = "# GRUB Environment Block\n";

/// A root UUID that cannot go into GRUB's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "root_uuid {0:?} is not a file system UUID (letters, digits and '-', at most 64): it would \
     be pasted into GRUB's configuration"
)]
pub struct BadRootUuid(pub String);

/// `uuid` if it is safe to paste into GRUB's configuration: it arrives from the network.
fn checked(uuid: &str) -> Result<&str, BadRootUuid> {
    let ok = !uuid.is_empty()
        && uuid.len() <= 64
        && uuid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(uuid)
    } else {
        Err(BadRootUuid(uuid.chars().take(80).collect()))
    }
}

/// The environment block for `root_uuid`: the header, `vmdeploy_root_uuid=<uuid>`, padded
/// with `#` to [`GRUBENV_LEN`] bytes, as grub-editenv writes one.
pub fn grubenv(root_uuid: &str) -> Result<Vec<u8>, BadRootUuid> {
    let uuid = checked(root_uuid)?;
    let mut block = format!("{GRUBENV_HEADER}{ROOT_UUID_VAR}={uuid}\n").into_bytes();
    block.resize(GRUBENV_LEN, b'#');
    Ok(block)
}

/// The readable `grub.cfg` for `root_uuid`: the steps of [`GRUB_EMBEDDED_CONFIG`] with the UUID
/// written in.
pub fn grub_cfg(root_uuid: &str) -> Result<String, BadRootUuid> {
    let uuid = checked(root_uuid)?;
    Ok(format!(
        "# Written by the vmdeploy agent (image.install_bootloader). The GRUB next to this file\n\
         # reads grubenv, not this file; a full GRUB put in its place reads this.\n\
         serial --unit=0 --speed=115200\n\
         terminal_input serial console\n\
         terminal_output serial console\n\
         search --no-floppy --fs-uuid --set=root {uuid}\n\
         linux /boot/vmlinuz root=UUID={uuid} console=ttyS0,115200\n\
         initrd /boot/initrd.img\n\
         boot\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_block_is_grub_editenvs_format() {
        let block = grubenv("7e57da7a-0000-4000-8000-000000000001").expect("valid");
        assert_eq!(block.len(), 1024);
        let text = std::str::from_utf8(&block).expect("ascii");
        assert!(text.starts_with(
            "# GRUB Environment Block\nvmdeploy_root_uuid=7e57da7a-0000-4000-8000-000000000001\n#"
        ));
        assert!(text.ends_with("####"));
        // The variable the block sets is the one the embedded config reads.
        assert!(GRUB_EMBEDDED_CONFIG.contains(&format!("${{{ROOT_UUID_VAR}}}")));
        assert!(GRUB_EMBEDDED_CONFIG.contains("load_env -f ${prefix}/grubenv"));
        // A vfat volume id (blkid's form) is a valid UUID too.
        assert!(grubenv("ABCD-1234").is_ok());
    }

    #[test]
    fn the_readable_config_boots_the_root_by_uuid() {
        let cfg = grub_cfg("7e57da7a-0000-4000-8000-000000000001").expect("valid");
        assert!(cfg.contains(
            "search --no-floppy --fs-uuid --set=root 7e57da7a-0000-4000-8000-000000000001\n"
        ));
        assert!(cfg.contains(
            "linux /boot/vmlinuz root=UUID=7e57da7a-0000-4000-8000-000000000001 console=ttyS0,115200\n"
        ));
        assert!(cfg.contains("initrd /boot/initrd.img\n"));
        assert!(cfg.ends_with("boot\n"));
    }

    /// A GRUB image's `mods` section: the module info and `objects` (type, payload).
    fn grub_with(objects: &[(u32, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for (kind, payload) in objects {
            let size = 8 + payload.len().next_multiple_of(8);
            body.extend_from_slice(&kind.to_le_bytes());
            body.extend_from_slice(&u32::try_from(size).expect("small").to_le_bytes());
            body.extend_from_slice(payload);
            body.resize(body.len() + size - 8 - payload.len(), 0);
        }
        let mut mods = b"mimg\0\0\0\0".to_vec();
        mods.extend_from_slice(&24u64.to_le_bytes());
        mods.extend_from_slice(&(24 + body.len() as u64).to_le_bytes());
        mods.extend_from_slice(&body);
        crate::pe::test_support::with_section("mods", &mods)
    }

    #[test]
    fn the_prefix_is_read_from_grubs_module_objects() {
        let grub = grub_with(&[
            (0, b"\x7fELF module"),
            (2, b"normal\n"),
            (3, b"/EFI/debian\0"),
        ]);
        assert_eq!(grub_prefix(&grub).as_deref(), Some("/EFI/debian"));
        assert_eq!(grub_prefix(&grub_with(&[(0, b"x")])), None);
        // Another device, or something that is no plain path, is not a place in the ESP.
        for odd in [
            &b"(hd0,gpt2)/boot/grub\0"[..],
            b"/EFI/../x\0",
            b"/EFI/a b\0",
            b"\xff\0",
        ] {
            assert_eq!(grub_prefix(&grub_with(&[(3, odd)])), None, "{odd:?}");
        }
        assert_eq!(grub_prefix(b"MZ"), None);
    }

    #[test]
    fn a_uuid_that_could_inject_commands_is_refused() {
        for bad in ["", "x\nboot", "a b", "$(x)", "u;reboot", &"a".repeat(65)] {
            assert!(grubenv(bad).is_err(), "{bad:?}");
            assert!(grub_cfg(bad).is_err(), "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn a_grub_prefix_is_never_a_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
            at in 0usize..400,
        ) {
            let mut grub = grub_with(&[(3, b"/EFI/debian\0")]);
            let start = grub.len() - 48;
            for (i, b) in bytes.iter().enumerate().skip(at % 48).take(48) {
                if let Some(slot) = grub.get_mut(start + i % 48) {
                    *slot = *b;
                }
            }
            let _ = grub_prefix(&grub);
            let _ = grub_prefix(&bytes);
        }
    }

    #[test]
    fn every_module_the_config_needs_is_listed() {
        for m in ["fat", "ext2", "part_gpt", "search", "loadenv", "linux"] {
            assert!(GRUB_EFI_MODULES.contains(&m), "{m}");
        }
        // The rescue parser runs the embedded config: no command of a module left out.
        assert!(!GRUB_EFI_MODULES.contains(&"normal"));
        for line in GRUB_EMBEDDED_CONFIG.lines() {
            let cmd = line.split_whitespace().next().unwrap_or_default();
            assert!(
                ["load_env", "search", "linux", "initrd", "boot"].contains(&cmd),
                "{line}"
            );
        }
    }
}
