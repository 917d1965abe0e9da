//! One iSCSI connection in the full feature phase (RFC 7143 §4, §11): a reader loop that frames
//! PDUs and gathers write data straight into aligned buffers, a writer task that stamps StatSN /
//! ExpCmdSN / MaxCmdSN on every outgoing PDU, and one blocking-pool job per SCSI command so the
//! network and the disk work at the same time.
//!
//! Error recovery level 0: a protocol error the target cannot answer with a Reject drops the
//! connection (RFC 7143 §7.1.4), never the process.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, TryAcquireError};
use vmdeploy_shared::iscsi::keys::{key, value};
use vmdeploy_shared::iscsi::pdu::{
    logout_response, reject_reason, response_code, sense_segment, sn_le, tmf_function, tmf_response,
};
use vmdeploy_shared::iscsi::scsi::{asc, Failure, ScsiCommand as Cdb, Sense};
use vmdeploy_shared::iscsi::{
    Bhs, DataIn, LogoutResponse, NopIn, OperationalParams, PduError, R2t, Reject, ScsiCommand,
    ScsiResponse, TaskMgmtResponse, TextKeys, TextResponse, BHS_LEN, RESERVED_TAG,
};

use super::backend::AlignedBuf;
use super::commands::{Outcome, Payload, Transfer};
use super::framing::{self, Header};
use super::login::{self, SessionKind, PORTAL_GROUP_TAG};
use super::reservations::Nexus;
use super::server::TargetShared;

/// MaxRecvDataSegmentLength this target declares: big PDUs keep header work per byte low
/// (reference iscsi-and-swift-peers.md §3: 256 KiB PDUs bring tgtd near disk speed).
pub const MAX_RECV_DATA_SEGMENT: u32 = 1 << 20;
/// Commands the initiator may have outstanding (MaxCmdSN - ExpCmdSN + 1).
pub const CMD_WINDOW: u32 = 64;
/// How much more data than its CDB asks for a WRITE may carry (residual overflow of the
/// initiator's buffer) before it is refused instead of drained.
const MAX_WRITE_SLACK: u32 = 1 << 20;
/// Socket read buffer for headers and small PDUs.
const READ_BUFFER: usize = 16 * 1024;
/// Largest Data-In data segment this target sends, whatever the initiator allows.
const MAX_SEND_SEGMENT: usize = 1 << 20;

/// Data attached to an outgoing PDU.
enum OutData {
    None,
    Bytes(Bytes),
    Slice(Arc<Payload>, usize, usize),
}

/// An outgoing PDU; the writer fills in the sequence numbers.
struct OutPdu {
    header: [u8; BHS_LEN],
    data: OutData,
    /// The PDU carries a status and takes the next StatSN.
    takes_stat_sn: bool,
    /// Close the connection after this PDU (logout).
    close_after: bool,
}

/// CmdSN window state of the session (one connection per session here).
struct CmdWindow {
    exp_cmd_sn: AtomicU32,
}

impl CmdWindow {
    fn exp(&self) -> u32 {
        self.exp_cmd_sn.load(Ordering::Acquire)
    }
    fn max(&self) -> u32 {
        self.exp().wrapping_add(CMD_WINDOW - 1)
    }
}

/// The sender side for the writer task.
#[derive(Clone)]
struct Outbox {
    tx: mpsc::UnboundedSender<OutPdu>,
}

impl Outbox {
    fn send(&self, bhs: impl Into<Bhs>, data: OutData, takes_stat_sn: bool) {
        self.push(bhs, data, takes_stat_sn, false);
    }

    fn push(&self, bhs: impl Into<Bhs>, data: OutData, takes_stat_sn: bool, close_after: bool) {
        let len = match &data {
            OutData::None => 0,
            OutData::Bytes(b) => b.len(),
            OutData::Slice(_, a, b) => b - a,
        };
        let header = bhs.into().encode(0, len);
        // A closed channel means the writer ended; the reader notices on its next read.
        let _ = self.tx.send(OutPdu {
            header,
            data,
            takes_stat_sn,
            close_after,
        });
    }
}

/// A write command waiting for its data.
struct PendingWrite {
    lun: u64,
    cmd: Cdb,
    buf: AlignedBuf,
    received: usize,
    /// Every byte below this has been written by the initiator's data; the buffer may come
    /// from the pool with an earlier command's data, so bytes the initiator skips are zeroed
    /// (as a fresh buffer would have them).
    filled_to: usize,
    /// Unsolicited Data-Out may still arrive.
    unsolicited_open: bool,
    unsolicited_data_sn: u32,
    /// Data up to here has been covered by unsolicited data or R2Ts sent.
    requested: usize,
    /// The R2T outstanding: (TTT, offset, length, expected next DataSN).
    r2t: Option<(u32, usize, usize, u32)>,
    r2t_sn: u32,
    expected_len: u32,
    /// The command already failed; its unsolicited data is drained before the status goes out
    /// (answering while the initiator is still sending trips up libiscsi 1.19).
    verdict: Option<(Failure, Option<(bool, u32)>)>,
    /// Residual to report (expected length and CDB disagree).
    residual: Option<(bool, u32)>,
}

/// Counters of one connection's SCSI command jobs, logged once when it ends: how many commands
/// really overlap and how large the writes are tells where the throughput goes.
#[derive(Debug, Default)]
struct JobStats {
    running: AtomicU32,
    peak_running: AtomicU32,
    commands: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    largest_write: AtomicU64,
}

impl JobStats {
    fn started(&self, write_len: usize) {
        let now = self.running.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_running.fetch_max(now, Ordering::Relaxed);
        self.commands.fetch_add(1, Ordering::Relaxed);
        if write_len > 0 {
            self.writes.fetch_add(1, Ordering::Relaxed);
            self.write_bytes
                .fetch_add(write_len as u64, Ordering::Relaxed);
            self.largest_write
                .fetch_max(write_len as u64, Ordering::Relaxed);
        }
    }

    fn finished(&self) {
        self.running.fetch_sub(1, Ordering::Relaxed);
    }

    fn log(&self) {
        let writes = self.writes.load(Ordering::Relaxed);
        let bytes = self.write_bytes.load(Ordering::Relaxed);
        tracing::info!(
            commands = self.commands.load(Ordering::Relaxed),
            peak_jobs_in_flight = self.peak_running.load(Ordering::Relaxed),
            writes,
            write_bytes = bytes,
            mean_write = bytes.checked_div(writes).unwrap_or(0),
            largest_write = self.largest_write.load(Ordering::Relaxed),
            "session command summary"
        );
    }
}

/// Serves one accepted TCP connection until it ends.
pub async fn serve(stream: TcpStream, peer: SocketAddr, shared: Arc<TargetShared>) {
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().ok();
    match run(stream, local, shared).await {
        Ok(()) => tracing::info!(%peer, "connection closed"),
        Err(e) => tracing::warn!(%peer, error = %format!("{e:#}"), "connection dropped"),
    }
}

async fn run(
    stream: TcpStream,
    local: Option<SocketAddr>,
    shared: Arc<TargetShared>,
) -> anyhow::Result<()> {
    let (rd, wr) = stream.into_split();
    // Small on purpose: a read bigger than the buffer bypasses it and lands in the command's
    // aligned buffer, while every byte the buffer does take in is copied once more; with 256 KiB
    // up to a quarter of each 1 MiB Data-Out went through that copy (5 % of the target's time
    // in memmove under perf, bench/iscsi-write.sh).
    let mut rd = BufReader::with_capacity(READ_BUFFER, rd);
    let mut wr = BufWriter::with_capacity(256 * 1024, wr);
    let logged_in = {
        let mut joined = tokio::io::join(&mut rd, &mut wr);
        login::login(&mut joined, &shared).await?
    };
    let Some(session) = logged_in else {
        return Ok(());
    };
    tracing::info!(
        initiator = %session.initiator,
        kind = ?session.kind,
        tsih = session.tsih,
        max_recv = session.params.max_recv_data_segment_length,
        peer_max_recv = session.params.max_xmit_data_segment_length,
        first_burst = session.params.first_burst_length,
        max_burst = session.params.max_burst_length,
        initial_r2t = session.params.initial_r2t,
        immediate_data = session.params.immediate_data,
        "login complete"
    );
    let window = Arc::new(CmdWindow {
        exp_cmd_sn: AtomicU32::new(session.exp_cmd_sn),
    });
    let nexus = Arc::new(Nexus {
        initiator: session.initiator.clone(),
        isid: session.isid,
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(writer_task(wr, rx, session.stat_sn, window.clone()));
    let mut conn = Connection {
        shared,
        params: session.params,
        kind: session.kind,
        local,
        window,
        out: Outbox { tx },
        pending: HashMap::new(),
        next_ttt: 1,
        stats: Arc::new(JobStats::default()),
        nexus: nexus.clone(),
    };
    let result = conn.reader_loop(&mut rd).await;
    // Logout or a lost connection ends the I_T nexus (one connection per session).
    conn.shared.lun.nexus_lost(&nexus);
    if conn.kind == SessionKind::Normal {
        conn.stats.log();
    }
    // Dropping the outbox lets the writer drain what is queued and end; commands still running
    // hold their own clones and finish first.
    drop(conn);
    match writer.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %format!("{e:#}"), "writer ended with an error"),
        Err(e) => tracing::debug!(error = %e, "writer task failed"),
    }
    result
}

async fn writer_task<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<OutPdu>,
    mut stat_sn: u32,
    window: Arc<CmdWindow>,
) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    while let Some(mut pdu) = rx.recv().await {
        // Every target PDU has StatSN, ExpCmdSN, MaxCmdSN at bytes 24..36 (RFC 7143 §11).
        pdu.header[24..28].copy_from_slice(&stat_sn.to_be_bytes());
        pdu.header[28..32].copy_from_slice(&window.exp().to_be_bytes());
        pdu.header[32..36].copy_from_slice(&window.max().to_be_bytes());
        if pdu.takes_stat_sn {
            stat_sn = stat_sn.wrapping_add(1);
        }
        let data: &[u8] = match &pdu.data {
            OutData::None => &[],
            OutData::Bytes(b) => b,
            OutData::Slice(p, a, b) => &p.as_slice()[*a..*b],
        };
        framing::write_pdu(&mut wr, &pdu.header, data)
            .await
            .context("sending a PDU")?;
        if pdu.close_after {
            wr.flush().await.context("flushing")?;
            wr.shutdown().await.ok();
            return Ok(());
        }
        if rx.is_empty() {
            wr.flush().await.context("flushing")?;
        }
    }
    wr.flush().await.ok();
    Ok(())
}

struct Connection {
    shared: Arc<TargetShared>,
    params: OperationalParams,
    kind: SessionKind,
    local: Option<SocketAddr>,
    window: Arc<CmdWindow>,
    out: Outbox,
    pending: HashMap<u32, PendingWrite>,
    next_ttt: u32,
    stats: Arc<JobStats>,
    nexus: Arc<Nexus>,
}

/// What the reader does after one PDU.
enum Next {
    Continue,
    Close,
}

impl Connection {
    async fn reader_loop<R: AsyncRead + Unpin>(&mut self, rd: &mut R) -> anyhow::Result<()> {
        loop {
            let Some(header) = framing::read_header(rd).await? else {
                return Ok(());
            };
            if header.data_len > self.params.max_recv_data_segment_length as usize {
                anyhow::bail!(
                    "data segment of {} bytes is over MaxRecvDataSegmentLength {}",
                    header.data_len,
                    self.params.max_recv_data_segment_length
                );
            }
            framing::skip(rd, header.ahs_len).await?;
            let bhs = match Bhs::decode(&header.raw) {
                Ok(b) => b,
                Err(e) => {
                    framing::skip(rd, framing_len(&header)).await?;
                    let reason = match e {
                        PduError::UnknownOpcode(_) => reject_reason::COMMAND_NOT_SUPPORTED,
                        _ => reject_reason::INVALID_PDU_FIELD,
                    };
                    tracing::warn!(error = %e, "rejecting a PDU");
                    self.reject(reason, &header);
                    continue;
                }
            };
            match self.handle(rd, &header, bhs).await? {
                Next::Continue => {}
                Next::Close => return Ok(()),
            }
        }
    }

    fn reject(&self, reason: u8, header: &Header) {
        self.out.send(
            Reject {
                reason,
                data_sn: 0,
                ..Default::default()
            },
            OutData::Bytes(Bytes::copy_from_slice(&header.raw)),
            true,
        );
    }

    /// Checks a CmdSN (RFC 7143 §4.2.2.1). `false`: outside the window, ignore the PDU.
    fn accept_cmd_sn(&self, immediate: bool, cmd_sn: u32) -> bool {
        let exp = self.window.exp();
        if !sn_le(exp, cmd_sn) || !sn_le(cmd_sn, self.window.max()) {
            tracing::warn!(cmd_sn, exp, "CmdSN outside the window; PDU ignored");
            return false;
        }
        if !immediate {
            self.window
                .exp_cmd_sn
                .store(cmd_sn.wrapping_add(1), Ordering::Release);
        }
        true
    }

    async fn handle<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        header: &Header,
        bhs: Bhs,
    ) -> anyhow::Result<Next> {
        match bhs {
            Bhs::ScsiCommand(cmd) => {
                if self.kind == SessionKind::Discovery {
                    framing::skip(rd, framing_len(header)).await?;
                    self.reject(reject_reason::PROTOCOL_ERROR, header);
                    return Ok(Next::Continue);
                }
                self.scsi_command(rd, header, cmd).await?;
            }
            Bhs::DataOut(d) => self.data_out(rd, header, d).await?,
            Bhs::NopOut(nop) => {
                let data = framing::read_data_vec(rd, header.data_len).await?;
                if !self.accept_cmd_sn(nop.immediate, nop.cmd_sn) {
                    return Ok(Next::Continue);
                }
                if nop.itt != RESERVED_TAG {
                    self.out.send(
                        NopIn {
                            lun: nop.lun,
                            itt: nop.itt,
                            ttt: RESERVED_TAG,
                            ..Default::default()
                        },
                        OutData::Bytes(Bytes::from(data)),
                        true,
                    );
                }
            }
            Bhs::TextRequest(t) => {
                let data = framing::read_data_vec(rd, header.data_len).await?;
                if !self.accept_cmd_sn(t.immediate, t.cmd_sn) {
                    return Ok(Next::Continue);
                }
                let keys = TextKeys::parse(&data).unwrap_or_default();
                let mut answer = TextKeys::new();
                for (k, v) in keys.iter() {
                    if k == key::SEND_TARGETS {
                        if v == value::ALL
                            || v.eq_ignore_ascii_case(&self.shared.iqn)
                            || (v.is_empty() && self.kind == SessionKind::Normal)
                        {
                            answer.push(key::TARGET_NAME, self.shared.iqn.clone());
                            if let Some(addr) = self.local {
                                let host = match addr {
                                    SocketAddr::V4(a) => a.ip().to_string(),
                                    SocketAddr::V6(a) => format!("[{}]", a.ip()),
                                };
                                answer.push(
                                    key::TARGET_ADDRESS,
                                    format!("{host}:{},{PORTAL_GROUP_TAG}", addr.port()),
                                );
                            }
                        }
                    } else {
                        answer.push(k, value::NOT_UNDERSTOOD);
                    }
                }
                self.out.send(
                    TextResponse {
                        final_: true,
                        continue_: false,
                        lun: t.lun,
                        itt: t.itt,
                        ttt: RESERVED_TAG,
                        ..Default::default()
                    },
                    OutData::Bytes(Bytes::from(answer.encode())),
                    true,
                );
            }
            Bhs::TaskMgmtRequest(tmf) => {
                framing::skip(rd, framing_len(header)).await?;
                if !self.accept_cmd_sn(tmf.immediate, tmf.cmd_sn) {
                    return Ok(Next::Continue);
                }
                let response = match tmf.function {
                    tmf_function::ABORT_TASK => {
                        if self.pending.remove(&tmf.referenced_tag).is_some() {
                            tmf_response::COMPLETE
                        } else {
                            // Running or finished: its response is (or will be) sent.
                            tmf_response::NO_SUCH_TASK
                        }
                    }
                    tmf_function::ABORT_TASK_SET
                    | tmf_function::CLEAR_TASK_SET
                    | tmf_function::LOGICAL_UNIT_RESET
                    | tmf_function::TARGET_WARM_RESET
                    | tmf_function::TARGET_COLD_RESET => {
                        self.pending.clear();
                        if tmf.function != tmf_function::ABORT_TASK_SET
                            && tmf.function != tmf_function::CLEAR_TASK_SET
                        {
                            self.shared.lun.reset();
                        }
                        tmf_response::COMPLETE
                    }
                    _ => tmf_response::NOT_SUPPORTED,
                };
                self.out.send(
                    TaskMgmtResponse {
                        response,
                        itt: tmf.itt,
                        ..Default::default()
                    },
                    OutData::None,
                    true,
                );
                if tmf.function == tmf_function::TARGET_COLD_RESET {
                    return Ok(Next::Close);
                }
            }
            Bhs::LogoutRequest(l) => {
                framing::skip(rd, framing_len(header)).await?;
                self.accept_cmd_sn(l.immediate, l.cmd_sn);
                self.out.push(
                    LogoutResponse {
                        response: logout_response::SUCCESS,
                        itt: l.itt,
                        ..Default::default()
                    },
                    OutData::None,
                    true,
                    true,
                );
                return Ok(Next::Close);
            }
            Bhs::Snack(_) => {
                // ErrorRecoveryLevel 0: SNACK is not supported (RFC 7143 §11.16).
                framing::skip(rd, framing_len(header)).await?;
                self.reject(reject_reason::SNACK_REJECT, header);
            }
            other => {
                // A target-to-initiator opcode or a Login Request in full feature phase.
                tracing::warn!(opcode = ?other.opcode(), "unexpected PDU from the initiator");
                framing::skip(rd, framing_len(header)).await?;
                self.reject(reject_reason::PROTOCOL_ERROR, header);
            }
        }
        Ok(Next::Continue)
    }

    async fn scsi_command<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        header: &Header,
        cmd: ScsiCommand,
    ) -> anyhow::Result<()> {
        let immediate_len = header.data_len;
        if !self.accept_cmd_sn(cmd.immediate, cmd.cmd_sn) {
            framing::skip(rd, framing_len(header)).await?;
            return Ok(());
        }
        if self.pending.contains_key(&cmd.itt) {
            framing::skip(rd, framing_len(header)).await?;
            self.reject(reject_reason::TASK_IN_PROGRESS, header);
            return Ok(());
        }
        let lun = u64::from(cmd.lun.number().unwrap_or(u16::MAX));
        let edtl = cmd.expected_data_len;
        tracing::trace!(itt = cmd.itt, cmd_sn = cmd.cmd_sn, edtl, cdb = ?cmd.cdb, immediate_len, "SCSI command");
        let prepared = if header.ahs_len > 0 {
            // Extended CDBs (AHS type 1) are not supported: no command here needs one.
            Err(Sense::invalid_opcode().into())
        } else {
            self.shared.lun.prepare(&self.nexus, lun, &cmd.cdb)
        };
        let (cdb, transfer) = match prepared {
            Ok(p) => p,
            Err(sense) => {
                framing::skip(rd, framing_len(header)).await?;
                self.fail_command(&cmd, sense, None);
                return Ok(());
            }
        };
        let Transfer::Out(needed) = transfer else {
            framing::skip(rd, framing_len(header)).await?;
            self.dispatch(lun, cdb, cmd.itt, edtl, cmd.read, DataOutBuf::Empty, None);
            return Ok(());
        };
        // A WRITE (or WRITE AND VERIFY) whose expected length differs from the CDB's transfers
        // only what both allow
        // and reports the residual (FCP-4 §9.4.2 option a; libiscsi 1.19's residual tests want
        // GOOD). Other data-out commands are refused without writing (option b).
        let sent = if cmd.write { edtl } else { 0 };
        let mut cdb = cdb;
        let mut residual = None;
        if sent != needed {
            let over = needed > sent;
            let count = needed.abs_diff(sent);
            let blocks = needed.min(sent) / self.shared.lun.backend().block_len();
            match cdb.with_write_blocks(blocks) {
                Some(trimmed) if sent <= needed.saturating_add(MAX_WRITE_SLACK) => {
                    cdb = trimmed;
                    residual = Some((over, count));
                }
                _ => {
                    framing::skip(rd, framing_len(header)).await?;
                    // COMPARE AND WRITE's length is a single CDB byte: a data-out of another
                    // size means the CDB does not describe it (libiscsi expects this sense).
                    let sense = if matches!(cdb, Cdb::CompareAndWrite { .. }) {
                        Sense::invalid_field_in_cdb(13, None)
                    } else {
                        Sense::illegal_request(asc::INVALID_FIELD_IN_INFORMATION_UNIT)
                    };
                    self.fail_command(&cmd, sense, Some((over, count)));
                    return Ok(());
                }
            }
        }
        let needed = sent;
        if immediate_len > needed as usize {
            anyhow::bail!(
                "immediate data of {immediate_len} bytes exceeds the expected length {needed}"
            );
        }
        if needed == 0 {
            framing::skip(rd, framing_len(header)).await?;
            self.dispatch(lun, cdb, cmd.itt, edtl, false, DataOutBuf::Empty, residual);
            return Ok(());
        }
        let mut buf = self.shared.buffers.take(needed as usize);
        framing::read_body(rd, &mut buf[..immediate_len]).await?;
        framing::skip_padding(rd, immediate_len).await?;
        // Unsolicited data covers the first min(FirstBurstLength, EDTL) bytes unless the F bit
        // says no Data-Out follows (RFC 7143 §4.2.5.2).
        let unsolicited_open = !cmd.final_ && !self.params.initial_r2t;
        let requested = if unsolicited_open {
            (self.params.first_burst_length as usize).min(needed as usize)
        } else {
            immediate_len
        };
        let mut pending = PendingWrite {
            lun,
            cmd: cdb,
            buf,
            received: immediate_len,
            filled_to: immediate_len,
            unsolicited_open,
            unsolicited_data_sn: 0,
            requested,
            r2t: None,
            r2t_sn: 0,
            expected_len: edtl,
            verdict: None,
            residual,
        };
        if self.advance_write(cmd.itt, &mut pending) {
            self.dispatch_write(cmd.itt, pending);
        } else {
            self.pending.insert(cmd.itt, pending);
        }
        Ok(())
    }

    /// Answers a failed command at once, or once its unsolicited Data-Out has been drained.
    fn fail_command(
        &mut self,
        cmd: &ScsiCommand,
        sense: impl Into<Failure>,
        residual: Option<(bool, u32)>,
    ) {
        let sense = sense.into();
        let unsolicited_follows = cmd.write && !cmd.final_ && !self.params.initial_r2t;
        if !unsolicited_follows {
            self.respond_sense(cmd.itt, sense, residual);
            return;
        }
        self.pending.insert(
            cmd.itt,
            PendingWrite {
                lun: 0,
                cmd: Cdb::TestUnitReady,
                buf: AlignedBuf::zeroed(0),
                received: 0,
                filled_to: 0,
                unsolicited_open: true,
                unsolicited_data_sn: 0,
                requested: 0,
                r2t: None,
                r2t_sn: 0,
                expected_len: cmd.expected_data_len,
                verdict: Some((sense, residual)),
                residual: None,
            },
        );
    }

    /// Sends the next R2T when nothing is outstanding. `true`: all data is in.
    fn advance_write(&mut self, itt: u32, p: &mut PendingWrite) -> bool {
        if p.unsolicited_open || p.r2t.is_some() {
            return false;
        }
        let total = p.buf.len();
        if p.requested >= total {
            return true;
        }
        let len = (total - p.requested).min(self.params.max_burst_length as usize);
        let ttt = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        self.out.send(
            R2t {
                lun: vmdeploy_shared::iscsi::Lun::from_number(p.lun as u16),
                itt,
                ttt,
                r2t_sn: p.r2t_sn,
                buffer_offset: p.requested as u32,
                desired_len: len as u32,
                ..Default::default()
            },
            OutData::None,
            false,
        );
        p.r2t_sn = p.r2t_sn.wrapping_add(1);
        p.r2t = Some((ttt, p.requested, len, 0));
        p.requested += len;
        false
    }

    async fn data_out<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        header: &Header,
        d: vmdeploy_shared::iscsi::DataOut,
    ) -> anyhow::Result<()> {
        let len = header.data_len;
        let Some(mut p) = self.pending.remove(&d.itt) else {
            // Data for a command already answered (rejected, aborted): drop it quietly.
            framing::skip(rd, framing_len(header)).await?;
            return Ok(());
        };
        if let Some((sense, residual)) = p.verdict {
            framing::skip(rd, framing_len(header)).await?;
            if d.final_ {
                self.respond_sense(d.itt, sense, residual);
            } else {
                self.pending.insert(d.itt, p);
            }
            return Ok(());
        }
        let offset = d.buffer_offset as usize;
        let end = offset.saturating_add(len);
        // Which sequence does this PDU belong to, and is its DataSN the next one?
        let in_sequence = if d.ttt == RESERVED_TAG {
            let ok = p.unsolicited_open
                && d.data_sn == p.unsolicited_data_sn
                && end <= (self.params.first_burst_length as usize).min(p.buf.len());
            p.unsolicited_data_sn = p.unsolicited_data_sn.wrapping_add(1);
            ok
        } else {
            match &mut p.r2t {
                Some((ttt, r_off, r_len, next_sn)) if *ttt == d.ttt => {
                    let ok = d.data_sn == *next_sn && offset >= *r_off && end <= *r_off + *r_len;
                    *next_sn = next_sn.wrapping_add(1);
                    ok
                }
                _ => false,
            }
        };
        if !in_sequence || end > p.buf.len() {
            // ERL 0: a sequence error in Data-Out ends the connection (RFC 7143 §7.1.4.1).
            anyhow::bail!(
                "Data-Out for ITT {:#x} out of sequence (DataSN {}, offset {offset}, {len} bytes, TTT {:#x})",
                d.itt,
                d.data_sn,
                d.ttt
            );
        }
        if offset > p.filled_to {
            p.buf[p.filled_to..offset].fill(0);
        }
        framing::read_body(rd, &mut p.buf[offset..end]).await?;
        framing::skip_padding(rd, len).await?;
        p.received += len;
        p.filled_to = p.filled_to.max(end);
        if d.final_ {
            if d.ttt == RESERVED_TAG {
                p.unsolicited_open = false;
            } else {
                p.r2t = None;
            }
        }
        if self.advance_write(d.itt, &mut p) {
            self.dispatch_write(d.itt, p);
        } else {
            self.pending.insert(d.itt, p);
        }
        Ok(())
    }

    fn dispatch_write(&mut self, itt: u32, mut p: PendingWrite) {
        if p.received < p.buf.len() {
            tracing::warn!(
                itt,
                received = p.received,
                needed = p.buf.len(),
                "write data incomplete"
            );
            self.respond_sense(
                itt,
                Sense::illegal_request(asc::INVALID_FIELD_IN_INFORMATION_UNIT),
                None,
            );
            self.shared.buffers.give(p.buf);
            return;
        }
        // Overlapping Data-Out can add up to the length and still leave bytes unwritten.
        let filled_to = p.filled_to;
        if let Some(rest) = p.buf.get_mut(filled_to..) {
            rest.fill(0);
        }
        self.dispatch(
            p.lun,
            p.cmd,
            itt,
            p.expected_len,
            false,
            p.buf.into(),
            p.residual,
        );
    }

    /// Runs a command on the blocking pool and queues its response.
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        lun: u64,
        cmd: Cdb,
        itt: u32,
        edtl: u32,
        read: bool,
        data: DataOutBuf,
        residual: Option<(bool, u32)>,
    ) {
        let shared = self.shared.clone();
        let nexus = self.nexus.clone();
        let out = self.out.clone();
        let max_xmit =
            (self.params.max_xmit_data_segment_length as usize).clamp(512, MAX_SEND_SEGMENT);
        let max_burst = self.params.max_burst_length as usize;
        let stats = self.stats.clone();
        stats.started(data.as_slice().len());
        let job_stats = stats.clone();
        let inflight = shared.inflight.clone();
        // The job answers from the blocking thread itself: waking a task only to queue the
        // response was one more thread hop per command (bench/iscsi-write.sh).
        let job = move |permit: OwnedSemaphorePermit| {
            let _permit = permit;
            let outcome: Outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                shared.lun.execute(&nexus, lun, &cmd, data.as_slice())
            }))
            .unwrap_or_else(|_| {
                tracing::error!("SCSI command job panicked");
                Err(Sense::new(
                    vmdeploy_shared::iscsi::scsi::SenseKey::HardwareError,
                    asc::INTERNAL_TARGET_FAILURE,
                )
                .into())
            });
            if let DataOutBuf::Aligned(buf) = data {
                shared.buffers.give(buf);
            }
            job_stats.finished();
            send_outcome(
                &out, itt, edtl, read, outcome, max_xmit, max_burst, residual,
            );
        };
        match inflight.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::task::spawn_blocking(move || job(permit));
            }
            Err(TryAcquireError::Closed) => stats.finished(), // shutting down
            Err(TryAcquireError::NoPermits) => {
                tokio::spawn(async move {
                    let Ok(permit) = inflight.acquire_owned().await else {
                        stats.finished();
                        return; // shutting down
                    };
                    tokio::task::spawn_blocking(move || job(permit));
                });
            }
        }
    }

    fn respond_sense(&self, itt: u32, sense: impl Into<Failure>, residual: Option<(bool, u32)>) {
        send_sense(&self.out, itt, sense.into(), residual);
    }
}

/// Data-out handed to a command job.
enum DataOutBuf {
    Empty,
    Aligned(AlignedBuf),
}

impl DataOutBuf {
    fn as_slice(&self) -> &[u8] {
        match self {
            DataOutBuf::Empty => &[],
            DataOutBuf::Aligned(b) => b,
        }
    }
}

impl From<AlignedBuf> for DataOutBuf {
    fn from(b: AlignedBuf) -> Self {
        DataOutBuf::Aligned(b)
    }
}

fn framing_len(header: &Header) -> usize {
    vmdeploy_shared::iscsi::pdu::padded_len(header.data_len)
}

fn send_sense(out: &Outbox, itt: u32, failure: Failure, residual: Option<(bool, u32)>) {
    let (overflow, underflow, count) = match residual {
        Some((true, n)) if n > 0 => (true, false, n),
        Some((false, n)) if n > 0 => (false, true, n),
        _ => (false, false, 0),
    };
    out.send(
        ScsiResponse {
            overflow,
            underflow,
            residual_count: count,
            response: response_code::COMPLETED,
            status: failure.status(),
            itt,
            ..Default::default()
        },
        match failure.sense() {
            Some(sense) => OutData::Bytes(Bytes::from(sense_segment(&sense.to_fixed()))),
            None => OutData::None,
        },
        true,
    );
}

/// Queues Data-In (with the status in the last PDU) or a SCSI Response for a finished command.
#[allow(clippy::too_many_arguments)]
fn send_outcome(
    out: &Outbox,
    itt: u32,
    edtl: u32,
    read: bool,
    outcome: Outcome,
    max_xmit: usize,
    max_burst: usize,
    write_residual: Option<(bool, u32)>,
) {
    let payload = match outcome {
        Err(sense) => return send_sense(out, itt, sense, None),
        Ok(p) => p,
    };
    let produced = payload.as_ref().map_or(0, |p| p.as_slice().len());
    let edtl = if read { edtl as usize } else { 0 };
    let sent = produced.min(edtl);
    let (overflow, underflow, residual) = if let Some((over, n)) = write_residual {
        (over, !over, n as usize)
    } else if produced > edtl && payload.is_some() {
        (true, false, produced - edtl)
    } else if edtl > produced {
        (false, true, edtl - produced)
    } else {
        (false, false, 0)
    };
    if sent == 0 {
        out.send(
            ScsiResponse {
                overflow,
                underflow,
                residual_count: residual as u32,
                response: response_code::COMPLETED,
                status: vmdeploy_shared::iscsi::pdu::scsi_status::GOOD,
                itt,
                ..Default::default()
            },
            OutData::None,
            true,
        );
        return;
    }
    let payload = Arc::new(payload.expect("sent > 0 implies a payload"));
    let mut offset = 0usize;
    let mut data_sn = 0u32;
    let mut burst_start = 0usize;
    while offset < sent {
        let len = (sent - offset).min(max_xmit);
        let end = offset + len;
        let last = end == sent;
        // F closes a Data-In sequence at each MaxBurstLength and at the end (RFC 7143 §11.7.1).
        let burst_end = last || end - burst_start >= max_burst;
        out.send(
            DataIn {
                final_: burst_end,
                has_status: last,
                status: vmdeploy_shared::iscsi::pdu::scsi_status::GOOD,
                overflow: last && overflow,
                underflow: last && underflow,
                residual_count: if last { residual as u32 } else { 0 },
                itt,
                ttt: RESERVED_TAG,
                data_sn,
                buffer_offset: offset as u32,
                ..Default::default()
            },
            OutData::Slice(payload.clone(), offset, end),
            last,
        );
        if burst_end {
            burst_start = end;
        }
        data_sn = data_sn.wrapping_add(1);
        offset = end;
    }
}
