//! Provision verbs: where each verb leaves a node from each state.

use super::harness::*;
use crate::manager::*;
use crate::states::ProvisionState;
use crate::states::{next, Event};

/// Where each allowed verb leaves a node once its task ended (the scripted flow waits after
/// deploy; the emulator's credentials are right).
fn settled_state(from: ProvisionState, verb: ProvisionVerb) -> ProvisionState {
    use ProvisionState::*;
    match (from, verb) {
        (_, ProvisionVerb::Manage) => Manageable,
        (_, ProvisionVerb::Provide) => Available,
        (_, ProvisionVerb::Deploy | ProvisionVerb::Rebuild) => WaitCallBack,
        (_, ProvisionVerb::Undeploy) => Available,
        (WaitCallBack, ProvisionVerb::Abort) => DeployFailed,
        (_, ProvisionVerb::Abort) => CleanFailed,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verb_from_every_state() {
    let h = Harness::new().await;
    let verbs = [
        ProvisionVerb::Manage,
        ProvisionVerb::Provide,
        ProvisionVerb::Deploy,
        ProvisionVerb::Rebuild,
        ProvisionVerb::Undeploy,
        ProvisionVerb::Abort,
    ];
    let mut allowed = 0;
    for from in ProvisionState::ALL {
        for verb in verbs {
            let uuid = h.node_in(from).await;
            let before = h.node(uuid).await;
            let result = h.manager.set_provision_state(&id(uuid), verb, None).await;
            h.settle().await;
            let after = h.node(uuid).await;
            assert_eq!(after.reservation, None, "{verb:?} from {from}");
            match next(from, Event::Verb(verb)) {
                None => {
                    assert!(
                        matches!(result, Err(ManagerError::InvalidState { state, .. }) if state == from),
                        "{verb:?} from {from}: {result:?}"
                    );
                    assert_eq!(
                        after, before,
                        "a refused {verb:?} changed the node in {from}"
                    );
                }
                Some(_) => {
                    allowed += 1;
                    result.unwrap_or_else(|e| panic!("{verb:?} from {from}: {e}"));
                    assert_eq!(
                        after.provision_state,
                        settled_state(from, verb),
                        "{verb:?} from {from}: {:?}",
                        after.last_error
                    );
                }
            }
        }
    }
    assert_eq!(allowed, 15, "the state machine's verbs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_done_at_once_is_active() {
    let h = Harness::new().await;
    let uuid = h.node_in(ProvisionState::DeployFailed).await;
    h.flow.script_deploy(Script::Done);
    let node = h.provision(uuid, ProvisionVerb::Deploy).await;
    assert_eq!(node.provision_state, ProvisionState::Active);
    assert_eq!(node.target_provision_state, None);
    assert_eq!(node.reservation, None);
}
