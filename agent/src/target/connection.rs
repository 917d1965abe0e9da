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

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, TryAcquireError};
use vmdeploy_shared::iscsi::keys::{key, value};
use vmdeploy_shared::iscsi::pdu::{logout_response, reject_reason, tmf_function, tmf_response};
use vmdeploy_shared::iscsi::scsi::{asc, Failure, ScsiCommand as Cdb, Sense};
use vmdeploy_shared::iscsi::{
    Bhs, LogoutResponse, NopIn, OperationalParams, PduError, R2t, ScsiCommand, SessionKind,
    TaskMgmtResponse, TextKeys, TextResponse, RESERVED_TAG,
};

use anyhow::Context as _;

use super::backend::AlignedBuf;
use super::budget::{Reservation, SessionQuota, MAX_WRITE_SLACK, SESSION_WRITE_QUOTA};
use super::commands::{Outcome, Payload, Transfer};
use super::framing::{self, Header, Limits};
use super::gather::{Gather, Step};
use super::login::{self, PORTAL_GROUP_TAG};
use super::outbox::{writer_task, CmdWindow, OutData, Outbox};
use super::reservations::Nexus;
use super::responses::{send_outcome, send_reject, send_sense, Answer, DataInLimits, Residual};
use super::server::TargetShared;

/// MaxRecvDataSegmentLength this target declares: big PDUs keep header work per byte low
/// (docs/iscsi-and-swift-peers.md §3: 256 KiB PDUs bring tgtd near disk speed).
pub const MAX_RECV_DATA_SEGMENT: u32 = 1 << 20;
/// Socket read buffer for headers and small PDUs.
const READ_BUFFER: usize = 16 * 1024;
/// Largest Data-In data segment this target sends, whatever the initiator allows.
const MAX_SEND_SEGMENT: usize = 1 << 20;

/// A write command waiting for its data.
struct PendingWrite {
    lun: u64,
    cmd: Cdb,
    buf: AlignedBuf,
    /// `buf`'s bytes in the session's share of the write budget.
    reservation: Reservation,
    gather: Gather,
    expected_len: u32,
    /// Residual to report (expected length and CDB disagree).
    residual: Residual,
}

/// A command that still expects Data-Out.
enum Pending {
    /// Gathering its data.
    Write(PendingWrite),
    /// Already failed: its unsolicited data is drained before the status goes out (answering
    /// while the initiator is still sending trips up libiscsi 1.19).
    Draining { sense: Failure, residual: Residual },
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
    serve_io(rd, wr, local, shared).await
}

/// One connection, login to logout, over any pair of byte streams: [`serve`]'s body, public so
/// the fuzz target (`fuzz/`) can feed it a byte string instead of a socket.
#[doc(hidden)]
pub async fn serve_io<R, W>(
    rd: R,
    wr: W,
    local: Option<SocketAddr>,
    shared: Arc<TargetShared>,
) -> anyhow::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
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
    let Some(login::Admitted { session, quota }) = logged_in else {
        return Ok(());
    };
    tracing::info!(
        initiator = %session.initiator_name,
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
    let window = Arc::new(CmdWindow::new(session.cmd_sn));
    let nexus = Arc::new(Nexus {
        initiator: session.initiator_name.clone(),
        isid: session.isid,
    });
    let (out, rx) = Outbox::channel();
    let writer = tokio::spawn(writer_task(wr, rx, session.stat_sn, window.clone()));
    let mut conn = Connection {
        shared,
        limits: Limits::new(session.params.max_recv_data_segment_length as usize),
        params: session.params,
        kind: session.kind,
        local,
        window,
        out,
        pending: HashMap::new(),
        quota,
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
    // hold their own clones and finish first. The writes still waiting for data give their
    // buffers and reservations back here.
    drop(conn);
    match writer.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %format!("{e:#}"), "writer ended with an error"),
        Err(e) => tracing::debug!(error = %e, "writer task failed"),
    }
    result
}

struct Connection {
    shared: Arc<TargetShared>,
    /// Framing limits: MaxRecvDataSegmentLength as declared at login.
    limits: Limits,
    params: OperationalParams,
    kind: SessionKind,
    local: Option<SocketAddr>,
    window: Arc<CmdWindow>,
    out: Outbox,
    pending: HashMap<u32, Pending>,
    /// The session's share of the write budget (`None` in a discovery session).
    quota: Option<SessionQuota>,
    next_ttt: u32,
    stats: Arc<JobStats>,
    /// The I_T nexus of this session, for reservations (SPC-4 §5.13).
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
            // The limit is MaxRecvDataSegmentLength, checked from the header before any data.
            let Some(header) = framing::read_header(rd, &self.limits).await? else {
                return Ok(());
            };
            framing::skip(rd, header.layout.ahs_len).await?;
            let bhs = match Bhs::decode(&header.raw) {
                Ok(b) => b,
                Err(e) => {
                    framing::skip(rd, header.body_len()).await?;
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
        send_reject(&self.out, reason, &header.raw);
    }

    /// Checks a CmdSN (RFC 7143 §4.2.2.1). `false`: outside the window, ignore the PDU.
    fn accept_cmd_sn(&self, immediate: bool, cmd_sn: u32) -> bool {
        self.window.accept(immediate, cmd_sn)
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
                    framing::skip(rd, header.body_len()).await?;
                    self.reject(reject_reason::PROTOCOL_ERROR, header);
                    return Ok(Next::Continue);
                }
                self.scsi_command(rd, header, cmd).await?;
            }
            Bhs::DataOut(d) => self.data_out(rd, header, d).await?,
            Bhs::NopOut(nop) => {
                let data = framing::read_data_vec(rd, header).await?;
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
                let data = framing::read_data_vec(rd, header).await?;
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
                framing::skip(rd, header.body_len()).await?;
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
                        // Resets (not aborts) end SPC-2 reservations; persistent ones stay.
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
                framing::skip(rd, header.body_len()).await?;
                self.accept_cmd_sn(l.immediate, l.cmd_sn);
                self.out.send_last(
                    LogoutResponse {
                        response: logout_response::SUCCESS,
                        itt: l.itt,
                        ..Default::default()
                    },
                    OutData::None,
                    true,
                );
                return Ok(Next::Close);
            }
            Bhs::Snack(_) => {
                // ErrorRecoveryLevel 0: SNACK is not supported (RFC 7143 §11.16).
                framing::skip(rd, header.body_len()).await?;
                self.reject(reject_reason::SNACK_REJECT, header);
            }
            other => {
                // A target-to-initiator opcode or a Login Request in full feature phase.
                tracing::warn!(opcode = ?other.opcode(), "unexpected PDU from the initiator");
                framing::skip(rd, header.body_len()).await?;
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
        let immediate_len = header.data_len();
        if !self.accept_cmd_sn(cmd.immediate, cmd.cmd_sn) {
            framing::skip(rd, header.body_len()).await?;
            return Ok(());
        }
        if self.pending.contains_key(&cmd.itt) {
            framing::skip(rd, header.body_len()).await?;
            self.reject(reject_reason::TASK_IN_PROGRESS, header);
            return Ok(());
        }
        let lun = u64::from(cmd.lun.number().unwrap_or(u16::MAX));
        let edtl = cmd.expected_data_len;
        tracing::trace!(itt = cmd.itt, cmd_sn = cmd.cmd_sn, edtl, cdb = ?cmd.cdb, immediate_len, "SCSI command");
        let prepared = if header.layout.ahs_len > 0 {
            // Extended CDBs (AHS type 1) are not supported: no command here needs one.
            Err(Sense::invalid_opcode().into())
        } else {
            self.shared.lun.prepare(&self.nexus, lun, &cmd.cdb)
        };
        let (cdb, transfer) = match prepared {
            Ok(p) => p,
            Err(sense) => {
                framing::skip(rd, header.body_len()).await?;
                self.fail_command(&cmd, sense, None);
                return Ok(());
            }
        };
        let Transfer::Out(needed) = transfer else {
            framing::skip(rd, header.body_len()).await?;
            // A READ's result stays in memory until the initiator has taken its Data-In, and
            // the CmdSN window moves on as each command arrives: an initiator that sends
            // READs and never reads the answers would pile up results without end. They are
            // reserved in the session's share like write buffers, before the read, so the
            // reader stops taking commands (backpressure) once the share is out.
            let data = match &cdb {
                Cdb::Read(range) if range.blocks > 0 && self.quota.is_some() => {
                    let len =
                        u64::from(range.blocks) * u64::from(self.shared.lun.backend().block_len());
                    let len = usize::try_from(len).context("a READ longer than memory")?;
                    DataOutBuf::ReadResult(self.reserve(len).await?)
                }
                _ => DataOutBuf::Empty,
            };
            let answer = Answer {
                itt: cmd.itt,
                edtl,
                read: cmd.read,
                write_residual: None,
            };
            self.dispatch(lun, cdb, answer, data);
            return Ok(());
        };
        // A WRITE whose expected length differs from the CDB's transfers only what both allow
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
                    framing::skip(rd, header.body_len()).await?;
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
            framing::skip(rd, header.body_len()).await?;
            let answer = Answer {
                itt: cmd.itt,
                edtl,
                read: false,
                write_residual: residual,
            };
            self.dispatch(lun, cdb, answer, DataOutBuf::Empty);
            return Ok(());
        }
        // Reserved before the buffer exists: what a command announces is what it may cost.
        let reservation = self.reserve(needed as usize).await?;
        let mut buf = self.shared.buffers.take(needed as usize);
        framing::read_body(rd, &mut buf[..immediate_len]).await?;
        framing::skip_padding(rd, header).await?;
        let unsolicited_open = !cmd.final_ && !self.params.initial_r2t;
        let pending = PendingWrite {
            lun,
            cmd: cdb,
            buf,
            reservation,
            gather: Gather::new(
                needed as usize,
                immediate_len,
                unsolicited_open,
                self.params.first_burst_length as usize,
            ),
            expected_len: edtl,
            residual,
        };
        self.advance_write(cmd.itt, pending);
        Ok(())
    }

    /// Reserves `len` bytes (a write buffer or a READ's result) in the session's share of the
    /// budget. When the share is short, waits for running commands and unsent results to give
    /// theirs back, reading nothing more meanwhile (the initiator's data waits in the socket:
    /// backpressure). When even that cannot free enough, the share being held by writes that
    /// wait for data behind this command on this very connection, the wait would never end:
    /// the connection is dropped.
    async fn reserve(&self, len: usize) -> anyhow::Result<Reservation> {
        let Some(quota) = &self.quota else {
            anyhow::bail!("a data transfer in a session without a buffer quota");
        };
        if let Some(r) = quota.try_reserve(len) {
            return Ok(r);
        }
        let waiting_for_data: usize = self
            .pending
            .values()
            .map(|p| match p {
                Pending::Write(w) => w.reservation.bytes(),
                Pending::Draining { .. } => 0,
            })
            .sum();
        if waiting_for_data.saturating_add(len) > SESSION_WRITE_QUOTA {
            anyhow::bail!(
                "a transfer of {len} bytes does not fit the session's buffer quota \
                 ({SESSION_WRITE_QUOTA} bytes; {waiting_for_data} held by writes waiting for \
                 their data)"
            );
        }
        tracing::debug!(
            len,
            waiting_for_data,
            "buffer quota in use; waiting for commands and unsent results"
        );
        quota.reserve(len).await.context("reserving a write buffer")
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
        self.pending
            .insert(cmd.itt, Pending::Draining { sense, residual });
    }

    /// Sends the next R2T, or runs the write once all its data is in; otherwise keeps it
    /// pending.
    fn advance_write(&mut self, itt: u32, mut p: PendingWrite) {
        let max_burst = self.params.max_burst_length as usize;
        match p.gather.next(max_burst, || self.new_ttt()) {
            Step::Complete => self.dispatch_write(itt, p),
            Step::Waiting => {
                self.pending.insert(itt, Pending::Write(p));
            }
            Step::R2t(r2t) => {
                self.out.send(
                    R2t {
                        lun: vmdeploy_shared::iscsi::Lun::from_number(p.lun as u16),
                        itt,
                        ttt: r2t.ttt,
                        r2t_sn: r2t.r2t_sn,
                        buffer_offset: r2t.offset as u32,
                        desired_len: r2t.len as u32,
                        ..Default::default()
                    },
                    OutData::None,
                    false,
                );
                self.pending.insert(itt, Pending::Write(p));
            }
        }
    }

    /// The next Target Transfer Tag (never the reserved value).
    fn new_ttt(&mut self) -> u32 {
        let ttt = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        ttt
    }

    async fn data_out<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        header: &Header,
        d: vmdeploy_shared::iscsi::DataOut,
    ) -> anyhow::Result<()> {
        let p = match self.pending.remove(&d.itt) {
            Some(Pending::Write(p)) => p,
            Some(Pending::Draining { sense, residual }) => {
                framing::skip(rd, header.body_len()).await?;
                if d.final_ {
                    self.respond_sense(d.itt, sense, residual);
                } else {
                    self.pending
                        .insert(d.itt, Pending::Draining { sense, residual });
                }
                return Ok(());
            }
            None => {
                // Data for a command already answered (rejected, aborted): drop it quietly.
                framing::skip(rd, header.body_len()).await?;
                return Ok(());
            }
        };
        let mut p = p;
        // ERL 0: a sequence error in Data-Out ends the connection (RFC 7143 §7.1.4.1).
        let place = p.gather.place(&d, header.data_len())?;
        p.buf[place.zero].fill(0);
        framing::read_body(rd, &mut p.buf[place.data]).await?;
        framing::skip_padding(rd, header).await?;
        self.advance_write(d.itt, p);
        Ok(())
    }

    fn dispatch_write(&mut self, itt: u32, mut p: PendingWrite) {
        if p.gather.received() < p.buf.len() {
            tracing::warn!(
                itt,
                received = p.gather.received(),
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
        let filled_to = p.gather.filled_to();
        if let Some(rest) = p.buf.get_mut(filled_to..) {
            rest.fill(0);
        }
        let answer = Answer {
            itt,
            edtl: p.expected_len,
            read: false,
            write_residual: p.residual,
        };
        self.dispatch(
            p.lun,
            p.cmd,
            answer,
            DataOutBuf::Aligned(p.buf, p.reservation),
        );
    }

    /// Runs a command on the blocking pool and queues its response.
    fn dispatch(&self, lun: u64, cmd: Cdb, answer: Answer, data: DataOutBuf) {
        let shared = self.shared.clone();
        let nexus = self.nexus.clone();
        let out = self.out.clone();
        let limits = DataInLimits {
            max_xmit: (self.params.max_xmit_data_segment_length as usize)
                .clamp(512, MAX_SEND_SEGMENT),
            max_burst: self.params.max_burst_length as usize,
        };
        let stats = self.stats.clone();
        stats.started(data.as_slice().len());
        let job_stats = stats.clone();
        let inflight = shared.inflight.clone();
        // The job answers from the blocking thread itself: waking a task only to queue the
        // response was one more thread hop per command (bench/iscsi-write.sh).
        let job = move |permit: OwnedSemaphorePermit| {
            let _permit = permit;
            let mut outcome: Outcome =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
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
            match data {
                DataOutBuf::Aligned(buf, reservation) => {
                    // Idle in the pool, the buffer no longer counts against the session.
                    shared.buffers.give(buf);
                    drop(reservation);
                }
                DataOutBuf::ReadResult(reservation) => {
                    if let Ok(Some(payload)) = outcome {
                        outcome = Ok(Some(Payload::Reserved(Box::new(payload), reservation)));
                    }
                }
                DataOutBuf::Empty => {}
            }
            job_stats.finished();
            send_outcome(&out, &answer, outcome, limits);
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

    fn respond_sense(&self, itt: u32, sense: impl Into<Failure>, residual: Residual) {
        send_sense(&self.out, itt, sense.into(), residual);
    }
}

/// Data-out handed to a command job.
enum DataOutBuf {
    Empty,
    /// The gathered data, and its bytes in the session's share until the job is done.
    Aligned(AlignedBuf, Reservation),
    /// No data-out; the bytes of the READ's result in the session's share, handed on to the
    /// result until it is sent.
    ReadResult(Reservation),
}

impl DataOutBuf {
    fn as_slice(&self) -> &[u8] {
        match self {
            DataOutBuf::Empty | DataOutBuf::ReadResult(_) => &[],
            DataOutBuf::Aligned(b, _) => b,
        }
    }
}
