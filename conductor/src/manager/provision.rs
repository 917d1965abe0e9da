//! `PUT /v1/nodes/{node}/states/provision`: every verb through [`crate::states::next`], and the
//! tasks that carry them out (deploy, undeploy, verify, provide with automated cleaning, abort).
//!
//! # Design
//! The request reserves the node, checks the verb against the state machine (400
//! `InvalidState` when refused), moves the node to the verb's first state and spawns the task;
//! verbs with nothing to do (manage from `available`) finish in the request. The deploy flow
//! never changes `provision_state` itself: it returns a [`DeployStep`], and this module moves
//! the node. Every failure records `last_error`, then cleans up through the flow and powers the
//! node off (docs/architecture.md §8, Ironic's `set_failed_state`).

use std::sync::Arc;

use serde_json::Value;

use super::tasks::{self, apply, move_to};
use super::{Core, ManagerError};
use crate::bmc::Bmc;
use crate::deploy::{DeployInterface, DeployStep};
use crate::node::hardware_type;
use crate::states::{Event, NodePower, ProvisionState, ProvisionVerb};
use crate::store::{Node, NodeIdent};
use vmdeploy_shared::error::Chain;

/// Ironic's name of a verb in messages.
fn verb_name(verb: ProvisionVerb) -> &'static str {
    match verb {
        ProvisionVerb::Manage => "manage",
        ProvisionVerb::Provide => "provide",
        ProvisionVerb::Deploy => "deploy",
        ProvisionVerb::Rebuild => "rebuild",
        ProvisionVerb::Undeploy => "undeploy",
        ProvisionVerb::Abort => "abort",
    }
}

/// The work a verb leaves for its task.
enum Work {
    /// Nothing: the verb finished in the request.
    None,
    /// Check the BMC credentials (manage from enroll).
    Verify,
    /// Cleaning, then available (provide).
    Provide,
    /// Run the flow's deploy.
    Deploy(Arc<dyn DeployInterface>),
    /// Run the flow's tear-down.
    Undeploy(Arc<dyn DeployInterface>),
    /// Clean up after an abort in `wait call-back`.
    Abort(Arc<dyn DeployInterface>),
}

/// Reserves the node, checks and records the verb, and starts its task.
pub(crate) async fn set_provision_state(
    core: &Arc<Core>,
    ident: &NodeIdent,
    verb: ProvisionVerb,
    configdrive: Option<Value>,
) -> Result<(), ManagerError> {
    if configdrive.is_some() && !matches!(verb, ProvisionVerb::Deploy | ProvisionVerb::Rebuild) {
        return Err(ManagerError::InvalidInput {
            field: "configdrive",
            message: format!(
                "configdrive can only be given with the deploy (\"active\") or rebuild verb, \
                 not {}",
                verb_name(verb)
            ),
        });
    }
    let (mut node, reservation) = tasks::reserve(core, ident).await?;
    let work = match start(core, &mut node, verb, configdrive) {
        Ok(work) => work,
        Err(err) => {
            reservation.release().await;
            return Err(err);
        }
    };
    if let Err(err) = core.store().update_node(&node).await {
        reservation.release().await;
        return Err(err.into());
    }
    tracing::info!(
        node = %node.uuid,
        verb = verb_name(verb),
        state = %node.provision_state,
        "provision verb accepted"
    );
    let kind = match &work {
        Work::None => {
            reservation.release().await;
            return Ok(());
        }
        Work::Verify => "verify",
        Work::Provide => "provide",
        Work::Deploy(_) => "deploy",
        Work::Undeploy(_) => "undeploy",
        Work::Abort(_) => "abort",
    };
    tasks::spawn(core, reservation, kind, move |core| async move {
        match work {
            Work::None => {}
            Work::Verify => run_verify(&core, node).await,
            Work::Provide => run_provide(&core, node).await,
            Work::Deploy(flow) => run_deploy(&core, node, flow).await,
            Work::Undeploy(flow) => run_undeploy(&core, node, flow).await,
            Work::Abort(flow) => clean_up_after_failure(&core, &mut node, Some(&flow)).await,
        }
    });
    Ok(())
}

/// Checks `verb` on the reserved `node` and moves it to the verb's first state.
fn start(
    core: &Core,
    node: &mut Node,
    verb: ProvisionVerb,
    configdrive: Option<Value>,
) -> Result<Work, ManagerError> {
    let from = node.provision_state;
    let to =
        crate::states::next(from, Event::Verb(verb)).ok_or_else(|| ManagerError::InvalidState {
            action: verb_name(verb).to_string(),
            node: node.uuid,
            state: from,
        })?;
    let flow = || {
        core.flow_for(node)
            .ok_or_else(|| ManagerError::Unsupported {
                node: node.uuid,
                message: hardware_type::no_flow_reason(node),
            })
    };
    let work = match verb {
        ProvisionVerb::Manage if from == ProvisionState::Enroll => Work::Verify,
        ProvisionVerb::Manage => Work::None,
        ProvisionVerb::Provide => Work::Provide,
        ProvisionVerb::Deploy | ProvisionVerb::Rebuild => {
            if node.maintenance {
                return Err(ManagerError::InMaintenance {
                    node: node.uuid,
                    reason: node.maintenance_reason.clone(),
                });
            }
            let flow = flow()?;
            if let Some(drive) = configdrive {
                node.instance_info.insert("configdrive".into(), drive);
            }
            Work::Deploy(flow)
        }
        ProvisionVerb::Undeploy => Work::Undeploy(flow()?),
        // Aborting a wait for the ramdisk (deploy or cleaning) leaves it booted: clean up.
        ProvisionVerb::Abort if from.is_waiting() => Work::Abort(flow()?),
        ProvisionVerb::Abort => Work::None,
    };
    move_to(node, to);
    node.last_error = match (verb, from) {
        (ProvisionVerb::Abort, ProvisionState::WaitCallBack) => Some(format!(
            "Deploy of node {} was aborted by request while waiting for the ramdisk",
            node.uuid
        )),
        (ProvisionVerb::Abort, _) => Some(format!(
            "Cleaning of node {} was aborted by request",
            node.uuid
        )),
        _ => None,
    };
    Ok(work)
}

/// `manage` from `enroll`: the credentials work when the BMC answers a power-state read.
async fn run_verify(core: &Core, mut node: Node) {
    match Bmc::read_power(&mut node, &core.deploy.config.ilo_defaults).await {
        Ok(power) => {
            node.power_state = Some(power);
            apply(&mut node, Event::Done);
            tracing::info!("BMC credentials verified");
        }
        Err(err) => {
            apply(&mut node, Event::Fail);
            let message = format!(
                "Failed to verify the BMC credentials of node {}: {err}; fix driver_info and \
                 manage the node again",
                node.uuid
            );
            tracing::error!("{message}");
            node.last_error = Some(message);
        }
    }
    if let Err(err) = core.store().update_node(&node).await {
        tasks::log_store_error(&err, "the outcome of the verification");
    }
}

/// `provide` (and the end of an undeploy): the node is `cleaning`. Without `automated_clean` it
/// is available at once, as before; with it, the flow boots the agent ramdisk and the node
/// waits in `clean wait` for its heartbeat ([`super::heartbeat`] runs the steps).
async fn run_provide(core: &Core, mut node: Node) {
    if !core.config.automated_clean {
        apply(&mut node, Event::Done);
        if let Err(err) = core.store().update_node(&node).await {
            tasks::log_store_error(&err, "the end of cleaning");
        }
        return;
    }
    let Some(flow) = core.flow_for(&node) else {
        let message = format!(
            "Cleaning failed: {}; turn deploy.automated_clean off or change the driver, then \
             manage and provide the node",
            hardware_type::no_flow_reason(&node)
        );
        fail_clean(core, &mut node, None, message).await;
        return;
    };
    node.last_error = None;
    match flow.prepare_cleaning(&mut node).await {
        Ok(()) => {
            // The flow powered the node on to boot the ramdisk.
            node.power_state = Some(NodePower::On);
            apply(&mut node, Event::Wait);
            tracing::info!(state = %node.provision_state, "agent ramdisk booting for cleaning");
            if let Err(err) = core.store().update_node(&node).await {
                tasks::log_store_error(&err, "the start of cleaning");
            }
        }
        Err(err) => {
            let message = format!(
                "Cleaning of node {} failed while booting the agent ramdisk: {err:#}; fix the \
                 cause, then manage and provide the node to clean it again",
                node.uuid
            );
            fail_clean(core, &mut node, Some(&flow), message).await;
        }
    }
}

/// Moves a node in `cleaning` or `clean wait` to `clean failed` with `message`, then cleans up
/// as after a failed deploy (the flow's clean-up: media, floppy, token; power off) and forgets
/// the agent.
pub(crate) async fn fail_clean(
    core: &Core,
    node: &mut Node,
    flow: Option<&Arc<dyn DeployInterface>>,
    message: String,
) {
    crate::deploy::clean::forget_plan(&mut node.driver_internal_info);
    record_failure(
        core,
        node,
        ProvisionState::CleanFailed,
        message,
        "the failed cleaning",
    )
    .await;
    clean_up_after_failure(core, node, flow).await;
    super::heartbeat::wipe_agent_secrets(node);
    if let Err(err) = core.store().update_node(node).await {
        tasks::log_store_error(&err, "the clean-up after the failed cleaning");
    }
}

/// `deploy`/`rebuild`: the flow boots the ramdisk and returns `Wait` (the node waits for its
/// heartbeat, unreserved) or `Done`.
async fn run_deploy(core: &Core, mut node: Node, flow: Arc<dyn DeployInterface>) {
    // Validation apart and first: a node refused here (iLO unreachable, login refused, virtual
    // media not licensed, fields missing) has not been touched, so it is neither cleaned up nor
    // powered off ("refused before anything is powered off"; a rebuild keeps its instance
    // running). The flow's deploy validates again: one more BMC round trip.
    if let Err(err) = flow.validate(&node).await {
        let message = format!(
            "Deploy of node {} failed validation, nothing on the node was changed: {err:#}",
            node.uuid
        );
        record_failure(
            core,
            &mut node,
            ProvisionState::DeployFailed,
            message,
            "the failed validation",
        )
        .await;
        return;
    }
    match flow.deploy(&mut node).await {
        Ok(step) => {
            // The flow powered the node on: the ramdisk boots (Wait) or the instance runs
            // (Done). Recorded here, or the API shows the state from before the deploy.
            node.power_state = Some(NodePower::On);
            let event = match step {
                DeployStep::Wait => Event::Wait,
                DeployStep::Done => Event::Done,
            };
            apply(&mut node, event);
            tracing::info!(state = %node.provision_state, "deploy step done");
            if let Err(err) = core.store().update_node(&node).await {
                tasks::log_store_error(&err, "the deploy step");
            }
        }
        Err(err) => {
            let message = format!("Deploy of node {} failed: {err:#}", node.uuid);
            fail_deploy(core, &mut node, Some(&flow), message).await;
        }
    }
}

/// `undeploy`: the flow's tear-down, then cleaning ([`run_provide`]), then available.
async fn run_undeploy(core: &Core, mut node: Node, flow: Arc<dyn DeployInterface>) {
    match flow.tear_down(&mut node).await {
        Ok(()) => {
            // As Ironic's tear-down: the instance is gone from the node.
            node.instance_info.clear();
            node.instance_uuid = None;
            super::heartbeat::wipe_agent_secrets(&mut node);
            apply(&mut node, Event::Done);
            if let Err(err) = core.store().update_node(&node).await {
                tasks::log_store_error(&err, "the end of the tear-down");
                return;
            }
            run_provide(core, node).await;
        }
        Err(err) => {
            let message = format!(
                "Undeploy of node {} failed: {err:#}; fix the cause and undeploy again",
                node.uuid
            );
            tracing::error!("{message}");
            apply(&mut node, Event::Fail);
            node.last_error = Some(message);
            if let Err(err) = core.store().update_node(&node).await {
                tasks::log_store_error(&err, "the failed tear-down");
            }
            flow.clean_up(&mut node).await;
            if let Err(err) = core.store().update_node(&node).await {
                tasks::log_store_error(&err, "the clean-up after the failed tear-down");
            }
        }
    }
}

/// Moves a node in `deploying` or `wait call-back` to `deploy failed` with `message`, then
/// cleans up through the flow and powers it off.
pub(crate) async fn fail_deploy(
    core: &Core,
    node: &mut Node,
    flow: Option<&Arc<dyn DeployInterface>>,
    message: String,
) {
    // Recorded before the clean-up, so a crash during it still leaves the right state.
    record_failure(
        core,
        node,
        ProvisionState::DeployFailed,
        message,
        "the failed deploy",
    )
    .await;
    clean_up_after_failure(core, node, flow).await;
}

/// Logs `message`, moves the node on with `Fail` (to `failed_state` where the state machine
/// has no such transition), sets `last_error` and stores the node (`what` names it in a store
/// error).
async fn record_failure(
    core: &Core,
    node: &mut Node,
    failed_state: ProvisionState,
    message: String,
    what: &str,
) {
    tracing::error!("{message}");
    if !apply(node, Event::Fail) {
        move_to(node, failed_state);
    }
    node.last_error = Some(message);
    if let Err(err) = core.store().update_node(node).await {
        tasks::log_store_error(&err, what);
    }
}

/// The flow's clean-up (media, objects, token), then power off; what fails is appended to
/// `last_error`.
pub(crate) async fn clean_up_after_failure(
    core: &Core,
    node: &mut Node,
    flow: Option<&Arc<dyn DeployInterface>>,
) {
    if let Some(flow) = flow {
        flow.clean_up(node).await;
    }
    let powered_off = match Bmc::connect(node, &core.deploy.config.ilo_defaults).await {
        Ok(bmc) => bmc.power_off().await,
        Err(err) => Err(err),
    };
    match powered_off {
        Ok(()) => node.power_state = Some(NodePower::Off),
        Err(err) => {
            tracing::warn!(error = %Chain(&err), "could not power the node off after the failure");
            let note = format!("; the node could not be powered off: {err}");
            node.last_error = Some(node.last_error.take().unwrap_or_default() + &note);
        }
    }
    if let Err(err) = core.store().update_node(node).await {
        tasks::log_store_error(&err, "the clean-up after the failure");
    }
}
