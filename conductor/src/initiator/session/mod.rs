//! The full feature phase: SCSI commands over one logged-in connection, many at once.
//!
//! # Design
//! A reader task (`reader.rs`) owns the receive side. It keeps ExpStatSN and the CmdSN window (ExpCmdSN,
//! MaxCmdSN; RFC 7143 §4.2.2.1) up to date, answers target pings (NOP-In with a transfer tag),
//! and routes every other PDU by Initiator Task Tag to the command that owns it. A command:
//! 1. waits until CmdSN ≤ MaxCmdSN, then, holding the send lock, takes the next CmdSN and sends
//!    the SCSI Command with immediate data and any unsolicited Data-Out (up to FirstBurstLength
//!    when InitialR2T=No, RFC 7143 §13.10-13.14), so commands reach the target in CmdSN order;
//! 2. answers each R2T with Data-Out PDUs of at most the target's MaxRecvDataSegmentLength;
//! 3. copies Data-In into its buffer, and finishes on the status (in a SCSI Response or the
//!    last Data-In).
//!
//! A target that says nothing for `Timeouts::command` fails the command; a lost connection fails
//! every command with the reason the reader saw.
//!
//! Whole-image transfers with many commands in flight are in `pipeline.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};
use vmdeploy_shared::iscsi::keys::OperationalParams;
use vmdeploy_shared::iscsi::pdu::{
    logout_reason, logout_response, response_code, scsi_status, sense_from_segment, sn_le, sn_lt,
    task_attr,
};
use vmdeploy_shared::iscsi::scsi::{build, Capacity, Sense, SenseKey};
use vmdeploy_shared::iscsi::{
    Bhs, DataOut, Digests, LogoutRequest, Lun, Pdu, ScsiCommand, SessionKind, RESERVED_TAG,
};

mod reader;

use super::login::login;
use super::transport::{send_pdu, shutdown};
use super::{with_timeout, InitiatorError, SessionConfig, Timeouts};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves plain counters behind: still usable.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct Sequence {
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
    next_itt: u32,
}

struct Inner {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    seq: Mutex<Sequence>,
    window: Notify,
    tasks: Mutex<HashMap<u32, mpsc::UnboundedSender<Pdu>>>,
    dead: Mutex<Option<String>>,
    /// Set by `logout`: the connection ending is expected, not a failure worth a warning.
    closing: AtomicBool,
    params: OperationalParams,
    digests: Digests,
    lun: Lun,
    timeouts: Timeouts,
    target: String,
    reader: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(reader) = lock(&self.reader).take() {
            reader.abort();
        }
    }
}

impl Inner {
    fn dead_reason(&self) -> Option<String> {
        lock(&self.dead).clone()
    }

    /// Marks the session failed: every waiting command is woken and fails with `reason`.
    fn fail(&self, reason: String) {
        {
            let mut dead = lock(&self.dead);
            if dead.is_none() {
                if self.closing.load(Ordering::Relaxed) {
                    debug!(target_name = %self.target, %reason, "iSCSI session closed");
                } else {
                    warn!(target_name = %self.target, %reason, "iSCSI session failed");
                }
                *dead = Some(reason);
            }
        }
        lock(&self.tasks).clear();
        self.window.notify_waiters();
    }

    fn lost(&self) -> InitiatorError {
        InitiatorError::ConnectionLost(
            self.dead_reason()
                .unwrap_or_else(|| "the session was closed".to_string()),
        )
    }

    fn update_window(&self, exp_cmd_sn: u32, max_cmd_sn: u32) {
        // RFC 7143 §4.2.2.1: ignore MaxCmdSN < ExpCmdSN - 1, and never move the window back.
        if sn_lt(max_cmd_sn, exp_cmd_sn.wrapping_sub(1)) {
            return;
        }
        let mut seq = lock(&self.seq);
        if sn_lt(seq.exp_cmd_sn, exp_cmd_sn) {
            seq.exp_cmd_sn = exp_cmd_sn;
        }
        if sn_lt(seq.max_cmd_sn, max_cmd_sn) {
            seq.max_cmd_sn = max_cmd_sn;
            drop(seq);
            self.window.notify_waiters();
        }
    }

    fn update_stat_sn(&self, stat_sn: u32) {
        let mut seq = lock(&self.seq);
        let next = stat_sn.wrapping_add(1);
        if sn_lt(seq.exp_stat_sn, next) {
            seq.exp_stat_sn = next;
        }
    }

    fn exp_stat_sn(&self) -> u32 {
        lock(&self.seq).exp_stat_sn
    }

    async fn send(&self, writer: &mut OwnedWriteHalf, pdu: &Pdu) -> Result<(), InitiatorError> {
        if let Err(e) = send_pdu(writer, pdu, self.digests, self.timeouts.write).await {
            self.fail(e.to_string());
            return Err(e);
        }
        Ok(())
    }

    async fn lock_writer(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, OwnedWriteHalf>, InitiatorError> {
        match tokio::time::timeout(self.timeouts.write, self.writer.lock()).await {
            Ok(guard) => Ok(guard),
            Err(_) => Err(InitiatorError::Timeout(
                self.timeouts.write,
                "waiting to send (the connection is stalled)",
            )),
        }
    }

    /// Sends `data[offset..offset + len]` as Data-Out PDUs of at most MaxRecvDataSegmentLength
    /// of the target, DataSN from 0, F on the last (RFC 7143 §11.7).
    async fn send_data_out(
        &self,
        itt: u32,
        ttt: u32,
        data: &Bytes,
        offset: usize,
        len: usize,
    ) -> Result<(), InitiatorError> {
        let segment = (self.params.max_xmit_data_segment_length as usize).max(512);
        let mut writer = self.lock_writer().await?;
        let mut at = offset;
        let end = offset + len;
        let mut data_sn = 0u32;
        while at < end {
            let n = segment.min(end - at);
            let header = DataOut {
                final_: at + n == end,
                lun: self.lun,
                itt,
                ttt,
                exp_stat_sn: self.exp_stat_sn(),
                data_sn,
                buffer_offset: at as u32,
            };
            self.send(&mut writer, &Pdu::with_data(header, data.slice(at..at + n)))
                .await?;
            at += n;
            data_sn = data_sn.wrapping_add(1);
        }
        Ok(())
    }
}

/// What a command moves.
enum Payload {
    None,
    Read(usize),
    Write(Bytes),
}

/// Removes a command's routing entry however the command ends.
struct TaskEntry<'a> {
    inner: &'a Inner,
    itt: u32,
}

impl Drop for TaskEntry<'_> {
    fn drop(&mut self) {
        lock(&self.inner.tasks).remove(&self.itt);
    }
}

/// A logged-in session to one LUN. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
    capacity: Capacity,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("target", &self.inner.target)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Session {
    /// Connects, logs in, and reads the LUN's capacity (clearing the unit attention a fresh
    /// session may report first).
    pub async fn open(config: &SessionConfig) -> Result<Session, InitiatorError> {
        let connected = login(config, SessionKind::Normal).await?;
        let logged = connected.session;
        let inner = Arc::new(Inner {
            writer: tokio::sync::Mutex::new(connected.writer),
            seq: Mutex::new(Sequence {
                cmd_sn: logged.cmd_sn,
                exp_cmd_sn: logged.cmd_sn,
                max_cmd_sn: logged.max_cmd_sn,
                exp_stat_sn: logged.stat_sn,
                next_itt: 0x10,
            }),
            window: Notify::new(),
            tasks: Mutex::new(HashMap::new()),
            dead: Mutex::new(None),
            closing: AtomicBool::new(false),
            digests: logged.digests(),
            params: logged.params,
            lun: Lun::from_number(config.lun),
            timeouts: config.timeouts,
            target: config.target.clone(),
            reader: Mutex::new(None),
        });
        let reader = tokio::spawn(reader::read_loop(Arc::downgrade(&inner), connected.reader));
        *lock(&inner.reader) = Some(reader);
        let mut session = Session {
            inner,
            capacity: Capacity {
                blocks: 0,
                block_len: 512,
                physical_exponent: 0,
                thin: false,
                unmapped_reads_zero: false,
            },
        };
        // SPC-4 §5.14: the first command after a login may report UNIT ATTENTION (power on,
        // reset); it is informational, so retry a few times.
        let mut attempts = 0;
        let capacity = loop {
            match session.read_capacity().await {
                Err(InitiatorError::CheckCondition {
                    key: Some(SenseKey::UnitAttention),
                    ..
                }) if attempts < 3 => attempts += 1,
                other => break other?,
            }
        };
        if capacity.block_len == 0 || !capacity.block_len.is_multiple_of(512) {
            return Err(InitiatorError::Protocol(format!(
                "the LUN reports a block length of {} bytes",
                capacity.block_len
            )));
        }
        session.capacity = capacity;
        info!(
            target_name = %config.target,
            lun = config.lun,
            bytes = capacity.blocks * u64::from(capacity.block_len),
            block_len = capacity.block_len,
            "LUN ready"
        );
        Ok(session)
    }

    /// The negotiated operational parameters.
    pub fn params(&self) -> &OperationalParams {
        &self.inner.params
    }

    /// The LUN's capacity as read when the session opened.
    pub fn capacity(&self) -> Capacity {
        self.capacity
    }

    /// Size of the LUN in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.capacity.blocks * u64::from(self.capacity.block_len)
    }

    /// Logical block length.
    pub fn block_len(&self) -> usize {
        self.capacity.block_len as usize
    }

    /// A good size for one READ/WRITE: one MaxBurstLength (so a write needs one R2T at most
    /// after its unsolicited data), at least 64 KiB, at most 4 MiB, whole blocks.
    pub fn io_size(&self) -> usize {
        let burst = (self.inner.params.max_burst_length as usize).clamp(64 * 1024, 4 << 20);
        (burst / self.block_len()).max(1) * self.block_len()
    }

    /// TEST UNIT READY.
    pub async fn test_unit_ready(&self) -> Result<(), InitiatorError> {
        self.execute("TEST UNIT READY", build::test_unit_ready(), Payload::None)
            .await
            .map(drop)
    }

    /// READ CAPACITY (16), asked of the target now.
    pub async fn read_capacity(&self) -> Result<Capacity, InitiatorError> {
        let data = self
            .execute(
                "READ CAPACITY (16)",
                build::read_capacity_16(32),
                Payload::Read(32),
            )
            .await?;
        Capacity::parse_read_capacity_16(&data)
            .map_err(|e| InitiatorError::Protocol(format!("READ CAPACITY (16) data: {e}")))
    }

    fn check_range(&self, lba: u64, bytes: usize) -> Result<u32, InitiatorError> {
        let bl = self.block_len();
        if !bytes.is_multiple_of(bl) {
            return Err(InitiatorError::Range(format!(
                "{bytes} bytes is not a whole number of {bl}-byte blocks"
            )));
        }
        let blocks = (bytes / bl) as u64;
        if blocks > u64::from(u32::MAX) || lba.saturating_add(blocks) > self.capacity.blocks {
            return Err(InitiatorError::Range(format!(
                "blocks {lba}..{} are past the end of the LUN ({} blocks)",
                lba.saturating_add(blocks),
                self.capacity.blocks
            )));
        }
        Ok(blocks as u32)
    }

    /// READ (16) of `blocks` blocks at `lba`.
    pub async fn read(&self, lba: u64, blocks: u32) -> Result<Vec<u8>, InitiatorError> {
        let len = blocks as usize * self.block_len();
        self.check_range(lba, len)?;
        self.execute("READ (16)", build::read_16(lba, blocks), Payload::Read(len))
            .await
    }

    /// WRITE (16) of `data` (whole blocks) at `lba`.
    pub async fn write(&self, lba: u64, data: Bytes) -> Result<(), InitiatorError> {
        let blocks = self.check_range(lba, data.len())?;
        if blocks == 0 {
            return Ok(());
        }
        self.execute(
            "WRITE (16)",
            build::write_16(lba, blocks, false),
            Payload::Write(data),
        )
        .await
        .map(drop)
    }

    /// SYNCHRONIZE CACHE (16) of the whole LUN: the target's write cache reaches its disk.
    pub async fn synchronize_cache(&self) -> Result<(), InitiatorError> {
        self.execute(
            "SYNCHRONIZE CACHE (16)",
            build::synchronize_cache_16(),
            Payload::None,
        )
        .await
        .map(drop)
    }

    /// Logs out (close session) and closes the connection. Commands still running fail.
    pub async fn logout(&self) -> Result<(), InitiatorError> {
        let inner = &*self.inner;
        if let Some(reason) = inner.dead_reason() {
            return Err(InitiatorError::ConnectionLost(reason));
        }
        let (itt, mut rx, _entry) = self.register();
        inner.closing.store(true, Ordering::Relaxed);
        {
            let mut writer = inner.lock_writer().await?;
            let (cmd_sn, exp_stat_sn) = {
                let seq = lock(&inner.seq);
                (seq.cmd_sn, seq.exp_stat_sn)
            };
            // Immediate: carries the current CmdSN without using it up (RFC 7143 §3.2.2.1).
            let request = LogoutRequest {
                immediate: true,
                reason: logout_reason::CLOSE_SESSION,
                itt,
                cid: 0,
                cmd_sn,
                exp_stat_sn,
            };
            inner.send(&mut writer, &Pdu::new(request)).await?;
        }
        let reply = with_timeout(
            inner.timeouts.logout,
            "waiting for the logout response",
            async { rx.recv().await.ok_or_else(|| inner.lost()) },
        )
        .await?;
        {
            let mut writer = inner.lock_writer().await?;
            shutdown(&mut *writer).await;
        }
        inner.fail("logged out".into());
        match reply.bhs {
            Bhs::LogoutResponse(h) if h.response == logout_response::SUCCESS => {
                debug!(target_name = %inner.target, "logged out");
                Ok(())
            }
            Bhs::LogoutResponse(h) => Err(InitiatorError::Protocol(format!(
                "logout refused (response {})",
                h.response
            ))),
            other => Err(InitiatorError::Protocol(format!(
                "unexpected answer to logout: {:?}",
                other.opcode()
            ))),
        }
    }

    fn register(&self) -> (u32, mpsc::UnboundedReceiver<Pdu>, TaskEntry<'_>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut tasks = lock(&self.inner.tasks);
        let itt = {
            let mut seq = lock(&self.inner.seq);
            loop {
                let itt = seq.next_itt;
                seq.next_itt = seq.next_itt.wrapping_add(1);
                if itt != RESERVED_TAG && !tasks.contains_key(&itt) {
                    break itt;
                }
            }
        };
        tasks.insert(itt, tx);
        (
            itt,
            rx,
            TaskEntry {
                inner: &self.inner,
                itt,
            },
        )
    }

    /// Waits for room in the CmdSN window.
    async fn wait_window(&self) -> Result<(), InitiatorError> {
        let inner = &*self.inner;
        loop {
            let notified = inner.window.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if inner.dead_reason().is_some() {
                return Err(inner.lost());
            }
            {
                let seq = lock(&inner.seq);
                if sn_le(seq.cmd_sn, seq.max_cmd_sn) {
                    return Ok(());
                }
            }
            if tokio::time::timeout(inner.timeouts.command, notified)
                .await
                .is_err()
            {
                return Err(InitiatorError::Timeout(
                    inner.timeouts.command,
                    "waiting for the target to open its command window (MaxCmdSN)",
                ));
            }
        }
    }

    async fn execute(
        &self,
        op: &'static str,
        cdb: [u8; 16],
        payload: Payload,
    ) -> Result<Vec<u8>, InitiatorError> {
        let inner = &*self.inner;
        if inner.dead_reason().is_some() {
            return Err(inner.lost());
        }
        let (itt, mut rx, _entry) = self.register();
        let (read_len, write_data) = match payload {
            Payload::None => (0, Bytes::new()),
            Payload::Read(n) => (n, Bytes::new()),
            Payload::Write(data) => (0, data),
        };
        let write_len = write_data.len();
        let params = &inner.params;
        let segment = params.max_xmit_data_segment_length as usize;
        let first_burst = params.first_burst_length as usize;
        let immediate_len = if params.immediate_data {
            write_len.min(first_burst).min(segment)
        } else {
            0
        };
        let unsolicited_len = if params.initial_r2t {
            immediate_len
        } else {
            write_len.min(first_burst)
        };

        // Send the command (and its unsolicited data) in CmdSN order.
        loop {
            self.wait_window().await?;
            let mut writer = inner.lock_writer().await?;
            let (cmd_sn, exp_stat_sn) = {
                let mut seq = lock(&inner.seq);
                if !sn_le(seq.cmd_sn, seq.max_cmd_sn) {
                    continue; // another command took the last slot
                }
                let sn = seq.cmd_sn;
                seq.cmd_sn = sn.wrapping_add(1);
                (sn, seq.exp_stat_sn)
            };
            let command = ScsiCommand {
                immediate: false,
                final_: unsolicited_len == immediate_len,
                read: read_len > 0,
                write: write_len > 0,
                task_attr: task_attr::SIMPLE,
                lun: inner.lun,
                itt,
                expected_data_len: (read_len + write_len) as u32,
                cmd_sn,
                exp_stat_sn,
                cdb,
            };
            inner
                .send(
                    &mut writer,
                    &Pdu::with_data(command, write_data.slice(..immediate_len)),
                )
                .await?;
            drop(writer);
            if unsolicited_len > immediate_len {
                inner
                    .send_data_out(
                        itt,
                        RESERVED_TAG,
                        &write_data,
                        immediate_len,
                        unsolicited_len - immediate_len,
                    )
                    .await?;
            }
            break;
        }

        if inner.dead_reason().is_some() {
            // The session failed while this command was being sent: nothing will answer it.
            return Err(inner.lost());
        }
        let mut read_buf = vec![0u8; read_len];
        let mut received = 0usize;
        loop {
            let pdu = match tokio::time::timeout(inner.timeouts.command, rx.recv()).await {
                Ok(Some(pdu)) => pdu,
                Ok(None) => return Err(inner.lost()),
                Err(_) => {
                    let err = InitiatorError::Timeout(
                        inner.timeouts.command,
                        "waiting for the target to answer a command",
                    );
                    // ERL 0 has no way to resynchronise one task: the session is unusable.
                    inner.fail(format!("{op}: {err}"));
                    return Err(err);
                }
            };
            match pdu.bhs {
                Bhs::R2t(h) => {
                    let offset = h.buffer_offset as usize;
                    let len = h.desired_len as usize;
                    if len == 0 || offset.checked_add(len).is_none_or(|end| end > write_len) {
                        let reason = format!(
                            "{op}: R2T for bytes {offset}+{len} outside the {write_len}-byte transfer"
                        );
                        inner.fail(reason.clone());
                        return Err(InitiatorError::Protocol(reason));
                    }
                    inner
                        .send_data_out(itt, h.ttt, &write_data, offset, len)
                        .await?;
                }
                Bhs::DataIn(h) => {
                    let offset = h.buffer_offset as usize;
                    let end = offset.checked_add(pdu.data.len());
                    match end {
                        Some(end) if end <= read_len => {
                            read_buf[offset..end].copy_from_slice(&pdu.data);
                            received += pdu.data.len();
                        }
                        _ => {
                            let reason = format!(
                                "{op}: Data-In at {offset}+{} outside the {read_len}-byte buffer",
                                pdu.data.len()
                            );
                            inner.fail(reason.clone());
                            return Err(InitiatorError::Protocol(reason));
                        }
                    }
                    if h.has_status {
                        check_status(op, response_code::COMPLETED, h.status, &[])?;
                        if h.underflow {
                            read_buf.truncate(read_len.saturating_sub(h.residual_count as usize));
                        }
                        return Ok(read_buf);
                    }
                }
                Bhs::ScsiResponse(h) => {
                    check_status(op, h.response, h.status, &pdu.data)?;
                    if read_len > 0 && h.underflow {
                        read_buf.truncate(read_len.saturating_sub(h.residual_count as usize));
                    } else if read_len > 0 && received < read_len {
                        debug!(op, received, read_len, "short read without underflow flag");
                    }
                    return Ok(read_buf);
                }
                Bhs::Reject(r) => {
                    return Err(InitiatorError::CommandFailed {
                        op,
                        reason: format!("the target rejected a PDU (reason {:#04x})", r.reason),
                    })
                }
                other => {
                    return Err(InitiatorError::Protocol(format!(
                        "{op}: unexpected {:?} for this command",
                        other.opcode()
                    )))
                }
            }
        }
    }
}

fn check_status(
    op: &'static str,
    response: u8,
    status: u8,
    data: &[u8],
) -> Result<(), InitiatorError> {
    if response != response_code::COMPLETED {
        return Err(InitiatorError::CommandFailed {
            op,
            reason: format!("target failure (iSCSI response {response:#04x})"),
        });
    }
    match status {
        scsi_status::GOOD | scsi_status::CONDITION_MET => Ok(()),
        scsi_status::CHECK_CONDITION => {
            let raw = sense_from_segment(data);
            let (sense, key) = match Sense::parse(raw) {
                Ok(s) => (
                    format!(
                        "sense key {:?}, ASC/ASCQ {:02x}/{:02x}",
                        s.key, s.asc, s.ascq
                    ),
                    Some(s.key),
                ),
                Err(e) => (format!("undecodable sense data ({e})"), None),
            };
            Err(InitiatorError::CheckCondition { op, sense, key })
        }
        other => Err(InitiatorError::ScsiStatus { op, status: other }),
    }
}
