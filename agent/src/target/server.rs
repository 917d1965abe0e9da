//! Starting and stopping the target ([`Target::start`], the one start-up the CLI, the iSCSI
//! deploy flow and the `iscsi` API extension share), its accept loop, and the state every
//! connection shares.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use vmdeploy_shared::iscsi::ChapCredentials;

use super::backend::{BlockBackend, BufferPool};
use super::commands::{Identity, Lun};

/// What a target serves, and where.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// Target name (`iqn.…` or Ironic's `iqn-<uuid>`); checked by [`Target::start`].
    pub iqn: String,
    /// Block device or file served as LUN 1.
    pub disk: PathBuf,
    /// Address to listen on.
    pub listen: SocketAddr,
    /// CHAP credentials, when CHAP is required.
    pub chap: Option<ChapCredentials>,
    /// Buffered I/O even where O_DIRECT works.
    pub buffered: bool,
}

/// A running target: listening and serving its LUN until [`Target::stop`].
#[derive(Debug)]
pub struct Target {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Target {
    /// Checks the name, opens the disk, listens, and serves in a task of the current runtime.
    pub async fn start(config: TargetConfig) -> anyhow::Result<Target> {
        Target::start_with(config, |_| Ok(())).await
    }

    /// [`Target::start`], running `prepare` on the opened disk (on the blocking pool) before
    /// the port is bound: no initiator sees the disk before it is done.
    pub async fn start_with(
        config: TargetConfig,
        prepare: impl FnOnce(&BlockBackend) -> anyhow::Result<()> + Send + 'static,
    ) -> anyhow::Result<Target> {
        let TargetConfig {
            iqn,
            disk,
            listen,
            chap,
            buffered,
        } = config;
        vmdeploy_shared::iqn::validate(&iqn)
            .with_context(|| format!("checking target name {iqn:?}"))?;
        let path = disk.clone();
        let backend = tokio::task::spawn_blocking(move || -> anyhow::Result<BlockBackend> {
            let backend = BlockBackend::open(&path, buffered)?;
            prepare(&backend).with_context(|| format!("preparing {}", path.display()))?;
            Ok(backend)
        })
        .await
        .context("joining the disk's opening")??;
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening for iSCSI on {listen}"))?;
        let addr = listener
            .local_addr()
            .context("reading the iSCSI listener's address")?;
        let lun = Lun::new(Arc::new(backend), Identity::derive(&iqn, &disk));
        let shared = Arc::new(TargetShared::new(iqn, chap, lun));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, shared, async move {
            // A dropped sender stops the target too.
            let _ = stopped.await;
        }));
        Ok(Target { addr, stop, task })
    }

    /// The address the target listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, drops every connection, waits for the commands in flight and flushes
    /// the disk.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await.context("the target task failed")?
    }
}

/// Upper bound of SCSI command jobs running at once, over all connections; shutdown takes all
/// permits to wait for the jobs in flight before the final flush.
pub const MAX_INFLIGHT: u32 = 256;

/// What every connection of the target shares.
#[derive(Debug)]
pub struct TargetShared {
    /// The target name initiators log in to.
    pub iqn: String,
    /// CHAP credentials, when CHAP is required.
    pub chap: Option<ChapCredentials>,
    /// LUN 1.
    pub lun: Lun,
    /// Permits for command jobs.
    pub inflight: Arc<Semaphore>,
    /// Write buffers reused from command to command.
    pub buffers: BufferPool,
    tsih: AtomicU16,
}

impl TargetShared {
    /// State for a target named `iqn` serving `lun`.
    pub fn new(iqn: String, chap: Option<ChapCredentials>, lun: Lun) -> Self {
        Self {
            iqn,
            chap,
            lun,
            inflight: Arc::new(Semaphore::new(MAX_INFLIGHT as usize)),
            buffers: BufferPool::new(),
            tsih: AtomicU16::new(1),
        }
    }

    /// A fresh TSIH (never 0, RFC 7143 §11.12.6).
    pub fn next_tsih(&self) -> u16 {
        loop {
            let t = self.tsih.fetch_add(1, Ordering::Relaxed);
            if t != 0 {
                return t;
            }
        }
    }
}

/// Accepts connections on `listener` until `stop` resolves; then drops every connection, waits
/// for the command jobs in flight and flushes the disk.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<TargetShared>,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut connections = JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => {
                let (stream, peer): (_, SocketAddr) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and friends: keep serving the connections that exist.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                tracing::info!(%peer, "connection accepted");
                connections.spawn(super::connection::serve(stream, peer, shared.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    tracing::info!("stopping the target");
    drop(listener);
    connections.shutdown().await;
    // Every running job holds a permit: taking them all waits for the last write.
    let _all = shared
        .inflight
        .acquire_many(MAX_INFLIGHT)
        .await
        .context("waiting for commands in flight")?;
    shared.inflight.close();
    let backend = shared.lun.backend().clone();
    tokio::task::spawn_blocking(move || backend.sync())
        .await
        .context("joining the final flush")?
        .context("flushing the disk (fdatasync)")?;
    tracing::info!("disk flushed; target stopped");
    Ok(())
}
