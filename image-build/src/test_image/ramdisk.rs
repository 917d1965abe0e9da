//! The test OS ramdisk: Debian's static busybox, a shell `/init` ([`INIT_SCRIPT`], the file
//! `init.sh` beside this one) and the modules a root disk and ext4 need, in the module list
//! format of the deploy ramdisk (`crate::initramfs`), gzipped.
//!
//! # Why busybox and a shell script
//! The init only loads a few modules, waits for a UUID, mounts, reads one file and prints one
//! line: 60 lines of shell an operator can read on the console's terms. A Rust init would be a
//! second static musl program that has to be built (and found) before this command can run;
//! busybox-static is one Debian package of a fixed version, read from the system like the boot
//! loaders, so `test-image` needs no build step of its own.
//!
//! # Layout
//! ```text
//! init, dev/console, proc/ sys/ ...    crate::initramfs::write_cpio (init = INIT_SCRIPT)
//! etc/vmdeploy/modules, lib/modules/   the modules in load order (crate::initramfs)
//! bin/busybox                          a second archive; /init installs the applet links
//! ```

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use flate2::write::GzEncoder;
use vmdeploy_shared::cpio::CpioWriter;

use crate::initramfs::{self, InitramfsSpec, ModuleRequest};
use crate::kernel_deb::KernelPackage;

/// `/init`, with `@MARKER_TEXT@` replaced by [`super::MARKER_TEXT`] when written.
pub const INIT_SCRIPT: &str = include_str!("init.sh");

/// The modules the test OS loads (their dependencies are added from modules.dep): the disks the
/// QEMU nodes have (virtio-blk on the emulator's machines, tests/ilo-emulator/src/qemu/
/// machine.rs; AHCI and PIIX SATA/IDE disks and the MegaRAID node's logical drive as sdX), and
/// ext4 with the crc32c it asks the crypto API for (there is no modprobe in the ramdisk to load
/// it on demand).
pub const TEST_OS_MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_blk",
    "ahci",
    "ata_piix",
    "megaraid_sas",
    "sd_mod",
    "crc32c_generic",
    "ext4",
];

/// The built ramdisk.
pub struct Ramdisk {
    /// The gzipped archives.
    pub bytes: Vec<u8>,
    /// Modules in it.
    pub module_count: usize,
}

/// [`TEST_OS_MODULES`] plus `extra`.
pub fn module_requests(extra: &[String]) -> anyhow::Result<Vec<ModuleRequest>> {
    let mut requests = Vec::new();
    for spec in TEST_OS_MODULES
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
    {
        requests.push(ModuleRequest::parse(spec)?);
    }
    Ok(requests)
}

/// The init script as stored.
pub fn init_script() -> String {
    INIT_SCRIPT.replace("@MARKER_TEXT@", super::MARKER_TEXT)
}

/// Builds the ramdisk; `scratch` holds the init script file while the archive is written.
pub fn build(
    kernel: &KernelPackage,
    modules: &[ModuleRequest],
    busybox: &Path,
    scratch: &Path,
    keep_signatures: bool,
) -> anyhow::Result<Ramdisk> {
    let init = scratch.join("init");
    std::fs::write(&init, init_script()).with_context(|| format!("writing {}", init.display()))?;
    let spec = InitramfsSpec {
        agent: init,
        modules_dir: Some(kernel.modules_dir.clone()),
        modules: modules.to_vec(),
        local_boot_grub: None,
    };
    let plan = initramfs::plan_modules(&spec).context("choosing the modules")?;
    // Under Secure Boot the kernel refuses a module without its signature, which objcopy drops.
    if !keep_signatures {
        crate::module_strip::strip_modules(&plan).context("stripping the modules")?;
    }

    // Level 9 and mtime 0 (flate2's default header): the same bytes every time.
    let gz = GzEncoder::new(Vec::new(), flate2::Compression::best());
    let gz = initramfs::write_cpio(gz, &spec, &plan).context("writing the init archive")?;
    let bytes = std::fs::read(busybox).with_context(|| {
        format!(
            "reading {} (apt-get install busybox-static)",
            busybox.display()
        )
    })?;
    anyhow::ensure!(
        bytes.starts_with(b"\x7fELF"),
        "{} is no ELF program",
        busybox.display()
    );
    let mut cpio = CpioWriter::new(gz);
    cpio.dir("bin", 0o755).context("adding bin")?;
    cpio.file("bin/busybox", 0o755, &bytes)
        .context("adding bin/busybox")?;
    let mut gz = cpio.finish().context("finishing the busybox archive")?;
    gz.flush().context("flushing the ramdisk")?;
    let bytes = gz.finish().context("finishing the gzip stream")?;
    Ok(Ramdisk {
        bytes,
        module_count: plan.files.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_checks_the_marker_text_and_prints_both_lines() {
        let s = init_script();
        assert!(s.starts_with("#!/bin/busybox sh\n"));
        assert!(!s.contains('@'), "a placeholder is left: {s}");
        assert!(s.contains(&format!("= \"{}\" ]", super::super::MARKER_TEXT)));
        assert!(s.contains(&format!(
            "printf '\\n%s\\n' \"{}$root_uuid\" > /dev/console",
            super::super::MARKER_PREFIX
        )));
        assert!(s.contains("VMDEPLOY-TEST-OS failed: "));
        assert!(s.contains("vmdeploy_test_os.poweroff=1"));
    }

    #[test]
    fn extra_modules_follow_the_defaults() {
        let r = module_requests(&["nvme".into()]).expect("requests");
        assert_eq!(r.len(), TEST_OS_MODULES.len() + 1);
        assert_eq!(r.last().map(|m| m.name.as_str()), Some("nvme"));
        assert!(module_requests(&[" ".into()]).is_err());
    }
}
