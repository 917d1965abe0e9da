//! `vmdeploy-image-build deploy-iso`: the deploy ISO an iLO attaches as a virtual CD.
//!
//! # What goes in
//! ```text
//! kernel      boot/vmlinuz-<release> from a Debian linux-image .deb      (crate::kernel_deb)
//! initramfs   two cpio newc archives, each its own xz stream (CRC32): the agent as /init
//!             and the GRUB EFI binary it installs for partition images' UEFI local boot
//!             (x86 BCJ filter), then etc/vmdeploy/modules (the list the agent loads) and
//!             the modules of DEFAULT_MODULES + --module with their dependencies from
//!             modules.dep                                                 (crate::initramfs)
//! cmdline     boot_method=vmedia [--append ...]; the ISO writer puts the consoles first
//! loaders     isolinux (BIOS) and GRUB (UEFI) from the system            (crate::loaders)
//! DRIVERS/    the driver pack: every other network and storage module, their firmware and
//!             the index the agent matches devices against            (crate::driver_pack)
//! ```
//! The ISO itself comes from `vmdeploy_shared::iso::write_boot_iso_with` (docs/architecture.md
//! §10–11), is at most [`MAX_ISO_BYTES`] with at most [`MAX_BOOT_BYTES`] in the files every boot
//! reads, and is written through `OUT.partial` and a rename, so a failed build never leaves half
//! an ISO under the real name.
//!
//! `--kernel-out` writes the kernel alone, byte for byte the ISO's; `--initramfs-out` the ISO's
//! initramfs followed by a third, uncompressed archive holding the driver pack under
//! `usr/lib/vmdeploy/drivers/` (its files are xz already): `pxe_ilo` network boots the two (its
//! `pxe_deploy_kernel` and `pxe_deploy_ramdisk`), and a network boot has no CD to load drivers
//! from. They change nothing in the ISO.
//!
//! # Limitations
//! The agent loads every listed initramfs module in order, without checking for the hardware
//! first: a driver for absent hardware costs its load time only. `floppy`, which probes for a
//! controller for about 3 s on machines that have none (docs/qemu-and-boot.md §9), is therefore
//! in the pack, loaded only where ACPI lists a floppy controller.

use std::collections::BTreeSet;
use std::io::Cursor;
use std::path::{Path, PathBuf};

use anyhow::Context;
use vmdeploy_shared::driver_pack;
use vmdeploy_shared::exit::UsageError;
use vmdeploy_shared::iso::{self, BootIsoSpec, BootLoaders, ExtraFile};

use crate::initramfs::{self, InitramfsSpec, ModuleRequest};
use crate::kernel_deb::KernelPackage;

/// Largest deploy ISO accepted: the boot files and the driver pack (issue 29's budget).
pub const MAX_ISO_BYTES: u64 = 64 << 20;

/// Largest sum of the files every boot reads whole (kernel, initramfs, loaders): iLO virtual
/// media reads over the network, slowly, so these stay small and everything else sits in the
/// driver pack, read only on a node that has the device.
pub const MAX_BOOT_BYTES: u64 = 12 << 20;

/// [`MAX_BOOT_BYTES`] for Secure Boot media: Debian's signed shim and monolithic GRUB are about
/// 4.3 MB more than our own 0.6 MB GRUB, and the modules keep their signatures and symbols.
pub const MAX_SECURE_BOOT_BYTES: u64 = 17 << 20;

/// The kernel command line the agent needs: it reads its parameters from the virtual floppy
/// only when told it booted from virtual media (agent/src/floppy).
pub const BASE_CMDLINE: &str = "boot_method=vmedia";

/// The modules of the initramfs (their dependencies are added from modules.dep), in the order
/// the agent loads them: what it needs to find and read the virtual CD and the floppy, nothing
/// else. Every other driver is in the driver pack on the CD ([`crate::driver_pack`]), loaded by
/// the agent when a device present matches it. `--module` adds more or replaces one's
/// parameters.
pub const DEFAULT_MODULES: &[&str] = &[
    // USB: iLO presents its virtual CD and floppy as USB mass storage (xHCI on Gen9 and later,
    // EHCI before). delay_use=0: usb-storage would wait 1 s per device before the floppy shows.
    "xhci_pci",
    "ehci_pci",
    "usb-storage delay_use=0",
    // The USB floppy (and key) is a SCSI disk, the USB CD a SCSI CD-ROM (sr_mod, with cdrom).
    "sd_mod",
    "sr_mod",
    // The emulator's legacy layout puts the CD on the q35 machine's AHCI controller.
    "ahci",
    // Not `floppy`: the legacy floppy drive's driver probes for about 3 s on a machine without
    // one, so it is in the pack, loaded when ACPI shows a floppy controller (PNP0700).
    // The agent mounts configfs at /sys/kernel/config (agent/src/init/mounts.rs).
    "configfs",
];

/// Arguments of `deploy-iso`.
#[derive(Debug, clap::Args)]
pub struct DeployIsoArgs {
    /// The static musl agent, stored as /init.
    #[arg(long)]
    pub agent: PathBuf,
    /// A Debian linux-image-*.deb (scripts/setup downloads one into .cache/kernel).
    #[arg(long)]
    pub kernel_deb: PathBuf,
    /// An extra module (with optional parameters, `"usb-storage delay_use=0"`); repeat for more.
    #[arg(long = "module")]
    pub modules: Vec<String>,
    /// Extra kernel command-line arguments (appended after `boot_method=vmedia`).
    #[arg(long)]
    pub append: Option<String>,
    /// A `lib/firmware` tree (Debian's firmware packages unpacked): the firmware files the
    /// pack's modules name are taken from it. Without it the pack carries no firmware.
    #[arg(long)]
    pub firmware_dir: Option<PathBuf>,
    /// Boot under UEFI Secure Boot: a root holding Debian's signed shim and GRUB at their
    /// installed paths (`/` with `shim-signed` and `grub-efi-amd64-signed` installed;
    /// scripts/setup unpacks them into `.cache/secure-boot/root`). The UEFI entry is then shim
    /// and signed GRUB, the kernel must be signed and the modules keep their signatures
    /// ([`crate::secure_boot`]); the boot files may take [`MAX_SECURE_BOOT_BYTES`].
    #[arg(long)]
    pub signed_loaders: Option<PathBuf>,
    /// Also write the ramdisk for a network boot to this file (pxe_ilo's `pxe_deploy_ramdisk`):
    /// the ISO's initramfs with the driver pack inside, since no CD is attached then.
    #[arg(long)]
    pub initramfs_out: Option<PathBuf>,
    /// Also write the kernel alone to this file, byte for byte the ISO's (pxe_ilo's
    /// `pxe_deploy_kernel`).
    #[arg(long)]
    pub kernel_out: Option<PathBuf>,
    /// Output ISO.
    #[arg(long, short)]
    pub out: PathBuf,
}

/// The default modules with `extra` added; an extra naming a default module replaces its
/// parameters.
pub fn module_requests(extra: &[String]) -> anyhow::Result<Vec<ModuleRequest>> {
    let mut requests = DEFAULT_MODULES
        .iter()
        .map(|m| ModuleRequest::parse(m))
        .collect::<anyhow::Result<Vec<_>>>()
        .context("parsing DEFAULT_MODULES")?;
    for spec in extra {
        let req = ModuleRequest::parse(spec)?;
        let canon = req.name.replace('-', "_");
        match requests
            .iter_mut()
            .find(|r| r.name.replace('-', "_") == canon)
        {
            Some(existing) => *existing = req,
            None => requests.push(req),
        }
    }
    Ok(requests)
}

/// The kernel command line of the ISO.
pub fn cmdline(append: Option<&str>) -> String {
    match append.map(str::trim).filter(|a| !a.is_empty()) {
        Some(extra) => format!("{BASE_CMDLINE} {extra}"),
        None => BASE_CMDLINE.to_owned(),
    }
}

/// Builds the ISO.
pub fn run(args: DeployIsoArgs) -> anyhow::Result<()> {
    let requests = module_requests(&args.modules).map_err(UsageError::wrap)?;
    // Inputs that are not there are bad arguments (exit 64), not build failures.
    for (what, path) in [("agent", &args.agent), ("kernel package", &args.kernel_deb)] {
        if !path.is_file() {
            return Err(
                UsageError::wrap(format!("the {what} {} does not exist", path.display())).into(),
            );
        }
    }
    let cmdline = cmdline(args.append.as_deref());
    let agent_bytes = std::fs::metadata(&args.agent)
        .with_context(|| format!("reading the agent {}", args.agent.display()))?
        .len();
    let kernel_pkg = KernelPackage::unpack(&args.kernel_deb)?;
    let kernel = std::fs::read(&kernel_pkg.vmlinuz)
        .with_context(|| format!("reading {}", kernel_pkg.vmlinuz.display()))?;

    let local_boot_grub =
        crate::loaders::build_local_boot_grub(Path::new(crate::loaders::GRUB_EFI_MODULE_DIR))
            .context("building the GRUB for partition images' local boot")?;
    let spec = InitramfsSpec {
        agent: args.agent.clone(),
        modules_dir: Some(kernel_pkg.modules_dir.clone()),
        modules: requests,
        local_boot_grub: Some(local_boot_grub),
    };
    let plan = initramfs::plan_modules(&spec).context("choosing the modules")?;
    let signed = crate::secure_boot::SignedLoaders::read_if_given(args.signed_loaders.as_deref())?;
    if signed.is_some() {
        crate::secure_boot::require_signed_kernel(&kernel_pkg.vmlinuz)?;
        require_signed_modules(&plan)?;
    } else {
        crate::module_strip::strip_modules(&plan).context("stripping the modules")?;
    }
    let module_bytes = plan.bytes()?;
    let (ramdisk, cpio_len) = initramfs::xz_ramdisk(&spec, &plan).context("writing the ramdisk")?;

    let mut loaders = crate::loaders::system_loaders().context("getting the boot loaders")?;
    if let Some(signed) = &signed {
        loaders.grub_efi.clone_from(&signed.grub_cd);
        loaders.shim = Some(signed.shim.clone());
    }
    let max_boot_bytes = if signed.is_some() {
        MAX_SECURE_BOOT_BYTES
    } else {
        MAX_BOOT_BYTES
    };
    let mut report = Report {
        release: &kernel_pkg.release,
        kernel: kernel.len() as u64,
        agent: &args.agent,
        agent_bytes,
        module_count: plan.files.len(),
        module_bytes,
        cpio: cpio_len,
        ramdisk: ramdisk.len() as u64,
        loaders: &loaders,
        pack: None,
        cmdline: &cmdline,
        iso: None,
        max_boot_bytes,
    };
    // What every boot reads is known now: refuse before the driver pack's minute of xz.
    if report.boot_bytes() > max_boot_bytes {
        eprint!("{}", report.render());
        anyhow::bail!(
            "the kernel, initramfs and loaders would be {} bytes, over the {max_boot_bytes}-byte \
             budget of what every boot reads (MAX_BOOT_BYTES, MAX_SECURE_BOOT_BYTES): drop \
             initramfs modules",
            report.boot_bytes()
        );
    }

    let kernel_drivers =
        crate::coverage::KernelDrivers::read(&kernel_pkg.modules_dir, &kernel_pkg.release)?;
    let in_initramfs: BTreeSet<String> = plan
        .files
        .iter()
        .filter_map(|(path, _)| crate::kmod::module_name(path))
        .collect();
    let pack =
        crate::driver_pack::build(&kernel_drivers, &in_initramfs, args.firmware_dir.as_deref())
            .context("building the driver pack")?;
    let pack_paths: Vec<[&str; 2]> = std::iter::once(driver_pack::INDEX_NAME)
        .chain(pack.files.iter().map(|(name, _)| name.as_str()))
        .map(|name| [driver_pack::DIR, name])
        .collect();
    let extra: Vec<ExtraFile<'_>> = std::iter::once(pack.index.as_bytes())
        .chain(pack.files.iter().map(|(_, data)| data.as_slice()))
        .zip(&pack_paths)
        .map(|(data, path)| ExtraFile { path, data })
        .collect();

    let (cursor, _) = iso::write_boot_iso_with(
        &BootIsoSpec {
            kernel: &kernel,
            initramfs: &ramdisk,
            cmdline: &cmdline,
            loaders: &loaders,
        },
        &extra,
        iso::DEFAULT_EPOCH,
        Cursor::new(Vec::new()),
    )
    .context("writing the ISO")?;
    let image = cursor.into_inner();

    report.pack = Some(&pack);
    report.iso = Some(image.len() as u64);
    eprint!("{}", report.render());
    anyhow::ensure!(
        image.len() as u64 <= MAX_ISO_BYTES,
        "the ISO would be {} bytes, over the {MAX_ISO_BYTES}-byte budget (MAX_ISO_BYTES)",
        image.len()
    );
    if let Some(path) = &args.initramfs_out {
        let mut netboot = ramdisk.clone();
        netboot.extend(pack_archive(&pack).context("archiving the driver pack")?);
        write_file(path, &netboot)?;
        eprintln!(
            "wrote {} ({} bytes, the driver pack inside)",
            path.display(),
            netboot.len()
        );
    }
    if let Some(path) = &args.kernel_out {
        write_file(path, &kernel)?;
        eprintln!("wrote {} ({} bytes)", path.display(), kernel.len());
    }
    write_file(&args.out, &image)?;
    eprintln!(
        "wrote {} ({} bytes)\nmodule list:\n{}",
        args.out.display(),
        image.len(),
        plan.list
    );
    if !pack.missing_firmware.is_empty() {
        eprintln!(
            "firmware the pack's modules name that the firmware tree lacks: {}",
            pack.missing_firmware.len()
        );
    }
    Ok(())
}

/// Refuses a Secure Boot build whose initramfs modules lack their signatures: under lockdown
/// the kernel would refuse to load them, and the node would not find its CD.
fn require_signed_modules(plan: &initramfs::ModulePlan) -> anyhow::Result<()> {
    for (path, host) in &plan.files {
        let module = std::fs::read(host).with_context(|| format!("reading {}", host.display()))?;
        anyhow::ensure!(
            crate::secure_boot::module_is_signed(&module),
            "the module {path} carries no signature: a Secure Boot kernel would refuse it (the \
             kernel package's modules are signed; was it rebuilt or stripped?)"
        );
    }
    Ok(())
}

/// The driver pack as an uncompressed cpio archive under [`driver_pack::INITRAMFS_DIR`], to
/// follow the xz archives of a network-boot ramdisk (the kernel unpacks each in turn).
fn pack_archive(pack: &crate::driver_pack::BuiltPack) -> anyhow::Result<Vec<u8>> {
    let mut cpio = vmdeploy_shared::cpio::CpioWriter::new(Vec::new());
    let dir = driver_pack::INITRAMFS_DIR;
    let mut at = String::new();
    for part in dir.split('/') {
        if !at.is_empty() {
            at.push('/');
        }
        at.push_str(part);
        cpio.dir(&at, 0o755)
            .with_context(|| format!("adding {at}"))?;
    }
    cpio.file(
        &format!("{dir}/{}", driver_pack::INDEX_NAME),
        0o644,
        pack.index.as_bytes(),
    )
    .context("adding the index")?;
    for (name, data) in &pack.files {
        cpio.file(&format!("{dir}/{name}"), 0o644, data)
            .with_context(|| format!("adding {name}"))?;
    }
    cpio.finish().context("finishing the driver pack's archive")
}

fn write_file(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    initramfs::write_via_partial(path, |mut file| {
        use std::io::Write as _;
        file.write_all(bytes)
            .with_context(|| format!("writing {}", path.display()))?;
        file.sync_all()
            .with_context(|| format!("syncing {}", path.display()))
    })
}

/// What went into the ISO, for the operator.
struct Report<'a> {
    release: &'a str,
    kernel: u64,
    agent: &'a Path,
    agent_bytes: u64,
    module_count: usize,
    module_bytes: u64,
    cpio: u64,
    ramdisk: u64,
    loaders: &'a BootLoaders,
    /// `None` until the driver pack is built (a refusal on the boot budget comes first).
    pack: Option<&'a crate::driver_pack::BuiltPack>,
    cmdline: &'a str,
    /// `None` until the ISO is written.
    iso: Option<u64>,
    max_boot_bytes: u64,
}

impl Report<'_> {
    fn loader_bytes(&self) -> u64 {
        let l = self.loaders;
        (l.isolinux_bin.len() + l.ldlinux_c32.len() + l.grub_efi.len()) as u64
            + l.shim.as_ref().map_or(0, |shim| shim.len() as u64)
    }

    /// What a boot reads whole: the kernel, the initramfs and the larger of the loaders' sets.
    fn boot_bytes(&self) -> u64 {
        self.kernel + self.ramdisk + self.loader_bytes()
    }

    /// The parts, one per line; the driver pack's and the ISO's once they exist.
    fn render(&self) -> String {
        let l = self.loaders;
        let loaders = self.loader_bytes();
        let mut out = format!(
            "deploy ISO parts:\n\
             \x20 kernel     {:>10} bytes  vmlinuz-{}\n\
             \x20 agent      {:>10} bytes  {} (as /init, uncompressed)\n\
             \x20 modules    {:>10} bytes  {} modules (uncompressed, {})\n\
             \x20 initramfs  {:>10} bytes  xz ({} bytes uncompressed, {:.0}%)\n\
             \x20 loaders    {:>10} bytes  isolinux.bin {}, ldlinux.c32 {}, GRUB EFI {}{}\n\
             \x20 boot files {:>10} bytes  {:.2} MiB of {:.0} MiB (what every boot reads)\n",
            self.kernel,
            self.release,
            self.agent_bytes,
            self.agent.display(),
            self.module_bytes,
            self.module_count,
            if l.shim.is_some() {
                "signed, as packaged"
            } else {
                "stripped"
            },
            self.ramdisk,
            self.cpio,
            100.0 * self.ramdisk as f64 / self.cpio.max(1) as f64,
            loaders,
            l.isolinux_bin.len(),
            l.ldlinux_c32.len(),
            l.grub_efi.len(),
            l.shim.as_ref().map_or(String::new(), |shim| format!(
                " (Debian's signed gcdx64), shim {} (Secure Boot)",
                shim.len()
            )),
            self.boot_bytes(),
            self.boot_bytes() as f64 / f64::from(1 << 20),
            self.max_boot_bytes as f64 / f64::from(1 << 20),
        );
        if let Some(pack) = self.pack {
            out.push_str(&format!(
                "  drivers    {:>10} bytes  {} modules, {} firmware files ({} bytes uncompressed)\n",
                pack.bytes(),
                pack.modules,
                pack.firmware,
                pack.raw_bytes,
            ));
        }
        if let Some(iso) = self.iso {
            out.push_str(&format!(
                "  ISO        {:>10} bytes  {:.2} MiB of {:.0} MiB\n",
                iso,
                iso as f64 / f64::from(1 << 20),
                MAX_ISO_BYTES as f64 / f64::from(1 << 20),
            ));
        }
        out.push_str(&format!("  cmdline    {}\n", self.cmdline));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_modules_add_or_replace_parameters() {
        let reqs = module_requests(&["usb_storage quirks=1".into(), "mlx5_core".into()])
            .expect("requests");
        assert_eq!(reqs.len(), DEFAULT_MODULES.len() + 1);
        let usb = reqs
            .iter()
            .find(|r| r.name == "usb_storage")
            .expect("usb-storage replaced in place");
        assert_eq!(usb.params, "quirks=1");
        assert!(!reqs.iter().any(|r| r.name == "usb-storage"));
        assert_eq!(reqs.last().map(|r| r.name.as_str()), Some("mlx5_core"));
        assert!(module_requests(&["  ".into()]).is_err());
    }

    #[test]
    fn cmdline_starts_with_boot_method() {
        assert_eq!(cmdline(None), "boot_method=vmedia");
        assert_eq!(cmdline(Some("  ")), "boot_method=vmedia");
        assert_eq!(
            cmdline(Some("panic=-1 BOOTIF=01-aa")),
            "boot_method=vmedia panic=-1 BOOTIF=01-aa"
        );
    }

    #[test]
    fn xz_ramdisk_decodes_with_crc32_check() {
        use std::io::Read as _;
        let data: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let xz = initramfs::compress_xz(&data, true).expect("compress");
        assert!(xz.len() < data.len() / 4, "{} bytes", xz.len());
        // Stream flags (bytes 6-7): check type 0x01 = CRC32, which the kernel supports.
        assert_eq!(&xz[..6], b"\xfd7zXZ\0");
        assert_eq!(xz[7], 0x01);
        let mut back = Vec::new();
        lzma_rust2::XzReader::new(&xz[..], false)
            .read_to_end(&mut back)
            .expect("decode");
        assert!(back == data);
    }
}
