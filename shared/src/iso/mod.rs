//! Bootable ISO images: one ISO 9660 + El Torito image with a BIOS entry and a UEFI entry, the
//! kernel and initramfs stored once (docs/architecture.md §9–11, `docs/qemu-and-boot.md` §6).
//!
//! Used by `vmdeploy-image-build deploy-iso` / `boot-iso` and, at run time, by the conductor for
//! the instance boot ISOs of `iscsi_ilo` netboot. Pure code: the boot loader binaries come in as
//! bytes ([`BootLoaders`]); finding them on a system is the caller's business.
//!
//! # Layout
//! ```text
//! /boot/vmlinuz  /boot/initrd        stored once, read by both loaders
//! /isolinux/isolinux.bin             BIOS El Torito entry (no emulation, boot-info-table)
//! /isolinux/ldlinux.c32, isolinux.cfg
//! /boot/efi.img                      UEFI El Torito entry: FAT12 with EFI/BOOT/BOOTX64.EFI (GRUB;
//!                                    or, for Secure Boot, shim there and GRUB as grubx64.efi)
//! /boot/grub/grub.cfg                read by that GRUB once its embedded config found the volume
//! the boot catalog                  a sector after the directories, not in the tree
//! volume id VMEDIA_BOOT_ISO; the same inputs give the same bytes
//! ```
//! Names are stored as plain ISO 9660 (`BOOT/VMLINUZ.;1`); both loaders read them in lower case.
//!
//! # Why GRUB's config is not in the EFI image
//! GRUB started from an El Torito image sees the CD (`cd0`, the ISO 9660 tree), not the FAT
//! image it came from, so a `grub.cfg` beside `BOOTX64.EFI` is never read. The GRUB binary
//! carries [`GRUB_EARLY_CONFIG`] instead (`grub-mkimage -c`), which finds the ISO by its volume
//! label and reads `/boot/grub/grub.cfg` with the command line from there. The GRUB binary is
//! therefore the same for every ISO and can be built once.
//!
//! # Secure Boot
//! With [`BootLoaders::shim`] set, the EFI image holds Debian's Microsoft-signed shim as
//! `BOOTX64.EFI` and Debian's signed CD GRUB (`gcdx64.efi.signed`) beside it as `grubx64.efi`,
//! the name shim loads and verifies. That GRUB cannot carry our embedded config (its signature
//! covers it); its own is built with the prefix `/boot/grub` on the device it was loaded from,
//! which is the CD, so it reads the same `/boot/grub/grub.cfg`. The kernel must then be signed
//! by a key shim trusts (Debian's), which GRUB checks through shim before it runs it.
//!
//! # Why our own writer
//! hadris-iso 2.5.0 (`docs/crates.md` §3.1) stamps every volume descriptor and directory record with
//! the clock (`Utc::now()`), with no way to pass a time, so two builds never match; and fatfs
//! cannot write the EFI image's sub-directories cleanly. What the boot ISOs need is small: a
//! handful of fixed 8.3 names, two El Torito entries and a boot-info-table.

mod config;
mod date;
mod efi_image;
mod eltorito;
pub mod loaders;
pub mod read;
mod volume;

use std::borrow::Cow;
use std::io::{Seek, Write};

pub use config::{full_cmdline, CONSOLE_ARGS, MAX_CMDLINE};
pub use date::DEFAULT_EPOCH;

/// The volume id of every boot ISO we write.
pub const BOOT_VOLUME_ID: &str = "VMEDIA_BOOT_ISO";

/// Where GRUB's configuration lives in the ISO 9660 tree (GRUB's `prefix`).
pub const GRUB_PREFIX: &str = "/boot/grub";

/// The config embedded in the GRUB EFI binary (`grub-mkimage -c`): find the ISO by its volume
/// label and read the per-ISO `grub.cfg` from it (see the module documentation).
pub const GRUB_EARLY_CONFIG: &str = "search --no-floppy --label --set=root VMEDIA_BOOT_ISO\n\
                                     set prefix=($root)/boot/grub\n\
                                     configfile $prefix/grub.cfg\n";

/// The GRUB modules the EFI binary needs for [`GRUB_EARLY_CONFIG`] and the `grub.cfg` we write,
/// and nothing else (Debian's monolithic `gcdx64.efi` is 3.8 MB; this is about 0.6 MB).
/// `efi_gop` hands the firmware's frame buffer to Linux (efifb, so `console=tty0` shows on the
/// iLO's remote console); without a video driver GRUB also prints "no suitable video mode found".
pub const GRUB_EFI_MODULES: &[&str] = &[
    "iso9660",
    "search",
    "search_label",
    "configfile",
    "normal",
    "linux",
    "serial",
    "terminal",
    "efi_gop",
];

/// The boot loader binaries an ISO needs.
#[derive(Debug, Clone)]
pub struct BootLoaders {
    /// `isolinux.bin` (BIOS El Torito, no emulation, boot-info-table patched in).
    pub isolinux_bin: Vec<u8>,
    /// `ldlinux.c32`, which isolinux.bin loads.
    pub ldlinux_c32: Vec<u8>,
    /// GRUB's x86_64 EFI binary, stored as `EFI/BOOT/BOOTX64.EFI` in the EFI system image. It
    /// must carry [`GRUB_EARLY_CONFIG`] as its embedded config; with [`Self::shim`], it is
    /// Debian's signed CD GRUB instead, stored as `EFI/BOOT/GRUBX64.EFI`.
    pub grub_efi: Vec<u8>,
    /// Debian's signed shim, for media that boot under UEFI Secure Boot (see the module
    /// documentation); `None` for our own unsigned GRUB alone.
    pub shim: Option<Vec<u8>>,
}

/// What goes on a boot ISO.
#[derive(Debug, Clone, Copy)]
pub struct BootIsoSpec<'a> {
    /// The kernel (bzImage).
    pub kernel: &'a [u8],
    /// The initramfs, as the kernel will read it (compressed or not).
    pub initramfs: &'a [u8],
    /// The kernel command line both menus pass, after `console=tty0 console=ttyS0,115200`.
    pub cmdline: &'a str,
    /// The loaders.
    pub loaders: &'a BootLoaders,
}

/// Why an ISO could not be written.
#[derive(Debug, thiserror::Error)]
pub enum IsoError {
    /// Writing the output failed.
    #[error("writing the ISO: {0}")]
    Io(#[from] std::io::Error),
    /// An input is not usable (too large, a command line with a newline, ...).
    #[error("invalid ISO input: {0}")]
    Invalid(String),
}

/// Sizes of what went on an ISO, for the tools to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IsoSummary {
    /// The whole image.
    pub iso_bytes: u64,
    /// The EFI system image (FAT) holding GRUB.
    pub efi_image_bytes: u64,
}

/// The FAT image of the ISO's EFI El Torito entry: the loader at the firmware's removable-media
/// path `\EFI\BOOT\BOOTX64.EFI` (GRUB, or shim with GRUB beside it), nothing else.
fn efi_boot_image(loaders: &BootLoaders, time: &date::Civil) -> Result<Vec<u8>, IsoError> {
    match &loaders.shim {
        None => grub_only_image(&loaders.grub_efi, time),
        Some(shim) => efi_image::build(
            &[
                efi_image::FatFile {
                    path: &["EFI", "BOOT", "BOOTX64.EFI"],
                    data: shim,
                },
                efi_image::FatFile {
                    path: &["EFI", "BOOT", "GRUBX64.EFI"],
                    data: &loaders.grub_efi,
                },
            ],
            time,
        ),
    }
}

/// The EFI system partition image every one of our boot ISOs carries, on its own, with every
/// date at `epoch`: for a conductor that builds UEFI ISOs itself from a ready ESP image
/// (upstream Ironic's `[conductor] bootloader`). `grub_efi` must carry [`GRUB_EARLY_CONFIG`],
/// so the ISO's volume id must be [`BOOT_VOLUME_ID`] and its GRUB configuration
/// `/boot/grub/grub.cfg`.
pub fn efi_system_image(grub_efi: &[u8], epoch: u64) -> Result<Vec<u8>, IsoError> {
    grub_only_image(grub_efi, &date::Civil::from_epoch(epoch)?)
}

/// The FAT image holding `grub_efi` as `\EFI\BOOT\BOOTX64.EFI` and nothing else.
fn grub_only_image(grub_efi: &[u8], time: &date::Civil) -> Result<Vec<u8>, IsoError> {
    efi_image::build(
        &[efi_image::FatFile {
            path: &["EFI", "BOOT", "BOOTX64.EFI"],
            data: grub_efi,
        }],
        time,
    )
}

/// Writes the boot ISO to `out` with every date at [`DEFAULT_EPOCH`] and returns `out`.
pub fn write_boot_iso<W: Write + Seek>(spec: &BootIsoSpec<'_>, out: W) -> Result<W, IsoError> {
    write_boot_iso_at(spec, DEFAULT_EPOCH, out).map(|(out, _)| out)
}

/// Writes the boot ISO with every date at `epoch` (seconds since 1970, UTC; e.g. from
/// `SOURCE_DATE_EPOCH`), from the current position of `out`; returns `out` and the sizes.
pub fn write_boot_iso_at<W: Write + Seek>(
    spec: &BootIsoSpec<'_>,
    epoch: u64,
    out: W,
) -> Result<(W, IsoSummary), IsoError> {
    write_boot_iso_with(spec, &[], epoch, out)
}

/// A file a boot ISO carries besides its boot files (the deploy ISO's driver pack).
#[derive(Debug, Clone, Copy)]
pub struct ExtraFile<'a> {
    /// Its path: upper-case d-character names of at most 30 bytes, one dot in a file's name
    /// (`["DRIVERS", "INDEX."]`). The boot files' directories (`ISOLINUX`, `BOOT`) are taken.
    pub path: &'a [&'a str],
    /// Its bytes.
    pub data: &'a [u8],
}

/// [`write_boot_iso_at`] with `extra` files after the boot files, in the given order.
pub fn write_boot_iso_with<W: Write + Seek>(
    spec: &BootIsoSpec<'_>,
    extra: &[ExtraFile<'_>],
    epoch: u64,
    mut out: W,
) -> Result<(W, IsoSummary), IsoError> {
    if let Some(taken) = extra
        .iter()
        .find(|f| matches!(f.path.first(), Some(&"ISOLINUX" | &"BOOT")))
    {
        return Err(IsoError::Invalid(format!(
            "extra file {} would sit among the boot files",
            taken.path.join("/")
        )));
    }
    let time = date::Civil::from_epoch(epoch)?;
    check_inputs(spec)?;
    let cmdline = config::full_cmdline(spec.cmdline)?;
    let isolinux_cfg = config::isolinux_cfg(&cmdline);
    let grub_cfg = config::grub_cfg(&cmdline);
    let efi_image = efi_boot_image(spec.loaders, &time)?;
    let efi_image_len = efi_image.len();

    // Boot images and configs first, the large kernel and initramfs last.
    let mut files = vec![
        iso_file(&["ISOLINUX", "ISOLINUX.BIN"], &spec.loaders.isolinux_bin),
        iso_file(&["ISOLINUX", "LDLINUX.C32"], &spec.loaders.ldlinux_c32),
        iso_file(&["ISOLINUX", "ISOLINUX.CFG"], isolinux_cfg.into_bytes()),
        iso_file(&["BOOT", "GRUB", "GRUB.CFG"], grub_cfg.into_bytes()),
        iso_file(&["BOOT", "EFI.IMG"], efi_image),
        iso_file(&["BOOT", "VMLINUZ."], spec.kernel),
        iso_file(&["BOOT", "INITRD."], spec.initramfs),
    ];
    files.extend(extra.iter().map(|f| iso_file(f.path, f.data)));
    let boot = eltorito::ElTorito {
        bios_image: 0,
        efi_image: 4,
        efi_image_len,
    };
    let vol = volume::Volume {
        volume_id: BOOT_VOLUME_ID,
        time,
        files,
        boot: Some(&boot),
    };
    let mut buffered = std::io::BufWriter::with_capacity(1 << 20, &mut out);
    let iso_bytes = volume::write_volume(&vol, &mut buffered)?;
    buffered.flush()?;
    drop(buffered);
    Ok((
        out,
        IsoSummary {
            iso_bytes,
            efi_image_bytes: efi_image_len as u64,
        },
    ))
}

fn iso_file<'a>(path: &[&str], data: impl Into<Cow<'a, [u8]>>) -> volume::IsoFile<'a> {
    volume::IsoFile {
        path: path.iter().map(|s| (*s).to_owned()).collect(),
        data: data.into(),
    }
}

/// How many bytes of a kernel [`check_kernel`] reads: through the end of the boot protocol
/// header's magic.
pub const KERNEL_CHECK_LEN: usize = 0x206;

/// Refuses a kernel neither loader can boot: not an x86 bzImage. `head` may be the kernel's
/// first [`KERNEL_CHECK_LEN`] bytes or all of it.
pub fn check_kernel(head: &[u8]) -> Result<(), IsoError> {
    // The x86 boot protocol header: "HdrS" at 0x202 (Documentation/arch/x86/boot.rst).
    if head.get(0x202..KERNEL_CHECK_LEN) != Some(b"HdrS".as_slice()) {
        return Err(IsoError::Invalid(
            "the kernel is not an x86 bzImage (no \"HdrS\" boot protocol header at 0x202)".into(),
        ));
    }
    Ok(())
}

/// Refuses inputs no firmware or loader could use, before anything is written.
fn check_inputs(spec: &BootIsoSpec<'_>) -> Result<(), IsoError> {
    check_kernel(spec.kernel)?;
    if spec.initramfs.is_empty() {
        return Err(IsoError::Invalid("the initramfs is empty".into()));
    }
    let l = spec.loaders;
    if l.isolinux_bin.len() < 2048 {
        return Err(IsoError::Invalid(format!(
            "isolinux.bin is {} bytes; the real one is tens of KiB",
            l.isolinux_bin.len()
        )));
    }
    if l.ldlinux_c32.is_empty() {
        return Err(IsoError::Invalid("ldlinux.c32 is empty".into()));
    }
    if !l.grub_efi.starts_with(b"MZ") {
        return Err(IsoError::Invalid(
            "the GRUB EFI binary is not a PE image (no \"MZ\" header)".into(),
        ));
    }
    if l.shim.as_ref().is_some_and(|shim| !shim.starts_with(b"MZ")) {
        return Err(IsoError::Invalid(
            "the shim is not a PE image (no \"MZ\" header)".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::volume::tests::{read_file, u32le};
    use super::volume::SECTOR;
    use super::*;
    use proptest::prelude::*;
    use std::io::Cursor;

    fn loaders() -> BootLoaders {
        BootLoaders {
            isolinux_bin: (0..4096u32).map(|i| (i * 7) as u8).collect(),
            ldlinux_c32: b"ldlinux".to_vec(),
            grub_efi: [b"MZ".as_slice(), &[0x42; 5000]].concat(),
            shim: None,
        }
    }

    fn kernel(len: usize) -> Vec<u8> {
        let mut k: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        k[0x202..0x206].copy_from_slice(b"HdrS");
        k
    }

    fn build(spec: &BootIsoSpec<'_>) -> Vec<u8> {
        write_boot_iso(spec, Cursor::new(Vec::new()))
            .expect("ISO")
            .into_inner()
    }

    #[test]
    fn layout_and_contents() {
        let l = loaders();
        let k = kernel(10_000);
        let spec = BootIsoSpec {
            kernel: &k,
            initramfs: b"initramfs bytes",
            cmdline: "root=UUID=42 ro",
            loaders: &l,
        };
        let iso = build(&spec);
        assert_eq!(iso.len() % SECTOR, 0);
        let pvd = &iso[16 * SECTOR..];
        assert_eq!(&pvd[..7], b"\x01CD001\x01");
        assert_eq!(&pvd[40..72], format!("{BOOT_VOLUME_ID:<32}").as_bytes());
        assert_eq!(u32le(pvd, 80) as usize * SECTOR, iso.len());
        assert_eq!(&pvd[813..829], b"2026010100000000");
        assert_eq!(
            &iso[17 * SECTOR + 1..17 * SECTOR + 30],
            b"CD001\x01EL TORITO SPECIFICATION"
        );
        assert_eq!(iso[18 * SECTOR], 255);

        assert_eq!(read_file(&iso, &["BOOT", "VMLINUZ.;1"]), Some(k.as_slice()));
        assert_eq!(
            read_file(&iso, &["BOOT", "INITRD.;1"]),
            Some(b"initramfs bytes".as_slice())
        );
        let cfg = read_file(&iso, &["ISOLINUX", "ISOLINUX.CFG;1"]).expect("isolinux.cfg");
        assert!(String::from_utf8_lossy(cfg).contains(
            "APPEND initrd=/boot/initrd console=tty0 console=ttyS0,115200 root=UUID=42 ro\n"
        ));
        let grub = read_file(&iso, &["BOOT", "GRUB", "GRUB.CFG;1"]).expect("grub.cfg");
        assert!(String::from_utf8_lossy(grub)
            .contains("linux /boot/vmlinuz console=tty0 console=ttyS0,115200 root=UUID=42 ro\n"));

        // The boot catalog points at isolinux.bin (patched) and the EFI image.
        let catalog_lba = u32le(&iso, 17 * SECTOR + 0x47) as usize;
        let cat = &iso[catalog_lba * SECTOR..(catalog_lba + 1) * SECTOR];
        let bios_lba = u32le(cat, 40) as usize;
        let isolinux = read_file(&iso, &["ISOLINUX", "ISOLINUX.BIN;1"]).expect("isolinux");
        assert_eq!(isolinux.as_ptr(), iso[bios_lba * SECTOR..].as_ptr());
        assert_eq!(u32le(isolinux, 8), 16);
        assert_eq!(u32le(isolinux, 12) as usize, bios_lba);
        assert_eq!(u32le(isolinux, 16) as usize, l.isolinux_bin.len());
        assert_eq!(&isolinux[64..], &l.isolinux_bin[64..]);
        let efi_lba = u32le(cat, 104) as usize;
        let efi = read_file(&iso, &["BOOT", "EFI.IMG;1"]).expect("efi.img");
        assert_eq!(efi.as_ptr(), iso[efi_lba * SECTOR..].as_ptr());
        assert_eq!(
            usize::from(u16::from_le_bytes([cat[102], cat[103]])) * 512,
            efi.len()
        );
        assert!(efi
            .windows(l.grub_efi.len())
            .any(|w| w == l.grub_efi.as_slice()));
        // The kernel is stored once.
        assert_eq!(
            iso.windows(k.len()).filter(|w| *w == k.as_slice()).count(),
            1
        );
    }

    #[test]
    fn the_epoch_is_the_only_time() {
        let l = loaders();
        let k = kernel(3000);
        let spec = BootIsoSpec {
            kernel: &k,
            initramfs: b"i",
            cmdline: "",
            loaders: &l,
        };
        let at = |epoch| {
            write_boot_iso_at(&spec, epoch, Cursor::new(Vec::new()))
                .expect("ISO")
                .0
                .into_inner()
        };
        assert_eq!(at(DEFAULT_EPOCH), build(&spec));
        let other = at(1_000_000_000);
        assert_ne!(other, build(&spec));
        assert_eq!(
            &other[16 * SECTOR + 813..16 * SECTOR + 829],
            b"2001090901464000"
        );
        assert!(write_boot_iso_at(&spec, 0, Cursor::new(Vec::new())).is_err());
    }

    #[test]
    fn bad_inputs_are_errors() {
        let l = loaders();
        let k = kernel(3000);
        let ok = BootIsoSpec {
            kernel: &k,
            initramfs: b"i",
            cmdline: "ro",
            loaders: &l,
        };
        let fails = |spec: BootIsoSpec<'_>| {
            matches!(
                write_boot_iso(&spec, Cursor::new(Vec::new())),
                Err(IsoError::Invalid(_))
            )
        };
        assert!(!fails(ok));
        assert!(fails(BootIsoSpec {
            cmdline: "ro\ninit=/bin/sh",
            ..ok
        }));
        assert!(fails(BootIsoSpec {
            kernel: b"not a kernel",
            ..ok
        }));
        assert!(fails(BootIsoSpec {
            initramfs: b"",
            ..ok
        }));
        let mut bad = l.clone();
        bad.grub_efi = b"ELF".to_vec();
        assert!(fails(BootIsoSpec {
            loaders: &bad,
            ..ok
        }));
        let mut bad = l.clone();
        bad.isolinux_bin.truncate(100);
        assert!(fails(BootIsoSpec {
            loaders: &bad,
            ..ok
        }));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Any sizes: same bytes twice, files read back whole, the size the PVD says.
        #[test]
        fn any_sizes_round_trip(klen in 0x300usize..20_000, ilen in 1usize..9000, seed: u8) {
            let l = loaders();
            let mut k = kernel(klen);
            k[0] = seed;
            let initramfs: Vec<u8> = (0..ilen).map(|i| (i as u8) ^ seed).collect();
            let spec = BootIsoSpec { kernel: &k, initramfs: &initramfs, cmdline: "x=1", loaders: &l };
            let iso = build(&spec);
            prop_assert_eq!(&iso, &build(&spec));
            prop_assert_eq!(read_file(&iso, &["BOOT", "VMLINUZ.;1"]), Some(k.as_slice()));
            prop_assert_eq!(read_file(&iso, &["BOOT", "INITRD.;1"]), Some(initramfs.as_slice()));
            prop_assert_eq!(u32le(&iso, 16 * SECTOR + 80) as usize * SECTOR, iso.len());
        }
    }
}
