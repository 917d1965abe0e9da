//! One task per node: the reservation guard and the registry of running tasks.
//!
//! # Design
//! A task starts in the caller's request: [`reserve`] takes the node's lock in the store (a
//! second task gets [`StoreError::Locked`], the API's 409 `NodeLocked`), so the caller learns
//! at once whether its request was accepted. [`spawn`] then runs the work on its own tokio task
//! under a supervisor that releases the reservation on every exit path: normal end, error (the
//! work records it itself), panic and cancellation (the supervisor sees the `JoinError` and
//! fails the node in words an operator can act on). If the supervisor itself never finishes
//! (the runtime stops), the guard's `Drop` still tries to release, and the next start's
//! recovery releases whatever this conductor held.
//!
//! Holders are `<conductor_name>:<task uuid>`, so a restarted conductor finds its own locks by
//! prefix ([`crate::store::Store::release_all`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tracing::Instrument;
use uuid::Uuid;

use super::{Core, ManagerError};
use crate::states::{Event, ProvisionState};
use crate::store::{Node, NodeIdent, StoreError};
use vmdeploy_shared::error::Chain;

/// The node's task lock, held until [`Reservation::release`] (or drop).
pub(crate) struct Reservation {
    core: Arc<Core>,
    node: Uuid,
    holder: String,
    released: bool,
}

impl Reservation {
    /// The node it locks.
    pub(crate) fn node(&self) -> Uuid {
        self.node
    }

    /// Releases the lock; failures are logged (the next start's recovery releases it).
    pub(crate) async fn release(mut self) {
        self.released = true;
        if let Err(err) = self
            .core
            .store()
            .release_node(self.node, &self.holder)
            .await
        {
            tracing::error!(node = %self.node, error = %Chain(&err), "could not release the node's reservation");
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Dropped without release: an early return or a cancelled future. Release on the
        // runtime if there is still one; otherwise recovery does it at the next start.
        let store = self.core.store().clone();
        let (node, holder) = (self.node, std::mem::take(&mut self.holder));
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(err) = store.release_node(node, &holder).await {
                    tracing::error!(node = %node, error = %Chain(&err), "could not release the node's reservation");
                }
            });
        }
    }
}

/// The holder name of a new task of this conductor.
fn holder(core: &Core) -> String {
    format!("{}:{}", core.config.conductor_name, Uuid::new_v4())
}

/// The prefix of every holder of this conductor (`release_all` at start).
pub(crate) fn holder_prefix(core: &Core) -> String {
    format!("{}:", core.config.conductor_name)
}

/// Reserves the node named by `ident` and returns it as it is now.
pub(crate) async fn reserve(
    core: &Arc<Core>,
    ident: &NodeIdent,
) -> Result<(Node, Reservation), ManagerError> {
    let uuid = core.uuid_of(ident).await?;
    reserve_uuid(core, uuid).await
}

/// Reserves the node `uuid` and returns it as it is now.
pub(crate) async fn reserve_uuid(
    core: &Arc<Core>,
    uuid: Uuid,
) -> Result<(Node, Reservation), ManagerError> {
    let holder = holder(core);
    let node = core.store().reserve_node(uuid, &holder).await?;
    let reservation = Reservation {
        core: core.clone(),
        node: uuid,
        holder,
        released: false,
    };
    Ok((node, reservation))
}

/// Starts `future` on the manager's runtime (`Core::runtime`), or on the caller's when the
/// manager was made outside one.
pub(crate) fn spawn_on<F>(core: &Core, future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match &core.runtime {
        Some(runtime) => runtime.spawn(future),
        None => tokio::spawn(future),
    }
}

/// Runs `work` on its own task, holding `reservation` until it ends, whichever way it ends.
/// `kind` names the task in logs (`deploy`, `power`, ...).
pub(crate) fn spawn<F, Fut>(core: &Arc<Core>, reservation: Reservation, kind: &'static str, work: F)
where
    F: FnOnce(Arc<Core>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let node = reservation.node();
    let span = tracing::info_span!("task", node = %node, task = kind);
    let running = core.tasks.enter();
    let core = core.clone();
    let inner = spawn_on(&core, work(core.clone()).instrument(span.clone()));
    let runs_on = core.clone();
    spawn_on(
        &runs_on,
        async move {
            let _running = running;
            match inner.await {
                Ok(()) => {}
                Err(err) => {
                    let how = if err.is_panic() {
                        "failed unexpectedly (an internal error; see the conductor's log)"
                    } else {
                        "was cancelled"
                    };
                    tracing::error!(error = %Chain(&err), "the {kind} task {how}");
                    fail_after_crash(&core, node, kind, how).await;
                }
            }
            reservation.release().await;
        }
        .instrument(span),
    );
}

/// After a task panicked or was cancelled: a node it left in a transient state moves to the
/// failure state with a `last_error` that says so, and a power target is cleared.
async fn fail_after_crash(core: &Core, uuid: Uuid, kind: &str, how: &str) {
    let mut node = match core.store().node(&NodeIdent::Uuid(uuid)).await {
        Ok(node) => node,
        Err(err) => {
            tracing::error!(error = %Chain(&err), "could not read the node after its task ended");
            return;
        }
    };
    let mut changed = false;
    if !node.provision_state.is_stable() && !node.provision_state.is_waiting() {
        if let Some(failed) = crate::states::next(node.provision_state, Event::Fail) {
            node.last_error = Some(format!(
                "the conductor's {kind} task {how} while the node was {}; check the node and \
                 retry the request",
                node.provision_state
            ));
            move_to(&mut node, failed);
            changed = true;
        }
    }
    if node.target_power_state.take().is_some() {
        if !changed {
            node.last_error = Some(format!(
                "the conductor's {kind} task {how}; the power state may not have changed"
            ));
        }
        changed = true;
    }
    if changed {
        if let Err(err) = core.store().update_node(&node).await {
            tracing::error!(error = %Chain(&err), "could not record the failed task");
        }
    }
}

/// Moves `node` to `state` and sets what goes with it: `provision_updated_at`, and the
/// target Ironic shows (none in a stable state, except the failed states, whose target is
/// where a retry would go, as in Ironic's state machine).
pub(crate) fn move_to(node: &mut Node, state: ProvisionState) {
    use ProvisionState::*;
    node.provision_state = state;
    node.provision_updated_at = Some(OffsetDateTime::now_utc());
    node.target_provision_state = match state {
        Verifying => Some(Manageable),
        Deploying | WaitCallBack | DeployFailed => Some(Active),
        Deleting | Cleaning | CleanWait => Some(Available),
        Enroll | Manageable | Available | Active | CleanFailed | Error => None,
    };
}

/// Moves `node` by `event`, or leaves it (and says so in the log) when the state machine does
/// not allow it (someone changed the node behind the task: a bug, not an operator error).
pub(crate) fn apply(node: &mut Node, event: Event) -> bool {
    match crate::states::next(node.provision_state, event) {
        Some(state) => {
            move_to(node, state);
            true
        }
        None => {
            tracing::error!(state = %node.provision_state, ?event, "unexpected transition refused");
            false
        }
    }
}

/// Counts running tasks so `drain` can wait for them.
#[derive(Default)]
pub(crate) struct TaskRegistry {
    running: Arc<tokio::sync::watch::Sender<usize>>,
}

/// Held while a task runs; leaving decrements the count (also on panic).
pub(crate) struct Running {
    running: Arc<tokio::sync::watch::Sender<usize>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.running.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl TaskRegistry {
    /// Counts a task in.
    pub(crate) fn enter(&self) -> Running {
        self.running.send_modify(|n| *n += 1);
        Running {
            running: self.running.clone(),
        }
    }

    /// How many tasks run now.
    pub(crate) fn running(&self) -> usize {
        *self.running.borrow()
    }

    /// Waits until no task runs or `grace` passed.
    pub(crate) async fn drain(&self, grace: Duration) {
        let mut rx = self.running.subscribe();
        let waited = tokio::time::timeout(grace, rx.wait_for(|n| *n == 0)).await;
        if waited.is_err() {
            tracing::warn!(
                running = self.running(),
                "node tasks still running after the drain grace period; the next start fails \
                 them with a clear last_error"
            );
        }
    }
}

/// A store error in the operator's words when a task could not record its outcome.
pub(crate) fn log_store_error(err: &StoreError, what: &str) {
    tracing::error!(error = %Chain(err), "could not record {what}");
}
