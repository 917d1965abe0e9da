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
//!   be reaped yet.) Beyond `max_transfers` running transfers a request is dropped (logged
//!   at warn), so the client's own retransmission of its request is the retry; an error would
//!   end a PXE ROM's boot attempt for good.
//! - At shutdown the running transfers are aborted: TFTP clients retry, and a boot in progress
//!   cannot finish across a conductor restart anyway.
//!
//! # Limitations
//! - Bound to a wildcard address on a multi-homed host, a transfer's replies leave from the
//!   address the routing table picks, which may not be the one the client asked; PXE ROMs
//!   check it. Bind the server to the address the DHCP server announces as next-server.
//! - No windowsize (RFC 7440) or multicast (RFC 2090): lock-step only.

mod source;
mod transfer;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use tokio::net::UdpSocket;
use tokio::task::JoinSet;
use vmdeploy_shared::tftp::{parse, ErrorCode, Opcode, Packet};

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

/// Receive buffer of the main socket: the largest UDP payload, so no request is cut.
const MAIN_RECEIVE_BUFFER: usize = 65_536;

/// The server's configuration.
#[derive(Debug, Clone)]
pub struct TftpConfig {
    /// The directory served; every request is confined to it.
    pub root: PathBuf,
    /// The largest block size granted to a `blksize` request.
    pub max_blksize: u16,
    /// Retransmission timeout unless the client asks for one with `timeout`.
    pub retransmit_timeout: Duration,
    /// The longest `timeout` option granted, in seconds; a longer one is declined.
    pub max_timeout_secs: u8,
    /// Retransmissions of one packet before the transfer is given up.
    pub max_retries: u32,
    /// Transfers at once; requests beyond are dropped (the client retries).
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
        // Which transfer serves which (client, file name), for the repeated requests above.
        let mut running: HashMap<tokio::task::Id, (SocketAddr, String)> = HashMap::new();
        let mut requests: HashSet<(SocketAddr, String)> = HashSet::new();
        let mut buf = vec![0u8; MAIN_RECEIVE_BUFFER];
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(done) = transfers.join_next_with_id(), if !transfers.is_empty() => {
                    let id = match done {
                        Ok((id, ())) => id,
                        Err(err) => {
                            tracing::error!(error = %Chain(&err), "tftp: a transfer task failed");
                            err.id()
                        }
                    };
                    if let Some(key) = running.remove(&id) {
                        requests.remove(&key);
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
                    let key = (client, request.filename.clone());
                    if requests.contains(&key) {
                        tracing::debug!(%client, "tftp: repeated request of a running transfer dropped");
                    } else if transfers.len() >= self.max_transfers {
                        tracing::warn!(%client, file = %request.filename,
                            max_transfers = self.max_transfers,
                            "tftp: too many transfers; request dropped (the client retries)");
                    } else {
                        let span = tracing::info_span!("tftp", %client);
                        let handle = transfers.spawn(tracing::Instrument::instrument(
                            transfer::serve(request, Arc::clone(&self.settings)),
                            span,
                        ));
                        running.insert(handle.id(), key.clone());
                        requests.insert(key);
                    }
                }
            }
        }
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
                tracing::info!(%client, file = %filename, "tftp: write request refused");
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
