//! Memory of a process as benchmarks read it: its VmRSS, once or sampled while it works.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// VmRSS of `pid` in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Samples a pid's VmRSS every 100 ms until dropped; `peak()` stops and returns the maximum.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl RssSampler {
    pub fn start(pid: u32) -> RssSampler {
        Self::sampling(move || rss_kib(pid))
    }

    /// Samples the summed VmRSS of process group `pgid` ([`group_rss_kib`]).
    pub fn start_group(pgid: u32) -> RssSampler {
        Self::sampling(move || group_rss_kib(pgid))
    }

    fn sampling(read: impl Fn() -> Option<u64> + Send + 'static) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(read().unwrap_or(0));
                std::thread::sleep(Duration::from_millis(100));
            }
            peak.max(read().unwrap_or(0))
        });
        RssSampler {
            stop,
            thread: Some(thread),
        }
    }

    pub fn peak(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The summed VmRSS of every process in process group `pgid`, in KiB (a forking service such as
/// Ironic, whose master process does little of the work, led by the pid it was started as).
pub fn group_rss_kib(pgid: u32) -> Option<u64> {
    let mut total = None;
    for entry in std::fs::read_dir("/proc").ok()?.filter_map(|e| e.ok()) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // /proc/PID/stat: "pid (comm) state ppid pgrp ..."; comm may hold spaces and parens.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(after_comm) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
            continue;
        };
        let pgrp = after_comm
            .split_whitespace()
            .nth(2)
            .and_then(|f| f.parse::<u32>().ok());
        if pgrp == Some(pgid) {
            if let Some(kib) = rss_kib(pid) {
                total = Some(total.unwrap_or(0) + kib);
            }
        }
    }
    total
}
