//! One read transfer, on its own socket (RFC 1350 §4: the server's transfer ID is a new port).
//!
//! # Design
//! Lock-step, as RFC 1350 has it: send a packet, wait for its ACK, retransmit after the timeout
//! (the client's `timeout` option, else the server's), give up after `max_retries`
//! retransmissions. Until the client acknowledges the first packet (OACK or DATA 1) the
//! transfer is half-open and retransmits at the server's timeout when the client asked for a
//! longer one: nothing yet shows the request came from its source address, so a forged request
//! must not hold a slot for the client's timeout × retries. The first ACK sets the
//! `acknowledged` flag the main loop reads (see `slots.rs`). An ACK of any other block is ignored and does not trigger a retransmission:
//! answering duplicate ACKs doubles every later block ("Sorcerer's Apprentice", RFC 1123
//! §4.2.3.1). Packets from any address but the client's get ERROR 5 and are otherwise ignored;
//! the retransmission deadline is not moved by them. From the client, an ERROR ends the
//! transfer and anything else but an ACK is ignored.
//!
//! Block numbers count on past 65535 to 0 (what tftp-hpa, curl, iPXE and PXELINUX expect), so
//! files of any size can be sent at any block size.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use vmdeploy_shared::tftp::{
    data_header, parse, ErrorCode, Mode, Packet, RequestedOptions, TftpOption,
};

use super::source::BlockSource;
use super::Settings;
use crate::netboot::path::{resolve, PathError};
use vmdeploy_shared::error::Chain;

/// Receive buffer of a transfer socket: an ACK or an ERROR; anything longer arrives truncated
/// and fails to parse as an ACK (the codec wants exactly 4 bytes).
const RECEIVE_BUFFER: usize = 1024;

/// A read request as the main socket received it.
pub struct ReadRequest {
    /// The client's address and port (its transfer ID).
    pub client: SocketAddr,
    /// The name as sent.
    pub filename: String,
    /// Transfer mode.
    pub mode: Mode,
    /// Options as sent.
    pub options: Vec<TftpOption>,
}

/// How a transfer ended short of success.
#[derive(Debug, thiserror::Error)]
enum TransferError {
    #[error("the client sent ERROR {code}: {message:?}")]
    Client { code: ErrorCode, message: String },
    #[error("no ACK of block {block} after {retries} retransmissions")]
    TimedOut { block: u16, retries: u32 },
    #[error("reading the file: {0}")]
    Read(#[source] std::io::Error),
    #[error("on the transfer socket: {0}")]
    Socket(#[source] std::io::Error),
}

/// An ERROR packet's bytes; the message is ours, and a NUL in it (none of ours has one) would
/// become a space.
pub fn error_packet(code: ErrorCode, message: &str) -> Vec<u8> {
    Packet::error(code, message.replace('\0', " "))
        .encode()
        .expect("an ERROR without NUL bytes always encodes")
}

/// Serves one read request to the end; failures are logged, never returned. `acknowledged` is
/// set when the client acknowledges the first packet.
pub async fn serve(request: ReadRequest, settings: Arc<Settings>, acknowledged: Arc<AtomicBool>) {
    let socket = match UdpSocket::bind(SocketAddr::new(settings.local_ip, 0)).await {
        Ok(socket) => socket,
        Err(err) => {
            tracing::warn!(client = %request.client, file = %request.filename, error = %Chain(&err),
                "tftp: binding a transfer socket failed; request dropped");
            return;
        }
    };
    let opened = match open(&settings.root, &request).await {
        Ok(opened) => opened,
        Err((code, reason)) => {
            // A name that leaves the root is worth a warning; a missing file is routine
            // (PXELINUX probes a dozen configuration names before `default`).
            // Within the per-request line budget only (request_log.rs).
            if !settings.request_log.admit() {
            } else if code == ErrorCode::AccessViolation {
                tracing::warn!(client = %request.client, file = %request.filename,
                    mode = %request.mode, tftp_error = code.to_u16(), "tftp: refused: {reason}");
            } else {
                tracing::info!(client = %request.client, file = %request.filename,
                    mode = %request.mode, tftp_error = code.to_u16(), "tftp: refused: {reason}");
            }
            let _ = socket
                .send_to(&error_packet(code, &reason), request.client)
                .await;
            return;
        }
    };
    let requested = RequestedOptions::from_options(&request.options);
    // tsize only in octet mode: netascii changes the length, and knowing it would take a pass
    // over the whole file. Not for an empty file either: curl (lib/tftp.c,
    // tftp_parse_option_ack) fails a download whose OACK says `tsize 0`; leaving the option out
    // is the RFC 2347 way of not accepting it.
    let size_up_front = (request.mode == Mode::Octet && opened.size > 0).then_some(opened.size);
    let accepted = requested.accept(
        settings.max_blksize,
        settings.max_timeout_secs,
        size_up_front,
    );
    let timeout = accepted
        .timeout_secs
        .map(|secs| Duration::from_secs(secs.into()))
        .unwrap_or(settings.retransmit_timeout);
    if requested.timeout_secs.is_some() && accepted.timeout_secs.is_none() {
        tracing::debug!(client = %request.client, requested_secs = requested.timeout_secs,
            max_secs = settings.max_timeout_secs, "tftp: timeout option declined");
    }
    let blksize = accepted.block_size();
    if settings.request_log.admit() {
        tracing::info!(client = %request.client, file = %request.filename,
            path = %opened.path.display(), mode = %request.mode, size = opened.size, blksize,
            timeout_secs = timeout.as_secs_f32(), oack = !accepted.is_empty(),
            "tftp: transfer started");
    }
    let source = match request.mode {
        Mode::Netascii => BlockSource::netascii(opened.file),
        _ => BlockSource::octet(opened.file),
    };
    let mut transfer = Transfer {
        socket,
        client: request.client,
        timeout: timeout.min(settings.retransmit_timeout),
        negotiated_timeout: timeout,
        acknowledged,
        max_retries: settings.max_retries,
        buf: vec![0; RECEIVE_BUFFER],
    };
    let started = Instant::now();
    let mut sent = 0u64;
    let result = async {
        if let Some(oack) = accepted.oack() {
            let oack = oack.encode().map_err(|err| {
                TransferError::Socket(std::io::Error::other(format!("encoding the OACK: {err}")))
            })?;
            transfer.exchange(&oack, 0).await?;
        }
        transfer.send_file(source, blksize.into(), &mut sent).await
    }
    .await;
    let elapsed_ms = started.elapsed().as_millis();
    if let Err(TransferError::Read(_)) = result {
        let packet = error_packet(ErrorCode::NotDefined, "read error on the server");
        let _ = transfer.socket.send_to(&packet, transfer.client).await;
    }
    if !settings.request_log.admit() {
        return;
    }
    match result {
        Ok(()) => tracing::info!(client = %request.client, file = %request.filename, bytes = sent,
            blksize, elapsed_ms, "tftp: transfer done"),
        Err(err @ TransferError::Client { .. }) => tracing::info!(client = %request.client,
            file = %request.filename, bytes = sent, blksize, elapsed_ms,
            "tftp: transfer ended by the client: {err}"),
        Err(err) => tracing::warn!(client = %request.client, file = %request.filename,
            bytes = sent, blksize, elapsed_ms, "tftp: transfer abandoned: {err}"),
    }
}

/// A file checked and opened for a transfer.
struct Opened {
    file: tokio::fs::File,
    path: PathBuf,
    size: u64,
}

/// Checks the request and opens its file; a refusal is the TFTP error to send and its reason.
async fn open(root: &Path, request: &ReadRequest) -> Result<Opened, (ErrorCode, String)> {
    if request.mode == Mode::Mail {
        return Err((
            ErrorCode::IllegalOperation,
            "mail mode is not supported".into(),
        ));
    }
    let (root_owned, name) = (root.to_path_buf(), request.filename.clone());
    let path = tokio::task::spawn_blocking(move || resolve(&root_owned, &name))
        .await
        .map_err(|err| (ErrorCode::NotDefined, format!("resolving the name: {err}")))?
        .map_err(|err: PathError| (err.code(), err.to_string()))?;
    // O_NOFOLLOW: the last component cannot have become a symlink since `resolve`;
    // O_NONBLOCK: a FIFO put there since cannot hang the open (no effect on regular files).
    let file = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .await
        .map_err(|err| {
            let code = match err.kind() {
                std::io::ErrorKind::NotFound => ErrorCode::FileNotFound,
                _ => ErrorCode::AccessViolation,
            };
            (code, format!("opening the file: {err}"))
        })?;
    let metadata = file.metadata().await.map_err(|err| {
        (
            ErrorCode::NotDefined,
            format!("reading the file's metadata: {err}"),
        )
    })?;
    if !metadata.is_file() {
        return Err((ErrorCode::AccessViolation, "not a regular file".into()));
    }
    Ok(Opened {
        file,
        path,
        size: metadata.len(),
    })
}

/// The socket and retransmission state of one transfer.
struct Transfer {
    socket: UdpSocket,
    client: SocketAddr,
    /// The retransmission timeout now: at most the server's while half-open (module docs).
    timeout: Duration,
    /// The retransmission timeout once the client has acknowledged a packet.
    negotiated_timeout: Duration,
    /// Set at the first ACK; read by the main loop.
    acknowledged: Arc<AtomicBool>,
    max_retries: u32,
    buf: Vec<u8>,
}

impl Transfer {
    /// Sends the file as DATA blocks 1, 2, ... (wrapping), each acknowledged.
    async fn send_file<R: tokio::io::AsyncRead + Unpin>(
        &mut self,
        mut source: BlockSource<R>,
        blksize: usize,
        sent: &mut u64,
    ) -> Result<(), TransferError> {
        let mut packet = Vec::with_capacity(blksize + data_header(0).len());
        let mut block: u16 = 1;
        loop {
            packet.clear();
            packet.extend_from_slice(&data_header(block));
            source
                .next_block(blksize, &mut packet)
                .await
                .map_err(TransferError::Read)?;
            let payload = packet.len() - data_header(block).len();
            self.exchange(&packet, block).await?;
            *sent += payload as u64;
            if payload < blksize {
                return Ok(());
            }
            block = block.wrapping_add(1);
        }
    }

    /// Sends `packet` and waits for the ACK of `block`, retransmitting on timeout.
    async fn exchange(&mut self, packet: &[u8], block: u16) -> Result<(), TransferError> {
        let mut retries = 0;
        loop {
            self.socket
                .send_to(packet, self.client)
                .await
                .map_err(TransferError::Socket)?;
            let deadline = tokio::time::Instant::now() + self.timeout;
            match tokio::time::timeout_at(deadline, self.wait_for_ack(block)).await {
                Ok(Ok(())) => {
                    // The client answered from its address: the handshake is over.
                    self.timeout = self.negotiated_timeout;
                    self.acknowledged.store(true, Ordering::Relaxed);
                    return Ok(());
                }
                Ok(Err(err)) => return Err(err),
                Err(_elapsed) if retries < self.max_retries => {
                    retries += 1;
                    tracing::debug!(client = %self.client, block, retries, "tftp: retransmitting");
                }
                Err(_elapsed) => return Err(TransferError::TimedOut { block, retries }),
            }
        }
    }

    /// Receives until the client acknowledges `block` or sends an ERROR.
    async fn wait_for_ack(&mut self, block: u16) -> Result<(), TransferError> {
        loop {
            let (len, from) = self
                .socket
                .recv_from(&mut self.buf)
                .await
                .map_err(TransferError::Socket)?;
            if from != self.client {
                tracing::debug!(client = %self.client, stranger = %from,
                    "tftp: packet from an unknown transfer ID");
                let packet = error_packet(ErrorCode::UnknownTid, "unknown transfer ID");
                let _ = self.socket.send_to(&packet, from).await;
                continue;
            }
            match parse(&self.buf[..len]) {
                Ok(Packet::Ack { block: acked }) if acked == block => return Ok(()),
                // An earlier block's ACK again: ignored (Sorcerer's Apprentice, module docs).
                Ok(Packet::Ack { .. }) => {}
                Ok(Packet::Error { code, message }) => {
                    return Err(TransferError::Client { code, message })
                }
                Ok(other) => {
                    tracing::debug!(client = %self.client, opcode = ?other.opcode(),
                        "tftp: ignoring a packet that is not an ACK");
                }
                Err(err) => {
                    tracing::debug!(client = %self.client, error = %Chain(&err),
                        "tftp: ignoring a malformed packet");
                }
            }
        }
    }
}
