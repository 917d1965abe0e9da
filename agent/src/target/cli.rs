//! `vmdeploy-agent iscsi-target`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use vmdeploy_shared::exit::UsageError;
use vmdeploy_shared::iscsi::ChapCredentials;

use super::server::{Target, TargetConfig};

/// The port of the "done" notification (docs/ironic-protocols.md §2.4).
pub const DONE_PORT: u16 = 10000;

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
    pub listen: SocketAddr,
    /// Require CHAP with these credentials (`USER:SECRET`).
    #[arg(long)]
    pub chap: Option<ChapCredentials>,
    /// Address of the "done" listener (default: the --listen IP, port 10000).
    #[arg(long)]
    pub done_listen: Option<SocketAddr>,
    /// Use buffered I/O even where O_DIRECT works.
    #[arg(long)]
    pub buffered: bool,
}

/// Runs the target in the foreground until SIGTERM/SIGINT or a "done" notification, then flushes
/// the disk and returns.
pub fn run(args: IscsiTargetArgs) -> anyhow::Result<()> {
    // clap parsed the addresses and the credentials (a bad one is a usage error, exit 64); the
    // name is checked here, before anything is opened, for the same reason.
    let listen = args.listen;
    let done_listen = args
        .done_listen
        .unwrap_or_else(|| SocketAddr::new(listen.ip(), DONE_PORT));
    vmdeploy_shared::iqn::validate(&args.iqn)
        .map_err(UsageError::wrap)
        .with_context(|| format!("checking --iqn {:?}", args.iqn))?;
    let config = TargetConfig {
        iqn: args.iqn,
        disk: args.disk,
        listen,
        chap: args.chap,
        buffered: args.buffered,
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let done = tokio::net::TcpListener::bind(done_listen)
            .await
            .with_context(|| format!("listening for done on {done_listen}"))?;
        let iqn = config.iqn.clone();
        let target = Target::start(config).await?;
        tracing::info!(%listen, %done_listen, %iqn, "iSCSI target ready");
        wait_for_stop(done).await;
        target.stop().await
    })?;
    // Command jobs have all finished (Target::stop waited for them); do not wait on anything
    // else still parked in the blocking pool.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    Ok(())
}

/// Returns on a "done" notification, SIGTERM or SIGINT.
async fn wait_for_stop(done: tokio::net::TcpListener) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch SIGTERM");
            return;
        }
    };
    tokio::select! {
        r = super::done::wait_for_done(done) => {
            if let Err(e) = r {
                tracing::error!(error = %format!("{e:#}"), "done listener failed; stopping");
            }
        }
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
