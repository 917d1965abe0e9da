//! Counters of a running image stream, shared by the pipeline, the console reporter and (later)
//! the heartbeats (docs/architecture.md §4: "Heartbeats carry progress").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Byte counters of one image stream.
#[derive(Debug)]
pub struct Progress {
    /// Bytes received from the network (compressed size for compressed images).
    pub downloaded: AtomicU64,
    /// Size of the download when the server said it (Content-Length), else 0.
    pub download_total: AtomicU64,
    /// Bytes of the raw image written to the disk. A qcow2 download spooled to the disk before
    /// its conversion is not counted here (it is not the image yet), but in `spooled`.
    pub written: Arc<AtomicU64>,
    /// Size of the raw image being written when known, else 0: the download's size for an
    /// uncompressed raw image, the virtual size for a qcow2 image, and for a compressed raw
    /// image only once its stream has ended. `written` never passes it.
    pub image_total: AtomicU64,
    /// Bytes of a qcow2 download spooled to the disk.
    pub spooled: Arc<AtomicU64>,
    started: Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            downloaded: AtomicU64::new(0),
            download_total: AtomicU64::new(0),
            written: Arc::new(AtomicU64::new(0)),
            image_total: AtomicU64::new(0),
            spooled: Arc::new(AtomicU64::new(0)),
            started: Instant::now(),
        }
    }
}

impl Progress {
    /// The raw image's size when known (see `image_total`).
    pub fn image_total(&self) -> Option<u64> {
        match self.image_total.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }

    /// One console line: written bytes against the image's size, download progress against its
    /// total, and the rate.
    pub fn line(&self) -> String {
        const MIB: f64 = 1024.0 * 1024.0;
        let mib = |total: Option<u64>| match total {
            Some(t) => format!("{:.1} MiB", t as f64 / MIB),
            None => "unknown size".to_owned(),
        };
        let written = self.written.load(Ordering::Relaxed) as f64 / MIB;
        let down = self.downloaded.load(Ordering::Relaxed) as f64 / MIB;
        let download_total = match self.download_total.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        };
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let spooled = match self.spooled.load(Ordering::Relaxed) {
            0 => String::new(),
            s => format!(", qcow2 spooled {:.1} MiB", s as f64 / MIB),
        };
        format!(
            "written {written:.1} MiB of {}{spooled}, downloaded {down:.1} MiB of {}, {:.1} MiB/s",
            mib(self.image_total()),
            mib(download_total),
            written / secs
        )
    }
}

/// Prints [`Progress::line`] to stderr every `interval` until dropped (the console is the BMC's
/// serial/remote console: plain lines, no terminal control codes).
///
/// Dropping it wakes the thread at once: the write's end waits for this join, so a thread that
/// slept in ticks added up to a tick to every image write (100 ms was a tenth of a 1 GiB
/// stream in bench/agent-stream.sh).
#[derive(Debug)]
pub struct ConsoleReporter {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ConsoleReporter {
    /// Starts the reporter thread.
    pub fn start(progress: Arc<Progress>, interval: Duration) -> ConsoleReporter {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                // Nothing is ever sent: the sender's drop ends the wait.
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    eprintln!("progress: {}", progress.line());
                }
            })
            .ok();
        ConsoleReporter {
            stop: Some(stop),
            thread,
        }
    }
}

impl Drop for ConsoleReporter {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_reporter_stops_without_waiting_for_its_interval() {
        let progress = Arc::new(Progress::default());
        let reporter = ConsoleReporter::start(progress, Duration::from_secs(600));
        let started = Instant::now();
        drop(reporter);
        // A reporter sleeping through its interval would hold the end of the write for 10 min.
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the drop waited {:?}",
            started.elapsed()
        );
    }
}
