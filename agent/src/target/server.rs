//! Starting and stopping the target ([`Target::start`], the one start-up the CLI, the iSCSI
//! deploy flow and the `iscsi` API extension share), its accept loop, and the state every
//! connection shares.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use vmdeploy_shared::iscsi::ChapCredentials;

use super::backend::{BlockBackend, BufferPool};
use super::budget::{WriteBudget, DEFAULT_WRITE_BUDGET};
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
    shared: Arc<TargetShared>,
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
        let task = tokio::spawn(serve(listener, shared.clone(), async move {
            // A dropped sender stops the target too.
            let _ = stopped.await;
        }));
        Ok(Target {
            addr,
            shared,
            stop,
            task,
        })
    }

    /// The address the target listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Bytes reserved for write buffers right now, over all sessions (at most the budget).
    pub fn buffered_write_bytes(&self) -> usize {
        self.shared.budget.buffered()
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

/// TCP connections served at once, logins in progress included. A deploy needs one (two
/// while a lost connection is replaced, one more for a discovery); more are closed as soon as
/// they are accepted, so a flood of connections costs neither memory nor descriptors, and a
/// connection that never finishes its login gives its place back after the login timeout.
pub const MAX_CONNECTIONS: usize = 16;

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
    /// What write buffers may take, shared out to the sessions.
    pub budget: WriteBudget,
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
            budget: WriteBudget::new(DEFAULT_WRITE_BUDGET),
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
    let places = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let refused = AtomicU64::new(0);
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
                let Ok(place) = places.clone().try_acquire_owned() else {
                    // Logged at 1, 2, 4, 8... refusals: a flood must not flood the log too.
                    let n = refused.fetch_add(1, Ordering::Relaxed) + 1;
                    if n.is_power_of_two() {
                        tracing::warn!(%peer, refused = n, "{MAX_CONNECTIONS} connections open; closing a new one");
                    }
                    drop(stream);
                    continue;
                };
                tracing::info!(%peer, "connection accepted");
                let shared = shared.clone();
                connections.spawn(async move {
                    super::connection::serve(stream, peer, shared).await;
                    drop(place);
                });
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use vmdeploy_shared::iscsi::pdu::{padded_len, segment_lengths};
    use vmdeploy_shared::iscsi::{
        scsi, Bhs, Digests, LoginRequest, LoginStage, Lun as WireLun, Pdu, ScsiCommand, TextKeys,
        BHS_LEN,
    };

    use super::*;
    use crate::target::budget::{MAX_SESSIONS, SESSION_WRITE_QUOTA};

    const IQN: &str = "iqn.2026-11.test.vmdeploy:budget";

    async fn start(dir: &tempfile::TempDir) -> Target {
        let disk = dir.path().join("lun.img");
        std::fs::File::create(&disk)
            .and_then(|f| f.set_len(64 << 20))
            .expect("backing file");
        Target::start(TargetConfig {
            iqn: IQN.into(),
            disk,
            listen: "127.0.0.1:0".parse().expect("address"),
            chap: None,
            buffered: true,
        })
        .await
        .expect("target starts")
    }

    async fn send(s: &mut TcpStream, pdu: Pdu) -> std::io::Result<()> {
        let wire = pdu.encode(Digests::NONE).expect("encodes");
        s.write_all(&wire).await
    }

    async fn recv(s: &mut TcpStream) -> Option<Pdu> {
        let mut head = [0u8; BHS_LEN];
        s.read_exact(&mut head).await.ok()?;
        let (ahs, data) = segment_lengths(&head);
        let mut all = head.to_vec();
        all.resize(BHS_LEN + ahs + padded_len(data), 0);
        s.read_exact(&mut all[BHS_LEN..]).await.ok()?;
        Pdu::decode(&all, Digests::NONE, 1 << 24)
            .ok()
            .map(|(p, _)| p)
    }

    /// A normal session with 16 MiB unsolicited bursts; `None` if the login is refused.
    async fn log_in(addr: SocketAddr) -> Option<TcpStream> {
        let mut s = TcpStream::connect(addr).await.expect("connects");
        let mut keys = TextKeys::new();
        keys.push("InitiatorName", "iqn.2026-11.test.vmdeploy:client");
        keys.push("TargetName", IQN);
        keys.push("AuthMethod", "None");
        keys.push("InitialR2T", "No");
        keys.push("FirstBurstLength", "16777215");
        keys.push("MaxBurstLength", "16777215");
        let req = LoginRequest {
            transit: true,
            continue_: false,
            current_stage: LoginStage::Security,
            next_stage: LoginStage::FullFeature,
            version_max: 0,
            version_min: 0,
            isid: [0x80, 0, 0, 0, 0, 2],
            tsih: 0,
            itt: 1,
            cid: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
        };
        send(&mut s, Pdu::with_data(req, keys.encode()))
            .await
            .ok()?;
        match recv(&mut s).await?.bhs {
            Bhs::LoginResponse(r) if r.status.is_success() && r.transit => Some(s),
            _ => None,
        }
    }

    /// Announces a WRITE of `len` bytes with `CmdSN` `cmd_sn`, sends its first 4 KiB and stalls.
    async fn stall_write(s: &mut TcpStream, cmd_sn: u32, len: u32) -> std::io::Result<()> {
        let cmd = ScsiCommand {
            write: true,
            lun: WireLun::from_number(1),
            itt: 0x100 + cmd_sn,
            expected_data_len: len,
            cmd_sn,
            cdb: scsi::build::write_16(0, len / 512, false),
            ..Default::default()
        };
        send(s, Pdu::with_data(cmd, vec![0xee; 4096])).await
    }

    /// Waits until the connection is closed by the target (true) or 10 s pass (false).
    async fn closed(s: &mut TcpStream) -> bool {
        let mut buf = [0u8; 512];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
                Err(_) => return false,
            }
        }
    }

    async fn settle(target: &Target, want: impl Fn(usize) -> bool) -> usize {
        for _ in 0..200 {
            let n = target.buffered_write_bytes();
            if want(n) {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        target.buffered_write_bytes()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn target_write_buffers_stay_in_the_budget_and_return_when_connections_close() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = start(&dir).await;
        let addr = target.local_addr();
        let mut sessions = Vec::new();
        for _ in 0..MAX_SESSIONS {
            sessions.push(log_in(addr).await.expect("a session within the budget"));
        }
        assert!(
            log_in(addr).await.is_none(),
            "a session beyond the budget was admitted"
        );
        // Each session announces a 32 MiB write and stalls: all of it is reserved.
        for s in &mut sessions {
            stall_write(s, 1, 32 << 20).await.expect("sends");
        }
        let held = settle(&target, |n| n == MAX_SESSIONS * (32 << 20)).await;
        assert_eq!(held, MAX_SESSIONS * (32 << 20));
        assert!(held <= MAX_SESSIONS * SESSION_WRITE_QUOTA);
        // A second one cannot fit next to the first, whose data would have to come after it
        // on the same connection: the connection is dropped, not left waiting forever.
        stall_write(&mut sessions[0], 2, 32 << 20)
            .await
            .expect("sends");
        assert!(
            closed(&mut sessions[0]).await,
            "the over-quota session stayed"
        );
        let left = settle(&target, |n| n == (MAX_SESSIONS - 1) * (32 << 20)).await;
        assert_eq!(
            left,
            (MAX_SESSIONS - 1) * (32 << 20),
            "its buffer is returned"
        );
        // Its share is back: a new session logs in and writes.
        let mut fresh = log_in(addr)
            .await
            .expect("the dropped session's share is free");
        let data = vec![0x5a; 8192];
        let cmd = ScsiCommand {
            final_: true,
            write: true,
            lun: WireLun::from_number(1),
            itt: 7,
            expected_data_len: data.len() as u32,
            cmd_sn: 1,
            cdb: scsi::build::write_16(8, 16, false),
            ..Default::default()
        };
        send(&mut fresh, Pdu::with_data(cmd, data))
            .await
            .expect("sends");
        let answer = recv(&mut fresh).await.expect("an answer");
        assert!(
            matches!(answer.bhs, Bhs::ScsiResponse(ref r) if r.status == 0 && r.itt == 7),
            "{answer:?}"
        );
        drop(sessions);
        drop(fresh);
        assert_eq!(
            settle(&target, |n| n == 0).await,
            0,
            "buffers held after close"
        );
        target.stop().await.expect("stops");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn target_closes_connections_beyond_its_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = start(&dir).await;
        let addr = target.local_addr();
        let mut session = log_in(addr).await.expect("a session");
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS - 1 {
            idle.push(TcpStream::connect(addr).await.expect("connects"));
        }
        let mut extra = TcpStream::connect(addr).await.expect("connects");
        assert!(
            closed(&mut extra).await,
            "a connection beyond the limit was kept"
        );
        // The session still works.
        let tur = ScsiCommand {
            final_: true,
            lun: WireLun::from_number(1),
            itt: 3,
            cmd_sn: 1,
            cdb: scsi::build::test_unit_ready(),
            ..Default::default()
        };
        send(&mut session, Pdu::new(tur)).await.expect("sends");
        let answer = recv(&mut session).await.expect("an answer");
        assert!(
            matches!(answer.bhs, Bhs::ScsiResponse(ref r) if r.status == 0),
            "{answer:?}"
        );
        drop(idle);
        target.stop().await.expect("stops");
    }
}
