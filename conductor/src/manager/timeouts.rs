//! The callback timeouts (Ironic's `_check_deploy_timeouts` and `_check_cleanwait_timeouts`): a
//! node in `wait call-back` or `clean wait` whose ramdisk stayed silent for
//! `deploy_callback_timeout` since `provision_updated_at` goes to `deploy failed` or
//! `clean failed`, cleaned up and powered off.
//!
//! # Design
//! Checked every half timeout (at most every 60 s, Ironic's `check_provision_state_interval`,
//! and at least every 100 ms so short test timeouts work). Nodes in maintenance or reserved
//! are skipped; the check is repeated under the reservation, as a heartbeat may have come in
//! between the list and the reserve.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tracing::Instrument;

use super::provision::{fail_clean, fail_deploy};
use super::tasks;
use super::Core;
use crate::states::ProvisionState;
use crate::store::{Node, NodeFilter};
use vmdeploy_shared::error::Chain;

/// Runs the check until `shutdown` turns true.
pub(crate) async fn run(core: Arc<Core>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let period = (core.config.deploy_callback_timeout / 2)
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
