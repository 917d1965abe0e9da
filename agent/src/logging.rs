//! Console logging: one line per event, with a timestamp, on stderr (the serial console as PID 1),
//! and the same lines kept in memory (the last [`RECENT_CAPACITY`] bytes) for
//! `log.collect_system_logs`: the ramdisk has no log file.
//!
//! As an ordinary process the timestamp is wall-clock time. As PID 1 ([`use_uptime_clock`], called
//! by `init::setup_pid1`) it is seconds since boot in the kernel's own `[    1.234567]` form, so the
//! agent's lines sort in with the kernel's on the serial console.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{reload, Registry};

static UPTIME_CLOCK: AtomicBool = AtomicBool::new(false);

/// The level filter of the installed subscriber, when it came from the default (no `RUST_LOG`):
/// [`enable_debug`] raises it once the deploy parameters ask for it.
static DEFAULT_FILTER: OnceLock<reload::Handle<Targets, Registry>> = OnceLock::new();

/// Sets up `tracing` output; `RUST_LOG` (`debug`, `vmdeploy_agent=debug,info`; as PID 1 it comes
/// from the kernel command line) overrides the default `info` level.
///
/// The filter is `Targets`, not `EnvFilter`: EnvFilter's regex engine added about 0.3 MB to the
/// static agent, which the deploy ISO's 12 MiB budget spends on NIC drivers instead. A `RUST_LOG`
/// that does not parse is reported on stderr and the default applies.
pub fn init() {
    let (filter, from_default) = match std::env::var("RUST_LOG") {
        Ok(spec) => match spec.parse::<Targets>() {
            Ok(filter) => (filter, false),
            Err(err) => {
                eprintln!("vmdeploy-agent: ignoring RUST_LOG={spec:?}: {err}");
                (default_filter(), true)
            }
        },
        Err(_) => (default_filter(), true),
    };
    let (filter, handle) = reload::Layer::new(filter);
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .with_timer(AgentTime),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(|| RecentWriter)
                .with_ansi(false)
                .with_timer(AgentTime),
        )
        .try_init();
    if installed.is_ok() && from_default {
        let _ = DEFAULT_FILTER.set(handle);
    }
}

/// Logs at `debug` from now on: the deploy parameters hold `ipa-debug=1` (IPA's switch, on the
/// floppy through `driver_info.kernel_append_params`, where `RUST_LOG` cannot go: the kernel
/// hands only its own command line to init's environment). An explicit `RUST_LOG` wins.
/// Returns whether the level changed.
pub fn enable_debug() -> bool {
    let Some(handle) = DEFAULT_FILTER.get() else {
        return false;
    };
    handle
        .reload(Targets::new().with_default(LevelFilter::DEBUG))
        .is_ok()
}

/// How much of the log is kept in memory: the tail of a deploy with a few thousand lines.
pub const RECENT_CAPACITY: usize = 1 << 20;

/// A bounded copy of the log: the last `capacity` bytes, whole lines only.
struct LogRing {
    bytes: Mutex<VecDeque<u8>>,
    capacity: usize,
}

impl LogRing {
    const fn new(capacity: usize) -> LogRing {
        LogRing {
            bytes: Mutex::new(VecDeque::new()),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<u8>> {
        // A panic while holding the lock leaves whole bytes behind: keep using them.
        self.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn contents(&self) -> Vec<u8> {
        self.lock().iter().copied().collect()
    }

    /// Appends `bytes`, dropping the oldest lines beyond the capacity.
    fn append(&self, bytes: &[u8]) {
        let mut ring = self.lock();
        ring.extend(bytes);
        if ring.len() > self.capacity {
            let excess = ring.len() - self.capacity;
            ring.drain(..excess);
            // Drop the rest of the line the bound cut into.
            let partial = ring.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
            ring.drain(..partial);
        }
    }
}

static RECENT: LogRing = LogRing::new(RECENT_CAPACITY);

/// The log lines kept in memory, oldest first.
pub fn recent() -> Vec<u8> {
    RECENT.contents()
}

/// The in-memory log as a `tracing` writer.
struct RecentWriter;

impl std::io::Write for RecentWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        RECENT.append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn default_filter() -> Targets {
    Targets::new().with_default(LevelFilter::INFO)
}

/// Switches timestamps to seconds since boot (CLOCK_BOOTTIME, what the kernel's printk shows).
pub fn use_uptime_clock() {
    UPTIME_CLOCK.store(true, Ordering::Relaxed);
}

/// Seconds since boot, as the kernel prints them.
pub fn uptime() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Formats `[    1.234567]` (kernel printk style: seconds padded to 5, microseconds).
pub fn format_uptime(t: std::time::Duration) -> String {
    format!("[{:5}.{:06}]", t.as_secs(), t.subsec_micros())
}

struct AgentTime;

impl FormatTime for AgentTime {
    fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
        if UPTIME_CLOCK.load(Ordering::Relaxed) {
            write!(w, "{}", format_uptime(uptime()))
        } else {
            tracing_subscriber::fmt::time::SystemTime.format_time(w)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptime_looks_like_the_kernels() {
        assert_eq!(
            format_uptime(std::time::Duration::from_micros(1_234_567)),
            "[    1.234567]"
        );
        assert_eq!(
            format_uptime(std::time::Duration::from_secs(123_456)),
            "[123456.000000]"
        );
        assert!(uptime() > std::time::Duration::ZERO);
    }

    #[test]
    fn the_log_goes_to_memory_too() {
        init();
        tracing::info!("marker line for the in-memory log");
        let kept = String::from_utf8_lossy(&recent()).into_owned();
        assert!(kept.contains("marker line for the in-memory log"), "{kept}");
    }

    #[test]
    fn the_ring_keeps_whole_recent_lines_within_its_bound() {
        let ring = LogRing::new(1000);
        ring.append(b"first line\n");
        let line = format!("{}\n", "x".repeat(99));
        for _ in 0..30 {
            ring.append(line.as_bytes());
        }
        ring.append(b"last line\n");
        let kept = ring.contents();
        assert!(kept.len() <= 1000, "{}", kept.len());
        assert!(kept.len() > 1000 - 100, "{}", kept.len());
        let text = String::from_utf8(kept).expect("utf-8");
        assert!(!text.contains("first line"));
        assert!(text.ends_with("last line\n"));
        let body: Vec<&str> = text.lines().collect();
        assert!(
            body[..body.len() - 1].iter().all(|l| *l == "x".repeat(99)),
            "whole lines only: {text:?}"
        );
    }
}
