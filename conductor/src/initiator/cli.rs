//! `vmdeploy-conductor iscsi`.

/// Arguments of `vmdeploy-conductor iscsi`.
#[derive(clap::Args, Debug)]
pub struct IscsiArgs {
    /// Target portal, `ADDR:PORT`.
    #[arg(long, global = true)]
    pub portal: Option<String>,
}

/// Runs an iSCSI operator command.
pub fn run(_args: IscsiArgs) -> anyhow::Result<()> {
    anyhow::bail!("the iSCSI initiator is not built yet")
}
