//! `vmdeploy-image-build deploy-iso`: the deploy ISO (SKELETON).

use std::path::PathBuf;

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
    /// Also write the initramfs alone to this file.
    #[arg(long)]
    pub initramfs_out: Option<PathBuf>,
    /// Output ISO.
    #[arg(long, short)]
    pub out: PathBuf,
}

/// Builds the ISO.
pub fn run(args: DeployIsoArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("deploy-iso is not built yet (skeleton)")
}
