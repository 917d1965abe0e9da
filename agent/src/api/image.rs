//! The `image` extension: `install_bootloader`, which Ironic's `AgentDeploy.configure_local_boot`
//! sends after a partition image is written with local boot (and, with no ESP named, after a
//! whole-disk image under UEFI).
//!
//! # Parameters (IPA's `ImageExtension.install_bootloader`)
//! `root_uuid` (the root file system's UUID, from `standby.get_partition_uuids`),
//! `efi_system_part_uuid` (the ESP's FAT volume id, or null), `prep_boot_part_uuid` (ppc64 only,
//! must be null), `target_boot_mode` (`bios` or `uefi`; IPA's default `bios`),
//! `ignore_bootloader_failure` (accepted, not needed: this agent fails only for reasons that
//! would fail the boot too).
//!
//! # What it does (UEFI)
//! Copies the deploy initramfs's GRUB EFI binary
//! ([`GRUB_EFI_INITRAMFS_PATH`](vmdeploy_shared::partition::local_boot::GRUB_EFI_INITRAMFS_PATH))
//! to `\EFI\BOOT\BOOTX64.EFI` of the named ESP, the firmware's removable-media path, so no NVRAM
//! entry is needed; writes `\EFI\BOOT\grubenv` with the root's UUID, which that GRUB reads, and
//! a readable `\EFI\BOOT\grub.cfg` (see `vmdeploy_shared::partition::local_boot`). The instance
//! then boots the root's `/boot/vmlinuz` and `/boot/initrd.img` with
//! `root=UUID=<root_uuid> console=ttyS0,115200`. The ESP is the one the last
//! `prepare_image` made, or else an ESP of the disk's table whose volume id matches.
//! Without an ESP named (a whole-disk image), the image's own boot loader is left as it is.
//!
//! # Under UEFI Secure Boot
//! When the firmware booted the deploy ramdisk with Secure Boot on (the agent reads it from the
//! kernel's boot parameters, [`SecureBoot`]), our unsigned GRUB would be refused at the next
//! boot, so the image's own signed chain goes into the ESP instead: its shim as
//! `\EFI\BOOT\BOOTX64.EFI`, its signed GRUB beside it, and `grub.cfg` where that GRUB reads
//! it. They are read from the written root file system at the paths the distribution installs
//! them; an image without them fails the command with those paths named
//! (`vmdeploy_shared::partition::local_boot`, "Under UEFI Secure Boot").
//!
//! # Limitations
//! - BIOS local boot of a partition image is not supported (`target_boot_mode=bios` is an
//!   error saying so); nor are PReP partitions or software RAID.
//! - No NVRAM boot entry is written (the removable-media path needs none).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use serde_json::{json, Value};
use vmdeploy_shared::api::ipa::{CommandError, IpaErrorKind};
use vmdeploy_shared::partition::Role;

use super::server::{CommandFuture, StartError};
use super::standby::{require_disk, DiskChoice};
use crate::firmware::SecureBoot;
use crate::install::esp::EspBoot;
use crate::install::{esp, signed_chain, InstalledState};

/// Why `target_boot_mode=bios` fails.
pub const BIOS_UNSUPPORTED: &str = "install_bootloader: target_boot_mode is bios (or not given): \
     this agent installs boot loaders for UEFI only; deploy the partition image with the node's \
     boot_mode set to uefi, or deploy a whole-disk image";

/// The `image` extension.
pub struct Image {
    /// The install disk.
    pub disk: DiskChoice,
    /// The last partition image write.
    pub installed: InstalledState,
    /// The GRUB EFI binary to install (the initramfs's; tests point elsewhere).
    pub grub_efi: PathBuf,
    /// Whether the firmware runs Secure Boot ([`SecureBoot::of_this_boot`]; tests say).
    pub secure_boot: fn() -> SecureBoot,
}

/// `install_bootloader`'s parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BootloaderParams {
    root_uuid: Option<String>,
    efi_system_part_uuid: Option<String>,
    uefi: bool,
}

fn optional_string(params: &Value, name: &str) -> Result<Option<String>, StartError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(StartError::InvalidParams(format!(
            "{name} is {other}: expected a string"
        ))),
    }
}

fn parse(params: &Value) -> Result<BootloaderParams, StartError> {
    if optional_string(params, "prep_boot_part_uuid")?.is_some() {
        return Err(StartError::InvalidParams(
            "prep_boot_part_uuid is set: PReP boot partitions (ppc64) are not supported by this \
             agent"
                .into(),
        ));
    }
    let uefi = match optional_string(params, "target_boot_mode")?.as_deref() {
        None => false,
        Some(m) if m.eq_ignore_ascii_case("uefi") => true,
        Some(m) if m.eq_ignore_ascii_case("bios") => false,
        Some(m) => {
            return Err(StartError::InvalidParams(format!(
                "target_boot_mode is {m:?}: expected bios or uefi"
            )))
        }
    };
    Ok(BootloaderParams {
        root_uuid: optional_string(params, "root_uuid")?,
        efi_system_part_uuid: optional_string(params, "efi_system_part_uuid")?,
        uefi,
    })
}

impl Image {
    /// Starts `image.<cmd>`.
    pub fn start(&self, cmd: &str, params: &Value) -> Result<CommandFuture, StartError> {
        match cmd {
            "install_bootloader" => self.install_bootloader(params),
            other => Err(StartError::UnknownCommand(format!("image.{other}"))),
        }
    }

    fn install_bootloader(&self, params: &Value) -> Result<CommandFuture, StartError> {
        let p = parse(params)?;
        if !p.uefi {
            // A failed command rather than a refused request: Ironic reports the command's
            // error as the deploy's failure, word for word.
            return Ok(Box::pin(async {
                Err(CommandError::new(
                    IpaErrorKind::CommandExecution,
                    BIOS_UNSUPPORTED,
                ))
            }));
        }
        let disk = Arc::clone(&self.disk);
        let installed = Arc::clone(&self.installed);
        let grub_efi = self.grub_efi.clone();
        let secure_boot = (self.secure_boot)() == SecureBoot::Enabled;
        Ok(Box::pin(async move {
            let Some(esp_uuid) = p.efi_system_part_uuid else {
                // Ironic sends this for whole-disk images under UEFI: their own boot loader
                // stays, found by the firmware on the removable-media path.
                return Ok(json!({
                    "result": "install_bootloader: no EFI system partition named (whole-disk \
                               image): the image's own boot loader is used"
                }));
            };
            let root_uuid = p.root_uuid.ok_or_else(|| {
                CommandError::new(
                    IpaErrorKind::InvalidCommandParams,
                    "root_uuid is required with efi_system_part_uuid",
                )
            })?;
            let path = require_disk(&disk)?;
            let (shown_esp, shown_root) = (esp_uuid.clone(), root_uuid.clone());
            let outcome = tokio::task::spawn_blocking(move || {
                install_uefi(
                    &path,
                    &installed,
                    &grub_efi,
                    &esp_uuid,
                    &root_uuid,
                    secure_boot,
                )
            })
            .await;
            match outcome {
                Ok(Ok(installed)) => Ok(json!({
                    "result": format!(
                        "install_bootloader: {installed} installed at \\EFI\\BOOT\\BOOTX64.EFI \
                         of the EFI system partition {shown_esp}, booting the root file system \
                         {shown_root}"
                    )
                })),
                Ok(Err(e)) => Err(CommandError::new(
                    IpaErrorKind::CommandExecution,
                    format!("installing the boot loader: {e:#}"),
                )),
                Err(e) => Err(CommandError::new(
                    IpaErrorKind::CommandExecution,
                    format!("the boot loader task died: {e}"),
                )),
            }
        }))
    }
}

/// Finds the ESP named `esp_uuid` on `disk` and installs a boot loader there for `root_uuid`:
/// our GRUB, or under Secure Boot the image's signed chain. Says which it installed.
fn install_uefi(
    disk: &std::path::Path,
    installed: &InstalledState,
    grub_efi: &std::path::Path,
    esp_uuid: &str,
    root_uuid: &str,
    secure_boot: bool,
) -> anyhow::Result<String> {
    let file = esp::open_buffered(disk)?;
    let record = installed
        .lock()
        .ok()
        .and_then(|r| r.clone())
        .filter(|r| r.disk == disk);
    let recorded = record.as_ref().and_then(|r| {
        let efi = r.layout.partition(Role::Efi).copied()?;
        let same = r
            .esp_uuid
            .as_deref()
            .is_some_and(|u| u.eq_ignore_ascii_case(esp_uuid));
        same.then_some((efi.offset, efi.len))
    });
    let (offset, len) = match recorded {
        Some(extent) => extent,
        None => {
            let mut found = None;
            for (offset, len) in super::partitions::esp_extents(disk)? {
                if esp::uuid_of(&file, offset)?.is_some_and(|u| u.eq_ignore_ascii_case(esp_uuid)) {
                    found = Some((offset, len));
                    break;
                }
            }
            match found {
                Some(extent) => extent,
                None => bail!(
                    "no EFI system partition with the FAT volume id {esp_uuid} on {}",
                    disk.display()
                ),
            }
        }
    };
    let (ours, chain);
    let (boot, installed) = if secure_boot {
        let (root_offset, root_len) = root_extent(disk, &file, record.as_ref(), root_uuid)?;
        chain = signed_chain::read_from_root(&file, root_offset, root_len)?;
        tracing::info!(
            shim = chain.shim_path,
            grub_prefix = chain.prefix.as_deref().unwrap_or("(none)"),
            "UEFI Secure Boot is on: installing the image's own signed shim and GRUB"
        );
        (
            EspBoot::Signed(&chain),
            format!("the image's signed shim ({}) and GRUB", chain.shim_path),
        )
    } else {
        ours = std::fs::read(grub_efi).with_context(|| {
            format!(
                "reading the GRUB EFI binary {} (the deploy initramfs must carry it: build it \
                 with vmdeploy-image-build)",
                grub_efi.display()
            )
        })?;
        (EspBoot::Ours { grub: &ours }, "GRUB".to_owned())
    };
    esp::install_loader(&file, offset, len, &boot, root_uuid)?;
    file.sync_all()
        .with_context(|| format!("syncing {}", disk.display()))?;
    tracing::info!(%esp_uuid, %root_uuid, offset, "{installed} installed in the EFI system partition");
    Ok(installed)
}

/// The byte range of the root file system `root_uuid` on `disk`: the partition the last write
/// laid out, or else the partition of the disk's table whose ext2/3/4 file system has that
/// UUID (after a restart).
fn root_extent(
    disk: &std::path::Path,
    file: &std::fs::File,
    record: Option<&crate::install::PartitionRecord>,
    root_uuid: &str,
) -> anyhow::Result<(u64, u64)> {
    if let Some(root) = record
        .filter(|r| r.root_uuid.eq_ignore_ascii_case(root_uuid))
        .and_then(|r| r.layout.partition(Role::Root))
    {
        return Ok((root.offset, root.len));
    }
    for (offset, len) in super::partitions::partition_extents(disk, false)? {
        let Ok(fs) = vmdeploy_shared::ext4::Ext4Volume::open(file, offset, len) else {
            continue;
        };
        if fs.uuid().eq_ignore_ascii_case(root_uuid) {
            return Ok((offset, len));
        }
    }
    bail!(
        "no partition of {} holds the root file system {root_uuid} (ext2/3/4), where the \
         image's signed boot chain would be",
        disk.display()
    )
}

#[cfg(test)]
#[path = "image_tests.rs"]
mod tests;
