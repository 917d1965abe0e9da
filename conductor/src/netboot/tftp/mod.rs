//! The read-only TFTP server of the network boot service: RFC 1350 with the option extension
//! (RFC 2347) and the blksize, tsize and timeout options (RFC 2348, RFC 2349). The wire codec
//! is `vmdeploy_shared::tftp`.
//!
//! # Design
//! - The main socket only reads requests. Each read request gets its own task and its own
//!   ephemeral UDP socket, the server's transfer ID (RFC 1350 §4), on the main socket's address;
//!   refusals (missing file, path outside the root) are sent from that socket too, as a
//!   transfer's first packet. See `transfer.rs` for the lock-step transfer itself.
//! - Write requests get ERROR 2: the server is read-only. Other packets on the main socket get
//!   ERROR 4, except ERRORs, which are never answered; every malformed packet is logged at
//!   debug and the server keeps serving.
//! - Every name is confined to the root ([`crate::netboot::path`]). Modes octet and netascii (LF → CR LF,
//!   CR → CR NUL on the way out); mail is refused.
//! - A read request for the file a transfer from the same client port is still sending is
//!   dropped: it is the client retransmitting its request because our first packet is late, and
//!   the running transfer answers it. (A request for another file from that port is served:
//!   tftp-hpa fetches one file after the other from one port, and the finished transfer may not
//!   be reaped yet.)
//! - At most `max_transfers` transfers run, at most [`MAX_TRANSFERS_PER_CLIENT`] of them from
//!   one IP address. A transfer the client has not acknowledged yet (half-open) gives way to a
//!   new request when a limit is reached, oldest first, as a SYN cache does; an acknowledged one
//!   keeps its slot, and a request finding no half-open transfer to replace is dropped, so the
//!   client's own retransmission of its request is the retry (an error would end a PXE ROM's
//!   boot attempt for good). Forged requests, which nobody acknowledges, therefore cannot keep
//!   real clients out; see `slots.rs`. Turned-away requests are counted and logged at warn at
//!   most once per [`TURNAWAY_LOG_INTERVAL`], so a flood cannot flood the log; the lines
//!   each request writes (started, done, refused) have a budget per interval too
//!   (`request_log.rs`).
//! - How long a transfer nobody answers holds its slot is bounded by the server: a `timeout`
//!   option above `max_timeout_secs` is declined (left out of the OACK, RFC 2349), and a
//!   half-open transfer retransmits at the server's timeout whatever the client asked (see
//!   `transfer.rs`), so it gives up after `max_retries` + 1 server timeouts.
//! - At shutdown the running transfers are aborted: TFTP clients retry, and a boot in progress
//!   cannot finish across a conductor restart anyway.
//!
//! # Limitations
//! - Bound to a wildcard address on a multi-homed host, a transfer's replies leave from the
//!   address the routing table picks, which may not be the one the client asked; PXE ROMs
//!   check it. Bind the server to the address the DHCP server announces as next-server.
//! - No windowsize (RFC 7440) or multicast (RFC 2090): lock-step only.
//! - A flood of forged requests fast enough to fill every slot within a real client's round
//!   trip (`max_transfers` requests between our first packet and its ACK) still evicts that
//!   client's transfer before it is acknowledged; the client's retransmitted request then
//!   competes again. Rate limiting belongs in front of the server (firewall).

mod request_log;
mod slots;
mod source;
mod transfer;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use tokio::net::UdpSocket;
use tokio::task::{AbortHandle, JoinSet};
use vmdeploy_shared::tftp::{parse, ErrorCode, Opcode, Packet};

use self::request_log::RequestLog;
use self::slots::{Admission, Slots};
use self::transfer::{error_packet, ReadRequest};
use vmdeploy_shared::error::Chain;

/// Default largest block size: 1500-byte Ethernet MTU − 20 (IPv4) − 8 (UDP) − 4 (TFTP header),
/// so a DATA packet is never IP-fragmented; some PXE ROMs cannot reassemble fragments, and a
/// lost fragment costs the whole block.
pub const DEFAULT_MAX_BLKSIZE: u16 = 1468;
/// Default retransmission timeout when the client does not ask for one (RFC 2349 `timeout`).
pub const DEFAULT_RETRANSMIT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default longest retransmission timeout granted to a client's `timeout` option; a longer one
/// is declined. PXE ROMs and boot loaders ask for a few seconds if at all (curl asks 6 by
/// default and does without), while a never-acknowledged transfer at 255 s would hold its slot
/// for 25 minutes.
pub const DEFAULT_MAX_TIMEOUT_SECS: u8 = 5;
/// Default retransmissions of one packet before a transfer is given up.
pub const DEFAULT_MAX_RETRIES: u32 = 5;
/// Default number of transfers at once: a rack of servers PXE-booting together, each fetching
/// a boot loader, a kernel and a ramdisk one after the other.
pub const DEFAULT_MAX_TRANSFERS: usize = 64;
/// Transfers at once from one IP address. A PXE client fetches its files one after the other,
/// so it rarely runs more than two (the next file while the finished transfer is reaped); 8
/// leaves room for a few boot loaders behind one address while one host, or one forged
/// address, holds at most an eighth of the default slots.
pub const MAX_TRANSFERS_PER_CLIENT: usize = 8;
/// At most one warning per interval about turned-away requests, with the counts since the last.
pub const TURNAWAY_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Receive buffer of the main socket: the largest UDP payload, so no request is cut.
const MAIN_RECEIVE_BUFFER: usize = 65_536;

/// The server's configuration.
#[derive(Debug, Clone)]
pub struct TftpConfig {
    /// The directory served; every request is confined to it.
    pub root: PathBuf,
    /// The largest block size granted to a `blksize` request.
    pub max_blksize: u16,
    /// Retransmission timeout unless the client asks for one with `timeout`, and while a
    /// transfer is half-open.
    pub retransmit_timeout: Duration,
    /// The longest `timeout` option granted, in seconds; a longer one is declined.
    pub max_timeout_secs: u8,
    /// Retransmissions of one packet before the transfer is given up.
    pub max_retries: u32,
    /// Transfers at once; beyond, a request replaces the oldest half-open transfer or is
    /// dropped (the client retries).
    pub max_transfers: usize,
}

impl TftpConfig {
    /// The default settings for serving `root`.
    pub fn new(root: impl Into<PathBuf>) -> TftpConfig {
        TftpConfig {
            root: root.into(),
            max_blksize: DEFAULT_MAX_BLKSIZE,
            retransmit_timeout: DEFAULT_RETRANSMIT_TIMEOUT,
            max_timeout_secs: DEFAULT_MAX_TIMEOUT_SECS,
            max_retries: DEFAULT_MAX_RETRIES,
            max_transfers: DEFAULT_MAX_TRANSFERS,
        }
    }
}

/// What every transfer needs from the server.
struct Settings {
    /// The canonical root.
    root: PathBuf,
    /// The main socket's address: transfer sockets bind to it.
    local_ip: IpAddr,
    max_blksize: u16,
    retransmit_timeout: Duration,
    max_timeout_secs: u8,
    max_retries: u32,
    /// The budget of per-request log lines (`request_log.rs`).
    request_log: RequestLog,
}

/// A bound TFTP server.
pub struct TftpServer {
    socket: UdpSocket,
    local_addr: SocketAddr,
    settings: Arc<Settings>,
    max_transfers: usize,
}

impl TftpServer {
    /// Checks the root and binds the main socket.
    pub async fn bind(addr: SocketAddr, config: TftpConfig) -> anyhow::Result<TftpServer> {
        let root = config
            .root
            .canonicalize()
            .with_context(|| format!("resolving the TFTP root {}", config.root.display()))?;
        ensure!(
            root.is_dir(),
            "the TFTP root {} is not a directory",
            root.display()
        );
        ensure!(
            config.max_transfers > 0,
            "the TFTP server needs max_transfers of at least 1"
        );
        let socket = UdpSocket::bind(addr)
            .await
            .with_context(|| format!("binding the TFTP server to {addr}"))?;
        let local_addr = socket
            .local_addr()
            .context("reading the TFTP server's address")?;
        Ok(TftpServer {
            socket,
            local_addr,
            settings: Arc::new(Settings {
                root,
                local_ip: local_addr.ip(),
                max_blksize: config.max_blksize,
                retransmit_timeout: config.retransmit_timeout,
                max_timeout_secs: config.max_timeout_secs,
                max_retries: config.max_retries,
                request_log: RequestLog::new(TURNAWAY_LOG_INTERVAL),
            }),
            max_transfers: config.max_transfers,
        })
    }

    /// The address the main socket listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` resolves; each transfer on its own ephemeral UDP socket (a new
    /// TID, as RFC 1350 says) in its own task. Running transfers are aborted at shutdown.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        tracing::info!(address = %self.local_addr, root = %self.settings.root.display(),
            max_blksize = self.settings.max_blksize, "tftp: serving");
        let mut transfers = JoinSet::new();
        let mut slots: Slots<tokio::task::Id, AbortHandle> =
            Slots::new(self.max_transfers, MAX_TRANSFERS_PER_CLIENT);
        let mut turnaways = Turnaways::default();
        let mut summary = tokio::time::interval(TURNAWAY_LOG_INTERVAL);
        summary.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut buf = vec![0u8; MAIN_RECEIVE_BUFFER];
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(done) = transfers.join_next_with_id(), if !transfers.is_empty() => {
                    let id = match done {
                        Ok((id, ())) => id,
                        // Evicted (module docs): its slot was freed then.
                        Err(err) if err.is_cancelled() => err.id(),
                        Err(err) => {
                            tracing::error!(error = %Chain(&err), "tftp: a transfer task failed");
                            err.id()
                        }
                    };
                    slots.remove(id);
                }
                _ = summary.tick() => {
                    turnaways.log(&slots, self.max_transfers);
                    let left_out = self.settings.request_log.take_left_out();
                    if left_out > 0 {
                        tracing::warn!(left_out, running = slots.len(),
                            "tftp: per-request log lines left out (a burst of requests)");
                    }
                }
                received = self.socket.recv_from(&mut buf) => {
                    let (len, client) = match received {
                        Ok(received) => received,
                        Err(err) => {
                            // Not fatal (e.g. an ICMP error reported late); pause so a
                            // persistent error cannot spin the loop.
                            tracing::warn!(error = %Chain(&err), "tftp: receiving on the main socket");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let Some(request) = self.answer(&buf[..len], client).await else {
                        continue;
                    };
                    match slots.admit(client, &request.filename) {
                        Admission::Duplicate => {
                            tracing::debug!(%client, "tftp: repeated request of a running transfer dropped");
                        }
                        Admission::Busy { per_client } => {
                            tracing::debug!(%client, file = %request.filename, per_client,
                                "tftp: no transfer slot; request dropped (the client retries)");
                            turnaways.dropped(per_client, client);
                            turnaways.log(&slots, self.max_transfers);
                        }
                        Admission::Admit { evicted } => {
                            if let Some(evicted) = evicted {
                                tracing::debug!(%client, "tftp: a half-open transfer gives way");
                                evicted.abort();
                                turnaways.evicted(client);
                                turnaways.log(&slots, self.max_transfers);
                            }
                            let filename = request.filename.clone();
                            let acknowledged = Arc::new(AtomicBool::new(false));
                            let span = tracing::info_span!("tftp", %client);
                            let handle = transfers.spawn(tracing::Instrument::instrument(
                                transfer::serve(
                                    request,
                                    Arc::clone(&self.settings),
                                    Arc::clone(&acknowledged),
                                ),
                                span,
                            ));
                            slots.insert(handle.id(), client, filename, acknowledged, handle);
                        }
                    }
                }
            }
        }
        turnaways.flush(&slots, self.max_transfers);
        if !transfers.is_empty() {
            tracing::info!(
                running = transfers.len(),
                "tftp: shutting down, aborting running transfers"
            );
        }
        transfers.shutdown().await;
        tracing::info!(address = %self.local_addr, "tftp: stopped");
        Ok(())
    }

    /// Handles one datagram on the main socket: a read request is returned to be served, and
    /// anything else is answered (or dropped) here.
    async fn answer(&self, datagram: &[u8], client: SocketAddr) -> Option<ReadRequest> {
        let reply = match parse(datagram) {
            Ok(Packet::Rrq {
                filename,
                mode,
                options,
            }) => {
                return Some(ReadRequest {
                    client,
                    filename,
                    mode,
                    options,
                })
            }
            Ok(Packet::Wrq { filename, .. }) => {
                if self.settings.request_log.admit() {
                    tracing::info!(%client, file = %filename, "tftp: write request refused");
                }
                error_packet(ErrorCode::AccessViolation, "read-only server")
            }
            // Never answer an error (RFC 1350 §7): two servers could bounce errors forever.
            Ok(Packet::Error { code, message }) => {
                tracing::debug!(%client, %code, %message, "tftp: ERROR on the main socket ignored");
                return None;
            }
            Ok(other) => {
                tracing::debug!(%client, opcode = ?other.opcode(), "tftp: not a request");
                error_packet(ErrorCode::IllegalOperation, "not a request")
            }
            Err(err) => {
                tracing::debug!(%client, error = %Chain(&err), len = datagram.len(),
                    "tftp: malformed packet");
                if datagram.get(..2) == Some(&(Opcode::Error as u16).to_be_bytes()[..]) {
                    return None;
                }
                error_packet(ErrorCode::IllegalOperation, &err.to_string())
            }
        };
        if let Err(err) = self.socket.send_to(&reply, client).await {
            tracing::debug!(%client, error = %Chain(&err), "tftp: sending an error");
        }
        None
    }
}

/// Requests turned away since the last warning: a line per request would let a flood flood
/// the log, so the counts are summarised at most once per [`TURNAWAY_LOG_INTERVAL`].
#[derive(Default)]
struct Turnaways {
    /// Half-open transfers aborted for a new request.
    evicted: u64,
    /// Requests dropped: every slot held an acknowledged transfer.
    dropped_full: u64,
    /// Requests dropped: the client's address was at its cap with acknowledged transfers.
    dropped_per_client: u64,
    /// The client of the latest turned-away request, as a hint where a flood comes from.
    last_client: Option<SocketAddr>,
    last_logged: Option<tokio::time::Instant>,
}

impl Turnaways {
    fn evicted(&mut self, client: SocketAddr) {
        self.evicted += 1;
        self.last_client = Some(client);
    }

    fn dropped(&mut self, per_client: bool, client: SocketAddr) {
        if per_client {
            self.dropped_per_client += 1;
        } else {
            self.dropped_full += 1;
        }
        self.last_client = Some(client);
    }

    /// Warns with the counts when there are any and the last warning is an interval old.
    fn log<K: Copy + Eq + std::hash::Hash, H>(&mut self, slots: &Slots<K, H>, max: usize) {
        let now = tokio::time::Instant::now();
        if self
            .last_logged
            .is_none_or(|last| now.duration_since(last) >= TURNAWAY_LOG_INTERVAL)
        {
            self.flush(slots, max);
        }
    }

    /// Warns with the counts when there are any.
    fn flush<K: Copy + Eq + std::hash::Hash, H>(&mut self, slots: &Slots<K, H>, max: usize) {
        if self.evicted + self.dropped_full + self.dropped_per_client == 0 {
            return;
        }
        tracing::warn!(
            evicted_half_open = self.evicted,
            dropped_all_busy = self.dropped_full,
            dropped_client_at_cap = self.dropped_per_client,
            last_client = %self.last_client.map(|c| c.to_string()).unwrap_or_default(),
            running = slots.len(),
            half_open = slots.half_open(),
            max_transfers = max,
            max_per_client = slots.max_per_client(),
            "tftp: transfer slots taken; requests turned away since the last report (dropped \
             ones are retried by their clients; many evictions mean unanswered requests, e.g. \
             a flood)"
        );
        *self = Turnaways {
            last_logged: Some(tokio::time::Instant::now()),
            ..Turnaways::default()
        };
    }
}
