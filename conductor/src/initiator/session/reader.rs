//! The session's reader task: the one owner of the receive side. It keeps ExpStatSN and the
//! CmdSN window up to date from every PDU, answers the target's pings, and routes each PDU by
//! Initiator Task Tag to the command waiting for it.

use std::sync::Weak;

use tokio::net::tcp::OwnedReadHalf;
use tracing::{debug, warn};
use vmdeploy_shared::iscsi::{Bhs, Lun, NopOut, Pdu, RESERVED_TAG};

use super::{lock, Inner};
use crate::initiator::transport::PduReader;

/// The reader task: decodes PDUs, keeps the sequence numbers, routes PDUs to their commands.
pub(super) async fn read_loop(weak: Weak<Inner>, mut reader: PduReader<OwnedReadHalf>) {
    let reason = loop {
        let next = reader.next().await;
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let pdu = match next {
            Ok(Some(pdu)) => pdu,
            Ok(None) => break "the target closed the connection".to_string(),
            Err(e) => break e.to_string(),
        };
        if let Some((stat_sn, exp_cmd_sn, max_cmd_sn)) = sequence_numbers(&pdu.bhs) {
            if let Some(stat_sn) = stat_sn {
                inner.update_stat_sn(stat_sn);
            }
            inner.update_window(exp_cmd_sn, max_cmd_sn);
        }
        let route_to = match &pdu.bhs {
            Bhs::NopIn(h) => {
                if h.ttt != RESERVED_TAG {
                    // The target pings and wants an answer (RFC 7143 §11.19.1).
                    let (ttt, lun) = (h.ttt, h.lun);
                    let weak = weak.clone();
                    tokio::spawn(async move {
                        if let Some(inner) = weak.upgrade() {
                            answer_ping(&inner, ttt, lun).await;
                        }
                    });
                }
                (h.itt != RESERVED_TAG).then_some(h.itt)
            }
            Bhs::AsyncMessage(h) => {
                match h.event {
                    1 => warn!(target_name = %inner.target, "the target asks for a logout"),
                    2 | 3 => {
                        break format!(
                            "the target announced it drops the connection (async event {})",
                            h.event
                        )
                    }
                    _ => debug!(event = h.event, "async message"),
                }
                None
            }
            // The data segment of a Reject is the rejected header: its ITT names the command.
            Bhs::Reject(_) => pdu
                .data
                .get(16..20)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            other => Some(other.itt()),
        };
        if let Some(itt) = route_to {
            let sender = lock(&inner.tasks).get(&itt).cloned();
            match sender {
                Some(tx) => {
                    let _ = tx.send(pdu);
                }
                None => debug!(itt, opcode = ?pdu.bhs.opcode(), "PDU for no running command"),
            }
        }
    };
    if let Some(inner) = weak.upgrade() {
        inner.fail(reason);
    }
}

/// The StatSN a target PDU uses up (`None` for those that take none: R2T, NOP-In, Data-In
/// without status) and its ExpCmdSN and MaxCmdSN.
fn sequence_numbers(bhs: &Bhs) -> Option<(Option<u32>, u32, u32)> {
    Some(match bhs {
        Bhs::ScsiResponse(h) => (Some(h.stat_sn), h.exp_cmd_sn, h.max_cmd_sn),
        Bhs::DataIn(h) => (
            h.has_status.then_some(h.stat_sn),
            h.exp_cmd_sn,
            h.max_cmd_sn,
        ),
        Bhs::R2t(h) => (None, h.exp_cmd_sn, h.max_cmd_sn),
        Bhs::NopIn(h) => (None, h.exp_cmd_sn, h.max_cmd_sn),
        Bhs::TextResponse(h) => (Some(h.stat_sn), h.exp_cmd_sn, h.max_cmd_sn),
        Bhs::LogoutResponse(h) => (Some(h.stat_sn), h.exp_cmd_sn, h.max_cmd_sn),
        Bhs::TaskMgmtResponse(h) => (Some(h.stat_sn), h.exp_cmd_sn, h.max_cmd_sn),
        Bhs::AsyncMessage(h) => (Some(h.stat_sn), h.exp_cmd_sn, h.max_cmd_sn),
        Bhs::Reject(h) => (Some(h.stat_sn), h.exp_cmd_sn, h.max_cmd_sn),
        _ => return None,
    })
}

async fn answer_ping(inner: &Inner, ttt: u32, lun: Lun) {
    let Ok(mut writer) = inner.lock_writer().await else {
        return;
    };
    let (cmd_sn, exp_stat_sn) = {
        let seq = lock(&inner.seq);
        (seq.cmd_sn, seq.exp_stat_sn)
    };
    let answer = NopOut {
        immediate: true,
        lun,
        itt: RESERVED_TAG,
        ttt,
        cmd_sn,
        exp_stat_sn,
    };
    let _ = inner.send(&mut writer, &Pdu::new(answer)).await;
}
