//! `vmdeploy-image-build boot-iso`: the instance boot ISO for `iscsi_ilo` netboot, BIOS and
//! UEFI, written by the same `vmdeploy_shared::iso` code the conductor calls at run time.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use vmdeploy_shared::exit::UsageError;
use vmdeploy_shared::iso::{self, BootIsoSpec};

use crate::loaders;

/// Arguments of `boot-iso`.
#[derive(Debug, clap::Args)]
pub struct BootIsoArgs {
    /// The instance's kernel.
    #[arg(long)]
    pub kernel: PathBuf,
    /// The instance's initramfs.
    #[arg(long)]
    pub ramdisk: PathBuf,
    /// The kernel command line (`root=UUID=...`).
    #[arg(long)]
    pub cmdline: String,
    /// Output ISO.
    #[arg(long, short)]
    pub out: PathBuf,
}

/// Builds the ISO.
pub fn run(args: BootIsoArgs) -> anyhow::Result<()> {
    // Bad operator input first, before any tool runs.
    iso::full_cmdline(&args.cmdline)
        .context("checking --cmdline")
        .map_err(UsageError::wrap)?;
    let epoch = source_date_epoch().map_err(UsageError::wrap)?;
    let kernel = read_input(&args.kernel, "--kernel")?;
    let initramfs = read_input(&args.ramdisk, "--ramdisk")?;
    let loaders = loaders::system_loaders().context("finding the boot loaders")?;
    let spec = BootIsoSpec {
        kernel: &kernel,
        initramfs: &initramfs,
        cmdline: &args.cmdline,
        loaders: &loaders,
    };
    let summary = write_iso(&spec, epoch, &args.out)?;
    eprintln!(
        "wrote {} ({} bytes, volume {}): kernel {} B, initramfs {} B, EFI image {} B (GRUB {} B), \
         isolinux {} B + ldlinux.c32 {} B",
        args.out.display(),
        summary.iso_bytes,
        iso::BOOT_VOLUME_ID,
        kernel.len(),
        initramfs.len(),
        summary.efi_image_bytes,
        loaders.grub_efi.len(),
        loaders.isolinux_bin.len(),
        loaders.ldlinux_c32.len(),
    );
    Ok(())
}

/// Writes the ISO beside `out` and renames it into place, so a failed build never leaves a
/// half-written ISO under the final name.
pub fn write_iso(
    spec: &BootIsoSpec<'_>,
    epoch: u64,
    out: &Path,
) -> anyhow::Result<iso::IsoSummary> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    let (mut file, summary) = match iso::write_boot_iso_at(spec, epoch, tmp) {
        Ok(done) => done,
        // A kernel that is no bzImage, an empty ramdisk, a bad command line: the operator's
        // input (exit 64), not a failure of the build.
        Err(err @ iso::IsoError::Invalid(_)) => return Err(UsageError::wrap(err).into()),
        Err(err) => {
            return Err(err).with_context(|| format!("writing the ISO {}", out.display()));
        }
    };
    file.flush().context("flushing the ISO")?;
    file.persist(out)
        .with_context(|| format!("moving the ISO to {}", out.display()))?;
    Ok(summary)
}

fn read_input(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("reading {what} {}", path.display()))
        .map_err(UsageError::wrap)?;
    Ok(bytes)
}

/// `SOURCE_DATE_EPOCH` (reproducible-builds.org) if set, else the fixed default: never the clock.
pub fn source_date_epoch() -> anyhow::Result<u64> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds")),
        Err(std::env::VarError::NotPresent) => Ok(iso::DEFAULT_EPOCH),
        Err(err) => Err(err).context("reading SOURCE_DATE_EPOCH"),
    }
}
