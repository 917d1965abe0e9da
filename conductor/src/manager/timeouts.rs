//! The callback timeouts (Ironic's `_check_deploy_timeouts` and `_check_cleanwait_timeouts`): a
//! node in `wait call-back` or `clean wait` whose ramdisk stayed silent for
//! `deploy_callback_timeout` since `provision_updated_at` goes to `deploy failed` or
//! `clean failed`, cleaned up and powered off. The message quotes what the server's firmware
//! logged in the iLO's Integrated Management Log meanwhile: a node that never ran the ramdisk
//! (a boot loader refused under Secure Boot, say) has told nobody else.
//!
//! # Design
//! Checked every tenth of the timeout, so a node fails at most 10% after its timeout (at most
//! every 60 s, Ironic's `check_provision_state_interval`, which the default 1800 s timeout
//! reaches, and at least every 100 ms so short test timeouts work). Nodes in maintenance or reserved
//! are skipped; the check is repeated under the reservation, as a heartbeat may have come in
//! between the list and the reserve.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tracing::Instrument;

use super::provision::{fail_clean, fail_deploy};
use super::tasks;
use super::Core;
use crate::bmc::Bmc;
use crate::drivers::FirmwareLogEntry;
use crate::states::ProvisionState;
use crate::store::{Node, NodeFilter};
use vmdeploy_shared::error::Chain;

/// How many of the IML's newest entries a timeout reads, and how many it quotes.
const FIRMWARE_LOG_READ: usize = 16;
const FIRMWARE_LOG_QUOTED: usize = 3;
/// How long reading the IML may take: a timeout must not hang on a slow BMC.
const FIRMWARE_LOG_WAIT: Duration = Duration::from_secs(30);
/// Slack for the iLO's clock against ours when picking the entries of this wait.
const CLOCK_SLACK: Duration = Duration::from_secs(120);

/// What the server's firmware logged while the node waited, for the timeout's message: a
/// refused boot loader under Secure Boot, say, which the ramdisk cannot report because it never
/// ran. Empty when the log holds nothing of note or the BMC has no such log (RIBCL here); a
/// log that cannot be read is said, and never stops the failure.
async fn firmware_log_note(core: &Core, node: &Node) -> String {
    let read = async {
        let bmc = Bmc::connect_read_only(node, &core.deploy.config.ilo_defaults).await?;
        bmc.firmware_log(FIRMWARE_LOG_READ).await
    };
    let entries = match tokio::time::timeout(FIRMWARE_LOG_WAIT, read).await {
        Ok(Ok(entries)) => entries,
        Ok(Err(err))
            if matches!(
                err.driver_error(),
                Some(crate::drivers::DriverError::NotSupported { .. })
            ) =>
        {
            return String::new()
        }
        Ok(Err(err)) => {
            return format!(
                " (the iLO's Integrated Management Log could not be read: {})",
                Chain(&err)
            )
        }
        Err(_) => {
            return format!(
                " (reading the iLO's Integrated Management Log took over {}s)",
                FIRMWARE_LOG_WAIT.as_secs()
            )
        }
    };
    let since = node
        .provision_updated_at
        .map(|at| at - CLOCK_SLACK)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let quoted = logged_since(&entries, since);
    if quoted.is_empty() {
        return String::new();
    }
    tracing::warn!(node = %node.uuid, entries = quoted.len(), "the firmware logged problems while the node waited");
    format!(
        "; the iLO's Integrated Management Log since the boot: {}",
        quoted.join("; ")
    )
}

/// The newest [`FIRMWARE_LOG_QUOTED`] problems (not `OK`) of `entries` recorded at or after
/// `since`, as `<time> <severity>: <message>`. An entry whose time does not parse counts as
/// recent: a firmware's odd clock must not hide its only clue.
fn logged_since(entries: &[FirmwareLogEntry], since: OffsetDateTime) -> Vec<String> {
    let recent: Vec<String> = entries
        .iter()
        .filter(|e| e.is_problem())
        .filter(|e| {
            OffsetDateTime::parse(&e.created, &time::format_description::well_known::Rfc3339)
                .map_or(true, |at| at >= since)
        })
        .map(|e| format!("{} {}: {}", e.created, e.severity, e.message.trim()))
        .collect();
    recent[recent.len().saturating_sub(FIRMWARE_LOG_QUOTED)..].to_vec()
}

/// Runs the check until `shutdown` turns true.
pub(crate) async fn run(core: Arc<Core>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let period = (core.config.deploy_callback_timeout / 10)
        .clamp(Duration::from_millis(100), Duration::from_secs(60));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => check_once(&core).await,
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    return;
                }
            }
        }
    }
}

/// Whether `node` waited longer than `timeout`.
fn expired(node: &Node, timeout: Duration) -> bool {
    node.provision_state.is_waiting()
        && !node.maintenance
        && node
            .provision_updated_at
            .is_none_or(|since| OffsetDateTime::now_utc() - since >= timeout)
}

/// One pass.
pub(crate) async fn check_once(core: &Arc<Core>) {
    for state in [ProvisionState::WaitCallBack, ProvisionState::CleanWait] {
        check_state(core, state).await;
    }
}

/// One pass over the nodes waiting in `state`.
async fn check_state(core: &Arc<Core>, state: ProvisionState) {
    let filter = NodeFilter {
        provision_state: Some(state),
        maintenance: Some(false),
        ..NodeFilter::default()
    };
    let timeout = core.config.deploy_callback_timeout;
    let nodes = match core.store().list_nodes(&filter).await {
        Ok(nodes) => nodes,
        Err(err) => {
            tracing::error!(error = %Chain(&err), "callback timeouts: could not list nodes");
            return;
        }
    };
    // Only this conductor's nodes: the owner of each node times it out.
    let view = core.cluster.view();
    for listed in nodes {
        if listed.reservation.is_some()
            || !expired(&listed, timeout)
            || !view.is_mine(&listed.conductor_group, listed.uuid)
        {
            continue;
        }
        let Ok((mut node, reservation)) = tasks::reserve_uuid(core, listed.uuid).await else {
            continue;
        };
        if expired(&node, timeout) {
            // Ironic's words first (operators search for them), then what to check: a refused
            // heartbeat (wrong token) leaves no trace on the node, so the message names it.
            let flow = core.flow_for(&node);
            let cleaning = node.provision_state == ProvisionState::CleanWait;
            let awaited = match &flow {
                Some(f) if f.takes_pass_deploy_info() && !cleaning => {
                    "no pass_deploy_info with a valid deploy key"
                }
                _ => "no heartbeat with a valid agent token",
            };
            let message = format!(
                "Timeout reached while waiting for callback for node {}{}: {awaited} came \
                 within {}s (deploy_callback_timeout); check that the node boots the deploy ISO, \
                 reaches the API at {} and runs this {}'s floppy{}",
                node.uuid,
                if cleaning { " in clean wait" } else { "" },
                timeout.as_secs(),
                core.deploy.config.api_url,
                if cleaning { "cleaning" } else { "deploy" },
                if cleaning {
                    ", then manage and provide the node to clean it again"
                } else {
                    ""
                }
            );
            let message = message + &firmware_log_note(core, &node).await;
            let span = tracing::info_span!("timeout", node = %node.uuid);
            if cleaning {
                fail_clean(core, &mut node, flow.as_ref(), message)
                    .instrument(span)
                    .await;
            } else {
                fail_deploy(core, &mut node, flow.as_ref(), message)
                    .instrument(span)
                    .await;
            }
        }
        reservation.release().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(created: &str, severity: &str, message: &str) -> FirmwareLogEntry {
        FirmwareLogEntry {
            created: created.into(),
            severity: severity.into(),
            message: message.into(),
        }
    }

    #[test]
    fn only_recent_problems_are_quoted_newest_last() {
        let since = OffsetDateTime::parse(
            "2026-12-07T12:00:00Z",
            &time::format_description::well_known::Rfc3339,
        )
        .expect("a time");
        let entries = [
            entry("2026-12-07T11:00:00Z", "Critical", "before the boot"),
            entry("2026-12-07T12:00:05Z", "OK", "informational"),
            entry("2026-12-07T12:00:06Z", "Warning", "one"),
            entry("not a time", "Critical", "two"),
            entry("2026-12-07T12:00:08Z", "Critical", "three"),
            entry("2026-12-07T12:00:09Z", "Critical", "four "),
        ];
        assert_eq!(
            logged_since(&entries, since),
            [
                "not a time Critical: two",
                "2026-12-07T12:00:08Z Critical: three",
                "2026-12-07T12:00:09Z Critical: four",
            ]
        );
        assert!(logged_since(&entries[..2], since).is_empty());
    }
}
