//! Counters of a running image stream, shared by the pipeline, the console reporter and (later)
//! the heartbeats (DESIGN.md §4: "Heartbeats carry progress").

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Byte counters of one image stream.
#[derive(Debug)]
pub struct Progress {
    /// Bytes received from the network (compressed size for compressed images).
    pub downloaded: AtomicU64,
    /// Size of the download when the server said it (Content-Length), else 0.
    pub download_total: AtomicU64,
    /// Bytes written to the disk.
    pub written: Arc<AtomicU64>,
    started: Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            downloaded: AtomicU64::new(0),
            download_total: AtomicU64::new(0),
            written: Arc::new(AtomicU64::new(0)),
            started: Instant::now(),
        }
    }
}

impl Progress {
    /// One console line: written bytes, download progress against its total, and the rate.
    pub fn line(&self) -> String {
        const MIB: f64 = 1024.0 * 1024.0;
        let written = self.written.load(Ordering::Relaxed) as f64 / MIB;
        let down = self.downloaded.load(Ordering::Relaxed) as f64 / MIB;
        let total = self.download_total.load(Ordering::Relaxed);
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let total = if total > 0 {
            format!("{:.1} MiB", total as f64 / MIB)
        } else {
            "unknown size".to_owned()
        };
        format!(
            "written {written:.1} MiB, downloaded {down:.1} MiB of {total}, {:.1} MiB/s",
            written / secs
        )
    }
}

/// Prints [`Progress::line`] to stderr every `interval` until dropped (the console is the BMC's
/// serial/remote console: plain lines, no terminal control codes).
#[derive(Debug)]
pub struct ConsoleReporter {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ConsoleReporter {
    /// Starts the reporter thread.
    pub fn start(progress: Arc<Progress>, interval: Duration) -> ConsoleReporter {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                let tick = Duration::from_millis(100);
                let mut next = Instant::now() + interval;
                while !stop2.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    if Instant::now() >= next {
                        eprintln!("progress: {}", progress.line());
                        next += interval;
                    }
                }
            })
            .ok();
        ConsoleReporter { stop, thread }
    }
}

impl Drop for ConsoleReporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
