//! `vmdeploy-image-build`: builds the images a deploy needs.
//!
//! The virtual floppy with the deploy parameters (`floppy`), the deploy ramdisk with the agent
//! as /init (`initramfs`, see [`initramfs`]), the deploy ISO (`deploy-iso`), an instance boot
//! ISO (`boot-iso`), the boot loaders the conductor builds boot ISOs with (`loaders`), and the
//! test OS the end-to-end deploys install (`test-image`, see [`test_image`]).
//!
//! Exit codes ([`vmdeploy_shared::exit`]): 0 on success, 64 for bad usage or a bad input
//! (arguments, a parameters file that does not parse), 1 for a failure while building.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use vmdeploy_shared::exit::{self, UsageError};
use vmdeploy_shared::{fat, params::Params};

mod boot_iso;
mod coverage;
mod deploy_iso;
mod driver_pack;
mod initramfs;
mod kernel_deb;
mod kmod;
mod loaders;
mod module_strip;
mod secure_boot;
mod test_image;
mod tool;

#[derive(Parser)]
#[command(
    name = "vmdeploy-image-build",
    version,
    about = "Builds vmdeploy images"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the parameter floppy (FAT12, label ir-vfd-dev) from a parameters.txt or KEY=VALUE pairs.
    Floppy {
        /// A parameters.txt to put on the floppy (checked before it is written).
        #[arg(long, conflicts_with = "param")]
        params: Option<PathBuf>,
        /// A KEY=VALUE pair; repeat for more.
        #[arg(long)]
        param: Vec<String>,
        /// Output image file.
        #[arg(long, short)]
        out: PathBuf,
    },
    /// Build the deploy ramdisk (gzipped cpio newc): the agent as /init, /dev/console, kernel
    /// modules in dependency order (from modules.dep) and /etc/vmdeploy/modules.
    Initramfs {
        /// The agent binary (static musl release build).
        #[arg(long)]
        agent: PathBuf,
        /// An unpacked kernel's `lib/modules/<release>` directory with a `modules.dep`
        /// (`dpkg-deb -x linux-image-*.deb ROOT && depmod -b ROOT <release>`).
        #[arg(long)]
        modules_dir: Option<PathBuf>,
        /// A module to include, optionally with parameters (`"usb-storage delay_use=0"`);
        /// its dependencies are added. Repeat for more.
        #[arg(long = "module")]
        modules: Vec<String>,
        /// Output file (.cpio.gz).
        #[arg(long, short)]
        out: PathBuf,
    },
    /// Build the deploy ISO (BIOS + UEFI): a Debian kernel, the agent as /init and the modules
    /// it needs, volume id VMEDIA_BOOT_ISO.
    DeployIso(deploy_iso::DeployIsoArgs),
    /// Print which HP/HPE network and storage adapters (the pci.ids subsystems of vendors 103c
    /// and 1590 that a driver of the kernel drives) the deploy ISO's modules and firmware serve.
    Coverage(coverage::CoverageArgs),
    /// Build an instance boot ISO (BIOS + UEFI) from a kernel, a ramdisk and a command line.
    BootIso(boot_iso::BootIsoArgs),
    /// Write the boot loaders the conductor builds instance boot ISOs with (isolinux.bin,
    /// ldlinux.c32 and a GRUB EFI binary made by grub-mkimage) into the conductor's
    /// `[deploy] boot_loaders_dir` (default `<state dir>/boot-loaders`).
    Loaders {
        /// Output directory (created when missing).
        #[arg(long, short)]
        out: PathBuf,
        /// Also write Debian's signed shim and CD GRUB, for nodes that boot under UEFI Secure
        /// Boot: a root holding them at their installed paths (`/` with `shim-signed` and
        /// `grub-efi-amd64-signed` installed; scripts/setup unpacks them into
        /// `.cache/secure-boot/root`).
        #[arg(long)]
        signed_loaders: Option<PathBuf>,
    },
    /// Build the test OS (whole-disk raw + qcow2 with GRUB for BIOS and UEFI, a partition
    /// image, its kernel and ramdisk, manifest.json) into a directory; skipped when the
    /// directory already holds a build of the same inputs.
    TestImage(test_image::TestImageArgs),
    /// Write the EFI system partition image (FAT, our GRUB at \EFI\BOOT\BOOTX64.EFI) that a
    /// conductor building its own UEFI ISOs embeds: upstream Ironic's `[conductor] bootloader`,
    /// with `grub_config_path = boot/grub/grub.cfg` (GRUB finds the ISO by its volume id
    /// VMEDIA_BOOT_ISO, which Ironic's ISOs carry).
    Esp {
        /// Output file.
        #[arg(long, short)]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // `--help` and `--version` exit 0; usage errors 64 (clap would exit 2).
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(exit::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("vmdeploy-image-build: {err:#}");
            ExitCode::from(exit::code_for(err.chain()))
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::DeployIso(args) => deploy_iso::run(args),
        Command::Coverage(args) => coverage::run(args),
        Command::BootIso(args) => boot_iso::run(args),
        Command::TestImage(args) => test_image::run(args),
        Command::Esp { out } => {
            let grub_efi =
                loaders::build_grub_efi(std::path::Path::new(loaders::GRUB_EFI_MODULE_DIR))?;
            let image =
                vmdeploy_shared::iso::efi_system_image(&grub_efi, boot_iso::source_date_epoch()?)
                    .context("building the EFI system partition image")?;
            std::fs::write(&out, &image).with_context(|| format!("writing {}", out.display()))?;
            eprintln!("wrote {} ({} bytes)", out.display(), image.len());
            Ok(())
        }
        Command::Loaders {
            out,
            signed_loaders,
        } => {
            let loaders = loaders::system_loaders().context("finding the boot loaders")?;
            let signed = secure_boot::SignedLoaders::read_if_given(signed_loaders.as_deref())?;
            let mut written = loaders::write_dir(&loaders, &out)
                .with_context(|| format!("writing the boot loaders to {}", out.display()))?;
            if let Some(signed) = &signed {
                written.extend(loaders::write_signed(signed, &out).with_context(|| {
                    format!("writing the signed boot loaders to {}", out.display())
                })?);
            }
            for path in &written {
                let len = std::fs::metadata(path).map_or(0, |m| m.len());
                eprintln!("wrote {} ({len} bytes)", path.display());
            }
            Ok(())
        }
        Command::Initramfs {
            agent,
            modules_dir,
            modules,
            out,
        } => {
            let modules = modules
                .iter()
                .map(|m| initramfs::ModuleRequest::parse(m))
                .collect::<anyhow::Result<Vec<_>>>()
                .map_err(UsageError::wrap)?;
            let summary = initramfs::build(
                &initramfs::InitramfsSpec {
                    agent,
                    modules_dir,
                    modules,
                    // The pxe_ilo ramdisk: partition images are written by the conductor there.
                    local_boot_grub: None,
                },
                &out,
            )
            .with_context(|| format!("building the ramdisk {}", out.display()))?;
            eprint!(
                "wrote {} ({} bytes, {} modules)\n{}",
                out.display(),
                summary.bytes,
                summary.module_count,
                summary.module_list
            );
            Ok(())
        }
        Command::Floppy { params, param, out } => {
            let params = floppy_params(params, &param).map_err(UsageError::wrap)?;
            let text = params.render().context("rendering parameters.txt")?;
            let image =
                fat::build_floppy(fat::FLOPPY_LABEL, &[("parameters.txt", text.as_bytes())])
                    .context("building the floppy image")?;
            std::fs::write(&out, &image).with_context(|| format!("writing {}", out.display()))?;
            eprintln!(
                "wrote {} ({} bytes, label {}, {} parameters)",
                out.display(),
                image.len(),
                fat::FLOPPY_LABEL,
                params.len()
            );
            Ok(())
        }
    }
}

/// The floppy's parameters from `--params FILE` or `--param KEY=VALUE`s: all operator input, so
/// every error here is a usage error.
fn floppy_params(file: Option<PathBuf>, pairs: &[String]) -> anyhow::Result<Params> {
    if let Some(path) = file {
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        return Params::parse(&bytes).with_context(|| format!("checking {}", path.display()));
    }
    let mut params = Params::new();
    for pair in pairs {
        let (key, value) = pair
            .split_once('=')
            .with_context(|| format!("expected KEY=VALUE, found {pair:?}"))?;
        params
            .set(key, value)
            .with_context(|| format!("adding {key:?}"))?;
    }
    Ok(params)
}
