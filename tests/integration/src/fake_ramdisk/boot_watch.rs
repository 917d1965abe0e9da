//! Watching one emulated server for boots of the deploy media (the harness's step 1).
//!
//! # Design
//! One task per server reads its `GET /_emulator/state` every poll interval (the servers'
//! reads spread evenly over the interval, at most `poll_concurrency` in flight across all of
//! them) and owns the server's ramdisk: it starts one for each boot that booted the deploy
//! media ([`ramdisk_boot`]), at most once per boot number, and stops (aborts) it when the
//! server reads off or has booted again. A ramdisk that ended by itself (after
//! `standby.power_off`) is not started again for the same boot.
//!
//! What the conductor's virtual-media boot leaves in the state (`conductor/src/boot/vmedia`):
//! both media inserted and connected (`BOOT_ALWAYS`), a one-time boot from the CD, power on;
//! the boot then records `last_boot.device == "CDROM"` and counts `boots`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{ramdisk, Shared, Stats};

/// A boot of the deploy media, read from a server's admin state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RamdiskBoot {
    /// The emulator's boot count at this boot.
    pub boots: u64,
    /// Where the iLO reads the virtual floppy (a temp URL of the conductor's object store).
    pub floppy_url: String,
}

/// The boot of the deploy media `state` (`GET /_emulator/state`) shows, if the server runs one
/// now: powered on, last booted from the CD with its medium readable, and a floppy inserted.
pub fn ramdisk_boot(state: &Value) -> Option<RamdiskBoot> {
    if state["power"] != "ON" {
        return None;
    }
    let last = &state["last_boot"];
    if last["device"] != "CDROM" || !last["media_read_error"].is_null() {
        return None;
    }
    let floppy = &state["vmedia"]["FLOPPY"];
    if floppy["inserted"] != true {
        return None;
    }
    Some(RamdiskBoot {
        boots: state["boots"].as_u64()?,
        floppy_url: floppy["url"].as_str()?.to_owned(),
    })
}

/// A ramdisk task, aborted when dropped (so that the watcher's end ends it too).
struct Running {
    boots: u64,
    task: JoinHandle<()>,
    /// The ramdisk received `standby.power_off`.
    powered_off: Arc<AtomicBool>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches server `index` until `stop` changes.
pub(crate) async fn watch_server(
    shared: Arc<Shared>,
    index: usize,
    mut stop: watch::Receiver<bool>,
) {
    let config = &shared.config;
    let url = format!("https://{}/_emulator/state", config.servers[index].emulator);
    let phase = config
        .poll_interval
        .mul_f64(index as f64 / config.servers.len() as f64);
    tokio::select! {
        () = tokio::time::sleep(phase) => {}
        _ = stop.changed() => return,
    }
    let mut ticker = tokio::time::interval(config.poll_interval.max(Duration::from_millis(10)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut running: Option<Running> = None;
    let mut handled: Option<u64> = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => break,
        }
        let state = match read_state(&shared, &url).await {
            Ok(state) => state,
            Err(e) => {
                shared
                    .stats
                    .error(format!("server {index}: reading its state: {e:#}"));
                continue;
            }
        };
        let boots = state["boots"].as_u64();
        if let Some(r) = &running {
            if r.task.is_finished() {
                running = None;
            } else if state["power"] != "ON" || boots != Some(r.boots) {
                let why = if state["power"] != "ON" {
                    "the server is off"
                } else {
                    "the server booted again"
                };
                // After `standby.power_off` the iLO's power-off is the expected end (the
                // ramdisk was in its grace), not an interruption.
                if !r.powered_off.load(Ordering::SeqCst) {
                    shared
                        .log(|| format!("server {index} boot {}: {why}: ramdisk stopped", r.boots));
                    Stats::bump(&shared.stats.ramdisks_stopped_by_bmc);
                }
                running = None;
            }
        }
        if running.is_some() {
            continue;
        }
        if let Some(boot) = ramdisk_boot(&state).filter(|b| handled != Some(b.boots)) {
            handled = Some(boot.boots);
            shared.log(|| format!("server {index} boot {}: deploy media booted", boot.boots));
            let powered_off = Arc::new(AtomicBool::new(false));
            running = Some(Running {
                boots: boot.boots,
                task: tokio::spawn(ramdisk::run(
                    Arc::clone(&shared),
                    index,
                    boot,
                    Arc::clone(&powered_off),
                )),
                powered_off,
            });
        }
    }
}

/// One read of the server's admin state.
async fn read_state(shared: &Shared, url: &str) -> anyhow::Result<Value> {
    let _permit = shared
        .polls
        .acquire()
        .await
        .context("the poll limiter is closed")?;
    Stats::bump(&shared.stats.polls);
    let response = shared
        .emulator
        .get(url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .with_context(|| format!("reading the answer of GET {url}"))?;
    if !status.is_success() {
        anyhow::bail!(
            "GET {url} answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    serde_json::from_slice(&body).with_context(|| format!("GET {url} answered no JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The state after the conductor's virtual-media boot, as the emulator shows it.
    fn booted() -> Value {
        json!({
            "power": "ON", "boots": 3,
            "vmedia": {
                "FLOPPY": {"url": "https://127.0.0.1:1/f?temp_url_sig=x", "inserted": true},
                "CDROM": {"url": "https://127.0.0.1:1/iso", "inserted": true},
            },
            "last_boot": {"device": "CDROM", "reason": "one_time", "mode": "LEGACY",
                          "media_url": "https://127.0.0.1:1/iso", "media_read_error": null},
        })
    }

    #[test]
    fn a_deploy_media_boot_is_recognised() {
        assert_eq!(
            ramdisk_boot(&booted()),
            Some(RamdiskBoot {
                boots: 3,
                floppy_url: "https://127.0.0.1:1/f?temp_url_sig=x".into()
            })
        );
    }

    #[test]
    fn other_states_are_no_ramdisk_boot() {
        type Change = fn(&mut Value);
        let cases: [(&str, Change); 5] = [
            ("off", |s| s["power"] = json!("OFF")),
            ("disk boot", |s| s["last_boot"]["device"] = json!("HDD")),
            ("never booted", |s| s["last_boot"] = Value::Null),
            ("unreadable CD", |s| {
                s["last_boot"]["media_read_error"] = json!("HTTP 404")
            }),
            ("no floppy", |s| {
                s["vmedia"]["FLOPPY"] = json!({"url": null, "inserted": false})
            }),
        ];
        for (name, change) in cases {
            let mut state = booted();
            change(&mut state);
            assert_eq!(ramdisk_boot(&state), None, "{name}");
        }
    }
}
