//! `vmdeploy-image-build boot-iso`: the instance boot ISO for `iscsi_ilo` netboot (SKELETON).

use std::path::PathBuf;

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
    let _ = args;
    anyhow::bail!("boot-iso is not built yet (skeleton)")
}
