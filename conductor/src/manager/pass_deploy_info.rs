//! `pass_deploy_info`: the iSCSI ramdisk's call-back (docs/ironic-protocols.md §2.3).
//!
//! # Design
//! The ramdisk exposes the node's disk over iSCSI and posts its address, target name and the
//! one-use deploy key from its floppy. The checks, in this order:
//! - a body that does not parse or misses a field: 400, from the API, which hands the manager
//!   only a checked [`ValidPassDeployInfo`];
//! - a node that holds no deploy key (it is not waiting for an iSCSI ramdisk, or its key was
//!   used): 404, as for an unknown node, so the call-back tells an outsider nothing about which
//!   nodes exist;
//! - a key that is not the node's (compared in constant time): 403, and the node is unchanged;
//! - then, for the key's holder only: a node that is not in `wait call-back`, 409; a driver
//!   whose ramdisk heartbeats instead (`agent_ilo`), 400.
//!
//! A key that matches is burnt at once, in the store, before anything else happens: a replay,
//! even while the first call is still being served, finds no key and gets 404 (403 if it
//! passed the first check just before the burn). Then the reply
//! is 202 and the flow's [`crate::deploy::DeployInterface::pass_deploy_info`] runs on a node
//! task (the image write takes minutes); `Done` makes the node `active`, an error
//! `deploy failed`. An `error` the ramdisk reports fails the deploy with its text, through the
//! same clean-up as any failure.

use std::sync::Arc;

use time::OffsetDateTime;
use vmdeploy_shared::api::ValidPassDeployInfo;

use super::heartbeat::{secret_matches, stored_secret, wipe_agent_secrets};
use super::provision::fail_deploy;
use super::tasks::{self, apply};
use super::{Core, ManagerError};
use crate::deploy::DeployStep;
use crate::states::{Event, ProvisionState};
use crate::store::{Node, NodeIdent, StoreError};

pub(crate) use crate::boot::DEPLOY_KEY_KEY;

/// Whether `given` is the node's unused deploy key.
fn key_matches(node: &Node, given: &ValidPassDeployInfo) -> bool {
    secret_matches(node, DEPLOY_KEY_KEY, &given.key)
}

fn not_waiting(node: &Node) -> ManagerError {
    ManagerError::StateConflict {
        node: node.uuid,
        message: format!(
            "Node {} is not waiting for a ramdisk call-back: it is in state \"{}\"",
            node.uuid, node.provision_state
        ),
    }
}

fn refused(node: &Node) -> ManagerError {
    // Debug only: the API logs the refusal (module docs of `crate::api::ramdisk`).
    tracing::debug!(node = %node.uuid, "pass_deploy_info refused: wrong or already used deploy key");
    ManagerError::CallbackRefused {
        node: node.uuid,
        message: format!(
            "The deploy key for node {} is not valid (wrong, or already used).",
            node.uuid
        ),
    }
}

pub(crate) async fn pass_deploy_info(
    core: &Arc<Core>,
    ident: &NodeIdent,
    info: ValidPassDeployInfo,
) -> Result<(), ManagerError> {
    let node = core.store().node(ident).await?;
    if stored_secret(&node, DEPLOY_KEY_KEY).is_none() {
        tracing::debug!(node = %node.uuid, state = %node.provision_state,
            "pass_deploy_info refused: the node holds no deploy key (answered as unknown)");
        return Err(ManagerError::Store(StoreError::NotFound {
            kind: "node",
            ident: ident.to_string(),
        }));
    }
    if !key_matches(&node, &info) {
        return Err(refused(&node));
    }
    if node.provision_state != ProvisionState::WaitCallBack {
        return Err(not_waiting(&node));
    }
    let Some(flow) = core
        .flow_for(&node)
        .filter(|flow| flow.takes_pass_deploy_info())
    else {
        return Err(ManagerError::Unsupported {
            node: node.uuid,
            message: format!(
                "pass_deploy_info is for iscsi_ilo and pxe_ilo nodes; node {} uses driver {} \
                 whose ramdisk reports through heartbeats",
                node.uuid, node.driver
            ),
        });
    };
    // The key was checked before the reservation (a wrong key must not lock the node for the
    // real ramdisk), and is again under it: another call may have burnt it in between.
    let (mut node, reservation) = tasks::reserve_uuid(core, node.uuid).await?;
    if node.provision_state != ProvisionState::WaitCallBack {
        reservation.release().await;
        return Err(not_waiting(&node));
    }
    if !key_matches(&node, &info) {
        reservation.release().await;
        return Err(refused(&node));
    }
    node.driver_internal_info.remove(DEPLOY_KEY_KEY);
    node.provision_updated_at = Some(OffsetDateTime::now_utc());
    if let Err(err) = core.store().update_node(&node).await {
        reservation.release().await;
        return Err(err.into());
    }
    tracing::info!(
        node = %node.uuid,
        address = %info.address,
        iqn = %info.iqn,
        "pass_deploy_info accepted: deploy key burnt"
    );
    if let Some(error) = info.error.clone() {
        let message = format!(
            "The deploy ramdisk of node {} reported an error: {error}",
            node.uuid
        );
        fail_deploy(core, &mut node, Some(&flow), message).await;
        reservation.release().await;
        return Ok(());
    }
    tasks::spawn(
        core,
        reservation,
        "pass_deploy_info",
        move |core| async move {
            match flow.pass_deploy_info(&mut node, &info).await {
                Ok(DeployStep::Done) => {
                    // The flow rebooted the node into its instance.
                    node.power_state = Some(crate::states::NodePower::On);
                    apply(&mut node, Event::Resume);
                    apply(&mut node, Event::Done);
                    node.last_error = None;
                    wipe_agent_secrets(&mut node);
                    tracing::info!("deploy done: node active");
                }
                // The flow waits for something more (a later heartbeat of an agent it started).
                Ok(DeployStep::Wait) => node.provision_updated_at = Some(OffsetDateTime::now_utc()),
                Err(err) => {
                    let message = format!("Deploy of node {} failed: {err:#}", node.uuid);
                    fail_deploy(&core, &mut node, Some(&flow), message).await;
                    return;
                }
            }
            if let Err(err) = core.store().update_node(&node).await {
                tasks::log_store_error(&err, "the outcome of pass_deploy_info");
            }
        },
    );
    Ok(())
}
