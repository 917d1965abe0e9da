//! `vmdeploy-agent iscsi-target`.

use std::path::PathBuf;

/// Arguments of `vmdeploy-agent iscsi-target`.
#[derive(clap::Args, Debug)]
pub struct IscsiTargetArgs {
    /// Block device or file to serve as LUN 1.
    #[arg(long)]
    pub disk: PathBuf,
    /// Target name (`iqn.…` or Ironic's `iqn-<uuid>`).
    #[arg(long)]
    pub iqn: String,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:3260")]
    pub listen: String,
    /// Require CHAP with these credentials (`USER:SECRET`).
    #[arg(long)]
    pub chap: Option<String>,
}

/// Runs the target in the foreground.
pub fn run(args: IscsiTargetArgs) -> anyhow::Result<()> {
    anyhow::bail!("iscsi-target is not built yet (disk {})", args.disk.display())
}
