//! The target's accept loop and the state every connection shares.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use vmdeploy_shared::iscsi::ChapCredentials;

use super::backend::BufferPool;
use super::commands::Lun;

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
