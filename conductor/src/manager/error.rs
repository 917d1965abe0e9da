//! Why a manager call failed, one variant per answer the API gives (docs/ironic-protocols.md
//! §5.1), each keeping what caused it as its `source`.
//!
//! # Design
//! A variant's own text is the manager's words; the BMC's or the flow's words are its source.
//! Whoever shows the error to a person (the API's `faultstring`, `last_error`, a log field)
//! renders the whole chain with [`ManagerError::chain`], so no cause is lost and none printed
//! twice (docs/style.md).

use uuid::Uuid;

use crate::bmc::BmcError;
use crate::states::ProvisionState;
use crate::store::StoreError;

/// Why a manager call failed; the API maps each to Ironic's status code.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// From the store: not found (404), duplicate (409), locked (409 `NodeLocked`), a database
    /// failure (500).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The verb is not allowed in the node's state (400, Ironic's `InvalidStateRequested`).
    #[error("The requested action \"{action}\" can not be performed on node \"{node}\" while it is in state \"{state}\".")]
    InvalidState {
        /// The verb or action asked for.
        action: String,
        /// The node.
        node: Uuid,
        /// Its state.
        state: ProvisionState,
    },
    /// A request value the node cannot take (400), in words naming the field and what fixes it.
    #[error("{message}")]
    InvalidInput {
        /// The request field at fault (`timeout`, `configdrive`, `boot_device`, ...).
        field: &'static str,
        /// The operator's words.
        message: String,
    },
    /// The node's driver has no interface for what is asked (400): no deploy flow for its
    /// driver, or a call-back its deploy interface does not take.
    #[error("{message}")]
    Unsupported {
        /// The node.
        node: Uuid,
        /// The operator's words, naming the driver.
        message: String,
    },
    /// A deploy asked of a node in maintenance mode (400, Ironic's `NodeInMaintenance`).
    #[error(
        "node {node} is in maintenance mode{}; take it out of maintenance before deploying",
        reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()
    )]
    InMaintenance {
        /// The node.
        node: Uuid,
        /// Why it is in maintenance, as the operator said.
        reason: Option<String>,
    },
    /// The request conflicts with the node's state (409): delete while deployed, a call-back
    /// to a node that waits for none.
    #[error("{message}")]
    StateConflict {
        /// The node.
        node: Uuid,
        /// The operator's words, naming the state.
        message: String,
    },
    /// A ramdisk call-back with a wrong or missing agent token or deploy key (403).
    #[error("{message}")]
    CallbackRefused {
        /// The node.
        node: Uuid,
        /// What was refused (never the secret itself).
        message: String,
    },
    /// The node's BMC: `driver_info` that does not say how to reach it (400), or a step it
    /// failed while the caller waited (500).
    #[error("{action}")]
    Bmc {
        /// What the manager was doing, in the operator's words.
        action: String,
        /// The BMC layer's error, naming the BMC, the step and the `driver_info` key to check.
        #[source]
        source: BmcError,
    },
    /// The node's deploy interface failed while the caller waited (500).
    #[error("{action}")]
    Flow {
        /// What the manager asked of the flow, in the operator's words.
        action: String,
        /// The flow's error with its contexts.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ManagerError {
    /// A BMC failure while doing `action`.
    pub(crate) fn bmc(action: impl Into<String>) -> impl FnOnce(BmcError) -> ManagerError {
        let action = action.into();
        move |source| ManagerError::Bmc { action, source }
    }

    /// A flow failure while doing `action`; the flow's contexts stay in the chain.
    pub(crate) fn flow(action: impl Into<String>, source: anyhow::Error) -> ManagerError {
        ManagerError::Flow {
            action: action.into(),
            source: source.into(),
        }
    }

    /// The error and every cause on one line (`action: cause: cause`), for the API's
    /// `faultstring`, `last_error` and log fields.
    pub fn chain(&self) -> String {
        vmdeploy_shared::error::chain(self)
    }

    /// Whether the operator must fix the request or the node's settings (a 4xx) rather than
    /// the conductor or the BMC having failed (a 5xx).
    pub fn is_bmc_settings(&self) -> bool {
        matches!(
            self,
            ManagerError::Bmc {
                source: BmcError::Settings { .. },
                ..
            }
        )
    }
}

impl From<BmcError> for ManagerError {
    /// A BMC error met through `?`: its own message names the BMC and the step, so the
    /// manager's words only say which side must act.
    fn from(source: BmcError) -> Self {
        let action = match source {
            BmcError::Settings { .. } => "the node's BMC settings cannot be used",
            _ => "the BMC failed",
        };
        ManagerError::Bmc {
            action: action.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drivers::DriverError;

    fn login_failure() -> BmcError {
        BmcError::Driver {
            bmc: "iLO",
            address: "10.0.0.9".into(),
            step: "reading the power state".into(),
            description: "login failed; check ilo_username and ilo_password in the node's \
                          driver_info"
                .into(),
            error: Box::new(DriverError::LoginFailed {
                message: "login failed".into(),
            }),
        }
    }

    /// A BMC failure keeps its cause: the typed source for callers, and its words in every
    /// rendering a person reads (the API's fault, `last_error`, log fields).
    #[test]
    fn a_bmc_failures_cause_shows_in_its_rendered_message() {
        let err = ManagerError::bmc("the power change failed")(login_failure());
        let source = std::error::Error::source(&err).expect("a source");
        assert!(source.downcast_ref::<BmcError>().is_some(), "{source:?}");
        let text = err.chain();
        assert_eq!(
            text,
            "the power change failed: iLO 10.0.0.9: reading the power state: login failed; \
             check ilo_username and ilo_password in the node's driver_info"
        );
        // The log field the manager writes (`error = %err.chain()`), as a subscriber sees it.
        let logged = format!("{}", tracing::field::display(err.chain()));
        assert!(
            logged.contains("check ilo_username and ilo_password"),
            "{logged}"
        );
        // Through `?` the cause is kept the same way.
        let via_question_mark: ManagerError = login_failure().into();
        assert!(via_question_mark
            .chain()
            .ends_with("in the node's driver_info"));
        assert!(!via_question_mark.is_bmc_settings());
    }

    /// A flow's error keeps its anyhow contexts in the chain.
    #[test]
    fn a_flow_failures_contexts_show_in_its_rendered_message() {
        let flow_error =
            anyhow::anyhow!("the image is not a bzImage").context("fetching the kernel");
        let err = ManagerError::flow("the instance's boot could not be prepared", flow_error);
        assert_eq!(
            err.chain(),
            "the instance's boot could not be prepared: fetching the kernel: the image is not a \
             bzImage"
        );
    }
}
