//! How the target answers a command (RFC 7143 §11.4, §11.7): the result as Data-In PDUs with
//! the status in the last one, or a SCSI Response (GOOD with residuals, or CHECK CONDITION with
//! sense data), queued on the connection's [`Outbox`].

use std::sync::Arc;

use bytes::Bytes;
use vmdeploy_shared::iscsi::pdu::{response_code, scsi_status, sense_segment};
use vmdeploy_shared::iscsi::scsi::Failure;
use vmdeploy_shared::iscsi::{DataIn, Reject, ScsiResponse, BHS_LEN, RESERVED_TAG};

use super::commands::Outcome;
use super::outbox::{OutData, Outbox};

/// A residual to report: (overflow, count); `None` when the lengths agree.
pub type Residual = Option<(bool, u32)>;

/// The command a result answers.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    /// Initiator Task Tag.
    pub itt: u32,
    /// Expected Data Transfer Length.
    pub edtl: u32,
    /// The R bit: the initiator expects data in.
    pub read: bool,
    /// A WRITE that moved less or more than its CDB asked (connection.rs decides).
    pub write_residual: Residual,
}

/// How Data-In is cut: the initiator's MaxRecvDataSegmentLength (as this target clamps it) and
/// MaxBurstLength.
#[derive(Debug, Clone, Copy)]
pub struct DataInLimits {
    /// Longest Data-In data segment.
    pub max_xmit: usize,
    /// Bytes per Data-In sequence (F bit at each end).
    pub max_burst: usize,
}

/// Queues a Reject of the PDU whose header is `header` (RFC 7143 §11.17: the data segment is
/// the rejected header).
pub fn send_reject(out: &Outbox, reason: u8, header: &[u8; BHS_LEN]) {
    out.send(
        Reject {
            reason,
            data_sn: 0,
            ..Default::default()
        },
        OutData::Bytes(Bytes::copy_from_slice(header)),
        true,
    );
}

/// Queues a failed command's status: CHECK CONDITION with its sense data, or RESERVATION
/// CONFLICT (which carries none).
pub fn send_sense(out: &Outbox, itt: u32, failure: Failure, residual: Residual) {
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
pub fn send_outcome(out: &Outbox, answer: &Answer, outcome: Outcome, limits: DataInLimits) {
    let Answer {
        itt,
        edtl,
        read,
        write_residual,
    } = *answer;
    let payload = match outcome {
        Err(failure) => return send_sense(out, itt, failure, None),
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
                status: scsi_status::GOOD,
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
        let len = (sent - offset).min(limits.max_xmit);
        let end = offset + len;
        let last = end == sent;
        // F closes a Data-In sequence at each MaxBurstLength and at the end (RFC 7143 §11.7.1).
        let burst_end = last || end - burst_start >= limits.max_burst;
        out.send(
            DataIn {
                final_: burst_end,
                has_status: last,
                status: scsi_status::GOOD,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::commands::Payload;
    use vmdeploy_shared::iscsi::pdu::sense_from_segment;
    use vmdeploy_shared::iscsi::scsi::{asc, Sense};
    use vmdeploy_shared::iscsi::Bhs;

    /// What `queue` puts in an outbox: header, data, whether it takes a StatSN.
    fn queued(queue: impl FnOnce(&Outbox)) -> Vec<(Bhs, Vec<u8>, bool)> {
        let (out, mut rx) = Outbox::channel();
        queue(&out);
        drop(out);
        let mut all = Vec::new();
        while let Ok(pdu) = rx.try_recv() {
            all.push(pdu.decoded());
        }
        all
    }

    fn read_answer(edtl: u32) -> Answer {
        Answer {
            itt: 4,
            edtl,
            read: true,
            write_residual: None,
        }
    }

    const LIMITS: DataInLimits = DataInLimits {
        max_xmit: 4,
        max_burst: 8,
    };

    #[test]
    fn data_in_is_cut_by_segment_and_burst_with_the_status_last() {
        let payload = Payload::Heap((0u8..10).collect());
        let pdus = queued(|out| send_outcome(out, &read_answer(10), Ok(Some(payload)), LIMITS));
        let mut expect_offset = 0;
        let mut shape = Vec::new();
        for (i, (bhs, data, takes_stat_sn)) in pdus.iter().enumerate() {
            let Bhs::DataIn(h) = bhs else {
                panic!("Data-In expected, got {:?}", bhs.opcode())
            };
            assert_eq!(
                (h.itt, h.data_sn, h.buffer_offset),
                (4, i as u32, expect_offset)
            );
            assert_eq!(
                data[0], expect_offset as u8,
                "the payload's bytes at that offset"
            );
            expect_offset += data.len() as u32;
            shape.push((data.len(), h.final_, h.has_status, *takes_stat_sn));
        }
        // 4 + 4 closes the first 8-byte burst (F); the last PDU carries F, S and the StatSN.
        assert_eq!(
            shape,
            [
                (4, false, false, false),
                (4, true, false, false),
                (2, true, true, true)
            ]
        );
        let Bhs::DataIn(last) = &pdus[2].0 else {
            unreachable!()
        };
        assert_eq!(
            (last.status, last.underflow, last.overflow),
            (scsi_status::GOOD, false, false)
        );
    }

    #[test]
    fn residuals_of_short_and_long_results() {
        let short = queued(|out| {
            send_outcome(
                out,
                &read_answer(16),
                Ok(Some(Payload::Heap(vec![1; 6]))),
                LIMITS,
            )
        });
        let Some((Bhs::DataIn(h), _, true)) = short.last() else {
            panic!("a final Data-In with status")
        };
        assert_eq!(
            (h.underflow, h.overflow, h.residual_count),
            (true, false, 10)
        );

        let long = queued(|out| {
            send_outcome(
                out,
                &read_answer(2),
                Ok(Some(Payload::Heap(vec![1; 6]))),
                LIMITS,
            )
        });
        assert_eq!(long.len(), 1);
        let (Bhs::DataIn(h), data, true) = &long[0] else {
            panic!("one Data-In with status")
        };
        assert_eq!(data.len(), 2, "no more than the initiator expects");
        assert_eq!(
            (h.underflow, h.overflow, h.residual_count),
            (false, true, 4)
        );
    }

    #[test]
    fn commands_without_data_in_get_a_scsi_response() {
        let write = Answer {
            itt: 6,
            edtl: 4096,
            read: false,
            write_residual: Some((false, 512)),
        };
        let pdus = queued(|out| send_outcome(out, &write, Ok(None), LIMITS));
        let [(Bhs::ScsiResponse(h), data, true)] = &pdus[..] else {
            panic!("one SCSI Response, got {pdus:?}")
        };
        assert!(data.is_empty());
        assert_eq!(
            (h.itt, h.status, h.response, h.underflow, h.residual_count),
            (6, scsi_status::GOOD, response_code::COMPLETED, true, 512)
        );
    }

    #[test]
    fn a_reservation_conflict_has_its_status_and_no_sense_data() {
        let pdus = queued(|out| send_sense(out, 9, Failure::ReservationConflict, None));
        let [(Bhs::ScsiResponse(h), data, true)] = &pdus[..] else {
            panic!("one SCSI Response, got {pdus:?}")
        };
        assert_eq!(h.status, scsi_status::RESERVATION_CONFLICT);
        assert!(
            data.is_empty(),
            "RESERVATION CONFLICT carries no sense data"
        );
    }

    #[test]
    fn failures_carry_sense_data() {
        let sense = Sense::illegal_request(asc::INVALID_FIELD_IN_INFORMATION_UNIT);
        let pdus = queued(|out| send_outcome(out, &read_answer(512), Err(sense.into()), LIMITS));
        let [(Bhs::ScsiResponse(h), data, true)] = &pdus[..] else {
            panic!("one SCSI Response, got {pdus:?}")
        };
        assert_eq!(h.status, scsi_status::CHECK_CONDITION);
        assert_eq!(sense_from_segment(data), &sense.to_fixed()[..]);
        assert!(!h.underflow && !h.overflow, "no residual on a failure");

        let with_residual = queued(|out| send_sense(out, 1, sense.into(), Some((true, 3))));
        let [(Bhs::ScsiResponse(h), _, true)] = &with_residual[..] else {
            panic!("one SCSI Response")
        };
        assert_eq!((h.overflow, h.residual_count), (true, 3));
    }

    #[test]
    fn rejects_carry_the_rejected_header() {
        let header = [0x41u8; BHS_LEN];
        let pdus = queued(|out| send_reject(out, 0x09, &header));
        let [(Bhs::Reject(r), data, true)] = &pdus[..] else {
            panic!("one Reject")
        };
        assert_eq!(r.reason, 0x09);
        assert_eq!(&data[..], &header[..]);
    }
}
