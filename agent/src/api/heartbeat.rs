//! The heartbeat loop: when to send the next heartbeat, and what progress it carries.
//!
//! # Design
//! The interval follows IPA's heartbeater (`ironic_python_agent/agent.py`): after a heartbeat the
//! conductor accepted, wait `heartbeat_timeout × r` with `r` uniform in [0.3, 0.6]; after a failed
//! one, `5 s × r` with `r` in [1, 2] (failures are logged and retried, never fatal); when a
//! command finishes, heartbeat early so the conductor sees the result, but never less than 1 s
//! after the previous one (IPA waits 5 s there: see [`EARLY_HEARTBEAT_MIN_GAP`]).
//!
//! Progress of an image write goes in `agent_status_message` as
//! [`vmdeploy_shared::api::ipa::WriteProgress`] text (Ironic API ≥ 1.72 accepts the field and does
//! not check its content; `agent_status` itself, limited to start/end/error, is left out).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use vmdeploy_shared::api::ipa::{Heartbeat, WriteProgress};
use vmdeploy_shared::secret::Secret;

use super::client::ConductorClient;
use crate::stream::progress::Progress;

/// Heartbeat timeout assumed when the lookup gives none: Ironic's default (300 s, `[api]
/// ramdisk_heartbeat_timeout`, formerly `[agent] heartbeat_timeout`).
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(300);

/// Shortest gap between two heartbeats, and the base of the retry delay (IPA's
/// `min_heartbeat_interval`).
pub const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

/// Shortest gap between a heartbeat and the early one a finished command asks for. IPA waits
/// [`MIN_HEARTBEAT_INTERVAL`] here too; the conductor finishes a deploy only when it hears of the
/// finished `prepare_image`, so that wait was most of an agent_ilo deploy of a small image
/// (bench/conductor.sh: 5.9 s from deploy to active, the image on disk after 0.35 s). One
/// extra heartbeat per command costs a conductor nothing; the floor still stops a burst of
/// short commands from turning into a burst of heartbeats.
pub const EARLY_HEARTBEAT_MIN_GAP: Duration = Duration::from_secs(1);

/// Jitter range after a successful heartbeat, as a fraction of the heartbeat timeout.
pub const JITTER: (f64, f64) = (0.3, 0.6);

/// Jitter range after a failed heartbeat, as a multiple of [`MIN_HEARTBEAT_INTERVAL`].
pub const ERROR_JITTER: (f64, f64) = (1.0, 2.0);

/// The wait before the next heartbeat. `unit` is a number in [0, 1) that picks the point in the
/// jitter range (random in the loop, fixed in tests).
pub fn next_interval(heartbeat_timeout: Duration, last_ok: bool, unit: f64) -> Duration {
    let unit = if unit.is_finite() {
        unit.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let (base, (lo, hi)) = if last_ok {
        (heartbeat_timeout, JITTER)
    } else {
        (MIN_HEARTBEAT_INTERVAL, ERROR_JITTER)
    };
    base.mul_f64(lo + (hi - lo) * unit)
}

/// A number in [0, 1) from the standard library's per-process random hasher keys; jitter only
/// spreads agents apart, it needs no stronger randomness.
pub fn random_unit() -> f64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The image write being reported: its counters and when it started.
#[derive(Debug, Clone)]
pub struct ProgressSlot {
    /// Counters of the running (or last) write.
    pub progress: Arc<Progress>,
    /// When the write started.
    pub started: Instant,
    /// When it ended, if it did (the rate is then the final average).
    pub ended: Option<Instant>,
}

/// Where `standby.prepare_image` publishes its progress for heartbeats.
pub type SharedProgress = Arc<Mutex<Option<ProgressSlot>>>;

/// The progress of `slot` as sent in a heartbeat.
pub fn progress_of(slot: &ProgressSlot, now: Instant) -> WriteProgress {
    let written = slot.progress.written.load(Ordering::Relaxed);
    // Against the raw image's size, not the download's: a qcow2 or compressed download is
    // smaller than the image it becomes.
    let total = slot.progress.image_total();
    let end = slot.ended.unwrap_or(now);
    let secs = end.saturating_duration_since(slot.started).as_secs_f64();
    let rate = if secs > 0.0 {
        (written as f64 / secs) as u64
    } else {
        0
    };
    WriteProgress {
        written,
        total,
        rate,
    }
}

/// What every heartbeat of this agent carries.
#[derive(Debug, Clone)]
pub struct HeartbeatPlan {
    /// Node UUID from the lookup.
    pub node_uuid: String,
    /// `https://advertise:port` (`http://` with auto-TLS off).
    pub callback_url: String,
    /// The command API's certificate, PEM (`agent_verify_ca`); `None` with auto-TLS off.
    pub agent_verify_ca: Option<String>,
    /// The agent token.
    pub agent_token: Secret,
    /// The conductor's heartbeat timeout.
    pub heartbeat_timeout: Duration,
}

/// Heartbeats until `stop` is notified; `command_done` asks for an early heartbeat.
pub async fn run_heartbeats(
    client: ConductorClient,
    plan: HeartbeatPlan,
    progress: SharedProgress,
    command_done: Arc<Notify>,
    stop: Arc<Notify>,
) {
    let mut last_sent: Option<Instant> = None;
    let mut last_ok = true;
    let mut wait = Duration::ZERO;
    loop {
        // Wait for the interval, an early-heartbeat request (rate limited), or the stop.
        let deadline = tokio::time::Instant::now() + wait;
        tokio::select! {
            () = stop.notified() => return,
            () = tokio::time::sleep_until(deadline) => {}
            () = command_done.notified() => {
                // Early, but not sooner than EARLY_HEARTBEAT_MIN_GAP after the previous one;
                // after a refused or failed one, not before the error back-off's floor either.
                let gap = if last_ok {
                    EARLY_HEARTBEAT_MIN_GAP
                } else {
                    MIN_HEARTBEAT_INTERVAL
                };
                if let Some(t) = last_sent.map(|t| t + gap) {
                    let t = tokio::time::Instant::from_std(t).min(deadline);
                    tokio::select! {
                        () = stop.notified() => return,
                        () = tokio::time::sleep_until(t) => {}
                    }
                }
            }
        }
        let message = progress
            .lock()
            .ok()
            .and_then(|s| s.clone())
            .map(|slot| progress_of(&slot, Instant::now()));
        if let Some(p) = &message {
            tracing::info!(
                written = p.written,
                total = ?p.total,
                rate = p.rate,
                "image write progress"
            );
        }
        let body = Heartbeat {
            callback_url: plan.callback_url.clone(),
            agent_token: Some(plan.agent_token.clone()),
            agent_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            agent_verify_ca: plan.agent_verify_ca.clone(),
            agent_status: None,
            agent_status_message: message.map(|p| p.to_message()),
        };
        let ok = match client.heartbeat(&plan.node_uuid, &body).await {
            Ok(()) => {
                tracing::debug!("heartbeat accepted");
                true
            }
            Err(e) => {
                tracing::warn!("heartbeat failed (will retry): {e:#}");
                false
            }
        };
        last_sent = Some(Instant::now());
        last_ok = ok;
        wait = next_interval(plan.heartbeat_timeout, ok, random_unit());
        tracing::debug!(?wait, "next heartbeat");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_follows_ipa() {
        let t = Duration::from_secs(300);
        assert_eq!(next_interval(t, true, 0.0), Duration::from_secs(90));
        assert_eq!(next_interval(t, true, 1.0), Duration::from_secs(180));
        assert_eq!(next_interval(t, false, 0.0), Duration::from_secs(5));
        assert_eq!(next_interval(t, false, 1.0), Duration::from_secs(10));
        assert_eq!(next_interval(t, true, f64::NAN), Duration::from_secs(90));
        assert_eq!(next_interval(t, true, 7.0), Duration::from_secs(180));
        for _ in 0..1000 {
            let u = random_unit();
            assert!((0.0..1.0).contains(&u), "{u}");
            let i = next_interval(Duration::from_secs(60), true, u);
            assert!(
                i >= Duration::from_secs(18) && i <= Duration::from_secs(36),
                "{i:?}"
            );
        }
    }

    #[test]
    fn progress_encoding() {
        let progress = Arc::new(Progress::default());
        progress.written.store(50 << 20, Ordering::Relaxed);
        progress.image_total.store(100 << 20, Ordering::Relaxed);
        let started = Instant::now();
        let slot = ProgressSlot {
            progress: Arc::clone(&progress),
            started,
            ended: None,
        };
        let p = progress_of(&slot, started + Duration::from_secs(10));
        assert_eq!(p.written, 50 << 20);
        assert_eq!(p.total, Some(100 << 20));
        assert_eq!(p.rate, (5 << 20) as u64);
        assert_eq!(
            p.to_message(),
            format!(
                "image write: written={} total={} rate={}",
                50u64 << 20,
                100u64 << 20,
                5u64 << 20
            )
        );
        progress.image_total.store(0, Ordering::Relaxed);
        let ended = ProgressSlot {
            ended: Some(started + Duration::from_secs(5)),
            ..slot
        };
        let p = progress_of(&ended, started + Duration::from_secs(100));
        assert_eq!(p.total, None);
        assert_eq!(
            p.rate,
            (10 << 20) as u64,
            "rate frozen at the end of the write"
        );
        assert_eq!(progress_of(&ended, started).rate, (10 << 20) as u64);
        let zero = ProgressSlot {
            ended: Some(started),
            ..ended
        };
        assert_eq!(progress_of(&zero, started).rate, 0);
    }
}
