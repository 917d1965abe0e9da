//! A boot ISO from `vmdeploy-image-build boot-iso` boots under QEMU (TCG) with SeaBIOS (i440fx,
//! isolinux) and with OVMF (q35, GRUB EFI) and runs the initramfs from the ISO with the command
//! line given (docs/qemu-and-boot.md §6).
//!
//! The initramfs is the static agent as `/init` (`vmdeploy-image-build initramfs`, no modules).
//! The command line carries `boot_method=vmedia` and, after `--`, arguments for init
//! (`run --floppy-label <MARKER> ...`): the agent logs the label it looks for, finds no such
//! floppy and powers the machine off. The marker on the console thus proves that the kernel ran
//! with our command line, that the initramfs from the ISO was the one unpacked, and that the
//! whole command line reached init. Each firmware gets its own marker.
//!
//! Also, under OVMF with Secure Boot on and Microsoft's keys: the ISO the conductor builds for a
//! `secure_boot:true` netboot node (`boot_iso::build_iso` with the loaders directory
//! `vmdeploy-image-build loaders --signed-loaders` writes): shim, Debian's signed GRUB and the
//! Debian kernel boot it, and the kernel says Secure Boot is on.
//!
//! Needs QEMU and OVMF (scripts/setup), the static agent, the debug `vmdeploy-image-build` and
//! the loaders' Debian packages (see iso_xorriso.rs).

use std::path::{Path, PathBuf};
use std::time::Duration;

use vmdeploy_conductor::boot::vmedia::boot_iso::{build_iso, LoadersDir};
use vmdeploy_integration_tests::bin;
use vmdeploy_integration_tests::qemu::{self, Qemu};
use vmdeploy_shared::iso::loaders::LoaderSources;

/// TCG on two busy cores: generous (docs/architecture.md §11 says 120–180 s).
const BOOT_LIMIT: Duration = Duration::from_secs(180);

struct Booted {
    dir: tempfile::TempDir,
    iso: PathBuf,
}

/// The ISO for `marker`, built from the Debian kernel and an agent-only initramfs.
fn boot_iso(marker: &str) -> Booted {
    let kernel = qemu::kernel();
    let agent = qemu::musl_agent();
    let dir = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let initrd = dir.path().join("initrd.cpio.gz");
    qemu::build_initramfs(&agent, &kernel, &[], &initrd);
    let iso = dir.path().join("boot.iso");
    let out = std::process::Command::new(bin("vmdeploy-image-build"))
        .arg("boot-iso")
        .arg("--kernel")
        .arg(&kernel.vmlinuz)
        .arg("--ramdisk")
        .arg(&initrd)
        .arg("--cmdline")
        .arg(cmdline(marker))
        .arg("-o")
        .arg(&iso)
        .output()
        .expect("running vmdeploy-image-build boot-iso");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "boot-iso failed: {said}");
    eprintln!("{said}");
    Booted { dir, iso }
}

fn cmdline(marker: &str) -> String {
    format!(
        "boot_method=vmedia panic=-1 -- run --floppy-label {marker} --floppy-wait-secs 0 \
         --fail-timeout-secs 0"
    )
}

fn expect_line(qemu: &mut Qemu, what: &str, pred: impl Fn(&str) -> bool) -> qemu::ConsoleLine {
    match qemu.wait_for(BOOT_LIMIT, pred) {
        Some(l) => l,
        None => {
            qemu.dump();
            panic!("{what}: not on the console within {BOOT_LIMIT:?}");
        }
    }
}

/// Boots `args`, checks the console for the marker and a clean power-off; returns the console.
fn boot_and_check(args: &[String], log: &Path, marker: &str) -> String {
    let mut vm = Qemu::start(args, log);
    let full = format!("console=tty0 console=ttyS0,115200 {}", cmdline(marker));
    expect_line(&mut vm, "the kernel with our command line", |l| {
        l.contains("Kernel command line:") && l.contains(&full)
    });
    let seen = expect_line(&mut vm, "the agent from the ISO's initramfs", |l| {
        l.contains("looking for the virtual floppy") && l.contains(&format!("label={marker}"))
    });
    eprintln!("marker after {:.1} s", seen.at.as_secs_f64());
    // With no such floppy and a zero fail timeout the agent powers off: QEMU exits by itself.
    if vm.wait_exit(BOOT_LIMIT).is_none() {
        vm.dump();
        panic!("QEMU did not exit after the agent gave up");
    }
    let console = vm.console_text();
    assert!(console.contains("reboot: Power down"), "{console}");
    console
}

fn seabios_args(iso: &Path, memory_mib: u32) -> Vec<String> {
    let memory = memory_mib.to_string();
    [
        "-machine",
        "pc",
        // Qemu::start passes -m 512; a later -m wins.
        "-m",
        &memory,
        "-nic",
        "none",
        "-cdrom",
        iso.to_str().expect("UTF-8 path"),
        "-boot",
        "d",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// SeaBIOS boots the ISO through isolinux in the smallest machine the agent must work in (the
/// emulator's 256 MiB): the BIOS path has no boot loader heap to run out of, and a larger
/// machine boots the same way, so one boot covers both. (UEFI at 256 MiB does not boot: GRUB
/// 2.06's `linux` runs out of memory, as docs/qemu-and-boot.md §6 found with Debian's GRUB.)
#[test]
fn seabios_boots_the_iso_through_isolinux_in_256_mib() {
    let marker = "ISOBIOS256";
    let b = boot_iso(marker);
    let args = seabios_args(&b.iso, 256);
    let console = boot_and_check(&args, &b.dir.path().join("serial.log"), marker);
    assert!(
        console.contains("ISOLINUX 6."),
        "not booted by isolinux:\n{console}"
    );
}

#[test]
fn ovmf_boots_the_iso_through_grub() {
    let marker = "ISOUEFIMARK";
    let b = boot_iso(marker);
    let mut args = qemu::ovmf_q35_args(b.dir.path());
    args.extend(
        [
            "-nic",
            "none",
            "-cdrom",
            b.iso.to_str().expect("UTF-8 path"),
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let console = boot_and_check(&args, &b.dir.path().join("serial.log"), marker);
    assert!(
        console.contains("Welcome to GRUB!"),
        "not booted by GRUB:\n{console}"
    );
    assert!(
        !console.contains("ISOLINUX"),
        "isolinux ran under UEFI:\n{console}"
    );
    // efi_gop is in the GRUB image: no video complaint, and Linux got the frame buffer.
    for bad in ["error: no suitable video mode", "error: out of memory"] {
        assert!(!console.contains(bad), "GRUB said {bad:?}:\n{console}");
    }
    assert!(console.contains("efifb: probing for efifb"), "{console}");
}

/// The conductor's boot ISO for a Secure Boot node boots under OVMF's Secure Boot firmware
/// with Microsoft's keys: only a signed chain gets to the kernel (shim by Microsoft's key,
/// GRUB and the kernel by Debian's), and the kernel reports Secure Boot on.
#[test]
fn ovmf_secure_boot_boots_the_conductors_signed_boot_iso() {
    let marker = "ISOSECBOOT";
    let kernel = qemu::kernel();
    let dir = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let initrd = dir.path().join("initrd.cpio.gz");
    qemu::build_initramfs(&qemu::musl_agent(), &kernel, &[], &initrd);
    let loaders = dir.path().join("boot-loaders");
    let out = std::process::Command::new(bin("vmdeploy-image-build"))
        .arg("loaders")
        .arg("--signed-loaders")
        .arg(vmdeploy_integration_tests::deploy_iso::signed_loaders())
        .arg("-o")
        .arg(&loaders)
        .output()
        .expect("running vmdeploy-image-build loaders");
    assert!(
        out.status.success(),
        "loaders --signed-loaders failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let iso = dir.path().join("secure-boot.iso");
    let loaders = LoadersDir::new(loaders, LoaderSources::default());
    let summary = build_iso(
        &loaders,
        &kernel.vmlinuz,
        &initrd,
        &cmdline(marker),
        true,
        &iso,
    )
    .unwrap_or_else(|e| panic!("the conductor's Secure Boot ISO: {e:#}"));
    eprintln!("Secure Boot boot ISO: {} bytes", summary.iso_bytes);
    let mut args = qemu::ovmf_secure_boot_q35_args(dir.path());
    args.extend(
        ["-nic", "none", "-cdrom", iso.to_str().expect("UTF-8 path")]
            .iter()
            .map(|s| s.to_string()),
    );
    let console = boot_and_check(&args, &dir.path().join("serial.log"), marker);
    assert!(
        console.contains("secureboot: Secure boot enabled"),
        "the kernel did not boot under Secure Boot:\n{console}"
    );
}
