//! A budget for the log lines the TFTP server writes per request (transfer started, done,
//! refused, abandoned): each is one UDP packet away, so a flood of read requests would
//! otherwise become a flood of log lines, at info and warn, whatever the slots turn away.
//!
//! # Design
//! At most [`REQUEST_LINES_PER_INTERVAL`] per-request lines per [`super::TURNAWAY_LOG_INTERVAL`];
//! the lines past the budget are counted instead, and the server's periodic summary reports
//! the count (one warn line), so the log still says that something happened and how much.
//! A PXE boot writes a dozen lines (PXELINUX probes its configuration names), far below it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Per-request lines written per interval before the rest are only counted.
pub const REQUEST_LINES_PER_INTERVAL: u32 = 100;

/// The budget's state, shared by the server loop and its transfers.
#[derive(Debug)]
pub struct RequestLog {
    interval: Duration,
    window: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    written: u32,
    /// Lines left out since the last summary.
    left_out: u64,
}

impl RequestLog {
    /// A budget of [`REQUEST_LINES_PER_INTERVAL`] lines per `interval`.
    pub fn new(interval: Duration) -> RequestLog {
        RequestLog {
            interval,
            window: Mutex::new(Window {
                started: Instant::now(),
                written: 0,
                left_out: 0,
            }),
        }
    }

    /// Whether a per-request line may be written now; `false` counts it as left out.
    pub fn admit(&self) -> bool {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> bool {
        // A poisoned lock only means a panic elsewhere mid-update of two counters: keep going.
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_duration_since(window.started) >= self.interval {
            window.started = now;
            window.written = 0;
        }
        if window.written < REQUEST_LINES_PER_INTERVAL {
            window.written += 1;
            true
        } else {
            window.left_out += 1;
            false
        }
    }

    /// The lines left out since the last call, for the summary.
    pub fn take_left_out(&self) -> u64 {
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut window.left_out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_past_the_budget_are_counted_until_the_next_interval() {
        let log = RequestLog::new(Duration::from_secs(10));
        let start = Instant::now();
        let admitted = (0..REQUEST_LINES_PER_INTERVAL + 25)
            .filter(|_| log.admit_at(start))
            .count();
        assert_eq!(admitted, REQUEST_LINES_PER_INTERVAL as usize);
        assert_eq!(log.take_left_out(), 25);
        assert_eq!(log.take_left_out(), 0, "taken once");
        assert!(
            !log.admit_at(start + Duration::from_secs(9)),
            "same interval"
        );
        assert!(
            log.admit_at(start + Duration::from_secs(10)),
            "a new interval has a new budget"
        );
        assert_eq!(log.take_left_out(), 1);
    }
}
