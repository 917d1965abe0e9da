//! The send side of one connection: PDUs are queued in order from the reader and from the
//! command jobs ([`Outbox`]), and one writer task stamps StatSN, ExpCmdSN and MaxCmdSN on each as
//! it goes out ([`writer_task`]), so the numbers follow the order on the wire whatever thread
//! queued the PDU.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use vmdeploy_shared::iscsi::pdu::{sn_le, stamp_sequence_numbers};
use vmdeploy_shared::iscsi::{Bhs, BHS_LEN};

use super::commands::Payload;
use super::framing;

/// Commands the initiator may have outstanding (MaxCmdSN - ExpCmdSN + 1).
pub const CMD_WINDOW: u32 = 64;

/// Data attached to an outgoing PDU.
pub enum OutData {
    /// No data segment.
    None,
    /// Bytes built for this PDU (sense, text, a rejected header).
    Bytes(Bytes),
    /// `start..end` of a command's result, shared by the Data-In PDUs that carry it.
    Slice(Arc<Payload>, usize, usize),
}

impl OutData {
    fn as_slice(&self) -> &[u8] {
        match self {
            OutData::None => &[],
            OutData::Bytes(b) => b,
            OutData::Slice(p, start, end) => &p.as_slice()[*start..*end],
        }
    }
}

/// An outgoing PDU; the writer fills in the sequence numbers.
pub struct OutPdu {
    header: [u8; BHS_LEN],
    data: OutData,
    /// The PDU carries a status and takes the next StatSN.
    takes_stat_sn: bool,
    /// Close the connection after this PDU (logout).
    close_after: bool,
}

#[cfg(test)]
impl OutPdu {
    /// The header decoded, the data, and whether the PDU takes a StatSN.
    pub fn decoded(&self) -> (Bhs, Vec<u8>, bool) {
        let bhs = Bhs::decode(&self.header).expect("the outbox encodes valid headers");
        (bhs, self.data.as_slice().to_vec(), self.takes_stat_sn)
    }
}

/// The CmdSN window of the session (one connection per session here): ExpCmdSN, moved by the
/// reader, read by the writer for every PDU it stamps.
#[derive(Debug)]
pub struct CmdWindow {
    exp_cmd_sn: AtomicU32,
}

impl CmdWindow {
    /// A window whose next expected CmdSN is `exp_cmd_sn`.
    pub fn new(exp_cmd_sn: u32) -> CmdWindow {
        CmdWindow {
            exp_cmd_sn: AtomicU32::new(exp_cmd_sn),
        }
    }

    /// ExpCmdSN.
    pub fn exp(&self) -> u32 {
        self.exp_cmd_sn.load(Ordering::Acquire)
    }

    /// MaxCmdSN.
    pub fn max(&self) -> u32 {
        self.exp().wrapping_add(CMD_WINDOW - 1)
    }

    /// Checks a request's CmdSN (RFC 7143 §4.2.2.1) and, for a non-immediate one, moves the
    /// window past it. `false`: outside the window, the PDU is to be ignored.
    pub fn accept(&self, immediate: bool, cmd_sn: u32) -> bool {
        let exp = self.exp();
        if !sn_le(exp, cmd_sn) || !sn_le(cmd_sn, self.max()) {
            tracing::warn!(cmd_sn, exp, "CmdSN outside the window; PDU ignored");
            return false;
        }
        if !immediate {
            self.exp_cmd_sn
                .store(cmd_sn.wrapping_add(1), Ordering::Release);
        }
        true
    }
}

/// The queue to the writer task. Clones share it; the writer ends when every clone is gone.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<OutPdu>,
}

impl Outbox {
    /// An outbox and the receiving end for [`writer_task`].
    pub fn channel() -> (Outbox, mpsc::UnboundedReceiver<OutPdu>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Outbox { tx }, rx)
    }

    /// Queues a PDU; `takes_stat_sn` when it carries a status (RFC 7143 §4.2.2.2).
    pub fn send(&self, bhs: impl Into<Bhs>, data: OutData, takes_stat_sn: bool) {
        self.push(bhs, data, takes_stat_sn, false);
    }

    /// Queues the last PDU of the connection: the writer closes it after this one.
    pub fn send_last(&self, bhs: impl Into<Bhs>, data: OutData, takes_stat_sn: bool) {
        self.push(bhs, data, takes_stat_sn, true);
    }

    fn push(&self, bhs: impl Into<Bhs>, data: OutData, takes_stat_sn: bool, close_after: bool) {
        let header = bhs.into().encode(0, data.as_slice().len());
        // A closed channel means the writer ended; the reader notices on its next read.
        let _ = self.tx.send(OutPdu {
            header,
            data,
            takes_stat_sn,
            close_after,
        });
    }
}

/// Writes the queued PDUs in order, stamping StatSN (from `stat_sn` on) and the window, until
/// every [`Outbox`] is dropped or a PDU closes the connection. Flushes whenever the queue runs
/// empty, so PDUs queued together go out in one write.
pub async fn writer_task<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<OutPdu>,
    mut stat_sn: u32,
    window: Arc<CmdWindow>,
) -> anyhow::Result<()> {
    while let Some(mut pdu) = rx.recv().await {
        stamp_sequence_numbers(&mut pdu.header, stat_sn, window.exp(), window.max());
        if pdu.takes_stat_sn {
            stat_sn = stat_sn.wrapping_add(1);
        }
        framing::write_pdu(&mut wr, &pdu.header, pdu.data.as_slice())
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

#[cfg(test)]
mod tests {
    use super::*;
    use vmdeploy_shared::iscsi::{
        Digests, LogoutResponse, NopIn, Pdu, R2t, ScsiResponse, RESERVED_TAG,
    };

    /// Everything a writer task sends for `queue`, decoded.
    async fn written(window: Arc<CmdWindow>, queue: impl FnOnce(&Outbox)) -> Vec<Pdu> {
        let (out, rx) = Outbox::channel();
        queue(&out);
        drop(out);
        let mut wire = Vec::new();
        writer_task(&mut wire, rx, 10, window)
            .await
            .expect("writes");
        let mut pdus = Vec::new();
        let mut at = 0;
        while at < wire.len() {
            let (pdu, used) = Pdu::decode(&wire[at..], Digests::NONE, 1 << 20).expect("decodes");
            pdus.push(pdu);
            at += used;
        }
        pdus
    }

    fn numbers(pdu: &Pdu) -> (u32, u32, u32) {
        match &pdu.bhs {
            Bhs::NopIn(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn),
            Bhs::R2t(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn),
            Bhs::ScsiResponse(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn),
            Bhs::LogoutResponse(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn),
            other => panic!("unexpected {:?}", other.opcode()),
        }
    }

    #[tokio::test]
    async fn pdus_go_out_in_order_with_stat_sn_only_taken_by_statuses() {
        let window = Arc::new(CmdWindow::new(5));
        let pdus = written(window, |out| {
            out.send(
                NopIn {
                    itt: 1,
                    ttt: RESERVED_TAG,
                    ..Default::default()
                },
                OutData::Bytes(Bytes::from_static(b"ping!")),
                true,
            );
            out.send(
                R2t {
                    itt: 2,
                    ttt: 7,
                    ..Default::default()
                },
                OutData::None,
                false,
            );
            out.send(
                ScsiResponse {
                    itt: 2,
                    ..Default::default()
                },
                OutData::Slice(Arc::new(Payload::Heap(vec![1, 2, 3, 4, 5, 6])), 2, 5),
                true,
            );
        })
        .await;
        let itts: Vec<u32> = pdus.iter().map(|p| p.bhs.itt()).collect();
        assert_eq!(itts, [1, 2, 2], "queue order");
        let stamped: Vec<_> = pdus.iter().map(numbers).collect();
        // An R2T shows the next StatSN without using it (RFC 7143 §11.8.3).
        assert_eq!(stamped, [(10, 5, 68), (11, 5, 68), (11, 5, 68)]);
        assert_eq!(&pdus[0].data[..], b"ping!");
        assert_eq!(&pdus[2].data[..], &[3, 4, 5], "the slice of the payload");
    }

    #[tokio::test]
    async fn the_last_pdu_closes_the_connection_and_the_window_moves() {
        let window = Arc::new(CmdWindow::new(u32::MAX));
        assert!(window.accept(false, u32::MAX), "the expected CmdSN");
        assert_eq!(window.exp(), 0, "wraps");
        assert!(window.accept(true, 0), "immediate: checked, not consumed");
        assert_eq!(window.exp(), 0);
        assert!(!window.accept(false, 64), "beyond MaxCmdSN");
        assert!(!window.accept(false, u32::MAX), "already used");
        let pdus = written(window, |out| {
            out.send_last(
                LogoutResponse {
                    itt: 3,
                    ..Default::default()
                },
                OutData::None,
                true,
            );
            out.send(NopIn::default(), OutData::None, false);
        })
        .await;
        assert_eq!(pdus.len(), 1, "nothing after the closing PDU");
        assert_eq!(numbers(&pdus[0]), (10, 0, 63));
    }
}
