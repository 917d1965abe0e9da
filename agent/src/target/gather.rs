//! Where a write command's data goes as it arrives (RFC 7143 §4.2.5, §11.7, §11.8): immediate
//! data, then unsolicited Data-Out up to FirstBurstLength, then one R2T at a time of at most
//! MaxBurstLength, each sequence checked for its DataSN, offsets and F bit.
//!
//! # Design
//! [`Gather`] is bookkeeping only: it says which bytes of the command's buffer a Data-Out fills
//! (and which skipped bytes to zero), and which R2T to send next. The connection owns the
//! buffer and the socket, so the payload is read straight into place.
//!
//! # Limitations
//! ErrorRecoveryLevel 0: a Data-Out out of sequence is an error that ends the connection
//! (RFC 7143 §7.1.4.1); MaxOutstandingR2T is 1.

use std::ops::Range;

use vmdeploy_shared::iscsi::{DataOut, RESERVED_TAG};

/// The R2T outstanding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OpenR2t {
    ttt: u32,
    offset: usize,
    len: usize,
    next_data_sn: u32,
}

/// Where one Data-Out's payload goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Bytes the initiator skipped, to be zeroed (the buffer may come from the pool with an
    /// earlier command's data; a fresh buffer would hold zeroes there).
    pub zero: Range<usize>,
    /// Where the payload lands.
    pub data: Range<usize>,
}

/// An R2T to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2tRequest {
    /// Target Transfer Tag.
    pub ttt: u32,
    /// R2TSN.
    pub r2t_sn: u32,
    /// Buffer offset asked for.
    pub offset: usize,
    /// Desired Data Transfer Length.
    pub len: usize,
}

/// What the write needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Data-Out of an open sequence (unsolicited or the outstanding R2T) is still to come.
    Waiting,
    /// Send this R2T, then wait for its data.
    R2t(R2tRequest),
    /// Every byte has been asked for and has arrived.
    Complete,
}

/// The data-out progress of one write command.
#[derive(Debug, Clone)]
pub struct Gather {
    total: usize,
    received: usize,
    filled_to: usize,
    unsolicited_open: bool,
    unsolicited_limit: usize,
    unsolicited_data_sn: u32,
    requested: usize,
    r2t: Option<OpenR2t>,
    r2t_sn: u32,
}

impl Gather {
    /// A write of `total` bytes whose first `immediate_len` came with the command. Unsolicited
    /// Data-Out covers the first min(FirstBurstLength, total) bytes unless the command's F bit
    /// or InitialR2T=Yes says none follows (`unsolicited_open` false, RFC 7143 §4.2.5.2).
    pub fn new(
        total: usize,
        immediate_len: usize,
        unsolicited_open: bool,
        first_burst_length: usize,
    ) -> Gather {
        let unsolicited_limit = first_burst_length.min(total);
        Gather {
            total,
            received: immediate_len,
            filled_to: immediate_len,
            unsolicited_open,
            unsolicited_limit,
            unsolicited_data_sn: 0,
            requested: if unsolicited_open {
                unsolicited_limit
            } else {
                immediate_len
            },
            r2t: None,
            r2t_sn: 0,
        }
    }

    /// Checks a Data-Out of `len` bytes against the open sequences and records it as received.
    /// The caller zeroes `zero` and reads the payload into `data`.
    pub fn place(&mut self, d: &DataOut, len: usize) -> anyhow::Result<Placement> {
        let offset = d.buffer_offset as usize;
        let end = offset.saturating_add(len);
        // Which sequence does this PDU belong to, and is its DataSN the next one?
        let in_sequence = if d.ttt == RESERVED_TAG {
            let ok = self.unsolicited_open
                && d.data_sn == self.unsolicited_data_sn
                && end <= self.unsolicited_limit;
            self.unsolicited_data_sn = self.unsolicited_data_sn.wrapping_add(1);
            ok
        } else {
            match &mut self.r2t {
                Some(r2t) if r2t.ttt == d.ttt => {
                    let ok = d.data_sn == r2t.next_data_sn
                        && offset >= r2t.offset
                        && end <= r2t.offset + r2t.len;
                    r2t.next_data_sn = r2t.next_data_sn.wrapping_add(1);
                    ok
                }
                _ => false,
            }
        };
        if !in_sequence || end > self.total {
            anyhow::bail!(
                "Data-Out for ITT {:#x} out of sequence (DataSN {}, offset {offset}, {len} bytes, TTT {:#x})",
                d.itt,
                d.data_sn,
                d.ttt
            );
        }
        let zero = self.filled_to.min(offset)..offset;
        self.received += len;
        self.filled_to = self.filled_to.max(end);
        if d.final_ {
            if d.ttt == RESERVED_TAG {
                self.unsolicited_open = false;
            } else {
                self.r2t = None;
            }
        }
        Ok(Placement {
            zero,
            data: offset..end,
        })
    }

    /// What comes next: wait, send an R2T (its TTT from `new_ttt`) of at most `max_burst`
    /// bytes, or run the command.
    pub fn next(&mut self, max_burst: usize, new_ttt: impl FnOnce() -> u32) -> Step {
        if self.unsolicited_open || self.r2t.is_some() {
            return Step::Waiting;
        }
        if self.requested >= self.total {
            return Step::Complete;
        }
        let request = R2tRequest {
            ttt: new_ttt(),
            r2t_sn: self.r2t_sn,
            offset: self.requested,
            len: (self.total - self.requested).min(max_burst),
        };
        self.r2t_sn = self.r2t_sn.wrapping_add(1);
        self.r2t = Some(OpenR2t {
            ttt: request.ttt,
            offset: request.offset,
            len: request.len,
            next_data_sn: 0,
        });
        self.requested += request.len;
        Step::R2t(request)
    }

    /// Bytes received so far (overlapping Data-Out counts twice).
    pub fn received(&self) -> usize {
        self.received
    }

    /// Every byte below this has been written by the initiator's data.
    pub fn filled_to(&self) -> usize {
        self.filled_to
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_out(ttt: u32, data_sn: u32, offset: usize, final_: bool) -> DataOut {
        DataOut {
            final_,
            itt: 9,
            ttt,
            data_sn,
            buffer_offset: offset as u32,
            ..Default::default()
        }
    }

    fn place(g: &mut Gather, d: DataOut, len: usize) -> Range<usize> {
        let p = g.place(&d, len).expect("in sequence");
        assert!(p.zero.is_empty(), "no gap expected at {:?}", p.data);
        p.data
    }

    #[test]
    fn immediate_unsolicited_and_r2t_data_fill_the_buffer_in_order() {
        // 10 KiB: 1 KiB immediate, unsolicited up to FirstBurst 4 KiB, then R2Ts of 4 KiB.
        let mut g = Gather::new(10240, 1024, true, 4096);
        assert_eq!(g.next(4096, || unreachable!()), Step::Waiting);
        assert_eq!(
            place(&mut g, data_out(RESERVED_TAG, 0, 1024, false), 1024),
            1024..2048
        );
        assert_eq!(
            place(&mut g, data_out(RESERVED_TAG, 1, 2048, true), 2048),
            2048..4096
        );
        let mut ttts = 0x10..;
        let mut next_ttt = || ttts.next().expect("endless");
        let Step::R2t(first) = g.next(4096, &mut next_ttt) else {
            panic!("an R2T after the unsolicited burst")
        };
        assert_eq!(
            first,
            R2tRequest {
                ttt: 0x10,
                r2t_sn: 0,
                offset: 4096,
                len: 4096
            }
        );
        assert_eq!(
            g.next(4096, &mut next_ttt),
            Step::Waiting,
            "one R2T at a time"
        );
        assert_eq!(
            place(&mut g, data_out(0x10, 0, 4096, false), 2048),
            4096..6144
        );
        assert_eq!(
            place(&mut g, data_out(0x10, 1, 6144, true), 2048),
            6144..8192
        );
        let Step::R2t(second) = g.next(4096, &mut next_ttt) else {
            panic!("a second R2T")
        };
        assert_eq!(
            (second.ttt, second.r2t_sn, second.offset, second.len),
            (0x11, 1, 8192, 2048)
        );
        assert_eq!(
            place(&mut g, data_out(0x11, 0, 8192, true), 2048),
            8192..10240
        );
        assert_eq!(g.next(4096, &mut next_ttt), Step::Complete);
        assert_eq!((g.received(), g.filled_to()), (10240, 10240));
    }

    #[test]
    fn without_unsolicited_data_the_first_r2t_follows_the_immediate_data() {
        let mut g = Gather::new(8192, 512, false, 65536);
        let step = g.next(1 << 20, || 5);
        assert_eq!(
            step,
            Step::R2t(R2tRequest {
                ttt: 5,
                r2t_sn: 0,
                offset: 512,
                len: 7680
            })
        );
        let complete = Gather::new(512, 512, false, 65536).next(1 << 20, || unreachable!());
        assert_eq!(complete, Step::Complete, "all of it was immediate");
    }

    #[test]
    fn skipped_bytes_are_to_be_zeroed() {
        let mut g = Gather::new(4096, 0, true, 4096);
        let p = g
            .place(&data_out(RESERVED_TAG, 0, 1024, true), 1024)
            .expect("in sequence");
        assert_eq!((p.zero, p.data), (0..1024, 1024..2048));
        assert_eq!((g.received(), g.filled_to()), (1024, 2048));
    }

    #[test]
    fn data_out_of_sequence_is_an_error() {
        let unsolicited = || Gather::new(8192, 0, true, 4096);
        let with_r2t = || {
            let mut g = Gather::new(8192, 0, false, 4096);
            assert!(matches!(g.next(4096, || 7), Step::R2t(_)));
            g
        };
        let cases: Vec<(&str, Gather, DataOut, usize)> = vec![
            (
                "wrong DataSN",
                unsolicited(),
                data_out(RESERVED_TAG, 1, 0, false),
                512,
            ),
            (
                "past FirstBurstLength",
                unsolicited(),
                data_out(RESERVED_TAG, 0, 4000, false),
                512,
            ),
            (
                "unsolicited after InitialR2T",
                with_r2t(),
                data_out(RESERVED_TAG, 0, 0, false),
                512,
            ),
            ("unknown TTT", with_r2t(), data_out(8, 0, 0, false), 512),
            (
                "before the R2T's offset",
                {
                    let mut g = Gather::new(8192, 1024, false, 4096);
                    assert!(matches!(g.next(4096, || 7), Step::R2t(_)));
                    g
                },
                data_out(7, 0, 512, false),
                512,
            ),
            (
                "past the R2T's length",
                with_r2t(),
                data_out(7, 0, 4000, false),
                512,
            ),
            (
                "past the buffer",
                Gather::new(1024, 0, true, 4096),
                data_out(RESERVED_TAG, 0, 512, false),
                1024,
            ),
        ];
        for (name, mut g, d, len) in cases {
            assert!(g.place(&d, len).is_err(), "{name}");
        }
        let mut closed = unsolicited();
        closed
            .place(&data_out(RESERVED_TAG, 0, 0, true), 512)
            .expect("in sequence");
        assert!(
            closed
                .place(&data_out(RESERVED_TAG, 1, 512, false), 512)
                .is_err(),
            "unsolicited data after the F bit"
        );
    }
}
